// Error types shared by every vflow module.
//
// Two kinds of failure, as in c10's TORCH_CHECK / TORCH_INTERNAL_ASSERT:
// user errors (a bad job spec, a corrupt data file, an unusable checkpoint)
// carry a message the user can act on; InternalError marks a broken
// invariant inside vflow. Library code throws; only apps/ map errors to exit codes.
#pragma once

#include <stdexcept>
#include <string>

namespace vflow {

/// Base of every error vflow throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A job spec (YAML file, --set override, or options built in code) that is invalid.
/// The message starts with the location ("job.yaml:12:5") and the dotted key.
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
/// or an address that is not an elastic vflow job.
class RequestRefused : public Error {
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
