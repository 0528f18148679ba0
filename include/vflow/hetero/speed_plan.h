// Re-planning a running job's split from the speeds its workers measured.
#pragma once

#include <cstdint>
#include <vector>

namespace vflow::hetero {

/// Vnodes per member for `virtual_nodes` vnodes and members of the given per-vnode times
/// (seconds) and, where given, per-step times whatever they hold (`fixed_seconds`: the
/// optimizer's update, which every member runs on the whole model). A member's step takes
/// count x per-vnode + fixed; every member holds at least one vnode, and each further
/// vnode goes to the member that would finish it first, which minimises the slowest
/// member's time. A member with no measurement (per-vnode <= 0, a joiner) counts as the
/// fastest of the others; one whose fixed time is not known (< 0; a joiner with a profile
/// of its type) as the least of theirs. With none measured at all the result is empty
/// (split evenly).
std::vector<int64_t> plan_by_speed(const std::vector<double>& seconds_per_vnode,
                                   int64_t virtual_nodes,
                                   const std::vector<double>& fixed_seconds = {});

}  // namespace vflow::hetero
