// One simulation experiment as the vflow-sched app runs it: build a workload (synthetic or
// from a trace), bind it to the cluster, run one or more policies on it, summarize, write.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "vflow/scheduler/config.h"
#include "vflow/scheduler/metrics.h"

namespace vflow::scheduler {

struct ExperimentOptions {
  SchedulerConfig config;                ///< cluster, throughput file, pauses, policy knobs
  std::string workload = "synthetic";    ///< synthetic (Gavel shape) | paper (medium20 shape)
  std::string gavel_trace;               ///< Gavel-style TSV; overrides `workload`
  std::string philly_trace;              ///< Philly-derived CSV; overrides `workload`
  std::string philly_model = "default";  ///< model of every Philly job
  SyntheticOptions synthetic;            ///< jobs, rate, seed (shape set from `workload`)
  std::vector<std::string> policies = {"wfs-elastic"};  ///< names, or {"all"}
  MetricsOptions metrics;                               ///< JCT window
  std::string baseline = "priority";  ///< relative changes in the table against this
};

struct ExperimentResult {
  Workload workload;
  std::vector<SimResult> runs;     ///< one per policy, in the order run
  std::vector<Summary> summaries;  ///< same order
};

/// "12/h", "0.5/min", "0.01/s" or a bare number (per hour) -> jobs per hour.
double parse_rate(const std::string& text);

/// Throws vflow::SpecError / vflow::DataError on bad options or input files.
/// `log` (optional) receives one-line progress messages.
ExperimentResult run_experiment(const ExperimentOptions& options,
                                const std::function<void(const std::string&)>& log = {});

/// Writes summary.json, comparison.txt, workload.tsv and per policy jobs_<policy>.csv and
/// timeline_<policy>.csv into `dir` (created if missing).
void write_experiment(const ExperimentResult& result, const std::string& baseline,
                      const std::string& dir);

}  // namespace vflow::scheduler
