#include "vflow/scheduler/experiment.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "core/output_file.h"
#include "parse.h"
#include "vflow/core/error.h"

namespace vflow::scheduler {
namespace {

std::vector<JobRecord> load_records(const ExperimentOptions& options,
                                    const ThroughputTable& table) {
  if (!options.gavel_trace.empty()) return read_gavel_trace(options.gavel_trace);
  if (!options.philly_trace.empty()) {
    return read_philly_trace(options.philly_trace, options.philly_model);
  }
  SyntheticOptions synthetic = options.synthetic;
  if (options.workload == "synthetic") {
    synthetic.shape = WorkloadShape::kGavel;
  } else if (options.workload == "paper") {
    synthetic.shape = WorkloadShape::kPaper;
  } else {
    throw SpecError(fmt::format("workload '{}': expected synthetic or paper", options.workload));
  }
  if (synthetic.models.empty()) synthetic.models = table.models();
  return generate_synthetic(synthetic);
}

std::vector<std::string> policy_list(const std::vector<std::string>& names) {
  if (names.size() == 1 && names[0] == "all") return policy_names();
  for (const auto& n : names) make_policy(n);  // throws on an unknown name
  return names;
}

void write_file(const std::string& path, const std::function<void(std::ostream&)>& body) {
  std::ostringstream out;
  body(out);
  if (const std::string error = core::write_file_atomically(path, out.str()); !error.empty()) {
    throw Error(fmt::format("{}: cannot write: {}", path, error));
  }
}

}  // namespace

double parse_rate(const std::string& text) {
  const auto slash = text.find('/');
  const std::string number = text.substr(0, slash);
  const std::string unit = slash == std::string::npos ? "h" : text.substr(slash + 1);
  const auto value = parse_whole<double>(number);
  const double per_hour = unit == "h" ? 1 : unit == "min" ? 60 : unit == "s" ? 3600 : 0;
  if (!value || !(*value > 0) || per_hour == 0) {
    throw SpecError(fmt::format("rate '{}': expected e.g. 12/h, 0.5/min or 0.01/s", text));
  }
  return *value * per_hour;
}

ExperimentResult run_experiment(const ExperimentOptions& options,
                                const std::function<void(const std::string&)>& log) {
  const Cluster cluster = Cluster::parse(options.config.cluster);
  const ThroughputTable table = options.config.throughput.empty()
                                    ? ThroughputTable()
                                    : ThroughputTable::load(options.config.throughput);
  const auto policies = policy_list(options.policies);
  ExperimentResult result;
  result.workload =
      bind_workload(load_records(options, table), table, cluster, options.config.bind);
  if (log) {
    log(fmt::format("{} jobs on {} ({} devices)", result.workload.jobs.size(), cluster.describe(),
                    cluster.total_devices()));
  }
  for (const auto& name : policies) {
    PolicyOptions policy_options = options.config.policy;
    policy_options.restart_s = options.config.sim.restart_s;
    policy_options.resize_pause_s = options.config.sim.resize_pause_s;
    auto policy = make_policy(name, policy_options);
    SimOptions sim = options.config.sim;
    if (log && result.workload.jobs.size() >= 1000) {
      sim.on_progress = [&](const SimProgress& p) {
        if (p.finished % std::max(1, p.total / 10) == 0) {
          log(fmt::format("  {}: {}/{} jobs done, t = {:.0f} s, {} active, {:.1f} s host time",
                          name, p.finished, p.total, p.now_s, p.active, p.host_s));
        }
      };
    }
    result.runs.push_back(simulate(cluster, result.workload, *policy, sim));
    result.summaries.push_back(summarize(result.runs.back(), options.metrics));
    if (log) {
      log(fmt::format("{}: mean JCT {:.0f} s, {:.2f} s host time", name,
                      result.summaries.back().jct.mean_s, result.runs.back().wall_s));
    }
  }
  return result;
}

void write_experiment(const ExperimentResult& result, const std::string& baseline,
                      const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw DataError(fmt::format("{}: cannot create directory: {}", dir, ec.message()));
  write_file(dir + "/summary.json", [&](auto& out) { out << summaries_json(result.summaries); });
  write_file(dir + "/comparison.txt",
             [&](auto& out) { out << comparison_table(result.summaries, baseline); });
  write_file(dir + "/workload.tsv",
             [&](auto& out) { write_gavel_trace(to_records(result.workload), out); });
  for (const auto& run : result.runs) {
    write_file(dir + "/jobs_" + run.policy + ".csv", [&](auto& out) { write_jobs_csv(run, out); });
    write_file(dir + "/timeline_" + run.policy + ".csv",
               [&](auto& out) { write_timeline_csv(run, out); });
  }
}

}  // namespace vflow::scheduler
