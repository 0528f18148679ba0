// The simulator's YAML configuration file (every key optional; docs/scheduler.md, "Config"):
//   cluster: "v100:36,p100:36,k80:36"   # or a map {v100: 36, ...} or a device count
//   throughput: data/scheduler/throughput.tsv  # relative paths are relative to the file
//   resize_pause_s: 0.1
//   restart_s: 30
//   startup_s: 0
//   min_workers: 1
//   max_workers_factor: 1
//   vnodes_per_worker: 4       # a job's vnodes: max(max_workers, this * demand)
//   span_overhead: 0.3         # marginal-span: a step on several types takes 1.3x longer
//   fallback_parallel_fraction: 0.95
//   las_round_s: 300
//   las_thresholds: [3600, 36000]
//   gavel_round_s: 360
#pragma once

#include <string>

#include "vflow/scheduler/cluster.h"
#include "vflow/scheduler/policy.h"
#include "vflow/scheduler/simulator.h"
#include "vflow/scheduler/workload.h"

namespace vflow::scheduler {

struct SchedulerConfig {
  std::string cluster = "8";  ///< Cluster::parse form
  std::string throughput;     ///< throughput file; empty: every job uses the fallback curve
  SimOptions sim;             ///< pauses and restart costs
  PolicyOptions policy;       ///< round lengths, LAS buckets
  BindOptions bind;           ///< elastic bounds and fallback throughput
};

/// Applies the keys of the YAML file at `path` onto `config`. Throws vflow::SpecError
/// "path:line:column: key: ..." on an unknown key or a bad value.
void load_config(const std::string& path, SchedulerConfig& config);

}  // namespace vflow::scheduler
