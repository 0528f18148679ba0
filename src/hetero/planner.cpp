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
  double allreduce = 0;
  bool fits = true;  // a vnode's peak memory is within the type's cap
};

std::vector<TypeCost> type_costs(const PlanRequest& r) {
  if (r.global_batch <= 0 || r.virtual_nodes <= 0 || r.global_batch % r.virtual_nodes != 0) {
    throw Error(fmt::format("global batch {} must be a positive multiple of the {} virtual nodes",
                            r.global_batch, r.virtual_nodes));
  }
  if (r.inventory.empty()) throw Error("the inventory lists no devices");
  const int64_t size = r.global_batch / r.virtual_nodes;
  std::vector<TypeCost> costs;
  for (const auto& g : r.inventory) {
    const auto it = r.profiles.find(g.device_type);
    if (it == r.profiles.end()) {
      throw Error(fmt::format("no profile for device type '{}'; run vflow-profile on it first",
                              g.device_type));
    }
    const auto& p = it->second;
    if (!r.model.empty() && p.model != r.model) {
      throw Error(fmt::format(
          "the profile of '{}' was measured with model {} but this job's model is {}; profile "
          "this model",
          g.device_type, p.model.empty() ? "(unknown)" : p.model, r.model));
    }
    if (g.count < 1)
      throw Error(fmt::format("device type '{}' has count {}", g.device_type, g.count));
    TypeCost c{g.device_type,       g.count, p.vnode_seconds(size), p.optimizer_seconds,
               p.allreduce_seconds, true};
    c.fits = g.memory_cap_bytes == 0 || p.vnode_peak_bytes(size) <= g.memory_cap_bytes;
    costs.push_back(c);
  }
  return costs;
}

const TypeCost& cost_of(const std::vector<TypeCost>& costs, const std::string& type) {
  for (const auto& c : costs) {
    if (c.type == type) return c;
  }
  throw Error(fmt::format("device type '{}' is not in the inventory", type));
}

double predict(const std::vector<TypeCost>& costs, const std::vector<WorkerShare>& shares) {
  double slowest = 0;
  double allreduce = 0;
  int64_t taking_part = 0;
  for (const auto& s : shares) {
    if (s.vnodes == 0) continue;
    const auto& c = cost_of(costs, s.device_type);
    if (!c.fits) return kInfinity;
    slowest = std::max(slowest, c.optimizer + static_cast<double>(s.vnodes) * c.per_vnode);
    allreduce = std::max(allreduce, c.allreduce);
    ++taking_part;
  }
  return slowest + (taking_part > 1 ? allreduce : 0.0);
}

/// Vnodes one worker of type `c` finishes within `target` seconds (at most `n`).
int64_t capacity(const TypeCost& c, double target, int64_t n) {
  if (target < c.optimizer + c.per_vnode) return 0;
  if (c.per_vnode <= 0) return n;
  const double k = std::floor((target - c.optimizer) / c.per_vnode * (1 + 1e-12));
  return static_cast<int64_t>(std::min<double>(static_cast<double>(n), k));
}

/// Fills workers of the chosen types, cheapest vnodes first, up to their capacity at
/// `target`; returns an empty list when they cannot hold all `n` vnodes.
std::vector<WorkerShare> fill(const std::vector<const TypeCost*>& types, double target, int64_t n) {
  std::vector<WorkerShare> shares;
  int64_t left = n;
  for (const TypeCost* c : types) {
    const int64_t cap = capacity(*c, target, n);
    for (int64_t d = 0; d < c->count && left > 0 && cap > 0; ++d) {
      const int64_t take = std::min(cap, left);
      shares.push_back({c->type, take});
      left -= take;
    }
  }
  if (left > 0) shares.clear();
  return shares;
}

/// The smallest step time workers of `types` reach together (binary search over the
/// times at which some worker finishes its k-th vnode), and its assignment.
std::vector<WorkerShare> best_within(std::vector<const TypeCost*> types, int64_t n) {
  std::sort(types.begin(), types.end(),
            [](const TypeCost* a, const TypeCost* b) { return a->per_vnode < b->per_vnode; });
  std::vector<double> candidates;
  for (const TypeCost* c : types) {
    for (int64_t k = 1; k <= n; ++k) {
      candidates.push_back(c->optimizer + static_cast<double>(k) * c->per_vnode);
    }
  }
  std::sort(candidates.begin(), candidates.end());
  if (fill(types, candidates.back(), n).empty()) return {};
  // Feasibility is monotone in the target: find the first feasible candidate.
  size_t lo = 0, hi = candidates.size() - 1;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (fill(types, candidates[mid], n).empty()) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return fill(types, candidates[lo], n);
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

double predict_step_seconds(const PlanRequest& request, const std::vector<WorkerShare>& shares) {
  return predict(type_costs(request), shares);
}

Plan plan_exact(const PlanRequest& request) {
  const auto costs = type_costs(request);
  std::vector<const TypeCost*> usable;
  for (const auto& c : costs) {
    if (c.fits) usable.push_back(&c);
  }
  if (usable.empty()) {
    throw Error(fmt::format(
        "no device type can hold a vnode of {} examples within its memory cap; use more "
        "virtual nodes (smaller vnodes) or raise the caps",
        request.global_batch / request.virtual_nodes));
  }
  const int64_t n = request.virtual_nodes;
  Plan best;
  best.predicted_step_seconds = kInfinity;
  auto consider = [&](std::vector<WorkerShare> shares) {
    if (shares.empty()) return;
    const double t = predict(costs, shares);
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
    consider(best_within(chosen, n));
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
  b.even_split = predict(costs, spread(workers, n));

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
  b.proportional = predict(costs, shares);

  b.fastest_type_alone = kInfinity;
  for (const auto& c : costs) {
    const std::vector<std::string> own(static_cast<size_t>(std::min(c.count, n)), c.type);
    const double t = predict(costs, spread(own, n));
    if (t < b.fastest_type_alone) {
      b.fastest_type_alone = t;
      b.fastest_type = c.type;
    }
  }
  return b;
}

std::string Plan::describe() const {
  std::vector<std::string> order;
  std::map<std::string, std::vector<int64_t>> by_type;
  for (const auto& w : workers) {
    if (!by_type.count(w.device_type)) order.push_back(w.device_type);
    by_type[w.device_type].push_back(w.vnodes);
  }
  std::string text;
  for (const auto& type : order) {
    const auto& counts = by_type[type];
    text += fmt::format("{}: {} worker(s), vnodes {}\n", type, counts.size(),
                        fmt::format("{}", fmt::join(counts, " ")));
  }
  return text + fmt::format("predicted step time {:.4f} s\n", predicted_step_seconds);
}

}  // namespace vflow::hetero
