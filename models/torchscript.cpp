#include "vflow/models/torchscript.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <sstream>

#include "core/input_file.h"
#include "core/spec_schema.h"
#include "core/zip_check.h"
#include "vflow/core/error.h"
#include "vflow/vnode/stateful_kernels.h"

namespace vflow::models {

namespace {

// The part of a LibTorch error a user can act on: the Python-side error of a scripted
// function (after its TorchScript traceback), or else the first line (the rest is a
// C++ backtrace); line breaks folded into spaces.
std::string torch_message(const std::string& message) {
  const std::string marker = "Error: ";
  const auto at = message.rfind(marker);
  std::string text = at == std::string::npos ? message.substr(0, message.find('\n'))
                                             : message.substr(at + marker.size());
  std::string out;
  for (char c : text) {
    if (c == '\n' || c == ' ') {
      if (!out.empty() && out.back() != ' ') out.push_back(' ');
    } else {
      out.push_back(c);
    }
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

// The running statistics of a scripted batch norm (or instance norm tracking them):
// buffers running_mean and running_var and a momentum attribute (None = cumulative). An
// instance norm's forward never counts its batches and passes a momentum of None as 0.0
// (torch.nn's _InstanceNorm), so its counter is left alone.
std::optional<vnode::RunningStatsView> running_stats_of(const torch::jit::Module& m) {
  std::map<std::string, torch::Tensor> buffers;
  for (const auto& b : m.named_buffers(/*recurse=*/false)) buffers[b.name] = b.value;
  if (!buffers.count("running_mean") || !buffers.count("running_var") || !m.hasattr("momentum")) {
    return std::nullopt;
  }
  const auto type = m.type()->name();
  const bool instance_norm =
      type && type->qualifiedName().find("torch.nn.modules.instancenorm.") != std::string::npos;
  const auto momentum = m.attr("momentum");
  const std::optional<double> m_value =
      momentum.isNone() ? (instance_norm ? std::optional<double>(0.0) : std::nullopt)
                        : std::optional<double>(momentum.toDouble());
  const auto count = buffers.count("num_batches_tracked") && !instance_norm
                         ? buffers["num_batches_tracked"]
                         : torch::Tensor();
  return vnode::RunningStatsView(buffers["running_mean"], buffers["running_var"], count, m_value);
}

}  // namespace

TorchScriptModel::TorchScriptModel(const std::string& path) : path_(path) {
  // Read once, by vflow: refused unless a regular file (LibTorch's reader would block on
  // a FIFO), and checked as an archive first (LibTorch checks no CRC and can crash on a
  // damaged entry).
  auto in = core::read_input_file(path, uint64_t{1} << 40);
  if (!in.ok()) {
    throw SpecError(fmt::format("{}: cannot read the TorchScript module: {}", path, in.error));
  }
  if (const std::string problem = core::zip_archive_problem(in.bytes); !problem.empty()) {
    throw SpecError(fmt::format("{}: not a loadable TorchScript module: {}", path, problem));
  }
  try {
    std::istringstream bytes(std::move(in.bytes));
    module_ = std::make_unique<torch::jit::Module>(torch::jit::load(bytes));
  } catch (const std::exception& e) {
    throw SpecError(
        fmt::format("{}: not a loadable TorchScript module: {}", path, torch_message(e.what())));
  }
  mirror();
}

TorchScriptModel::~TorchScriptModel() = default;

// Registers the scripted module's tensors (the same tensors, not copies) under a tree of
// plain modules named as in Python, so parameters, buffers, checkpoints and the
// fingerprint see "layer1.0.conv1.weight" just as Python's state_dict does.
void TorchScriptModel::mirror() {
  std::map<std::string, std::shared_ptr<torch::nn::Module>> nodes;
  auto node_of = [&](const std::string& name) -> torch::nn::Module& {
    return name.empty() ? static_cast<torch::nn::Module&>(*this) : *nodes.at(name);
  };
  for (const auto& entry : module_->named_modules()) {
    const std::string& name = entry.name;
    if (!name.empty()) {
      const auto dot = name.rfind('.');
      const std::string parent = dot == std::string::npos ? "" : name.substr(0, dot);
      const std::string local = dot == std::string::npos ? name : name.substr(dot + 1);
      nodes[name] = node_of(parent).register_module(local, std::make_shared<torch::nn::Module>());
    }
    auto& node = node_of(name);
    for (const auto& p : entry.value.named_parameters(/*recurse=*/false)) {
      node.register_parameter(p.name, p.value, p.value.requires_grad());
    }
    for (const auto& b : entry.value.named_buffers(/*recurse=*/false)) {
      node.register_buffer(b.name, b.value);
    }
    if (auto stats = running_stats_of(entry.value)) {
      node.register_module("vflow_running_stats", *stats);
    }
  }
}

torch::Tensor TorchScriptModel::forward(const torch::Tensor& input) {
  auto out = module_->forward({input});
  if (!out.isTensor()) {
    throw SpecError(
        fmt::format("{}: forward() returned a {}, not one tensor of logits", path_, out.tagKind()));
  }
  return out.toTensor();
}

void TorchScriptModel::train(bool on) {
  torch::nn::Module::train(on);
  module_->train(on);
}

namespace {

struct TorchScriptOptions {
  std::string path;
};

const SpecSchema<TorchScriptOptions>& torchscript_schema() {
  static const auto schema = [] {
    SpecSchema<TorchScriptOptions> s("torchscript");
    s.text("path", &TorchScriptOptions::path,
           "the module's file, saved by `torch.jit.script` or `torch.jit.trace` and `.save()`; "
           "relative to the working directory")
        .default_text("required")
        .after([](OptionReader& r, TorchScriptOptions& o) {
          if (o.path.empty()) r.fail("path", "needs the TorchScript file (.pt) to train");
          std::error_code ec;
          if (!std::filesystem::is_regular_file(o.path, ec)) {
            r.fail("path", fmt::format("{}: no such file", o.path));
          }
        });
    return s;
  }();
  return schema;
}

ModelBuilder make_torchscript_factory(OptionReader& opt, const ModelContext& ctx) {
  TorchScriptOptions o;
  torchscript_schema().read(opt, o);
  return [path = o.path, ctx] {
    auto model = std::make_shared<TorchScriptModel>(path);
    // A mismatch between the exported model and the data shows here, not mid-training.
    std::vector<int64_t> shape{2};
    shape.insert(shape.end(), ctx.input_shape.begin(), ctx.input_shape.end());
    const auto probe = torch::zeros(shape, ctx.vocab_size > 0 ? torch::kInt64 : torch::kFloat32);
    torch::Tensor out;
    {
      torch::NoGradGuard no_grad;
      model->eval();
      try {
        out = model->forward(probe);
      } catch (const std::exception& e) {
        throw SpecError(fmt::format("{}: forward() fails on the data's inputs [n, {}]: {}", path,
                                    fmt::join(ctx.input_shape, ", "), torch_message(e.what())));
      }
      model->train();
    }
    const bool classes = out.dim() == 2 && out.size(1) == ctx.num_classes;
    const bool sequence = out.dim() == 3 && out.size(2) == ctx.num_classes;
    if (!classes && !sequence) {
      throw SpecError(fmt::format("{}: forward() returns shape [{}]; the data needs logits [n, {}]",
                                  path, fmt::join(out.sizes(), ", "), ctx.num_classes));
    }
    return model;
  };
}

}  // namespace

void register_torchscript(ModelRegistry& registry) {
  registry.add("torchscript", "a TorchScript module exported from Python", make_torchscript_factory,
               torchscript_schema().rows());
}

}  // namespace vflow::models
