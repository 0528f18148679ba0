// The virtual-node plan and the data order (docs/design.md §2, "Data").
//
// Neither depends on workers: the global batch of step s is the slice
// [s*B, (s+1)*B) of the epoch's permutation, which depends only on
// (seed, epoch), and vnode v takes a fixed contiguous sub-slice of it.
#pragma once

#include <cstdint>
#include <vector>

namespace vflow::vnode {

/// A contiguous range [offset, offset + size).
struct Slice {
  int64_t offset = 0;
  int64_t size = 0;
  bool operator==(const Slice& o) const { return offset == o.offset && size == o.size; }
};

/// N fixed slices of every global batch of B examples.
class VirtualNodePlan {
 public:
  /// Exact mode: every vnode holds b = B / N examples. Throws SpecError unless
  /// 1 <= virtual_nodes <= global_batch and B % N == 0.
  VirtualNodePlan(int64_t global_batch, int64_t virtual_nodes);
  /// Relaxed mode (docs/design.md §5): vnode v holds sizes[v] examples of every full batch.
  /// Throws SpecError unless every size is >= 1 and they sum to global_batch.
  VirtualNodePlan(int64_t global_batch, std::vector<int64_t> sizes);

  int64_t global_batch() const { return global_batch_; }
  int64_t virtual_nodes() const { return virtual_nodes_; }
  /// b = B / N in exact mode; the smallest vnode in relaxed mode.
  int64_t vnode_size() const { return smallest_; }
  /// Whether every vnode holds the same number of examples (exact mode).
  bool uniform() const { return sizes_.empty(); }

  /// The sub-slice of vnode v inside a batch of `batch_size` examples. For a full batch
  /// this is [v*b, (v+1)*b) (relaxed: [s_0+..+s_{v-1}, s_0+..+s_v)). The shorter last
  /// batch of an epoch (drop_last: false) of n examples is split, in both modes, over
  /// P = clamp(n / min(2, b), 1, N) vnodes as [floor(v*n/P), floor((v+1)*n/P)); vnodes
  /// v >= P are empty. A function of (B, the sizes, n, v) only.
  Slice slice(int64_t v, int64_t batch_size) const;

 private:
  int64_t global_batch_;
  int64_t virtual_nodes_;
  int64_t smallest_;
  std::vector<int64_t> sizes_;    ///< relaxed mode only
  std::vector<int64_t> offsets_;  ///< relaxed mode: where each vnode starts
};

/// The order in which examples are visited: one permutation per epoch.
class DataOrder {
 public:
  DataOrder(uint64_t seed, int64_t dataset_size, int64_t global_batch, bool drop_last);

  int64_t dataset_size() const { return dataset_size_; }
  /// Steps per epoch: floor(n / B) with drop_last, otherwise ceil(n / B).
  int64_t steps_per_epoch() const { return steps_per_epoch_; }

  /// The epoch's permutation of [0, n): a function of (seed, epoch) only, computed with
  /// vflow's own generator so it is identical on every platform and LibTorch version.
  std::vector<int64_t> permutation(int64_t epoch) const;

  /// Positions in the epoch's permutation that global batch `step_in_epoch` covers.
  Slice batch(int64_t step_in_epoch) const;

 private:
  uint64_t seed_;
  int64_t dataset_size_;
  int64_t global_batch_;
  int64_t steps_per_epoch_;
};

/// Worker `rank` of `workers` holds vnodes [first, last): contiguous blocks, the
/// first N mod K workers holding one vnode more.
struct VnodeRange {
  int64_t first = 0;
  int64_t last = 0;
};
VnodeRange vnodes_of(int64_t virtual_nodes, int64_t workers, int64_t rank);
/// The block of `rank` when worker w holds counts[w] consecutive vnodes (an uneven,
/// planned split; the counts sum to the number of vnodes).
VnodeRange vnodes_of(const std::vector<int64_t>& counts, int64_t rank);
/// Every rank's vnodes when `workers` workers hold `counts` consecutive vnodes each, or an
/// even split of `virtual_nodes` where `counts` is empty.
std::vector<VnodeRange> layout_of(int64_t virtual_nodes, int64_t workers,
                                  const std::vector<int64_t>& counts);

/// A well-mixed 64-bit value from a seed and two coordinates (splitmix64 finaliser chain).
/// Used for every derived seed: permutations per (seed, epoch), dropout per (seed, step, vnode).
uint64_t mix_seed(uint64_t seed, uint64_t a, uint64_t b);

}  // namespace vflow::vnode
