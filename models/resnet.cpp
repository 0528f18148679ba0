#include "vflow/models/resnet.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "core/spec_schema.h"

namespace vflow::models {

namespace {

namespace nn = torch::nn;

nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  return nn::Conv2d(
      nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
}

// The projection of a block's input when its shape changes (1x1 conv + batch norm).
nn::Sequential shortcut(int64_t in, int64_t out, int64_t stride) {
  nn::Sequential s;
  if (stride != 1 || in != out) {
    s->push_back(conv(in, out, 1, stride));
    s->push_back(nn::BatchNorm2d(out));
  }
  return s;
}

class BasicBlockImpl : public nn::Module {
 public:
  static constexpr int64_t kExpansion = 1;
  BasicBlockImpl(int64_t in, int64_t planes, int64_t stride)
      : conv1_(register_module("conv1", conv(in, planes, 3, stride))),
        bn1_(register_module("bn1", nn::BatchNorm2d(planes))),
        conv2_(register_module("conv2", conv(planes, planes, 3, 1))),
        bn2_(register_module("bn2", nn::BatchNorm2d(planes))),
        shortcut_(register_module("shortcut", shortcut(in, planes, stride))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    auto y = torch::relu(bn1_->forward(conv1_->forward(x)));
    y = bn2_->forward(conv2_->forward(y));
    return torch::relu(y + (shortcut_->is_empty() ? x : shortcut_->forward(x)));
  }

 private:
  nn::Conv2d conv1_;
  nn::BatchNorm2d bn1_;
  nn::Conv2d conv2_;
  nn::BatchNorm2d bn2_;
  nn::Sequential shortcut_;
};
TORCH_MODULE(BasicBlock);

class BottleneckImpl : public nn::Module {
 public:
  static constexpr int64_t kExpansion = 4;
  BottleneckImpl(int64_t in, int64_t planes, int64_t stride)
      : conv1_(register_module("conv1", conv(in, planes, 1, 1))),
        bn1_(register_module("bn1", nn::BatchNorm2d(planes))),
        conv2_(register_module("conv2", conv(planes, planes, 3, stride))),
        bn2_(register_module("bn2", nn::BatchNorm2d(planes))),
        conv3_(register_module("conv3", conv(planes, planes * kExpansion, 1, 1))),
        bn3_(register_module("bn3", nn::BatchNorm2d(planes * kExpansion))),
        shortcut_(register_module("shortcut", shortcut(in, planes * kExpansion, stride))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    auto y = torch::relu(bn1_->forward(conv1_->forward(x)));
    y = torch::relu(bn2_->forward(conv2_->forward(y)));
    y = bn3_->forward(conv3_->forward(y));
    return torch::relu(y + (shortcut_->is_empty() ? x : shortcut_->forward(x)));
  }

 private:
  nn::Conv2d conv1_;
  nn::BatchNorm2d bn1_;
  nn::Conv2d conv2_;
  nn::BatchNorm2d bn2_;
  nn::Conv2d conv3_;
  nn::BatchNorm2d bn3_;
  nn::Sequential shortcut_;
};
TORCH_MODULE(Bottleneck);

std::vector<int64_t> blocks_per_stage(int64_t depth) {
  switch (depth) {
    case 18:
      return {2, 2, 2, 2};
    case 34:
    case 50:
      return {3, 4, 6, 3};
    default:  // 101
      return {3, 4, 23, 3};
  }
}

template <typename Block>
int64_t add_stages(nn::ModuleList& stages, int64_t in, int64_t width,
                   const std::vector<int64_t>& blocks) {
  for (size_t s = 0; s < blocks.size(); ++s) {
    nn::Sequential stage;
    const int64_t planes = width << s;
    for (int64_t b = 0; b < blocks[s]; ++b) {
      stage->push_back(Block(in, planes, b == 0 && s > 0 ? 2 : 1));
      in = planes * Block::Impl::kExpansion;
    }
    stages->push_back(stage);
  }
  return in;
}

}  // namespace

ResNet::ResNet(const ResNetOptions& options, const ModelContext& ctx) {
  const int64_t channels = ctx.input_shape.at(0);
  const bool small =
      options.stem == "cifar" ||
      (options.stem == "auto" && ctx.input_shape.at(1) <= 64 && ctx.input_shape.at(2) <= 64);
  if (small) {
    stem_->push_back(conv(channels, options.width, 3, 1));
  } else {
    stem_->push_back(conv(channels, options.width, 7, 2));
  }
  stem_->push_back(nn::BatchNorm2d(options.width));
  stem_->push_back(nn::ReLU());
  if (!small) stem_->push_back(nn::MaxPool2d(nn::MaxPool2dOptions(3).stride(2).padding(1)));
  const auto blocks = blocks_per_stage(options.depth);
  const int64_t features =
      options.depth < 50 ? add_stages<BasicBlock>(stages_, options.width, options.width, blocks)
                         : add_stages<Bottleneck>(stages_, options.width, options.width, blocks);
  fc_ = nn::Linear(features, ctx.num_classes);
  register_module("stem", stem_);
  register_module("stages", stages_);
  register_module("fc", fc_);
}

torch::Tensor ResNet::forward(const torch::Tensor& input) {
  auto x = stem_->forward(input);
  for (const auto& stage : *stages_) x = stage->as<nn::Sequential>()->forward(x);
  return fc_->forward(torch::flatten(torch::adaptive_avg_pool2d(x, {1, 1}), 1));
}

namespace {

const SpecSchema<ResNetOptions>& resnet_schema() {
  static const auto schema = [] {
    using O = ResNetOptions;
    SpecSchema<O> s("resnet");
    s.integer("depth", &O::depth, 18, 101, "18, 34, 50 or 101").after([](OptionReader& r, O& o) {
      if (o.depth != 18 && o.depth != 34 && o.depth != 50 && o.depth != 101) {
        r.fail("depth", fmt::format("ResNet depth {} is not one of 18, 34, 50, 101", o.depth));
      }
    });
    s.choice("stem", &O::stem, {"auto", "cifar", "imagenet"},
             "`cifar` (3×3 conv, no pooling), `imagenet` (7×7 stride-2 conv + 3×3 max-pool), "
             "`auto` = cifar for inputs up to 64×64");
    s.integer("width", &O::width, 1, 4096,
              "channels of the first stage (stages double it); smaller = a thin ResNet");
    return s;
  }();
  return schema;
}

ModelBuilder make_resnet_factory(OptionReader& opt, const ModelContext& ctx) {
  ResNetOptions o;
  resnet_schema().read(opt, o);
  if (ctx.input_shape.size() != 3 || ctx.vocab_size > 0) {
    opt.fail("depth", fmt::format("resnet needs image inputs [channels, height, width]; the data "
                                  "has {} dimensions{}",
                                  ctx.input_shape.size(), ctx.vocab_size > 0 ? " of tokens" : ""));
  }
  return [o, ctx] { return std::make_shared<ResNet>(o, ctx); };
}

}  // namespace

void register_resnet(ModelRegistry& registry) {
  registry.add("resnet",
               "ResNet-18/34 with basic blocks, ResNet-50/101 with bottlenecks; batch norm "
               "throughout, handled by the stateful-kernel table",
               make_resnet_factory, resnet_schema().rows());
}

}  // namespace vflow::models
