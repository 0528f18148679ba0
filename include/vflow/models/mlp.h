// A multi-layer perceptron classifier.
#pragma once

#include <torch/nn/modules/container/sequential.h>

#include "vflow/models/registry.h"

namespace vflow::models {

struct MlpOptions {
  std::vector<int64_t> hidden = {256, 128};  ///< widths of the hidden layers
  double dropout = 0.2;                      ///< dropout after each hidden layer (0 = none)
  bool batch_norm = false;                   ///< BatchNorm1d after each hidden linear layer
};

class Mlp final : public Model {
 public:
  Mlp(const MlpOptions& options, const ModelContext& ctx);
  torch::Tensor forward(const torch::Tensor& input) override;

 private:
  torch::nn::Sequential layers_;
};

/// Registers "mlp" with its options' keys.
void register_mlp(ModelRegistry& registry);

}  // namespace vflow::models
