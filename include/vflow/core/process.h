// Starting child processes one way everywhere: the local launcher's workers and the
// scheduler's live jobs.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace vflow {

struct SpawnOptions {
  std::vector<std::string> command;      ///< program (a path) and its arguments
  std::vector<std::string> environment;  ///< NAME=value pairs added to this process's
  int stdout_fd = -1;                    ///< the child's standard output; -1 = this one's
  int stderr_fd = -1;                    ///< the child's standard error; -1 = this one's
  /// A process group of its own, so that the child and everything it starts can be
  /// signalled together and a terminal's Ctrl-C reaches only this process.
  bool own_process_group = false;
  /// Sent to the child when this process dies (PR_SET_PDEATHSIG: strictly, when the thread
  /// that started it ends); 0 = nothing.
  int parent_death_signal = 0;
  /// The child's working directory (entered as `run_as_user`); empty = this process's.
  std::string working_directory;
  /// A user id the child runs as, with the group id of the same number and no
  /// supplementary groups (this process must be root); -1 = this process's.
  int64_t run_as_user = -1;
};

/// Forks and executes `options.command` (a path: no PATH search), or where this program's
/// zygote can start it (this program itself: vflow/core/zygote.h), forks it from there
/// without executing anything. The child keeps only its
/// standard streams: every other inherited descriptor (sockets of the job's store, other
/// children's pipes) is closed before the program runs, which starts with default signal
/// handling and no blocked signals. A program that cannot be executed ends
/// the child with 127 after a message on its standard error. Throws Error when fork
/// fails.
pid_t spawn_process(const SpawnOptions& options);

/// The path of this process's executable (/proc/self/exe); `fallback` when unreadable.
std::string this_executable(const std::string& fallback);

/// This process's working directory; "" when it cannot be read.
std::string current_directory();

/// A wait status as a shell reports it: the exit code, or 128 + the signal.
int exit_code_of_status(int status);

/// The cores this process may use: the CPUs of its affinity mask (taskset, a cpuset),
/// and no more than its cgroup's CPU quota rounded up (a container's CPU limit, a
/// worker's `cpu_quota`), the smallest quota of its cgroup and of every cgroup above it.
/// At least 1.
int64_t usable_cores();

/// A CPU quota in cores from the text of a cgroup v2 `cpu.max` file ("50000 100000":
/// 0.5) or of cgroup v1's `cpu.cfs_quota_us` and `cpu.cfs_period_us` joined by a space;
/// 0 where there is no limit ("max", a quota of -1) or the text is not a quota.
double cgroup_quota_cores(const std::string& text);

/// A memory limit in bytes from the text of a cgroup v2 `memory.max` or v1
/// `memory.limit_in_bytes` file; 0 where there is none ("max", v1's largest value) or the
/// text is not a limit.
double cgroup_memory_bytes(const std::string& text);

/// The smallest memory limit in bytes of this process's cgroup and every cgroup above it
/// (a container's, a job's), which the processes it starts share; 0 = none.
double cgroup_memory_limit();

/// Where cgroup `path` (as /proc/self/cgroup names it) lies below the mount of a hierarchy
/// whose root is cgroup `root` (/proc/self/mountinfo's fourth field): a container without
/// a cgroup namespace sees the host's path, its hierarchy mounted from a cgroup further
/// down. None where `path` is not below `root` (that hierarchy does not show it).
std::optional<std::string> cgroup_path_in_mount(const std::string& root, const std::string& path);

}  // namespace vflow
