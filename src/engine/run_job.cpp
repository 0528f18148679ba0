#include "vflow/engine/run_job.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "engine/fused_update.h"
#include "vflow/core/clock.h"
#include "vflow/core/error.h"
#include "vflow/core/process.h"
#include "vflow/data/dataset.h"
#include "vflow/engine/checkpoint.h"
#include "vflow/engine/observers.h"
#include "vflow/engine/optimizer.h"
#include "vflow/engine/runtime.h"
#include "vflow/models/registry.h"
#include "vflow/vnode/shards.h"

namespace vflow::engine {

namespace {

/// The job's data, prepared to load, and the builder of its model.
std::pair<data::PreparedData, models::ModelBuilder> prepare_job(const JobSpec& spec) {
  const auto& sem = spec.semantic;
  const SpecNode no_name;
  auto prepared = data::DataRegistry::global().prepare(sem.data.name, no_name, sem.data.options);
  auto builder = models::ModelRegistry::global().prepare(
      sem.model.name, no_name, sem.model.options,
      models::ModelContext{prepared.info.input_shape, prepared.info.num_classes,
                           prepared.info.vocab_size});
  return {std::move(prepared), std::move(builder)};
}

/// MemTotal of /proc/meminfo in MB, 0 where it cannot be read.
double host_memory_mb() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemTotal:") return kib * 1024 / 1e6;
    meminfo.ignore(256, '\n');
  }
  return 0;
}

}  // namespace

std::string describe_shards(const JobSpec& spec, int64_t workers) {
  const auto& sem = spec.semantic;
  const auto& res = spec.resources;
  auto builder = prepare_job(spec).second;
  seed_initialisation(sem);
  const auto model = builder();
  std::vector<torch::Tensor> params;
  int64_t numel = 0;
  for (const auto& p : model->parameters()) {
    if (!p.requires_grad()) continue;
    params.push_back(p);
    numel += p.numel();
  }
  const auto optimizer = make_optimizer(sem.optimizer, params, sem.virtual_nodes);
  const auto* sharded = dynamic_cast<const ShardedState*>(optimizer.get());
  const int64_t vnodes = sem.virtual_nodes;
  const vnode::ShardLayout shards(numel, vnodes);
  const auto mb = [](int64_t elements) { return static_cast<double>(elements) * 4 / 1e6; };
  std::string out = fmt::format(
      "{} parameters ({:.4g} MB), {} canonical shards (one per vnode) of at most {} elements\n",
      numel, mb(numel), shards.shards(), shards.largest());
  if (sharded == nullptr) {
    return out +
           fmt::format(
               "semantic.optimizer {} keeps no sharded state (sgd, adamw, lamb and lars do)\n",
               sem.optimizer.name);
  }
  const int64_t rows = sharded->state_tensors();
  // A planned layout's vnode counts where it names these workers, else an even split.
  std::vector<int64_t> counts;
  if (static_cast<int64_t>(res.layout.size()) == workers) {
    for (const auto& w : res.layout) counts.push_back(w.vnodes);
  }
  const auto layout = vnode::layout_of(vnodes, workers, counts);
  const int64_t replicas = res.shard_optimizer ? res.shard_replicas : 0;
  out += fmt::format(
      "{} keeps {} state tensor(s) a parameter: {:.4g} MB in all; on {} worker(s), vnodes "
      "{}, {}:\n",
      sem.optimizer.name, rows, mb(rows * numel), workers,
      counts.empty() ? "split evenly" : "as resources.layout plans them",
      res.shard_optimizer ? fmt::format("sharded with shard_replicas {}", replicas)
                          : "unsharded (resources.shard_optimizer: false)");
  int64_t largest = 0;  // elements of parameters, gradients and state of a worker
  for (int64_t r = 0; r < workers; ++r) {
    const auto& held = layout[static_cast<size_t>(r)];
    const auto owned = shards.of_vnodes(held);
    int64_t kept = numel;
    std::string kept_list = "all shards";
    if (res.shard_optimizer) {
      const auto ids = vnode::ShardLayout::kept_by(layout, static_cast<int>(r), replicas);
      kept = 0;
      for (const int64_t s : ids) kept += shards.shard(s).numel();
      kept_list = "shards " + vnode::shard_list(ids);
    }
    // Vnode v's shard is shard v: one list names both.
    std::vector<int64_t> mine;
    for (int64_t v = held.first; v < held.last; ++v) mine.push_back(v);
    out += fmt::format(
        "worker {}: vnodes {}, owns their shards ({} parameters), keeps the state of {}: "
        "{:.4g} MB; with the parameters and gradients {:.4g} MB\n",
        r, vnode::shard_list(mine), owned.numel(), kept_list, mb(rows * kept),
        mb(2 * numel + rows * kept));
    largest = std::max(largest, 2 * numel + rows * kept);
  }
  // What cannot fit whatever else a worker needs (activations, data, code): each worker
  // under resources.memory_limit_mb, and every worker on this one host (its memory, or its
  // control group's limit where that is less).
  const auto remedy = res.shard_optimizer ? "more workers, or shard_replicas 1"
                                          : "shard the state (resources.shard_optimizer)";
  if (res.memory_limit_mb > 0 && mb(largest) > static_cast<double>(res.memory_limit_mb)) {
    out += fmt::format(
        "resources.memory_limit_mb is {}: the largest worker needs more than {:.0f} MB for "
        "these alone; {}\n",
        res.memory_limit_mb, mb(largest), remedy);
  }
  const double host = host_memory_mb();
  const double group = cgroup_memory_limit() / 1e6;
  const bool grouped = group > 0 && (host <= 0 || group < host);
  if (const double room = grouped ? group : host; room > 0 && mb(largest) * workers > room) {
    out += fmt::format(
        "this host {} {:.0f} MB of memory: {} workers on it would need more than {:.0f} MB "
        "for these alone; {}, or spread the workers over more hosts\n",
        grouped ? "lets its control group use" : "has", room, workers, mb(largest) * workers,
        remedy);
  }
  return out;
}

std::unique_ptr<Trainer> make_trainer(const JobSpec& spec,
                                      std::shared_ptr<comm::Communicator> communicator,
                                      bool elastic) {
  // In an elastic job ranks change between generations: every worker carries the
  // observers and they act on whichever worker is rank 0 at the time.
  const bool leader = elastic || !communicator || communicator->rank() == 0;
  const auto& sem = spec.semantic;
  const auto [prepared, builder] = prepare_job(spec);
  configure_runtime(spec);

  const auto t0 = std::chrono::steady_clock::now();
  spdlog::info("[data] loading {}", sem.data.name);
  auto splits = prepared.load();
  spdlog::info("[data] {} training and {} test examples in {:.1f}s", splits.train->size(),
               splits.test ? splits.test->size() : 0, seconds_since(t0));
  if (!spec.output.evaluation.enabled) splits.test = nullptr;

  seed_initialisation(sem);
  std::shared_ptr<models::Model> model;
  std::unique_ptr<Trainer> trainer;
  try {
    model = builder();
    trainer = std::make_unique<Trainer>(spec, model, splits, std::move(communicator));
  } catch (...) {
    if (!allocation_failed()) throw;
    int64_t numel = 0;
    if (model) {
      for (const auto& p : model->parameters()) numel += p.numel();
    }
    const int64_t limit = spec.resources.memory_limit_mb;
    const std::string under =
        limit > 0 ? fmt::format(" under resources.memory_limit_mb = {}", limit) : "";
    if (!model) {
      throw OutOfMemory(
          fmt::format("out of memory{} building the {} model", under, sem.model.name));
    }
    throw OutOfMemory(fmt::format(
        "out of memory{} before the first step: the {} model's {} parameters ({:.4g} MB) need "
        "as much again for their gradients and, with the fused optimizers, for the flat "
        "buffer they train in, beside the data set; give the worker more memory or use a "
        "smaller model",
        under, sem.model.name, numel, static_cast<double>(numel) * 4 / 1e6));
  }

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
