// SGD and AdamW as one pass over flat buffers (docs/design.md, "The fused update").
//
// The trainable parameters become views into one flat buffer, in the order of the
// gradient buffer's views, and the optimizer's state is flat too, so that one
// vectorised, parallel loop updates every element. The arithmetic is LibTorch's
// SGD's and AdamW's, element by element, in float32, compiled without FMA
// contraction, so hosts of different instruction sets compute the same update.
// Checkpoints hold exactly what LibTorch's SGD or AdamW would save.
#pragma once

#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <vector>

#include "vflow/engine/job_spec.h"
#include "vflow/vnode/fixed_point.h"
#include "vflow/vnode/shards.h"

namespace vflow::engine {

/// A step's loss closure evaluated with gradients on, as LibTorch's optimizers do
/// (undefined without one).
inline torch::Tensor evaluate_closure(const torch::optim::Optimizer::LossClosure& closure) {
  if (!closure) return {};
  torch::AutoGradMode enable_grad(true);
  return closure();
}

/// What the fused optimizers offer beyond LibTorch's interface: steps that take
/// deterministic mode's gradient as it lies, the reduced sum never written out as floats
/// (bitwise the step after FixedPointSum::assemble) or one worker's floats never rounded
/// in a pass of their own (after round_in_place): one pass less either way.
class FixedPointStep {
 public:
  /// One step with gradient `g` (the flat gradient, in the parameters' order). The
  /// parameters must be float32 on the CPU.
  virtual void step_fixed_point(const vnode::FixedPointSum::Reduced& g) = 0;
  /// One step with the gradients where step() reads them (one flat float32 buffer on the
  /// CPU), each rounded to a multiple of 2^-36 as it is read: bitwise the step after
  /// FixedPointSum::round_in_place of a worker's only vnode, one pass less.
  virtual void step_rounding() = 0;

 protected:
  ~FixedPointStep() = default;
};

/// The fused optimizers' state kept by canonical shard (resources.shard_optimizer;
/// docs/design.md, "Optimizer state sharded by vnode"). Each shard this worker holds has
/// its state as one tensor of state_tensors() rows, a row per state tensor (sgd's
/// momentum; adamw's exp_avg and exp_avg_sq) over the shard's range. A step updates the
/// parameters of the held shards only; the others' are the reducer's to gather.
class ShardedState {
 public:
  /// From now on the state is kept by the shards of `layout` (over the trainable
  /// parameters' flat buffer), of which this worker should keep `kept` (ascending).
  /// Holds none until set_shard or load; the first step starts the kept shards fresh.
  virtual void shard_by(const vnode::ShardLayout& layout) = 0;
  virtual const vnode::ShardLayout& layout() const = 0;
  /// The shards this worker should keep (after a resize: its new vnodes' and their second
  /// home's), which load() restores and trim() leaves.
  virtual void set_kept(std::vector<int64_t> kept) = 0;
  virtual const std::vector<int64_t>& kept() const = 0;
  /// The shards whose state this worker holds now, ascending.
  virtual std::vector<int64_t> held() const = 0;
  /// Shard s's state (state_tensors() x its numel): the tensor held, for sending.
  virtual torch::Tensor shard(int64_t s) const = 0;
  /// Holds `packed` as shard s's state.
  virtual void set_shard(int64_t s, torch::Tensor packed) = 0;
  /// Drops every held shard that is not kept.
  virtual void trim() = 0;
  /// Drops every held shard, and a checkpoint's shards left to read (its state is of
  /// another step than the parameters'); the step count is 0 again: this worker holds the
  /// state of no step.
  virtual void drop_all() = 0;
  /// Holds the kept shards as a fresh optimizer's (zero) state.
  virtual void start_fresh() = 0;
  virtual int64_t state_tensors() const = 0;
  /// The optimizer's step count (adamw's bias correction; sgd: > 0 once a step was taken).
  virtual int64_t steps() const = 0;
  virtual void set_steps(int64_t steps) = 0;
  /// Bytes of state held now.
  virtual int64_t held_bytes() const = 0;
  /// The learning rate the next step takes.
  virtual double lr() const = 0;
  virtual void set_lr(double lr) = 0;
  /// The flat parameters (the parameters are views into it), for gathering.
  virtual torch::Tensor flat_parameters() = 0;

  /// Replaces the state with a checkpoint's, kept by the canonical shards `layout` at
  /// optimizer step `steps`: read(s) gives shard s's (state_tensors() x its elements).
  /// Unsharded, it reads every shard now; sharded, the kept shards are read by
  /// read_pending, once the group's layout is known (`read` must outlive this call).
  virtual void load_shards(const vnode::ShardLayout& layout, int64_t steps,
                           const std::function<torch::Tensor(int64_t)>& read) = 0;
  /// Reads the kept shards of a checkpoint that load_shards left to read (if any).
  virtual void read_pending() = 0;
  /// The shards this worker owns (its vnodes'), of which it gives the figures every worker
  /// needs (LAMB's and LARS's sums of squares, from which the trust ratios are formed).
  virtual void set_owned(std::vector<int64_t> owned) = 0;
  /// A sum of a float64 tensor over every worker, in place, in an order that does not
  /// depend on the tensor's values (a collective, called by every worker at every step of
  /// LAMB and LARS): each figure is given by its shard's owner and is zero elsewhere, so
  /// the sum is that figure exactly.
  using Exchange = std::function<void(torch::Tensor&)>;
  virtual void set_exchange(Exchange exchange) = 0;
  /// Whether a sharded step calls the exchange (LAMB, LARS): its last collective before
  /// the update.
  virtual bool exchanges() const = 0;

 protected:
  ~ShardedState() = default;
};

/// The fused optimizer for `spec` (sgd, adamw, lamb or lars) over `params`, nullptr for
/// the others. LAMB's and LARS's norms are summed by the `canonical_shards` canonical
/// shards of the trainable parameters (vnode::ShardLayout; the job's vnodes), then added in
/// shard order, so that a sharded job forms the same trust ratios. Every parameter that
/// requires a gradient must have one at every step (as the engine's gradient buffer
/// provides); one without is an internal error.
std::unique_ptr<torch::optim::Optimizer> make_fused_optimizer(
    const OptimizerSpec& spec, const std::vector<torch::Tensor>& params,
    int64_t canonical_shards = 1);

}  // namespace vflow::engine
