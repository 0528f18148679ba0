// Throughput and peak memory of vflow's virtual-node step against a plain,
// hand-written LibTorch loop doing the same gradient accumulation, with the
// same model, micro-batch, optimizer and data, measured side by side.
//
// Each measurement runs in its own child process (so peak RSS is its own);
// children alternate vflow / plain and repeat, and the table reports medians.
//   vnode_overhead [--vnodes 1,2,4,8,16,32] [--micro-batch 32] [--examples 4096] [--repeats 3]
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>

#include "vflow/vflow.h"

namespace {

struct Config {
  int64_t vnodes = 1;
  int64_t micro_batch = 32;
  int64_t examples = 4096;  // examples trained per measurement (after warm-up)
  int64_t threads = 1;
  std::vector<int64_t> channels = {16, 32};
};

constexpr int64_t kDatasetSize = 8192;

vflow::engine::JobSpec job_for(const Config& c, int64_t steps) {
  vflow::SpecNode root = vflow::parse_yaml(fmt::format(R"(
semantic:
  model: {{name: convnet, options: {{channels: [{}], hidden: 128, dropout: 0.25, batch_norm: true}}}}
  data: {{name: synthetic, options: {{train_size: {}, test_size: 0, shape: [1, 28, 28], classes: 10}}}}
  global_batch: {}
  virtual_nodes: {}
  optimizer: {{name: sgd, lr: 0.01, momentum: 0.9, nesterov: false, weight_decay: 0}}
  schedule: {{name: constant}}
  steps: {}
resources: {{threads: {}}}
output: {{evaluation: {{enabled: false}}, logging: {{progress: off}}}}
)", fmt::join(c.channels, ", "), kDatasetSize, c.vnodes * c.micro_batch, c.vnodes, steps, c.threads),
                                           "<bench job>");
  return vflow::engine::parse_job_spec(root);
}

int64_t peak_rss_kb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

using Clock = std::chrono::steady_clock;
constexpr int64_t kWarmupSteps = 2;

/// vflow: the engine's own step.
double run_vflow(const Config& c, int64_t steps) {
  auto trainer = vflow::engine::make_trainer(job_for(c, steps + kWarmupSteps));
  for (int64_t i = 0; i < kWarmupSteps; ++i) trainer->train_step();
  const auto t0 = Clock::now();
  for (int64_t i = 0; i < steps; ++i) trainer->train_step();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// The plain loop a LibTorch user would write for the same accumulation.
double run_plain(const Config& c, int64_t steps) {
  const auto spec = job_for(c, steps + kWarmupSteps);
  vflow::engine::configure_runtime(spec);
  vflow::data::SyntheticOptions data_options;
  data_options.size = kDatasetSize;
  auto data = vflow::data::make_synthetic(data_options);
  vflow::engine::seed_initialisation(spec.semantic);
  vflow::models::ConvNetOptions model_options;
  model_options.channels = c.channels;
  auto model = std::make_shared<vflow::models::ConvNet>(model_options, vflow::models::ModelContext{{1, 28, 28}, 10});
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  const auto perm = torch::randperm(kDatasetSize, torch::kInt64);
  int64_t cursor = 0;
  auto step = [&] {
    optimizer.zero_grad();
    for (int64_t v = 0; v < c.vnodes; ++v) {
      if (cursor + c.micro_batch > kDatasetSize) cursor = 0;
      const auto batch = data->get(perm.narrow(0, cursor, c.micro_batch));
      cursor += c.micro_batch;
      const auto loss = torch::nn::functional::cross_entropy(model->forward(batch.input), batch.target);
      (loss / static_cast<double>(c.vnodes)).backward();
    }
    optimizer.step();
  };
  for (int64_t i = 0; i < kWarmupSteps; ++i) step();
  const auto t0 = Clock::now();
  for (int64_t i = 0; i < steps; ++i) step();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Measurement {
  double seconds = 0;
  int64_t rss_kb = 0;
};

Measurement run_child(const std::string& self, const std::string& kind, const Config& c) {
  const std::string cmd = fmt::format("{} --child {} --vnodes {} --micro-batch {} --examples {} --threads {} --channels {}",
                                      self, kind, c.vnodes, c.micro_batch, c.examples, c.threads,
                                      fmt::join(c.channels, ","));
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot start " + cmd);
  Measurement m;
  char line[256];
  bool ok = false;
  while (std::fgets(line, sizeof line, pipe)) {
    ok = ok || std::sscanf(line, "RESULT %lf %ld", &m.seconds, &m.rss_kb) == 2;
  }
  if (pclose(pipe) != 0 || !ok) throw std::runtime_error("child failed: " + cmd);
  return m;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"vflow virtual-node overhead against a plain LibTorch loop"};
  std::string child;
  std::vector<int64_t> vnodes = {1, 2, 4, 8, 16, 32};
  Config c;
  int repeats = 3;
  app.add_option("--child", child, "internal: run one measurement (vflow or plain)");
  app.add_option("--vnodes", vnodes, "vnode counts to measure")->delimiter(',');
  app.add_option("--micro-batch", c.micro_batch, "vnode size b");
  app.add_option("--examples", c.examples, "examples per measurement");
  app.add_option("--threads", c.threads, "intra-op threads");
  app.add_option("--channels", c.channels, "ConvNet channels")->delimiter(',');
  app.add_option("--repeats", repeats, "measurements per configuration");
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::warn);

  if (!child.empty()) {
    c.vnodes = vnodes.front();
    const int64_t steps = std::max<int64_t>(1, c.examples / (c.vnodes * c.micro_batch));
    const double seconds = child == "vflow" ? run_vflow(c, steps) : run_plain(c, steps);
    std::printf("RESULT %.6f %ld\n", seconds * static_cast<double>(c.examples) /
                                         static_cast<double>(steps * c.vnodes * c.micro_batch),
                peak_rss_kb());
    return 0;
  }

  std::cout << fmt::format("ConvNet channels [{}], micro-batch b={}, {} examples per measurement, "
                           "{} intra-op thread(s), median of {} alternating runs\n\n",
                           fmt::join(c.channels, ", "), c.micro_batch, c.examples, c.threads, repeats);
  std::cout << "| V | B | vflow ex/s | plain ex/s | ratio | vflow peak RSS MiB | plain peak RSS MiB |\n";
  std::cout << "|---|---|---|---|---|---|---|\n";
  double rss_first = 0, rss_last = 0;
  for (int64_t v : vnodes) {
    c.vnodes = v;
    std::vector<double> tv, tp, rv, rp;
    for (int r = 0; r < repeats; ++r) {
      const auto a = run_child(argv[0], "vflow", c);
      const auto b = run_child(argv[0], "plain", c);
      tv.push_back(a.seconds);
      tp.push_back(b.seconds);
      rv.push_back(static_cast<double>(a.rss_kb) / 1024.0);
      rp.push_back(static_cast<double>(b.rss_kb) / 1024.0);
    }
    const double ev = static_cast<double>(c.examples) / median(tv);
    const double ep = static_cast<double>(c.examples) / median(tp);
    if (v == vnodes.front()) rss_first = median(rv);
    rss_last = median(rv);
    std::cout << fmt::format("| {} | {} | {:.0f} | {:.0f} | {:.3f} | {:.1f} | {:.1f} |\n", v, v * c.micro_batch,
                             ev, ep, ev / ep, median(rv), median(rp));
    std::cout.flush();
  }
  std::cout << fmt::format("\nvflow peak RSS from V={} to V={}: {:+.2f}%\n", vnodes.front(), vnodes.back(),
                           100.0 * (rss_last - rss_first) / rss_first);
  return 0;
}
