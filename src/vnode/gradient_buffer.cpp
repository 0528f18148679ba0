#include "vflow/vnode/gradient_buffer.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "vflow/core/error.h"

namespace vflow::vnode {

GradientBuffer::GradientBuffer(const std::vector<torch::Tensor>& parameters, int64_t extra) {
  int64_t total = 0;
  for (const auto& p : parameters) {
    if (!p.requires_grad()) continue;
    if (!parameters_.empty()) {
      VFLOW_ASSERT(p.scalar_type() == parameters_.front().scalar_type() &&
                       p.device() == parameters_.front().device(),
                   "all parameters of a model must share one dtype and device");
    }
    parameters_.push_back(p);
    offsets_.push_back(total);
    total += p.numel();
  }
  VFLOW_ASSERT(!parameters_.empty(), "the model has no trainable parameters");
  gradient_numel_ = total;
  flat_ = torch::zeros({total + extra}, parameters_.front().options().requires_grad(false));
  bind();
}

void GradientBuffer::bind() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    auto& p = parameters_[i];
    p.mutable_grad() = flat_.narrow(0, offsets_[i], p.numel()).view(p.sizes());
  }
}

void GradientBuffer::zero() { flat_.zero_(); }

void GradientBuffer::check_views() const {
  const auto* base = static_cast<const char*>(flat_.data_ptr());
  const size_t item = flat_.element_size();
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const auto& g = parameters_[i].grad();
    const auto* expected = base + static_cast<size_t>(offsets_[i]) * item;
    VFLOW_ASSERT(g.defined() && static_cast<const char*>(g.data_ptr()) == expected,
                 fmt::format("the gradient of parameter {} left the flat buffer", i));
  }
}

}  // namespace vflow::vnode
