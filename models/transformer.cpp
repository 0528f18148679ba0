#include "vflow/models/transformer.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>

#include "core/spec_schema.h"

namespace vflow::models {

namespace nn = torch::nn;

namespace {
// Added to the attention scores of masked positions: large enough to vanish under
// softmax, finite so that a fully masked row cannot produce NaN.
constexpr double kMasked = -1e9;

int64_t intermediate_of(const TransformerOptions& o) {
  return o.intermediate > 0 ? o.intermediate : 4 * o.hidden;
}
}  // namespace

TransformerOptions bert_preset(const std::string& name) {
  struct Size {
    const char* name;
    int64_t layers, hidden, heads;
  };
  static constexpr Size kSizes[] = {{"tiny", 2, 128, 2},
                                    {"mini", 4, 256, 4},
                                    {"small", 4, 512, 8},
                                    {"medium", 8, 512, 8},
                                    {"base", 12, 768, 12}};
  TransformerOptions o;
  for (const auto& size : kSizes) {
    if (name == size.name) {
      o.layers = size.layers;
      o.hidden = size.hidden;
      o.heads = size.heads;
    }
  }
  return o;
}

TransformerBlockImpl::TransformerBlockImpl(const TransformerOptions& o, bool pre_norm)
    : heads_(o.heads),
      pre_norm_(pre_norm),
      qkv_(register_module("qkv", nn::Linear(o.hidden, 3 * o.hidden))),
      out_(register_module("out", nn::Linear(o.hidden, o.hidden))),
      up_(register_module("up", nn::Linear(o.hidden, intermediate_of(o)))),
      down_(register_module("down", nn::Linear(intermediate_of(o), o.hidden))),
      norm1_(register_module("norm1", nn::LayerNorm(nn::LayerNormOptions({o.hidden})))),
      norm2_(register_module("norm2", nn::LayerNorm(nn::LayerNormOptions({o.hidden})))),
      dropout_(register_module("dropout", nn::Dropout(o.dropout))) {}

torch::Tensor TransformerBlockImpl::attend(const torch::Tensor& x, const torch::Tensor& mask) {
  const int64_t n = x.size(0), t = x.size(1), width = x.size(2), head = width / heads_;
  auto qkv = qkv_->forward(x).view({n, t, 3, heads_, head}).permute({2, 0, 3, 1, 4});
  const auto q = qkv[0], k = qkv[1], v = qkv[2];  // [n, heads, T, head]
  auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head));
  if (mask.defined()) scores = scores + mask;
  auto weights = dropout_->forward(torch::softmax(scores, -1));
  auto y = torch::matmul(weights, v).transpose(1, 2).reshape({n, t, width});
  return out_->forward(y);
}

torch::Tensor TransformerBlockImpl::forward(const torch::Tensor& x, const torch::Tensor& mask) {
  auto feed_forward = [this](const torch::Tensor& h) {
    return down_->forward(torch::gelu(up_->forward(h)));
  };
  if (pre_norm_) {
    auto y = x + dropout_->forward(attend(norm1_->forward(x), mask));
    return y + dropout_->forward(feed_forward(norm2_->forward(y)));
  }
  auto y = norm1_->forward(x + dropout_->forward(attend(x, mask)));
  return norm2_->forward(y + dropout_->forward(feed_forward(y)));
}

TransformerStackImpl::TransformerStackImpl(const TransformerOptions& o, int64_t vocab,
                                           int64_t positions, bool pre_norm)
    : tokens_(register_module("tokens", nn::Embedding(vocab, o.hidden))),
      positions_(register_module("positions", nn::Embedding(positions, o.hidden))),
      norm_(register_module("norm", nn::LayerNorm(nn::LayerNormOptions({o.hidden})))),
      dropout_(register_module("dropout", nn::Dropout(o.dropout))),
      blocks_(register_module("blocks", nn::ModuleList())),
      pre_norm_(pre_norm) {
  for (int64_t i = 0; i < o.layers; ++i) blocks_->push_back(TransformerBlock(o, pre_norm));
  // BERT's and GPT-2's initialisation of embeddings: N(0, 0.02).
  torch::NoGradGuard no_grad;
  tokens_->weight.normal_(0.0, 0.02);
  positions_->weight.normal_(0.0, 0.02);
}

torch::Tensor TransformerStackImpl::forward(const torch::Tensor& tokens,
                                            const torch::Tensor& mask) {
  const auto where = torch::arange(tokens.size(1), tokens.options().dtype(torch::kInt64));
  auto x = tokens_->forward(tokens) + positions_->forward(where).unsqueeze(0);
  x = dropout_->forward(pre_norm_ ? x : norm_->forward(x));
  for (const auto& block : *blocks_) x = block->as<TransformerBlock>()->forward(x, mask);
  return pre_norm_ ? norm_->forward(x) : x;
}

BertClassifier::BertClassifier(const TransformerOptions& o, const ModelContext& ctx) {
  encoder_ = register_module(
      "encoder", TransformerStack(o, ctx.vocab_size, ctx.input_shape.at(0), /*pre_norm=*/false));
  pooler_ = register_module("pooler", nn::Linear(o.hidden, o.hidden));
  dropout_ = register_module("dropout", nn::Dropout(o.dropout));
  classifier_ = register_module("classifier", nn::Linear(o.hidden, ctx.num_classes));
}

torch::Tensor BertClassifier::forward(const torch::Tensor& tokens) {
  // Padding (id 0) is hidden from every query: [n, 1, 1, T] broadcasts over heads and queries.
  const auto mask =
      tokens.eq(0).to(torch::kFloat32).mul(kMasked).view({tokens.size(0), 1, 1, tokens.size(1)});
  const auto h = encoder_->forward(tokens, mask);
  const auto pooled = torch::tanh(pooler_->forward(h.select(1, 0)));
  return classifier_->forward(dropout_->forward(pooled));
}

TransformerLm::TransformerLm(const TransformerOptions& o, const ModelContext& ctx) {
  decoder_ = register_module(
      "decoder", TransformerStack(o, ctx.vocab_size, ctx.input_shape.at(0), /*pre_norm=*/true));
  head_ = register_module("head", nn::Linear(o.hidden, ctx.num_classes));
}

torch::Tensor TransformerLm::forward(const torch::Tensor& tokens) {
  const int64_t t = tokens.size(1);
  // Position i attends to positions 0..i only.
  const auto causal =
      torch::full({t, t}, kMasked, torch::TensorOptions().device(tokens.device())).triu(1);
  return head_->forward(decoder_->forward(tokens, causal));
}

namespace {

/// bert's options: a preset size, which the other keys override.
struct BertOptions : TransformerOptions {
  std::string preset = "tiny";  ///< the defaults above are tiny's
};

/// transformer-lm's options: the stack's defaults with 4 heads.
struct LmOptions : TransformerOptions {
  LmOptions() { heads = 4; }
};

/// The keys both models share; `sized` is the default column of the preset's keys.
template <class T>
void add_stack_keys(SpecSchema<T>& s, const char* sized) {
  auto layers = s.integer("layers", &T::layers, 1, 1024, "transformer blocks");
  auto hidden = s.integer("hidden", &T::hidden, 1, 1 << 16, "model width; `heads` must divide it");
  auto heads = s.integer("heads", &T::heads, 1, 1024, "attention heads");
  if (sized != nullptr) {
    layers.default_text(sized);
    hidden.default_text(sized);
    heads.default_text(sized);
  }
  s.integer("intermediate", &T::intermediate, 0, 1 << 20, "feed-forward width; 0 = 4 × hidden");
  s.real("dropout", &T::dropout, 0.0, 0.99, "on embeddings, attention weights and block outputs");
}

const SpecSchema<BertOptions>& bert_schema() {
  static const auto schema = [] {
    SpecSchema<BertOptions> s("bert");
    s.choice("preset", &BertOptions::preset, {"tiny", "mini", "small", "medium", "base"},
             "BERT sizes: `tiny` (2 layers, 128 wide, 2 heads), `mini` (4, 256, 4), `small` "
             "(4, 512, 8), `medium` (8, 512, 8), `base` (12, 768, 12); the keys below override "
             "it")
        .after([](OptionReader&, BertOptions& o) {
          static_cast<TransformerOptions&>(o) = bert_preset(o.preset);
        });
    add_stack_keys(s, "the preset's");
    return s;
  }();
  return schema;
}

const SpecSchema<LmOptions>& lm_schema() {
  static const auto schema = [] {
    SpecSchema<LmOptions> s("transformer-lm");
    add_stack_keys(s, nullptr);
    return s;
  }();
  return schema;
}

/// Refuses sizes that do not fit together and data that is not token sequences.
void check_transformer(OptionReader& opt, const TransformerOptions& o, const char* model,
                       const ModelContext& ctx) {
  if (o.hidden % o.heads != 0) {
    opt.fail("heads", fmt::format("{} heads do not divide hidden size {}", o.heads, o.hidden));
  }
  if (ctx.vocab_size <= 0 || ctx.input_shape.size() != 1) {
    opt.fail("layers",
             fmt::format("{} needs token sequences (a text data set such as "
                         "fortunes-langid or fortunes-lm); the data has {}",
                         model, ctx.vocab_size > 0 ? "tokens of another shape" : "float inputs"));
  }
}

ModelBuilder make_bert_factory(OptionReader& opt, const ModelContext& ctx) {
  BertOptions read;
  bert_schema().read(opt, read);
  const TransformerOptions o = read;
  check_transformer(opt, o, "bert", ctx);
  return [o, ctx] { return std::make_shared<BertClassifier>(o, ctx); };
}

ModelBuilder make_transformer_lm_factory(OptionReader& opt, const ModelContext& ctx) {
  LmOptions read;
  lm_schema().read(opt, read);
  const TransformerOptions o = read;
  check_transformer(opt, o, "transformer-lm", ctx);
  if (ctx.num_classes != ctx.vocab_size) {
    opt.fail("layers",
             "transformer-lm predicts the next token: the data's classes must be its "
             "vocabulary (a language-modelling data set such as fortunes-lm)");
  }
  return [o, ctx] { return std::make_shared<TransformerLm>(o, ctx); };
}

}  // namespace

void register_transformers(ModelRegistry& registry) {
  registry.add("bert",
               "a BERT-style post-norm encoder over token inputs, classifying from the first "
               "([start]) position through a tanh pooler; padding is masked out of attention",
               make_bert_factory, bert_schema().rows());
  registry.add("transformer-lm",
               "a decoder-only pre-norm language model with causal attention, logits for the "
               "next token at every position",
               make_transformer_lm_factory, lm_schema().rows());
}

}  // namespace vflow::models
