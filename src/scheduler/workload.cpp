#include "vflow/scheduler/workload.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>

#include "vflow/core/error.h"

namespace vflow::scheduler {
namespace {

// Our own conversions on top of mt19937_64 so that a seed gives the same workload with any
// standard library (std::*_distribution is implementation-defined).
class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  double exponential(double rate) { return -std::log1p(-uniform()) / rate; }
  /// Index drawn with probabilities proportional to `weights`.
  size_t pick(const std::vector<double>& weights) {
    const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
    double u = uniform() * total;
    for (size_t i = 0; i + 1 < weights.size(); ++i) {
      if (u < weights[i]) return i;
      u -= weights[i];
    }
    return weights.size() - 1;
  }

 private:
  std::mt19937_64 engine_;
};

std::string where(const JobRecord& r, size_t index) {
  return r.origin.empty() ? fmt::format("job {}", index) : r.origin;
}

Curves curves_for(const JobRecord& r, size_t index, const ThroughputTable& table,
                  const Cluster& cluster, const BindOptions& options) {
  std::vector<ThroughputCurve> curves;
  const bool known = table.has_model(r.model);
  for (const auto& type : cluster.types()) {
    if (!known) {
      curves.push_back(
          ThroughputCurve::amdahl(options.fallback_one_worker, options.fallback_parallel_fraction));
      continue;
    }
    const ThroughputCurve* curve = table.find(r.model, type.name);
    if (curve == nullptr) {
      throw DataError(fmt::format("{}: model '{}' has no throughput for device type '{}'",
                                  where(r, index), r.model, type.name));
    }
    curves.push_back(*curve);
  }
  return make_curves(std::move(curves));
}

// `curves`: by model, filled as models are met.
Job bind_one(const JobRecord& r, size_t index, const ThroughputTable& table, const Cluster& cluster,
             const BindOptions& options, std::map<std::string, Curves>& curves) {
  int largest = 0;
  for (const auto& t : cluster.types()) largest = std::max(largest, t.count);
  Job job;
  job.model = r.model;
  job.arrival_s = r.arrival_s;
  job.demand = r.demand;
  job.weight = r.weight;
  if (r.demand < 1 || r.demand > largest) {
    throw DataError(fmt::format("{}: demand {} does not fit the largest device type ({} devices)",
                                where(r, index), r.demand, largest));
  }
  if (!(r.weight > 0)) throw DataError(fmt::format("{}: weight must be > 0", where(r, index)));
  job.min_workers = r.min_workers > 0 ? r.min_workers : std::min(options.min_workers, r.demand);
  job.max_workers = r.max_workers > 0
                        ? r.max_workers
                        : static_cast<int>(std::ceil(r.demand * options.max_workers_factor));
  job.max_workers = std::min(std::max(job.max_workers, r.demand), largest);
  if (job.min_workers > job.demand) {
    throw DataError(fmt::format("{}: min_workers {} > demand {}", where(r, index), job.min_workers,
                                job.demand));
  }
  job.vnodes = std::max(job.max_workers, options.vnodes_per_worker * job.demand);
  job.span_overhead = options.span_overhead;
  Curves& shared = curves[r.model];
  if (!shared) shared = curves_for(r, index, table, cluster, options);
  job.throughput = shared;
  for (int t = 0; t < cluster.num_types(); ++t) {
    job.demand_rate = std::max(job.demand_rate, job.rate(t, job.demand));
  }
  job.total_work =
      r.total_steps > 0 ? r.total_steps : r.duration_s * job.rate(options.reference_type, r.demand);
  if (!(job.total_work > 0)) {
    throw DataError(fmt::format("{}: needs total_steps or duration > 0", where(r, index)));
  }
  return job;
}

}  // namespace

double Job::mixed_rate(const int* counts, int num_types) const {
  int used = -1, types = 0, held = 0;
  for (int t = 0; t < num_types; ++t) {
    if (counts[t] > 0) used = t, ++types, held += counts[t];
  }
  if (types <= 1) return used < 0 ? 0.0 : rate(used, counts[used]);
  if (held > vnodes) {
    throw InternalError(
        fmt::format("mixed_rate: {} workers for {} vnodes (at most one a vnode)", held, vnodes));
  }
  // Each type starts with one vnode per worker; every further vnode goes where the slowest
  // time grows least (ties to the lower type), which minimises the largest k_t * step_t.
  constexpr int kOnStack = 16;
  double step_on_stack[kOnStack], load_on_stack[kOnStack];
  int held_on_stack[kOnStack];
  std::vector<double> step_on_heap, load_on_heap;  // clusters of more types
  std::vector<int> held_on_heap;
  if (num_types > kOnStack) {
    step_on_heap.resize(num_types), load_on_heap.resize(num_types);
    held_on_heap.resize(num_types);
  }
  const bool heap = num_types > kOnStack;
  double* step = heap ? step_on_heap.data() : step_on_stack;
  double* load = heap ? load_on_heap.data() : load_on_stack;
  int* held_by = heap ? held_on_heap.data() : held_on_stack;
  for (int t = 0; t < num_types; ++t) {
    step[t] = counts[t] > 0 ? 1.0 / rate(t, counts[t]) : 0.0;
    held_by[t] = counts[t];
    load[t] = held_by[t] * step[t];
  }
  for (int v = held; v < vnodes; ++v) {
    int best = -1;
    for (int t = 0; t < num_types; ++t) {
      if (counts[t] > 0 && (best < 0 || load[t] + step[t] < load[best] + step[best])) best = t;
    }
    load[best] = ++held_by[best] * step[best];
  }
  double slowest = 0;
  for (int t = 0; t < num_types; ++t) slowest = std::max(slowest, load[t]);
  return vnodes / (slowest * (1 + span_overhead));
}

Workload bind_workload(const std::vector<JobRecord>& records, const ThroughputTable& table,
                       const Cluster& cluster, const BindOptions& options) {
  if (options.reference_type < 0 || options.reference_type >= cluster.num_types()) {
    throw SpecError("bind: reference_type is not a device type of the cluster");
  }
  std::vector<size_t> order(records.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return records[a].arrival_s < records[b].arrival_s; });
  Workload workload;
  workload.jobs.reserve(records.size());
  std::map<std::string, Curves> curves;
  for (size_t i : order) {
    workload.jobs.push_back(bind_one(records[i], i, table, cluster, options, curves));
    workload.jobs.back().id = static_cast<int>(workload.jobs.size()) - 1;
  }
  return workload;
}

std::vector<JobRecord> to_records(const Workload& workload) {
  std::vector<JobRecord> records;
  for (const auto& job : workload.jobs) {
    JobRecord r;
    r.arrival_s = job.arrival_s;
    r.model = job.model;
    r.total_steps = job.total_work;
    r.demand = job.demand;
    r.min_workers = job.min_workers;
    r.max_workers = job.max_workers;
    r.weight = job.weight;
    records.push_back(std::move(r));
  }
  return records;
}

std::vector<JobRecord> generate_synthetic(const SyntheticOptions& options) {
  if (options.num_jobs < 0) throw SpecError("synthetic workload: num_jobs must be >= 0");
  if (!(options.jobs_per_hour > 0)) throw SpecError("synthetic workload: rate must be > 0");
  const std::vector<std::string> models =
      options.models.empty() ? std::vector<std::string>{"default"} : options.models;
  const bool gavel = options.shape == WorkloadShape::kGavel;
  const std::vector<int> scales = {1, 2, 4, 8};
  const std::vector<double> scale_p =
      gavel ? std::vector<double>{0.7, 0.1, 0.15, 0.05} : std::vector<double>{1, 1, 1, 1};
  Rng rng(options.seed);
  std::vector<JobRecord> records;
  double now = 0;
  for (int i = 0; i < options.num_jobs; ++i) {
    JobRecord r;
    now += rng.exponential(options.jobs_per_hour / 3600.0);
    r.arrival_s = now;
    r.model = models[static_cast<size_t>(rng.uniform() * models.size()) % models.size()];
    if (gavel) {
      const bool short_job = rng.uniform() < 0.8;
      r.duration_s = 60.0 * std::pow(10.0, short_job ? rng.uniform(1.5, 3) : rng.uniform(3, 4));
      r.weight = rng.uniform() < options.high_priority_fraction ? options.high_priority_weight : 1;
    } else {
      r.duration_s = std::pow(10.0, rng.uniform(2.7, 3.5));
      r.weight = std::vector<double>{1, 5, 10}[rng.pick({1, 1, 1})];
    }
    r.demand = scales[rng.pick(scale_p)];
    records.push_back(std::move(r));
  }
  return records;
}

}  // namespace vflow::scheduler
