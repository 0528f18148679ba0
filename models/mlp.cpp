#include "vflow/models/mlp.h"

#include <torch/torch.h>

#include "core/spec_schema.h"

namespace vflow::models {

Mlp::Mlp(const MlpOptions& options, const ModelContext& ctx) {
  int64_t width = 1;
  for (int64_t d : ctx.input_shape) width *= d;
  layers_->push_back(torch::nn::Flatten());
  for (int64_t h : options.hidden) {
    layers_->push_back(torch::nn::Linear(width, h));
    if (options.batch_norm) layers_->push_back(torch::nn::BatchNorm1d(h));
    layers_->push_back(torch::nn::ReLU());
    if (options.dropout > 0) layers_->push_back(torch::nn::Dropout(options.dropout));
    width = h;
  }
  layers_->push_back(torch::nn::Linear(width, ctx.num_classes));
  register_module("layers", layers_);
}

torch::Tensor Mlp::forward(const torch::Tensor& input) { return layers_->forward(input); }

namespace {

const SpecSchema<MlpOptions>& mlp_schema() {
  static const auto schema = [] {
    SpecSchema<MlpOptions> s("mlp");
    s.integers("hidden", &MlpOptions::hidden, 1, 1 << 20, "hidden layer widths");
    s.real("dropout", &MlpOptions::dropout, 0.0, 0.99, "dropout after each hidden layer");
    s.boolean("batch_norm", &MlpOptions::batch_norm, "BatchNorm1d after each hidden linear layer");
    return s;
  }();
  return schema;
}

ModelBuilder make_mlp_factory(OptionReader& opt, const ModelContext& ctx) {
  MlpOptions o;
  mlp_schema().read(opt, o);
  if (ctx.vocab_size > 0) {
    opt.fail("hidden",
             "mlp needs float inputs; the data holds token ids (use bert or "
             "transformer-lm)");
  }
  return [o, ctx] { return std::make_shared<Mlp>(o, ctx); };
}

}  // namespace

void register_mlp(ModelRegistry& registry) {
  registry.add("mlp", "a multi-layer perceptron", make_mlp_factory, mlp_schema().rows());
}

}  // namespace vflow::models
