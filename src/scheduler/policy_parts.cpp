#include "policy_parts.h"

namespace vflow::scheduler::detail {

Allocation to_allocation(const std::vector<JobView>& active, const std::vector<int>& types,
                         const std::vector<int>& workers) {
  Allocation out;
  auto& as = out.assignments;
  as.resize(active.size());
  size_t k = 0;
  for (size_t i = 0; i < active.size(); ++i) {
    if (workers[i] > 0) as[k++] = {active[i].job->id, types[i], workers[i]};
  }
  as.resize(k);
  return out;
}

// The devices of each type.
std::vector<int> device_counts(const Cluster& cluster) {
  std::vector<int> count(cluster.num_types());
  for (int t = 0; t < cluster.num_types(); ++t) count[t] = cluster.type(t).count;
  return count;
}

// `events`: the starts of jobs 0..n-1, then their stops in descending job order. Puts them in
// pair order (level, then id: at one level the stops, then the starts, each as they lie in
// `events`) into `out` without a sort, or returns false where the levels are more than
// kFewLevels. `slot`: scratch.
bool order_few_levels(const std::vector<std::pair<double, long>>& events, size_t n,
                      std::vector<uint8_t>& slot, std::vector<std::pair<double, long>>& out) {
  double levels[kFewLevels];
  size_t distinct = 0;
  const size_t size = events.size();
  slot.resize(size);
  for (size_t e = 0; e < size; ++e) {
    size_t b = 0;
    while (b < distinct && levels[b] != events[e].first) ++b;
    if (b == distinct) {
      if (distinct == kFewLevels) return false;
      levels[distinct++] = events[e].first;
    }
    slot[e] = static_cast<uint8_t>(2 * b + (e < n ? 1 : 0));  // a level's stops, then starts
  }
  // Counted and placed in kLanes stretches of `events` side by side: most events share one
  // level, and one count at a time would chain every increment to the one before.
  constexpr size_t kLanes = 4;
  const size_t stretch = (size + kLanes - 1) / kLanes;
  size_t at[kLanes][2 * kFewLevels] = {};
  for (size_t j = 0; j < stretch; ++j) {
    for (size_t l = 0; l < kLanes; ++l) {
      if (const size_t e = l * stretch + j; e < size) ++at[l][slot[e]];
    }
  }
  size_t by_rank[kFewLevels];
  std::iota(by_rank, by_rank + distinct, size_t{0});
  std::sort(by_rank, by_rank + distinct, [&](size_t a, size_t b) { return levels[a] < levels[b]; });
  size_t next = 0;  // levels ascending; in a slot, the stretches in order: the events' order
  for (size_t r = 0; r < distinct; ++r) {
    for (const size_t s : {2 * by_rank[r], 2 * by_rank[r] + 1}) {
      for (auto& lane : at) next += std::exchange(lane[s], next);
    }
  }
  out.resize(size);
  for (size_t j = 0; j < stretch; ++j) {
    for (size_t l = 0; l < kLanes; ++l) {
      if (const size_t e = l * stretch + j; e < size) out[at[l][slot[e]]++] = events[e];
    }
  }
  return true;
}

// Non-elastic placement in the given order: each job runs at exactly its demand on one type
// or waits. Running jobs stay on their type when it has room. `keep_running`: running jobs
// are placed first and never preempted. `strict`: stop at the first job that does not fit
// (no backfilling).
Allocation place_at_demand(const Cluster& cluster, const std::vector<JobView>& active,
                           const std::vector<size_t>& order, bool keep_running, bool strict) {
  std::vector<int> free = device_counts(cluster);
  std::vector<int> types(active.size(), -1), workers(active.size(), 0);
  if (keep_running) {
    for (size_t i = 0; i < active.size(); ++i) {
      if (active[i].workers == 0) continue;
      types[i] = active[i].device_type;
      workers[i] = active[i].workers;
      free[types[i]] -= workers[i];
    }
  }
  for (size_t k = 0; k < order.size(); ++k) {
    fetch_ahead(active, order, k);
    const size_t i = order[k];
    if (workers[i] > 0) continue;
    const Job& job = *active[i].job;
    const auto fits = [&](int t) { return free[t] >= job.demand; };
    const int now = running_type(active[i]);
    const int best = now >= 0 && fits(now) ? now : fastest_type(cluster, fits, [&](int t) {
      return job.rate(t, job.demand);
    });
    if (best < 0) {
      if (strict) break;
      continue;
    }
    types[i] = best;
    workers[i] = job.demand;
    free[best] -= job.demand;
  }
  return to_allocation(active, types, workers);
}

}  // namespace vflow::scheduler::detail
