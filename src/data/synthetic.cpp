#include "vflow/data/synthetic.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "vflow/vnode/plan.h"

namespace vflow::data {

std::shared_ptr<TensorDataset> make_synthetic(const SyntheticOptions& options) {
  auto prototypes_gen = at::detail::createCPUGenerator(options.seed);
  auto sample_gen =
      at::detail::createCPUGenerator(vnode::mix_seed(options.seed, 0xDA7AULL, options.split + 1));
  std::vector<int64_t> proto_shape{options.classes};
  proto_shape.insert(proto_shape.end(), options.shape.begin(), options.shape.end());
  const auto prototypes = torch::randn(proto_shape, prototypes_gen);
  const auto targets = torch::randint(options.classes, {options.size}, sample_gen, torch::kInt64);
  std::vector<int64_t> input_shape{options.size};
  input_shape.insert(input_shape.end(), options.shape.begin(), options.shape.end());
  auto inputs =
      prototypes.index_select(0, targets) + options.noise * torch::randn(input_shape, sample_gen);
  return std::make_shared<TensorDataset>(inputs, targets, options.classes);
}

}  // namespace vflow::data
