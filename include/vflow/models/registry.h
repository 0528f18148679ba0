// The model zoo's interface and registry: models are built by name from a job
// spec's `semantic.model` section, and users register their own C++ modules.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "vflow/core/registry.h"
#include "vflow/core/spec_node.h"

namespace vflow::models {

/// What the data tells a model before it is built.
struct ModelContext {
  std::vector<int64_t> input_shape;  ///< one example, e.g. {1, 28, 28}
  int64_t num_classes = 0;
  int64_t vocab_size = 0;  ///< inputs are int64 token ids in [0, vocab_size); 0 = float inputs
};

/// A classifier: maps a batch of inputs [n, ...] to logits [n, num_classes], or a
/// sequence model: maps [n, T] to per-position logits [n, T, num_classes].
/// Any module that normalises with running statistics (batch norm) is handled
/// by vflow's stateful-kernel mechanism; dropout draws from torch's default
/// generator, which vflow seeds per (seed, step, vnode).
class Model : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(const torch::Tensor& input) = 0;
};

/// Cross-entropy of logits [n, C] against targets [n], or of [n, T, C] against [n, T]
/// (every position one prediction, all equally weighted). `sum`: the sum instead of
/// the mean over predictions. `label_smoothing`: targets mixed with the uniform
/// distribution by this weight (PyTorch's cross_entropy(label_smoothing=)).
torch::Tensor prediction_loss(const torch::Tensor& logits, const torch::Tensor& target,
                              bool sum = false, double label_smoothing = 0);

using ModelBuilder = std::function<std::shared_ptr<Model>()>;
/// Reads and validates a model's options (throwing SpecError through the reader) and
/// returns a builder. Building happens later, after all validation has passed.
using ModelFactory = std::function<ModelBuilder(OptionReader& options, const ModelContext& ctx)>;

class ModelRegistry : public Registry<ModelFactory> {
 public:
  /// The registry with vflow's models: "mlp", "convnet", "resnet", "bert",
  /// "transformer-lm" and "torchscript".
  static ModelRegistry& global();

  /// Validates `options` for model `name`; unknown names and keys are SpecErrors.
  ModelBuilder prepare(const std::string& name, const SpecNode& name_node, const SpecNode& options,
                       const ModelContext& ctx) const;

 private:
  ModelRegistry();
};

}  // namespace vflow::models
