// Transformer models over token inputs: a BERT-style encoder with a
// classification head, and a decoder-only (GPT-style) language model. Both use
// layer norm, which keeps no running statistics, so every worker computes it
// the same way without the stateful-kernel table; dropout draws from the
// generator vflow seeds per (seed, step, vnode).
#pragma once

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include "vflow/models/registry.h"

namespace vflow::models {

/// Sizes of a transformer stack.
struct TransformerOptions {
  int64_t layers = 2;        ///< transformer blocks
  int64_t hidden = 128;      ///< model width (embedding size)
  int64_t heads = 2;         ///< attention heads; must divide hidden
  int64_t intermediate = 0;  ///< feed-forward width; 0 = 4 x hidden
  double dropout = 0.1;      ///< on embeddings, attention weights and block outputs
};

/// BERT's published sizes (Turc et al. 2019 for the small ones): tiny (2 layers, 128
/// wide, 2 heads), mini (4, 256, 4), small (4, 512, 8), medium (8, 512, 8) and base
/// (12, 768, 12).
TransformerOptions bert_preset(const std::string& name);

/// Self-attention, feed-forward and two layer norms, in BERT's post-norm order or
/// the pre-norm order of GPT-2.
class TransformerBlockImpl : public torch::nn::Module {
 public:
  TransformerBlockImpl(const TransformerOptions& options, bool pre_norm);
  /// x [n, T, hidden]; `mask` is added to the attention scores ([T, T] or [n, 1, 1, T]).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask);

 private:
  torch::Tensor attend(const torch::Tensor& x, const torch::Tensor& mask);
  int64_t heads_;
  bool pre_norm_;
  torch::nn::Linear qkv_, out_, up_, down_;
  torch::nn::LayerNorm norm1_, norm2_;
  torch::nn::Dropout dropout_;
};
TORCH_MODULE(TransformerBlock);

/// Token and position embeddings followed by a stack of blocks.
class TransformerStackImpl : public torch::nn::Module {
 public:
  TransformerStackImpl(const TransformerOptions& options, int64_t vocab, int64_t positions,
                       bool pre_norm);
  torch::Tensor forward(const torch::Tensor& tokens, const torch::Tensor& mask);

 private:
  torch::nn::Embedding tokens_, positions_;
  torch::nn::LayerNorm norm_;  // after the embeddings (post-norm) or after the stack (pre-norm)
  torch::nn::Dropout dropout_;
  torch::nn::ModuleList blocks_;
  bool pre_norm_;
};
TORCH_MODULE(TransformerStack);

/// BERT-style encoder classifying a whole sequence from its first ([CLS]) position
/// through a tanh pooler. Padding tokens (id 0) are masked out of attention.
class BertClassifier final : public Model {
 public:
  BertClassifier(const TransformerOptions& options, const ModelContext& ctx);
  torch::Tensor forward(const torch::Tensor& tokens) override;

 private:
  TransformerStack encoder_{nullptr};
  torch::nn::Linear pooler_{nullptr}, classifier_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
};

/// Decoder-only language model: causal self-attention, logits for the next token at
/// every position ([n, T, vocab]).
class TransformerLm final : public Model {
 public:
  TransformerLm(const TransformerOptions& options, const ModelContext& ctx);
  torch::Tensor forward(const torch::Tensor& tokens) override;

 private:
  TransformerStack decoder_{nullptr};
  torch::nn::Linear head_{nullptr};
};

/// Registers "bert" and "transformer-lm" with their options' keys.
void register_transformers(ModelRegistry& registry);

}  // namespace vflow::models
