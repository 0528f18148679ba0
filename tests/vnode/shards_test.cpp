// Canonical shards of the flat parameters (vnode/shards.h): balanced, aligned, the same
// for every worker count, each kept by its owner and the next rank.
#include "vflow/vnode/shards.h"

#include <catch2/catch.hpp>

using vflow::vnode::ShardLayout;
using vflow::vnode::VnodeRange;

TEST_CASE("canonical shards cover the buffer in aligned ranges balanced by size", "[unit][shard]") {
  for (const int64_t numel : {int64_t{0}, int64_t{15}, int64_t{1000}, int64_t{23520842}}) {
    for (const int64_t n : {int64_t{1}, int64_t{4}, int64_t{12}, int64_t{13}}) {
      CAPTURE(numel, n);
      const ShardLayout layout(numel, n);
      REQUIRE(layout.shards() == n);
      CHECK(layout.shard(0).begin == 0);
      CHECK(layout.shard(n - 1).end == numel);
      int64_t smallest = numel, largest = 0;
      for (int64_t s = 0; s < n; ++s) {
        const auto r = layout.shard(s);
        if (s > 0) CHECK(r.begin == layout.shard(s - 1).end);
        CHECK(r.begin % ShardLayout::kAlign == 0);
        smallest = std::min(smallest, r.numel());
        largest = std::max(largest, r.numel());
      }
      CHECK(largest - smallest < 2 * ShardLayout::kAlign);
      CHECK(layout.largest() == largest);
    }
  }
  const ShardLayout layout(1000, 4);
  CHECK(layout.of_vnodes(VnodeRange{1, 3}).begin == layout.shard(1).begin);
  CHECK(layout.of_vnodes(VnodeRange{1, 3}).end == layout.shard(2).end);
}

TEST_CASE("each shard is kept by its owner and the next rank in ring order", "[unit][shard]") {
  // 12 vnodes as 3, 3, 2, 2, 2.
  const std::vector<VnodeRange> layout{{0, 3}, {3, 6}, {6, 8}, {8, 10}, {10, 12}};
  CHECK(ShardLayout::kept_by(layout, 0, 2) == std::vector<int64_t>{0, 1, 2, 10, 11});
  CHECK(ShardLayout::kept_by(layout, 1, 2) == std::vector<int64_t>{0, 1, 2, 3, 4, 5});
  CHECK(ShardLayout::kept_by(layout, 4, 1) == std::vector<int64_t>{10, 11});
  // One worker keeps everything once.
  CHECK(ShardLayout::kept_by({{0, 4}}, 0, 2) == std::vector<int64_t>{0, 1, 2, 3});
  // Every shard has exactly `replicas` homes.
  for (const int64_t replicas : {1, 2}) {
    std::vector<int> homes(12, 0);
    for (int r = 0; r < 5; ++r) {
      for (const int64_t s : ShardLayout::kept_by(layout, r, replicas)) ++homes[s];
    }
    for (const int h : homes) CHECK(h == replicas);
  }
  CHECK(vflow::vnode::shard_list({0, 1, 2, 5, 7, 8}) == "0..2, 5, 7..8");
  CHECK(vflow::vnode::shard_list({}) == "none");
}
