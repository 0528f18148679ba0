// Elasticity and failures (docs/design.md §4), with real worker processes on loopback: a
// deterministic job resized, killed into and preempted while it trains ends with the
// fingerprint of an undisturbed run.
#include <algorithm>
#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <numeric>
#include <regex>
#include <sstream>
#include <thread>

#include "apps/multiworker_support.h"
#include "image_support.h"
#include "support.h"
#include "vflow/job/control_plane.h"
#include "vflow/job/control_store.h"

using namespace vflow::testing;

namespace {

// Long enough for several generations to come and go while it trains paced (Pace: at most
// ten steps a second while a test's actions run; they took fewer than 200 steps).
constexpr int kLongSteps = 600;
const std::string kLongJob =
    kJob + kDeterministic + " --set semantic.steps=" + std::to_string(kLongSteps) +
    " --set resources.timeout_s=10" + " --set output.logging.every_steps=1";

std::string reference_fingerprint(const std::string& extra = "") {
  const auto r = run_command(kTrain + kLongJob + extra);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const auto fps = fingerprints_in(r.output);
  REQUIRE(fps.size() == 1);
  return *fps.begin();
}

/// The long job with `extra` settings, elastic (see run_elastic_job), paced unless `paced`
/// is false.
CommandResult elastic_job(const TempDir& dir, int workers, const std::string& extra,
                          const std::string& actions, bool paced = true) {
  return run_elastic_job(dir, workers, kLongJob + extra, actions, "", "", paced);
}

/// Shell: sends `signal` to the worker that has rank `rank` now.
std::string kill_rank(int rank, const std::string& signal) {
  return "kill -" + signal + " $(status | sed -n 's/^rank " + std::to_string(rank) +
         " worker .* pid //p')";
}

/// The vnodes of each of the 3 workers of generation 2 (empty when not found); they sum to
/// the job's 12.
std::vector<int64_t> second_generation_split(const std::string& output) {
  std::smatch m;
  const std::regex published(
      R"(published generation 2: 3 worker\(s\).*holding \[(\d+),(\d+),(\d+)\])");
  if (!std::regex_search(output, m, published)) return {};
  std::vector<int64_t> split{std::stoll(m[1]), std::stoll(m[2]), std::stoll(m[3])};
  CHECK(split[0] + split[1] + split[2] == 12);
  return split;
}

/// Every example was used once in each whole epoch of an examples log of the long job
/// (600 steps of 12 vnodes over 600 examples, B = 48: 12 full batches and a tail of 24, so
/// 13 steps an epoch; the last epoch is cut short by the steps).
void check_each_example_once_an_epoch(
    const std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>>& log) {
  constexpr int64_t kStepsPerEpoch = 13;
  std::map<int64_t, std::vector<int64_t>> uses;  // epoch -> indices
  for (const auto& [key, indices] : log) {
    auto& u = uses[key.first / kStepsPerEpoch];
    u.insert(u.end(), indices.begin(), indices.end());
  }
  for (auto& [epoch, indices] : uses) {
    if (epoch == kLongSteps / kStepsPerEpoch) continue;
    CAPTURE(epoch);
    std::sort(indices.begin(), indices.end());
    std::vector<int64_t> all(600);
    std::iota(all.begin(), all.end(), 0);
    CHECK(indices == all);
  }
}

}  // namespace

TEST_CASE("a job resized 2 -> 3 -> 1 -> 4 ends with the undisturbed fingerprint",
          "[multiproc][elastic]") {
  const auto reference = reference_fingerprint();
  TempDir dir;
  const auto r = elastic_job(dir, 2, "",
                             "$CTL resize $A 3; await_workers 3; $CTL resize $A 1; await_workers "
                             "1; $CTL resize $A 4; await_workers 4");
  INFO(r.output);
  CHECK_THAT(r.output, Catch::Matchers::Contains("exit=0"));
  CHECK_THAT(r.output, !Catch::Matchers::Contains("TIMEOUT") && !Catch::Matchers::Contains("GONE"));
  CHECK_THAT(r.output, Catch::Matchers::Contains("published generation 4: 4 worker(s)"));
  CHECK(fingerprints_in(r.output) == std::set<std::string>{reference});
  CHECK(count_matches(r.output, "fingerprint ") == 4);  // the last generation's workers
  CHECK(count_matches(r.output, "left the job") == 2);  // the scale-in to 1
  CHECK(nothing_left(dir));
}

TEST_CASE(
    "a job on an etcd control store is resized, survives a SIGKILLed worker and "
    "leaves no keys",
    "[multiproc][elastic][etcd]") {
  const auto reference = reference_fingerprint();
  EtcdCluster etcd;
  TempDir dir;
  const auto r = run_elastic_job(
      dir, 2, kLongJob + " --set output.logging.examples=" + dir.file("examples.log"),
      // The SIGKILL lands while the 3 workers train, 20 steps after their generation was
      // published, not in the middle of their rendezvous.
      "$CTL list; $CTL resize $A 3; await_workers 3; "
      "await_step $(( $(status | sed -n 's/^step //p') + 20 )); " +
          kill_rank(1, "KILL") + "; await_workers 2; $CTL resize $A 1; await_workers 1",
      etcd.url(), "fmnist-1");
  INFO(r.output);
  CHECK_THAT(r.output, Catch::Matchers::Contains("exit=0"));
  CHECK_THAT(r.output, !Catch::Matchers::Contains("TIMEOUT") && !Catch::Matchers::Contains("GONE"));
  CHECK_THAT(r.output, Catch::Matchers::Contains("job 'fmnist-1' on the control store etcd://"));
  CHECK_THAT(r.output, Catch::Matchers::Contains("died (status 137)"));
  CHECK_THAT(r.output, Catch::Matchers::Contains("fmnist-1 state running step"));  // ctl list
  CHECK(fingerprints_in(r.output) == std::set<std::string>{reference});
  CHECK(read_example_log(dir.file("examples.log")).size() ==
        kLongSteps * 12);  // each (step, vnode) once
  CHECK(nothing_left(dir));
  // No store was hosted: the job's generations and rendezvous went through etcd, and a
  // finished job's keys are gone.
  CHECK_THAT(r.output, !Catch::Matchers::Contains("coordinator on"));
  const auto store =
      vflow::job::connect_control_store(etcd.url(), "fmnist-1", std::chrono::seconds(5));
  CHECK(store->list("").empty());
  // vflow-ctl names a job that is not there.
  const auto missing = run_command(kCtl + " --control " + etcd.url() + " status fmnist-1");
  CHECK(missing.exit_code == 7);
  CHECK_THAT(missing.output, Catch::Matchers::Contains("no job named 'fmnist-1'"));
}

TEST_CASE("workers started outside the launcher join a job on etcd, one dies, one stays to the end",
          "[multiproc][elastic][etcd]") {
  const auto reference = reference_fingerprint();
  EtcdCluster etcd;
  TempDir dir;
  const std::string settings =
      kLongJob + " --set output.logging.examples=" + dir.file("examples.log");
  // As srun or a user would start them: the job's spec, --control and --job, no --workers.
  const auto volunteer = [&](const std::string& log, const std::string& pid) {
    return kTrain + settings + " --control " + etcd.url() + " --job joined > " + dir.file(log) +
           " 2>&1 & " + pid + "=$!; ";
  };
  const auto r = run_elastic_job(
      dir, 2, settings,
      volunteer("dies.log", "v") + volunteer("stays.log", "w") + "await_workers 4; " + kTrain +
          settings + " --set semantic.seed=99 --control " + etcd.url() +
          " --job joined 2>&1 | grep -o 'spec differs' ; kill -KILL $v; await_workers 3; "
          "pace_off; wait $w; echo \"stayer exit=$?\"",
      etcd.url(), "joined");
  INFO(r.output);
  INFO(read_file(dir.file("stays.log")));
  CHECK_THAT(r.output, Catch::Matchers::Contains("exit=0"));
  CHECK_THAT(r.output, Catch::Matchers::Contains("stayer exit=0"));
  CHECK_THAT(r.output, !Catch::Matchers::Contains("TIMEOUT") && !Catch::Matchers::Contains("GONE"));
  CHECK(count_matches(r.output, "\\(started outside the launcher\\) offers to join") == 2);
  CHECK(count_matches(r.output, "published generation \\d+: 4 worker\\(s\\)") >= 1);
  CHECK_THAT(r.output, Catch::Matchers::Contains("spec differs"));  // the seed-99 worker
  // The killed one's lease expired; the one that stayed ended with the job, no failure.
  CHECK(count_matches(r.output, "liveness lease expired") == 1);
  CHECK(count_matches(r.output, "died \\(status") == 1);
  CHECK(fingerprints_in(r.output) == std::set<std::string>{reference});
  CHECK(fingerprints_in(read_file(dir.file("stays.log"))) == std::set<std::string>{reference});
  CHECK(read_example_log(dir.file("examples.log")).size() ==
        kLongSteps * 12);  // each (step, vnode) once
  CHECK(nothing_left(dir));
  // One for a job that is not there is told so.
  const auto none =
      run_command(kTrain + settings + " --control " + etcd.url() + " --job nothing-here");
  CHECK(none.exit_code == 7);
  CHECK_THAT(none.output, Catch::Matchers::Contains("no job named 'nothing-here'"));
}

TEST_CASE("the training recipes' keys keep the undisturbed fingerprint through resizes",
          "[multiproc][elastic][recipes]") {
  // LAMB, LARS and the weight average keep state of their own (moved to joiners with the
  // training state); clipping and label smoothing act on the reduced gradient and the loss.
  const std::vector<std::string> recipes{
      " --set semantic.optimizer='{name: lamb, lr: 0.01}' --set semantic.clip.max_norm=0.5"
      " --set semantic.loss.label_smoothing=0.1 --set semantic.ema='{decay: 0.99, every_steps: 3}'"
      " --set semantic.schedule='{name: polynomial, power: 2, warmup_steps: 10}'",
      " --set semantic.optimizer='{name: lars, lr: 1.0, trust_coefficient: 0.01, "
      "exclude_bias_and_norm: false}'"
      " --set semantic.clip='{value: 0.05}' --set semantic.schedule='{name: inverse_sqrt, "
      "warmup_steps: 20}'",
      " --set semantic.optimizer='{name: adam, lr: 0.002, beta2: 0.98}'"
      " --set semantic.schedule='{name: linear, warmup_steps: 5, min_factor: 0.1}'"
      " --set semantic.ema.decay=0.9 --set output.evaluation.use_ema=true"};
  for (const auto& recipe : recipes) {
    CAPTURE(recipe);
    const auto reference = reference_fingerprint(recipe);
    TempDir dir;
    const auto r = elastic_job(dir, 2, recipe,
                               "$CTL resize $A 3; await_workers 3; $CTL resize $A 1; "
                               "await_workers 1");
    INFO(r.output);
    CHECK_THAT(r.output, Catch::Matchers::Contains("exit=0"));
    CHECK_THAT(r.output,
               !Catch::Matchers::Contains("TIMEOUT") && !Catch::Matchers::Contains("GONE"));
    CHECK(fingerprints_in(r.output) == std::set<std::string>{reference});
    CHECK(nothing_left(dir));
  }
}

TEST_CASE("a SIGKILLed worker is survived: the step is redone, nothing is lost",
          "[multiproc][elastic]") {
  const auto reference = reference_fingerprint();
  TempDir dir;
  // Not paced: the kill comes at once, and should land inside a step, not in the pause
  // before one.
  const auto r = elastic_job(dir, 3, " --set output.logging.examples=" + dir.file("examples.log"),
                             kill_rank(1, "KILL") + "; await_workers 2", /*paced=*/false);
  INFO(r.output);
  CHECK_THAT(r.output, Catch::Matchers::Contains("exit=0"));
  CHECK_THAT(r.output, Catch::Matchers::Contains("died (status 137)"));
  CHECK_THAT(r.output, Catch::Matchers::Contains("in the next generation"));
  CHECK(fingerprints_in(r.output) == std::set<std::string>{reference});
  CHECK(nothing_left(dir));

  // Exactly once: every (step, vnode) ran once, and each epoch used every example once.
  const auto log = read_example_log(dir.file("examples.log"));
  CHECK(log.size() == kLongSteps * 12);
  check_each_example_once_an_epoch(log);
}

TEST_CASE(
    "with the reduction in buckets during the backward pass, a SIGKILLed worker is survived "
    "in default and in deterministic mode",
    "[multiproc][elastic]") {
  // About one bucket a parameter: a worker dies with several buckets in flight (not paced,
  // as above).
  const bool deterministic = GENERATE(false, true);
  CAPTURE(deterministic);
  const std::string buckets = std::string(" --set semantic.deterministic=") +
                              (deterministic ? "true" : "false") +
                              " --set resources.bucket_mb=0.001";
  TempDir dir;
  const auto r =
      elastic_job(dir, 3, buckets + " --set output.logging.examples=" + dir.file("examples.log"),
                  kill_rank(1, "KILL") + "; await_workers 2", /*paced=*/false);
  INFO(r.output);
  CHECK_THAT(r.output, Catch::Matchers::Contains("exit=0"));
  CHECK_THAT(r.output, Catch::Matchers::Contains("died (status 137)"));
  CHECK_THAT(r.output, Catch::Matchers::Contains("in the next generation"));
  CHECK(fingerprints_in(r.output).size() == 1);  // the survivors hold the same state
  // Deterministic mode: nothing half-applied, the undisturbed run's fingerprint.
  if (deterministic)
    CHECK(fingerprints_in(r.output) == std::set<std::string>{reference_fingerprint()});
  CHECK(nothing_left(dir));
  // Every (step, vnode) ran exactly once (the log refuses a duplicate).
  CHECK(read_example_log(dir.file("examples.log")).size() == kLongSteps * 12);
}

/// The long job reading a streaming data set (`data`: its settings) grows from 2 workers
/// to 3 and loses one to SIGKILL: it must end with the undisturbed run's fingerprint, every
/// (step, vnode) once and every example once an epoch.
void resize_and_kill_streaming(const TempDir& dir, const std::string& data) {
  const auto reference = reference_fingerprint(data);
  const auto r =
      elastic_job(dir, 2, data + " --set output.logging.examples=" + dir.file("examples.log"),
                  "$CTL resize $A 3; await_workers 3; "
                  "await_step $(( $(status | sed -n 's/^step //p') + 20 )); " +
                      kill_rank(1, "KILL") + "; await_workers 2");
  INFO(r.output);
  CHECK_THAT(r.output, Catch::Matchers::Contains("exit=0"));
  CHECK_THAT(r.output, !Catch::Matchers::Contains("TIMEOUT") && !Catch::Matchers::Contains("GONE"));
  CHECK_THAT(r.output, Catch::Matchers::Contains("died (status 137)"));
  CHECK(fingerprints_in(r.output) == std::set<std::string>{reference});
  const auto log = read_example_log(dir.file("examples.log"));
  CHECK(log.size() == kLongSteps * 12);  // each (step, vnode) once
  check_each_example_once_an_epoch(log);
  CHECK(nothing_left(dir));
}

TEST_CASE(
    "a language model streaming token shards is resized and survives a SIGKILLed worker: "
    "every window once an epoch",
    "[multiproc][elastic]") {
  // 600 windows of 8 tokens in two llm.c shards of fortune text (as many examples as the
  // long job's, so an epoch is 13 steps), read from disk as the vnodes need them.
  TempDir dir;
  for (size_t s = 0; s < 2; ++s) {
    write_llmc_shard(dir.file("shard_" + std::to_string(s) + ".bin"),
                     fortune_byte_tokens(300 * 8 + 1, s * 2400));
  }
  const std::string lm =
      " --set semantic.data='{name: token-shards, options: {train: " + dir.file("shard_*.bin") +
      ", context: 8, vocab_size: 259}}' --set semantic.model='{name: transformer-lm, options: "
      "{layers: 1, hidden: 16, heads: 2}}'";
  resize_and_kill_streaming(dir, lm);
}

TEST_CASE(
    "an image folder decoded on data threads is resized and survives a SIGKILLed worker: every "
    "image once an epoch",
    "[multiproc][elastic]") {
  // 600 Fashion-MNIST JPEGs (as many examples as the long job's), randomly cropped and
  // flipped, read and decoded as the vnodes need them, two data threads a worker.
  TempDir dir;
  const auto root = write_image_folder(dir.file("train"), fashion_images(600));
  const std::string images =
      " --set semantic.data='{name: image-folder, options: {train: " + root +
      ", index_cache: off, channels: 1, transforms: [{random_resized_crop: {size: 12, scale: "
      "[0.5, 1]}}, horizontal_flip]}}' --set resources.data_threads=2";
  resize_and_kill_streaming(dir, images);
}

TEST_CASE("a failed worker is replaced when resources.replace_failed is set",
          "[multiproc][elastic]") {
  TempDir dir;
  const auto r = elastic_job(dir, 2, " --set resources.replace_failed=true",
                             kill_rank(1, "KILL") + "; await_workers 2");
  INFO(r.output);
  CHECK_THAT(r.output, Catch::Matchers::Contains("exit=0"));
  CHECK_THAT(r.output, !Catch::Matchers::Contains("TIMEOUT") && !Catch::Matchers::Contains("GONE"));
  // The replacement is split by speed with the survivor (the split is in between).
  CHECK(std::regex_search(
      r.output,
      std::regex(R"(2 worker\(s\) \[0,2\]( holding \[\d+,\d+\] vnodes)?, state from 0)")));
  CHECK(fingerprints_in(r.output) == std::set<std::string>{reference_fingerprint()});
}

TEST_CASE("SIGTERM to a worker is a graceful leave, not a failure", "[multiproc][elastic]") {
  TempDir dir;
  const auto r = elastic_job(dir, 3, "", kill_rank(2, "TERM") + "; await_workers 2");
  INFO(r.output);
  CHECK_THAT(r.output, Catch::Matchers::Contains("exit=0"));
  CHECK_THAT(r.output, Catch::Matchers::Contains("[worker 2] ") &&
                           Catch::Matchers::Contains("worker 2 left the job"));
  CHECK_THAT(r.output, !Catch::Matchers::Contains("died"));
  CHECK(fingerprints_in(r.output) == std::set<std::string>{reference_fingerprint()});
}

TEST_CASE("a resize storm finishes without a hang or a leaked process", "[multiproc][elastic]") {
  // Not paced: the storm asks at every step, and a paced step would give each generation
  // the time to form. Long enough for its requests at full speed.
  const std::string storm = " --set semantic.steps=1500";
  TempDir dir;
  const int port = free_port();
  CommandResult job;
  std::thread launcher([&] {
    job = run_command(kTrain + kLongJob + storm + " --workers 2 --port " + std::to_string(port) +
                      " --set output.logging.metrics=" + dir.file("m.jsonl"));
  });
  // Through the library API: a request at every step the job takes, for 50 steps,
  // cycling through 1..4 workers.
  const int requests = resize_storm(port, 50);
  launcher.join();
  INFO(job.output);
  CHECK(requests == 50);
  CHECK(job.exit_code == 0);
  CHECK(fingerprints_in(job.output) == std::set<std::string>{reference_fingerprint(storm)});
  CHECK(nothing_left(dir));
}

TEST_CASE("resize requests outside min_workers..max_workers are refused clearly",
          "[multiproc][elastic]") {
  TempDir dir;
  const auto r =
      elastic_job(dir, 2, " --set resources.min_workers=2 --set resources.max_workers=3",
                  "$CTL resize $A 4; echo \"resize4=$?\"; $CTL resize $A 1; echo \"resize1=$?\"");
  INFO(r.output);
  CHECK_THAT(r.output,
             Catch::Matchers::Contains("resize4=7") && Catch::Matchers::Contains("resize1=7"));
  CHECK_THAT(r.output,
             Catch::Matchers::Contains("cannot resize to 4 workers: this job allows 2 to 3"));
  CHECK_THAT(r.output, Catch::Matchers::Contains("exit=0"));
}

TEST_CASE("vflow-ctl stop ends the job with 130 and logs no worker deaths",
          "[multiproc][elastic]") {
  TempDir dir;
  const auto r = elastic_job(dir, 2, "",
                             "$CTL stop $A; echo \"stop=$?\"; $CTL stop 127.0.0.1:1; "
                             "echo \"unreachable=$?\"; $CTL stop nowhere; echo \"usage=$?\"");
  INFO(r.output);
  CHECK_THAT(r.output, Catch::Matchers::Contains("stop=0"));
  CHECK_THAT(r.output, Catch::Matchers::Contains("unreachable=5"));
  CHECK_THAT(r.output, Catch::Matchers::Contains("usage=2"));
  CHECK(count_matches(r.output, "worker [0-9]+ of generation [0-9]+ stopped as requested") == 2);
  CHECK(count_matches(r.output, "died") == 0);
  CHECK_THAT(r.output, Catch::Matchers::Contains("exit=130"));
  CHECK(nothing_left(dir));
}

TEST_CASE("below min_workers after a failure the job stops with a checkpoint",
          "[multiproc][elastic]") {
  TempDir dir;
  const auto r = elastic_job(
      dir, 2, " --set resources.min_workers=2 --set output.checkpoint.dir=" + dir.file("ck"),
      kill_rank(1, "KILL"));
  INFO(r.output);
  CHECK_THAT(r.output, Catch::Matchers::Contains("below resources.min_workers = 2; stopping"));
  CHECK_THAT(r.output, Catch::Matchers::Contains("[checkpoint] wrote"));
  CHECK_THAT(r.output, Catch::Matchers::Contains("exit=5"));
  CHECK(nothing_left(dir));
}

TEST_CASE("a checkpoint written on 3 workers resumes on 2 with the same trajectory",
          "[multiproc][elastic]") {
  const auto reference = reference_fingerprint();
  TempDir dir;
  const std::string ck = " --set output.checkpoint.dir=" + dir.path() +
                         " --set output.checkpoint.every_steps=200 --set output.checkpoint.keep=5";
  const auto first = run_command(kTrain + kLongJob + ck + " --workers 3");
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  const auto resumed =
      run_command(kTrain + kLongJob + ck + " --workers 2 --resume " + dir.file("step-00000200.pt"));
  INFO(resumed.output);
  CHECK(resumed.exit_code == 0);
  CHECK_THAT(resumed.output, Catch::Matchers::Contains("resumed from"));
  CHECK(fingerprints_in(resumed.output) == std::set<std::string>{reference});
}

TEST_CASE("when the coordinator dies the workers stop with a checkpoint, none hangs",
          "[multiproc][elastic]") {
  TempDir dir;
  const auto r = elastic_job(dir, 3, " --set output.checkpoint.dir=" + dir.file("ck"),
                             "kill -KILL $pid; sleep 8; ls " + dir.file("ck"));
  INFO(r.output);
  CHECK_THAT(r.output, Catch::Matchers::Contains("exit=137"));
  CHECK_THAT(r.output, Catch::Matchers::Contains("step-"));
  CHECK(nothing_left(dir));
}

TEST_CASE("a planned uneven split over CPU-quota workers keeps the homogeneous fingerprint",
          "[multiproc][hetero]") {
  TempDir dir;
  // Exact mode: worker 0 holds 6 vnodes, two workers limited to half a core and to one and
  // a half hold 3 each. The second may use two cores, yet runs one thread: deterministic
  // mode's count, since two would change the bits.
  write_file(dir.file("job.yaml"),
             "resources:\n  workers: 3\n  layout:\n    - {vnodes: 6, device: cpu}\n"
             "    - {vnodes: 3, cpu_quota: 0.5}\n    - {vnodes: 3, cpu_quota: 1.5}\n");
  const std::string job = kTrain + " " + dir.file("job.yaml") + kJob + kDeterministic +
                          " --set resources.threads=0 --set semantic.steps=60" +
                          " --set output.logging.examples=";
  const auto mixed = run_command(job + dir.file("examples.log"));
  INFO(mixed.output);
  REQUIRE(mixed.exit_code == 0);
  CHECK_THAT(mixed.output, Catch::Matchers::Contains("holding [6,3,3] vnodes") &&
                               Catch::Matchers::Contains("worker 1 limited to 0.5 cores") &&
                               Catch::Matchers::Contains("worker 2 limited to 1.5 cores"));
  CHECK(std::regex_search(mixed.output,
                          std::regex(R"(\[worker 2\][^\n]* 1 threads on cpu, deterministic)")));
  const auto alone =
      run_command(job + dir.file("alone.log") + " --set resources.layout=null --workers 1");
  INFO(alone.output);
  REQUIRE(alone.exit_code == 0);
  CHECK(fingerprints_in(mixed.output) == fingerprints_in(alone.output));
  CHECK(fingerprints_in(mixed.output).size() == 1);
  // Every vnode of every step ran exactly once with the uneven split.
  CHECK(read_example_log(dir.file("examples.log")).size() == 60 * 12);
  CHECK(
      run_command("ls /sys/fs/cgroup/cpu /sys/fs/cgroup 2>/dev/null | grep -c '^vflow-'").output ==
      "0\n");  // the quota groups went with their workers
}

TEST_CASE("a planned worker on a device this machine lacks stops the launch, naming the entry",
          "[multiproc][hetero]") {
  TempDir dir;
  const auto r =
      run_command(kTrain + kJob +
                  " --set resources.workers=2"
                  " --set 'resources.layout=[{vnodes: 6}, {vnodes: 6, device: \"cuda:99\"}]'");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Matchers::Contains("resources.layout[1].device: ") &&
                           Catch::Matchers::Contains("cuda:99"));
  CHECK_THAT(r.output, !Catch::Matchers::Contains("[worker"));  // no worker was started
}

TEST_CASE("relaxed vnode sizes over a planned uneven split keep the one-worker fingerprint",
          "[multiproc][hetero]") {
  TempDir dir;
  // Relaxed mode: worker 0 holds 4 vnodes of 9 examples, worker 1 (half a core) 2 of 6.
  const std::string job = kTrain + kJob + kDeterministic +
                          " --set semantic.virtual_nodes=null"
                          " --set 'semantic.vnode_sizes=[9, 9, 9, 9, 6, 6]'"
                          " --set semantic.steps=30 --set output.logging.examples=";
  const auto mixed =
      run_command(job + dir.file("examples.log") +
                  " --set 'resources.layout=[{vnodes: 4}, {vnodes: 2, cpu_quota: 0.5}]'"
                  " --set resources.workers=2");
  INFO(mixed.output);
  REQUIRE(mixed.exit_code == 0);
  CHECK_THAT(mixed.output, Catch::Matchers::Contains("6 vnodes of sizes [9, 9, 9, 9, 6, 6]"));
  const auto alone = run_command(job + dir.file("alone.log") + " --workers 1");
  INFO(alone.output);
  REQUIRE(alone.exit_code == 0);
  CHECK(fingerprints_in(mixed.output) == fingerprints_in(alone.output));
  CHECK(fingerprints_in(mixed.output).size() == 1);
  const auto log = read_example_log(dir.file("examples.log"));
  CHECK(log.size() == 30 * 6);  // every vnode of every step exactly once
  for (const auto& [key, indices] : log) {
    if (key.first % 13 == 12) continue;  // the epoch's short tail is split evenly
    CAPTURE(key.first, key.second);
    CHECK(indices.size() == (key.second < 4 ? 9u : 6u));
  }
  // The sizes are part of the result: another split of the same batch differs.
  const auto even =
      run_command(kTrain + kJob + kDeterministic +
                  " --set semantic.virtual_nodes=6 --set semantic.steps=30 --workers 1");
  INFO(even.output);
  REQUIRE(even.exit_code == 0);
  CHECK(fingerprints_in(even.output) != fingerprints_in(alone.output));
}

TEST_CASE("a joiner not yet measured counts at its device type's profiled time on a resize",
          "[multiproc][elastic][hetero]") {
  // Two workers at a tenth of a core each; the joiner at full speed, of the device type
  // profiled here (cpu-1t). As fast as the fastest member measured, the old rule, it would
  // get a third of the vnodes; by its profile it gets the most. A quarter of a core was
  // not enough: a step's 6 ms of compute meets the quota's 10 ms period in a different
  // phase each step, and a quota worker then measured as little as 1.2x the profile. Not
  // paced: a quota worker waiting for its next step would start it with its quota unspent.
  const std::string larger = " --set semantic.global_batch=480 --set semantic.steps=300";
  const auto reference = reference_fingerprint(larger);
  TempDir dir;
  const auto profile =
      run_command(std::string(VFLOW_PROFILE_BINARY) + kLongJob + larger +
                  " --sizes 40 --repeats 3 --out " + dir.file("cpu.yaml") + " 2>&1");
  INFO(profile.output);
  REQUIRE(profile.exit_code == 0);
  const auto r = elastic_job(
      dir, 2,
      larger + " --set resources.profiles=" + dir.file("cpu.yaml") +
          " --set 'resources.layout=[{vnodes: 6, cpu_quota: 0.1}, {vnodes: 6, cpu_quota: 0.1}]'",
      "await_step 30; $CTL resize $A 3; await_workers 3", /*paced=*/false);
  INFO(r.output);
  CHECK_THAT(r.output, Catch::Matchers::Contains("exit=0"));
  CHECK_THAT(r.output, Catch::Matchers::Contains("(profile of cpu-1t)"));
  const auto split = second_generation_split(r.output);
  REQUIRE(split.size() == 3);
  const int64_t first = split[0], second = split[1], joiner = split[2];
  CHECK(joiner > first);
  CHECK(joiner > second);
  CHECK(fingerprints_in(r.output) == std::set<std::string>{reference});
  CHECK(nothing_left(dir));
}

TEST_CASE("a job's profiles are checked before any worker starts", "[integration][hetero]") {
  TempDir dir;
  write_file(dir.file("other.yaml"),
             "device_type: cpu-1t\nmodel: 0123456789abcdef\npoints:\n"
             "  - {vnode_size: 100, seconds: 0.01}\n");
  const auto other = run_command(kTrain + kLongJob + " --workers 2 --set resources.profiles=" +
                                 dir.file("other.yaml") + " 2>&1");
  INFO(other.output);
  CHECK(other.exit_code == 2);
  CHECK_THAT(other.output,
             Catch::Matchers::Contains("resources.profiles: " + dir.file("other.yaml") +
                                       ": measured with model 0123456789abcdef"));
  CHECK_THAT(other.output, !Catch::Matchers::Contains("published generation"));
  const auto missing = run_command(kTrain + kLongJob + " --workers 2 --set resources.profiles=" +
                                   dir.file("none.yaml") + " 2>&1");
  INFO(missing.output);
  CHECK(missing.exit_code == 2);
  CHECK_THAT(missing.output, Catch::Matchers::Contains(dir.file("none.yaml")));
}

TEST_CASE("a job that started with a planned split re-plans it by measured speed on a resize",
          "[multiproc][elastic][hetero]") {
  // Vnodes of 40 examples, so that a quarter of a core is clearly slower per vnode.
  const std::string larger = " --set semantic.global_batch=480 --set semantic.steps=300";
  const auto reference = reference_fingerprint(larger);
  TempDir dir;
  // Worker 1 runs at a tenth of a core (clearly slower per vnode even when other work
  // loads the machine); the joiner at full speed. Not paced (see the test above).
  const auto r = elastic_job(
      dir, 2, larger + " --set 'resources.layout=[{vnodes: 6}, {vnodes: 6, cpu_quota: 0.1}]'",
      "await_step 30; $CTL resize $A 3; await_workers 3", /*paced=*/false);
  INFO(r.output);
  CHECK_THAT(r.output, Catch::Matchers::Contains("exit=0"));
  const auto split = second_generation_split(r.output);
  REQUIRE(split.size() == 3);
  const int64_t fast = split[0], slow = split[1], joiner = split[2];
  CHECK(slow < fast);  // the tenth-of-a-core worker holds fewer vnodes than the others
  CHECK(slow < joiner);
  CHECK(fingerprints_in(r.output) == std::set<std::string>{reference});
  CHECK(nothing_left(dir));
}
