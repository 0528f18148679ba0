// vflow-agent: one per host of a cluster. Registers the host's slots on the cluster's
// control store (etcd), starts and supervises the workers that jobs' coordinators place
// there, and stands as a candidate to coordinate every job. SIGTERM: its workers leave
// their jobs at the next step boundary, then it ends.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <sstream>

#include "command_line.h"
#include "vflow/comm/nccl_environment.h"
#include "vflow/core/error.h"
#include "vflow/job/agent.h"
#include "vflow/job/environment.h"

namespace {
std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }
}  // namespace

int main(int argc, char** argv) {
  vflow::comm::prepare_nccl_environment();  // before any thread exists: workers inherit it
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGPIPE, SIG_IGN);  // a closed output must not end the agent of a host
  CLI::App app{
      "vflow-agent: serve this host's slots to the vflow jobs of a cluster's control store\n"
      "exit codes: 0 stopped, 2 usage error, 5 control store unreachable"};
  vflow::job::AgentOptions options;
  std::string slots;
  double timeout_s = 30;
  std::string worker;
  app.add_option("--control", options.control,
                 "the cluster's control store, etcd://HOST:PORT,... (etcds:// for TLS; "
                 "credentials: VFLOW_ETCD_*); list this host's member first")
      ->required();
  app.add_option("--name", options.name,
                 "this agent's name in the cluster (default: the host name; under srun "
                 "slurm<job id>-<node>)");
  app.add_option("--host", options.host,
                 "this host as the cluster knows it, for listings (default: the name)");
  app.add_option("--slots", slots,
                 "one device per slot, comma-separated: cpu,cpu,cuda:0,... (default: cpu; under "
                 "srun one per GPU, else per CPU, of the task); each slot runs one worker");
  app.add_option("--timeout", timeout_s,
                 "seconds a request to the control store may take; the agent's lease lives a "
                 "third of it, at least 3 s")
      ->check(vflow::apps::positive_number());
  app.add_option("--work-dir", options.work_dir,
                 "where job specs are written for the workers (default: /tmp/vflow-agent-NAME)");
  app.add_option("--worker", worker,
                 "the program a worker runs (default: vflow-train beside this program)");
  app.add_option("--stop-grace", options.stop_grace_s,
                 "seconds the workers have to leave after SIGTERM before they are killed")
      ->check(vflow::apps::at_least(1));
  app.add_flag("--require-job-user", options.require_job_user,
               "start workers only for jobs whose submitter holds an etcd user confined to the "
               "job (their workers get it); refuse the others instead of giving them this "
               "agent's credentials");
  std::string worker_uids;
  app.add_option("--worker-uids", worker_uids,
                 "FIRST-LAST: run each job's workers as a user id of its own from this range "
                 "(the agent runs as root), so that jobs cannot read each other's files or this "
                 "agent's credentials; workers then run in the job's folder under --work-dir");
  if (const int code = vflow::apps::parse_command_line(app, argc, argv); code >= 0) return code;
  spdlog::set_pattern("[%H:%M:%S] %v");
  return vflow::apps::run_reporting_errors([&]() -> int {
    // Under srun the allocation says who and what this agent is, unless the flags do.
    const auto place = vflow::job::agent_place_from_environment();
    if (options.name.empty()) options.name = place.name;
    if (options.host.empty()) options.host = place.host;
    if (slots.empty() && !place.slots.empty()) {
      for (const auto& s : place.slots) slots += (slots.empty() ? "" : ",") + s;
    }
    if (slots.empty()) slots = "cpu";
    options.slots.clear();
    std::stringstream list(slots);
    for (std::string slot; std::getline(list, slot, ',');) {
      if (slot != "cpu" && slot.rfind("cuda:", 0) != 0) {
        throw vflow::SpecError("--slots: '" + slot + "' is not cpu or cuda:K");
      }
      options.slots.push_back(slot);
    }
    if (!worker.empty()) options.worker_command = {worker};
    if (!worker_uids.empty()) {
      const auto dash = worker_uids.find('-');
      try {
        size_t used = 0;
        options.worker_uid_first = std::stoll(worker_uids.substr(0, dash), &used);
        if (dash == std::string::npos || used != dash) throw std::invalid_argument("range");
        options.worker_uid_last = std::stoll(worker_uids.substr(dash + 1), &used);
        if (used != worker_uids.size() - dash - 1) throw std::invalid_argument("range");
      } catch (const std::exception&) {
        throw vflow::SpecError("--worker-uids: '" + worker_uids + "' is not FIRST-LAST");
      }
    }
    options.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    options.stop_flag = &g_stop;
    return vflow::job::run_agent(options);
  });
}
