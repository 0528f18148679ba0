#include "vflow/engine/optimizer.h"

#include <torch/torch.h>

#include "vflow/core/error.h"

namespace vflow::engine {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerSpec& spec,
                                                        const std::vector<torch::Tensor>& params) {
  if (spec.name == "sgd") {
    auto options = torch::optim::SGDOptions(spec.lr)
                       .momentum(spec.momentum)
                       .dampening(spec.dampening)
                       .nesterov(spec.nesterov)
                       .weight_decay(spec.weight_decay);
    return std::make_unique<torch::optim::SGD>(params, options);
  }
  if (spec.name == "adamw") {
    auto options = torch::optim::AdamWOptions(spec.lr)
                       .betas({spec.beta1, spec.beta2})
                       .eps(spec.eps)
                       .weight_decay(spec.weight_decay);
    return std::make_unique<torch::optim::AdamW>(params, options);
  }
  throw SpecError("semantic.optimizer.name: unknown optimizer '" + spec.name +
                  "'; choices: sgd, adamw");
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace vflow::engine
