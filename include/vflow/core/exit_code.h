// How every vflow program ends: one table for vflow-train, vflow-ctl, vflow-profile,
// vflow-plan and vflow-sched, and for the launcher, which passes a worker's code on.
// docs/job-spec.md ("Exit codes") documents it; keep the two together.
#pragma once

namespace vflow {

enum ExitCode : int {
  kExitOk = 0,
  kExitFailure = 1,      ///< anything not listed below
  kExitUsage = 2,        ///< a bad job spec, flag, profile, config or jobs file
  kExitBadData = 3,      ///< a data file that is missing, unreadable or malformed
  kExitCheckpoint = 4,   ///< a checkpoint that cannot be read, written, or does not fit
  kExitPeerFailure = 5,  ///< a worker or the coordinator failed or cannot be reached
  kExitOutOfMemory = 6,  ///< a step needed more memory than the worker may use
  kExitRefused = 7,      ///< the coordinator refused a request (e.g. a resize past the limits)
  kExitMismatch = 8,     ///< a cross-check found workers computing different bits (verification)
  kExitStopped = 130,    ///< stopped on request (SIGINT, SIGTERM, vflow-ctl stop)
};

}  // namespace vflow
