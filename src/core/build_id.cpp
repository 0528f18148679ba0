#include "vflow/core/build_id.h"

#include <dlfcn.h>
#include <elf.h>
#include <fmt/format.h>
#include <link.h>

#include <cstring>
#include <fstream>
#include <vector>

namespace vflow {

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

}  // namespace

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

namespace {

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

std::string loaded_build_id(const void* address) {
  Dl_info info{};
  if (dladdr(address, &info) == 0) return {};
  Search search;
  search.base = info.dli_fbase;
  dl_iterate_phdr(find_build_id, &search);
  return search.id;
}

}  // namespace vflow
