// The benchmarks' measure of memory: this process's peak resident memory since it was
// exec'd (VmHWM). Not ru_maxrss, which also counts the memory of the process it was forked
// from before the exec (the benchmark's parent, with LibTorch and its data).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace vflow::bench {

/// VmHWM in KiB; -1 where /proc does not say.
inline int64_t peak_resident_kib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

}  // namespace vflow::bench
