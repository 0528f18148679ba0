#include "vflow/engine/job_spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "vflow/core/error.h"
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

SpecNode scalar(const std::string& v) { return SpecNode::scalar(v); }
SpecNode scalar(bool v) { return SpecNode::scalar(v ? "true" : "false"); }
SpecNode scalar(int64_t v) { return SpecNode::scalar(std::to_string(v)); }
SpecNode scalar(uint64_t v) { return SpecNode::scalar(std::to_string(v)); }
SpecNode scalar(double v) { return SpecNode::scalar(fmt::format("{}", v)); }

SpecNode semantic_tree(const SemanticSpec& s) {
  SpecNode root = SpecNode::map();
  SpecNode model = SpecNode::map();
  model.set("name", scalar(s.model.name));
  model.set("options", s.model.options.is_null() ? SpecNode::map() : s.model.options);
  root.set("model", model);
  SpecNode data = SpecNode::map();
  data.set("name", scalar(s.data.name));
  data.set("options", s.data.options.is_null() ? SpecNode::map() : s.data.options);
  data.set("drop_last", scalar(s.data.drop_last));
  root.set("data", data);
  root.set("global_batch", scalar(s.global_batch));
  root.set("virtual_nodes", scalar(s.virtual_nodes));
  if (!s.vnode_sizes.empty()) {  // relaxed mode only, so exact-mode texts stay as they were
    SpecNode sizes = SpecNode::sequence();
    for (const int64_t size : s.vnode_sizes) sizes.append(scalar(size));
    root.set("vnode_sizes", sizes);
  }
  SpecNode opt = SpecNode::map();
  opt.set("name", scalar(s.optimizer.name));
  opt.set("lr", scalar(s.optimizer.lr));
  opt.set("weight_decay", scalar(s.optimizer.weight_decay));
  if (s.optimizer.name == "sgd") {
    opt.set("momentum", scalar(s.optimizer.momentum));
    opt.set("dampening", scalar(s.optimizer.dampening));
    opt.set("nesterov", scalar(s.optimizer.nesterov));
  } else {
    opt.set("beta1", scalar(s.optimizer.beta1));
    opt.set("beta2", scalar(s.optimizer.beta2));
    opt.set("eps", scalar(s.optimizer.eps));
  }
  root.set("optimizer", opt);
  SpecNode sched = SpecNode::map();
  sched.set("name", scalar(s.schedule.name));
  sched.set("warmup_steps", scalar(s.schedule.warmup_steps));
  sched.set("warmup_start", scalar(s.schedule.warmup_start));
  if (s.schedule.name == "step") {
    sched.set("step_size", scalar(s.schedule.step_size));
    sched.set("gamma", scalar(s.schedule.gamma));
  } else if (s.schedule.name == "cosine") {
    sched.set("min_factor", scalar(s.schedule.min_factor));
  }
  root.set("schedule", sched);
  if (s.steps > 0) {
    root.set("steps", scalar(s.steps));
  } else {
    root.set("epochs", scalar(s.epochs));
  }
  root.set("seed", scalar(s.seed));
  root.set("deterministic", scalar(s.deterministic));
  // Written only when not the default, so that earlier specs' text (kept in their
  // checkpoints and profiles) stays put.
  if (s.precision != "fp32") root.set("precision", scalar(s.precision));
  return root;
}

SpecNode full_tree(const JobSpec& spec) {
  SpecNode root = SpecNode::map();
  root.set("semantic", semantic_tree(spec.semantic));
  SpecNode res = SpecNode::map();
  res.set("workers", scalar(spec.resources.workers));
  res.set("device", scalar(spec.resources.device));
  res.set("backend", scalar(spec.resources.backend));
  res.set("threads", scalar(spec.resources.threads));
  res.set("prefetch", scalar(spec.resources.prefetch));
  res.set("timeout_s", scalar(spec.resources.timeout_s));
  res.set("memory_limit_mb", scalar(spec.resources.memory_limit_mb));
  res.set("min_workers", scalar(spec.resources.min_workers));
  res.set("max_workers", scalar(spec.resources.max_workers));
  res.set("replace_failed", scalar(spec.resources.replace_failed));
  if (!spec.resources.layout.empty()) {
    SpecNode layout = SpecNode::sequence();
    for (const auto& w : spec.resources.layout) {
      SpecNode item = SpecNode::map();
      item.set("vnodes", scalar(w.vnodes));
      if (!w.device.empty()) item.set("device", scalar(w.device));
      item.set("threads", scalar(w.threads));
      item.set("cpu_quota", scalar(w.cpu_quota));
      layout.append(item);
    }
    res.set("layout", layout);
  }
  root.set("resources", res);
  const OutputSpec& o = spec.output;
  SpecNode out = SpecNode::map();
  SpecNode eval = SpecNode::map();
  eval.set("enabled", scalar(o.evaluation.enabled));
  eval.set("every_epochs", scalar(o.evaluation.every_epochs));
  eval.set("every_steps", scalar(o.evaluation.every_steps));
  eval.set("batch", scalar(o.evaluation.batch));
  out.set("evaluation", eval);
  SpecNode ckpt = SpecNode::map();
  ckpt.set("dir", scalar(o.checkpoint.dir));
  ckpt.set("every_steps", scalar(o.checkpoint.every_steps));
  ckpt.set("keep", scalar(o.checkpoint.keep));
  ckpt.set("resume", scalar(o.checkpoint.resume));
  out.set("checkpoint", ckpt);
  SpecNode log = SpecNode::map();
  log.set("metrics", scalar(o.logging.metrics));
  log.set("tensorboard", scalar(o.logging.tensorboard));
  log.set("progress", scalar(o.logging.progress));
  log.set("every_steps", scalar(o.logging.every_steps));
  log.set("level", scalar(o.logging.level));
  log.set("examples", scalar(o.logging.examples));
  out.set("logging", log);
  root.set("output", out);
  root.relocate(SpecLocation{spec.source, 0, 0});
  return root;
}

constexpr int64_t kBig = int64_t{1} << 40;

void parse_semantic(const SpecNode& node, SemanticSpec& s, bool check_components) {
  OptionReader r(node);
  {
    const SpecNode& m = r.section("model");
    OptionReader mr(m);
    if (const SpecNode* script = m.find("torchscript")) {
      // Shorthand: {torchscript: file.pt} = {name: torchscript, options: {path: file.pt}}.
      if (m.find("name") || m.find("options")) {
        mr.fail("torchscript", "the torchscript shorthand takes no name or options");
      }
      mr.get_string("torchscript", "");
      s.model.name = "torchscript";
      s.model.options = SpecNode::map(m.where(), m.path() + ".options");
      s.model.options.set("path", *script, script->key_where());
    } else {
      s.model.name = mr.get_string("name", s.model.name);
      s.model.options = mr.section("options");
    }
    mr.finish();
  }
  const SpecNode* model_name = node.find("model") ? node.find("model")->find("name") : nullptr;
  const SpecNode& data_node = r.section("data");
  {
    OptionReader dr(data_node);
    s.data.name = dr.get_string("name", s.data.name);
    s.data.options = dr.section("options");
    s.data.drop_last = dr.get_bool("drop_last", s.data.drop_last);
    dr.finish();
  }
  s.global_batch = r.get_int("global_batch", s.global_batch, 1, kBig);
  const bool explicit_n = r.has("virtual_nodes");
  s.virtual_nodes = r.get_int("virtual_nodes", s.virtual_nodes, 1, kBig);
  s.vnode_sizes = r.get_int_list("vnode_sizes", {}, 1, kBig);
  if (!s.vnode_sizes.empty()) {  // relaxed mode: the sizes decide N
    const auto n = static_cast<int64_t>(s.vnode_sizes.size());
    if (explicit_n && s.virtual_nodes != n) {
      r.fail("vnode_sizes", fmt::format("{} sizes for virtual_nodes {}", n, s.virtual_nodes));
    }
    const int64_t total = std::accumulate(s.vnode_sizes.begin(), s.vnode_sizes.end(), int64_t{0});
    if (total != s.global_batch) {
      r.fail("vnode_sizes",
             fmt::format("the sizes sum to {}, not to global_batch {}", total, s.global_batch));
    }
    s.virtual_nodes = n;
  } else if (s.virtual_nodes > s.global_batch) {
    r.fail("virtual_nodes", fmt::format("virtual_nodes ({}) cannot exceed global_batch ({})",
                                        s.virtual_nodes, s.global_batch));
  }
  if (s.vnode_sizes.empty() && s.global_batch % s.virtual_nodes != 0) {
    r.fail("virtual_nodes", fmt::format("global_batch {} is not divisible by virtual_nodes {} "
                                        "(every vnode must hold B/N examples)",
                                        s.global_batch, s.virtual_nodes));
  }
  {
    OptionReader o(r.section("optimizer"));
    auto& op = s.optimizer;
    op.name = o.get_choice("name", op.name, {"sgd", "adamw"});
    op.lr = o.get_double("lr", op.lr, 0.0, 1e6);
    op.weight_decay =
        o.get_double("weight_decay", op.name == "adamw" ? 0.01 : op.weight_decay, 0.0, 1e3);
    const std::vector<std::string> sgd_keys{"momentum", "dampening", "nesterov"};
    const std::vector<std::string> adamw_keys{"beta1", "beta2", "eps"};
    for (const auto& key : op.name == "sgd" ? adamw_keys : sgd_keys) {
      if (o.has(key)) {
        o.fail(key, fmt::format("{} is an {} option; optimizer {} takes lr, weight_decay, {}", key,
                                op.name == "sgd" ? "adamw" : "sgd", op.name,
                                fmt::join(op.name == "sgd" ? sgd_keys : adamw_keys, ", ")));
      }
    }
    if (op.name == "sgd") {
      op.momentum = o.get_double("momentum", op.momentum, 0.0, 1.0);
      op.dampening = o.get_double("dampening", op.dampening, 0.0, 1.0);
      op.nesterov = o.get_bool("nesterov", op.momentum > 0 && op.dampening == 0 && op.nesterov);
      if (op.nesterov && (op.momentum <= 0 || op.dampening != 0)) {
        o.fail("nesterov", "nesterov momentum needs momentum > 0 and dampening 0");
      }
    } else {
      op.beta1 = o.get_double("beta1", op.beta1, 0.0, 0.999999);
      op.beta2 = o.get_double("beta2", op.beta2, 0.0, 0.999999);
      op.eps = o.get_double("eps", op.eps, 1e-30, 1.0);
    }
    o.finish();
  }
  {
    OptionReader o(r.section("schedule"));
    auto& sc = s.schedule;
    sc.name = o.get_choice("name", sc.name, {"constant", "step", "cosine"});
    sc.warmup_steps = o.get_int("warmup_steps", sc.warmup_steps, 0, kBig);
    sc.warmup_start = o.get_double("warmup_start", sc.warmup_start, 0.0, 1.0);
    if (sc.name == "step") {
      sc.step_size = o.get_int("step_size", sc.step_size, 1, kBig);
      sc.gamma = o.get_double("gamma", sc.gamma, 0.0, 1.0);
    } else if (sc.name == "cosine") {
      sc.min_factor = o.get_double("min_factor", sc.min_factor, 0.0, 1.0);
    }
    o.finish();
  }
  if (r.has("steps") && r.has("epochs")) {
    r.fail("steps", "give either steps or epochs, not both");
  }
  s.steps = r.get_int("steps", s.steps, 0, kBig);
  s.epochs = r.get_int("epochs", s.steps > 0 ? 0 : s.epochs, 0, kBig);
  if (s.steps == 0 && s.epochs == 0) r.fail("epochs", "training needs steps > 0 or epochs > 0");
  s.seed = static_cast<uint64_t>(r.get_int("seed", static_cast<int64_t>(s.seed), 0, INT64_MAX));
  s.deterministic = r.get_bool("deterministic", s.deterministic);
  s.precision = r.get_choice("precision", s.precision, {"fp32", "bf16"});
  r.finish();
  if (!check_components) return;

  // Model and data options: validated by their factories, without loading anything.
  const SpecNode* data_name = data_node.find("name");
  const SpecNode fallback_name = SpecNode::scalar("", node.where(), node.path());
  const auto prepared = data::DataRegistry::global().prepare(
      s.data.name, data_name ? *data_name : fallback_name, s.data.options);
  models::ModelRegistry::global().prepare(
      s.model.name, model_name ? *model_name : fallback_name, s.model.options,
      models::ModelContext{prepared.info.input_shape, prepared.info.num_classes,
                           prepared.info.vocab_size});
}

bool is_cuda_device(const std::string& name) {
  return name == "cuda" || (name.size() > 5 && name.rfind("cuda:", 0) == 0 &&
                            name.find_first_not_of("0123456789", 5) == std::string::npos);
}

/// A device name (cpu, cuda, cuda:K) read from `key`; absent = `fallback`.
std::string read_device(OptionReader& r, const std::string& key, const std::string& fallback) {
  std::string device = r.get_string(key, fallback);
  if (device != "cpu" && !is_cuda_device(device) && !(device.empty() && fallback.empty())) {
    r.fail(key, fmt::format("unknown device '{}'; choices: cpu, cuda, cuda:K", device));
  }
  return device;
}

void parse_layout(OptionReader& r, ResourcesSpec& res, const SemanticSpec& s) {
  const auto& items = r.list("layout");
  if (items.empty()) return;
  res.layout.clear();
  int64_t total = 0;
  for (const auto& item : items) {
    OptionReader w(item);
    ResourcesSpec::Worker worker;
    worker.vnodes = w.get_int("vnodes", 0, 1, s.virtual_nodes);
    worker.device = read_device(w, "device", "");
    if (worker.device == res.device) worker.device.clear();
    worker.threads = w.get_int("threads", 0, 0, 4096);
    worker.cpu_quota = w.get_double("cpu_quota", 0, 0, 4096);
    w.finish();
    total += worker.vnodes;
    res.layout.push_back(worker);
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
  if (res.backend == "nccl" && !cpu_worker.empty()) {
    r.fail("backend", fmt::format("nccl needs every worker on a CUDA device, but {} is on the cpu; "
                                  "use backend gloo (or auto) for a job that mixes cpu and cuda",
                                  cpu_worker));
  }
  const bool any_cuda =
      is_cuda_device(res.device) ||
      std::any_of(res.layout.begin(), res.layout.end(),
                  [](const ResourcesSpec::Worker& w) { return is_cuda_device(w.device); });
  if (res.backend == "auto" && any_cuda && !cpu_worker.empty()) res.backend = "gloo";
}

void parse_resources(const SpecNode& node, ResourcesSpec& res, const SemanticSpec& s) {
  OptionReader r(node);
  res.workers = r.get_int("workers", res.workers, 1, kBig);
  if (res.workers > s.virtual_nodes) {
    r.fail("workers", fmt::format("{} workers but only {} virtual nodes: every worker needs at "
                                  "least one vnode",
                                  res.workers, s.virtual_nodes));
  }
  res.device = read_device(r, "device", res.device);
  res.backend = r.get_choice("backend", res.backend, {"auto", "gloo", "nccl"});
  res.threads = r.get_int("threads", res.threads, 0, 4096);
  res.prefetch = r.get_choice("prefetch", res.prefetch, {"auto", "true", "false"});
  res.timeout_s = r.get_double("timeout_s", res.timeout_s, 0.1, 86400.0);
  res.memory_limit_mb = r.get_int("memory_limit_mb", res.memory_limit_mb, 0, int64_t{1} << 30);
  res.min_workers = r.get_int("min_workers", res.min_workers, 1, kBig);
  res.max_workers = r.get_int("max_workers", res.max_workers, 0, kBig);
  if (res.max_workers > s.virtual_nodes) {
    r.fail("max_workers", fmt::format("{} workers but only {} virtual nodes: every worker needs "
                                      "at least one vnode",
                                      res.max_workers, s.virtual_nodes));
  }
  const int64_t most = res.max_workers > 0 ? res.max_workers : s.virtual_nodes;
  if (res.min_workers > most) {
    r.fail("min_workers", fmt::format("min_workers {} is above the most workers allowed ({})",
                                      res.min_workers, most));
  }
  if (res.workers < res.min_workers || res.workers > most) {
    r.fail("workers", fmt::format("{} workers is outside min_workers..max_workers = {}..{}",
                                  res.workers, res.min_workers, most));
  }
  res.replace_failed = r.get_bool("replace_failed", res.replace_failed);
  parse_layout(r, res, s);
  check_backend(r, res);
  r.finish();
}

void parse_output(const SpecNode& node, OutputSpec& out) {
  OptionReader r(node);
  {
    OptionReader e(r.section("evaluation"));
    auto& ev = out.evaluation;
    ev.enabled = e.get_bool("enabled", ev.enabled);
    ev.every_epochs = e.get_int("every_epochs", ev.every_epochs, 0, kBig);
    ev.every_steps = e.get_int("every_steps", ev.every_steps, 0, kBig);
    ev.batch = e.get_int("batch", ev.batch, 1, kBig);
    e.finish();
  }
  {
    OptionReader c(r.section("checkpoint"));
    auto& ck = out.checkpoint;
    ck.dir = c.get_string("dir", ck.dir);
    ck.every_steps = c.get_int("every_steps", ck.every_steps, 0, kBig);
    ck.keep = c.get_int("keep", ck.keep, 1, 1000000);
    ck.resume = c.get_string("resume", ck.resume);
    if (ck.resume == "latest" && ck.dir.empty()) {
      c.fail("resume", "resume: latest needs output.checkpoint.dir");
    }
    c.finish();
  }
  {
    OptionReader l(r.section("logging"));
    auto& lg = out.logging;
    lg.metrics = l.get_string("metrics", lg.metrics);
    lg.tensorboard = l.get_string("tensorboard", lg.tensorboard);
    lg.progress = l.get_choice("progress", lg.progress, {"auto", "bar", "lines", "off"});
    lg.every_steps = l.get_int("every_steps", lg.every_steps, 1, kBig);
    lg.level = l.get_choice("level", lg.level, {"trace", "debug", "info", "warn", "error"});
    lg.examples = l.get_string("examples", lg.examples);
    l.finish();
  }
  r.finish();
}

}  // namespace

std::string JobSpec::semantic_yaml() const { return semantic_tree(semantic).to_yaml(); }

std::string JobSpec::model_digest() const {
  std::string text;
  const SpecNode tree = semantic_tree(semantic);
  for (const auto& [key, node] : tree.entries()) {
    // Precision changes the speed too (absent, as in earlier profiles, for fp32).
    if (key == "model" || key == "data" || key == "precision") {
      text += key + ":\n" + node.to_yaml(2);
    }
  }
  uint64_t hash = 14695981039346656037ULL;  // FNV-1a, stable across builds
  for (const unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ULL;
  }
  return fmt::format("{:016x}", hash);
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
  parse_output(output, spec.output);
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
