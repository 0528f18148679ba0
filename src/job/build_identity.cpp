// The identity of this build, compared between the hosts of a job on a cluster store.
#include "vflow/job/build_identity.h"

#include <dlfcn.h>
#include <elf.h>
#include <fmt/format.h>
#include <link.h>
#include <torch/version.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

namespace vflow::job {

namespace {

/// The GNU build id in the ELF notes between `at` and `end`, in hex; empty when none.
std::string build_id_in_notes(const char* at, const char* end) {
  std::string id;
  while (at + sizeof(ElfW(Nhdr)) <= end) {
    const auto* note = reinterpret_cast<const ElfW(Nhdr)*>(at);
    const char* name = at + sizeof(ElfW(Nhdr));
    const char* desc = name + ((note->n_namesz + 3) & ~3u);
    if (note->n_type == NT_GNU_BUILD_ID && note->n_namesz == 4 &&
        std::memcmp(name, "GNU", 4) == 0 && desc + note->n_descsz <= end) {
      for (unsigned k = 0; k < note->n_descsz; ++k) {
        id += fmt::format("{:02x}", static_cast<unsigned char>(desc[k]));
      }
      return id;
    }
    at = desc + ((note->n_descsz + 3) & ~3u);
  }
  return id;
}

/// The GNU build id of the ELF file at `path`, read from its note segments without
/// loading it; empty when it cannot be read or has none.
std::string file_build_id(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ElfW(Ehdr) header{};
  if (!in.read(reinterpret_cast<char*>(&header), sizeof(header)) ||
      std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0 ||
      header.e_phentsize != sizeof(ElfW(Phdr))) {
    return {};
  }
  for (int i = 0; i < header.e_phnum; ++i) {
    ElfW(Phdr) segment{};
    in.seekg(static_cast<std::streamoff>(header.e_phoff + i * sizeof(segment)));
    if (!in.read(reinterpret_cast<char*>(&segment), sizeof(segment))) return {};
    if (segment.p_type != PT_NOTE || segment.p_filesz > (1u << 16)) continue;
    std::vector<char> notes(segment.p_filesz);
    in.seekg(static_cast<std::streamoff>(segment.p_offset));
    if (!in.read(notes.data(), static_cast<std::streamsize>(notes.size()))) return {};
    auto id = build_id_in_notes(notes.data(), notes.data() + notes.size());
    if (!id.empty()) return id;
  }
  return {};
}

struct Search {
  const void* base = nullptr;  // where the object holding this code is loaded
  std::string id;              // its GNU build id, in hex
};

int find_build_id(dl_phdr_info* info, size_t, void* data) {
  auto& search = *static_cast<Search*>(data);
  if (reinterpret_cast<const void*>(info->dlpi_addr) != search.base) return 0;
  for (int i = 0; i < info->dlpi_phnum && search.id.empty(); ++i) {
    const auto& header = info->dlpi_phdr[i];
    if (header.p_type != PT_NOTE) continue;
    const char* at = reinterpret_cast<const char*>(info->dlpi_addr + header.p_vaddr);
    search.id = build_id_in_notes(at, at + header.p_memsz);
  }
  return 1;
}

}  // namespace

std::string build_identity() {
  static const std::string identity = [] {
    // The engine's library names the build: this code lives in the control plane's
    // library, which programs without LibTorch (node agents) load alone, and the engine's
    // lies beside it. A program linked statically has none beside: its own id then.
    Search search;
    Dl_info info{};
    if (dladdr(reinterpret_cast<const void*>(&build_identity), &info) != 0) {
      if (info.dli_fname != nullptr) {
        const auto beside = std::filesystem::path(info.dli_fname).parent_path() / "libvflow.so";
        if (std::filesystem::path(info.dli_fname).filename() != beside.filename()) {
          search.id = file_build_id(beside.string());
        }
      }
      if (search.id.empty()) {
        search.base = info.dli_fbase;
        dl_iterate_phdr(find_build_id, &search);
      }
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
