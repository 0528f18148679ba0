// The node agent (docs/design.md §1): one process per host that registers the host's slots
// (devices) on the cluster's control store, starts, supervises and stops the workers the
// coordinators of jobs place there, and is a candidate to coordinate every job it sees.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "vflow/job/control_store.h"

namespace vflow::job {

struct AgentOptions {
  std::string control;  ///< the cluster's control store, etcd://H:P,... (its own member first)
  std::string name;     ///< unique among the cluster's agents; default: the host name
  std::string host;     ///< the host as others know it (messages, vflow-ctl agents); default: name
  /// One device per slot, as the heterogeneous planner names device types: "cpu",
  /// "cuda:0", ... Each slot runs one worker at a time.
  std::vector<std::string> slots{"cpu"};
  /// The program (and arguments before the job spec) a worker runs; default: vflow-train
  /// beside this program.
  std::vector<std::string> worker_command;
  /// Where the agent writes each job's spec for its workers; a job's workers run in the
  /// submitter's working directory when this host has it, else in the job's folder here.
  std::string work_dir;
  /// Requests to the control store; the agent's lease lives a third of it (at least 3 s).
  std::chrono::milliseconds timeout{30000};
  int stop_grace_s = 60;  ///< after SIGTERM, workers still running are killed
  /// Starts workers only for jobs whose submitter published a user of the job's own
  /// (ControlPlane::credentials); others are refused instead of running with this agent's.
  /// So does an agent with worker_uid_first, whose workers could not read this agent's.
  /// (An agent without an etcd user of its own has no credentials to give: it refuses none.)
  bool require_job_user = false;
  /// User ids for the workers, [first, last] (the agent runs as root): each job with workers
  /// here runs as the lowest id no other job here holds, so that no job's workers can read
  /// another's files, environment or memory, nor this agent's credentials; they run in the
  /// job's folder here. -1: workers run as this agent's user.
  int64_t worker_uid_first = -1;
  int64_t worker_uid_last = -1;
  /// Set (SIGTERM, SIGINT): the agent takes no new worker, its workers leave their jobs at
  /// the next step boundary, and it ends once they have (or after stop_grace_s).
  const std::atomic<bool>* stop_flag = nullptr;
};

/// The slots node agents registered (agents/ in the cluster's tree): one agent's record and which
/// of its slots are taken.
struct AgentRecord {
  std::string name;
  std::string host;
  int64_t pid = 0;
  std::string version;                   ///< build_identity() of the agent
  std::vector<std::string> slots;        ///< each slot's device: "cpu", "cuda:0", ...
  std::map<int64_t, std::string> taken;  ///< slot -> "<job> <member>" running there
  bool draining = false;                 ///< stopping: takes no new worker
};

/// Every living agent (one scan and one liveness read), sorted by name.
std::vector<AgentRecord> read_agents(ClusterStore& root);

/// The slots of the node agents living on the cluster store `control` ("etcd://..."):
/// what a scheduler schedules over there (docs/design.md §6). Counts every slot whose device
/// suits `device` ("cpu", "cuda"), taken or free.
int agent_slots(const std::string& control, const std::string& device,
                std::chrono::milliseconds timeout);

/// Runs a node agent until `stop_flag` is set and its workers have ended. Returns 0, or
/// throws Error (another agent of that name is running; the cluster cannot be reached).
int run_agent(const AgentOptions& options);

}  // namespace vflow::job
