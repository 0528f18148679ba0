#include "vflow/scheduler/policy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <queue>

#include "vflow/core/error.h"

namespace vflow::scheduler {
namespace {

// A type whose per-job estimate beats the job's current type by less than this factor does
// not justify a migration (a checkpoint-restart).
constexpr double kMigrationGain = 1.25;

double priority_key(Priority priority, const JobView& v, const PolicyOptions& options) {
  const Job& job = *v.job;
  switch (priority) {
    case Priority::kFifo:
      return job.arrival_s;
    case Priority::kSjf:
      return job.total_work / job.demand_rate;
    case Priority::kSrtf:
      return v.remaining_work / job.demand_rate;
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
  for (size_t i = 0; i < active.size(); ++i) {
    if (workers[i] > 0) out.assignments.push_back({active[i].job->id, types[i], workers[i]});
  }
  return out;
}

// The device type that `fits` and runs the job fastest by `speed` (ties to the lower type),
// -1 where none fits.
template <typename Fits, typename Speed>
int fastest_type(const Cluster& cluster, const Fits& fits, const Speed& speed) {
  int best = -1;
  for (int t = 0; t < cluster.num_types(); ++t) {
    if (fits(t) && (best < 0 || speed(t) > speed(best))) best = t;
  }
  return best;
}

// The type a running job runs on, -1 for a waiting one.
int running_type(const JobView& v) { return v.workers > 0 ? v.device_type : -1; }

// Non-elastic placement in the given order: each job runs at exactly its demand on one type
// or waits. Running jobs stay on their type when it has room. `keep_running`: running jobs
// are placed first and never preempted. `strict`: stop at the first job that does not fit
// (no backfilling).
Allocation place_at_demand(const Cluster& cluster, const std::vector<JobView>& active,
                           const std::vector<size_t>& order, bool keep_running, bool strict) {
  std::vector<int> free(cluster.num_types());
  for (int t = 0; t < cluster.num_types(); ++t) free[t] = cluster.type(t).count;
  std::vector<int> types(active.size(), -1), workers(active.size(), 0);
  if (keep_running) {
    for (size_t i = 0; i < active.size(); ++i) {
      if (active[i].workers == 0) continue;
      types[i] = active[i].device_type;
      workers[i] = active[i].workers;
      free[types[i]] -= workers[i];
    }
  }
  for (size_t i : order) {
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
    return place_at_demand(cluster, active, priority_order(priority_, active, options_),
                           !preemptive_, strict_);
  }

 private:
  std::string name_;
  Priority priority_;
  bool preemptive_;
  bool strict_;
  double round_s_;
  PolicyOptions options_;
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
    const std::vector<size_t> order = priority_order(priority_, active, options_);
    std::vector<int> types(active.size(), -1), workers(active.size(), 0);
    const auto placed = place(cluster, active, order, types);
    for (int t = 0; t < cluster.num_types(); ++t) {
      std::vector<double> w;
      std::vector<int> lo, hi;
      for (size_t i : placed[t]) {
        w.push_back(share_weight(active[i]));
        lo.push_back(active[i].job->min_workers);
        hi.push_back(std::min(active[i].job->max_workers, cluster.type(t).count));
      }
      const auto shares = weighted_water_fill(w, lo, hi, cluster.type(t).count);
      for (size_t k = 0; k < placed[t].size(); ++k) workers[placed[t][k]] = shares[k];
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

  // Per type, the indices of the jobs placed there, in priority order.
  std::vector<std::vector<size_t>> place(const Cluster& cluster, const std::vector<JobView>& active,
                                         const std::vector<size_t>& order,
                                         std::vector<int>& types) const {
    const int n_types = cluster.num_types();
    std::vector<int> min_room(n_types);
    std::vector<double> weight_sum(n_types, 0.0);
    for (int t = 0; t < n_types; ++t) min_room[t] = cluster.type(t).count;
    std::vector<std::vector<size_t>> placed(n_types);
    for (size_t i : order) {
      const Job& job = *active[i].job;
      const double w = share_weight(active[i]);
      int best = -1;
      double best_rate = 0;
      for (int t = 0; t < n_types; ++t) {
        if (min_room[t] < job.min_workers) continue;
        const int count = cluster.type(t).count;
        const int guess = std::clamp(static_cast<int>(count * w / (weight_sum[t] + w)),
                                     job.min_workers, std::min(job.max_workers, count));
        double rate = job.rate(t, guess);
        if (t == active[i].device_type && active[i].workers > 0) rate *= kMigrationGain;
        if (best < 0 || rate > best_rate) best = t, best_rate = rate;
      }
      if (best < 0) continue;
      types[i] = best;
      min_room[best] -= job.min_workers;
      weight_sum[best] += w;
      placed[best].push_back(i);
    }
    return placed;
  }

  std::string name_;
  Priority priority_;
  PolicyOptions options_;
};

// Elastic shortest remaining time by marginal gain (the water-filling floor that AFS and
// Pollux build on), for mean JCT, so weights do not count: each job is given a type in SRTF
// order (`place`), then every device goes, one at a time, to the job whose completion it
// advances most, counted as the fraction of the job's remaining work one more worker does
// per second. A job's first grant is its minimum worker count at once. With linear scaling
// this is SRTF at up to each job's maximum; with diminishing returns, a device that a long
// job's next worker would barely use goes to the next job. A job left without devices on
// its type then tries the devices left on the others (`place_in_leftovers`).
class MarginalPolicy : public Policy {
 public:
  std::string name() const override { return "marginal"; }
  bool elastic() const override { return true; }
  Allocation allocate(const Cluster& cluster, const std::vector<JobView>& active, double) override {
    const int n_types = cluster.num_types();
    std::vector<int> free(n_types);
    for (int t = 0; t < n_types; ++t) free[t] = cluster.type(t).count;
    std::vector<int> types(active.size(), -1), workers(active.size(), 0);
    // Gain per device of growing job i on type t from its current workers by `step`.
    const auto gain = [&](size_t i, int t, int step) {
      const Job& job = *active[i].job;
      const double left = std::max(active[i].remaining_work, 1e-9 * job.total_work);
      const int now = workers[i];
      return (job.rate(t, now + step) - (now > 0 ? job.rate(t, now) : 0.0)) / (left * step);
    };
    struct Grant {
      double gain;
      size_t job;
      int type, step;
    };
    // Highest gain first; ties to the lower job id, then the lower type.
    const auto later = [&](const Grant& a, const Grant& b) {
      if (a.gain != b.gain) return a.gain < b.gain;
      if (active[a.job].job->id != active[b.job].job->id) {
        return active[a.job].job->id > active[b.job].job->id;
      }
      return a.type > b.type;
    };
    // Grants devices by gain: each job of `homes` its minimum there first, then one worker
    // at a time to whichever job (these and those already running) gains most.
    const auto grant = [&](const std::vector<int>& homes) {
      std::priority_queue<Grant, std::vector<Grant>, decltype(later)> grants(later);
      const auto offer_next = [&](size_t i) {
        const Job& job = *active[i].job;
        const int t = types[i];
        if (workers[i] < std::min(job.max_workers, cluster.type(t).count)) {
          grants.push({gain(i, t, 1), i, t, 1});
        }
      };
      for (size_t i = 0; i < active.size(); ++i) {
        const int min = active[i].job->min_workers;
        if (workers[i] > 0) {
          offer_next(i);
        } else if (homes[i] >= 0) {
          grants.push({gain(i, homes[i], min), i, homes[i], min});
        }
      }
      while (!grants.empty()) {
        const Grant g = grants.top();
        grants.pop();
        if (free[g.type] < g.step) continue;  // no room left there for this grant
        types[g.job] = g.type;
        workers[g.job] += g.step;
        free[g.type] -= g.step;
        offer_next(g.job);
      }
    };
    const auto order = priority_order(Priority::kSrtf, active);
    grant(place(cluster, active, order));
    // A job left out where it was placed tries the devices left on other types.
    grant(place_in_leftovers(cluster, active, order, workers, free));
    return to_allocation(active, types, workers);
  }

 private:
  // For each job without workers, in SRTF `order`, the type whose free devices would run it
  // fastest (its own type first if it was running), -1 where none has room for its minimum.
  static std::vector<int> place_in_leftovers(const Cluster& cluster,
                                             const std::vector<JobView>& active,
                                             const std::vector<size_t>& order,
                                             const std::vector<int>& workers,
                                             std::vector<int> free) {
    std::vector<int> home(active.size(), -1);
    for (size_t i : order) {
      const Job& job = *active[i].job;
      if (workers[i] > 0) continue;
      const auto fits = [&](int t) { return free[t] >= job.min_workers; };
      const int now = running_type(active[i]);
      const int best = now >= 0 && fits(now) ? now : fastest_type(cluster, fits, [&](int t) {
        return job.rate(t, std::clamp(free[t], job.min_workers, job.demand));
      });
      if (best < 0) continue;
      home[i] = best;
      free[best] -= std::min(free[best], job.demand);
    }
    return home;
  }

  // The device type each job competes on, -1 for none: in SRTF `order`, like `srtf`'s
  // placement, the fastest type with room for the job's demand, else the one where the room
  // left runs it fastest, else its fastest type. A running job stays unless a type with
  // room for its demand would run it kMigrationGain times as fast.
  static std::vector<int> place(const Cluster& cluster, const std::vector<JobView>& active,
                                const std::vector<size_t>& order) {
    std::vector<int> room(cluster.num_types()), home(active.size(), -1);
    for (int t = 0; t < cluster.num_types(); ++t) room[t] = cluster.type(t).count;
    for (size_t i : order) {
      const Job& job = *active[i].job;
      const auto at_demand = [&](int t) { return job.rate(t, job.demand); };
      int best = fastest_type(
          cluster, [&](int t) { return room[t] >= job.demand; }, at_demand);
      const int now = running_type(active[i]);
      if (now >= 0 && (best < 0 || at_demand(best) < kMigrationGain * at_demand(now))) best = now;
      if (best < 0) {
        best = fastest_type(
            cluster, [&](int t) { return room[t] >= job.min_workers; },
            [&](int t) { return job.rate(t, std::clamp(room[t], job.min_workers, job.demand)); });
      }
      if (best < 0) {
        best = fastest_type(
            cluster, [&](int t) { return job.min_workers <= cluster.type(t).count; }, at_demand);
      }
      if (best < 0) continue;
      home[i] = best;
      room[best] -= std::min(room[best], job.demand);
    }
    return home;
  }
};

}  // namespace

std::vector<int> weighted_water_fill(const std::vector<double>& weights, const std::vector<int>& lo,
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
  if (hi_sum <= capacity) return hi;
  // f(l) = sum clamp(l * w_i, lo_i, hi_i) is piecewise linear in l; sweep its breakpoints.
  std::vector<std::pair<double, long>> events;  // (l, +i+1 starts growing | -(i+1) stops)
  events.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    events.emplace_back(lo[i] / weights[i], static_cast<long>(i) + 1);
    events.emplace_back(hi[i] / weights[i], -static_cast<long>(i) - 1);
  }
  std::sort(events.begin(), events.end());
  double level = 0, value = static_cast<double>(lo_sum), slope = 0;
  for (const auto& [at, id] : events) {
    const double next = value + slope * (at - level);
    if (next >= capacity && slope > 0) break;
    value = next;
    level = at;
    const size_t i = static_cast<size_t>(std::labs(id) - 1);
    slope += id > 0 ? weights[i] : -weights[i];
  }
  if (slope > 0) level += (capacity - value) / slope;
  std::vector<int> shares(n);
  std::vector<double> remainder(n);
  int left = capacity;
  for (size_t i = 0; i < n; ++i) {
    const double x = std::clamp(level * weights[i], double(lo[i]), double(hi[i]));
    shares[i] = std::clamp(static_cast<int>(std::floor(x + 1e-9)), lo[i], hi[i]);
    remainder[i] = x - shares[i];
    left -= shares[i];
  }
  std::vector<size_t> by_remainder(n);
  std::iota(by_remainder.begin(), by_remainder.end(), 0);
  std::stable_sort(by_remainder.begin(), by_remainder.end(),
                   [&](size_t a, size_t b) { return remainder[a] > remainder[b]; });
  for (size_t k = 0; k < n && left > 0; ++k) {
    const size_t i = by_remainder[k];
    if (shares[i] < hi[i]) ++shares[i], --left;
  }
  return shares;
}

std::vector<size_t> priority_order(Priority priority, const std::vector<JobView>& active,
                                   const PolicyOptions& options) {
  std::vector<double> key(active.size());
  for (size_t i = 0; i < active.size(); ++i) key[i] = priority_key(priority, active[i], options);
  std::vector<size_t> order(active.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (key[a] != key[b]) return key[a] < key[b];
    return active[a].job->id < active[b].job->id;
  });
  return order;
}

std::vector<std::string> policy_names() {
  return {"marginal", "wfs-elastic", "wfs-fifo", "wfs-sjf", "wfs-srtf",
          "fifo",     "priority",    "srtf",     "las",     "gavel"};
}

std::unique_ptr<Policy> make_policy(const std::string& name, const PolicyOptions& options) {
  if (name == "marginal") return std::make_unique<MarginalPolicy>();
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
