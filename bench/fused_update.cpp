// The optimizer update alone: vflow's fused SGD and AdamW against LibTorch's, on the
// parameters of the MLP 784-2048-2048-10 (5.8 M, as bench/ddp_compare.py --model
// mlp-wide trains), alternating blocks of steps between the two so that drift in the
// machine's speed affects both alike. A second table times deterministic mode's update
// from the reduced integer sums: assembled into floats and then stepped, against the
// fused step reading the sums where they lie.
//   fused_update [--threads 1] [--steps 20] [--repeats 5] [--hidden 2048,2048]
#include "engine/fused_update.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "vflow/engine/runtime.h"
#include "vflow/engine/trainer.h"
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

template <typename F>
double milliseconds_per_call(F f, int calls) {
  const auto t0 = Clock::now();
  for (int i = 0; i < calls; ++i) f();
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / calls;
}

/// Median (min-max) of `a` and of `b`, timed in alternating blocks, as a table row.
template <typename A, typename B>
void print_row(const std::string& name, A a, B b, int steps, int repeats) {
  milliseconds_per_call(a, 2);  // state allocated, caches warm
  milliseconds_per_call(b, 2);
  std::vector<double> ta, tb;
  for (int r = 0; r < repeats; ++r) {
    ta.push_back(milliseconds_per_call(a, steps));
    tb.push_back(milliseconds_per_call(b, steps));
  }
  std::sort(ta.begin(), ta.end());
  std::sort(tb.begin(), tb.end());
  const double ma = ta[ta.size() / 2], mb = tb[tb.size() / 2];
  std::printf("| %s | %.2f (%.2f-%.2f) | %.2f (%.2f-%.2f) | %.2fx |\n", name.c_str(), ma,
              ta.front(), ta.back(), mb, tb.front(), tb.back(), ma / mb);
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
  vflow::engine::set_intra_op_threads(threads);

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
    print_row(
        spec.name, [&] { libtorch->step(); }, [&] { fused->step(); }, steps, repeats);
  }

  // Deterministic mode: the summed dense int32 part and about one listed value in 5,000,
  // as two workers of this MLP give them.
  std::printf(
      "\n| deterministic, %s | assemble, then step ms | step from the sums ms | speed-up "
      "|\n|---|---|---|---|\n",
      "2 workers' sums");
  for (const auto& spec : {sgd, adamw}) {
    Parameters a(hidden), b(hidden);
    const auto dense = torch::randint(-(1 << 24), 1 << 24, {numel}, torch::kInt32);
    const auto index =
        std::get<0>(torch::randperm(numel, torch::kInt64).narrow(0, 0, numel / 5000).sort());
    const auto value =
        torch::randint(int64_t{1} << 31, int64_t{1} << 33, {index.numel()}, torch::kInt64);
    auto assembled = vflow::engine::make_fused_optimizer(spec, a.params);
    auto direct = vflow::engine::make_fused_optimizer(spec, b.params);
    auto& from_sums = dynamic_cast<vflow::engine::FixedPointStep&>(*direct);
    auto flat = a.buffer->flat();
    print_row(
        spec.name,
        [&] {
          vflow::vnode::FixedPointSum::assemble(dense, index, value, flat);
          assembled->step();
        },
        [&] {
          from_sums.step_fixed_point(
              vflow::vnode::FixedPointSum::reduced(dense, index, value, numel));
        },
        steps, repeats);
  }
  std::printf("\n%ld parameters, %d thread(s), medians (min-max) of %d blocks of %d steps\n",
              static_cast<long>(numel), threads, repeats, steps);
  return 0;
}
