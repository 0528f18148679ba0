#include "vflow/vnode/step_packet.h"

#include <torch/torch.h>

#include <cmath>

#include "vflow/core/error.h"
#include "vflow/vnode/fixed_point.h"

namespace vflow::vnode {

namespace {
constexpr int64_t kLossSlots = 1;
constexpr int64_t kControlSlots = 2;                          // stop, regroup
constexpr int64_t kVerifySlots = 2 * StepPacket::kHashParts;  // the owner's, the checker's
}  // namespace

StepPacket::StepPacket(const std::vector<torch::Tensor>& parameters, int64_t table_numel,
                       bool verify)
    : buffer_(parameters, table_numel + kLossSlots + kControlSlots + (verify ? kVerifySlots : 0)) {
  const int64_t g = buffer_.gradients().numel();
  sections_ = {{"gradients", 0, g},
               {"table", g, table_numel},
               {"loss", g + table_numel, 1},
               {"stop", g + table_numel + 1, 1},
               {"regroup", g + table_numel + 2, 1}};
  if (verify) sections_.push_back({"verify", g + table_numel + 3, kVerifySlots});
}

void StepPacket::add_loss(const torch::Tensor& vnode_loss, int64_t examples) {
  auto slot = loss();
  slot += vnode_loss.detach() * static_cast<double>(examples);
}

void StepPacket::request_stop() { section(Part::kStop).fill_(1.0); }

void StepPacket::request_regroup(int64_t generation) {
  section(Part::kRegroup).fill_(static_cast<double>(generation));
}

uint64_t StepPacket::contribution_hash() const {
  return FixedPointSum::contribution_hash(buffer_.flat(), section_of(Part::kStop).offset);
}

torch::Tensor StepPacket::hash_parts(uint64_t hash) {
  auto parts = torch::empty({kHashParts}, torch::kFloat32);
  float* p = parts.data_ptr<float>();
  for (int64_t k = 0; k < kHashParts; ++k) p[k] = static_cast<float>((hash >> (16 * k)) & 0xffffu);
  return parts;
}

uint64_t StepPacket::hash_of_parts(const torch::Tensor& parts) {
  VFLOW_ASSERT(parts.numel() == kHashParts, "a hash of another number of parts");
  const auto host = parts.to(torch::kCPU, torch::kDouble).contiguous();
  const double* p = host.data_ptr<double>();
  uint64_t hash = 0;
  for (int64_t k = 0; k < kHashParts; ++k) {
    hash |= (static_cast<uint64_t>(std::llround(p[k])) & 0xffffu) << (16 * k);
  }
  return hash;
}

void StepPacket::write_hash(Role role, uint64_t hash) {
  VFLOW_ASSERT(has_verify(), "a hash written into a packet without a verify section");
  section(Part::kVerify)
      .narrow(0, static_cast<int64_t>(role) * kHashParts, kHashParts)
      .copy_(hash_parts(hash));
}

StepPacket::Tail StepPacket::tail() const {
  // loss, stop, regroup (and verify) lie next to each other at the end of the packet.
  const int64_t loss_at = section_of(Part::kLoss).offset;
  const auto host = buffer_.flat()
                        .narrow(0, loss_at, buffer_.flat().numel() - loss_at)
                        .to(torch::kCPU, torch::kDouble)
                        .contiguous();
  const double* v = host.data_ptr<double>();
  Tail tail{v[0], v[1] > 0, std::llround(v[2])};
  if (has_verify()) {
    for (int r = 0; r < 2; ++r)
      tail.hashes[r] = hash_of_parts(host.narrow(0, 3 + r * kHashParts, kHashParts));
  }
  return tail;
}

}  // namespace vflow::vnode
