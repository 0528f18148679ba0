// The Gloo communicator over a real coordinator store on loopback, ranks in threads.
#include "vflow/comm/communicator.h"

#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "support.h"
#include "vflow/comm/nccl.h"
#include "vflow/job/launcher.h"

using vflow::comm::Rendezvous;
using vflow::job::StoreHost;

namespace {
Rendezvous rendezvous(const StoreHost& c, int rank, int size, const std::string& generation,
                      int timeout_ms = 10000) {
  return vflow::testing::rendezvous_at(c, rank, size, generation, timeout_ms);
}
}  // namespace

TEST_CASE("Gloo collectives over the coordinator's store", "[integration]") {
  StoreHost coordinator("127.0.0.1", 0, std::chrono::seconds(10));
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
  StoreHost coordinator("127.0.0.1", 0, std::chrono::seconds(10));
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(vflow::comm::make_gloo_communicator(rendezvous(coordinator, 0, 2, "t2", 1000)),
                  vflow::comm::PeerFailure);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
}

TEST_CASE("a peer that leaves mid-job makes the next collective fail, not hang", "[integration]") {
  StoreHost coordinator("127.0.0.1", 0, std::chrono::seconds(10));
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
    StoreHost coordinator("127.0.0.1", 0, std::chrono::seconds(5));
    auto r = rendezvous(coordinator, 0, 1, "nccl");
    r.backend = vflow::comm::Backend::kNccl;
    CHECK_THROWS_WITH(vflow::comm::make_communicator(r),
                      Catch::Contains("cannot use NCCL") && Catch::Contains(status.reason));
  }
  vflow::comm::Rendezvous unchosen;
  unchosen.backend = vflow::comm::Backend::kAuto;
  CHECK_THROWS_WITH(vflow::comm::make_communicator(unchosen), Catch::Contains("not chosen"));
}
