// Sums through one host's shared memory: ranks in threads and in processes of their own,
// over a real coordinator store on loopback.
#include "comm/host_memory.h"

#include <fmt/format.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <thread>

#include "support.h"
#include "vflow/job/control_store.h"
#include "vflow/job/launcher.h"

extern char** environ;

using vflow::comm::Communicator;
using vflow::job::StoreHost;

namespace {

using Clock = std::chrono::steady_clock;

/// Rank `rank`'s values for a sum of `n` elements of `dtype`: seeded by (rank, n).
torch::Tensor values(int rank, int64_t n, torch::ScalarType dtype) {
  auto g = torch::make_generator<at::CPUGeneratorImpl>(1000 * n + rank);
  if (dtype == torch::kInt) {
    // Large enough that three ranks' sums come near INT32_MAX, and negatives.
    return torch::randint(-700000000, 700000000, {n}, g, torch::kInt);
  }
  if (dtype == torch::kLong)
    return torch::randint(-(int64_t{1} << 60), int64_t{1} << 60, {n}, g, torch::kLong);
  return torch::randn({n}, g, torch::TensorOptions(dtype)) * (rank + 1);
}

/// Starts this test program running only the test case `name` (a child process's part),
/// with the coordinator's port in VFLOW_TEST_SHM_PORT and `extra` (NAME=VALUE) in its
/// environment; returns its pid.
pid_t spawn_child(const std::string& name, const StoreHost& coordinator,
                  const std::string& extra = "") {
  char self[PATH_MAX] = {};
  REQUIRE(readlink("/proc/self/exe", self, sizeof self - 1) > 0);
  std::string port = fmt::format("VFLOW_TEST_SHM_PORT={}", coordinator.port());
  std::string more = extra;
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
  env.push_back(port.data());
  if (!more.empty()) env.push_back(more.data());
  env.push_back(nullptr);
  std::string case_name = name;
  char* argv[] = {self, case_name.data(), nullptr};
  pid_t child = 0;
  REQUIRE(posix_spawn(&child, self, nullptr, nullptr, argv, env.data()) == 0);
  return child;
}

/// The child process's communicator: rank 1 of `ranks` in `generation`, over the store at
/// `port` (VFLOW_TEST_SHM_PORT).
std::unique_ptr<Communicator> child_rank_one(const char* port, int ranks,
                                             const std::string& generation) {
  vflow::comm::Rendezvous r;
  r.store_port = std::atoi(port);
  r.store =
      vflow::job::connect_embedded_store(r.store_host, r.store_port, std::chrono::seconds(20));
  r.rank = 1;
  r.world_size = ranks;
  r.generation = generation;
  r.timeout = std::chrono::seconds(20);
  return vflow::comm::make_gloo_communicator(r);
}

/// Three ranks' shares of 3000 elements, a third each, every rank wanting the others'.
vflow::comm::Shares thirds_wanted_by_all() {
  vflow::comm::Shares shares{{0, 1000, 2000, 3000}, {}};
  for (int k = 0; k < 3; ++k) {
    vflow::comm::Shares::Ranges others;
    for (int j = 0; j < 3; ++j) {
      if (j != k) others.emplace_back(1000 * j, 1000 * (j + 1));
    }
    shares.wanted.push_back(others);
  }
  return shares;
}

/// The sum over `ranks` ranks, element by element, rank 0 first.
torch::Tensor sum_in_rank_order(int ranks, int64_t n, torch::ScalarType dtype) {
  auto sum = values(0, n, dtype);
  for (int k = 1; k < ranks; ++k) sum = sum + values(k, n, dtype);
  return sum;
}

}  // namespace

TEST_CASE("ranks on one host sum through shared memory, bit for bit the sum in rank order",
          "[integration]") {
  StoreHost coordinator("127.0.0.1", 0, std::chrono::seconds(10));
  constexpr int kRanks = 3;
  // 3 M floats cross the pieces of three ranks' slots (half a slot: 1 M floats), and
  // the sums before and after start on either half.
  const std::vector<std::pair<int64_t, torch::ScalarType>> sums = {
      {3000000, torch::kFloat}, {0, torch::kFloat},   {1, torch::kFloat},      {17, torch::kDouble},
      {1000001, torch::kInt},   {4099, torch::kLong}, {2500000, torch::kFloat}};
  std::vector<std::vector<torch::Tensor>> results(kRanks);
  std::vector<bool> shared(kRanks);
  std::vector<torch::Tensor> strided(kRanks);
  const auto errors =
      vflow::testing::run_gloo_ranks(coordinator, kRanks, "shm", [&](int rank, Communicator& comm) {
        shared[rank] = vflow::comm::sums_through_host_memory(comm);
        for (const auto& [n, dtype] : sums) {
          auto t = values(rank, n, dtype);
          comm.allreduce_sum(t);
          results[rank].push_back(t);
        }
        // Not contiguous: summed in a contiguous copy.
        strided[rank] = torch::full({8, 2}, rank + 1.0f).select(1, 0);
        comm.allreduce_sum(strided[rank]);
      });
  for (int rank = 0; rank < kRanks; ++rank) {
    CAPTURE(rank, errors[rank]);
    REQUIRE(errors[rank].empty());
    CHECK(shared[rank]);
    for (size_t i = 0; i < sums.size(); ++i) {
      CAPTURE(i);
      CHECK(
          torch::equal(results[rank][i], sum_in_rank_order(kRanks, sums[i].first, sums[i].second)));
    }
    CHECK(torch::equal(strided[rank], torch::full({8}, 6.0f)));
  }

  // Turned off, the group is Gloo's alone.
  std::vector<int> off(2, -1);
  const auto off_errors = vflow::testing::run_gloo_ranks(
      coordinator, 2, "off",
      [&](int rank, Communicator& comm) {
        off[rank] = vflow::comm::sums_through_host_memory(comm) ? 1 : 0;
        auto t = torch::ones({5});
        comm.allreduce_sum(t);
      },
      /*shared_memory=*/false);
  CHECK(off_errors == std::vector<std::string>(2));
  CHECK(off == std::vector<int>{0, 0});
}

TEST_CASE("a silent peer fails a shared-memory sum within the timeout, naming it",
          "[integration]") {
  StoreHost coordinator("127.0.0.1", 0, std::chrono::seconds(10));
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::thread silent([&] {
    auto comm = vflow::comm::make_gloo_communicator(
        vflow::testing::rendezvous_at(coordinator, 1, 2, "silent", 1500));
    // Holds its communicator, never sums, until rank 0 has given up.
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return done; });
  });
  auto comm = vflow::comm::make_gloo_communicator(
      vflow::testing::rendezvous_at(coordinator, 0, 2, "silent", 1500));
  REQUIRE(vflow::comm::sums_through_host_memory(*comm));
  const auto t0 = Clock::now();
  auto t = torch::ones({1000});
  CHECK_THROWS_WITH(comm->allreduce_sum(t),
                    Catch::Contains("rank 1 did not arrive within 1500 ms"));
  const auto waited = Clock::now() - t0;
  CHECK(waited >= std::chrono::milliseconds(1500));
  CHECK(waited < std::chrono::seconds(6));
  {
    std::lock_guard<std::mutex> lock(m);
    done = true;
  }
  cv.notify_one();
  silent.join();
}

// The peer process of the next test: rank 1, one sum, then it exits at once.
TEST_CASE("shared-memory peer that exits (child process)", "[.][child]") {
  const char* port = std::getenv("VFLOW_TEST_SHM_PORT");
  if (port == nullptr) return;
  auto comm = child_rank_one(port, 2, "exit");
  auto t = torch::ones({100000});
  comm->allreduce_sum(t);
  _exit(vflow::comm::sums_through_host_memory(*comm) ? 0 : 3);
}

TEST_CASE("a peer process that exits fails the shared-memory sum at once, not at the timeout",
          "[multiproc]") {
  StoreHost coordinator("127.0.0.1", 0, std::chrono::seconds(20));
  const pid_t child = spawn_child("shared-memory peer that exits (child process)", coordinator);

  auto comm = vflow::comm::make_gloo_communicator(
      vflow::testing::rendezvous_at(coordinator, 0, 2, "exit", 20000));
  CHECK(vflow::comm::sums_through_host_memory(*comm));
  auto t = torch::ones({100000});
  comm->allreduce_sum(t);
  CHECK(t[99999].item<float>() == 2.0f);
  const auto t0 = Clock::now();
  CHECK_THROWS_WITH(comm->allreduce_sum(t),
                    Catch::Contains("rank 1 (pid") && Catch::Contains(") exited"));
  CHECK(Clock::now() - t0 < std::chrono::seconds(5));
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

// The peer process of the next test: rank 1 of 3, which arrives in a gather and waits there
// for rank 2 until it is killed.
TEST_CASE("shared-memory peer killed in a gather (child process)", "[.][child]") {
  const char* port = std::getenv("VFLOW_TEST_SHM_PORT");
  const char* arrived = std::getenv("VFLOW_TEST_SHM_ARRIVED");
  if (port == nullptr || arrived == nullptr) return;
  auto comm = child_rank_one(port, 3, "killed");
  vflow::testing::write_file(arrived, "");
  auto t = torch::full({3000}, 1.0f);
  comm->gather_shares(t, thirds_wanted_by_all());
  std::this_thread::sleep_for(std::chrono::seconds(60));
  _exit(0);
}

TEST_CASE(
    "a peer killed after it arrived in a shared-memory gather's last barrier fails it on no "
    "rank: every survivor ends the collective alike",
    "[multiproc]") {
  // Rank 1 (a process of its own) arrives and is killed while rank 0 waits for rank 2,
  // which arrives after rank 0 has seen rank 1's exit. Rank 2 finds every rank arrived and
  // ends the gather; rank 0 must too, or the survivors would be a step apart (the update
  // taken on one only), which a sharded job cannot repair.
  StoreHost coordinator("127.0.0.1", 0, std::chrono::seconds(20));
  vflow::testing::TempDir dir;
  const pid_t child = spawn_child("shared-memory peer killed in a gather (child process)",
                                  coordinator, "VFLOW_TEST_SHM_ARRIVED=" + dir.file("arrived"));

  std::mutex m;
  std::condition_variable cv;
  bool go = false;
  std::vector<torch::Tensor> gathered(3);
  std::vector<std::string> errors(3), after(3);
  const auto rank = [&](int r) {
    try {
      auto comm = vflow::comm::make_gloo_communicator(
          vflow::testing::rendezvous_at(coordinator, r, 3, "killed", 20000));
      if (!vflow::comm::sums_through_host_memory(*comm)) {
        errors[r] = "not through shared memory";
        return;
      }
      if (r == 2) {
        std::unique_lock<std::mutex> lock(m);
        cv.wait(lock, [&] { return go; });
      }
      auto t = torch::full({3000}, static_cast<float>(r));
      try {
        comm->gather_shares(t, thirds_wanted_by_all());
        gathered[r] = t;
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
      // The dead peer fails the next collective on every survivor.
      try {
        auto next = torch::ones({10});
        comm->allreduce_sum(next);
      } catch (const std::exception& e) {
        after[r] = e.what();
      }
    } catch (const std::exception& e) {
      errors[r] = std::string("setup: ") + e.what();
    }
  };
  std::thread rank0(rank, 0), rank2(rank, 2);
  for (int i = 0; i < 400 && !std::filesystem::exists(dir.file("arrived")); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // It arrives in the gather a memcpy after the file: 2 s leaves a loaded machine's
  // scheduler room (killed before it arrived, it would rightly fail the gather on all).
  std::this_thread::sleep_for(std::chrono::seconds(2));
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // rank 0 sees it gone
  {
    std::lock_guard<std::mutex> lock(m);
    go = true;
  }
  cv.notify_one();
  rank0.join();
  rank2.join();
  CHECK(WIFSIGNALED(status));
  auto expected = torch::empty({3000});
  for (int k = 0; k < 3; ++k) expected.narrow(0, 1000 * k, 1000).fill_(static_cast<float>(k));
  for (const int r : {0, 2}) {
    CAPTURE(r, errors[r], after[r]);
    CHECK(errors[r].empty());
    CHECK((gathered[r].defined() && torch::equal(gathered[r], expected)));
    CHECK_FALSE(after[r].empty());
  }
}

TEST_CASE("ranks on one host combine their tensors element by element and agree on the figure",
          "[integration]") {
  StoreHost coordinator("127.0.0.1", 0, std::chrono::seconds(10));
  constexpr int kRanks = 3;
  // The largest of the ranks' values where rank 0's is positive, else their sum; the
  // figure is the largest magnitude seen.
  const vflow::comm::Combine combine = [](const float* const* parts, int ranks, float* dst,
                                          int64_t n) {
    double figure = 0;
    for (int64_t i = 0; i < n; ++i) {
      float best = parts[0][i];
      float sum = 0;
      for (int k = 0; k < ranks; ++k) {
        best = std::max(best, parts[k][i]);
        sum += parts[k][i];
        figure = std::max(figure, static_cast<double>(std::fabs(parts[k][i])));
      }
      dst[i] = parts[0][i] > 0 ? best : sum;
    }
    return figure;
  };
  const int64_t n = 2500000;  // three pieces of three ranks' slots
  std::vector<torch::Tensor> results(kRanks);
  std::vector<double> figures(kRanks);
  const auto errors = vflow::testing::run_gloo_ranks(
      coordinator, kRanks, "combine", [&](int rank, Communicator& comm) {
        REQUIRE(comm.can_combine());
        auto t = values(rank, n, torch::kFloat);
        if (rank == 2) t[n - 1] = -100.0f;  // the largest magnitude, in the last piece
        figures[rank] = comm.allreduce_combine(t, combine);
        results[rank] = t;
      });
  std::vector<torch::Tensor> inputs;
  for (int k = 0; k < kRanks; ++k) inputs.push_back(values(k, n, torch::kFloat));
  inputs[2][n - 1] = -100.0f;
  const auto best = torch::max(torch::max(inputs[0], inputs[1]), inputs[2]);
  const auto expected = torch::where(inputs[0] > 0, best, inputs[0] + inputs[1] + inputs[2]);
  for (int rank = 0; rank < kRanks; ++rank) {
    CAPTURE(rank, errors[rank]);
    REQUIRE(errors[rank].empty());
    CHECK(torch::equal(results[rank], expected));
    CHECK(figures[rank] == 100.0);
  }

  // Gloo's sockets alone cannot.
  std::vector<std::string> refused(2);
  vflow::testing::run_gloo_ranks(
      coordinator, 2, "no-combine",
      [&](int rank, Communicator& comm) {
        auto t = torch::ones({5});
        if (comm.can_combine()) return;
        try {
          comm.allreduce_combine(t, combine);
        } catch (const vflow::Error& e) {
          refused[rank] = e.what();
        }
      },
      /*shared_memory=*/false);
  for (const auto& r : refused) CHECK_THAT(r, Catch::Contains("cannot combine"));
}

namespace {

/// `t`'s elements in the ranges `wanted`, one after another.
torch::Tensor in_ranges(const torch::Tensor& t,
                        const std::vector<std::pair<int64_t, int64_t>>& wanted) {
  std::vector<torch::Tensor> parts;
  for (const auto& [b, e] : wanted) parts.push_back(t.narrow(0, b, e - b));
  return torch::cat(parts);
}

}  // namespace

TEST_CASE(
    "a reduce-scatter and a gather by owner leave each rank what it wants, and move one "
    "allreduce's bytes through shared memory",
    "[integration]") {
  StoreHost coordinator("127.0.0.1", 0, std::chrono::seconds(10));
  constexpr int kRanks = 4;
  // Uneven shares, one of them empty and one crossing many rounds; the tail past the
  // last bound is wanted by all, as a packet's loss and table are.
  const int64_t n = 2600000;
  const std::vector<int64_t> bounds = {0, 1000000, 1300000, 1300000, n};
  using Ranges = vflow::comm::Shares::Ranges;
  // Each rank wants its ring successor's share too (a second home), and the last 1000.
  const auto wanted_by = [&](int rank) {
    Ranges wanted;
    const int next = (rank + 1) % kRanks;
    const std::pair<int64_t, int64_t> own{bounds[rank], bounds[rank + 1]};
    const std::pair<int64_t, int64_t> theirs{bounds[next], bounds[next + 1]};
    for (const auto& r : rank < next ? std::vector{own, theirs} : std::vector{theirs, own}) {
      if (r.second > r.first) wanted.push_back(r);
    }
    if (wanted.back().second < n - 1000) wanted.emplace_back(n - 1000, n);
    return wanted;
  };
  const auto not_wanted = [&](int rank) {
    Ranges rest;
    int64_t at = 0;
    for (const auto& [b, e] : wanted_by(rank)) {
      if (b > at) rest.emplace_back(at, b);
      at = e;
    }
    if (at < n) rest.emplace_back(at, n);
    return rest;
  };
  vflow::comm::Shares sums{bounds, {}}, values_of_owners{bounds, {}};
  for (int k = 0; k < kRanks; ++k) {
    sums.wanted.push_back(wanted_by(k));
    values_of_owners.wanted.push_back(not_wanted(k));
  }
  const auto expected = sum_in_rank_order(kRanks, n, torch::kFloat);
  auto owners = torch::empty({n});
  for (int k = 0; k < kRanks; ++k) {
    owners.narrow(0, bounds[k], bounds[k + 1] - bounds[k]).fill_(static_cast<float>(k));
  }
  // Through shared memory, then over Gloo's sockets (point-to-point messages): the same
  // results, bit for bit the sum in rank order.
  for (const bool shared_memory : {true, false}) {
    CAPTURE(shared_memory);
    std::vector<torch::Tensor> scattered(kRanks), gathered(kRanks);
    std::vector<int64_t> scatter_bytes(kRanks), gather_bytes(kRanks), allreduce_bytes(kRanks);
    const auto errors = vflow::testing::run_gloo_ranks(
        coordinator, kRanks, shared_memory ? "scatter" : "scatter-sockets",
        [&](int rank, Communicator& comm) {
          auto t = values(rank, n, torch::kFloat);
          int64_t before = comm.received_bytes();
          comm.reduce_scatter_sum(t, sums);
          scatter_bytes[rank] = comm.received_bytes() - before;
          scattered[rank] = t.clone();
          // The gather: each rank keeps what it wants and takes the rest from its owners.
          auto g = torch::full({n}, static_cast<float>(rank));
          before = comm.received_bytes();
          comm.gather_shares(g, values_of_owners);
          gather_bytes[rank] = comm.received_bytes() - before;
          gathered[rank] = g;
          auto whole = values(rank, n, torch::kFloat);
          before = comm.received_bytes();
          comm.allreduce_sum(whole);
          allreduce_bytes[rank] = comm.received_bytes() - before;
        },
        shared_memory);
    int64_t moved = 0, allreduce = 0;
    for (int rank = 0; rank < kRanks; ++rank) {
      CAPTURE(rank, errors[rank]);
      REQUIRE(errors[rank].empty());
      const auto wanted = wanted_by(rank);
      CHECK(torch::equal(in_ranges(scattered[rank], wanted), in_ranges(expected, wanted)));
      // Owned ranges come from their owners, the rest is untouched.
      const auto rest = not_wanted(rank);
      CHECK(torch::equal(in_ranges(gathered[rank], rest), in_ranges(owners, rest)));
      CHECK((in_ranges(gathered[rank], wanted) == static_cast<float>(rank)).all().item<bool>());
      if (!shared_memory) continue;
      // Bytes: the others' values of its own share, the others' sums it wants, the owners'
      // values of the rest.
      const int64_t own = bounds[rank + 1] - bounds[rank];
      int64_t wanted_elsewhere = -own;
      for (const auto& [b, e] : wanted) wanted_elsewhere += e - b;
      int64_t rest_elements = 0;
      for (const auto& [b, e] : rest) rest_elements += e - b;
      CHECK(scatter_bytes[rank] == 4 * ((kRanks - 1) * own + wanted_elsewhere));
      CHECK(gather_bytes[rank] == 4 * rest_elements);
      moved += scatter_bytes[rank] + gather_bytes[rank];
      allreduce += allreduce_bytes[rank];
    }
    if (!shared_memory) {
      CHECK(scatter_bytes == std::vector<int64_t>(kRanks, 0));  // -1 - -1: not counted
      continue;
    }
    // Over the group, a reduce-scatter to each rank's shares and the gather of the rest
    // move what one allreduce moves: a rank takes each element it does not own once, as a
    // sum where it wants it, as its owner's value elsewhere.
    CHECK(allreduce == int64_t{4} * 2 * (kRanks - 1) * n);
    CHECK(moved == allreduce);
  }
}
