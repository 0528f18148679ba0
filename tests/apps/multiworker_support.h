// What the multi-process tests share: the small job they train, output parsing and an
// elastic job driven from a shell script.
#pragma once

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support.h"
#include "vflow/data/text.h"
#include "vflow/job/control_plane.h"

namespace vflow::testing {

inline const std::string kTrain = VFLOW_TRAIN_BINARY;
inline const std::string kCtl = VFLOW_CTL_BINARY;
// ConvNet with batch norm and dropout, N = 12 vnodes of 4.
inline const std::string kJob =
    " --set semantic.data='{name: synthetic, options: {train_size: 600, test_size: 64, shape: [1, "
    "12, 12], "
    "classes: 4, noise: 1.5}}'"
    " --set semantic.model.options='{channels: [4, 8], hidden: 16, dropout: 0.25}'"
    " --set semantic.global_batch=48 --set semantic.virtual_nodes=12 --set semantic.steps=16"
    " --set semantic.epochs=null --set resources.threads=1 --set resources.timeout_s=20"
    " --set output.logging.progress=off";
inline const std::string kDeterministic = " --set semantic.deterministic=true";

/// Every distinct "fingerprint <hex>" in a program's output.
inline std::set<std::string> fingerprints_in(const std::string& output) {
  std::set<std::string> out;
  const std::regex fp(
      "(?:^|[^(])fingerprint ([0-9a-f]{16})");  // not "(fingerprint ...)" of a resume
  for (auto it = std::sregex_iterator(output.begin(), output.end(), fp);
       it != std::sregex_iterator(); ++it) {
    out.insert((*it)[1]);
  }
  return out;
}

/// `count` bytes of a fortune file, from byte `from`, as byte-token ids
/// (data::ByteTokenizer): token shards of real text.
inline std::vector<uint16_t> fortune_byte_tokens(size_t count, size_t from = 0) {
  const std::string text = read_file("/usr/share/games/fortunes/computers");
  REQUIRE(text.size() >= from + count);
  std::vector<uint16_t> tokens;
  for (size_t i = from; i < from + count; ++i) {
    tokens.push_back(
        static_cast<uint16_t>(vflow::data::ByteTokenizer::id(static_cast<unsigned char>(text[i]))));
  }
  return tokens;
}

/// The number `key` of every step record in a metrics file that has it, in order.
inline std::vector<double> step_values(const std::string& metrics_path, const std::string& key) {
  std::vector<double> out;
  std::ifstream in(metrics_path);
  std::string line;
  const std::regex value("\"event\":\"step\".*\"" + key + "\":([-0-9.e+]+)");
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, value)) out.push_back(std::stod(m[1]));
  }
  return out;
}

/// The training loss of every step record in a metrics file, in order.
inline std::vector<double> step_losses(const std::string& metrics_path) {
  return step_values(metrics_path, "loss");
}

/// How many times `pattern` matches in `text`.
inline long count_matches(const std::string& text, const std::string& pattern) {
  const std::regex re(pattern);
  return std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator());
}

/// The pace of a disturbed job: its workers start their steps at least 100 ms apart while
/// the file `pace` in the test's folder exists (VFLOW_STEP_PACE, a test switch). A job then
/// trains at most ten steps a second while a test disturbs it, on any machine, so that its
/// steps need cover only that, not what the fastest machine would run meanwhile; once the
/// disturbances are over, the test removes the file and the job runs out at full speed. In
/// a script, on() makes the file and exports the switch to the processes started after it
/// (the launcher's and the agents' workers inherit it); off() removes the file.
struct Pace {
  explicit Pace(const TempDir& dir) : file(dir.file("pace")) {}
  std::string on() const { return "touch " + file + "; export VFLOW_STEP_PACE=100:" + file + "\n"; }
  std::string off() const { return "rm -f " + file + "\n"; }
  std::string file;
};

/// Starts vflow-train with the settings `job` and `workers` workers on a known port, waits
/// for its 20th step, runs the shell `actions` (with $CTL, $A = the job's address, and the
/// helpers `await_workers K`, `await_step S` and `pace_off`), waits for the launcher and
/// prints "exit=<code>". With `control` (etcd://...) the job runs on that cluster control
/// store as `job_name`, its workers started by the launcher (--local). Unless `paced` is
/// false the job is paced (Pace) until the actions are done or call pace_off.
inline CommandResult run_elastic_job(const TempDir& dir, int workers, const std::string& job,
                                     const std::string& actions, const std::string& control = "",
                                     const std::string& job_name = "", bool paced = true) {
  const int port = free_port();
  const Pace pace(dir);
  // With a cluster control store, vflow-ctl reaches the job by name there; otherwise at
  // the coordinator's port.
  const std::string ctl =
      control.empty() ? kCtl + " --timeout 2" : kCtl + " --timeout 2 --control " + control;
  const std::string address = control.empty() ? "127.0.0.1:" + std::to_string(port) : job_name;
  const std::string where = control.empty()
                                ? " --port " + std::to_string(port)
                                : " --control " + control + " --job " + job_name + " --local";
  // The helpers give up as soon as the coordinator is gone (the job ended).
  const std::string script =
      "CTL=\"" + ctl + "\"; A=" + address +
      "\nstatus() { $CTL status $A 2>/dev/null; }"
      "\nawait_workers() { for i in $(seq 300); do out=$(status) || { echo \"GONE waiting for $1 "
      "workers\"; return 1; }; echo \"$out\" | grep -qx \"workers $1\" && return 0; sleep 0.05; "
      "done; echo \"TIMEOUT waiting for $1 workers\"; }"
      "\nawait_step() { for i in $(seq 600); do kill -0 $pid 2>/dev/null || { echo \"GONE waiting "
      "for step $1\"; return 1; }; s=$(status | sed -n 's/^step //p'); [ -n \"$s\" ] "
      "&& [ \"$s\" -ge $1 ] && return 0; sleep 0.05; done; }"
      "\npace_off() { " +
      pace.off() + "echo \"pace off at $(status | grep '^step')\"; }\n" + (paced ? pace.on() : "") +
      kTrain + job + " --set output.logging.metrics=" + dir.file("m.jsonl") + " --workers " +
      std::to_string(workers) + where + " & pid=$!\nawait_step 20\n" + actions +
      "\npace_off\nwait $pid; echo \"exit=$?\"\n";
  write_file(dir.file("job.sh"), script);
  return run_command("bash " + dir.file("job.sh"));
}

/// Asks the job whose coordinator listens on `port` for a resize at every step it takes,
/// cycling through 1..4 workers, until `requests` were made or the job ended; returns how
/// many were made. Fails the test on an error.
inline int resize_storm(int port, int requests) {
  int made = 0;
  try {
    std::unique_ptr<vflow::job::ControlPlane> control;
    for (int attempt = 0; attempt < 100 && !control; ++attempt) {
      try {
        control =
            std::make_unique<vflow::job::ControlPlane>("127.0.0.1", port, std::chrono::seconds(2));
        control->limits();  // the coordinator has published the job
      } catch (const std::exception&) {
        control.reset();
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
    REQUIRE(control);
    int64_t last = -1;
    while (made < requests && control->state() == vflow::job::JobState::kRunning) {
      const int64_t step = control->status().step;
      if (step == last) continue;
      control->request_resize(made % 4 + 1);
      last = step;
      ++made;
    }
  } catch (const std::exception& e) {
    FAIL_CHECK(e.what());
  }
  return made;
}

/// No process of this job is left (its temp dir is in every worker's command line).
inline bool nothing_left(const TempDir& dir) {
  return run_command("ps -eo args | grep -c '[v]flow-train.*" + dir.path() + "'").output == "0\n";
}

/// The example log as {(step, vnode) -> indices}; fails on a duplicate (step, vnode).
inline std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> read_example_log(
    const std::string& path) {
  std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> log;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    int64_t step = 0, vnode = 0, index = 0;
    fields >> step >> vnode;
    std::vector<int64_t> indices;
    while (fields >> index) indices.push_back(index);
    const bool fresh = log.emplace(std::make_pair(step, vnode), indices).second;
    CAPTURE(step, vnode);
    CHECK(fresh);  // no vnode of any step ran twice
  }
  return log;
}

}  // namespace vflow::testing
