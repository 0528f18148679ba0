#include "core/output_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/input_file.h"

namespace vflow::core {

namespace {

namespace fs = std::filesystem;

/// Writes all of `bytes` at the descriptor's position; returns 0 or errno.
int write_all(int fd, std::string_view bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;
    done += static_cast<size_t>(n);
  }
  return 0;
}

int fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno;
  const int rc = ::fsync(fd) == 0 ? 0 : errno;
  ::close(fd);
  return rc;
}

}  // namespace

std::string write_file_atomically(const std::string& path, std::string_view bytes) {
  const fs::path target(path);
  const std::string dir =
      target.has_parent_path() ? target.parent_path().string() : std::string(".");
  std::error_code ec;
  // Never replace a device, a FIFO or a directory by renaming a file over it.
  const auto status = fs::status(target, ec);
  if (!ec && fs::exists(status) && !fs::is_regular_file(status)) {
    return fmt::format("{} exists and is not a regular file", path);
  }
  fs::create_directories(dir, ec);
  if (ec) return fmt::format("cannot create directory {}: {}", dir, ec.message());
  const std::string tmp = fmt::format("{}.tmp-{}", path, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fmt::format("cannot create {}: {}", tmp, std::strerror(errno));
  int err = write_all(fd, bytes);
  const char* what = "write";
  if (err == 0 && ::fsync(fd) != 0) {
    err = errno;
    what = "fsync";
  }
  // close() reports delayed write errors of some file systems (NFS).
  if (::close(fd) != 0 && err == 0) {
    err = errno;
    what = "close";
  }
  if (err == 0 && std::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    what = "rename";
  }
  if (err != 0) {
    ::unlink(tmp.c_str());
    if (what == std::string_view("rename")) {
      return fmt::format("cannot rename {} to {}: {}", tmp, path, std::strerror(err));
    }
    return fmt::format("cannot {} {}: {}", what, tmp, std::strerror(err));
  }
  if (const int e = fsync_directory(dir); e != 0) {
    return fmt::format("cannot fsync directory {}: {}", dir, std::strerror(e));
  }
  return "";
}

AppendFile::AppendFile(const std::string& path, bool exclusive) : path_(path) {
  // O_NONBLOCK: opening a FIFO for writing would otherwise wait for a reader.
  const int flags =
      O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NONBLOCK | (exclusive ? O_EXCL : 0);
  fd_ = ::open(path.c_str(), flags, 0644);
  if (fd_ < 0) {
    errno_ = errno;
    error_ = errno_ == ENXIO ? "is a FIFO (named pipe), not a regular file" : std::strerror(errno_);
    return;
  }
  struct stat st {};
  const bool stated = ::fstat(fd_, &st) == 0;
  if (!stated || !S_ISREG(st.st_mode)) {
    errno_ = stated ? EINVAL : errno;
    error_ = stated ? not_a_regular_file(st.st_mode) : std::strerror(errno_);
    ::close(fd_);
    fd_ = -1;
    return;
  }
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
}

AppendFile::~AppendFile() {
  if (fd_ >= 0) ::close(fd_);
}

std::string AppendFile::append(std::string_view record) {
  if (fd_ < 0) return error_;
  const off_t before = ::lseek(fd_, 0, SEEK_END);
  const int err = write_all(fd_, record);
  if (err == 0) return "";
  // Take the partial record back off; the next append starts on a record boundary. (A
  // record another process appended in between would go too: vflow's logs have one
  // writer at a time.)
  if (before >= 0 && ::ftruncate(fd_, before) != 0) {
    return fmt::format("{} (and the partial record could not be removed: {})", std::strerror(err),
                       std::strerror(errno));
  }
  return std::strerror(err);
}

}  // namespace vflow::core
