#include "vflow/vnode/stateful_kernels.h"

#include <torch/torch.h>

#include <mutex>
#include <optional>
#include <unordered_set>

#include "vflow/core/error.h"

namespace vflow::vnode {

namespace {

/// The running means and variances of every norm layer the set recognises (batch norm,
/// instance norm, RunningStatsView), with an exponential (momentum) or cumulative average
/// as torch keeps them, handled as one kernel: each phase is a few multi-tensor operations
/// whatever the number of layers, not a few per layer. On a GPU each operation is a kernel
/// launch; ResNet-18's 20 batch norms took about 100 launches a vnode one by one.
class RunningStatsGroup final : public StatefulKernel {
 public:
  struct Layer {
    torch::Tensor mean, var, count;  // count may be undefined (no counter)
    std::optional<double> momentum;  // empty: cumulative average
  };

  /// False, adding nothing, for a layer whose statistics are already here (a module
  /// registered twice, or a view of a module's own statistics): they must be updated once.
  /// A counter that only one of the two names is kept.
  bool add(Layer layer) {
    if (layer.count.defined() && layer.count.numel() != 1) {
      throw SpecError("a running-statistics counter must be one number, not " +
                      std::to_string(layer.count.numel()));
    }
    for (auto& known : layers_) {
      if (!same_memory(known.mean, layer.mean)) continue;
      if (known.momentum != layer.momentum) {
        throw SpecError(
            "the same running statistics are registered twice with different momenta; "
            "register them once");
      }
      if (!known.count.defined() && layer.count.defined()) {
        known.count = layer.count;
        index();
      }
      return false;
    }
    layers_.push_back(std::move(layer));
    index();
    return true;
  }
  bool empty() const { return layers_.empty(); }

  // Contribution: mean and variance of layer 0, then of layer 1, ...
  int64_t contribution_size() const override { return size_; }

  void begin_step() override {
    state0_ = torch::cat(flattened(stats_));
    if (!counts_.empty()) counts0_ = torch::cat(flattened(counts_));
    // Only a cumulative average needs the counters here (one transfer for all layers).
    if (!cumulative_) return;
    count0_.assign(layers_.size(), 0);
    if (counts_.empty()) return;
    const auto host = counts0_.to(torch::kCPU, torch::kInt64).contiguous();
    const int64_t* value = host.data_ptr<int64_t>();
    for (size_t i = 0; i < layers_.size(); ++i) {
      if (layers_[i].count.defined()) count0_[i] = *value++;
    }
  }

  void begin_vnode(int64_t ordinal) override {
    // With zero running statistics the module's own update leaves exactly
    // factor * (batch statistic): this vnode's contribution.
    at::_foreach_zero_(stats_);
    // A cumulative average reads its counter: as if the vnodes before this one had run
    // here. (With a momentum the counter is only counted; apply() sets it.)
    if (!cumulative_) return;
    for (size_t i = 0; i < layers_.size(); ++i) {
      auto& layer = layers_[i];
      if (!layer.momentum && layer.count.defined()) layer.count.fill_(count0_[i] + ordinal);
    }
  }

  void end_vnode(torch::Tensor out) override { torch::cat_out(out, flattened(stats_)); }

  void apply(const std::vector<torch::Tensor>& rows) override {
    // The state saved at the start of the step, bit for bit: -0.0 is the identity of
    // addition (x + -0.0 == x for every x, -0.0 too), so zero, negate, add. (Not for a NaN's
    // payload, nor for denormals where they are flushed to zero, which LibTorch does not
    // do unless asked.)
    at::_foreach_zero_(stats_);
    at::_foreach_neg_(stats_);
    at::_foreach_add_(stats_, like_stats(state0_));
    std::vector<at::Scalar> keep(stats_.size());
    for (size_t k = 0; k < rows.size(); ++k) {
      for (size_t i = 0; i < layers_.size(); ++i) {
        const auto& layer = layers_[i];
        const double factor =
            layer.momentum ? *layer.momentum : 1.0 / static_cast<double>(count0_[i] + k + 1);
        keep[2 * i] = keep[2 * i + 1] = 1.0 - factor;
      }
      at::_foreach_mul_(stats_, keep);
      at::_foreach_add_(stats_, like_stats(rows[k]));
    }
    if (counts_.empty()) return;
    at::_foreach_zero_(counts_);
    at::_foreach_add_(counts_, like(counts_, counts0_));
    at::_foreach_add_(counts_, static_cast<int64_t>(rows.size()));
  }

 private:
  static bool same_memory(const torch::Tensor& a, const torch::Tensor& b) {
    return a.is_alias_of(b) && a.storage_offset() == b.storage_offset() && a.numel() == b.numel();
  }

  /// The lists the operations take, from layers_.
  void index() {
    stats_.clear();
    counts_.clear();
    cumulative_ = false;
    size_ = 0;
    for (const auto& layer : layers_) {
      stats_.push_back(layer.mean);
      stats_.push_back(layer.var);
      if (layer.count.defined()) counts_.push_back(layer.count);
      if (!layer.momentum) cumulative_ = true;
      size_ += 2 * layer.mean.numel();
    }
  }

  static std::vector<torch::Tensor> flattened(const std::vector<torch::Tensor>& tensors) {
    std::vector<torch::Tensor> out;
    out.reserve(tensors.size());
    for (const auto& t : tensors) out.push_back(t.reshape({-1}));
    return out;
  }

  /// Consecutive slices of the 1-D `flat`, shaped as `tensors`.
  static std::vector<torch::Tensor> like(const std::vector<torch::Tensor>& tensors,
                                         const torch::Tensor& flat) {
    std::vector<torch::Tensor> out;
    out.reserve(tensors.size());
    int64_t offset = 0;
    for (const auto& t : tensors) {
      out.push_back(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
    return out;
  }
  std::vector<torch::Tensor> like_stats(const torch::Tensor& flat) const {
    return like(stats_, flat);
  }

  std::vector<Layer> layers_;
  std::vector<torch::Tensor> stats_;   // mean and variance of each layer, in layer order
  std::vector<torch::Tensor> counts_;  // the defined counters, in layer order
  bool cumulative_ = false;            // some layer keeps a cumulative average
  int64_t size_ = 0;
  torch::Tensor state0_, counts0_;  // at the start of the step, concatenated
  std::vector<int64_t> count0_;     // per layer (0: no counter), read where a layer is cumulative
};

// Batch norm's momentum is optional (none = cumulative average); instance norm's is not.
std::optional<double> momentum_of(const c10::optional<double>& m) {
  return m.has_value() ? std::optional<double>(*m) : std::nullopt;
}
std::optional<double> momentum_of(double m) { return m; }

// `Counts`: the module's forward pass counts its batches in num_batches_tracked (batch
// norm does; instance norm keeps the buffer but never changes it, so neither does vflow).
template <typename Impl, bool Counts>
std::optional<RunningStatsGroup::Layer> match_norm(torch::nn::Module& m) {
  auto* norm = dynamic_cast<Impl*>(&m);
  if (!norm || !norm->options.track_running_stats() || !norm->running_mean.defined()) {
    return std::nullopt;
  }
  return RunningStatsGroup::Layer{norm->running_mean, norm->running_var,
                                  Counts ? norm->num_batches_tracked : torch::Tensor(),
                                  momentum_of(norm->options.momentum())};
}

/// The running statistics of a module vflow knows (tried after the user's factories).
std::optional<RunningStatsGroup::Layer> running_stats_of(torch::nn::Module& m) {
  if (auto* view = dynamic_cast<RunningStatsViewImpl*>(&m)) {
    return RunningStatsGroup::Layer{view->mean, view->var, view->count, view->momentum};
  }
  for (auto match :
       {match_norm<torch::nn::BatchNorm1dImpl, true>, match_norm<torch::nn::BatchNorm2dImpl, true>,
        match_norm<torch::nn::BatchNorm3dImpl, true>,
        match_norm<torch::nn::InstanceNorm1dImpl, false>,
        match_norm<torch::nn::InstanceNorm2dImpl, false>,
        match_norm<torch::nn::InstanceNorm3dImpl, false>}) {
    if (auto layer = match(m)) return layer;
  }
  return std::nullopt;
}

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::vector<StatefulKernelFactory>& factories() {
  static std::vector<StatefulKernelFactory> list;
  return list;
}

std::vector<StatefulKernelFactory> user_factories() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  return factories();
}

}  // namespace

void StatefulKernelSet::register_factory(StatefulKernelFactory factory) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  factories().push_back(std::move(factory));
}

StatefulKernelSet::StatefulKernelSet(torch::nn::Module& model, int64_t virtual_nodes,
                                     torch::Device device) {
  const auto candidates = user_factories();
  auto running_stats = std::make_unique<RunningStatsGroup>();
  int64_t width = 1;  // column 0: present flag
  const auto add = [&](std::unique_ptr<StatefulKernel> kernel) {
    offsets_.push_back(width);
    width += kernel->contribution_size();
    kernels_.push_back(std::move(kernel));
  };
  // The model itself need not live in a shared_ptr, so it is visited apart from its children.
  std::vector<torch::nn::Module*> modules{&model};
  for (const auto& child : model.modules(/*include_self=*/false)) modules.push_back(child.get());
  std::unordered_set<const torch::nn::Module*> seen;  // a module registered twice counts once
  for (auto* module : modules) {
    if (!seen.insert(module).second) continue;
    std::unique_ptr<StatefulKernel> kernel;
    for (const auto& factory : candidates) {
      if ((kernel = factory(*module))) break;
    }
    if (kernel) {
      add(std::move(kernel));
      ++modules_;
    } else if (auto layer = running_stats_of(*module)) {
      if (running_stats->add(std::move(*layer))) ++modules_;
    }
  }
  // The running statistics of all layers: one kernel, after the user's.
  if (!running_stats->empty()) add(std::move(running_stats));
  table_ =
      torch::zeros({virtual_nodes, width}, torch::TensorOptions(torch::kFloat32).device(device));
}

void StatefulKernelSet::bind_table(const torch::Tensor& storage) {
  VFLOW_ASSERT(storage.dim() == 1 && storage.numel() == table_.numel() &&
                   storage.scalar_type() == torch::kFloat32,
               "the table storage must be a 1-D float32 slice of table_numel() elements");
  table_ = storage.view(table_.sizes());
}

void StatefulKernelSet::begin_step() {
  torch::NoGradGuard no_grad;
  table_.zero_();
  for (auto& k : kernels_) k->begin_step();
}

void StatefulKernelSet::begin_vnode(int64_t vnode, int64_t ordinal) {
  torch::NoGradGuard no_grad;
  for (auto& k : kernels_) k->begin_vnode(ordinal);
}

void StatefulKernelSet::end_vnode(int64_t vnode) {
  torch::NoGradGuard no_grad;
  auto row = table_[vnode];
  row[0].fill_(1.0);
  for (size_t i = 0; i < kernels_.size(); ++i) {
    kernels_[i]->end_vnode(row.narrow(0, offsets_[i], kernels_[i]->contribution_size()));
  }
}

void StatefulKernelSet::apply() {
  torch::NoGradGuard no_grad;
  std::vector<int64_t> present;
  const auto flags = table_.select(1, 0).to(torch::kCPU).contiguous();
  const float* flag = flags.data_ptr<float>();
  for (int64_t v = 0; v < table_.size(0); ++v) {
    if (flag[v] > 0.5F) present.push_back(v);
  }
  for (size_t i = 0; i < kernels_.size(); ++i) {
    std::vector<torch::Tensor> rows;
    rows.reserve(present.size());
    for (int64_t v : present) {
      rows.push_back(table_[v].narrow(0, offsets_[i], kernels_[i]->contribution_size()));
    }
    kernels_[i]->apply(rows);
  }
}

void StatefulKernelSet::abort_step() {
  torch::NoGradGuard no_grad;
  for (auto& k : kernels_) k->apply({});
}

}  // namespace vflow::vnode
