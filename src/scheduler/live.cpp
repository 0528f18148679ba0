#include "vflow/scheduler/live.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "vflow/core/address.h"
#include "vflow/core/clock.h"
#include "vflow/core/error.h"
#include "vflow/core/exit_code.h"
#include "vflow/core/process.h"
#include "vflow/core/spec_node.h"
#include "vflow/job/agent.h"
#include "vflow/job/control_plane.h"

namespace vflow::scheduler {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// ---- jobs file -----------------------------------------------------------------

/// semantic.steps of a job spec when it is a plain number; the spec itself is vflow-train's
/// to validate, so anything unreadable just leaves the estimate unknown.
double spec_steps(const std::string& spec_path) {
  try {
    const SpecNode root = load_yaml_file(spec_path, "job spec");
    const SpecNode* semantic = root.is_map() ? root.find("semantic") : nullptr;
    const SpecNode* steps = semantic && semantic->is_map() ? semantic->find("steps") : nullptr;
    if (steps && steps->is_scalar()) {
      char* end = nullptr;
      const double v = std::strtod(steps->value().c_str(), &end);
      if (end && *end == '\0' && std::isfinite(v)) return std::max(1.0, v);
    }
  } catch (const Error&) {
  }
  return 1;
}

constexpr int kMaxInt = std::numeric_limits<int>::max();

LiveJob read_entry(const std::string& path, const SpecNode& entry) {
  OptionReader r(entry);
  LiveJob job;
  job.origin = fmt::format("{}:{}", path, entry.where().line);
  job.name = r.get_string("name", "");
  if (job.name.empty()) r.fail("name", "a job needs a name");
  const bool safe = std::all_of(job.name.begin(), job.name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
  if (!safe || job.name[0] == '.') r.fail("name", "use letters, digits, '-', '_' and '.'");
  const fs::path spec = r.get_string("spec", "");
  if (spec.empty()) r.fail("spec", "a job needs a job spec file");
  job.spec = (spec.is_absolute() ? spec : fs::path(path).parent_path() / spec).string();
  std::error_code ec;
  if (!fs::is_regular_file(job.spec, ec)) {
    r.fail("spec", fmt::format("no such file {}", job.spec));
  }
  const double kUnbounded = std::numeric_limits<double>::max();
  job.arrival_s = r.get_double("arrival_s", 0, 0, kUnbounded);
  job.weight = r.get_double("weight", 1, 1e-9, kUnbounded);
  job.demand = static_cast<int>(r.get_int("demand", 1, 1, kMaxInt));
  job.min_workers = static_cast<int>(r.get_int("min_workers", 1, 1, kMaxInt));
  job.max_workers = static_cast<int>(r.get_int("max_workers", job.demand, 1, kMaxInt));
  if (job.min_workers > job.demand) r.fail("min_workers", "must be <= demand");
  if (job.max_workers < job.demand) r.fail("max_workers", "must be >= demand");
  job.steps = r.has("steps") ? r.get_double("steps", 1, 1, kUnbounded) : spec_steps(job.spec);
  job.args = r.get_string_list("args", {});
  job.model = r.get_string("model", "");
  r.finish();
  return job;
}

// ---- processes -----------------------------------------------------------------

/// Whether something accepts connections on 127.0.0.1:port. Connecting to a store that is
/// not up yet would block for the client's whole timeout; a refused connect returns at once.
bool port_open(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool open = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return open;
}

/// Starts `argv` in a process group of its own (so the job's launcher and workers can be
/// killed together, and a terminal's Ctrl-C reaches only the scheduler), output to `log`.
pid_t spawn(const std::vector<std::string>& argv, const std::string& log) {
  const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(fmt::format("{}: cannot write: {}", log, std::strerror(errno)));
  SpawnOptions options;
  options.command = argv;
  options.stdout_fd = fd;
  options.stderr_fd = fd;
  options.own_process_group = true;
  // A scheduler that dies without cleaning up (SIGKILL) still stops its jobs: the
  // launcher takes SIGTERM as a stop request.
  options.parent_death_signal = SIGTERM;
  try {
    const pid_t pid = spawn_process(options);
    close(fd);
    return pid;
  } catch (...) {
    close(fd);
    throw;
  }
}

bool has_checkpoint(const fs::path& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".pt") return true;
  }
  return false;
}

std::string plural(int n, const char* word) {
  return fmt::format("{} {}{}", n, word, n == 1 ? "" : "s");
}

// ---- the run -------------------------------------------------------------------

constexpr int kStoppedExit = kExitStopped;  // vflow-train after a stop request

struct LiveState {
  bool arrived = false;
  bool finished = false;
  int held = 0;    // workers the policy gives the job (slots it occupies)
  pid_t pid = -1;  // the job's launcher (leader of its process group); -1 when none
  int port = 0;
  std::unique_ptr<job::ControlPlane> control;  // set once the job's limits are readable
  int requested = 0;                           // workers the job was started with or last asked for
  bool stopping = false;
  bool abandoned = false;   // stopped for good (it never came up), not preempted
  int64_t launch_step = 0;  // the step it was (re)started from, as last reported
  bool up = false;          // it has reported a step beyond launch_step since its launch
  Clock::time_point launched_at, stop_sent_at;
};

Cluster pool_of(int slots) {
  if (slots < 1) throw SpecError("live: --slots must be >= 1");
  return Cluster({{"slot", slots}});
}

class LiveRun {
 public:
  LiveRun(const std::vector<LiveJob>& jobs, const LiveOptions& options)
      : options_(options), cluster_(pool_of(options.slots)) {
    if (options.train_binary.empty() || access(options.train_binary.c_str(), X_OK) != 0) {
      throw SpecError(
          fmt::format("live: vflow-train not found or not executable at '{}' (--train PATH)",
                      options.train_binary));
    }
    if (options.out_dir.empty()) throw SpecError("live: an output directory is required (--out)");
    PolicyOptions policy_options = options.policy_options;
    policy_options.restart_s = options.restart_s;
    policy_options.resize_pause_s = options.resize_pause_s;
    policy_ = make_policy(options.policy, policy_options);
    jobs_ = jobs;
    std::stable_sort(jobs_.begin(), jobs_.end(),
                     [](const LiveJob& a, const LiveJob& b) { return a.arrival_s < b.arrival_s; });
    const ThroughputTable table =
        options.throughput.empty() ? ThroughputTable() : ThroughputTable::load(options.throughput);
    std::set<std::string> names;
    std::vector<JobRecord> records;
    for (const auto& job : jobs_) {
      if (!names.insert(job.name).second) {
        throw SpecError(fmt::format("{}: name: '{}' is used twice", job.origin, job.name));
      }
      if (job.demand > options.slots) {
        throw SpecError(fmt::format("{}: demand {} does not fit the pool of {} slots (--slots)",
                                    job.origin, job.demand, options.slots));
      }
      if (!job.model.empty() && !table.has_model(job.model)) {
        throw SpecError(fmt::format("{}: model: '{}' has no rows in the throughput file '{}'",
                                    job.origin, job.model, options.throughput));
      }
      records.push_back({job.arrival_s, job.model.empty() ? job.name : job.model, job.steps, 0,
                         job.demand, job.min_workers, job.max_workers, job.weight, job.origin});
    }
    // Binding checks that every job fits the pool and gives the policies their estimates:
    // the throughput file's curve of the job's model, else the fallback curve.
    workload_ = bind_workload(records, table, cluster_);
    for (const auto dir : {"logs", "checkpoints"}) {
      std::error_code ec;
      fs::create_directories(fs::path(options.out_dir) / dir, ec);
      if (ec) throw Error(fmt::format("{}: cannot create: {}", options.out_dir, ec.message()));
    }
    state_.resize(jobs_.size());
    result_.policy = policy_->name();
    result_.total_devices = options.slots;
    for (const auto& job : workload_.jobs) {  // in jobs_' order: both sorted stably by arrival
      result_.jobs.push_back(job_result_for(job));
      outcomes_.push_back({jobs_[job.id].name, -1, 0, 0, log_path(job.id), {}, {}});
      if (options.log && table.has_model(job.model)) {
        options.log(fmt::format("{}: throughput of model {}: {}", jobs_[job.id].name, job.model,
                                (*job.throughput)[0].describe()));
      }
    }
  }

  ~LiveRun() {
    try {
      stop_all();
    } catch (...) {
      kill_all();  // never leave a job behind, whatever failed
    }
  }

  LiveResult run() {
    start_ = Clock::now();
    double last = 0;
    double next_round = policy_->round_s() > 0 ? policy_->round_s() : -1;
    while (finished_ < static_cast<int>(jobs_.size())) {
      if (options_.stop_flag != nullptr && options_.stop_flag->load()) {
        interrupted_ = true;
        say("interrupted: stopping every job");
        break;
      }
      const double now = elapsed();
      account(now - last);
      last = now;
      bool changed = reap(now);
      for (size_t id = 0; id < jobs_.size(); ++id) {
        if (!state_[id].arrived && jobs_[id].arrival_s <= now) {
          arrive(static_cast<int>(id));
          changed = true;
        }
      }
      if (next_round > 0 && now >= next_round) {
        next_round += policy_->round_s();
        changed |= !active_.empty();
      }
      if (changed) reallocate(now);
      for (int id : active_) reconcile(id);
      std::this_thread::sleep_for(std::chrono::duration<double>(options_.poll_s));
    }
    stop_all();
    account(elapsed() - last);
    result_.wall_s = elapsed();
    return finish_result();
  }

 private:
  double elapsed() const { return seconds_since(start_); }

  void say(const std::string& line) const {
    if (options_.log) options_.log(fmt::format("[{:7.1f} s] {}", elapsed(), line));
  }

  const std::string& name(int id) const { return jobs_[id].name; }
  std::string log_path(int id) const {
    return (fs::path(options_.out_dir) / "logs" / (name(id) + ".log")).string();
  }

  // Device-seconds as the simulator counts them: slots held, whatever the job does.
  void account(double dt) {
    for (int id : active_) result_.jobs[id].device_seconds += state_[id].held * dt;
  }

  void arrive(int id) {
    const Job& job = workload_.jobs[id];
    state_[id].arrived = true;
    active_.insert(std::upper_bound(active_.begin(), active_.end(), id), id);
    say(fmt::format("arrive {} (demand {}, workers {}..{}, weight {:g}, {:g} steps)", name(id),
                    job.demand, job.min_workers, job.max_workers, job.weight, job.total_work));
  }

  void reallocate(double now) {
    std::vector<JobView> views;
    for (int id : active_) {
      const Job& job = workload_.jobs[id];
      const double remaining = std::max(1.0, job.total_work - outcomes_[id].last_step);
      views.push_back({&job, remaining, result_.jobs[id].device_seconds,
                       state_[id].held > 0 ? 0 : -1, state_[id].held});
      views.back().restart_s = restart_cost(id);
    }
    const Allocation allocation = policy_->allocate(cluster_, views, now);
    ++result_.allocations;
    if (!allocation.spans.empty()) {  // one device type (slot): nothing to span
      throw InternalError(
          fmt::format("policy {} spans device types in live mode", policy_->name()));
    }
    std::map<int, int> workers;
    int total = 0;
    for (const auto& a : allocation.assignments) {
      const Job& job = workload_.jobs.at(a.job_id);
      const bool ok = policy_->elastic()
                          ? a.workers >= job.min_workers && a.workers <= job.max_workers
                          : a.workers == job.demand;
      if (!ok || !state_[a.job_id].arrived || state_[a.job_id].finished) {
        throw InternalError(fmt::format("policy {} gave job {} {} workers", policy_->name(),
                                        name(a.job_id), a.workers));
      }
      workers[a.job_id] = a.workers;
      total += a.workers;
    }
    if (total > options_.slots) {
      throw InternalError(
          fmt::format("policy {} used {} of {} slots", policy_->name(), total, options_.slots));
    }
    std::string summary;
    bool any = false;
    for (int id : active_) {
      const int w = workers.count(id) ? workers[id] : 0;
      summary += fmt::format("{}{}={}", summary.empty() ? "" : " ", name(id), w);
      if (w != state_[id].held) {
        apply(id, w, now);
        any = true;
      }
    }
    if (any) say(fmt::format("allocation: {} ({} of {} slots)", summary, total, options_.slots));
    record(now);
  }

  // The same bookkeeping as the simulator's: one type, so a change of a running job's
  // worker count is a resize, and losing every worker a preemption.
  void apply(int id, int workers, double now) {
    LiveState& s = state_[id];
    JobResult& r = result_.jobs[id];
    if (s.held > 0 && workers > 0) {
      ++r.resizes;
    } else if (workers > 0) {
      if (r.start_s < 0) r.start_s = now;
    } else {
      ++r.preemptions;
    }
    allocated_ += workers - s.held;
    s.held = workers;
  }

  void record(double now) {
    auto& timeline = result_.timeline;
    if (!timeline.empty() && timeline.back().allocated == allocated_) return;
    timeline.push_back({now, allocated_});
  }

  // Brings the job's processes in line with what the policy gave it.
  void reconcile(int id) {
    LiveState& s = state_[id];
    if (s.finished) return;
    if (s.pid < 0) {
      if (s.held > 0) launch(id);
      return;
    }
    if (!s.control) connect(id);
    if (s.held == 0 && !s.stopping) {
      const double restart = restart_cost(id);
      say(fmt::format("preempt {} at step {}: stop with a checkpoint ({})", name(id),
                      outcomes_[id].last_step,
                      restart < 0 ? std::string("restart not measured yet")
                                  : fmt::format("measured restart {:.1f} s", restart)));
      request_stop(id);
    } else if (s.stopping && Clock::now() - s.stop_sent_at > grace()) {
      say(fmt::format("{} ignored the stop request for {:.0f} s: killing it", name(id),
                      options_.stop_grace_s));
      killpg(s.pid, SIGKILL);
      s.stop_sent_at = Clock::now();
    } else if (s.control && !s.stopping && s.requested != s.held) {
      say(fmt::format("resize {} {} -> {} at step {}", name(id), s.requested, s.held,
                      outcomes_[id].last_step));
      s.requested = s.held;  // once: a refused request is not retried every tick
      try {
        s.control->request_resize(s.held);
      } catch (const Error& e) {
        say(fmt::format("resize of {} failed: {}", name(id), e.what()));
      }
    }
    if (!s.control && !s.stopping &&
        Clock::now() - s.launched_at > std::chrono::duration<double>(options_.connect_timeout_s)) {
      say(fmt::format("{} did not open its control plane within {:.0f} s: stopping it", name(id),
                      options_.connect_timeout_s));
      s.abandoned = true;
      request_stop(id);
    }
  }

  std::chrono::duration<double> grace() const {
    return std::chrono::duration<double>(options_.stop_grace_s);
  }

  void launch(int id) {
    LiveState& s = state_[id];
    const LiveJob& job = jobs_[id];
    const auto checkpoints = fs::path(options_.out_dir) / "checkpoints" / job.name;
    // A job stopped before its first step may have written no checkpoint: it starts afresh.
    const bool resume = outcomes_[id].launches > 0 && has_checkpoint(checkpoints);
    std::vector<std::string> argv = {options_.train_binary, job.spec};
    argv.insert(argv.end(), job.args.begin(), job.args.end());
    for (const auto& set : {fmt::format("resources.min_workers={}", workload_.jobs[id].min_workers),
                            fmt::format("resources.max_workers={}", workload_.jobs[id].max_workers),
                            fmt::format("output.checkpoint.dir={}", checkpoints.string())}) {
      argv.insert(argv.end(), {"--set", set});
    }
    if (resume) argv.insert(argv.end(), {"--resume", "latest"});
    argv.insert(argv.end(), {"--workers", std::to_string(s.held)});
    std::string where;
    if (cluster()) {
      // On the agents' slots, by name; a resumed job takes its name again (a stopped job's
      // keys are removed when it ends).
      argv.insert(argv.end(), {"--control", options_.control, "--job", job.name});
      where = fmt::format("job '{}' on {}", job.name, options_.control);
    } else {
      s.port = free_loopback_port();
      argv.insert(argv.end(), {"--port", std::to_string(s.port)});
      where = fmt::format("127.0.0.1:{}", s.port);
    }
    s.pid = spawn(argv, log_path(id));
    s.launched_at = Clock::now();
    s.launch_step = outcomes_[id].last_step;
    s.up = false;
    s.requested = s.held;
    s.stopping = false;
    ++outcomes_[id].launches;
    say(fmt::format("{} {} on {} ({}, pid {})", resume ? "resume" : "start", name(id),
                    plural(s.held, "worker"), where, s.pid));
  }

  bool cluster() const { return !options_.control.empty(); }

  void connect(int id) {
    LiveState& s = state_[id];
    if (!cluster() && !port_open(s.port)) return;
    try {
      const std::chrono::milliseconds timeout(10000);
      auto control = std::make_unique<job::ControlPlane>(
          cluster() ? job::ControlPlane::on_cluster(options_.control, jobs_[id].name, timeout)
                    : job::ControlPlane("127.0.0.1", s.port, timeout));
      control->limits();  // throws until the launcher has published them
      s.control = std::move(control);
    } catch (const Error&) {
      // Not ready yet (or already gone): the next tick tries again, or reaps the job.
    }
  }

  void request_stop(int id) {
    LiveState& s = state_[id];
    if (s.stopping || s.pid < 0) return;
    s.stopping = true;
    s.stop_sent_at = Clock::now();
    try {
      if (s.control) {
        s.control->request_stop();
        return;
      }
    } catch (const Error&) {
    }
    // The launcher takes SIGINT as a stop request (and, on one machine, SIGTERM too; on a
    // cluster store SIGTERM makes it leave the job to the agents).
    kill(s.pid, SIGINT);
  }

  void poll_step(int id) {
    LiveState& s = state_[id];
    if (!s.control) return;
    try {
      outcomes_[id].last_step = std::max(outcomes_[id].last_step, s.control->status().step);
    } catch (const Error&) {
      // The job is ending; its exit status tells what happened.
    }
    if (!s.up && outcomes_[id].last_step > s.launch_step) {
      s.up = true;
      const double took = seconds_since(s.launched_at);
      outcomes_[id].start_seconds.push_back(took);
      say(fmt::format("{} is at step {}, {:.1f} s after its {}", name(id), outcomes_[id].last_step,
                      took, outcomes_[id].launches > 1 ? "resume" : "start"));
    }
  }

  // What preempting the job would cost it, as measured: its last start (to its first step)
  // plus its last stop, or the mean stop of the preemptions so far (none: 0); -1 before
  // its first start is measured.
  double restart_cost(int id) const {
    const LiveJobOutcome& o = outcomes_[id];
    if (o.start_seconds.empty()) return -1;
    double stop = 0;
    if (!o.stop_seconds.empty()) {
      stop = o.stop_seconds.back();
    } else if (stops_ > 0) {
      stop = stop_seconds_ / stops_;
    }
    return o.start_seconds.back() + stop;
  }

  // Collects ended launchers; true when a job completed or failed.
  bool reap(double now) {
    bool changed = false;
    for (int id : std::vector<int>(active_)) {
      LiveState& s = state_[id];
      if (s.pid < 0) continue;
      poll_step(id);
      int status = 0;
      if (waitpid(s.pid, &status, WNOHANG) != s.pid) continue;
      const int code = exit_code_of_status(status);
      killpg(s.pid, SIGKILL);  // workers of a launcher that died abruptly
      s.pid = -1;
      s.control.reset();
      outcomes_[id].exit_code = code;
      const bool preempted = s.stopping && code == kStoppedExit && !s.abandoned && !interrupted_;
      s.stopping = false;
      if (preempted) {
        const double took = seconds_since(s.stop_sent_at);
        outcomes_[id].stop_seconds.push_back(took);
        stop_seconds_ += took;
        ++stops_;
        say(fmt::format("{} stopped at step {} (preempted), {:.1f} s after the request", name(id),
                        outcomes_[id].last_step, took));
        continue;
      }
      if (code == 0) outcomes_[id].last_step = static_cast<int64_t>(jobs_[id].steps);
      finish(id, now, code);
      changed = true;
    }
    return changed;
  }

  void finish(int id, double now, int code) {
    LiveState& s = state_[id];
    JobResult& r = result_.jobs[id];
    s.finished = true;
    allocated_ -= s.held;
    s.held = 0;
    r.finish_s = now;
    r.work_done = static_cast<double>(outcomes_[id].last_step);
    active_.erase(std::find(active_.begin(), active_.end(), id));
    ++finished_;
    say(fmt::format("{} {} (exit {}, JCT {:.1f} s, queueing {:.1f} s, {}, log {})", name(id),
                    code == 0 ? "completed" : "FAILED", code, r.jct_s(), r.queueing_s(),
                    plural(r.resizes, "resize"), outcomes_[id].log_path));
  }

  // Stop requests to every job still running, then SIGKILL after the grace period.
  void stop_all() {
    bool any = false;
    for (size_t id = 0; id < state_.size(); ++id) {
      if (state_[id].pid < 0) continue;
      any = true;
      request_stop(static_cast<int>(id));
    }
    if (!any) return;
    const auto deadline = Clock::now() + grace();
    while (Clock::now() < deadline) {
      bool running = false;
      for (size_t id = 0; id < state_.size(); ++id) {
        LiveState& s = state_[id];
        if (s.pid < 0) continue;
        int status = 0;
        if (waitpid(s.pid, &status, WNOHANG) == s.pid) {
          outcomes_[id].exit_code = exit_code_of_status(status);
          killpg(s.pid, SIGKILL);
          s.pid = -1;
          s.control.reset();
        } else {
          running = true;
        }
      }
      if (!running) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    kill_all();
  }

  void kill_all() noexcept {
    for (auto& s : state_) {
      if (s.pid < 0) continue;
      killpg(s.pid, SIGKILL);
      int status = 0;
      waitpid(s.pid, &status, 0);
      s.pid = -1;
    }
  }

  LiveResult finish_result() {
    LiveResult out;
    out.interrupted = interrupted_;
    out.outcomes = outcomes_;
    // Jobs that never finished (interrupted) end now, so that metrics stay defined.
    for (auto& r : result_.jobs) {
      if (r.finish_s < 0) r.finish_s = result_.wall_s;
      if (r.start_s < 0) r.start_s = r.finish_s;
    }
    out.experiment.workload = workload_;
    out.experiment.runs.push_back(result_);
    out.experiment.summaries.push_back(summarize(result_));
    return out;
  }

  LiveOptions options_;
  Cluster cluster_;
  std::unique_ptr<Policy> policy_;
  std::vector<LiveJob> jobs_;  // by job id (arrival order)
  Workload workload_;
  std::vector<LiveState> state_;
  std::vector<LiveJobOutcome> outcomes_;
  std::vector<int> active_;  // arrived, unfinished, ascending ids
  SimResult result_;
  Clock::time_point start_;
  int allocated_ = 0;
  int finished_ = 0;
  bool interrupted_ = false;
  double stop_seconds_ = 0;  // summed over every preemption so far
  int stops_ = 0;
};

}  // namespace

bool LiveResult::all_completed() const {
  return !interrupted && std::all_of(outcomes.begin(), outcomes.end(),
                                     [](const LiveJobOutcome& o) { return o.exit_code == 0; });
}

std::vector<LiveJob> read_live_jobs(const std::string& path) {
  const SpecNode root = load_yaml_file(path, "jobs file");
  if (!root.is_sequence() || root.items().empty()) {
    throw SpecError(fmt::format("{}: expected a non-empty list of jobs", root.where().str()));
  }
  std::vector<LiveJob> jobs;
  for (const auto& entry : root.items()) {
    if (!entry.is_map()) {
      throw SpecError(
          fmt::format("{}: expected a job (a map with name, spec, ...)", entry.describe()));
    }
    jobs.push_back(read_entry(path, entry));
  }
  return jobs;
}

LiveResult run_live(const std::vector<LiveJob>& jobs, const LiveOptions& options) {
  // A job's store connection that breaks as the job ends must fail the next call, not
  // kill the scheduler with SIGPIPE.
  struct IgnoreSigpipe {
    struct sigaction old {};
    IgnoreSigpipe() {
      struct sigaction ignore {};
      ignore.sa_handler = SIG_IGN;
      sigaction(SIGPIPE, &ignore, &old);
    }
    ~IgnoreSigpipe() { sigaction(SIGPIPE, &old, nullptr); }
  } ignore_sigpipe;
  LiveOptions resolved = options;
  if (!options.control.empty() && options.slots == 0) {
    // The pool is the CPU slots the node agents have registered now.
    resolved.slots = job::agent_slots(options.control, "cpu", std::chrono::seconds(10));
    if (resolved.slots == 0) {
      throw SpecError(
          fmt::format("live: no node agent with a cpu slot is registered on {}", options.control));
    }
    if (options.log) {
      options.log(
          fmt::format("{} cpu slot(s) of the node agents on {}", resolved.slots, options.control));
    }
  }
  LiveRun run(jobs, resolved);
  return run.run();
}

}  // namespace vflow::scheduler
