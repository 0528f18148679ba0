#include "vflow/vnode/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "vflow/core/error.h"

namespace vflow::vnode {

VirtualNodePlan::VirtualNodePlan(int64_t global_batch, std::vector<int64_t> sizes)
    : global_batch_(global_batch),
      virtual_nodes_(static_cast<int64_t>(sizes.size())),
      smallest_(sizes.empty() ? 0 : *std::min_element(sizes.begin(), sizes.end())),
      sizes_(std::move(sizes)) {
  if (sizes_.empty()) throw SpecError("vnode_sizes lists no vnodes");
  if (smallest_ < 1) throw SpecError(fmt::format("vnode_sizes holds a size of {}", smallest_));
  int64_t total = 0;
  for (const int64_t size : sizes_) {
    offsets_.push_back(total);
    total += size;
  }
  if (total != global_batch_) {
    throw SpecError(
        fmt::format("vnode_sizes sum to {}, not to global_batch {}", total, global_batch_));
  }
}

VirtualNodePlan::VirtualNodePlan(int64_t global_batch, int64_t virtual_nodes)
    : global_batch_(global_batch),
      virtual_nodes_(virtual_nodes),
      smallest_(virtual_nodes > 0 ? global_batch / virtual_nodes : 0) {
  if (global_batch < 1)
    throw SpecError(fmt::format("global_batch must be >= 1, got {}", global_batch));
  if (virtual_nodes < 1 || virtual_nodes > global_batch) {
    throw SpecError(fmt::format("virtual_nodes must be in [1, global_batch={}], got {}",
                                global_batch, virtual_nodes));
  }
  if (global_batch % virtual_nodes != 0) {
    throw SpecError(fmt::format("global_batch {} is not divisible by virtual_nodes {}",
                                global_batch, virtual_nodes));
  }
}

VnodeRange vnodes_of(const std::vector<int64_t>& counts, int64_t rank) {
  VFLOW_ASSERT(rank >= 0 && rank < static_cast<int64_t>(counts.size()), "rank outside the counts");
  VnodeRange r;
  for (int64_t w = 0; w < rank; ++w) r.first += counts[static_cast<size_t>(w)];
  r.last = r.first + counts[static_cast<size_t>(rank)];
  return r;
}

VnodeRange vnodes_of(int64_t virtual_nodes, int64_t workers, int64_t rank) {
  const int64_t q = virtual_nodes / workers;
  const int64_t extra = virtual_nodes % workers;
  const int64_t first = rank * q + std::min(rank, extra);
  return VnodeRange{first, first + q + (rank < extra ? 1 : 0)};
}

std::vector<VnodeRange> layout_of(int64_t virtual_nodes, int64_t workers,
                                  const std::vector<int64_t>& counts) {
  std::vector<VnodeRange> layout;
  for (int64_t r = 0; r < workers; ++r) {
    layout.push_back(counts.empty() ? vnodes_of(virtual_nodes, workers, r) : vnodes_of(counts, r));
  }
  return layout;
}

Slice VirtualNodePlan::slice(int64_t v, int64_t batch_size) const {
  VFLOW_ASSERT(v >= 0 && v < virtual_nodes_, fmt::format("vnode {} out of range", v));
  VFLOW_ASSERT(batch_size >= 0 && batch_size <= global_batch_, "batch larger than global_batch");
  if (!sizes_.empty() && batch_size == global_batch_) {
    return Slice{offsets_[static_cast<size_t>(v)], sizes_[static_cast<size_t>(v)]};
  }
  // Non-empty vnodes hold at least two examples where the batch allows it, so that
  // batch norm can normalise a short last batch; a full batch always uses all N.
  const int64_t min_size = std::min<int64_t>(2, vnode_size());
  const int64_t parts = std::clamp<int64_t>(batch_size / min_size, 1, virtual_nodes_);
  if (v >= parts) return Slice{batch_size, 0};
  const int64_t begin = v * batch_size / parts;
  const int64_t end = (v + 1) * batch_size / parts;
  return Slice{begin, end - begin};
}

namespace {
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/// Uniform integer in [0, bound) without modulo bias (Lemire's multiply-and-reject).
uint64_t bounded(uint64_t& state, uint64_t bound) {
  unsigned __int128 m = static_cast<unsigned __int128>(splitmix64(state)) * bound;
  auto low = static_cast<uint64_t>(m);
  if (low < bound) {
    const uint64_t threshold = (0 - bound) % bound;
    while (low < threshold) {
      m = static_cast<unsigned __int128>(splitmix64(state)) * bound;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}
}  // namespace

uint64_t mix_seed(uint64_t seed, uint64_t a, uint64_t b) {
  uint64_t state = seed;
  uint64_t h = splitmix64(state);
  state ^= a * 0xD6E8FEB86659FD93ULL;
  h ^= splitmix64(state);
  state ^= b * 0xA0761D6478BD642FULL;
  h ^= splitmix64(state);
  return h;
}

DataOrder::DataOrder(uint64_t seed, int64_t dataset_size, int64_t global_batch, bool drop_last)
    : seed_(seed), dataset_size_(dataset_size), global_batch_(global_batch) {
  if (dataset_size < 1) throw SpecError("the training set is empty");
  steps_per_epoch_ =
      drop_last ? dataset_size / global_batch : (dataset_size + global_batch - 1) / global_batch;
  if (steps_per_epoch_ < 1) {
    throw SpecError(fmt::format(
        "global_batch {} is larger than the training set ({} examples) and drop_last is true",
        global_batch, dataset_size));
  }
}

std::vector<int64_t> DataOrder::permutation(int64_t epoch) const {
  std::vector<int64_t> perm(static_cast<size_t>(dataset_size_));
  std::iota(perm.begin(), perm.end(), 0);
  uint64_t state = mix_seed(seed_, 0x5EED0DA7AULL, static_cast<uint64_t>(epoch));
  for (int64_t i = dataset_size_ - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(bounded(state, static_cast<uint64_t>(i + 1)));
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
  }
  return perm;
}

Slice DataOrder::batch(int64_t step_in_epoch) const {
  VFLOW_ASSERT(step_in_epoch >= 0 && step_in_epoch < steps_per_epoch_, "step outside the epoch");
  const int64_t begin = step_in_epoch * global_batch_;
  return Slice{begin, std::min(global_batch_, dataset_size_ - begin)};
}

}  // namespace vflow::vnode
