#include "vflow/job/agent.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <grp.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "job/child_processes.h"
#include "job/coordination.h"
#include "job/periodic.h"
#include "vflow/core/error.h"
#include "vflow/core/exit_code.h"
#include "vflow/core/process.h"
#include "vflow/job/build_identity.h"
#include "vflow/job/control_store.h"

namespace vflow::job {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

const std::string kJobs = "jobs/";
/// The start of the names of a worker's private files in its job's folder.
const std::string kPrivateFile = "private-";

/// Follows every job's keys (jobs/ in the cluster's tree) from a thread of its own: one
/// scan, then watches from its revision, and a scan again when that history is gone. The
/// agent's loop takes what changed without ever waiting on the store.
class JobWatcher {
 public:
  explicit JobWatcher(std::unique_ptr<ClusterStore> root) : root_(std::move(root)) {
    thread_ = std::thread([this] { run(); });
  }
  ~JobWatcher() {
    stop_ = true;
    thread_.join();
  }
  std::vector<StoreEvent> take() {
    std::lock_guard<std::mutex> hold(mutex_);
    std::vector<StoreEvent> out(events_.begin(), events_.end());
    events_.clear();
    return out;
  }

 private:
  void run() {
    int64_t revision = 0;
    bool scanned = false;
    while (!stop_) {
      try {
        std::vector<StoreEvent> batch;
        if (!scanned) {
          for (auto& [key, value] : root_->scan(kJobs, &revision)) batch.push_back({key, value});
          scanned = true;
        } else if (auto events = root_->watch(kJobs, revision, milliseconds(200))) {
          batch = std::move(*events);
        } else {
          scanned = false;  // compacted: look at everything again
          continue;
        }
        std::lock_guard<std::mutex> hold(mutex_);
        events_.insert(events_.end(), batch.begin(), batch.end());
      } catch (const std::exception& e) {
        spdlog::warn("[agent] following the jobs: {}", e.what());
        std::this_thread::sleep_for(milliseconds(500));
      }
    }
  }
  std::unique_ptr<ClusterStore> root_;
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::deque<StoreEvent> events_;
  std::thread thread_;
};

/// A job this agent has seen: its keys, and this agent's candidacy to coordinate it.
struct ServedJob {
  std::unique_ptr<ControlPlane> control;
  std::string incarnation;  // its job/owner value: a later job of the same name differs
  JobRecord record;
  std::unique_ptr<AgentPlacement> placement;  // the joiners a coordinator here places
  std::unique_ptr<CoordinatorCandidate> candidate;
  std::optional<Clock::time_point> done_since;  // when this agent, coordinating, saw it end
};

/// A job's incarnation: (its name, its job/owner value).
using JobKey = std::pair<std::string, std::string>;

/// One worker this agent runs.
struct Running {
  std::string job;
  std::string incarnation;
  std::string member;
  int64_t slot = 0;
  std::string slot_holder;  // what its slot's record holds: "<job> <member>"
  /// Files for this worker alone (the job's password; with --worker-uids, copies of the
  /// agent's TLS files), removed when it ends.
  std::vector<std::string> private_files;
};

/// A file only `owner` (-1: this process's user) may read, holding `bytes` (created
/// afresh: never one another process made or links to).
void write_private_file(const std::filesystem::path& path, const std::string& bytes,
                        int64_t owner) {
  std::filesystem::remove(path);
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) throw Error(fmt::format("cannot create {}: {}", path.string(), std::strerror(errno)));
  const bool written =
      write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()) &&
      (owner < 0 || fchown(fd, static_cast<uid_t>(owner), static_cast<gid_t>(owner)) == 0);
  const int error = errno;
  close(fd);
  if (!written) {
    std::filesystem::remove(path);
    throw Error(fmt::format("cannot write {}: {}", path.string(), std::strerror(error)));
  }
}

/// Throws SpecError unless users other than its owner may reach `path` (every folder down
/// to it searchable by them) and, for a program, run it: what workers of --worker-uids need.
/// With `kept`, `path` (the jobs/ folder of the agent's work folder) must also be safe from
/// other users: it and its parent folders of this process's user that nobody else may
/// write, below folders of root's that others may write only where their sticky bit keeps
/// them from replacing what is not theirs (/tmp). Else another local user could have made
/// it, or could swap what is in it, before workers of other user ids are given parts of it.
void check_for_workers(const std::filesystem::path& path, const std::string& what, bool kept) {
  const auto full = std::filesystem::absolute(path);
  for (auto p = full;; p = p.parent_path()) {
    struct stat st {};
    if ((kept ? lstat(p.c_str(), &st) : stat(p.c_str(), &st)) != 0) {
      throw SpecError(fmt::format("{} {}: {}", what, p.string(), std::strerror(errno)));
    }
    if ((st.st_mode & S_IXOTH) == 0) {
      throw SpecError(fmt::format(
          "--worker-uids: the workers cannot reach {} {}: {} is closed to other users (chmod "
          "o+x {}, or choose another)",
          what, path.string(), p.string(), p.string()));
    }
    if (kept) {
      const bool own = p == full || p == full.parent_path();
      const bool others_write = (st.st_mode & (S_IWGRP | S_IWOTH)) != 0;
      const bool safe = S_ISDIR(st.st_mode) &&
                        (own ? st.st_uid == geteuid() && !others_write
                             : st.st_uid == 0 && (!others_write || (st.st_mode & S_ISVTX) != 0));
      if (!safe) {
        throw SpecError(fmt::format(
            "--worker-uids: {} {} is not safe from other users: {} must be a folder {}, "
            "writable by its owner alone{} (choose another --work-dir)",
            what, full.parent_path().string(), p.string(),
            own ? "of the agent's user" : "of root's", own ? "" : " or sticky"));
      }
    }
    if (p == p.parent_path()) break;
  }
}

/// Ends every process running as `user` (its real, effective or saved id): a job's workers
/// may have left some, which must not live on into the next job given that id. Signalled
/// from here (root), so that they cannot stop or signal what kills them; passes over /proc
/// until one finds none. False when some are still there after that.
bool kill_processes_of(int64_t user) {
  for (int pass = 0; pass < 50; ++pass) {
    int found = 0;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
      const std::string pid = entry.path().filename().string();
      if (pid.empty() || !std::all_of(pid.begin(), pid.end(), ::isdigit)) continue;
      std::ifstream status(entry.path() / "status");
      for (std::string line; std::getline(status, line);) {
        if (line.rfind("Uid:", 0) != 0) continue;
        std::istringstream ids(line.substr(4));
        int64_t real = -1, effective = -1, saved = -1;
        ids >> real >> effective >> saved;
        if (real == user || effective == user || saved == user) {
          ++found;
          kill(static_cast<pid_t>(std::stol(pid)), SIGKILL);
        }
        break;
      }
    }
    if (found == 0) return true;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return false;
}

/// The parts of a key under jobs/: (job, the rest), or nullopt.
std::optional<std::pair<std::string, std::string>> split_job_key(const std::string& key) {
  if (key.rfind(kJobs, 0) != 0) return std::nullopt;
  const auto slash = key.find('/', kJobs.size());
  if (slash == std::string::npos) return std::nullopt;
  return std::make_pair(key.substr(kJobs.size(), slash - kJobs.size()), key.substr(slash + 1));
}

class Agent {
 public:
  explicit Agent(AgentOptions options) : options_(std::move(options)) {
    const auto etcd = etcd_options(options_.control, "job", options_.timeout);
    agent_user_ = etcd.user;
    if (options_.worker_uid_first >= 0) {
      for (const auto& [variable, path] : etcd_tls_files(etcd)) {
        std::ifstream in(path, std::ios::binary);
        tls_files_.emplace_back(variable, std::string(std::istreambuf_iterator<char>(in), {}));
      }
    }
    root_ = connect_etcd_root(etcd);
    record_.name = options_.name;
    record_.host = options_.host;
    record_.pid = getpid();
    record_.version = build_identity();
    record_.slots = options_.slots;
    const auto ttl = lease_ttl(options_.timeout);
    if (root_->alive(agent_liveness(options_.name))) {
      throw RequestRefused(
          fmt::format("an agent named '{}' is running on {} already: give this one "
                      "another --name",
                      options_.name, options_.control));
    }
    // What an earlier agent of this name left (it died): its slots are free now, and its
    // workers' password files go.
    root_->remove_all(agent_key(options_.name) + "/");
    remove_private_files();
    root_->set(agent_key(options_.name), encode_agent(record_));
    auto lease_store = connect_etcd_root(etcd);
    lease_store->heartbeat(agent_liveness(options_.name), ttl);
    lease_ = std::make_unique<Periodic>(
        [s = std::shared_ptr<ClusterStore>(std::move(lease_store)),
         name = agent_liveness(options_.name), ttl] { s->heartbeat(name, ttl); },
        ttl / 4, "renewing agent " + options_.name + "'s lease");
    watcher_ = std::make_unique<JobWatcher>(connect_etcd_root(etcd));
    std::string slots;
    for (const auto& s : options_.slots) slots += (slots.empty() ? "" : ",") + s;
    spdlog::info("[agent] {} on {} serves {} slot(s) [{}] on {} ({})", options_.name, options_.host,
                 options_.slots.size(), slots, options_.control, record_.version);
  }

  ~Agent() {
    jobs_.clear();  // candidates give up their claims
    watcher_.reset();
    try {
      root_->remove_all(agent_key(options_.name) + "/");
      root_->remove(agent_key(options_.name));
    } catch (const std::exception& e) {
      spdlog::warn("[agent] could not remove {}'s records: {}", options_.name, e.what());
    }
  }

  int run() {
    std::optional<Clock::time_point> kill_at;
    while (true) {
      group_.pump(20);
      for (auto& event : watcher_->take()) on_event(event);
      reap();
      serve_jobs();
      reconcile_slots();
      if (options_.stop_flag && options_.stop_flag->load() && !kill_at) {
        spdlog::info("[agent] {} stops: its {} worker(s) leave their jobs", options_.name,
                     running_.size());
        draining_ = true;
        guarded("marking the agent as stopping",
                [&] { root_->set(agent_draining_key(options_.name), "1"); });
        group_.signal_all(SIGTERM);  // a graceful leave at the next step boundary
        kill_at = Clock::now() + std::chrono::seconds(options_.stop_grace_s);
      }
      if (kill_at && group_.all_reaped()) break;
      if (kill_at && Clock::now() > *kill_at) group_.signal_all(SIGKILL);
    }
    spdlog::info("[agent] {} stopped", options_.name);
    return kExitOk;
  }

 private:
  template <typename F>
  void guarded(const std::string& what, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      spdlog::warn("[agent] {}: {}", what, e.what());
    }
  }

  void on_event(const StoreEvent& event) {
    const auto parts = split_job_key(event.key);
    if (!parts) return;
    // Named references, not a structured binding: the lambdas below capture them.
    const std::string& job = parts->first;
    const std::string& rest = parts->second;
    if (rest == "job/record" && event.value && jobs_.count(job) == 0) {
      guarded("following job " + job, [&] { serve(job); });
    } else if (rest == "job/owner" && !event.value) {
      forget(job);
    } else if (rest.rfind("placement/", 0) == 0 && event.value) {
      const std::string member = rest.substr(std::string("placement/").size());
      guarded("starting worker " + member + " of job " + job, [&] { place(job, member); });
    }
  }

  /// A job whose keys are gone: this agent stops standing for it, and its workers here
  /// (none should be left: they end with the job) leave.
  void forget(const std::string& job) {
    if (jobs_.erase(job) == 0) return;
    spdlog::info("[agent] job '{}' is gone", job);
    for (const auto& [id, r] : running_) {
      if (r.job == job) group_.signal(id, SIGTERM);
    }
  }

  void serve(const std::string& job) {
    ServedJob served;
    served.control = std::make_unique<ControlPlane>(
        connect_cluster_store(options_.control, job, options_.timeout));
    const auto record = served.control->record();
    const auto owner = served.control->store().get("job/owner");
    if (!record || !owner) return;
    served.incarnation = *owner;
    served.record = *record;
    served.placement = std::make_unique<AgentPlacement>(options_.control, *served.control, *record,
                                                        record->timeout);
    served.candidate = std::make_unique<CoordinatorCandidate>(
        options_.control, job, "agent " + options_.name, served.placement.get(), record->timeout,
        /*first=*/false);
    jobs_[job] = std::move(served);
  }

  void refuse(ControlPlane& control, const std::string& job, const std::string& member,
              const std::string& why) {
    spdlog::warn("[agent] {} does not start worker {} of job '{}': {}", options_.name, member, job,
                 why);
    control.report_exit(member, WorkerExit{kExitRefused, why});
  }

  void place(const std::string& job, const std::string& member) {
    // Members are numbered by the job's counter; anything else (a '/' or "..", written by
    // whoever holds the job's user) names no file of this agent's.
    if (member.empty() || !std::all_of(member.begin(), member.end(), ::isdigit)) {
      spdlog::warn("[agent] job '{}' places a worker named '{}', which is not a number: ignored",
                   job, member);
      return;
    }
    if (jobs_.count(job) == 0) serve(job);
    const auto it = jobs_.find(job);
    if (it == jobs_.end()) return;
    ServedJob& served = it->second;
    const auto where = served.control->placement(member);
    if (!where || where->agent != options_.name) return;
    // One start per placement of this incarnation of the job (a later job of the same name
    // numbers its workers from 0 again).
    const std::string id = fmt::format("{} {} {}", job, served.incarnation, member);
    if (started_.count(id) != 0) return;
    // Only a worker still awaited: after a restart, old placements are history.
    const auto joiners = served.control->joiners();
    if (std::find(joiners.begin(), joiners.end(), member) == joiners.end() ||
        served.control->exits().count(member) != 0) {
      return;
    }
    started_.insert(id);
    const auto& record = served.record;
    if (draining_) {
      return decline(*served.control, job, member, "its agent " + options_.name + " is stopping");
    }
    if (where->slot >= static_cast<int64_t>(options_.slots.size())) {
      return refuse(*served.control, job, member,
                    fmt::format("agent {} has no slot {}", options_.name, where->slot));
    }
    const std::string device = options_.slots[static_cast<size_t>(where->slot)];
    if (record.version != record_.version) {
      return refuse(*served.control, job, member,
                    fmt::format("agent {} runs {}, the job {}", options_.name, record_.version,
                                record.version));
    }
    if (!device_suits(device, record.device)) {
      return refuse(*served.control, job, member,
                    fmt::format("slot {} of agent {} is {}, the job trains on {}", where->slot,
                                options_.name, device, record.device));
    }
    // Read before the slot is taken: a job this agent refuses holds none of its slots.
    const auto credentials = served.control->credentials();
    if (!credentials && !agent_user_.empty() &&
        (options_.require_job_user || options_.worker_uid_first >= 0)) {
      return refuse(
          *served.control, job, member,
          fmt::format("the job has no etcd user of its own, and agent {} gives its "
                      "workers no other ({})",
                      options_.name,
                      options_.require_job_user ? "--require-job-user" : "--worker-uids"));
    }
    const auto slot_key = agent_slot_key(options_.name, where->slot);
    const std::string slot_holder = job + " " + member;
    const auto holder = root_->set_if_absent(slot_key, slot_holder);
    if (holder != slot_holder) {
      return decline(
          *served.control, job, member,
          fmt::format("slot {} of agent {} runs {} already", where->slot, options_.name, holder));
    }
    try {
      start_worker(served, job, member, *where, device, id, slot_holder, credentials);
    } catch (const std::exception& e) {
      guarded("freeing slot " + std::to_string(where->slot), [&] { root_->remove(slot_key); });
      refuse(*served.control, job, member, e.what());
    }
  }

  /// A placement this agent cannot take up now, which the coordinator makes again elsewhere.
  void decline(ControlPlane& control, const std::string& job, const std::string& member,
               const std::string& why) {
    spdlog::info("[agent] {} passes worker {} of job '{}' back: {}", options_.name, member, job,
                 why);
    control.report_exit(member, WorkerExit{kPlacementDeclined, why});
  }

  void start_worker(const ServedJob& served, const std::string& job, const std::string& member,
                    const Placement& where, const std::string& device, const std::string& id,
                    const std::string& slot_holder,
                    const std::optional<JobCredentials>& credentials) {
    namespace fs = std::filesystem;
    const fs::path folder = fs::path(options_.work_dir) / "jobs" / job;
    fs::create_directories(folder);
    const JobKey job_key{job, served.incarnation};
    const int64_t user = user_for(job_key);
    try {
      start_worker_as(served, job, member, where, device, id, slot_holder, credentials, folder,
                      user);
    } catch (...) {
      release_user(job_key);
      throw;
    }
  }

  /// The folder a job's workers of --worker-uids run in: within the job's folder, which stays
  /// this agent's (so that no file this agent writes there can be replaced by a link), one
  /// of the job's user id alone for each incarnation of the job.
  std::filesystem::path home_of(const std::string& job, const std::string& incarnation) const {
    return std::filesystem::path(options_.work_dir) / "jobs" / job /
           fmt::format("home-{}", std::hash<std::string>{}(incarnation));
  }

  /// start_worker's part once the job's user id (-1: none) is known; an error leaves the id
  /// to the caller.
  void start_worker_as(const ServedJob& served, const std::string& job, const std::string& member,
                       const Placement& where, const std::string& device, const std::string& id,
                       const std::string& slot_holder,
                       const std::optional<JobCredentials>& credentials,
                       const std::filesystem::path& folder, int64_t user) {
    const auto& record = served.record;
    namespace fs = std::filesystem;
    const fs::path home = home_of(job, served.incarnation);
    if (user >= 0) {
      // The job's folder is this agent's, and other users may only pass through it.
      if (lchown(folder.c_str(), geteuid(), getegid()) != 0 || chmod(folder.c_str(), 0755) != 0) {
        throw Error(fmt::format("cannot keep {}: {}", folder.string(), std::strerror(errno)));
      }
      fs::create_directory(home);
      struct stat st {};
      if (lstat(home.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
          lchown(home.c_str(), static_cast<uid_t>(user), static_cast<gid_t>(user)) != 0 ||
          chmod(home.c_str(), 0700) != 0) {
        throw Error(fmt::format("cannot give {} to user {}: {}", home.string(), user,
                                std::strerror(errno)));
      }
    }
    // One file per incarnation of the job, written whole before any worker reads it.
    const fs::path spec =
        folder / fmt::format("spec-{}.yaml", std::hash<std::string>{}(served.incarnation));
    if (!fs::exists(spec)) {
      const fs::path partial = spec.string() + ".partial";
      {
        std::ofstream out(partial);
        out << record.spec;
        out.flush();
        if (!out) throw Error("cannot write " + partial.string());
      }
      fs::rename(partial, spec);
    }
    std::error_code ec;
    const bool shared = !record.directory.empty() && fs::is_directory(record.directory, ec);
    ChildProcesses::Start w;
    w.name = id;
    w.prefix = fmt::format("[{} {}] ", job, member);
    w.command = options_.worker_command;
    w.command.push_back(spec.string());
    w.command.push_back("--set");
    w.command.push_back("resources.device=" + device);
    w.environment = {"VFLOW_CONTROL=" + options_.control, "VFLOW_JOB=" + job,
                     "VFLOW_MEMBER=" + member, fmt::format("VFLOW_LOCAL_RANK={}", where.slot),
                     fmt::format("VFLOW_LOCAL_WORLD_SIZE={}", options_.slots.size())};
    w.working_directory = user >= 0 ? home.string() : shared ? record.directory : folder.string();
    w.run_as_user = user;
    if (user >= 0) w.environment.push_back("HOME=" + home.string());  // not the agent's
    w.parent_death_signal = SIGTERM;  // the agent's death is a graceful leave of its workers
    // The job's own user replaces this agent's (docs/security.md): its password in a file
    // of this worker's alone, named in the environment, never on a command line. A worker of
    // a user id of its own gets copies of the TLS files too: it may not read the agent's.
    std::vector<std::string> private_files;
    const auto hand_over = [&](const std::string& variable, const std::string& bytes) {
      const auto path =
          folder / fmt::format("{}{}-{}-{}-{}", kPrivateFile, options_.name,
                               std::hash<std::string>{}(served.incarnation), member, variable);
      private_files.push_back(path.string());
      write_private_file(path, bytes, user);
      w.environment.push_back(variable + "=" + path.string());
    };
    try {
      if (user >= 0) {
        for (const auto& [variable, bytes] : tls_files_) hand_over(variable, bytes);
      }
      if (credentials) {
        hand_over("VFLOW_ETCD_PASSWORD_FILE", credentials->password + "\n");
        w.environment.push_back("VFLOW_ETCD_USER=" + credentials->user);
      }
      group_.start(w);
    } catch (...) {
      for (const auto& f : private_files) fs::remove(f, ec);
      throw;
    }
    if (!credentials && !agent_user_.empty() &&
        warned_shared_.insert(JobKey{job, served.incarnation}).second) {
      spdlog::warn(
          "[agent] job '{}' has no etcd user of its own: its workers on {} hold the agents' "
          "user '{}', which reaches every job",
          job, options_.name, agent_user_);
    }
    running_[id] = Running{job, served.incarnation, member, where.slot, slot_holder, private_files};
    spdlog::info("[agent] {} started worker {} of job '{}' on slot {} ({}) in {}{}", options_.name,
                 member, job, where.slot, device, w.working_directory,
                 user >= 0 ? fmt::format(" as user {}", user) : "");
  }

  void reap() {
    for (const auto& ended : group_.reap()) {
      const std::string& id = ended.first;
      const int code = ended.second;  // captured below: not a structured binding
      const auto it = running_.find(id);
      if (it == running_.end()) continue;
      const Running r = it->second;
      running_.erase(it);
      spdlog::info("[agent] worker {} of job '{}' ended with status {}", r.member, r.job, code);
      for (const auto& f : r.private_files) {
        std::error_code ec;
        std::filesystem::remove(f, ec);
      }
      release_user(JobKey{r.job, r.incarnation});
      guarded("freeing slot " + std::to_string(r.slot),
              [&] { root_->remove(agent_slot_key(options_.name, r.slot)); });
      // Its job's keys are gone, or belong to a later job of the same name: nobody waits for
      // the news.
      const auto job = jobs_.find(r.job);
      if (job == jobs_.end() || job->second.incarnation != r.incarnation) continue;
      // Through the store, also when this agent coordinates: the coordinator reads it with
      // whether the worker ever was ready (a worker that could not start is not placed here
      // again).
      guarded("reporting worker " + r.member + "'s end", [&] {
        // The job's keys may have gone since this agent last looked (its submitter removes
        // them when it ends, often as its last workers exit): a report then would write
        // them again, an exit record and the request counter left behind for good. Asked
        // first, the window is one round trip instead of up to the 2 s between looks.
        auto& control = *job->second.control;
        if (control.store().get("job/owner") != job->second.incarnation) return;
        control.report_exit(r.member, WorkerExit{code, ""});
      });
    }
  }

  /// Slots whose worker is gone but whose record stayed (its end could not be reported:
  /// the host was cut off) are freed again.
  void reconcile_slots() {
    const auto now = Clock::now();
    if (now - last_reconcile_ < std::chrono::seconds(2)) return;
    last_reconcile_ = now;
    guarded("checking the slots' records", [&] {
      const std::string prefix = agent_key(options_.name) + "/slot/";
      for (const auto& entry : root_->scan(prefix)) {
        const std::string& key = entry.first;
        const std::string& holder = entry.second;  // captured below: not a structured binding
        const bool runs = std::any_of(running_.begin(), running_.end(), [&](const auto& r) {
          return r.second.slot_holder == holder;
        });
        if (runs) continue;
        spdlog::info("[agent] {} frees slot {}: {} is not running", options_.name,
                     key.substr(prefix.size()), holder);
        root_->remove(key);  // only this agent's own loop writes its slots: no race
      }
    });
  }

  /// Every job's candidate takes its turn; a job this agent coordinates that has ended
  /// has its keys removed once its submitter is gone and its workers have ended.
  void serve_jobs() {
    const auto now = Clock::now();
    const bool maintain = now - last_maintenance_ > milliseconds(250);
    if (maintain) last_maintenance_ = now;
    const bool look = now - last_owner_check_ > std::chrono::seconds(2);
    if (look) last_owner_check_ = now;
    std::vector<std::string> finished, gone;
    for (auto& [name, job] : jobs_) {
      try {
        // A job removed while this agent could not follow (a watch history compacted away)
        // is noticed here.
        if (look && job.control->store().get("job/owner") != job.incarnation) {
          gone.push_back(name);
          continue;
        }
        if (!job.candidate->tick() || !maintain) continue;
        if (job.control->state() == JobState::kRunning) continue;
        if (!job.done_since) job.done_since = now;
        auto& store = job.control->store();
        // Its submitter and workers had a lease time to read the end and leave.
        const auto ttl = lease_ttl(job.record.timeout);
        const bool quiet =
            !store.alive("launcher") && store.alive_names(ControlPlane::liveness_name("")).empty();
        if ((quiet && now - *job.done_since > ttl) || now - *job.done_since > 2 * ttl) {
          finished.push_back(name);
        }
      } catch (const std::exception& e) {
        if (maintain) spdlog::warn("[agent] job '{}': {}", name, e.what());  // a few a second
      }
    }
    for (const auto& name : gone) forget(name);
    for (const auto& name : finished) {
      guarded("removing the keys of job " + name, [&] {
        const auto state = to_string(jobs_[name].control->state());
        jobs_[name].candidate->retire();
        const auto removed = jobs_[name].control->store().remove_all("");
        spdlog::info("[agent] job '{}' ended ({}): removed its {} keys", name, state, removed);
      });
      jobs_.erase(name);
    }
  }

  /// The user id the workers of `job_key` run as: -1 without
  /// --worker-uids, else the job's id here, or the lowest no other job holds.
  int64_t user_for(const JobKey& job_key) {
    if (options_.worker_uid_first < 0) return -1;
    if (const auto it = job_users_.find(job_key); it != job_users_.end()) return it->second;
    for (int64_t id = options_.worker_uid_first; id <= options_.worker_uid_last; ++id) {
      const bool taken = std::any_of(job_users_.begin(), job_users_.end(),
                                     [&](const auto& held) { return held.second == id; });
      if (taken) continue;
      // None should be left, not even from an earlier agent; an id whose would not end
      // is passed over.
      if (!kill_processes_of(id)) continue;
      return job_users_[job_key] = id;
    }
    throw Error(fmt::format("each of agent {}'s worker user ids {}-{} runs another job",
                            options_.name, options_.worker_uid_first, options_.worker_uid_last));
  }

  /// Once a job has no worker left here, its user id is free for another job: what ran as
  /// it is ended and the job's folder for it is handed back to this agent's user. An id
  /// whose processes would not end is kept from other jobs.
  void release_user(const JobKey& job_key) {
    const auto it = job_users_.find(job_key);
    if (it == job_users_.end()) return;
    const bool in_use = std::any_of(running_.begin(), running_.end(), [&](const auto& r) {
      return JobKey{r.second.job, r.second.incarnation} == job_key;
    });
    if (in_use) return;
    if (!kill_processes_of(it->second)) {
      spdlog::error("[agent] {}: processes of user {} would not end: the id is not used again",
                    options_.name, it->second);
      return;
    }
    const auto home = home_of(job_key.first, job_key.second);
    namespace fs = std::filesystem;
    std::error_code ec;
    if (lchown(home.c_str(), geteuid(), getegid()) == 0) {
      for (auto entry = fs::recursive_directory_iterator(home, ec);
           !ec && entry != fs::recursive_directory_iterator(); entry.increment(ec)) {
        (void)!lchown(entry->path().c_str(), geteuid(), getegid());
      }
    }
    job_users_.erase(it);
  }

  /// The private files of workers an earlier agent of this name started (it was killed),
  /// in every job's folder.
  void remove_private_files() {
    namespace fs = std::filesystem;
    std::error_code ec;
    for (const auto& job : fs::directory_iterator(fs::path(options_.work_dir) / "jobs", ec)) {
      for (const auto& file : fs::directory_iterator(job.path(), ec)) {
        const auto name = file.path().filename().string();
        if (name.rfind(kPrivateFile + options_.name + "-", 0) == 0) {
          fs::remove(file.path(), ec);
        }
      }
    }
  }

  AgentOptions options_;
  std::string agent_user_;  // this agent's etcd user ("" : none)
  /// With --worker-uids: the TLS files' variables and contents, copied for each worker.
  std::vector<std::pair<std::string, std::string>> tls_files_;
  AgentRecord record_;
  std::unique_ptr<ClusterStore> root_;
  std::unique_ptr<Periodic> lease_;
  std::unique_ptr<JobWatcher> watcher_;
  std::map<std::string, ServedJob> jobs_;
  ChildProcesses group_;
  std::map<std::string, Running> running_;  // by "<job> <incarnation> <member>"
  std::set<std::string> started_;           // every placement acted on, by the same key
  std::set<JobKey> warned_shared_;          // jobs without a user of their own, said once
  std::map<JobKey, int64_t> job_users_;     // --worker-uids
  bool draining_ = false;
  Clock::time_point last_maintenance_{};
  Clock::time_point last_reconcile_{};
  Clock::time_point last_owner_check_{};
};

}  // namespace

int run_agent(const AgentOptions& given) {
  AgentOptions options = given;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  if (options.name.empty()) options.name = host;
  if (options.host.empty()) options.host = options.name;
  if (options.worker_command.empty()) {
    const auto self = std::filesystem::path(this_executable("vflow-agent"));
    options.worker_command = {(self.parent_path() / "vflow-train").string()};
  }
  if (options.work_dir.empty()) options.work_dir = "/tmp/vflow-agent-" + options.name;
  if (options.slots.empty()) throw SpecError("an agent needs at least one slot");
  if (options.worker_uid_first >= 0) {
    if (options.worker_uid_first < 1 || options.worker_uid_last < options.worker_uid_first ||
        options.worker_uid_last > 0x7fffffff) {
      throw SpecError(fmt::format("--worker-uids {}-{} is not a range of user ids above 0",
                                  options.worker_uid_first, options.worker_uid_last));
    }
    if (geteuid() != 0) {
      throw SpecError("--worker-uids: the agent must run as root to start workers as other users");
    }
    std::filesystem::create_directories(std::filesystem::path(options.work_dir) / "jobs");
    check_for_workers(std::filesystem::path(options.work_dir) / "jobs", "the work folder", true);
    check_for_workers(options.worker_command.front(), "the worker program", false);
  }
  Agent agent(options);
  return agent.run();
}

}  // namespace vflow::job
