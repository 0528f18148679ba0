#include "vflow/models/registry.h"

#include "vflow/core/error.h"
#include "vflow/models/convnet.h"
#include "vflow/models/mlp.h"

namespace vflow::models {

ModelRegistry::ModelRegistry() : Registry("model") {
  add("mlp", "multi-layer perceptron (options: hidden, dropout, batch_norm)", make_mlp_factory);
  add("convnet", "conv + batch norm + dropout (options: channels, hidden, dropout, batch_norm)",
      make_convnet_factory);
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
