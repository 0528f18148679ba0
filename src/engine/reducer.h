// The reduction of a step (docs/design.md, "The reducer"): everything between a
// worker's vnodes and the updated parameters. The trainer runs its vnodes into the step
// packet and calls a reducer at five points; it never knows which reducer it has.
//
//   begin_step   the packet is cleared for the step
//   absorb       after a vnode's backward pass when another of the worker's vnodes follows
//   arm          before the backward pass of the worker's last vnode (the packet past the
//                gradients, the stateful-kernel table, loss and control word, is final)
//   finish       the step's one collective: the packet then holds the sum over all workers
//   update       the optimizer step from that sum (with semantic.clip)
//
// and at `abandon` when the step failed anywhere. The reducers:
//   - the whole-packet allreduce (one sum of the packet after the last backward pass);
//   - the bucketed reduction overlapped with the last backward pass (resources.bucket_mb);
//   - the exact fixed-point sum of deterministic mode, whole or in buckets, with its
//     one-worker forms (rounding in place; on one worker of one vnode, rounding as the
//     fused update reads the gradients).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "vflow/engine/job_spec.h"
#include "vflow/vnode/plan.h"

namespace at {
class Tensor;
}
namespace torch::optim {
class Optimizer;
}
namespace vflow::comm {
class Communicator;
struct Shares;
}  // namespace vflow::comm
namespace vflow::vnode {
class StepPacket;
}

namespace vflow::engine {

/// What a reducer is made from: the parts of the job spec that choose and shape it.
struct ReducerOptions {
  c10::Device device{c10::kCPU};  ///< where the packet lives
  bool exact = false;             ///< semantic.deterministic: the exact fixed-point sum
  int64_t bucket_bytes = 0;       ///< resources.bucket_mb in bytes; 0: the whole packet at once
  ClipSpec clip;                  ///< semantic.clip, applied to the reduced gradient
  int64_t virtual_nodes = 1;      ///< of the job
  /// Elements of the packet's stateful-kernel table, which are usually large in the exact
  /// sum's terms (room is kept for them in each rank's region of the reduction).
  int64_t table_numel = 0;
  /// The exact sum's passes run half on a background thread (a CPU worker with a core
  /// beyond its intra-op threads: resources.prefetch).
  bool second_thread = false;
};

/// A worker that holds only some canonical shards of the reduced gradient (a sharded
/// update): those it holds, those whose sums it gives the others (each shard one rank's),
/// and how a vector of per-shard values is summed over the group (a collective: throws
/// comm::PeerFailure).
struct ClipShards {
  std::vector<int64_t> held;
  std::vector<int64_t> given;
  std::function<void(at::Tensor&)> sum_over_group;
};

/// semantic.clip on the reduced gradient `gradients`, cut into `shards` canonical shards
/// (vnode::ShardLayout): each element clamped to ±clip.value, then the whole scaled down to
/// the norm clip.max_norm. The norm is the shards' sums of squares (float64, each summed in
/// a fixed order of its own) added in shard order, so it is the same bits on any number of
/// workers, sharded or not. `sharded`: only the shards it holds are clipped, and their sums
/// come from their owners. Returns the norm before clipping, or nothing where clipping is
/// off.
std::optional<double> clip_gradients(const at::Tensor& gradients, const ClipSpec& clip,
                                     int64_t shards, const ClipShards* sharded = nullptr);

class Reducer {
 public:
  virtual ~Reducer() = default;
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  /// Clears the packet for step `step` (which error messages name), reduced over `comm`,
  /// which must outlive the step. `overlap`: the reduction may start during the last
  /// backward pass (buckets); false keeps the packet writable until finish (a cross-check
  /// writes the hash of the worker's last vnode after its backward pass). Every rank of
  /// the group passes the same.
  virtual void begin_step(comm::Communicator& comm, int64_t step, bool overlap) = 0;
  /// After a vnode's backward pass, when another of this worker's vnodes follows.
  virtual void absorb() {}
  /// Before the backward pass of this worker's last vnode of the step.
  virtual void arm() {}
  /// The step's collective. Throws comm::PeerFailure when a peer fails; the packet is then
  /// undefined and the step must be abandoned.
  virtual void finish() = 0;
  /// The optimizer step from the reduced gradient. Returns the gradient's L2 norm before
  /// clipping where semantic.clip is on.
  virtual std::optional<double> update() = 0;
  /// update()'s optimizer step alone, for a reduced gradient that semantic.clip scaled
  /// already (a sharded reducer clips the shards it holds before its commit).
  virtual void step_clipped() = 0;
  /// The step failed (a collective, a data error, memory): a sum in flight is abandoned and
  /// nothing of the step is kept, so it can be redone. Safe to call more than once.
  virtual void abandon() = 0;

  /// From the next step on, this worker needs the reduced gradients only where `gradients`
  /// says (shares of the packet's gradients by owner, and the ranges this worker wants;
  /// nullptr: everywhere): the sum may leave the rest unspecified, and moves fewer bytes
  /// where the communicator can (comm::Communicator::reduce_scatter_sum). The rest of the
  /// packet is summed everywhere. Every rank of the group sets it alike. A reducer that
  /// sums in buckets on the backend's own threads ignores it.
  virtual void scatter_sums(const comm::Shares* gradients) {}

  // ---- the state a reducer keeps (a sharded reducer: the optimizer's shards) ----
  /// The group's vnodes changed: `layout` holds every rank's, in rank order, and this
  /// worker is rank `rank`. A reducer that keeps state by vnode moves it at the next
  /// begin_step (a collective).
  virtual void set_layout(const std::vector<vnode::VnodeRange>& layout, int rank) {}
  /// Every rank of the group calls it together when the group regroups cleanly (its
  /// members still here) into the next one, before the members that leave go: this
  /// group's rank r is the next one's next_rank[r] (-1: it leaves), whose ranks hold the
  /// vnodes `next_layout`. A reducer that keeps state by vnode passes what the leavers
  /// alone hold to members that stay. Throws PeerFailure.
  virtual void hand_off(comm::Communicator& comm, const std::vector<int>& next_rank,
                        const std::vector<vnode::VnodeRange>& next_layout) {}
  /// Every rank calls it together where a checkpoint is due and the reducer keeps the
  /// optimizer state by canonical shard: each shard's state, in shard order, reaches
  /// `write` on rank 0 with the group's optimizer step count, sent there from a rank that
  /// holds it one shard at a time, so that no rank holds the whole state (none, before the
  /// optimizer's first step). The parameters are whole on every rank first (settle).
  /// Returns the optimizer step count. Throws PeerFailure.
  using ShardWriter =
      std::function<void(int64_t shard, int64_t optimizer_steps, const at::Tensor& state)>;
  virtual int64_t write_state_shards(comm::Communicator& comm, const ShardWriter& write) {
    return 0;
  }
  /// Every rank calls it together after the last step: a reducer whose gather of the
  /// parameters failed sends them again, so that every rank's are whole. Throws
  /// PeerFailure.
  virtual void settle(comm::Communicator& comm) {}
  /// Whether this rank's parameters are whole: false from a failed gather of the
  /// parameters until the next group's first step (or settle) sent them again; what reads
  /// every parameter (the average, an evaluation) waits until then.
  virtual bool parameters_complete() const { return true; }
  /// Whether the optimizer's state is part of the state sent to a joining worker (a sharded
  /// reducer sends shards itself).
  virtual bool transfers_optimizer() const { return true; }
  /// The model's state was replaced by a transferred one (with the optimizer's only where
  /// transfers_optimizer()); `moved`: of another step than this worker's.
  virtual void state_transferred(bool moved) {}

 protected:
  Reducer() = default;
};

/// The reducer the options call for, over `packet` and `optimizer`, which must outlive it.
std::unique_ptr<Reducer> make_reducer(vnode::StepPacket& packet, torch::optim::Optimizer& optimizer,
                                      const ReducerOptions& options);

}  // namespace vflow::engine
