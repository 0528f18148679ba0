// Cross-checks while training and replays from a checkpoint (docs/verification.md), with
// real worker processes on loopback: a bit flipped in one worker's gradients is caught,
// and under `evict` the worker that computed it is named and removed with nothing lost;
// `warn` and `stop` do what the docs say; a replay reproduces the hashes the job logged;
// a clean job cross-checked at every step raises no alarm, also across resizes.
#include <catch2/catch.hpp>
#include <regex>
#include <set>
#include <string>
#include <tuple>

#include "apps/multiworker_support.h"
#include "support.h"

using namespace vflow::testing;

namespace {

// The small job, every step cross-checked. On 3 workers (4 vnodes each) turn s checks
// vnode s % 12 of rank (s % 12) / 4 on checker partners[(s + s / 12) % 2] among the other
// two ranks: step 5 is vnode 5 of rank 1 checked by rank 2, step 6 vnode 6 of rank 1
// checked by rank 0. Members are numbered as the first generation's ranks.
const std::string kChecked = kJob + kDeterministic + " --set resources.verify_every_steps=1";

std::string the_fingerprint(const CommandResult& r) {
  const auto fps = fingerprints_in(r.output);
  INFO(r.output);
  REQUIRE(fps.size() == 1);
  return *fps.begin();
}

/// The contribution rank 0 logged for (step, vnode) where its two workers agreed.
std::string agreed_hash(const std::string& output, int step, int vnode) {
  std::smatch m;
  const std::regex line("\\[verify\\] step " + std::to_string(step) + " vnode " +
                        std::to_string(vnode) +
                        ": [^\\n]* agree \\(contribution ([0-9a-f]{16})\\)");
  return std::regex_search(output, m, line) ? m[1].str() : "";
}

/// The contribution worker `rank` computed in the logged mismatch.
std::string mismatched_hash(const std::string& output, int rank) {
  std::smatch m;
  const std::regex part("worker " + std::to_string(rank) +
                        " \\([^)]*\\) computed (?:contribution )?([0-9a-f]{16})");
  return std::regex_search(output, m, part) ? m[1].str() : "";
}

std::string replay_hash(const std::string& output) {
  std::smatch m;
  return std::regex_search(output, m, std::regex("contribution ([0-9a-f]{16})")) ? m[1].str() : "";
}

}  // namespace

TEST_CASE(
    "a bit flipped in one worker's gradients is caught and under evict that worker leaves "
    "with nothing lost",
    "[multiproc][verify]") {
  const auto reference = the_fingerprint(run_command(kTrain + kChecked));
  // The owner of the checked vnode (member 1 at step 5), then the checker (member 0, rank 0,
  // at step 6): a third worker decides which of the two is odd.
  for (const auto& [fault, odd, other] : {std::tuple<std::string, int, int>{"5:1", 1, 2},
                                          std::tuple<std::string, int, int>{"6:0", 0, 1}}) {
    TempDir dir;
    const auto r = run_command("VFLOW_INJECT_FAULT=" + fault + " " + kTrain + kChecked +
                               " --set resources.on_mismatch=evict --set output.logging.examples=" +
                               dir.file("examples.log") + " --workers 3");
    INFO(fault << "\n" << r.output);
    CHECK(r.exit_code == 0);
    const std::string step = fault.substr(0, 1);
    CHECK_THAT(r.output, Catch::Matchers::Contains("mismatch at step " + step + " vnode " + step));
    // Named: the odd worker, by rank, member and host, and the one the third agreed with.
    const std::regex verdict(
        "agrees with worker " + std::to_string(other) + " \\(member " + std::to_string(other) +
        ", [^)]*\\), so worker " + std::to_string(odd) + " \\(member " + std::to_string(odd) +
        ", pid \\d+ on [^)]+\\) leaves the job and step " + step + " is redone without it");
    CHECK(std::regex_search(r.output, verdict));
    CHECK_THAT(r.output, Catch::Matchers::Contains("this worker was outvoted"));
    CHECK_THAT(r.output, Catch::Matchers::Contains("left after a cross-check mismatch (status 8)"));
    CHECK(count_matches(r.output, "mismatch at step") >= 1);
    CHECK(the_fingerprint(r) == reference);
    // Exactly once: the undone step's vnodes ran again on the survivors, and no other.
    CHECK(read_example_log(dir.file("examples.log")).size() == 16 * 12);
    CHECK(nothing_left(dir));
  }
}

TEST_CASE(
    "under warn a mismatch is logged and training goes on, under stop the job stops before "
    "the step and a replay from there reproduces the logged hashes",
    "[multiproc][verify]") {
  // A clean run on 3 workers: every step agreed, each hash logged.
  const auto clean = run_command(kTrain + kChecked + " --workers 3");
  INFO(clean.output);
  REQUIRE(clean.exit_code == 0);
  CHECK_THAT(clean.output, !Catch::Matchers::Contains("mismatch"));
  CHECK(count_matches(clean.output, "agree \\(contribution") == 16);
  const auto reference = the_fingerprint(clean);

  const auto warn = run_command("VFLOW_INJECT_FAULT=5:1 " + kTrain + kChecked +
                                " --set resources.on_mismatch=warn --workers 3");
  INFO(warn.output);
  CHECK(warn.exit_code == 0);
  CHECK_THAT(warn.output, Catch::Matchers::Contains("mismatch at step 5 vnode 5"));
  CHECK_THAT(warn.output, Catch::Matchers::Contains("going on (resources.on_mismatch: warn)"));
  CHECK(the_fingerprint(warn) != reference);  // the flipped bit is in the sum

  TempDir dir;
  const std::string ckpt = " --set output.checkpoint.dir=" + dir.file("ckpt");
  const auto stop = run_command("VFLOW_INJECT_FAULT=5:2 " + kTrain + kChecked + ckpt +
                                " --workers 3");  // on_mismatch: stop, the default
  INFO(stop.output);
  CHECK(stop.exit_code == 8);
  CHECK_THAT(stop.output, Catch::Matchers::Contains("mismatch at step 5 vnode 5"));
  CHECK_THAT(stop.output, Catch::Matchers::Contains("step 5 is undone and the job stops"));
  // The honest owner's hash is what the clean run agreed on; the checker's is not.
  const auto honest = agreed_hash(clean.output, 5, 5);
  REQUIRE(honest.size() == 16);
  CHECK(mismatched_hash(stop.output, 1) == honest);
  CHECK(mismatched_hash(stop.output, 2) != honest);
  std::smatch m;
  REQUIRE(std::regex_search(stop.output, m, std::regex("\\[checkpoint\\] wrote (\\S+)")));
  const std::string checkpoint = m[1];
  CHECK_THAT(checkpoint, Catch::Matchers::Contains("00000005"));

  // Replays: the checked step itself, and one further on, trained forward to.
  for (const auto& [step, vnode] : {std::pair<int, int>{5, 5}, std::pair<int, int>{9, 9}}) {
    const auto replay = run_command(kTrain + kChecked + " --replay " + checkpoint + " --step " +
                                    std::to_string(step) + " --vnode " + std::to_string(vnode));
    INFO(replay.output);
    CHECK(replay.exit_code == 0);
    CHECK(replay_hash(replay.output) == agreed_hash(clean.output, step, vnode));
    CHECK_THAT(replay.output, Catch::Matchers::Contains("non-finite none"));
    CHECK_THAT(replay.output, Catch::Matchers::Contains("loss "));
  }
  // A replay that cannot answer says why instead: a step before the checkpoint's or past
  // the job's, a vnode out of range, another semantic part, default mode.
  const std::tuple<std::string, int, std::string> refused[] = {
      {kChecked + " --step 3 --vnode 1", 2, "holds step 5"},
      {kChecked + " --step 16 --vnode 1", 2, "the job has 16 steps"},
      {kChecked + " --step 6 --vnode 12", 2, "the job has 12 vnodes"},
      {kChecked + " --step 6 --vnode 1 --set semantic.seed=2", 4, "different semantic part"},
      {kJob + " --step 6 --vnode 1", 2, "not deterministic"},
  };
  for (const auto& [args, code, why] : refused) {
    const auto r = run_command(kTrain + " --replay " + checkpoint + args);
    INFO(args << "\n" << r.output);
    CHECK(r.exit_code == code);
    CHECK_THAT(r.output, Catch::Matchers::Contains(why));
  }
}

TEST_CASE("a clean job cross-checked at every step raises no alarm across resizes",
          "[multiproc][verify]") {
  const std::string job = kChecked + " --set semantic.steps=400 --set resources.timeout_s=10";
  const auto reference = the_fingerprint(run_command(kTrain + job));
  TempDir dir;
  const auto r = run_elastic_job(dir, 3, job,
                                 "$CTL resize $A 2; await_workers 2; $CTL resize $A 4; "
                                 "await_workers 4");
  INFO(r.output);
  CHECK_THAT(r.output, Catch::Matchers::Contains("exit=0"));
  CHECK_THAT(r.output, Catch::Matchers::Contains("published generation 3: 4 worker(s)"));
  CHECK_THAT(r.output, !Catch::Matchers::Contains("mismatch"));
  CHECK(the_fingerprint(r) == reference);
  // Every step was checked; the vnodes and the pairs of workers took turns.
  CHECK(count_matches(r.output, "agree \\(contribution") == 400);
  std::set<std::string> vnodes, pairs;
  const std::regex line(R"(\[verify\] step \d+ vnode (\d+): worker (\d+) .* and worker (\d+) )");
  for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), line);
       it != std::sregex_iterator(); ++it) {
    vnodes.insert((*it)[1]);
    pairs.insert((*it)[2].str() + "-" + (*it)[3].str());
  }
  CHECK(vnodes.size() == 12);
  CHECK(pairs.size() >= 6);
  CHECK(nothing_left(dir));
}

TEST_CASE("workers of different kernel signatures are not compared, and the job says so",
          "[multiproc][verify]") {
  // One and two intra-op threads give other bits: no pair can be checked.
  const auto r = run_command(
      kTrain + kChecked +
      " --workers 2 --set 'resources.layout=[{vnodes: 6, threads: 1}, {vnodes: 6, threads: 2}]'");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Matchers::Contains("no two of the 2 workers compute with the same "
                                                 "kernels"));
  CHECK_THAT(r.output, !Catch::Matchers::Contains("agree (contribution") &&
                           !Catch::Matchers::Contains("mismatch"));
}

TEST_CASE(
    "with no third worker to decide, evict stops, and a job without checkpoints keeps the "
    "state before the step",
    "[multiproc][verify]") {
  // 2 workers of 6 vnodes: step 7 checks vnode 7 of rank 1 on rank 0, and nobody referees.
  TempDir dir;
  const auto r = run_command("cd " + dir.path() + " && VFLOW_INJECT_FAULT=7:0 " + kTrain +
                             kChecked + " --set resources.on_mismatch=evict --workers 2");
  INFO(r.output);
  CHECK(r.exit_code == 8);
  CHECK_THAT(r.output, Catch::Matchers::Contains("mismatch at step 7 vnode 7"));
  CHECK_THAT(r.output, Catch::Matchers::Contains("no third worker of their signature to decide"));
  CHECK_THAT(r.output, Catch::Matchers::Contains("step 7 is undone and the job stops"));
  CHECK_THAT(r.output, Catch::Matchers::Contains("the state before step 7 is saved in "
                                                 "vflow-mismatch-step-7.pt"));
  const auto replay = run_command("cd " + dir.path() + " && " + kTrain + kChecked +
                                  " --replay vflow-mismatch-step-7.pt --step 7 --vnode 7");
  INFO(replay.output);
  CHECK(replay.exit_code == 0);
  CHECK(replay_hash(replay.output) == mismatched_hash(r.output, 1));  // the honest owner's
}
