// Launching a job (docs/design.md §1, "Coordinator"): launch_job() makes the current process
// the job's coordinator, on this host or on a cluster store, and StoreHost serves the
// embedded store a coordinator on one host keeps the job's state in.
//
// The coordinator is never a worker, because a worker may leave.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "vflow/comm/rendezvous.h"
#include "vflow/job/generation_manager.h"

namespace vflow::job {

/// Hosts the job's store: the embedded store's server, bound to `host` alone.
class StoreHost {
 public:
  /// Listens on host:port; port 0 picks a free port.
  StoreHost(const std::string& host, int port, std::chrono::milliseconds timeout);
  ~StoreHost();
  StoreHost(const StoreHost&) = delete;
  StoreHost& operator=(const StoreHost&) = delete;
  const std::string& host() const { return host_; }
  int port() const;
  /// Serves until `workers` workers have left (Communicator::leave) or `stop` is set.
  /// Returns true when all workers left.
  bool serve(int workers, const std::atomic<bool>* stop);
  /// Where rank `rank` of `size` meets its peers through this store for `generation` (a
  /// fresh store prefix), with a client of its own, giving up after `timeout`.
  comm::Rendezvous rendezvous(int rank, int size, const std::string& generation,
                              std::chrono::milliseconds timeout) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string host_;
};

struct LaunchOptions {
  int workers = 1;                   ///< workers of the first generation
  std::vector<std::string> command;  ///< program and arguments each worker runs
  int port = 0;                      ///< the coordinator's port on 127.0.0.1; 0 = any free port
  /// Set ("etcd://H:P,..." or "etcds://..."): the job's control store is this cluster's,
  /// under the name `job`, and no embedded store is hosted: the generations, requests
  /// and the workers' rendezvous all go through it, and `vflow-ctl --control URL`
  /// reaches the job by name. Its workers run on the slots of node agents (vflow-agent),
  /// unless `local`; this process is the first of the job's coordinator candidates, so the
  /// job survives it. The job's keys are removed when it ends.
  std::string control;
  std::string job;
  bool local = false;  ///< with `control`: the workers are this process's children
  /// With `control`: the whole job spec (JobSpec::yaml()), which agents start workers with,
  /// and its resources.device (the slots it can use).
  std::string spec;
  std::string device = "cpu";
  /// The job's semantic spec (JobSpec::semantic_yaml), published for every worker to
  /// check its own against; empty: not published.
  std::string semantic;
  std::chrono::milliseconds timeout{30000};
  ElasticOptions elastic;  ///< limits and failure handling (its timeout is `timeout`)
  /// Set by the caller (e.g. a signal handler): stop the job at the next step boundary.
  const std::atomic<bool>* stop_flag = nullptr;
  /// With `control`, set by the caller (SIGTERM: this process must go, not the job): this
  /// process stops coordinating and leaves; the job goes on with its other candidates.
  const std::atomic<bool>* detach_flag = nullptr;
  int stop_grace_s = 60;  ///< after a stop request, workers still running are killed
  /// Per first-generation worker, in rank order (a planned split): its vnodes and extra
  /// environment (e.g. the worker's layout entry). Empty: an even split.
  std::vector<int64_t> vnodes;
  std::vector<std::vector<std::string>> worker_env;
};

/// Runs an elastic job: on this host, or on a cluster store (`options.control`). On this host it
/// hosts the coordinator and its generation manager, starts `workers` processes running `command`
/// with VFLOW_MEMBER (the worker's name) and VFLOW_STORE set, starts joiners when a resize asks for
/// more workers (and replacements when options.elastic.replace_failed), forwards their output line
/// by line with a "[worker name] " prefix, and waits until every worker has ended. A worker that
/// dies during training is survived (docs/design.md §4); one that fails at start-up stops the
/// others. Returns 0 when the job completed, 130 when stopped by `stop_flag`, the failing
/// worker's exit code (128 + signal when killed) for a failed start, else 5 (the job could not
/// continue).
int launch_job(const LaunchOptions& options);

}  // namespace vflow::job
