// Cross-checking while training (docs/verification.md): every resources.verify_every_steps
// steps one vnode is computed a second time, by another worker with the same kernel
// signature, and the hashes of the two contributions are compared in the step's packet.
// In deterministic mode a vnode's contribution is a function of the parameters, the seed,
// the step and the vnode on any worker of one signature, so unequal hashes mean that one
// of the two computed something else: a faulty core or device, or memory that changed.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "vflow/vnode/plan.h"

namespace vflow::comm {
class Communicator;
}

namespace vflow::engine {

/// What must be equal between two workers for their bits to agree, as text: the build
/// (vflow's and LibTorch's), the device type (a GPU's name; a CPU's model, the instruction
/// sets its kernels are picked by, the BLAS library and its core type) and the intra-op
/// threads.
std::string kernel_signature(c10::Device device);

/// One step's cross-check: who computes which vnode twice.
struct CrossCheck {
  int64_t step = 0;
  int64_t vnode = -1;
  int owner = -1;    ///< the rank that holds the vnode
  int checker = -1;  ///< the rank that computes it a second time
};

/// The cross-checks of a job on one communicator.
class CrossChecks {
 public:
  /// Every `every` steps (> 0).
  explicit CrossChecks(int64_t every) : every_(every) {}

  /// Whether step `step` is cross-checked where a pair can be found.
  bool due(int64_t step) const { return step % every_ == 0; }

  /// Every rank's kernel signature, process and host, exchanged once per communicator by
  /// every rank together (a collective; throws comm::PeerFailure). Rank 0 says when no
  /// two ranks share a signature, so that nothing can be cross-checked.
  void meet(comm::Communicator& comm, c10::Device device);
  bool met() const { return !signatures_.empty(); }
  /// A new communicator: meet again before the next cross-check.
  void forget() { signatures_.clear(); }

  /// The cross-check of step `step`, where `held[r]` are rank r's vnodes and `present`
  /// the step's non-empty vnodes: the vnodes take turns, and so do the checkers among
  /// the ranks that share the owner's signature. Nothing when no rank has a partner.
  std::optional<CrossCheck> plan(int64_t step, const std::vector<vnode::VnodeRange>& held,
                                 const std::vector<int64_t>& present) const;
  /// A third rank of the owner's signature that decides which of the two is odd, or -1.
  int referee(const CrossCheck& check) const;
  /// "worker 2 (member 5, pid 123 on host-a)".
  std::string describe(int rank) const;

 private:
  int64_t every_;
  std::vector<uint64_t> signatures_;  // by rank: the kernel signature's hash
  std::vector<std::string> members_, hosts_;
  std::vector<int64_t> pids_;
};

/// A fault injected for tests (VFLOW_INJECT_FAULT=STEP:MEMBER[:BIT]): in step STEP, the
/// worker whose VFLOW_MEMBER is MEMBER flips bit BIT (default 22, the highest of the
/// mantissa) of the largest gradient of every vnode it computes; with `gather` in place of
/// BIT it kills itself (SIGKILL) instead, after its update and as the parameters' gather of
/// a sharded job starts; with `late` it comes to a sharded step's commit (the exchange
/// after the sums, before the update) resources.timeout_s and 2 s late, so that its
/// peers give up there while it passes. Read in this one place.
struct InjectedFault {
  int64_t step = -1;
  int bit = 22;
  bool dies_in_gather = false;
  bool late_to_commit = false;
  /// A fault of the gradients (a flipped bit), not of a sharded step's collectives.
  bool flips_bit() const { return !dies_in_gather && !late_to_commit; }
};
std::optional<InjectedFault> injected_fault();

}  // namespace vflow::engine
