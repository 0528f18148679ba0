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
#include <thread>
#include <tuple>

#include "comm/store.h"
#include "vflow/core/address.h"
#include "vflow/core/exit_code.h"
#include "vflow/core/process.h"

namespace vflow::job {

// ---- coordinator -------------------------------------------------------------

struct Coordinator::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

Coordinator::Coordinator(const std::string& host, int port, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()), host_(host) {
  try {
    impl_->store = comm::open_store(host, port, timeout, /*server=*/true);
  } catch (const std::exception& e) {
    throw Error(
        fmt::format("[comm] cannot host the job's store on {}:{}: {}", host, port, e.what()));
  }
}

Coordinator::~Coordinator() = default;

int Coordinator::port() const { return impl_->store->getPort(); }

bool Coordinator::serve(int workers, const std::atomic<bool>* stop) {
  while (!(stop && stop->load())) {
    if (impl_->store->add(comm::kLeftKey, 0) >= workers) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// ---- local launcher ------------------------------------------------------------

namespace {

void forward_lines(std::string& buffer, const char* data, size_t n, const std::string& name,
                   FILE* sink, bool flush_all) {
  buffer.append(data, n);
  size_t start = 0;
  while (true) {
    const size_t nl = buffer.find('\n', start);
    if (nl == std::string::npos) break;
    std::fprintf(sink, "[worker %s] %.*s\n", name.c_str(), static_cast<int>(nl - start),
                 buffer.data() + start);
    start = nl + 1;
  }
  buffer.erase(0, start);
  if (flush_all && !buffer.empty()) {
    std::fprintf(sink, "[worker %s] %s\n", name.c_str(), buffer.c_str());
    buffer.clear();
  }
  std::fflush(sink);
}

}  // namespace

namespace {

/// The worker processes of a local job and their output.
class ProcessGroup {
 public:
  ProcessGroup(std::vector<std::string> command, std::vector<std::string> env)
      : command_(std::move(command)), env_(std::move(env)) {}

  /// Starts a worker named `member` with `extra` environment variables.
  void start(const std::string& member, const std::vector<std::string>& extra = {}) {
    int out[2] = {-1, -1}, err[2] = {-1, -1};
    const auto close_all = [&] {
      for (const int fd : {out[0], out[1], err[0], err[1]}) {
        if (fd >= 0) close(fd);
      }
    };
    // Close-on-exec: no later child inherits this worker's pipes (dup2 clears the flag on
    // the child's own standard streams).
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
      const int e = errno;
      close_all();
      throw Error(fmt::format("pipe failed: {}", std::strerror(e)));
    }
    Child c;
    c.name = member;
    std::vector<std::string> env = env_;
    env.push_back("VFLOW_MEMBER=" + member);
    env.push_back("VFLOW_LOCAL_RANK=" + member);  // picks the GPU of device "cuda"
    env.insert(env.end(), extra.begin(), extra.end());
    SpawnOptions spawn;
    spawn.command = command_;
    spawn.environment = std::move(env);
    spawn.stdout_fd = out[1];
    spawn.stderr_fd = err[1];
    try {
      c.pid = spawn_process(spawn);
    } catch (...) {
      close_all();
      throw;
    }
    close(out[1]);
    close(err[1]);
    c.out = out[0];
    c.err = err[0];
    children_.push_back(std::move(c));
  }

  /// Forwards output for up to `wait_ms`; returns false once every worker has ended.
  bool pump(int wait_ms) {
    std::vector<pollfd> fds;
    std::vector<std::pair<size_t, bool>> owners;  // (child, is_stdout)
    for (size_t i = 0; i < children_.size(); ++i) {
      if (children_[i].out >= 0) {
        fds.push_back({children_[i].out, POLLIN, 0});
        owners.emplace_back(i, true);
      }
      if (children_[i].err >= 0) {
        fds.push_back({children_[i].err, POLLIN, 0});
        owners.emplace_back(i, false);
      }
    }
    if (fds.empty()) return !all_reaped();
    poll(fds.data(), fds.size(), wait_ms);
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      auto& c = children_[owners[i].first];
      const bool is_out = owners[i].second;
      char buf[8192];
      const ssize_t n = read(fds[i].fd, buf, sizeof buf);
      int& fd = is_out ? c.out : c.err;
      std::string& line_buf = is_out ? c.out_buf : c.err_buf;
      FILE* sink = is_out ? stdout : stderr;
      if (n > 0) {
        forward_lines(line_buf, buf, static_cast<size_t>(n), c.name, sink, false);
      } else {
        forward_lines(line_buf, buf, 0, c.name, sink, true);
        close(fd);
        fd = -1;
      }
    }
    return true;
  }

  /// Workers that ended since the last call, as (name, exit code).
  std::vector<std::pair<std::string, int>> reap() {
    std::vector<std::pair<std::string, int>> ended;
    for (auto& c : children_) {
      if (!c.running) continue;
      int status = 0;
      if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
        c.running = false;
        ended.emplace_back(c.name, exit_code_of_status(status));
      }
    }
    return ended;
  }

  void signal_all(int sig) {
    for (auto& c : children_) {
      if (c.running) kill(c.pid, sig);
    }
  }

  bool all_reaped() const {
    return std::none_of(children_.begin(), children_.end(),
                        [](const Child& c) { return c.running || c.out >= 0 || c.err >= 0; });
  }

 private:
  struct Child {
    std::string name;
    pid_t pid = -1;
    int out = -1;  // stdout pipe
    int err = -1;  // stderr pipe
    std::string out_buf, err_buf;
    bool running = true;
  };
  std::vector<std::string> command_;
  std::vector<std::string> env_;
  std::vector<Child> children_;
};

/// The launcher's liveness record on a cluster store (a lease there).
const char* const kLauncher = "launcher";

/// Takes the job's name on a cluster store: refused while a launcher of a job of that
/// name is alive; the keys of one that finished or died are removed first.
void claim_job_name(ControlPlane& control, const LaunchOptions& options) {
  auto& store = control.store();
  if (!store.list("").empty()) {
    if (control.done().empty() && store.alive(kLauncher)) {
      throw Error(
          fmt::format("a job named '{}' is running on {}: choose another --job, or stop it first "
                      "(vflow-ctl --control {} stop {})",
                      options.job, options.control, options.control, options.job));
    }
    const int64_t removed = store.remove_all("");
    spdlog::info("[launch] removed {} keys of an earlier job named '{}'", removed, options.job);
  }
  store.heartbeat(kLauncher, options.timeout);
  const std::string me = fmt::format("{}", getpid());
  if (store.set_if_absent("job/owner", me) != me) {
    throw Error(fmt::format("another launcher took the job name '{}' on {} at the same moment",
                            options.job, options.control));
  }
}

}  // namespace

int launch_local(const LaunchOptions& options) {
  const bool cluster = !options.control.empty();
  std::optional<Coordinator> coordinator;
  std::vector<std::string> env{fmt::format("VFLOW_LOCAL_WORLD_SIZE={}", options.workers)};
  std::unique_ptr<ControlStore> store;
  if (cluster) {
    store = connect_control_store(options.control, options.job, options.timeout);
    env.push_back("VFLOW_CONTROL=" + options.control);
    env.push_back("VFLOW_JOB=" + options.job);
  } else {
    coordinator.emplace("127.0.0.1", options.port, options.timeout);
    spdlog::info("[launch] coordinator on {}:{}, starting {} workers", coordinator->host(),
                 coordinator->port(), options.workers);
    store = connect_embedded_store(coordinator->host(), coordinator->port(), options.timeout);
    env.push_back(fmt::format("VFLOW_STORE={}:{}", coordinator->host(), coordinator->port()));
  }
  ControlPlane control(std::move(store));
  if (cluster) {
    claim_job_name(control, options);
    spdlog::info("[launch] job '{}' on the control store {}, starting {} workers", options.job,
                 options.control, options.workers);
  }
  if (!options.semantic.empty()) control.publish_spec(options.semantic);
  auto last_beat = std::chrono::steady_clock::now();
  ProcessGroup workers(options.command, env);
  int next_member = 0;
  auto start_worker = [&] {
    const std::string name = std::to_string(next_member++);
    workers.start(name);
    return name;
  };
  ElasticOptions elastic = options.elastic;
  elastic.timeout = options.timeout;
  GenerationManager manager(control, elastic, start_worker);
  std::vector<std::string> initial;
  for (int k = 0; k < options.workers; ++k) {
    const std::string name = std::to_string(next_member++);
    workers.start(name, k < static_cast<int>(options.worker_env.size())
                            ? options.worker_env[static_cast<size_t>(k)]
                            : std::vector<std::string>{});
    initial.push_back(name);
  }
  manager.start(initial, options.vnodes);

  int failure = 0;       // the first failure that ended the job
  int worker_error = 0;  // the first error a worker exited with (not a signal, not a stop)
  bool stop_sent = false;
  std::optional<std::chrono::steady_clock::time_point> kill_at;
  auto stop_workers = [&](int seconds) {
    if (!kill_at) kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  };
  while (workers.pump(20)) {
    if (cluster && std::chrono::steady_clock::now() - last_beat > options.timeout / 4) {
      try {
        control.store().heartbeat(kLauncher, options.timeout);
      } catch (const PeerFailure& e) {
        spdlog::error("{}", e.what());  // the workers find out too, through their own calls
      }
      last_beat = std::chrono::steady_clock::now();
    }
    for (const auto& [name, code] : workers.reap()) {
      const bool starting = manager.current().id == 0;
      if (code != 0 && code < 128 && worker_error == 0) worker_error = code;
      manager.on_exit(name, code);
      if (code != 0 && starting && failure == 0) {
        // A worker that cannot start fails the job: nothing has been trained yet.
        spdlog::error("[launch] worker {} exited with status {} at start-up; stopping the others",
                      name, code);
        failure = code;
        workers.signal_all(SIGTERM);
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
    if (kill_at && std::chrono::steady_clock::now() > *kill_at) workers.signal_all(SIGKILL);
  }
  if (failure != 0) return failure;
  const std::string done = control.done();
  const bool stopped = stop_sent || control.stop_requested();
  if (cluster) {
    // A finished job's keys go, so that a long-lived etcd does not collect them.
    try {
      control.store().remove_all("");
    } catch (const Error& e) {
      spdlog::warn("[launch] the keys of job '{}' could not be removed: {}", options.job, e.what());
    }
  }
  if (done == "completed") return kExitOk;
  // Stopped on request: a signal to this launcher, or `vflow-ctl stop` (the control plane).
  if (stopped) return kExitStopped;
  spdlog::error("[launch] the job ended {}", done.empty() ? "without finishing" : done);
  // A worker's own error (a checkpoint that could not be written at the end, exit 4, say)
  // says more than "a peer failed".
  return worker_error != 0 ? worker_error : kExitPeerFailure;
}

}  // namespace vflow::job
