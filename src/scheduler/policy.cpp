// The scheduler's policies by name; each lives in a file of its own (policy_*.cpp), with
// the pieces they share in policy_parts.h.
#include "vflow/scheduler/policy.h"

#include <fmt/format.h>

#include "policy_parts.h"
#include "vflow/core/error.h"

namespace vflow::scheduler {

std::vector<int> weighted_water_fill(const std::vector<double>& weights, const std::vector<int>& lo,
                                     const std::vector<int>& hi, int capacity) {
  return detail::WaterFill().fill(weights, lo, hi, capacity);
}

std::vector<size_t> priority_order(Priority priority, const std::vector<JobView>& active,
                                   const PolicyOptions& options) {
  return detail::Ranking().order(priority, active, options);
}

std::vector<std::string> policy_names() {
  return {"marginal", "marginal-span", "wfs-elastic", "wfs-fifo", "wfs-sjf", "wfs-srtf",
          "fifo",     "priority",      "srtf",        "las",      "gavel"};
}

std::unique_ptr<Policy> make_policy(const std::string& name, const PolicyOptions& given) {
  if (name == "marginal") return detail::make_marginal_policy(given);
  if (name == "marginal-span") return detail::make_spanning_policy(given);
  PolicyOptions options = given;
  options.restart_s = 0;  // only marginal weighs the restart and the resize pause
  options.resize_pause_s = 0;
  if (name == "wfs-elastic") {
    return detail::make_elastic_wfs_policy(name, Priority::kWeights, options);
  }
  if (name == "wfs-fifo") return detail::make_elastic_wfs_policy(name, Priority::kFifo, options);
  if (name == "wfs-sjf") return detail::make_elastic_wfs_policy(name, Priority::kSjf, options);
  if (name == "wfs-srtf") return detail::make_elastic_wfs_policy(name, Priority::kSrtf, options);
  if (name == "fifo") {
    return detail::make_non_elastic_policy(name, Priority::kFifo, false, true, 0, options);
  }
  if (name == "priority") {
    return detail::make_non_elastic_policy(name, Priority::kWeights, true, false, 0, options);
  }
  if (name == "srtf") {
    return detail::make_non_elastic_policy(name, Priority::kSrtf, true, false, 0, options);
  }
  if (name == "las") {
    return detail::make_non_elastic_policy(name, Priority::kLas, true, false, options.las_round_s,
                                           options);
  }
  if (name == "gavel") return detail::make_gavel_policy(options.gavel_round_s);
  std::string known;
  for (const auto& n : policy_names()) known += (known.empty() ? "" : ", ") + n;
  throw SpecError(fmt::format("unknown policy '{}' (known: {}, all)", name, known));
}

}  // namespace vflow::scheduler
