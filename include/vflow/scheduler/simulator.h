// Event-driven cluster simulator. Events: job arrivals, job completions and, for policies
// with rounds, periodic reallocations. All events at one instant are applied together, then
// the policy is asked once for a new allocation; only jobs whose (type, workers) changed are
// touched (a job on several device types: when its workers on any type change). Between events a
// job progresses at its throughput(workers, type), except during a pause: resize_pause_s after an
// elastic resize on the same type, restart_s after a preemption (on resume) or a move to another
// device type, startup_s at the first start. The simulator has no randomness: a workload and a
// policy give one result.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "vflow/scheduler/cluster.h"
#include "vflow/scheduler/policy.h"
#include "vflow/scheduler/workload.h"

namespace vflow::scheduler {

struct SimProgress {
  int finished = 0;   ///< jobs completed so far
  int total = 0;      ///< jobs in the workload
  double now_s = 0;   ///< simulated time
  double host_s = 0;  ///< host time spent simulating so far
  size_t active = 0;  ///< jobs arrived and not finished
};

struct SimOptions {
  double resize_pause_s = 0.1;  ///< no progress after an elastic resize (measured; see docs)
  double restart_s = 30;        ///< no progress after a resume from preemption or a migration
  double startup_s = 0;         ///< no progress after a job's first start (every policy alike)
  /// 0: the policy decides at every instant with an arrival, a completion or a round. > 0:
  /// it decides only at multiples of this many seconds (a round-based scheduler's period),
  /// once for every change since the last decision; devices a job frees and jobs that
  /// arrive wait until then. The large-scale simulations use it.
  double decision_interval_s = 0;
  bool record_timeline = true;  ///< keep the allocated-devices step function
  std::function<void(const SimProgress&)> on_progress;  ///< called each ~1% of jobs finished
};

struct JobResult {
  int id = 0;
  std::string model;
  double weight = 1;
  int demand = 1;
  double arrival_s = 0;
  double start_s = -1;  ///< first time the job held devices
  double finish_s = -1;
  double total_work = 0;      ///< steps the job needed
  double work_done = 0;       ///< steps the simulator credited; equals total_work
  double device_seconds = 0;  ///< devices held x time, pauses included
  int resizes = 0;            ///< worker-count changes on the same type while running
  int migrations = 0;         ///< moves to another device type while running
  int preemptions = 0;        ///< times the job lost all its devices before finishing
  double spanned_s = 0;       ///< seconds the job held devices of several types
  double jct_s() const { return finish_s - arrival_s; }
  double queueing_s() const { return start_s - arrival_s; }
};

struct TimelinePoint {
  double time_s = 0;
  int allocated = 0;  ///< devices held by jobs from time_s until the next point
};

struct SimResult {
  std::string policy;
  int total_devices = 0;
  std::vector<JobResult> jobs;          ///< by job id
  std::vector<TimelinePoint> timeline;  ///< empty unless record_timeline
  int64_t events = 0;                   ///< events processed
  int64_t allocations = 0;              ///< policy calls
  double wall_s = 0;                    ///< host time spent simulating
};

/// A result that knows only the job (id, model, weight, demand, arrival, work), for a runner
/// to fill in as the job runs.
JobResult job_result_for(const Job& job);

/// Runs the workload to completion. Throws vflow::InternalError if the policy returns an
/// allocation that breaks the cluster's capacity or a job's bounds.
SimResult simulate(const Cluster& cluster, const Workload& workload, Policy& policy,
                   const SimOptions& options = {});

}  // namespace vflow::scheduler
