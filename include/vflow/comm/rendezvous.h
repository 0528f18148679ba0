// Where and how a worker meets its peers: what a launcher, a coordinator and a worker
// agree on before any communicator exists. No LibTorch: the control plane
// (vflow_control) hands rendezvous out without linking it.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "vflow/comm/key_value_store.h"

namespace vflow::comm {

/// The collectives' library: what resources.backend asks for, and what a rendezvous chose.
enum class Backend {
  kAuto,  ///< "auto": nccl on CUDA devices where it can be used, else gloo (asked only)
  kGloo,  ///< "gloo"
  kNccl,  ///< "nccl"
};
inline std::string to_string(Backend b) {
  return b == Backend::kGloo ? "gloo" : b == Backend::kNccl ? "nccl" : "auto";
}

/// The store key under which Communicator::leave counts a rank out: a coordinator that
/// only hosts the store for externally started workers serves until all have left.
inline constexpr const char* kLeftKey = "job/workers_left";

/// Where and how a worker meets its peers.
struct Rendezvous {
  std::string store_host = "127.0.0.1";  ///< the coordinator's store
  int store_port = 0;
  /// Set: the ranks meet through this store (a cluster's control store, e.g. etcd)
  /// instead of a TCPStore at store_host:store_port, which then only names the host
  /// whose direction picks Gloo's network interface (one of the store's endpoints).
  std::shared_ptr<KeyValueStore> store;
  int rank = 0;
  int world_size = 1;
  std::string generation = "0";  ///< store prefix: each generation gets a fresh one
  std::chrono::milliseconds timeout{30000};
  /// This process hosts the store itself (rank 0 under an external launcher such as
  /// torchrun, mpirun or srun, where no vflow coordinator runs).
  bool host_store = false;
  Backend backend = Backend::kGloo;  ///< gloo or nccl (see make_communicator)
  int cuda_device = 0;               ///< nccl: this rank's CUDA device index
  /// gloo: ranks that all run on this host (and share its namespaces) sum host tensors
  /// through a shared-memory segment instead of loopback sockets (docs/design.md, "Ranks
  /// on one host"); elsewhere, or when the segment cannot be reserved, Gloo's sockets.
  bool shared_memory = true;
  /// nccl: > 0 when this rank is new and joins the communicator that the earlier
  /// members, ranks 0 .. grown_from - 1, grow (Communicator::grow), instead of
  /// initialising one with everybody afresh.
  int grown_from = 0;
};

}  // namespace vflow::comm
