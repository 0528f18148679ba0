// Fashion-MNIST from its idx files (plain or .gz), as Debian's
// dataset-fashion-mnist package installs them.
#pragma once

#include <memory>
#include <string>

#include "vflow/data/dataset.h"

namespace vflow::data {

/// Default location of Debian's dataset-fashion-mnist package.
inline constexpr const char* kFashionMnistDefaultPath = "/usr/share/datasets/fashion-mnist";

/// Loads split "train" (60,000 examples) or "test" (10,000) from `directory`.
/// Images become float [n, 1, 28, 28] scaled to [0, 1] and, when `normalize`,
/// standardised with the training set's mean 0.2860 and std 0.3530. Throws
/// DataError naming the file for a missing file, bad magic number, wrong
/// dimensions, truncation, label out of range or image/label count mismatch.
std::shared_ptr<TensorDataset> load_fashion_mnist(const std::string& directory,
                                                  const std::string& split, bool normalize);

/// Reads one idx file (optionally gzip-compressed) and returns its dimensions and bytes.
struct IdxFile {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;
};
IdxFile read_idx_file(const std::string& path, uint32_t expected_magic);

}  // namespace vflow::data
