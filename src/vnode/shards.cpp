#include "vflow/vnode/shards.h"

#include <fmt/format.h>

#include <algorithm>

#include "vflow/core/error.h"

namespace vflow::vnode {

ShardLayout::ShardLayout(int64_t numel, int64_t shards) {
  VFLOW_ASSERT(numel >= 0 && shards > 0, "a shard layout of no shards");
  // In units of kAlign elements, as evenly as integers allow; the last shard takes the
  // remainder below one unit.
  const int64_t units = numel / kAlign;
  begins_.reserve(static_cast<size_t>(shards) + 1);
  for (int64_t s = 0; s < shards; ++s) begins_.push_back(units * s / shards * kAlign);
  begins_.push_back(numel);
}

std::vector<int64_t> ShardLayout::kept_by(const std::vector<VnodeRange>& layout, int rank,
                                          int64_t replicas) {
  const int ranks = static_cast<int>(layout.size());
  VFLOW_ASSERT(rank >= 0 && rank < ranks, "kept_by of a rank outside the layout");
  std::vector<int64_t> kept;
  // The owner keeps its own; the next rank in ring order keeps the owner's as well.
  const int64_t homes = std::min<int64_t>(replicas, ranks);
  for (int64_t k = 0; k < homes; ++k) {
    const auto& owned = layout[static_cast<size_t>((rank - k + ranks) % ranks)];
    for (int64_t s = owned.first; s < owned.last; ++s) kept.push_back(s);
  }
  std::sort(kept.begin(), kept.end());
  kept.erase(std::unique(kept.begin(), kept.end()), kept.end());
  return kept;
}

int64_t ShardLayout::largest() const {
  int64_t out = 0;
  for (int64_t s = 0; s < shards(); ++s) out = std::max(out, shard(s).numel());
  return out;
}

std::string shard_list(const std::vector<int64_t>& shards) {
  if (shards.empty()) return "none";
  std::string out;
  for (size_t i = 0; i < shards.size();) {
    size_t j = i;
    while (j + 1 < shards.size() && shards[j + 1] == shards[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += j == i ? fmt::format("{}", shards[i]) : fmt::format("{}..{}", shards[i], shards[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace vflow::vnode
