// The same job on K = 1..4 worker processes (docs/design.md §2 across workers).
#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <fstream>
#include <regex>
#include <set>

#include "apps/multiworker_support.h"
#include "image_support.h"
#include "support.h"
#include "vflow/job/launcher.h"

using vflow::testing::run_command;
using vflow::testing::TempDir;

namespace {
using namespace vflow::testing;

struct Run {
  std::set<std::string> fingerprints;  // one per rank; all equal when consistent
  std::vector<double> losses;          // per step, from rank 0's metrics
  std::string output;
};

Run train(int workers, const std::string& extra) {
  TempDir dir;
  const std::string metrics = dir.file("m.jsonl");
  const auto r =
      run_command(kTrain + kJob + extra + " --workers " + std::to_string(workers) +
                  " --set output.logging.every_steps=1 --set output.logging.metrics=" + metrics);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  Run run;
  run.output = r.output;
  run.fingerprints = fingerprints_in(r.output);
  run.losses = step_losses(metrics);
  REQUIRE(static_cast<int>(std::count(r.output.begin(), r.output.end(), '\n')) > 0);
  return run;
}
}  // namespace

TEST_CASE("deterministic jobs give the same fingerprint on 1, 2, 3 and 4 workers", "[multiproc]") {
  const auto one = train(1, " --set semantic.deterministic=true");
  REQUIRE(one.fingerprints.size() == 1);
  REQUIRE(one.losses.size() == 16);
  for (int k : {2, 3, 4}) {
    CAPTURE(k);
    const auto run = train(k, " --set semantic.deterministic=true");
    INFO(run.output);
    CHECK(run.fingerprints == one.fingerprints);  // every rank, bitwise
    CHECK(run.losses == one.losses);
  }
}

TEST_CASE("a launcher's workers are forks of its zygote and train as executed ones do",
          "[multiproc]") {
  const std::string job = kTrain + kJob + kDeterministic + " --workers 3";
  const auto forked = run_command("VFLOW_ZYGOTE=1 " + job);
  INFO(forked.output);
  REQUIRE(forked.exit_code == 0);
  CHECK(count_matches(forked.output, "worker \\d+ ready \\(forked from its launcher's zygote\\)") ==
        3);
  // Each has its own streams (the launcher prefixes each line with the worker's name).
  CHECK(count_matches(forked.output, "\\[worker [012]\\] fingerprint") == 3);
  const auto executed = run_command(job);
  INFO(executed.output);
  REQUIRE(executed.exit_code == 0);
  CHECK(count_matches(executed.output, "worker \\d+ ready\\n") == 3);
  CHECK(count_matches(executed.output, "forked") == 0);
  CHECK(fingerprints_in(forked.output) == fingerprints_in(executed.output));
  CHECK(fingerprints_in(forked.output).size() == 1);
}

TEST_CASE("a language model on token shards gives one fingerprint on 1 and 3 workers",
          "[multiproc]") {
  // Real text as tokens: a fortune file's bytes (id 3 + b), in two training shards of
  // llm.c's format and an evaluation shard, read from disk as the examples are needed.
  TempDir dir;
  write_llmc_shard(dir.file("train_0.bin"), fortune_byte_tokens(9000));
  write_llmc_shard(dir.file("train_1.bin"), fortune_byte_tokens(8000, 9000));
  write_llmc_shard(dir.file("eval.bin"), fortune_byte_tokens(3000, 17000));
  const std::string lm =
      " --set semantic.data='{name: token-shards, options: {train: " + dir.file("train_*.bin") +
      ", eval: " + dir.file("eval.bin") +
      ", context: 16, vocab_size: 259}}'"
      " --set semantic.model='{name: transformer-lm, options: {layers: 1, hidden: 16, heads: "
      "2, dropout: 0.1}}' --set semantic.deterministic=true";
  const auto one = train(1, lm);
  REQUIRE(one.fingerprints.size() == 1);
  REQUIRE(one.losses.size() == 16);
  CHECK(one.losses.back() < one.losses.front());
  const auto three = train(3, lm);
  CHECK(three.fingerprints == one.fingerprints);
  CHECK(three.losses == one.losses);
}

TEST_CASE(
    "images decoded and randomly augmented give one fingerprint on any number of workers, data "
    "threads and prefetch depths, from a folder or from tar shards",
    "[multiproc]") {
  // 240 Fashion-MNIST JPEGs: 16 steps of 48 are three epochs and more, so the random crops
  // and flips change with the epoch.
  TempDir dir;
  const auto images = fashion_images(240);
  const auto root = write_image_folder(dir.file("train"), images);
  const std::string options =
      "channels: 1, transforms: [{random_resized_crop: {size: 20, scale: [0.5, 1]}}, "
      "horizontal_flip, {normalize: {mean: [0.29], std: [0.35]}}]";
  const std::string folder = " --set semantic.data='{name: image-folder, options: {train: " + root +
                             ", index_cache: off, " + options +
                             "}}' --set semantic.deterministic=true";
  const auto one = train(1, folder + " --set resources.data_threads=1");
  REQUIRE(one.fingerprints.size() == 1);
  REQUIRE(one.losses.size() == 16);
  const auto three = train(3, folder +
                                  " --set resources.data_threads=3 --set resources.prefetch=true"
                                  " --set resources.prefetch_depth=3");
  CHECK(three.fingerprints == one.fingerprints);
  CHECK(three.losses == one.losses);
  // The same files in two tar shards, in the folder's order (class by class, by name).
  std::vector<std::pair<std::string, std::string>> members[2];
  int64_t k = 0;
  for (int64_t label = 0; label < 10; ++label) {
    for (size_t i = 0; i < images.labels.size(); ++i) {
      if (images.labels[i] != label) continue;
      const std::string key = fmt::format("{:05d}", k);
      const std::string file = fmt::format("{}/{}/{:05d}.jpg", root, label, i);
      members[k < 120 ? 0 : 1].emplace_back(key + ".jpg", read_file(file));
      members[k < 120 ? 0 : 1].emplace_back(key + ".cls", std::to_string(label));
      ++k;
    }
  }
  write_file(dir.file("shard-0.tar"), tar_of(members[0]));
  write_file(dir.file("shard-1.tar"), tar_of(members[1]));
  const std::string shards =
      " --set semantic.data='{name: image-shards, options: {train: " + dir.file("shard-*.tar") +
      ", classes: 10, " + options + "}}' --set semantic.deterministic=true";
  const auto two = train(2, shards +
                                " --set resources.data_threads=2 --set resources.prefetch=true"
                                " --set resources.prefetch_depth=2");
  CHECK(two.fingerprints == one.fingerprints);
  CHECK(two.losses == one.losses);
}

TEST_CASE(
    "deterministic jobs of one vnode a worker give the one-worker fingerprint, their exact sum "
    "formed in shared memory or split over sockets",
    "[multiproc]") {
  // N = W: on one host the exact sum is formed inside the shared-memory reduction
  // (Communicator::allreduce_combine); without it, split into the int32 carrier over Gloo.
  const std::string three = kDeterministic + " --set semantic.virtual_nodes=3";
  const auto one = train(1, three);
  REQUIRE(one.fingerprints.size() == 1);
  for (const std::string memory : {"true", "false"}) {
    CAPTURE(memory);
    const auto run = train(3, three + " --set resources.shared_memory=" + memory);
    CHECK(run.fingerprints == one.fingerprints);
    CHECK(run.losses == one.losses);
  }
  // Two vnodes on two workers and on one.
  const std::string two = kDeterministic + " --set semantic.virtual_nodes=2";
  CHECK(train(2, two).fingerprints == train(1, two).fingerprints);
}

TEST_CASE(
    "deterministic mode's passes shared with a second thread change no result, in one "
    "reduction or in buckets",
    "[multiproc]") {
  // resources.prefetch: true runs half of each pass of the exact sum (absorb, rounding,
  // split; in buckets from the backward pass's hooks) on the background thread.
  const std::string job = kDeterministic + " --set resources.prefetch=";
  const auto alone = train(1, job + "false");
  REQUIRE(alone.fingerprints.size() == 1);
  const auto shared = train(1, job + "true");
  CHECK(shared.fingerprints == alone.fingerprints);
  CHECK(shared.losses == alone.losses);
  for (const char* mb : {"0", "0.001"}) {
    CAPTURE(mb);
    const auto two = train(2, job + "true --set resources.bucket_mb=" + std::string(mb));
    CHECK(two.fingerprints == alone.fingerprints);
    CHECK(two.losses == alone.losses);
  }
}

TEST_CASE("default jobs agree across worker counts within tolerance", "[multiproc][numeric]") {
  const auto one = train(1, vflow::testing::threads_flag());
  const auto three = train(3, vflow::testing::threads_flag());
  CHECK(three.fingerprints.size() == 1);  // all ranks hold the same state
  REQUIRE(one.losses.size() == three.losses.size());
  for (size_t i = 0; i < one.losses.size(); ++i) {
    CAPTURE(i);
    CHECK(std::abs(one.losses[i] - three.losses[i]) <=
          1e-4 * std::max(1.0, std::abs(one.losses[i])));
  }
}

TEST_CASE("the reduction in buckets overlapped with the backward pass changes no result",
          "[multiproc]") {
  // Two workers: each element's sum has two addends, so Gloo's order does not matter and
  // the one allreduce and the buckets (about one a parameter) must agree bitwise.
  const auto whole = train(2, " --set resources.bucket_mb=0");
  const auto buckets = train(2, " --set resources.bucket_mb=0.001");
  REQUIRE(whole.fingerprints.size() == 1);
  CHECK(buckets.fingerprints == whole.fingerprints);
  CHECK(buckets.losses == whole.losses);
}

TEST_CASE(
    "deterministic jobs reduced in buckets during the backward pass give the one-worker "
    "fingerprint for every bucket size",
    "[multiproc]") {
  const auto one = train(1, kDeterministic);
  REQUIRE(one.fingerprints.size() == 1);
  // About one bucket a parameter, a few parameters a bucket, and one bucket for all.
  for (const char* mb : {"0.001", "0.004", "64"}) {
    for (int k : {2, 3}) {
      CAPTURE(mb, k);
      const auto run = train(k, kDeterministic + " --set resources.bucket_mb=" + mb);
      CHECK(run.fingerprints == one.fingerprints);
      CHECK(run.losses == one.losses);
    }
  }
}

namespace {
/// A deterministic job with a learning rate that makes it diverge, with `settings`: it
/// stops with the range error and prints no fingerprint.
void check_range_error(const std::string& settings) {
  const auto r =
      run_command(kTrain + kJob + kDeterministic + " --set semantic.optimizer.lr=1e5" + settings);
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Matchers::Contains("is outside the deterministic reduction's range"));
  CHECK(fingerprints_in(r.output).empty());
}
}  // namespace

TEST_CASE(
    "a deterministic job that diverges stops with the range error, in one reduction or in "
    "buckets",
    "[multiproc]") {
  // One vnode a worker: the out-of-range values are found on their way into the
  // reduction (in buckets: inside the backward pass), not between vnodes.
  const std::string mb = GENERATE("0", "0.001");
  CAPTURE(mb);
  check_range_error(
      " --set semantic.virtual_nodes=2 --set resources.timeout_s=10 --workers 2"
      " --set resources.bucket_mb=" +
      mb);
}

TEST_CASE(
    "a deterministic job that diverges stops with the range error where its passes are shared "
    "with a second thread",
    "[integration]") {
  check_range_error(" --set resources.prefetch=true --set semantic.virtual_nodes=4 --workers 1");
}

TEST_CASE("a deterministic job of one vnode on one worker that diverges stops with the range error",
          "[integration]") {
  // The fused update rounds such a worker's gradients as it reads them; their range is
  // checked before it, in the pass that rounds the rest of the packet.
  check_range_error(" --set semantic.virtual_nodes=1 --set semantic.global_batch=4 --workers 1");
}

TEST_CASE("a worker that fails makes the launcher fail without hanging", "[multiproc]") {
  // Rank 1 cannot read its data directory... all ranks read the same spec, so make the job
  // itself fail on every rank: a data path that does not exist.
  const auto r = run_command(kTrain + " --workers 2 --set semantic.data.options.path=/nonexistent");
  CHECK(r.exit_code == 3);
  CHECK_THAT(r.output, Catch::Matchers::Contains("[worker 0] data error") ||
                           Catch::Matchers::Contains("[worker 1] data error"));
}

namespace {
/// Runs a long job on `workers` workers in the background, waits for its first metrics
/// record, runs `action` (shell, with $pid the launcher), and reports "exit=<code>".
vflow::testing::CommandResult long_job_with(const TempDir& dir, int workers,
                                            const std::string& action) {
  const std::string metrics = dir.file("m.jsonl");
  const std::string script =
      kTrain + kJob + " --set semantic.steps=1000000 --set output.logging.every_steps=1" +
      " --set output.logging.metrics=" + metrics + " --set output.checkpoint.dir=" + dir.path() +
      " --workers " + std::to_string(workers) +
      " & pid=$!; for i in $(seq 600); do grep -q '\"event\":\"step\"' " + metrics +
      " 2>/dev/null && break; sleep 0.1; done; " + action + "; wait $pid; echo \"exit=$?\"";
  return run_command("bash -c '" + std::regex_replace(script, std::regex("'"), "'\\''") + "'");
}
}  // namespace

TEST_CASE("SIGTERM to the launcher stops every worker after the same step", "[multiproc]") {
  TempDir dir;
  const auto r = long_job_with(dir, 3, "kill -TERM $pid");
  INFO(r.output);
  CHECK_THAT(r.output, Catch::Matchers::Contains("exit=130"));
  for (int rank = 0; rank < 3; ++rank) {
    CHECK_THAT(r.output, Catch::Matchers::Contains("[worker " + std::to_string(rank) + "]") &&
                             Catch::Matchers::Contains("stopped at step"));
  }
  // All ranks stopped at the same step and hold the same state.
  const std::regex stopped(R"(\[worker \d\] .*stopped at step (\d+))");
  std::set<std::string> steps;
  for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), stopped);
       it != std::sregex_iterator(); ++it) {
    steps.insert((*it)[1]);
  }
  CHECK(steps.size() == 1);
  CHECK(fingerprints_in(r.output).size() == 1);
  CHECK_THAT(r.output, Catch::Matchers::Contains("[checkpoint] wrote"));
}

TEST_CASE("workers started torchrun-style (RANK, WORLD_SIZE, MASTER_ADDR/PORT) train together",
          "[multiproc]") {
  const auto reference = train(1, kDeterministic);
  const std::string env =
      "MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(vflow::testing::free_port()) +
      " WORLD_SIZE=2";
  const std::string cmd = kTrain + kJob + kDeterministic;
  const auto r =
      run_command("(" + env + " RANK=0 " + cmd + " & " + env + " RANK=1 " + cmd + " & wait)");
  INFO(r.output);
  const auto fps = fingerprints_in(r.output);
  CHECK(fps == reference.fingerprints);
  CHECK(count_matches(r.output, "fingerprint ") == 2);  // both ranks finished
}

TEST_CASE("workers started by OpenMPI's mpirun train together", "[multiproc]") {
  const auto which = run_command("command -v mpirun");
  REQUIRE(which.exit_code == 0);  // openmpi-bin is a test dependency: never skip silently
  const auto reference = train(1, kDeterministic);
  const auto r = run_command(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 3 "
      "-x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=" +
      std::to_string(vflow::testing::free_port()) + " " + kTrain + kJob + kDeterministic);
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(fingerprints_in(r.output) == reference.fingerprints);
  CHECK(count_matches(r.output, "fingerprint ") == 3);
}

TEST_CASE("an unreachable coordinator is reported within the timeout", "[multiproc]") {
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = run_command("VFLOW_RANK=0 VFLOW_WORLD_SIZE=2 VFLOW_STORE=127.0.0.1:" +
                             std::to_string(vflow::testing::free_port()) + " " + kTrain + kJob +
                             " --set resources.timeout_s=2");
  INFO(r.output);
  CHECK(r.exit_code == 5);
  CHECK_THAT(r.output,
             Catch::Matchers::Contains("cannot reach the job's coordinator at 127.0.0.1:"));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30));
}

TEST_CASE("a busy store port is reported, naming the address", "[multiproc]") {
  // Something else already listens on the port rank 0 should host the store on.
  vflow::job::StoreHost squatter("127.0.0.1", 0, std::chrono::seconds(5));
  const auto r = run_command(
      "RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(squatter.port()) +
      " " + kTrain + kJob + " --set resources.timeout_s=2");
  INFO(r.output);
  CHECK(r.exit_code == 5);
  CHECK_THAT(r.output, Catch::Matchers::Contains("127.0.0.1:" + std::to_string(squatter.port())));
}

TEST_CASE("more workers than vnodes is refused before anything starts", "[multiproc]") {
  const auto r = run_command(kTrain + kJob + " --workers 13");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output,
             Catch::Matchers::Contains("resources.workers: 13 workers but only 12 virtual nodes"));
  CHECK_THAT(r.output, !Catch::Matchers::Contains("[worker"));
}

TEST_CASE("coordinator and workers on separate network hosts, with a link cut", "[multiproc]") {
  const auto reference = train(1, kDeterministic);
  const auto t0 = std::chrono::steady_clock::now();
  // Refused without the opt-in: the store would be open to the network, unauthenticated.
  const auto refused = run_command(kTrain + kJob + " --workers 2 --coordinator 10.231.77.1:29400");
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.output, Catch::Matchers::Contains("resources.unauthenticated_store: true"));
  const auto r = run_command("bash " VFLOW_SOURCE_DIR "/tests/netns/multihost.sh " + kTrain + kJob +
                             kDeterministic + " --set resources.unauthenticated_store=true");
  INFO(r.output);
  // Never a silent pass: a machine without namespaces fails this test, saying why.
  REQUIRE_THAT(r.output, !Catch::Matchers::Contains("NETNS-UNAVAILABLE"));
  CHECK_THAT(r.output, Catch::Matchers::Contains("train: worker 0 exit=0") &&
                           Catch::Matchers::Contains("train: worker 1 exit=0"));
  CHECK(fingerprints_in(r.output) == reference.fingerprints);
  CHECK_THAT(r.output, Catch::Matchers::Contains("cut: worker 1's link is down"));
  CHECK_THAT(r.output, Catch::Matchers::Contains("cut: worker 0 exit=5") &&
                           Catch::Matchers::Contains("cut: worker 0: peer failure"));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(120));
}
