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

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  const fs::path target(path_);
  dir_ = target.has_parent_path() ? target.parent_path().string() : std::string(".");
  std::error_code ec;
  // Never replace a device, a FIFO or a directory by renaming a file over it.
  const auto status = fs::status(target, ec);
  if (!ec && fs::exists(status) && !fs::is_regular_file(status)) {
    error_ = fmt::format("{} exists and is not a regular file", path_);
    return;
  }
  fs::create_directories(dir_, ec);
  if (ec) {
    error_ = fmt::format("cannot create directory {}: {}", dir_, ec.message());
    return;
  }
  tmp_ = fmt::format("{}.tmp-{}", path_, ::getpid());
  // A temporary file of this name can only be a dead process's (the pid is reused).
  ::unlink(tmp_.c_str());
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd_ < 0) error_ = fmt::format("cannot create {}: {}", tmp_, std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !tmp_.empty()) ::unlink(tmp_.c_str());
}

size_t AtomicFile::write(const void* data, size_t size) {
  if (error_.empty()) {
    if (const int err = write_all(fd_, std::string_view(static_cast<const char*>(data), size))) {
      error_ = fmt::format("cannot write {}: {}", tmp_, std::strerror(err));
    }
  }
  return size;
}

std::string AtomicFile::commit() {
  if (!error_.empty()) return error_;
  if (::fsync(fd_) != 0)
    return error_ = fmt::format("cannot fsync {}: {}", tmp_, std::strerror(errno));
  const int fd = fd_;
  fd_ = -1;
  // close() reports delayed write errors of some file systems (NFS).
  if (::close(fd) != 0)
    return error_ = fmt::format("cannot close {}: {}", tmp_, std::strerror(errno));
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    return error_ = fmt::format("cannot rename {} to {}: {}", tmp_, path_, std::strerror(errno));
  }
  committed_ = true;
  // The file is complete and in place; a directory that cannot be fsynced only means the
  // rename may not survive a crash of the machine, as a crash a moment earlier would not.
  fsync_directory(dir_);
  return "";
}

std::string write_file_atomically(const std::string& path, std::string_view bytes) {
  AtomicFile file(path);
  file.write(bytes.data(), bytes.size());
  return file.commit();
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
  size_t written = 0;
  int err = 0;
  while (written < record.size()) {
    const ssize_t n = ::write(fd_, record.data() + written, record.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : EIO;
      break;
    }
    written += static_cast<size_t>(n);
  }
  if (err == 0) return "";
  // Take the partial record back off, so that the next append starts on a record
  // boundary: it ends where this descriptor's last append ended, and is cut only while it
  // is still the end of the file (another writer may have appended since).
  const off_t end = ::lseek(fd_, 0, SEEK_CUR);
  struct stat st {};
  if (written > 0 && end >= static_cast<off_t>(written) && ::fstat(fd_, &st) == 0 &&
      st.st_size == end && ::ftruncate(fd_, end - static_cast<off_t>(written)) != 0) {
    return fmt::format("{} (and the partial record could not be removed: {})", std::strerror(err),
                       std::strerror(errno));
  }
  return std::strerror(err);
}

}  // namespace vflow::core
