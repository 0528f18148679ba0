#include "vflow/vnode/gradient_buffer.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "vflow/core/error.h"

namespace vflow::vnode {

FlatLayout::FlatLayout(const std::vector<torch::Tensor>& all) {
  for (const auto& p : all) {
    if (!p.requires_grad()) continue;
    if (!parameters.empty()) {
      VFLOW_ASSERT(p.scalar_type() == parameters.front().scalar_type() &&
                       p.device() == parameters.front().device(),
                   "all parameters of a model must share one dtype and device");
    }
    parameters.push_back(p);
    offsets.push_back(numel);
    numel += p.numel();
  }
  VFLOW_ASSERT(!parameters.empty(), "the model has no trainable parameters");
}

bool FlatLayout::at_offset(const torch::Tensor& t, const void* base, size_t i) const {
  return t.defined() &&
         static_cast<const char*>(t.data_ptr()) ==
             static_cast<const char*>(base) + static_cast<size_t>(offsets[i]) * t.element_size();
}

GradientBuffer::GradientBuffer(const std::vector<torch::Tensor>& parameters, int64_t extra)
    : layout_(parameters),
      flat_(torch::zeros({layout_.numel + extra},
                         layout_.parameters.front().options().requires_grad(false))) {
  bind();
}

void GradientBuffer::bind() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < layout_.parameters.size(); ++i) {
    auto& p = layout_.parameters[i];
    p.mutable_grad() = flat_.narrow(0, layout_.offsets[i], p.numel()).view(p.sizes());
  }
}

void GradientBuffer::zero() { flat_.zero_(); }

void GradientBuffer::check_views() const {
  for (size_t i = 0; i < layout_.parameters.size(); ++i) {
    VFLOW_ASSERT(layout_.at_offset(layout_.parameters[i].grad(), flat_.data_ptr(), i),
                 fmt::format("the gradient of parameter {} left the flat buffer", i));
  }
}

}  // namespace vflow::vnode
