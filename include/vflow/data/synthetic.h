// A deterministic synthetic classification data set for tests and benchmarks:
// each class is a fixed random prototype, each example its prototype plus noise.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "vflow/data/dataset.h"

namespace vflow::data {

struct SyntheticOptions {
  int64_t size = 4096;                       ///< number of examples
  int64_t classes = 10;                      ///< number of classes
  std::vector<int64_t> shape = {1, 28, 28};  ///< shape of one example
  double noise = 1.0;                        ///< std of the per-example noise
  uint64_t seed = 0;                         ///< data seed (independent of the job seed)
  uint64_t split = 0;                        ///< 0 = train, 1 = test: same prototypes, other noise
};

std::shared_ptr<TensorDataset> make_synthetic(const SyntheticOptions& options);

}  // namespace vflow::data
