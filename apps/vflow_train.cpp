// vflow-train: train a job spec. Parse, validate, build, run, map the outcome to an exit code.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <iostream>

#include "exit_code.h"
#include "vflow/comm/nccl.h"
#include "vflow/core/address.h"
#include "vflow/hetero/cpu_quota.h"
#include "vflow/vflow.h"

namespace {
std::atomic<bool> g_stop{false};
std::atomic<bool> g_leave{false};
void on_signal(int) {
  g_stop.store(true);
  std::signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends the process at once
}
// A worker of an elastic job takes SIGTERM (what clusters send before they reclaim a
// machine) as a request to leave at the next step boundary, not to stop the job.
void on_leave_signal(int) { g_leave.store(true); }

std::string self_executable(const char* argv0) {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) return argv0;
  path[n] = '\0';
  return path;
}

int report(const vflow::engine::TrainResult& result) {
  if (result.evaluation) {
    std::cout << "test accuracy " << 100.0 * result.evaluation->accuracy << "% after "
              << result.evaluation->step << " steps\n";
  }
  std::cout << "fingerprint " << result.fingerprint << "\n";
  if (!result.completed) {
    spdlog::warn("[train] stopped at step {}", result.steps);
    return vflow::kExitStopped;
  }
  return vflow::kExitOk;
}

vflow::comm::JobLimits limits_of(const vflow::engine::JobSpec& spec) {
  vflow::comm::JobLimits limits;
  limits.virtual_nodes = spec.semantic.virtual_nodes;
  limits.min_workers = spec.resources.min_workers;
  limits.max_workers =
      spec.resources.max_workers > 0 ? spec.resources.max_workers : spec.semantic.virtual_nodes;
  return limits;
}

/// A worker of a planned layout gets its own device, threads and CPU quota from the
/// launcher.
vflow::engine::JobSpec apply_worker_layout(vflow::engine::JobSpec spec,
                                           const vflow::comm::ElasticWorkerEnvironment& env) {
  if (const char* device = std::getenv("VFLOW_DEVICE"); device && *device) {
    spec.resources.device = device;
  }
  if (const char* threads = std::getenv("VFLOW_THREADS"); threads && std::atoll(threads) > 0) {
    spec.resources.threads = std::atoll(threads);
  }
  if (const char* quota = std::getenv("VFLOW_CPU_QUOTA"); quota && std::atof(quota) > 0) {
    vflow::hetero::apply_cpu_quota(std::atof(quota),
                                   fmt::format("vflow-{}-{}", env.store_port, env.member));
    spdlog::info("[hetero] worker {} limited to {} cores", env.member, std::atof(quota));
  }
  return spec;
}

int run_as_elastic_worker(const vflow::engine::JobSpec& job,
                          const vflow::comm::ElasticWorkerEnvironment& env,
                          std::chrono::milliseconds timeout) {
  const auto spec = apply_worker_layout(job, env);
  struct Release {  // the worker's CPU-quota group, if any, goes with it
    std::string name;
    ~Release() { vflow::hetero::release_cpu_quota(name); }
  } release{fmt::format("vflow-{}-{}", env.store_port, env.member)};
  vflow::engine::ElasticWorkerOptions options;
  options.store_host = env.store_host;
  options.store_port = env.store_port;
  options.member = env.member;
  options.timeout = timeout;
  options.stop_flag = &g_stop;
  options.leave_flag = &g_leave;
  const auto outcome = vflow::engine::run_elastic_worker(spec, options);
  if (outcome.kind != vflow::engine::ElasticOutcome::Kind::kFinished) return vflow::kExitOk;
  return report(outcome.result);
}
}  // namespace

int main(int argc, char** argv) {
  vflow::comm::prepare_nccl_environment();  // before any thread exists
  CLI::App app{
      "vflow-train: train a model with virtual nodes; the result depends on the job spec only"};
  std::string spec_path;
  std::vector<std::string> overrides;
  std::string resume;
  bool print_spec = false;
  bool check_only = false;
  int workers = 0;
  int port = 0;
  std::string coordinate;
  app.add_option("job", spec_path, "job spec (YAML); the built-in default job when omitted");
  app.add_option("--set", overrides, "override a key, e.g. --set semantic.seed=7 (repeatable)");
  app.add_option("--resume", resume,
                 "resume from a checkpoint file, or 'latest' in output.checkpoint.dir");
  app.add_flag("--print-spec", print_spec, "print the effective semantic part and exit");
  app.add_flag("--check", check_only, "validate the job spec and exit");
  app.add_option("--coordinator", coordinate,
                 "only host the job's store on HOST:PORT for --workers workers started elsewhere "
                 "(VFLOW_RANK, VFLOW_WORLD_SIZE, VFLOW_STORE=HOST:PORT), until all have finished");
  app.add_option("--workers", workers, "worker processes on this machine (sets resources.workers)")
      ->check(vflow::apps::at_least(1));
  app.add_option("--port", port,
                 "with --workers: the coordinator's port on 127.0.0.1, the address vflow-ctl "
                 "talks to (default: any free port, printed at start)")
      ->check(vflow::apps::tcp_port());
  if (const int code = vflow::apps::parse_command_line(app, argc, argv); code >= 0) return code;

  return vflow::apps::run_reporting_errors([&]() -> int {
    // A path as it is ("run #2/x.pt" is no YAML comment), not parsed as YAML.
    if (!resume.empty()) {
      overrides.push_back("output.checkpoint.resume=" + vflow::yaml_quoted(resume));
    }
    if (workers > 0) overrides.push_back("resources.workers=" + std::to_string(workers));
    const auto spec = vflow::engine::load_job_spec(spec_path, overrides);
    spdlog::set_level(spdlog::level::from_str(spec.output.logging.level));
    spdlog::set_pattern("[%H:%M:%S] %v");
    if (print_spec) {
      std::cout << spec.semantic_yaml();
      return vflow::kExitOk;
    }
    if (check_only) {
      std::cout << spec.source << ": valid\n";
      return vflow::kExitOk;
    }
    const auto elastic_worker = vflow::comm::elastic_worker_from_environment();
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, elastic_worker ? on_leave_signal : on_signal);
    // A worker outlives a dead launcher long enough to stop cleanly: writing to its
    // closed output pipe must fail, not kill it.
    if (elastic_worker) std::signal(SIGPIPE, SIG_IGN);
    const auto timeout =
        std::chrono::milliseconds(static_cast<int64_t>(spec.resources.timeout_s * 1000));
    if (!coordinate.empty()) {
      const auto address = vflow::parse_host_port(coordinate, "--coordinator");
      vflow::comm::Coordinator coordinator(address.host, address.port, timeout);
      spdlog::info("[coordinator] serving {}:{} for {} workers", coordinator.host(),
                   coordinator.port(), spec.resources.workers);
      return coordinator.serve(static_cast<int>(spec.resources.workers), &g_stop)
                 ? vflow::kExitOk
                 : vflow::kExitStopped;
    }
    if (elastic_worker) return run_as_elastic_worker(spec, *elastic_worker, timeout);
    auto rendezvous = vflow::comm::rendezvous_from_environment(timeout);
    // A planned layout, even of one worker, runs through the launcher, which gives each
    // worker its entry's device, threads and CPU quota.
    if (!rendezvous &&
        (workers > 0 || spec.resources.workers > 1 || !spec.resources.layout.empty())) {
      // This process becomes the coordinator and runs this same command line as each worker.
      vflow::comm::LaunchOptions launch;
      launch.workers = static_cast<int>(spec.resources.workers);
      launch.command.push_back(self_executable(argv[0]));
      for (int i = 1; i < argc; ++i) launch.command.emplace_back(argv[i]);
      launch.port = port;
      launch.timeout = timeout;
      launch.elastic.limits = limits_of(spec);
      launch.elastic.replace_failed = spec.resources.replace_failed;
      vflow::engine::check_devices(spec.resources);
      for (const auto& w : spec.resources.layout) {
        launch.vnodes.push_back(w.vnodes);
        launch.worker_env.push_back({fmt::format("VFLOW_DEVICE={}", w.device),
                                     fmt::format("VFLOW_THREADS={}", w.threads),
                                     fmt::format("VFLOW_CPU_QUOTA={}", w.cpu_quota)});
      }
      launch.stop_flag = &g_stop;
      return vflow::comm::launch_local(launch);
    }
    vflow::engine::JobRunOptions options;
    options.stop_flag = &g_stop;
    if (rendezvous) {
      vflow::engine::choose_backend(spec.resources, vflow::engine::worker_device(spec.resources),
                                    *rendezvous);
      options.communicator = vflow::comm::make_communicator(*rendezvous);
    }
    const auto result = vflow::engine::run_job(spec, options);
    if (options.communicator) options.communicator->leave();
    return report(result);
  });
}
