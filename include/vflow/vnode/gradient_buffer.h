// One persistent, flat gradient buffer per generation (DESIGN.md §3.2).
//
// Every parameter's .grad is a view into the buffer, so backward passes of
// successive vnodes accumulate in place and a collective can reduce the whole
// buffer without a copy. Memory overhead: one model-sized buffer, whatever the
// number of vnodes.
#pragma once

#include <torch/types.h>

#include <vector>

namespace vflow::vnode {

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
  /// The gradients alone.
  torch::Tensor gradients() const { return flat_.narrow(0, 0, gradient_numel_); }
  /// The extra part after the gradients.
  torch::Tensor extra() const {
    return flat_.narrow(0, gradient_numel_, flat_.numel() - gradient_numel_);
  }

  /// Throws InternalError if some parameter's .grad no longer aliases the buffer
  /// (autograd replaced it instead of accumulating in place).
  void check_views() const;
  /// Re-installs the views (after something outside vflow reset .grad).
  void bind();

 private:
  std::vector<torch::Tensor> parameters_;
  std::vector<int64_t> offsets_;
  int64_t gradient_numel_ = 0;
  torch::Tensor flat_;
};

}  // namespace vflow::vnode
