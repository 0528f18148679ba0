#include "policy_parts.h"

namespace vflow::scheduler::detail {

namespace {

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

}  // namespace

std::unique_ptr<Policy> make_gavel_policy(double round_s) {
  return std::make_unique<GavelPolicy>(round_s);
}

}  // namespace vflow::scheduler::detail
