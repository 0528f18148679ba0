#include "vflow/engine/run_job.h"

#include <spdlog/spdlog.h>

#include <chrono>

#include "vflow/core/clock.h"
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

}  // namespace vflow::engine
