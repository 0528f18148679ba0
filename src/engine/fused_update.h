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

#include <memory>
#include <vector>

#include "vflow/engine/job_spec.h"
#include "vflow/vnode/fixed_point.h"

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

/// The fused optimizer for `spec` (sgd or adamw) over `params`, nullptr for the others.
/// Every parameter that requires a gradient must have one at every step (as the engine's
/// gradient buffer provides); one without is an internal error.
std::unique_ptr<torch::optim::Optimizer> make_fused_optimizer(
    const OptimizerSpec& spec, const std::vector<torch::Tensor>& params);

}  // namespace vflow::engine
