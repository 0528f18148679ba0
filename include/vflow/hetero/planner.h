// The batch-split planner (docs/design.md §5, "Plan"): how many vnodes each worker of a
// heterogeneous inventory runs so that the predicted step time is smallest.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "vflow/hetero/layout.h"
#include "vflow/hetero/profile.h"

namespace vflow::hetero {

/// Devices of one type.
struct DeviceGroup {
  std::string device_type;       ///< a key of PlanRequest::profiles
  int64_t count = 1;             ///< devices (workers) of this type
  int64_t memory_cap_bytes = 0;  ///< peak memory one vnode may use; 0 = no limit
};

struct PlanRequest {
  int64_t global_batch = 0;   ///< B
  int64_t virtual_nodes = 0;  ///< N; exact mode keeps every vnode at B / N examples
  std::vector<DeviceGroup> inventory;
  std::map<std::string, DeviceProfile> profiles;  ///< by device type
  std::string model;  ///< when set, every profile must have been measured with it
  /// Effective allreduce bandwidth in bytes/s of the links between devices of different
  /// types (the network between their hosts, say); 0 = as fast as within one type.
  double link_bandwidth = 0;
};

/// One step's allreduce among `participants` workers, the model of docs/heterogeneous.md
/// ("The allreduce"): none for one worker; else a ring's, in which every worker sends and
/// receives 2(P-1)/P of the gradient buffer, so the two-worker time `pair_seconds` (of the
/// slowest type taking part) grows by the factor 2(P-1)/P, which is 1 for two. A group of
/// several types (`mixed`) is no faster than moving that share of `gradient_bytes` over
/// a link of `link_bandwidth` bytes/s (0 = no such limit).
double allreduce_seconds(double pair_seconds, int64_t participants, bool mixed,
                         int64_t gradient_bytes, double link_bandwidth);

/// One worker's share of the step.
struct WorkerShare {
  std::string device_type;
  int64_t vnodes = 0;
};

struct Plan {
  std::vector<WorkerShare> workers;   ///< workers with at least one vnode
  double predicted_step_seconds = 0;  ///< last worker's finish + allreduce
  std::string describe() const;       ///< one line per device type
};

/// Predicted step time of an assignment: when the last worker has finished its vnodes and
/// optimizer step, plus the allreduce of the workers taking part (allreduce_seconds). Where
/// the profiles measured a spread, the expected finish of the last of the workers' noisy
/// times, which is later than the slowest mean (docs/heterogeneous.md, "Noisy workers");
/// else the slowest worker's time.
double predict_step_seconds(const PlanRequest& request, const std::vector<WorkerShare>& shares);

/// Exact mode: equal vnode sizes (so docs/design.md §2 holds bitwise), per-worker vnode
/// counts that minimise the predicted step time. The smallest feasible step time is
/// found by binary search over the candidate times (a worker of type t finishes k
/// vnodes at optimizer_t + k·t_t(b)); since fewer workers allreduce faster, the times up
/// to one allreduce above it are tried too, each filled by as few workers as can hold
/// the vnodes. A device type may be left unused. Throws Error for an
/// invalid request (a profile missing or for another model, no type whose memory
/// cap fits a vnode, an empty inventory).
Plan plan_exact(const PlanRequest& request);

/// One worker's share in relaxed mode: `vnodes` vnodes of `vnode_size` examples.
struct RelaxedShare {
  std::string device_type;
  int64_t vnodes = 0;
  int64_t vnode_size = 0;
};

struct RelaxedPlan {
  std::vector<RelaxedShare> workers;  ///< workers with at least one vnode, rank order
  double predicted_step_seconds = 0;
  /// The semantic part's vnode_sizes: each worker's vnodes in rank order.
  std::vector<int64_t> vnode_sizes() const;
  std::string describe() const;  ///< one line per device type
};

/// Predicted step time of a relaxed assignment (as predict_step_seconds, with each
/// worker's own vnode size).
double predict_relaxed_seconds(const PlanRequest& request, const std::vector<RelaxedShare>& shares);

/// The vnode sizes relaxed mode considers for a device type: the sizes its profile
/// measured and the exact mode's B / N (when N divides B), up to B and within the
/// type's memory cap.
std::vector<int64_t> candidate_sizes(const PlanRequest& request, const DeviceGroup& group);

/// Relaxed mode (docs/design.md §5): one vnode size per device type, from candidate_sizes,
/// and per-worker vnode counts, such that all vnodes together hold exactly B examples;
/// minimises the predicted step time (request.virtual_nodes is not used: N follows
/// from the plan). Exhaustive over the subsets of types and their size choices; for
/// each, the smallest feasible step time is found by binary search over the times at
/// which a worker finishes its k-th vnode, feasibility being an exact bounded
/// subset-sum (type t adds K_t · b_t examples, K_t up to its workers' capacity); the
/// times up to one allreduce above it are tried too, each with the K_t that need the
/// fewest workers, as long as that search stays within a fraction of a second per size
/// choice (beyond it, the best plan found so far). A single worker alone is also
/// considered. Results differ from exact mode's (batch norm sees other batches); the
/// gradient is still the global batch's mean (docs/design.md §2).
RelaxedPlan plan_relaxed(const PlanRequest& request);

/// What simpler rules would predict, for comparison.
struct Baselines {
  double even_split = 0;          ///< every device, vnodes spread evenly in inventory order
  double proportional = 0;        ///< counts proportional to each type's single-device throughput
  double fastest_type_alone = 0;  ///< the best single device type, all its devices, even split
  std::string fastest_type;
};
Baselines baselines(const PlanRequest& request);

/// A plan as the job's `resources.layout`, in rank order: each worker's vnodes and, from
/// its type's profile, its device (the k-th worker on a CUDA type gets cuda:k), threads
/// and CPU quota; and a note per worker naming its device type (and, relaxed, its vnode
/// size). engine::layout_lines prints it.
struct PlannedLayout {
  std::vector<LayoutEntry> entries;
  std::vector<std::string> notes;
};
PlannedLayout planned_layout(const PlanRequest& request, const std::vector<WorkerShare>& workers);
PlannedLayout planned_layout(const PlanRequest& request, const RelaxedPlan& plan);

/// The worker list of an inventory, in inventory order (one entry per device).
std::vector<std::string> expand_inventory(const std::vector<DeviceGroup>& inventory);

}  // namespace vflow::hetero
