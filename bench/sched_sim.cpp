// Simulator speed: a Gavel-shape workload (default 10,000 jobs) on a large cluster (default
// 1,000 devices), timed per policy. The workload's generation and binding are not timed.
// The Helios-scale run of docs/scheduler.md: --jobs 1000000 --rate 250/h --interval 60
// --cluster v100:3334,p100:3333,k80:3333.
#include <fmt/format.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <iostream>

#include "vflow/core/clock.h"
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
  app.add_option("--interval", options.config.sim.decision_interval_s,
                 "decide only every this many seconds (0: at every event)")
      ->check(CLI::NonNegativeNumber);
  bool quiet = false;
  app.add_flag("--quiet", quiet, "no progress lines");
  CLI11_PARSE(app, argc, argv);
  try {
    options.synthetic.jobs_per_hour = sched::parse_rate(rate);
    const auto start = std::chrono::steady_clock::now();
    const auto log = [&](const std::string& line) {
      if (!quiet) std::cerr << line << std::endl;
    };
    const auto result = sched::run_experiment(options, log);
    const double total = vflow::seconds_since(start);
    fmt::print("{} jobs, cluster {}, rate {}, decision interval {} s\n", options.synthetic.num_jobs,
               options.config.cluster, rate, options.config.sim.decision_interval_s);
    fmt::print("{:<12} {:>9} {:>10} {:>12} {:>10} {:>6}\n", "policy", "sim_s", "events",
               "allocations", "mean JCT", "util");
    for (size_t i = 0; i < result.runs.size(); ++i) {
      const auto& run = result.runs[i];
      const auto& s = result.summaries[i];
      fmt::print("{:<12} {:>9.3f} {:>10} {:>12} {:>10.0f} {:>6.3f}\n", run.policy, run.wall_s,
                 run.events, run.allocations, s.jct.mean_s, s.utilization);
    }
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    fmt::print("total host time including workload generation: {:.3f} s; peak RSS {:.0f} MiB\n",
               total, usage.ru_maxrss / 1024.0);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "sched_sim_bench: " << e.what() << '\n';
    return 2;
  }
}
