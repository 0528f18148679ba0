// Reading files that come from outside: job specs, profiles, data sets, checkpoints.
//
// Every such path is opened without blocking and refused unless it is a regular file:
// a directory, a FIFO (which would block a plain open until a writer appears), a
// device such as /dev/zero (which never ends) or a socket gets a message instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace vflow::core {

/// A file descriptor that closes itself.
class InputFd {
 public:
  InputFd() = default;
  explicit InputFd(int fd) : fd_(fd) {}
  ~InputFd();
  InputFd(InputFd&& other) noexcept : fd_(other.release()) {}
  InputFd& operator=(InputFd&& other) noexcept;
  InputFd(const InputFd&) = delete;
  InputFd& operator=(const InputFd&) = delete;

  int get() const { return fd_; }
  /// Hands the descriptor to a reader that closes it itself (zlib's gzdopen).
  int release();

 private:
  int fd_ = -1;
};

/// The result of opening an input: a descriptor and the file's size, or why not.
struct OpenedInput {
  InputFd fd;
  uint64_t size = 0;
  std::string error;  ///< empty on success, else e.g. "is a directory, not a file"
  bool ok() const { return error.empty(); }
};

/// Opens `path` for reading if it is a regular file.
OpenedInput open_input_file(const std::string& path);

/// Reads up to `n` bytes at `offset` of `fd` into `out` (pread, retried where interrupted);
/// fewer only at the end of the file. A read error sets `error` and returns what was read.
size_t read_at(int fd, uint64_t offset, size_t n, void* out, std::string& error);

/// Exactly `n` bytes at `offset` of `fd` into `out`; fewer (a read error, or a file that
/// ends before) is a DataError naming `name`, the size and the offset.
void read_exactly_at(int fd, uint64_t offset, size_t n, void* out, const std::string& name);

/// The whole content of a regular file, or why it could not be read (`error`).
struct InputBytes {
  std::string bytes;
  std::string error;
  bool ok() const { return error.empty(); }
};

/// Reads a regular file of at most `max_bytes` bytes; a larger one is refused unread.
InputBytes read_input_file(const std::string& path, uint64_t max_bytes);

/// "is a directory, not a file", "is a FIFO (named pipe), not a regular file", ...: what a
/// stat mode is, for messages about a path that is not a regular file.
const char* not_a_regular_file(unsigned mode);

/// "12.0 MiB", "512 bytes": a size for messages.
std::string describe_size(uint64_t bytes);

}  // namespace vflow::core
