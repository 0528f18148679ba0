#include "vflow/comm/nccl_environment.h"

#include <cstdlib>

namespace vflow::comm {

void prepare_nccl_environment() {
  // NCCL 2.30 and later take two ranks on one GPU (tests, small jobs) only when asked. A
  // value the user set wins; older NCCL ignores the variable (vflow refuses that case).
  if (std::getenv("NCCL_MULTI_RANK_GPU_ENABLE") == nullptr) {
    ::setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1", /*overwrite=*/0);
  }
}

}  // namespace vflow::comm
