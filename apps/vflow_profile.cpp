// vflow-profile: measure what one vnode of a job's model costs on this device type, across
// vnode sizes, and write a profile file for vflow-plan (docs/heterogeneous.md).
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <exception>
#include <iostream>
#include <numeric>
#include <thread>

#include "command_line.h"
#include "vflow/comm/nccl.h"
#include "vflow/core/clock.h"
#include "vflow/engine/runtime.h"
#include "vflow/hetero/cpu_quota.h"
#include "vflow/job/roles.h"
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

/// The sample standard deviation of `v` over `typical` (0 for fewer than two values): how
/// much a step's compute varies, which the planner adds as the wait for the last of
/// several workers.
double relative_spread(const std::vector<double>& v, double typical) {
  if (v.size() < 2 || typical <= 0) return 0;
  const double mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  double squares = 0;
  for (const double x : v) squares += (x - mean) * (x - mean);
  return std::sqrt(squares / static_cast<double>(v.size() - 1)) / typical;
}

/// Peak memory so far: the process's peak RSS on the CPU, the device memory in use on a
/// GPU (where the backend library can tell; else the RSS).
int64_t peak_bytes(const torch::Device& device) {
  if (device.is_cuda()) {
    const auto used = vflow::comm::cuda_memory_used(device.index());
    if (used >= 0) return used;
  }
  return peak_rss_bytes();
}

constexpr int kMostWarmUp = 50;

/// Vnodes of `size` one after another in each step, as a worker runs them, enough for 64
/// examples and at least two: a vnode's cost is the step's compute time over its vnodes, so
/// what a step costs once (preparing the gradient buffer, say) is spread as in training.
vflow::hetero::DeviceProfile::Point measure(vflow::engine::JobSpec spec, int64_t size, int repeats,
                                            double* optimizer_seconds) {
  const int64_t vnodes = std::max<int64_t>(2, (64 + size - 1) / size);
  spec.semantic.global_batch = size * vnodes;
  spec.semantic.virtual_nodes = vnodes;
  spec.semantic.steps = repeats + kMostWarmUp;
  spec.semantic.data.drop_last = true;
  spec.resources.workers = spec.resources.min_workers = 1;
  spec.resources.layout.clear();  // a job file may carry a planned layout
  spec.resources.max_workers = 0;
  spec.output = vflow::engine::OutputSpec{};
  spec.output.evaluation.enabled = false;
  spec.output.logging.progress = "off";
  const auto trainer = vflow::engine::make_trainer(spec);
  // Warm-up (allocator, caches, the clock of an idle core): at least two steps and half a
  // second, at most kMostWarmUp steps.
  const auto warm_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  for (int i = 0; i < kMostWarmUp && (i < 2 || std::chrono::steady_clock::now() < warm_until);
       ++i) {
    trainer->train_step();
  }
  std::vector<double> compute, update;
  for (int i = 0; i < repeats; ++i) {
    const auto info = trainer->train_step();
    compute.push_back(info.compute_seconds / static_cast<double>(vnodes));
    update.push_back(info.update_seconds);
  }
  *optimizer_seconds = median(update);
  const double typical = median(compute);
  return {size, typical, peak_bytes(trainer->device()), relative_spread(compute, typical)};
}

/// One allreduce of the gradient buffer (on `device`) between two local workers on Gloo,
/// each a thread of this process.
double allreduce_seconds(int64_t numel, const torch::Device& device, int repeats) {
  vflow::job::StoreHost coordinator("127.0.0.1", 0, std::chrono::seconds(30));
  std::vector<double> times(2);
  auto worker = [&](int rank) {
    const auto comm = vflow::comm::make_gloo_communicator(
        coordinator.rendezvous(rank, 2, "profile", std::chrono::seconds(30)));
    auto buffer = torch::ones({numel}, torch::TensorOptions().device(device));
    std::vector<double> t;
    for (int i = 0; i < repeats + 2; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      comm->allreduce_sum(buffer);
      t.push_back(vflow::seconds_since(t0));
    }
    times[static_cast<size_t>(rank)] = median(t);
  };
  // An exception of the second rank is rethrown here, never left to end its thread.
  std::exception_ptr failed;
  std::thread other([&] {
    try {
      worker(1);
    } catch (...) {
      failed = std::current_exception();
    }
  });
  try {
    worker(0);
  } catch (...) {
    other.join();
    throw;
  }
  other.join();
  if (failed) std::rethrow_exception(failed);
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
                 "the name the planner knows this device type by (default: cpu-<threads>t, "
                 "cpu-<threads>t-q<quota>, or cuda-<GPU name> for resources.device)");
  std::string device;
  app.add_option("--device", device, "cpu, cuda or cuda:K (sets resources.device)");
  app.add_option("--sizes", sizes, "vnode sizes to measure")->delimiter(',');
  app.add_option("--repeats", repeats, "timed steps per size (median)")
      ->check(vflow::apps::at_least(1, 1000000));
  app.add_option("--out", out, "profile file to write")->required();
  app.add_option("--cpu-quota", cpu_quota,
                 "limit this process to this many cores (cgroup cpu controller), to profile a "
                 "slower CPU device type")
      ->check(vflow::apps::positive_number());
  if (const int code = vflow::apps::parse_command_line(app, argc, argv); code >= 0) return code;
  return vflow::apps::run_reporting_errors([&]() -> int {
    if (!device.empty()) overrides.push_back("resources.device=" + device);
    auto spec = vflow::engine::load_job_spec(spec_path, overrides);
    // The quota first: under it, threads 0 are the cores this process may use (as for a
    // worker whose layout entry gives the same quota, job::place_on_this_host).
    const std::string group = fmt::format("vflow-profile-{}", ::getpid());
    const vflow::hetero::CpuQuotaRelease release(cpu_quota > 0 ? group : std::string());
    if (cpu_quota > 0) vflow::hetero::apply_cpu_quota(cpu_quota, group);
    // Under srun or torchrun, plain "cuda" is this process's local rank's device; threads 0
    // becomes the count a worker here runs, which names the default device type.
    const auto placed = vflow::job::place_on_this_host(spec, /*own_quota=*/cpu_quota > 0);
    spec.resources.device = placed.device;
    spec.resources.threads = placed.threads;
    spdlog::set_level(spdlog::level::warn);
    const auto on = vflow::engine::worker_device(spec.resources);
    if (device_type.empty()) {
      const std::string gpu =
          on.is_cuda() ? vflow::comm::cuda_device_name(std::max<int>(0, on.index())) : "";
      device_type =
          vflow::hetero::default_device_type(on.is_cuda(), gpu, spec.resources.threads, cpu_quota);
    }
    std::sort(sizes.begin(), sizes.end());
    vflow::hetero::DeviceProfile profile;
    profile.device_type = device_type;
    profile.model = spec.model_digest();
    profile.device = on.is_cuda() ? "cuda" : "cpu";
    profile.threads = spec.resources.threads;
    profile.cpu_quota = cpu_quota;
    std::cerr << "profiling " << device_type << " on " << on.str() << "\n";
    double optimizer = 0;
    for (const int64_t size : sizes) {
      profile.points.push_back(measure(spec, size, repeats, &optimizer));
      const auto& point = profile.points.back();
      std::cerr << "vnode size " << size << ": " << point.seconds * 1e3 << " ms, spread "
                << point.spread * 100 << " %, peak memory " << point.peak_bytes / (1 << 20)
                << " MiB\n";
    }
    profile.optimizer_seconds = optimizer;
    int64_t numel = 0;
    {
      const auto trainer = vflow::engine::make_trainer(spec);
      for (const auto& p : trainer->model().parameters()) {
        numel += p.numel();
        profile.gradient_bytes += p.numel() * static_cast<int64_t>(p.element_size());
      }
    }
    // Both ranks are threads of this process: under a quota, the process gets one
    // worker's quota per rank while they run, so each runs as one worker of this type.
    if (cpu_quota > 0) vflow::hetero::apply_cpu_quota(2 * cpu_quota, group);
    profile.allreduce_seconds = allreduce_seconds(numel, on, repeats);
    std::cerr << "optimizer step " << optimizer * 1e3 << " ms, allreduce of " << numel << " floats "
              << profile.allreduce_seconds * 1e3 << " ms\n";
    vflow::hetero::save_profile(profile, out);
    std::cout << "wrote " << out << " (device type " << device_type << ", model " << profile.model
              << ")\n";
    return vflow::kExitOk;
  });
}
