#include "vflow/engine/optimizer.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>

#include "core/torch_compat.h"
#include "engine/fused_update.h"
#include "engine/optimizer_archive.h"
#include "vflow/core/error.h"

namespace vflow::engine {

namespace {

/// An optimizer whose per-parameter state is a few tensors per parameter, kept in
/// parameter order and saved under "<name>.<index>": no dependence on how a LibTorch
/// version keys its own state map. LAMB and LARS of LibTorch's operations, for parameters
/// other than the CPU's float32 (the fused ones read and write the same format).
class LayerwiseOptimizer : public torch::optim::Optimizer {
 public:
  LayerwiseOptimizer(const std::vector<torch::Tensor>& params, double lr,
                     std::vector<std::string> state_names)
      : Optimizer({torch::optim::OptimizerParamGroup(params)},
                  std::make_unique<torch::optim::SGDOptions>(lr)),
        names_(std::move(state_names)) {}

  torch::Tensor step(LossClosure closure = nullptr) override {
    torch::NoGradGuard no_grad;
    const auto loss = evaluate_closure(closure);
    auto& group = param_groups().front();
    const double lr = group.options().get_lr();
    auto& params = group.params();
    if (state_.empty()) {
      state_.resize(params.size());
      for (size_t i = 0; i < params.size(); ++i) {
        for (size_t k = 0; k < names_.size(); ++k) {
          state_[i].push_back(torch::zeros_like(params[i], torch::MemoryFormat::Preserve));
        }
      }
    }
    ++steps_;
    for (size_t i = 0; i < params.size(); ++i) {
      auto& p = params[i];
      if (!p.grad().defined()) continue;
      update(p, p.grad(), state_[i], lr);
    }
    return loss;
  }

  void save(torch::serialize::OutputArchive& archive) const override {
    archive.write("steps", c10::IValue(steps_));
    for (size_t i = 0; i < state_.size(); ++i) {
      for (size_t k = 0; k < names_.size(); ++k) {
        archive.write(fmt::format("{}.{}", names_[k], i), state_[i][k], /*is_buffer=*/true);
      }
    }
  }

  void load(torch::serialize::InputArchive& archive) override {
    c10::IValue steps;
    archive.read("steps", steps);
    steps_ = steps.toInt();
    state_.clear();
    if (steps_ == 0) return;
    const auto& params = param_groups().front().params();
    state_.resize(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      for (size_t k = 0; k < names_.size(); ++k) {
        torch::Tensor t;
        archive.read(fmt::format("{}.{}", names_[k], i), t, /*is_buffer=*/true);
        if (!t.sizes().equals(params[i].sizes())) {
          throw CheckpointError(fmt::format("optimizer state {}.{} has shape {}, its parameter {}",
                                            names_[k], i, fmt::join(t.sizes(), "x"),
                                            fmt::join(params[i].sizes(), "x")));
        }
        state_[i].push_back(t.to(params[i].device()));
      }
    }
  }

 protected:
  /// One parameter's update at step steps_ (1-based), with its state tensors.
  virtual void update(torch::Tensor& p, const torch::Tensor& grad,
                      std::vector<torch::Tensor>& state, double lr) = 0;
  int64_t steps_ = 0;

 private:
  std::vector<std::string> names_;
  std::vector<std::vector<torch::Tensor>> state_;
};

/// A layer's trust ratio ‖a‖ / ‖b‖, 1 where either norm is 0 (a fresh zero layer, or no
/// gradient), as both papers do.
double trust_ratio(const torch::Tensor& a, const torch::Tensor& b) {
  const double na = a.norm().item<double>();
  const double nb = b.norm().item<double>();
  return na > 0 && nb > 0 ? na / nb : 1.0;
}

/// LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning", Algorithm 2):
/// Adam's bias-corrected direction r = m̂ / (√v̂ + ε), plus decoupled weight decay,
/// scaled per layer by ‖w‖ / ‖r + λw‖.
class Lamb : public LayerwiseOptimizer {
 public:
  Lamb(const std::vector<torch::Tensor>& params, const OptimizerSpec& spec)
      : LayerwiseOptimizer(params, spec.lr, {"exp_avg", "exp_avg_sq"}), spec_(spec) {}

 protected:
  void update(torch::Tensor& p, const torch::Tensor& grad, std::vector<torch::Tensor>& state,
              double lr) override {
    auto& m = state[0];
    auto& v = state[1];
    m.mul_(spec_.beta1).add_(grad, 1 - spec_.beta1);
    v.mul_(spec_.beta2).addcmul_(grad, grad, 1 - spec_.beta2);
    const double c1 = 1 - std::pow(spec_.beta1, static_cast<double>(steps_));
    const double c2 = 1 - std::pow(spec_.beta2, static_cast<double>(steps_));
    auto u = (m / c1).div_((v / c2).sqrt_().add_(spec_.eps));
    if (spec_.weight_decay > 0) u.add_(p, spec_.weight_decay);
    p.add_(u, -lr * trust_ratio(p, u));
  }

 private:
  OptimizerSpec spec_;
};

/// LARS (You et al. 2017, "Large Batch Training of Convolutional Networks", Algorithm 1):
/// a layer's rate is lr × η‖w‖ / (‖∇w‖ + β‖w‖); v = m·v + rate · (∇w + βw); w −= v.
/// Parameters of one dimension (biases, normalization weights) are, by default, left out
/// of both the trust ratio and the weight decay, as common practice does.
class Lars : public LayerwiseOptimizer {
 public:
  Lars(const std::vector<torch::Tensor>& params, const OptimizerSpec& spec)
      : LayerwiseOptimizer(params, spec.lr, {"momentum_buffer"}), spec_(spec) {}

 protected:
  void update(torch::Tensor& p, const torch::Tensor& grad, std::vector<torch::Tensor>& state,
              double lr) override {
    auto& buffer = state[0];
    const bool excluded = spec_.exclude_bias_and_norm && p.dim() <= 1;
    double rate = lr;
    torch::Tensor g = grad;
    if (!excluded) {
      const double wn = p.norm().item<double>();
      const double gn = grad.norm().item<double>();
      if (wn > 0 && gn > 0) {
        rate *= spec_.trust_coefficient * wn / (gn + spec_.weight_decay * wn);
      }
      if (spec_.weight_decay > 0) g = grad.add(p, spec_.weight_decay);
    }
    buffer.mul_(spec_.momentum).add_(g, rate);
    p.sub_(buffer);
  }

 private:
  OptimizerSpec spec_;
};

/// LibTorch's Adam, whose checkpoint state is read by each parameter's place
/// (engine/optimizer_archive.h), so that a checkpoint moves between LibTorch versions.
class Adam final : public torch::optim::Adam {
 public:
  using torch::optim::Adam::Adam;

  void load(torch::serialize::InputArchive& archive) override {
    std::vector<torch::Tensor> params;
    for (const auto& group : param_groups()) {
      params.insert(params.end(), group.params().begin(), group.params().end());
    }
    auto& states = state();
    states.clear();
    for_each_saved_state(
        archive, params.size(), [&](size_t i, torch::serialize::InputArchive& saved) {
          auto s = std::make_unique<torch::optim::AdamParamState>();
          s->serialize(saved);
          states[compat::optimizer_state_key<std::decay_t<decltype(states)>>(params[i])] =
              std::move(s);
        });
  }
};

}  // namespace

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const OptimizerSpec& spec,
                                                        const std::vector<torch::Tensor>& params,
                                                        int64_t canonical_shards) {
  // SGD and AdamW (LibTorch's arithmetic and format), and LAMB and LARS on the CPU: one
  // pass over flat buffers.
  if (auto fused = make_fused_optimizer(spec, params, canonical_shards)) return fused;
  if (spec.name == "adam") {
    auto options = torch::optim::AdamOptions(spec.lr)
                       .betas({spec.beta1, spec.beta2})
                       .eps(spec.eps)
                       .weight_decay(spec.weight_decay);
    return std::make_unique<Adam>(params, options);
  }
  if (spec.name == "lamb") return std::make_unique<Lamb>(params, spec);
  if (spec.name == "lars") return std::make_unique<Lars>(params, spec);
  throw SpecError("semantic.optimizer.name: unknown optimizer '" + spec.name +
                  "'; choices: sgd, adamw, adam, lamb, lars");
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace vflow::engine
