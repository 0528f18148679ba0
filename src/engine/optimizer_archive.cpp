#include "engine/optimizer_archive.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <vector>

#include "vflow/core/error.h"

namespace vflow::engine {

namespace {

torch::serialize::InputArchive read_archive(torch::serialize::InputArchive& archive,
                                            const std::string& key) {
  torch::serialize::InputArchive nested;
  if (!archive.try_read(key, nested)) {
    throw CheckpointError(fmt::format("the optimizer state has no '{}'", key));
  }
  return nested;
}

int64_t read_count(torch::serialize::InputArchive& archive, const std::string& key) {
  torch::Tensor count;
  if (!archive.try_read(key, count) || count.numel() != 1 || count.item<int64_t>() < 0) {
    throw CheckpointError(fmt::format("the optimizer state has no count '{}'", key));
  }
  return count.item<int64_t>();
}

/// The state keys of the archive's parameters, in parameter order.
std::vector<std::string> listed_keys(torch::serialize::InputArchive& archive) {
  auto groups = read_archive(archive, "param_groups");
  std::vector<std::string> keys;
  const int64_t group_count = read_count(groups, "param_groups/size");
  for (int64_t g = 0; g < group_count; ++g) {
    auto group = read_archive(groups, fmt::format("param_groups/{}", g));
    const int64_t count = read_count(group, "params/size");
    for (int64_t k = 0; k < count; ++k) {
      c10::IValue key;
      if (!group.try_read(fmt::format("params/{}", k), key)) {
        throw CheckpointError(
            fmt::format("the optimizer state's group {} lists no parameter {}", g, k));
      }
      if (key.isString()) {
        keys.push_back(key.toStringRef());
      } else if (key.isInt()) {
        keys.push_back(std::to_string(key.toInt()));
      } else {
        throw CheckpointError(fmt::format(
            "the optimizer state's group {} names parameter {} by a {}", g, k, key.tagKind()));
      }
    }
  }
  return keys;
}

}  // namespace

void for_each_saved_state(
    torch::serialize::InputArchive& archive, size_t parameters,
    const std::function<void(size_t, torch::serialize::InputArchive&)>& restore) {
  const auto keys = listed_keys(archive);
  if (keys.size() != parameters) {
    throw CheckpointError(fmt::format("the optimizer state lists {} parameters, this model has {}",
                                      keys.size(), parameters));
  }
  auto states = read_archive(archive, "state");
  const auto saved = states.keys();
  for (size_t i = 0; i < keys.size(); ++i) {
    if (std::find(saved.begin(), saved.end(), keys[i]) == saved.end()) continue;
    torch::serialize::InputArchive state;
    states.read(keys[i], state);
    restore(i, state);
  }
}

}  // namespace vflow::engine
