// The GPU path: the NCCL communicator against Gloo, its regrouping and abort, and CUDA
// training against the CPU (in the spirit of ggml's test-backend-ops). Ranks run as
// threads over a real coordinator store on loopback.
#include <fmt/format.h>
#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <exception>
#include <thread>

#include "apps/multiworker_support.h"
#include "cuda/skip.h"
#include "engine/copy_stream.h"
#include "support.h"
#include "vflow/comm/nccl.h"
#include "vflow/comm/split_sum.h"
#include "vflow/engine/run_job.h"
#include "vflow/job/launcher.h"
#include "vflow/vnode/fixed_point.h"

using vflow::comm::Rendezvous;
using vflow::job::StoreHost;
using vflow::testing::skip_unless;

namespace {

Rendezvous rendezvous(const StoreHost& c, int rank, int size, const std::string& generation,
                      int device, vflow::comm::Backend backend = vflow::comm::Backend::kNccl,
                      int timeout_ms = 20000) {
  auto r = vflow::testing::rendezvous_at(c, rank, size, generation, timeout_ms);
  r.backend = backend;
  r.cuda_device = device;
  return r;
}

vflow::comm::NcclStatus usable_nccl() {
  const auto s = vflow::comm::nccl_status();
  skip_unless(s.usable(), "NCCL cannot be used: " + s.reason);
  return s;
}

/// Devices for two NCCL ranks: two GPUs, or one GPU shared (NCCL >= 2.30 only).
std::pair<int, int> two_rank_devices(const vflow::comm::NcclStatus& s) {
  if (s.devices >= 2) return {0, 1};
  skip_unless(s.version >= 23000,
              fmt::format("two NCCL ranks need two GPUs or NCCL >= 2.30 (found {} GPU, "
                          "NCCL {})",
                          s.devices, s.version));
  return {0, 0};
}

/// Runs `body(rank)` on `ranks` threads; returns each rank's error message (empty = ok).
template <typename Body>
std::vector<std::string> on_ranks(int ranks, Body body) {
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(rank);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(rank)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

/// Rank-specific values, made without a random generator (ranks run as threads, which
/// would share LibTorch's global one).
torch::Tensor payload(int rank, int64_t n) {
  return torch::arange(n, torch::kFloat32).mul_(0.37 * (rank + 1)).sin_().mul_(rank + 1);
}

}  // namespace

TEST_CASE("NCCL of one rank: collectives on host tensors and on the device", "[cuda]") {
  usable_nccl();
  StoreHost coordinator("127.0.0.1", 0, std::chrono::seconds(20));
  auto comm = vflow::comm::make_nccl_communicator(rendezvous(coordinator, 0, 1, "one", 0));
  CHECK(comm->size() == 1);
  const auto x = payload(0, 1000);
  auto y = x.clone();
  comm->allreduce_sum(y);  // a host tensor, staged through device memory
  CHECK(torch::equal(x, y));
  auto ints = torch::arange(10, torch::kInt64);
  comm->broadcast(ints, 0);
  CHECK(torch::equal(ints, torch::arange(10, torch::kInt64)));
  CHECK(torch::equal(comm->all_gather(x)[0], x));
  comm->barrier();
  if (torch::cuda::is_available()) {
    auto d = x.to(torch::Device(torch::kCUDA, 0));
    comm->allreduce_sum(d);
    CHECK(torch::equal(d.cpu(), x));
    CHECK(torch::equal(comm->all_gather(d)[0].cpu(), x));
  }
}

TEST_CASE("NCCL sums, broadcasts and gathers exactly as Gloo does", "[cuda]") {
  const auto status = usable_nccl();
  // Not a structured binding: the ranks' lambda captures them (C++20; clang refuses it).
  const auto devices = two_rank_devices(status);
  const int d0 = devices.first, d1 = devices.second;
  StoreHost coordinator("127.0.0.1", 0, std::chrono::seconds(20));
  std::vector<std::vector<torch::Tensor>> out(2);
  for (const auto backend : {vflow::comm::Backend::kGloo, vflow::comm::Backend::kNccl}) {
    const auto errors = on_ranks(2, [&, backend = backend](int rank) {
      auto comm = vflow::comm::make_communicator(
          rendezvous(coordinator, rank, 2, to_string(backend), rank == 0 ? d0 : d1, backend));
      auto sum = payload(rank, 100000);
      comm->allreduce_sum(sum);
      auto ints = torch::full({7}, rank * 10 + 1, torch::kInt64);
      comm->allreduce_sum(ints);
      auto root = payload(rank, 33);
      comm->broadcast(root, 1);
      const auto gathered = comm->all_gather(torch::full({3}, static_cast<float>(rank)));
      if (rank == 0)
        out[backend == vflow::comm::Backend::kGloo ? 0 : 1] = {sum, ints, root, gathered[1]};
    });
    CAPTURE(to_string(backend), errors[0], errors[1]);
    REQUIRE(errors[0].empty());
    REQUIRE(errors[1].empty());
  }
  // Two summands: float addition is commutative, so both backends agree bitwise.
  for (size_t i = 0; i < out[0].size(); ++i) CHECK(torch::equal(out[0][i], out[1][i]));
}

TEST_CASE("NCCL refuses two ranks on one GPU clearly before 2.30", "[cuda]") {
  const auto status = usable_nccl();
  skip_unless(status.version < 23000,
              fmt::format("NCCL {} takes two ranks on one GPU", status.version));
  StoreHost coordinator("127.0.0.1", 0, std::chrono::seconds(20));
  const auto errors = on_ranks(2, [&](int rank) {
    vflow::comm::make_nccl_communicator(rendezvous(coordinator, rank, 2, "shared", 0));
  });
  for (const auto& e : errors) CHECK_THAT(e, Catch::Contains("on one GPU"));
}

TEST_CASE("NCCL shrinks to the ranks that stay", "[cuda]") {
  const auto status = usable_nccl();
  skip_unless(status.version >= 22700, "ncclCommShrink needs NCCL >= 2.27");
  StoreHost coordinator("127.0.0.1", 0, std::chrono::seconds(20));
  {
    // No shrink for an empty exclusion list (NCCL rejects it) nor after a failure (the
    // communicator was aborted): the caller initialises afresh.
    auto comm = vflow::comm::make_nccl_communicator(rendezvous(coordinator, 0, 1, "s1", 0));
    CHECK_FALSE(comm->shrink({}, /*after_failure=*/false));
    CHECK_FALSE(comm->shrink({0}, /*after_failure=*/true));
    auto x = torch::ones({5});
    comm->allreduce_sum(x);  // still usable
    CHECK(x.sum().item<float>() == 5.0f);
  }
  if (status.devices < 2 && status.version < 23000) return;  // no two ranks on this GPU
  const auto [d0, d1] = two_rank_devices(status);
  std::vector<float> seen(2, -1);
  const auto errors = on_ranks(2, [&, d0 = d0, d1 = d1](int rank) {
    auto comm = vflow::comm::make_nccl_communicator(
        rendezvous(coordinator, rank, 2, "s2", rank == 0 ? d0 : d1));
    if (rank == 1) return;  // leaves; rank 0 goes on alone
    auto child = comm->shrink({1}, /*after_failure=*/false);
    if (!child) throw std::runtime_error("no communicator from the shrink");
    auto x = torch::full({4}, 3.0f);
    child->allreduce_sum(x);
    seen[0] = x[0].item<float>();
    seen[1] = static_cast<float>(child->size());
  });
  CAPTURE(errors[0], errors[1]);
  CHECK(errors[0].empty());
  CHECK(seen[0] == 3.0f);
  CHECK(seen[1] == 1.0f);
}

namespace {

/// Grows an NCCL communicator of `earlier` ranks (made afresh and used once) by `added`
/// new ranks on `devices` (by rank); returns each rank's sum of rank + 1 over the grown
/// communicator, plus 100 times the value broadcast from the last new rank.
std::vector<float> grow_and_sum(const StoreHost& coordinator, const std::string& name, int earlier,
                                int added, const std::vector<int>& devices) {
  const int size = earlier + added;
  std::vector<float> seen(static_cast<size_t>(size), -1);
  const auto errors = on_ranks(size, [&](int rank) {
    auto next = rendezvous(coordinator, rank, size, name + "-grown", devices[rank]);
    std::unique_ptr<vflow::comm::Communicator> comm;
    if (rank < earlier) {
      auto before = vflow::comm::make_nccl_communicator(
          rendezvous(coordinator, rank, earlier, name, devices[rank]));
      auto x = torch::ones({3});
      before->allreduce_sum(x);
      comm = before->grow(next);
      if (!comm) throw std::runtime_error("no communicator from the grow");
    } else {
      next.grown_from = earlier;
      comm = vflow::comm::make_nccl_communicator(next);
    }
    if (comm->rank() != rank || comm->size() != size) {
      throw std::runtime_error(fmt::format("rank {} of {} after the grow, not {} of {}",
                                           comm->rank(), comm->size(), rank, size));
    }
    auto x = torch::full({4}, static_cast<float>(rank + 1));
    comm->allreduce_sum(x);
    auto root = torch::full({2}, static_cast<float>(rank + 7));
    comm->broadcast(root, size - 1);
    seen[static_cast<size_t>(rank)] = x[0].item<float>() + 100 * root[0].item<float>();
  });
  for (int rank = 0; rank < size; ++rank) {
    CAPTURE(name, rank, errors[static_cast<size_t>(rank)]);
    CHECK(errors[static_cast<size_t>(rank)].empty());
  }
  return seen;
}

}  // namespace

TEST_CASE("NCCL grows by new ranks that join, keeping the earlier ranks' numbers", "[cuda]") {
  const auto status = usable_nccl();
  skip_unless(status.can_grow,
              fmt::format("ncclCommGrow needs NCCL >= 2.29 (found {})", status.version));
  const auto [d0, d1] = two_rank_devices(status);
  StoreHost coordinator("127.0.0.1", 0, std::chrono::seconds(20));
  // 1 -> 2: rank 0 alone passes the grow id.
  CHECK(grow_and_sum(coordinator, "one", 1, 1, {d0, d1}) == std::vector<float>(2, 803.0f));
  // 2 -> 3: an earlier rank that passes no id (three GPUs, or one shared from 2.30 on).
  if (status.devices >= 3 || status.version >= 23000) {
    const std::vector<int> devices = {0, 1 % status.devices, 2 % status.devices};
    CHECK(grow_and_sum(coordinator, "two", 2, 1, devices) == std::vector<float>(3, 906.0f));
  }
  // Gloo cannot derive communicators: its members start afresh.
  auto gloo = vflow::comm::make_communicator(
      rendezvous(coordinator, 0, 1, "g", 0, vflow::comm::Backend::kGloo));
  CHECK_FALSE(gloo->grow(rendezvous(coordinator, 0, 2, "g2", 0, vflow::comm::Backend::kGloo)));
}

TEST_CASE("A silent NCCL peer ends the collective within the timeout and aborts", "[cuda]") {
  const auto status = usable_nccl();
  StoreHost coordinator("127.0.0.1", 0, std::chrono::seconds(20));
  const int timeout_ms = 3000;
  if (status.devices < 2 && status.version < 23000) {
    // One GPU: the peer never arrives at all; the id exchange gives up in time.
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(vflow::comm::make_nccl_communicator(rendezvous(
                        coordinator, 0, 2, "absent", 0, vflow::comm::Backend::kNccl, timeout_ms)),
                    vflow::comm::PeerFailure);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(3 * timeout_ms));
    return;
  }
  const auto [d0, d1] = two_rank_devices(status);
  std::string second_call;
  double waited = 0;
  const auto errors = on_ranks(2, [&, d0 = d0, d1 = d1](int rank) {
    auto comm = vflow::comm::make_nccl_communicator(
        rendezvous(coordinator, rank, 2, "silent", rank == 0 ? d0 : d1, vflow::comm::Backend::kNccl,
                   timeout_ms));
    if (rank == 1) {
      // Stays silent, then aborts too (all ranks of a failed communicator abort).
      std::this_thread::sleep_for(std::chrono::milliseconds(2 * timeout_ms));
      comm->abort();
      return;
    }
    auto x = torch::ones({1 << 20});
    const auto t0 = std::chrono::steady_clock::now();
    try {
      comm->allreduce_sum(x);
    } catch (const vflow::comm::PeerFailure&) {
      waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    try {
      comm->allreduce_sum(x);
    } catch (const vflow::comm::PeerFailure& e) {
      second_call = e.what();
    }
  });
  CAPTURE(errors[0], errors[1]);
  CHECK(errors[0].empty());
  CHECK(waited >= 0.9 * timeout_ms / 1000.0);
  CHECK(waited < 2.0 * timeout_ms / 1000.0);
  CHECK_THAT(second_call, Catch::Contains("aborted"));
}

namespace {
std::vector<double> first_losses(const std::string& device, int steps) {
  auto spec = vflow::testing::small_job(
      {"resources.device=" + device, fmt::format("semantic.steps={}", steps),
       "semantic.model.options.dropout=0", "output.evaluation.enabled=false"});
  struct Record : vflow::engine::TrainingObserver {
    std::vector<double> losses;
    void on_step_end(vflow::engine::Trainer&, const vflow::engine::StepInfo& info) override {
      losses.push_back(info.loss);
    }
  };
  auto record = std::make_shared<Record>();
  auto trainer = vflow::engine::make_trainer(spec);
  trainer->add_observer(record);
  trainer->run();
  return record->losses;
}
}  // namespace

TEST_CASE("The first CUDA steps follow the CPU's within the documented tolerance", "[cuda]") {
  skip_unless(torch::cuda::is_available(), "this LibTorch has no CUDA device");
  // Dropout masks come from per-device generators, so the check runs the job's model
  // without dropout; tolerance (docs/gpu.md): relative 1e-3 over the first 5 steps.
  const auto cpu = first_losses("cpu", 5);
  const auto cuda = first_losses("cuda:0", 5);
  REQUIRE(cpu.size() == cuda.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    CAPTURE(i, cpu[i], cuda[i]);
    CHECK(std::abs(cpu[i] - cuda[i]) <= 1e-3 * std::abs(cpu[i]));
  }
}

TEST_CASE("A batch copied on the side stream is whole when the computing stream reads it",
          "[cuda]") {
  skip_unless(torch::cuda::is_available(), "this LibTorch has no CUDA device");
  const torch::Device device("cuda:0");
  const vflow::engine::CopyStream copies(device);
  // 64 MiB batches. Each round, kernels on the computing stream read the batch behind
  // long matrix products, the batch is dropped at once, and the next batch is copied
  // from another thread (as the loader does) into memory the allocator may hand out
  // again: without the event and the recorded use, those reads would see memory not yet
  // written, or the next batch.
  const auto values = torch::arange(int64_t{1} << 24, torch::kFloat32);
  const auto ids = torch::arange(1000, torch::kInt64);
  const auto busy = torch::rand({4096, 4096}, device);
  auto copy_on_loader = [&](int round) {
    vflow::engine::CopiedBatch out;
    std::exception_ptr error;
    std::thread([&] {
      try {
        out = copies.copy({values + static_cast<float>(round), ids * round});
      } catch (...) {
        error = std::current_exception();
      }
    }).join();
    if (error) std::rethrow_exception(error);
    return out;
  };
  auto pending = copy_on_loader(0);
  for (int round = 1; round <= 4; ++round) {
    torch::Tensor doubled, targets;
    {
      const auto batch = copies.ready(std::move(pending));
      REQUIRE(batch.input.device() == device);
      for (int k = 0; k < 8; ++k) busy.mm(busy);  // keeps the computing stream busy
      doubled = batch.input * 2;
      targets = batch.target + 0;
    }
    pending = copy_on_loader(round);
    CAPTURE(round);
    CHECK(torch::equal(doubled.cpu(), (values + static_cast<float>(round - 1)) * 2));
    CHECK(torch::equal(targets.cpu(), ids * (round - 1)));
  }
}

TEST_CASE("Deterministic mode's exact sum on a CUDA device gives the CPU's bits", "[cuda]") {
  skip_unless(torch::cuda::is_available(), "this LibTorch has no CUDA device");
  using vflow::vnode::FixedPointSum;
  // Four vnodes' values, the largest magnitudes from 2^-9 up to 4: across the CPU's
  // 32-bit room (2^-6) and the two-rank dense limit, over a ragged length.
  const int64_t n = (int64_t{1} << 17) + 977;
  const auto vnode = [&](int k) { return payload(k, n).mul_(std::ldexp(1.0, 3 * k - 9)); };
  struct Result {
    torch::Tensor rounded, dense, index, value;
  };
  const auto run = [&](torch::Device device) {
    Result r;
    FixedPointSum one(n, device);  // one worker: absorb three, round the last in place
    for (int k = 0; k < 3; ++k) {
      auto v = vnode(k).to(device);
      CHECK(one.absorb(v) < FixedPointSum::kLimit);
    }
    auto last = vnode(3).to(device);
    CHECK(one.round_in_place(last) < FixedPointSum::kLimit);
    r.rounded = last.cpu();
    FixedPointSum two(n, device);  // a rank of two: absorb three, split the last
    for (int k = 0; k < 3; ++k) {
      auto v = vnode(k).to(device);
      two.absorb(v);
    }
    auto dense = torch::zeros({n}, torch::TensorOptions(torch::kInt32).device(device));
    two.split(vnode(3).to(device), vflow::comm::SplitSum::dense_limit(2), dense, r.index, r.value);
    r.dense = dense.cpu();
    return r;
  };
  const auto cpu = run(torch::kCPU);
  const auto cuda = run(torch::Device(torch::kCUDA, 0));
  CHECK(torch::equal(cpu.rounded, cuda.rounded));
  CHECK(torch::equal(cpu.dense, cuda.dense));
  CHECK(torch::equal(cpu.index, cuda.index));
  CHECK(torch::equal(cpu.value, cuda.value));
  CHECK(cpu.index.numel() > 0);  // some values were large enough to be listed
}

TEST_CASE("A deterministic job on one CUDA device gives one fingerprint, run after run", "[cuda]") {
  skip_unless(torch::cuda::is_available(), "this LibTorch has no CUDA device");
  using namespace vflow::testing;
  auto train = [] {
    const auto r = run_command(kTrain + kJob + kDeterministic +
                               " --set resources.device=cuda:0 --workers 1 2>&1");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    return fingerprints_in(r.output);
  };
  const auto first = train();
  REQUIRE(first.size() == 1);
  CHECK(train() == first);
}

TEST_CASE("Two CUDA workers over NCCL give the one-worker fingerprint", "[cuda][multiproc]") {
  const auto status = usable_nccl();
  skip_unless(torch::cuda::is_available(), "this LibTorch has no CUDA device");
  two_rank_devices(status);
  using namespace vflow::testing;
  auto train = [](int workers) {
    const auto r = run_command(kTrain + kJob + kDeterministic +
                               " --set resources.device=cuda --set resources.backend=auto" +
                               " --workers " + std::to_string(workers) + " 2>&1");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    return r.output;
  };
  const auto one = train(1);
  const auto two = train(2);
  CHECK_THAT(two, Catch::Contains("nccl") || Catch::Contains("NCCL"));
  CHECK(fingerprints_in(two) == fingerprints_in(one));
}

TEST_CASE("A CUDA and a CPU worker in one layout talk through Gloo and follow the CPU run",
          "[cuda][multiproc][hetero]") {
  skip_unless(torch::cuda::is_available(), "this LibTorch has no CUDA device");
  using namespace vflow::testing;
  // Dropout off (its masks come from per-device generators); tolerance as for one CUDA
  // worker against the CPU (docs/gpu.md) over the first 5 steps, 2e-2 after that (the
  // rounding differences compound).
  TempDir dir;
  auto train = [&](const std::string& name, const std::string& extra) {
    const std::string metrics = dir.file(name + ".jsonl");
    const auto r = run_command(kTrain + kJob + " --set semantic.model.options.dropout=0" +
                               " --set output.logging.every_steps=1" +
                               " --set output.logging.metrics=" + metrics + extra + " 2>&1");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    return std::make_pair(r.output, step_losses(metrics));
  };
  const auto [cpu_output, cpu] = train("cpu", " --workers 1");
  const auto [mixed_output, mixed] =
      train("mixed",
            " --set resources.workers=2"
            " --set 'resources.layout=[{vnodes: 8, device: \"cuda:0\"}, {vnodes: 4}]'");
  CHECK_THAT(mixed_output, Catch::Contains("gloo") && Catch::Contains("on cuda:0"));
  REQUIRE(cpu.size() == mixed.size());
  for (size_t i = 0; i < cpu.size(); ++i) {
    CAPTURE(i, cpu[i], mixed[i]);
    CHECK(std::abs(cpu[i] - mixed[i]) <= (i < 5 ? 1e-3 : 2e-2) * std::abs(cpu[i]));
  }
}

TEST_CASE("Training state moves between a CUDA and a CPU worker and trains on", "[cuda]") {
  skip_unless(torch::cuda::is_available(), "this LibTorch has no CUDA device");
  // A joiner or a survivor behind takes the donor's state whatever device either is on:
  // the optimizer's momentum buffers must land on the receiver's device.
  auto job = [](const std::string& device) {
    return vflow::engine::make_trainer(vflow::testing::small_job(
        {"resources.device=" + device, "semantic.steps=6", "output.evaluation.enabled=false"}));
  };
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"cuda:0", "cpu"},
                                 std::pair<std::string, std::string>{"cpu", "cuda:0"}}) {
    CAPTURE(from, to);
    const auto donor = job(from);
    donor->train_step();
    donor->train_step();
    const auto receiver = job(to);
    receiver->load_state_bytes(donor->state_bytes());
    CHECK(receiver->step() == 2);
    CHECK(receiver->fingerprint() == donor->fingerprint());
    CHECK_NOTHROW(receiver->train_step());  // the optimizer step runs on its own device
  }
}

TEST_CASE("A CUDA job over NCCL grows and shrinks while it trains and keeps its fingerprint",
          "[cuda][multiproc][elastic]") {
  const auto status = usable_nccl();
  skip_unless(torch::cuda::is_available(), "this LibTorch has no CUDA device");
  two_rank_devices(status);
  using namespace vflow::testing;
  const std::string job = kJob + kDeterministic +
                          " --set semantic.steps=1500 --set resources.timeout_s=10"
                          " --set output.logging.every_steps=1 --set resources.device=cuda"
                          " --set resources.backend=nccl";
  const auto fixed = run_command(kTrain + job + " --workers 1");
  INFO(fixed.output);
  REQUIRE(fixed.exit_code == 0);
  TempDir dir;
  const auto r = run_elastic_job(dir, 1, job,
                                 "$CTL resize $A 2; await_workers 2; $CTL resize $A 1; "
                                 "await_workers 1");
  INFO(r.output);
  CHECK_THAT(r.output, Catch::Contains("exit=0"));
  CHECK_THAT(r.output, !Catch::Contains("TIMEOUT") && !Catch::Contains("GONE"));
  CHECK(fingerprints_in(r.output) == fingerprints_in(fixed.output));
  // How the communicators were made: generation 1 afresh; generation 2 grown by both
  // members where NCCL can (2.29), else afresh; generation 3 shrunk (2.27).
  CHECK(count_matches(r.output, "nccl grow\\)") == (status.can_grow ? 2 : 0));
  CHECK(count_matches(r.output, "nccl init\\)") >= (status.can_grow ? 1 : 3));
  if (status.version >= 22700) CHECK(count_matches(r.output, "nccl shrink\\)") == 1);
}
