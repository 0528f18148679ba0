// Loads the NCCL backend (libvflow_nccl) on first use, so that CPU-only programs and
// machines never load CUDA or NCCL. The backend lives next to libvflow (build tree and
// install tree alike); VFLOW_NCCL_BACKEND names another file.
#include <dlfcn.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "vflow/comm/nccl.h"
#include "vflow/comm/nccl_environment.h"

namespace vflow::comm {
namespace {

struct LoadedBackend {
  int (*version)() = nullptr;
  int (*can_grow)() = nullptr;
  int (*devices)(char*, size_t) = nullptr;
  bool (*device_name)(int, char*, size_t) = nullptr;
  long long (*memory_used)(int) = nullptr;
  Communicator* (*create)(const Rendezvous*) = nullptr;
  std::string error;  ///< why it could not be loaded
};

std::string beside_this_library(const std::string& name) {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&nccl_status), &info) == 0 || !info.dli_fname) return name;
  const std::string self = info.dli_fname;
  const auto slash = self.rfind('/');
  return slash == std::string::npos ? name : self.substr(0, slash + 1) + name;
}

const LoadedBackend& backend() {
  static LoadedBackend loaded;
  static std::once_flag once;
  std::call_once(once, [] {
    prepare_nccl_environment();  // before any NCCL call: NCCL reads its variables once
    const char* chosen = std::getenv("VFLOW_NCCL_BACKEND");
    std::string path = chosen && *chosen ? chosen : beside_this_library("libvflow_nccl.so");
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle && !(chosen && *chosen)) {
      handle = dlopen("libvflow_nccl.so", RTLD_NOW | RTLD_LOCAL);  // the loader's search path
    }
    if (!handle) {
      const char* why = dlerror();
      loaded.error = fmt::format(
          "the NCCL backend is not available: {} (vflow builds it when CMake finds CUDA's "
          "runtime and NCCL; see docs/gpu.md)",
          why ? why : path);
      return;
    }
    loaded.version = reinterpret_cast<int (*)()>(dlsym(handle, "vflow_nccl_version"));
    loaded.can_grow = reinterpret_cast<int (*)()>(dlsym(handle, "vflow_nccl_can_grow"));
    loaded.devices = reinterpret_cast<int (*)(char*, size_t)>(dlsym(handle, "vflow_nccl_devices"));
    loaded.device_name =
        reinterpret_cast<bool (*)(int, char*, size_t)>(dlsym(handle, "vflow_nccl_device_name"));
    loaded.memory_used =
        reinterpret_cast<long long (*)(int)>(dlsym(handle, "vflow_nccl_memory_used"));
    loaded.create =
        reinterpret_cast<Communicator* (*)(const Rendezvous*)>(dlsym(handle, "vflow_nccl_create"));
    if (!loaded.version || !loaded.can_grow || !loaded.devices || !loaded.device_name ||
        !loaded.memory_used || !loaded.create) {
      loaded.error =
          fmt::format("{} is not a vflow NCCL backend (its entry points are missing)", path);
      loaded.create = nullptr;
      return;
    }
    // Which NCCL a process really uses decides what it can do (shrink, grow, two ranks on
    // one GPU): say it once, with the library's path.
    auto* library = reinterpret_cast<const char* (*)()>(dlsym(handle, "vflow_nccl_library"));
    const int v = loaded.version();
    spdlog::info("[comm] NCCL backend {}: NCCL {}.{}.{} from {}", path, v / 10000, v / 100 % 100,
                 v % 100, library ? library() : "an unknown path");
  });
  return loaded;
}

}  // namespace

std::string cuda_device_name(int index) {
  const auto names = nccl_status().device_names;
  return index >= 0 && static_cast<size_t>(index) < names.size() ? names[index] : std::string();
}

NcclStatus nccl_status() {
  NcclStatus status;
  const auto& b = backend();
  if (!b.create) {
    status.reason = b.error;
    return status;
  }
  status.built = true;
  status.version = b.version();
  status.can_grow = b.can_grow() != 0;
  char why[256] = {};
  status.devices = b.devices(why, sizeof why);
  if (status.devices < 0) {
    status.devices = 0;
    status.reason = fmt::format("no CUDA device: {}", why);
  } else if (status.devices == 0) {
    status.reason = "no CUDA device is visible to this process";
  }
  for (int i = 0; i < status.devices; ++i) {
    char name[256] = {};
    status.device_names.emplace_back(b.device_name(i, name, sizeof name) ? name : "");
  }
  return status;
}

int64_t cuda_memory_used(int device) {
  const auto& b = backend();
  return b.create ? static_cast<int64_t>(b.memory_used(device)) : -1;
}

std::unique_ptr<Communicator> make_nccl_communicator(const Rendezvous& rendezvous) {
  const auto status = nccl_status();
  if (!status.usable()) {
    throw Error(fmt::format("[comm] rank {}: cannot use NCCL: {}", rendezvous.rank, status.reason));
  }
  if (rendezvous.cuda_device < 0 || rendezvous.cuda_device >= status.devices) {
    throw SpecError(fmt::format("[comm] rank {}: cuda:{} does not exist ({} CUDA device{} visible)",
                                rendezvous.rank, rendezvous.cuda_device, status.devices,
                                status.devices == 1 ? "" : "s"));
  }
  return std::unique_ptr<Communicator>(backend().create(&rendezvous));
}

BackendCapabilities backend_capabilities(Backend backend) {
  BackendCapabilities caps;
  if (backend == Backend::kNccl) {
    caps.can_shrink = true;
    caps.can_grow = nccl_status().can_grow;
  }
  return caps;
}

void choose_backend(Backend requested, const std::string& key, const torch::Device& device,
                    Rendezvous& r) {
  r.cuda_device = device.is_cuda() ? device.index() : 0;
  if (requested == Backend::kGloo || (requested == Backend::kAuto && !device.is_cuda())) {
    r.backend = Backend::kGloo;
    return;
  }
  if (!device.is_cuda()) {
    throw SpecError(fmt::format("{}: nccl needs workers on CUDA devices (resources.device)", key));
  }
  const auto nccl = nccl_status();
  if (nccl.usable()) {
    r.backend = Backend::kNccl;
  } else if (requested == Backend::kNccl) {
    throw SpecError(fmt::format("{}: nccl cannot be used: {}", key, nccl.reason));
  } else {
    spdlog::info("[comm] NCCL cannot be used ({}); the CUDA workers talk through Gloo",
                 nccl.reason);
    r.backend = Backend::kGloo;
  }
}

std::unique_ptr<Communicator> make_communicator(const Rendezvous& rendezvous) {
  switch (rendezvous.backend) {
    case Backend::kNccl:
      return make_nccl_communicator(rendezvous);
    case Backend::kGloo:
      return make_gloo_communicator(rendezvous);
    case Backend::kAuto:
      break;
  }
  throw InternalError(
      "[comm] a rendezvous whose backend is not chosen (auto): choose_backend "
      "resolves it first");
}

}  // namespace vflow::comm
