// Optimizers from the job spec: LibTorch's SGD and AdamW.
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
