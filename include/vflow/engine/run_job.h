// Running a whole job from its spec: load the data, build the model, attach
// the observers the output part asks for, resume if asked, train.
#pragma once

#include <atomic>
#include <functional>
#include <string>

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

/// The job's canonical shards and what each of `workers` workers (the vnodes split as
/// resources.layout plans them where it has that many entries, else evenly) would own and
/// keep of the optimizer state, in MB, with and without
/// resources.shard_optimizer as the spec says: what `vflow-train --print-shards` prints.
/// Builds the model (not the data).
std::string describe_shards(const JobSpec& spec, int64_t workers);

/// Recomputes vnode `vnode` of step `step` of a deterministic job on this process alone,
/// from `checkpoint` (of step `step` or an earlier one, trained forward to it): the hash a
/// cross-check compared, the loss and where a non-finite value first appears
/// (docs/verification.md). A spec whose semantic part is not the checkpoint's, a step
/// before the checkpoint's or past the job's, or a vnode out of range is a SpecError or
/// CheckpointError before anything is trained.
VnodeContribution replay_vnode(const JobSpec& spec, const std::string& checkpoint, int64_t step,
                               int64_t vnode);

}  // namespace vflow::engine
