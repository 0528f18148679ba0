#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "fuzz_target.h"

namespace vflow::fuzz {

void finding(const std::string& what) {
  std::fprintf(stderr, "vflow fuzz finding: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

MemoryFile::MemoryFile(const uint8_t* data, size_t size) {
  fd_ = ::memfd_create("vflow-fuzz-input", MFD_CLOEXEC);
  if (fd_ < 0) finding("memfd_create failed (the harness, not vflow)");
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd_, data + done, size - done);
    if (n <= 0) finding("writing the input to memory failed (the harness, not vflow)");
    done += static_cast<size_t>(n);
  }
  path_ = "/proc/self/fd/" + std::to_string(fd_);
}

MemoryFile::~MemoryFile() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace vflow::fuzz
