#include "core/input_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "vflow/core/error.h"

namespace vflow::core {

InputFd::~InputFd() {
  if (fd_ >= 0) ::close(fd_);
}

InputFd& InputFd::operator=(InputFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

int InputFd::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

const char* not_a_regular_file(unsigned mode) {
  if (S_ISDIR(mode)) return "is a directory, not a file";
  if (S_ISFIFO(mode)) return "is a FIFO (named pipe), not a regular file";
  if (S_ISCHR(mode)) return "is a character device, not a regular file";
  if (S_ISBLK(mode)) return "is a block device, not a regular file";
  if (S_ISSOCK(mode)) return "is a socket, not a regular file";
  return "is not a regular file";
}

OpenedInput open_input_file(const std::string& path) {
  OpenedInput out;
  // Looked at before it is opened: opening a device can have effects of its own, and a
  // socket cannot be opened at all.
  struct stat before {};
  if (::stat(path.c_str(), &before) == 0 && !S_ISREG(before.st_mode)) {
    out.error = not_a_regular_file(before.st_mode);
    return out;
  }
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    out.error = fmt::format("cannot open: {}", std::strerror(errno));
    return out;
  }
  out.fd = InputFd(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    out.error = fmt::format("cannot stat: {}", std::strerror(errno));
    return out;
  }
  if (!S_ISREG(st.st_mode)) {
    out.error = not_a_regular_file(st.st_mode);
    return out;
  }
  // Regular files never block; clear the flag so that readers see ordinary semantics.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  out.size = static_cast<uint64_t>(st.st_size);
  return out;
}

size_t read_at(int fd, uint64_t offset, size_t n, void* out, std::string& error) {
  size_t done = 0;
  while (done < n) {
    const ssize_t got =
        ::pread(fd, static_cast<char*>(out) + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      error = std::strerror(errno);
      break;
    }
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

void read_exactly_at(int fd, uint64_t offset, size_t n, void* out, const std::string& name) {
  std::string error;
  if (read_at(fd, offset, n, out, error) != n) {
    throw DataError(fmt::format("{}: cannot read {} bytes at offset {}: {}", name, n, offset,
                                error.empty() ? "the file is shorter" : error));
  }
}

InputBytes read_input_file(const std::string& path, uint64_t max_bytes) {
  InputBytes out;
  OpenedInput in = open_input_file(path);
  if (!in.ok()) {
    out.error = std::move(in.error);
    return out;
  }
  if (in.size > max_bytes) {
    out.error = fmt::format("is {}, more than the {} such a file may have", describe_size(in.size),
                            describe_size(max_bytes));
    return out;
  }
  try {
    out.bytes.reserve(static_cast<size_t>(in.size));
  } catch (const std::bad_alloc&) {
    out.error =
        fmt::format("is {}, more than this process can hold in memory", describe_size(in.size));
    return out;
  }
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(in.fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      out.error = fmt::format("read error: {}", std::strerror(errno));
      out.bytes.clear();
      return out;
    }
    if (n == 0) break;
    try {
      out.bytes.append(buf, static_cast<size_t>(n));
    } catch (const std::bad_alloc&) {
      out.error = "grew past what this process can hold in memory while it was read";
      out.bytes.clear();
      return out;
    }
    // A file that grows while it is read is still bounded.
    if (out.bytes.size() > max_bytes) {
      out.error = fmt::format("is more than the {} such a file may have", describe_size(max_bytes));
      out.bytes.clear();
      return out;
    }
  }
  return out;
}

std::string describe_size(uint64_t bytes) {
  if (bytes < 1024) return fmt::format("{} bytes", bytes);
  if (bytes < (1U << 20)) return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / 1024);
  if (bytes < (1U << 30)) return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20));
  return fmt::format("{:.1f} GiB", static_cast<double>(bytes) / (1 << 30));
}

}  // namespace vflow::core
