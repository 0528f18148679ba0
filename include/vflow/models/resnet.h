// Residual networks (He et al. 2016): ResNet-18/34 with basic blocks and
// ResNet-50/101 with bottleneck blocks, with a CIFAR-style stem (3x3 conv, no
// pooling; small images) or the ImageNet stem (7x7 stride-2 conv and max-pool).
// Their batch norms are handled by vflow's stateful-kernel mechanism.
#pragma once

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include "vflow/models/registry.h"

namespace vflow::models {

struct ResNetOptions {
  int64_t depth = 18;         ///< 18, 34 (basic blocks), 50 or 101 (bottleneck blocks)
  std::string stem = "auto";  ///< cifar | imagenet | auto (cifar for inputs up to 64x64)
  int64_t width = 64;         ///< channels of the first stage; stages double it
};

class ResNet final : public Model {
 public:
  ResNet(const ResNetOptions& options, const ModelContext& ctx);
  torch::Tensor forward(const torch::Tensor& input) override;

 private:
  torch::nn::Sequential stem_;
  torch::nn::ModuleList stages_;  // of Sequential blocks
  torch::nn::Linear fc_{nullptr};
};

/// Registers "resnet" with its options' keys.
void register_resnet(ModelRegistry& registry);

}  // namespace vflow::models
