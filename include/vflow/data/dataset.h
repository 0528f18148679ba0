// Data sets: the interface users implement, an in-memory tensor data set, and
// the registry that builds data sets from a job spec's `semantic.data` section.
#pragma once

#include <torch/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "vflow/core/error.h"
#include "vflow/core/registry.h"
#include "vflow/core/spec_node.h"
#include "vflow/data/data_threads.h"

namespace vflow::data {

/// A batch of examples: inputs [n, ...] (float features, or int64 token ids) and int64
/// targets: a class per example [n], or a class per position [n, T] (language models).
struct Batch {
  torch::Tensor input;
  torch::Tensor target;
};

/// What a model needs to know about the data before it is loaded.
struct DataInfo {
  std::vector<int64_t> input_shape;  ///< shape of one example, e.g. {1, 28, 28}
  int64_t num_classes = 0;
  int64_t vocab_size = 0;  ///< inputs are token ids in [0, vocab_size); 0 = float inputs
};

/// What a read may depend on besides the indices: the epoch and the job's seed (for
/// random augmentation: every random choice a function of (seed, epoch, example)), and the
/// pool of threads to decode in (resources.data_threads).
struct ReadContext {
  uint64_t seed = 0;
  int64_t epoch = 0;
  DataThreads* threads = nullptr;  ///< null: read on the calling thread

  /// fn(0) ... fn(n - 1), on the pool when there is one (DataThreads::for_each).
  void for_each(int64_t n, const std::function<void(int64_t)>& fn) const;
};

/// A finite, indexable data set. get() and read() must be safe to call from a background
/// thread while the training thread runs (vflow prefetches the next vnode's batch), and
/// from two threads at once (evaluation while the loader prefetches).
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual DataInfo info() const = 0;
  /// The examples at `indices` (a 1-D int64 tensor), in that order.
  virtual Batch get(const torch::Tensor& indices) const = 0;
  /// The same in `context`: training reads through this, with the epoch and the pool. A
  /// data set with random augmentation or costly decoding overrides it; the default is
  /// get(indices). An example that cannot be read throws CorruptExample, so that
  /// `data.on_corrupt: skip` can replace it.
  virtual Batch read(const torch::Tensor& indices, const ReadContext& context) const {
    return get(indices);
  }
};

/// One example of a data set cannot be read (a corrupt image, say); the message names the
/// file. `data.on_corrupt` decides whether the job stops or replaces the example.
class CorruptExample : public DataError {
 public:
  CorruptExample(int64_t example, const std::string& message)
      : DataError(message), example_(example) {}
  int64_t example() const { return example_; }

 private:
  int64_t example_;
};

/// Examples held as two tensors in memory.
class TensorDataset final : public Dataset {
 public:
  /// `vocab_size` > 0 marks integer token inputs (DataInfo::vocab_size).
  TensorDataset(torch::Tensor inputs, torch::Tensor targets, int64_t num_classes,
                int64_t vocab_size = 0);
  int64_t size() const override { return inputs_.size(0); }
  DataInfo info() const override;
  Batch get(const torch::Tensor& indices) const override;
  const torch::Tensor& inputs() const { return inputs_; }
  const torch::Tensor& targets() const { return targets_; }

 private:
  torch::Tensor inputs_;
  torch::Tensor targets_;
  int64_t num_classes_;
  int64_t vocab_size_;
};

/// The training split and the (optional) evaluation split of a job.
struct DataSplits {
  std::shared_ptr<Dataset> train;
  std::shared_ptr<Dataset> test;  ///< may be null: no evaluation
};

/// A data set kind, prepared from validated options: describes itself without
/// loading, then loads on demand.
struct PreparedData {
  DataInfo info;
  std::function<DataSplits()> load;
};

/// Reads and validates a data set's options (throwing SpecError) and returns how
/// to load it. Must not touch the data files' contents: validation stays cheap.
using DataFactory = std::function<PreparedData(OptionReader& options)>;

class DataRegistry : public Registry<DataFactory> {
 public:
  /// The registry with vflow's data sets: "fashion-mnist", "synthetic", "text-classes",
  /// "text-lm", the fortune-package presets "fortunes-langid" and "fortunes-lm", and
  /// "token-shards".
  static DataRegistry& global();

  /// Validates `options` for data set `name`; unknown names and keys are SpecErrors.
  PreparedData prepare(const std::string& name, const SpecNode& name_node,
                       const SpecNode& options) const;

 private:
  DataRegistry();
};

}  // namespace vflow::data
