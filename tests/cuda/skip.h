// Visible skipping for the [cuda] tests (Catch2 2.x has no SKIP).
#pragma once

#include <string>

#include "support.h"  // kSkipped

namespace vflow::testing {

/// Why no [cuda] test can run here (no CUDA device for NCCL nor for LibTorch); empty
/// when at least some can.
std::string gpu_missing();

/// Ends the test process with kSkipped after printing "SKIPPED [cuda]: why" unless
/// `available`. Each test runs in its own process under ctest.
void skip_unless(bool available, const std::string& why);

}  // namespace vflow::testing
