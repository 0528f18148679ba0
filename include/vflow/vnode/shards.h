// Canonical shards of the flat parameter buffer (docs/design.md, "Optimizer state sharded
// by vnode"): one per vnode, contiguous and balanced by size, the same for every worker
// count. A worker keeps the optimizer state of the shards of the vnodes it holds, and of
// its ring neighbour's as their second home.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "vflow/vnode/plan.h"

namespace vflow::vnode {

/// A range [begin, end) of a flat buffer.
struct FlatRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t numel() const { return end - begin; }
  bool operator==(const FlatRange& o) const { return begin == o.begin && end == o.end; }
};

class ShardLayout {
 public:
  /// `numel` elements cut into `shards` ranges (one per vnode) whose sizes differ by at
  /// most kAlign elements; every boundary but the last is a multiple of kAlign.
  ShardLayout(int64_t numel, int64_t shards);

  static constexpr int64_t kAlign = 16;  ///< elements: 64 bytes of float32

  int64_t shards() const { return static_cast<int64_t>(begins_.size()) - 1; }
  int64_t numel() const { return begins_.back(); }
  FlatRange shard(int64_t s) const { return {begins_.at(s), begins_.at(s + 1)}; }
  /// The shards of vnodes `held`, one contiguous range.
  FlatRange of_vnodes(const VnodeRange& held) const {
    return {begins_.at(held.first), begins_.at(held.last)};
  }

  /// The shards rank `rank` keeps when each rank of `layout` (every rank's vnodes, in rank
  /// order) owns its vnodes' shards and `replicas` ranks keep each (1 or 2: the owner, then
  /// the next rank in ring order), ascending.
  static std::vector<int64_t> kept_by(const std::vector<VnodeRange>& layout, int rank,
                                      int64_t replicas);

  /// The largest shard's elements.
  int64_t largest() const;

 private:
  std::vector<int64_t> begins_;  // shard s is [begins_[s], begins_[s + 1])
};

/// "3..5, 8" for ascending shard ids; "none" for none.
std::string shard_list(const std::vector<int64_t>& shards);

}  // namespace vflow::vnode
