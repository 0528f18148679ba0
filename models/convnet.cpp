#include "vflow/models/convnet.h"

#include <fmt/format.h>
#include <torch/torch.h>

namespace vflow::models {

ConvNet::ConvNet(const ConvNetOptions& options, const ModelContext& ctx) {
  int64_t in_channels = ctx.input_shape.at(0);
  int64_t height = ctx.input_shape.at(1);
  int64_t width = ctx.input_shape.at(2);
  for (int64_t c : options.channels) {
    features_->push_back(torch::nn::Conv2d(
        torch::nn::Conv2dOptions(in_channels, c, 3).padding(1).bias(!options.batch_norm)));
    if (options.batch_norm) features_->push_back(torch::nn::BatchNorm2d(c));
    features_->push_back(torch::nn::ReLU());
    features_->push_back(torch::nn::MaxPool2d(2));
    in_channels = c;
    height /= 2;
    width /= 2;
  }
  features_->push_back(torch::nn::Flatten());
  classifier_->push_back(torch::nn::Linear(in_channels * height * width, options.hidden));
  classifier_->push_back(torch::nn::ReLU());
  if (options.dropout > 0) classifier_->push_back(torch::nn::Dropout(options.dropout));
  classifier_->push_back(torch::nn::Linear(options.hidden, ctx.num_classes));
  register_module("features", features_);
  register_module("classifier", classifier_);
}

torch::Tensor ConvNet::forward(const torch::Tensor& input) {
  return classifier_->forward(features_->forward(input));
}

ModelBuilder make_convnet_factory(OptionReader& opt, const ModelContext& ctx) {
  ConvNetOptions o;
  o.channels = opt.get_int_list("channels", o.channels, 1, 4096);
  o.hidden = opt.get_int("hidden", o.hidden, 1, 1 << 20);
  o.dropout = opt.get_double("dropout", o.dropout, 0.0, 0.99);
  o.batch_norm = opt.get_bool("batch_norm", o.batch_norm);
  if (o.channels.empty()) opt.fail("channels", "needs at least one convolution block");
  if (ctx.input_shape.size() != 3) {
    opt.fail("channels", fmt::format("convnet needs image inputs [channels, height, width]; the "
                                     "data has {} dimensions",
                                     ctx.input_shape.size()));
  }
  const int64_t shrink = int64_t{1} << o.channels.size();
  if (ctx.input_shape[1] < shrink || ctx.input_shape[2] < shrink) {
    opt.fail("channels", fmt::format("{} pooling blocks shrink a {}x{} input to nothing",
                                     o.channels.size(), ctx.input_shape[1], ctx.input_shape[2]));
  }
  return [o, ctx] { return std::make_shared<ConvNet>(o, ctx); };
}

}  // namespace vflow::models
