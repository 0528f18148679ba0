// What a process is in a job, and running it as that (docs/design.md §1): the entry point a
// program uses to train a job on one or several workers, elastically. vflow-train is
// one such program; a program that embeds vflow with its own models and data sets is
// another (docs/embedding.md).
#pragma once

#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "vflow/engine/job_spec.h"
#include "vflow/engine/trainer.h"

namespace vflow::job {

enum class Role {
  kSingle,         ///< trains alone, with every vnode
  kLauncher,       ///< hosts the coordinator and starts the workers on this host
  kElasticWorker,  ///< a worker started by vflow's launcher (VFLOW_MEMBER, VFLOW_STORE)
  kWorker,         ///< a worker of an external launcher (torchrun, mpirun, srun, VFLOW_RANK)
  kCoordinator,    ///< only hosts the job's store for workers started elsewhere
};

struct RoleOptions {
  /// This program's command line (command_line_of_this_program): the launcher runs it as
  /// each worker, so every worker builds the same job, with the same models and data sets
  /// registered.
  std::vector<std::string> command;
  bool launch = false;     ///< start workers on this host even for one (--workers given)
  int port = 0;            ///< launcher: the coordinator's port on 127.0.0.1; 0 = any free one
  std::string coordinate;  ///< HOST:PORT: only host the job's store there (kCoordinator)
  /// The job's control store is this cluster store ("etcd://H:P,..."), under the name
  /// `job`, instead of the embedded one: with `launch` this process submits the job
  /// (LaunchOptions::control); without, it joins the running job as one more worker.
  std::string control;
  std::string job;
  /// With `control` and `launch`: start the workers on this machine instead of on node
  /// agents' slots.
  bool local = false;
  /// Set (e.g. by a signal handler): stop the job at the next step boundary, with a
  /// checkpoint where one is configured.
  const std::atomic<bool>* stop_flag = nullptr;
  /// Set in an elastic worker (SIGTERM): leave the job at the next step boundary; set in the
  /// submitter of a job on a cluster store: leave the job to its other coordinator
  /// candidates (it goes on).
  const std::atomic<bool>* leave_flag = nullptr;
  /// Called with each trainer this process builds (a worker's, or the single process's),
  /// before it trains: e.g. to add observers of your own.
  std::function<void(engine::Trainer&)> prepare;
};

/// This process's executable (/proc/self/exe) followed by its arguments.
std::vector<std::string> command_line_of_this_program(int argc, char** argv);

/// The role from the options and the environment: --coordinator, then vflow's launcher's
/// worker variables, then an external launcher's, then a launch when asked for, when
/// resources.workers > 1 or when resources.layout is set, else kSingle. Throws Error for
/// inconsistent launcher variables.
Role role_of(const engine::JobSpec& spec, const RoleOptions& options);

/// The job's resources part as this process applies it among the workers a launcher placed
/// on this host: plain "cuda" becomes the local rank's device (job::local_rank() modulo the
/// devices visible), `threads: 0` the threads engine::intra_op_threads gives one of
/// local_workers() workers, and `prefetch: auto` is decided for them. With `own_quota` the
/// process runs under a CPU quota of its own (a layout entry's `cpu_quota`, `vflow-profile
/// --cpu-quota`), applied already: the cores it may use under it are its own, not shared
/// with the host's other workers, so threads 0 are those of one worker.
engine::ResourcesSpec place_on_this_host(const engine::JobSpec& spec, bool own_quota = false);

struct RoleOutcome {
  /// Where this process trained until the job completed or stopped: its result (rank 0's
  /// evaluation, the fingerprint every rank holds).
  std::optional<engine::TrainResult> result;
  /// Otherwise what the process ends with (vflow/core/exit_code.h): the launcher's outcome
  /// of the whole job, the coordinator's, or 0 for an elastic worker that left the job.
  int exit_code = 0;
};

/// Runs `spec` as `role`. Throws vflow::Error subclasses for user errors.
RoleOutcome run_role(Role role, const engine::JobSpec& spec, const RoleOptions& options);

}  // namespace vflow::job
