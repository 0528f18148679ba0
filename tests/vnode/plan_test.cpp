#include "vflow/vnode/plan.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <set>

#include "vflow/core/error.h"

using vflow::vnode::DataOrder;
using vflow::vnode::Slice;
using vflow::vnode::VirtualNodePlan;

TEST_CASE("full batches split into equal contiguous vnode slices", "[unit]") {
  const VirtualNodePlan plan(256, 8);
  CHECK(plan.vnode_size() == 32);
  for (int64_t v = 0; v < 8; ++v) CHECK(plan.slice(v, 256) == Slice{v * 32, 32});
}

TEST_CASE("the last short batch is split as evenly as possible", "[unit]") {
  const VirtualNodePlan plan(12, 4);
  int64_t covered = 0;
  for (int64_t v = 0; v < 4; ++v) {
    const auto s = plan.slice(v, 10);
    CHECK(s.offset == covered);
    CHECK((s.size == 2 || s.size == 3));
    covered += s.size;
  }
  CHECK(covered == 10);
  int64_t nonempty = 0;
  for (int64_t v = 0; v < 4; ++v) nonempty += plan.slice(v, 2).size > 0;
  CHECK(nonempty == 1);  // two examples: one vnode of 2 rather than two of 1
  CHECK(plan.slice(0, 5) == Slice{0, 2});
  CHECK(plan.slice(1, 5) == Slice{2, 3});
  CHECK(plan.slice(2, 5).size == 0);
  const VirtualNodePlan singles(4, 4);  // b = 1: every vnode holds one example
  for (int64_t v = 0; v < 4; ++v) CHECK(singles.slice(v, 4) == Slice{v, 1});
}

TEST_CASE("plans reject impossible shapes", "[unit]") {
  CHECK_THROWS_AS(VirtualNodePlan(100, 8), vflow::SpecError);
  CHECK_THROWS_AS(VirtualNodePlan(8, 16), vflow::SpecError);
  CHECK_THROWS_AS(VirtualNodePlan(8, 0), vflow::SpecError);
}

TEST_CASE("epoch permutations depend on (seed, epoch) only", "[unit]") {
  const DataOrder a(7, 1000, 64, false);
  const DataOrder b(7, 1000, 128, true);  // batch shape does not change the order
  const DataOrder c(8, 1000, 64, false);
  const auto p0 = a.permutation(0);
  CHECK(p0 == b.permutation(0));
  CHECK(p0 == a.permutation(0));
  CHECK(p0 != a.permutation(1));
  CHECK(p0 != c.permutation(0));
  auto sorted = p0;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) REQUIRE(sorted[static_cast<size_t>(i)] == i);
}

TEST_CASE("every example is used exactly once per epoch across steps and vnodes", "[unit]") {
  for (const bool drop_last : {false, true}) {
    const int64_t n = 1003, batch = 48;
    const DataOrder order(5, n, batch, drop_last);
    const VirtualNodePlan plan(batch, 12);
    CHECK(order.steps_per_epoch() == (drop_last ? n / batch : (n + batch - 1) / batch));
    const auto perm = order.permutation(3);
    std::vector<int> uses(static_cast<size_t>(n), 0);
    for (int64_t s = 0; s < order.steps_per_epoch(); ++s) {
      const auto b = order.batch(s);
      for (int64_t v = 0; v < plan.virtual_nodes(); ++v) {
        const auto part = plan.slice(v, b.size);
        for (int64_t i = 0; i < part.size; ++i) {
          ++uses[static_cast<size_t>(perm[static_cast<size_t>(b.offset + part.offset + i)])];
        }
      }
    }
    const int64_t used = std::count(uses.begin(), uses.end(), 1);
    CHECK(std::count_if(uses.begin(), uses.end(), [](int u) { return u > 1; }) == 0);
    CHECK(used == (drop_last ? n / batch * batch : n));
  }
}

TEST_CASE("derived seeds differ per coordinate", "[unit]") {
  std::set<uint64_t> seen;
  for (uint64_t s = 0; s < 20; ++s) {
    for (uint64_t v = 0; v < 20; ++v) seen.insert(vflow::vnode::mix_seed(1, s, v));
  }
  CHECK(seen.size() == 400);
  CHECK(vflow::vnode::mix_seed(1, 2, 3) != vflow::vnode::mix_seed(1, 3, 2));
}

TEST_CASE("vnode blocks cover 0..N-1 contiguously, sizes differing by at most one", "[unit]") {
  for (int64_t n : {1, 5, 12, 13}) {
    for (int64_t k = 1; k <= n; ++k) {
      int64_t next = 0;
      for (int64_t r = 0; r < k; ++r) {
        const auto range = vflow::vnode::vnodes_of(n, k, r);
        CHECK(range.first == next);
        const int64_t size = range.last - range.first;
        CHECK((size == n / k || size == n / k + 1));
        next = range.last;
      }
      CHECK(next == n);
    }
  }
}

TEST_CASE("relaxed plans slice full batches by their sizes and the tail evenly", "[unit]") {
  const VirtualNodePlan plan(16, std::vector<int64_t>{3, 5, 2, 6});
  CHECK(plan.virtual_nodes() == 4);
  CHECK_FALSE(plan.uniform());
  CHECK(plan.slice(0, 16) == Slice{0, 3});
  CHECK(plan.slice(2, 16) == Slice{8, 2});
  CHECK(plan.slice(3, 16) == Slice{10, 6});
  // A short last batch of 6 is split as in exact mode: over min(6 / 2, 4) = 3 vnodes.
  CHECK(plan.slice(0, 6) == Slice{0, 2});
  CHECK(plan.slice(2, 6) == Slice{4, 2});
  CHECK(plan.slice(3, 6).size == 0);
  CHECK_THROWS_WITH(VirtualNodePlan(16, std::vector<int64_t>{3, 5}),
                    Catch::Contains("sum to 8, not to global_batch 16"));
  CHECK_THROWS_AS(VirtualNodePlan(4, std::vector<int64_t>{4, 0}), vflow::SpecError);
}
