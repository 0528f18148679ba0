// Small builders shared by the scheduler tests.
#pragma once

#include <utility>
#include <vector>

#include "vflow/scheduler/policy.h"
#include "vflow/scheduler/workload.h"

namespace vflow::scheduler::testing {

/// A bound job on a one-type cluster with ideal linear scaling (1 step/s per worker).
inline Job linear_job(int id, double arrival_s, double work, int demand, int min_workers,
                      int max_workers, double weight = 1) {
  Job job;
  job.id = id;
  job.model = "linear";
  job.arrival_s = arrival_s;
  job.total_work = work;
  job.demand = demand;
  job.min_workers = min_workers;
  job.max_workers = max_workers;
  job.weight = weight;
  job.throughput = make_curves({ThroughputCurve::linear(1.0)});
  job.demand_rate = demand;
  return job;
}

inline std::vector<JobView> views_of(const std::vector<Job>& jobs) {
  std::vector<JobView> views;
  for (const auto& job : jobs) views.push_back({&job, job.total_work, 0, -1, 0});
  return views;
}

/// Workers per job id (0 when absent) of an allocation over `n` jobs.
inline std::vector<int> workers_of(const Allocation& allocation, size_t n) {
  std::vector<int> out(n, 0);
  for (const auto& a : allocation.assignments) out.at(a.job_id) = a.workers;
  return out;
}

/// (device type, workers) of each assignment, in job id order.
inline std::vector<std::pair<int, int>> placements_of(const Allocation& allocation) {
  std::vector<std::pair<int, int>> out;
  for (const auto& a : allocation.assignments) out.emplace_back(a.device_type, a.workers);
  return out;
}

}  // namespace vflow::scheduler::testing
