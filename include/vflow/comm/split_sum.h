// An exact sum across ranks of int64 values of which nearly all are small, in 32 bits an
// element (deterministic mode's reduction; docs/design.md).
//
// Each rank gives a dense int32 part, every element below dense_limit(world) in magnitude
// so that the sum over all ranks cannot overflow, and a list of its few other values as
// (index, int64 value) pairs. One int32 allreduce sums the dense parts and carries, in a
// region of its own per rank, each rank's count and first capacity() pairs; only when
// some rank lists more does a second collective follow (an all-gather of the remainder, or a
// dense int64 allreduce when that is smaller). Integer sums are exact, so the result does
// not depend on the number of ranks or the order of the additions.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace vflow::comm {

class Communicator;
struct Shares;

class SplitSum {
 public:
  /// Pairs each rank carries inside the dense allreduce: numel / (256 · world), at
  /// least 16384 / world and 2048 (a ConvNet of 0.4 M parameters lists about 600 a rank
  /// on two ranks, BERT-tiny of 0.46 M 300 to 3,300), plus the rank's share of
  /// `reserved`, elements known to be large in most steps (the stateful-kernel table's
  /// batch statistics: ResNet-18 lists about 5,400 of its table's 19,208 a rank on two
  /// ranks, and 2,000 gradients). The regions add about 5 % to a large model's
  /// allreduce, more only to a small one's (at least 192 KiB in all, 12 bytes a pair) or
  /// one with a large table, and spare it the second collective (an all-gather over
  /// Gloo's sockets, not the shared memory).
  static int64_t capacity(int64_t numel, int world, int64_t reserved = 0);

  /// For dense parts of `numel` elements on `device`, `reserved` of them usually listed
  /// (see capacity()).
  SplitSum(int64_t numel, torch::Device device, int64_t reserved = 0);

  /// The magnitude every element of a rank's dense part must stay below when `world`
  /// ranks add theirs: 2^31 / (world rounded up to a power of two).
  static int64_t dense_limit(int world);

  /// The dense part to fill before reduce (int32, numel elements, on the device).
  torch::Tensor dense(int world);

  /// The listed values summed over ranks.
  struct Listed {
    torch::Tensor index;  ///< int64 on the CPU, distinct, ascending
    torch::Tensor value;  ///< int64 on the CPU: the sum of every rank's value there
  };

  /// Sums every rank's dense part in place and merges the lists. `index` and `value`
  /// (int64, on the CPU, distinct indices) are this rank's list. Every rank calls it
  /// together; a failed collective throws PeerFailure as the communicator does.
  /// It is list(), one sum of carrier_part(0, numel) and merge(). Where `dense` (shares of
  /// the dense part) is given, the dense sum needs to hold only where it says
  /// (Communicator::reduce_scatter_sum); the lists are merged whole.
  Listed reduce(Communicator& comm, const torch::Tensor& index, const torch::Tensor& value,
                const Shares* dense = nullptr);

  /// The same in pieces, for a reduction in buckets: list() this rank's whole list as
  /// `rank`, sum every rank's carrier_part() of each bucket with the same parts on the
  /// other ranks (in any order, each once), then merge().
  void list(int rank, const torch::Tensor& index, const torch::Tensor& value);
  /// What to sum for the dense elements [offset, offset + count): that range of the
  /// carrier, and at offset 0 the ranks' regions of listed values too (they lie just
  /// before the dense part), so the part at offset 0 is summed after list().
  torch::Tensor carrier_part(int64_t offset, int64_t count);
  /// The listed values summed over ranks, once every part has been summed; a second
  /// collective follows only when some rank listed more than capacity() values.
  Listed merge(Communicator& comm);

 private:
  int64_t numel_;
  torch::Device device_;
  int64_t reserved_;
  int world_ = 0;
  int64_t capacity_ = 0;
  torch::Tensor carrier_;        // int32: [per rank: count, capacity_ x (index, low, high) | dense]
  torch::Tensor index_, value_;  // this rank's list, from list()
};

}  // namespace vflow::comm
