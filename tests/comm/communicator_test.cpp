// The Gloo communicator over a real coordinator store on loopback, ranks in threads.
#include "vflow/comm/communicator.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <numeric>
#include <thread>

#include "support.h"
#include "vflow/comm/nccl.h"
#include "vflow/hetero/speed_plan.h"
#include "vflow/job/control_plane.h"
#include "vflow/job/launcher.h"

using vflow::comm::Rendezvous;
using vflow::job::Coordinator;

namespace {
Rendezvous rendezvous(const Coordinator& c, int rank, int size, const std::string& generation,
                      int timeout_ms = 10000) {
  return vflow::testing::rendezvous_at(c, rank, size, generation, timeout_ms);
}
}  // namespace

TEST_CASE("Gloo collectives over the coordinator's store", "[integration]") {
  Coordinator coordinator("127.0.0.1", 0, std::chrono::seconds(10));
  constexpr int kRanks = 3;
  std::vector<std::vector<float>> results(kRanks);
  const auto errors = vflow::testing::run_gloo_ranks(
      coordinator, kRanks, "t1", [&](int rank, vflow::comm::Communicator& comm) {
        auto sum = torch::full({4}, static_cast<float>(rank + 1));
        comm.allreduce_sum(sum);
        auto root = torch::full({2}, static_cast<float>(10 * rank));
        comm.broadcast(root, 2);
        const auto gathered = comm.all_gather(torch::full({1}, static_cast<float>(rank)));
        comm.barrier();
        results[rank] = {sum[0].item<float>(), sum[3].item<float>(), root[1].item<float>(),
                         gathered[0].item<float>(), gathered[2].item<float>()};
      });
  for (int rank = 0; rank < kRanks; ++rank) {
    CAPTURE(rank, errors[rank]);
    REQUIRE(errors[rank].empty());
    CHECK(results[rank] == std::vector<float>{6, 6, 20, 0, 2});
  }
}

TEST_CASE("a peer that never arrives is a PeerFailure within the timeout", "[integration]") {
  Coordinator coordinator("127.0.0.1", 0, std::chrono::seconds(10));
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(vflow::comm::make_gloo_communicator(rendezvous(coordinator, 0, 2, "t2", 1000)),
                  vflow::comm::PeerFailure);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
}

TEST_CASE("a peer that leaves mid-job makes the next collective fail, not hang", "[integration]") {
  Coordinator coordinator("127.0.0.1", 0, std::chrono::seconds(10));
  std::string error;
  std::thread leaver([&] {
    auto comm = vflow::comm::make_gloo_communicator(rendezvous(coordinator, 1, 2, "t3", 2000));
    comm->barrier();
    // Leaves: the communicator and its connections are destroyed.
  });
  auto comm = vflow::comm::make_gloo_communicator(rendezvous(coordinator, 0, 2, "t3", 2000));
  comm->barrier();
  leaver.join();
  const auto t0 = std::chrono::steady_clock::now();
  auto t = torch::ones({1024});
  CHECK_THROWS_AS(comm->allreduce_sum(t), vflow::comm::PeerFailure);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
}

TEST_CASE("The NCCL backend loads only when used and says why it cannot run", "[unit]") {
  const auto status = vflow::comm::nccl_status();
  INFO(status.reason);
  // Built by CMake wherever CUDA's runtime and NCCL are found (this project's machines
  // have them even without a GPU); the loader must then find it next to libvflow.
  CHECK(status.built == static_cast<bool>(VFLOW_NCCL_BUILT));
  if (status.built) CHECK(status.version >= 22700);
  if (status.version < 22900) CHECK_FALSE(status.can_grow);  // ncclCommGrow came with 2.29
  if (!status.usable()) {
    CHECK_FALSE(status.reason.empty());
    Coordinator coordinator("127.0.0.1", 0, std::chrono::seconds(5));
    auto r = rendezvous(coordinator, 0, 1, "nccl");
    r.backend = "nccl";
    CHECK_THROWS_WITH(vflow::comm::make_communicator(r),
                      Catch::Contains("cannot use NCCL") && Catch::Contains(status.reason));
  }
  vflow::comm::Rendezvous unknown;
  unknown.backend = "mpi";
  CHECK_THROWS_WITH(vflow::comm::make_communicator(unknown),
                    Catch::Contains("unknown backend 'mpi'") && Catch::Contains("gloo, nccl"));
}

namespace {

/// Brute force for four members of per-vnode times `t` and per-step times `fixed`: checks
/// that no other split of 10 vnodes (each member >= 1) has a faster slowest member than
/// plan_by_speed's.
void check_no_split_is_faster(const std::vector<double>& t, const std::vector<double>& fixed) {
  const auto counts = vflow::hetero::plan_by_speed(t, 10, fixed);
  REQUIRE(counts.size() == 4);
  CHECK(std::accumulate(counts.begin(), counts.end(), int64_t{0}) == 10);
  auto slowest = [&](const std::vector<int64_t>& c) {
    double worst = 0;
    for (size_t m = 0; m < c.size(); ++m) {
      worst = std::max(worst, fixed[m] + static_cast<double>(c[m]) * t[m]);
    }
    return worst;
  };
  double best = 1e9;
  for (int64_t a = 1; a <= 7; ++a)
    for (int64_t b = 1; a + b <= 8; ++b)
      for (int64_t c = 1; a + b + c <= 9; ++c)
        best = std::min(best, slowest({a, b, c, 10 - a - b - c}));
  CHECK(slowest(counts) == Approx(best));
}

}  // namespace

TEST_CASE("a resize re-plans the split by the members' measured speeds", "[unit]") {
  using vflow::hetero::plan_by_speed;
  // A worker four times slower gets the fewest vnodes; the others as many as they finish
  // in about the same time.
  CHECK(plan_by_speed({1.0, 4.0, 1.0}, 12) == std::vector<int64_t>{6, 1, 5});
  CHECK(plan_by_speed({1.0, 1.0}, 8) == std::vector<int64_t>{4, 4});
  // A joiner not yet measured (0) counts as the fastest of the others.
  CHECK(plan_by_speed({0.1, 0.0, 0.3}, 7) == plan_by_speed({0.1, 0.1, 0.3}, 7));
  // Everyone keeps at least one vnode, and nothing measured means an even split.
  CHECK(plan_by_speed({1.0, 100.0}, 4) == std::vector<int64_t>{3, 1});
  CHECK(plan_by_speed({0.0, 0.0}, 4).empty());
  check_no_split_is_faster({0.3, 0.7, 0.2, 0.5}, {0, 0, 0, 0});
}

TEST_CASE("a resize's split counts each member's update time as well", "[unit]") {
  using vflow::hetero::plan_by_speed;
  // Equal per-vnode times, but member 1's update takes three vnodes' time: it holds fewer,
  // and both finish their steps at 7.
  CHECK(plan_by_speed({1.0, 1.0}, 11, {0.0, 3.0}) == std::vector<int64_t>{7, 4});
  CHECK(plan_by_speed({1.0, 1.0}, 11) == std::vector<int64_t>{6, 5});
  // An update time not known (< 0: a joiner with its type's profile) counts as the least
  // known one; a member not measured at all takes the fastest one's times.
  CHECK(plan_by_speed({1.0, 1.0, 1.0}, 9, {0.5, 2.0, -1}) ==
        plan_by_speed({1.0, 1.0, 1.0}, 9, {0.5, 2.0, 0.5}));
  CHECK(plan_by_speed({1.0, 0.0, 2.0}, 9, {0.5, 7.0, 2.0}) ==
        plan_by_speed({1.0, 1.0, 2.0}, 9, {0.5, 0.5, 2.0}));
  check_no_split_is_faster({0.3, 0.7, 0.2, 0.5}, {0.4, 0.0, 1.0, 0.2});
  check_no_split_is_faster({0.1, 0.1, 0.4, 0.2}, {2.0, 0.0, 0.1, 0.3});
}

TEST_CASE("members derive a communicator from an earlier one only when all can", "[integration]") {
  using vflow::job::Regroup;
  using vflow::job::RegroupOffer;
  using Kind = RegroupOffer::Kind;
  Coordinator coordinator("127.0.0.1", 0, std::chrono::seconds(10));
  const RegroupOffer none;
  const RegroupOffer join{Kind::kJoin, 0};
  auto shrink = [](int64_t parent) { return RegroupOffer{Kind::kShrink, parent}; };
  auto grow = [](int64_t parent, int64_t members) {
    return RegroupOffer{Kind::kGrow, parent, members};
  };
  // Each member offers what it can, from a thread of its own over its own connection,
  // as the workers do; every member must get the same answer.
  auto agree = [&](int64_t generation, const std::vector<RegroupOffer>& offers) {
    std::vector<std::string> members;
    for (size_t m = 0; m < offers.size(); ++m) members.push_back(fmt::format("w{}", m));
    std::vector<vflow::job::RegroupAnswer> answers(members.size());
    std::vector<std::string> errors(members.size());
    std::vector<std::thread> threads;
    for (size_t m = 0; m < members.size(); ++m) {
      threads.emplace_back([&, m] {
        try {
          vflow::job::ControlPlane control(coordinator.host(), coordinator.port(),
                                           std::chrono::seconds(5));
          answers[m] = control.agree_regroup(generation, members, members[m], offers[m],
                                             std::chrono::seconds(5));
        } catch (const std::exception& e) {
          errors[m] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (const auto& e : errors) REQUIRE(e.empty());
    for (const auto& a : answers) {
      REQUIRE(a.how == answers.front().how);
      REQUIRE(a.grown_from == answers.front().grown_from);
    }
    return answers.front();
  };
  auto how = [&](int64_t generation, const std::vector<RegroupOffer>& offers) {
    return agree(generation, offers).how;
  };
  CHECK(how(3, {shrink(2), shrink(2), shrink(2)}) == Regroup::kShrink);
  // One member lost its communicator (it failed meanwhile): nobody shrinks.
  CHECK(how(5, {shrink(4), none, shrink(4)}) == Regroup::kFresh);
  // Communicators of different generations cannot be shrunk together.
  CHECK(how(6, {shrink(5), shrink(5), shrink(4)}) == Regroup::kFresh);
  // Exactly the earlier members first, then the new ones, who can all join: a grow; the
  // new ranks learn where theirs start.
  const auto grown = agree(7, {grow(6, 2), grow(6, 2), join});
  CHECK(grown.how == Regroup::kGrow);
  CHECK(grown.grown_from == 2);
  CHECK(agree(8, {grow(7, 1), join, join}).grown_from == 1);
  // A new member that cannot join, one in the middle, an earlier member without its
  // communicator, an earlier generation of another size, a grow that adds nobody,
  // nothing but new members: afresh.
  CHECK(how(9, {grow(8, 2), grow(8, 2), none}) == Regroup::kFresh);
  CHECK(how(10, {grow(9, 2), join, grow(9, 2)}) == Regroup::kFresh);
  CHECK(how(11, {grow(10, 2), none, join}) == Regroup::kFresh);
  CHECK(how(12, {grow(11, 2), join, join}) == Regroup::kFresh);
  CHECK(how(13, {grow(12, 2), grow(12, 2)}) == Regroup::kFresh);
  CHECK(how(14, {join, join}) == Regroup::kFresh);
  CHECK(how(15, {shrink(14), join}) == Regroup::kFresh);
  CHECK(how(16, {none}) == Regroup::kFresh);

  // A member that says nothing is a PeerFailure within the timeout, naming it.
  const std::vector<std::string> members = {"w0", "w1", "w2"};
  vflow::job::ControlPlane control(coordinator.host(), coordinator.port(), std::chrono::seconds(5));
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(
      control.agree_regroup(17, members, "w0", shrink(16), std::chrono::milliseconds(300)),
      vflow::comm::PeerFailure);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3));
  CHECK_THROWS_WITH(
      control.agree_regroup(18, members, "w0", grow(17, 3), std::chrono::milliseconds(100)),
      Catch::Contains("member w1 did not say"));
  // A member that comes after another gave up on it finds every offer, but follows the
  // settled answer: nobody regroups without a member another one has given up on.
  const std::vector<std::string> pair = {"w0", "w1"};
  CHECK_THROWS_AS(control.agree_regroup(19, pair, "w0", shrink(18), std::chrono::milliseconds(100)),
                  vflow::comm::PeerFailure);
  CHECK_THROWS_WITH(control.agree_regroup(19, pair, "w1", shrink(18), std::chrono::seconds(5)),
                    Catch::Contains("member w1 did not say"));
}
