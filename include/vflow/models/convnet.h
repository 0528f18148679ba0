// A small convolutional classifier with batch norm and dropout: the default
// model of vflow's default job (Fashion-MNIST).
#pragma once

#include <torch/nn/modules/container/sequential.h>

#include "vflow/models/registry.h"

namespace vflow::models {

struct ConvNetOptions {
  std::vector<int64_t> channels = {32, 64};  ///< one 3x3 conv + 2x2 max-pool block per entry
  int64_t hidden = 128;                      ///< width of the fully connected layer
  double dropout = 0.25;                     ///< dropout before the classifier (0 = none)
  bool batch_norm = true;                    ///< BatchNorm2d after each convolution
};

class ConvNet final : public Model {
 public:
  ConvNet(const ConvNetOptions& options, const ModelContext& ctx);
  torch::Tensor forward(const torch::Tensor& input) override;

 private:
  torch::nn::Sequential features_;
  torch::nn::Sequential classifier_;
};

/// Registers "convnet" with its options' keys.
void register_convnet(ModelRegistry& registry);

}  // namespace vflow::models
