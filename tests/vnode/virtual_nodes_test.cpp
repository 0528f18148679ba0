// The virtual-node contracts of docs/design.md §2-3 on one worker: gradients, the
// stateful-kernel rule, and determinism.
#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <cmath>

#include "support.h"
#include "vflow/data/dataset.h"
#include "vflow/engine/run_job.h"
#include "vflow/engine/runtime.h"
#include "vflow/engine/trainer.h"
#include "vflow/models/registry.h"
#include "vflow/vnode/plan.h"
#include "vflow/vnode/stateful_kernels.h"

using vflow::engine::JobSpec;
using vflow::engine::Trainer;

namespace {

/// A job whose optimizer does not move the parameters (lr 0), so gradients and
/// statistics of any step can be compared with a reference computed by hand.
JobSpec frozen_job(const std::string& model, int64_t virtual_nodes, bool batch_norm,
                   int64_t train_size = 100) {
  return vflow::testing::small_job({
      "semantic.model.name=" + model,
      "semantic.model.options={hidden: [32, 16], dropout: 0, batch_norm: " +
          std::string(batch_norm ? "true" : "false") + "}",
      "semantic.data.options.train_size=" + std::to_string(train_size),
      "semantic.virtual_nodes=" + std::to_string(virtual_nodes),
      "semantic.optimizer={name: sgd, lr: 0, momentum: 0, weight_decay: 0}",
      "semantic.steps=3",
  });
}

/// As frozen_job, for any model section and data shape.
JobSpec frozen_job_of(const std::string& model_yaml, const std::string& data_options,
                      int64_t virtual_nodes) {
  return vflow::testing::small_job({
      "semantic.model=" + model_yaml,
      "semantic.data.options=" + data_options,
      "semantic.virtual_nodes=" + std::to_string(virtual_nodes),
      "semantic.optimizer={name: sgd, lr: 0, momentum: 0, weight_decay: 0}",
      "semantic.steps=3",
  });
}

struct Setup {
  std::shared_ptr<vflow::models::Model> model;
  std::shared_ptr<vflow::models::Model> reference;
  vflow::data::DataSplits data;
};

Setup build(const JobSpec& spec) {
  const auto& sem = spec.semantic;
  const vflow::SpecNode none;
  auto prepared =
      vflow::data::DataRegistry::global().prepare(sem.data.name, none, sem.data.options);
  auto builder = vflow::models::ModelRegistry::global().prepare(
      sem.model.name, none, sem.model.options,
      {prepared.info.input_shape, prepared.info.num_classes});
  vflow::engine::configure_runtime(spec);
  Setup s;
  s.data = prepared.load();
  vflow::engine::seed_initialisation(sem);
  s.model = builder();
  vflow::engine::seed_initialisation(sem);
  s.reference = builder();
  return s;
}

torch::Tensor as_tensor(const std::vector<int64_t>& v) {
  return torch::tensor(std::vector<int64_t>(v.begin(), v.end()), torch::kInt64);
}

/// Trains 3 frozen steps (lr 0) and checks after each that the vnodes' weighted gradient
/// equals the gradient of the whole batch in one piece. Steps 0 and 1 are full batches
/// of 48; step 2 is the epoch's short tail of 4 examples, spread over some vnodes with
/// weights n_v / 4.
void check_one_batch_gradients(const JobSpec& spec) {
  auto s = build(spec);
  Trainer trainer(spec, s.model, s.data);
  for (int64_t step = 0; step < 3; ++step) {
    CAPTURE(step);
    const auto indices = trainer.batch_indices(step);
    trainer.train_step();
    s.reference->zero_grad();
    const auto batch = s.data.train->get(as_tensor(indices));
    torch::nn::functional::cross_entropy(s.reference->forward(batch.input), batch.target)
        .backward();
    const auto got = s.model->parameters();
    const auto want = s.reference->parameters();
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      CHECK(torch::allclose(got[i].grad(), want[i].grad(), 1e-5, 1e-6));
      CHECK(torch::equal(got[i], want[i]));  // lr 0: parameters did not move
    }
  }
}

}  // namespace

TEST_CASE("the gradient of N weighted vnodes equals the one-big-batch gradient",
          "[unit][numeric]") {
  for (const int64_t n : {1, 4, 12}) {
    CAPTURE(n);
    const auto spec = frozen_job("mlp", n, false);
    check_one_batch_gradients(spec);
  }
}

namespace {

/// Trains 3 frozen steps and checks every buffer against torch's own modules running
/// the vnode slices one after another (the stateful-kernel rule of docs/design.md §2).
void check_sequential_statistics(const JobSpec& spec, size_t buffers) {
  const auto& sem = spec.semantic;
  const auto plan = sem.vnode_sizes.empty()
                        ? vflow::vnode::VirtualNodePlan(sem.global_batch, sem.virtual_nodes)
                        : vflow::vnode::VirtualNodePlan(sem.global_batch, sem.vnode_sizes);
  auto s = build(spec);
  Trainer trainer(spec, s.model, s.data);
  for (int64_t step = 0; step < 3; ++step) {
    const auto indices = as_tensor(trainer.batch_indices(step));
    trainer.train_step();
    s.reference->train();
    torch::NoGradGuard no_grad;
    for (int64_t v = 0; v < plan.virtual_nodes(); ++v) {
      const auto part = plan.slice(v, indices.size(0));
      if (part.size == 0) continue;
      s.reference->forward(
          s.data.train->get(indices.slice(0, part.offset, part.offset + part.size)).input);
    }
    const auto got = s.model->named_buffers();
    const auto want = s.reference->named_buffers();
    REQUIRE(got.size() == want.size());
    REQUIRE(got.size() == buffers);
    for (size_t i = 0; i < got.size(); ++i) {
      CAPTURE(step, got[i].key());
      CHECK(torch::allclose(got[i].value().to(torch::kDouble), want[i].value().to(torch::kDouble),
                            1e-6, 1e-7));
    }
  }
}

}  // namespace

TEST_CASE("batch-norm running statistics follow sequential updates in vnode order",
          "[unit][numeric]") {
  // 108 examples: two full batches of 48, then a tail of 12 (2 per vnode).
  check_sequential_statistics(frozen_job("mlp", 6, true, 108), 6);  // 2 BatchNorm1d x 3
}

TEST_CASE("ResNet's batch norms follow the stateful-kernel rule", "[unit][numeric]") {
  // Stem + 8 basic blocks (2 norms each) + 3 projection shortcuts = 20 norms x 3 buffers.
  check_sequential_statistics(frozen_job_of("{name: resnet, options: {depth: 18, width: 4}}",
                                            "{train_size: 108, shape: [3, 8, 8], classes: 4}", 4),
                              60);
}

TEST_CASE("batch norms inside a TorchScript model follow the stateful-kernel rule",
          "[integration][torchscript]") {
  vflow::testing::TempDir dir;
  // Momentum 0.1 (ConvNet), a cumulative average (momentum None) and an instance norm.
  const auto convnet = vflow::testing::export_torchscript("convnet", dir.file("convnet.pt"));
  check_sequential_statistics(
      frozen_job_of("{torchscript: " + convnet + "}",
                    "{train_size: 108, shape: [1, 28, 28], classes: 10}", 6),
      6);
  const auto mlp = vflow::testing::export_torchscript("mlp-cumulative", dir.file("mlp.pt"));
  check_sequential_statistics(
      frozen_job_of("{torchscript: " + mlp + "}",
                    "{train_size: 108, shape: [1, 28, 28], classes: 10}", 6),
      3);
  // An instance norm's forward leaves its counter alone; so must vflow.
  const auto instance =
      vflow::testing::export_torchscript("instance-norm", dir.file("instance.pt"));
  check_sequential_statistics(
      frozen_job_of("{torchscript: " + instance + "}",
                    "{train_size: 108, shape: [1, 28, 28], classes: 10}", 6),
      3);
}

TEST_CASE("the contribution table reproduces cumulative-average batch norm too",
          "[unit][numeric]") {
  torch::manual_seed(0);
  auto bn = torch::nn::BatchNorm2d(torch::nn::BatchNorm2dOptions(3).momentum(c10::nullopt));
  auto reference = torch::nn::BatchNorm2d(torch::nn::BatchNorm2dOptions(3).momentum(c10::nullopt));
  torch::NoGradGuard no_grad;
  vflow::vnode::StatefulKernelSet kernels(*bn, 4);
  REQUIRE(kernels.size() == 1);
  for (int step = 0; step < 3; ++step) {
    const auto x = torch::randn({16, 3, 5, 5}) * (step + 1) + step;
    kernels.begin_step();
    for (int64_t v = 0; v < 4; ++v) {
      kernels.begin_vnode(v, v);
      bn->forward(x.slice(0, 4 * v, 4 * v + 4));
      kernels.end_vnode(v);
      reference->forward(x.slice(0, 4 * v, 4 * v + 4));
    }
    kernels.apply();
    CHECK(torch::allclose(bn->running_mean, reference->running_mean, 1e-6, 1e-7));
    CHECK(torch::allclose(bn->running_var, reference->running_var, 1e-6, 1e-7));
    CHECK(bn->num_batches_tracked.item<int64_t>() ==
          reference->num_batches_tracked.item<int64_t>());
  }
}

TEST_CASE("norm layers of different kinds and momenta share one running-statistics kernel",
          "[unit][numeric]") {
  torch::manual_seed(0);
  // Momentum 0.1, 0.3 and a cumulative average, batch norm and instance norm.
  struct Net : torch::nn::Module {
    torch::nn::BatchNorm2d a{torch::nn::BatchNorm2dOptions(3)};
    torch::nn::BatchNorm2d b{torch::nn::BatchNorm2dOptions(3).momentum(0.3)};
    torch::nn::BatchNorm2d c{torch::nn::BatchNorm2dOptions(3).momentum(c10::nullopt)};
    torch::nn::InstanceNorm2d d{torch::nn::InstanceNorm2dOptions(3).track_running_stats(true)};
    Net() {
      register_module("a", a);
      register_module("b", b);
      register_module("c", c);
      register_module("d", d);
    }
    torch::Tensor forward(const torch::Tensor& x) { return d(c(b(a(x)))); }
  };
  Net net, reference;
  torch::NoGradGuard no_grad;
  vflow::vnode::StatefulKernelSet kernels(net, 4);
  REQUIRE(kernels.size() == 4);
  for (int step = 0; step < 3; ++step) {
    const auto x = torch::randn({16, 3, 5, 5}) * (step + 1) + step;
    kernels.begin_step();
    for (int64_t v = 0; v < 4; ++v) {
      kernels.begin_vnode(v, v);
      net.forward(x.slice(0, 4 * v, 4 * v + 4));
      kernels.end_vnode(v);
      reference.forward(x.slice(0, 4 * v, 4 * v + 4));
    }
    kernels.apply();
    const auto got = net.buffers();
    const auto want = reference.buffers();
    REQUIRE(got.size() == 12);
    for (size_t i = 0; i < got.size(); ++i) {
      CAPTURE(step, i);
      CHECK(torch::allclose(got[i].to(torch::kDouble), want[i].to(torch::kDouble), 1e-6, 1e-7));
    }
  }
}

TEST_CASE("a norm layer registered twice has its statistics updated once", "[unit][numeric]") {
  torch::manual_seed(0);
  struct Net : torch::nn::Module {
    torch::nn::BatchNorm1d shared{torch::nn::BatchNorm1dOptions(4)};
    Net() {
      register_module("first", shared);
      register_module("again", shared);
    }
  };
  Net net;
  auto reference = torch::nn::BatchNorm1d(torch::nn::BatchNorm1dOptions(4));
  torch::NoGradGuard no_grad;
  vflow::vnode::StatefulKernelSet kernels(net, 3);
  REQUIRE(kernels.size() == 1);
  const auto x = torch::randn({12, 4}) * 3 + 1;
  kernels.begin_step();
  for (int64_t v = 0; v < 3; ++v) {
    kernels.begin_vnode(v, v);
    net.shared->forward(x.slice(0, 4 * v, 4 * v + 4));
    kernels.end_vnode(v);
    reference->forward(x.slice(0, 4 * v, 4 * v + 4));
  }
  kernels.apply();
  CHECK(torch::allclose(net.shared->running_mean, reference->running_mean, 1e-6, 1e-7));
  CHECK(torch::allclose(net.shared->running_var, reference->running_var, 1e-6, 1e-7));
  CHECK(net.shared->num_batches_tracked.item<int64_t>() == 3);
}

TEST_CASE("a view of a norm layer's own statistics does not count them twice", "[unit][numeric]") {
  torch::manual_seed(0);
  using vflow::vnode::RunningStatsView;
  struct Net : torch::nn::Module {
    torch::nn::BatchNorm1d bn{torch::nn::BatchNorm1dOptions(4)};
    RunningStatsView view{nullptr};
    explicit Net(std::optional<double> momentum) {
      // The view first, other tensor objects over the same memory, and no counter.
      view = register_module(
          "view", RunningStatsView(bn->running_mean.view({4}), bn->running_var.view({2, 2}),
                                   torch::Tensor(), momentum));
      register_module("bn", bn);
    }
  };
  torch::NoGradGuard no_grad;
  CHECK_THROWS_WITH(vflow::vnode::StatefulKernelSet(*std::make_shared<Net>(0.3), 3),
                    Catch::Contains("different momenta"));
  auto net = std::make_shared<Net>(0.1);
  auto reference = torch::nn::BatchNorm1d(torch::nn::BatchNorm1dOptions(4));
  vflow::vnode::StatefulKernelSet kernels(*net, 3);
  REQUIRE(kernels.size() == 1);
  const auto x = torch::randn({12, 4}) * 3 + 1;
  kernels.begin_step();
  for (int64_t v = 0; v < 3; ++v) {
    kernels.begin_vnode(v, v);
    net->bn->forward(x.slice(0, 4 * v, 4 * v + 4));
    kernels.end_vnode(v);
    reference->forward(x.slice(0, 4 * v, 4 * v + 4));
  }
  kernels.apply();
  CHECK(torch::allclose(net->bn->running_mean, reference->running_mean, 1e-6, 1e-7));
  CHECK(torch::allclose(net->bn->running_var, reference->running_var, 1e-6, 1e-7));
  // The module's counter is kept: a step that will not complete restores it too.
  CHECK(net->bn->num_batches_tracked.item<int64_t>() == 3);
  kernels.begin_step();
  kernels.begin_vnode(0, 0);
  net->bn->forward(x.slice(0, 0, 4));
  kernels.abort_step();
  CHECK(net->bn->num_batches_tracked.item<int64_t>() == 3);
}

TEST_CASE("a step that will not complete leaves the running statistics bit for bit", "[unit]") {
  auto bn = torch::nn::BatchNorm1d(torch::nn::BatchNorm1dOptions(4));
  torch::NoGradGuard no_grad;
  // -0.0 included: a copy made by adding to +0.0 would lose its sign.
  bn->running_mean.copy_(torch::tensor({-0.0F, 0.5F, -1.25F, 3.0F}));
  bn->running_var.copy_(torch::tensor({1.0F, 0.0F, 2.5F, 7.0F}));
  bn->num_batches_tracked.fill_(5);
  const auto mean = bn->running_mean.clone();
  const auto var = bn->running_var.clone();
  vflow::vnode::StatefulKernelSet kernels(*bn, 2);
  kernels.begin_step();
  kernels.begin_vnode(0, 0);
  bn->forward(torch::randn({8, 4}));
  kernels.end_vnode(0);
  kernels.abort_step();
  CHECK(torch::equal(bn->running_mean, mean));
  CHECK(torch::equal(bn->running_var, var));
  CHECK(std::signbit(bn->running_mean[0].item<float>()));
  CHECK(bn->num_batches_tracked.item<int64_t>() == 5);
}

TEST_CASE("user-registered stateful kernels are picked up", "[unit]") {
  struct Counter final : vflow::vnode::StatefulKernel {
    int* applied;
    explicit Counter(int* a) : applied(a) {}
    int64_t contribution_size() const override { return 1; }
    void begin_step() override {}
    void begin_vnode(int64_t) override {}
    void end_vnode(torch::Tensor out) override { out.fill_(2.0); }
    void apply(const std::vector<torch::Tensor>& rows) override {
      for (const auto& r : rows) *applied += static_cast<int>(r.item<float>());
    }
  };
  static int applied = 0;
  struct Marker : torch::nn::Module {};
  vflow::vnode::StatefulKernelSet::register_factory(
      [](torch::nn::Module& m) -> std::unique_ptr<vflow::vnode::StatefulKernel> {
        if (dynamic_cast<Marker*>(&m)) return std::make_unique<Counter>(&applied);
        return nullptr;
      });
  Marker marker;
  vflow::vnode::StatefulKernelSet kernels(marker, 3);
  REQUIRE(kernels.size() == 1);
  kernels.begin_step();
  for (int64_t v = 0; v < 3; ++v) {
    kernels.begin_vnode(v, v);
    kernels.end_vnode(v);
  }
  kernels.apply();
  CHECK(applied == 6);
}

TEST_CASE("deterministic jobs give the same fingerprint on every run", "[integration]") {
  const auto spec =
      vflow::testing::small_job({"semantic.deterministic=true", "resources.prefetch=true"});
  const auto first = vflow::engine::run_job(spec);
  const auto second = vflow::engine::run_job(spec);
  const auto no_prefetch = vflow::engine::run_job(
      vflow::testing::small_job({"semantic.deterministic=true", "resources.prefetch=false"}));
  const auto other_seed = vflow::engine::run_job(
      vflow::testing::small_job({"semantic.deterministic=true", "semantic.seed=4"}));
  CHECK(first.steps == 20);
  CHECK(first.fingerprint == second.fingerprint);
  CHECK(first.fingerprint == no_prefetch.fingerprint);
  CHECK(first.fingerprint != other_seed.fingerprint);
}

TEST_CASE("dropout inside vnode v of step s draws from a generator seeded by (seed, s, v)",
          "[unit]") {
  const int64_t n = 4;
  auto spec = vflow::testing::small_job({
      "semantic.model.name=mlp",
      "semantic.model.options={hidden: [64], dropout: 0.5}",
      "semantic.virtual_nodes=" + std::to_string(n),
      "semantic.optimizer={name: sgd, lr: 0, momentum: 0, weight_decay: 0}",
      "semantic.steps=2",
  });
  auto s = build(spec);
  Trainer trainer(spec, s.model, s.data);
  for (int64_t step = 0; step < 2; ++step) {
    const auto indices = as_tensor(trainer.batch_indices(step));
    trainer.train_step();
    s.reference->zero_grad();
    const int64_t size = indices.size(0);
    for (int64_t v = 0; v < n; ++v) {
      torch::manual_seed(vflow::vnode::mix_seed(spec.semantic.seed, static_cast<uint64_t>(step),
                                                static_cast<uint64_t>(v)));
      const auto b = s.data.train->get(indices.slice(0, v * size / n, (v + 1) * size / n));
      const auto loss =
          torch::nn::functional::cross_entropy(s.reference->forward(b.input), b.target);
      (loss * (static_cast<double>(b.target.size(0)) / static_cast<double>(size))).backward();
    }
    const auto got = s.model->parameters();
    const auto want = s.reference->parameters();
    for (size_t i = 0; i < got.size(); ++i) {
      CAPTURE(step, i);
      CHECK(torch::allclose(got[i].grad(), want[i].grad(), 1e-5, 1e-6));
    }
  }
}

TEST_CASE("relaxed vnode sizes: weighted gradients and batch norm per vnode still hold",
          "[unit][numeric]") {
  const std::string sizes = "semantic.vnode_sizes=[10, 2, 7, 5, 24]";  // B = 48, N = 5
  {
    const auto spec = vflow::testing::small_job(
        {"semantic.model={name: mlp, options: {hidden: [32, 16], dropout: 0}}",
         "semantic.data.options.train_size=100", sizes, "semantic.virtual_nodes=null",
         "semantic.optimizer={name: sgd, lr: 0, momentum: 0, weight_decay: 0}",
         "semantic.steps=3"});
    REQUIRE(spec.semantic.virtual_nodes == 5);
    CHECK_THAT(spec.semantic_yaml(), Catch::Contains("vnode_sizes"));  // part of the result
    check_one_batch_gradients(spec);
  }
  {
    // Batch norm: each vnode normalises over its own (unequal) slice; running
    // statistics follow torch's modules over the same slices in vnode order.
    auto spec = vflow::testing::small_job(
        {"semantic.model={name: mlp, options: {hidden: [32, 16], dropout: 0, batch_norm: true}}",
         "semantic.data.options.train_size=100", sizes, "semantic.virtual_nodes=null",
         "semantic.optimizer={name: sgd, lr: 0, momentum: 0, weight_decay: 0}",
         "semantic.steps=3"});
    const vflow::vnode::VirtualNodePlan plan(spec.semantic.global_batch, spec.semantic.vnode_sizes);
    CHECK(plan.slice(1, 48) == vflow::vnode::Slice{10, 2});
    CHECK(plan.slice(4, 48) == vflow::vnode::Slice{24, 24});
    check_sequential_statistics(spec, 6);  // two full batches and the tail of 4
  }
}
