// Scheduling policies. A policy sees the active jobs (arrived, not finished) and returns an
// Allocation: job id -> (device type, worker count). The simulator applies it; a live mode
// would apply the same allocation to running jobs through resize requests.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "vflow/scheduler/cluster.h"
#include "vflow/scheduler/workload.h"

namespace vflow::scheduler {

/// What a policy knows about one active job at decision time.
struct JobView {
  const Job* job = nullptr;
  double remaining_work = 0;    ///< steps left
  double attained_service = 0;  ///< device-seconds held so far
  int device_type = -1;         ///< current type, -1 when not running
  int workers = 0;              ///< current worker count (all types), 0 when not running
  /// Workers per device type while the job runs on several types (device_type is then the
  /// type of its assignment), nullptr otherwise.
  const int* counts = nullptr;
  /// What stopping the job and resuming it later costs it, seconds, where measured (live
  /// mode measures it per job); < 0: unknown, PolicyOptions::restart_s stands for it.
  double restart_s = -1;
  /// The highest of job->rate(t, job->demand) over the cluster's types, or more; <= 0:
  /// not given (a policy that wants it computes it). It does not change while the job
  /// runs, so a simulator computes it once.
  double fastest_demand_rate = -1;
};

struct Assignment {
  int job_id = 0;
  int device_type = 0;
  int workers = 0;  ///< > 0
};

/// Jobs absent from `assignments` get no devices. Sorted by job id.
struct Allocation {
  std::vector<Assignment> assignments;
  /// Further workers of other device types for jobs of `assignments` (elastic policies only;
  /// a job's worker bounds apply to its total). Sorted by (job id, device type); never the
  /// type of the job's assignment.
  std::vector<Assignment> spans;
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string name() const = 0;
  /// false: every assignment has workers == demand (the simulator checks).
  virtual bool elastic() const = 0;
  /// > 0: the simulator also reallocates every round_s seconds while jobs are active.
  virtual double round_s() const { return 0; }
  /// `active` is sorted by job id. Must respect the cluster's per-type counts.
  virtual Allocation allocate(const Cluster& cluster, const std::vector<JobView>& active,
                              double now) = 0;
};

/// The order (and, for the elastic policy, the share weight) of jobs.
enum class Priority {
  kFifo,     ///< arrival time; weight = user weight
  kSjf,      ///< total time at demand; weight = user weight / that time
  kSrtf,     ///< remaining time at demand; weight = user weight / that time
  kWeights,  ///< user weight, descending, then arrival; weight = user weight
  kLas,      ///< Tiresias: attained service bucket, then arrival
};

struct PolicyOptions {
  std::vector<double> las_thresholds = {3600, 36000};  ///< LAS bucket bounds, device-seconds
  double las_round_s = 300;                            ///< LAS: re-rank period, seconds
  double gavel_round_s = 360;  ///< Gavel-style policy: round length, seconds
  /// marginal and marginal-span: what stopping a running job costs it (the simulator's
  /// restart_s). A running job ranks and gains as if this much less were left, and a move
  /// to another type must save more than this on its remaining work. A job's own measured
  /// cost (JobView::restart_s) replaces it where known; 0 weighs no restart at all. Other
  /// policies get 0.
  double restart_s = 0;
  /// marginal and marginal-span: the pause of resizing a running job (the simulator's
  /// resize_pause_s). Growing a running job costs it this much, as if that much more work
  /// at its new rate were left, and keeping its worker count saves it; 0 weighs no pause.
  /// Other policies get 0.
  double resize_pause_s = 0;
};

/// Names: marginal, marginal-span (jobs may span device types), wfs-elastic (user weights),
/// wfs-fifo, wfs-sjf, wfs-srtf; fifo, priority, srtf, las, gavel. Throws vflow::SpecError on an
/// unknown name.
std::unique_ptr<Policy> make_policy(const std::string& name, const PolicyOptions& options = {});
/// Every name make_policy accepts, the elastic ones first.
std::vector<std::string> policy_names();

/// Weighted water-filling: integer shares x_i in [lo_i, hi_i] with sum min(capacity, sum hi),
/// x_i proportional to weights[i] where no bound binds. Needs weights > 0 and sum lo <=
/// capacity. Rounding: floors, then one extra worker each by largest remainder, ties to the
/// lower index (callers pass jobs in priority order).
std::vector<int> weighted_water_fill(const std::vector<double>& weights, const std::vector<int>& lo,
                                     const std::vector<int>& hi, int capacity);

/// Indices into `active` sorted by priority (ties by job id).
std::vector<size_t> priority_order(Priority priority, const std::vector<JobView>& active,
                                   const PolicyOptions& options = {});

}  // namespace vflow::scheduler
