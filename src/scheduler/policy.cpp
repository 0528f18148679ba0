#include "vflow/scheduler/policy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <queue>
#include <utility>

#include "vflow/core/error.h"

namespace vflow::scheduler {
namespace {

// A type whose per-job estimate beats the job's current type by less than this factor does
// not justify a migration (a checkpoint-restart).
constexpr double kMigrationGain = 1.25;

// What stopping job `v` costs it, as a policy weighs it: nothing where the policy weighs no
// restart (restart_s 0), else the job's measured cost where known, else the estimate.
double restart_cost(const JobView& v, const PolicyOptions& options) {
  if (options.restart_s <= 0) return 0;
  return v.restart_s >= 0 ? v.restart_s : options.restart_s;
}

// Seconds of pause that a grant of `step` workers of type t, from `from`, saves a running job
// (< 0: costs it): giving it back exactly the workers it runs on there saves the pause of
// resizing it; a grant beyond them costs that pause.
double pause_saved(const JobView& v, int t, int from, int step, double pause) {
  if (pause <= 0 || v.workers == 0) return 0;
  const int now = v.counts != nullptr ? v.counts[t] : (v.device_type == t ? v.workers : 0);
  return (from + step == now ? pause : 0) - (from >= now ? pause : 0);
}

double priority_key(Priority priority, const JobView& v, const PolicyOptions& options) {
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

// The device type that `fits` and runs the job fastest by `speed` (ties to the lower type),
// -1 where none fits.
template <typename Fits, typename Speed>
int fastest_type(const Cluster& cluster, const Fits& fits, const Speed& speed) {
  int best = -1;
  double best_speed = 0;
  for (int t = 0; t < cluster.num_types(); ++t) {
    if (!fits(t)) continue;
    const double v = speed(t);
    if (best < 0 || v > best_speed) best = t, best_speed = v;
  }
  return best;
}

// The devices of each type.
std::vector<int> device_counts(const Cluster& cluster) {
  std::vector<int> count(cluster.num_types());
  for (int t = 0; t < cluster.num_types(); ++t) count[t] = cluster.type(t).count;
  return count;
}

// The type a running job runs on, -1 for a waiting one.
int running_type(const JobView& v) { return v.workers > 0 ? v.device_type : -1; }

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

class NonElasticPolicy : public Policy {
 public:
  NonElasticPolicy(std::string name, Priority priority, bool preemptive, bool strict,
                   double round_s, PolicyOptions options)
      : name_(std::move(name)),
        priority_(priority),
        preemptive_(preemptive),
        strict_(strict),
        round_s_(round_s),
        options_(std::move(options)) {}
  std::string name() const override { return name_; }
  bool elastic() const override { return false; }
  double round_s() const override { return round_s_; }
  Allocation allocate(const Cluster& cluster, const std::vector<JobView>& active, double) override {
    return place_at_demand(cluster, active, ranking_.order(priority_, active, options_),
                           !preemptive_, strict_);
  }

 private:
  std::string name_;
  Priority priority_;
  bool preemptive_;
  bool strict_;
  double round_s_;
  PolicyOptions options_;
  Ranking ranking_;
};

// Gavel-style heterogeneity-aware max-min fairness, approximated by Gavel's round-based
// mechanism without its LP: every round, jobs are ranked by the normalized throughput they
// have received so far (steps done / steps an equal time-share of the cluster would have
// given them since arrival), divided by their priority weight, lowest first, and placed at
// their demand on the fastest type with room.
class GavelPolicy : public Policy {
 public:
  explicit GavelPolicy(double round_s) : round_s_(round_s) {}
  std::string name() const override { return "gavel"; }
  bool elastic() const override { return false; }
  double round_s() const override { return round_s_; }
  Allocation allocate(const Cluster& cluster, const std::vector<JobView>& active,
                      double now) override {
    double total_demand = 0;
    for (const auto& v : active) total_demand += v.job->demand;
    const double share = std::min(1.0, cluster.total_devices() / std::max(1.0, total_demand));
    std::vector<double> key(active.size());
    for (size_t i = 0; i < active.size(); ++i) {
      const Job& job = *active[i].job;
      double fair_rate = 0;  // steps/s under an equal time-share of every type
      for (int t = 0; t < cluster.num_types(); ++t) {
        fair_rate += job.rate(t, job.demand) * cluster.type(t).count / cluster.total_devices();
      }
      const double elapsed = now - job.arrival_s;
      const double done = job.total_work - active[i].remaining_work;
      key[i] = elapsed <= 0 ? 0 : done / (elapsed * fair_rate * share) / job.weight;
    }
    std::vector<size_t> order(active.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return key[a] < key[b]; });
    return place_at_demand(cluster, active, order, false, false);
  }

 private:
  double round_s_;
};

// Elastic weighted fair shares (VirtualFlow's WFS): admit jobs in priority order while their
// minimum worker counts fit, put each on the device type where its weighted share would run
// fastest, then water-fill every type among its jobs by weight.
class ElasticWfsPolicy : public Policy {
 public:
  ElasticWfsPolicy(std::string name, Priority priority, PolicyOptions options)
      : name_(std::move(name)), priority_(priority), options_(std::move(options)) {}
  std::string name() const override { return name_; }
  bool elastic() const override { return true; }
  Allocation allocate(const Cluster& cluster, const std::vector<JobView>& active, double) override {
    const std::vector<size_t>& order = ranking_.order(priority_, active, options_);
    std::vector<int> types(active.size(), -1), workers(active.size(), 0);
    const std::vector<Placed>& placed = place(cluster, active, order, types);
    for (int t = 0; t < cluster.num_types(); ++t) {
      const Placed& p = placed[t];
      const auto& shares = water_fill_.fill(p.weight, p.lo, p.hi, cluster.type(t).count);
      for (size_t k = 0; k < p.jobs.size(); ++k) workers[p.jobs[k]] = shares[k];
    }
    return to_allocation(active, types, workers);
  }

 private:
  double share_weight(const JobView& v) const {
    const Job& job = *v.job;
    switch (priority_) {
      case Priority::kSjf:
        return job.weight * job.demand_rate / job.total_work;
      case Priority::kSrtf:
        return job.weight * job.demand_rate / std::max(v.remaining_work, 1e-9 * job.total_work);
      default:
        return job.weight;
    }
  }

  // The jobs placed on one type in priority order, with their share weights and bounds.
  struct Placed {
    std::vector<size_t> jobs;
    std::vector<double> weight;
    std::vector<int> lo, hi;
  };

  // Whether a running job whose own type `own` offers `kept` (its rate there with the
  // migration gain) stays there whatever the other types offer: none reaches `kept` at any
  // count up to its bound. Most running jobs stay, and this needs no guess on the other
  // types, whose divisions chain one job's choice to the next.
  static bool stays(const Job& job, int own, double kept, const std::vector<int>& count) {
    const auto& curves = *job.throughput;
    for (size_t t = 0; t < count.size(); ++t) {
      if (static_cast<int>(t) != own &&
          curves[t].peak(std::min(job.max_workers, count[t])) >= kept) {
        return false;
      }
    }
    return true;
  }

  // Per type, the jobs placed there (valid until the next call). Reads each job once, in
  // priority order.
  const std::vector<Placed>& place(const Cluster& cluster, const std::vector<JobView>& active,
                                   const std::vector<size_t>& order, std::vector<int>& types) {
    const int n_types = cluster.num_types();
    const std::vector<int> count = device_counts(cluster);
    std::vector<int> min_room = count;
    std::vector<double> weight_sum(n_types, 0.0);
    placed_.resize(n_types);
    for (auto& p : placed_) {
      p.jobs.clear();
      p.weight.clear();
      p.lo.clear();
      p.hi.clear();
    }
    for (size_t k = 0; k < order.size(); ++k) {
      fetch_ahead(active, order, k);
      const size_t i = order[k];
      const Job& job = *active[i].job;
      const double w = share_weight(active[i]);
      const auto rate_at_guess = [&](int t) {
        const int guess = std::clamp(static_cast<int>(count[t] * w / (weight_sum[t] + w)),
                                     job.min_workers, std::min(job.max_workers, count[t]));
        return job.rate(t, guess);
      };
      const auto fits = [&](int t) { return min_room[t] >= job.min_workers; };
      const int own = running_type(active[i]);
      const bool may_stay = own >= 0 && fits(own);
      // Its own type's rate with the migration gain, where it has room there.
      const double kept = may_stay ? kMigrationGain * rate_at_guess(own) : 0;
      int best = -1;
      if (may_stay && stays(job, own, kept, count)) {
        best = own;
      } else {
        double best_rate = 0;
        for (int t = 0; t < n_types; ++t) {
          if (!fits(t)) continue;
          const double rate = t == own ? kept : rate_at_guess(t);
          if (best < 0 || rate > best_rate) best = t, best_rate = rate;
        }
      }
      if (best < 0) continue;
      types[i] = best;
      min_room[best] -= job.min_workers;
      weight_sum[best] += w;
      Placed& p = placed_[best];
      p.jobs.push_back(i);
      p.weight.push_back(w);
      p.lo.push_back(job.min_workers);
      p.hi.push_back(std::min(job.max_workers, count[best]));
    }
    return placed_;
  }

  std::string name_;
  Priority priority_;
  PolicyOptions options_;
  Ranking ranking_;
  std::vector<Placed> placed_;  // place()'s, kept between decisions
  WaterFill water_fill_;
};

// Elastic shortest remaining time by marginal gain (the water-filling floor that AFS and
// Pollux build on), for mean JCT, so weights do not count: each job is given a type
// (`place`: who gets its demand in SRTF order, which type by the seconds it saves), then
// every device goes, one at a time, to the job whose completion it
// advances most, counted as the fraction of the job's remaining work one more worker does
// per second. A job's first grant is its minimum worker count at once. With linear scaling
// this is SRTF at up to each job's maximum; with diminishing returns, a device that a long
// job's next worker would barely use goes to the next job. A job left without devices on
// its type then tries the devices left on the others (`place_in_leftovers`).
class MarginalPolicy : public Policy {
 public:
  explicit MarginalPolicy(const PolicyOptions& options = {}) : options_(options) {}
  std::string name() const override { return "marginal"; }
  bool elastic() const override { return true; }
  Allocation allocate(const Cluster& cluster, const std::vector<JobView>& active, double) override {
    std::vector<int> types, workers, free;
    settle(cluster, active, types, workers, free);
    return to_allocation(active, types, workers);
  }

 protected:
  const PolicyOptions& options() const { return options_; }

  // The steps a job has left, never 0: gains are per remaining step.
  static double steps_left(const JobView& v) {
    return std::max(v.remaining_work, 1e-9 * v.job->total_work);
  }

  // The allocation on one type per job: types[i], workers[i] (0: none) for active[i], and the
  // devices left free per type.
  void settle(const Cluster& cluster, const std::vector<JobView>& active, std::vector<int>& types,
              std::vector<int>& workers, std::vector<int>& free) {
    const int n_types = cluster.num_types();
    const std::vector<int> count = device_counts(cluster);
    free = count;
    types.assign(active.size(), -1);
    workers.assign(active.size(), 0);
    // Gain per device of growing job i on type t from `from` workers by `step`: the share of
    // its remaining work that the step adds per second.
    const auto left = [&](size_t i) { return steps_left(active[i]); };
    // The steps over which a grant's gain counts, for a running job on its own type what the
    // grant saves or costs it in pauses, as steps less (or more) left at the grant's rate: its
    // first grant saves the restart that stopping it would cost (SRTF with a switching cost:
    // a job goes first iff its time plus the restart is less than the running one's); the
    // grant that gives it back exactly the workers it runs on saves the pause of shrinking
    // it; a grant beyond them costs the pause of growing it.
    const auto left_of = [&](size_t i, int t, int from, int step, double rate) {
      const JobView& v = active[i];
      if (v.workers == 0 || v.device_type != t) return left(i);
      const double saved = (from == 0 ? restart_cost(v, options_) : 0) +
                           pause_saved(v, t, from, step, options_.resize_pause_s);
      if (saved == 0) return left(i);
      return std::max(left(i) - saved * rate, 1e-9 * v.job->total_work);
    };
    const auto gain = [&](size_t i, int t, int from, int step) {
      const Job& job = *active[i].job;
      const double more = job.rate(t, from + step);
      return (more - job.rate(t, from)) / (left_of(i, t, from, step, more) * step);
    };
    struct Grant {
      double gain;
      size_t job;
      int type, step;
    };
    // Highest gain first; ties to the lower job id (`active` is in id order), then the lower
    // type.
    const auto later = [](const Grant& a, const Grant& b) {
      if (a.gain != b.gain) return a.gain < b.gain;
      return a.job != b.job ? a.job > b.job : a.type > b.type;
    };
    std::vector<Item>& items = items_;
    // Grants devices by gain: each job of `homes` its minimum there first, then one worker
    // at a time to whichever job (these and those already running) gains most. Grants on
    // one type never compete with another's, so each type is settled on its own: where
    // every job's bound fits, each gets it (the order does not matter); where every grant is
    // one worker, by selection (`take_best`); otherwise one grant at a time from a heap.
    // `only`: where not null, the jobs that can compete at all (the others are at their
    // bound or have no type with room), so that the rest need not be read.
    const auto grant = [&](const std::vector<int>& homes, const std::vector<size_t>* only) {
      // Per type, the jobs that compete there and are below their bound; per job, its bound.
      std::vector<std::vector<size_t>>& on = on_;
      on.resize(n_types);
      for (auto& jobs : on) jobs.clear();
      const size_t candidates = only != nullptr ? only->size() : active.size();
      std::vector<int>& bound = bound_;  // read only for the jobs of `on`
      bound.resize(active.size());
      std::vector<long> wanted(n_types, 0);  // per type, the workers its jobs lack
      for (size_t k = 0; k < candidates; ++k) {
        const size_t i = only != nullptr ? (*only)[k] : k;
        const int t = workers[i] > 0 ? types[i] : homes[i];
        if (t < 0) continue;
        bound[i] = std::min(active[i].job->max_workers, count[t]);
        if (workers[i] < bound[i]) on[t].push_back(i), wanted[t] += bound[i] - workers[i];
      }
      // The job's next grant on type t.
      const auto next_of = [&](size_t i, int t) {
        const int step = workers[i] > 0 ? 1 : active[i].job->min_workers;
        return Grant{gain(i, t, workers[i], step), i, t, step};
      };
      // Where every grant on type t is one worker, the grants one at a time from the heap
      // would take: the free[t] first by (level, job), a grant's level being the lowest gain
      // of the job's grants up to it. A job's next grant enters the heap only once the one
      // before it is taken, so a grant that gains more than one before it is taken right
      // after that one, at its level. False where a job's first grant is its minimum > 1.
      const auto take_best = [&](int t, long lacking) {
        items.clear();
        items.reserve(lacking);
        for (size_t i : on[t]) {
          const Job& job = *active[i].job;
          if (workers[i] == 0 && job.min_workers != 1) return false;
          const ThroughputCurve& curve = (*job.throughput)[t];  // job.rate(t, ·)
          double rate = curve.at(workers[i]);
          double level = std::numeric_limits<double>::infinity();
          for (int w = workers[i]; w < bound[i]; ++w) {
            const double more = curve.at(w + 1);
            level = std::min(level, (more - rate) / left_of(i, t, w, 1, more));  // gain(i, t, w, 1)
            items.push_back({level, static_cast<uint32_t>(i)});
            rate = more;
          }
        }
        const auto best_first = [](const Item& a, const Item& b) {  // as `later`, reversed
          return a.level != b.level ? a.level > b.level : a.job < b.job;
        };
        const auto end = items.begin() + free[t];
        std::nth_element(items.begin(), end, items.end(), best_first);
        for (auto it = items.begin(); it != end; ++it) types[it->job] = t, ++workers[it->job];
        free[t] = 0;
        return true;
      };
      std::vector<Grant> offers;
      for (int t = 0; t < n_types; ++t) {
        if (free[t] == 0) continue;  // nothing left to grant there
        if (wanted[t] <= free[t]) {
          for (size_t i : on[t]) {
            free[t] -= bound[i] - workers[i];
            types[i] = t;
            workers[i] = bound[i];
          }
        } else if (!take_best(t, wanted[t])) {
          for (size_t i : on[t]) offers.push_back(next_of(i, t));
        }
      }
      std::priority_queue<Grant, std::vector<Grant>, decltype(later)> grants(later,
                                                                             std::move(offers));
      while (!grants.empty()) {
        Grant g = grants.top();
        grants.pop();
        // The job keeps the devices coming while its next grant still comes first: the
        // same sequence as one grant per pop, with a heap operation per job, not per device.
        while (free[g.type] >= g.step) {  // else no room left there for this grant
          types[g.job] = g.type;
          workers[g.job] += g.step;
          free[g.type] -= g.step;
          if (workers[g.job] == bound[g.job]) break;
          g = next_of(g.job, g.type);
          if (!grants.empty() && later(g, grants.top())) {
            grants.push(g);
            break;
          }
        }
      }
    };
    const std::vector<size_t>& order = ranking_.order(Priority::kSrtf, active, options_);
    grant(place(cluster, active, order), nullptr);
    // A job left out where it was placed tries the devices left on other types. Only those
    // compete then: a type with devices still free has every job on it at its bound (a grant
    // is dropped only where fewer devices are free than its step, which is 1 for a job that
    // runs).
    if (std::any_of(free.begin(), free.end(), [](int f) { return f > 0; })) {
      std::vector<size_t> placed;
      const auto homes = place_in_leftovers(cluster, active, order, workers, free, placed);
      if (!placed.empty()) grant(homes, &placed);
    }
  }

 private:
  // For each job without workers, in SRTF `order`, the type whose free devices would run it
  // fastest (its own type first if it was running), -1 where none has room for its minimum;
  // `placed` gets the jobs given a type.
  static std::vector<int> place_in_leftovers(const Cluster& cluster,
                                             const std::vector<JobView>& active,
                                             const std::vector<size_t>& order,
                                             const std::vector<int>& workers, std::vector<int> free,
                                             std::vector<size_t>& placed) {
    std::vector<int> home(active.size(), -1);
    std::vector<size_t> waiting;  // in `order`: only these are read
    for (size_t i : order) {
      if (workers[i] == 0) waiting.push_back(i);
    }
    int left = std::accumulate(free.begin(), free.end(), 0);
    for (size_t k = 0; k < waiting.size() && left > 0; ++k) {  // minimums are >= 1
      fetch_ahead(active, waiting, k);
      const size_t i = waiting[k];
      const Job& job = *active[i].job;
      const auto fits = [&](int t) { return free[t] >= job.min_workers; };
      const int now = running_type(active[i]);
      const int best = now >= 0 && fits(now) ? now : fastest_type(cluster, fits, [&](int t) {
        return job.rate(t, std::clamp(free[t], job.min_workers, job.demand));
      });
      if (best < 0) continue;
      home[i] = best;
      placed.push_back(i);
      const int taken = std::min(free[best], job.demand);
      free[best] -= taken;
      left -= taken;
    }
    return home;
  }

  // The device type each job competes on, -1 for none. A running job stays where no type
  // would run it kMigrationGain times as fast. The others choose by choose_type: first those
  // that the devices left hold at their demand, taken in SRTF `order`, the one that loses
  // most without its fastest type first, so that a fast type goes to the jobs it saves the
  // most seconds, not to the shortest (for whom it saves the fewest); then the rest, in
  // SRTF order. Which jobs run, and on how many workers, the grants decide.
  std::vector<int> place(const Cluster& cluster, const std::vector<JobView>& active,
                         const std::vector<size_t>& order) const {
    std::vector<int> room = device_counts(cluster), home(active.size(), -1);
    std::vector<size_t> movers;  // in `order`: the jobs that choose a type below
    for (size_t k = 0; k < order.size(); ++k) {
      fetch_ahead(active, order, k);
      const size_t i = order[k];
      const Job& job = *active[i].job;
      const int now = running_type(active[i]);
      // Where no type runs the job kMigrationGain times as fast as its own, it stays (as
      // choose_type would decide, without reading every type's rate).
      const double fastest = active[i].fastest_demand_rate;
      if (now >= 0 && fastest > 0 && fastest < kMigrationGain * job.rate(now, job.demand)) {
        home[i] = now;
        room[now] -= std::min(room[now], job.demand);
      } else {
        movers.push_back(i);
      }
    }
    // The jobs that get their demand, in SRTF order while the devices left hold it (over all
    // types), choose first, those that lose most without their fastest type first: the
    // seconds its fastest type saves a job's remaining work over the next fastest.
    long left = std::accumulate(room.begin(), room.end(), 0L);
    std::vector<std::pair<double, size_t>> first;  // (-seconds saved, job)
    std::vector<size_t> later;                     // in SRTF order
    for (size_t i : movers) {
      const Job& job = *active[i].job;
      if (job.demand > left) {
        later.push_back(i);
        continue;
      }
      left -= job.demand;
      double best = 0, next = 0;
      for (int t = 0; t < cluster.num_types(); ++t) {
        const double r = job.rate(t, job.demand);
        if (r > best) {
          next = best, best = r;
        } else if (r > next) {
          next = r;
        }
      }
      first.emplace_back(next > 0 ? -steps_left(active[i]) * (1 / next - 1 / best) : 0.0, i);
    }
    std::stable_sort(first.begin(), first.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<double> demand_rates(cluster.num_types());
    for (const auto& f : first) choose_type(cluster, active, f.second, room, home, demand_rates);
    for (size_t i : later) choose_type(cluster, active, i, room, home, demand_rates);
    return home;
  }

  // Job i's type (home[i]; none where no type could ever hold its minimum), taking its
  // demand from `room`: the fastest type with room for its demand, where a running job moves
  // only to one kMigrationGain times as fast that saves more than its restart; else the type
  // whose room runs it fastest at its minimum or more; else its fastest type that can hold
  // its minimum at all.
  void choose_type(const Cluster& cluster, const std::vector<JobView>& active, size_t i,
                   std::vector<int>& room, std::vector<int>& home,
                   std::vector<double>& demand_rates) const {
    const Job& job = *active[i].job;
    const int now = running_type(active[i]);
    for (int t = 0; t < cluster.num_types(); ++t) demand_rates[t] = job.rate(t, job.demand);
    const auto at_demand = [&](int t) { return demand_rates[t]; };
    int best = fastest_type(
        cluster, [&](int t) { return room[t] >= job.demand; }, at_demand);
    // Moving pays the restart: it must also save more than that on the remaining work.
    const auto worth_moving = [&](int to) {
      return at_demand(to) >= kMigrationGain * at_demand(now) &&
             steps_left(active[i]) * (1 / at_demand(now) - 1 / at_demand(to)) >
                 restart_cost(active[i], options_);
    };
    if (now >= 0 && (best < 0 || !worth_moving(best))) best = now;
    if (best < 0) {
      best = fastest_type(
          cluster, [&](int t) { return room[t] >= job.min_workers; },
          [&](int t) { return job.rate(t, std::clamp(room[t], job.min_workers, job.demand)); });
    }
    if (best < 0) {
      best = fastest_type(
          cluster, [&](int t) { return job.min_workers <= cluster.type(t).count; }, at_demand);
    }
    if (best < 0) return;
    home[i] = best;
    room[best] -= std::min(room[best], job.demand);
  }

  Ranking ranking_;
  PolicyOptions options_;
  // settle()'s buffers, kept between decisions: the grants' items, per type the jobs that
  // compete there, per job its bound.
  struct Item {  // one worker for `job` at `level`; 16 bytes, for the selection's speed
    double level;
    uint32_t job;
  };
  std::vector<Item> items_;
  std::vector<std::vector<size_t>> on_;
  std::vector<int> bound_;
};

// `marginal`, then jobs may span device types: the devices still free after it (every job
// that could start has started) go, by the same gain (Delta rate per remaining step and
// device), to running jobs below their bound as workers of other types, with the rate of
// the exact-mode split over the types (Job::mixed_rate), whose cross-type synchronisation
// cost makes a slow type's first workers a loss for a job on a fast type. A grant may be
// several workers at once (the first workers of a type can lose what more of them gain).
// Heterogeneity-aware placement as VirtualFlow's extension of Gavel has it, inside one job.
class SpanningPolicy : public MarginalPolicy {
 public:
  using MarginalPolicy::MarginalPolicy;
  std::string name() const override { return "marginal-span"; }
  Allocation allocate(const Cluster& cluster, const std::vector<JobView>& active, double) override {
    std::vector<int> types, workers, free;
    settle(cluster, active, types, workers, free);
    Allocation out = to_allocation(active, types, workers);
    if (std::all_of(free.begin(), free.end(), [](int f) { return f == 0; })) return out;
    const int n_types = cluster.num_types();
    struct Candidate {
      size_t job;
      int room;     // workers it may still gain (all types)
      double rate;  // at its counts
      double left;  // remaining steps
    };
    std::vector<Candidate> cands;
    std::vector<int> counts;  // n_types per candidate
    for (size_t i = 0; i < active.size(); ++i) {
      const Job& job = *active[i].job;
      const int room = std::min(job.max_workers, job.vnodes) - workers[i];
      if (workers[i] == 0 || room <= 0) continue;
      cands.push_back({i, room, job.rate(types[i], workers[i]), steps_left(active[i])});
      counts.resize(counts.size() + n_types, 0);
      counts[counts.size() - n_types + types[i]] = workers[i];
    }
    struct Offer {
      double gain;
      size_t cand;
      int type, step;
      bool operator<(const Offer& o) const {  // the heap's top is the best offer
        if (gain != o.gain) return gain < o.gain;
        if (cand != o.cand) return cand > o.cand;
        return type != o.type ? type > o.type : step > o.step;
      }
    };
    // The candidate's best grant on the free devices, if any gains.
    const auto best_offer = [&](size_t c, Offer& best) {
      const Candidate& k = cands[c];
      const Job& job = *active[k.job].job;
      int* mine = &counts[c * n_types];
      bool found = false;
      for (int u = 0; u < n_types; ++u) {
        if (u == types[k.job]) continue;
        const int held = mine[u];
        for (int step = 1; step <= std::min(free[u], k.room); ++step) {
          mine[u] = held + step;
          const double rate = job.mixed_rate(mine, n_types);
          // Growing the running job pauses it (as in settle's grants).
          const double pause = pause_saved(active[k.job], u, held, step, options().resize_pause_s);
          const double left = std::max(k.left - pause * rate, 1e-9 * job.total_work);
          const double gain = (rate - k.rate) / (left * step);
          const Offer o{gain, c, u, step};
          if (gain > 0 && (!found || best < o)) best = o, found = true;
        }
        mine[u] = held;
      }
      return found;
    };
    std::priority_queue<Offer> offers;
    Offer o{};
    for (size_t c = 0; c < cands.size(); ++c) {
      if (best_offer(c, o)) offers.push(o);
    }
    while (!offers.empty()) {
      const Offer top = offers.top();
      offers.pop();
      Candidate& k = cands[top.cand];
      if (top.step > free[top.type] || top.step > k.room) {  // others took devices since
        if (best_offer(top.cand, o)) offers.push(o);
        continue;
      }
      int* mine = &counts[top.cand * n_types];
      mine[top.type] += top.step;
      free[top.type] -= top.step;
      k.room -= top.step;
      k.rate = active[k.job].job->mixed_rate(mine, n_types);
      if (best_offer(top.cand, o)) offers.push(o);
    }
    for (size_t c = 0; c < cands.size(); ++c) {
      const size_t i = cands[c].job;
      for (int u = 0; u < n_types; ++u) {
        const int n = counts[c * n_types + u];
        if (u != types[i] && n > 0) out.spans.push_back({active[i].job->id, u, n});
      }
    }
    return out;
  }
};

}  // namespace

std::vector<int> weighted_water_fill(const std::vector<double>& weights, const std::vector<int>& lo,
                                     const std::vector<int>& hi, int capacity) {
  return WaterFill().fill(weights, lo, hi, capacity);
}

std::vector<size_t> priority_order(Priority priority, const std::vector<JobView>& active,
                                   const PolicyOptions& options) {
  return Ranking().order(priority, active, options);
}

std::vector<std::string> policy_names() {
  return {"marginal", "marginal-span", "wfs-elastic", "wfs-fifo", "wfs-sjf", "wfs-srtf",
          "fifo",     "priority",      "srtf",        "las",      "gavel"};
}

std::unique_ptr<Policy> make_policy(const std::string& name, const PolicyOptions& given) {
  if (name == "marginal") return std::make_unique<MarginalPolicy>(given);
  if (name == "marginal-span") return std::make_unique<SpanningPolicy>(given);
  PolicyOptions options = given;
  options.restart_s = 0;  // only marginal weighs the restart and the resize pause
  options.resize_pause_s = 0;
  if (name == "wfs-elastic") {
    return std::make_unique<ElasticWfsPolicy>(name, Priority::kWeights, options);
  }
  if (name == "wfs-fifo") return std::make_unique<ElasticWfsPolicy>(name, Priority::kFifo, options);
  if (name == "wfs-sjf") return std::make_unique<ElasticWfsPolicy>(name, Priority::kSjf, options);
  if (name == "wfs-srtf") return std::make_unique<ElasticWfsPolicy>(name, Priority::kSrtf, options);
  if (name == "fifo") {
    return std::make_unique<NonElasticPolicy>(name, Priority::kFifo, false, true, 0, options);
  }
  if (name == "priority") {
    return std::make_unique<NonElasticPolicy>(name, Priority::kWeights, true, false, 0, options);
  }
  if (name == "srtf") {
    return std::make_unique<NonElasticPolicy>(name, Priority::kSrtf, true, false, 0, options);
  }
  if (name == "las") {
    return std::make_unique<NonElasticPolicy>(name, Priority::kLas, true, false,
                                              options.las_round_s, options);
  }
  if (name == "gavel") return std::make_unique<GavelPolicy>(options.gavel_round_s);
  std::string known;
  for (const auto& n : policy_names()) known += (known.empty() ? "" : ", ") + n;
  throw SpecError(fmt::format("unknown policy '{}' (known: {}, all)", name, known));
}

}  // namespace vflow::scheduler
