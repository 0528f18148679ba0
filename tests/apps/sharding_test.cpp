// The optimizer state sharded by vnode (resources.shard_optimizer; docs/design.md,
// "Optimizer state sharded by vnode"), with real worker processes on loopback: the
// fingerprint is the unsharded job's on every worker count, through resizes, a SIGKILLed
// worker and a checkpoint resumed on another count.
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <regex>
#include <set>
#include <string>
#include <thread>

#include "apps/multiworker_support.h"
#include "support.h"

using namespace vflow::testing;

namespace {

// The small job with AdamW, whose two moments are the state that is sharded.
const std::string kAdamW =
    kJob + kDeterministic +
    " --set semantic.optimizer='{name: adamw, lr: 0.002, weight_decay: 0.01}'";
const std::string kSharded = " --set resources.shard_optimizer=true";

std::string the_fingerprint(const CommandResult& r) {
  const auto fps = fingerprints_in(r.output);
  INFO(r.output);
  REQUIRE(fps.size() == 1);
  return *fps.begin();
}

}  // namespace

TEST_CASE("sharded optimizer state keeps the unsharded fingerprint on 1, 2, 3 and 5 workers",
          "[multiproc][shard]") {
  const auto reference = the_fingerprint(run_command(kTrain + kAdamW));
  for (const int workers : {1, 2, 5}) {
    CAPTURE(workers);
    const auto r =
        run_command(kTrain + kAdamW + kSharded + " --workers " + std::to_string(workers));
    CHECK(r.exit_code == 0);
    CHECK(the_fingerprint(r) == reference);
    // 12 vnodes on 5 workers: 3, 3, 2, 2, 2; each keeps its own and its ring neighbour's.
    if (workers == 5) {
      CHECK(count_matches(r.output,
                          "worker 1 of 5 owns shards 3..5 \\(\\d+ parameters\\) and "
                          "keeps the optimizer state of shards 0..5:") == 1);
      CHECK(count_matches(r.output,
                          "worker 0 of 5 owns shards 0..2 \\(\\d+ parameters\\) and "
                          "keeps the optimizer state of shards 0..2, 10..11:") == 1);
    }
  }
  // A planned, uneven layout (as vflow-plan gives a fast and two slow devices): the fast
  // worker owns more shards, and the fingerprint stays.
  const auto planned =
      run_command(kTrain + kAdamW + kSharded +
                  " --workers 3 --set 'resources.layout=[{vnodes: 7}, {vnodes: 3}, {vnodes: 2}]'");
  CHECK(the_fingerprint(planned) == reference);
  CHECK(count_matches(planned.output,
                      "worker 0 of 3 owns shards 0..6 \\(\\d+ parameters\\) and keeps the "
                      "optimizer state of shards 0..6, 10..11:") == 1);
  // Through Gloo's sockets rather than shared memory: the sum is reduce-scattered and the
  // parameters gathered by point-to-point messages.
  const auto sockets =
      run_command(kTrain + kAdamW + kSharded + " --set resources.shared_memory=false --workers 3");
  CHECK(the_fingerprint(sockets) == reference);
  CHECK(count_matches(sockets.output, "worker 2 of 3 owns shards 8..11") == 1);
  // Default mode: the same sum on the same workers, and an update element by element, give
  // the unsharded run's bits too.
  const std::string fast = kJob + " --set semantic.optimizer='{name: adamw, lr: 0.002}'";
  CHECK(the_fingerprint(run_command(kTrain + fast + kSharded + " --workers 3")) ==
        the_fingerprint(run_command(kTrain + fast + " --workers 3")));
  // SGD with momentum (one state tensor), sharded with its owner alone.
  const std::string sgd = kJob + kDeterministic;
  const auto sgd_reference = the_fingerprint(run_command(kTrain + sgd));
  const auto r =
      run_command(kTrain + sgd + kSharded + " --set resources.shard_replicas=1 --workers 3");
  CHECK(the_fingerprint(r) == sgd_reference);
}

TEST_CASE(
    "sharded LAMB and LARS keep the unsharded fingerprint: their trust ratios are summed by "
    "canonical shard and exchanged",
    "[multiproc][shard]") {
  // LAMB with decay, LARS with every parameter's ratio spanning shards, and LAMB with
  // clipping (the clip's sums of squares exchanged, then LAMB's).
  const std::vector<std::string> optimizers{
      " --set semantic.optimizer='{name: lamb, lr: 0.01, weight_decay: 0.02}'",
      " --set semantic.optimizer='{name: lars, lr: 1.0, trust_coefficient: 0.01, "
      "exclude_bias_and_norm: false}'",
      " --set semantic.optimizer='{name: lamb, lr: 0.01}' --set semantic.clip.max_norm=0.5"};
  for (const auto& optimizer : optimizers) {
    CAPTURE(optimizer);
    const std::string job = kJob + kDeterministic + optimizer;
    const auto reference = the_fingerprint(run_command(kTrain + job));
    // Shared memory on 3 workers, an uneven planned layout, Gloo's sockets on 5.
    for (const std::string workers :
         {" --workers 3",
          " --workers 3 --set 'resources.layout=[{vnodes: 7}, {vnodes: 3}, "
          "{vnodes: 2}]'",
          " --workers 5 --set resources.shared_memory=false"}) {
      CAPTURE(workers);
      const auto r = run_command(kTrain + job + kSharded + workers);
      INFO(r.output);
      CHECK(r.exit_code == 0);
      CHECK(the_fingerprint(r) == reference);
    }
  }
  // Default mode: the same sums on the same workers give the unsharded run's bits too.
  const std::string fast = kJob + " --set semantic.optimizer='{name: lamb, lr: 0.01}'";
  CHECK(the_fingerprint(run_command(kTrain + fast + kSharded + " --workers 3")) ==
        the_fingerprint(run_command(kTrain + fast + " --workers 3")));
}

TEST_CASE(
    "sharded clipping sums the gradient's norm by canonical shard: the sum is still "
    "reduce-scattered, and the norms and fingerprint are the unsharded job's",
    "[multiproc][shard]") {
  TempDir dir;
  const std::string clip = " --set semantic.clip='{value: 0.05, max_norm: 0.3}'";
  const auto metrics = [&](const std::string& name) {
    return " --set output.logging.every_steps=1 --set output.logging.metrics=" + dir.file(name);
  };
  const auto reference = run_command(kTrain + kAdamW + clip + metrics("whole.jsonl"));
  const auto norms = step_values(dir.file("whole.jsonl"), "grad_norm");
  REQUIRE(norms.size() == 16);
  // The clip acts: its norm is above max_norm in some steps.
  CHECK(std::count_if(norms.begin(), norms.end(), [](double n) { return n > 0.3; }) > 0);
  const auto sharded =
      run_command(kTrain + kAdamW + clip + kSharded + " --workers 3" + metrics("sharded.jsonl"));
  CHECK(the_fingerprint(sharded) == the_fingerprint(reference));
  CHECK(step_values(dir.file("sharded.jsonl"), "grad_norm") == norms);
  // Each worker reads what it read unclipped: its shards' sums and the others' parameters.
  run_command(kTrain + kAdamW + kSharded + " --workers 3" + metrics("unclipped.jsonl"));
  const auto received = step_values(dir.file("sharded.jsonl"), "received_mb");
  REQUIRE(received.size() == 16);
  CHECK(received == step_values(dir.file("unclipped.jsonl"), "received_mb"));
  // Gloo's sockets on 5 workers, and default mode.
  CHECK(the_fingerprint(run_command(kTrain + kAdamW + clip + kSharded +
                                    " --workers 5 --set resources.shared_memory=false")) ==
        the_fingerprint(reference));
  const std::string fast = kJob + " --set semantic.optimizer='{name: adamw, lr: 0.002}'" + clip;
  CHECK(the_fingerprint(run_command(kTrain + fast + kSharded + " --workers 3")) ==
        the_fingerprint(run_command(kTrain + fast + " --workers 3")));
}

namespace {

// Long enough for several generations to come and go while it trains paced (Pace: at most
// ten steps a second while a test's actions run; they took fewer than 200 steps).
constexpr int kLongSteps = 600;
const std::string kLongStepsSetting = " --set semantic.steps=" + std::to_string(kLongSteps);
const std::string kLong = kAdamW + kSharded + kLongStepsSetting +
                          " --set resources.timeout_s=10 --set output.logging.every_steps=1";

/// Shell: sends `signal` to the worker that has rank `rank` now.
std::string kill_rank(int rank, const std::string& signal) {
  return "kill -" + signal + " $(status | sed -n 's/^rank " + std::to_string(rank) +
         " worker .* pid //p')";
}

/// The long job's fingerprint unsharded on one worker, with `extra` settings.
std::string long_reference(const std::string& extra = "") {
  return the_fingerprint(run_command(kTrain + kAdamW + kLongStepsSetting +
                                     " --set output.logging.every_steps=1" + extra));
}

}  // namespace

TEST_CASE(
    "sharded optimizer state moves with its vnodes through resizes 2 -> 5 -> 3, a SIGKILL and "
    "a failure during a resize, with nothing lost",
    "[multiproc][shard][elastic]") {
  const auto reference = long_reference();
  TempDir dir;
  const auto r = run_elastic_job(
      dir, 2, kLong + " --set output.logging.examples=" + dir.file("examples.log"),
      "$CTL resize $A 5; await_workers 5; "
      "await_step $(( $(status | sed -n 's/^step //p') + 20 )); $CTL resize $A 3; "
      "await_workers 3; await_step $(( $(status | sed -n 's/^step //p') + 20 )); " +
          kill_rank(1, "KILL") + "; await_workers 2; $CTL resize $A 4; " + kill_rank(1, "KILL"));
  INFO(r.output);
  CHECK_THAT(r.output, Catch::Matchers::Contains("exit=0"));
  CHECK_THAT(r.output, !Catch::Matchers::Contains("TIMEOUT") && !Catch::Matchers::Contains("GONE"));
  CHECK(count_matches(r.output, "died \\(status 137\\)") == 2);
  CHECK_THAT(r.output, Catch::Matchers::Contains("shard(s) of optimizer state moved"));
  CHECK(fingerprints_in(r.output) == std::set<std::string>{reference});
  CHECK(read_example_log(dir.file("examples.log")).size() == kLongSteps * 12);  // each once
  CHECK(nothing_left(dir));
}

TEST_CASE("sharded LAMB's shards move through resizes 2 -> 4 -> 3 and a SIGKILL, with nothing lost",
          "[multiproc][shard][elastic]") {
  const std::string lamb = kJob + kDeterministic +
                           " --set semantic.optimizer='{name: lamb, lr: 0.01}'" +
                           kLongStepsSetting + " --set output.logging.every_steps=1";
  const auto reference = the_fingerprint(run_command(kTrain + lamb));
  TempDir dir;
  const auto r = run_elastic_job(dir, 2, lamb + kSharded + " --set resources.timeout_s=10",
                                 "$CTL resize $A 4; await_workers 4; "
                                 "await_step $(( $(status | sed -n 's/^step //p') + 20 )); " +
                                     kill_rank(2, "KILL") + "; await_workers 3");
  INFO(r.output);
  CHECK_THAT(r.output, Catch::Matchers::Contains("exit=0"));
  CHECK(count_matches(r.output, "died \\(status 137\\)") == 1);
  CHECK_THAT(r.output, Catch::Matchers::Contains("shard(s) of optimizer state moved"));
  CHECK(fingerprints_in(r.output) == std::set<std::string>{reference});
  CHECK(nothing_left(dir));
}

TEST_CASE("a checkpoint of sharded state written on 4 workers resumes on 3 and unsharded",
          "[multiproc][shard]") {
  const auto reference = long_reference();
  TempDir dir;
  const std::string ck = " --set output.checkpoint.dir=" + dir.path() +
                         " --set output.checkpoint.every_steps=200 --set output.checkpoint.keep=5";
  const auto first = run_command(kTrain + kLong + ck + " --workers 4");
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  CHECK(the_fingerprint(first) == reference);
  const auto resumed =
      run_command(kTrain + kLong + ck + " --workers 3 --resume " + dir.file("step-00000200.pt"));
  INFO(resumed.output);
  CHECK(resumed.exit_code == 0);
  CHECK_THAT(resumed.output, Catch::Matchers::Contains("resumed from"));
  CHECK(the_fingerprint(resumed) == reference);
  // The optimizer state is in one file per canonical shard beside each checkpoint, written
  // by rank 0 as each arrives from a holder.
  for (int s = 0; s < 12; ++s) {
    CHECK(std::filesystem::is_regular_file(dir.file("step-00000200.shards/shard-" +
                                                    std::string(s < 10 ? "0000" : "000") +
                                                    std::to_string(s) + ".pt")));
  }
  CHECK_FALSE(std::filesystem::exists(dir.file("step-00000200.shards/shard-00012.pt")));
  // An unsharded job resumes from it too, reading every shard.
  const auto plain = run_command(kTrain + kAdamW + kLongStepsSetting + " --resume " +
                                 dir.file("step-00000400.pt"));
  INFO(plain.output);
  CHECK(the_fingerprint(plain) == reference);
  // A damaged or missing shard is refused, naming its file.
  const auto shard = dir.file("step-00000400.shards/shard-00004.pt");
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) / 2);
  const auto damaged =
      run_command(kTrain + kLong + " --workers 2 --resume " + dir.file("step-00000400.pt"));
  CHECK(damaged.exit_code != 0);
  CHECK_THAT(damaged.output, Catch::Matchers::Contains("step-00000400.shards/shard-00004.pt: "
                                                       "not a usable checkpoint"));
  std::filesystem::remove(shard);
  const auto missing = run_command(kTrain + kAdamW + kLongStepsSetting + " --resume " +
                                   dir.file("step-00000400.pt"));
  CHECK(missing.exit_code != 0);
  CHECK_THAT(missing.output, Catch::Matchers::Contains("step-00000400.shards/shard-00004.pt"));
  // And a sharded job resumes from an unsharded job's checkpoint (the format before).
  TempDir whole;
  const auto unsharded = run_command(kTrain + kAdamW + kLongStepsSetting +
                                     " --set output.checkpoint.dir=" + whole.path() +
                                     " --set output.checkpoint.every_steps=200");
  REQUIRE(unsharded.exit_code == 0);
  CHECK_FALSE(std::filesystem::exists(whole.file("step-00000400.shards")));
  const auto from_whole =
      run_command(kTrain + kLong + " --workers 3 --resume " + whole.file("step-00000400.pt"));
  INFO(from_whole.output);
  CHECK(the_fingerprint(from_whole) == reference);
}

TEST_CASE("with one home a shard's state dies with its worker, and the job says so",
          "[multiproc][shard][elastic]") {
  TempDir dir;
  const auto r =
      run_elastic_job(dir, 3, kLong + " --set resources.shard_replicas=1", kill_rank(1, "KILL"));
  INFO(r.output);
  CHECK_THAT(r.output, Catch::Matchers::Contains("died (status 137)"));
  CHECK_THAT(r.output, Catch::Matchers::Contains(
                           "the optimizer state of shard(s) 4..7 is held by no remaining worker"));
  CHECK_THAT(r.output, !Catch::Matchers::Contains("exit=0"));
  CHECK(nothing_left(dir));
}

TEST_CASE("a resize storm over sharded state ends with the unsharded fingerprint",
          "[multiproc][shard][elastic]") {
  // Not paced: the storm asks at every step, and a paced step would give each generation
  // the time to form. Long enough for its requests at full speed.
  const int steps = 1500;
  const std::string storm = " --set semantic.steps=" + std::to_string(steps);
  const auto reference = long_reference(storm);
  TempDir dir;
  const int port = free_port();
  CommandResult job;
  std::thread launcher([&] {
    job = run_command(kTrain + kLong + storm + " --workers 2 --port " + std::to_string(port) +
                      " --set output.logging.examples=" + dir.file("examples.log"));
  });
  // A request at every step the job takes, for 40 steps, cycling through 1..4 workers:
  // shards move while the last move's generation is still forming.
  const int requests = resize_storm(port, 40);
  launcher.join();
  INFO(job.output);
  CHECK(requests == 40);
  CHECK(job.exit_code == 0);
  CHECK(fingerprints_in(job.output) == std::set<std::string>{reference});
  CHECK(read_example_log(dir.file("examples.log")).size() == std::size_t(steps) * 12);
  CHECK(nothing_left(dir));
}

TEST_CASE(
    "a worker killed in the parameters' gather loses nothing: the survivors take the "
    "shards' parameters from their other homes",
    "[multiproc][shard][elastic]") {
  // With the parameters' average, which reads every parameter after each update, and an
  // evaluation due after the step of the kill.
  const std::string job =
      kAdamW +
      " --set semantic.steps=300 --set semantic.ema.decay=0.9"
      " --set output.evaluation.every_steps=50"
      " --set output.logging.progress=lines --set output.logging.every_steps=50";
  const auto reference = the_fingerprint(run_command(kTrain + job));
  // Member 2 updates its shards of step 149 and dies as the gather starts: the others fail
  // in it after their own update, so the step is taken and their parameters incomplete;
  // the average and the evaluation wait until the regrouped survivors sent them again.
  // Through shared memory, then over Gloo's point-to-point messages.
  for (const bool shared_memory : {true, false}) {
    CAPTURE(shared_memory);
    const auto r =
        run_command("VFLOW_INJECT_FAULT=149:2:gather " + kTrain + job + kSharded +
                    " --set resources.timeout_s=10 --workers 4 --set resources.shared_memory=" +
                    (shared_memory ? "true" : "false"));
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(count_matches(r.output, "died \\(status 137\\)") == 1);
    CHECK(count_matches(r.output, "the parameters' gather failed") == 3);
    CHECK(count_matches(r.output, "evaluation due after step 150 waits until the parameters") == 1);
    CHECK(count_matches(r.output, "\\[eval\\] step 151: test accuracy") == 1);
    CHECK(the_fingerprint(r) == reference);
  }
  // In the last step's gather: no step follows to send the parameters again; the end of the
  // job does (its collective fails on the dead peer, the survivors regroup and send them).
  const auto last = run_command("VFLOW_INJECT_FAULT=299:2:gather " + kTrain + job + kSharded +
                                " --set resources.timeout_s=10 --workers 4");
  INFO(last.output);
  CHECK(last.exit_code == 0);
  CHECK(count_matches(last.output, "died \\(status 137\\)") == 1);
  CHECK(the_fingerprint(last) == reference);
}

TEST_CASE(
    "a worker late to a step's commit takes the step while the others give up: they take it "
    "in the next group from the sums they kept, and lose no shard",
    "[multiproc][shard][elastic]") {
  // Member 1 of 3 comes to step 49's commit after the others timed out there. Through shared
  // memory it finds every rank arrived and takes the step, so the others are a step behind:
  // before the commit kept their sums, the shards 8..11 that only members 0 and 2 keep were
  // lost and the job stopped. Over Gloo's messages its commit fails too, and every worker
  // redoes the step. AdamW, and LAMB with clipping, whose sums of squares were exchanged
  // (after the clip) before the commit.
  const std::string steps = " --set semantic.steps=100 --set resources.timeout_s=5";
  const std::string lamb = kJob + kDeterministic +
                           " --set semantic.optimizer='{name: lamb, lr: 0.01}'"
                           " --set semantic.clip.max_norm=0.5";
  for (const auto& job : {kAdamW + steps, lamb + steps}) {
    const auto reference = the_fingerprint(run_command(kTrain + job));
    for (const bool shared_memory : {true, false}) {
      CAPTURE(job, shared_memory);
      TempDir dir;
      const auto r =
          run_command("VFLOW_INJECT_FAULT=49:1:late " + kTrain + job + kSharded +
                      " --workers 3 --set output.logging.examples=" + dir.file("examples.log") +
                      " --set resources.shared_memory=" + (shared_memory ? "true" : "false"));
      INFO(r.output);
      CHECK(r.exit_code == 0);
      CHECK(read_example_log(dir.file("examples.log")).size() == 100 * 12);  // each once
      CHECK(count_matches(r.output, "step 49's commit failed") == (shared_memory ? 2 : 3));
      CHECK(count_matches(r.output,
                          "step 49 was taken by another worker: this worker takes it "
                          "on shards 8\\.\\.11") == (shared_memory ? 2 : 0));
      CHECK(the_fingerprint(r) == reference);
    }
  }
}

TEST_CASE("vflow-train --print-shards shows the canonical shards and what each worker would keep",
          "[integration][shard]") {
  // The default job's ConvNet (8 vnodes) on 3 workers: vnodes 3, 3, 2; each keeps its own
  // shards and its ring predecessor's.
  const std::string adamw = " --set semantic.optimizer='{name: adamw, lr: 0.001}'";
  const auto r = run_command(kTrain + adamw + kSharded + " --workers 3 --print-shards");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Matchers::Contains(
                           "421738 parameters (1.687 MB), 8 canonical shards (one per vnode)"));
  CHECK_THAT(r.output, Catch::Matchers::Contains("adamw keeps 2 state tensor(s) a parameter"));
  CHECK_THAT(r.output, Catch::Matchers::Contains("sharded with shard_replicas 2"));
  CHECK_THAT(r.output,
             Catch::Matchers::Contains("worker 0: vnodes 0..2, owns their shards (158144 "
                                       "parameters), keeps the state of shards 0..2, 6..7"));
  CHECK_THAT(r.output, Catch::Matchers::Contains("worker 2: vnodes 6..7, owns their shards "
                                                 "(105450 parameters), keeps the state of "
                                                 "shards 3..7"));
  // A planned layout's counts: 4, 2, 2.
  const auto planned =
      run_command(kTrain + adamw + kSharded +
                  " --workers 3 --set 'resources.layout=[{vnodes: 4}, {vnodes: 2}, {vnodes: 2}]'"
                  " --print-shards");
  INFO(planned.output);
  CHECK_THAT(planned.output, Catch::Matchers::Contains("vnodes as resources.layout plans them"));
  CHECK_THAT(planned.output,
             Catch::Matchers::Contains("worker 1: vnodes 4..5, owns their shards (105424 "
                                       "parameters), keeps the state of shards 0..5"));
  // Unsharded, every worker keeps everything; LibTorch's Adam keeps no sharded state.
  const auto plain = run_command(kTrain + adamw + " --workers 2 --print-shards");
  CHECK_THAT(plain.output, Catch::Matchers::Contains("keeps the state of all shards: 3.374 MB"));
  // A worker's memory limit the parameters, gradients and state would pass alone.
  const auto limited =
      run_command(kTrain + adamw + " --workers 2 --set resources.memory_limit_mb=5 --print-shards");
  CHECK_THAT(limited.output, Catch::Matchers::Contains(
                                 "resources.memory_limit_mb is 5: the largest worker needs more "
                                 "than 7 MB for these alone; shard the state"));
  const auto adam = run_command(
      kTrain + kJob + " --set semantic.optimizer='{name: adam, lr: 0.01}' --print-shards");
  CHECK_THAT(adam.output, Catch::Matchers::Contains("adam keeps no sharded state"));
}
