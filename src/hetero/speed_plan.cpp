#include "vflow/hetero/speed_plan.h"

#include <algorithm>
#include <limits>

namespace vflow::hetero {

std::vector<int64_t> plan_by_speed(const std::vector<double>& seconds_per_vnode,
                                   int64_t virtual_nodes) {
  std::vector<double> known;
  for (const double t : seconds_per_vnode) {
    if (t > 0) known.push_back(t);
  }
  const auto members = static_cast<int64_t>(seconds_per_vnode.size());
  if (known.empty() || members == 0 || virtual_nodes < members) return {};
  // Joiners start like the launcher's other workers, without limits: count them as fast
  // as the fastest measured member until they are measured themselves.
  const double fastest = *std::min_element(known.begin(), known.end());
  std::vector<double> t;
  for (const double v : seconds_per_vnode) t.push_back(v > 0 ? v : fastest);
  std::vector<int64_t> counts(static_cast<size_t>(members), 1);
  for (int64_t given = members; given < virtual_nodes; ++given) {
    size_t best = 0;
    for (size_t m = 1; m < counts.size(); ++m) {
      if (static_cast<double>(counts[m] + 1) * t[m] <
          static_cast<double>(counts[best] + 1) * t[best]) {
        best = m;
      }
    }
    ++counts[best];
  }
  return counts;
}

}  // namespace vflow::hetero
