#include "vflow/models/registry.h"

#include <fmt/format.h>

#include "vflow/core/error.h"
#include "vflow/models/convnet.h"
#include "vflow/models/mlp.h"

namespace vflow::models {

ModelRegistry::ModelRegistry() {
  add("mlp", "multi-layer perceptron (options: hidden, dropout, batch_norm)", make_mlp_factory);
  add("convnet", "conv + batch norm + dropout (options: channels, hidden, dropout, batch_norm)",
      make_convnet_factory);
}

ModelRegistry& ModelRegistry::global() {
  static ModelRegistry registry;
  return registry;
}

void ModelRegistry::add(const std::string& name, const std::string& description,
                        ModelFactory factory) {
  for (auto& e : entries_) {
    if (e.name == name) {
      e = Entry{name, description, std::move(factory)};
      return;
    }
  }
  entries_.push_back(Entry{name, description, std::move(factory)});
}

std::vector<std::string> ModelRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& e : entries_) out.push_back(e.name);
  return out;
}

ModelBuilder ModelRegistry::prepare(const std::string& name, const SpecNode& name_node,
                                    const SpecNode& options, const ModelContext& ctx) const {
  for (const auto& e : entries_) {
    if (e.name != name) continue;
    OptionReader reader(options);
    ModelBuilder builder = e.factory(reader, ctx);
    reader.finish();
    return builder;
  }
  throw SpecError(fmt::format("{}: unknown model '{}'; choices: {}", name_node.describe(), name,
                              fmt::join(names(), ", ")));
}

}  // namespace vflow::models
