// Starting child processes one way everywhere: the local launcher's workers and the
// scheduler's live jobs.
#pragma once

#include <sys/types.h>

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
  /// The child's working directory; empty = this process's.
  std::string working_directory;
};

/// Forks and executes `options.command` (a path: no PATH search). The child keeps only its
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

}  // namespace vflow
