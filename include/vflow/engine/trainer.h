// The virtual-node trainer (docs/design.md, "The step"): one worker's vnodes of each step.
//
// One step: for each vnode in ascending order, take its slice of the global
// batch (prefetched in the background), seed dropout from (seed, step, vnode),
// forward, backward with the loss weighted n_v / B into the persistent flat
// gradient buffer, and record the vnode's stateful-kernel contribution; then
// apply the stateful kernels canonically and take one optimizer step.
// Checkpointing, evaluation, metrics and progress hang off TrainingObserver.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "vflow/comm/communicator.h"
#include "vflow/data/dataset.h"
#include "vflow/engine/job_spec.h"
#include "vflow/models/registry.h"

namespace vflow::engine {

/// What one finished step did.
struct StepInfo {
  int64_t step = 0;   ///< 0-based index of the finished step
  int64_t epoch = 0;  ///< 0-based epoch of the step
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  int64_t examples = 0;        ///< examples in this step's global batch
  double loss = 0;             ///< mean training loss over those examples
  double lr = 0;               ///< learning rate used
  double seconds = 0;          ///< wall time of the step
  double compute_seconds = 0;  ///< forward, backward and accumulation of the held vnodes
  double sync_seconds = 0;     ///< the step's collective (waiting for peers included)
  double update_seconds = 0;   ///< stateful kernels and the optimizer step
  int workers = 1;             ///< workers of the generation that ran the step
  /// Corrupt examples this worker has replaced so far (semantic.data.on_corrupt: skip).
  int64_t replaced_examples = 0;
  /// The L2 norm of the step's reduced gradient before clipping (semantic.clip only).
  std::optional<double> grad_norm;
  /// The optimizer state this worker holds, in bytes (the fused optimizers: sgd, adamw;
  /// with resources.shard_optimizer, its kept shards'); -1 where not known.
  int64_t optimizer_state_bytes = -1;
  /// Bytes this worker read of its peers' data in the step's sums and gathers, where its
  /// communicator counts them (shared memory); -1 where not.
  int64_t received_bytes = -1;
  /// The example indices of the step's vnodes, as (vnode, indices), each vnode listed as
  /// many times as workers ran it according to the step's collective (so exactly once
  /// when all is well); filled only when Trainer::record_examples(true).
  std::vector<std::pair<int64_t, std::vector<int64_t>>> examples_used;
};

/// What a worker adds to a step's control word (docs/design.md §3.3): requests that every
/// worker learns through the step's single collective, so all act after the same step.
struct StepControl {
  bool stop = false;            ///< stop training after this step
  int64_t next_generation = 0;  ///< regroup into this generation after this step (0: none)
};

struct EvalResult {
  int64_t step = 0;     ///< number of steps trained when evaluated
  double loss = 0;      ///< mean cross-entropy over the test split
  double accuracy = 0;  ///< fraction of correct top-1 predictions
  int64_t examples = 0;
};

struct TrainResult {
  int64_t steps = 0;                     ///< steps trained in total (including resumed ones)
  bool completed = false;                ///< false when stopped early by request_stop()
  std::string fingerprint;               ///< of the final model state
  std::optional<EvalResult> evaluation;  ///< the last evaluation, if any
  double seconds = 0;                    ///< wall time of this run() call
  double examples_per_second = 0;
  double final_loss = 0;  ///< training loss of the last step
  /// Non-zero when run() returned early because the workers agreed to regroup into
  /// this generation; call run() again once the new communicator is installed.
  int64_t next_generation = 0;
  /// Non-empty when the job stopped because a cross-check found two workers disagreeing
  /// (resources.on_mismatch: stop): what they computed; `steps` is the step undone.
  std::string mismatch;
};

/// One vnode's contribution to a step, computed again (Trainer::contribution; a replay,
/// docs/verification.md).
struct VnodeContribution {
  int64_t step = 0;
  int64_t vnode = 0;
  int64_t examples = 0;
  /// The hash a cross-check compares: the contribution as the exact sum's integers.
  uint64_t hash = 0;
  double loss = 0;  ///< the vnode's mean loss
  /// Where a NaN or infinity first appears: "parameter NAME" (the state the step starts
  /// from), "loss" or "gradient of NAME", in this order and the model's parameter order;
  /// empty if nowhere.
  std::string non_finite;
};

class Trainer;

/// Hooks into the training loop. Every method has an empty default.
class TrainingObserver {
 public:
  virtual ~TrainingObserver() = default;
  virtual void on_train_begin(Trainer& trainer) {}
  virtual void on_step_end(Trainer& trainer, const StepInfo& info) {}
  virtual void on_epoch_end(Trainer& trainer, int64_t epoch) {}
  virtual void on_evaluation(Trainer& trainer, const EvalResult& result) {}
  virtual void on_train_end(Trainer& trainer) {}
  /// A new generation goes on from this worker's state (elastic jobs: it was sent to the
  /// members behind, or all were at this step already); other workers, rank 0 among
  /// them, may not have completed that step.
  virtual void on_state_donated(Trainer& trainer) {}
};

class Trainer {
 public:
  /// `data.train` must be set; `data.test` may be null. The model must already be on
  /// the spec's device or on the CPU (it is moved). With a communicator, this worker
  /// processes its block of vnodes (vnode::vnodes_of) and the step's buffer is summed
  /// across workers; without one, it holds every vnode. Every worker must start from
  /// the same model state (seed_initialisation before building it). Throws SpecError
  /// for an invalid spec.
  Trainer(JobSpec spec, std::shared_ptr<models::Model> model, data::DataSplits data,
          std::shared_ptr<comm::Communicator> communicator = nullptr);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  void add_observer(std::shared_ptr<TrainingObserver> observer);

  /// Trains from the current step to the end (or until request_stop(), or until the
  /// workers agree to regroup: see TrainResult::next_generation). Observers see
  /// on_train_begin once and on_train_end only when training ends. When a collective
  /// fails, throws comm::PeerFailure with the interrupted step undone (parameters,
  /// optimizer and stateful kernels as before the step), so it can be redone.
  TrainResult run();
  /// Runs exactly one step (the current one) and returns what it did; no observers. A step
  /// a cross-check undid (resources.on_mismatch: stop) returns an empty StepInfo, leaves
  /// step() as it was and stops the job (TrainResult::mismatch).
  StepInfo train_step();

  /// Vnode `vnode` of the current step computed alone, as a cross-check computes it,
  /// with nothing applied: parameters, optimizer, stateful kernels and step stay as they
  /// are. Throws SpecError for a vnode out of range or empty in this step.
  VnodeContribution contribution(int64_t vnode);

  /// Evaluates on the test split; throws if the job has none.
  EvalResult evaluate();
  /// Whether this worker's parameters are whole: false after a failed gather of a sharded
  /// job's parameters until the next group sent them again (an evaluation waits).
  bool parameters_complete() const;
  /// Tells every observer about an evaluation and remembers it as the latest.
  void publish_evaluation(const EvalResult& result);
  const std::optional<EvalResult>& last_evaluation() const;

  /// Writes the complete training state atomically (temp file, fsync, rename).
  void save_checkpoint(const std::string& path) const;
  /// Restores a checkpoint written by the same semantic spec; throws CheckpointError.
  void load_checkpoint(const std::string& path);

  /// Asks run() to stop (safe from another thread). The request rides in the next step's
  /// collective, so every worker stops after that same step.
  void request_stop();
  /// A flag that, once set, acts like request_stop() (e.g. set by a signal handler).
  void set_stop_flag(const std::atomic<bool>* flag);
  /// Every worker of a generation calls this together: run() ends before the next step.
  void stop_now();

  /// Called on every worker before each step's collective; what it returns rides in the
  /// control word (e.g. a pending generation, polled by rank 0 only).
  void set_step_control(std::function<StepControl(const Trainer&)> control);
  /// Installs the communicator of a new generation: this worker's vnodes follow its
  /// rank (vnode::vnodes_of). The training state is unchanged.
  void set_communicator(std::shared_ptr<comm::Communicator> communicator);
  /// The same with a planned, uneven split: this worker holds vnode counts[rank()]
  /// consecutive vnodes (the counts of all ranks sum to the number of vnodes).
  void set_communicator(std::shared_ptr<comm::Communicator> communicator,
                        const std::vector<int64_t>& counts);
  int rank() const;
  int world_size() const;

  /// The complete training state (as in a checkpoint) as bytes, for a joining worker.
  std::string state_bytes() const;
  /// Restores state_bytes() of a worker of the same job; throws CheckpointError.
  void load_state_bytes(const std::string& bytes);
  /// Tells the observers that state_bytes() went to a new generation.
  void state_donated();
  /// Every worker of the generation calls it together after run() returned to regroup
  /// (TrainResult::next_generation), before those that leave go: this generation's rank
  /// r is rank next_rank[r] of the next one (-1: it leaves), which has `next_size` workers
  /// holding next_counts vnodes each (empty: an even split). With the optimizer state
  /// sharded, the shards that only leaving workers hold pass to workers that stay.
  /// Throws comm::PeerFailure.
  void hand_off_state(const std::vector<int>& next_rank, int next_size,
                      const std::vector<int64_t>& next_counts);

  /// Fill StepInfo::examples_used from now on.
  void record_examples(bool on);

  std::string fingerprint() const;
  int64_t step() const;          ///< steps completed so far
  torch::Device device() const;  ///< where the model and gradient buffer live
  /// This worker's smoothed compute time per vnode it holds (0 before its first step).
  double seconds_per_vnode() const;
  /// This worker's smoothed update time a step (the optimizer on the whole model, whatever
  /// vnodes it holds; 0 before its first step).
  double update_seconds() const;
  int64_t total_steps() const;
  int64_t steps_per_epoch() const;
  const JobSpec& spec() const;
  models::Model& model();
  /// Global batch (indices into the training set) of `step`: what the data contract says it is.
  std::vector<int64_t> batch_indices(int64_t step) const;

 private:
  /// Parses and restores serialized state; every failure is a CheckpointError naming source.
  void load_state(const std::string& bytes, const std::string& source);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace vflow::engine
