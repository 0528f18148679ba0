// Embedding vflow: your own module and data set, registered by name; a job built in
// code; a hook on every evaluation; and the same job on several worker processes,
// resized while it runs, through the entry point vflow-train uses.
//
//   embed_example                              one process; exits 1 if it did not learn
//   embed_example --workers 2 --port P [--resize K]
//       two workers started on this machine (each runs this program again), the
//       coordinator on 127.0.0.1:P; with --resize, asks for K workers once it trains
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>
#include <vflow/vflow.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

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

// Every process of the job builds the model and the data set by name from the spec,
// so every process registers them before it reads the spec.
void register_components() {
  vflow::models::ModelRegistry::global().add(
      "spiralnet", "an MLP with batch norm for the spirals (no options)",
      [](vflow::OptionReader&, const vflow::models::ModelContext&) -> vflow::models::ModelBuilder {
        return [] { return std::make_shared<SpiralNet>(); };
      });
  vflow::data::DataRegistry::global().add(
      "spirals", "two interleaved spirals (options: train_size)", [](vflow::OptionReader& o) {
        const int64_t n = o.get_int("train_size", 2048, 16, 1 << 20);
        vflow::data::PreparedData p;
        p.info = vflow::data::DataInfo{{2}, 2};
        p.load = [n] {
          return vflow::data::DataSplits{std::make_shared<Spirals>(n, 1),
                                         std::make_shared<Spirals>(512, 2)};
        };
        return p;
      });
}

vflow::engine::JobSpec spiral_job() {
  vflow::engine::JobSpec spec;  // every field has its documented default
  spec.semantic.model.name = "spiralnet";
  spec.semantic.data.name = "spirals";
  spec.semantic.global_batch = 128;
  spec.semantic.virtual_nodes = 4;
  spec.semantic.optimizer.name = "adamw";
  spec.semantic.optimizer.lr = 0.01;
  spec.semantic.optimizer.weight_decay = 0.0;
  spec.semantic.epochs = 40;
  spec.semantic.deterministic = true;  // the same fingerprint on any number of workers
  spec.resources.threads = 1;
  spec.resources.timeout_s = 20;
  spec.output.logging.progress = "off";
  return spec;
}

/// Asks the job at 127.0.0.1:port for `workers` workers as soon as it trains, through the
/// control plane (what vflow-ctl resize does). Gives up quietly when the job is over.
void resize_once_training(int port, int64_t workers) {
  try {
    vflow::job::ControlPlane control("127.0.0.1", port, std::chrono::seconds(20));
    while (true) {
      if (control.state() != vflow::job::JobState::kRunning) return;
      try {
        if (control.status().step > 0) break;
      } catch (const vflow::RequestRefused&) {
        // the launcher has not published the job's limits yet
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    control.request_resize(workers);
    std::cout << "resize to " << workers << " workers requested" << std::endl;
  } catch (const vflow::Error& e) {
    std::cerr << "resize not requested: " << e.what() << std::endl;
  }
}

std::atomic<bool> g_stop{false};
std::atomic<bool> g_leave{false};

}  // namespace

int main(int argc, char** argv) {
  int workers = 0;
  int port = 0;
  int64_t resize = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int value = std::atoi(argv[i + 1]);
    if (flag == "--workers") workers = value;
    if (flag == "--port") port = value;
    if (flag == "--resize") resize = value;
  }
  if (workers > 0 && port <= 0) {
    std::cerr << "usage: embed_example [--workers K --port P [--resize K]]\n";
    return 2;
  }
  try {
    register_components();
    auto spec = spiral_job();
    if (workers > 0) spec.resources.workers = workers;
    vflow::engine::validate(spec, /*check_components=*/false);

    vflow::job::RoleOptions roles;
    roles.command = vflow::job::command_line_of_this_program(argc, argv);
    roles.launch = workers > 0;
    roles.port = port;
    roles.prepare = [](vflow::engine::Trainer& trainer) {
      trainer.add_observer(std::make_shared<EpochPrinter>());
    };
    roles.stop_flag = &g_stop;
    roles.leave_flag = &g_leave;
    const auto role = vflow::job::role_of(spec, roles);
    // What vflow-train does: Ctrl-C stops the job with a checkpoint; SIGTERM asks an
    // elastic worker to leave at the next step boundary, and a worker outlives a dead
    // launcher long enough to stop cleanly.
    std::signal(SIGINT, [](int) { g_stop.store(true); });
    if (role == vflow::job::Role::kElasticWorker) {
      std::signal(SIGTERM, [](int) { g_leave.store(true); });
      std::signal(SIGPIPE, SIG_IGN);
    } else {
      std::signal(SIGTERM, [](int) { g_stop.store(true); });
    }
    struct Joined {  // the resizer ends with the job, also when the job throws
      std::thread thread;
      ~Joined() {
        if (thread.joinable()) thread.join();
      }
    } resizer;
    if (role == vflow::job::Role::kLauncher && resize > 0) {
      resizer.thread = std::thread(resize_once_training, port, resize);
    }
    const auto outcome = vflow::job::run_role(role, spec, roles);
    if (!outcome.result) return outcome.exit_code;  // the launcher, or a worker that left
    const auto& result = *outcome.result;
    std::cout << "fingerprint " << result.fingerprint << "\n";
    if (!result.evaluation) return 0;  // a worker other than rank 0
    std::cout << "final accuracy " << result.evaluation->accuracy << "\n";
    return result.evaluation->accuracy > 0.9 ? 0 : 1;
  } catch (const vflow::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
}
