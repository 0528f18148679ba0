#include "vflow/engine/trainer.h"

#include <fmt/format.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>

#include "core/input_file.h"
#include "core/output_file.h"
#include "core/torch_compat.h"
#include "engine/background_task.h"
#include "engine/bucketed_reduction.h"
#include "engine/copy_stream.h"
#include "engine/fused_update.h"
#include "vflow/comm/nccl.h"
#include "vflow/comm/split_sum.h"
#include "vflow/core/clock.h"
#include "vflow/core/error.h"
#include "vflow/core/process.h"
#include "vflow/core/spec_node.h"
#include "vflow/engine/checkpoint.h"
#include "vflow/engine/fingerprint.h"
#include "vflow/engine/lr_schedule.h"
#include "vflow/engine/optimizer.h"
#include "vflow/vnode/fixed_point.h"
#include "vflow/vnode/gradient_buffer.h"
#include "vflow/vnode/plan.h"
#include "vflow/vnode/stateful_kernels.h"
#include "vflow/vnode/step_packet.h"

namespace vflow::engine {

namespace {

constexpr int64_t kCheckpointFormat = 1;
/// Checkpoints are read whole into memory; this only bounds what a wrong path can cost.
constexpr uint64_t kMaxCheckpointBytes = uint64_t{1} << 40;
constexpr uint64_t kInitStream = 0x1417;

using Clock = std::chrono::steady_clock;

/// The first line where two texts differ, for a readable mismatch message.
std::string first_difference(const std::string& a, const std::string& b) {
  std::istringstream sa(a), sb(b);
  std::string la, lb;
  while (true) {
    const bool ga = static_cast<bool>(std::getline(sa, la));
    const bool gb = static_cast<bool>(std::getline(sb, lb));
    if (!ga && !gb) return "(no difference)";
    if (!ga) la = "(end)";
    if (!gb) lb = "(end)";
    if (la != lb) {
      // The checkpoint's text may be anything (a damaged file): shown short and printable.
      const auto shown = [](const std::string& line) {
        return printable(line.size() > 200 ? line.substr(0, 200) + "..." : line);
      };
      return fmt::format("checkpoint has '{}', this job has '{}'", shown(la), shown(lb));
    }
  }
}

}  // namespace

namespace {
/// The cores this worker may use: its CPU affinity and its cgroup's CPU quota count, so a
/// worker in a container limited to 2 of a host's 64 cores runs 2 threads, not 64.
int64_t host_cores() { return usable_cores(); }

/// The intra-op threads of a worker whose resources.threads is resolved, or, where it is 0
/// (in-process, where no launcher placed it), of the only worker on the host.
int64_t configured_threads(const ResourcesSpec& resources) {
  return resources.threads > 0 ? resources.threads : host_cores();
}
}  // namespace

int64_t intra_op_threads(const JobSpec& spec, int64_t local_workers) {
  if (spec.resources.threads > 0) return spec.resources.threads;
  if (spec.semantic.deterministic) return 1;
  // Every core for each of several workers oversubscribes the host, and each one's
  // intra-op threads spin while waiting for cores the others hold: two workers of an MLP
  // 784-2048-2048-10 on 2 cores trained at about 600 examples/s so, 2,090 with one each.
  return std::max<int64_t>(1, host_cores() / std::max<int64_t>(1, local_workers));
}

bool prefetch_enabled(const ResourcesSpec& resources, int64_t local_workers) {
  if (resources.prefetch != "auto") return resources.prefetch == "true";
  // A background loader only helps when it gets a core of its own; on a fully
  // subscribed host it competes with the compute threads (measured at first: about
  // -15% with 2 single-threaded workers on 2 cores; at later builds within the noise
  // either way, docs/benchmarks.md, so the rule stands on the first measurement).
  return configured_threads(resources) * std::max<int64_t>(1, local_workers) < host_cores();
}

void seed_initialisation(const SemanticSpec& semantic) {
  torch::manual_seed(vnode::mix_seed(semantic.seed, kInitStream, 0));
}

namespace {
/// The device `name` (cpu, cuda, cuda:K) on this machine; errors name `key`.
torch::Device resolve_device(const std::string& name, const std::string& key) {
  if (name == "cpu") return torch::Device(torch::kCPU);
  if (!torch::cuda::is_available()) {
    throw SpecError(fmt::format(
        "{}: '{}' requested but this LibTorch build or machine has no CUDA device", key, name));
  }
  const auto count = static_cast<int>(torch::cuda::device_count());
  if (name != "cuda") {
    torch::Device device(name);
    if (device.index() >= count) {
      throw SpecError(fmt::format("{}: {} does not exist ({} CUDA device{} visible)", key, name,
                                  count, count == 1 ? "" : "s"));
    }
    return device;
  }
  return torch::Device(torch::kCUDA, 0);
}
}  // namespace

torch::Device worker_device(const ResourcesSpec& resources) {
  return resolve_device(resources.device, "resources.device");
}

void check_devices(const ResourcesSpec& resources) {
  worker_device(resources);  // entries without a device of their own, and joiners
  for (size_t i = 0; i < resources.layout.size(); ++i) {
    const auto& device = resources.layout[i].device;
    if (!device.empty()) resolve_device(device, fmt::format("resources.layout[{}].device", i));
  }
}

void choose_backend(const ResourcesSpec& resources, torch::Device device, comm::Rendezvous& r) {
  comm::choose_backend(resources.backend, "resources.backend", device, r);
  r.shared_memory = resources.shared_memory;
}

namespace {
/// Keeps the memory of freed tensors in the process for the next step. glibc's malloc
/// serves large blocks with mmap and hands freed heap tops back to the kernel, so every
/// step's activations fault their pages in afresh; on a virtual machine of this project's
/// reference kind that more than doubled a transformer's step (bert-mini, one thread, the
/// plain LibTorch loop: 26-28 against 62-64 examples/s, docs/benchmarks.md). Blocks below 64 MiB
/// now come from the heap, which is trimmed once 128 MiB lie free at its top. glibc's own settings
/// in the environment win.
void keep_freed_memory() {
#if defined(__GLIBC__)
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"}) {
    if (std::getenv(name) != nullptr) return;
  }
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 128 << 20);
#endif
}
}  // namespace

void set_intra_op_threads(int64_t threads) {
  torch::set_num_threads(static_cast<int>(threads));
#ifdef _OPENMP
  // The library's own loops run on the OpenMP runtime it was linked with: LibTorch's on
  // Debian, where this repeats the setting. PyTorch's wheels carry a copy of their own, and
  // which copy each library's calls bind to depends on the load order; this sets both.
  omp_set_num_threads(static_cast<int>(threads));
#endif
}

void note_deterministic_threads(const JobSpec& spec) {
  if (spec.resources.threads != 0 || !spec.semantic.deterministic || host_cores() == 1) return;
  spdlog::info(
      "[runtime] deterministic mode with resources.threads 0: one intra-op thread, since the "
      "thread count changes LibTorch's CPU results; set resources.threads to use more (every "
      "run that must agree bit for bit with the same value)");
}

void configure_runtime(const JobSpec& spec) {
  keep_freed_memory();
  const auto threads = intra_op_threads(spec, /*local_workers=*/1);
  note_deterministic_threads(spec);  // in-process; a launched worker's was resolved already
  set_intra_op_threads(threads);
  compat::set_deterministic_algorithms(spec.semantic.deterministic);
  compat::use_full_float32();
  if (spec.resources.memory_limit_mb > 0) {
    // OpenBLAS (0.3.21, Debian 12) retries a failed allocation of its per-thread work
    // buffers forever instead of failing (OpenBLAS issue 5289): let it allocate them for
    // the main thread and every intra-op thread before memory is capped.
    const auto a = torch::ones({256, 256});
    torch::mm(a, a);
    at::parallel_for(0, threads, 1, [&](int64_t, int64_t) { torch::mm(a, a); });
    // The soft limit only, so that a process running several jobs can lift it again.
    rlimit limit{};
    getrlimit(RLIMIT_DATA, &limit);
    const auto bytes = static_cast<rlim_t>(spec.resources.memory_limit_mb) << 20;
    limit.rlim_cur = limit.rlim_max == RLIM_INFINITY ? bytes : std::min(bytes, limit.rlim_max);
    if (setrlimit(RLIMIT_DATA, &limit) != 0) {
      throw Error(fmt::format("cannot limit memory to {} MiB: {}", spec.resources.memory_limit_mb,
                              std::strerror(errno)));
    }
  }
}

/// One unit of vnode work: vnode `vnode` of step `step`.
struct WorkItem {
  int64_t step = -1;
  int64_t vnode = -1;
  bool operator==(const WorkItem& o) const { return step == o.step && vnode == o.vnode; }
};

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
  /// The optimizer, when its update reads deterministic mode's summed gradient where it
  /// lies (a fused one on the CPU, with no clipping), else null.
  FixedPointStep* fixed_point_step = nullptr;
  /// That summed gradient (reduce_packet), for this step's update.
  std::optional<vnode::FixedPointSum::Reduced> reduced_gradient;
  /// Or: this step's update rounds the gradients of one worker's only vnode as it reads
  /// them (FixedPointStep::step_rounding).
  bool rounding_gradient = false;
  std::vector<torch::Tensor> ema;  // semantic.ema: the parameters' average, in their order
  std::shared_ptr<comm::Communicator> comm;
  vnode::VnodeRange held;  // the vnodes this worker processes
  bool prefetch = false;   // load the next vnode's batch in the background
  // Deterministic mode: the exact sum of vnode contributions, and its reduction.
  std::unique_ptr<vnode::FixedPointSum> exact;
  std::unique_ptr<comm::SplitSum> exact_reduction;
  // Deterministic mode with a core beyond the intra-op threads (resources.prefetch): the
  // thread that runs half of each of the exact sum's passes.
  std::unique_ptr<BackgroundTask<bool>> second_thread;
  // The reduction in buckets, overlapped with the last backward pass.
  std::unique_ptr<BucketedReduction> buckets;
  bool bucketed = false;  // this step reduces through `buckets`
  // Deterministic mode in buckets: the dense part the buckets fill, and the large values
  // each bucket listed so far this step.
  torch::Tensor bucket_dense;
  std::vector<torch::Tensor> bucket_index, bucket_value;
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

  // Epoch permutations, shared with the prefetch thread.
  mutable std::mutex perm_mutex;
  mutable std::map<int64_t, torch::Tensor> perms;

  // The background load of the next vnode's batch, copied to the device on a side stream.
  CopyStream copy_stream{device};
  WorkItem pending_item;
  BackgroundTask<CopiedBatch> loader;

  Impl(JobSpec s, std::shared_ptr<models::Model> m, data::DataSplits d)
      : spec(std::move(s)),
        model(std::move(m)),
        data(std::move(d)),
        device(worker_device(spec.resources)),
        bf16(spec.semantic.precision == "bf16"),
        plan(spec.semantic.vnode_sizes.empty()
                 ? vnode::VirtualNodePlan(spec.semantic.global_batch, spec.semantic.virtual_nodes)
                 : vnode::VirtualNodePlan(spec.semantic.global_batch, spec.semantic.vnode_sizes)),
        order(spec.semantic.seed, data.train ? data.train->size() : 0, spec.semantic.global_batch,
              spec.semantic.data.drop_last),
        total_steps(spec.semantic.steps > 0 ? spec.semantic.steps
                                            : spec.semantic.epochs * order.steps_per_epoch()),
        schedule(spec.semantic.schedule, spec.semantic.optimizer.lr, total_steps) {}

  torch::Tensor permutation(int64_t epoch) const {
    std::lock_guard<std::mutex> lock(perm_mutex);
    auto it = perms.find(epoch);
    if (it != perms.end()) return it->second;
    auto p = order.permutation(epoch);
    auto t = torch::from_blob(p.data(), {static_cast<int64_t>(p.size())}, torch::kInt64).clone();
    while (perms.size() >= 2) perms.erase(perms.begin());
    perms.emplace(epoch, t);
    return t;
  }

  /// Positions of vnode v's examples in the epoch permutation, for `step`.
  vnode::Slice vnode_positions(int64_t s, int64_t v) const {
    const auto batch = order.batch(s % order.steps_per_epoch());
    const auto part = plan.slice(v, batch.size);
    return vnode::Slice{batch.offset + part.offset, part.size};
  }

  CopiedBatch load(const WorkItem& item) const {
    const auto pos = vnode_positions(item.step, item.vnode);
    const auto idx =
        permutation(item.step / order.steps_per_epoch()).narrow(0, pos.offset, pos.size);
    return copy_stream.copy(data.train->get(idx));
  }

  /// The non-empty vnode work that follows `item`, or step -1 at the end of training.
  WorkItem next_item(WorkItem item) const {
    while (true) {
      if (++item.vnode == plan.virtual_nodes()) {
        item.vnode = 0;
        ++item.step;
      }
      if (item.step >= total_steps) return WorkItem{};
      if (item.vnode >= held.first && item.vnode < held.last &&
          vnode_positions(item.step, item.vnode).size > 0) {
        return item;
      }
    }
  }

  /// Discards a background load (a new generation holds other vnodes).
  void drain_loader() {
    if (!loader.outstanding()) return;
    try {
      loader.wait();
    } catch (const std::exception&) {
      // The load is not needed any more; a real data error shows again when retried.
    }
  }

  std::vector<int64_t> example_indices(int64_t s, int64_t v) const {
    const auto pos = vnode_positions(s, v);
    const auto idx = permutation(s / order.steps_per_epoch()).narrow(0, pos.offset, pos.size);
    return std::vector<int64_t>(idx.data_ptr<int64_t>(), idx.data_ptr<int64_t>() + pos.size);
  }

  /// After the collective, the table's presence column counts the workers that ran each
  /// vnode: lists each vnode's examples that many times (an audit of exactly-once use).
  void record_use(int64_t s, StepInfo& info) const {
    const auto flags = kernels->table().select(1, 0).to(torch::kCPU).contiguous();
    for (int64_t v = 0; v < plan.virtual_nodes(); ++v) {
      const auto runs = std::lround(flags[v].item<double>());
      for (long k = 0; k < runs; ++k) info.examples_used.emplace_back(v, example_indices(s, v));
    }
  }

  /// Undoes the local effects of a step whose collective failed: nothing was applied to
  /// the parameters or the optimizer, but the stateful kernels hold partial updates.
  void abandon_step() {
    drain_loader();
    kernels->abort_step();
    packet->clear();
    if (exact) exact->clear();
    reduced_gradient.reset();
    rounding_gradient = false;
  }

  data::Batch take(const WorkItem& item) {
    CopiedBatch batch;
    if (loader.outstanding()) {
      auto ready = loader.wait();  // rethrows a load error
      if (pending_item == item) batch = std::move(ready);
    }
    if (!batch.batch.input.defined()) batch = load(item);
    if (prefetch) {
      const WorkItem next = next_item(item);
      if (next.step >= 0) {
        pending_item = next;
        loader.submit([this, next] { return load(next); });
      }
    }
    return copy_stream.ready(std::move(batch));
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
    packet->clear();
    kernels->begin_step();
    if (exact) exact->clear();
    // Every rank of the group decides alike: the collectives must match.
    bucketed = buckets && comm->size() > 1 && comm->asynchronous();
    if (bucketed && exact) {
      bucket_dense = exact_reduction->dense(comm->size());
      bucket_index.clear();
      bucket_value.clear();
    }
    int64_t ran = 0;
    try {
      ran = run_vnodes(s, batch);
    } catch (...) {
      if (bucketed) buckets->abandon(*comm);
      throw;
    }
    // Kernels run asynchronously on a GPU: the compute time (and the speed measured for
    // re-planning and profiles) includes them only once they have finished.
    if (device.is_cuda()) torch::cuda::synchronize(device.index());
    const auto t_sync = Clock::now();
    reduce_packet();
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
    if (spec.semantic.clip.enabled()) info.grad_norm = clip_gradients();
    if (reduced_gradient) {
      fixed_point_step->step_fixed_point(*reduced_gradient);
      reduced_gradient.reset();
    } else if (rounding_gradient) {
      fixed_point_step->step_rounding();
      rounding_gradient = false;
    } else {
      optimizer->step();
    }
    ++step;
    if (!ema.empty() && step % spec.semantic.ema.every_steps == 0) update_ema();

    info.step = s;
    info.workers = comm->size();
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
      // Deterministic mode: the previous vnode's contributions become exact integers; the
      // last vnode's are rounded on their way into the reduction.
      if (exact && ran > 1) check_range(exact->absorb(packet->flat()));
      const data::Batch b = take(WorkItem{s, v});
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
        if (bucketed && device.is_cpu()) buckets->arm(*comm);
      }
      // Weight n_v / B: the accumulated gradient is the global batch's mean-loss gradient.
      (loss * (static_cast<double>(part.size) / static_cast<double>(batch.size))).backward();
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

  /// The one collective: gradients, stateful-kernel table, loss and control word together
  /// (deterministic mode: as exact fixed-point integers, 32 bits an element).
  void reduce_packet() {
    auto& flat = packet->flat();
    if (bucketed) {
      buckets->finish(*comm);
      if (exact) {
        const auto listed = exact_reduction->merge(*comm);
        exact->clear();
        take_exact_sums(bucket_dense, listed);
      }
      return;
    }
    if (!exact) {
      comm->allreduce_sum(flat);
      return;
    }
    const int world = comm->size();
    if (world == 1) {
      if (fixed_point_step != nullptr && exact->empty()) {
        // This worker's only vnode: every value's range is checked now, the gradients are
        // rounded by the update as it reads them, the rest of the packet here.
        check_range(exact->round_in_place_from(flat, packet->gradients().numel()));
        rounding_gradient = true;
        return;
      }
      check_range(exact->round_in_place(flat));
      return;
    }
    if (comm->can_combine() && plan.virtual_nodes() == world) {
      // One vnode a worker, on one host: the exact sum is formed inside the reduction,
      // each element converted once, and every rank checks the range of all the parts.
      VFLOW_ASSERT(exact->empty(), "a worker of one vnode absorbed none before the reduction");
      check_range(comm->allreduce_combine(flat, vnode::FixedPointSum::sum_rounded));
      exact->clear();
      return;
    }
    auto dense = exact_reduction->dense(world);
    torch::Tensor index, value;
    check_range(exact->split(flat, comm::SplitSum::dense_limit(world), dense, index, value));
    take_exact_sums(dense, exact_reduction->reduce(*comm, index, value));
  }

  /// Deterministic mode in buckets: what bucket `b` sums, its range of the packet as
  /// exact integers (split while the rest of the backward pass runs). The bucket at
  /// offset 0 starts last and carries every bucket's listed values.
  torch::Tensor prepare_exact_bucket(const BucketedReduction::Bucket& b) {
    torch::Tensor index, value;
    check_range(exact->split_part(packet->flat(), comm::SplitSum::dense_limit(comm->size()),
                                  bucket_dense, index, value, b.offset, b.numel));
    bucket_index.push_back(std::move(index));
    bucket_value.push_back(std::move(value));
    if (b.offset == 0) {
      exact_reduction->list(comm->rank(), torch::cat(bucket_index), torch::cat(bucket_value));
    }
    return exact_reduction->carrier_part(b.offset, b.numel);
  }

  /// Deterministic mode: the packet from the summed parts. The update reads the
  /// gradients' sums where they lie (bitwise the same step, one pass less); the rest of
  /// the packet is assembled as floats.
  void take_exact_sums(const torch::Tensor& dense, const comm::SplitSum::Listed& listed) {
    auto& flat = packet->flat();
    if (fixed_point_step != nullptr) {
      const int64_t gradients = packet->gradients().numel();
      vnode::FixedPointSum::assemble(dense, listed.index, listed.value, flat, gradients);
      reduced_gradient =
          vnode::FixedPointSum::reduced(dense, listed.index, listed.value, gradients);
      return;
    }
    vnode::FixedPointSum::assemble(dense, listed.index, listed.value, flat);
  }

  /// Every worker holds the same parameters after the update, so each keeps the same
  /// average.
  void update_ema() {
    torch::NoGradGuard no_grad;
    const double decay = spec.semantic.ema.decay;
    const auto params = model->parameters();
    for (size_t i = 0; i < ema.size(); ++i) ema[i].mul_(decay).add_(params[i], 1 - decay);
  }

  /// semantic.clip on the reduced gradient, which every worker holds alike, so the
  /// clipped update is the same for every worker count. Returns the norm before clipping.
  double clip_gradients() {
    const auto& clip = spec.semantic.clip;
    auto gradients = packet->gradients();
    const double norm = gradients.norm().item<double>();
    if (clip.value > 0) gradients.clamp_(-clip.value, clip.value);
    if (clip.max_norm > 0) {
      // As PyTorch's clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is < 1.
      const double clipped = clip.value > 0 ? gradients.norm().item<double>() : norm;
      const double scale = clip.max_norm / (clipped + 1e-6);
      if (scale < 1) gradients.mul_(scale);
    }
    return norm;
  }

  /// Deterministic mode: `largest`, the largest magnitude of a vnode's contributions
  /// (NaN if one is NaN), must be in the exact sum's range. Integer addition is
  /// associative, so the total is bitwise the same however vnodes are spread over
  /// workers and in whatever order the collective adds the workers' parts.
  void check_range(double largest) const {
    if (!(largest < vnode::FixedPointSum::kLimit)) {
      throw Error(fmt::format(
          "step {}: a gradient value of {} is outside the deterministic reduction's range "
          "(|g| < {}); the run diverged or needs deterministic: false",
          step, largest, vnode::FixedPointSum::kLimit));
    }
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
  impl_->prefetch = prefetch_enabled(placed, /*local_workers=*/1);
  impl_->kernels =
      std::make_unique<vnode::StatefulKernelSet>(m, impl_->plan.virtual_nodes(), impl_->device);
  impl_->packet =
      std::make_unique<vnode::StepPacket>(m.parameters(), impl_->kernels->table_numel());
  impl_->kernels->bind_table(impl_->packet->table());
  if (impl_->spec.semantic.deterministic) {
    impl_->exact = std::make_unique<vnode::FixedPointSum>(impl_->packet->numel(), impl_->device);
    impl_->exact_reduction = std::make_unique<comm::SplitSum>(impl_->packet->numel(), impl_->device,
                                                              impl_->kernels->table_numel());
    if (impl_->prefetch && impl_->device.is_cpu()) {
      impl_->second_thread = std::make_unique<BackgroundTask<bool>>();
      impl_->exact->share_passes(
          [task = impl_->second_thread.get()](const std::function<void()>& theirs,
                                              const std::function<void()>& mine) {
            task->submit([&theirs] {
              theirs();
              return true;
            });
            std::exception_ptr error;
            try {
              mine();
            } catch (...) {  // rethrown once the other half is done with the buffer
              error = std::current_exception();
            }
            task->wait();
            if (error) std::rethrow_exception(error);
          });
    }
  }
  if (impl_->spec.resources.bucket_mb > 0) {
    BucketedReduction::Prepare prepare;
    if (impl_->exact) {
      prepare = [impl = impl_.get()](const BucketedReduction::Bucket& b) {
        return impl->prepare_exact_bucket(b);
      };
    }
    impl_->buckets = std::make_unique<BucketedReduction>(
        *impl_->packet, static_cast<int64_t>(impl_->spec.resources.bucket_mb * (1 << 20)),
        std::move(prepare));
  }
  impl_->optimizer = make_optimizer(impl_->spec.semantic.optimizer, m.parameters());
  if (impl_->exact && impl_->device.is_cpu() && !impl_->spec.semantic.clip.enabled()) {
    impl_->fixed_point_step = dynamic_cast<FixedPointStep*>(impl_->optimizer.get());
  }
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
               im.prefetch ? "on" : "off");
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
  torch::NoGradGuard no_grad;
  // output.evaluation.use_ema: the average takes the parameters' place while evaluating.
  std::vector<torch::Tensor> trained;
  if (im.spec.output.evaluation.use_ema && !im.ema.empty()) {
    torch::NoGradGuard no_grad;
    auto params = im.model->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      trained.push_back(params[i].detach().clone());
      params[i].copy_(im.ema[i]);
    }
  }
  im.model->eval();
  const int64_t n = im.data.test->size();
  const int64_t chunk = im.spec.output.evaluation.batch;
  double loss_sum = 0;
  int64_t correct = 0;
  int64_t predictions = 0;  // examples, or tokens of a sequence model
  for (int64_t begin = 0; begin < n; begin += chunk) {
    const int64_t size = std::min(chunk, n - begin);
    auto b = im.data.test->get(torch::arange(begin, begin + size, torch::kInt64));
    const compat::AutocastGuard autocast(im.device.type(), im.bf16);
    const auto logits = im.model->forward(b.input.to(im.device));
    const auto target = b.target.to(im.device);
    loss_sum += models::prediction_loss(logits, target, /*sum=*/true).item<double>();
    correct += logits.argmax(-1).eq(target).sum().item<int64_t>();
    predictions += target.numel();
  }
  im.model->train();
  if (!trained.empty()) {
    torch::NoGradGuard no_grad;
    auto params = im.model->parameters();
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(trained[i]);
  }
  EvalResult r;
  r.step = im.step;
  r.examples = n;
  r.loss = predictions > 0 ? loss_sum / static_cast<double>(predictions) : 0;
  r.accuracy =
      predictions > 0 ? static_cast<double>(correct) / static_cast<double>(predictions) : 0;
  return r;
}

void Trainer::publish_evaluation(const EvalResult& result) {
  impl_->last_eval = result;
  for (auto& o : impl_->observers) o->on_evaluation(*this, result);
}

const std::optional<EvalResult>& Trainer::last_evaluation() const { return impl_->last_eval; }

namespace {
/// Inside a catch block: LibTorch's c10::Error, or the plain std::exception its TorchScript
/// type parser throws (torch::jit::ErrorReport, on a damaged archive's class names), as a
/// CheckpointError; vflow's own errors pass unchanged.
[[noreturn]] void rethrow_as_checkpoint_error(const std::string& what) {
  try {
    throw;
  } catch (const Error&) {
    throw;
  } catch (const c10::Error& e) {
    throw CheckpointError(fmt::format("{}: {}", what, compat::message_of(e)));
  } catch (const std::exception& e) {
    const std::string message = e.what();
    const std::string line = message.substr(0, message.find('\n'));
    throw CheckpointError(fmt::format("{}: {}", what, line.empty() ? "a damaged archive" : line));
  }
}

/// Reads a required value of a vflow state archive.
c10::IValue read_value(torch::serialize::InputArchive& archive, const std::string& source,
                       const char* key) {
  c10::IValue v;
  if (!archive.try_read(key, v)) {
    throw CheckpointError(fmt::format("{}: not a vflow checkpoint (no '{}')", source, key));
  }
  return v;
}
}  // namespace

void Trainer::save_checkpoint(const std::string& path) const {
  // LibTorch's own file writer throws from its destructor when the disk fills, which ends
  // the process in std::terminate. It writes through vflow's checked writer instead, which
  // never fails mid-way: it keeps the first error and reports it at the end.
  core::AtomicFile file(path);
  try {
    torch::serialize::OutputArchive archive;
    write_state(archive);
    archive.save_to([&](const void* data, size_t size) { return file.write(data, size); });
  } catch (...) {
    rethrow_as_checkpoint_error(path + ": cannot write checkpoint");
  }
  if (const std::string error = file.commit(); !error.empty()) {
    throw CheckpointError(fmt::format("{}: cannot write checkpoint: {}", path, error));
  }
}

std::string Trainer::state_bytes() const {
  torch::serialize::OutputArchive archive;
  write_state(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void Trainer::load_state_bytes(const std::string& bytes) { load_state(bytes, "transferred state"); }

void Trainer::write_state(torch::serialize::OutputArchive& archive) const {
  auto& im = *impl_;
  archive.write("vflow_format", c10::IValue(kCheckpointFormat));
  archive.write("vflow_step", c10::IValue(im.step));
  archive.write("vflow_semantic", c10::IValue(im.spec.semantic_yaml()));
  archive.write("vflow_fingerprint", c10::IValue(fingerprint()));
  torch::serialize::OutputArchive model_archive;
  im.model->save(model_archive);
  archive.write("model", model_archive);
  torch::serialize::OutputArchive optimizer_archive;
  im.optimizer->save(optimizer_archive);
  archive.write("optimizer", optimizer_archive);
  if (!im.ema.empty()) {
    torch::serialize::OutputArchive ema_archive;
    for (size_t i = 0; i < im.ema.size(); ++i) {
      ema_archive.write(fmt::format("p{}", i), im.ema[i], /*is_buffer=*/true);
    }
    archive.write("ema", ema_archive);
  }
}

void Trainer::load_checkpoint(const std::string& path) {
  // Read with vflow's own checks first: LibTorch's reader would block on a FIFO and read
  // a device such as /dev/zero for ever.
  const auto in = core::read_input_file(path, kMaxCheckpointBytes);
  if (!in.ok())
    throw CheckpointError(fmt::format("{}: cannot read checkpoint: {}", path, in.error));
  // A damaged file is refused here: LibTorch checks no CRC and can crash on one.
  check_archive(in.bytes, path);
  load_state(in.bytes, path);
  spdlog::info("[engine] resumed from {} at step {} (fingerprint {})", path, step(), fingerprint());
}

void Trainer::load_state(const std::string& bytes, const std::string& source) {
  torch::serialize::InputArchive archive;
  try {
    // Onto this worker's device: the writer's may be another (a job can mix devices).
    archive.load_from(bytes.data(), bytes.size(), impl_->device);
  } catch (...) {
    rethrow_as_checkpoint_error(source + ": cannot read checkpoint");
  }
  try {
    read_state(archive, source);
  } catch (...) {
    // A value of the wrong type (a damaged or foreign file).
    rethrow_as_checkpoint_error(source + ": not a usable vflow checkpoint");
  }
}

void Trainer::read_state(torch::serialize::InputArchive& archive, const std::string& path) {
  auto& im = *impl_;
  auto read = [&](const char* key) { return read_value(archive, path, key); };
  const int64_t format = read("vflow_format").toInt();
  if (format != kCheckpointFormat) {
    throw CheckpointError(fmt::format("{}: checkpoint format {} is not supported (expected {})",
                                      path, format, kCheckpointFormat));
  }
  const std::string semantic = read("vflow_semantic").toStringRef();
  if (semantic != im.spec.semantic_yaml()) {
    throw CheckpointError(fmt::format(
        "{}: written by a job with a different semantic part, so resuming would change the "
        "result: {}",
        path, first_difference(semantic, im.spec.semantic_yaml())));
  }
  const int64_t saved_step = read("vflow_step").toInt();
  const std::string saved_fingerprint = read("vflow_fingerprint").toStringRef();
  if (saved_step < 0 || saved_step > im.total_steps) {
    throw CheckpointError(fmt::format("{}: step {} is outside this job's {} steps", path,
                                      saved_step, im.total_steps));
  }
  try {
    torch::serialize::InputArchive model_archive;
    archive.read("model", model_archive);
    im.model->load(model_archive);
    torch::serialize::InputArchive optimizer_archive;
    archive.read("optimizer", optimizer_archive);
    im.optimizer->load(optimizer_archive);
    if (!im.ema.empty()) {
      torch::serialize::InputArchive ema_archive;
      archive.read("ema", ema_archive);
      for (size_t i = 0; i < im.ema.size(); ++i) {
        torch::Tensor t;
        ema_archive.read(fmt::format("p{}", i), t, /*is_buffer=*/true);
        if (!t.sizes().equals(im.ema[i].sizes())) {
          throw Error(fmt::format("its weight average p{} has shape {}, the parameter {}", i,
                                  fmt::join(t.sizes(), "x"), fmt::join(im.ema[i].sizes(), "x")));
        }
        im.ema[i] = t.to(im.device);
      }
    }
  } catch (const c10::Error& e) {
    throw CheckpointError(
        fmt::format("{}: does not fit this model: {}", path, compat::message_of(e)));
  } catch (const std::exception& e) {
    throw CheckpointError(fmt::format("{}: does not fit this model: {}", path, e.what()));
  }
  im.model->to(im.device);
  im.packet->gradient_buffer().bind();
  im.step = saved_step;
  if (fingerprint() != saved_fingerprint) {
    throw CheckpointError(
        fmt::format("{}: restored state has fingerprint {}, checkpoint recorded "
                    "{} (corrupt file?)",
                    path, fingerprint(), saved_fingerprint));
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
  im.drain_loader();
  im.comm = std::move(next);
  im.held = vnode::vnodes_of(im.plan.virtual_nodes(), workers, im.comm->rank());
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
}
void Trainer::set_stop_flag(const std::atomic<bool>* flag) { impl_->stop_flag = flag; }
std::string Trainer::fingerprint() const {
  return engine::fingerprint(*impl_->model, impl_->ema, "ema");
}
torch::Device Trainer::device() const { return impl_->device; }

double Trainer::seconds_per_vnode() const { return impl_->vnode_seconds; }
double Trainer::update_seconds() const { return impl_->update_seconds; }

int64_t Trainer::step() const { return impl_->step; }
int64_t Trainer::total_steps() const { return impl_->total_steps; }
int64_t Trainer::steps_per_epoch() const { return impl_->order.steps_per_epoch(); }
const JobSpec& Trainer::spec() const { return impl_->spec; }
models::Model& Trainer::model() { return *impl_->model; }

std::vector<int64_t> Trainer::batch_indices(int64_t step) const {
  const auto& im = *impl_;
  const auto batch = im.order.batch(step % im.order.steps_per_epoch());
  const auto perm =
      im.permutation(step / im.order.steps_per_epoch()).narrow(0, batch.offset, batch.size);
  return std::vector<int64_t>(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + batch.size);
}

}  // namespace vflow::engine
