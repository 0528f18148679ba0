#include "vflow/hetero/speed_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace vflow::hetero {

std::vector<int64_t> plan_by_speed(const std::vector<double>& seconds_per_vnode,
                                   int64_t virtual_nodes,
                                   const std::vector<double>& fixed_seconds) {
  const size_t members = seconds_per_vnode.size();
  const auto fixed_of = [&](size_t m) {  // < 0: not known
    return m < fixed_seconds.size() ? fixed_seconds[m] : 0.0;
  };
  double fastest = std::numeric_limits<double>::infinity();
  double least_fixed = std::numeric_limits<double>::infinity();
  for (size_t m = 0; m < members; ++m) {
    if (!(seconds_per_vnode[m] > 0)) continue;
    fastest = std::min(fastest, seconds_per_vnode[m]);
    if (fixed_of(m) >= 0) least_fixed = std::min(least_fixed, fixed_of(m));
  }
  if (std::isinf(fastest) || members == 0 || virtual_nodes < static_cast<int64_t>(members)) {
    return {};
  }
  if (std::isinf(least_fixed)) least_fixed = 0;
  // Joiners start like the launcher's other workers, without limits: count them as fast
  // as the fastest measured member until they are measured themselves.
  std::vector<double> t, fixed;
  for (size_t m = 0; m < members; ++m) {
    const bool measured = seconds_per_vnode[m] > 0;
    t.push_back(measured ? seconds_per_vnode[m] : fastest);
    fixed.push_back(measured && fixed_of(m) >= 0 ? fixed_of(m) : least_fixed);
  }
  // Each further vnode to the member that would finish it first. The chosen finishing
  // times are then the smallest there are (each member's grow with its count), so the
  // slowest member's time is the least any split has.
  std::vector<int64_t> counts(members, 1);
  const auto finish = [&](size_t m) {
    return fixed[m] + static_cast<double>(counts[m] + 1) * t[m];
  };
  for (auto given = static_cast<int64_t>(members); given < virtual_nodes; ++given) {
    size_t best = 0;
    for (size_t m = 1; m < members; ++m) {
      if (finish(m) < finish(best)) best = m;
    }
    ++counts[best];
  }
  return counts;
}

}  // namespace vflow::hetero
