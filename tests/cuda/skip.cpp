#include "cuda/skip.h"

#include <torch/torch.h>

#include <cstdlib>
#include <iostream>

#include "vflow/comm/nccl.h"

namespace vflow::testing {

std::string gpu_missing() {
  if (torch::cuda::is_available()) return {};
  const auto nccl = comm::nccl_status();
  if (nccl.usable()) return {};
  return "no CUDA device for LibTorch (a CPU-only build, or no GPU) nor for NCCL (" + nccl.reason +
         ")";
}

void skip_unless(bool available, const std::string& why) {
  if (available) return;
  std::cout << "SKIPPED [cuda]: " << why << std::endl;
  std::_Exit(kSkipped);
}

}  // namespace vflow::testing
