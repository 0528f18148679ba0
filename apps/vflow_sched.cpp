// vflow-sched: simulate cluster scheduling policies on a synthetic workload or a trace.
// Parse, run, map the outcome to an exit code.
#include <CLI/CLI.hpp>
#include <iostream>

#include "vflow/core/error.h"
#include "vflow/scheduler/experiment.h"

namespace {
enum ExitCode { kOk = 0, kFailure = 1, kBadInput = 2 };
}  // namespace

int main(int argc, char** argv) {
  namespace sched = vflow::scheduler;
  CLI::App app{"vflow-sched: elastic cluster scheduler (trace-driven simulator)"};
  app.require_subcommand(1);
  auto* simulate = app.add_subcommand("simulate", "run policies on a workload and compare them");
  sched::ExperimentOptions options;
  std::string config_path, cluster, rate = "12/h", out_dir, throughput, measure;
  int devices = 0;
  simulate->add_option("--config", config_path, "YAML config (cluster, pauses, throughput file)");
  simulate->add_option("--workload", options.workload, "synthetic (Gavel shape) | paper")
      ->check(CLI::IsMember({"synthetic", "paper"}));
  simulate->add_option("--jobs", options.synthetic.num_jobs, "synthetic jobs")
      ->check(CLI::PositiveNumber);
  simulate->add_option("--rate", rate, "arrival rate, e.g. 12/h, 0.5/min, 0.01/s");
  simulate->add_option("--seed", options.synthetic.seed, "workload seed");
  simulate->add_option("--trace", options.gavel_trace, "Gavel-style trace (TSV)");
  simulate->add_option("--philly", options.philly_trace, "Philly-derived trace (CSV)");
  simulate->add_option("--philly-model", options.philly_model, "model of every Philly job");
  simulate->add_option("--devices", devices, "homogeneous cluster of N devices")
      ->check(CLI::PositiveNumber);
  simulate->add_option("--cluster", cluster, "typed cluster, e.g. v100:36,p100:36,k80:36");
  simulate->add_option("--throughput", throughput, "throughput file (TSV)");
  simulate->add_option("--policy", options.policies, "policy name(s), or 'all'")->delimiter(',');
  simulate->add_option("--baseline", options.baseline, "policy the table's changes refer to");
  simulate->add_option("--resize-pause", options.config.sim.resize_pause_s, "seconds");
  simulate->add_option("--restart", options.config.sim.restart_s, "seconds");
  simulate->add_option("--max-workers-factor", options.config.bind.max_workers_factor,
                       "elastic jobs may grow to ceil(demand * f) workers");
  simulate->add_option("--measure", measure, "job-id window FROM:TO for JCT statistics");
  simulate->add_option("--out", out_dir, "write CSV/JSON results into this directory");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? kOk : kBadInput;
  }
  try {
    // Config first, then flags given on the command line override it.
    auto flags = options.config;
    if (!config_path.empty()) sched::load_config(config_path, options.config);
    if (simulate->count("--resize-pause"))
      options.config.sim.resize_pause_s = flags.sim.resize_pause_s;
    if (simulate->count("--restart")) options.config.sim.restart_s = flags.sim.restart_s;
    if (simulate->count("--max-workers-factor")) {
      options.config.bind.max_workers_factor = flags.bind.max_workers_factor;
    }
    if (devices > 0) options.config.cluster = std::to_string(devices);
    if (!cluster.empty()) options.config.cluster = cluster;
    if (!throughput.empty()) options.config.throughput = throughput;
    options.synthetic.jobs_per_hour = sched::parse_rate(rate);
    if (!measure.empty()) {
      const auto colon = measure.find(':');
      if (colon == std::string::npos) throw vflow::SpecError("--measure: expected FROM:TO");
      options.metrics.measure_from = std::stoi(measure.substr(0, colon));
      options.metrics.measure_to = std::stoi(measure.substr(colon + 1));
    }
    const auto log = [](const std::string& line) { std::cerr << line << '\n'; };
    const auto result = sched::run_experiment(options, log);
    std::cout << sched::comparison_table(result.summaries, options.baseline);
    if (!out_dir.empty()) sched::write_experiment(result, options.baseline, out_dir);
    return kOk;
  } catch (const vflow::SpecError& e) {
    std::cerr << "vflow-sched: " << e.what() << '\n';
    return kBadInput;
  } catch (const vflow::DataError& e) {
    std::cerr << "vflow-sched: " << e.what() << '\n';
    return kBadInput;
  } catch (const std::invalid_argument& e) {
    std::cerr << "vflow-sched: bad number in --measure\n";
    return kBadInput;
  } catch (const std::exception& e) {
    std::cerr << "vflow-sched: " << e.what() << '\n';
    return kFailure;
  }
}
