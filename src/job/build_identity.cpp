// The identity of this build, compared between the hosts of a job on a cluster store.
#include "vflow/job/build_identity.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <torch/version.h>

#include <filesystem>

#include "vflow/core/build_id.h"

namespace vflow::job {

std::string build_identity() {
  static const std::string identity = [] {
    // The engine's library names the build: this code lives in the control plane's
    // library, which programs without LibTorch (node agents) load alone, and the engine's
    // lies beside it. A program linked statically has none beside: its own id then.
    std::string id;
    Dl_info info{};
    if (dladdr(reinterpret_cast<const void*>(&build_identity), &info) != 0 &&
        info.dli_fname != nullptr) {
      const auto beside = std::filesystem::path(info.dli_fname).parent_path() / "libvflow.so";
      if (std::filesystem::path(info.dli_fname).filename() != beside.filename()) {
        id = file_build_id(beside.string());
      }
    }
    if (id.empty()) id = loaded_build_id(reinterpret_cast<const void*>(&build_identity));
    // The load address of the main program is 0 in dl_iterate_phdr's terms when it is not
    // position independent: then no id is found, and the versions alone must match.
    return fmt::format("vflow {} (control protocol {}, LibTorch {}.{}.{}, build {})", VFLOW_VERSION,
                       kControlProtocol, TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR,
                       TORCH_VERSION_PATCH, id.empty() ? "unknown" : id.substr(0, 16));
  }();
  return identity;
}

}  // namespace vflow::job
