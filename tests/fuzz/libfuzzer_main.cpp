// The libFuzzer entry point of one target, chosen at compile time (VFLOW_FUZZ_TARGET).
#include <cstdio>
#include <cstdlib>

#include "fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto* target = vflow::fuzz::find_target(VFLOW_FUZZ_TARGET);
  if (!target) {
    std::fprintf(stderr, "no fuzz target '%s'\n", VFLOW_FUZZ_TARGET);
    std::abort();
  }
  target->run(data, size);
  return 0;
}
