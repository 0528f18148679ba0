// A name -> factory table, the shape shared by the model and data registries.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "vflow/core/spec_node.h"

namespace vflow {

/// Throws SpecError "<where>: unknown <kind> '<name>'; choices: a, b".
[[noreturn]] void throw_unknown_name(const SpecNode& name_node, const std::string& kind,
                                     const std::string& name,
                                     const std::vector<std::string>& choices);

template <typename Factory>
class Registry {
 public:
  struct Entry {
    std::string name;
    std::string description;  ///< a phrase: "multi-layer perceptron"
    Factory factory;
    /// Its options' key table (the options' schema rows); empty = not documented here.
    std::vector<SpecKeyRow> keys;
  };

  explicit Registry(std::string kind) : kind_(std::move(kind)) {}

  /// Registers `name`, replacing an earlier entry of the same name.
  void add(const std::string& name, const std::string& description, Factory factory,
           std::vector<SpecKeyRow> keys = {}) {
    Entry entry{name, description, std::move(factory), std::move(keys)};
    for (auto& e : entries_) {
      if (e.name == name) {
        e = std::move(entry);
        return;
      }
    }
    entries_.push_back(std::move(entry));
  }

  /// The factory of `name`; an unknown name is a SpecError located at `name_node`.
  const Factory& find(const std::string& name, const SpecNode& name_node) const {
    for (const auto& e : entries_) {
      if (e.name == name) return e.factory;
    }
    throw_unknown_name(name_node, kind_, name, names());
  }

  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : entries_) out.push_back(e.name);
    return out;
  }

  /// Every entry, in the order registered.
  const std::vector<Entry>& entries() const { return entries_; }

 private:
  std::string kind_;
  std::vector<Entry> entries_;
};

}  // namespace vflow
