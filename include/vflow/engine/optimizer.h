// Optimizers from the job spec: SGD and AdamW fused over flat buffers (LibTorch's
// arithmetic and checkpoint format), LibTorch's Adam, LAMB and LARS.
#pragma once

#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

#include "vflow/engine/job_spec.h"

namespace vflow::engine {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerSpec& spec,
                                                        const std::vector<torch::Tensor>& params);

/// Sets the learning rate of every parameter group.
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

}  // namespace vflow::engine
