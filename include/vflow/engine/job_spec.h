// The job spec: what to train (semantic part), with what (resources part) and
// what to write (output part). See docs/job-spec.md for every key and default.
//
// The semantic part alone decides the training trajectory (docs/design.md §1); the
// resources part decides only speed; the output part decides what is written
// and when, never the parameters. Every field maps one-to-one onto a YAML key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "vflow/comm/rendezvous.h"
#include "vflow/core/spec_node.h"
#include "vflow/hetero/layout.h"

namespace vflow::engine {

/// semantic.precision: the forward passes' arithmetic.
enum class Precision {
  kFp32,  ///< "fp32"
  kBf16,  ///< "bf16": under autocast to bfloat16
};
inline std::string to_string(Precision p) { return p == Precision::kBf16 ? "bf16" : "fp32"; }

/// resources.prefetch: the background loader (and the exact sum's second thread).
enum class Prefetch {
  kAuto,  ///< "auto": on where this host has a core to spare
  kOn,    ///< "true"
  kOff,   ///< "false"
};
inline std::string to_string(Prefetch p) {
  return p == Prefetch::kOn ? "true" : p == Prefetch::kOff ? "false" : "auto";
}

/// semantic.data.on_corrupt: what a corrupt example met while training does.
enum class OnCorrupt {
  kFail,  ///< "fail": the job stops with the data error
  kSkip,  ///< "skip": the next example that reads takes its place, and is counted
};
inline std::string to_string(OnCorrupt o) { return o == OnCorrupt::kSkip ? "skip" : "fail"; }

/// resources.on_mismatch: what a cross-check whose two workers disagree does
/// (docs/verification.md).
enum class OnMismatch {
  kWarn,   ///< "warn": logs both workers and goes on with the step
  kStop,   ///< "stop": undoes the step and stops the job with a checkpoint of the step before
  kEvict,  ///< "evict": a third worker decides which is odd; that one leaves, the step is redone
};
inline std::string to_string(OnMismatch o) {
  return o == OnMismatch::kWarn ? "warn" : o == OnMismatch::kEvict ? "evict" : "stop";
}

struct ModelSpec {
  std::string name = "convnet";  ///< a name in the model registry
  SpecNode options;              ///< model-specific options, validated by the model's factory
};

struct DataSpec {
  std::string name = "fashion-mnist";  ///< a name in the data registry
  SpecNode options;                    ///< data-set-specific options
  bool drop_last =
      false;  ///< drop the epoch's last, shorter batch instead of splitting it over the vnodes
  OnCorrupt on_corrupt = OnCorrupt::kFail;
};

struct OptimizerSpec {
  std::string name = "sgd";    ///< sgd | adamw | adam | lamb | lars
  double lr = 0.05;            ///< peak learning rate
  double weight_decay = 5e-4;  ///< L2 (sgd, adam, lars) or decoupled (adamw, lamb) weight decay
  double momentum = 0.9;       ///< sgd and lars
  double dampening = 0.0;      ///< sgd only
  bool nesterov = true;        ///< sgd only; needs momentum > 0 and dampening 0
  double beta1 = 0.9;          ///< adamw, adam and lamb
  double beta2 = 0.999;        ///< adamw, adam and lamb
  double eps = 1e-8;           ///< adamw, adam and lamb
  double trust_coefficient = 0.001;   ///< lars only: eta of the layer-wise trust ratio
  bool exclude_bias_and_norm = true;  ///< lars only: 1-d parameters keep lr, no decay
};

struct ScheduleSpec {
  /// constant | step | cosine | linear | inverse_sqrt | polynomial
  std::string name = "cosine";
  int64_t warmup_steps = 0;   ///< linear warmup from warmup_start * lr to lr over this many steps
  double warmup_start = 0.1;  ///< warmup starting factor
  int64_t step_size = 1000;   ///< step: multiply by gamma every step_size steps
  double gamma = 0.1;         ///< step: decay factor
  double min_factor = 0.0;    ///< cosine, linear, polynomial: final lr = min_factor * lr
  double power = 1.0;         ///< polynomial: exponent of the decay
};

/// Clipping of the step's reduced gradient (the same on every worker); 0 = off.
struct ClipSpec {
  double max_norm = 0;  ///< scale the whole gradient down to this global L2 norm
  double value = 0;     ///< clamp every gradient element to [-value, value]
  bool enabled() const { return max_norm > 0 || value > 0; }
};

/// An exponential moving average of the parameters, updated after optimizer steps.
struct EmaSpec {
  double decay = 0;         ///< ema = decay * ema + (1 - decay) * parameters; 0 = no EMA
  int64_t every_steps = 1;  ///< update after every k-th step
  bool enabled() const { return decay > 0; }
};

struct LossSpec {
  double label_smoothing = 0;  ///< of the training loss's targets (cross-entropy's)
};

struct SemanticSpec {
  ModelSpec model;
  DataSpec data;
  int64_t global_batch = 256;  ///< B: examples per optimizer step
  int64_t virtual_nodes = 8;   ///< N: fixed slices of every global batch; B % N == 0
  /// Relaxed mode (heterogeneous devices): the examples of each vnode, summing to B
  /// (N = their count; vflow-plan --relaxed prints them). Empty = exact mode, B / N each.
  std::vector<int64_t> vnode_sizes;
  OptimizerSpec optimizer;
  ScheduleSpec schedule;
  ClipSpec clip;
  LossSpec loss;
  EmaSpec ema;
  int64_t steps = 0;           ///< total optimizer steps; 0 = use epochs
  int64_t epochs = 3;          ///< used when steps is 0
  uint64_t seed = 1;           ///< seeds initialisation, data order and dropout
  bool deterministic = false;  ///< bitwise reproducible kernels (slower)
  /// fp32, or bf16: forward passes under autocast to bfloat16 on the worker's device
  /// (matrix products and convolutions in bf16; parameters, gradients, optimizer in fp32).
  Precision precision = Precision::kFp32;
};

struct ResourcesSpec {
  int64_t workers = 1;         ///< worker processes (1..virtual_nodes)
  std::string device = "cpu";  ///< cpu | cuda (the local rank's GPU) | cuda:K
  /// Collectives: auto (nccl on CUDA devices when the NCCL backend is usable, else
  /// gloo) | gloo | nccl.
  comm::Backend backend = comm::Backend::kAuto;
  int64_t threads = 0;  ///< intra-op threads; 0: see engine::intra_op_threads
  /// Load the next vnode's batch on a background thread: on, off, or auto (on when this
  /// host has a core to spare: intra-op threads x local workers < cores).
  Prefetch prefetch = Prefetch::kAuto;
  /// How many vnodes' batches the background loader reads ahead (with prefetch on).
  int64_t prefetch_depth = 1;
  /// Threads that decode and transform examples, the loading thread's own included;
  /// 0: see engine::data_threads.
  int64_t data_threads = 0;
  /// Gradient bytes (MiB) per bucket of the reduction overlapped with the backward pass
  /// (default mode, Gloo); 0 = one collective after the backward pass, the default: on
  /// one machine the reduction uses the cores that train (docs/benchmarks.md).
  double bucket_mb = 0;
  /// Workers on one host sum their gradients through shared memory rather than Gloo's
  /// loopback sockets (Gloo only; docs/design.md, "Ranks on one host").
  bool shared_memory = true;
  double timeout_s = 30;    ///< rendezvous and collective timeout (a silent peer is dead after it)
  int64_t min_workers = 1;  ///< an elastic job never runs on fewer; below it, it stops
  int64_t max_workers = 0;  ///< resize requests above it are refused; 0 = virtual_nodes
  bool replace_failed = false;  ///< the launcher starts a new worker for each one that dies
  /// A job spanning machines without a cluster control store is allowed: its store is then
  /// reachable, unauthenticated, from the network (docs/security.md).
  bool unauthenticated_store = false;
  /// Each worker's data memory (heap and anonymous mappings, RLIMIT_DATA) in MiB; a step
  /// that needs more ends the job with OutOfMemory. 0 = no limit.
  int64_t memory_limit_mb = 0;
  /// Deterministic mode: every this many steps one vnode is computed a second time by
  /// another worker and the two contributions compared bit for bit; 0 = never
  /// (docs/verification.md). No effect on results.
  int64_t verify_every_steps = 100;
  /// What a cross-check that finds two workers disagreeing does.
  OnMismatch on_mismatch = OnMismatch::kStop;
  /// The optimizer state is cut into one canonical shard per vnode, kept only by the
  /// workers that hold the vnode (and its second home); no effect on results
  /// (docs/design.md, "Optimizer state sharded by vnode").
  bool shard_optimizer = false;
  /// How many workers keep each shard's state when shard_optimizer is on: 1 (its owner
  /// alone), or 2 (the owner and the next worker, so that a failed worker loses nothing).
  int64_t shard_replicas = 2;
  /// One worker of a planned first generation (vflow-plan prints them).
  using Worker = hetero::LayoutEntry;
  /// Per-worker settings of the first generation, in rank order; empty = even split.
  std::vector<Worker> layout;
  /// Device profiles (vflow-profile files) by which a resize splits the vnodes over workers
  /// not yet measured, matched by device type.
  std::vector<std::string> profiles;
  /// The device type name of workers that take resources.* (joiners, and every worker of a
  /// job without a layout); empty = the default name (hetero::default_device_type).
  std::string device_type;
};

struct EvaluationSpec {
  bool enabled = true;       ///< evaluate on the test split
  int64_t every_epochs = 1;  ///< evaluate after every k-th epoch (0 = never mid-run)
  int64_t every_steps = 0;   ///< evaluate every k steps (0 = never)
  int64_t batch = 1000;      ///< evaluation batch size (no effect on results)
  bool use_ema = false;      ///< evaluate the weight EMA (semantic.ema) instead of the weights
};

struct CheckpointSpec {
  std::string dir;          ///< directory for checkpoints; empty = no checkpoints
  int64_t every_steps = 0;  ///< write every k steps (0 = only at the end)
  int64_t keep = 2;         ///< keep the newest k checkpoints
  std::string resume;       ///< a checkpoint file, or "latest" (newest in dir); empty = fresh start
};

struct LoggingSpec {
  std::string metrics;            ///< JSON-lines metrics file; empty = none
  std::string tensorboard;        ///< directory for TensorBoard event files; empty = none
  std::string progress = "auto";  ///< auto | bar | lines | off
  int64_t every_steps = 50;       ///< period of progress lines and metrics records
  std::string level = "info";     ///< trace | debug | info | warn | error
  /// Every worker appends the example indices of the vnodes it ran to this file
  /// ("step vnode index..." per line), for auditing exactly-once use; empty = none.
  std::string examples;
};

struct OutputSpec {
  EvaluationSpec evaluation;
  CheckpointSpec checkpoint;
  LoggingSpec logging;
};

struct JobSpec {
  SemanticSpec semantic;
  ResourcesSpec resources;
  OutputSpec output;
  std::string source = "<code>";  ///< where the spec came from (file name)

  /// Canonical YAML of the semantic part, defaults included: two jobs with the same
  /// text follow the same trajectory. Stored in checkpoints to refuse a mismatched resume.
  std::string semantic_yaml() const;
  /// The whole spec, defaults included, as YAML that parses back to this spec.
  std::string yaml() const;
  /// A digest of the model and data parts alone: what a device profile was measured with.
  std::string model_digest() const;
};

/// One layout entry as YAML, with the keys of resources.layout[] (what a launcher hands a
/// worker of a planned layout), and back; errors name `source` and the key.
std::string layout_entry_yaml(const ResourcesSpec::Worker& worker);
/// A layout as the lines under a `layout:` key: one flow map per entry through the
/// layout-entry schema, each followed by "  # <comment>" where `comments` gives one.
std::string layout_lines(const std::vector<ResourcesSpec::Worker>& layout,
                         const std::vector<std::string>& comments = {});
ResourcesSpec::Worker parse_layout_entry(const std::string& text, const std::string& source);

/// The reference tables of every key (key, default, meaning), one markdown table per part
/// between "<!-- keys: PART -->" and "<!-- end keys -->" lines: what docs/job-spec.md shows,
/// generated from the same declaration the parser reads (`vflow-train --spec-keys`). The
/// registered models' and data sets' options are parts "model.NAME" and "data.NAME".
std::string job_spec_key_tables();

/// The built-in default job: a ConvNet on Fashion-MNIST.
const std::string& default_job_yaml();

/// Parses and validates a tree (types, ranges, unknown keys, divisibility and, when
/// `check_components`, the model's and data set's options against their registries).
/// Throws SpecError naming location and key.
JobSpec parse_job_spec(const SpecNode& root, bool check_components = true);

/// Loads `path` (or the default job when empty), applies "key=value" overrides,
/// and validates the result.
JobSpec load_job_spec(const std::string& path, const std::vector<std::string>& overrides = {});

/// Re-validates a spec built or edited in code (e.g. by a program embedding vflow).
/// With `check_components` false, model and data names and options are not looked up,
/// for programs that hand their own module and data set to the Trainer.
void validate(const JobSpec& spec, bool check_components = true);

}  // namespace vflow::engine
