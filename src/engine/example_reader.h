// How a worker reads a data set's examples: on its data threads (resources.data_threads),
// with the job's seed and the epoch for random augmentation, and with semantic.data's
// on_corrupt deciding what a corrupt example does.
#pragma once

#include <torch/types.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "vflow/data/data_threads.h"
#include "vflow/data/dataset.h"
#include "vflow/engine/job_spec.h"

namespace vflow::engine {

class ExampleReader {
 public:
  ExampleReader(uint64_t seed, OnCorrupt on_corrupt) : seed_(seed), on_corrupt_(on_corrupt) {}

  /// Reads on `threads` threads in all (the caller's included).
  void set_threads(int64_t threads);
  int64_t threads() const { return threads_ ? threads_->threads() : 1; }

  /// The examples at `indices` of `data`, read as in `epoch`. With on_corrupt skip, each
  /// corrupt example k is replaced by the first of k + 1, k + 2, ... (modulo the size) that
  /// reads, augmented as itself: the same on every worker, every run. Thread-safe.
  data::Batch read(const data::Dataset& data, const torch::Tensor& indices, int64_t epoch) const;

  /// Examples this reader has replaced so far.
  int64_t replaced() const { return replaced_.load(); }

 private:
  int64_t replacement(const data::Dataset& data, int64_t bad,
                      const data::ReadContext& context) const;

  uint64_t seed_;
  OnCorrupt on_corrupt_;
  std::unique_ptr<data::DataThreads> threads_;
  mutable std::atomic<int64_t> replaced_{0};
};

}  // namespace vflow::engine
