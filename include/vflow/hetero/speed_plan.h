// Re-planning a running job's split from the speeds its workers measured.
#pragma once

#include <cstdint>
#include <vector>

namespace vflow::hetero {

/// Vnodes per member for `virtual_nodes` vnodes and members of the given per-vnode times
/// (seconds): every member holds at least one, and each further vnode goes to the
/// member that would finish it first, which minimises the slowest member's time. A
/// member with no measurement (<= 0, a joiner) counts as the fastest of the others; with
/// none measured at all the result is empty (split evenly).
std::vector<int64_t> plan_by_speed(const std::vector<double>& seconds_per_vnode,
                                   int64_t virtual_nodes);

}  // namespace vflow::hetero
