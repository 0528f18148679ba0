#include "vflow/scheduler/config.h"

#include <fmt/format.h>

#include <limits>

#include "vflow/core/error.h"
#include "vflow/core/spec_node.h"

namespace vflow::scheduler {
namespace {

constexpr double kUnbounded = std::numeric_limits<double>::max();
// A job's vnodes are this times its demand: the split over types is exact to one vnode, and
// its cost grows with their number.
constexpr int64_t kMaxVnodesPerWorker = 1024;

std::string cluster_text(const SpecNode& node) {
  if (node.is_scalar()) return node.value();
  if (!node.is_map()) {
    throw SpecError(
        fmt::format("{}: expected a map of device type: count, or a string such as "
                    "v100:4,k80:2",
                    node.describe()));
  }
  OptionReader r(node);
  std::string text;
  for (const auto& [name, count] : node.entries()) {
    text += fmt::format("{}{}:{}", text.empty() ? "" : ",", name,
                        r.get_int(name, 0, 1, std::numeric_limits<int>::max()));
  }
  return text;
}

std::string resolve(const std::string& config_path, const std::string& file) {
  if (file.empty() || file[0] == '/') return file;
  const auto slash = config_path.rfind('/');
  return slash == std::string::npos ? file : config_path.substr(0, slash + 1) + file;
}

}  // namespace

void load_config(const std::string& path, SchedulerConfig& config) {
  const SpecNode root = load_yaml_file(path, "scheduler config");
  OptionReader r(root);
  if (const SpecNode* cluster = r.value("cluster")) {
    config.cluster = cluster_text(*cluster);
    try {
      (void)Cluster::parse(config.cluster);  // checked here, where its line is known
    } catch (const SpecError& e) {
      throw SpecError(fmt::format("{}: {}", cluster->describe(), e.what()));
    }
  }
  if (r.has("throughput")) config.throughput = resolve(path, r.get_string("throughput", ""));
  config.sim.resize_pause_s =
      r.get_double("resize_pause_s", config.sim.resize_pause_s, 0, kUnbounded);
  config.sim.restart_s = r.get_double("restart_s", config.sim.restart_s, 0, kUnbounded);
  config.sim.startup_s = r.get_double("startup_s", config.sim.startup_s, 0, kUnbounded);
  config.sim.decision_interval_s =
      r.get_double("decision_interval_s", config.sim.decision_interval_s, 0, kUnbounded);
  config.bind.min_workers = static_cast<int>(
      r.get_int("min_workers", config.bind.min_workers, 1, std::numeric_limits<int>::max()));
  config.bind.max_workers_factor =
      r.get_double("max_workers_factor", config.bind.max_workers_factor, 1, kUnbounded);
  config.bind.vnodes_per_worker = static_cast<int>(
      r.get_int("vnodes_per_worker", config.bind.vnodes_per_worker, 1, kMaxVnodesPerWorker));
  config.bind.span_overhead =
      r.get_double("span_overhead", config.bind.span_overhead, 0, kUnbounded);
  config.bind.fallback_parallel_fraction =
      r.get_double("fallback_parallel_fraction", config.bind.fallback_parallel_fraction, 0, 1);
  config.policy.las_round_s = r.get_double("las_round_s", config.policy.las_round_s, 0, kUnbounded);
  config.policy.gavel_round_s =
      r.get_double("gavel_round_s", config.policy.gavel_round_s, 0, kUnbounded);
  config.policy.las_thresholds =
      r.get_double_list("las_thresholds", config.policy.las_thresholds, 0, kUnbounded);
  r.finish();
}

}  // namespace vflow::scheduler
