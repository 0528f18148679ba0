// Stateful kernels: modules whose training-mode forward pass mutates buffers,
// such as batch norm's running statistics (docs/design.md §2, "Stateful kernels").
//
// Naive gradient accumulation lets each micro-batch update the running
// statistics in whatever order a worker happens to run it. vflow instead has
// every vnode record its *contribution* to a table (one row per vnode), and
// after the step applies the rows in vnode order 0..N-1 to the state saved at
// the start of the step. The table is plain numbers, so workers can sum it
// across processes; the resulting state is the same whichever worker ran
// which vnode, and equals sequential updates in vnode order.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace vflow::vnode {

/// One module's stateful behaviour, seen through the contribution protocol.
class StatefulKernel {
 public:
  virtual ~StatefulKernel() = default;
  /// Numbers per vnode contribution.
  virtual int64_t contribution_size() const = 0;
  /// Saves the state at the start of a step.
  virtual void begin_step() = 0;
  /// Prepares the module so that the next forward records only this vnode's effect.
  /// `ordinal` counts the non-empty vnodes before this one in the step.
  virtual void begin_vnode(int64_t ordinal) = 0;
  /// Writes this vnode's contribution (a 1-D slice of contribution_size()), after its
  /// forward pass (the trainer calls it before the backward pass).
  virtual void end_vnode(torch::Tensor out) = 0;
  /// Restores the saved state and applies the contributions (rows, in vnode order).
  virtual void apply(const std::vector<torch::Tensor>& rows) = 0;
};

/// Returns a kernel for modules it recognises, nullptr for the rest.
using StatefulKernelFactory = std::function<std::unique_ptr<StatefulKernel>(torch::nn::Module&)>;

/// Running statistics updated by code vflow cannot see as a torch::nn norm module,
/// e.g. a batch norm inside a TorchScript graph. Register one as a child module of
/// the model, holding the same tensors, and StatefulKernelSet treats them as it treats
/// batch norm's. It registers no parameters or buffers itself: the tensors stay
/// registered where they belong, so they are counted once.
class RunningStatsViewImpl : public torch::nn::Module {
 public:
  /// `count` may be undefined (no counter); `momentum` empty = cumulative average.
  RunningStatsViewImpl(torch::Tensor mean, torch::Tensor var, torch::Tensor count,
                       std::optional<double> momentum)
      : mean(std::move(mean)), var(std::move(var)), count(std::move(count)), momentum(momentum) {}
  torch::Tensor mean, var, count;
  std::optional<double> momentum;
};
TORCH_MODULE(RunningStatsView);

/// All stateful kernels of a model and the per-step contribution table.
class StatefulKernelSet {
 public:
  /// `device`: where the model's buffers (and so the contribution table) live.
  StatefulKernelSet(torch::nn::Module& model, int64_t virtual_nodes,
                    torch::Device device = torch::kCPU);

  /// Adds a factory for user-defined stateful modules; tried before the built-in ones
  /// (batch norm and instance norm with running statistics).
  static void register_factory(StatefulKernelFactory factory);

  bool empty() const { return kernels_.empty(); }
  /// The stateful modules found (the running statistics of all norm layers are handled by
  /// one kernel).
  size_t size() const { return modules_; }

  void begin_step();
  void begin_vnode(int64_t vnode, int64_t ordinal);
  void end_vnode(int64_t vnode);
  /// Applies every present row of the table, in vnode order.
  void apply();
  /// Restores the state saved by begin_step() (a step that will not complete).
  void abort_step();

  /// [virtual_nodes, 1 + sum of contribution sizes]; column 0 marks a present row.
  /// Rows of vnodes held elsewhere are zero, so a sum across workers completes it.
  torch::Tensor& table() { return table_; }
  /// Number of elements of the table.
  int64_t table_numel() const { return table_.numel(); }
  /// Moves the table into `storage` (1-D, table_numel() elements, float32), e.g. a
  /// slice of the gradient buffer so that it rides along in the same collective.
  void bind_table(const torch::Tensor& storage);

 private:
  std::vector<std::unique_ptr<StatefulKernel>> kernels_;
  std::vector<int64_t> offsets_;
  size_t modules_ = 0;
  torch::Tensor table_;
};

}  // namespace vflow::vnode
