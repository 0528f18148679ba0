#include "vflow/job/roles.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>

#include "vflow/comm/nccl.h"
#include "vflow/core/address.h"
#include "vflow/core/exit_code.h"
#include "vflow/core/process.h"
#include "vflow/engine/run_job.h"
#include "vflow/engine/runtime.h"
#include "vflow/hetero/cpu_quota.h"
#include "vflow/hetero/profile.h"
#include "vflow/job/control_store.h"
#include "vflow/job/elastic_worker.h"
#include "vflow/job/environment.h"
#include "vflow/job/launcher.h"

namespace vflow::job {

namespace {

std::chrono::milliseconds timeout_of(const engine::JobSpec& spec) {
  return std::chrono::milliseconds(static_cast<int64_t>(spec.resources.timeout_s * 1000));
}

JobLimits limits_of(const engine::JobSpec& spec) {
  JobLimits limits;
  limits.virtual_nodes = spec.semantic.virtual_nodes;
  limits.min_workers = spec.resources.min_workers;
  limits.max_workers =
      spec.resources.max_workers > 0 ? spec.resources.max_workers : spec.semantic.virtual_nodes;
  return limits;
}

// A worker of the first generation of a planned layout gets its entry of
// resources.layout from the launcher in this variable, as YAML (joiners have none: they
// take resources.* as they are).
constexpr const char* kLayoutEntryVar = "VFLOW_LAYOUT_ENTRY";

std::string quota_group(const ElasticWorkerEnvironment& env) {
  // One job's workers on a host are told apart from another's by the store's port, or
  // by the job's name on a cluster store.
  if (!env.control.empty()) return fmt::format("vflow-{}-{}", env.job, env.member);
  return fmt::format("vflow-{}-{}", env.store_port, env.member);
}

/// What a worker's layout entry says of its device type: the name it gives, and the CPU
/// quota that the default name counts.
struct LayoutType {
  std::string name;
  double cpu_quota = 0;
};

/// A worker of a planned layout gets its own device, threads and CPU quota from the
/// launcher; `type` what its entry says of its device type (joiners have no entry: theirs
/// is resources.device_type).
engine::JobSpec apply_worker_layout(engine::JobSpec spec, const ElasticWorkerEnvironment& env,
                                    LayoutType& type) {
  type = {spec.resources.device_type, 0};
  const char* text = std::getenv(kLayoutEntryVar);
  if (!text || !*text) return spec;
  const auto entry = engine::parse_layout_entry(text, kLayoutEntryVar);
  if (!entry.device.empty()) spec.resources.device = entry.device;
  if (entry.threads > 0) spec.resources.threads = entry.threads;
  if (entry.cpu_quota > 0) {
    hetero::apply_cpu_quota(entry.cpu_quota, quota_group(env));
    spdlog::info("[hetero] worker {} limited to {} cores", env.member, entry.cpu_quota);
  }
  type = {entry.device_type, entry.cpu_quota};
  return spec;
}

/// The worker's device type name: the one its layout entry (or resources.device_type)
/// gives, else the name vflow-profile gives its device, threads and quota.
std::string worker_device_type(const engine::JobSpec& spec, const LayoutType& type) {
  if (!type.name.empty()) return type.name;
  const auto device = engine::worker_device(spec.resources);
  // The GPU's name only for a CUDA worker: asking loads the NCCL backend.
  const std::string gpu =
      device.is_cuda() ? comm::cuda_device_name(std::max<int>(0, device.index())) : "";
  return hetero::default_device_type(device.is_cuda(), gpu, spec.resources.threads, type.cpu_quota);
}

/// Seconds per vnode of the job's vnode size by device type, from resources.profiles.
std::map<std::string, double> profiled_seconds(const engine::JobSpec& spec) {
  std::map<std::string, double> out;
  if (spec.resources.profiles.empty()) return out;
  const int64_t size =
      spec.semantic.global_batch / std::max<int64_t>(1, spec.semantic.virtual_nodes);
  const std::string model = spec.model_digest();
  for (const auto& path : spec.resources.profiles) {
    const auto profile = hetero::load_profile(path);
    const auto refuse = [&](const std::string& why) {
      throw SpecError(fmt::format("resources.profiles: {}: {}", path, why));
    };
    if (profile.model != model) {
      refuse(
          fmt::format("measured with model {}, but this job's model is {}; profile this job "
                      "(vflow-profile)",
                      profile.model.empty() ? "(unknown)" : profile.model, model));
    }
    double seconds = 0;
    try {
      seconds = profile.vnode_seconds(size);
    } catch (const Error& e) {
      refuse(e.what());
    }
    if (profile.device_type.find_first_of("\r\n") != std::string::npos) {
      refuse("a device type name is one line");
    }
    if (!out.emplace(profile.device_type, seconds).second) {
      refuse(fmt::format("device type {} has a profile already", profile.device_type));
    }
    spdlog::info("[hetero] {}: {:.4g} s per vnode of {} examples", profile.device_type, seconds,
                 size);
  }
  return out;
}

/// A worker that joins a job on a cluster store by itself (vflow-train --control URL --job
/// NAME without --workers): named after its host and process, never reused.
ElasticWorkerEnvironment volunteer_environment(const RoleOptions& options) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  ElasticWorkerEnvironment env;
  env.member = fmt::format("{}-{}", host, getpid());
  env.control = options.control;
  env.job = options.job;
  return env;
}

RoleOutcome run_elastic_worker_role(const engine::JobSpec& job, const RoleOptions& options) {
  const auto launched = elastic_worker_from_environment();
  const auto env = launched ? *launched : volunteer_environment(options);
  const hetero::CpuQuotaRelease release(quota_group(env));  // the worker's quota group, if any
  LayoutType type;
  engine::JobSpec spec = apply_worker_layout(job, env, type);
  // A quota is this worker's own: threads 0 are the cores it may use under it, undivided,
  // as vflow-profile counts them for the type's name.
  spec.resources = place_on_this_host(spec, /*own_quota=*/type.cpu_quota > 0);
  ElasticWorkerOptions worker;
  worker.store_host = env.store_host;
  worker.store_port = env.store_port;
  worker.control = env.control;
  worker.job = env.job;
  worker.volunteer = !launched;
  worker.member = env.member;
  // Only a job with profiles matches types (a CUDA worker's name loads the NCCL backend).
  if (!spec.resources.profiles.empty()) worker.device_type = worker_device_type(spec, type);
  worker.timeout = timeout_of(spec);
  worker.stop_flag = options.stop_flag;
  worker.leave_flag = options.leave_flag;
  worker.prepare = options.prepare;
  auto outcome = run_elastic_worker(spec, worker);
  RoleOutcome out;
  if (outcome.kind == ElasticOutcome::Kind::kFinished) out.result = std::move(outcome.result);
  return out;
}

RoleOutcome run_launcher_role(const engine::JobSpec& spec, const RoleOptions& options) {
  if (options.command.empty()) {
    throw SpecError(
        "a job of several workers needs the command line each worker runs "
        "(RoleOptions::command, e.g. command_line_of_this_program)");
  }
  engine::check_devices(spec.resources);
  LaunchOptions launch;
  launch.workers = static_cast<int>(spec.resources.workers);
  launch.command = options.command;
  launch.port = options.port;
  launch.control = options.control;
  launch.job = options.job;
  launch.local = options.local;
  launch.spec = spec.yaml();
  launch.device = spec.resources.device;
  launch.semantic = spec.semantic_yaml();
  if (!options.control.empty() && !options.local && !spec.resources.layout.empty()) {
    throw SpecError(
        "resources.layout places workers on this machine's devices: on a cluster store it needs "
        "--local (node agents place workers by the slots they registered)");
  }
  launch.timeout = timeout_of(spec);
  launch.elastic.limits = limits_of(spec);
  launch.elastic.replace_failed = spec.resources.replace_failed;
  launch.elastic.profiled = profiled_seconds(spec);
  for (const auto& w : spec.resources.layout) {
    launch.vnodes.push_back(w.vnodes);
    launch.worker_env.push_back(
        {fmt::format("{}={}", kLayoutEntryVar, engine::layout_entry_yaml(w))});
  }
  launch.stop_flag = options.stop_flag;
  if (!options.control.empty()) launch.detach_flag = options.leave_flag;
  RoleOutcome out;
  out.exit_code = launch_job(launch);
  return out;
}

RoleOutcome run_coordinator_role(const engine::JobSpec& spec, const RoleOptions& options) {
  const auto address = parse_host_port(options.coordinate, "--coordinator");
  check_store_exposure(address.host, spec.resources.unauthenticated_store,
                       "--coordinator " + options.coordinate);
  StoreHost coordinator(address.host, address.port, timeout_of(spec));
  spdlog::info("[coordinator] serving {}:{} for {} workers", coordinator.host(), coordinator.port(),
               spec.resources.workers);
  RoleOutcome out;
  out.exit_code = coordinator.serve(static_cast<int>(spec.resources.workers), options.stop_flag)
                      ? kExitOk
                      : kExitStopped;
  return out;
}

RoleOutcome run_training_role(Role role, const engine::JobSpec& job, const RoleOptions& options) {
  engine::JobSpec spec = job;
  spec.resources = place_on_this_host(spec);
  engine::JobRunOptions run;
  run.stop_flag = options.stop_flag;
  run.prepare = options.prepare;
  if (role == Role::kWorker) {
    auto rendezvous = *rendezvous_from_environment(timeout_of(spec));
    check_store_exposure(rendezvous.store_host, spec.resources.unauthenticated_store,
                         "the job's store (VFLOW_STORE or MASTER_ADDR)");
    if (!rendezvous.store) {
      // An external launcher's rank 0 hosts the store, bound to MASTER_ADDR alone.
      rendezvous.store =
          rendezvous.host_store
              ? host_embedded_store(rendezvous.store_host, rendezvous.store_port, timeout_of(spec))
              : connect_embedded_store(rendezvous.store_host, rendezvous.store_port,
                                       timeout_of(spec));
      rendezvous.host_store = false;
    }
    engine::choose_backend(spec.resources, engine::worker_device(spec.resources), rendezvous);
    run.communicator = comm::make_communicator(rendezvous);
  }
  RoleOutcome out;
  out.result = engine::run_job(spec, run);
  if (run.communicator) run.communicator->leave();
  return out;
}

}  // namespace

engine::ResourcesSpec place_on_this_host(const engine::JobSpec& spec, bool own_quota) {
  auto resources = spec.resources;
  if (resources.device == "cuda" && torch::cuda::is_available()) {
    // Where CUDA is missing the engine reports it, naming the key.
    const auto count = static_cast<int64_t>(torch::cuda::device_count());
    resources.device = fmt::format("cuda:{}", local_rank() % count);
  }
  resources.threads = engine::intra_op_threads(spec, own_quota ? 1 : local_workers());
  if (local_rank() == 0) engine::note_deterministic_threads(spec);
  if (resources.prefetch == engine::Prefetch::kAuto) {
    resources.prefetch = engine::prefetch_enabled(resources, local_workers())
                             ? engine::Prefetch::kOn
                             : engine::Prefetch::kOff;
  }
  return resources;
}

std::vector<std::string> command_line_of_this_program(int argc, char** argv) {
  std::vector<std::string> command{this_executable(argc > 0 ? argv[0] : "")};
  for (int i = 1; i < argc; ++i) command.emplace_back(argv[i]);
  return command;
}

Role role_of(const engine::JobSpec& spec, const RoleOptions& options) {
  if (!options.coordinate.empty()) return Role::kCoordinator;
  if (elastic_worker_from_environment()) return Role::kElasticWorker;
  // On a cluster store a process submits the job (--workers given) or joins it, even
  // when an external launcher's variables (srun's, torchrun's) are set.
  if (!options.control.empty()) return options.launch ? Role::kLauncher : Role::kElasticWorker;
  if (rendezvous_from_environment(timeout_of(spec))) return Role::kWorker;
  // A planned layout, even of one worker, runs through the launcher, which gives each
  // worker its entry's device, threads and CPU quota.
  if (options.launch || spec.resources.workers > 1 || !spec.resources.layout.empty()) {
    return Role::kLauncher;
  }
  return Role::kSingle;
}

RoleOutcome run_role(Role role, const engine::JobSpec& spec, const RoleOptions& options) {
  switch (role) {
    case Role::kCoordinator:
      return run_coordinator_role(spec, options);
    case Role::kElasticWorker:
      return run_elastic_worker_role(spec, options);
    case Role::kLauncher:
      return run_launcher_role(spec, options);
    case Role::kWorker:
    case Role::kSingle:
      return run_training_role(role, spec, options);
  }
  throw InternalError("unknown role");
}

}  // namespace vflow::job
