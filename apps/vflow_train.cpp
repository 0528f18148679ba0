// vflow-train: train a job spec. Parse, validate, build, run, map the outcome to an exit code.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <iostream>

#include "command_line.h"
#include "vflow/comm/nccl.h"
#include "vflow/core/zygote.h"
#include "vflow/engine/job_spec.h"
#include "vflow/engine/run_job.h"
#include "vflow/job/control_store.h"
#include "vflow/job/roles.h"

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

int report(const vflow::engine::TrainResult& result) {
  if (result.evaluation) {
    std::cout << "test accuracy " << 100.0 * result.evaluation->accuracy << "% after "
              << result.evaluation->step << " steps\n";
  }
  std::cout << "fingerprint " << result.fingerprint << "\n";
  if (!result.mismatch.empty()) {
    spdlog::error("[train] stopped before step {}: {}", result.steps, result.mismatch);
    return vflow::kExitMismatch;
  }
  if (!result.completed) {
    spdlog::warn("[train] stopped at step {}", result.steps);
    return vflow::kExitStopped;
  }
  return vflow::kExitOk;
}
}  // namespace

/// The program from its arguments on: main's, and each worker's that the zygote starts.
int train_main(int argc, char** argv) {
  // A stop that comes while the job is still being set up (a scheduler preempting a job
  // it just started) is honoured at the first step boundary, not fatal: the handlers are
  // in place from the start, and an elastic worker's SIGTERM becomes a leave below.
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  CLI::App app{
      "vflow-train: train a model with virtual nodes; the result depends on the job spec only"};
  std::string spec_path;
  std::vector<std::string> overrides;
  std::string resume;
  bool print_spec = false;
  bool print_shards = false;
  bool check_only = false;
  bool spec_keys = false;
  int workers = 0;
  int port = 0;
  std::string coordinate;
  std::string control;
  std::string job_name;
  // Named "spec", not "job": CLI11 2.x keeps positionals and long options in one namespace,
  // and --job is the job's name on a cluster store.
  app.add_option("spec", spec_path, "job spec (YAML); the built-in default job when omitted");
  app.add_option("--set", overrides, "override a key, e.g. --set semantic.seed=7 (repeatable)");
  app.add_option("--resume", resume,
                 "resume from a checkpoint file, or 'latest' in output.checkpoint.dir");
  app.add_flag("--print-spec", print_spec, "print the effective semantic part and exit");
  app.add_flag("--print-shards", print_shards,
               "print the optimizer state's canonical shards and what each of the job's workers "
               "(--workers) would own and keep of it, and exit (builds the model)");
  app.add_flag("--check", check_only, "validate the job spec and exit");
  app.add_flag("--spec-keys", spec_keys,
               "print every job-spec key with its default and meaning (markdown) and exit");
  app.add_option("--coordinator", coordinate,
                 "only host the job's store on HOST:PORT for --workers workers started elsewhere "
                 "(VFLOW_RANK, VFLOW_WORLD_SIZE, VFLOW_STORE=HOST:PORT), until all have finished");
  app.add_option("--workers", workers, "worker processes on this machine (sets resources.workers)")
      ->check(vflow::apps::at_least(1));
  app.add_option("--port", port,
                 "with --workers: the coordinator's port on 127.0.0.1, the address vflow-ctl "
                 "talks to (default: any free port, printed at start)")
      ->check(vflow::apps::tcp_port());
  auto* control_option = app.add_option(
      "--control", control,
      "a cluster's control store, etcd://HOST:PORT,... (etcds:// for TLS): the job's "
      "generations, requests and rendezvous go through it instead of a store this process "
      "hosts (credentials: VFLOW_ETCD_*, docs/distributed.md)");
  auto* job_option = app.add_option(
      "--job", job_name,
      "with --control: the job's name there (vflow-ctl --control URL ... NAME); with --workers "
      "this process submits the job, without it joins the running job as one more worker");
  bool local = false;
  auto* local_option = app.add_flag(
      "--local", local,
      "with --control and --workers: start the workers on this machine instead of on the slots "
      "of node agents (vflow-agent)");
  std::string replay;
  int64_t replay_step = -1;
  int64_t replay_vnode = -1;
  auto* replay_option = app.add_option(
      "--replay", replay,
      "recompute one vnode of one step of this deterministic job from a checkpoint of that "
      "step or an earlier one, on this process alone, and print the hash of its contribution "
      "(what cross-checks compare), its loss and where a NaN or infinity first appears "
      "(docs/verification.md); needs --step and --vnode");
  auto* step_option = app.add_option("--step", replay_step, "with --replay: the step")
                          ->check(vflow::apps::at_least(0));
  auto* vnode_option = app.add_option("--vnode", replay_vnode, "with --replay: the vnode")
                           ->check(vflow::apps::at_least(0));
  step_option->needs(replay_option);
  vnode_option->needs(replay_option);
  replay_option->needs(step_option);
  replay_option->needs(vnode_option);
  replay_option->excludes("--workers");
  replay_option->excludes("--resume");
  replay_option->excludes("--coordinator");
  local_option->needs(control_option);
  control_option->needs(job_option);
  job_option->needs(control_option);
  control_option->excludes("--coordinator");
  if (const int code = vflow::apps::parse_command_line(app, argc, argv); code >= 0) return code;

  if (spec_keys) {
    std::cout << vflow::engine::job_spec_key_tables();
    return vflow::kExitOk;
  }
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
    if (print_shards) {
      std::cout << vflow::engine::describe_shards(spec, spec.resources.workers);
      return vflow::kExitOk;
    }
    if (check_only) {
      std::cout << spec.source << ": valid\n";
      return vflow::kExitOk;
    }
    if (!replay.empty()) {
      const auto c = vflow::engine::replay_vnode(spec, replay, replay_step, replay_vnode);
      std::cout << fmt::format("step {} vnode {} ({} examples) replayed from {}\n", c.step, c.vnode,
                               c.examples, replay)
                << fmt::format("contribution {:016x}\n", c.hash)
                << fmt::format("loss {:.9g}\n", c.loss) << "non-finite "
                << (c.non_finite.empty() ? "none" : c.non_finite) << "\n";
      return vflow::kExitOk;
    }
    vflow::job::RoleOptions roles;
    roles.command = vflow::job::command_line_of_this_program(argc, argv);
    roles.launch = workers > 0;
    if (local && workers == 0) {
      throw vflow::SpecError("--local starts the workers of a job it submits: it needs --workers");
    }
    if (!control.empty()) {
      vflow::job::etcd_options(control, job_name, std::chrono::milliseconds(1));  // checks both
      roles.control = control;
      roles.job = job_name;
      roles.local = local;
    }
    roles.port = port;
    roles.coordinate = coordinate;
    roles.stop_flag = &g_stop;
    roles.leave_flag = &g_leave;
    const auto role = vflow::job::role_of(spec, roles);
    const bool elastic_worker = role == vflow::job::Role::kElasticWorker;
    // On a cluster store SIGTERM (a batch system reclaiming this process) is a leave for the
    // submitter too: the job goes on with its other coordinator candidates. SIGINT stops it.
    const bool leaves = elastic_worker || (role == vflow::job::Role::kLauncher && !control.empty());
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, leaves ? on_leave_signal : on_signal);
    // A worker outlives a dead launcher long enough to stop cleanly: writing to its
    // closed output pipe must fail, not kill it.
    if (elastic_worker) std::signal(SIGPIPE, SIG_IGN);
    const auto outcome = vflow::job::run_role(role, spec, roles);
    return outcome.result ? report(*outcome.result) : outcome.exit_code;
  });
}

int main(int argc, char** argv) {
  vflow::comm::prepare_nccl_environment();  // before any thread exists
  // Before anything else of the program: the workers this process starts are forks of
  // this point, which skip loading and initialising LibTorch again (vflow/core/zygote.h).
  vflow::start_zygote(train_main);
  return train_main(argc, argv);
}
