#include "vflow/comm/launcher.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace vflow::comm {

// ---- coordinator -------------------------------------------------------------

struct Coordinator::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

Coordinator::Coordinator(const std::string& host, int port, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()), host_(host) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(port);
  options.isServer = true;
  options.waitWorkers = false;
  options.timeout = timeout;
  try {
    impl_->store = c10::make_intrusive<c10d::TCPStore>(host, options);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    throw Error(fmt::format("[comm] cannot host the job's store on {}:{}: {}", host, port,
                            what.substr(0, what.find('\n'))));
  }
}

Coordinator::~Coordinator() = default;

int Coordinator::port() const { return impl_->store->getPort(); }

bool Coordinator::serve(int workers, const std::atomic<bool>* stop) {
  while (!(stop && stop->load())) {
    if (impl_->store->add(kLeftKey, 0) >= workers) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// ---- worker environment ------------------------------------------------------

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
    throw Error(
        fmt::format("environment variable {}='{}' is not a non-negative integer", name, value));
  }
  return static_cast<int>(v);
}
}  // namespace

std::optional<Rendezvous> rendezvous_from_environment(std::chrono::milliseconds timeout) {
  Rendezvous r;
  r.timeout = timeout;
  const auto rank = env("VFLOW_RANK");
  const auto size = env("VFLOW_WORLD_SIZE");
  const auto store = env("VFLOW_STORE");
  if (rank || size || store) {
    if (!rank || !size || !store) {
      throw Error("VFLOW_RANK, VFLOW_WORLD_SIZE and VFLOW_STORE must be set together");
    }
    r.rank = env_int("VFLOW_RANK", *rank);
    r.world_size = env_int("VFLOW_WORLD_SIZE", *size);
    const auto colon = store->rfind(':');
    if (colon == std::string::npos)
      throw Error("VFLOW_STORE must be host:port, got '" + *store + "'");
    r.store_host = store->substr(0, colon);
    r.store_port = env_int("VFLOW_STORE", store->substr(colon + 1));
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
      throw Error(
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
    throw Error(fmt::format("rank {} is not below the world size {}", r.rank, r.world_size));
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

// ---- local launcher ------------------------------------------------------------

namespace {

struct Child {
  int rank = 0;
  pid_t pid = -1;
  int out = -1;  // stdout pipe
  int err = -1;  // stderr pipe
  std::string out_buf, err_buf;
  bool running = true;
  int exit_code = 0;
};

void forward_lines(std::string& buffer, const char* data, size_t n, int rank, FILE* sink,
                   bool flush_all) {
  buffer.append(data, n);
  size_t start = 0;
  while (true) {
    const size_t nl = buffer.find('\n', start);
    if (nl == std::string::npos) break;
    std::fprintf(sink, "[rank %d] %.*s\n", rank, static_cast<int>(nl - start),
                 buffer.data() + start);
    start = nl + 1;
  }
  buffer.erase(0, start);
  if (flush_all && !buffer.empty()) {
    std::fprintf(sink, "[rank %d] %s\n", rank, buffer.c_str());
    buffer.clear();
  }
  std::fflush(sink);
}

pid_t spawn(const std::vector<std::string>& command, const std::vector<std::string>& extra_env,
            int out_fd, int err_fd) {
  const pid_t pid = fork();
  if (pid < 0) throw Error(fmt::format("fork failed: {}", std::strerror(errno)));
  if (pid == 0) {
    dup2(out_fd, STDOUT_FILENO);
    dup2(err_fd, STDERR_FILENO);
    for (const auto& e : extra_env) putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> argv;
    for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    std::fprintf(stderr, "cannot run %s: %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  return pid;
}

}  // namespace

int launch_local(const LaunchOptions& options) {
  Coordinator coordinator("127.0.0.1", 0, options.timeout);
  spdlog::info("[launch] coordinator on {}:{}, starting {} workers", coordinator.host(),
               coordinator.port(), options.workers);
  std::vector<Child> children(static_cast<size_t>(options.workers));
  for (int k = 0; k < options.workers; ++k) {
    int out[2], err[2];
    if (pipe(out) != 0 || pipe(err) != 0) throw Error("pipe failed");
    auto& c = children[static_cast<size_t>(k)];
    c.rank = k;
    const std::vector<std::string> env{
        fmt::format("VFLOW_RANK={}", k), fmt::format("VFLOW_WORLD_SIZE={}", options.workers),
        fmt::format("VFLOW_STORE={}:{}", coordinator.host(), coordinator.port()),
        fmt::format("VFLOW_LOCAL_WORLD_SIZE={}", options.workers)};
    c.pid = spawn(options.command, env, out[1], err[1]);
    close(out[1]);
    close(err[1]);
    c.out = out[0];
    c.err = err[0];
  }

  int result = 0;
  bool stopping = false;
  std::chrono::steady_clock::time_point stop_deadline;
  auto stop_all = [&](int sig) {
    for (auto& c : children) {
      if (c.running) kill(c.pid, sig);
    }
  };
  while (true) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Child*, bool>> owners;  // (child, is_stdout)
    for (auto& c : children) {
      if (c.out >= 0) {
        fds.push_back({c.out, POLLIN, 0});
        owners.emplace_back(&c, true);
      }
      if (c.err >= 0) {
        fds.push_back({c.err, POLLIN, 0});
        owners.emplace_back(&c, false);
      }
    }
    if (fds.empty()) break;
    poll(fds.data(), fds.size(), 100);
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      auto [c, is_out] = owners[i];
      char buf[8192];
      const ssize_t n = read(fds[i].fd, buf, sizeof buf);
      int& fd = is_out ? c->out : c->err;
      std::string& line_buf = is_out ? c->out_buf : c->err_buf;
      FILE* sink = is_out ? stdout : stderr;
      if (n > 0) {
        forward_lines(line_buf, buf, static_cast<size_t>(n), c->rank, sink, false);
      } else {
        forward_lines(line_buf, buf, 0, c->rank, sink, true);
        close(fd);
        fd = -1;
      }
    }
    for (auto& c : children) {
      if (!c.running) continue;
      int status = 0;
      if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
        c.running = false;
        c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (c.exit_code != 0 && result == 0) {
          result = c.exit_code;
          if (!stopping) {
            spdlog::error("[launch] worker {} exited with status {}; stopping the others", c.rank,
                          c.exit_code);
            stopping = true;
            stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
            stop_all(SIGTERM);
          }
        }
      }
    }
    if (options.stop_flag && options.stop_flag->load() && !stopping) {
      spdlog::warn("[launch] stopping the workers");
      stopping = true;
      stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      stop_all(SIGTERM);
    }
    if (stopping && std::chrono::steady_clock::now() > stop_deadline) stop_all(SIGKILL);
  }
  // Pipes are closed; reap whoever is left.
  for (auto& c : children) {
    if (!c.running) continue;
    int status = 0;
    waitpid(c.pid, &status, 0);
    c.running = false;
    c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (c.exit_code != 0 && result == 0) result = c.exit_code;
  }
  return result;
}

}  // namespace vflow::comm
