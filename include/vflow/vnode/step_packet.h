// The step's one collective, as a named layout (docs/design.md §3.3).
//
// A worker's whole contribution to a step is one flat buffer, summed across workers by
// a single allreduce:
//
//   [ gradients | stateful-kernel table | loss | stop | regroup | verify ]
//
// - gradients: every parameter's .grad is a view into this section (GradientBuffer), so
//   the vnodes' backward passes accumulate Σ (n_v / B) g_v in place;
// - table: one row per vnode of the stateful kernels' contributions (rows of vnodes
//   held elsewhere stay zero; StatefulKernelSet::bind_table);
// - loss: Σ loss_v · n_v over the worker's vnodes;
// - stop: > 0 when any worker was asked to stop, so all stop after the same step;
// - regroup: the generation to regroup into (set by one worker, rank 0), 0 for none;
// - verify (only in a packet made with room for it: resources.verify_every_steps): the
//   two hashes of one vnode's contribution that a cross-check compares, each written by
//   one worker (the vnode's owner and its checker) as four 16-bit parts, which the sum
//   carries exactly (docs/verification.md).
//
// The sections are contiguous and in this order, so a reduction may cut the buffer into
// buckets along sections(): the trainer's buckets (engine/bucketed_reduction.h) start with
// the last parameters' gradients and everything after them, written before the last
// vnode's backward pass.
#pragma once

#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "vflow/vnode/gradient_buffer.h"

namespace vflow::vnode {

class StepPacket {
 public:
  /// The sections, in the packet's order.
  enum class Part : size_t { kGradients, kTable, kLoss, kStop, kRegroup, kVerify };

  /// The cross-check's two places in the verify section.
  enum class Role : int { kOwner = 0, kChecker = 1 };

  /// One contiguous range of the packet.
  struct Section {
    std::string name;  ///< gradients, table, loss, stop, regroup or verify
    int64_t offset = 0;
    int64_t numel = 0;
  };

  /// Installs the gradient views of `parameters` (GradientBuffer) and reserves
  /// `table_numel` elements for the stateful-kernel table, and the verify section where
  /// `verify`.
  StepPacket(const std::vector<torch::Tensor>& parameters, int64_t table_numel,
             bool verify = false);
  StepPacket(const StepPacket&) = delete;
  StepPacket& operator=(const StepPacket&) = delete;

  /// Zeroes the whole packet for a new step.
  void clear() { buffer_.zero(); }
  /// The flat buffer the collective reduces.
  torch::Tensor& flat() { return buffer_.flat(); }
  const torch::Tensor& flat() const { return buffer_.flat(); }
  int64_t numel() const { return buffer_.numel(); }
  GradientBuffer& gradient_buffer() { return buffer_; }

  torch::Tensor gradients() const { return section(Part::kGradients); }
  torch::Tensor table() const { return section(Part::kTable); }
  /// One element: Σ loss_v · n_v; add a vnode's share with add_loss.
  torch::Tensor loss() const { return section(Part::kLoss); }
  void add_loss(const torch::Tensor& vnode_loss, int64_t examples);

  // ---- the control word ----
  void request_stop();
  void request_regroup(int64_t generation);

  // ---- the cross-check (a packet with a verify section) ----
  /// The hash of what the packet holds of one vnode alone (gradients, table and loss, as
  /// the exact sum's integers: vnode::FixedPointSum::contribution_hash), the control word
  /// and the verify section left out.
  uint64_t contribution_hash() const;
  /// Writes `hash` into `role`'s place of the verify section (the others' stay zero).
  void write_hash(Role role, uint64_t hash);

  /// A 64-bit hash as the parts a verify place holds: kHashParts 16-bit values, each
  /// exact in float32 and in the exact sum (a float32 tensor on the CPU); and the hash
  /// back from such parts, of any dtype and device, after a sum to which one rank
  /// contributed them and the others zero.
  static constexpr int64_t kHashParts = 4;
  static torch::Tensor hash_parts(uint64_t hash);
  static uint64_t hash_of_parts(const torch::Tensor& parts);

  /// After the reduction: the loss sum and the control word, read in one transfer (on a
  /// GPU, one synchronisation instead of three).
  struct Tail {
    double loss_sum = 0;  ///< Σ loss_v · n_v over every vnode
    bool stop = false;    ///< did any worker ask to stop
    int64_t regroup = 0;  ///< the generation to regroup into, 0 for none
    /// The verify section's two hashes (owner's, checker's), 0 where none was written or
    /// the packet has no verify section.
    uint64_t hashes[2] = {0, 0};
  };
  Tail tail() const;

  /// The sections in order: gradients, table, loss, stop, regroup (and verify).
  const std::vector<Section>& sections() const { return sections_; }
  const Section& section_of(Part part) const { return sections_[static_cast<size_t>(part)]; }
  bool has_verify() const { return sections_.size() > static_cast<size_t>(Part::kVerify); }

 private:
  torch::Tensor section(Part part) const {
    const Section& s = section_of(part);
    return buffer_.flat().narrow(0, s.offset, s.numel);
  }
  GradientBuffer buffer_;
  std::vector<Section> sections_;
};

}  // namespace vflow::vnode
