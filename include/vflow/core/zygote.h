// Workers started as forks of a clean copy of their program (docs/design.md, "Workers
// start as forks"). Loading LibTorch and its libraries and running their initialisers
// takes a process about 0.8 s of a core before main; a launcher starting its workers as
// new executions of itself pays that once per worker and per joiner. So a program that
// starts copies of itself forks a zygote first thing in main, before any thread exists
// and before anything of main has run: a copy that waits, and forks each such child,
// which then runs the program's entry with its own arguments, environment, directory and
// standard streams, exactly as a new execution would from main on.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace vflow {

struct SpawnOptions;

/// The program's own main, run by each child the zygote starts.
using ProgramEntry = int (*)(int argc, char** argv);

/// Forks this program's zygote, once, where VFLOW_ZYGOTE=1 (for now) and this process has
/// a single thread; none inside a worker (VFLOW_MEMBER set). This process becomes a child
/// subreaper (PR_SET_CHILD_SUBREAPER), so that the zygote's children are its own: it waits
/// for them, and their parent-death signal follows it. The zygote ends with this process.
void start_zygote(ProgramEntry entry);

/// Whether this process is a child the zygote started (not an execution of the program).
bool started_by_zygote();

/// Whether a child with the environment `wanted` may be forked from a zygote started with
/// `at_start` (NAME=value entries): they differ in VFLOW_ variables only.
bool fork_runs_as_executed(const std::vector<std::string>& wanted,
                           const std::vector<std::string>& at_start);

/// `options` started from the zygote, as spawn_process would start it: where the command is
/// this program, run as this user, and the environment differs from this process's at the
/// zygote's start in VFLOW_ variables only (the others may be read as the libraries load,
/// which a fork does not repeat). Nothing where it cannot be (spawn_process then executes
/// the program); the child's pid otherwise. `environment`: the child's, NAME=value.
std::optional<pid_t> spawn_from_zygote(const SpawnOptions& options,
                                       const std::vector<std::string>& environment);

}  // namespace vflow
