// What a child of spawn_process does before its program runs, whether it is then executed
// or runs the program's entry forked from the zygote (vflow/core/zygote.h).
#pragma once

#include <sys/types.h>

#include <string>

namespace vflow {

/// In a child just forked, after its process group and user are set: the parent-death
/// signal `death_signal` (0: none; the child ends at once where `parent` died meanwhile),
/// default handling of SIGPIPE and no blocked signals, `out` and `err` as its standard
/// output and error (where >= 0), `directory` entered (where not empty; else `cannot_enter`
/// is written and the child ends with 127), and every other descriptor closed. Only
/// async-signal-safe calls: the parent may have threads.
void start_child(int death_signal, pid_t parent, int out, int err, const std::string& directory,
                 const std::string& cannot_enter);

}  // namespace vflow
