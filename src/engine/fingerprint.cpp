#include "vflow/engine/fingerprint.h"

#include <fmt/format.h>
#include <torch/torch.h>

namespace vflow::engine {

namespace {
struct Fnv1a {
  uint64_t h = 0xcbf29ce484222325ULL;
  void add(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < n; ++i) {
      h ^= p[i];
      h *= 0x100000001b3ULL;
    }
  }
  void add(const std::string& s) { add(s.data(), s.size()); }
  void add(const torch::Tensor& t) {
    const auto cpu = t.detach().to(torch::kCPU).contiguous();
    const auto type = static_cast<int32_t>(cpu.scalar_type());
    add(&type, sizeof type);
    for (int64_t d : cpu.sizes()) add(&d, sizeof d);
    add(cpu.data_ptr(), cpu.numel() * cpu.element_size());
  }
};
}  // namespace

std::string fingerprint(const torch::nn::Module& module) { return fingerprint(module, {}, ""); }

std::string fingerprint(const torch::nn::Module& module, const std::vector<torch::Tensor>& extra,
                        const std::string& extra_name) {
  Fnv1a f;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    f.add(p.key());
    f.add(p.value());
  }
  for (const auto& b : module.named_buffers(/*recurse=*/true)) {
    f.add(b.key());
    f.add(b.value());
  }
  for (size_t i = 0; i < extra.size(); ++i) {
    f.add(fmt::format("{}.{}", extra_name, i));
    f.add(extra[i]);
  }
  return fmt::format("{:016x}", f.h);
}

}  // namespace vflow::engine
