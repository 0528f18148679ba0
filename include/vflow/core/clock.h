// The monotonic clock that phases, steps and waits are timed by.
#pragma once

#include <chrono>

namespace vflow {

/// Seconds from `t` to now, on the steady clock.
inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace vflow
