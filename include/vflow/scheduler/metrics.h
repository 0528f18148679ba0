// Summary metrics of a simulation and their CSV / JSON / table forms.
//   JCT = finish - arrival; queueing delay = first start - arrival;
//   makespan = last finish - first arrival;
//   utilization = device-seconds held by jobs (pauses included) / (devices x makespan);
//   percentiles interpolate linearly between order statistics (median of 2 values = mean).
#pragma once

#include <iosfwd>
#include <map>
#include <string>
#include <vector>

#include "vflow/scheduler/simulator.h"

namespace vflow::scheduler {

struct JctStats {
  int jobs = 0;
  double mean_s = 0;
  double median_s = 0;
  double p99_s = 0;
};

struct Summary {
  std::string policy;
  JctStats jct;                              ///< over the measured jobs
  std::map<double, JctStats> jct_by_weight;  ///< per priority class (weight)
  double makespan_s = 0;                     ///< over all jobs
  double utilization = 0;                    ///< over all jobs, in [0, 1]
  double mean_queueing_s = 0;                ///< over the measured jobs
  long resizes = 0;                          ///< over all jobs
  long migrations = 0;                       ///< over all jobs
  long preemptions = 0;                      ///< over all jobs
  long spanned_jobs = 0;                     ///< jobs that ran on several device types
  double wall_s = 0;                         ///< simulation host time
};

struct MetricsOptions {
  int measure_from = 0;  ///< first job id whose JCT counts (steady-state windows)
  int measure_to = -1;   ///< one past the last; -1: all jobs
};

/// Percentile q in [0, 100] of `values` (need not be sorted); 0 for an empty list.
double percentile(std::vector<double> values, double q);
Summary summarize(const SimResult& result, const MetricsOptions& options = {});

void write_jobs_csv(const SimResult& result, std::ostream& out);
void write_timeline_csv(const SimResult& result, std::ostream& out);
/// A JSON array of summaries.
std::string summaries_json(const std::vector<Summary>& summaries);
/// A fixed-width comparison table; changes are relative to `baseline` when it is present.
std::string comparison_table(const std::vector<Summary>& summaries, const std::string& baseline);

}  // namespace vflow::scheduler
