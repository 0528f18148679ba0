// Throughput and peak memory of vflow's virtual-node step against a plain,
// hand-written LibTorch loop doing the same gradient accumulation, with the
// same model, micro-batch, optimizer and data, measured side by side; or, with
// --against deterministic, the engine's step in deterministic mode against its
// default mode (semantic.deterministic), the same way.
//
// Throughput: each child process builds both loops and alternates blocks of
// steps between them, so drift in the machine's speed affects both alike; the
// table reports the median over repeated children. Peak RSS: one child per
// loop, so each process's high-water mark is its own. Against deterministic mode,
// each block sets LibTorch's deterministic-algorithms flags (process-wide; on a
// GPU they choose cuDNN's kernels) to its own trainer's mode before it runs. With
// --workers K (against deterministic, on the CPU) a measurement is K processes on one
// communicator (Gloo over loopback, the shared-memory sums of ranks on one host), each
// with both trainers, the V vnodes split over them as in a job; rank 0's figures count.
//   vnode_overhead [--model convnet|mlp-wide|resnet18|bert-tiny|bert-mini|lm]
//                  [--vnodes 1,2,4,8,16,32] [--micro-batch 32] [--examples 8192] [--repeats 5]
//                  [--device cpu|cuda:0] [--optimizer sgd|adamw]
//                  [--against plain|deterministic] [--workers 1]
// On a CUDA device the timed blocks end with a device synchronisation, and the memory
// column is the device memory the process holds at the end (cudaMemGetInfo, which
// counts LibTorch's caching allocator at its high-water mark) instead of the peak RSS.
// Models: the ConvNet on synthetic 28x28 images, the MLP 784-2048-2048-10 (mlp-wide) on the
// same images, a ResNet-18 (width 16 unless --width) on
// synthetic 3x32x32 images, BERT-tiny on the fortunes-langid sentences (64 tokens), and
// the transformer-lm of examples/jobs/fortunes-lm.yaml (lm: 2 layers of 128, 64 tokens).
#include <dlfcn.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <type_traits>

#include "core/torch_compat.h"
#include "vflow/core/address.h"
#include "vflow/core/clock.h"
#include "vflow/engine/runtime.h"
#include "vflow/vflow.h"

namespace {

struct Config {
  int64_t vnodes = 1;
  int64_t micro_batch = 32;
  int64_t examples = 8192;  // examples trained per measurement (after warm-up)
  int64_t threads = 1;
  std::vector<int64_t> channels = {16, 32};
  std::string model = "convnet";
  std::string device = "cpu";
  int64_t width = 16;             // resnet18: channels of the first stage (64 = the real ResNet-18)
  std::string optimizer = "sgd";  // sgd or adamw, for both loops
  std::string against = "plain";  // the second loop: plain (LibTorch) or deterministic (vflow)
  int workers = 1;                // against deterministic: worker processes, over Gloo
  int rank = 0;                   // a child's rank among them
  int port = 0;                   // their store's port on 127.0.0.1 (rank 0 hosts it)
};

constexpr int64_t kDatasetSize = 8192;
constexpr int64_t kWarmupSteps = 2;
constexpr int64_t kBlocks = 8;
using Clock = std::chrono::steady_clock;

// The model and data sections of each benchmarked workload.
std::pair<std::string, std::string> workload(const Config& c) {
  if (c.model == "resnet18") {
    return {fmt::format("{{name: resnet, options: {{depth: 18, width: {}}}}}", c.width),
            fmt::format("{{name: synthetic, options: {{train_size: {}, test_size: 0, shape: [3, "
                        "32, 32], classes: 10}}}}",
                        kDatasetSize)};
  }
  if (c.model == "mlp-wide") {  // 5.8 M parameters: communication- and update-heavy
    return {
        "{name: mlp, options: {hidden: [2048, 2048], dropout: 0}}",
        fmt::format("{{name: synthetic, options: {{train_size: {}, test_size: 0, shape: [1, 28, "
                    "28], classes: 10}}}}",
                    kDatasetSize)};
  }
  if (c.model == "lm") {  // examples/jobs/fortunes-lm.yaml's model and data
    return {"{name: transformer-lm, options: {layers: 2, hidden: 128, heads: 4}}",
            "{name: fortunes-lm, options: {context: 64}}"};
  }
  if (c.model == "bert-tiny" || c.model == "bert-mini") {
    return {fmt::format("{{name: bert, options: {{preset: {}}}}}", c.model.substr(5)),
            "{name: fortunes-langid, options: {max_length: 64}}"};
  }
  return {fmt::format("{{name: convnet, options: {{channels: [{}], hidden: 128, dropout: 0.25, "
                      "batch_norm: true}}}}",
                      fmt::join(c.channels, ", ")),
          fmt::format("{{name: synthetic, options: {{train_size: {}, test_size: 0, shape: [1, 28, "
                      "28], classes: 10}}}}",
                      kDatasetSize)};
}

/// resources.prefetch: auto in one process, as a launched worker resolves it for K
/// workers on this host (on where their intra-op threads leave a core free).
std::string prefetch(const Config& c) {
  if (c.workers == 1) return "auto";
  vflow::engine::ResourcesSpec r;
  r.threads = c.threads;
  return vflow::engine::prefetch_enabled(r, c.workers) ? "true" : "false";
}

/// The optimizer, the same on both sides: SGD with momentum, or AdamW as the transformer
/// jobs of examples/jobs train.
std::string optimizer_section(const Config& c) {
  return c.optimizer == "adamw"
             ? "{name: adamw, lr: 0.001, beta1: 0.9, beta2: 0.999, eps: 1.0e-8, weight_decay: 0.01}"
             : "{name: sgd, lr: 0.01, momentum: 0.9, nesterov: false, weight_decay: 0}";
}

vflow::engine::JobSpec job_for(const Config& c, int64_t steps, bool deterministic = false) {
  const auto [model, data] = workload(c);
  const std::string text =
      fmt::format(R"(
semantic:
  model: {}
  data: {}
  global_batch: {}
  virtual_nodes: {}
  deterministic: {}
  optimizer: {}
  schedule: {{name: constant}}
  steps: {}
resources: {{threads: {}, device: '{}', prefetch: {}}}
output: {{evaluation: {{enabled: false}}, logging: {{progress: off}}}}
)",
                  model, data, c.vnodes * c.micro_batch, c.vnodes, deterministic,
                  optimizer_section(c), steps, c.threads, c.device, prefetch(c));
  return vflow::engine::parse_job_spec(vflow::parse_yaml(text, "<bench job>"));
}

int64_t peak_rss_kb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

/// Device memory in use on the current CUDA device, in KiB (CUDA's runtime is looked up
/// at run time, so the benchmark needs no CUDA headers); -1 when unavailable.
int64_t device_memory_kb() {
  void* cudart = dlopen("libcudart.so", RTLD_NOW | RTLD_NOLOAD);
  for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
    if (!cudart) cudart = dlopen(name, RTLD_NOW);
  }
  if (!cudart) return -1;
  using MemGetInfo = int (*)(size_t*, size_t*);
  const auto get = reinterpret_cast<MemGetInfo>(dlsym(cudart, "cudaMemGetInfo"));
  size_t free_bytes = 0, total_bytes = 0;
  if (!get || get(&free_bytes, &total_bytes) != 0) return -1;
  return static_cast<int64_t>((total_bytes - free_bytes) / 1024);
}

int64_t memory_kb(const Config& c) {
  return c.device == "cpu" ? peak_rss_kb() : device_memory_kb();
}

void synchronize(const Config& c) {
  if (c.device != "cpu") torch::cuda::synchronize();
}

/// This child's communicator among --workers processes; none for one.
std::shared_ptr<vflow::comm::Communicator> communicator(const Config& c) {
  if (c.workers == 1) return nullptr;
  vflow::comm::Rendezvous r;
  r.store_port = c.port;
  r.host_store = c.rank == 0;
  r.rank = c.rank;
  r.world_size = c.workers;
  r.generation = "bench";
  r.timeout = std::chrono::seconds(120);
  return vflow::comm::make_communicator(r);
}

/// vflow: the engine's own step, in its default or deterministic mode.
class VflowRunner {
 public:
  VflowRunner(const Config& c, int64_t steps, bool deterministic = false,
              std::shared_ptr<vflow::comm::Communicator> comm = nullptr)
      : trainer_(vflow::engine::make_trainer(job_for(c, steps + kWarmupSteps, deterministic),
                                             std::move(comm))),
        deterministic_(deterministic) {}
  void step() {
    // The flags are the process's, and another trainer may have set them since.
    vflow::compat::set_deterministic_algorithms(deterministic_);
    const auto info = trainer_->train_step();
    phases_[0] += info.compute_seconds;
    phases_[1] += info.sync_seconds;
    phases_[2] += info.update_seconds;
    ++steps_;
  }
  /// The mean compute, sync and update phase of the steps so far, in ms.
  std::array<double, 3> phases_ms() const {
    std::array<double, 3> ms{};
    for (size_t k = 0; k < ms.size(); ++k)
      ms[k] = 1000.0 * phases_[k] / std::max<int64_t>(1, steps_);
    return ms;
  }
  void reset_phases() {
    phases_ = {};
    steps_ = 0;
  }
  std::string fingerprint() const { return trainer_->fingerprint(); }

 private:
  std::unique_ptr<vflow::engine::Trainer> trainer_;
  bool deterministic_;
  std::array<double, 3> phases_{};
  int64_t steps_ = 0;
};

/// The plain loop a LibTorch user would write for the same accumulation.
class PlainRunner {
 public:
  PlainRunner(const Config& c, int64_t steps) : c_(c) {
    const auto spec = job_for(c, steps + kWarmupSteps);
    vflow::engine::configure_runtime(spec);
    // The same data set and model as the engine builds, from the same registries.
    const auto& sem = spec.semantic;
    const vflow::SpecNode none;
    auto prepared =
        vflow::data::DataRegistry::global().prepare(sem.data.name, none, sem.data.options);
    data_ = prepared.load().train;
    vflow::engine::seed_initialisation(sem);
    model_ = vflow::models::ModelRegistry::global().prepare(
        sem.model.name, none, sem.model.options,
        {prepared.info.input_shape, prepared.info.num_classes, prepared.info.vocab_size})();
    if (c.optimizer == "adamw") {
      optimizer_ = std::make_unique<torch::optim::AdamW>(
          model_->parameters(), torch::optim::AdamWOptions(0.001).weight_decay(0.01));
    } else {
      optimizer_ = std::make_unique<torch::optim::SGD>(
          model_->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    }
    device_ = vflow::engine::worker_device(spec.resources);
    model_->to(device_);
    perm_ = torch::randperm(data_->size(), torch::kInt64);
  }

  void step() {
    optimizer_->zero_grad();
    for (int64_t v = 0; v < c_.vnodes; ++v) {
      if (cursor_ + c_.micro_batch > data_->size()) cursor_ = 0;
      auto batch = data_->get(perm_.narrow(0, cursor_, c_.micro_batch));
      cursor_ += c_.micro_batch;
      if (device_.is_cuda()) {
        batch.input = batch.input.pin_memory().to(device_, /*non_blocking=*/true);
        batch.target = batch.target.pin_memory().to(device_, /*non_blocking=*/true);
      }
      const auto loss = vflow::models::prediction_loss(model_->forward(batch.input), batch.target);
      (loss / static_cast<double>(c_.vnodes)).backward();
    }
    optimizer_->step();
  }

 private:
  Config c_;
  std::shared_ptr<vflow::data::Dataset> data_;
  std::shared_ptr<vflow::models::Model> model_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  torch::Tensor perm_;
  torch::Device device_ = torch::kCPU;
  int64_t cursor_ = 0;
};

template <typename Runner>
double timed_steps(Runner& runner, int64_t steps, const Config& c) {
  synchronize(c);
  const auto t0 = Clock::now();
  for (int64_t i = 0; i < steps; ++i) runner.step();
  synchronize(c);
  return vflow::seconds_since(t0);
}

/// Both loops warmed up, then blocks of steps alternating between them; prints
/// "RESULT a b", each loop's examples/s.
template <typename A, typename B>
int alternate(A& a, B& b, int64_t steps, const Config& c) {
  timed_steps(a, kWarmupSteps, c);
  timed_steps(b, kWarmupSteps, c);
  if constexpr (std::is_same_v<B, VflowRunner>) {  // the phases of the timed steps only
    a.reset_phases();
    b.reset_phases();
  }
  double ta = 0, tb = 0;
  for (int64_t k = 0; k < kBlocks; ++k) {
    const int64_t n = steps * (k + 1) / kBlocks - steps * k / kBlocks;
    ta += timed_steps(a, n, c);
    tb += timed_steps(b, n, c);
  }
  const double trained = static_cast<double>(steps * c.vnodes * c.micro_batch);
  std::printf("RESULT %.3f %.3f\n", trained / ta, trained / tb);
  return 0;
}

/// One measurement in this process; prints "RESULT a b".
int child_main(const std::string& mode, const Config& c) {
  const int64_t steps = std::max<int64_t>(1, c.examples / (c.vnodes * c.micro_batch));
  const auto comm = communicator(c);
  if (mode == "memory-vflow" || mode == "memory-deterministic") {
    VflowRunner r(c, steps, /*deterministic=*/mode == "memory-deterministic", comm);
    std::printf("RESULT %.6f %ld\n", timed_steps(r, steps + kWarmupSteps, c), memory_kb(c));
    return 0;
  }
  if (mode == "memory-plain") {
    PlainRunner r(c, steps);
    std::printf("RESULT %.6f %ld\n", timed_steps(r, steps + kWarmupSteps, c), memory_kb(c));
    return 0;
  }
  if (mode == "plain") {
    // The plain loop alone (examples/s), e.g. as one of K loops run side by side.
    PlainRunner r(c, steps);
    timed_steps(r, kWarmupSteps, c);
    const double seconds = timed_steps(r, steps, c);
    std::printf("RESULT %.3f 0\n", static_cast<double>(steps * c.vnodes * c.micro_batch) / seconds);
    return 0;
  }
  // Both trainers on one communicator: every rank runs the same blocks in the same order.
  VflowRunner vflow_runner(c, steps, /*deterministic=*/false, comm);
  if (c.against == "deterministic") {
    VflowRunner exact_runner(c, steps, /*deterministic=*/true, comm);
    const int result = alternate(vflow_runner, exact_runner, steps, c);
    const auto a = vflow_runner.phases_ms(), b = exact_runner.phases_ms();
    std::printf("PHASES %.3f %.3f %.3f %.3f %.3f %.3f\n", a[0], a[1], a[2], b[0], b[1], b[2]);
    // What the deterministic trainer computed: the same on every rank, and for every
    // --workers (tests/scripts/bench_determinism.sh).
    std::printf("FINGERPRINT %s\n", exact_runner.fingerprint().c_str());
    return result;
  }
  PlainRunner plain_runner(c, steps);
  return alternate(vflow_runner, plain_runner, steps, c);
}

struct Pair {
  double a = 0;
  double b = 0;
  std::array<double, 6> phases{};  // against deterministic: both trainers' mean phases, ms
  std::string fingerprint;         // against deterministic: the deterministic trainer's
};

/// The fingerprint a child printed in `line`, or empty.
std::string fingerprint_in(const char* line) {
  char text[64] = {};
  return std::sscanf(line, "FINGERPRINT %63s", text) == 1 ? text : "";
}

/// One measurement: a child process, or --workers of them (rank 0's result).
Pair run_child(const std::string& self, const std::string& mode, const Config& c) {
  const int port = c.workers > 1 ? vflow::free_loopback_port() : 0;
  const auto command = [&](int rank) {
    return fmt::format(
        "{} --child {} --model {} --vnodes {} --micro-batch {} --examples {} --threads {} "
        "--channels {} --device {} --width {} --optimizer {} --against {} --workers {} --rank {} "
        "--port {}",
        self, mode, c.model, c.vnodes, c.micro_batch, c.examples, c.threads,
        fmt::join(c.channels, ","), c.device, c.width, c.optimizer, c.against, c.workers, rank,
        port);
  };
  std::vector<FILE*> others;  // ranks 1.., their output read (and ignored) at the end
  for (int rank = 1; rank < c.workers; ++rank) {
    FILE* other = popen(command(rank).c_str(), "r");
    if (!other) throw std::runtime_error("cannot start " + command(rank));
    others.push_back(other);
  }
  FILE* pipe = popen(command(0).c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot start " + command(0));
  Pair p;
  char line[256];
  bool ok = false;
  while (std::fgets(line, sizeof line, pipe)) {
    ok = ok || std::sscanf(line, "RESULT %lf %lf", &p.a, &p.b) == 2;
    auto& f = p.phases;
    std::sscanf(line, "PHASES %lf %lf %lf %lf %lf %lf", &f[0], &f[1], &f[2], &f[3], &f[4], &f[5]);
    if (const auto fp = fingerprint_in(line); !fp.empty()) p.fingerprint = fp;
  }
  ok = pclose(pipe) == 0 && ok;
  for (FILE* other : others) {
    while (std::fgets(line, sizeof line, other)) {
      const auto fp = fingerprint_in(line);
      if (!fp.empty() && fp != p.fingerprint) {
        throw std::runtime_error(fmt::format(
            "the deterministic trainers of one measurement differ: rank 0 ended with {}, "
            "another rank with {}",
            p.fingerprint, fp));
      }
    }
    ok = pclose(other) == 0 && ok;
  }
  if (!ok) throw std::runtime_error("child failed: " + command(0));
  return p;
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
  int repeats = 5;
  app.add_option("--child", child,
                 "one measurement: throughput, memory-vflow, memory-deterministic, memory-plain, "
                 "plain");
  app.add_option("--vnodes", vnodes, "vnode counts to measure")->delimiter(',');
  app.add_option("--micro-batch", c.micro_batch, "vnode size b");
  app.add_option("--examples", c.examples, "examples per loop per measurement");
  app.add_option("--threads", c.threads, "intra-op threads");
  app.add_option("--channels", c.channels, "ConvNet channels")->delimiter(',');
  app.add_option("--model", c.model, "convnet, mlp-wide, resnet18, bert-tiny, bert-mini or lm")
      ->check(CLI::IsMember({"convnet", "mlp-wide", "resnet18", "bert-tiny", "bert-mini", "lm"}));
  app.add_option("--optimizer", c.optimizer, "sgd (momentum 0.9) or adamw (lr 0.001)")
      ->check(CLI::IsMember({"sgd", "adamw"}));
  app.add_option("--repeats", repeats, "throughput measurements (processes) per configuration");
  app.add_option("--device", c.device, "cpu, cuda or cuda:K (resources.device)");
  app.add_option("--width", c.width, "resnet18: first-stage channels (64 = ResNet-18)");
  app.add_option("--against", c.against,
                 "the second loop: plain (a LibTorch loop) or deterministic (vflow's step with "
                 "semantic.deterministic: true)")
      ->check(CLI::IsMember({"plain", "deterministic"}));
  app.add_option("--workers", c.workers,
                 "worker processes of one measurement (with --against deterministic, on the CPU)")
      ->check(CLI::Range(1, 64));
  app.add_option("--rank", c.rank, "a child's rank")->group("");
  app.add_option("--port", c.port, "the children's store port")->group("");
  CLI11_PARSE(app, argc, argv);
  if (c.workers > 1 && (c.against != "deterministic" || c.device != "cpu")) {
    std::cerr << "vnode_overhead: --workers above 1 needs --against deterministic and --device "
                 "cpu (the plain loop has no reduction)\n";
    return 2;
  }
  spdlog::set_level(spdlog::level::warn);
  // Both loops in full float32, as vflow's trainer runs (no TF32 on the GPU).
  vflow::compat::use_full_float32();

  if (!child.empty()) {
    c.vnodes = vnodes.front();
    return child_main(child, c);
  }

  const bool exact = c.against == "deterministic";
  std::cout << fmt::format(
      "model {}, optimizer {}, micro-batch b={}, {} examples per loop per measurement, {} "
      "intra-op thread(s), "
      "median of {} measurements of {} process(es) each, alternating {} blocks of {} steps, on "
      "{}\n\n",
      workload(c).first, optimizer_section(c), c.micro_batch, c.examples, c.threads, repeats,
      c.workers, kBlocks, exact ? "default and deterministic" : "vflow and plain", c.device);
  const std::string memory = c.device == "cpu" ? "peak RSS" : "device memory";
  const std::string second = exact ? "deterministic" : "plain";
  std::cout << fmt::format(
      exact ? "| V | B | default ex/s | deterministic ex/s | deterministic / default | default {0} "
              "MiB | deterministic {0} MiB |\n"
            : "| V | B | vflow ex/s | plain ex/s | ratio | vflow {0} MiB | plain {0} MiB |\n",
      memory);
  std::cout << "|---|---|---|---|---|---|---|\n";
  double rss_first = 0, rss_last = 0, worst = 1e9;
  std::string ranges;        // each V's ratio, lowest to highest process
  std::string phases;        // against deterministic: each V's phases, medians over the processes
  std::string fingerprints;  // against deterministic: each V's, as every measurement ended
  for (int64_t v : vnodes) {
    c.vnodes = v;
    std::vector<double> ev, ep, ratio;
    std::array<std::vector<double>, 6> phase;
    std::string fingerprint;  // against deterministic: the same in every measurement
    for (int r = 0; r < repeats; ++r) {
      const auto t = run_child(argv[0], "throughput", c);
      if (exact && r > 0 && t.fingerprint != fingerprint) {
        std::cerr << fmt::format(
            "vnode_overhead: the deterministic trainer ended with {} in one measurement of V={} "
            "and {} in another\n",
            fingerprint, v, t.fingerprint);
        return 1;
      }
      fingerprint = t.fingerprint;
      ev.push_back(t.a);
      ep.push_back(t.b);
      ratio.push_back(exact ? t.b / t.a : t.a / t.b);
      for (size_t k = 0; k < phase.size(); ++k) phase[k].push_back(t.phases[k]);
    }
    if (exact) {
      fingerprints += fmt::format("deterministic fingerprint V={}: {}\n", v, fingerprint);
      phases += fmt::format("| {} | {:.2f} / {:.2f} | {:.2f} / {:.2f} | {:.2f} / {:.2f} |\n", v,
                            median(phase[0]), median(phase[3]), median(phase[1]), median(phase[4]),
                            median(phase[2]), median(phase[5]));
    }
    Config short_run = c;
    short_run.examples = std::min<int64_t>(c.examples, 4 * c.vnodes * c.micro_batch);
    const double rv = run_child(argv[0], "memory-vflow", short_run).b / 1024.0;
    const double rp = run_child(argv[0], "memory-" + second, short_run).b / 1024.0;
    if (v == vnodes.front()) rss_first = rv;
    rss_last = rv;
    worst = std::min(worst, median(ratio));
    ranges += fmt::format("{}V={}: {:.3f}-{:.3f}", ranges.empty() ? "" : ", ", v,
                          *std::min_element(ratio.begin(), ratio.end()),
                          *std::max_element(ratio.begin(), ratio.end()));
    std::cout << fmt::format("| {} | {} | {:.0f} | {:.0f} | {:.3f} | {:.1f} | {:.1f} |\n", v,
                             v * c.micro_batch, median(ev), median(ep), median(ratio), rv, rp);
    std::cout.flush();
  }
  std::cout << fmt::format("\nratio over the processes, lowest-highest: {}\n", ranges);
  if (exact) {
    std::cout << "\nmean step phases of rank 0 in ms, median over the processes, default / "
                 "deterministic\n| V | compute | sync | update |\n|---|---|---|---|\n"
              << phases << "\n"
              << fingerprints << "\n";
  }
  std::cout << fmt::format(
      "lowest median throughput ratio {:.3f}; vflow {} from V={} to V={}: {:+.2f}%\n", worst,
      memory, vnodes.front(), vnodes.back(), 100.0 * (rss_last - rss_first) / rss_first);
  return 0;
}
