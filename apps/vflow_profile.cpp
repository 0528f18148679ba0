// vflow-profile: measure what one vnode of a job's model costs on this device type, across
// vnode sizes, and write a profile file for vflow-plan (docs/heterogeneous.md).
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>
#include <thread>

#include "exit_code.h"
#include "vflow/hetero/cpu_quota.h"
#include "vflow/vflow.h"

namespace {

int64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// One vnode of `size` per step: the step's compute time is the vnode's cost.
vflow::hetero::DeviceProfile::Point measure(vflow::engine::JobSpec spec, int64_t size, int repeats,
                                            double* optimizer_seconds) {
  spec.semantic.global_batch = size;
  spec.semantic.virtual_nodes = 1;
  spec.semantic.steps = repeats + 2;
  spec.semantic.data.drop_last = true;
  spec.resources.workers = spec.resources.min_workers = 1;
  spec.resources.max_workers = 0;
  spec.output = vflow::engine::OutputSpec{};
  spec.output.evaluation.enabled = false;
  spec.output.logging.progress = "off";
  const auto trainer = vflow::engine::make_trainer(spec);
  std::vector<double> compute, update;
  for (int i = 0; i < repeats + 2; ++i) {
    const auto info = trainer->train_step();
    if (i < 2) continue;  // warm-up: allocator and caches
    compute.push_back(info.compute_seconds);
    update.push_back(info.update_seconds);
  }
  *optimizer_seconds = median(update);
  return {size, median(compute), peak_rss_bytes()};
}

/// One allreduce of the gradient buffer between two local workers on Gloo.
double allreduce_seconds(int64_t numel, int repeats) {
  vflow::comm::Coordinator coordinator("127.0.0.1", 0, std::chrono::seconds(30));
  std::vector<double> times(2);
  auto worker = [&](int rank) {
    vflow::comm::Rendezvous r;
    r.store_port = coordinator.port();
    r.rank = rank;
    r.world_size = 2;
    r.generation = "profile";
    const auto comm = vflow::comm::make_gloo_communicator(r);
    auto buffer = torch::ones({numel});
    std::vector<double> t;
    for (int i = 0; i < repeats + 2; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      comm->allreduce_sum(buffer);
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    times[static_cast<size_t>(rank)] = median(t);
  };
  std::thread other(worker, 1);
  worker(0);
  other.join();
  return std::max(times[0], times[1]);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"vflow-profile: measure a job's vnode cost on this device type"};
  std::string spec_path, device_type, out;
  std::vector<std::string> overrides;
  std::vector<int64_t> sizes{4, 8, 16, 32, 64};
  int repeats = 5;
  double cpu_quota = 0;
  app.add_option("job", spec_path, "job spec (YAML); the built-in default job when omitted");
  app.add_option("--set", overrides, "override a key (repeatable), e.g. resources.threads=1");
  app.add_option("--device-type", device_type,
                 "the name the planner knows this device type by, e.g. cpu-1t")
      ->required();
  app.add_option("--sizes", sizes, "vnode sizes to measure")->delimiter(',');
  app.add_option("--repeats", repeats, "timed steps per size (median)")->check(CLI::PositiveNumber);
  app.add_option("--out", out, "profile file to write")->required();
  app.add_option("--cpu-quota", cpu_quota,
                 "limit this process to this many cores (cgroup cpu controller), to profile a "
                 "slower CPU device type")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  return vflow::apps::run_reporting_errors([&] {
    const auto spec = vflow::engine::load_job_spec(spec_path, overrides);
    spdlog::set_level(spdlog::level::warn);
    if (cpu_quota > 0) vflow::hetero::apply_cpu_quota(cpu_quota, "vflow-" + device_type);
    std::sort(sizes.begin(), sizes.end());
    vflow::hetero::DeviceProfile profile;
    profile.device_type = device_type;
    profile.model = spec.model_digest();
    double optimizer = 0;
    for (const int64_t size : sizes) {
      profile.points.push_back(measure(spec, size, repeats, &optimizer));
      std::cerr << "vnode size " << size << ": " << profile.points.back().seconds * 1e3
                << " ms, peak RSS " << profile.points.back().peak_bytes / (1 << 20) << " MiB\n";
    }
    profile.optimizer_seconds = optimizer;
    int64_t numel = 0;
    {
      const auto trainer = vflow::engine::make_trainer(spec);
      for (const auto& p : trainer->model().parameters()) numel += p.numel();
    }
    profile.allreduce_seconds = allreduce_seconds(numel, repeats);
    std::cerr << "optimizer step " << optimizer * 1e3 << " ms, allreduce of " << numel << " floats "
              << profile.allreduce_seconds * 1e3 << " ms\n";
    vflow::hetero::save_profile(profile, out);
    if (cpu_quota > 0) vflow::hetero::release_cpu_quota("vflow-" + device_type);
    std::cout << "wrote " << out << " (model " << profile.model << ")\n";
    return 0;
  });
}
