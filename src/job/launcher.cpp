#include "vflow/job/launcher.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <thread>
#include <tuple>

#include "job/child_processes.h"
#include "job/coordination.h"
#include "job/embedded_store.h"
#include "job/periodic.h"
#include "vflow/core/address.h"
#include "vflow/core/exit_code.h"
#include "vflow/core/process.h"
#include "vflow/job/build_identity.h"

namespace vflow::job {

// ---- coordinator -------------------------------------------------------------

struct StoreHost::Impl {
  std::unique_ptr<EmbeddedStoreServer> server;
  std::unique_ptr<ControlStore> client;  // serve()'s
};

StoreHost::StoreHost(const std::string& host, int port, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()), host_(host) {
  try {
    impl_->server = std::make_unique<EmbeddedStoreServer>(host, port);
  } catch (const std::exception& e) {
    throw Error(
        fmt::format("[comm] cannot host the job's store on {}:{}: {}", host, port, e.what()));
  }
  impl_->client = connect_embedded_store(host, impl_->server->port(), timeout);
}

StoreHost::~StoreHost() = default;

int StoreHost::port() const { return impl_->server->port(); }

bool StoreHost::serve(int workers, const std::atomic<bool>* stop) {
  while (!(stop && stop->load())) {
    if (impl_->client->add(comm::kLeftKey, 0) >= workers) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

comm::Rendezvous StoreHost::rendezvous(int rank, int size, const std::string& generation,
                                       std::chrono::milliseconds timeout) const {
  comm::Rendezvous r;
  r.store_host = host_;
  r.store_port = port();
  r.store = connect_embedded_store(host_, port(), timeout);
  r.rank = rank;
  r.world_size = size;
  r.generation = generation;
  r.timeout = timeout;
  return r;
}

// ---- local launcher ------------------------------------------------------------

namespace {

using Clock = std::chrono::steady_clock;

/// The launcher's liveness record on a cluster store (a lease there).
const char* const kLauncher = "launcher";

/// This process's name as a coordinator candidate: "submitter@<host>-<pid>".
std::string submitter_name() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return fmt::format("submitter@{}-{}", host, getpid());
}

/// Takes the job's name on a cluster store: refused while a job of that name runs (it has
/// a coordinator, a launcher or a living worker); the keys of one that finished or died are
/// removed first.
void claim_job_name(ControlPlane& control, ClusterStore& store, const LaunchOptions& options) {
  if (!store.list("").empty()) {
    const bool running = control.state() == JobState::kRunning &&
                         (store.holder("coordinator") || store.alive(kLauncher) ||
                          !store.alive_names(ControlPlane::liveness_name("")).empty());
    if (running) {
      throw RequestRefused(
          fmt::format("a job named '{}' is running on {}: choose another --job, or stop it first "
                      "(vflow-ctl --control {} stop {})",
                      options.job, options.control, options.control, options.job));
    }
    const int64_t removed = store.remove_all("");
    spdlog::info("[launch] removed {} keys of an earlier job named '{}'", removed, options.job);
  }
  // This submission of the name: agents tell its workers from a later job's of that name.
  const std::string me = fmt::format("{}-{}", submitter_name(),
                                     std::chrono::system_clock::now().time_since_epoch().count());
  if (store.set_if_absent("job/owner", me) != me) {
    throw RequestRefused(
        fmt::format("another launcher took the job name '{}' on {} at the same moment", options.job,
                    options.control));
  }
}

/// The submitter's etcd user when etcd confines it to the job's keys: what node agents hand
/// the job's workers in place of their own (docs/security.md). A user that reaches further
/// (the agents', root) is not passed on; nullopt then, with `why` saying so.
std::optional<JobCredentials> credentials_for_workers(const LaunchOptions& options,
                                                      std::string& why) {
  const auto etcd = etcd_options(options.control, options.job, options.timeout);
  if (etcd.user.empty()) {
    why = "the submitter gave no etcd user of the job's own (VFLOW_ETCD_USER)";
    return std::nullopt;
  }
  try {
    // A key outside the job's prefix, which a user confined to the job may not read.
    connect_etcd_root(etcd)->get("jobs/");
  } catch (const RequestRefused&) {
    return JobCredentials{etcd.user, etcd.password};
  }
  why = fmt::format("the submitter's etcd user '{}' reaches beyond the job's keys", etcd.user);
  return std::nullopt;
}

/// Workers as children of this process, started with the launcher's command line.
class LocalWorkers : public WorkerSource {
 public:
  LocalWorkers(ChildProcesses& group, std::vector<std::string> command,
               std::vector<std::string> env)
      : group_(group), command_(std::move(command)), env_(std::move(env)) {}
  bool start(const std::string& member) override { return start(member, {}); }
  bool start(const std::string& member, const std::vector<std::string>& extra) {
    ChildProcesses::Start w;
    w.name = member;
    w.command = command_;
    w.environment = env_;
    w.environment.push_back("VFLOW_MEMBER=" + member);
    w.environment.push_back("VFLOW_LOCAL_RANK=" + member);  // picks the GPU of device "cuda"
    w.environment.insert(w.environment.end(), extra.begin(), extra.end());
    group_.start(w);
    return true;
  }

 private:
  ChildProcesses& group_;
  std::vector<std::string> command_;
  std::vector<std::string> env_;
};

const std::vector<std::string>& worker_env(const LaunchOptions& options, size_t k) {
  static const std::vector<std::string> none;
  return k < options.worker_env.size() ? options.worker_env[k] : none;
}

/// The launcher's exit code once the job has ended as `done` says.
int outcome(JobState done, bool stopped, int worker_error) {
  if (done == JobState::kCompleted) return kExitOk;
  // Stopped on request: a signal to this launcher, or `vflow-ctl stop` (the control plane).
  if (stopped) return kExitStopped;
  spdlog::error("[launch] the job ended {}",
                done == JobState::kRunning ? "without finishing" : to_string(done));
  // A worker's own error (a checkpoint that could not be written at the end, exit 4, say)
  // says more than "a peer failed".
  return worker_error != 0 ? worker_error : kExitPeerFailure;
}

/// A job on a cluster store: its workers on node agents' slots (or, with options.local,
/// children of this process), coordinated by whichever candidate holds the claim, this
/// process first.
int launch_on_cluster(const LaunchOptions& options) {
  auto store = connect_cluster_store(options.control, options.job, options.timeout);
  ClusterStore& names = *store;
  ControlPlane control(std::move(store));
  claim_job_name(control, names, options);
  ChildProcesses group;
  LocalWorkers local(group, options.command,
                     {fmt::format("VFLOW_LOCAL_WORLD_SIZE={}", options.workers),
                      "VFLOW_CONTROL=" + options.control, "VFLOW_JOB=" + options.job});
  JobRecord record;
  record.spec = options.spec;
  record.version = build_identity();
  record.directory = current_directory();
  record.device = options.device;
  record.timeout = options.timeout;
  record.replace_failed = options.elastic.replace_failed;
  std::unique_ptr<AgentPlacement> agents;
  if (!options.local)
    agents = std::make_unique<AgentPlacement>(options.control, control, record, options.timeout);
  WorkerSource* source = options.local ? static_cast<WorkerSource*>(&local) : agents.get();
  // The claim first, then the record that makes the job visible to other candidates.
  CoordinatorCandidate candidate(options.control, options.job, submitter_name(), source,
                                 options.timeout, /*first=*/true);
  if (!options.semantic.empty()) control.publish_spec(options.semantic);
  if (!options.local) {
    std::string why;
    if (const auto credentials = credentials_for_workers(options, why)) {
      control.publish_credentials(*credentials);
    } else {
      spdlog::warn(
          "[launch] {}: the workers node agents start for job '{}' hold the agents' own etcd "
          "credentials, which reach every job (docs/security.md)",
          why, options.job);
    }
  }
  control.publish_record(record);
  // The launcher's lease, renewed from a thread of its own with a client of its own.
  const auto ttl = lease_ttl(options.timeout);
  std::shared_ptr<ClusterStore> lease =
      connect_cluster_store(options.control, options.job, options.timeout);
  lease->heartbeat(kLauncher, ttl);
  Periodic launcher_lease([lease, ttl] { lease->heartbeat(kLauncher, ttl); }, ttl / 4,
                          "renewing the launcher's lease");
  spdlog::info("[launch] job '{}' on the control store {}, starting {} workers{}", options.job,
               options.control, options.workers, options.local ? " on this machine" : " on agents");
  std::vector<std::string> initial;
  const auto deadline = Clock::now() + options.timeout;
  for (int k = 0; k < options.workers; ++k) {
    const std::string name = control.next_member();
    control.add_joiner(name);
    if (options.local) {
      local.start(name, worker_env(options, static_cast<size_t>(k)));
    } else {
      // Agents of an allocation may still be registering: their slots are awaited.
      while (!agents->start(name)) {
        if (Clock::now() > deadline || (options.stop_flag && options.stop_flag->load())) {
          const auto free = agents->describe();
          // Workers placed already see the job end; its keys go with the next coordinator.
          control.mark_done(JobState::kFailed);
          throw PeerFailure(
              fmt::format("[launch] no free slot for worker {} of {} within {} s on {}: {} (start "
                          "vflow-agent --control {} on the hosts, or pass --local)",
                          k + 1, options.workers, options.timeout.count() / 1000.0, options.control,
                          free, options.control));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    }
    initial.push_back(name);
  }
  ElasticOptions elastic = options.elastic;
  elastic.timeout = options.timeout;
  elastic.cluster = true;
  candidate.start(elastic, initial, options.vnodes);

  int worker_error = 0;
  bool stop_sent = false;
  int64_t shown = 0;  // the last generation this process reported
  std::optional<Clock::time_point> kill_at;
  std::optional<Clock::time_point> done_at;
  while (true) {
    group.pump(20);
    for (const auto& [name, code] : group.reap()) {
      if (code != 0 && code < 128 && worker_error == 0) worker_error = code;
      try {
        control.report_exit(name, WorkerExit{code, ""});
      } catch (const Error& e) {
        spdlog::error("{}", e.what());
      }
      if (auto* manager = candidate.manager()) manager->on_exit(name, code);
    }
    JobState done = JobState::kRunning;
    try {
      candidate.tick();
      if (!candidate.manager()) {
        const int64_t latest = control.latest_generation();
        if (latest > shown) {
          spdlog::info("[launch] job '{}': {}", options.job, control.generation(latest).describe());
          shown = latest;
        }
      }
      done = control.state();
      if (options.stop_flag && options.stop_flag->load() && !stop_sent) {
        spdlog::warn("[launch] stopping the job at the next step boundary");
        control.request_stop();
        stop_sent = true;
        kill_at = Clock::now() + std::chrono::seconds(options.stop_grace_s);
      }
    } catch (const PeerFailure& e) {
      spdlog::error("{}", e.what());
    }
    if (kill_at && Clock::now() > *kill_at) group.signal_all(SIGKILL);
    if (done == JobState::kRunning && options.detach_flag && options.detach_flag->load()) {
      spdlog::warn(
          "[launch] leaving job '{}' to its other coordinator candidates; it goes on "
          "(vflow-ctl --control {} status {})",
          options.job, options.control, options.job);
      return kExitOk;  // the claim and the launcher's lease end with this process's clients
    }
    if (done != JobState::kRunning && !done_at) done_at = Clock::now();
    // Ended: its workers here have exited, and the ones elsewhere have ended too (their
    // leases are gone), or had two lease times to; only then do its keys go.
    if (done_at && group.all_reaped()) {
      bool quiet = Clock::now() - *done_at > 2 * lease_ttl(options.timeout);
      try {
        quiet = quiet || names.alive_names(ControlPlane::liveness_name("")).empty();
      } catch (const PeerFailure& e) {
        spdlog::warn("{}", e.what());
      }
      if (quiet) break;
    }
    if (done == JobState::kRunning && options.local && group.all_reaped() && !candidate.manager()) {
      break;  // every worker here ended and nobody coordinates: nothing will finish it
    }
  }
  const JobState done = control.state();
  if (const auto result = control.result()) {
    std::cout << fmt::format("job '{}' {}: {}", options.job,
                             done == JobState::kRunning ? "ended" : to_string(done), *result)
              << std::endl;
  }
  if (worker_error == 0 && done == JobState::kFailed) {
    for (const auto& [member, exit] : control.exits()) {
      if (exit.code != 0 && exit.code < 128 && worker_error == 0) worker_error = exit.code;
    }
  }
  const bool stopped = stop_sent || control.stop_requested();
  // A finished job's keys go, so that a long-lived etcd does not collect them; the claim
  // first, so that its removal is not taken for a lost one.
  try {
    candidate.retire();
    names.remove_all("");
  } catch (const Error& e) {
    spdlog::warn("[launch] the keys of job '{}' could not be removed: {}", options.job, e.what());
  }
  return outcome(done, stopped, worker_error);
}

}  // namespace

int launch_job(const LaunchOptions& options) {
  if (!options.control.empty()) return launch_on_cluster(options);
  StoreHost coordinator("127.0.0.1", options.port, options.timeout);
  spdlog::info("[launch] coordinator on {}:{}, starting {} workers", coordinator.host(),
               coordinator.port(), options.workers);
  ControlPlane control(
      connect_embedded_store(coordinator.host(), coordinator.port(), options.timeout));
  if (!options.semantic.empty()) control.publish_spec(options.semantic);
  ChildProcesses group;
  LocalWorkers workers(group, options.command,
                       {fmt::format("VFLOW_LOCAL_WORLD_SIZE={}", options.workers),
                        fmt::format("VFLOW_STORE={}:{}", coordinator.host(), coordinator.port())});
  ElasticOptions elastic = options.elastic;
  elastic.timeout = options.timeout;
  GenerationManager manager(control, elastic, &workers);
  std::vector<std::string> initial;
  for (int k = 0; k < options.workers; ++k) {
    const std::string name = control.next_member();
    workers.start(name, worker_env(options, static_cast<size_t>(k)));
    initial.push_back(name);
  }
  manager.start(initial, options.vnodes);

  int failure = 0;       // the first failure that ended the job
  int worker_error = 0;  // the first error a worker exited with (not a signal, not a stop)
  bool stop_sent = false;
  std::optional<Clock::time_point> kill_at;
  auto stop_workers = [&](int seconds) {
    if (!kill_at) kill_at = Clock::now() + std::chrono::seconds(seconds);
  };
  while (group.pump(20)) {
    for (const auto& [name, code] : group.reap()) {
      const bool starting = manager.current().id == 0;
      if (code != 0 && code < 128 && worker_error == 0) worker_error = code;
      manager.on_exit(name, code);
      if (code != 0 && starting && failure == 0) {
        // A worker that cannot start fails the job: nothing has been trained yet.
        spdlog::error("[launch] worker {} exited with status {} at start-up; stopping the others",
                      name, code);
        failure = code;
        group.signal_all(SIGTERM);
        stop_workers(5);
      }
    }
    if (failure == 0) {
      try {
        manager.tick();
      } catch (const PeerFailure& e) {
        spdlog::error("{}", e.what());
      }
    }
    if (options.stop_flag && options.stop_flag->load() && !stop_sent) {
      // Workers stop together after the same step; rank 0 writes the checkpoint.
      spdlog::warn("[launch] stopping the job at the next step boundary");
      control.request_stop();
      stop_sent = true;
      stop_workers(options.stop_grace_s);
    }
    if (kill_at && Clock::now() > *kill_at) group.signal_all(SIGKILL);
  }
  if (failure != 0) return failure;
  return outcome(control.state(), stop_sent || control.stop_requested(), worker_error);
}

}  // namespace vflow::job
