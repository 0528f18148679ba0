// The model zoo: output shapes, a few training steps, and the errors for data a
// model cannot take.
#include <torch/torch.h>

#include <catch2/catch.hpp>

#include "support.h"
#include "vflow/core/error.h"
#include "vflow/data/text.h"
#include "vflow/models/registry.h"
#include "vflow/models/transformer.h"

using vflow::models::ModelContext;
using vflow::models::ModelRegistry;

namespace {

std::shared_ptr<vflow::models::Model> build(const std::string& name, const std::string& options,
                                            const ModelContext& ctx) {
  const auto node = vflow::parse_yaml(options, "<test options>");
  torch::manual_seed(0);
  return ModelRegistry::global().prepare(name, vflow::SpecNode(), node, ctx)();
}

/// Trains a few steps on one fixed batch; the loss must fall (the model can learn).
void check_learns(vflow::models::Model& model, const torch::Tensor& input,
                  const torch::Tensor& target, double lr) {
  torch::optim::Adam optimizer(model.parameters(), torch::optim::AdamOptions(lr));
  model.train();
  double first = 0, last = 0;
  for (int i = 0; i < 8; ++i) {
    optimizer.zero_grad();
    const auto loss = vflow::models::prediction_loss(model.forward(input), target);
    loss.backward();
    optimizer.step();
    (i == 0 ? first : last) = loss.item<double>();
  }
  CHECK(std::isfinite(last));
  CHECK(last < first);
}

constexpr int64_t kVocab = vflow::data::ByteTokenizer::kVocabSize;

}  // namespace

TEST_CASE("ResNets give [n, classes] logits and learn", "[unit][models][numeric]") {
  struct Case {
    std::string options;
    ModelContext ctx;
    int64_t parameters;  // torchvision's counts where the configuration matches
  };
  const std::vector<Case> cases = {
      // CIFAR-style ResNet-18 on 3x32x32, 10 classes: 11,173,962 parameters.
      {"{depth: 18, stem: cifar}", {{3, 32, 32}, 10}, 11173962},
      // ImageNet ResNet-50, 1000 classes: torchvision's 25,557,032.
      {"{depth: 50, stem: imagenet}", {{3, 64, 64}, 1000}, 25557032},
      // Thin variants that train quickly, on Fashion-MNIST's shape.
      {"{depth: 18, width: 8}", {{1, 28, 28}, 10}, 0},
      {"{depth: 50, width: 4, stem: imagenet}", {{1, 32, 32}, 10}, 0},
  };
  for (const auto& c : cases) {
    CAPTURE(c.options);
    auto model = build("resnet", c.options, c.ctx);
    int64_t count = 0;
    for (const auto& p : model->parameters()) count += p.numel();
    if (c.parameters > 0) CHECK(count == c.parameters);
    auto input =
        torch::randn({4, c.ctx.input_shape[0], c.ctx.input_shape[1], c.ctx.input_shape[2]});
    {
      torch::NoGradGuard no_grad;
      CHECK(model->forward(input).sizes() == torch::IntArrayRef({4, c.ctx.num_classes}));
    }
    if (c.parameters == 0) check_learns(*model, input, torch::tensor({0, 1, 2, 3}), 1e-2);
  }
}

TEST_CASE("the BERT-style encoder classifies token sequences and learns",
          "[unit][models][numeric]") {
  const ModelContext ctx{{16}, 4, kVocab};
  auto tokens = torch::randint(vflow::data::ByteTokenizer::kFirstByte, kVocab, {6, 16});
  tokens.slice(1, 10, 16).fill_(vflow::data::ByteTokenizer::kPad);  // padded tails
  tokens.select(1, 0).fill_(vflow::data::ByteTokenizer::kStart);
  auto model = build("bert", "{preset: tiny}", ctx);
  {
    torch::NoGradGuard no_grad;
    model->eval();
    const auto logits = model->forward(tokens);
    CHECK(logits.sizes() == torch::IntArrayRef({6, 4}));
    // Padding is masked out: changing a padded position's token id changes nothing.
    auto other = tokens.clone();
    other.select(1, 12).fill_(vflow::data::ByteTokenizer::kFirstByte);
    CHECK_FALSE(torch::allclose(model->forward(other), logits));  // not padding any more
    auto tail = tokens.clone();
    tail.slice(1, 10, 16).fill_(vflow::data::ByteTokenizer::kPad);
    CHECK(torch::allclose(model->forward(tail), logits));
  }
  check_learns(*model, tokens, torch::tensor({0, 1, 2, 3, 0, 1}), 1e-3);

  // The presets have BERT's published sizes: base = 12 layers of width 768.
  const auto base = vflow::models::bert_preset("base");
  CHECK(base.layers == 12);
  CHECK(base.hidden == 768);
  CHECK(base.heads == 12);
  auto mini = build("bert", "{preset: mini}", ctx);
  int64_t count = 0;
  for (const auto& p : mini->parameters()) count += p.numel();
  // 4 layers x (4*256*256 + 4*256 + 2*256*1024 + 1024 + 256 + 4*256) + embeddings + pooler + head
  CHECK(count == 4 * (4 * 256 * 256 + 4 * 256 + 2 * 256 * 1024 + 1024 + 256 + 4 * 256) +
                     (kVocab + 16) * 256 + 2 * 256 + 256 * 256 + 256 + 256 * 4 + 4);
}

TEST_CASE("the Transformer language model predicts every next token causally",
          "[unit][models][numeric]") {
  const ModelContext ctx{{12}, kVocab, kVocab};
  auto model = build("transformer-lm", "{layers: 2, hidden: 32, heads: 4, dropout: 0}", ctx);
  const auto tokens = torch::randint(vflow::data::ByteTokenizer::kFirstByte, kVocab, {3, 12});
  {
    torch::NoGradGuard no_grad;
    const auto logits = model->forward(tokens);
    CHECK(logits.sizes() == torch::IntArrayRef({3, 12, kVocab}));
    // Causality: changing token 8 leaves the predictions at positions 0..7 unchanged.
    auto changed = tokens.clone();
    changed.select(1, 8).fill_(vflow::data::ByteTokenizer::kFirstByte + 1);
    const auto again = model->forward(changed);
    CHECK(torch::allclose(again.slice(1, 0, 8), logits.slice(1, 0, 8), 1e-5, 1e-6));
    CHECK_FALSE(torch::allclose(again.slice(1, 8, 12), logits.slice(1, 8, 12)));
  }
  const auto targets = torch::roll(tokens, -1, 1);
  check_learns(*model, tokens, targets, 3e-3);
}

TEST_CASE("models refuse data they cannot take, naming the key", "[unit][models]") {
  const ModelContext image{{1, 28, 28}, 10};
  const ModelContext text{{32}, 4, kVocab};
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(build("bert", "{preset: tiny}", image), Contains("needs token sequences"));
  CHECK_THROWS_WITH(build("transformer-lm", "{}", text),
                    Contains("the data's classes must be its vocabulary"));
  CHECK_THROWS_WITH(build("resnet", "{}", text), Contains("resnet needs image inputs"));
  CHECK_THROWS_WITH(build("convnet", "{}", text), Contains("convnet needs image inputs"));
  CHECK_THROWS_WITH(build("mlp", "{}", text), Contains("mlp needs float inputs"));
  CHECK_THROWS_WITH(build("resnet", "{depth: 20}", image), Contains("not one of 18, 34, 50, 101"));
  CHECK_THROWS_WITH(build("bert", "{hidden: 100, heads: 3}", text),
                    Contains("3 heads do not divide hidden size 100"));
  CHECK_THROWS_WITH(build("bert", "{preset: huge}", text), Contains("preset"));
  CHECK_THROWS_WITH(build("torchscript", "{path: /nonexistent/model.pt}", image),
                    Contains("/nonexistent/model.pt: no such file"));
}

TEST_CASE("a TorchScript model keeps its Python names and is checked against the data",
          "[integration][torchscript]") {
  vflow::testing::TempDir dir;
  const auto path = vflow::testing::export_torchscript("convnet", dir.file("convnet.pt"));
  auto model = build("torchscript", "{path: " + path + "}", {{1, 28, 28}, 10});
  std::vector<std::string> names;
  for (const auto& p : model->named_parameters()) names.push_back(p.key());
  CHECK(names.front() == "features.0.weight");
  CHECK(names.back() == "classifier.3.bias");
  std::vector<std::string> buffers;
  for (const auto& b : model->named_buffers()) buffers.push_back(b.key());
  CHECK(buffers == std::vector<std::string>{"features.1.running_mean", "features.1.running_var",
                                            "features.1.num_batches_tracked",
                                            "features.5.running_mean", "features.5.running_var",
                                            "features.5.num_batches_tracked"});
  check_learns(*model, torch::randn({4, 1, 28, 28}), torch::tensor({0, 1, 2, 3}), 1e-3);

  using Catch::Matchers::Contains;
  // Exported for 28x28 images with 10 classes: other data is refused before training.
  CHECK_THROWS_WITH(build("torchscript", "{path: " + path + "}", {{1, 28, 28}, 4}),
                    Contains("the data needs logits [n, 4]"));
  CHECK_THROWS_WITH(build("torchscript", "{path: " + path + "}", {{3, 32, 32}, 10}),
                    Contains("forward() fails on the data's inputs [n, 3, 32, 32]"));
  vflow::testing::write_file(dir.file("junk.pt"), "not a model");
  CHECK_THROWS_WITH(build("torchscript", "{path: " + dir.file("junk.pt") + "}", {{1, 28, 28}, 10}),
                    Contains("junk.pt: not a loadable TorchScript module"));
}
