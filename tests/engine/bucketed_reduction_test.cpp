// The reduction in buckets overlapped with the backward pass: its buckets, its sums over
// real Gloo ranks (a parameter without a gradient included), and a silent peer costing one
// timeout in all, not one per bucket.
#include "engine/bucketed_reduction.h"

#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "engine/small_net.h"
#include "support.h"
#include "vflow/comm/communicator.h"
#include "vflow/job/control_plane.h"
#include "vflow/vnode/step_packet.h"

using vflow::engine::BucketedReduction;

namespace {

using Net = vflow::testing::SmallNet;

constexpr int64_t kTable = 3;

/// Rank r's input. Made before the ranks' threads start, as their networks are: the
/// random generator is global.
torch::Tensor input(int rank) {
  torch::manual_seed(40 + rank);
  return torch::randn({6, 8});
}

/// Rank r's packet before the reduction: its gradients and a table of r + 1.
torch::Tensor contribution(int rank) {
  Net net;
  vflow::vnode::StepPacket packet(net.parameters(), kTable);
  packet.table().fill_(rank + 1);
  net.loss(input(rank)).backward();
  return packet.flat().clone();
}

}  // namespace

TEST_CASE("buckets cover the packet in reverse parameter order, the table in the first", "[unit]") {
  Net net;
  vflow::vnode::StepPacket packet(net.parameters(), kTable);
  const int64_t bytes = GENERATE(as<int64_t>{}, 1, 256, 1000, int64_t{1} << 30);
  CAPTURE(bytes);
  BucketedReduction reduction(packet, bytes);
  const auto& buckets = reduction.buckets();
  REQUIRE(!buckets.empty());
  int64_t end = packet.numel();  // the first bucket ends at the packet's end
  const auto& offsets = packet.gradient_buffer().layout().offsets;
  for (size_t k = 0; k < buckets.size(); ++k) {
    CAPTURE(k);
    CHECK(buckets[k].offset + buckets[k].numel == end);
    // Whole parameters: every bucket begins where a parameter does.
    CHECK(std::find(offsets.begin(), offsets.end(), buckets[k].offset) != offsets.end());
    const int64_t gradients =
        (std::min(end, packet.gradient_buffer().layout().numel) - buckets[k].offset) * 4;
    if (k + 1 < buckets.size()) CHECK(gradients >= bytes);
    end = buckets[k].offset;
  }
  CHECK(end == 0);
  if (bytes == 1) CHECK(buckets.size() == offsets.size());  // one bucket per parameter
  if (bytes == int64_t{1} << 30) CHECK(buckets.size() == 1);
}

TEST_CASE("first parameters of no elements make no empty bucket: only the last begins at 0",
          "[unit]") {
  // Deterministic mode's listed values ride in the one bucket that begins at offset 0.
  torch::nn::Module m;
  m.register_parameter("empty", torch::zeros({0}));
  m.register_parameter("also_empty", torch::zeros({0}));
  m.register_parameter("w", torch::randn({16}));
  m.register_parameter("v", torch::randn({8}));
  vflow::vnode::StepPacket packet(m.parameters(), kTable);
  BucketedReduction reduction(packet, /*bucket_bytes=*/1);
  const auto& buckets = reduction.buckets();
  REQUIRE(buckets.size() == 2);  // v with the table, then w with the empty ones
  CHECK(buckets.back().offset == 0);
  CHECK(buckets.back().numel == 16);
  CHECK(buckets.front().offset == 16);
  CHECK(buckets.front().numel == packet.numel() - 16);  // v and all past the gradients
}

TEST_CASE(
    "bucketed sums over Gloo ranks equal the whole packet's sum, buckets start in the "
    "backward pass, one without gradients after it",
    "[integration]") {
  constexpr int kRanks = 2;  // two addends: Gloo's sum is exact, so compare bitwise
  auto expected = contribution(0);
  for (int r = 1; r < kRanks; ++r) expected.add_(contribution(r));
  vflow::job::StoreHost coordinator("127.0.0.1", 0, std::chrono::seconds(10));
  std::vector<torch::Tensor> results(kRanks);
  std::vector<size_t> during(kRanks), total(kRanks);
  std::vector<std::unique_ptr<Net>> nets;
  std::vector<torch::Tensor> inputs;
  for (int r = 0; r < kRanks; ++r) {
    nets.push_back(std::make_unique<Net>());
    inputs.push_back(input(r));
  }
  const auto errors = vflow::testing::run_gloo_ranks(
      coordinator, kRanks, "buckets", [&](int rank, vflow::comm::Communicator& comm) {
        auto& net = *nets[rank];
        vflow::vnode::StepPacket packet(net.parameters(), kTable);
        BucketedReduction reduction(packet, /*bucket_bytes=*/256);
        total[rank] = reduction.buckets().size();
        for (int step = 0; step < 2; ++step) {  // the hooks serve step after step
          packet.clear();
          packet.table().fill_(rank + 1);
          reduction.arm(comm);
          net.loss(inputs[rank]).backward();
          during[rank] = reduction.started();
          reduction.finish(comm);
        }
        results[rank] = packet.flat().clone();
      });
  for (int r = 0; r < kRanks; ++r) {
    CAPTURE(r);
    REQUIRE(errors[r].empty());
    CHECK(total[r] == 3);
    // c's and b's buckets start inside the backward pass; the one holding `unused`
    // (no gradient) waits for finish().
    CHECK(during[r] == 2);
    CHECK(torch::equal(results[r], expected));
  }
}

TEST_CASE("a silent peer fails every queued bucket within one timeout in all", "[integration]") {
  constexpr int kTimeoutMs = 1000;
  constexpr int kRanks = 4;  // rank 3 is silent; ranks 1 and 2 are not next to it in a ring
  vflow::job::StoreHost coordinator("127.0.0.1", 0, std::chrono::seconds(10));
  // Per active rank: from finish() until its communicator is gone, as after a failure.
  std::vector<double> waited(kRanks - 1, -1);
  std::vector<std::string> failure(kRanks - 1), error(kRanks - 1);
  std::vector<std::unique_ptr<Net>> nets;
  std::vector<torch::Tensor> inputs;
  for (int r = 0; r < kRanks - 1; ++r) {
    nets.push_back(std::make_unique<Net>());
    inputs.push_back(input(r));
  }
  std::vector<std::thread> threads;
  threads.emplace_back([&] {  // joins, then takes part in no collective for a while
    try {
      auto comm = vflow::comm::make_gloo_communicator(
          vflow::testing::rendezvous_at(coordinator, kRanks - 1, kRanks, "silent", kTimeoutMs));
      std::this_thread::sleep_for(std::chrono::milliseconds(5 * kTimeoutMs));
    } catch (const std::exception&) {
      // its peers have given up on it by now: nothing to check here
    }
  });
  for (int rank = 0; rank < kRanks - 1; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        auto comm = vflow::comm::make_gloo_communicator(
            vflow::testing::rendezvous_at(coordinator, rank, kRanks, "silent", kTimeoutMs));
        vflow::vnode::StepPacket packet(nets[rank]->parameters(), kTable);
        BucketedReduction reduction(packet, /*bucket_bytes=*/1);  // one bucket a parameter
        REQUIRE(reduction.buckets().size() == 8);
        reduction.arm(*comm);
        nets[rank]->loss(inputs[rank]).backward();
        const auto t0 = std::chrono::steady_clock::now();
        try {
          reduction.finish(*comm);
        } catch (const vflow::comm::PeerFailure& e) {
          failure[rank] = e.what();
        }
        comm.reset();
        waited[rank] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      } catch (const std::exception& e) {
        error[rank] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < kRanks - 1; ++rank) {
    CAPTURE(rank, failure[rank], waited[rank]);
    REQUIRE(error[rank].empty());
    CHECK(failure[rank].find("allreduce failed on rank") != std::string::npos);
    // Gloo runs two collectives at a time and its group's destructor runs what is
    // queued; it closes the connections of a collective that timed out, so that the
    // queued ones fail at once, and the shared deadline bounds the waits.
    CHECK(waited[rank] > 0);
    CHECK(waited[rank] < 2.5 * kTimeoutMs / 1000.0);
  }
}
