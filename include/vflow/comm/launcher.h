// The coordinator and the local launcher (DESIGN.md §1, "Coordinator").
//
// The coordinator is the stable process that hosts the job's rendezvous store;
// it is never a worker, because a worker may leave. launch_local() makes the
// current process the coordinator and starts K worker processes on this host.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "vflow/comm/communicator.h"

namespace vflow::comm {

/// The store key under which workers count themselves out.
extern const char* const kLeftKey;

/// Hosts the job's store (a c10d TCPStore server).
class Coordinator {
 public:
  /// Listens on host:port; port 0 picks a free port.
  Coordinator(const std::string& host, int port, std::chrono::milliseconds timeout);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;
  const std::string& host() const { return host_; }
  int port() const;
  /// Serves until `workers` workers have left (Communicator::leave) or `stop` is set.
  /// Returns true when all workers left.
  bool serve(int workers, const std::atomic<bool>* stop);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string host_;
};

struct LaunchOptions {
  int workers = 1;
  std::vector<std::string> command;  ///< program and arguments each worker runs
  std::chrono::milliseconds timeout{30000};
  /// Set by the caller (e.g. a signal handler): forward SIGTERM to the workers.
  const std::atomic<bool>* stop_flag = nullptr;
};

/// Hosts the coordinator, starts `workers` processes running `command` with
/// VFLOW_RANK, VFLOW_WORLD_SIZE and VFLOW_STORE set, forwards their output line by
/// line with a "[rank k] " prefix, and waits. When a worker fails, the others are
/// stopped (SIGTERM, then SIGKILL after a grace period). Returns 0 when all
/// workers succeed, else the first failing worker's exit code (128 + signal when killed).
int launch_local(const LaunchOptions& options);

/// The rendezvous a launcher handed to this process through the environment, or
/// nullopt. Read in this order: vflow's own launcher (VFLOW_RANK, VFLOW_WORLD_SIZE,
/// VFLOW_STORE=host:port); torchrun and Kubernetes training operators (RANK,
/// WORLD_SIZE); OpenMPI's mpirun (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE);
/// Slurm's srun (SLURM_PROCID, SLURM_NTASKS). The last three need MASTER_ADDR and
/// MASTER_PORT, and rank 0 hosts the store there (host_store).
std::optional<Rendezvous> rendezvous_from_environment(std::chrono::milliseconds timeout);

/// Worker processes of this job on this host: VFLOW_LOCAL_WORLD_SIZE (vflow's
/// launcher), LOCAL_WORLD_SIZE (torchrun), OMPI_COMM_WORLD_LOCAL_SIZE (mpirun),
/// SLURM_NTASKS_PER_NODE (srun), else 1.
int64_t local_workers();

}  // namespace vflow::comm
