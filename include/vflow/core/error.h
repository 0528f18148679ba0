// Error types shared by every vflow module.
//
// Two kinds of failure, as in c10's TORCH_CHECK / TORCH_INTERNAL_ASSERT:
// user errors (a bad job spec, a corrupt data file, an unusable checkpoint)
// carry a message the user can act on; InternalError marks a broken
// invariant inside vflow. Library code throws; only apps/ map errors to exit codes.
//
// Which class to throw:
// - what the user gave (a spec, flag, variable, profile, model) -> SpecError;
// - a data file -> DataError; a checkpoint, or the state a joiner receives -> CheckpointError;
// - a peer or the coordinator that failed -> PeerFailure; a request that the job, its
//   control store or its name's owner refused -> RequestRefused; memory -> OutOfMemory;
// - two workers that computed different bits for one vnode -> Mismatch;
// - the machine or a service failing vflow (a system call, a cgroup, libcurl, an output
//   file that cannot be written, a store holding what vflow never wrote) -> Error itself,
//   with a message naming the resource;
// - a broken invariant -> VFLOW_ASSERT or InternalError.
#pragma once

#include <stdexcept>
#include <string>

namespace vflow {

/// Base of every error vflow throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A job spec (YAML file, --set override, or options built in code) that is invalid: the
/// message starts with the location ("job.yaml:12:5") and the dotted key. Also a flag, an
/// environment variable, a profile or a model that cannot be used, named in the message.
class SpecError : public Error {
 public:
  using Error::Error;
};

/// A data file that is missing, truncated or malformed; the message names the file.
class DataError : public Error {
 public:
  using Error::Error;
};

/// A checkpoint that cannot be written, read, or does not match the job.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

/// A training step needed more memory than the worker may use (resources.memory_limit_mb
/// or the machine's own limit). More vnodes make each vnode, and so its memory, smaller.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

/// A peer did not answer: a collective did not complete because a worker died, closed its
/// connection or stayed silent past the timeout (its output is undefined; nothing has
/// been applied to the model), or the job's coordinator cannot be reached.
class PeerFailure : public Error {
 public:
  using Error::Error;
};

/// A running job's coordinator refused a request, e.g. a resize outside the job's limits
/// or an address that is not an elastic vflow job; or the cluster's control store did (a
/// job or agent name that another holds, keys the user's credentials may not touch).
class RequestRefused : public Error {
 public:
  using Error::Error;
};

/// A cross-check (resources.verify_every_steps) found two workers computing different bits
/// for the same vnode of a step, and the job stops, or this worker was outvoted and leaves
/// it (resources.on_mismatch). The message names the step, the vnode and the workers.
class Mismatch : public Error {
 public:
  using Error::Error;
};

/// A violated internal invariant: a bug in vflow, not a user mistake.
class InternalError : public Error {
 public:
  using Error::Error;
};

[[noreturn]] void internal_assert_failed(const char* condition, const char* file, int line,
                                         const std::string& message);

}  // namespace vflow

/// Checks an internal invariant; throws vflow::InternalError naming the condition and place.
#define VFLOW_ASSERT(condition, message)                                        \
  do {                                                                          \
    if (!(condition)) {                                                         \
      ::vflow::internal_assert_failed(#condition, __FILE__, __LINE__, message); \
    }                                                                           \
  } while (false)
