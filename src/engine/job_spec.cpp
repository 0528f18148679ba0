#include "vflow/engine/job_spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "core/spec_schema.h"
#include "vflow/core/error.h"
#include "vflow/core/hash.h"
#include "vflow/data/dataset.h"
#include "vflow/models/registry.h"

namespace vflow::engine {

const std::string& default_job_yaml() {
  static const std::string text =
      R"(# vflow's default job: a ConvNet with batch norm and dropout on Fashion-MNIST.
semantic:
  model:
    name: convnet
    options: {channels: [32, 64], hidden: 128, dropout: 0.25, batch_norm: true}
  data:
    name: fashion-mnist
    options: {path: /usr/share/datasets/fashion-mnist}
  global_batch: 256
  virtual_nodes: 8
  optimizer: {name: sgd, lr: 0.05, momentum: 0.9, nesterov: true, weight_decay: 0.0005}
  schedule: {name: cosine, warmup_steps: 50}
  epochs: 3
  seed: 1
resources:
  workers: 1
  device: cpu
output:
  evaluation: {every_epochs: 1}
  logging: {progress: auto, every_steps: 50}
)";
  return text;
}

namespace {

constexpr int64_t kBig = int64_t{1} << 40;

bool is_cuda_device(const std::string& name) {
  return name == "cuda" || (name.size() > 5 && name.rfind("cuda:", 0) == 0 &&
                            name.find_first_not_of("0123456789", 5) == std::string::npos);
}

/// Refuses a device name other than cpu, cuda and cuda:K (empty only when `may_be_empty`).
void check_device(OptionReader& r, const std::string& device, bool may_be_empty) {
  if (device == "cpu" || is_cuda_device(device) || (device.empty() && may_be_empty)) return;
  r.fail("device", fmt::format("unknown device '{}'; choices: cpu, cuda, cuda:K", device));
}

// ---- the schema: every key of the job spec, once ------------------------------------

const SpecSchema<ModelSpec>& model_schema() {
  static const auto schema = [] {
    SpecSchema<ModelSpec> s("model");
    // Shorthand: {torchscript: file.pt} = {name: torchscript, options: {path: file.pt}}.
    s.custom("torchscript", [](OptionReader& r, ModelSpec& m) {
      if (!r.has("torchscript")) {
        r.value("torchscript");
        return;
      }
      if (r.node().find("name") || r.node().find("options")) {
        r.fail("torchscript", "the torchscript shorthand takes no name or options");
      }
      const SpecNode& script = *r.value("torchscript");
      r.get_string("torchscript", "");  // a path: a scalar
      m.name = "torchscript";
      m.options = SpecNode::map(r.node().where(), r.node().path() + ".options");
      m.options.set("path", script, script.key_where());
    });
    s.text("name", &ModelSpec::name,
           "model in the registry: `mlp`, `convnet`, `resnet`, `bert`, `transformer-lm`, "
           "`torchscript`, or one a program registers");
    s.options("options", &ModelSpec::options, "model options, below");
    return s;
  }();
  return schema;
}

const SpecSchema<DataSpec>& data_schema() {
  static const auto schema = [] {
    SpecSchema<DataSpec> s("data");
    s.text("name", &DataSpec::name,
           "data set in the registry: `fashion-mnist`, `synthetic`, the text data sets below, "
           "or one a program registers");
    s.options("options", &DataSpec::options, "data set options, below");
    s.boolean("drop_last", &DataSpec::drop_last,
              "drop each epoch's last, shorter batch; when false it is split over the vnodes as "
              "evenly as possible and weighted by its true size");
    s.choice("on_corrupt", &DataSpec::on_corrupt, {OnCorrupt::kFail, OnCorrupt::kSkip},
             "an example that cannot be read or decoded while training: `fail` stops the job with "
             "the data error (naming the file); `skip` logs it and reads the next example of the "
             "data set that reads in its place (the same one on every worker and in every run), "
             "counted in each step's `replaced` metric")
        // Printed only when set: the data section's text keys device profiles and digests.
        .shown([](const DataSpec& d) { return d.on_corrupt != OnCorrupt::kFail; });
    return s;
  }();
  return schema;
}

const SpecSchema<OptimizerSpec>& optimizer_schema() {
  static const auto schema = [] {
    using O = OptimizerSpec;
    SpecSchema<O> s("optimizer");
    s.variants(&O::name, "name", {{"sgd", "an"}, {"adamw", "an"}, {"adam", "an"}});
    s.choice("name", &O::name, {"sgd", "adamw", "adam", "lamb", "lars"},
             "`sgd`, `adamw` or `adam` (LibTorch's implementations), `lamb` (Adam with a "
             "layer-wise trust ratio; You et al. 2019, with bias correction) or `lars` (SGD with "
             "momentum and a layer-wise trust ratio; You et al. 2017)");
    s.real("lr", &O::lr, 0.0, 1e6, "peak learning rate");
    s.real("weight_decay", &O::weight_decay, 0.0, 1e3,
           "L2 penalty added to the gradient (sgd, adam, lars) or decoupled decay (adamw, "
           "lamb: inside the trust ratio's update)")
        .fallback(
            [](O& o) {
              if (o.name == "adamw" || o.name == "lamb") o.weight_decay = 0.01;
              if (o.name == "adam") o.weight_decay = 0;
            },
            "`0.0005` (sgd, lars), `0.01` (adamw, lamb), `0` (adam)");
    s.real("momentum", &O::momentum, 0.0, 1.0, "momentum factor").only_for({"sgd", "lars"});
    s.real("dampening", &O::dampening, 0.0, 1.0, "dampening of the momentum").only_for({"sgd"});
    s.boolean("nesterov", &O::nesterov, "Nesterov momentum; needs momentum > 0 and dampening 0")
        .only_for({"sgd"})
        .fallback([](O& o) { o.nesterov = o.momentum > 0 && o.dampening == 0 && o.nesterov; },
                  "`true` when momentum > 0 and dampening 0")
        .after([](OptionReader& r, O& o) {
          if (o.nesterov && (o.momentum <= 0 || o.dampening != 0)) {
            r.fail("nesterov", "nesterov momentum needs momentum > 0 and dampening 0");
          }
        });
    const std::vector<std::string> adam_like{"adamw", "adam", "lamb"};
    s.real("beta1", &O::beta1, 0.0, 0.999999, "first-moment decay").only_for(adam_like);
    s.real("beta2", &O::beta2, 0.0, 0.999999, "second-moment decay").only_for(adam_like);
    s.real("eps", &O::eps, 1e-30, 1.0, "added to the denominator").only_for(adam_like);
    s.real("trust_coefficient", &O::trust_coefficient, 1e-12, 1e3,
           "eta: a layer's rate is lr × eta × ‖w‖ / (‖∇w‖ + weight_decay × ‖w‖)")
        .only_for({"lars"});
    s.boolean("exclude_bias_and_norm", &O::exclude_bias_and_norm,
              "parameters of one dimension (biases, normalization weights) get neither the "
              "trust ratio nor weight decay")
        .only_for({"lars"});
    return s;
  }();
  return schema;
}

const SpecSchema<ScheduleSpec>& schedule_schema() {
  static const auto schema = [] {
    using S = ScheduleSpec;
    SpecSchema<S> s("schedule");
    s.variants(&S::name, "name", {});
    s.choice("name", &S::name,
             {"constant", "step", "cosine", "linear", "inverse_sqrt", "polynomial"},
             "`constant`; `step`; `cosine`, `linear` or `polynomial` decay from `lr` to "
             "`min_factor` × `lr` over the steps after warmup; `inverse_sqrt` = `lr` × "
             "√(max(warmup_steps, 1) / max(step, warmup_steps, 1)) (the Transformer's)");
    s.integer("warmup_steps", &S::warmup_steps, 0, kBig,
              "linear warmup length; combines with any schedule");
    s.real("warmup_start", &S::warmup_start, 0.0, 1.0, "warmup starts at this fraction of `lr`");
    s.integer("step_size", &S::step_size, 1, kBig, "decay every this many steps")
        .only_for({"step"});
    s.real("gamma", &S::gamma, 0.0, 1.0, "decay factor").only_for({"step"});
    s.real("min_factor", &S::min_factor, 0.0, 1.0, "final lr as a fraction of `lr`")
        .only_for({"cosine", "linear", "polynomial"});
    s.real("power", &S::power, 1e-3, 1e3,
           "exponent: factor = min + (1 − min) × (1 − progress)^power")
        .only_for({"polynomial"});
    return s;
  }();
  return schema;
}

const SpecSchema<ClipSpec>& clip_schema() {
  static const auto schema = [] {
    SpecSchema<ClipSpec> s("clip");
    s.real("max_norm", &ClipSpec::max_norm, 0.0, 1e12,
           "clip the step's reduced gradient to this global L2 norm (as PyTorch's "
           "`clip_grad_norm_`); 0 = off. Metrics records then carry the norm before clipping "
           "(`grad_norm`)");
    s.real("value", &ClipSpec::value, 0.0, 1e12,
           "clamp every element of the reduced gradient to [−value, value], before `max_norm`; "
           "0 = off");
    return s;
  }();
  return schema;
}

const SpecSchema<EmaSpec>& ema_schema() {
  static const auto schema = [] {
    SpecSchema<EmaSpec> s("ema");
    s.real("decay", &EmaSpec::decay, 0.0, 0.999999999,
           "keep an exponential moving average of the parameters, ema = decay × ema + (1 − "
           "decay) × parameters after each update; 0 = none. It is part of the result: in the "
           "checkpoint (`ema` in parameter order), moved to joiners with the optimizer state, "
           "and in the fingerprint");
    s.integer("every_steps", &EmaSpec::every_steps, 1, kBig,
              "update the average after every k-th optimizer step");
    return s;
  }();
  return schema;
}

const SpecSchema<LossSpec>& loss_schema() {
  static const auto schema = [] {
    SpecSchema<LossSpec> s("loss");
    s.real("label_smoothing", &LossSpec::label_smoothing, 0.0, 0.999,
           "label smoothing of the training cross-entropy (classification and language "
           "models, as PyTorch's `cross_entropy(label_smoothing=)`); evaluation reports the "
           "plain cross-entropy");
    return s;
  }();
  return schema;
}

/// Relaxed mode: the sizes decide N. Exact mode: every vnode holds B / N examples.
void check_vnodes(OptionReader& r, SemanticSpec& s) {
  if (!s.vnode_sizes.empty()) {
    const auto n = static_cast<int64_t>(s.vnode_sizes.size());
    if (r.has("virtual_nodes") && s.virtual_nodes != n) {
      r.fail("vnode_sizes", fmt::format("{} sizes for virtual_nodes {}", n, s.virtual_nodes));
    }
    const int64_t total = std::accumulate(s.vnode_sizes.begin(), s.vnode_sizes.end(), int64_t{0});
    if (total != s.global_batch) {
      r.fail("vnode_sizes",
             fmt::format("the sizes sum to {}, not to global_batch {}", total, s.global_batch));
    }
    s.virtual_nodes = n;
    return;
  }
  if (s.virtual_nodes > s.global_batch) {
    r.fail("virtual_nodes", fmt::format("virtual_nodes ({}) cannot exceed global_batch ({})",
                                        s.virtual_nodes, s.global_batch));
  }
  if (s.global_batch % s.virtual_nodes != 0) {
    r.fail("virtual_nodes", fmt::format("global_batch {} is not divisible by virtual_nodes {} "
                                        "(every vnode must hold B/N examples)",
                                        s.global_batch, s.virtual_nodes));
  }
}

const SpecSchema<SemanticSpec>& semantic_schema() {
  static const auto schema = [] {
    using S = SemanticSpec;
    SpecSchema<S> s("semantic");
    s.section("model", &S::model, model_schema());
    s.section("data", &S::data, data_schema());
    s.integer("global_batch", &S::global_batch, 1, kBig, "B, examples per optimizer step (≥ 1)");
    s.integer("virtual_nodes", &S::virtual_nodes, 1, kBig,
              "N, fixed slices of every global batch; 1 ≤ N ≤ B and B % N == 0");
    // Written only in relaxed mode, so that exact-mode texts stay as they were.
    s.integers("vnode_sizes", &S::vnode_sizes, 1, kBig,
               "relaxed mode (docs/heterogeneous.md): the examples of each vnode of a full "
               "batch, in vnode order, summing to `global_batch`; `virtual_nodes` is then their "
               "count (set it to `null` or to that count). `vflow-plan --relaxed` prints them. "
               "Unset = exact mode, B / N each")
        .shown([](const S& v) { return !v.vnode_sizes.empty(); })
        .default_text("unset")
        .after(check_vnodes);
    s.section("optimizer", &S::optimizer, optimizer_schema());
    s.section("schedule", &S::schedule, schedule_schema());
    // Written only when set, so that earlier specs' text stays put (as for precision).
    s.section("clip", &S::clip, clip_schema()).shown([](const S& v) { return v.clip.enabled(); });
    s.section("loss", &S::loss, loss_schema()).shown([](const S& v) {
      return v.loss.label_smoothing != LossSpec{}.label_smoothing;
    });
    s.section("ema", &S::ema, ema_schema()).shown([](const S& v) { return v.ema.enabled(); });
    s.integer("steps", &S::steps, 0, kBig, "total optimizer steps; give either `steps` or `epochs`")
        .shown([](const S& v) { return v.steps > 0; })
        .default_text("unset")
        .after([](OptionReader& r, S&) {
          if (r.has("steps") && r.has("epochs")) {
            r.fail("steps", "give either steps or epochs, not both");
          }
        });
    s.integer("epochs", &S::epochs, 0, kBig,
              "passes over the training set when `steps` is not given")
        .shown([](const S& v) { return v.steps == 0; })
        .fallback(
            [](S& v) {
              if (v.steps > 0) v.epochs = 0;
            },
            fmt::format("`{}`", S{}.epochs))
        .after([](OptionReader& r, S& v) {
          if (v.steps == 0 && v.epochs == 0) {
            r.fail("epochs", "training needs steps > 0 or epochs > 0");
          }
        });
    s.integer("seed", &S::seed, static_cast<uint64_t>(INT64_MAX),
              "seeds initialisation, data order (per epoch) and dropout (per step and vnode)");
    s.boolean("deterministic", &S::deterministic,
              "LibTorch deterministic algorithms (and cuDNN's, benchmark mode off) and an exact "
              "(fixed-point) gradient reduction: bitwise-identical results run to run and across "
              "worker counts (with equal `resources.threads`)");
    // Written only when not the default, so that earlier specs' text (kept in their
    // checkpoints and profiles) stays put.
    s.choice("precision", &S::precision, {Precision::kFp32, Precision::kBf16},
             "`fp32`, or `bf16`: every forward pass (training and evaluation) under autocast to "
             "bfloat16 on the worker's device type (matrix products and convolutions in bf16; "
             "parameters, gradients, the reduction and the optimizer stay fp32). Part of the "
             "result: a checkpoint does not resume under the other precision")
        .shown([](const S& v) { return v.precision != S{}.precision; });
    return s;
  }();
  return schema;
}

const SpecSchema<ResourcesSpec::Worker>& worker_schema() {
  static const auto schema = [] {
    using W = ResourcesSpec::Worker;
    SpecSchema<W> s("layout entry");
    s.integer("vnodes", &W::vnodes, 1, kBig,
              "vnodes this worker holds; the entries' vnodes sum to `virtual_nodes`")
        .default_text("required")
        .after([](OptionReader& r, W&) {
          if (!r.has("vnodes")) r.fail("vnodes", "every layout entry needs vnodes");
        });
    s.text("device", &W::device, "as `resources.device`; absent = `resources.device`")
        .shown([](const W& w) { return !w.device.empty(); })
        .after([](OptionReader& r, W& w) { check_device(r, w.device, true); });
    s.integer("threads", &W::threads, 0, 4096,
              "its intra-op threads; 0 = `resources.threads` (with `cpu_quota` and threads 0: "
              "the cores it may use under its quota, or 1 in deterministic mode)")
        .shown([](const W& w) { return w.threads != 0; });
    s.real("cpu_quota", &W::cpu_quota, 0, 4096,
           "cores it may use (a cgroup of its own, cpu controller); 0 = no limit")
        .shown([](const W& w) { return w.cpu_quota != 0; });
    s.text("device_type", &W::device_type,
           "its device type's name, matched against `resources.profiles`; absent = the name "
           "`vflow-profile` gives its device, threads and quota (`cpu-1t-q0.5`)")
        .shown([](const W& w) { return !w.device_type.empty(); });
    return s;
  }();
  return schema;
}

const SpecSchema<ResourcesSpec>& resources_schema() {
  static const auto schema = [] {
    using R = ResourcesSpec;
    SpecSchema<R> s("resources");
    s.integer("workers", &R::workers, 1, kBig,
              "worker processes of the first generation, 1 to `virtual_nodes`; `vflow-train "
              "--workers K` sets it. With `--workers` (any K) or K > 1, `vflow-train` becomes "
              "the coordinator and starts K elastic workers on this machine "
              "(docs/elasticity.md)");
    s.text("device", &R::device,
           "`cpu`, `cuda` (each worker the GPU of its local rank, modulo the GPUs visible) or "
           "`cuda:K`; the model, gradient buffer and stateful-kernel table live there "
           "(docs/gpu.md)")
        .after([](OptionReader& r, R& res) { check_device(r, res.device, false); });
    s.choice("backend", &R::backend,
             {comm::Backend::kAuto, comm::Backend::kGloo, comm::Backend::kNccl},
             "collectives: `auto` = `nccl` when the workers are on CUDA devices and the NCCL "
             "backend can be used, else `gloo` (and always `gloo` when a `layout` mixes CPU and "
             "CUDA workers: every worker must use the same collectives); `gloo`; `nccl` (needs "
             "every worker on a CUDA device: `device: cuda...` and no `layout` entry on `cpu`)");
    s.integer("threads", &R::threads, 0, 4096,
              "intra-op threads; 0 = the cores a worker may use (its CPU affinity and "
              "cgroup CPU quota) shared among this host's workers (a layout entry's cpu_quota "
              "is the worker's own: its cores under it, undivided), or 1 in deterministic mode");
    s.choice("prefetch", &R::prefetch, {Prefetch::kAuto, Prefetch::kOn, Prefetch::kOff},
             "a background thread beside the compute, which loads the next vnode's batch and, "
             "in deterministic mode on a CPU, runs half of each pass of the exact sum: `auto` "
             "= on where the intra-op threads of this host's workers leave a core free for it "
             "(threads × workers < the cores a worker may use), `true` = on, `false` = off");
    s.integer("prefetch_depth", &R::prefetch_depth, 1, 64,
              "with prefetch on, how many of the worker's next vnodes' batches the background "
              "thread reads ahead (each is held in memory until its vnode runs)");
    s.integer("data_threads", &R::data_threads, 0, 4096,
              "threads that read, decode and transform examples (image data sets), the loading "
              "thread included; 0 = the cores this host's workers leave to spare, shared among "
              "them, at least 1. No effect on results");
    s.real("bucket_mb", &R::bucket_mb, 0, 1 << 20,
           "MiB of gradients per bucket of the reduction that overlaps the backward pass of a "
           "worker's last vnode (on Gloo: each bucket's allreduce starts as soon "
           "as its gradients are final); 0 = one allreduce after the backward pass. Buckets hold "
           "whole parameters. For workers on separate hosts 1 is a good size (1.1-1.2x on "
           "1 Gbit/s links); on one machine the reduction competes with training for the same "
           "cores, and buckets measured up to 11% slower there (docs/benchmarks.md). Each element "
           "is still summed once over the workers: bitwise the "
           "same result on 2 workers, on more the order of Gloo's additions may differ (default "
           "mode's tolerance); deterministic mode sums exact integers in its buckets, so its "
           "result is bitwise the same for every bucket size");
    s.boolean("shared_memory", &R::shared_memory,
              "workers that all run on one host (sharing its network, mount, IPC and PID "
              "namespaces) sum their gradients through a shared-memory segment in /dev/shm "
              "instead of Gloo's loopback sockets; elsewhere, or when the segment cannot be "
              "reserved, Gloo's sockets. The sum is the same (elements added in rank order); "
              "bucketed sums (`bucket_mb`) stay on Gloo");
    s.real("timeout_s", &R::timeout_s, 0.1, 86400.0,
           "rendezvous and collective timeout in seconds: a peer silent for longer is declared "
           "dead");
    s.integer("memory_limit_mb", &R::memory_limit_mb, 0, int64_t{1} << 30,
              "each worker's data memory (heap and anonymous mappings: the soft `RLIMIT_DATA`, "
              "which LibTorch's allocations count against) in MiB; a step that needs more ends "
              "the job with exit code 6 naming the vnode size (or, where the optimizer's state "
              "made at the first update does not fit, what it keeps and how to shard it); 0 = "
              "no limit. It counts "
              "everything the worker holds (data set, model, optimizer, one vnode's "
              "activations), so with a fixed limit a global batch that does not fit as one "
              "vnode can still be trained as several smaller ones (docs/experiments/exploration)");
    s.integer("verify_every_steps", &R::verify_every_steps, 0, kBig,
              "deterministic mode: every this many steps one vnode is computed a second time "
              "by another worker with the same kernel signature, and the two contributions "
              "(the exact sum's integers, as a 64-bit hash in the step's packet) are compared "
              "bit for bit; the vnode and the checker take turns. 0 = never. Costs about "
              "1 / (N x the vnodes a worker holds) of the compute; no effect on results. Ignored "
              "outside deterministic mode unless set (then an error) (docs/verification.md)")
        // Printed only when changed: a spec printed and read back outside deterministic
        // mode must not look as if it had asked for cross-checks.
        .shown([](const R& res) {
          return res.verify_every_steps != ResourcesSpec{}.verify_every_steps;
        });
    s.choice("on_mismatch", &R::on_mismatch,
             {OnMismatch::kWarn, OnMismatch::kStop, OnMismatch::kEvict},
             "when a cross-check's two workers disagree (both are logged, with their hosts): "
             "`warn` goes on; `stop` undoes the step and stops the job with a checkpoint of "
             "the step before (exit code 8); `evict` has a third worker of the same signature "
             "compute the vnode, and the one the other two outvote leaves the job (exit code 8) "
             "as if it had failed, and the step is redone without it (with no third worker: "
             "`stop`)");
    s.boolean("shard_optimizer", &R::shard_optimizer,
              "cut the optimizer state (sgd's and lars's momentum, adamw's and lamb's two "
              "moments) into one canonical "
              "shard per vnode, contiguous ranges of the parameters balanced by size: each worker "
              "keeps and updates only the shards of the vnodes it holds (and, with "
              "`shard_replicas: 2`, its ring neighbour's), then the workers all-gather the "
              "updated parameters. Shards move with their vnodes on a resize; a checkpoint keeps "
              "one file per canonical shard beside it (`step-N.shards/`), which any worker count, "
              "sharded or not, resumes from. The same result bit for bit (lamb's and "
              "lars's trust ratios are summed by canonical shard, sharded or not); sgd, adamw, "
              "lamb and lars (docs/design.md, \"Optimizer state sharded by vnode\")");
    s.integer("shard_replicas", &R::shard_replicas, 1, 2,
              "with `shard_optimizer`: how many workers keep each shard's state, 2 = its owner "
              "and the next worker in rank order (a second home, so that a worker that dies "
              "loses no state), 1 = its owner alone (a failure then stops the job: resume from "
              "the last checkpoint)");
    s.integer("min_workers", &R::min_workers, 1, kBig,
              "an elastic job never runs on fewer workers: resize requests below it are "
              "refused; when failures leave fewer, the job waits `timeout_s` for joiners, then "
              "stops with a checkpoint");
    s.integer("max_workers", &R::max_workers, 0, kBig,
              "resize requests above it are refused; 0 = `virtual_nodes`");
    s.boolean("replace_failed", &R::replace_failed,
              "the launcher starts a new worker for each one that dies, which joins at a step "
              "boundary");
    s.boolean("unauthenticated_store", &R::unauthenticated_store,
              "allow a job that spans machines without a cluster control store: its store "
              "(`--coordinator HOST:PORT`, or rank 0's at `MASTER_ADDR` under torchrun, mpirun "
              "or srun) is then open to anyone who can reach that address, with no "
              "authentication: they can stop or resize the job or overwrite its keys. Without "
              "it such a job is refused; use `--control etcds://...` on clusters "
              "(docs/security.md)");
    s.list("layout", &R::layout, worker_schema(),
           "per-worker settings of the first generation, in rank order, one entry per worker "
           "(keys below). The launcher checks every entry's device (and `resources.device`, "
           "which joiners use) before it starts a worker; a layout of one entry also runs as a "
           "launched worker, so that its settings apply. `vflow-plan` prints it "
           "(docs/heterogeneous.md). Later generations re-plan the vnode counts by the speeds "
           "the workers measured; workers that join later use `resources.device`")
        .shown([](const R& res) { return !res.layout.empty(); });
    s.texts("profiles", &R::profiles,
            "device profiles (`vflow-profile` files, paths relative to the working directory): "
            "when the job changes size, a worker not yet measured counts at its device type's "
            "profiled time per vnode instead of as fast as the fastest member; each must have "
            "been measured with this job's model, and at vnodes as large as this job's "
            "(docs/heterogeneous.md)")
        .shown([](const R& res) { return !res.profiles.empty(); });
    s.text("device_type", &R::device_type,
           "the device type name of workers that take `resources.*` (those that join later, and "
           "every worker of a job without a `layout`), matched against `profiles`; absent = "
           "the name `vflow-profile` gives them (`cpu-<threads>t`, `cuda-<GPU name>`)")
        .shown([](const R& res) { return !res.device_type.empty(); });
    return s;
  }();
  return schema;
}

const SpecSchema<EvaluationSpec>& evaluation_schema() {
  static const auto schema = [] {
    using E = EvaluationSpec;
    SpecSchema<E> s("evaluation");
    s.boolean("enabled", &E::enabled, "evaluate on the test split");
    s.integer("every_epochs", &E::every_epochs, 0, kBig,
              "evaluate after every k-th epoch (0 = not per epoch)");
    s.integer("every_steps", &E::every_steps, 0, kBig, "evaluate every k steps (0 = not per step)");
    s.integer("batch", &E::batch, 1, kBig, "evaluation batch size (no effect on results)");
    s.boolean("use_ema", &E::use_ema,
              "evaluate the weight average of `semantic.ema` instead of the weights (needs "
              "`semantic.ema.decay` > 0); buffers such as batch-norm statistics stay the "
              "model's own");
    return s;
  }();
  return schema;
}

const SpecSchema<CheckpointSpec>& checkpoint_schema() {
  static const auto schema = [] {
    using C = CheckpointSpec;
    SpecSchema<C> s("checkpoint");
    s.text("dir", &C::dir, "directory for `step-NNNNNNNN.pt` checkpoints; empty = none");
    s.integer("every_steps", &C::every_steps, 0, kBig,
              "write every k steps; a checkpoint is always written at the end and when stopped "
              "by a signal. A periodic checkpoint that cannot be written (a full disk) is logged "
              "as an error and training goes on (see [Checkpoints](#checkpoints))");
    s.integer("keep", &C::keep, 1, 1000000, "keep the newest k checkpoints");
    s.text("resume", &C::resume, "resume from a checkpoint file or `latest` (the newest in `dir`)")
        .after([](OptionReader& r, C& c) {
          if (c.resume == "latest" && c.dir.empty()) {
            r.fail("resume", "resume: latest needs output.checkpoint.dir");
          }
        });
    return s;
  }();
  return schema;
}

const SpecSchema<LoggingSpec>& logging_schema() {
  static const auto schema = [] {
    using L = LoggingSpec;
    SpecSchema<L> s("logging");
    s.text(
        "metrics", &L::metrics,
        "append JSON lines to this file: `step` records (loss, lr, examples/s, and the mean "
        "per-step `compute_ms`, `sync_ms`, `update_ms` since the previous record, the "
        "generation's `workers`, `time` in Unix seconds and, with `semantic.clip`, the step's "
        "`grad_norm` before clipping, and `replaced`, the corrupt examples the writing worker has "
        "replaced so far under `data.on_corrupt: skip`, and `optimizer_state_mb`, the optimizer "
        "state the writing worker holds (sgd, adamw; its shards' with "
        "`resources.shard_optimizer`), and `received_mb`, the mean bytes per step it read of "
        "its peers' data in the sums and gathers through shared memory), `eval` records (accuracy, "
        "loss; "
        "per token for sequence models) and one `end` record (fingerprint); a non-finite "
        "loss is written as `null`");
    s.text("tensorboard", &L::tensorboard,
           "directory for TensorBoard event files (`tensorboard --logdir DIR`): `train/loss`, "
           "`train/lr`, `train/examples_per_second` every `every_steps`, `eval/loss` and "
           "`eval/accuracy` at each evaluation; written by rank 0");
    s.choice("progress", &L::progress, {"auto", "bar", "lines", "off"},
             "`bar` (status line), `lines` (periodic log lines), `off`; `auto` = bar on a "
             "terminal");
    s.integer("every_steps", &L::every_steps, 1, kBig,
              "period of progress lines and metrics records");
    s.choice("level", &L::level, {"trace", "debug", "info", "warn", "error"},
             "`trace`, `debug`, `info`, `warn`, `error`");
    s.text("examples", &L::examples,
           "audit file: after each step, rank 0 appends one line `step vnode index...` per "
           "vnode, listed as many times as the step's collective says workers ran it (exactly "
           "once when all is well); large, meant for tests and audits. In an elastic job a "
           "worker can complete a step whose allreduce failed on rank 0 (a peer died in "
           "between); when the next generation goes on from that worker's state (sent to the "
           "others, or theirs already), it appends that step's lines itself (it reads the "
           "file's last line, so the file must be reachable from the workers' hosts). Not "
           "covered: rank 0 dying after logging a step that no survivor completed, which the "
           "next generation redoes and logs again");
    return s;
  }();
  return schema;
}

const SpecSchema<OutputSpec>& output_schema() {
  static const auto schema = [] {
    SpecSchema<OutputSpec> s("output");
    s.section("evaluation", &OutputSpec::evaluation, evaluation_schema());
    s.section("checkpoint", &OutputSpec::checkpoint, checkpoint_schema());
    s.section("logging", &OutputSpec::logging, logging_schema());
    return s;
  }();
  return schema;
}

// ---- parsing: the schema, then the checks across sections ---------------------------

SpecNode full_tree(const JobSpec& spec) {
  SpecNode root = SpecNode::map();
  root.set("semantic", semantic_schema().tree(spec.semantic));
  root.set("resources", resources_schema().tree(spec.resources));
  root.set("output", output_schema().tree(spec.output));
  root.relocate(SpecLocation{spec.source, 0, 0});
  return root;
}

void parse_semantic(const SpecNode& node, SemanticSpec& s, bool check_components) {
  semantic_schema().read_section(node, s);
  if (!check_components) return;

  // Model and data options: validated by their factories, without loading anything.
  const SpecNode* model = node.find("model");
  const SpecNode* data = node.find("data");
  const SpecNode* model_name = model ? model->find("name") : nullptr;
  const SpecNode* data_name = data ? data->find("name") : nullptr;
  const SpecNode fallback_name = SpecNode::scalar("", node.where(), node.path());
  const auto prepared = data::DataRegistry::global().prepare(
      s.data.name, data_name ? *data_name : fallback_name, s.data.options);
  models::ModelRegistry::global().prepare(
      s.model.name, model_name ? *model_name : fallback_name, s.model.options,
      models::ModelContext{prepared.info.input_shape, prepared.info.num_classes,
                           prepared.info.vocab_size});
}

/// The layout's entries against the semantic part: one entry per worker, the vnodes of
/// all entries summing to N. An entry on the job's own device names none.
void check_layout(OptionReader& r, ResourcesSpec& res, const SemanticSpec& s) {
  if (res.layout.empty()) return;
  int64_t total = 0;
  for (size_t i = 0; i < res.layout.size(); ++i) {
    auto& worker = res.layout[i];
    if (worker.vnodes > s.virtual_nodes) {
      OptionReader(r.node().find("layout")->items()[i])
          .fail("vnodes",
                fmt::format("value {} is out of range [1, {}]", worker.vnodes, s.virtual_nodes));
    }
    if (worker.device == res.device) worker.device.clear();
    total += worker.vnodes;
  }
  if (static_cast<int64_t>(res.layout.size()) != res.workers || total != s.virtual_nodes) {
    r.fail("layout", fmt::format("{} entries holding {} vnodes, but the job has {} workers and {} "
                                 "virtual nodes",
                                 res.layout.size(), total, res.workers, s.virtual_nodes));
  }
}

/// Every worker of a job uses the same collectives. NCCL needs every worker on a CUDA
/// device, including workers that join later (they use resources.device); a job that
/// mixes CPU and CUDA workers talks through Gloo.
void check_backend(OptionReader& r, ResourcesSpec& res) {
  std::string cpu_worker;  // the first worker on the CPU, if any
  if (!is_cuda_device(res.device)) cpu_worker = "resources.device (and every worker that joins)";
  for (size_t i = 0; i < res.layout.size() && cpu_worker.empty(); ++i) {
    if (res.layout[i].device == "cpu") cpu_worker = fmt::format("resources.layout[{}]", i);
  }
  if (res.backend == comm::Backend::kNccl && !cpu_worker.empty()) {
    r.fail("backend", fmt::format("nccl needs every worker on a CUDA device, but {} is on the cpu; "
                                  "use backend gloo (or auto) for a job that mixes cpu and cuda",
                                  cpu_worker));
  }
  const bool any_cuda =
      is_cuda_device(res.device) ||
      std::any_of(res.layout.begin(), res.layout.end(),
                  [](const ResourcesSpec::Worker& w) { return is_cuda_device(w.device); });
  if (res.backend == comm::Backend::kAuto && any_cuda && !cpu_worker.empty()) {
    res.backend = comm::Backend::kGloo;
  }
}

void parse_resources(const SpecNode& node, ResourcesSpec& res, const SemanticSpec& s) {
  OptionReader r(node);
  resources_schema().read(r, res);
  const auto too_many = [&](const char* key, int64_t workers) {
    if (workers <= s.virtual_nodes) return;
    r.fail(key, fmt::format("{} workers but only {} virtual nodes: every worker needs at least "
                            "one vnode",
                            workers, s.virtual_nodes));
  };
  too_many("workers", res.workers);
  too_many("max_workers", res.max_workers);
  const int64_t most = res.max_workers > 0 ? res.max_workers : s.virtual_nodes;
  if (res.min_workers > most) {
    r.fail("min_workers", fmt::format("min_workers {} is above the most workers allowed ({})",
                                      res.min_workers, most));
  }
  if (res.workers < res.min_workers || res.workers > most) {
    r.fail("workers", fmt::format("{} workers is outside min_workers..max_workers = {}..{}",
                                  res.workers, res.min_workers, most));
  }
  if (!s.deterministic && res.verify_every_steps > 0 && node.find("verify_every_steps")) {
    r.fail("verify_every_steps",
           "cross-checks compare bits, which only deterministic mode makes a function of the "
           "job: set semantic.deterministic: true, or verify_every_steps: 0");
  }
  if (res.shard_optimizer && s.optimizer.name == "adam") {
    r.fail("shard_optimizer",
           "the optimizer state is sharded for sgd, adamw, lamb and lars, whose update is "
           "element by element or by norms summed per shard; semantic.optimizer.name is adam");
  }
  check_layout(r, res, s);
  check_backend(r, res);
  r.finish();
}

/// One markdown table of key rows.
std::string key_table(const std::vector<SpecKeyRow>& rows) {
  std::string text = "| key | default | meaning |\n|---|---|---|\n";
  for (const auto& row : rows) {
    text += fmt::format("| `{}` | {} | {} |\n", row.key, row.default_text, row.doc);
  }
  return text;
}

SpecNode semantic_tree(const SemanticSpec& s) { return semantic_schema().tree(s); }

}  // namespace

std::string layout_entry_yaml(const ResourcesSpec::Worker& worker) {
  return worker_schema().tree(worker).to_yaml();
}

std::string layout_lines(const std::vector<ResourcesSpec::Worker>& layout,
                         const std::vector<std::string>& comments) {
  std::string text;
  for (size_t i = 0; i < layout.size(); ++i) {
    text += "    - " + worker_schema().tree(layout[i]).to_flow();
    if (i < comments.size() && !comments[i].empty()) text += "  # " + comments[i];
    text += "\n";
  }
  return text;
}

ResourcesSpec::Worker parse_layout_entry(const std::string& text, const std::string& source) {
  ResourcesSpec::Worker worker;
  worker_schema().read_section(parse_yaml(text, source), worker);
  return worker;
}

std::string job_spec_key_tables() {
  std::string text;
  const std::pair<const char*, std::vector<SpecKeyRow>> parts[] = {
      {"semantic", semantic_schema().rows()},
      {"resources", resources_schema().rows()},
      {"output", output_schema().rows()},
  };
  for (const auto& [part, rows] : parts) {
    text += fmt::format("<!-- keys: {} -->\n{}<!-- end keys -->\n", part, key_table(rows));
  }
  // Each model's and data set's options: its description, then its table.
  const auto options = [&text](const char* section, const auto& entries) {
    for (const auto& e : entries) {
      text +=
          fmt::format("<!-- keys: {}.{} -->\n`{}`: {}.\n\n{}<!-- end keys -->\n", section, e.name,
                      e.name, e.description, e.keys.empty() ? "No options.\n" : key_table(e.keys));
    }
  };
  options("model", models::ModelRegistry::global().entries());
  options("data", data::DataRegistry::global().entries());
  return text;
}

std::string JobSpec::semantic_yaml() const { return semantic_tree(semantic).to_yaml(); }

std::string JobSpec::yaml() const { return full_tree(*this).to_yaml(); }

std::string JobSpec::model_digest() const {
  std::string text;
  const SpecNode tree = semantic_tree(semantic);
  for (const auto& [key, node] : tree.entries()) {
    // Precision changes the speed too (absent, as in earlier profiles, for fp32).
    if (key == "model" || key == "data" || key == "precision") {
      text += key + ":\n" + node.to_yaml(2);
    }
  }
  return fmt::format("{:016x}", fnv1a(text));  // stable across builds
}

JobSpec parse_job_spec(const SpecNode& root, bool check_components) {
  OptionReader r(root);
  JobSpec spec;
  spec.source = root.where().file.empty() ? "<code>" : root.where().file;
  const SpecNode& semantic = r.section("semantic");
  const SpecNode& resources = r.section("resources");
  const SpecNode& output = r.section("output");
  r.finish();
  parse_semantic(semantic, spec.semantic, check_components);
  parse_resources(resources, spec.resources, spec.semantic);
  output_schema().read_section(output, spec.output);
  if (spec.output.evaluation.use_ema && !spec.semantic.ema.enabled()) {
    OptionReader e(output.find("evaluation") ? *output.find("evaluation") : output);
    e.fail("use_ema", "use_ema needs a weight average: set semantic.ema.decay");
  }
  return spec;
}

JobSpec load_job_spec(const std::string& path, const std::vector<std::string>& overrides) {
  SpecNode root = path.empty() ? parse_yaml(default_job_yaml(), "<built-in default job>")
                               : load_yaml_file(path, "job spec");
  for (const auto& o : overrides) apply_override(root, o);
  JobSpec spec = parse_job_spec(root);
  spec.source = path.empty() ? "<built-in default job>" : path;
  return spec;
}

void validate(const JobSpec& spec, bool check_components) {
  parse_job_spec(full_tree(spec), check_components);
}

}  // namespace vflow::engine
