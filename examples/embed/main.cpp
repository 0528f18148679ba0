// Embedding vflow: your own module, your own data set, a job built in code,
// and a hook on every epoch. Exits non-zero if the model did not learn.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>
#include <vflow/vflow.h>

#include <cmath>
#include <iostream>

namespace {

// Two interleaved spirals: a task a linear model cannot solve.
class Spirals final : public vflow::data::Dataset {
 public:
  Spirals(int64_t n, uint64_t seed) {
    auto gen = at::detail::createCPUGenerator(seed);
    const auto t = torch::rand({n}, gen) * 3.0 * M_PI + 0.5;
    labels_ = torch::randint(2, {n}, gen, torch::kInt64);
    const auto sign = labels_.to(torch::kFloat32) * 2 - 1;
    const auto x = sign * t * torch::cos(t) / 10 + 0.05 * torch::randn({n}, gen);
    const auto y = sign * t * torch::sin(t) / 10 + 0.05 * torch::randn({n}, gen);
    points_ = torch::stack({x, y}, 1);
  }
  int64_t size() const override { return points_.size(0); }
  vflow::data::DataInfo info() const override { return {{2}, 2}; }
  vflow::data::Batch get(const torch::Tensor& indices) const override {
    return {points_.index_select(0, indices), labels_.index_select(0, indices)};
  }

 private:
  torch::Tensor points_, labels_;
};

// Your own module: anything deriving from vflow::models::Model.
class SpiralNet final : public vflow::models::Model {
 public:
  SpiralNet() {
    net_ = register_module(
        "net", torch::nn::Sequential(torch::nn::Linear(2, 64), torch::nn::Tanh(),
                                     torch::nn::BatchNorm1d(64), torch::nn::Linear(64, 64),
                                     torch::nn::Tanh(), torch::nn::Linear(64, 2)));
  }
  torch::Tensor forward(const torch::Tensor& x) override { return net_->forward(x); }

 private:
  torch::nn::Sequential net_{nullptr};
};

// A hook: print the test accuracy at the end of every epoch.
class EpochPrinter final : public vflow::engine::TrainingObserver {
 public:
  void on_evaluation(vflow::engine::Trainer&, const vflow::engine::EvalResult& r) override {
    std::cout << "step " << r.step << ": accuracy " << r.accuracy << "\n";
  }
};

}  // namespace

int main() {
  try {
    vflow::engine::JobSpec spec;  // every field has its documented default
    spec.semantic.model.name = "spiralnet";
    spec.semantic.data.name = "spirals";
    spec.semantic.global_batch = 128;
    spec.semantic.virtual_nodes = 4;
    spec.semantic.optimizer.name = "adamw";
    spec.semantic.optimizer.lr = 0.01;
    spec.semantic.optimizer.weight_decay = 0.0;
    spec.semantic.epochs = 40;
    spec.semantic.deterministic = true;
    spec.resources.threads = 1;
    spec.output.logging.progress = "off";
    vflow::engine::validate(spec, /*check_components=*/false);
    vflow::engine::configure_runtime(spec);

    vflow::data::DataSplits data{std::make_shared<Spirals>(2048, 1),
                                 std::make_shared<Spirals>(512, 2)};
    vflow::engine::seed_initialisation(spec.semantic);
    auto model = std::make_shared<SpiralNet>();

    vflow::engine::Trainer trainer(spec, model, data);
    trainer.add_observer(
        std::make_shared<vflow::engine::EvaluationObserver>(spec.output.evaluation));
    trainer.add_observer(std::make_shared<EpochPrinter>());
    const auto result = trainer.run();
    std::cout << "fingerprint " << result.fingerprint << "\n";
    return result.evaluation && result.evaluation->accuracy > 0.9 ? 0 : 1;
  } catch (const vflow::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
}
