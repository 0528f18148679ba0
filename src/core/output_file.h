// Writing files with checked calls only, so that a full disk or a failing device is an
// error message naming the file and the cause, never an abort, a half-written file
// that looks whole, or a record cut in the middle.
#pragma once

#include <string>
#include <string_view>

namespace vflow::core {

/// Writes `bytes` to `path` so that readers see the old file or the whole new one: a
/// temporary file beside it, every byte written and fsynced, a rename over `path` and
/// an fsync of the directory. Returns "" on success; otherwise the temporary file is
/// gone, `path` is untouched and the message says what failed, e.g.
/// "cannot write job.pt.tmp-4242: No space left on device".
std::string write_file_atomically(const std::string& path, std::string_view bytes);

/// A file written in pieces that readers see whole or not at all: the steps of
/// write_file_atomically, for a writer that produces the bytes as it goes. Every write is
/// checked; the first failure is kept and later writes do nothing but report success, so
/// that a producer that cannot handle errors (LibTorch's archive writer, which throws from
/// its destructor) can be fed to the end. commit() then says whether it all worked.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  /// Removes the temporary file unless commit() succeeded.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  /// Appends `size` bytes (or, after a failure, nothing); always returns `size`.
  size_t write(const void* data, size_t size);
  /// fsync, rename over the path, fsync of the directory: "" on success, else the first
  /// failure ("cannot write job.pt.tmp-4242: No space left on device").
  std::string commit();

 private:
  std::string path_;
  std::string tmp_;
  std::string dir_;
  int fd_ = -1;
  std::string error_;
  bool committed_ = false;
};

/// A file that grows by whole records (lines of a log, framed events). Each record is
/// one write; one that fails or is cut short is taken back off the end, so the file
/// never holds part of a record.
class AppendFile {
 public:
  /// Opens `path` for appending, creating it (mode 0644) unless `exclusive` demands a new
  /// file; error() says why it could not.
  explicit AppendFile(const std::string& path, bool exclusive = false);
  ~AppendFile();
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;

  bool is_open() const { return fd_ >= 0; }
  /// Why the file could not be opened (with errno's text), empty when it is open.
  const std::string& error() const { return error_; }
  /// errno of the failed open (EEXIST for an exclusive open of an existing file).
  int error_number() const { return errno_; }
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }

  /// Appends `record`; returns "" or the cause ("No space left on device").
  std::string append(std::string_view record);

 private:
  std::string path_;
  int fd_ = -1;
  int errno_ = 0;
  std::string error_;
};

}  // namespace vflow::core
