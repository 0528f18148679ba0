#include "vflow/engine/run_job.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>

#include "vflow/core/clock.h"
#include "vflow/core/error.h"
#include "vflow/data/dataset.h"
#include "vflow/engine/checkpoint.h"
#include "vflow/engine/observers.h"
#include "vflow/engine/runtime.h"
#include "vflow/models/registry.h"

namespace vflow::engine {

std::unique_ptr<Trainer> make_trainer(const JobSpec& spec,
                                      std::shared_ptr<comm::Communicator> communicator,
                                      bool elastic) {
  // In an elastic job ranks change between generations: every worker carries the
  // observers and they act on whichever worker is rank 0 at the time.
  const bool leader = elastic || !communicator || communicator->rank() == 0;
  const auto& sem = spec.semantic;
  const SpecNode no_name;
  const auto prepared =
      data::DataRegistry::global().prepare(sem.data.name, no_name, sem.data.options);
  const auto builder = models::ModelRegistry::global().prepare(
      sem.model.name, no_name, sem.model.options,
      models::ModelContext{prepared.info.input_shape, prepared.info.num_classes,
                           prepared.info.vocab_size});
  configure_runtime(spec);

  const auto t0 = std::chrono::steady_clock::now();
  spdlog::info("[data] loading {}", sem.data.name);
  auto splits = prepared.load();
  spdlog::info("[data] {} training and {} test examples in {:.1f}s", splits.train->size(),
               splits.test ? splits.test->size() : 0, seconds_since(t0));
  if (!spec.output.evaluation.enabled) splits.test = nullptr;

  seed_initialisation(sem);
  auto model = builder();
  auto trainer = std::make_unique<Trainer>(spec, model, splits, std::move(communicator));

  const auto& out = spec.output;
  auto attach = [&](std::shared_ptr<TrainingObserver> o) {
    if (!leader) return;
    trainer->add_observer(elastic ? std::make_shared<LeaderOnly>(std::move(o)) : std::move(o));
  };
  if (out.evaluation.enabled && splits.test) {
    attach(std::make_shared<EvaluationObserver>(out.evaluation));
  }
  if (out.logging.progress != "off") {
    attach(std::make_shared<ProgressObserver>(out.logging.progress, out.logging.every_steps));
  }
  if (!out.logging.metrics.empty()) {
    attach(std::make_shared<MetricsObserver>(out.logging.metrics, out.logging.every_steps));
  }
  if (!out.logging.tensorboard.empty()) {
    attach(std::make_shared<TensorBoardObserver>(out.logging.tensorboard, out.logging.every_steps));
  }
  if (!out.checkpoint.dir.empty()) {
    attach(std::make_shared<CheckpointObserver>(out.checkpoint));
  }
  if (!out.logging.examples.empty()) {
    trainer->record_examples(true);
    // It writes on rank 0 itself, and must see every worker's steps (a donor may log one).
    if (leader) trainer->add_observer(std::make_shared<ExampleLogObserver>(out.logging.examples));
  }
  if (!out.checkpoint.resume.empty()) {
    const std::string path = out.checkpoint.resume == "latest"
                                 ? latest_checkpoint(out.checkpoint.dir)
                                 : out.checkpoint.resume;
    trainer->load_checkpoint(path);
  }
  return trainer;
}

TrainResult run_job(const JobSpec& spec, const JobRunOptions& options) {
  auto trainer = make_trainer(spec, options.communicator);
  trainer->set_stop_flag(options.stop_flag);
  if (options.prepare) options.prepare(*trainer);
  return trainer->run();
}

VnodeContribution replay_vnode(const JobSpec& job, const std::string& checkpoint, int64_t step,
                               int64_t vnode) {
  if (!job.semantic.deterministic) {
    throw SpecError(
        "--replay: the job is not deterministic (semantic.deterministic: false); only in "
        "deterministic mode is a vnode's contribution a function of the job, so that a replay "
        "can answer whether a worker computed it right");
  }
  if (vnode < 0 || vnode >= job.semantic.virtual_nodes) {
    throw SpecError(fmt::format("--vnode {}: the job has {} vnodes (0..{})", vnode,
                                job.semantic.virtual_nodes, job.semantic.virtual_nodes - 1));
  }
  // One process with every vnode, the threads a worker of the job has, and nothing written.
  JobSpec spec = job;
  spec.resources.workers = 1;
  spec.resources.min_workers = 1;
  spec.resources.layout.clear();
  spec.resources.threads = intra_op_threads(job, /*local_workers=*/1);
  spec.output = OutputSpec{};
  spec.output.evaluation.enabled = false;
  spec.output.logging.progress = "off";
  spec.output.logging.level = job.output.logging.level;
  auto trainer = make_trainer(spec, nullptr);
  trainer->load_checkpoint(checkpoint);
  if (step < trainer->step()) {
    throw SpecError(
        fmt::format("--step {}: {} holds step {}, and a replay trains forward from its "
                    "checkpoint: give one of step {} or earlier",
                    step, checkpoint, trainer->step(), step));
  }
  if (step >= trainer->total_steps()) {
    throw SpecError(fmt::format("--step {}: the job has {} steps (0..{})", step,
                                trainer->total_steps(), trainer->total_steps() - 1));
  }
  auto last_note = std::chrono::steady_clock::now();
  const int64_t from = trainer->step();
  while (trainer->step() < step) {
    trainer->train_step();
    if (seconds_since(last_note) > 10) {
      spdlog::info("[replay] step {} of {}..{}", trainer->step(), from, step);
      last_note = std::chrono::steady_clock::now();
    }
  }
  return trainer->contribution(vnode);
}

}  // namespace vflow::engine
