// The training state a checkpoint holds and a joining worker receives (docs/design.md,
// "Checkpoints"): the model's parameters and buffers, the optimizer state, the weight
// average, the step, and the semantic part of the spec that wrote it. The learning rate,
// data order and dropout are functions of the step and the spec, so nothing more is kept.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

namespace at {
class Tensor;
}
namespace torch::optim {
class Optimizer;
}
namespace vflow::models {
class Model;
}

namespace vflow::engine {

/// A worker's state, by reference.
struct StateParts {
  models::Model& model;
  torch::optim::Optimizer& optimizer;
  std::vector<at::Tensor>& ema;  ///< semantic.ema's average, in parameter order (or empty)
  /// The optimizer's state is written and read (a transfer to a joining worker leaves it
  /// out where the reducer moves it by shard).
  bool with_optimizer = true;
  /// > 0: the optimizer's state is in this many files of canonical shards beside the
  /// checkpoint (save_shard), at optimizer step `optimizer_steps`; the checkpoint records
  /// only that.
  int64_t optimizer_shards = 0;
  int64_t optimizer_steps = 0;
};

/// What a state records about itself.
struct StateHeader {
  int64_t step = 0;         ///< steps completed
  std::string semantic;     ///< the writer's JobSpec::semantic_yaml()
  std::string fingerprint;  ///< of the model and the average, when written
  /// > 0: the optimizer's state is in this many files of canonical shards, at optimizer
  /// step `optimizer_steps` (the optimizer was not restored: load_shards restores it).
  int64_t optimizer_shards = 0;
  int64_t optimizer_steps = 0;
  /// The average (semantic.ema) of the last update is still to be taken from the
  /// parameters once they are whole (a transfer from a worker whose gather failed).
  bool ema_pending = false;
};

/// One canonical shard of the optimizer state, as its file holds it.
struct ShardRecord {
  int64_t shard = 0;   ///< its index
  int64_t shards = 0;  ///< of how many (the job's vnodes)
  int64_t begin = 0;   ///< its range of the flat trainable parameters
  int64_t end = 0;
  int64_t step = 0;  ///< the training step of the checkpoint it belongs to
  int64_t optimizer_steps = 0;
  std::string optimizer;  ///< semantic.optimizer.name
};

/// Writes shard `r` with its `state` (state tensors x its elements) to `path` atomically;
/// throws CheckpointError naming the file.
void save_shard(const std::string& path, const ShardRecord& r, const at::Tensor& state);
/// Reads the shard file at `path`, checks that it is the shard `expected` describes, with
/// `rows` state tensors, and returns its state. Throws CheckpointError naming the file and
/// what is wrong.
at::Tensor load_shard(const std::string& path, const ShardRecord& expected, int64_t rows);

/// The state as bytes (the checkpoint's archive).
std::string serialize_state(const StateParts& parts, const StateHeader& header);

/// Writes the state to `path` atomically (temp file, fsync, rename); throws
/// CheckpointError naming the file and the cause.
void save_state(const std::string& path, const StateParts& parts, const StateHeader& header);

/// The checkpoint file at `path`, read and checked whole (an undamaged archive); throws
/// CheckpointError.
std::string read_checkpoint_file(const std::string& path);

/// Restores `bytes` (serialize_state's) onto `device` into `parts`, after checking that
/// they were written by a job with this `semantic` part and a step within `total_steps`.
/// Returns the header as written; every failure is a CheckpointError naming `source`.
/// The caller checks the restored fingerprint against it.
StateHeader restore_state(const std::string& bytes, const std::string& source,
                          const StateParts& parts, const std::string& semantic, int64_t total_steps,
                          c10::Device device);

}  // namespace vflow::engine
