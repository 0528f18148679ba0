// Running a whole job from its spec: load the data, build the model, attach
// the observers the output part asks for, resume if asked, train.
#pragma once

#include <atomic>
#include <functional>

#include "vflow/engine/job_spec.h"
#include "vflow/engine/trainer.h"

namespace vflow::engine {

struct JobRunOptions {
  /// When set (e.g. by a signal handler), training stops at the next step boundary
  /// and, with a checkpoint directory, writes a checkpoint.
  const std::atomic<bool>* stop_flag = nullptr;
  /// This worker's communicator; null trains alone with every vnode.
  std::shared_ptr<comm::Communicator> communicator;
  /// Called with the trainer once it is built, before it trains (e.g. to add observers).
  std::function<void(Trainer&)> prepare;
};

/// Runs a validated job spec. Throws vflow::Error subclasses for user errors.
TrainResult run_job(const JobSpec& spec, const JobRunOptions& options = {});

/// Builds the trainer of a job spec (data loaded, model built, observers attached,
/// checkpoint restored) without running it.
/// Evaluation, progress, metrics and checkpoints are attached on rank 0 only (every
/// rank holds the same state); with `elastic`, on every worker, acting while it is rank 0.
std::unique_ptr<Trainer> make_trainer(const JobSpec& spec,
                                      std::shared_ptr<comm::Communicator> communicator = nullptr,
                                      bool elastic = false);

}  // namespace vflow::engine
