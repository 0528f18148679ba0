// One persistent, flat gradient buffer per generation (docs/design.md §3.2).
//
// Every parameter's .grad is a view into the buffer, so backward passes of
// successive vnodes accumulate in place and a collective can reduce the whole
// buffer without a copy. Memory overhead: one model-sized buffer, whatever the
// number of vnodes.
#pragma once

#include <torch/types.h>

#include <vector>

namespace vflow::vnode {

/// How a model's trainable parameters lie in one flat buffer: those that require a
/// gradient, in registration order, each at its offset. The gradient buffer and the
/// fused optimizer's parameter buffer share it, so one index addresses both.
struct FlatLayout {
  /// Checks that the trainable parameters share one dtype and device, and that there is
  /// one (InternalError otherwise).
  explicit FlatLayout(const std::vector<torch::Tensor>& parameters);
  /// Whether `t` is defined and its data start at parameter i's offset in the buffer
  /// at `base`.
  bool at_offset(const torch::Tensor& t, const void* base, size_t i) const;

  std::vector<torch::Tensor> parameters;
  std::vector<int64_t> offsets;
  int64_t numel = 0;  ///< the trainable parameters' elements
};

class GradientBuffer {
 public:
  /// Allocates the buffer (zeroed) and installs the views. All parameters must share
  /// one dtype and device; parameters without requires_grad are skipped. `extra`
  /// elements after the gradients carry what rides along in the same collective
  /// (the stateful-kernel table, the loss).
  explicit GradientBuffer(const std::vector<torch::Tensor>& parameters, int64_t extra = 0);

  GradientBuffer(const GradientBuffer&) = delete;
  GradientBuffer& operator=(const GradientBuffer&) = delete;

  void zero();
  /// The flat buffer: parameters' gradients in registration order, then the extra part.
  torch::Tensor& flat() { return flat_; }
  const torch::Tensor& flat() const { return flat_; }
  int64_t numel() const { return flat_.numel(); }
  /// Where each trainable parameter's gradient lies in flat().
  const FlatLayout& layout() const { return layout_; }
  /// The gradients alone.
  torch::Tensor gradients() const { return flat_.narrow(0, 0, layout_.numel); }
  /// The extra part after the gradients.
  torch::Tensor extra() const {
    return flat_.narrow(0, layout_.numel, flat_.numel() - layout_.numel);
  }

  /// Throws InternalError if some parameter's .grad no longer aliases the buffer
  /// (autograd replaced it instead of accumulating in place).
  void check_views() const;
  /// Re-installs the views (after something outside vflow reset .grad).
  void bind();

 private:
  FlatLayout layout_;
  torch::Tensor flat_;
};

}  // namespace vflow::vnode
