#include "vflow/models/mlp.h"

#include <torch/torch.h>

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

ModelBuilder make_mlp_factory(OptionReader& opt, const ModelContext& ctx) {
  MlpOptions o;
  o.hidden = opt.get_int_list("hidden", o.hidden, 1, 1 << 20);
  o.dropout = opt.get_double("dropout", o.dropout, 0.0, 0.99);
  o.batch_norm = opt.get_bool("batch_norm", o.batch_norm);
  if (ctx.vocab_size > 0) {
    opt.fail("hidden",
             "mlp needs float inputs; the data holds token ids (use bert or "
             "transformer-lm)");
  }
  return [o, ctx] { return std::make_shared<Mlp>(o, ctx); };
}

}  // namespace vflow::models
