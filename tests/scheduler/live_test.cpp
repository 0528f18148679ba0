// The live mode with real vflow-train jobs on loopback: staggered arrivals on a small pool
// make the elastic policy resize (or the priority policy preempt) running jobs, and every job
// still ends with the fingerprint of the same job run alone (deterministic mode).
#include "vflow/scheduler/live.h"

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <regex>
#include <sstream>
#include <string>
#include <utility>

namespace sched = vflow::scheduler;
namespace fs = std::filesystem;

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

struct Output {
  int exit_code = -1;
  std::string text;
};

/// Runs a shell command with its stdout and stderr captured in the file `log`.
Output run_command(const std::string& command, const std::string& log) {
  const int status = std::system((command + " >'" + log + "' 2>&1").c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_text(log)};
}

/// The last "fingerprint <16 hex>" of a job's output (a resumed job prints one per launch).
std::string last_fingerprint(const std::string& text) {
  static const std::regex pattern("fingerprint ([0-9a-f]{16})");
  std::string last;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), pattern);
       it != std::sregex_iterator(); ++it) {
    last = (*it)[1];
  }
  return last;
}

/// A fresh directory, removed with everything in it at the end of the test.
struct TempDir {
  std::string root = [] {
    std::string pattern = (fs::temp_directory_path() / "vflow_live_XXXXXX").string();
    return std::string(mkdtemp(pattern.data()));
  }();
  ~TempDir() { fs::remove_all(root); }
  std::string file(const std::string& name) const { return root + "/" + name; }
};

// The small synthetic-data job of the engine's tests: a few seconds on one core.
std::string job_spec(int seed, int steps) {
  return "semantic:\n"
         "  model: {name: convnet, options: {channels: [4, 8], hidden: 16, dropout: 0.25}}\n"
         "  data: {name: synthetic, options: {train_size: 600, test_size: 64, shape: [1, 12, 12], "
         "classes: 4, noise: 1.5}}\n"
         "  global_batch: 48\n"
         "  virtual_nodes: 12\n"
         "  steps: " +
         std::to_string(steps) +
         "\n"
         "  epochs: null\n"
         "  seed: " +
         std::to_string(seed) +
         "\n"
         "  deterministic: true\n"
         "resources: {threads: 1}\n"
         "output:\n"
         "  logging: {progress: off}\n";
}

/// vflow-train processes of this test's jobs (every one has the directory in its arguments).
int processes_left(const TempDir& dir) {
  const auto out =
      run_command("ps -eo args | grep -c '[v]flow-train.*" + dir.root + "'", dir.root + ".ps");
  std::remove((dir.root + ".ps").c_str());
  return std::atoi(out.text.c_str());
}

struct TestJob {
  std::string name;
  int seed = 1, steps = 200;
  double arrival_s = 0;
  int demand = 1, max_workers = 1;
  double weight = 1;
};

/// A real etcd and two node agents on loopback (2 and 1 cpu slots): a cluster store for
/// the live mode. Stopped, agents first, when the object dies.
struct AgentCluster {
  TempDir dir;
  std::string url;
  AgentCluster() {
    const auto etcd = run_command(
        std::string(VFLOW_SOURCE_DIR) + "/scripts/etcd-local.sh start " + dir.file("etcd"),
        dir.file("etcd.out"));
    INFO(etcd.text);
    REQUIRE(etcd.exit_code == 0);
    url = etcd.text.substr(etcd.text.rfind("etcd://"));
    while (!url.empty() && std::isspace(static_cast<unsigned char>(url.back()))) url.pop_back();
    for (const auto& [name, slots] : {std::pair{"a1", "cpu,cpu"}, std::pair{"a2", "cpu"}}) {
      std::system((std::string(VFLOW_AGENT_BINARY) + " --control " + url + " --name " + name +
                   " --slots " + slots + " --timeout 10 --work-dir " + dir.file(name) + " > " +
                   dir.file(std::string(name) + ".log") + " 2>&1 & echo $! >> " +
                   dir.file("agents.pid"))
                      .c_str());
    }
    for (int i = 0; i < 100; ++i) {
      const auto agents = run_command(
          std::string(VFLOW_CTL_BINARY) + " --control " + url + " agents | grep -c ' host '",
          dir.file("agents.out"));
      if (std::atoi(agents.text.c_str()) == 2) return;
      usleep(100000);
    }
    FAIL("the agents did not register");
  }
  ~AgentCluster() {
    std::system(("kill -TERM $(cat " + dir.file("agents.pid") + ") 2>/dev/null; for p in $(cat " +
                 dir.file("agents.pid") +
                 "); do while kill -0 $p 2>/dev/null; do sleep 0.1; "
                 "done; done; " VFLOW_SOURCE_DIR "/scripts/etcd-local.sh stop " +
                 dir.file("etcd"))
                    .c_str());
  }
};

/// Runs `jobs` in live mode on `slots` slots (on `cluster`'s node agents when given: the
/// pool is then theirs) and checks what every scenario must keep: all jobs complete with exit
/// 0 and the fingerprint of the same job run alone, the result files are written, and no
/// process is left.
sched::LiveResult run_and_check(const std::vector<TestJob>& jobs, int slots,
                                const std::string& policy, const AgentCluster* cluster = nullptr) {
  TempDir dir;
  std::string jobs_yaml;
  for (const auto& j : jobs) {
    write_text(dir.file(j.name + ".yaml"), job_spec(j.seed, j.steps));
    jobs_yaml += "- {name: " + j.name + ", spec: " + j.name +
                 ".yaml, arrival_s: " + std::to_string(j.arrival_s) +
                 ", demand: " + std::to_string(j.demand) +
                 ", min_workers: 1, max_workers: " + std::to_string(j.max_workers) +
                 ", weight: " + std::to_string(j.weight) + "}\n";
  }
  write_text(dir.file("jobs.yaml"), jobs_yaml);

  // The references: each job alone in one process.
  std::vector<std::future<Output>> references;
  for (const auto& j : jobs) {
    references.push_back(std::async(std::launch::async, [&dir, name = j.name] {
      return run_command(std::string(VFLOW_TRAIN_BINARY) + " " + dir.file(name + ".yaml"),
                         dir.file(name + ".reference.log"));
    }));
  }
  std::map<std::string, std::string> expected;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Output ref = references[i].get();
    INFO(ref.text);
    REQUIRE(ref.exit_code == 0);
    expected[jobs[i].name] = last_fingerprint(ref.text);
    REQUIRE(expected[jobs[i].name].size() == 16);
  }

  sched::LiveOptions options;
  options.slots = slots;
  if (cluster) {
    options.control = cluster->url;
    options.slots = 0;  // the agents' slots
  }
  options.policy = policy;
  options.train_binary = VFLOW_TRAIN_BINARY;
  options.out_dir = dir.file("out");
  std::string progress;
  options.log = [&](const std::string& line) { progress += line + "\n"; };
  auto result = sched::run_live(sched::read_live_jobs(dir.file("jobs.yaml")), options);
  INFO(progress);
  sched::write_experiment(result.experiment, "", options.out_dir);

  CHECK(result.all_completed());
  CHECK(result.experiment.summaries.at(0).jct.jobs == static_cast<int>(jobs.size()));
  REQUIRE(result.outcomes.size() == jobs.size());
  for (const auto& outcome : result.outcomes) {
    INFO(outcome.name << ": " << read_text(outcome.log_path));
    CHECK(outcome.exit_code == 0);
    // On the agents the submitter prints the job's result as rank 0 saw it.
    CHECK(last_fingerprint(read_text(outcome.log_path)) == expected[outcome.name]);
  }
  if (cluster)
    CHECK_THAT(progress, Catch::Matchers::Contains(std::to_string(slots) + " cpu slot(s)"));
  for (const auto& job : result.experiment.runs.at(0).jobs) {
    CHECK(job.start_s >= job.arrival_s);
    CHECK(job.finish_s > job.start_s);
  }
  CHECK(fs::exists(dir.file("out/summary.json")));
  CHECK(fs::exists(dir.file("out/jobs_" + policy + ".csv")));
  CHECK(processes_left(dir) == 0);
  return result;
}

}  // namespace

TEST_CASE("live mode resizes real jobs without changing their results", "[multiproc][scheduler]") {
  // a fills the pool alone; b and c arrive while it trains, so a shrinks, then grows again.
  const auto result =
      run_and_check({{"a", 1, 1000, 0, 1, 3}, {"b", 2, 200, 1.5, 1, 2}, {"c", 3, 200, 3, 1, 2}}, 3,
                    "wfs-elastic");
  CHECK(result.experiment.summaries.at(0).resizes >= 1);
}

TEST_CASE("live mode preempts a job with a checkpoint and resumes it unchanged",
          "[multiproc][scheduler]") {
  // The heavier job b takes the whole pool from a, which stops, waits, and resumes from its
  // checkpoint once b is done. a is long enough to be still training when b arrives (at
  // 300 steps a quick machine had finished it by then).
  const auto result =
      run_and_check({{"a", 1, 1200, 0, 2, 2}, {"b", 2, 150, 1.5, 2, 2, 5}}, 2, "priority");
  CHECK(result.experiment.summaries.at(0).preemptions == 1);
  CHECK(result.outcomes.at(0).launches == 2);
  // What the preemption cost a is measured: the stop, and each launch that made progress
  // (the first may have been stopped before its first step), the resume at least.
  const auto& a = result.outcomes.at(0);
  REQUIRE(a.stop_seconds.size() == 1);
  CHECK(a.stop_seconds[0] > 0);
  CHECK(a.stop_seconds[0] < 30);  // the stop grace: a stop that took longer was killed
  CHECK(!a.start_seconds.empty());
  CHECK(a.start_seconds.size() <= 2);
  for (const auto& outcome : result.outcomes) {
    INFO(outcome.name);
    REQUIRE(!outcome.start_seconds.empty());
    CHECK(outcome.start_seconds.back() > 0);
    // About 1.5 s here; a job that has not opened its control plane after the connect
    // timeout (60 s) is abandoned, so a start this long means something is wrong.
    CHECK(outcome.start_seconds.back() < 60);
  }
  CHECK(result.outcomes.at(1).stop_seconds.empty());
}

TEST_CASE("live mode on node agents schedules over their slots and resizes jobs through etcd",
          "[multiproc][scheduler][etcd][agents]") {
  const AgentCluster cluster;
  const auto result =
      run_and_check({{"a", 1, 1000, 0, 1, 3}, {"b", 2, 200, 1.5, 1, 2}, {"c", 3, 200, 3, 1, 2}}, 3,
                    "wfs-elastic", &cluster);
  CHECK(result.experiment.summaries.at(0).resizes >= 1);
}

TEST_CASE("live mode orders jobs by the throughput measured from their profiles",
          "[multiproc][scheduler]") {
  // One slot, srtf, two jobs at once: a has 40 steps, b 60. With the fallback curve (1 step/s
  // for every job) a runs first. With throughput rows, b's made by vflow-plan from a profile
  // of its own job (tens of steps/s here) and a's written at 0.5 step/s, b's 60 steps take
  // about a second against a's 80 s: b runs first.
  TempDir dir;
  write_text(dir.file("a.yaml"), job_spec(1, 40));
  write_text(dir.file("b.yaml"), job_spec(2, 60));
  const auto profile =
      run_command(std::string(VFLOW_PROFILE_BINARY) + " " + dir.file("b.yaml") +
                      " --device-type slot --sizes 4 --repeats 2 --out " + dir.file("slot.yaml"),
                  dir.file("profile.log"));
  INFO(profile.text);
  REQUIRE(profile.exit_code == 0);
  const auto rows = run_command(std::string(VFLOW_PLAN_BINARY) + " " + dir.file("b.yaml") +
                                    " --profile " + dir.file("slot.yaml") + " --throughput conv:1",
                                dir.file("rows.tsv"));
  INFO(rows.text);
  REQUIRE(rows.exit_code == 0);
  write_text(dir.file("throughput.tsv"), rows.text + "linear  slow  slot  0.5\n");
  const auto run = [&](const std::string& throughput, const std::string& out) {
    write_text(dir.file("jobs.yaml"), throughput.empty()
                                          ? "- {name: a, spec: a.yaml}\n- {name: b, spec: b.yaml}\n"
                                          : "- {name: a, spec: a.yaml, model: slow}\n"
                                            "- {name: b, spec: b.yaml, model: conv}\n");
    sched::LiveOptions options;
    options.slots = 1;
    options.policy = "srtf";
    options.throughput = throughput;
    options.train_binary = VFLOW_TRAIN_BINARY;
    options.out_dir = dir.file(out);
    std::string progress;
    options.log = [&](const std::string& line) { progress += line + "\n"; };
    auto result = sched::run_live(sched::read_live_jobs(dir.file("jobs.yaml")), options);
    INFO(progress);
    CHECK(result.all_completed());
    REQUIRE(result.outcomes.size() == 2);
    CHECK(result.outcomes[0].name == "a");
    CHECK(result.outcomes[1].name == "b");
    if (!throughput.empty()) {
      CHECK_THAT(progress, Catch::Matchers::Contains("b: throughput of model conv: table("));
    }
    const auto& jobs = result.experiment.runs.at(0).jobs;
    return jobs.at(1).start_s < jobs.at(0).start_s;  // b first
  };
  CHECK(run(dir.file("throughput.tsv"), "measured"));
  CHECK_FALSE(run("", "fallback"));
  CHECK(processes_left(dir) == 0);

  // A model the file lacks is an error naming the jobs file's line.
  write_text(dir.file("jobs.yaml"), "- {name: a, spec: a.yaml, model: missing}\n");
  sched::LiveOptions options;
  options.slots = 1;
  options.throughput = dir.file("throughput.tsv");
  options.train_binary = VFLOW_TRAIN_BINARY;
  options.out_dir = dir.file("missing");
  CHECK_THROWS_WITH(sched::run_live(sched::read_live_jobs(dir.file("jobs.yaml")), options),
                    Catch::Matchers::Contains("jobs.yaml:1") &&
                        Catch::Matchers::Contains("'missing' has no rows"));
}

TEST_CASE("vflow-sched live reports a bad jobs file with file:line and exit code 2",
          "[multiproc][scheduler]") {
  TempDir dir;
  write_text(dir.file("spec.yaml"), job_spec(1, 10));
  write_text(dir.file("jobs.yaml"),
             "- {name: a, spec: spec.yaml}\n- {name: b, spec: spec.yaml, "
             "demand: 2, max_workers: 1}\n");
  const std::string sched = std::string(VFLOW_SCHED_BINARY) + " live --slots 2 --out " +
                            dir.file("out") + " --train " + VFLOW_TRAIN_BINARY + " --jobs ";
  auto out = run_command(sched + dir.file("jobs.yaml"), dir.file("sched.log"));
  CHECK(out.exit_code == 2);
  CHECK_THAT(out.text, Catch::Matchers::Contains("jobs.yaml:2:") &&
                           Catch::Matchers::Contains("max_workers: must be >= demand"));
  write_text(dir.file("jobs.yaml"), "- {name: a, spec: spec.yaml, demand: 3}\n");
  out = run_command(sched + dir.file("jobs.yaml"), dir.file("sched.log"));
  CHECK(out.exit_code == 2);  // demand larger than the pool
  CHECK_THAT(out.text, Catch::Matchers::Contains("jobs.yaml:1"));
  out = run_command(sched + dir.file("missing.yaml"), dir.file("sched.log"));
  CHECK(out.exit_code == 2);
  CHECK(processes_left(dir) == 0);
}
