// The default mode's reduction overlapped with the backward pass (docs/design.md,
// "Communication overlapped with the backward pass").
//
// The step packet is cut into buckets of whole parameters in reverse registration order,
// the order in which a backward pass finishes them: bucket 0 holds the last parameters'
// gradients and the packet's part after the gradients (stateful-kernel table, loss,
// control word), which the trainer writes before that backward pass. Each parameter's
// gradient-accumulator node gets a post hook, which fires once its gradient is final;
// during the backward pass of the worker's last vnode a bucket's allreduce starts as soon
// as all its gradients are final and every earlier bucket has started, so that every
// rank starts the same collectives in the same order. What has not started when the
// backward pass ends (a parameter without a gradient this step) starts then.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace vflow::comm {
class Communicator;
}
namespace vflow::vnode {
class StepPacket;
}

namespace vflow::engine {

class BucketedReduction {
 public:
  /// One bucket: a contiguous range of the packet.
  struct Bucket {
    int64_t offset = 0;
    int64_t numel = 0;
  };

  /// What a bucket sums, called when it starts (inside the backward pass or in finish):
  /// by default its range of the packet. Deterministic mode gives the bucket's exact
  /// integer form instead (docs/design.md). It may throw; the step then fails in finish.
  using Prepare = std::function<torch::Tensor(const Bucket&)>;

  /// Buckets of at least `bucket_bytes` of gradients each (the last one may be smaller)
  /// over `packet`, which must outlive this object.
  BucketedReduction(vnode::StepPacket& packet, int64_t bucket_bytes, Prepare prepare = nullptr);
  ~BucketedReduction();
  BucketedReduction(const BucketedReduction&) = delete;
  BucketedReduction& operator=(const BucketedReduction&) = delete;

  /// In the order they start.
  const std::vector<Bucket>& buckets() const;

  /// How many buckets have started their sum in this step so far.
  size_t started() const;

  /// The next backward pass starts each bucket's sum on `comm` once it is final. The
  /// packet's part after the gradients must be final already.
  void arm(comm::Communicator& comm);
  /// After the backward pass (or without one: a worker that computed nothing this
  /// step): starts the buckets not started yet, then waits for all of them, within one
  /// timeout of `comm` in total. On a failure it aborts `comm` (no bucket still queued
  /// waits out a timeout of its own) and throws PeerFailure. Where a bucket could not be
  /// prepared it throws that error (aborting `comm` where the backend can and a bucket
  /// had started): the buckets started before it are left unmatched on the peers, so the
  /// communicator must not be used again (the worker stops).
  void finish(comm::Communicator& comm);
  /// The step failed elsewhere: nothing more starts, and a sum in flight is abandoned
  /// by aborting `comm`.
  void abandon(comm::Communicator& comm);

  struct State;  ///< shared with the hooks, which may outlive this object

 private:
  std::shared_ptr<State> state_;
};

}  // namespace vflow::engine
