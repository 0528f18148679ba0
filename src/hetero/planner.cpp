#include "vflow/hetero/planner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "vflow/core/error.h"

namespace vflow::hetero {

namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

/// What one vnode costs on one device type, for the request's vnode size.
struct TypeCost {
  std::string type;
  int64_t count = 0;
  double per_vnode = 0;
  double optimizer = 0;
  double allreduce = 0;  // between two workers of this type
  int64_t gradient_bytes = 0;
  bool fits = true;   // a vnode's peak memory is within the type's cap
  double spread = 0;  // relative standard deviation of a worker's compute
};

/// When the last worker of a step finishes. Each worker takes its optimizer step and
/// vnodes, `mean` seconds, give or take `sd` (its compute's measured spread, step to
/// step); the step waits for the last. Without spread that is the slowest mean. With it,
/// the expected maximum of independent normal times, by Clark's approximation (C. E.
/// Clark, "The greatest of a finite set of random variables", Operations Research 9(2),
/// 1961): the maximum of two has an exact mean and variance and is taken as normal in
/// turn, for the next worker. Two balanced workers of spread sd wait sd / sqrt(pi) longer
/// than either alone; a worker far faster than the slowest adds nothing.
class Finish {
 public:
  void add(double mean, double sd) {
    const double var = sd * sd;
    if (!any_) {
      mean_ = mean;
      var_ = var;
      any_ = true;
      return;
    }
    const double both = var_ + var;
    if (both <= 0) {
      mean_ = std::max(mean_, mean);
      return;
    }
    const double a = std::sqrt(both);
    const double alpha = (mean_ - mean) / a;
    const double first_later = 0.5 * std::erfc(-alpha / std::sqrt(2.0));  // Phi(alpha)
    const double second_later = 0.5 * std::erfc(alpha / std::sqrt(2.0));  // Phi(-alpha)
    const double density = std::exp(-0.5 * alpha * alpha) / std::sqrt(2.0 * M_PI);
    const double m = mean_ * first_later + mean * second_later + a * density;
    const double square = (mean_ * mean_ + var_) * first_later +
                          (mean * mean + var) * second_later + (mean_ + mean) * a * density;
    mean_ = m;
    var_ = std::max(0.0, square - m * m);
  }
  double seconds() const { return mean_; }

 private:
  double mean_ = 0;
  double var_ = 0;
  bool any_ = false;
};

/// The workers taking part in one step, as their allreduce sees them.
class Group {
 public:
  void add(const std::string& type, double pair_seconds, int64_t gradient_bytes) {
    if (participants_ == 0) first_type_ = type;
    mixed_ = mixed_ || type != first_type_;
    pair_ = std::max(pair_, pair_seconds);
    gradient_bytes_ = std::max(gradient_bytes_, gradient_bytes);
    ++participants_;
  }
  double allreduce(double link_bandwidth) const {
    return allreduce_seconds(pair_, participants_, mixed_, gradient_bytes_, link_bandwidth);
  }

 private:
  std::string first_type_;
  double pair_ = 0;
  int64_t gradient_bytes_ = 0;
  int64_t participants_ = 0;
  bool mixed_ = false;
};

const DeviceProfile& profile_for(const PlanRequest& r, const std::string& type) {
  const auto it = r.profiles.find(type);
  if (it == r.profiles.end()) {
    throw SpecError(
        fmt::format("no profile for device type '{}'; run vflow-profile on it first", type));
  }
  return it->second;
}

/// The checks both modes share: devices listed, a profile for each type, measured with
/// this model.
void check_profiles(const PlanRequest& r) {
  if (r.inventory.empty()) throw SpecError("the inventory lists no devices");
  for (const auto& g : r.inventory) {
    const auto& p = profile_for(r, g.device_type);
    if (!r.model.empty() && p.model != r.model) {
      throw SpecError(fmt::format(
          "the profile of '{}' was measured with model {} but this job's model is {}; profile "
          "this model",
          g.device_type, p.model.empty() ? "(unknown)" : p.model, r.model));
    }
    if (g.count < 1)
      throw SpecError(fmt::format("device type '{}' has count {}", g.device_type, g.count));
    if (r.link_bandwidth > 0 && p.gradient_bytes <= 0) {
      throw SpecError(fmt::format(
          "the profile of '{}' does not record gradient_bytes, which the link bandwidth "
          "between device types needs; profile again or add it",
          g.device_type));
    }
  }
  if (r.link_bandwidth < 0) {
    throw SpecError(fmt::format("link bandwidth {} must be positive", r.link_bandwidth));
  }
}

std::vector<TypeCost> type_costs(const PlanRequest& r) {
  if (r.global_batch <= 0 || r.virtual_nodes <= 0 || r.global_batch % r.virtual_nodes != 0) {
    throw SpecError(
        fmt::format("global batch {} must be a positive multiple of the {} virtual nodes",
                    r.global_batch, r.virtual_nodes));
  }
  check_profiles(r);
  const int64_t size = r.global_batch / r.virtual_nodes;
  std::vector<TypeCost> costs;
  for (const auto& g : r.inventory) {
    const auto& p = r.profiles.at(g.device_type);
    TypeCost c{
        g.device_type,    g.count, p.vnode_seconds(size), p.optimizer_seconds, p.allreduce_seconds,
        p.gradient_bytes, true};
    c.fits = g.memory_cap_bytes == 0 || p.vnode_peak_bytes(size) <= g.memory_cap_bytes;
    c.spread = p.vnode_spread(size);
    costs.push_back(c);
  }
  return costs;
}

const TypeCost& cost_of(const std::vector<TypeCost>& costs, const std::string& type) {
  for (const auto& c : costs) {
    if (c.type == type) return c;
  }
  throw SpecError(fmt::format("device type '{}' is not in the inventory", type));
}

double predict(const std::vector<TypeCost>& costs, const std::vector<WorkerShare>& shares,
               double link_bandwidth) {
  Finish finish;
  Group group;
  for (const auto& s : shares) {
    if (s.vnodes == 0) continue;
    const auto& c = cost_of(costs, s.device_type);
    if (!c.fits) return kInfinity;
    const double compute = static_cast<double>(s.vnodes) * c.per_vnode;
    finish.add(c.optimizer + compute, c.spread * compute);
    group.add(c.type, c.allreduce, c.gradient_bytes);
  }
  return finish.seconds() + group.allreduce(link_bandwidth);
}

/// Vnodes one worker of type `c` finishes within `target` seconds (at most `n`).
int64_t capacity(const TypeCost& c, double target, int64_t n) {
  if (target < c.optimizer + c.per_vnode) return 0;
  if (c.per_vnode <= 0) return n;
  const double k = std::floor((target - c.optimizer) / c.per_vnode * (1 + 1e-12));
  return static_cast<int64_t>(std::min<double>(static_cast<double>(n), k));
}

/// Fills workers of the chosen types up to their capacity at `target`, the types that
/// hold the most vnodes first, so that as few workers as possible take part; returns an
/// empty list when they cannot hold all `n` vnodes.
std::vector<WorkerShare> fill(std::vector<const TypeCost*> types, double target, int64_t n) {
  std::vector<int64_t> caps;
  for (const TypeCost* c : types) caps.push_back(capacity(*c, target, n));
  std::vector<size_t> order(types.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return caps[a] > caps[b] || (caps[a] == caps[b] && types[a]->per_vnode < types[b]->per_vnode);
  });
  std::vector<WorkerShare> shares;
  int64_t left = n;
  for (const size_t i : order) {
    for (int64_t d = 0; d < types[i]->count && left > 0 && caps[i] > 0; ++d) {
      const int64_t take = std::min(caps[i], left);
      shares.push_back({types[i]->type, take});
      left -= take;
    }
  }
  if (left > 0) shares.clear();
  return shares;
}

/// Index of the first of the ascending `candidates` at which `feasible` holds (it is
/// monotone in the target), or candidates.size() when none does.
template <typename Feasible>
size_t first_feasible(const std::vector<double>& candidates, Feasible feasible) {
  if (candidates.empty() || !feasible(candidates.back())) return candidates.size();
  size_t lo = 0, hi = candidates.size() - 1;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (feasible(candidates[mid])) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

/// The best step workers of `types` reach together. The smallest feasible time is found
/// by binary search over the times at which some worker finishes its k-th vnode; later
/// times need fewer workers and so may allreduce faster, so each one up to the best
/// step found so far is tried as well (no plan whose slowest worker takes longer can
/// beat that step).
std::vector<WorkerShare> best_within(const std::vector<const TypeCost*>& types, int64_t n,
                                     const std::vector<TypeCost>& costs, double link_bandwidth) {
  std::vector<double> candidates;
  for (const TypeCost* c : types) {
    for (int64_t k = 1; k <= n; ++k) {
      candidates.push_back(c->optimizer + static_cast<double>(k) * c->per_vnode);
    }
  }
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  std::vector<WorkerShare> best;
  double best_seconds = kInfinity;
  for (size_t i = first_feasible(candidates, [&](double t) { return !fill(types, t, n).empty(); });
       i < candidates.size() && candidates[i] < best_seconds; ++i) {
    auto shares = fill(types, candidates[i], n);
    const double t = predict(costs, shares, link_bandwidth);
    if (t < best_seconds) {
      best = std::move(shares);
      best_seconds = t;
    }
  }
  return best;
}

/// `n` vnodes spread over `workers` devices as evenly as possible, in order.
std::vector<WorkerShare> spread(const std::vector<std::string>& workers, int64_t n) {
  std::vector<WorkerShare> shares;
  const auto k = static_cast<int64_t>(workers.size());
  for (int64_t w = 0; w < k; ++w) shares.push_back({workers[w], n / k + (w < n % k ? 1 : 0)});
  return shares;
}

}  // namespace

std::vector<std::string> expand_inventory(const std::vector<DeviceGroup>& inventory) {
  std::vector<std::string> workers;
  for (const auto& g : inventory) {
    for (int64_t d = 0; d < g.count; ++d) workers.push_back(g.device_type);
  }
  return workers;
}

double allreduce_seconds(double pair_seconds, int64_t participants, bool mixed,
                         int64_t gradient_bytes, double link_bandwidth) {
  if (participants < 2) return 0;
  const double share =
      2.0 * static_cast<double>(participants - 1) / static_cast<double>(participants);
  double seconds = pair_seconds * share;
  if (mixed && link_bandwidth > 0) {
    seconds = std::max(seconds, share * static_cast<double>(gradient_bytes) / link_bandwidth);
  }
  return seconds;
}

double predict_step_seconds(const PlanRequest& request, const std::vector<WorkerShare>& shares) {
  return predict(type_costs(request), shares, request.link_bandwidth);
}

Plan plan_exact(const PlanRequest& request) {
  const auto costs = type_costs(request);
  std::vector<const TypeCost*> usable;
  for (const auto& c : costs) {
    if (c.fits) usable.push_back(&c);
  }
  if (usable.empty()) {
    throw SpecError(fmt::format(
        "no device type can hold a vnode of {} examples within its memory cap; use more "
        "virtual nodes (smaller vnodes) or raise the caps",
        request.global_batch / request.virtual_nodes));
  }
  const int64_t n = request.virtual_nodes;
  Plan best;
  best.predicted_step_seconds = kInfinity;
  auto consider = [&](std::vector<WorkerShare> shares) {
    if (shares.empty()) return;
    const double t = predict(costs, shares, request.link_bandwidth);
    if (t < best.predicted_step_seconds) {
      best.workers = std::move(shares);
      best.predicted_step_seconds = t;
    }
  };
  // Every subset of types: the allreduce cost depends on which types take part.
  const size_t subsets = size_t{1} << usable.size();
  for (size_t mask = 1; mask < subsets; ++mask) {
    std::vector<const TypeCost*> chosen;
    for (size_t i = 0; i < usable.size(); ++i) {
      if (mask & (size_t{1} << i)) chosen.push_back(usable[i]);
    }
    consider(best_within(chosen, n, costs, request.link_bandwidth));
    // One worker alone needs no allreduce at all.
    for (const TypeCost* c : chosen) consider({{c->type, n}});
  }
  return best;
}

Baselines baselines(const PlanRequest& request) {
  const auto costs = type_costs(request);
  const int64_t n = request.virtual_nodes;
  Baselines b;
  auto workers = expand_inventory(request.inventory);
  if (static_cast<int64_t>(workers.size()) > n) workers.resize(static_cast<size_t>(n));
  const double link = request.link_bandwidth;
  b.even_split = predict(costs, spread(workers, n), link);

  // Proportional to single-device throughput, rounded by largest remainder.
  std::vector<double> speed;
  for (const auto& w : workers) speed.push_back(1.0 / cost_of(costs, w).per_vnode);
  const double total = std::accumulate(speed.begin(), speed.end(), 0.0);
  std::vector<WorkerShare> shares;
  std::vector<std::pair<double, size_t>> remainders;
  int64_t given = 0;
  for (size_t i = 0; i < workers.size(); ++i) {
    const double exact = static_cast<double>(n) * speed[i] / total;
    shares.push_back({workers[i], static_cast<int64_t>(std::floor(exact))});
    given += shares.back().vnodes;
    remainders.emplace_back(-(exact - std::floor(exact)), i);
  }
  std::sort(remainders.begin(), remainders.end());
  for (size_t i = 0; given < n; ++i, ++given) ++shares[remainders[i].second].vnodes;
  b.proportional = predict(costs, shares, link);

  b.fastest_type_alone = kInfinity;
  for (const auto& c : costs) {
    const std::vector<std::string> own(static_cast<size_t>(std::min(c.count, n)), c.type);
    const double t = predict(costs, spread(own, n), link);
    if (t < b.fastest_type_alone) {
      b.fastest_type_alone = t;
      b.fastest_type = c.type;
    }
  }
  return b;
}

// ---- relaxed mode ---------------------------------------------------------

namespace {

/// One device type with a chosen vnode size.
struct SizedType {
  std::string type;
  int64_t count = 0;
  int64_t size = 0;
  double per_vnode = 0;
  double optimizer = 0;
};

/// Vnodes one worker finishes within `target`.
int64_t relaxed_capacity(const SizedType& t, double target, int64_t most) {
  if (target < t.optimizer + t.per_vnode) return 0;
  const double k = std::floor((target - t.optimizer) / t.per_vnode * (1 + 1e-12));
  return static_cast<int64_t>(std::min<double>(static_cast<double>(most), k));
}

/// The per-type vnode totals a knapsack over 0..b chose: walking back from b, where
/// took[t][sum / unit] is how many vnodes type t added to reach `sum`.
std::vector<int64_t> walk_back(const std::vector<SizedType>& types,
                               const std::vector<std::vector<int64_t>>& took, int64_t b,
                               int64_t unit = 1) {
  std::vector<int64_t> totals(types.size(), 0);
  int64_t sum = b;
  for (size_t t = types.size(); t-- > 0;) {
    totals[t] = took[t][static_cast<size_t>(sum / unit)];
    sum -= totals[t] * types[t].size;
  }
  return totals;
}

/// Vnode totals K_t (each at most `most[t]`) with sum_t K_t · size_t == b, or empty when
/// none exists: a bounded subset-sum over 0..b, with the coins each sum used kept for
/// reconstruction.
std::vector<int64_t> exact_totals(const std::vector<SizedType>& types,
                                  const std::vector<int64_t>& most, int64_t b) {
  const auto width = static_cast<size_t>(b + 1);
  std::vector<std::vector<int64_t>> used(types.size(), std::vector<int64_t>(width, -1));
  std::vector<bool> reach(width, false);
  reach[0] = true;
  for (size_t t = 0; t < types.size(); ++t) {
    const int64_t size = types[t].size;
    std::vector<bool> next(width, false);
    for (int64_t sum = 0; sum <= b; ++sum) {
      const auto i = static_cast<size_t>(sum);
      if (reach[i]) {
        next[i] = true;
        used[t][i] = 0;
      } else if (sum >= size && next[i - static_cast<size_t>(size)] &&
                 used[t][i - static_cast<size_t>(size)] < most[t]) {
        next[i] = true;
        used[t][i] = used[t][i - static_cast<size_t>(size)] + 1;
      }
    }
    reach.swap(next);
  }
  if (!reach[static_cast<size_t>(b)]) return {};
  return walk_back(types, used, b);
}

/// Of the vnode totals K_t with sum_t K_t · size_t == b, the one that needs the fewest
/// workers when a worker of type t holds at most caps[t] vnodes (and type t has `count`
/// workers), or empty when none exists: a knapsack over the sums 0..b in steps of the
/// sizes' greatest common divisor, counting workers. Adds the knapsack's steps to `work`.
std::vector<int64_t> fewest_workers_totals(const std::vector<SizedType>& types,
                                           const std::vector<int64_t>& caps, int64_t b,
                                           int64_t& work) {
  int64_t unit = b;
  for (const auto& t : types) unit = std::gcd(unit, t.size);
  if (unit <= 0 || b % unit != 0) return {};
  const int64_t units = b / unit;
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  const auto width = static_cast<size_t>(units + 1);
  std::vector<int64_t> workers(width, kNone);
  workers[0] = 0;
  std::vector<std::vector<int64_t>> took(types.size(), std::vector<int64_t>(width, 0));
  for (size_t t = 0; t < types.size(); ++t) {
    const int64_t step = types[t].size / unit, cap = caps[t];
    const int64_t most = cap > 0 ? std::min(types[t].count * cap, units / step) : 0;
    std::vector<int64_t> next(width, kNone);
    for (int64_t from = 0; from <= units; ++from) {
      const int64_t before = workers[static_cast<size_t>(from)];
      if (before == kNone) continue;
      for (int64_t k = 0; k <= most && from + k * step <= units; ++k) {
        const auto sum = static_cast<size_t>(from + k * step);
        const int64_t cost = before + (k + cap - 1) / std::max<int64_t>(cap, 1);
        if (cost < next[sum]) {
          next[sum] = cost;
          took[t][sum] = k;
        }
        ++work;
      }
    }
    workers.swap(next);
  }
  if (workers[static_cast<size_t>(units)] == kNone) return {};
  return walk_back(types, took, b, unit);
}

/// Knapsack steps one size choice may spend on times after its smallest feasible one (a
/// fraction of a second): beyond them, the plan is the best found so far.
constexpr int64_t kScanWork = 4'000'000;

/// The best assignment for fixed per-type sizes, all of `types` allowed to take part: the
/// smallest feasible time by binary search (feasibility an exact subset-sum), then, as in
/// exact mode, each later time up to the best step so far with the fewest workers, within
/// kScanWork.
std::vector<RelaxedShare> best_sized(const PlanRequest& request,
                                     const std::vector<SizedType>& types) {
  const int64_t b = request.global_batch;
  std::vector<double> candidates;
  for (const auto& t : types) {
    for (int64_t k = 1; k * t.size <= b; ++k) {
      candidates.push_back(t.optimizer + static_cast<double>(k) * t.per_vnode);
    }
  }
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  auto caps_at = [&](double target) {
    std::vector<int64_t> caps;
    for (const auto& t : types) caps.push_back(relaxed_capacity(t, target, b / t.size));
    return caps;
  };
  auto feasible = [&](double target) {
    const auto caps = caps_at(target);
    std::vector<int64_t> most;
    for (size_t t = 0; t < types.size(); ++t) most.push_back(types[t].count * caps[t]);
    return !exact_totals(types, most, b).empty();
  };
  std::vector<RelaxedShare> best;
  double best_seconds = kInfinity;
  int64_t work = 0;  // knapsack steps so far; later times are tried within kScanWork
  for (size_t i = first_feasible(candidates, feasible);
       i < candidates.size() && candidates[i] < best_seconds && (best.empty() || work < kScanWork);
       ++i) {
    const auto caps = caps_at(candidates[i]);
    const auto totals = fewest_workers_totals(types, caps, b, work);
    std::vector<RelaxedShare> shares;
    for (size_t t = 0; t < types.size(); ++t) {
      if (totals[t] == 0) continue;
      // Spread evenly over the fewest workers that hold K: ceil(K / used) <= the capacity.
      const int64_t used = (totals[t] + caps[t] - 1) / caps[t];
      for (int64_t d = 0; d < used; ++d) {
        shares.push_back(
            {types[t].type, totals[t] / used + (d < totals[t] % used ? 1 : 0), types[t].size});
      }
    }
    const double seconds = predict_relaxed_seconds(request, shares);
    if (seconds < best_seconds) {
      best = std::move(shares);
      best_seconds = seconds;
    }
  }
  return best;
}

}  // namespace

std::vector<int64_t> candidate_sizes(const PlanRequest& request, const DeviceGroup& group) {
  const auto& p = profile_for(request, group.device_type);
  std::vector<int64_t> sizes;
  for (const auto& point : p.points) sizes.push_back(point.vnode_size);
  if (request.virtual_nodes > 0 && request.global_batch % request.virtual_nodes == 0) {
    sizes.push_back(request.global_batch / request.virtual_nodes);
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  std::vector<int64_t> out;
  for (const int64_t size : sizes) {
    if (size < 1 || size > request.global_batch || p.points.empty() ||
        size > p.points.back().vnode_size) {
      continue;
    }
    if (group.memory_cap_bytes > 0 && p.vnode_peak_bytes(size) > group.memory_cap_bytes) continue;
    out.push_back(size);
  }
  return out;
}

double predict_relaxed_seconds(const PlanRequest& request,
                               const std::vector<RelaxedShare>& shares) {
  Finish finish;
  Group group;
  for (const auto& s : shares) {
    if (s.vnodes == 0) continue;
    const auto& p = profile_for(request, s.device_type);
    const double compute = static_cast<double>(s.vnodes) * p.vnode_seconds(s.vnode_size);
    finish.add(p.optimizer_seconds + compute, p.vnode_spread(s.vnode_size) * compute);
    group.add(s.device_type, p.allreduce_seconds, p.gradient_bytes);
  }
  return finish.seconds() + group.allreduce(request.link_bandwidth);
}

RelaxedPlan plan_relaxed(const PlanRequest& request) {
  check_profiles(request);
  const int64_t b = request.global_batch;
  if (b <= 0) throw SpecError(fmt::format("global batch {} must be positive", b));
  std::vector<std::pair<const DeviceGroup*, std::vector<int64_t>>> options;
  for (const auto& g : request.inventory) {
    auto sizes = candidate_sizes(request, g);
    if (!sizes.empty()) options.emplace_back(&g, std::move(sizes));
  }
  if (options.empty()) {
    throw SpecError(
        "no device type can hold any profiled vnode size within its memory cap; "
        "profile smaller vnode sizes or raise the caps");
  }
  RelaxedPlan best;
  best.predicted_step_seconds = kInfinity;
  auto consider = [&](std::vector<RelaxedShare> shares) {
    if (shares.empty()) return;
    const double t = predict_relaxed_seconds(request, shares);
    if (t < best.predicted_step_seconds) {
      best.workers = std::move(shares);
      best.predicted_step_seconds = t;
    }
  };
  const size_t subsets = size_t{1} << options.size();
  for (size_t mask = 1; mask < subsets; ++mask) {
    std::vector<size_t> chosen;
    for (size_t i = 0; i < options.size(); ++i) {
      if (mask & (size_t{1} << i)) chosen.push_back(i);
    }
    // Every combination of one candidate size per chosen type (an odometer).
    std::vector<size_t> pick(chosen.size(), 0);
    while (true) {
      std::vector<SizedType> types;
      for (size_t j = 0; j < chosen.size(); ++j) {
        const auto& [group, sizes] = options[chosen[j]];
        const auto& p = request.profiles.at(group->device_type);
        const int64_t size = sizes[pick[j]];
        types.push_back(
            {group->device_type, group->count, size, p.vnode_seconds(size), p.optimizer_seconds});
        if (b % size == 0) consider({{group->device_type, b / size, size}});  // alone
      }
      consider(best_sized(request, types));
      size_t j = 0;
      while (j < pick.size() && ++pick[j] == options[chosen[j]].second.size()) pick[j++] = 0;
      if (j == pick.size()) break;
    }
  }
  if (best.workers.empty()) {
    throw SpecError(fmt::format(
        "no combination of the profiled vnode sizes adds up to the global batch {}; profile "
        "more sizes",
        b));
  }
  return best;
}

std::vector<int64_t> RelaxedPlan::vnode_sizes() const {
  std::vector<int64_t> sizes;
  for (const auto& w : workers)
    sizes.insert(sizes.end(), static_cast<size_t>(w.vnodes), w.vnode_size);
  return sizes;
}

namespace {

/// One line per device type, in order of first appearance, with each worker's share as
/// `share` writes it ("what" names the shares), then the predicted step.
template <typename Share, typename Write>
std::string describe_by_type(const std::vector<Share>& workers, const char* what, Write share,
                             double step_seconds) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<std::string>> by_type;
  for (const auto& w : workers) {
    if (!by_type.count(w.device_type)) order.push_back(w.device_type);
    by_type[w.device_type].push_back(share(w));
  }
  std::string text;
  for (const auto& type : order) {
    text += fmt::format("{}: {} worker(s), {} {}\n", type, by_type[type].size(), what,
                        fmt::join(by_type[type], " "));
  }
  return text + fmt::format("predicted step time {:.4f} s\n", step_seconds);
}

}  // namespace

std::string RelaxedPlan::describe() const {
  return describe_by_type(
      workers, "vnodes x examples",
      [](const RelaxedShare& w) { return fmt::format("{}x{}", w.vnodes, w.vnode_size); },
      predicted_step_seconds);
}

std::string Plan::describe() const {
  return describe_by_type(
      workers, "vnodes", [](const WorkerShare& w) { return std::to_string(w.vnodes); },
      predicted_step_seconds);
}

}  // namespace vflow::hetero

namespace vflow::hetero {

namespace {

/// One layout entry per worker; `sizes[i]` > 0 adds the vnode size to the note.
PlannedLayout layout_of(const PlanRequest& request, const std::vector<std::string>& types,
                        const std::vector<int64_t>& vnodes, const std::vector<int64_t>& sizes) {
  PlannedLayout layout;
  int cuda_workers = 0;
  for (size_t i = 0; i < types.size(); ++i) {
    const auto found = request.profiles.find(types[i]);
    const DeviceProfile* p = found == request.profiles.end() ? nullptr : &found->second;
    LayoutEntry entry;
    entry.vnodes = vnodes[i];
    if (p && p->device == "cuda") {
      entry.device = fmt::format("cuda:{}", cuda_workers++);
    } else if (p && p->device == "cpu") {
      entry.device = "cpu";
    }
    if (p) {
      entry.threads = p->threads;
      entry.cpu_quota = p->cpu_quota;
    }
    layout.entries.push_back(entry);
    layout.notes.push_back(sizes[i] > 0 ? fmt::format("{}, {} examples each", types[i], sizes[i])
                                        : types[i]);
  }
  return layout;
}

}  // namespace

PlannedLayout planned_layout(const PlanRequest& request, const std::vector<WorkerShare>& workers) {
  std::vector<std::string> types;
  std::vector<int64_t> vnodes;
  for (const auto& w : workers) {
    types.push_back(w.device_type);
    vnodes.push_back(w.vnodes);
  }
  return layout_of(request, types, vnodes, std::vector<int64_t>(workers.size(), 0));
}

PlannedLayout planned_layout(const PlanRequest& request, const RelaxedPlan& plan) {
  std::vector<std::string> types;
  std::vector<int64_t> vnodes, sizes;
  for (const auto& w : plan.workers) {
    types.push_back(w.device_type);
    vnodes.push_back(w.vnodes);
    sizes.push_back(w.vnode_size);
  }
  return layout_of(request, types, vnodes, sizes);
}

}  // namespace vflow::hetero
