// The conventions by which launchers tell a worker process who it is: vflow's own
// launcher, torchrun and Kubernetes training operators, OpenMPI's mpirun, Slurm's srun.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "vflow/comm/rendezvous.h"

namespace vflow::job {

/// The rendezvous a launcher handed to this process through the environment, or
/// nullopt. Read in this order: vflow's own launcher (VFLOW_RANK, VFLOW_WORLD_SIZE,
/// VFLOW_STORE=host:port); torchrun and Kubernetes training operators (RANK,
/// WORLD_SIZE); OpenMPI's mpirun (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE);
/// Slurm's srun (SLURM_PROCID, SLURM_NTASKS). The last three need MASTER_ADDR and
/// MASTER_PORT, and rank 0 hosts the store there (host_store). The store is vflow's
/// embedded one (job::connect_embedded_store, job::host_embedded_store), which
/// job::run_role opens.
std::optional<comm::Rendezvous> rendezvous_from_environment(std::chrono::milliseconds timeout);

/// A worker of an elastic job, as vflow's launcher starts it (VFLOW_MEMBER and
/// VFLOW_STORE=host:port, or VFLOW_CONTROL=etcd://... and VFLOW_JOB for a job whose
/// control store is a cluster's), or nullopt.
struct ElasticWorkerEnvironment {
  std::string member;
  std::string store_host;
  int store_port = 0;
  std::string control;  ///< VFLOW_CONTROL, or empty
  std::string job;      ///< VFLOW_JOB
};
std::optional<ElasticWorkerEnvironment> elastic_worker_from_environment();

/// Worker processes of this job on this host: VFLOW_LOCAL_WORLD_SIZE (vflow's
/// launcher), LOCAL_WORLD_SIZE (torchrun), OMPI_COMM_WORLD_LOCAL_SIZE (mpirun),
/// SLURM_NTASKS_PER_NODE (srun), else 1.
int64_t local_workers();
/// This process's index among the workers on its host, from the same conventions
/// (VFLOW_LOCAL_RANK set by vflow's launcher, LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK,
/// SLURM_LOCALID); 0 when none is set.
int64_t local_rank();

/// What a node agent's launcher says about where it runs: under Slurm (srun, one task per
/// node) the name "slurm<job id>-<node>", the node as its host, and one slot per GPU Slurm
/// gave the task (SLURM_STEP_GPUS or SLURM_JOB_GPUS, as "cuda:0", "cuda:1", ...) or else per
/// CPU (SLURM_CPUS_PER_TASK). Empty fields where it says nothing.
struct AgentPlace {
  std::string name;
  std::string host;
  std::vector<std::string> slots;
};
AgentPlace agent_place_from_environment();

}  // namespace vflow::job
