// The identity of this build, compared between the hosts of a job on a cluster store.
#include "vflow/job/build_identity.h"

#include <dlfcn.h>
#include <elf.h>
#include <fmt/format.h>
#include <link.h>
#include <torch/version.h>

#include <cstring>

namespace vflow::job {

namespace {

struct Search {
  const void* base = nullptr;  // where the object holding this code is loaded
  std::string id;              // its GNU build id, in hex
};

int find_build_id(dl_phdr_info* info, size_t, void* data) {
  auto& search = *static_cast<Search*>(data);
  if (reinterpret_cast<const void*>(info->dlpi_addr) != search.base) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto& header = info->dlpi_phdr[i];
    if (header.p_type != PT_NOTE) continue;
    const char* at = reinterpret_cast<const char*>(info->dlpi_addr + header.p_vaddr);
    const char* end = at + header.p_memsz;
    while (at + sizeof(ElfW(Nhdr)) <= end) {
      const auto* note = reinterpret_cast<const ElfW(Nhdr)*>(at);
      const char* name = at + sizeof(ElfW(Nhdr));
      const char* desc = name + ((note->n_namesz + 3) & ~3u);
      if (note->n_type == NT_GNU_BUILD_ID && note->n_namesz == 4 &&
          std::memcmp(name, "GNU", 4) == 0 && desc + note->n_descsz <= end) {
        for (unsigned k = 0; k < note->n_descsz; ++k) {
          search.id += fmt::format("{:02x}", static_cast<unsigned char>(desc[k]));
        }
        return 1;
      }
      at = desc + ((note->n_descsz + 3) & ~3u);
    }
  }
  return 1;
}

}  // namespace

std::string build_identity() {
  static const std::string identity = [] {
    Search search;
    Dl_info info{};
    if (dladdr(reinterpret_cast<const void*>(&build_identity), &info) != 0) {
      search.base = info.dli_fbase;
      dl_iterate_phdr(find_build_id, &search);
    }
    // The load address of the main program is 0 in dl_iterate_phdr's terms when it is not
    // position independent: then no id is found, and the versions alone must match.
    return fmt::format("vflow {} (control protocol {}, LibTorch {}.{}.{}, build {})", VFLOW_VERSION,
                       kControlProtocol, TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR,
                       TORCH_VERSION_PATCH,
                       search.id.empty() ? "unknown" : search.id.substr(0, 16));
  }();
  return identity;
}

}  // namespace vflow::job
