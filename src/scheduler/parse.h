// Number parsing shared by the scheduler's readers (internal to src/scheduler).
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>

namespace vflow::scheduler {

/// Traces and throughput tables are read whole; a million-job trace is about 50 MB.
inline constexpr uint64_t kMaxTableFileBytes = uint64_t{4} << 30;

/// `text` as a number when all of it is one (std::stoi / std::stod syntax) and finite,
/// else nullopt.
template <typename Number>
std::optional<Number> parse_whole(const std::string& text) {
  size_t used = 0;
  Number value{};
  try {
    if constexpr (std::is_integral_v<Number>) {
      value = static_cast<Number>(std::stoi(text, &used));
    } else {
      value = static_cast<Number>(std::stod(text, &used));
    }
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used == 0 || used != text.size()) return std::nullopt;
  if constexpr (std::is_floating_point_v<Number>) {
    if (!std::isfinite(value)) return std::nullopt;
  }
  return value;
}

}  // namespace vflow::scheduler
