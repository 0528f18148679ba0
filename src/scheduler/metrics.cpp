#include "vflow/scheduler/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <ostream>

namespace vflow::scheduler {
namespace {

JctStats stats_of(std::vector<double> jcts) {
  JctStats s;
  s.jobs = static_cast<int>(jcts.size());
  if (jcts.empty()) return s;
  s.mean_s = std::accumulate(jcts.begin(), jcts.end(), 0.0) / jcts.size();
  s.median_s = percentile(jcts, 50);
  s.p99_s = percentile(std::move(jcts), 99);
  return s;
}

std::string stats_json(const JctStats& s) {
  return fmt::format(R"({{"jobs": {}, "mean_s": {:.3f}, "median_s": {:.3f}, "p99_s": {:.3f}}})",
                     s.jobs, s.mean_s, s.median_s, s.p99_s);
}

}  // namespace

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double pos = q / 100.0 * (values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (pos - lo) * (values[hi] - values[lo]);
}

Summary summarize(const SimResult& result, const MetricsOptions& options) {
  Summary s;
  s.policy = result.policy;
  s.wall_s = result.wall_s;
  const int n = static_cast<int>(result.jobs.size());
  const int to = options.measure_to < 0 ? n : std::min(options.measure_to, n);
  std::vector<double> jcts;
  std::map<double, std::vector<double>> by_weight;
  double first_arrival = std::numeric_limits<double>::infinity(), last_finish = 0, held = 0;
  double queueing = 0;
  for (const auto& job : result.jobs) {
    first_arrival = std::min(first_arrival, job.arrival_s);
    last_finish = std::max(last_finish, job.finish_s);
    held += job.device_seconds;
    s.resizes += job.resizes;
    s.migrations += job.migrations;
    s.preemptions += job.preemptions;
    s.spanned_jobs += job.spanned_s > 0;
    if (job.id < options.measure_from || job.id >= to) continue;
    jcts.push_back(job.jct_s());
    by_weight[job.weight].push_back(job.jct_s());
    queueing += job.queueing_s();
  }
  s.jct = stats_of(jcts);
  for (auto& [weight, values] : by_weight) s.jct_by_weight[weight] = stats_of(std::move(values));
  s.mean_queueing_s = jcts.empty() ? 0 : queueing / jcts.size();
  if (n > 0) {
    s.makespan_s = last_finish - first_arrival;
    const double capacity = result.total_devices * s.makespan_s;
    s.utilization = capacity > 0 ? held / capacity : 0;
  }
  return s;
}

void write_jobs_csv(const SimResult& result, std::ostream& out) {
  out << "id,model,weight,demand,arrival_s,start_s,finish_s,jct_s,queueing_s,total_work,"
         "work_done,device_seconds,resizes,migrations,preemptions,spanned_s\n";
  for (const auto& j : result.jobs) {
    out << fmt::format(
        "{},{},{:g},{},{:.3f},{:.3f},{:.3f},{:.3f},{:.3f},{:.6g},{:.6g},{:.3f},{},{},{},{:.3f}\n",
        j.id, j.model, j.weight, j.demand, j.arrival_s, j.start_s, j.finish_s, j.jct_s(),
        j.queueing_s(), j.total_work, j.work_done, j.device_seconds, j.resizes, j.migrations,
        j.preemptions, j.spanned_s);
  }
}

void write_timeline_csv(const SimResult& result, std::ostream& out) {
  out << "time_s,allocated,total\n";
  for (const auto& p : result.timeline) {
    out << fmt::format("{:.3f},{},{}\n", p.time_s, p.allocated, result.total_devices);
  }
}

std::string summaries_json(const std::vector<Summary>& summaries) {
  std::string out = "[\n";
  for (size_t i = 0; i < summaries.size(); ++i) {
    const Summary& s = summaries[i];
    std::string classes;
    for (const auto& [weight, stats] : s.jct_by_weight) {
      classes +=
          fmt::format("{}\"{:g}\": {}", classes.empty() ? "" : ", ", weight, stats_json(stats));
    }
    out += fmt::format(
        "  {{\"policy\": \"{}\", \"jct\": {}, \"jct_by_weight\": {{{}}}, \"makespan_s\": {:.3f}, "
        "\"utilization\": {:.6f}, \"mean_queueing_s\": {:.3f}, \"resizes\": {}, "
        "\"migrations\": {}, \"preemptions\": {}, \"spanned_jobs\": {}, \"wall_s\": {:.4f}}}{}\n",
        s.policy, stats_json(s.jct), classes, s.makespan_s, s.utilization, s.mean_queueing_s,
        s.resizes, s.migrations, s.preemptions, s.spanned_jobs, s.wall_s,
        i + 1 < summaries.size() ? "," : "");
  }
  return out + "]\n";
}

std::string comparison_table(const std::vector<Summary>& summaries, const std::string& baseline) {
  const Summary* base = nullptr;
  for (const auto& s : summaries) {
    if (s.policy == baseline) base = &s;
  }
  std::string out =
      fmt::format("{:<13} {:>10} {:>10} {:>10} {:>11} {:>6} {:>10} {:>8} {:>8} {:>8} {:>7}",
                  "policy", "mean JCT", "median", "p99", "makespan", "util", "queueing", "resizes",
                  "migrate", "preempt", "spanned");
  if (base != nullptr) out += fmt::format(" {:>8} {:>8}", "dJCT", "dUtil");
  out += "\n";
  for (const auto& s : summaries) {
    out += fmt::format(
        "{:<13} {:>10.0f} {:>10.0f} {:>10.0f} {:>11.0f} {:>6.3f} {:>10.0f} {:>8} {:>8} {:>8} {:>7}",
        s.policy, s.jct.mean_s, s.jct.median_s, s.jct.p99_s, s.makespan_s, s.utilization,
        s.mean_queueing_s, s.resizes, s.migrations, s.preemptions, s.spanned_jobs);
    if (base != nullptr) {
      out += fmt::format(" {:>+7.1f}% {:>+7.1f}%", 100 * (s.jct.mean_s / base->jct.mean_s - 1),
                         100 * (s.utilization / base->utilization - 1));
    }
    out += "\n";
  }
  return out;
}

}  // namespace vflow::scheduler
