// The reducers' contract table (docs/design.md, "The reducer"): every reducer on 1 to 4
// Gloo ranks, whole and in buckets, float and exact, with a fused optimizer (which reads
// the exact sum where it lies) and a LibTorch one (which reads assembled floats), runs two
// steps of four vnodes through begin_step, absorb, arm, finish and update, and gives the
// documented result:
//   - float: the one-rank result within a float tolerance (a sum's order may differ);
//   - exact: bitwise the one-rank exact result, parameters and the rest of the packet;
//   - exact and float agree within the tolerance, so the exact result is the sum at all.
#include "engine/reducer.h"

#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>

#include "engine/small_net.h"
#include "engine/verification.h"
#include "support.h"
#include "vflow/comm/communicator.h"
#include "vflow/engine/optimizer.h"
#include "vflow/job/control_plane.h"
#include "vflow/vnode/plan.h"
#include "vflow/vnode/shards.h"
#include "vflow/vnode/step_packet.h"

namespace {

constexpr int64_t kVnodes = 4;
constexpr int64_t kTable = 3;
constexpr int kSteps = 2;

using Net = vflow::testing::SmallNet;

/// What one rank holds after the steps: its parameters, and the packet past the gradients
/// (stateful-kernel table, loss, control word) after the last step's reduction.
struct Outcome {
  torch::Tensor parameters;
  torch::Tensor rest;
};

struct Reduction {
  bool exact = false;
  bool bucketed = false;
  std::string optimizer;
};

/// Runs the steps on `ranks` Gloo ranks; every rank's outcome.
std::vector<Outcome> run(const Reduction& reduction, int ranks) {
  // Made before the ranks' threads start: the random generator is global.
  std::vector<std::unique_ptr<Net>> nets;
  for (int r = 0; r < ranks; ++r) nets.push_back(std::make_unique<Net>());
  std::vector<std::vector<torch::Tensor>> inputs(kSteps);
  torch::manual_seed(40);
  for (auto& step : inputs) {
    for (int64_t v = 0; v < kVnodes; ++v) step.push_back(torch::randn({6, 8}));
  }
  vflow::engine::OptimizerSpec optimizer_spec;
  optimizer_spec.name = reduction.optimizer;
  optimizer_spec.lr = 0.1;
  vflow::engine::ReducerOptions options;
  options.exact = reduction.exact;
  options.bucket_bytes = reduction.bucketed ? 256 : 0;
  options.virtual_nodes = kVnodes;
  options.table_numel = kTable;

  vflow::job::StoreHost coordinator("127.0.0.1", 0, std::chrono::seconds(10));
  std::vector<Outcome> outcomes(ranks);
  const auto errors = vflow::testing::run_gloo_ranks(
      coordinator, ranks, "reducer", [&](int rank, vflow::comm::Communicator& comm) {
        auto& net = *nets[rank];
        vflow::vnode::StepPacket packet(net.parameters(), kTable);
        const auto optimizer = vflow::engine::make_optimizer(optimizer_spec, net.parameters());
        const auto reducer = vflow::engine::make_reducer(packet, *optimizer, options);
        const auto held = vflow::vnode::vnodes_of(kVnodes, ranks, rank);
        for (int step = 0; step < kSteps; ++step) {
          reducer->begin_step(comm, step, /*overlap=*/true);
          for (int64_t v = held.first; v < held.last; ++v) {
            const auto loss = net.loss(inputs[step][v]);
            packet.table()[v % kTable] += 0.25 * static_cast<double>(v + 1);
            packet.add_loss(loss, 6);
            if (v + 1 == held.last) reducer->arm();
            (loss / static_cast<double>(kVnodes)).backward();
            if (v + 1 < held.last) reducer->absorb();
          }
          reducer->finish();
          reducer->update();
        }
        std::vector<torch::Tensor> flat;
        for (const auto& p : net.parameters()) flat.push_back(p.detach().flatten());
        const int64_t gradients = packet.gradients().numel();
        outcomes[rank] = {torch::cat(flat),
                          packet.flat().narrow(0, gradients, packet.numel() - gradients).clone()};
      });
  for (int r = 0; r < ranks; ++r) {
    INFO("rank " << r << ": " << errors[r]);
    REQUIRE(errors[r].empty());
  }
  return outcomes;
}

std::string describe(const Reduction& r) {
  return std::string(r.exact ? "exact" : "float") + (r.bucketed ? ", bucketed" : ", whole") + ", " +
         r.optimizer;
}

}  // namespace

TEST_CASE("the reducers' contract table: every reducer on 1-4 ranks gives the documented result",
          "[integration]") {
  std::map<std::tuple<bool, std::string>, Outcome> one_rank;  // (exact, optimizer)
  for (const std::string optimizer : {"sgd", "adam"}) {
    for (const bool exact : {false, true}) {
      for (const bool bucketed : {false, true}) {
        const Reduction reduction{exact, bucketed, optimizer};
        for (int ranks = 1; ranks <= 4; ++ranks) {
          INFO(describe(reduction) << " on " << ranks << " rank(s)");
          const auto outcomes = run(reduction, ranks);
          const auto key = std::make_tuple(exact, optimizer);
          if (one_rank.count(key) == 0) one_rank[key] = outcomes[0];
          const auto& want = one_rank[key];
          for (int r = 0; r < ranks; ++r) {
            CAPTURE(r);
            if (exact) {
              CHECK(torch::equal(outcomes[r].parameters, want.parameters));
              CHECK(torch::equal(outcomes[r].rest, want.rest));
            } else {
              CHECK(torch::allclose(outcomes[r].parameters, want.parameters, 1e-5, 1e-6));
              CHECK(torch::allclose(outcomes[r].rest, want.rest, 1e-5, 1e-6));
            }
          }
        }
      }
    }
    // The exact sum is the sum: it agrees with the float one within a float's rounding
    // (2^-36 a value is far below it).
    INFO(optimizer);
    const auto& exact = one_rank[std::make_tuple(true, optimizer)];
    const auto& floats = one_rank[std::make_tuple(false, optimizer)];
    CHECK(torch::allclose(exact.parameters, floats.parameters, 1e-5, 1e-6));
    CHECK(torch::allclose(exact.rest, floats.rest, 1e-5, 1e-6));
    // ... and the steps moved the parameters.
    Net initial;
    std::vector<torch::Tensor> flat;
    for (const auto& p : initial.parameters()) flat.push_back(p.detach().flatten());
    CHECK(!torch::allclose(exact.parameters, torch::cat(flat), 1e-3, 1e-4));
  }
}

TEST_CASE("the exact reducer's one-worker forms agree: rounding as the update reads, and in place",
          "[integration]") {
  // One worker of one vnode: a fused update rounds the gradients as it reads them; with
  // clipping on (that clips nothing) the reducer rounds them in place and the same update
  // takes them as floats. Bitwise the same step.
  const auto one_vnode = [](const vflow::engine::ClipSpec& clip) {
    Net net;
    torch::manual_seed(41);
    const auto x = torch::randn({6, 8});
    vflow::vnode::StepPacket packet(net.parameters(), kTable);
    vflow::engine::OptimizerSpec spec;
    spec.lr = 0.1;
    const auto optimizer = vflow::engine::make_optimizer(spec, net.parameters());
    vflow::engine::ReducerOptions options;
    options.exact = true;
    options.clip = clip;
    options.table_numel = kTable;
    const auto reducer = vflow::engine::make_reducer(packet, *optimizer, options);
    const auto comm = vflow::comm::make_local_communicator();
    for (int step = 0; step < kSteps; ++step) {
      reducer->begin_step(*comm, step, /*overlap=*/true);
      const auto loss = net.loss(x);
      packet.add_loss(loss, 6);
      reducer->arm();
      loss.backward();
      reducer->finish();
      reducer->update();
    }
    std::vector<torch::Tensor> flat;
    for (const auto& p : net.parameters()) flat.push_back(p.detach().flatten());
    return torch::cat(flat);
  };
  vflow::engine::ClipSpec no_clip;
  vflow::engine::ClipSpec clip_nothing;
  clip_nothing.value = 1e30;
  const auto rounding = one_vnode(no_clip);
  const auto in_place = one_vnode(clip_nothing);
  CHECK(torch::equal(rounding, in_place));
}

TEST_CASE("the fault-injection switch is read for this worker only and checked", "[unit]") {
  const auto with = [](const char* fault, const char* member) {
    struct Variables {  // unset again however the read ends
      Variables(const char* fault, const char* member) {
        setenv("VFLOW_INJECT_FAULT", fault, 1);
        setenv("VFLOW_MEMBER", member, 1);
      }
      ~Variables() {
        unsetenv("VFLOW_INJECT_FAULT");
        unsetenv("VFLOW_MEMBER");
      }
    } set(fault, member);
    return vflow::engine::injected_fault();
  };
  const auto mine = with("12:3", "3");
  REQUIRE(mine);
  CHECK(mine->step == 12);
  CHECK(mine->bit == 22);
  CHECK(with("12:3:7", "3")->bit == 7);
  CHECK_FALSE(with("12:3", "4"));  // another worker's
  for (const char* bad : {"12", "x:3", "12:3:40", "-1:3", "12:3:z"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH(with(bad, "3"), Catch::Matchers::Contains("VFLOW_INJECT_FAULT"));
  }
}

TEST_CASE("clipping takes the norm by canonical shard, the same bits whole or sharded",
          "[unit][shard]") {
  using vflow::engine::clip_gradients;
  using vflow::engine::ClipShards;
  using vflow::engine::ClipSpec;
  constexpr int64_t kShards = 5;
  torch::manual_seed(7);
  const auto original = torch::randn({100003}) * 0.01;
  const vflow::vnode::ShardLayout layout(original.numel(), kShards);
  ClipSpec clip;
  clip.value = 0.02;
  clip.max_norm = 1.0;

  // Whole: the norm before clipping is the shards' sums of squares, added in shard order.
  auto whole = original.clone();
  const auto norm = clip_gradients(whole, clip, kShards);
  REQUIRE(norm.has_value());
  double total = 0;
  for (int64_t s = 0; s < kShards; ++s) {
    const auto r = layout.shard(s);
    total +=
        original.narrow(0, r.begin, r.numel()).to(torch::kFloat64).square().sum().item<double>();
  }
  CHECK(*norm == Approx(std::sqrt(total)).epsilon(1e-12));
  // The clamp, then the scale from the clamped gradient's norm (as PyTorch's
  // clip_grad_value_ then clip_grad_norm_).
  const auto clamped = original.clamp(-clip.value, clip.value);
  const double scale = clip.max_norm / (clamped.to(torch::kFloat64).norm().item<double>() + 1e-6);
  REQUIRE(scale < 1);
  CHECK(torch::allclose(whole, clamped * scale, 1e-6, 1e-9));
  CHECK(clip_gradients(whole, ClipSpec{}, kShards) == std::nullopt);

  // Two workers, each holding some shards and giving the sums of those it owns; their sums
  // meet in the group's sum (here, between two threads).
  std::mutex mutex;
  std::condition_variable met;
  torch::Tensor group;
  int arrived = 0;
  const auto sum_over_group = [&](torch::Tensor& values) {
    std::unique_lock<std::mutex> lock(mutex);
    group = group.defined() ? group + values : values.clone();
    if (++arrived == 2) met.notify_all();
    met.wait(lock, [&] { return arrived == 2; });
    values.copy_(group);
  };
  const std::vector<ClipShards> workers{{{0, 1, 4}, {0, 1}, sum_over_group},
                                        {{1, 2, 3, 4}, {2, 3, 4}, sum_over_group}};
  std::vector<torch::Tensor> gradients{original.clone(), original.clone()};
  std::vector<std::optional<double>> norms(2);
  std::vector<std::thread> threads;
  for (size_t w = 0; w < 2; ++w) {
    threads.emplace_back(
        [&, w] { norms[w] = clip_gradients(gradients[w], clip, kShards, &workers[w]); });
  }
  for (auto& t : threads) t.join();
  for (size_t w = 0; w < 2; ++w) {
    CAPTURE(w);
    CHECK(norms[w] == norm);  // bitwise
    for (int64_t s = 0; s < kShards; ++s) {
      CAPTURE(s);
      const auto r = layout.shard(s);
      const auto& held = workers[w].held;
      const bool holds = std::find(held.begin(), held.end(), s) != held.end();
      // A held shard clipped as the whole gradient was; the others untouched.
      CHECK(torch::equal(gradients[w].narrow(0, r.begin, r.numel()),
                         (holds ? whole : original).narrow(0, r.begin, r.numel())));
    }
  }
}
