#include "vflow/core/process.h"

#include <fmt/format.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <vector>

#include "core/child_start.h"
#include "vflow/core/error.h"
#include "vflow/core/zygote.h"

extern char** environ;

namespace vflow {

void start_child(int death_signal, pid_t parent, int out, int err, const std::string& directory,
                 const std::string& cannot_enter) {
  if (death_signal != 0) {
    prctl(PR_SET_PDEATHSIG, death_signal);
    if (getppid() != parent) _exit(128 + death_signal);  // died meanwhile
  }
  // The program starts with default signal handling (this process may ignore SIGPIPE).
  signal(SIGPIPE, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (out >= 0) dup2(out, STDOUT_FILENO);
  if (err >= 0) dup2(err, STDERR_FILENO);
  if (!directory.empty() && chdir(directory.c_str()) != 0) {
    (void)!write(STDERR_FILENO, cannot_enter.data(), cannot_enter.size());
    _exit(127);
  }
  if (syscall(SYS_close_range, 3U, ~0U, 0U) != 0) {
    for (int i = 3; i < 4096; ++i) close(i);
  }
}

pid_t spawn_process(const SpawnOptions& options) {
  VFLOW_ASSERT(!options.command.empty(), "spawn_process needs a program");
  // Everything the child needs is built before fork: after it, only async-signal-safe
  // calls (the parent may have threads).
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const std::string entry(*e);
    env[entry.substr(0, entry.find('='))] = entry;
  }
  for (const auto& entry : options.environment) env[entry.substr(0, entry.find('='))] = entry;
  std::vector<std::string> entries;
  for (const auto& [name, entry] : env) entries.push_back(entry);
  if (const auto pid = spawn_from_zygote(options, entries)) {
    if (options.own_process_group) setpgid(*pid, *pid);  // as below
    return *pid;
  }
  std::vector<char*> envp;
  for (auto& [name, entry] : env) envp.push_back(entry.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = options.command;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string cannot_run = "cannot run " + args.front() + ": exec failed, errno ";
  const std::string cannot_enter =
      "cannot run " + args.front() + ": cannot enter " + options.working_directory + "\n";
  const pid_t parent = getpid();

  const std::string cannot_become =
      fmt::format("cannot run {} as user {}: setuid failed\n", args.front(), options.run_as_user);
  const pid_t pid = fork();
  if (pid == 0) {
    if (options.own_process_group) setpgid(0, 0);
    // Before the parent-death signal, which a change of user clears.
    if (options.run_as_user >= 0) {
      const auto id = static_cast<uid_t>(options.run_as_user);
      if (setgroups(0, nullptr) != 0 || setgid(id) != 0 || setuid(id) != 0) {
        (void)!write(STDERR_FILENO, cannot_become.data(), cannot_become.size());
        _exit(127);
      }
    }
    start_child(options.parent_death_signal, parent, options.stdout_fd, options.stderr_fd,
                options.working_directory, cannot_enter);
    execve(argv[0], argv.data(), envp.data());
    // Only async-signal-safe calls here: the message was made before fork.
    char digits[12];
    int n = 0;
    for (int e = errno; n == 0 || e > 0; e /= 10) digits[n++] = static_cast<char>('0' + e % 10);
    (void)!write(STDERR_FILENO, cannot_run.data(), cannot_run.size());
    while (n > 0) (void)!write(STDERR_FILENO, &digits[--n], 1);
    (void)!write(STDERR_FILENO, "\n", 1);
    _exit(127);
  }
  const int fork_errno = errno;
  if (pid < 0) throw Error(fmt::format("fork failed: {}", std::strerror(fork_errno)));
  // Also here: the parent may signal the group before the child runs.
  if (options.own_process_group) setpgid(pid, pid);
  return pid;
}

std::string current_directory() {
  char path[4096];
  return getcwd(path, sizeof path) ? std::string(path) : std::string();
}

std::string this_executable(const std::string& fallback) {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) return fallback;
  return std::string(path, static_cast<size_t>(n));
}

double cgroup_quota_cores(const std::string& text) {
  std::istringstream in(text);
  std::string quota;
  long long period = 0;
  std::string rest;
  if (!(in >> quota >> period) || (in >> rest) || period <= 0 || quota == "max") return 0;
  char* end = nullptr;
  const long long q = std::strtoll(quota.c_str(), &end, 10);
  if (end == quota.c_str() || *end != '\0' || q <= 0) return 0;
  return static_cast<double>(q) / static_cast<double>(period);
}

double cgroup_memory_bytes(const std::string& text) {
  std::istringstream in(text);
  std::string value;
  std::string rest;
  if (!(in >> value) || (in >> rest)) return 0;
  char* end = nullptr;
  const long long bytes = std::strtoll(value.c_str(), &end, 10);
  // "max" (v2) and v1's largest value, rounded to a page, mean none.
  if (end == value.c_str() || *end != '\0' || bytes <= 0 || bytes >= (1LL << 62)) return 0;
  return static_cast<double>(bytes);
}

std::optional<std::string> cgroup_path_in_mount(const std::string& root, const std::string& path) {
  if (root == "/") return path;
  if (path.compare(0, root.size(), root) != 0) return std::nullopt;
  if (path.size() == root.size()) return std::string("/");
  if (path[root.size()] != '/') return std::nullopt;
  return path.substr(root.size());
}

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return in ? text.str() : std::string();
}

/// A mounted cgroup hierarchy: the cgroup at its root, where it is mounted, its version
/// and (v1) its controllers.
struct CgroupMount {
  std::string root, point;
  bool v2 = false;
  std::vector<std::string> controllers;
};

std::vector<std::string> split(const std::string& text, char by) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, by)) parts.push_back(part);
  return parts;
}

/// A mountinfo field with its octal escapes (\040 for a space, \134 for a backslash)
/// decoded.
std::string unescape(const std::string& field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size() &&
        std::all_of(field.begin() + static_cast<long>(i) + 1,
                    field.begin() + static_cast<long>(i) + 4,
                    [](char c) { return c >= '0' && c <= '7'; })) {
      out += static_cast<char>((field[i + 1] - '0') * 64 + (field[i + 2] - '0') * 8 +
                               (field[i + 3] - '0'));
      i += 3;
    } else {
      out += field[i];
    }
  }
  return out;
}

/// The cgroup hierarchies mounted in this mount namespace (/proc/self/mountinfo).
std::vector<CgroupMount> cgroup_mounts() {
  std::vector<CgroupMount> mounts;
  std::ifstream info("/proc/self/mountinfo");
  std::string line;
  while (std::getline(info, line)) {
    // id parent major:minor root mount-point options [optional...] - type source super-options
    const auto fields = split(line, ' ');
    const auto dash = std::find(fields.begin(), fields.end(), "-");
    if (fields.size() < 5 || dash == fields.end() || fields.end() - dash < 4) continue;
    const std::string& type = dash[1];
    if (type != "cgroup" && type != "cgroup2") continue;
    CgroupMount m{unescape(fields[3]), unescape(fields[4]), type == "cgroup2", {}};
    if (!m.v2) m.controllers = split(dash[3], ',');
    mounts.push_back(std::move(m));
  }
  return mounts;
}

/// The smallest positive `value_of(directory, v2)` along this process's cgroup of
/// `controller` and every cgroup above it, in each hierarchy that shows it; 0 = none.
double smallest_along_cgroup(const std::string& controller,
                             const std::function<double(const std::string&, bool)>& value_of) {
  const auto mounts = cgroup_mounts();
  double smallest = 0;
  const auto take = [&](const std::string& point, std::string path, bool v2) {
    while (true) {
      const double value = value_of(point + (path == "/" ? "" : path), v2);
      if (value > 0 && (smallest == 0 || value < smallest)) smallest = value;
      if (path == "/" || path.empty()) return;
      const auto slash = path.find_last_of('/');
      path = slash == 0 ? "/" : path.substr(0, slash);
    }
  };
  const auto has = [&](const std::vector<std::string>& controllers) {
    return std::find(controllers.begin(), controllers.end(), controller) != controllers.end();
  };
  std::ifstream self("/proc/self/cgroup");
  std::string line;
  while (std::getline(self, line)) {
    // hierarchy-id:controllers:path; cgroup v2 is "0::path".
    const auto a = line.find(':');
    const auto b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const auto controllers = split(line.substr(a + 1, b - a - 1), ',');
    const std::string path = line.substr(b + 1);
    const bool v2 = line.compare(0, a, "0") == 0 && controllers.empty();
    if (!v2 && !has(controllers)) continue;
    bool mounted = false;
    for (const auto& m : mounts) {
      if (m.v2 != v2 || (!v2 && !has(m.controllers))) continue;
      mounted = true;  // where the cgroup is not below this mount's root, it is not seen here
      if (const auto below = cgroup_path_in_mount(m.root, path)) take(m.point, *below, v2);
    }
    if (!mounted) {  // no mount table: where systems mount them
      take(v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/" + line.substr(a + 1, b - a - 1), path, v2);
    }
  }
  return smallest;
}

/// The smallest CPU quota in cores along this process's cgroup and its parents, 0 = none.
double cgroup_quota() {
  return smallest_along_cgroup("cpu", [](const std::string& dir, bool v2) {
    return cgroup_quota_cores(v2 ? read_text(dir + "/cpu.max")
                                 : read_text(dir + "/cpu.cfs_quota_us") + " " +
                                       read_text(dir + "/cpu.cfs_period_us"));
  });
}

/// The CPUs of this process's affinity mask, 0 when it cannot be read. The mask is sized
/// for the host and grown while the kernel finds it too small, so that hosts of more CPUs
/// than a fixed cpu_set_t holds (1024) count theirs too.
int64_t affinity_cpus() {
  long cpus = std::max<long>(CPU_SETSIZE, sysconf(_SC_NPROCESSORS_CONF));
  for (int tries = 0; tries < 8; ++tries, cpus *= 2) {
    cpu_set_t* set = CPU_ALLOC(cpus);
    if (set == nullptr) return 0;
    const size_t bytes = CPU_ALLOC_SIZE(cpus);
    CPU_ZERO_S(bytes, set);
    const bool read = sched_getaffinity(0, bytes, set) == 0;
    const int error = errno;
    const int64_t count = read ? CPU_COUNT_S(bytes, set) : 0;
    CPU_FREE(set);
    if (read || error != EINVAL) return count;
  }
  return 0;
}

}  // namespace

double cgroup_memory_limit() {
  return smallest_along_cgroup("memory", [](const std::string& dir, bool v2) {
    return cgroup_memory_bytes(read_text(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes")));
  });
}

int64_t usable_cores() {
  int64_t cores = affinity_cpus();
  if (cores <= 0) cores = std::max<long>(1, sysconf(_SC_NPROCESSORS_ONLN));
  const double quota = cgroup_quota();
  if (quota > 0 && quota < static_cast<double>(cores)) {
    cores = static_cast<int64_t>(std::ceil(quota - 1e-9));
  }
  return std::max<int64_t>(1, cores);
}

int exit_code_of_status(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace vflow
