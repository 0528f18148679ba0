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
  explicit Registry(std::string kind) : kind_(std::move(kind)) {}

  /// Registers `name`, replacing an earlier entry of the same name.
  void add(const std::string& name, const std::string& description, Factory factory) {
    for (auto& e : entries_) {
      if (e.name == name) {
        e = Entry{name, description, std::move(factory)};
        return;
      }
    }
    entries_.push_back(Entry{name, description, std::move(factory)});
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

 private:
  struct Entry {
    std::string name;
    std::string description;
    Factory factory;
  };
  std::string kind_;
  std::vector<Entry> entries_;
};

}  // namespace vflow
