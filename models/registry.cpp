#include "vflow/models/registry.h"

#include <torch/nn/functional/loss.h>

#include "vflow/core/error.h"
#include "vflow/models/convnet.h"
#include "vflow/models/mlp.h"
#include "vflow/models/resnet.h"
#include "vflow/models/torchscript.h"
#include "vflow/models/transformer.h"

namespace vflow::models {

ModelRegistry::ModelRegistry() : Registry("model") {
  register_mlp(*this);
  register_convnet(*this);
  register_resnet(*this);
  register_transformers(*this);
  register_torchscript(*this);
}

torch::Tensor prediction_loss(const torch::Tensor& logits, const torch::Tensor& target, bool sum,
                              double label_smoothing) {
  namespace F = torch::nn::functional;
  auto options = F::CrossEntropyFuncOptions().label_smoothing(label_smoothing);
  if (sum) options.reduction(torch::kSum);
  return F::cross_entropy(logits.reshape({-1, logits.size(-1)}), target.reshape({-1}), options);
}

ModelRegistry& ModelRegistry::global() {
  static ModelRegistry registry;
  return registry;
}

ModelBuilder ModelRegistry::prepare(const std::string& name, const SpecNode& name_node,
                                    const SpecNode& options, const ModelContext& ctx) const {
  const ModelFactory& factory = find(name, name_node);
  OptionReader reader(options);
  ModelBuilder builder = factory(reader, ctx);
  reader.finish();
  return builder;
}

}  // namespace vflow::models
