// vflow-sched: simulate cluster scheduling policies on a synthetic workload or a trace, or run
// real jobs on a pool of worker slots (live mode). Parse, run, map the outcome to an exit code.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <filesystem>
#include <iostream>

#include "command_line.h"
#include "vflow/core/error.h"
#include "vflow/core/process.h"
#include "vflow/scheduler/experiment.h"
#include "vflow/scheduler/live.h"

namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) {
  g_stop.store(true);
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the scheduler at once; its jobs
                                 // still get SIGTERM (their parent-death signal) and stop
}

/// vflow-train next to this executable (the installed layout).
std::string default_train_binary() {
  const std::string self = vflow::this_executable("");
  if (self.empty()) return "vflow-train";
  return (std::filesystem::path(self).parent_path() / "vflow-train").string();
}

int run_live_mode(const std::string& jobs_path, vflow::scheduler::LiveOptions options) {
  namespace sched = vflow::scheduler;
  if (options.train_binary.empty()) options.train_binary = default_train_binary();
  const auto jobs = sched::read_live_jobs(jobs_path);
  options.stop_flag = &g_stop;
  options.log = [](const std::string& line) { std::cout << line << std::endl; };
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  const auto result = sched::run_live(jobs, options);
  std::cout << sched::comparison_table(result.experiment.summaries, "");
  sched::write_experiment(result.experiment, "", options.out_dir);
  if (result.interrupted) return vflow::kExitStopped;
  return result.all_completed() ? vflow::kExitOk : vflow::kExitFailure;
}
}  // namespace

int main(int argc, char** argv) {
  namespace sched = vflow::scheduler;
  CLI::App app{"vflow-sched: elastic cluster scheduler (trace-driven simulator and live mode)"};
  app.require_subcommand(1);
  auto* simulate = app.add_subcommand("simulate", "run policies on a workload and compare them");
  sched::ExperimentOptions options;
  std::string config_path, cluster, rate = "12/h", out_dir, throughput, measure;
  int devices = 0;
  simulate->add_option("--config", config_path, "YAML config (cluster, pauses, throughput file)");
  simulate->add_option("--workload", options.workload, "synthetic (Gavel shape) | paper")
      ->check(CLI::IsMember({"synthetic", "paper"}));
  simulate->add_option("--jobs", options.synthetic.num_jobs, "synthetic jobs")
      ->check(vflow::apps::at_least(1));
  simulate->add_option("--rate", rate, "arrival rate, e.g. 12/h, 0.5/min, 0.01/s");
  simulate->add_option("--seed", options.synthetic.seed, "workload seed");
  simulate->add_option("--trace", options.gavel_trace, "Gavel-style trace (TSV)");
  simulate->add_option("--philly", options.philly_trace, "Philly-derived trace (CSV)");
  simulate->add_option("--philly-model", options.philly_model, "model of every Philly job");
  simulate->add_option("--devices", devices, "homogeneous cluster of N devices")
      ->check(vflow::apps::at_least(1));
  simulate->add_option("--cluster", cluster, "typed cluster, e.g. v100:36,p100:36,k80:36");
  simulate->add_option("--throughput", throughput, "throughput file (TSV)");
  simulate->add_option("--policy", options.policies, "policy name(s), or 'all'")->delimiter(',');
  simulate->add_option("--baseline", options.baseline, "policy the table's changes refer to");
  simulate->add_option("--resize-pause", options.config.sim.resize_pause_s, "seconds");
  simulate->add_option("--restart", options.config.sim.restart_s, "seconds");
  simulate
      ->add_option("--interval", options.config.sim.decision_interval_s,
                   "decide only every this many seconds (0: at every event)")
      ->check(CLI::NonNegativeNumber);
  simulate->add_option("--max-workers-factor", options.config.bind.max_workers_factor,
                       "elastic jobs may grow to ceil(demand * f) workers");
  simulate
      ->add_option("--span-overhead", options.config.bind.span_overhead,
                   "a step on several device types takes (1 + this) times its slowest type's "
                   "share (marginal-span; default 0.3)")
      ->check(CLI::NonNegativeNumber);
  simulate->add_option("--measure", measure, "job-id window FROM:TO for JCT statistics");
  simulate->add_option("--out", out_dir, "write CSV/JSON results into this directory");

  auto* live = app.add_subcommand("live", "run real elastic jobs on a pool of worker slots");
  sched::LiveOptions live_options;
  std::string jobs_path;
  auto* slots = live->add_option("--slots", live_options.slots, "worker slots")
                    ->check(vflow::apps::at_least(1));
  auto* control = live->add_option(
      "--control", live_options.control,
      "run the jobs on the node agents of this cluster store, etcd://HOST:PORT,... (credentials: "
      "VFLOW_ETCD_*); the pool is their cpu slots unless --slots says otherwise");
  live->callback([&] {
    if (!*slots && !*control) throw CLI::RequiredError("--slots (or --control)");
    if (!*slots) live_options.slots = 0;
  });
  live->add_option("--jobs", jobs_path, "jobs file (YAML)")->required();
  live->add_option("--policy", live_options.policy, "policy name");
  live->add_option("--throughput", live_options.throughput,
                   "throughput file with rows of device type slot for the jobs' models (e.g. "
                   "from vflow-plan --throughput); default: the fallback curve");
  live->add_option("--out", live_options.out_dir, "results, job logs and checkpoints")->required();
  live->add_option("--train", live_options.train_binary,
                   "vflow-train executable (default: next to vflow-sched)");
  live->add_option("--restart", live_options.restart_s,
                   "seconds a preemption costs a job until its own is measured (marginal "
                   "weighs it; 0: not at all)")
      ->check(CLI::NonNegativeNumber);
  live->add_option("--resize-pause", live_options.resize_pause_s,
                   "seconds a resize pauses a job (marginal weighs it; 0: not at all)")
      ->check(CLI::NonNegativeNumber);
  live->add_option("--poll", live_options.poll_s, "event-loop period, seconds")
      ->check(vflow::apps::positive_number());
  if (const int code = vflow::apps::parse_command_line(app, argc, argv); code >= 0) return code;
  return vflow::apps::run_reporting_errors([&]() -> int {
    if (live->parsed()) return run_live_mode(jobs_path, live_options);
    // Config first, then flags given on the command line override it.
    auto flags = options.config;
    if (!config_path.empty()) sched::load_config(config_path, options.config);
    if (simulate->count("--resize-pause"))
      options.config.sim.resize_pause_s = flags.sim.resize_pause_s;
    if (simulate->count("--restart")) options.config.sim.restart_s = flags.sim.restart_s;
    if (simulate->count("--interval")) {
      options.config.sim.decision_interval_s = flags.sim.decision_interval_s;
    }
    if (simulate->count("--max-workers-factor")) {
      options.config.bind.max_workers_factor = flags.bind.max_workers_factor;
    }
    if (simulate->count("--span-overhead")) {
      options.config.bind.span_overhead = flags.bind.span_overhead;
    }
    if (devices > 0) options.config.cluster = std::to_string(devices);
    if (!cluster.empty()) options.config.cluster = cluster;
    if (!throughput.empty()) options.config.throughput = throughput;
    options.synthetic.jobs_per_hour = sched::parse_rate(rate);
    if (!measure.empty()) {
      const auto colon = measure.find(':');
      const auto number = [&](const std::string& text) {
        if (text.empty() || text.size() > 9 ||
            text.find_first_not_of("0123456789") != std::string::npos) {
          throw vflow::SpecError("--measure: expected FROM:TO, two job ids, got '" + measure + "'");
        }
        return std::stoi(text);
      };
      if (colon == std::string::npos) number("");
      options.metrics.measure_from = number(measure.substr(0, colon));
      options.metrics.measure_to = number(measure.substr(colon + 1));
    }
    const auto log = [](const std::string& line) { std::cerr << line << '\n'; };
    const auto result = sched::run_experiment(options, log);
    std::cout << sched::comparison_table(result.summaries, options.baseline);
    if (!out_dir.empty()) sched::write_experiment(result, options.baseline, out_dir);
    return vflow::kExitOk;
  });
}
