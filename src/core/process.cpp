#include "vflow/core/process.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>

#include "vflow/core/error.h"

extern char** environ;

namespace vflow {

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

  const pid_t pid = fork();
  if (pid == 0) {
    if (options.own_process_group) setpgid(0, 0);
    if (options.parent_death_signal != 0) {
      prctl(PR_SET_PDEATHSIG, options.parent_death_signal);
      if (getppid() != parent) _exit(128 + options.parent_death_signal);  // died meanwhile
    }
    // The program starts with default signal handling (this process may ignore SIGPIPE).
    signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (options.stdout_fd >= 0) dup2(options.stdout_fd, STDOUT_FILENO);
    if (options.stderr_fd >= 0) dup2(options.stderr_fd, STDERR_FILENO);
    if (!options.working_directory.empty() && chdir(options.working_directory.c_str()) != 0) {
      (void)!write(STDERR_FILENO, cannot_enter.data(), cannot_enter.size());
      _exit(127);
    }
    if (syscall(SYS_close_range, 3U, ~0U, 0U) != 0) {
      for (int i = 3; i < 4096; ++i) close(i);
    }
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

int exit_code_of_status(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace vflow
