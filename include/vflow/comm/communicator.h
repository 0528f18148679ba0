// The communicator interface (docs/design.md §3.3): the collectives a worker needs,
// independent of the backend (Gloo on CPU, NCCL on GPU).
#pragma once

#include <torch/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "vflow/comm/key_value_store.h"
#include "vflow/comm/rendezvous.h"
#include "vflow/core/error.h"

namespace vflow::comm {

/// A collective did not complete because a peer died, closed its connection or
/// stayed silent past the timeout (vflow/core/error.h).
using vflow::PeerFailure;

/// A collective in flight (Communicator::start_allreduce_sum).
class PendingWork {
 public:
  virtual ~PendingWork() = default;
  /// Returns once the collective has completed; throws PeerFailure when it failed or
  /// is still running at `deadline`.
  virtual void wait(std::chrono::steady_clock::time_point deadline) = 0;
};

/// An element-wise combination of the ranks' parts of a float tensor
/// (Communicator::allreduce_combine): writes dst[i] from parts[0][i] .. parts[ranks - 1][i]
/// for i < n, and returns a figure of the parts (their largest magnitude, say), which the
/// group max-reduces. It must not depend on which rank calls it.
using Combine = std::function<double(const float* const* parts, int ranks, float* dst, int64_t n)>;

/// A tensor cut by owner, for the sums and gathers that leave each rank only what it needs
/// (Communicator::reduce_scatter_sum, gather_shares): rank r owns the elements
/// [bounds[r], bounds[r + 1]) and wants wanted[r] (ranges of elements, begin and end,
/// ascending, disjoint; they may cover its own share). `bounds` has size() + 1 entries,
/// from 0 to the tensor's numel, ascending; every rank passes the same.
struct Shares {
  using Ranges = std::vector<std::pair<int64_t, int64_t>>;
  std::vector<int64_t> bounds;
  std::vector<Ranges> wanted;

  /// These shares inside a tensor with `before` more elements in front of them and `after`
  /// more behind: those go with the first and the last share, and every rank wants them.
  Shares around(int64_t before, int64_t after) const;
  /// Asserts that these are shares of a group of `ranks`: bounds from 0, ascending, and
  /// every rank's wanted ranges.
  void check(int ranks) const;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Element-wise sum over all ranks, in place.
  virtual void allreduce_sum(torch::Tensor& tensor) = 0;
  /// Starts an element-wise sum over all ranks of `tensor` in place, which must stay
  /// untouched until the returned work has completed. Every rank starts the same
  /// collectives in the same order. The default runs the sum at once.
  virtual std::unique_ptr<PendingWork> start_allreduce_sum(torch::Tensor& tensor);
  /// Whether start_allreduce_sum returns before the sum of a host tensor is done, so
  /// that the caller can compute meanwhile: a property of the backend, the same on every
  /// rank (Gloo: yes; a device tensor's sum runs at once even there).
  virtual bool asynchronous() const { return false; }
  /// Whether allreduce_combine is available: the same on every rank of a group (shared
  /// memory on one host: vflow/comm/communicator.h's Rendezvous::shared_memory).
  virtual bool can_combine() const { return false; }
  /// `tensor` (float32, the same size on every rank) becomes `combine` of every rank's
  /// tensor, element by element. Returns the largest of combine's figures over the group
  /// (NaN when one is NaN), the same on every rank. Throws Error where !can_combine().
  virtual double allreduce_combine(torch::Tensor& tensor, const Combine& combine);
  /// The sum over all ranks as allreduce_sum forms it, bitwise, but where only each rank's
  /// own share and the ranges it wants must hold it afterwards (the rest of its tensor is
  /// left unspecified): through shared memory, each owner reduces its share and the
  /// others read back only what they want, so with the gather below the bytes moved are
  /// one allreduce's. The default sums everything.
  virtual void reduce_scatter_sum(torch::Tensor& tensor, const Shares& shares) {
    allreduce_sum(tensor);
  }
  /// allreduce_combine, with what holds the result afterwards as in reduce_scatter_sum.
  virtual double reduce_scatter_combine(torch::Tensor& tensor, const Combine& combine,
                                        const Shares& shares) {
    return allreduce_combine(tensor, combine);
  }
  /// Every rank's wanted ranges become the values of their owners' tensors there; the rest
  /// of its tensor is left as it is. The default broadcasts each owner's whole share.
  virtual void gather_shares(torch::Tensor& tensor, const Shares& shares);
  /// Bytes this rank has read of its peers' data in its sums and gathers since it was
  /// made, where the backend counts them (shared memory: what it copies out of the peers'
  /// slots); -1 where it does not.
  virtual int64_t received_bytes() const { return -1; }
  /// How long a collective may wait for a silent peer.
  virtual std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(30000); }
  /// Copies `root`'s tensor into every rank's `tensor` (same shape everywhere).
  virtual void broadcast(torch::Tensor& tensor, int root) = 0;
  /// Every rank's tensor (same shape everywhere), in rank order.
  virtual std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor) = 0;
  virtual void barrier() = 0;
  /// Tells the coordinator that this rank has finished (best effort, never throws).
  virtual void leave() {}
  /// The communicator of the next generation made from this one, when the backend can
  /// derive it without a fresh rendezvous: `excluded` are this generation's ranks that
  /// are not in the next one (the others keep their order); `after_failure` says a peer
  /// died. Every remaining rank must call it together. Returns nullptr when the backend
  /// cannot (the caller then rendezvouses afresh): Gloo always, NCCL after a failure
  /// (its communicator was aborted) or for an empty exclusion list.
  virtual std::unique_ptr<Communicator> shrink(const std::vector<int>& excluded,
                                               bool after_failure) {
    return nullptr;
  }
  /// The communicator of the next generation when it keeps this generation's ranks, in
  /// their order, and appends new ones: every member of this generation calls it with its
  /// rendezvous in the next one, while each new rank calls make_communicator with
  /// `Rendezvous::grown_from` set. Returns nullptr when the backend cannot (Gloo; NCCL
  /// before 2.29, or a communicator aborted after a failure); throws PeerFailure when the
  /// growth fails (the members then start afresh in a later generation).
  virtual std::unique_ptr<Communicator> grow(const Rendezvous& next) { return nullptr; }
  /// Abandons every collective in flight and releases the connections at once (NCCL
  /// cannot be destroyed cleanly after a peer failed). Never throws.
  virtual void abort() {}
};

/// A Gloo communicator on LibTorch's c10d (ProcessGroupGloo over a TCPStore client).
/// Throws PeerFailure when the peers do not all arrive within the timeout.
std::unique_ptr<Communicator> make_gloo_communicator(const Rendezvous& rendezvous);

/// What a backend can do besides its collectives: derive the next generation's
/// communicator from this generation's instead of a fresh rendezvous.
struct BackendCapabilities {
  bool can_shrink = false;  ///< Communicator::shrink drops ranks (after a clean regroup)
  bool can_grow = false;    ///< Communicator::grow appends ranks; new ranks can join it
  bool can_derive() const { return can_shrink || can_grow; }
};

/// The capabilities of `backend` ("gloo", "nccl") in this process: Gloo derives nothing;
/// NCCL shrinks, and grows where the loaded NCCL has ncclCommGrow (>= 2.29).
BackendCapabilities backend_capabilities(Backend backend);

/// Sets `r.backend` and `r.cuda_device` for a worker on `device` from the requested
/// backend (`requested`: auto | gloo | nccl, the value of the setting named `key`): auto is
/// nccl on a CUDA device when the NCCL backend is usable, gloo otherwise. Throws SpecError
/// naming `key` when nccl is asked for and cannot be used.
void choose_backend(Backend requested, const std::string& key, const torch::Device& device,
                    Rendezvous& r);

/// The communicator of `rendezvous.backend`: "gloo" (CPU tensors, and CUDA tensors where
/// LibTorch has CUDA) or "nccl" (CUDA tensors; see vflow/comm/nccl.h).
std::unique_ptr<Communicator> make_communicator(const Rendezvous& rendezvous);

/// A communicator of one rank: every collective is the identity.
std::unique_ptr<Communicator> make_local_communicator();

}  // namespace vflow::comm
