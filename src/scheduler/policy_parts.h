// The pieces the scheduler's policies share (src/scheduler/policy_*.cpp): the estimates
// they weigh, the water fill, the incremental ranking, placement at demand, and a factory
// per policy for make_policy.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "vflow/core/error.h"
#include "vflow/scheduler/policy.h"

namespace vflow::scheduler::detail {

// A type whose per-job estimate beats the job's current type by less than this factor does
// not justify a migration (a checkpoint-restart).
constexpr double kMigrationGain = 1.25;

// What stopping job `v` costs it, as a policy weighs it: nothing where the policy weighs no
// restart (restart_s 0), else the job's measured cost where known, else the estimate.
inline double restart_cost(const JobView& v, const PolicyOptions& options) {
  if (options.restart_s <= 0) return 0;
  return v.restart_s >= 0 ? v.restart_s : options.restart_s;
}

// Seconds of pause that a grant of `step` workers of type t, from `from`, saves a running job
// (< 0: costs it): giving it back exactly the workers it runs on there saves the pause of
// resizing it; a grant beyond them costs that pause.
inline double pause_saved(const JobView& v, int t, int from, int step, double pause) {
  if (pause <= 0 || v.workers == 0) return 0;
  const int now = v.counts != nullptr ? v.counts[t] : (v.device_type == t ? v.workers : 0);
  return (from + step == now ? pause : 0) - (from >= now ? pause : 0);
}

inline double priority_key(Priority priority, const JobView& v, const PolicyOptions& options) {
  const Job& job = *v.job;
  switch (priority) {
    case Priority::kFifo:
      return job.arrival_s;
    case Priority::kSjf:
      return job.total_work / job.demand_rate;
    case Priority::kSrtf:  // a running job is ahead by what stopping it would cost it
      return v.remaining_work / job.demand_rate - (v.workers > 0 ? restart_cost(v, options) : 0);
    case Priority::kWeights:
      return -job.weight;
    case Priority::kLas:
      break;
  }
  const auto& bounds = options.las_thresholds;
  return static_cast<double>(std::upper_bound(bounds.begin(), bounds.end(), v.attained_service) -
                             bounds.begin());
}

// The device type that `fits` and runs the job fastest by `speed` (ties to the lower type),
// -1 where none fits.
template <typename Fits, typename Speed>
inline int fastest_type(const Cluster& cluster, const Fits& fits, const Speed& speed) {
  int best = -1;
  double best_speed = 0;
  for (int t = 0; t < cluster.num_types(); ++t) {
    if (!fits(t)) continue;
    const double v = speed(t);
    if (best < 0 || v > best_speed) best = t, best_speed = v;
  }
  return best;
}

// The type a running job runs on, -1 for a waiting one.
inline int running_type(const JobView& v) { return v.workers > 0 ? v.device_type : -1; }

// Jobs lie far apart in memory: fetching the job this many places ahead of the one being
// read hides most of the wait for it in a large simulation.
constexpr size_t kFetchAhead = 8;

// For a visit of `active` in `order` (priority order, out of memory order), at place k.
inline void fetch_ahead(const std::vector<JobView>& active, const std::vector<size_t>& order,
                        size_t k) {
  if (k + kFetchAhead < order.size()) __builtin_prefetch(active[order[k + kFetchAhead]].job);
}

// The water fill's breakpoints, in pair order, where at most this many distinct levels hold
// them all (jobs of a few weights and bounds): counted into one bucket per level instead of
// sorted.
constexpr size_t kFewLevels = 16;

Allocation to_allocation(const std::vector<JobView>& active, const std::vector<int>& types,
                         const std::vector<int>& workers);

// The devices of each type.
std::vector<int> device_counts(const Cluster& cluster);

// `events`: the starts of jobs 0..n-1, then their stops in descending job order. Puts them in
// pair order (level, then id: at one level the stops, then the starts, each as they lie in
// `events`) into `out` without a sort, or returns false where the levels are more than
// kFewLevels. `slot`: scratch.
bool order_few_levels(const std::vector<std::pair<double, long>>& events, size_t n,
                      std::vector<uint8_t>& slot, std::vector<std::pair<double, long>>& out);

// weighted_water_fill with its buffers kept from one fill to the next.
class WaterFill {
 public:
  // The shares, valid until the next call.
  const std::vector<int>& fill(const std::vector<double>& weights, const std::vector<int>& lo,
                               const std::vector<int>& hi, int capacity) {
    const size_t n = weights.size();
    if (lo.size() != n || hi.size() != n) throw InternalError("water fill: size mismatch");
    long lo_sum = 0, hi_sum = 0;
    for (size_t i = 0; i < n; ++i) {
      if (!(weights[i] > 0) || lo[i] < 0 || lo[i] > hi[i]) {
        throw InternalError(
            fmt::format("water fill: bad job {} (w {}, [{}, {}])", i, weights[i], lo[i], hi[i]));
      }
      lo_sum += lo[i];
      hi_sum += hi[i];
    }
    if (lo_sum > capacity) throw InternalError("water fill: minimums exceed capacity");
    if (hi_sum <= capacity) return shares_ = hi;
    // f(l) = sum clamp(l * w_i, lo_i, hi_i) is piecewise linear in l; sweep its breakpoints
    // (l, +i+1 when job i starts growing | -(i+1) when it stops), in pair order. Starts are
    // made in ascending i and stops in descending i, so a stable sort by l alone gives that
    // order (a few distinct l among many jobs send std::sort into its heapsort); callers
    // pass jobs in priority order, which often leaves the starts sorted already. Where the
    // levels are few, they are counted into buckets instead (order_few_levels), the same
    // order.
    events_.resize(2 * n);
    for (size_t i = 0; i < n; ++i) {
      events_[i] = {lo[i] / weights[i], static_cast<long>(i) + 1};
      events_[2 * n - 1 - i] = {hi[i] / weights[i], -static_cast<long>(i) - 1};
    }
    const bool few = order_few_levels(events_, n, slot_, ordered_);
    if (!few) {
      const auto by_level = [](const auto& a, const auto& b) { return a.first < b.first; };
      const auto stops = events_.begin() + static_cast<std::ptrdiff_t>(n);
      if (!std::is_sorted(events_.begin(), stops, by_level)) {
        std::stable_sort(events_.begin(), stops, by_level);
      }
      std::stable_sort(stops, events_.end(), by_level);
      std::inplace_merge(events_.begin(), stops, events_.end());
    }
    double level = 0, value = static_cast<double>(lo_sum), slope = 0;
    for (const auto& [at, id] : few ? ordered_ : events_) {
      const double next = value + slope * (at - level);
      if (next >= capacity && slope > 0) break;
      value = next;
      level = at;
      const size_t i = static_cast<size_t>(std::labs(id) - 1);
      slope += id > 0 ? weights[i] : -weights[i];
    }
    if (slope > 0) level += (capacity - value) / slope;
    std::vector<int>& shares = shares_;
    shares.resize(n);
    remainder_.resize(n);
    int left = capacity;
    for (size_t i = 0; i < n; ++i) {
      const double x = std::clamp(level * weights[i], double(lo[i]), double(hi[i]));
      shares[i] = std::clamp(static_cast<int>(std::floor(x + 1e-9)), lo[i], hi[i]);
      remainder_[i] = x - shares[i];
      left -= shares[i];
    }
    // One more worker each for the `left` jobs below their bound with the largest
    // remainders, ties to the lower index: a selection, not a sort.
    std::vector<size_t>& below = below_;
    below.clear();
    for (size_t i = 0; i < n; ++i) {
      if (shares[i] < hi[i]) below.push_back(i);
    }
    const auto first = [&](size_t a, size_t b) {
      return remainder_[a] != remainder_[b] ? remainder_[a] > remainder_[b] : a < b;
    };
    const size_t more = std::min(below.size(), static_cast<size_t>(std::max(left, 0)));
    std::nth_element(below.begin(), below.begin() + more, below.end(), first);
    for (size_t k = 0; k < more; ++k) ++shares[below[k]];
    return shares;
  }

 private:
  std::vector<std::pair<double, long>> events_, ordered_;
  std::vector<uint8_t> slot_;
  std::vector<double> remainder_;
  std::vector<size_t> below_;
  std::vector<int> shares_;
};

// Sorts active jobs by (priority key, id), starting from the order of its previous call: a
// simulation at scale ranks thousands of active jobs at every decision, and from one
// decision to the next few of them change places. The jobs still active keep their last
// order and are insertion-sorted (few moves), the new ones are sorted apart and merged in;
// past 8 moves a job it sorts afresh. (key, id) is a strict order, so the result is the
// same as a plain sort's.
class Ranking {
 public:
  // The order, valid until the next call.
  const std::vector<size_t>& order(Priority priority, const std::vector<JobView>& active,
                                   const PolicyOptions& options) {
    fresh_.resize(active.size());
    for (size_t i = 0; i < active.size(); ++i) {  // in id order, each job read once
      if (i + kFetchAhead < active.size()) __builtin_prefetch(active[i + kFetchAhead].job);
      const int id = active[i].job->id;
      fresh_[i] = {priority_key(priority, active[i], options), id, static_cast<uint32_t>(i)};
      if (static_cast<size_t>(id) >= index_of_.size()) index_of_.resize(id + 1, -1);
      index_of_[id] = static_cast<int>(i);
    }
    const size_t n = active.size();
    ranks_.resize(n);
    taken_.assign(n, 0);
    size_t kept = 0;
    for (int id : last_) {  // still active, in their last order
      if (int& i = index_of_[id]; i >= 0) ranks_[kept++] = fresh_[i], taken_[i] = 1, i = -1;
    }
    for (size_t i = 0, k = kept; i < n; ++i) {  // new since the last call
      if (!taken_[i]) ranks_[k++] = fresh_[i], index_of_[fresh_[i].id] = -1;
    }
    const auto middle = ranks_.begin() + static_cast<std::ptrdiff_t>(kept);
    if (!insertion_sort(ranks_.begin(), middle, 8 * n + 16))
      std::sort(ranks_.begin(), middle, less);
    std::sort(middle, ranks_.end(), less);
    last_.resize(n);
    out_.resize(n);
    size_t a = 0, b = kept, k = 0;  // merge the two into the order
    const auto put = [&](const Rank& r) { last_[k] = r.id, out_[k++] = r.index; };
    while (a < kept && b < n) put(less(ranks_[b], ranks_[a]) ? ranks_[b++] : ranks_[a++]);
    while (a < kept) put(ranks_[a++]);
    while (b < n) put(ranks_[b++]);
    return out_;
  }

 private:
  struct Rank {
    double key;
    int id;
    uint32_t index;
  };
  static bool less(const Rank& a, const Rank& b) {
    return a.key != b.key ? a.key < b.key : a.id < b.id;
  }
  // false, range left partly sorted, once more than `budget` elements have been moved.
  template <typename It>
  static bool insertion_sort(It first, It last, size_t budget) {
    for (It i = first; i != last; ++i) {
      const Rank r = *i;
      It j = i;
      for (; j != first && less(r, *(j - 1)); --j) {  // *j is the hole
        if (budget-- == 0) {
          *j = r;  // every element stays in the range
          return false;
        }
        *j = *(j - 1);
      }
      *j = r;
    }
    return true;
  }

  std::vector<Rank> fresh_;     // this call's ranks by index, then merged in order
  std::vector<Rank> ranks_;     // kept ones in their last order, then the new ones
  std::vector<int> last_;       // job ids in the last order
  std::vector<int> index_of_;   // job id -> index into `active` during a call, else -1
  std::vector<size_t> out_;     // the order returned
  std::vector<uint8_t> taken_;  // per index into `active`: 1 where kept from the last order
};

// Non-elastic placement in the given order: each job runs at exactly its demand on one type
// or waits. Running jobs stay on their type when it has room. `keep_running`: running jobs
// are placed first and never preempted. `strict`: stop at the first job that does not fit
// (no backfilling).
Allocation place_at_demand(const Cluster& cluster, const std::vector<JobView>& active,
                           const std::vector<size_t>& order, bool keep_running, bool strict);

std::unique_ptr<Policy> make_non_elastic_policy(std::string name, Priority priority,
                                                bool preemptive, bool strict, double round_s,
                                                PolicyOptions options);
std::unique_ptr<Policy> make_gavel_policy(double round_s);
std::unique_ptr<Policy> make_elastic_wfs_policy(std::string name, Priority priority,
                                                PolicyOptions options);
std::unique_ptr<Policy> make_marginal_policy(const PolicyOptions& options);
std::unique_ptr<Policy> make_spanning_policy(const PolicyOptions& options);

}  // namespace vflow::scheduler::detail
