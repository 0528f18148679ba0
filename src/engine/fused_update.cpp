#include "engine/fused_update.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "core/torch_compat.h"
#include "engine/optimizer_archive.h"
#include "engine/update_kernels.h"
#include "vflow/core/error.h"
#include "vflow/vnode/gradient_buffer.h"

namespace vflow::engine {

namespace {

constexpr int64_t kChunk = int64_t{1} << 14;  // elements per parallel task

/// f(begin, end) over chunks of [0, n), in parallel.
template <typename F>
void for_chunks(int64_t n, F f) {
  at::parallel_for(0, (n + kChunk - 1) / kChunk, 1, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) f(c * kChunk, std::min(n, (c + 1) * kChunk));
  });
}

bool cpu_float(const torch::Tensor& t) {
  return t.device().is_cpu() && t.scalar_type() == torch::kFloat32 && t.is_contiguous();
}

/// A step's gradient: flat floats, or deterministic mode's reduced sum.
struct Gradient {
  torch::Tensor values;  // when reduced is null
  const vnode::FixedPointSum::Reduced* reduced = nullptr;
  bool rounding = false;  // values are rounded to multiples of 2^-36 as they are read

  /// The float gradient is on the CPU, or the gradient is a reduced sum.
  bool on_cpu() const { return reduced != nullptr || cpu_float(values); }

  /// f(begin, end, source) over [0, n) in parallel chunks, `source` the gradients of
  /// [begin, end) as an update kernel takes them: for floats a `const float*` a chunk
  /// (RoundedGradients where they are rounded as they are read); for a reduced sum runs
  /// of ReducedGradients between the listed elements, and each listed element alone as
  /// a `const float*` to its float.
  template <typename F>
  void for_runs(int64_t n, F f) const {
    if (reduced == nullptr) {
      const float* g = values.data_ptr<float>();
      for_chunks(n, [&](int64_t b, int64_t e) {
        if (rounding) {
          f(b, e, RoundedGradients{g + b});
        } else {
          f(b, e, g + b);
        }
      });
      return;
    }
    const auto& r = *reduced;
    VFLOW_ASSERT(r.numel == n, "a reduced gradient of another size");
    const auto dense = [&](int64_t at) {
      return ReducedGradients{r.dense + at, vnode::FixedPointSum::Reduced::kUnit};
    };
    for_chunks(n, [&](int64_t b, int64_t e) {
      auto k = static_cast<size_t>(std::lower_bound(r.index.begin(), r.index.end(), b) -
                                   r.index.begin());
      int64_t at = b;
      for (; k < r.index.size() && r.index[k] < e; ++k) {
        const int64_t i = r.index[k];
        if (at < i) f(at, i, dense(at));
        f(i, i + 1, &r.listed[k]);
        at = i + 1;
      }
      if (at < e) f(at, e, dense(at));
    });
  }
};

// ---- flat parameters -----------------------------------------------------------------

/// The trainable parameters as views into one flat buffer, laid out as the gradient
/// buffer lays out their gradients (vnode::FlatLayout).
class FlatParameters {
 public:
  explicit FlatParameters(const std::vector<torch::Tensor>& all)
      : layout_(all),
        flat_(torch::empty({layout_.numel},
                           layout_.parameters.front().options().requires_grad(false))) {
    bind();
  }

  /// Makes every parameter a view into the buffer again, copying in the values of those
  /// that were given storage of their own (a checkpoint's load replaces it).
  void bind() {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < layout_.parameters.size(); ++i) {
      auto& p = layout_.parameters[i];
      if (is_view(i)) continue;
      auto slot = part(flat_, i);
      slot.copy_(p.detach());
      p.set_(flat_.storage(), flat_.storage_offset() + layout_.offsets[i], p.sizes(),
             slot.strides());
    }
  }

  /// The gradients as one flat tensor when they are one buffer in the parameters' order
  /// (the step packet's gradient section), else undefined.
  torch::Tensor flat_gradients() const {
    const auto& g0 = layout_.parameters.front().grad();
    if (!g0.defined() || g0.scalar_type() != flat_.scalar_type() || g0.device() != flat_.device()) {
      return {};
    }
    for (size_t i = 0; i < layout_.parameters.size(); ++i) {
      if (!contiguous_at(layout_.parameters[i].grad(), g0.data_ptr(), i)) return {};
    }
    return torch::empty({0}, g0.options())
        .set_(g0.storage(), g0.storage_offset(), {flat_.numel()}, {1});
  }

  /// The gradients copied into one flat tensor. Every trainable parameter must have one:
  /// LibTorch's optimizers skip a parameter without, which one pass over all cannot.
  /// The engine's gradient buffer gives each a view, so it never lacks one.
  torch::Tensor gathered_gradients() const {
    auto out = torch::empty_like(flat_);
    for (size_t i = 0; i < layout_.parameters.size(); ++i) {
      const auto& g = layout_.parameters[i].grad();
      VFLOW_ASSERT(g.defined(), fmt::format("the fused update has no gradient of parameter {}", i));
      part(out, i).copy_(g);
    }
    return out;
  }

  const std::vector<torch::Tensor>& params() const { return layout_.parameters; }
  torch::Tensor& flat() { return flat_; }
  /// Parameter i's range of a flat tensor laid out like the parameters.
  torch::Tensor part(const torch::Tensor& flat, size_t i) const {
    return flat.narrow(0, layout_.offsets[i], layout_.parameters[i].numel())
        .view(layout_.parameters[i].sizes());
  }

 private:
  /// `t` is contiguous and starts at parameter i's offset in the buffer at `base`.
  bool contiguous_at(const torch::Tensor& t, const void* base, size_t i) const {
    return layout_.at_offset(t, base, i) && t.is_contiguous();
  }
  bool is_view(size_t i) const { return contiguous_at(layout_.parameters[i], flat_.data_ptr(), i); }

  vnode::FlatLayout layout_;
  torch::Tensor flat_;
};

// ---- the optimizers --------------------------------------------------------------------

/// An optimizer whose update is one pass over flat buffers. `Reference` is LibTorch's
/// optimizer of the same arithmetic: it defines the checkpoint format (save goes through
/// one built for the purpose; load reads each parameter's `State` by its place,
/// engine/optimizer_archive.h) and its options are this optimizer's.
template <typename Reference, typename Options, typename State>
class FusedOptimizer : public torch::optim::Optimizer, public FixedPointStep {
 public:
  FusedOptimizer(const std::vector<torch::Tensor>& params, const Options& options,
                 int state_tensors)
      : Optimizer({torch::optim::OptimizerParamGroup(params)}, std::make_unique<Options>(options)),
        all_params_(params),
        flat_(params) {
    for (int k = 0; k < state_tensors; ++k) state_.push_back(torch::zeros_like(flat_.flat()));
  }

  torch::Tensor step(LossClosure closure = nullptr) override {
    torch::NoGradGuard no_grad;
    const auto loss = evaluate_closure(closure);
    flat_.bind();
    auto gradients = flat_.flat_gradients();
    if (!gradients.defined()) gradients = flat_.gathered_gradients();
    update(flat_.flat(), Gradient{gradients}, options().get_lr());
    ++steps_;
    return loss;
  }

  void step_rounding() override {
    torch::NoGradGuard no_grad;
    flat_.bind();
    const auto gradients = flat_.flat_gradients();
    VFLOW_ASSERT(cpu_float(flat_.flat()) && gradients.defined() && cpu_float(gradients),
                 "a rounding step of parameters or gradients not one float32 buffer on the CPU");
    update(flat_.flat(), Gradient{gradients, nullptr, /*rounding=*/true}, options().get_lr());
    ++steps_;
  }

  void step_fixed_point(const vnode::FixedPointSum::Reduced& g) override {
    torch::NoGradGuard no_grad;
    flat_.bind();
    VFLOW_ASSERT(cpu_float(flat_.flat()),
                 "a fixed-point step of parameters not float32 on the CPU");
    update(flat_.flat(), Gradient{{}, &g}, options().get_lr());
    ++steps_;
  }

  void save(torch::serialize::OutputArchive& archive) const override {
    auto reference = make_reference();
    if (steps_ > 0 && !state_.empty()) {
      auto& state = reference.state();
      for (size_t i = 0; i < flat_.params().size(); ++i) {
        const auto& p = flat_.params()[i];
        state[compat::optimizer_state_key<std::decay_t<decltype(state)>>(p)] = saved_state(i);
      }
    }
    reference.save(archive);
  }

  void load(torch::serialize::InputArchive& archive) override {
    steps_ = 0;
    for (auto& s : state_) s.zero_();
    // The archive lists every parameter; the update holds the trainable ones.
    const auto& trainable = flat_.params();
    std::vector<int64_t> place(all_params_.size(), -1);
    for (size_t i = 0; i < trainable.size(); ++i) {
      for (size_t j = 0; j < all_params_.size(); ++j) {
        if (all_params_[j].unsafeGetTensorImpl() == trainable[i].unsafeGetTensorImpl()) {
          place[j] = static_cast<int64_t>(i);
        }
      }
    }
    std::vector<bool> restored(trainable.size(), false);
    bool any = false;  // a state was restored
    for_each_saved_state(
        archive, all_params_.size(), [&](size_t j, torch::serialize::InputArchive& saved) {
          if (place[j] < 0) return;
          const auto i = static_cast<size_t>(place[j]);
          State state;
          state.serialize(saved);
          const int64_t steps = restore_state(i, state);
          if (any && steps != steps_) {
            throw CheckpointError(fmt::format(
                "the optimizer state of parameter {} is at step {}, not {}", i, steps, steps_));
          }
          steps_ = steps;
          restored[i] = any = true;
        });
    // A fresh optimizer's archive holds no state at all; any other holds every parameter's.
    const auto missing = std::find(restored.begin(), restored.end(), false);
    if (any && missing != restored.end()) {
      throw CheckpointError(
          fmt::format("the optimizer state has no entry for trainable parameter {}",
                      missing - restored.begin()));
    }
  }

 protected:
  /// The update of every element: `p` and `g` are flat, state_ is laid out alike;
  /// steps_ updates were applied before this one.
  virtual void update(torch::Tensor& p, const Gradient& g, double lr) = 0;
  /// Parameter i's state as LibTorch's optimizer keeps it.
  virtual std::unique_ptr<torch::optim::OptimizerParamState> saved_state(size_t i) const = 0;
  /// Copies LibTorch's state of parameter i into state_; returns its step count.
  virtual int64_t restore_state(size_t i, const torch::optim::OptimizerParamState& s) = 0;

  const Options& options() const {
    return static_cast<const Options&>(param_groups().front().options());
  }
  /// Parameter i's part of state tensor k, as a tensor of its own (for a checkpoint).
  torch::Tensor state_of(size_t i, int k) const { return flat_.part(state_[k], i).clone(); }
  /// Copies `t` into parameter i's part of state tensor k, checking its shape.
  void restore(size_t i, int k, const torch::Tensor& t, const char* name) {
    const auto& p = flat_.params()[i];
    if (!t.defined() || !t.sizes().equals(p.sizes())) {
      throw CheckpointError(fmt::format(
          "optimizer state {} of parameter {} has shape {}, its parameter {}", name, i,
          t.defined() ? fmt::format("{}", fmt::join(t.sizes(), "x")) : std::string("(none)"),
          fmt::join(p.sizes(), "x")));
    }
    flat_.part(state_[k], i).copy_(t);
  }

  std::vector<torch::Tensor> state_;  // flat, laid out like the parameters
  int64_t steps_ = 0;

 private:
  Reference make_reference() const { return Reference(all_params_, options()); }

  std::vector<torch::Tensor> all_params_;
  FlatParameters flat_;
};

class FusedSgd final : public FusedOptimizer<torch::optim::SGD, torch::optim::SGDOptions,
                                             torch::optim::SGDParamState> {
 public:
  FusedSgd(const std::vector<torch::Tensor>& params, const torch::optim::SGDOptions& options)
      : FusedOptimizer(params, options, /*state_tensors=*/options.momentum() != 0 ? 1 : 0) {}

 protected:
  void update(torch::Tensor& p, const Gradient& gradient, double lr) override {
    const auto& o = options();
    const SgdScalars s{static_cast<float>(-lr),
                       static_cast<float>(o.weight_decay()),
                       static_cast<float>(o.momentum()),
                       static_cast<float>(1 - o.dampening()),
                       o.weight_decay() != 0,
                       o.momentum() != 0,
                       o.nesterov(),
                       steps_ == 0};
    if (cpu_float(p) && gradient.on_cpu()) {
      float* pp = p.data_ptr<float>();
      float* bp = s.use_momentum ? state_[0].data_ptr<float>() : nullptr;
      gradient.for_runs(p.numel(), [&](int64_t b, int64_t e, auto g) {
        sgd_kernel(pp + b, g, bp ? bp + b : nullptr, e - b, s);
      });
      return;
    }
    const auto& g = gradient.values;
    // Other devices and types: LibTorch's operations over the whole buffer.
    auto d = s.decay ? g.add(p, o.weight_decay()) : g;
    if (s.use_momentum) {
      auto& buf = state_[0];
      if (s.first) {
        buf.copy_(d);
      } else {
        buf.mul_(o.momentum()).add_(d, 1 - o.dampening());
      }
      d = s.nesterov ? d.add(buf, o.momentum()) : buf;
    }
    p.add_(d, -lr);
  }

  std::unique_ptr<torch::optim::OptimizerParamState> saved_state(size_t i) const override {
    auto s = std::make_unique<torch::optim::SGDParamState>();
    s->momentum_buffer(state_of(i, 0));
    return s;
  }

  int64_t restore_state(size_t i, const torch::optim::OptimizerParamState& state) override {
    restore(i, 0, static_cast<const torch::optim::SGDParamState&>(state).momentum_buffer(),
            "momentum_buffer");
    return 1;  // LibTorch's SGD counts no steps: any state means the first step is past
  }
};

class FusedAdamW final : public FusedOptimizer<torch::optim::AdamW, torch::optim::AdamWOptions,
                                               torch::optim::AdamWParamState> {
 public:
  FusedAdamW(const std::vector<torch::Tensor>& params, const torch::optim::AdamWOptions& options)
      : FusedOptimizer(params, options, /*state_tensors=*/2) {
    VFLOW_ASSERT(!options.amsgrad(), "the fused AdamW has no amsgrad variant");
  }

 protected:
  void update(torch::Tensor& p, const Gradient& gradient, double lr) override {
    const auto& o = options();
    const double beta1 = std::get<0>(o.betas());
    const double beta2 = std::get<1>(o.betas());
    const auto t = static_cast<double>(steps_ + 1);
    const double correction1 = 1 - std::pow(beta1, t);
    const double correction2 = 1 - std::pow(beta2, t);
    const double step_size = lr / correction1;
    auto& m = state_[0];
    auto& v = state_[1];
    if (cpu_float(p) && gradient.on_cpu()) {
      const AdamWScalars s{static_cast<float>(1 - lr * o.weight_decay()),
                           static_cast<float>(beta1),
                           static_cast<float>(1 - beta1),
                           static_cast<float>(beta2),
                           static_cast<float>(1 - beta2),
                           static_cast<float>(std::sqrt(correction2)),
                           static_cast<float>(o.eps()),
                           static_cast<float>(-step_size),
                           o.weight_decay() != 0};
      float* pp = p.data_ptr<float>();
      float* mp = m.data_ptr<float>();
      float* vp = v.data_ptr<float>();
      gradient.for_runs(p.numel(), [&](int64_t b, int64_t e, auto g) {
        adamw_kernel(pp + b, g, mp + b, vp + b, e - b, s);
      });
      return;
    }
    const auto& g = gradient.values;
    if (o.weight_decay() != 0) p.mul_(1 - lr * o.weight_decay());
    m.mul_(beta1).add_(g, 1 - beta1);
    v.mul_(beta2).addcmul_(g, g, 1 - beta2);
    const auto denom = (v.sqrt() / std::sqrt(correction2)).add_(o.eps());
    p.addcdiv_(m, denom, -step_size);
  }

  std::unique_ptr<torch::optim::OptimizerParamState> saved_state(size_t i) const override {
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->step(steps_);
    s->exp_avg(state_of(i, 0));
    s->exp_avg_sq(state_of(i, 1));
    return s;
  }

  int64_t restore_state(size_t i, const torch::optim::OptimizerParamState& state) override {
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(state);
    restore(i, 0, s.exp_avg(), "exp_avg");
    restore(i, 1, s.exp_avg_sq(), "exp_avg_sq");
    return s.step();
  }
};

}  // namespace

std::unique_ptr<torch::optim::Optimizer> make_fused_optimizer(
    const OptimizerSpec& spec, const std::vector<torch::Tensor>& params) {
  if (spec.name == "sgd") {
    return std::make_unique<FusedSgd>(params, torch::optim::SGDOptions(spec.lr)
                                                  .momentum(spec.momentum)
                                                  .dampening(spec.dampening)
                                                  .nesterov(spec.nesterov)
                                                  .weight_decay(spec.weight_decay));
  }
  if (spec.name == "adamw") {
    return std::make_unique<FusedAdamW>(params, torch::optim::AdamWOptions(spec.lr)
                                                    .betas({spec.beta1, spec.beta2})
                                                    .eps(spec.eps)
                                                    .weight_decay(spec.weight_decay));
  }
  return nullptr;
}

}  // namespace vflow::engine
