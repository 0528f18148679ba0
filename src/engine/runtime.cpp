#include "vflow/engine/runtime.h"

#include <fmt/format.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/torch_compat.h"
#include "vflow/comm/nccl.h"
#include "vflow/core/error.h"
#include "vflow/core/process.h"
#include "vflow/vnode/plan.h"

namespace vflow::engine {

namespace {
/// The initialisation's stream of the job's seed (vnode::mix_seed).
constexpr uint64_t kInitStream = 0x1417;
}  // namespace

namespace {
/// The cores this worker may use: its CPU affinity and its cgroup's CPU quota count, so a
/// worker in a container limited to 2 of a host's 64 cores runs 2 threads, not 64.
int64_t host_cores() { return usable_cores(); }

/// The intra-op threads of a worker whose resources.threads is resolved, or, where it is 0
/// (in-process, where no launcher placed it), of the only worker on the host.
int64_t configured_threads(const ResourcesSpec& resources) {
  return resources.threads > 0 ? resources.threads : host_cores();
}
}  // namespace

int64_t intra_op_threads(const JobSpec& spec, int64_t local_workers) {
  if (spec.resources.threads > 0) return spec.resources.threads;
  if (spec.semantic.deterministic) return 1;
  // Every core for each of several workers oversubscribes the host, and each one's
  // intra-op threads spin while waiting for cores the others hold: two workers of an MLP
  // 784-2048-2048-10 on 2 cores trained at about 600 examples/s so, 2,090 with one each.
  return std::max<int64_t>(1, host_cores() / std::max<int64_t>(1, local_workers));
}

bool prefetch_enabled(const ResourcesSpec& resources, int64_t local_workers) {
  if (resources.prefetch != Prefetch::kAuto) return resources.prefetch == Prefetch::kOn;
  // A background loader only helps when it gets a core of its own; on a fully
  // subscribed host it competes with the compute threads (measured at first: about
  // -15% with 2 single-threaded workers on 2 cores; at later builds within the noise
  // either way, docs/experiments/benchmarks-notebook.md, "The background loader with both
  // cores busy", so the rule stands on the first measurement).
  return configured_threads(resources) * std::max<int64_t>(1, local_workers) < host_cores();
}

int64_t data_threads(const ResourcesSpec& resources, int64_t local_workers) {
  if (resources.data_threads > 0) return resources.data_threads;
  const int64_t workers = std::max<int64_t>(1, local_workers);
  const int64_t spare = host_cores() - configured_threads(resources) * workers;
  return std::max<int64_t>(1, spare / workers);
}

void seed_initialisation(const SemanticSpec& semantic) {
  torch::manual_seed(vnode::mix_seed(semantic.seed, kInitStream, 0));
}

namespace {
/// The device `name` (cpu, cuda, cuda:K) on this machine; errors name `key`.
torch::Device resolve_device(const std::string& name, const std::string& key) {
  if (name == "cpu") return torch::Device(torch::kCPU);
  if (!torch::cuda::is_available()) {
    throw SpecError(fmt::format(
        "{}: '{}' requested but this LibTorch build or machine has no CUDA device", key, name));
  }
  const auto count = static_cast<int>(torch::cuda::device_count());
  if (name != "cuda") {
    torch::Device device(name);
    if (device.index() >= count) {
      throw SpecError(fmt::format("{}: {} does not exist ({} CUDA device{} visible)", key, name,
                                  count, count == 1 ? "" : "s"));
    }
    return device;
  }
  return torch::Device(torch::kCUDA, 0);
}
}  // namespace

torch::Device worker_device(const ResourcesSpec& resources) {
  return resolve_device(resources.device, "resources.device");
}

void check_devices(const ResourcesSpec& resources) {
  worker_device(resources);  // entries without a device of their own, and joiners
  for (size_t i = 0; i < resources.layout.size(); ++i) {
    const auto& device = resources.layout[i].device;
    if (!device.empty()) resolve_device(device, fmt::format("resources.layout[{}].device", i));
  }
}

void choose_backend(const ResourcesSpec& resources, torch::Device device, comm::Rendezvous& r) {
  comm::choose_backend(resources.backend, "resources.backend", device, r);
  r.shared_memory = resources.shared_memory;
}

namespace {
/// Keeps the memory of freed tensors in the process for the next step. glibc's malloc
/// serves large blocks with mmap and hands freed heap tops back to the kernel, so every
/// step's activations fault their pages in afresh; on a virtual machine of this project's
/// reference kind that more than doubled a transformer's step (bert-mini, one thread, the
/// plain LibTorch loop: 26-28 against 62-64 examples/s, docs/experiments/benchmarks-notebook.md,
/// "Memory kept between steps"). Blocks below 64 MiB now come from the heap, which is trimmed
/// once 128 MiB lie free at its top. glibc's own settings in the environment win.
void keep_freed_memory() {
#if defined(__GLIBC__)
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"}) {
    if (std::getenv(name) != nullptr) return;
  }
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 128 << 20);
#endif
}
}  // namespace

void release_free_memory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

bool allocation_failed() {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return true;
  } catch (const c10::Error& e) {
    const auto& m = e.msg();
    return m.find("can't allocate memory") != std::string::npos ||
           m.find("not enough memory") != std::string::npos;
  } catch (...) {
    return false;
  }
}

void set_intra_op_threads(int64_t threads) {
  torch::set_num_threads(static_cast<int>(threads));
#ifdef _OPENMP
  // The library's own loops run on the OpenMP runtime it was linked with: LibTorch's on
  // Debian, where this repeats the setting. PyTorch's wheels carry a copy of their own, and
  // which copy each library's calls bind to depends on the load order; this sets both.
  omp_set_num_threads(static_cast<int>(threads));
#endif
}

void note_deterministic_threads(const JobSpec& spec) {
  if (spec.resources.threads != 0 || !spec.semantic.deterministic || host_cores() == 1) return;
  spdlog::info(
      "[runtime] deterministic mode with resources.threads 0: one intra-op thread, since the "
      "thread count changes LibTorch's CPU results; set resources.threads to use more (every "
      "run that must agree bit for bit with the same value)");
}

void configure_runtime(const JobSpec& spec) {
  keep_freed_memory();
  const auto threads = intra_op_threads(spec, /*local_workers=*/1);
  note_deterministic_threads(spec);  // in-process; a launched worker's was resolved already
  set_intra_op_threads(threads);
  compat::set_deterministic_algorithms(spec.semantic.deterministic);
  compat::use_full_float32();
  if (spec.resources.memory_limit_mb > 0) {
    // OpenBLAS (0.3.21, Debian 12) retries a failed allocation of its per-thread work
    // buffers forever instead of failing (OpenBLAS issue 5289): let it allocate them for
    // the main thread and every intra-op thread before memory is capped.
    const auto a = torch::ones({256, 256});
    torch::mm(a, a);
    at::parallel_for(0, threads, 1, [&](int64_t, int64_t) { torch::mm(a, a); });
    // The soft limit only, so that a process running several jobs can lift it again.
    rlimit limit{};
    getrlimit(RLIMIT_DATA, &limit);
    const auto bytes = static_cast<rlim_t>(spec.resources.memory_limit_mb) << 20;
    limit.rlim_cur = limit.rlim_max == RLIM_INFINITY ? bytes : std::min(bytes, limit.rlim_max);
    if (setrlimit(RLIMIT_DATA, &limit) != 0) {
      throw Error(fmt::format("cannot limit memory to {} MiB: {}", spec.resources.memory_limit_mb,
                              std::strerror(errno)));
    }
  }
}

}  // namespace vflow::engine
