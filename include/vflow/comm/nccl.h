// The NCCL backend (docs/design.md §7): collectives between CUDA devices.
//
// The backend is a separate library (libvflow_nccl), built when CMake finds CUDA's
// runtime and NCCL, and loaded on first use; a CPU-only build or machine never loads
// CUDA. Nothing in this header depends on CUDA.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "vflow/comm/communicator.h"
#include "vflow/comm/nccl_environment.h"

namespace vflow::comm {

/// What this build and machine offer for NCCL. Never throws.
struct NcclStatus {
  bool built = false;     ///< the backend library was found and loaded
  int version = 0;        ///< NCCL's version code of the loaded library (e.g. 22809)
  bool can_grow = false;  ///< it can add ranks to a communicator (ncclCommGrow, >= 2.29)
  int devices = 0;        ///< CUDA devices visible to this process
  std::vector<std::string> device_names;  ///< their names (e.g. "NVIDIA H200")
  std::string reason;                     ///< why it is not usable (empty when it is)
  bool usable() const { return built && devices > 0; }
};

NcclStatus nccl_status();
/// The name of CUDA device `index` (e.g. "NVIDIA H200"), empty when not known.
std::string cuda_device_name(int index);

/// Bytes in use on CUDA device `device` (total - free, so LibTorch's caching allocator
/// counts at its high-water mark), or -1 when the backend or device is not there.
int64_t cuda_memory_used(int device);

/// An NCCL communicator for `rendezvous.cuda_device`. The rank of generation g that is
/// rank 0 creates NCCL's unique id and publishes it in the job's store under the
/// generation's prefix; every rank initialises in non-blocking mode and gives up after
/// `rendezvous.timeout` (PeerFailure, the communicator aborted). Tensors may live on the
/// CUDA device (used in place) or on the CPU (staged through device memory). Collectives
/// wait for completion, polling NCCL's asynchronous error state; a failure or timeout
/// aborts the communicator and throws PeerFailure naming the call, file:line and NCCL's
/// message. `shrink` uses ncclCommShrink (NCCL >= 2.27) for a planned scale-in, `grow`
/// and `Rendezvous::grown_from` use ncclCommGrow (NCCL >= 2.29) for a planned scale-out;
/// after a failure, and where NCCL cannot, the members initialise afresh.
/// Throws Error when the backend is not built or no CUDA device is visible.
std::unique_ptr<Communicator> make_nccl_communicator(const Rendezvous& rendezvous);

}  // namespace vflow::comm
