// The [cuda] tests' entry point. ctest runs every test case in its own process; where a
// test cannot run (no CUDA device, no NCCL backend, a CPU-only LibTorch) it prints why
// and exits with 77, which ctest reports as "Skipped" (SKIP_RETURN_CODE), never passed.
#include <cstring>
#include <iostream>

#include "catch_session.h"
#include "cuda/skip.h"

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing = listing || std::strncmp(argv[i], "--list", 6) == 0;
  if (!listing) {
    const auto why = vflow::testing::gpu_missing();
    if (!why.empty()) {
      std::cout << "SKIPPED [cuda]: " << why << "\n";
      return vflow::testing::kSkipped;
    }
  }
  return vflow::testing::run_catch(argc, argv);
}
