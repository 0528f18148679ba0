#include "vflow/scheduler/cluster.h"

#include <fmt/format.h>

#include <set>

#include "parse.h"
#include "vflow/core/error.h"

namespace vflow::scheduler {
namespace {

int parse_count(const std::string& text, const std::string& whole) {
  const auto value = parse_whole<int>(text);
  if (!value || *value < 1) {
    throw SpecError(
        fmt::format("cluster '{}': device count '{}' is not a positive integer", whole, text));
  }
  return *value;
}

}  // namespace

Cluster::Cluster(std::vector<DeviceType> types) : types_(std::move(types)) {
  if (types_.empty()) throw SpecError("cluster: no device types");
  std::set<std::string> names;
  for (const auto& t : types_) {
    if (t.name.empty()) throw SpecError("cluster: a device type has an empty name");
    if (t.count < 1) {
      throw SpecError(fmt::format("cluster: device type '{}' has count {} (< 1)", t.name, t.count));
    }
    if (!names.insert(t.name).second) {
      throw SpecError(fmt::format("cluster: device type '{}' appears twice", t.name));
    }
    total_ += t.count;
  }
}

Cluster Cluster::parse(const std::string& text) {
  if (text.find(':') == std::string::npos) return Cluster({{"gpu", parse_count(text, text)}});
  std::vector<DeviceType> types;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    const std::string item = text.substr(begin, end - begin);
    const size_t colon = item.find(':');
    if (colon == std::string::npos || colon == 0) {
      throw SpecError(fmt::format("cluster '{}': item '{}' is not TYPE:COUNT", text, item));
    }
    types.push_back({item.substr(0, colon), parse_count(item.substr(colon + 1), text)});
    begin = end + 1;
  }
  return Cluster(std::move(types));
}

int Cluster::index_of(const std::string& name) const {
  for (int i = 0; i < num_types(); ++i) {
    if (types_[i].name == name) return i;
  }
  return -1;
}

std::string Cluster::describe() const {
  std::string out;
  for (const auto& t : types_) {
    if (!out.empty()) out += ',';
    out += fmt::format("{}:{}", t.name, t.count);
  }
  return out;
}

}  // namespace vflow::scheduler
