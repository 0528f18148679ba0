#include "vflow/job/environment.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <tuple>

#include "vflow/core/address.h"
#include "vflow/core/error.h"

namespace vflow::job {

namespace {
std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

int env_int(const char* name, const std::string& value) {
  char* end = nullptr;
  const long v = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || v < 0) {
    throw SpecError(
        fmt::format("environment variable {}='{}' is not a non-negative integer", name, value));
  }
  return static_cast<int>(v);
}
std::pair<std::string, int> store_address(const std::string& store) {
  const HostPort address = parse_host_port(store, "VFLOW_STORE");
  return {address.host, address.port};
}
}  // namespace

std::optional<ElasticWorkerEnvironment> elastic_worker_from_environment() {
  const auto member = env("VFLOW_MEMBER");
  if (!member) return std::nullopt;
  ElasticWorkerEnvironment out;
  out.member = *member;
  if (const auto control = env("VFLOW_CONTROL")) {
    const auto job = env("VFLOW_JOB");
    if (!job) throw SpecError("VFLOW_CONTROL is set but VFLOW_JOB (the job's name) is not");
    out.control = *control;
    out.job = *job;
    return out;
  }
  const auto store = env("VFLOW_STORE");
  if (!store) {
    throw SpecError(
        "VFLOW_MEMBER is set but neither VFLOW_STORE (the coordinator's host:port) nor "
        "VFLOW_CONTROL (a cluster's control store) is");
  }
  std::tie(out.store_host, out.store_port) = store_address(*store);
  return out;
}

std::optional<comm::Rendezvous> rendezvous_from_environment(std::chrono::milliseconds timeout) {
  comm::Rendezvous r;
  r.timeout = timeout;
  const auto rank = env("VFLOW_RANK");
  const auto size = env("VFLOW_WORLD_SIZE");
  const auto store = env("VFLOW_STORE");
  if (rank || size || store) {
    if (!rank || !size || !store) {
      throw SpecError("VFLOW_RANK, VFLOW_WORLD_SIZE and VFLOW_STORE must be set together");
    }
    r.rank = env_int("VFLOW_RANK", *rank);
    r.world_size = env_int("VFLOW_WORLD_SIZE", *size);
    std::tie(r.store_host, r.store_port) = store_address(*store);

  } else {
    // External launchers: the first convention whose variables are all present.
    const std::pair<const char*, const char*> conventions[] = {
        {"RANK", "WORLD_SIZE"},
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
        {"SLURM_PROCID", "SLURM_NTASKS"}};
    const char* found_rank = nullptr;
    const char* found_size = nullptr;
    for (const auto& [rank_var, size_var] : conventions) {
      if (env(rank_var) && env(size_var)) {
        found_rank = rank_var;
        found_size = size_var;
        break;
      }
    }
    if (!found_rank) return std::nullopt;
    r.rank = env_int(found_rank, *env(found_rank));
    r.world_size = env_int(found_size, *env(found_size));
    const auto addr = env("MASTER_ADDR");
    const auto port = env("MASTER_PORT");
    if (!addr || !port) {
      throw SpecError(
          fmt::format("{} and {} are set, so this is a worker of an external launcher, "
                      "but MASTER_ADDR and MASTER_PORT (where rank 0 hosts the job's "
                      "store) are not",
                      found_rank, found_size));
    }
    r.store_host = *addr;
    r.store_port = env_int("MASTER_PORT", *port);
    r.host_store = r.rank == 0;
  }
  if (r.world_size < 1 || r.rank >= r.world_size) {
    throw SpecError(fmt::format("rank {} is not below the world size {}", r.rank, r.world_size));
  }
  return r;
}

int64_t local_workers() {
  for (const char* name : {"VFLOW_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE",
                           "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"}) {
    if (const auto v = env(name)) return std::max(1, env_int(name, *v));
  }
  return 1;
}

int64_t local_rank() {
  for (const char* name :
       {"VFLOW_LOCAL_RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}) {
    if (const auto v = env(name)) return std::max(0, env_int(name, *v));
  }
  return 0;
}

AgentPlace agent_place_from_environment() {
  AgentPlace place;
  const auto job = env("SLURM_JOB_ID");
  const auto node = env("SLURMD_NODENAME");
  if (!job || !node) return place;
  place.name = fmt::format("slurm{}-{}", *job, *node);
  place.host = *node;
  std::optional<std::string> gpus = env("SLURM_STEP_GPUS");
  if (!gpus) gpus = env("SLURM_JOB_GPUS");
  if (gpus && !gpus->empty()) {
    // Slurm sets CUDA_VISIBLE_DEVICES to these: the task sees them as 0, 1, ...
    const auto count = std::count(gpus->begin(), gpus->end(), ',') + 1;
    for (int64_t k = 0; k < count; ++k) place.slots.push_back(fmt::format("cuda:{}", k));
  } else if (const auto cpus = env("SLURM_CPUS_PER_TASK")) {
    place.slots.assign(static_cast<size_t>(std::max(1, env_int("SLURM_CPUS_PER_TASK", *cpus))),
                       "cpu");
  }
  return place;
}

}  // namespace vflow::job
