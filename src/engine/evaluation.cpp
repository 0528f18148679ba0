#include "engine/evaluation.h"

#include <torch/torch.h>

#include <algorithm>

#include "core/torch_compat.h"

namespace vflow::engine {

EvalResult evaluate_model(models::Model& model, const data::Dataset& test,
                          const ExampleReader& reader, c10::Device device, bool bf16, int64_t batch,
                          const std::vector<at::Tensor>& average) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> trained;
  if (!average.empty()) {
    auto params = model.parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      trained.push_back(params[i].detach().clone());
      params[i].copy_(average[i]);
    }
  }
  model.eval();
  const int64_t n = test.size();
  double loss_sum = 0;
  int64_t correct = 0;
  int64_t predictions = 0;  // examples, or tokens of a sequence model
  for (int64_t begin = 0; begin < n; begin += batch) {
    const int64_t size = std::min(batch, n - begin);
    auto b = reader.read(test, torch::arange(begin, begin + size, torch::kInt64), /*epoch=*/0);
    const compat::AutocastGuard autocast(device.type(), bf16);
    const auto logits = model.forward(b.input.to(device));
    const auto target = b.target.to(device);
    loss_sum += models::prediction_loss(logits, target, /*sum=*/true).item<double>();
    correct += logits.argmax(-1).eq(target).sum().item<int64_t>();
    predictions += target.numel();
  }
  model.train();
  if (!trained.empty()) {
    auto params = model.parameters();
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(trained[i]);
  }
  EvalResult r;
  r.examples = n;
  r.loss = predictions > 0 ? loss_sum / static_cast<double>(predictions) : 0;
  r.accuracy =
      predictions > 0 ? static_cast<double>(correct) / static_cast<double>(predictions) : 0;
  return r;
}

}  // namespace vflow::engine
