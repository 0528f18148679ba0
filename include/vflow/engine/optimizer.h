// Optimizers from the job spec: SGD and AdamW fused over flat buffers (LibTorch's
// arithmetic and checkpoint format), LAMB and LARS fused too where the parameters are the
// CPU's float32 (elsewhere LibTorch's operations), and LibTorch's Adam.
#pragma once

#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

#include "vflow/engine/job_spec.h"

namespace vflow::engine {

/// `canonical_shards`: the job's vnodes, by whose canonical shards LAMB and LARS sum their
/// norms (engine/fused_update.h).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerSpec& spec,
                                                        const std::vector<torch::Tensor>& params,
                                                        int64_t canonical_shards = 1);

/// Sets the learning rate of every parameter group.
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

}  // namespace vflow::engine
