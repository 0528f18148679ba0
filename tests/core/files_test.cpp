// Checked reads and writes of files (src/core/input_file.h, src/core/output_file.h). A
// full disk is imitated by a file-size limit (RLIMIT_FSIZE) in a child process: writes past
// it fail with EFBIG, as they would with ENOSPC.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <functional>

#include "core/input_file.h"
#include "core/output_file.h"
#include "support.h"

using Catch::Matchers::Contains;
using vflow::testing::read_file;
using vflow::testing::TempDir;
using vflow::testing::write_file;

namespace {
/// Runs `body` in a child process whose files may not grow past `limit` bytes; returns
/// the child's exit status (what `body` returns).
int with_file_size_limit(rlim_t limit, const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);  // a write past the limit fails instead of killing
    const rlimit r{limit, limit};
    ::setrlimit(RLIMIT_FSIZE, &r);
    ::_exit(body());
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}
}  // namespace

TEST_CASE("an append that fails is taken back off: the file holds whole records", "[unit]") {
  TempDir dir;
  const std::string path = dir.file("log.jsonl");
  const int status = with_file_size_limit(105, [&] {
    vflow::core::AppendFile file(path);
    int failed = 0;
    for (int i = 0; i < 10; ++i) {
      if (!file.append("{\"record\": " + std::to_string(i) + ", \"pad\": \"xxxxxxxx\"}\n")
               .empty()) {
        ++failed;
      }
    }
    const std::string small = file.append("{}\n");  // still fits after the cut-back
    return failed == 7 && small.empty() ? 0 : 1;
  });
  CHECK(status == 0);
  // Three records of 33 bytes, then "{}\n": no partial fourth record before it.
  const std::string text = read_file(path);
  CHECK(text.size() == 3 * 33 + 3);
  CHECK(text.substr(text.size() - 3) == "{}\n");
}

TEST_CASE("an atomic write that fails leaves the old file and no temporary file", "[unit]") {
  TempDir dir;
  const std::string path = dir.file("state.bin");
  write_file(path, "old contents");
  std::string error;
  const int status = with_file_size_limit(1000, [&] {
    const std::string e = vflow::core::write_file_atomically(path, std::string(5000, 'x'));
    return e.find("File too large") != std::string::npos &&
                   e.find(path + ".tmp-") != std::string::npos
               ? 0
               : 1;
  });
  CHECK(status == 0);
  CHECK(read_file(path) == "old contents");
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    (void)entry;
    ++files;
  }
  CHECK(files == 1);
  CHECK(vflow::core::write_file_atomically(path, "new").empty());
  CHECK(read_file(path) == "new");
  CHECK_THAT(vflow::core::write_file_atomically("/dev/null", "x"),
             Contains("/dev/null exists and is not a regular file"));
}

TEST_CASE("a log is never opened on a FIFO or a device", "[unit]") {
  TempDir dir;
  REQUIRE(::mkfifo(dir.file("fifo").c_str(), 0600) == 0);
  const vflow::core::AppendFile fifo(dir.file("fifo"));  // returns at once: no reader needed
  CHECK_FALSE(fifo.is_open());
  CHECK_THAT(fifo.error(), Contains("is a FIFO"));
  const vflow::core::AppendFile device("/dev/null");
  CHECK_FALSE(device.is_open());
  CHECK_THAT(device.error(), Contains("is a character device"));
  const vflow::core::AppendFile file(dir.file("log"));
  CHECK(file.is_open());
}

TEST_CASE("input files must be regular files and are bounded in size", "[unit]") {
  TempDir dir;
  write_file(dir.file("small"), "0123456789");
  CHECK(vflow::core::read_input_file(dir.file("small"), 10).bytes == "0123456789");
  CHECK_THAT(vflow::core::read_input_file(dir.file("small"), 9).error,
             Contains("is 10 bytes, more than the 9 bytes such a file may have"));
  REQUIRE(::mkfifo(dir.file("fifo").c_str(), 0600) == 0);
  CHECK_THAT(vflow::core::read_input_file(dir.file("fifo"), 10).error, Contains("is a FIFO"));
  CHECK_THAT(vflow::core::read_input_file("/dev/zero", 10).error,
             Contains("is a character device"));
  CHECK_THAT(vflow::core::read_input_file(dir.path(), 10).error, Contains("is a directory"));
  CHECK_THAT(vflow::core::read_input_file(dir.file("none"), 10).error,
             Contains("cannot open: No such file or directory"));
}
