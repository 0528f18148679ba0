// The optimizer update alone: vflow's fused SGD and AdamW against LibTorch's, on the
// parameters of the MLP 784-2048-2048-10 (5.8 M, as bench/ddp_compare.py --model
// mlp-wide trains), alternating blocks of steps between the two so that drift in the
// machine's speed affects both alike.
//   fused_update [--threads 1] [--steps 20] [--repeats 5] [--hidden 2048,2048]
#include "engine/fused_update.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "vflow/vnode/gradient_buffer.h"

namespace {

using Clock = std::chrono::steady_clock;

/// The MLP's parameters, with their gradients as views into one flat buffer (as the
/// engine's step packet holds them), filled with a gradient.
struct Parameters {
  explicit Parameters(const std::vector<int64_t>& hidden) {
    torch::manual_seed(1);
    int64_t width = 784;
    for (int64_t h : hidden) {
      add({h, width});
      add({h});
      width = h;
    }
    add({10, width});
    add({10});
    buffer = std::make_unique<vflow::vnode::GradientBuffer>(params);
    buffer->flat().normal_(0, 1e-3);
  }
  void add(std::vector<int64_t> shape) {
    params.push_back((torch::randn(shape) * 0.02).requires_grad_());
  }
  std::vector<torch::Tensor> params;
  std::unique_ptr<vflow::vnode::GradientBuffer> buffer;
};

double milliseconds_per_step(torch::optim::Optimizer& o, int steps) {
  const auto t0 = Clock::now();
  for (int i = 0; i < steps; ++i) o.step();
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / steps;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"vflow's fused optimizer update against LibTorch's"};
  int threads = 1, steps = 20, repeats = 5;
  std::vector<int64_t> hidden = {2048, 2048};
  app.add_option("--threads", threads, "intra-op threads");
  app.add_option("--steps", steps, "steps per timed block");
  app.add_option("--repeats", repeats, "timed blocks per optimizer");
  app.add_option("--hidden", hidden, "the MLP's hidden widths")->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(threads);

  vflow::engine::OptimizerSpec sgd;
  sgd.name = "sgd";  // momentum 0.9, Nesterov, weight decay 5e-4: the defaults
  vflow::engine::OptimizerSpec adamw;
  adamw.name = "adamw";
  adamw.lr = 1e-3;
  adamw.weight_decay = 0.01;

  int64_t numel = 0;
  std::printf("| optimizer | LibTorch ms/step | fused ms/step | speed-up |\n|---|---|---|---|\n");
  for (const auto& spec : {sgd, adamw}) {
    Parameters a(hidden), b(hidden);
    numel = a.buffer->gradients().numel();
    std::unique_ptr<torch::optim::Optimizer> libtorch;
    if (spec.name == "sgd") {
      libtorch =
          std::make_unique<torch::optim::SGD>(a.params, torch::optim::SGDOptions(spec.lr)
                                                            .momentum(spec.momentum)
                                                            .nesterov(spec.nesterov)
                                                            .weight_decay(spec.weight_decay));
    } else {
      libtorch = std::make_unique<torch::optim::AdamW>(
          a.params, torch::optim::AdamWOptions(spec.lr).weight_decay(spec.weight_decay));
    }
    auto fused = vflow::engine::make_fused_optimizer(spec, b.params);
    milliseconds_per_step(*libtorch, 2);  // state allocated, caches warm
    milliseconds_per_step(*fused, 2);
    std::vector<double> tl, tf;
    for (int r = 0; r < repeats; ++r) {
      tl.push_back(milliseconds_per_step(*libtorch, steps));
      tf.push_back(milliseconds_per_step(*fused, steps));
    }
    std::sort(tl.begin(), tl.end());
    std::sort(tf.begin(), tf.end());
    const double ml = tl[tl.size() / 2], mf = tf[tf.size() / 2];
    std::printf("| %s | %.2f (%.2f-%.2f) | %.2f (%.2f-%.2f) | %.2fx |\n", spec.name.c_str(), ml,
                tl.front(), tl.back(), mf, tf.front(), tf.back(), ml / mf);
  }
  std::printf("\n%ld parameters, %d thread(s), medians (min-max) of %d blocks of %d steps\n",
              static_cast<long>(numel), threads, repeats, steps);
  return 0;
}
