#include "engine/fused_update.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <optional>

#include "core/torch_compat.h"
#include "engine/optimizer_archive.h"
#include "engine/update_kernels.h"
#include "vflow/core/error.h"
#include "vflow/vnode/gradient_buffer.h"

namespace vflow::engine {

namespace {

constexpr int64_t kChunk = int64_t{1} << 14;  // elements per parallel task

/// f(begin, end) over chunks of [lo, hi), in parallel.
template <typename F>
void for_chunks(int64_t lo, int64_t hi, F f) {
  at::parallel_for(0, (hi - lo + kChunk - 1) / kChunk, 1, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) f(lo + c * kChunk, std::min(hi, lo + (c + 1) * kChunk));
  });
}

bool cpu_float(const torch::Tensor& t) {
  return t.device().is_cpu() && t.scalar_type() == torch::kFloat32 && t.is_contiguous();
}

/// n gradients from a source of Gradient::runs, written out as floats.
void read_into(float* out, const float* g, int64_t n) { std::copy_n(g, n, out); }
template <typename Source>
void read_into(float* out, Source g, int64_t n) {
  read_gradients(out, g, n);
}

/// A step's gradient: flat floats, or deterministic mode's reduced sum.
struct Gradient {
  torch::Tensor values;  // when reduced is null
  const vnode::FixedPointSum::Reduced* reduced = nullptr;
  bool rounding = false;  // values are rounded to multiples of 2^-36 as they are read

  /// The float gradient is on the CPU, or the gradient is a reduced sum.
  bool on_cpu() const { return reduced != nullptr || cpu_float(values); }

  /// f(begin, end, source) over [lo, hi) in parallel chunks, `source` the gradients of
  /// [begin, end) as an update kernel takes them: for floats a `const float*` a chunk
  /// (RoundedGradients where they are rounded as they are read); for a reduced sum runs
  /// of ReducedGradients between the listed elements, and each listed element alone as
  /// a `const float*` to its float.
  template <typename F>
  void for_runs(int64_t lo, int64_t hi, F f) const {
    VFLOW_ASSERT(reduced == nullptr || hi <= reduced->numel, "a reduced gradient of another size");
    for_chunks(lo, hi, [&](int64_t b, int64_t e) { runs(b, e, f); });
  }

  /// for_runs over [b, e) in this thread, as one chunk.
  template <typename F>
  void runs(int64_t b, int64_t e, F f) const {
    if (reduced == nullptr) {
      const float* g = values.data_ptr<float>();
      if (rounding) {
        f(b, e, RoundedGradients{g + b});
      } else {
        f(b, e, g + b);
      }
      return;
    }
    const auto& r = *reduced;
    const auto dense = [&](int64_t at) {
      return ReducedGradients{r.dense + at, vnode::FixedPointSum::Reduced::kUnit};
    };
    auto k =
        static_cast<size_t>(std::lower_bound(r.index.begin(), r.index.end(), b) - r.index.begin());
    int64_t at = b;
    for (; k < r.index.size() && r.index[k] < e; ++k) {
      const int64_t i = r.index[k];
      if (at < i) f(at, i, dense(at));
      f(i, i + 1, &r.listed[k]);
      at = i + 1;
    }
    if (at < e) f(at, e, dense(at));
  }

  /// The float gradients of [b, e) as the kernels read them: in place where they are
  /// plain floats, else written into `scratch`.
  const float* floats(int64_t b, int64_t e, std::vector<float>& scratch) const {
    if (reduced == nullptr && !rounding) return values.data_ptr<float>() + b;
    scratch.resize(static_cast<size_t>(e - b));
    runs(b, e, [&](int64_t rb, int64_t re, auto source) {
      read_into(scratch.data() + (rb - b), source, re - rb);
    });
    return scratch.data();
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
  /// Parameter i's range of the flat buffer.
  vnode::FlatRange range(size_t i) const {
    return {layout_.offsets[i], layout_.offsets[i] + layout_.parameters[i].numel()};
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
/// engine/optimizer_archive.h) and its options are this optimizer's. Its state is flat,
/// laid out like the parameters, or kept by canonical shard (ShardedState).
template <typename Reference, typename Options, typename State>
class FusedOptimizer : public torch::optim::Optimizer, public FixedPointStep, public ShardedState {
 public:
  FusedOptimizer(const std::vector<torch::Tensor>& params, const Options& options,
                 int state_tensors)
      : Optimizer({torch::optim::OptimizerParamGroup(params)}, std::make_unique<Options>(options)),
        state_tensors_(state_tensors),
        all_params_(params),
        flat_(params) {}

  torch::Tensor step(LossClosure closure = nullptr) override {
    torch::NoGradGuard no_grad;
    const auto loss = evaluate_closure(closure);
    flat_.bind();
    auto gradients = flat_.flat_gradients();
    if (!gradients.defined()) gradients = flat_.gathered_gradients();
    update_all(Gradient{gradients}, options().get_lr());
    return loss;
  }

  void step_rounding() override {
    torch::NoGradGuard no_grad;
    flat_.bind();
    const auto gradients = flat_.flat_gradients();
    VFLOW_ASSERT(cpu_float(flat_.flat()) && gradients.defined() && cpu_float(gradients),
                 "a rounding step of parameters or gradients not one float32 buffer on the CPU");
    update_all(Gradient{gradients, nullptr, /*rounding=*/true}, options().get_lr());
  }

  void step_fixed_point(const vnode::FixedPointSum::Reduced& g) override {
    torch::NoGradGuard no_grad;
    flat_.bind();
    VFLOW_ASSERT(cpu_float(flat_.flat()),
                 "a fixed-point step of parameters not float32 on the CPU");
    update_all(Gradient{{}, &g}, options().get_lr());
  }

  void save(torch::serialize::OutputArchive& archive) const override {
    auto reference = make_reference();
    if (steps_ > 0 && state_tensors_ > 0) {
      if (layout_) {
        const auto held_now = held();
        VFLOW_ASSERT(static_cast<int64_t>(held_now.size()) == layout_->shards(),
                     "a sharded optimizer state saved before it was gathered whole");
      }
      auto& state = reference.state();
      for (size_t i = 0; i < flat_.params().size(); ++i) {
        const auto& p = flat_.params()[i];
        state[compat::optimizer_state_key<std::decay_t<decltype(state)>>(p)] = saved_state(i);
      }
    }
    reference.save(archive);
  }

  void load(torch::serialize::InputArchive& archive) override {
    reset_state();
    // The archive lists every parameter; the update holds the trainable ones.
    const auto& trainable = flat_.params();
    const auto place = places();
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

  // ---- ShardedState ----

  void shard_by(const vnode::ShardLayout& layout) override {
    VFLOW_ASSERT(layout.numel() == flat_.flat().numel(),
                 "a shard layout of another size than the parameters");
    VFLOW_ASSERT(steps_ == 0, "the optimizer state sharded after a step");
    layout_.emplace(layout);
    state_.clear();
    shards_.clear();
  }
  const vnode::ShardLayout& layout() const override { return *layout_; }
  void set_kept(std::vector<int64_t> kept) override { kept_ = std::move(kept); }
  const std::vector<int64_t>& kept() const override { return kept_; }
  std::vector<int64_t> held() const override {
    std::vector<int64_t> out;
    for (const auto& [s, t] : shards_) out.push_back(s);
    return out;
  }
  torch::Tensor shard(int64_t s) const override { return shards_.at(s); }
  void set_shard(int64_t s, torch::Tensor packed) override {
    VFLOW_ASSERT(packed.dim() == 2 && packed.size(0) == state_tensors_ &&
                     packed.size(1) == layout_->shard(s).numel(),
                 "a shard's state of another shape");
    shards_[s] = std::move(packed);
  }
  void trim() override {
    for (auto it = shards_.begin(); it != shards_.end();) {
      it = std::binary_search(kept_.begin(), kept_.end(), it->first) ? std::next(it)
                                                                     : shards_.erase(it);
    }
  }
  void drop_all() override {
    shards_.clear();
    pending_ = nullptr;
    steps_ = 0;
  }
  void read_pending() override {
    if (!pending_) return;
    for (const int64_t s : kept_) set_shard(s, pending_(s).to(flat_.flat().options()).contiguous());
    pending_ = nullptr;
  }
  void start_fresh() override {
    for (const int64_t s : kept_) {
      shards_[s] =
          torch::zeros({state_tensors_, layout_->shard(s).numel()}, flat_.flat().options());
    }
  }
  int64_t state_tensors() const override { return state_tensors_; }
  int64_t steps() const override { return steps_; }
  void set_steps(int64_t steps) override { steps_ = steps; }
  int64_t held_bytes() const override {
    int64_t bytes = 0;
    for (const auto& [s, t] : shards_) bytes += t.numel() * t.element_size();
    for (const auto& t : state_) bytes += t.numel() * t.element_size();
    return bytes;
  }
  double lr() const override { return options().get_lr(); }
  void set_lr(double lr) override { param_groups().front().options().set_lr(lr); }
  torch::Tensor flat_parameters() override {
    flat_.bind();
    return flat_.flat();
  }
  void load_shards(const vnode::ShardLayout& layout, int64_t steps,
                   const std::function<torch::Tensor(int64_t)>& read) override {
    VFLOW_ASSERT(layout.numel() == flat_.flat().numel(),
                 "a checkpoint's shards of another size than the parameters");
    VFLOW_ASSERT(!layout_ || layout_->shards() == layout.shards(),
                 "a checkpoint's shards of another layout than the job's");
    if (layout_) {
      // Read once the group's layout is known (read_pending): a worker that loads the
      // checkpoint before it joins keeps every shard until then, which need not fit.
      shards_.clear();
      steps_ = steps;
      pending_ = steps > 0 ? read : nullptr;
      return;
    }
    reset_state();
    if (steps == 0) return;
    for (int64_t s = 0; s < layout.shards(); ++s) {
      const auto r = layout.shard(s);
      const auto packed = read(s);
      for (int k = 0; k < state_tensors_; ++k) {
        state_[k].narrow(0, r.begin, r.numel()).copy_(packed[k]);
      }
    }
    steps_ = steps;
  }
  void set_owned(std::vector<int64_t> owned) override { owned_ = std::move(owned); }
  void set_exchange(Exchange exchange) override { exchange_ = std::move(exchange); }
  bool exchanges() const override { return false; }

 protected:
  /// A range [lo, hi) of the flat parameters that a step updates, with its state: each
  /// of `state` covers [lo, hi).
  struct Part {
    int64_t lo = 0;
    int64_t hi = 0;
    std::vector<torch::Tensor> state;
  };
  /// The update of `parts` (every element, or the held shards'): `p` and `g` are flat;
  /// steps_ updates were applied before this one.
  virtual void update_parts(torch::Tensor& p, const Gradient& g, double lr,
                            std::vector<Part>& parts) = 0;
  /// Parameter i's state as LibTorch's optimizer keeps it.
  virtual std::unique_ptr<torch::optim::OptimizerParamState> saved_state(size_t i) const = 0;
  /// Copies LibTorch's state of parameter i into the state; returns its step count.
  virtual int64_t restore_state(size_t i, const torch::optim::OptimizerParamState& s) = 0;

  const Options& options() const {
    return static_cast<const Options&>(param_groups().front().options());
  }
  /// Parameter i's part of state tensor k, as a tensor of its own (for a checkpoint).
  torch::Tensor state_of(size_t i, int k) const {
    if (!layout_) return flat_.part(state_[k], i).clone();
    const auto& p = flat_.params()[i];
    auto out = torch::empty({p.numel()}, p.options().requires_grad(false));
    for_shards_of(i, [&](const vnode::FlatRange& at, const torch::Tensor& shard, int64_t from) {
      out.narrow(0, at.begin, at.numel()).copy_(shard[k].narrow(0, from, at.numel()));
    });
    return out.view(p.sizes());
  }
  /// Copies `t` into parameter i's part of state tensor k (of the kept shards, where
  /// sharded), checking its shape.
  void restore(size_t i, int k, const torch::Tensor& t, const char* name) {
    const auto& p = flat_.params()[i];
    if (!t.defined() || !t.sizes().equals(p.sizes())) {
      throw CheckpointError(fmt::format(
          "optimizer state {} of parameter {} has shape {}, its parameter {}", name, i,
          t.defined() ? fmt::format("{}", fmt::join(t.sizes(), "x")) : std::string("(none)"),
          fmt::join(p.sizes(), "x")));
    }
    if (!layout_) {
      flat_.part(state_[k], i).copy_(t);
      return;
    }
    const auto flat = t.reshape({-1});
    for_shards_of(i, [&](const vnode::FlatRange& at, const torch::Tensor& shard, int64_t from) {
      shard[k].narrow(0, from, at.numel()).copy_(flat.narrow(0, at.begin, at.numel()));
    });
  }

  /// No state, at step 0: the kept shards' state zero where sharded (a load starts so).
  void reset_state() {
    steps_ = 0;
    if (layout_) {
      shards_.clear();
      start_fresh();
    } else {
      allocate_flat();
      for (auto& s : state_) s.zero_();
    }
  }
  /// For each parameter the optimizer was given, its index among the trainable ones
  /// (which the update holds), -1 for one that is not trainable.
  std::vector<int64_t> places() const {
    const auto& trainable = flat_.params();
    std::vector<int64_t> place(all_params_.size(), -1);
    for (size_t i = 0; i < trainable.size(); ++i) {
      for (size_t j = 0; j < all_params_.size(); ++j) {
        if (all_params_[j].unsafeGetTensorImpl() == trainable[i].unsafeGetTensorImpl()) {
          place[j] = static_cast<int64_t>(i);
        }
      }
    }
    return place;
  }
  const std::vector<torch::Tensor>& all_params() const { return all_params_; }
  const std::vector<torch::Tensor>& trainable() const { return flat_.params(); }
  vnode::FlatRange range_of(size_t i) const { return flat_.range(i); }
  /// The canonical shards, where the state is kept by them.
  const std::optional<vnode::ShardLayout>& sharded() const { return layout_; }
  const std::vector<int64_t>& owned() const { return owned_; }
  const Exchange& exchange() const { return exchange_; }

  int64_t steps_ = 0;

 private:
  Reference make_reference() const { return Reference(all_params_, options()); }

  /// The flat state, zero, where it is not allocated yet (allocated at first use, so that
  /// a sharded optimizer never holds it).
  void allocate_flat() {
    if (static_cast<int>(state_.size()) == state_tensors_) return;
    state_.clear();
    for (int k = 0; k < state_tensors_; ++k) state_.push_back(torch::zeros_like(flat_.flat()));
  }

  /// One step over every element this worker updates: all of them, or the held shards'.
  void update_all(const Gradient& g, double lr) {
    auto& p = flat_.flat();
    std::vector<Part> parts;
    if (!layout_) {
      allocate_flat();
      parts.push_back({0, p.numel(), state_});
    } else {
      // Before the first step every shard's state is zero (made here, after the first
      // backward pass, as the flat state is, rather than beside its activations).
      if (steps_ == 0 && shards_.empty()) start_fresh();
      for (auto& [s, packed] : shards_) {
        const auto r = layout_->shard(s);
        auto& part = parts.emplace_back(Part{r.begin, r.end, {}});
        for (int k = 0; k < state_tensors_; ++k) part.state.push_back(packed[k]);
      }
    }
    update_parts(p, g, lr, parts);
    ++steps_;
  }

  /// f(at, shard, from) for each held shard that overlaps parameter i: `at` the overlap
  /// relative to the parameter's start, `from` its start within the shard.
  template <typename F>
  void for_shards_of(size_t i, F f) const {
    const auto r = flat_.range(i);
    for (const auto& [s, packed] : shards_) {
      const auto sh = layout_->shard(s);
      const int64_t b = std::max(r.begin, sh.begin);
      const int64_t e = std::min(r.end, sh.end);
      if (b < e) f(vnode::FlatRange{b - r.begin, e - r.begin}, packed, b - sh.begin);
    }
  }

  const int state_tensors_;
  std::vector<torch::Tensor> state_;          // flat, laid out like the parameters (unsharded)
  std::optional<vnode::ShardLayout> layout_;  // sharded: the canonical shards
  std::vector<int64_t> kept_;                 // sharded: the shards this worker keeps
  std::map<int64_t, torch::Tensor> shards_;   // sharded: the held shards' state, by shard
  std::vector<torch::Tensor> all_params_;
  FlatParameters flat_;
  std::vector<int64_t> owned_;  // sharded: the shards this worker owns, ascending
  std::function<torch::Tensor(int64_t)> pending_;  // sharded: a checkpoint's shards, unread
  Exchange exchange_;  // sharded: how the per-shard norms reach every worker
};

class FusedSgd final : public FusedOptimizer<torch::optim::SGD, torch::optim::SGDOptions,
                                             torch::optim::SGDParamState> {
 public:
  FusedSgd(const std::vector<torch::Tensor>& params, const torch::optim::SGDOptions& options)
      : FusedOptimizer(params, options, /*state_tensors=*/options.momentum() != 0 ? 1 : 0) {}

 protected:
  void update_parts(torch::Tensor& p, const Gradient& g, double lr,
                    std::vector<Part>& parts) override {
    for (auto& part : parts) update(p, g, lr, part.lo, part.hi, part.state);
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

 private:
  /// The update of the flat range [lo, hi), whose state `state` covers.
  void update(torch::Tensor& p, const Gradient& gradient, double lr, int64_t lo, int64_t hi,
              std::vector<torch::Tensor>& state) {
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
      float* bp = s.use_momentum ? state[0].data_ptr<float>() : nullptr;  // from element lo
      gradient.for_runs(lo, hi, [&](int64_t b, int64_t e, auto g) {
        sgd_kernel(pp + b, g, bp ? bp + (b - lo) : nullptr, e - b, s);
      });
      return;
    }
    // Other devices and types: LibTorch's operations over the range.
    auto range = p.narrow(0, lo, hi - lo);
    const auto g = gradient.values.narrow(0, lo, hi - lo);
    auto d = s.decay ? g.add(range, o.weight_decay()) : g;
    if (s.use_momentum) {
      auto& buf = state[0];
      if (s.first) {
        buf.copy_(d);
      } else {
        buf.mul_(o.momentum()).add_(d, 1 - o.dampening());
      }
      d = s.nesterov ? d.add(buf, o.momentum()) : buf;
    }
    range.add_(d, -lr);
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
  void update_parts(torch::Tensor& p, const Gradient& g, double lr,
                    std::vector<Part>& parts) override {
    for (auto& part : parts) update(p, g, lr, part.lo, part.hi, part.state);
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

 private:
  /// The update of the flat range [lo, hi), whose state `state` covers.
  void update(torch::Tensor& p, const Gradient& gradient, double lr, int64_t lo, int64_t hi,
              std::vector<torch::Tensor>& state) {
    const auto& o = options();
    const double beta1 = std::get<0>(o.betas());
    const double beta2 = std::get<1>(o.betas());
    const auto t = static_cast<double>(steps_ + 1);
    const double correction1 = 1 - std::pow(beta1, t);
    const double correction2 = 1 - std::pow(beta2, t);
    const double step_size = lr / correction1;
    auto& m = state[0];
    auto& v = state[1];
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
      float* mp = m.data_ptr<float>();  // from element lo
      float* vp = v.data_ptr<float>();
      gradient.for_runs(lo, hi, [&](int64_t b, int64_t e, auto g) {
        adamw_kernel(pp + b, g, mp + (b - lo), vp + (b - lo), e - b, s);
      });
      return;
    }
    auto range = p.narrow(0, lo, hi - lo);
    const auto g = gradient.values.narrow(0, lo, hi - lo);
    if (o.weight_decay() != 0) range.mul_(1 - lr * o.weight_decay());
    m.mul_(beta1).add_(g, 1 - beta1);
    v.mul_(beta2).addcmul_(g, g, 1 - beta2);
    const auto denom = (v.sqrt() / std::sqrt(correction2)).add_(o.eps());
    range.addcdiv_(m, denom, -step_size);
  }
};

// ---- LAMB and LARS: trust ratios by canonical shard ------------------------------------

/// An optimizer whose step scales each parameter's update by a ratio of norms (LAMB's and
/// LARS's trust ratios), over flat buffers as the others. The norms' squares are summed
/// by piece, a parameter's part of one canonical shard, in blocks of kChunk elements from
/// the piece's start (each block in update_kernels' lanes), the blocks and then a
/// parameter's pieces added in flat order. A worker holding every shard and workers each
/// holding some (their pieces' sums exchanged) thus form the same ratios, bitwise, on any
/// worker count (docs/design.md, "Optimizer state sharded by vnode").
///
/// Checkpoints keep the format of the engine's LibTorch-operation LAMB and LARS:
/// "steps", then "<state name>.<parameter index>" for every parameter once a step is taken.
class FusedLayerwise : public FusedOptimizer<torch::optim::SGD, torch::optim::SGDOptions,
                                             torch::optim::SGDParamState> {
 public:
  FusedLayerwise(const std::vector<torch::Tensor>& params, const OptimizerSpec& spec,
                 std::vector<std::string> state_names, int64_t canonical_shards)
      : FusedOptimizer(params, torch::optim::SGDOptions(spec.lr),
                       static_cast<int>(state_names.size())),
        spec_(spec),
        names_(std::move(state_names)),
        canonical_(flat_parameters().numel(), canonical_shards) {
    // The pieces: each trainable parameter cut by the canonical shards, in flat order.
    for (size_t i = 0; i < trainable().size(); ++i) {
      const auto r = range_of(i);
      for (int64_t s = 0; s < canonical_.shards(); ++s) {
        const auto sh = canonical_.shard(s);
        const int64_t b = std::max(r.begin, sh.begin);
        const int64_t e = std::min(r.end, sh.end);
        if (b < e) pieces_.push_back({{b, e}, i, s});
      }
    }
    std::sort(pieces_.begin(), pieces_.end(),
              [](const Piece& a, const Piece& b) { return a.at.begin < b.at.begin; });
  }

  bool exchanges() const override { return true; }

  void shard_by(const vnode::ShardLayout& layout) override {
    VFLOW_ASSERT(layout.numel() == canonical_.numel() && layout.shards() == canonical_.shards(),
                 "LAMB or LARS sharded by other shards than it sums its norms by");
    FusedOptimizer::shard_by(layout);
  }

  void save(torch::serialize::OutputArchive& archive) const override {
    archive.write("steps", c10::IValue(steps_));
    if (steps_ == 0) return;
    if (sharded()) {
      VFLOW_ASSERT(static_cast<int64_t>(held().size()) == sharded()->shards(),
                   "a sharded optimizer state saved before it was gathered whole");
    }
    const auto place = places();
    for (size_t j = 0; j < place.size(); ++j) {
      for (size_t k = 0; k < names_.size(); ++k) {
        // A parameter that is not trainable never moves: its state stays zero.
        const auto t = place[j] >= 0 ? state_of(static_cast<size_t>(place[j]), static_cast<int>(k))
                                     : torch::zeros_like(all_params()[j]);
        archive.write(fmt::format("{}.{}", names_[k], j), t, /*is_buffer=*/true);
      }
    }
  }

  void load(torch::serialize::InputArchive& archive) override {
    reset_state();
    c10::IValue steps;
    archive.read("steps", steps);
    if (steps.toInt() == 0) return;
    const auto place = places();
    for (size_t j = 0; j < place.size(); ++j) {
      if (place[j] < 0) continue;
      for (size_t k = 0; k < names_.size(); ++k) {
        const auto name = fmt::format("{}.{}", names_[k], j);
        torch::Tensor t;
        if (!archive.try_read(name, t, /*is_buffer=*/true)) {
          throw CheckpointError("the optimizer state has no entry " + name);
        }
        restore(static_cast<size_t>(place[j]), static_cast<int>(k), t, names_[k].c_str());
      }
    }
    steps_ = steps.toInt();
  }

 protected:
  /// out[0] = Σp², out[1] = Σx² over n elements, x the other norm's vector; `state` the
  /// state rows at the first element.
  virtual void norms(const float* p, const float* g, float* const* state, int64_t n,
                     double out[2]) const = 0;
  /// Parameter i's factor of its update from its sums of squares (LAMB: −lr · ratio;
  /// LARS: its rate).
  virtual double factor(size_t i, double p2, double x2, double lr) const = 0;
  /// The step of n elements of parameter i with its factor.
  virtual void apply(float* p, const float* g, float* const* state, int64_t n, size_t i,
                     double factor) const = 0;

  void update_parts(torch::Tensor& p, const Gradient& g, double lr,
                    std::vector<Part>& parts) override {
    VFLOW_ASSERT(cpu_float(p) && g.on_cpu(),
                 "the fused LAMB and LARS take float32 parameters and gradients on the CPU");
    // The blocks of every piece in the parts, in flat order.
    std::vector<Block> blocks;
    for (size_t k = 0; k < parts.size(); ++k) {
      const auto& part = parts[k];
      auto it = std::lower_bound(pieces_.begin(), pieces_.end(), part.lo,
                                 [](const Piece& a, int64_t at) { return a.at.begin < at; });
      for (; it != pieces_.end() && it->at.begin < part.hi; ++it) {
        for (int64_t b = it->at.begin; b < it->at.end; b += kChunk) {
          blocks.push_back(
              {static_cast<size_t>(it - pieces_.begin()), k, b, std::min(it->at.end, b + kChunk)});
        }
      }
    }
    float* pp = p.data_ptr<float>();
    const auto each_block = [&](auto f) {
      at::parallel_for(0, static_cast<int64_t>(blocks.size()), 1, [&](int64_t first, int64_t last) {
        std::vector<float> scratch;
        for (int64_t t = first; t < last; ++t) {
          const auto& b = blocks[static_cast<size_t>(t)];
          const auto& part = parts[b.part];
          std::array<float*, 2> rows{};
          for (size_t r = 0; r < part.state.size(); ++r) {
            rows[r] = part.state[r].data_ptr<float>() + (b.begin - part.lo);
          }
          f(t, b, pp + b.begin, g.floats(b.begin, b.end, scratch), rows.data());
        }
      });
    };
    std::vector<double> sums(2 * blocks.size());
    each_block([&](int64_t t, const Block& b, float* pb, const float* gb, float* const* rows) {
      norms(pb, gb, rows, b.end - b.begin, &sums[static_cast<size_t>(2 * t)]);
    });
    // By piece: its blocks added in order (zero where this worker holds it not).
    auto mine = torch::zeros({static_cast<int64_t>(2 * pieces_.size())}, torch::kFloat64);
    auto* m = mine.data_ptr<double>();
    std::vector<char> measured(pieces_.size(), 0);
    for (size_t t = 0; t < blocks.size(); ++t) {
      const auto& b = blocks[t];
      const bool first = b.begin == pieces_[b.piece].at.begin;
      for (int q = 0; q < 2; ++q) {
        auto& x = m[2 * b.piece + q];
        x = first ? sums[2 * t + q] : x + sums[2 * t + q];
      }
      measured[b.piece] = 1;
    }
    const auto every = by_piece(mine, measured);
    std::vector<double> factors(trainable().size(), 0.0);
    std::vector<double> p2(trainable().size(), 0.0);
    std::vector<double> x2(trainable().size(), 0.0);
    for (size_t k = 0; k < pieces_.size(); ++k) {
      p2[pieces_[k].param] += every[2 * k];
      x2[pieces_[k].param] += every[2 * k + 1];
    }
    for (size_t i = 0; i < factors.size(); ++i) factors[i] = factor(i, p2[i], x2[i], lr);
    each_block([&](int64_t, const Block& b, float* pb, const float* gb, float* const* rows) {
      const size_t i = pieces_[b.piece].param;
      apply(pb, gb, rows, b.end - b.begin, i, factors[i]);
    });
  }

  std::unique_ptr<torch::optim::OptimizerParamState> saved_state(size_t) const override {
    VFLOW_ASSERT(false, "LAMB and LARS save in a format of their own");
    return nullptr;
  }
  int64_t restore_state(size_t, const torch::optim::OptimizerParamState&) override {
    VFLOW_ASSERT(false, "LAMB and LARS load a format of their own");
    return 0;
  }

  const OptimizerSpec spec_;

 private:
  struct Piece {
    vnode::FlatRange at;
    size_t param = 0;
    int64_t shard = 0;
  };
  struct Block {
    size_t piece = 0;
    size_t part = 0;
    int64_t begin = 0;
    int64_t end = 0;
  };

  /// Every piece's two sums: this worker's where it holds them all, else their sum over
  /// the workers, each giving those of the shards it owns (and zeros): exactly the owner's.
  /// `measured`: the pieces this worker summed.
  std::vector<double> by_piece(torch::Tensor mine, const std::vector<char>& measured) const {
    auto* m = mine.data_ptr<double>();
    if (!sharded()) {
      VFLOW_ASSERT(std::count(measured.begin(), measured.end(), 1) ==
                       static_cast<std::ptrdiff_t>(measured.size()),
                   "an unsharded LAMB or LARS that measured not every piece");
      return {m, m + mine.numel()};
    }
    VFLOW_ASSERT(static_cast<bool>(exchange()), "a sharded LAMB or LARS with no exchange");
    for (size_t k = 0; k < pieces_.size(); ++k) {
      if (std::binary_search(owned().begin(), owned().end(), pieces_[k].shard)) {
        VFLOW_ASSERT(measured[k] != 0, "a shard this worker owns and does not hold");
      } else {
        m[2 * k] = m[2 * k + 1] = 0;
      }
    }
    exchange()(mine);
    const auto host = mine.to(torch::kCPU).contiguous();
    return {host.data_ptr<double>(), host.data_ptr<double>() + host.numel()};
  }

  std::vector<std::string> names_;
  vnode::ShardLayout canonical_;
  std::vector<Piece> pieces_;  // ascending
};

/// LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning", Algorithm 2):
/// Adam's bias-corrected direction u = m̂ / (√v̂ + ε), plus decoupled weight decay λw,
/// scaled per layer by ‖w‖ / ‖u‖ (1 where either is 0: a fresh zero layer, or no gradient).
class FusedLamb final : public FusedLayerwise {
 public:
  FusedLamb(const std::vector<torch::Tensor>& params, const OptimizerSpec& spec, int64_t shards)
      : FusedLayerwise(params, spec, {"exp_avg", "exp_avg_sq"}, shards) {}

 protected:
  void norms(const float* p, const float* g, float* const* state, int64_t n,
             double out[2]) const override {
    lamb_norms(p, g, state[0], state[1], n, scalars(), out);
  }
  double factor(size_t, double p2, double u2, double lr) const override {
    const double ratio = p2 > 0 && u2 > 0 ? std::sqrt(p2) / std::sqrt(u2) : 1.0;
    return -lr * ratio;
  }
  void apply(float* p, const float* g, float* const* state, int64_t n, size_t,
             double factor) const override {
    lamb_kernel(p, g, state[0], state[1], n, scalars(), static_cast<float>(factor));
  }

 private:
  LambScalars scalars() const {
    const auto t = static_cast<double>(steps_ + 1);
    return {static_cast<float>(spec_.beta1),
            static_cast<float>(1 - spec_.beta1),
            static_cast<float>(spec_.beta2),
            static_cast<float>(1 - spec_.beta2),
            static_cast<float>(1 - std::pow(spec_.beta1, t)),
            static_cast<float>(1 - std::pow(spec_.beta2, t)),
            static_cast<float>(spec_.eps),
            static_cast<float>(spec_.weight_decay),
            spec_.weight_decay > 0};
  }
};

/// LARS (You et al. 2017, "Large Batch Training of Convolutional Networks", Algorithm 1):
/// a layer's rate is lr × η‖w‖ / (‖∇w‖ + β‖w‖); v = m·v + rate · (∇w + βw); w −= v.
/// Parameters of one dimension (biases, normalization weights) are, by default, left out
/// of both the trust ratio and the weight decay, as common practice does.
class FusedLars final : public FusedLayerwise {
 public:
  FusedLars(const std::vector<torch::Tensor>& params, const OptimizerSpec& spec, int64_t shards)
      : FusedLayerwise(params, spec, {"momentum_buffer"}, shards) {}

 protected:
  void norms(const float* p, const float* g, float* const*, int64_t n,
             double out[2]) const override {
    square_sums(p, g, n, out);
  }
  double factor(size_t i, double p2, double g2, double lr) const override {
    if (excluded(i)) return lr;
    const double wn = std::sqrt(p2);
    const double gn = std::sqrt(g2);
    return wn > 0 && gn > 0 ? lr * spec_.trust_coefficient * wn / (gn + spec_.weight_decay * wn)
                            : lr;
  }
  void apply(float* p, const float* g, float* const* state, int64_t n, size_t i,
             double factor) const override {
    const LarsScalars s{static_cast<float>(factor), static_cast<float>(spec_.weight_decay),
                        static_cast<float>(spec_.momentum), spec_.weight_decay > 0 && !excluded(i)};
    lars_kernel(p, g, state[0], n, s);
  }

 private:
  bool excluded(size_t i) const { return spec_.exclude_bias_and_norm && trainable()[i].dim() <= 1; }
};

}  // namespace

std::unique_ptr<torch::optim::Optimizer> make_fused_optimizer(
    const OptimizerSpec& spec, const std::vector<torch::Tensor>& params, int64_t canonical_shards) {
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
  // LAMB and LARS: the CPU's float32 parameters (elsewhere LibTorch's operations).
  const bool cpu = std::all_of(params.begin(), params.end(), [](const torch::Tensor& p) {
    return !p.requires_grad() || (p.device().is_cpu() && p.scalar_type() == torch::kFloat32);
  });
  if (spec.name == "lamb" && cpu)
    return std::make_unique<FusedLamb>(params, spec, canonical_shards);
  if (spec.name == "lars" && cpu)
    return std::make_unique<FusedLars>(params, spec, canonical_shards);
  return nullptr;
}

}  // namespace vflow::engine
