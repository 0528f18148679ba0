#include "vflow/vnode/stateful_kernels.h"

#include <torch/torch.h>

#include <mutex>
#include <optional>

#include "vflow/core/error.h"

namespace vflow::vnode {

namespace {

/// Running mean/variance with an exponential (momentum) or cumulative average,
/// as torch's batch norm and instance norm keep them.
class RunningStatsKernel final : public StatefulKernel {
 public:
  RunningStatsKernel(torch::Tensor mean, torch::Tensor var, torch::Tensor count,
                     std::optional<double> momentum)
      : mean_(std::move(mean)),
        var_(std::move(var)),
        count_(std::move(count)),
        momentum_(momentum),
        channels_(mean_.numel()) {}

  int64_t contribution_size() const override { return 2 * channels_; }

  void begin_step() override {
    mean0_ = mean_.detach().clone();
    var0_ = var_.detach().clone();
    count0_ = count_.defined() ? count_.item<int64_t>() : 0;
  }

  void begin_vnode(int64_t ordinal) override {
    // With zero running statistics the module's own update leaves exactly
    // factor * (batch statistic): this vnode's contribution.
    mean_.zero_();
    var_.zero_();
    if (count_.defined()) count_.fill_(count0_ + ordinal);
  }

  void end_vnode(torch::Tensor out) override {
    out.narrow(0, 0, channels_).copy_(mean_.reshape({-1}));
    out.narrow(0, channels_, channels_).copy_(var_.reshape({-1}));
  }

  void apply(const std::vector<torch::Tensor>& rows) override {
    auto mean = mean0_.clone();
    auto var = var0_.clone();
    int64_t k = 0;
    for (const auto& row : rows) {
      const double factor = momentum_ ? *momentum_ : 1.0 / static_cast<double>(count0_ + k + 1);
      mean.mul_(1.0 - factor).add_(row.narrow(0, 0, channels_).view_as(mean));
      var.mul_(1.0 - factor).add_(row.narrow(0, channels_, channels_).view_as(var));
      ++k;
    }
    mean_.copy_(mean);
    var_.copy_(var);
    if (count_.defined()) count_.fill_(count0_ + k);
  }

 private:
  torch::Tensor mean_, var_, count_;
  std::optional<double> momentum_;
  int64_t channels_;
  torch::Tensor mean0_, var0_;
  int64_t count0_ = 0;
};

// Batch norm's momentum is optional (none = cumulative average); instance norm's is not.
std::optional<double> momentum_of(const c10::optional<double>& m) {
  return m.has_value() ? std::optional<double>(*m) : std::nullopt;
}
std::optional<double> momentum_of(double m) { return m; }

template <typename Impl>
std::unique_ptr<StatefulKernel> match_norm(torch::nn::Module& m) {
  auto* norm = dynamic_cast<Impl*>(&m);
  if (!norm || !norm->options.track_running_stats() || !norm->running_mean.defined()) {
    return nullptr;
  }
  return std::make_unique<RunningStatsKernel>(norm->running_mean, norm->running_var,
                                              norm->num_batches_tracked,
                                              momentum_of(norm->options.momentum()));
}

std::unique_ptr<StatefulKernel> match_view(torch::nn::Module& m) {
  auto* view = dynamic_cast<RunningStatsViewImpl*>(&m);
  if (!view) return nullptr;
  return std::make_unique<RunningStatsKernel>(view->mean, view->var, view->count, view->momentum);
}

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::vector<StatefulKernelFactory>& factories() {
  static std::vector<StatefulKernelFactory> list;
  return list;
}

std::vector<StatefulKernelFactory> all_factories() {
  std::vector<StatefulKernelFactory> out;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    out = factories();
  }
  out.emplace_back(match_view);
  out.emplace_back(match_norm<torch::nn::BatchNorm1dImpl>);
  out.emplace_back(match_norm<torch::nn::BatchNorm2dImpl>);
  out.emplace_back(match_norm<torch::nn::BatchNorm3dImpl>);
  out.emplace_back(match_norm<torch::nn::InstanceNorm1dImpl>);
  out.emplace_back(match_norm<torch::nn::InstanceNorm2dImpl>);
  out.emplace_back(match_norm<torch::nn::InstanceNorm3dImpl>);
  return out;
}

}  // namespace

void StatefulKernelSet::register_factory(StatefulKernelFactory factory) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  factories().push_back(std::move(factory));
}

StatefulKernelSet::StatefulKernelSet(torch::nn::Module& model, int64_t virtual_nodes,
                                     torch::Device device) {
  const auto candidates = all_factories();
  int64_t width = 1;  // column 0: present flag
  // The model itself need not live in a shared_ptr, so it is visited apart from its children.
  std::vector<torch::nn::Module*> modules{&model};
  for (const auto& child : model.modules(/*include_self=*/false)) modules.push_back(child.get());
  for (auto* module : modules) {
    for (const auto& factory : candidates) {
      if (auto kernel = factory(*module)) {
        offsets_.push_back(width);
        width += kernel->contribution_size();
        kernels_.push_back(std::move(kernel));
        break;
      }
    }
  }
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
