// The scheduler's live mode (docs/design.md §6): the same policies as the simulator, applied to
// real elastic jobs (`vflow-train SPEC --workers K --port P`) on a pool of worker slots.
// Allocation changes become control-plane requests (§4): a resize for a running job, a
// stop with a checkpoint for a preempted one (it resumes from that checkpoint later). What
// a preemption costs each job is measured as it runs and given to the policies.
// Results use the simulator's types, so metrics, CSV and JSON are the same.
//
// Jobs file (YAML, a list; paths relative to the file):
//   - name: resnet-a          # unique; names the log and checkpoint directory
//     spec: jobs/a.yaml       # vflow-train job spec
//     arrival_s: 0            # seconds after the start of the run (default 0)
//     weight: 1               # priority weight (default 1)
//     demand: 2               # workers requested (default 1)
//     min_workers: 1          # elastic bounds (default 1 and demand)
//     max_workers: 3
//     steps: 400              # total steps, for remaining-work estimates (default: the spec's
//                             #   semantic.steps when it is a number, else 1)
//     args: [--set, semantic.seed=3]   # extra vflow-train arguments (default none)
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "vflow/scheduler/experiment.h"
#include "vflow/scheduler/simulator.h"

namespace vflow::scheduler {

/// One job of a jobs file.
struct LiveJob {
  std::string name;
  std::string spec;  ///< job spec path, resolved against the jobs file's directory
  double arrival_s = 0;
  double weight = 1;
  int demand = 1;
  int min_workers = 1;
  int max_workers = 1;
  double steps = 1;  ///< total steps (remaining-work estimates only)
  /// Throughput model: the rows of LiveOptions::throughput for it give the job's steps/s
  /// by worker count (device type "slot"); empty: the job's name, and the fallback curve
  /// where the file has no rows for that.
  std::string model;
  std::vector<std::string> args;  ///< extra vflow-train arguments
  std::string origin;             ///< "file:line" of the job's entry
};

/// Reads a jobs file. Throws vflow::SpecError "file:line:column: key: ..." on a bad entry.
std::vector<LiveJob> read_live_jobs(const std::string& path);

struct LiveOptions {
  int slots = 4;  ///< worker slots (one device type, "slot")
  /// Set ("etcd://H:P,..."): the jobs run on the node agents of this cluster store, submitted
  /// there by name (vflow-train --control URL --job NAME --workers K), and are resized and
  /// stopped through it; `slots` is then what the agents registered (job::agent_slots) when
  /// it is 0 (CPU slots, read once at the start).
  std::string control;
  std::string policy = "wfs-elastic";  ///< make_policy name
  /// Throughput file (docs/scheduler.md; e.g. from vflow-plan --throughput over profiles
  /// of device type "slot"); empty: every job gets the fallback curve.
  std::string throughput;
  PolicyOptions policy_options;  ///< round lengths, LAS buckets
  /// What preempting a job costs it, for the policies that weigh restarts (marginal), until
  /// the job's own is measured (LiveJobOutcome: its last start plus its last stop, or the
  /// mean stop so far); 0: no restart is weighed. Replaces policy_options.restart_s.
  double restart_s = 30;
  /// What resizing a running job pauses it, for marginal's objective; 0: not weighed.
  /// Replaces policy_options.resize_pause_s.
  double resize_pause_s = 0.1;
  std::string train_binary;       ///< vflow-train executable; required
  std::string out_dir;            ///< job logs (logs/NAME.log) and checkpoints; required
  double poll_s = 0.15;           ///< event-loop period, seconds
  double stop_grace_s = 30;       ///< after a stop request, SIGKILL the job's processes
  double connect_timeout_s = 60;  ///< a started job must open its control plane by then
  const std::atomic<bool>* stop_flag = nullptr;  ///< set (e.g. by SIGINT) to stop every job
  std::function<void(const std::string&)> log;   ///< progress lines; optional
};

/// What happened to one job's processes.
struct LiveJobOutcome {
  std::string name;
  int exit_code = -1;     ///< the last launcher's exit status; -1 when it never ended
  int64_t last_step = 0;  ///< steps completed, as the control plane last reported
  int launches = 0;       ///< processes started (1 + resumes after preemption)
  std::string log_path;   ///< the job's stdout and stderr
  /// Per launch that made progress: seconds from the launch to the first step the
  /// scheduler saw beyond the one it started from (process start, rendezvous, checkpoint
  /// load, and the steps made before the scheduler saw them: an upper bound).
  std::vector<double> start_seconds;
  /// Per preemption: seconds from the stop request to the launcher's exit (its last step
  /// and its checkpoint).
  std::vector<double> stop_seconds;
};

struct LiveResult {
  ExperimentResult experiment;           ///< one run; write_experiment writes it
  std::vector<LiveJobOutcome> outcomes;  ///< by job id (arrival order)
  bool interrupted = false;              ///< stop_flag ended the run early
  /// Every job completed with exit status 0.
  bool all_completed() const;
};

/// Runs the jobs in real time until all have ended (or stop_flag is set; then every job is
/// stopped). No process outlives the call: jobs that ignore a stop request are killed after
/// stop_grace_s, also when an error is thrown. Throws vflow::SpecError on bad options or jobs.
LiveResult run_live(const std::vector<LiveJob>& jobs, const LiveOptions& options);

}  // namespace vflow::scheduler
