// Models exported from Python with TorchScript (torch.jit.script or
// torch.jit.trace, then .save). vflow trains them like its own modules: their
// parameters and buffers keep the names they have in Python (so checkpoints map
// back onto the Python module's state_dict), and the running statistics of their
// batch norms follow the stateful-kernel contract.
#pragma once

#include <memory>
#include <string>

#include "vflow/models/registry.h"

namespace torch::jit {
struct Module;
}

namespace vflow::models {

class TorchScriptModel final : public Model {
 public:
  /// Loads `path`; a missing or unreadable file, or one that is not a TorchScript
  /// module, is a SpecError naming it.
  explicit TorchScriptModel(const std::string& path);
  ~TorchScriptModel() override;
  /// The scripted forward(input); it must return one tensor.
  torch::Tensor forward(const torch::Tensor& input) override;
  void train(bool on = true) override;

 private:
  void mirror();
  std::string path_;
  std::unique_ptr<torch::jit::Module> module_;
};

/// Registers "torchscript" with its option, `path` (the .pt file, relative to the working
/// directory). The job spec's shorthand `model: {torchscript: file.pt}` means
/// {name: torchscript, options: {path}}.
void register_torchscript(ModelRegistry& registry);

}  // namespace vflow::models
