// The environment NCCL reads, set before any thread exists. No LibTorch and no CUDA: a
// node agent (vflow_control) sets it for the workers it starts.
#pragma once

namespace vflow::comm {

/// Sets the NCCL variables vflow relies on (NCCL_MULTI_RANK_GPU_ENABLE=1, for two ranks on
/// one GPU with NCCL 2.30 and later) unless the user set them. The backend's loader calls
/// it before any NCCL call; a program calls it first thing in main, before it starts
/// threads, because changing the environment is not safe while other threads read it.
void prepare_nccl_environment();

}  // namespace vflow::comm
