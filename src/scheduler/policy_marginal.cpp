#include <queue>

#include "policy_parts.h"

namespace vflow::scheduler::detail {

namespace {

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

std::unique_ptr<Policy> make_marginal_policy(const PolicyOptions& options) {
  return std::make_unique<MarginalPolicy>(options);
}

std::unique_ptr<Policy> make_spanning_policy(const PolicyOptions& options) {
  return std::make_unique<SpanningPolicy>(options);
}

}  // namespace vflow::scheduler::detail
