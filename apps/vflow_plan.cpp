// vflow-plan: choose how many vnodes each device of a heterogeneous inventory runs, from
// device profiles, and print the plan against simpler splits (docs/heterogeneous.md).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "command_line.h"
#include "vflow/vflow.h"

namespace {

/// TYPE:COUNT or TYPE:COUNT:CAP_MIB.
vflow::hetero::DeviceGroup parse_group(const std::string& text) {
  const auto parts = [&] {
    std::vector<std::string> out;
    size_t start = 0;
    while (true) {
      const auto colon = text.find(':', start);
      out.push_back(text.substr(start, colon - start));
      if (colon == std::string::npos) return out;
      start = colon + 1;
    }
  }();
  if (parts.size() < 2 || parts.size() > 3 || parts[0].empty()) {
    throw vflow::SpecError("--devices: '" + text + "' is not TYPE:COUNT or TYPE:COUNT:CAP_MIB");
  }
  vflow::hetero::DeviceGroup g;
  g.device_type = parts[0];
  // Whole numbers only: a count of 1 to 1,000,000 devices, a cap of at most 2^40 MiB.
  const auto number = [&](const std::string& digits, int64_t min, int64_t max) {
    if (digits.empty() || digits.size() > 13 ||
        digits.find_first_not_of("0123456789") != std::string::npos || std::stoll(digits) < min ||
        std::stoll(digits) > max) {
      throw vflow::SpecError("--devices: '" + text + "': expected a count of 1 to " +
                             std::to_string(max) + (parts.size() == 3 ? " and a cap in MiB" : ""));
    }
    return std::stoll(digits);
  };
  g.count = number(parts[1], 1, 1'000'000);
  if (parts.size() == 3) g.memory_cap_bytes = number(parts[2], 1, int64_t{1} << 40) << 20;
  return g;
}

/// Rows of the scheduler's throughput file (docs/scheduler.md): for each profiled type and
/// 1 to MAX workers of it, the steps per second of the exact-mode plan over those workers
/// (which may leave some idle, so a row never falls below the one before).
void print_throughput(vflow::hetero::PlanRequest request, const std::string& spec) {
  const auto colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  int64_t max = request.virtual_nodes;
  if (colon != std::string::npos) {
    const std::string digits = spec.substr(colon + 1);
    if (digits.empty() || digits.size() > 6 ||
        digits.find_first_not_of("0123456789") != std::string::npos || std::stoll(digits) < 1) {
      throw vflow::SpecError("--throughput: '" + spec +
                             "': expected NAME or NAME:MAX, MAX 1 to 999999");
    }
    max = std::stoll(digits);
  }
  if (name.empty() || name.find_first_of(" \t#") != std::string::npos) {
    throw vflow::SpecError("--throughput: '" + spec + "': the model name must be one word");
  }
  std::cout << fmt::format(
      "# {}: exact-mode plans of {} vnodes x {} from vflow-profile profiles (vnode and optimizer\n"
      "# times measured; the allreduce measured between 2 workers and scaled as a ring's,\n"
      "# 2(P-1)/P, for P workers)\n",
      name, request.virtual_nodes, request.global_batch / request.virtual_nodes);
  for (const auto& [type, profile] : request.profiles) {
    for (int64_t workers = 1; workers <= max; ++workers) {
      request.inventory = {{type, workers, 0}};
      const double seconds = vflow::hetero::plan_exact(request).predicted_step_seconds;
      std::cout << fmt::format("table  {}  {}  {}  {:.9g}\n", name, type, workers, 1 / seconds);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"vflow-plan: split a job's vnodes over a heterogeneous inventory"};
  std::string spec_path;
  std::vector<std::string> overrides, profiles, devices;
  app.add_option("job", spec_path, "job spec (YAML); the built-in default job when omitted");
  app.add_option("--set", overrides, "override a key (repeatable)");
  app.add_option("--profile", profiles, "a profile file from vflow-profile (repeatable)")
      ->required();
  app.add_option("--devices", devices, "TYPE:COUNT[:CAP_MIB] (repeatable)");
  std::string throughput;
  app.add_option("--throughput", throughput,
                 "NAME[:MAX]: print the scheduler's throughput rows of model NAME for 1 to MAX "
                 "workers (default: the job's vnodes) of each profiled type, instead of a plan");
  bool relaxed = false;
  app.add_flag("--relaxed", relaxed,
               "also plan relaxed mode: a vnode size per device type (changes the result: "
               "batch norm sees other batches)");
  double link_gb_per_s = 0;
  app.add_option("--link-bandwidth", link_gb_per_s,
                 "effective allreduce bandwidth between devices of different types in GB/s (the "
                 "network between their hosts, say); default: as fast as within one type")
      ->check(vflow::apps::positive_number());
  if (const int code = vflow::apps::parse_command_line(app, argc, argv); code >= 0) return code;
  return vflow::apps::run_reporting_errors([&]() -> int {
    const auto spec = vflow::engine::load_job_spec(spec_path, overrides);
    vflow::hetero::PlanRequest request;
    request.global_batch = spec.semantic.global_batch;
    request.virtual_nodes = spec.semantic.virtual_nodes;
    request.model = spec.model_digest();
    request.link_bandwidth = link_gb_per_s * 1e9;
    for (const auto& path : profiles) {
      auto profile = vflow::hetero::load_profile(path);
      request.profiles[profile.device_type] = std::move(profile);
    }
    if (!throughput.empty()) {
      print_throughput(request, throughput);
      return vflow::kExitOk;
    }
    if (devices.empty()) throw vflow::SpecError("--devices: required unless --throughput is given");
    for (const auto& d : devices) request.inventory.push_back(parse_group(d));
    const auto plan = vflow::hetero::plan_exact(request);
    const auto base = vflow::hetero::baselines(request);
    std::cout << "exact mode: global batch " << request.global_batch << " = "
              << request.virtual_nodes << " vnodes x "
              << request.global_batch / request.virtual_nodes << "\n"
              << plan.describe();
    auto line = [&](const std::string& name, double t) {
      std::cout << "  " << name << ": ";
      if (std::isinf(t)) {
        std::cout << "does not fit in memory\n";
      } else {
        std::cout << t << " s (plan is " << t / plan.predicted_step_seconds << "x faster)\n";
      }
    };
    const auto layout = vflow::hetero::planned_layout(request, plan.workers);
    std::cout << "as the job's resources part:\n"
              << "resources:\n  workers: " << plan.workers.size() << "\n  layout:\n"
              << vflow::engine::layout_lines(layout.entries, layout.notes);
    std::cout << "baselines:\n";
    line("even split over every device", base.even_split);
    line("split proportional to throughput", base.proportional);
    line("best single type alone (" + base.fastest_type + ")", base.fastest_type_alone);
    if (relaxed) {
      const auto r = vflow::hetero::plan_relaxed(request);
      const auto relaxed_layout = vflow::hetero::planned_layout(request, r);
      std::cout << "\nrelaxed mode: global batch " << request.global_batch << " in "
                << r.vnode_sizes().size() << " vnodes\n"
                << r.describe() << "  exact mode's plan: " << plan.predicted_step_seconds
                << " s (relaxed is " << plan.predicted_step_seconds / r.predicted_step_seconds
                << "x faster)\n"
                << "as the job's semantic and resources parts (the sizes are part of the "
                   "result):\nsemantic:\n  virtual_nodes: null\n  vnode_sizes: ["
                << fmt::format("{}", fmt::join(r.vnode_sizes(), ", ")) << "]\nresources:\n"
                << "  workers: " << r.workers.size() << "\n  layout:\n"
                << vflow::engine::layout_lines(relaxed_layout.entries, relaxed_layout.notes);
    }
    return vflow::kExitOk;
  });
}
