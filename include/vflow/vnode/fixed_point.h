// Deterministic mode's exact sum of vnode contributions (docs/design.md, "Bitwise
// reproducibility across worker counts").
//
// Each vnode's weighted gradient (and table row, and loss) is rounded to a multiple of
// 2^-36 and added as an integer to a worker's sum (32 bits an element on the CPU, with
// the few elements that leave that range listed in int64); the sum over workers is integer
// addition too, so the total is the same however vnodes are spread over workers and in
// whatever order they are added. The float buffer of a vnode is read and cleared in one
// pass. The last vnode a worker computes needs no int64 step of its own: its values are
// rounded on the way into the reduction (split) or into the result (round_in_place).
//
// The reduction across workers carries the total in 32 bits an element: split() writes
// every element whose magnitude is below a limit (chosen so that the sum over all
// workers fits int32) into a dense int32 part and lists the few larger ones as
// (index, int64 value) pairs; assemble() turns the reduced parts back into floats. The
// result is bitwise that of one int64 sum, converted once.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace vflow::vnode {

class FixedPointSum {
 public:
  /// The unit is 2^-36; values must stay below 2^20 in magnitude, so that up to 128
  /// vnodes cannot overflow the int64 total.
  static constexpr double kScale = 68719476736.0;  // 2^36
  static constexpr double kLimit = 1048576.0;      // 2^20

  /// A sum for buffers of `numel` elements on `device`, zero.
  FixedPointSum(int64_t numel, torch::Device device);

  /// Adds `values` (one vnode's contributions, the buffer of `numel` elements) to the
  /// sum and zeroes them. Returns the largest magnitude among them, NaN if one is NaN;
  /// when that is not below kLimit the sum is invalid until clear().
  double absorb(torch::Tensor& values);

  /// One worker alone: `values` becomes the sum plus its own rounded values, as floats.
  /// Returns the largest magnitude among `values` before (as absorb). Clears the sum.
  double round_in_place(torch::Tensor& values);

  /// One worker with one vnode (nothing absorbed): checks the range of every element of
  /// `values` (returns the largest magnitude, as absorb) but rounds only those from
  /// `from` on. The first `from` stay as they are for a reader that rounds each as it
  /// reads it (vnode/fixed_point_rounding.h; the fused update): one pass less.
  double round_in_place_from(torch::Tensor& values, int64_t from);

  /// The reduction's parts of the sum plus the rounded `values` (left as they are):
  /// elements of magnitude below `dense_limit` (units of 2^-36, a power of two up to
  /// 2^31) go to `dense` (int32, `numel` elements), the others are 0 there and listed in
  /// `index` and `value` (int64, on the CPU, ascending index). Returns the largest
  /// magnitude among `values` (as absorb). Clears the sum.
  double split(const torch::Tensor& values, int64_t dense_limit, torch::Tensor& dense,
               torch::Tensor& index, torch::Tensor& value);

  /// split of elements [from, from + count) only (a bucket of the reduction): writes
  /// that range of `dense` and lists its large values (indices into the whole buffer).
  /// Leaves the sum as it is: clear() it once every part has been split.
  double split_part(const torch::Tensor& values, int64_t dense_limit, torch::Tensor& dense,
                    torch::Tensor& index, torch::Tensor& value, int64_t from, int64_t count) const;

  /// `values` = (dense + the listed values at their indices) · 2^-36, rounded to float
  /// once: the inverse of split after the parts were summed over workers. `index` and
  /// `value` are int64 on the CPU with distinct indices. Only elements from `from` on
  /// are written.
  static void assemble(const torch::Tensor& dense, const torch::Tensor& index,
                       const torch::Tensor& value, torch::Tensor& values, int64_t from = 0);

  /// The summed parts read where they lie, for an update that takes them in place of
  /// assembled floats (one pass less over the buffer): element i < numel is
  /// float(dense[i]) · kUnit, except at index[k], where it is listed[k]. Bitwise what
  /// assemble writes.
  struct Reduced {
    static constexpr float kUnit = static_cast<float>(1.0 / kScale);  // 2^-36, exact
    const int32_t* dense = nullptr;
    int64_t numel = 0;
    std::vector<int64_t> index;  // ascending
    std::vector<float> listed;
  };

  /// The first `numel` elements of the summed parts (`dense` int32, contiguous, on the
  /// CPU; `index` and `value` as for assemble, ascending) as a Reduced that refers to
  /// `dense`.
  static Reduced reduced(const torch::Tensor& dense, const torch::Tensor& index,
                         const torch::Tensor& value, int64_t numel);

  /// The exact sum over workers that hold one vnode each, formed inside the reduction
  /// (comm::Communicator::allreduce_combine): dst[i] = the float nearest to
  /// Σ_k round(parts[k][i] · 2^36) · 2^-36, bitwise what split, the summed parts and
  /// assemble give. Returns the largest magnitude among the parts (as absorb; NaN if one
  /// is NaN); when that is not below kLimit, dst is not the sum.
  static double sum_rounded(const float* const* parts, int ranks, float* dst, int64_t n);

  /// A 64-bit hash of the first `n` elements of `values` as the exact sum sees them:
  /// each rounded to its integer in units of 2^-36 (0 where |x| is not below kLimit) and
  /// hashed with its index, so equal hashes mean, up to hash collisions, equal integer
  /// vectors, however the elements are laid out in memory or split over threads.
  /// Used to compare one vnode's contribution between workers (docs/verification.md).
  static uint64_t contribution_hash(const torch::Tensor& values, int64_t n);

  /// Runs `theirs` on another thread while running `mine` on this one; returns once both
  /// have finished, rethrowing what either threw.
  using TwoThreads =
      std::function<void(const std::function<void()>& theirs, const std::function<void()>& mine)>;
  /// Shares the passes over the buffer (absorb, round_in_place, split) with a second
  /// thread, half of each pass's chunks on it: a core the worker has beyond its intra-op
  /// threads. Every element's integers are exact, so the results stay the same bits.
  void share_passes(TwoThreads both) { both_ = std::move(both); }

  /// Nothing absorbed since the last clear(), split() or round_in_place().
  bool empty() const { return empty_; }

  /// Zeroes the sum (a step abandoned).
  void clear();

 private:
  using Spilled = std::vector<std::pair<int64_t, int64_t>>;  // (index, int64 value)

  torch::Tensor& generic_sum();

  int64_t numel_;
  // On the CPU the running sum is 32 bits an element, half the memory traffic of each
  // absorb: element i's total is sum32_[i] plus its entry in spilled_ (ascending,
  // distinct indices), which takes a vnode's value, with the element's int32 sum (then
  // zero), where adding it would carry that sum to 2^30 or beyond. Elsewhere (and for
  // values not float32) it is the int64 tensor sum_ of tensor operations.
  torch::Tensor sum32_;
  Spilled spilled_;
  torch::Tensor sum_;
  bool empty_ = true;  // the sum is zero: the first absorb writes instead of adding
  TwoThreads both_;    // share_passes
};

}  // namespace vflow::vnode
