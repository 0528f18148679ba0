#include "vflow/engine/trainer.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <chrono>
#include <optional>

#include "core/torch_compat.h"
#include "engine/evaluation.h"
#include "engine/reducer.h"
#include "engine/training_state.h"
#include "engine/vnode_batches.h"
#include "vflow/core/clock.h"
#include "vflow/core/error.h"
#include "vflow/core/spec_node.h"
#include "vflow/engine/checkpoint.h"
#include "vflow/engine/fingerprint.h"
#include "vflow/engine/lr_schedule.h"
#include "vflow/engine/optimizer.h"
#include "vflow/engine/runtime.h"
#include "vflow/vnode/gradient_buffer.h"
#include "vflow/vnode/plan.h"
#include "vflow/vnode/stateful_kernels.h"
#include "vflow/vnode/step_packet.h"

namespace vflow::engine {

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

struct Trainer::Impl {
  JobSpec spec;
  std::shared_ptr<models::Model> model;
  data::DataSplits data;
  torch::Device device;
  bool bf16;                  // semantic.precision: forward passes under bfloat16 autocast
  double vnode_seconds = 0;   // smoothed compute time of one held vnode (0 = none yet)
  double update_seconds = 0;  // smoothed update time a step (0 = none yet)
  vnode::VirtualNodePlan plan;
  vnode::DataOrder order;
  int64_t total_steps;
  LrSchedule schedule;
  std::unique_ptr<vnode::StepPacket> packet;  // the step's one collective
  std::unique_ptr<vnode::StatefulKernelSet> kernels;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<Reducer> reducer;  // the packet's sum over workers, and the update
  std::vector<torch::Tensor> ema;    // semantic.ema: the parameters' average, in their order
  std::shared_ptr<comm::Communicator> comm;
  vnode::VnodeRange held;  // the vnodes this worker processes
  std::vector<std::shared_ptr<TrainingObserver>> observers;
  int64_t step = 0;
  std::optional<EvalResult> last_eval;
  std::atomic<bool> stop_request{false};  // asked locally (request_stop, stop flag)
  bool stop_agreed = false;               // some worker asked: every worker stops now
  int64_t regroup_agreed = 0;             // every worker regroups into this generation now
  const std::atomic<bool>* stop_flag = nullptr;
  std::function<StepControl(const Trainer&)> step_control;
  Trainer* self = nullptr;
  bool views_checked = false;
  bool began = false;            // observers have seen on_train_begin
  bool record_examples = false;  // fill StepInfo::examples_used

  ExampleReader reader;  // the data threads, the seed for augmentation, data.on_corrupt
  VnodeBatches batches;  // the held vnodes' batches in the data order, prefetched

  Impl(JobSpec s, std::shared_ptr<models::Model> m, data::DataSplits d)
      : spec(std::move(s)),
        model(std::move(m)),
        data(std::move(d)),
        device(worker_device(spec.resources)),
        bf16(spec.semantic.precision == Precision::kBf16),
        plan(spec.semantic.vnode_sizes.empty()
                 ? vnode::VirtualNodePlan(spec.semantic.global_batch, spec.semantic.virtual_nodes)
                 : vnode::VirtualNodePlan(spec.semantic.global_batch, spec.semantic.vnode_sizes)),
        order(spec.semantic.seed, data.train ? data.train->size() : 0, spec.semantic.global_batch,
              spec.semantic.data.drop_last),
        total_steps(spec.semantic.steps > 0 ? spec.semantic.steps
                                            : spec.semantic.epochs * order.steps_per_epoch()),
        schedule(spec.semantic.schedule, spec.semantic.optimizer.lr, total_steps),
        reader(spec.semantic.seed, spec.semantic.data.on_corrupt),
        batches(order, plan, total_steps, data.train, device, reader) {}

  /// After the collective, the table's presence column counts the workers that ran each
  /// vnode: lists each vnode's examples that many times (an audit of exactly-once use).
  void record_use(int64_t s, StepInfo& info) const {
    const auto flags = kernels->table().select(1, 0).to(torch::kCPU).contiguous();
    for (int64_t v = 0; v < plan.virtual_nodes(); ++v) {
      const auto runs = std::lround(flags[v].item<double>());
      for (long k = 0; k < runs; ++k) {
        info.examples_used.emplace_back(v, batches.example_indices(s, v));
      }
    }
  }

  /// Undoes the local effects of a step whose collective failed: nothing was applied to
  /// the parameters or the optimizer, but the stateful kernels hold partial updates.
  void abandon_step() {
    batches.discard();
    kernels->abort_step();
    reducer->abandon();
  }

  /// train_step(), with allocation failures turned into OutOfMemory naming the remedy.
  StepInfo guarded_step() {
    try {
      return train_step();
    } catch (const std::bad_alloc&) {
      throw out_of_memory();
    } catch (const c10::Error& e) {
      // LibTorch's CPU allocator: "can't allocate memory" (malloc failed) or "not enough
      // memory" (size checks); anything else is not ours to translate.
      const auto& m = e.msg();
      if (m.find("can't allocate memory") == std::string::npos &&
          m.find("not enough memory") == std::string::npos) {
        throw;
      }
      throw out_of_memory();
    }
  }

  OutOfMemory out_of_memory() const {
    const int64_t limit = spec.resources.memory_limit_mb;
    return OutOfMemory(fmt::format(
        "step {}: out of memory{}: a vnode of {} examples (global batch {} as {} vnodes) needs "
        "more than this worker may use; more virtual_nodes make each vnode smaller",
        step, limit > 0 ? fmt::format(" under resources.memory_limit_mb = {}", limit) : "",
        spec.semantic.global_batch / spec.semantic.virtual_nodes, spec.semantic.global_batch,
        spec.semantic.virtual_nodes));
  }

  /// One step: the vnode loop into the packet, the control word, the one collective,
  /// then the update.
  StepInfo train_step() {
    VFLOW_ASSERT(step < total_steps, "train_step() after the last step");
    const auto t0 = Clock::now();
    const int64_t s = step;
    const auto batch = order.batch(s % order.steps_per_epoch());
    const double lr = schedule.at(s);
    set_learning_rate(*optimizer, lr);
    model->train();
    reducer->begin_step(*comm, s);
    kernels->begin_step();
    int64_t ran = 0;
    try {
      ran = run_vnodes(s, batch);
    } catch (...) {
      reducer->abandon();
      throw;
    }
    // Kernels run asynchronously on a GPU: the compute time (and the speed measured for
    // re-planning and profiles) includes them only once they have finished.
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
    const auto t_sync = Clock::now();
    reducer->finish();
    const auto t_update = Clock::now();
    StepInfo info;
    if (record_examples) record_use(s, info);
    kernels->apply();
    const auto tail = packet->tail();
    if (tail.stop) stop_agreed = true;
    regroup_agreed = tail.regroup;
    if (!views_checked) {
      packet->gradient_buffer().check_views();
      views_checked = true;
    }
    info.grad_norm = reducer->update();
    ++step;
    if (!ema.empty() && step % spec.semantic.ema.every_steps == 0) update_ema();

    info.step = s;
    info.workers = comm->size();
    info.replaced_examples = reader.replaced();
    info.epoch = s / order.steps_per_epoch();
    info.steps_per_epoch = order.steps_per_epoch();
    info.total_steps = total_steps;
    info.examples = batch.size;
    info.loss = tail.loss_sum / static_cast<double>(batch.size);
    info.lr = lr;
    info.seconds = seconds_since(t0);
    info.compute_seconds = std::chrono::duration<double>(t_sync - t0).count();
    if (ran > 0) {  // a smoothed per-vnode time, for re-planning the split on a resize
      const double per = info.compute_seconds / static_cast<double>(ran);
      vnode_seconds = vnode_seconds > 0 ? 0.7 * vnode_seconds + 0.3 * per : per;
    }
    info.sync_seconds = std::chrono::duration<double>(t_update - t_sync).count();
    info.update_seconds = seconds_since(t_update);
    update_seconds =
        update_seconds > 0 ? 0.7 * update_seconds + 0.3 * info.update_seconds : info.update_seconds;
    return info;
  }

  /// The vnode loop: forward and backward of each vnode this worker holds, in ascending
  /// order, accumulated into the packet (gradients, stateful-kernel rows, loss). Returns
  /// how many vnodes this worker computed.
  int64_t run_vnodes(int64_t s, const vnode::Slice& batch) {
    int64_t last = -1;  // the last vnode this worker computes
    for (int64_t v = held.first; v < held.last; ++v) {
      if (plan.slice(v, batch.size).size > 0) last = v;
    }
    if (last < 0) write_control_word();
    int64_t ordinal = 0;
    int64_t ran = 0;
    for (int64_t v = 0; v < plan.virtual_nodes(); ++v) {
      const auto part = plan.slice(v, batch.size);
      if (part.size == 0) continue;
      ++ordinal;
      if (v < held.first || v >= held.last) continue;
      ++ran;
      const data::Batch b = batches.take(s, v);
      // Randomness inside the forward pass depends on (seed, step, vnode) only.
      torch::manual_seed(
          vnode::mix_seed(spec.semantic.seed, static_cast<uint64_t>(s), static_cast<uint64_t>(v)));
      kernels->begin_vnode(v, ordinal - 1);
      torch::Tensor loss;
      {
        const compat::AutocastGuard autocast(device.type(), bf16);
        loss = models::prediction_loss(model->forward(b.input), b.target, /*sum=*/false,
                                       spec.semantic.loss.label_smoothing);
      }
      kernels->end_vnode(v);
      packet->add_loss(loss, part.size);
      if (v == last) {
        // The packet past the gradients is final before the last backward pass, so
        // that it can ride in the first bucket.
        write_control_word();
        reducer->arm();
      }
      // Weight n_v / B: the accumulated gradient is the global batch's mean-loss gradient.
      (loss * (static_cast<double>(part.size) / static_cast<double>(batch.size))).backward();
      if (v != last) reducer->absorb();
    }
    return ran;
  }

  /// The control word: a stop request anywhere stops every worker after this same step;
  /// a pending generation (seen by one worker) regroups every worker after it.
  void write_control_word() {
    const StepControl wanted = step_control ? step_control(*self) : StepControl{};
    if (stop_requested() || wanted.stop) packet->request_stop();
    if (wanted.next_generation > 0) packet->request_regroup(wanted.next_generation);
  }

  /// Every worker holds the same parameters after the update, so each keeps the same
  /// average.
  void update_ema() {
    torch::NoGradGuard no_grad;
    const double decay = spec.semantic.ema.decay;
    const auto params = model->parameters();
    for (size_t i = 0; i < ema.size(); ++i) ema[i].mul_(decay).add_(params[i], 1 - decay);
  }

  std::string fingerprint() const { return engine::fingerprint(*model, ema, "ema"); }
  StateParts state_parts() { return StateParts{*model, *optimizer, ema}; }
  StateHeader state_header() const {
    return StateHeader{step, spec.semantic_yaml(), fingerprint()};
  }

  bool stop_requested() const {
    return stop_request.load() || (stop_flag != nullptr && stop_flag->load());
  }
};

Trainer::Trainer(JobSpec spec, std::shared_ptr<models::Model> model, data::DataSplits data,
                 std::shared_ptr<comm::Communicator> communicator) {
  VFLOW_ASSERT(model != nullptr, "Trainer needs a model");
  if (!data.train) throw SpecError("the job has no training data");
  validate(spec, /*check_components=*/false);
  impl_ = std::make_unique<Impl>(std::move(spec), std::move(model), std::move(data));
  impl_->self = this;
  auto& m = *impl_->model;
  m.to(impl_->device);
  set_communicator(std::move(communicator));
  auto placed = impl_->spec.resources;  // a launched worker's threads are resolved already
  placed.threads = intra_op_threads(impl_->spec, /*local_workers=*/1);
  impl_->batches.set_prefetch(prefetch_enabled(placed, /*local_workers=*/1),
                              impl_->spec.resources.prefetch_depth);
  impl_->reader.set_threads(data_threads(placed, /*local_workers=*/1));
  impl_->kernels =
      std::make_unique<vnode::StatefulKernelSet>(m, impl_->plan.virtual_nodes(), impl_->device);
  impl_->packet =
      std::make_unique<vnode::StepPacket>(m.parameters(), impl_->kernels->table_numel());
  impl_->kernels->bind_table(impl_->packet->table());
  impl_->optimizer = make_optimizer(impl_->spec.semantic.optimizer, m.parameters());
  ReducerOptions reduction;
  reduction.device = impl_->device;
  reduction.exact = impl_->spec.semantic.deterministic;
  reduction.bucket_bytes = static_cast<int64_t>(impl_->spec.resources.bucket_mb * (1 << 20));
  reduction.clip = impl_->spec.semantic.clip;
  reduction.virtual_nodes = impl_->plan.virtual_nodes();
  reduction.table_numel = impl_->kernels->table_numel();
  reduction.second_thread = impl_->batches.prefetch();
  impl_->reducer = make_reducer(*impl_->packet, *impl_->optimizer, reduction);
  if (impl_->spec.semantic.ema.enabled()) {
    for (const auto& p : m.parameters()) impl_->ema.push_back(p.detach().clone());
  }
  const auto& sem = impl_->spec.semantic;
  const int64_t tail = impl_->data.train->size() % sem.global_batch;
  if (!impl_->kernels->empty() && !sem.data.drop_last && tail == 1) {
    throw SpecError(fmt::format(
        "semantic.data.drop_last: the training set has {} examples, so every epoch ends with a "
        "batch of 1 example, which batch norm cannot normalise; set drop_last: true or change "
        "global_batch",
        impl_->data.train->size()));
  }
}

Trainer::~Trainer() = default;

void Trainer::add_observer(std::shared_ptr<TrainingObserver> observer) {
  impl_->observers.push_back(std::move(observer));
}

StepInfo Trainer::train_step() { return impl_->guarded_step(); }

TrainResult Trainer::run() {
  auto& im = *impl_;
  const auto& sem = im.spec.semantic;
  spdlog::info(
      "[engine] {} steps ({} per epoch), global batch {} = {} vnodes {}, {} stateful "
      "kernel(s), {} threads on {}{}{}",
      im.total_steps, im.order.steps_per_epoch(), sem.global_batch, sem.virtual_nodes,
      im.plan.uniform() ? fmt::format("x {}", im.plan.vnode_size())
                        : fmt::format("of sizes [{}]", fmt::join(sem.vnode_sizes, ", ")),
      im.kernels->size(), torch::get_num_threads(), im.device.str(),
      sem.deterministic ? ", deterministic" : "", im.bf16 ? ", bf16 autocast" : "");
  spdlog::info("[engine] worker {} of {} holds vnodes {}..{}, background prefetch {}",
               im.comm->rank(), im.comm->size(), im.held.first, im.held.last - 1,
               im.batches.prefetch() ? "on" : "off");
  if (!im.began) {
    for (auto& o : im.observers) o->on_train_begin(*this);
    im.began = true;
  }
  const auto t0 = Clock::now();
  int64_t examples = 0;
  double last_loss = 0;
  // Workers leave the loop together: stop and regroup requests take effect through
  // the control word of the step's collective, never on one worker alone.
  while (im.step < im.total_steps && !im.stop_agreed && im.regroup_agreed == 0) {
    StepInfo info;
    try {
      info = im.guarded_step();
    } catch (const comm::PeerFailure&) {
      im.abandon_step();
      throw;
    }
    examples += info.examples;
    last_loss = info.loss;
    for (auto& o : im.observers) o->on_step_end(*this, info);
    if (im.step % im.order.steps_per_epoch() == 0) {
      for (auto& o : im.observers) o->on_epoch_end(*this, info.epoch);
    }
  }
  TrainResult result;
  result.seconds = seconds_since(t0);
  result.completed = im.step >= im.total_steps;
  result.next_generation = result.completed ? 0 : im.regroup_agreed;
  im.regroup_agreed = 0;
  if (result.next_generation == 0) {
    for (auto& o : im.observers) o->on_train_end(*this);
  }
  result.steps = im.step;
  result.fingerprint = fingerprint();
  result.evaluation = im.last_eval;
  result.examples_per_second =
      result.seconds > 0 ? static_cast<double>(examples) / result.seconds : 0;
  result.final_loss = last_loss;
  return result;
}

EvalResult Trainer::evaluate() {
  auto& im = *impl_;
  if (!im.data.test) throw SpecError("the job has no evaluation split to evaluate on");
  // output.evaluation.use_ema: the average takes the parameters' place while evaluating.
  const auto& evaluation = im.spec.output.evaluation;
  auto result =
      evaluate_model(*im.model, *im.data.test, im.reader, im.device, im.bf16, evaluation.batch,
                     evaluation.use_ema ? im.ema : std::vector<torch::Tensor>{});
  result.step = im.step;
  return result;
}

void Trainer::publish_evaluation(const EvalResult& result) {
  impl_->last_eval = result;
  for (auto& o : impl_->observers) o->on_evaluation(*this, result);
}

const std::optional<EvalResult>& Trainer::last_evaluation() const { return impl_->last_eval; }

void Trainer::save_checkpoint(const std::string& path) const {
  save_state(path, impl_->state_parts(), impl_->state_header());
}

std::string Trainer::state_bytes() const {
  return serialize_state(impl_->state_parts(), impl_->state_header());
}

void Trainer::load_state_bytes(const std::string& bytes) { load_state(bytes, "transferred state"); }

void Trainer::load_checkpoint(const std::string& path) {
  load_state(read_checkpoint_file(path), path);
  spdlog::info("[engine] resumed from {} at step {} (fingerprint {})", path, step(), fingerprint());
}

void Trainer::load_state(const std::string& bytes, const std::string& source) {
  auto& im = *impl_;
  const auto saved = restore_state(bytes, source, im.state_parts(), im.spec.semantic_yaml(),
                                   im.total_steps, im.device);
  im.model->to(im.device);
  im.packet->gradient_buffer().bind();
  im.step = saved.step;
  if (fingerprint() != saved.fingerprint) {
    throw CheckpointError(
        fmt::format("{}: restored state has fingerprint {}, checkpoint recorded {} (corrupt file?)",
                    source, fingerprint(), saved.fingerprint));
  }
}

void Trainer::request_stop() { impl_->stop_request.store(true); }
void Trainer::stop_now() { impl_->stop_agreed = true; }
void Trainer::record_examples(bool on) { impl_->record_examples = on; }

void Trainer::state_donated() {
  for (auto& o : impl_->observers) o->on_state_donated(*this);
}
int Trainer::rank() const { return impl_->comm->rank(); }
int Trainer::world_size() const { return impl_->comm->size(); }

void Trainer::set_step_control(std::function<StepControl(const Trainer&)> control) {
  impl_->step_control = std::move(control);
}

void Trainer::set_communicator(std::shared_ptr<comm::Communicator> communicator) {
  auto& im = *impl_;
  auto next = communicator ? std::move(communicator) : comm::make_local_communicator();
  const int64_t workers = next->size();
  if (workers > im.plan.virtual_nodes()) {
    throw SpecError(fmt::format("{} workers but only {} virtual nodes: every worker needs a vnode",
                                workers, im.plan.virtual_nodes()));
  }
  im.comm = std::move(next);
  im.held = vnode::vnodes_of(im.plan.virtual_nodes(), workers, im.comm->rank());
  im.batches.hold(im.held);
}

void Trainer::set_communicator(std::shared_ptr<comm::Communicator> communicator,
                               const std::vector<int64_t>& counts) {
  set_communicator(std::move(communicator));
  if (counts.empty()) return;
  auto& im = *impl_;
  int64_t total = 0;
  for (const int64_t c : counts) total += c;
  if (static_cast<int>(counts.size()) != im.comm->size() || total != im.plan.virtual_nodes()) {
    throw SpecError(fmt::format("a split of {} vnodes over {} workers does not fit {} vnodes on {}",
                                total, counts.size(), im.plan.virtual_nodes(), im.comm->size()));
  }
  im.held = vnode::vnodes_of(counts, im.comm->rank());
  im.batches.hold(im.held);
}
void Trainer::set_stop_flag(const std::atomic<bool>* flag) { impl_->stop_flag = flag; }
std::string Trainer::fingerprint() const { return impl_->fingerprint(); }
torch::Device Trainer::device() const { return impl_->device; }

double Trainer::seconds_per_vnode() const { return impl_->vnode_seconds; }
double Trainer::update_seconds() const { return impl_->update_seconds; }

int64_t Trainer::step() const { return impl_->step; }
int64_t Trainer::total_steps() const { return impl_->total_steps; }
int64_t Trainer::steps_per_epoch() const { return impl_->order.steps_per_epoch(); }
const JobSpec& Trainer::spec() const { return impl_->spec; }
models::Model& Trainer::model() { return *impl_->model; }

std::vector<int64_t> Trainer::batch_indices(int64_t step) const {
  return impl_->batches.batch_indices(step);
}

}  // namespace vflow::engine
