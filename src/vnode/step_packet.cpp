#include "vflow/vnode/step_packet.h"

#include <torch/torch.h>

#include <cmath>

namespace vflow::vnode {

namespace {
constexpr int64_t kLossSlots = 1;
constexpr int64_t kControlSlots = 2;  // stop, regroup
}  // namespace

StepPacket::StepPacket(const std::vector<torch::Tensor>& parameters, int64_t table_numel)
    : buffer_(parameters, table_numel + kLossSlots + kControlSlots) {
  const int64_t g = buffer_.gradients().numel();
  sections_ = {{"gradients", 0, g},
               {"table", g, table_numel},
               {"loss", g + table_numel, 1},
               {"stop", g + table_numel + 1, 1},
               {"regroup", g + table_numel + 2, 1}};
}

void StepPacket::add_loss(const torch::Tensor& vnode_loss, int64_t examples) {
  auto slot = loss();
  slot += vnode_loss.detach() * static_cast<double>(examples);
}

void StepPacket::request_stop() { section(Part::kStop).fill_(1.0); }

void StepPacket::request_regroup(int64_t generation) {
  section(Part::kRegroup).fill_(static_cast<double>(generation));
}

StepPacket::Tail StepPacket::tail() const {
  // loss, stop and regroup lie next to each other at the end of the packet.
  const int64_t loss_at = section_of(Part::kLoss).offset;
  const auto host =
      buffer_.flat().narrow(0, loss_at, 3).to(torch::kCPU, torch::kDouble).contiguous();
  const double* v = host.data_ptr<double>();
  return Tail{v[0], v[1] > 0, std::llround(v[2])};
}

}  // namespace vflow::vnode
