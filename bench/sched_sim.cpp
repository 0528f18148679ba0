// Simulator speed: a Gavel-shape workload (default 10,000 jobs) on a large cluster (default
// 1,000 devices), timed per policy. The workload's generation and binding are not timed.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <iostream>

#include "vflow/scheduler/experiment.h"

int main(int argc, char** argv) {
  namespace sched = vflow::scheduler;
  CLI::App app{"sched_sim_bench: time the scheduler simulator"};
  sched::ExperimentOptions options;
  options.synthetic.num_jobs = 10000;
  options.config.cluster = "1000";
  options.policies = {"wfs-elastic"};
  std::string rate = "25/h";
  app.add_option("--jobs", options.synthetic.num_jobs, "jobs")->check(CLI::PositiveNumber);
  app.add_option("--rate", rate, "arrival rate; 25/h loads 1,000 devices to about 0.8");
  app.add_option("--cluster", options.config.cluster, "cluster, e.g. 1000 or v100:400,k80:600");
  app.add_option("--throughput", options.config.throughput, "throughput file (TSV)");
  app.add_option("--policy", options.policies, "policies, or 'all'")->delimiter(',');
  app.add_option("--seed", options.synthetic.seed, "workload seed");
  CLI11_PARSE(app, argc, argv);
  try {
    options.synthetic.jobs_per_hour = sched::parse_rate(rate);
    const auto start = std::chrono::steady_clock::now();
    const auto result = sched::run_experiment(options);
    const double total =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    fmt::print("{} jobs, cluster {}, rate {}\n", options.synthetic.num_jobs, options.config.cluster,
               rate);
    fmt::print("{:<12} {:>9} {:>10} {:>12} {:>10} {:>6}\n", "policy", "sim_s", "events",
               "allocations", "mean JCT", "util");
    for (size_t i = 0; i < result.runs.size(); ++i) {
      const auto& run = result.runs[i];
      const auto& s = result.summaries[i];
      fmt::print("{:<12} {:>9.3f} {:>10} {:>12} {:>10.0f} {:>6.3f}\n", run.policy, run.wall_s,
                 run.events, run.allocations, s.jct.mean_s, s.utilization);
    }
    fmt::print("total host time including workload generation: {:.3f} s\n", total);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "sched_sim_bench: " << e.what() << '\n';
    return 2;
  }
}
