// The worker processes a launcher or a node agent started on this host, and their output,
// forwarded line by line with a prefix naming the worker.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace vflow::job {

class ChildProcesses {
 public:
  /// What one worker runs.
  struct Start {
    std::string name;                      ///< the worker's name, for the prefix and reaping
    std::vector<std::string> command;      ///< program and arguments
    std::vector<std::string> environment;  ///< NAME=value pairs added to this process's
    std::string working_directory;         ///< empty: this process's
    std::string prefix;                    ///< before each output line; empty: "[worker NAME] "
    /// Sent to the worker when this process dies (a node agent's workers leave with it).
    int parent_death_signal = 0;
    int64_t run_as_user = -1;  ///< a user id of its own (SpawnOptions::run_as_user)
  };

  /// Starts a worker. Throws Error when it cannot be started.
  void start(const Start& worker);
  /// Forwards output for up to `wait_ms`; returns false once every worker has ended.
  bool pump(int wait_ms);
  /// Workers that ended since the last call, as (name, exit code).
  std::vector<std::pair<std::string, int>> reap();
  void signal_all(int sig);
  /// Sends `sig` to worker `name` if it runs.
  void signal(const std::string& name, int sig);
  /// Workers still running.
  size_t running() const;
  bool all_reaped() const;

 private:
  struct Child {
    std::string name;
    std::string prefix;
    pid_t pid = -1;
    int out = -1;  // stdout pipe
    int err = -1;  // stderr pipe
    std::string out_buf, err_buf;
    bool running = true;
  };
  std::vector<Child> children_;
};

}  // namespace vflow::job
