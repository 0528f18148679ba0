// Number parsing shared by the scheduler's readers (internal to src/scheduler).
#pragma once

#include <optional>
#include <string>
#include <type_traits>

namespace vflow::scheduler {

/// `text` as a number when all of it is one (std::stoi / std::stod syntax), else nullopt.
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
  return value;
}

}  // namespace vflow::scheduler
