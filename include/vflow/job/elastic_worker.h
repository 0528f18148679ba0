// A worker of an elastic job (docs/design.md §4): trains through generations, regroups
// at step boundaries, takes the training state from a donor when it joins, redoes a
// step interrupted by a failed peer, and leaves when a generation no longer holds it.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string>

#include "vflow/engine/job_spec.h"
#include "vflow/engine/trainer.h"

namespace vflow::job {

struct ElasticWorkerOptions {
  std::string store_host = "127.0.0.1";  ///< the coordinator's store
  int store_port = 0;
  /// Set ("etcd://H:P,..."): the job's control store is this cluster store, under the job
  /// name `job`, and the communicators meet through it too; store_host and store_port
  /// are then unused.
  std::string control;
  std::string job;
  std::string member;  ///< this worker's name in the job
  /// This worker's device type name (published for the coordinator to match against the
  /// job's profiles until the worker is measured); empty: not published.
  std::string device_type;
  /// Started outside the launcher (with `control` set): it offers itself to the running
  /// job (ControlPlane::volunteer) and keeps a liveness lease the coordinator watches.
  bool volunteer = false;
  std::chrono::milliseconds timeout{30000};  ///< collectives, rendezvous, waiting for generations
  const std::atomic<bool>* stop_flag = nullptr;   ///< set: stop the whole job (checkpoint)
  const std::atomic<bool>* leave_flag = nullptr;  ///< set: leave at the next step boundary
  /// Called with the worker's trainer once it is built, before it joins a generation.
  std::function<void(engine::Trainer&)> prepare;
};

struct ElasticOutcome {
  enum class Kind {
    kFinished,   ///< trained to the end, or stopped with the job
    kLeft,       ///< a generation without this worker was published (scale-in, SIGTERM)
    kNotNeeded,  ///< joined too late: the job finished before a generation took it in
  };
  Kind kind = Kind::kFinished;
  engine::TrainResult result;  ///< meaningful for kFinished
};

/// Runs one worker of an elastic job until it finishes or leaves. `spec.resources` is taken
/// as it is: a launched worker's placement on its host (place_on_this_host) and its layout
/// entry are applied by job::run_role before. Throws PeerFailure
/// when the coordinator is unreachable or never publishes a generation for a survivor.
ElasticOutcome run_elastic_worker(const engine::JobSpec& spec, const ElasticWorkerOptions& options);

/// Copies the donor's complete training state to every rank of `communicator`.
void transfer_state(engine::Trainer& trainer, comm::Communicator& communicator, int donor);

}  // namespace vflow::job
