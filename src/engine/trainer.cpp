#include "vflow/engine/trainer.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>

#include "core/torch_compat.h"
#include "engine/evaluation.h"
#include "engine/fused_update.h"
#include "engine/reducer.h"
#include "engine/sharded_reducer.h"
#include "engine/training_state.h"
#include "engine/verification.h"
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

/// What shard s's file of a checkpoint at training step `step` holds (besides its state).
ShardRecord record_of(const vnode::ShardLayout& layout, int64_t s, int64_t step,
                      int64_t optimizer_steps, const std::string& optimizer) {
  const auto range = layout.shard(s);
  return {s, layout.shards(), range.begin, range.end, step, optimizer_steps, optimizer};
}

using Clock = std::chrono::steady_clock;

/// A test switch, VFLOW_STEP_PACE=MS:FILE: while FILE exists, this worker starts its steps
/// at least MS milliseconds apart. A test's disturbances then find the job still training
/// on a machine of any speed, with a number of steps sized for the pace rather than three
/// times what the fastest machine would run meanwhile; once the test removes FILE, the job
/// runs out at full speed. The pause comes before a step begins and changes no result.
class StepPace {
 public:
  /// From the environment; no pace where VFLOW_STEP_PACE is unset or empty.
  static StepPace from_environment() {
    StepPace pace;
    const char* text = std::getenv("VFLOW_STEP_PACE");
    if (text == nullptr || *text == 0) return pace;
    const std::string value = text;
    const auto colon = value.find(':');
    size_t used = 0;
    int64_t ms = -1;
    try {
      ms = std::stoll(value.substr(0, colon), &used);
    } catch (const std::logic_error&) {
      used = 0;
    }
    if (colon == std::string::npos || colon + 1 == value.size() || used != colon || ms <= 0) {
      throw SpecError(fmt::format(
          "VFLOW_STEP_PACE='{}': expected MS:FILE, milliseconds of 1 or more and a file (a test "
          "switch: steps at least MS ms apart while FILE exists)",
          value));
    }
    pace.interval_ = std::chrono::milliseconds(ms);
    pace.file_ = value.substr(colon + 1);
    return pace;
  }

  /// Before a step: waits out the rest of the interval since the last step began, while the
  /// file exists (once it is gone, for good).
  void wait() {
    if (file_.empty()) return;
    std::error_code error;
    if (!std::filesystem::exists(file_, error)) {
      file_.clear();
      return;
    }
    std::this_thread::sleep_until(last_ + interval_);
    last_ = Clock::now();
  }

 private:
  std::chrono::milliseconds interval_{0};
  std::string file_;
  Clock::time_point last_{};
};

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
  bool ema_pending = false;          // the last update's average waits for the parameters' gather
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

  // Cross-checks (resources.verify_every_steps, deterministic mode; docs/verification.md).
  std::optional<CrossChecks> checks;
  std::vector<vnode::VnodeRange> layout;  // every rank's vnodes, in rank order
  std::optional<InjectedFault> fault;     // VFLOW_INJECT_FAULT, for tests
  StepPace pace;                          // VFLOW_STEP_PACE, for tests
  std::string mismatch;                   // why the job stopped after a cross-check
  bool updating = false;                  // in the optimizer's update (out_of_memory)
  // resources.shard_optimizer: the checkpoint whose optimizer shards were written last
  // (its path, step and optimizer step count; what failed, on rank 0), for save_checkpoint.
  struct WrittenShards {
    std::string path;
    int64_t step = -1;
    int64_t optimizer_steps = 0;
    std::string error;
  };
  WrittenShards written_shards;

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

  /// The step's cross-check, if it has one: meets the group's workers first where this
  /// communicator has not (a collective every rank makes at the same step).
  std::optional<CrossCheck> plan_check(int64_t s, const vnode::Slice& batch) {
    if (!checks || comm->size() < 2 || !checks->due(s)) return std::nullopt;
    if (!checks->met()) checks->meet(*comm, device);
    std::vector<int64_t> present;
    for (int64_t v = 0; v < plan.virtual_nodes(); ++v) {
      if (plan.slice(v, batch.size).size > 0) present.push_back(v);
    }
    return checks->plan(s, layout, present);
  }

  /// The position of vnode `v` among the step's non-empty vnodes (a stateful kernel's
  /// ordinal).
  int64_t ordinal_of(int64_t v, const vnode::Slice& batch) const {
    int64_t ordinal = 0;
    for (int64_t u = 0; u < v; ++u) ordinal += plan.slice(u, batch.size).size > 0 ? 1 : 0;
    return ordinal;
  }

  /// Vnode `v`'s forward pass, its stateful-kernel row and its loss into the packet;
  /// returns its mean loss, for the backward pass.
  torch::Tensor forward_vnode(int64_t s, int64_t v, int64_t ordinal, const data::Batch& b,
                              int64_t examples) {
    // Randomness inside the forward pass depends on (seed, step, vnode) only.
    torch::manual_seed(
        vnode::mix_seed(spec.semantic.seed, static_cast<uint64_t>(s), static_cast<uint64_t>(v)));
    kernels->begin_vnode(v, ordinal);
    torch::Tensor loss;
    {
      const compat::AutocastGuard autocast(device.type(), bf16);
      loss = models::prediction_loss(model->forward(b.input), b.target, /*sum=*/false,
                                     spec.semantic.loss.label_smoothing);
    }
    kernels->end_vnode(v);
    packet->add_loss(loss, examples);
    return loss;
  }

  /// The backward pass of a vnode of `examples` of the step's `batch_size` (weight
  /// n_v / B: the accumulated gradient is the global batch's mean-loss gradient), and
  /// the injected fault where this worker has one for step `s`.
  void backward_vnode(int64_t s, const torch::Tensor& loss, int64_t examples, int64_t batch_size) {
    (loss * (static_cast<double>(examples) / static_cast<double>(batch_size))).backward();
    if (fault && fault->step == s && fault->flips_bit()) flip_largest_gradient(fault->bit);
  }

  /// VFLOW_INJECT_FAULT: flips bit `bit` of the largest gradient in the packet, as a
  /// faulty core might have computed it.
  void flip_largest_gradient(int bit) {
    torch::NoGradGuard no_grad;
    auto g = packet->gradients();
    const int64_t at = g.abs().argmax().item<int64_t>();
    auto host = g.narrow(0, at, 1).to(torch::kCPU, torch::kFloat32).contiguous();
    uint32_t bits = 0;
    std::memcpy(&bits, host.data_ptr<float>(), sizeof bits);
    bits ^= uint32_t{1} << bit;
    std::memcpy(host.data_ptr<float>(), &bits, sizeof bits);
    g.narrow(0, at, 1).copy_(host);
  }

  /// Vnode `v` of step `s` computed by a worker that does not hold it (a checker or a
  /// referee): its forward and backward pass into the packet, which holds nothing else
  /// then, and the hash of that contribution; the packet is cleared again. The stateful
  /// kernels' state is restored by the step's apply or abort, which start from the state
  /// saved at begin_step.
  uint64_t recompute(int64_t s, int64_t v, const vnode::Slice& batch) {
    compute_alone(s, v, batch);
    const uint64_t hash = packet->contribution_hash();
    packet->clear();
    return hash;
  }

  /// Vnode `v` of step `s`, which this worker need not hold, through its forward and
  /// backward pass into the packet (which must hold nothing else); returns its mean loss.
  torch::Tensor compute_alone(int64_t s, int64_t v, const vnode::Slice& batch) {
    const auto part = plan.slice(v, batch.size);
    const data::Batch b = batches.take_extra(s, v);
    const auto loss = forward_vnode(s, v, ordinal_of(v, batch), b, part.size);
    backward_vnode(s, loss, part.size, batch.size);
    return loss;
  }

  /// After the step's collective: compares the two hashes of the step's cross-check and,
  /// where they differ, acts by resources.on_mismatch. Returns false when the step is
  /// undone and the job stops (`stop`); throws Mismatch on the outvoted worker and
  /// comm::PeerFailure on the others (`evict`), so that the job goes on without it.
  bool settle(const CrossCheck& check, const vnode::StepPacket::Tail& tail,
              const vnode::Slice& batch) {
    const uint64_t owner = tail.hashes[0];
    const uint64_t checker = tail.hashes[1];
    const int rank = comm->rank();
    if (owner == checker) {
      if (rank == 0) {
        spdlog::info("[verify] step {} vnode {}: {} and {} agree (contribution {:016x})",
                     check.step, check.vnode, checks->describe(check.owner),
                     checks->describe(check.checker), owner);
      }
      return true;
    }
    const std::string what =
        fmt::format("step {} vnode {}: {} computed contribution {:016x}, {} computed {:016x}",
                    check.step, check.vnode, checks->describe(check.owner), owner,
                    checks->describe(check.checker), checker);
    const auto policy = spec.resources.on_mismatch;
    if (policy == OnMismatch::kWarn) {
      if (rank == 0) {
        spdlog::error("[verify] mismatch at {}; going on (resources.on_mismatch: warn)", what);
      }
      return true;
    }
    abandon_step();
    if (policy == OnMismatch::kEvict) evict(check, owner, checker, what, batch);
    mismatch = "cross-check mismatch at " + what;
    if (rank == 0) {
      spdlog::error(
          "[verify] mismatch at {}; step {} is undone and the job stops with the state before "
          "it (resources.on_mismatch: {})",
          what, check.step, to_string(policy));
    }
    stop_agreed = true;
    return false;
  }

  /// on_mismatch: evict. A third worker of the same signature computes the vnode; the one
  /// of the two it disagrees with leaves the job. Returns (to stop instead) when there is
  /// no third worker or it agrees with neither.
  void evict(const CrossCheck& check, uint64_t owner, uint64_t checker, const std::string& what,
             const vnode::Slice& batch) {
    const int referee = checks->referee(check);
    if (referee < 0) {
      if (comm->rank() == 0) spdlog::error("[verify] no third worker of their signature to decide");
      return;
    }
    kernels->begin_step();
    const uint64_t third = comm->rank() == referee ? recompute(check.step, check.vnode, batch) : 0;
    kernels->abort_step();
    // The referee's hash, zero from every other rank, summed as a verify place is.
    auto shared = vnode::StepPacket::hash_parts(third).to(device);
    comm->allreduce_sum(shared);
    const uint64_t decided = vnode::StepPacket::hash_of_parts(shared);
    const int odd = decided == owner ? check.checker : decided == checker ? check.owner : -1;
    if (odd < 0) {
      if (comm->rank() == 0) {
        spdlog::error("[verify] {} computed {:016x}, agreeing with neither",
                      checks->describe(referee), decided);
      }
      return;
    }
    const std::string verdict = fmt::format(
        "cross-check mismatch at {}; {} agrees with {}, so {} leaves the job and step "
        "{} is redone without it (resources.on_mismatch: evict)",
        what, checks->describe(referee),
        checks->describe(odd == check.owner ? check.checker : check.owner), checks->describe(odd),
        check.step);
    if (comm->rank() == 0) spdlog::error("[verify] {}", verdict);
    if (comm->rank() == odd) throw Mismatch("this worker was outvoted: " + verdict);
    throw comm::PeerFailure(fmt::format("{} was evicted by a cross-check", checks->describe(odd)));
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
    } catch (...) {
      if (allocation_failed()) throw out_of_memory();
      throw;
    }
  }

  OutOfMemory out_of_memory() const {
    const int64_t limit = spec.resources.memory_limit_mb;
    const std::string under =
        limit > 0 ? fmt::format(" under resources.memory_limit_mb = {}", limit) : "";
    if (updating) return state_out_of_memory(under);
    return OutOfMemory(fmt::format(
        "step {}: out of memory{}: a vnode of {} examples (global batch {} as {} vnodes) needs "
        "more than this worker may use; more virtual_nodes make each vnode smaller",
        step, under, spec.semantic.global_batch / spec.semantic.virtual_nodes,
        spec.semantic.global_batch, spec.semantic.virtual_nodes));
  }

  /// The optimizer's state did not fit beside the parameters and gradients: what this
  /// worker holds and keeps, and what would shrink it.
  OutOfMemory state_out_of_memory(const std::string& under) const {
    const auto mb = [](int64_t elements) { return static_cast<double>(elements) * 4 / 1e6; };
    const int64_t numel = packet->gradients().numel();
    const auto* state = dynamic_cast<const ShardedState*>(optimizer.get());
    const auto& name = spec.semantic.optimizer.name;
    std::string keeps = fmt::format("the {} state", name);
    std::string remedy =
        state != nullptr
            ? "shard it (resources.shard_optimizer: true: each of K workers keeps about 2 / K "
              "of it)"
            : "use an optimizer whose state can be sharded (sgd, adamw, and on the CPU lamb and "
              "lars)";
    if (state != nullptr && spec.resources.shard_optimizer) {
      int64_t kept = 0;
      for (const int64_t s : state->kept()) kept += state->layout().shard(s).numel();
      keeps = fmt::format("the {} state of shards {}: {:.4g} MB", name,
                          vnode::shard_list(state->kept()), mb(state->state_tensors() * kept));
      remedy = spec.resources.shard_replicas > 1
                   ? "spread the job over more workers (each keeps its vnodes' shards and one "
                     "neighbour's), or keep one home a shard (resources.shard_replicas: 1)"
                   : "spread the job over more workers (each keeps its vnodes' shards)";
    } else if (state != nullptr) {
      keeps += fmt::format(": {:.4g} MB", mb(state->state_tensors() * numel));
    }
    return OutOfMemory(fmt::format(
        "step {}: out of memory{} making the optimizer's state: this worker holds {:.4g} MB of "
        "parameters and {:.4g} MB of gradients, and {} does not fit beside them; {} "
        "(`vflow-train JOB --print-shards --workers K` shows what each worker would keep)",
        step, under, mb(numel), mb(numel), keeps, remedy));
  }

  /// One step: the vnode loop into the packet, the control word, the one collective,
  /// then the update.
  StepInfo train_step() {
    VFLOW_ASSERT(step < total_steps, "train_step() after the last step");
    pace.wait();
    updating = false;
    const auto t0 = Clock::now();
    const int64_t s = step;
    const auto batch = order.batch(s % order.steps_per_epoch());
    const double lr = schedule.at(s);
    set_learning_rate(*optimizer, lr);
    model->train();
    // The stateful kernels' state is saved first, so that a failure from here on (the
    // cross-check's first exchange is a collective) restores this step's, not an older one.
    kernels->begin_step();
    const auto check = plan_check(s, batch);
    // A cross-checked step reduces after the backward passes: the owner writes its hash
    // after its vnode's, which may be its last.
    const int64_t received = comm->received_bytes();
    reducer->begin_step(*comm, s, /*overlap=*/!check);
    settle_ema();  // the parameters are whole again (sent again by the new group)
    int64_t ran = 0;
    try {
      if (check && comm->rank() == check->checker) {
        packet->write_hash(vnode::StepPacket::Role::kChecker, recompute(s, check->vnode, batch));
      }
      ran = run_vnodes(s, batch, check);
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
    const auto tail = packet->tail();
    if (check && !settle(*check, tail, batch)) return StepInfo{};
    StepInfo info;
    if (record_examples) record_use(s, info);
    kernels->apply();
    if (!views_checked) {
      packet->gradient_buffer().check_views();
      views_checked = true;
    }
    // The optimizer's state is made at its first update: an allocation that fails there is
    // the state's, not the vnode's (out_of_memory).
    const auto* state = dynamic_cast<const ShardedState*>(optimizer.get());
    updating = state != nullptr ? state->steps() == 0 : step == 0;
    info.grad_norm = reducer->update();
    updating = false;
    // The step's agreed requests take effect once it is taken: an update that fails (a
    // peer lost in LAMB's exchange) leaves the step to be redone, requests and all.
    if (tail.stop) stop_agreed = true;
    regroup_agreed = tail.regroup;
    if (state != nullptr) info.optimizer_state_bytes = state->held_bytes();
    if (received >= 0) info.received_bytes = comm->received_bytes() - received;
    ++step;
    if (!ema.empty() && step % spec.semantic.ema.every_steps == 0) {
      ema_pending = true;
      settle_ema();
    }

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
  /// order, accumulated into the packet (gradients, stateful-kernel rows, loss), and the
  /// hash of the cross-checked vnode's contribution where this worker owns it. Returns
  /// how many vnodes this worker computed.
  int64_t run_vnodes(int64_t s, const vnode::Slice& batch, const std::optional<CrossCheck>& check) {
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
      const auto loss = forward_vnode(s, v, ordinal - 1, b, part.size);
      if (v == last) {
        // The packet past the gradients is final before the last backward pass, so
        // that it can ride in the first bucket.
        write_control_word();
        reducer->arm();
      }
      backward_vnode(s, loss, part.size, batch.size);
      // The packet holds this vnode's contribution alone until it is absorbed.
      if (check && v == check->vnode) {
        packet->write_hash(vnode::StepPacket::Role::kOwner, packet->contribution_hash());
      }
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

  /// The average of the last update, where it is due, once this worker's parameters are
  /// whole: a sharded worker whose gather of them failed takes it when the next group sent
  /// them again (settle, or the next step's begin), not from the parameters it had.
  void settle_ema() {
    if (!ema_pending || !reducer->parameters_complete()) return;
    update_ema();
    ema_pending = false;
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
  /// The state sent to a joining worker: without the optimizer's where the reducer sends
  /// it itself (sharded).
  StateParts transfer_parts() {
    auto parts = state_parts();
    parts.with_optimizer = reducer->transfers_optimizer();
    return parts;
  }

  /// Restores `bytes` (a checkpoint's or a transfer's, `source` in messages) into `parts`.
  StateHeader load(const std::string& bytes, const std::string& source, const StateParts& parts) {
    const auto saved =
        restore_state(bytes, source, parts, spec.semantic_yaml(), total_steps, device);
    model->to(device);
    packet->gradient_buffer().bind();
    step = saved.step;
    ema_pending = saved.ema_pending;
    if (fingerprint() != saved.fingerprint) {
      throw CheckpointError(fmt::format(
          "{}: restored state has fingerprint {}, checkpoint recorded {} (corrupt file?)", source,
          fingerprint(), saved.fingerprint));
    }
    return saved;
  }

  /// Where the checkpoint of this step goes: output.checkpoint's directory, or where the
  /// job keeps none, the state before a cross-check's mismatch (what `--replay` starts from).
  std::string checkpoint_target() const {
    const auto& dir = spec.output.checkpoint.dir;
    return dir.empty() ? fmt::format("vflow-mismatch-step-{}.pt", step)
                       : checkpoint_path(dir, step);
  }

  /// After step `step` (done) every rank calls it: where a checkpoint is due now
  /// (output.checkpoint's schedule, the end, a stop, a mismatch) and the reducer keeps the
  /// optimizer state by canonical shard, each shard is written beside it by rank 0 as it
  /// arrives (docs/design.md, "Checkpoints by canonical shard").
  void write_shards_for_checkpoint() {
    if (!spec.resources.shard_optimizer) return;
    const auto& ck = spec.output.checkpoint;
    const bool due = !mismatch.empty() ||
                     (!ck.dir.empty() && ((ck.every_steps > 0 && step % ck.every_steps == 0) ||
                                          step == total_steps || stop_agreed));
    if (!due || written_shards.step == step) return;
    WrittenShards out;
    out.path = checkpoint_target();
    out.step = step;
    const auto directory = shard_directory(out.path);
    const bool leader = comm->rank() == 0;
    if (leader) {
      // A checkpoint of this step written before (by a run resumed from an earlier one)
      // goes first, its file and then its shards: no file may name shards that are not its.
      std::error_code ec;
      std::filesystem::remove(out.path, ec);
      if (!ec) std::filesystem::remove_all(directory, ec);
      if (!ec) std::filesystem::create_directories(directory, ec);
      if (ec) out.error = fmt::format("{}: cannot replace: {}", directory, ec.message());
    }
    const auto& layout = dynamic_cast<ShardedState&>(*optimizer).layout();
    const auto write = [&](int64_t s, int64_t optimizer_steps, const torch::Tensor& state) {
      out.optimizer_steps = optimizer_steps;
      if (!out.error.empty()) return;  // every shard still arrives: the others go on
      try {
        save_shard(shard_file(directory, s),
                   record_of(layout, s, step, optimizer_steps, spec.semantic.optimizer.name),
                   state);
      } catch (const CheckpointError& e) {
        out.error = e.what();
      }
    };
    try {
      out.optimizer_steps = reducer->write_state_shards(*comm, write);
      settle_ema();  // in the checkpoint beside them
    } catch (...) {
      // A peer failed while the shards came: no checkpoint file will name this directory.
      std::error_code ec;
      if (leader) std::filesystem::remove_all(directory, ec);
      throw;
    }
    if (leader && !out.error.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(directory, ec);
    }
    written_shards = out;
  }

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
  const auto& res = impl_->spec.resources;
  const bool verify = impl_->spec.semantic.deterministic && res.verify_every_steps > 0;
  impl_->packet =
      std::make_unique<vnode::StepPacket>(m.parameters(), impl_->kernels->table_numel(), verify);
  if (verify) impl_->checks.emplace(res.verify_every_steps);
  impl_->fault = injected_fault();
  impl_->pace = StepPace::from_environment();
  impl_->kernels->bind_table(impl_->packet->table());
  impl_->optimizer =
      make_optimizer(impl_->spec.semantic.optimizer, m.parameters(), impl_->plan.virtual_nodes());
  ReducerOptions reduction;
  reduction.device = impl_->device;
  reduction.exact = impl_->spec.semantic.deterministic;
  reduction.bucket_bytes = static_cast<int64_t>(impl_->spec.resources.bucket_mb * (1 << 20));
  reduction.clip = impl_->spec.semantic.clip;
  reduction.virtual_nodes = impl_->plan.virtual_nodes();
  reduction.table_numel = impl_->kernels->table_numel();
  reduction.second_thread = impl_->batches.prefetch();
  impl_->reducer = make_reducer(*impl_->packet, *impl_->optimizer, reduction);
  if (res.shard_optimizer) {
    // The fused optimizers keep their state by canonical shard (the spec allows no other).
    auto* sharded = dynamic_cast<ShardedState*>(impl_->optimizer.get());
    if (sharded == nullptr) {
      throw SpecError(fmt::format(
          "resources.shard_optimizer: {} keeps its state by canonical shard for float32 "
          "parameters on the CPU only; this worker's are {} on {}",
          impl_->spec.semantic.optimizer.name, c10::toString(m.parameters().front().scalar_type()),
          m.parameters().front().device().str()));
    }
    sharded->shard_by(
        vnode::ShardLayout(impl_->packet->gradients().numel(), impl_->plan.virtual_nodes()));
    impl_->reducer = make_sharded_reducer(std::move(impl_->reducer), *sharded, res.shard_replicas,
                                          *impl_->packet, impl_->spec.semantic.clip);
    impl_->reducer->set_layout(impl_->layout, impl_->comm->rank());
  }
  if (impl_->spec.semantic.ema.enabled()) {
    for (const auto& p : m.parameters()) impl_->ema.push_back(p.detach().clone());
  }
  // The parameters' first storage, replaced by the flat buffers, goes back to the system.
  release_free_memory();
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
    if (!im.mismatch.empty()) break;  // the step was undone (resources.on_mismatch: stop)
    examples += info.examples;
    last_loss = info.loss;
    // Where a checkpoint of this step is due, rank 0 writes the optimizer's shards first.
    im.write_shards_for_checkpoint();
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
  result.mismatch = im.mismatch;
  // The end's checkpoint (or the mismatch's) needs the optimizer's shards written; every
  // rank decides alike whether it is due.
  if (result.next_generation == 0) {
    // A gather that failed in the last step left some parameters to be sent again.
    im.reducer->settle(*im.comm);
    im.settle_ema();
    im.write_shards_for_checkpoint();
  }
  if (!im.mismatch.empty() && im.spec.output.checkpoint.dir.empty() && rank() == 0) {
    // The state before the step the workers disagreed on is kept even where the job keeps
    // no checkpoints: what `--replay` starts from.
    const auto path = im.checkpoint_target();
    save_checkpoint(path);
    spdlog::error("[verify] the state before step {} is saved in {}", im.step, path);
  }
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

bool Trainer::parameters_complete() const { return impl_->reducer->parameters_complete(); }

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
  auto& im = *impl_;
  auto parts = im.state_parts();
  if (im.spec.resources.shard_optimizer) {
    // The optimizer state went by canonical shard into the files beside `path`, at the
    // steps output.checkpoint names; the checkpoint itself records that, written last.
    const auto& written = im.written_shards;
    if (written.step != im.step || written.path != path) {
      throw CheckpointError(fmt::format(
          "{}: the optimizer state is kept by shard on the workers (resources.shard_optimizer) "
          "and is written beside a checkpoint at the steps output.checkpoint names only",
          path));
    }
    if (!written.error.empty()) throw CheckpointError(written.error);
    parts.optimizer_shards = im.plan.virtual_nodes();
    parts.optimizer_steps = written.optimizer_steps;
  }
  save_state(path, parts, im.state_header());
}

std::string Trainer::state_bytes() const {
  auto header = impl_->state_header();
  header.ema_pending = impl_->ema_pending;
  return serialize_state(impl_->transfer_parts(), header);
}

void Trainer::load_state_bytes(const std::string& bytes) {
  auto& im = *impl_;
  const int64_t before = im.step;
  im.load(bytes, "transferred state", im.transfer_parts());
  im.reducer->state_transferred(im.step != before);
}

void Trainer::load_checkpoint(const std::string& path) {
  auto& im = *impl_;
  const auto header = im.load(read_checkpoint_file(path), path, im.state_parts());
  if (header.optimizer_shards > 0) {
    // The optimizer state is in files of canonical shards beside it: this worker reads
    // those it keeps (sharded) or every one (not).
    auto* state = dynamic_cast<ShardedState*>(im.optimizer.get());
    if (header.optimizer_shards != im.plan.virtual_nodes()) {
      throw CheckpointError(fmt::format(
          "{}: its optimizer state is kept in {} canonical shards, and this job has {} vnodes",
          path, header.optimizer_shards, im.plan.virtual_nodes()));
    }
    if (state == nullptr) {
      throw CheckpointError(fmt::format(
          "{}: its optimizer state is kept by canonical shard, which {} on {} cannot read "
          "(the fused optimizers on the CPU can)",
          path, im.spec.semantic.optimizer.name, im.device.str()));
    }
    const vnode::ShardLayout layout(im.packet->gradients().numel(), header.optimizer_shards);
    const auto directory = shard_directory(path);
    // Every file is there before the job goes on (each is checked whole when it is read,
    // by the workers that keep it, once the group is known).
    for (int64_t s = 0; s < layout.shards(); ++s) {
      if (!std::filesystem::is_regular_file(shard_file(directory, s))) {
        throw CheckpointError(fmt::format("{}: its optimizer state's shard {} is missing ({})",
                                          path, s, shard_file(directory, s)));
      }
    }
    const int64_t rows = state->state_tensors();
    state->load_shards(
        layout, header.optimizer_steps,
        [layout, directory, rows, step = header.step, optimizer_steps = header.optimizer_steps,
         name = im.spec.semantic.optimizer.name](int64_t s) {
          return load_shard(shard_file(directory, s),
                            record_of(layout, s, step, optimizer_steps, name), rows);
        });
  }
  spdlog::info("[engine] resumed from {} at step {} (fingerprint {})", path, step(), fingerprint());
}

void Trainer::load_state(const std::string& bytes, const std::string& source) {
  impl_->load(bytes, source, impl_->state_parts());
}

VnodeContribution Trainer::contribution(int64_t vnode) {
  auto& im = *impl_;
  VFLOW_ASSERT(im.step < im.total_steps, "contribution() after the last step");
  const auto batch = im.order.batch(im.step % im.order.steps_per_epoch());
  if (vnode < 0 || vnode >= im.plan.virtual_nodes()) {
    throw SpecError(fmt::format("vnode {} is out of range: the job has {} vnodes (0..{})", vnode,
                                im.plan.virtual_nodes(), im.plan.virtual_nodes() - 1));
  }
  VnodeContribution out;
  out.step = im.step;
  out.vnode = vnode;
  out.examples = im.plan.slice(vnode, batch.size).size;
  if (out.examples == 0) {
    throw SpecError(
        fmt::format("vnode {} has no examples in step {} (the epoch's last, shorter "
                    "batch)",
                    vnode, im.step));
  }
  im.model->train();
  im.packet->clear();
  im.kernels->begin_step();
  try {
    out.loss = im.compute_alone(im.step, vnode, batch).item<double>();
    out.hash = im.packet->contribution_hash();
  } catch (...) {
    im.kernels->abort_step();
    im.packet->clear();
    throw;
  }
  // The state first (a NaN there reaches the loss and every gradient), then the loss,
  // then the gradients, each in the model's parameter order.
  const auto named = im.model->named_parameters();
  for (const auto& p : named) {
    if (!out.non_finite.empty()) break;
    if (!torch::isfinite(p.value()).all().item<bool>()) out.non_finite = "parameter " + p.key();
  }
  if (out.non_finite.empty() && !std::isfinite(out.loss)) out.non_finite = "loss";
  for (const auto& p : named) {
    if (!out.non_finite.empty()) break;
    const auto& g = p.value().grad();
    if (g.defined() && !torch::isfinite(g).all().item<bool>()) {
      out.non_finite = "gradient of " + p.key();
    }
  }
  im.kernels->abort_step();
  im.packet->clear();
  return out;
}

void Trainer::request_stop() { impl_->stop_request.store(true); }
void Trainer::stop_now() { impl_->stop_agreed = true; }
void Trainer::record_examples(bool on) { impl_->record_examples = on; }

void Trainer::state_donated() {
  for (auto& o : impl_->observers) o->on_state_donated(*this);
}
void Trainer::hand_off_state(const std::vector<int>& next_rank, int next_size,
                             const std::vector<int64_t>& next_counts) {
  auto& im = *impl_;
  im.reducer->hand_off(*im.comm, next_rank,
                       vnode::layout_of(im.plan.virtual_nodes(), next_size, next_counts));
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
  im.layout = vnode::layout_of(im.plan.virtual_nodes(), workers, {});
  if (im.checks) im.checks->forget();
  if (im.reducer) im.reducer->set_layout(im.layout, im.comm->rank());
  // Every member of the new group takes part in the next checkpoint's shards, whatever
  // each wrote before (write_shards_for_checkpoint's guard must agree on every rank).
  im.written_shards = {};
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
  im.layout = vnode::layout_of(im.plan.virtual_nodes(), im.comm->size(), counts);
  if (im.reducer) im.reducer->set_layout(im.layout, im.comm->rank());
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
