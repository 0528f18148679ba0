#include "policy_parts.h"

namespace vflow::scheduler::detail {

namespace {

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

}  // namespace

std::unique_ptr<Policy> make_elastic_wfs_policy(std::string name, Priority priority,
                                                PolicyOptions options) {
  return std::make_unique<ElasticWfsPolicy>(std::move(name), priority, std::move(options));
}

}  // namespace vflow::scheduler::detail
