#include "policy_parts.h"

namespace vflow::scheduler::detail {

namespace {

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

}  // namespace

std::unique_ptr<Policy> make_non_elastic_policy(std::string name, Priority priority,
                                                bool preemptive, bool strict, double round_s,
                                                PolicyOptions options) {
  return std::make_unique<NonElasticPolicy>(std::move(name), priority, preemptive, strict, round_s,
                                            std::move(options));
}

}  // namespace vflow::scheduler::detail
