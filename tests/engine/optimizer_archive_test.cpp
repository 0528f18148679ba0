// Optimizer checkpoints move between LibTorch versions: each parameter's state is found
// through the archive's parameter list, by place, whatever text its key has (1.13 writes
// TensorImpl addresses in hex, 2.x in decimal).
#include "engine/optimizer_archive.h"

#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "vflow/core/error.h"
#include "vflow/engine/optimizer.h"

namespace {

/// Parameters of two shapes that a state attached to the wrong one would not fit.
std::vector<torch::Tensor> parameters() {
  return {torch::zeros({4, 2}, torch::requires_grad()), torch::zeros({4}, torch::requires_grad())};
}

/// An optimizer archive as LibTorch writes it, with `keys` for the parameters (in order)
/// and their states written in the reverse order, each holding `tensors` (name -> value of
/// the parameter's shape, value i + 1 for parameter i) and `step` where given.
std::string archive_with_keys(const std::vector<std::string>& keys,
                              const std::vector<std::string>& tensors, bool step) {
  const auto params = parameters();
  torch::serialize::OutputArchive archive;
  archive.write("pytorch_version", c10::IValue("1.5.0"));
  torch::serialize::OutputArchive states;
  for (size_t k = keys.size(); k-- > 0;) {
    torch::serialize::OutputArchive state;
    if (step) state.write("step", c10::IValue(int64_t{3}));
    for (const auto& name : tensors) {
      state.write(name, torch::full(params[k].sizes(), static_cast<double>(k + 1)));
    }
    states.write(keys[k], state);
  }
  archive.write("state", states);
  torch::serialize::OutputArchive groups;
  groups.write("param_groups/size", torch::tensor(int64_t{1}));
  torch::serialize::OutputArchive group;
  group.write("params/size", torch::tensor(static_cast<int64_t>(keys.size())));
  for (size_t k = 0; k < keys.size(); ++k) {
    group.write("params/" + std::to_string(k), c10::IValue(keys[k]));
  }
  torch::serialize::OutputArchive options;
  torch::optim::SGDOptions(0.1).serialize(options);
  group.write("options", options);
  groups.write("param_groups/0", group);
  archive.write("param_groups", groups);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

/// `name` of each parameter's state in `optimizer`'s own archive, by place.
std::vector<torch::Tensor> saved(torch::optim::Optimizer& optimizer, const std::string& name) {
  torch::serialize::OutputArchive out;
  optimizer.save(out);
  std::ostringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  const std::string text = bytes.str();
  in.load_from(text.data(), text.size());
  std::vector<torch::Tensor> values(2);
  vflow::engine::for_each_saved_state(
      in, 2, [&](size_t i, torch::serialize::InputArchive& s) { s.read(name, values[i]); });
  return values;
}

void load(torch::optim::Optimizer& optimizer, const std::string& bytes) {
  torch::serialize::InputArchive in;
  in.load_from(bytes.data(), bytes.size());
  optimizer.load(in);
}

}  // namespace

TEST_CASE("optimizer states attach to their parameters by place, whatever their keys' text",
          "[unit]") {
  // Hex (LibTorch 1.13), decimal (2.x), and keys a number parser would take as one.
  const auto keys = GENERATE(std::vector<std::string>{"0x55d0c0a0", "0x55d0c1f0"},
                             std::vector<std::string>{"94371239", "94371455"},
                             std::vector<std::string>{"0x1", "0x2"});
  CAPTURE(keys);
  struct Case {
    std::string name;
    std::vector<std::string> tensors;
    bool step;
  };
  for (const auto& c :
       {Case{"sgd", {"momentum_buffer"}, false}, Case{"adamw", {"exp_avg", "exp_avg_sq"}, true},
        Case{"adam", {"exp_avg", "exp_avg_sq"}, true}}) {
    CAPTURE(c.name);
    vflow::engine::OptimizerSpec spec;
    spec.name = c.name;
    const auto params = parameters();
    auto optimizer = vflow::engine::make_optimizer(spec, params);
    load(*optimizer, archive_with_keys(keys, c.tensors, c.step));
    for (const auto& name : c.tensors) {
      CAPTURE(name);
      const auto values = saved(*optimizer, name);
      for (size_t i = 0; i < 2; ++i) {
        REQUIRE(values[i].defined());
        CHECK(values[i].sizes() == params[i].sizes());
        CHECK(torch::equal(values[i], torch::full(params[i].sizes(), static_cast<double>(i + 1))));
      }
    }
  }
}

TEST_CASE("an optimizer archive for another number of parameters is refused", "[unit]") {
  vflow::engine::OptimizerSpec spec;
  auto optimizer = vflow::engine::make_optimizer(spec, parameters());
  const auto bytes = archive_with_keys({"0x1"}, {"momentum_buffer"}, false);
  CHECK_THROWS_WITH(load(*optimizer, bytes),
                    Catch::Contains("the optimizer state lists 1 parameters, this model has 2"));
}
