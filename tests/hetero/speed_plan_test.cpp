// Re-planning the split of vnodes on a resize by the members' measured speeds.
#include "vflow/hetero/speed_plan.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>
#include <vector>

namespace {

/// Brute force for four members of per-vnode times `t` and per-step times `fixed`: checks
/// that no other split of 10 vnodes (each member >= 1) has a faster slowest member than
/// plan_by_speed's.
void check_no_split_is_faster(const std::vector<double>& t, const std::vector<double>& fixed) {
  const auto counts = vflow::hetero::plan_by_speed(t, 10, fixed);
  REQUIRE(counts.size() == 4);
  CHECK(std::accumulate(counts.begin(), counts.end(), int64_t{0}) == 10);
  auto slowest = [&](const std::vector<int64_t>& c) {
    double worst = 0;
    for (size_t m = 0; m < c.size(); ++m) {
      worst = std::max(worst, fixed[m] + static_cast<double>(c[m]) * t[m]);
    }
    return worst;
  };
  double best = 1e9;
  for (int64_t a = 1; a <= 7; ++a)
    for (int64_t b = 1; a + b <= 8; ++b)
      for (int64_t c = 1; a + b + c <= 9; ++c)
        best = std::min(best, slowest({a, b, c, 10 - a - b - c}));
  CHECK(slowest(counts) == Approx(best));
}

}  // namespace

TEST_CASE("a resize re-plans the split by the members' measured speeds", "[unit]") {
  using vflow::hetero::plan_by_speed;
  // A worker four times slower gets the fewest vnodes; the others as many as they finish
  // in about the same time.
  CHECK(plan_by_speed({1.0, 4.0, 1.0}, 12) == std::vector<int64_t>{6, 1, 5});
  CHECK(plan_by_speed({1.0, 1.0}, 8) == std::vector<int64_t>{4, 4});
  // A joiner not yet measured (0) counts as the fastest of the others.
  CHECK(plan_by_speed({0.1, 0.0, 0.3}, 7) == plan_by_speed({0.1, 0.1, 0.3}, 7));
  // Everyone keeps at least one vnode, and nothing measured means an even split.
  CHECK(plan_by_speed({1.0, 100.0}, 4) == std::vector<int64_t>{3, 1});
  CHECK(plan_by_speed({0.0, 0.0}, 4).empty());
  check_no_split_is_faster({0.3, 0.7, 0.2, 0.5}, {0, 0, 0, 0});
}

TEST_CASE("a resize's split counts each member's update time as well", "[unit]") {
  using vflow::hetero::plan_by_speed;
  // Equal per-vnode times, but member 1's update takes three vnodes' time: it holds fewer,
  // and both finish their steps at 7.
  CHECK(plan_by_speed({1.0, 1.0}, 11, {0.0, 3.0}) == std::vector<int64_t>{7, 4});
  CHECK(plan_by_speed({1.0, 1.0}, 11) == std::vector<int64_t>{6, 5});
  // An update time not known (< 0: a joiner with its type's profile) counts as the least
  // known one; a member not measured at all takes the fastest one's times.
  CHECK(plan_by_speed({1.0, 1.0, 1.0}, 9, {0.5, 2.0, -1}) ==
        plan_by_speed({1.0, 1.0, 1.0}, 9, {0.5, 2.0, 0.5}));
  CHECK(plan_by_speed({1.0, 0.0, 2.0}, 9, {0.5, 7.0, 2.0}) ==
        plan_by_speed({1.0, 1.0, 2.0}, 9, {0.5, 0.5, 2.0}));
  check_no_split_is_faster({0.3, 0.7, 0.2, 0.5}, {0.4, 0.0, 1.0, 0.2});
  check_no_split_is_faster({0.1, 0.1, 0.4, 0.2}, {2.0, 0.0, 0.1, 0.3});
}
