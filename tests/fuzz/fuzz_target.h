// Fuzz targets: each feeds one input to one of vflow's parsers of outside input, the
// real code, not a copy. The same functions run under libFuzzer (scripts/fuzz.sh, with
// AddressSanitizer and UBSan) and in the test command, which replays every committed
// corpus through the normal build (vflow_fuzz_replay).
//
// The contract a target checks: a parser refuses a bad input with a vflow::Error that
// carries a message. Anything else (another exception type, an InternalError, an empty
// message, a crash, a hang) is a finding; the target aborts so that both drivers see it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace vflow::fuzz {

/// Returns "" when the input was accepted, else the message it was refused with.
using TargetFn = std::string (*)(const uint8_t* data, size_t size);

struct Target {
  const char* name;
  TargetFn run;
};

/// Every target, in the order scripts/fuzz.sh runs them.
const std::vector<Target>& targets();
const Target* find_target(const std::string& name);

/// Runs `body`, aborting on anything but a vflow::Error (not an InternalError) with a
/// message. `expected_prefix`, when not empty, is what every message must start with
/// (the input's name, so that errors stay located). Returns the message, or "" when
/// `body` accepted the input.
template <typename Body>
std::string expect_clean_refusal(Body&& body, const std::string& expected_prefix = "");

/// A file with `size` bytes of `data`, in memory (memfd), named by a path the parsers
/// open like any other: "/proc/self/fd/N".
class MemoryFile {
 public:
  MemoryFile(const uint8_t* data, size_t size);
  ~MemoryFile();
  MemoryFile(const MemoryFile&) = delete;
  MemoryFile& operator=(const MemoryFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

[[noreturn]] void finding(const std::string& what);

}  // namespace vflow::fuzz

#include "fuzz_target_impl.h"
