#include "vflow/models/convnet.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "core/spec_schema.h"

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

namespace {

const SpecSchema<ConvNetOptions>& convnet_schema() {
  static const auto schema = [] {
    using O = ConvNetOptions;
    SpecSchema<O> s("convnet");
    s.integers("channels", &O::channels, 1, 4096, "output channels of each block");
    s.integer("hidden", &O::hidden, 1, 1 << 20, "width of the fully connected layer");
    s.real("dropout", &O::dropout, 0.0, 0.99, "dropout before the classifier (0 = none)");
    s.boolean("batch_norm", &O::batch_norm, "BatchNorm2d after each convolution");
    return s;
  }();
  return schema;
}

ModelBuilder make_convnet_factory(OptionReader& opt, const ModelContext& ctx) {
  ConvNetOptions o;
  convnet_schema().read(opt, o);
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

}  // namespace

void register_convnet(ModelRegistry& registry) {
  registry.add("convnet",
               "one 3×3 convolution [+ batch norm] + ReLU + 2×2 max-pool block per channel "
               "entry, then a hidden layer",
               make_convnet_factory, convnet_schema().rows());
}

}  // namespace vflow::models
