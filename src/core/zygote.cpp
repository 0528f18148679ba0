#include "vflow/core/zygote.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <thread>

#include "core/child_start.h"
#include "vflow/core/process.h"

extern char** environ;

namespace vflow {

namespace {

/// The largest request (arguments and environment); a larger one is executed instead.
constexpr size_t kMaxRequest = 1 << 20;

struct Zygote {
  std::mutex mutex;  // one request at a time
  int socket = -1;   // to the zygote; -1: none (or it failed)
  pid_t pid = -1;    // the zygote's
  std::string executable;
  std::vector<std::string> environment;  // this process's at the zygote's start
};

bool g_started_by_zygote = false;

/// The signals the zygote ignores (a Ctrl-C or a SIGTERM to the launcher's process group
/// must not end it: it ends with the launcher), and what they were at its start.
constexpr int kIgnored[] = {SIGHUP, SIGINT, SIGQUIT, SIGTERM};
struct sigaction g_at_start[std::size(kIgnored)];

Zygote& zygote() {
  static Zygote* z = new Zygote;  // never destroyed: children may be spawned at exit
  return *z;
}

/// NAME -> NAME=value.
std::map<std::string, std::string> by_name(const std::vector<std::string>& entries) {
  std::map<std::string, std::string> out;
  for (const auto& e : entries) out[e.substr(0, e.find('='))] = e;
  return out;
}

int threads_of_this_process() {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int n = 0;
  while (const dirent* e = readdir(dir)) n += e->d_name[0] != '.';
  closedir(dir);
  return n;
}

// ---- the request: flags, directory, arguments, environment; the two streams as fds ----

void put_u32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }
void put_string(std::string& out, const std::string& s) {
  put_u32(out, static_cast<uint32_t>(s.size()));
  out += s;
}
void put_strings(std::string& out, const std::vector<std::string>& list) {
  put_u32(out, static_cast<uint32_t>(list.size()));
  for (const auto& s : list) put_string(out, s);
}

struct Reader {
  const char* at;
  const char* end;
  bool ok = true;
  uint32_t u32() {
    uint32_t v = 0;
    if (end - at < 4) {
      ok = false;
      return 0;
    }
    std::memcpy(&v, at, 4);
    at += 4;
    return v;
  }
  std::string string() {
    const uint32_t n = u32();
    if (!ok || static_cast<size_t>(end - at) < n) {
      ok = false;
      return {};
    }
    std::string s(at, n);
    at += n;
    return s;
  }
  std::vector<std::string> strings() {
    const uint32_t n = u32();
    std::vector<std::string> out;
    for (uint32_t i = 0; ok && i < n; ++i) out.push_back(string());
    return out;
  }
};

struct Request {
  bool own_process_group = false;
  int parent_death_signal = 0;
  std::string directory;
  std::vector<std::string> args;
  std::vector<std::string> environment;
  int out = -1, err = -1;  // the child's standard output and error
};

/// One buffer, and room for the two streams' descriptors.
struct Message {
  iovec iov;
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  msghdr msg{};
  Message(void* data, size_t size) : iov{data, size} {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
  }
  Message(const Message&) = delete;
  Message& operator=(const Message&) = delete;
};

bool send_request(int socket, const std::string& bytes, int out, int err) {
  Message m(const_cast<char*>(bytes.data()), bytes.size());
  auto& msg = m.msg;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(2 * sizeof(int));
  const int fds[2] = {out, err};
  std::memcpy(CMSG_DATA(c), fds, sizeof fds);
  return sendmsg(socket, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

/// The next request, or false when the launcher is gone (or sent something malformed).
bool receive_request(int socket, std::vector<char>& buffer, Request& r) {
  Message m(buffer.data(), buffer.size());
  auto& msg = m.msg;
  ssize_t n;
  do {
    n = recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return false;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (c == nullptr || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(2 * sizeof(int))) {
    return false;
  }
  int fds[2];
  std::memcpy(fds, CMSG_DATA(c), sizeof fds);
  r.out = fds[0];
  r.err = fds[1];
  Reader in{buffer.data(), buffer.data() + n};
  r.own_process_group = in.u32() != 0;
  r.parent_death_signal = static_cast<int>(in.u32());
  r.directory = in.string();
  r.args = in.strings();
  r.environment = in.strings();
  return in.ok && (msg.msg_flags & MSG_TRUNC) == 0 && !r.args.empty();
}

/// In the child the zygote forked (through a process that exited at once): the request's
/// settings as spawn_process's child makes them, then the program's entry.
[[noreturn]] void become(const Request& r, pid_t launcher, ProgramEntry entry) {
  // Its parent becomes the launcher (the subreaper) once the middle process has exited;
  // the parent-death signal must follow the launcher, not the process that exited.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (getppid() != launcher) {
    if (kill(launcher, 0) != 0 || std::chrono::steady_clock::now() > deadline) _exit(127);
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  // Its name, as a new execution of the program would have it (not the zygote's).
  const std::string name = r.args.front().substr(r.args.front().rfind('/') + 1);
  prctl(PR_SET_NAME, name.substr(0, 15).c_str());
  if (r.own_process_group) setpgid(0, 0);
  // As after an execution: the signals the launcher handles (SIGINT, SIGTERM) start
  // with their default action; the others as the launcher found them.
  for (size_t i = 0; i < std::size(kIgnored); ++i) sigaction(kIgnored[i], &g_at_start[i], nullptr);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  start_child(r.parent_death_signal, launcher, r.out, r.err, r.directory,
              "cannot run " + r.args.front() + ": cannot enter " + r.directory + "\n");
  g_started_by_zygote = true;
  clearenv();
  for (const auto& e : r.environment) putenv(strdup(e.c_str()));  // kept for the process
  std::vector<char*> argv;
  for (const auto& a : r.args) argv.push_back(strdup(a.c_str()));
  argv.push_back(nullptr);
  std::exit(entry(static_cast<int>(r.args.size()), argv.data()));
}

/// The zygote: forks a child for each request until the launcher goes.
[[noreturn]] void serve(int socket, pid_t launcher, ProgramEntry entry) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != launcher) _exit(0);
  prctl(PR_SET_NAME, "vflow-zygote");
  for (size_t i = 0; i < std::size(kIgnored); ++i) {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigaction(kIgnored[i], &ignore, &g_at_start[i]);
  }
  // Nothing of the launcher's streams stays open here: whoever reads the launcher's output
  // to its end must not wait for this process.
  const int null = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null >= 0) {
    dup2(null, STDOUT_FILENO);
    dup2(null, STDERR_FILENO);
    close(null);
  }
  std::vector<char> buffer(kMaxRequest);
  while (true) {
    Request r;
    if (!receive_request(socket, buffer, r)) _exit(0);
    // Through a middle process that exits at once, so that the child's parent becomes the
    // launcher; the middle one tells the child's pid through `link`.
    int link[2];
    int32_t reply = -EAGAIN;
    if (pipe2(link, O_CLOEXEC) == 0) {
      const pid_t middle = fork();
      if (middle == 0) {
        close(link[0]);
        const pid_t child = fork();
        if (child == 0) {
          close(link[1]);
          close(socket);
          become(r, launcher, entry);
        }
        const int32_t told = child > 0 ? child : -errno;
        (void)!write(link[1], &told, sizeof told);
        _exit(0);
      }
      close(link[1]);
      if (middle > 0) {
        int32_t told = -EIO;
        if (read(link[0], &told, sizeof told) == sizeof told) reply = told;
        // Once the middle process has been reaped, the child is the launcher's.
        while (waitpid(middle, nullptr, 0) < 0 && errno == EINTR) {
        }
      } else {
        reply = -errno;
      }
      close(link[0]);
    }
    close(r.out);
    close(r.err);
    if (send(socket, &reply, sizeof reply, MSG_NOSIGNAL) != sizeof reply) _exit(0);
  }
}

}  // namespace

bool started_by_zygote() { return g_started_by_zygote; }

bool fork_runs_as_executed(const std::vector<std::string>& wanted,
                           const std::vector<std::string>& at_start) {
  const auto a = by_name(wanted);
  const auto b = by_name(at_start);
  // Every variable of one that is not the engine's own has the same value in the other.
  const auto within = [](const std::map<std::string, std::string>& x,
                         const std::map<std::string, std::string>& y) {
    return std::all_of(x.begin(), x.end(), [&](const auto& kv) {
      if (kv.first.rfind("VFLOW_", 0) == 0) return true;
      const auto it = y.find(kv.first);
      return it != y.end() && it->second == kv.second;
    });
  };
  return within(a, b) && within(b, a);
}

void start_zygote(ProgramEntry entry) {
  auto& z = zygote();
  if (z.socket >= 0) return;
  // Opt-in while it proves itself in full test runs (docs/design.md).
  const char* on = std::getenv("VFLOW_ZYGOTE");
  if (on == nullptr || std::string(on) != "1") return;
  if (std::getenv("VFLOW_MEMBER") != nullptr) return;  // a worker starts no workers
  if (threads_of_this_process() != 1) return;          // a fork would miss the other threads
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) return;
  // Before the fork: the zygote and its children inherit that a subreaper is above them.
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    close(pair[0]);
    close(pair[1]);
    return;
  }
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) env.emplace_back(*e);
  const pid_t launcher = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    close(pair[0]);
    serve(pair[1], launcher, entry);
  }
  close(pair[1]);
  if (pid < 0) {
    close(pair[0]);
    return;
  }
  z.socket = pair[0];
  z.pid = pid;
  z.executable = this_executable("");
  z.environment = std::move(env);
  // At exit the zygote sees its socket close, ends, and is reaped here rather than left to
  // whichever process adopts it.
  std::atexit([] {
    auto& z = zygote();
    if (z.socket >= 0) close(z.socket);
    z.socket = -1;
    while (waitpid(z.pid, nullptr, 0) < 0 && errno == EINTR) {
    }
  });
}

std::optional<pid_t> spawn_from_zygote(const SpawnOptions& options,
                                       const std::vector<std::string>& environment) {
  auto& z = zygote();
  std::lock_guard<std::mutex> lock(z.mutex);
  if (z.socket < 0 || options.run_as_user >= 0 || options.command.empty() ||
      options.command.front() != z.executable) {
    return std::nullopt;
  }
  if (!fork_runs_as_executed(environment, z.environment)) return std::nullopt;
  std::string bytes;
  put_u32(bytes, options.own_process_group ? 1 : 0);
  put_u32(bytes, static_cast<uint32_t>(options.parent_death_signal));
  put_string(bytes,
             options.working_directory.empty() ? current_directory() : options.working_directory);
  put_strings(bytes, options.command);
  put_strings(bytes, environment);
  if (bytes.size() > kMaxRequest) return std::nullopt;
  const int out = options.stdout_fd >= 0 ? options.stdout_fd : STDOUT_FILENO;
  const int err = options.stderr_fd >= 0 ? options.stderr_fd : STDERR_FILENO;
  int32_t reply = 0;
  ssize_t n = -1;
  if (send_request(z.socket, bytes, out, err)) {
    do {
      n = recv(z.socket, &reply, sizeof reply, 0);
    } while (n < 0 && errno == EINTR);
  }
  if (n != sizeof reply || reply <= 0) {
    // The zygote is gone or could not fork: new executions from now on.
    close(z.socket);
    z.socket = -1;
    return std::nullopt;
  }
  return static_cast<pid_t>(reply);
}

}  // namespace vflow
