// The one place where LibTorch version differences live (1.13 here, 2.x on
// GPU machines). Everything else calls these helpers.
#pragma once

#include <ATen/Context.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include <string>

namespace vflow::compat {

inline void set_deterministic_algorithms(bool enabled) {
  at::globalContext().setDeterministicAlgorithms(enabled, /*warn_only=*/false);
}

/// A LibTorch error message without the C++ backtrace.
inline std::string message_of(const c10::Error& e) { return e.what_without_backtrace(); }

inline std::string torch_version() { return TORCH_VERSION; }

}  // namespace vflow::compat
