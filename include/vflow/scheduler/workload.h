// Jobs bound to a cluster and a throughput table, and the synthetic workload generators.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "vflow/scheduler/cluster.h"
#include "vflow/scheduler/throughput.h"
#include "vflow/scheduler/trace.h"

namespace vflow::scheduler {

/// Throughput curves, one per cluster device type. The jobs of one model share theirs: a
/// million-job workload holds a few curves, and a policy reading them stays in cache.
using Curves = std::shared_ptr<const std::vector<ThroughputCurve>>;
inline Curves make_curves(std::vector<ThroughputCurve> curves) {
  return std::make_shared<const std::vector<ThroughputCurve>>(std::move(curves));
}

// What policies read at every decision comes first, in 64 bytes, one cache line (a large
// simulation reads thousands of jobs per decision); the model's name last.
struct alignas(64) Job {
  int id = 0;                ///< 0..n-1 in arrival order (ties keep input order)
  int demand = 1;            ///< workers requested; non-elastic policies run exactly this many
  int min_workers = 1;       ///< elastic lower bound, <= demand
  int max_workers = 1;       ///< elastic upper bound, >= demand, <= the largest device type
  double arrival_s = 0;      ///< seconds since the workload's start
  double total_work = 0;     ///< optimizer steps to run
  double weight = 1;         ///< priority weight, > 0
  double demand_rate = 0;    ///< steps/s at `demand` on the job's fastest type (time estimates)
  Curves throughput;         ///< one curve per cluster device type
  std::string model;         ///< throughput model name
  int vnodes = 1;            ///< virtual nodes, >= max_workers: the unit of a split over types
  double span_overhead = 0;  ///< a step on several device types takes (1 + this) times longer

  /// Steps per second with `workers` workers of device type `type`.
  double rate(int type, int workers) const { return (*throughput)[type].at(workers); }
  /// Steps per second on counts[t] workers of each device type t (`num_types` entries, their
  /// sum in 1..vnodes): the exact-mode split of the vnodes over the types. Type t's workers
  /// hold k_t >= counts[t] vnodes and take k_t / vnodes of their whole-batch step time
  /// 1 / rate(t, counts[t]); the k_t minimise the slowest type's time, and on more than one
  /// type the step takes (1 + span_overhead) times that (the synchronisation across types
  /// that one type's curve does not hold). On one type it is rate(t, counts[t]).
  double mixed_rate(const int* counts, int num_types) const;
};

struct Workload {
  std::vector<Job> jobs;
};

struct BindOptions {
  int min_workers = 1;                       ///< min_workers of records that leave it 0
  double max_workers_factor = 1.0;           ///< records' default max_workers = ceil(demand * f)
  double fallback_parallel_fraction = 0.95;  ///< Amdahl p for models the table does not know
  double fallback_one_worker = 1.0;          ///< steps/s of one worker for unknown models
  int reference_type = 0;                    ///< device type that durations are measured on
  int vnodes_per_worker = 4;                 ///< Job::vnodes = max(max_workers, this * demand)
  double span_overhead = 0.3;  ///< Job::span_overhead of every job (docs/scheduler.md)
};

/// Resolves throughput curves, converts durations to steps and sorts by arrival. A model the
/// table knows must have a curve for every device type of the cluster. Throws
/// vflow::DataError naming the record's origin on a job that cannot run on the cluster.
Workload bind_workload(const std::vector<JobRecord>& records, const ThroughputTable& table,
                       const Cluster& cluster, const BindOptions& options = {});

/// Back to records (total_steps set), e.g. to write a generated workload as a trace.
std::vector<JobRecord> to_records(const Workload& workload);

enum class WorkloadShape {
  kGavel,  ///< Gavel: duration 60*10^U(1.5,3) s (p 0.8) else 60*10^U(3,4) s; scale 1/2/4/8
           ///< with p 0.7/0.1/0.15/0.05; a fraction of jobs gets a high priority weight
  kPaper,  ///< VirtualFlow's medium20 shape: scale 1/2/4/8 uniform, weight 1/5/10 uniform,
           ///< duration 10^U(2.7,3.5) s (500 s to 53 min) at the requested scale
};

struct SyntheticOptions {
  WorkloadShape shape = WorkloadShape::kGavel;  ///< distributions of duration, scale and weight
  int num_jobs = 20;                            ///< jobs to generate
  double jobs_per_hour = 12;                    ///< Poisson arrival rate
  uint64_t seed = 1;                            ///< the only source of randomness
  double high_priority_fraction = 0.2;          ///< kGavel: share of jobs with high_priority_weight
  double high_priority_weight = 5;              ///< kGavel: weight of those jobs (others 1)
  std::vector<std::string> models;              ///< drawn uniformly; empty: {"default"}
};

/// Records with duration_s set (steps follow from binding). Deterministic for a seed.
std::vector<JobRecord> generate_synthetic(const SyntheticOptions& options);

}  // namespace vflow::scheduler
