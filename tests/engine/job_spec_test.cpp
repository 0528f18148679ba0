#include "vflow/engine/job_spec.h"

#include <catch2/catch.hpp>

#include "support.h"
#include "vflow/core/error.h"
#include "vflow/data/dataset.h"
#include "vflow/models/registry.h"

using Catch::Matchers::Contains;
using vflow::SpecError;
using vflow::engine::load_job_spec;

namespace {
/// Loads `text` as a job file and returns the error message (empty if it is valid).
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  vflow::testing::TempDir dir;
  const std::string path = dir.file("job.yaml");
  vflow::testing::write_file(path, text);
  try {
    load_job_spec(path, overrides);
  } catch (const SpecError& e) {
    std::string msg = e.what();
    const auto pos = msg.find(path);
    if (pos != std::string::npos) msg.replace(pos, path.size(), "job.yaml");
    return msg;
  }
  return "";
}
}  // namespace

TEST_CASE("the built-in default job is valid and trains a ConvNet on Fashion-MNIST", "[unit]") {
  const auto spec = load_job_spec("");
  CHECK(spec.semantic.model.name == "convnet");
  CHECK(spec.semantic.data.name == "fashion-mnist");
  CHECK(spec.semantic.global_batch == 256);
  CHECK(spec.semantic.virtual_nodes == 8);
  CHECK(spec.resources.workers == 1);
}

TEST_CASE("a planned layout may put workers on several device types", "[unit][hetero]") {
  vflow::testing::TempDir dir;
  const std::string path = dir.file("job.yaml");
  vflow::testing::write_file(path,
                             "resources:\n  workers: 3\n  layout:\n"
                             "    - {vnodes: 4, device: 'cuda:1'}\n"
                             "    - {vnodes: 2, device: cpu, threads: 1}\n"
                             "    - {vnodes: 2, device: cuda, cpu_quota: 0.5}\n");
  const auto spec = load_job_spec(path);
  REQUIRE(spec.resources.layout.size() == 3);
  CHECK(spec.resources.layout[0].device == "cuda:1");
  CHECK(spec.resources.layout[1].device.empty());  // the job's own device (cpu)
  CHECK(spec.resources.layout[2].device == "cuda");
  CHECK(spec.resources.layout[2].cpu_quota == 0.5);
  // CPU and CUDA workers in one job: every worker talks through Gloo.
  CHECK(spec.resources.backend == vflow::comm::Backend::kGloo);
  CHECK_NOTHROW(vflow::engine::validate(spec));

  SECTION("workers on CUDA devices only keep the automatic choice") {
    vflow::testing::write_file(path,
                               "resources:\n  device: cuda\n  workers: 2\n  layout:\n"
                               "    - {vnodes: 4, device: 'cuda:1'}\n    - {vnodes: 4}\n");
    CHECK(load_job_spec(path).resources.backend == vflow::comm::Backend::kAuto);
  }
}

TEST_CASE("an empty job file is refused, and {} means every default", "[unit]") {
  CHECK(error_of("") == "job.yaml: the job spec is empty (no YAML document)");
  CHECK(error_of("# only a comment\n") != "");
  CHECK(error_of("{}\n") == "");
  CHECK(error_of("semantic: {}\n") == "");
}

TEST_CASE("each class of bad job spec is rejected with file, line and key", "[unit]") {
  SECTION("unknown key") {
    CHECK_THAT(error_of("semantic:\n  global_bacth: 64\n"),
               Contains("job.yaml:2:3: semantic.global_bacth: unknown key"));
  }
  SECTION("unknown top-level section") {
    CHECK_THAT(error_of("semantics: {}\n"), Contains("job.yaml:1:1: semantics: unknown key"));
  }
  SECTION("wrong type") {
    CHECK_THAT(error_of("semantic:\n  global_batch: lots\n"),
               Contains("job.yaml:2:17: semantic.global_batch: expected an integer, got 'lots'"));
    CHECK_THAT(error_of("semantic:\n  optimizer: sgd\n"),
               Contains("job.yaml:2:14: semantic.optimizer: expected a section"));
  }
  SECTION("out of range") {
    CHECK_THAT(error_of("semantic:\n  optimizer: {lr: -1}\n"),
               Contains("semantic.optimizer.lr: value -1 is out of range"));
    CHECK_THAT(error_of("semantic:\n  global_batch: 0\n"),
               Contains("job.yaml:2:17: semantic.global_batch"));
  }
  SECTION("global_batch not divisible by virtual_nodes") {
    CHECK_THAT(
        error_of("semantic:\n  global_batch: 100\n  virtual_nodes: 8\n"),
        Contains("job.yaml:3:18: semantic.virtual_nodes: global_batch 100 is not divisible by "
                 "virtual_nodes 8"));
  }
  SECTION("elastic limits and a planned layout that do not fit") {
    CHECK_THAT(error_of("resources:\n  workers: 3\n  max_workers: 2\n"),
               Contains("resources.workers: 3 workers is outside min_workers..max_workers = 1..2"));
    CHECK_THAT(error_of("resources:\n  workers: 2\n  layout:\n    - {vnodes: 4}\n"
                        "    - {vnodes: 3}\n"),
               Contains("job.yaml:4:5: resources.layout: 2 entries holding 7 vnodes, but the job "
                        "has 2 workers and 8 virtual nodes"));
    CHECK_THAT(error_of("resources:\n  layout:\n    - {vnodes: 8, cores: 2}\n"),
               Contains("job.yaml:3:19: resources.layout[0].cores: unknown key"));
  }
  SECTION("unknown choice") {
    CHECK_THAT(
        error_of("semantic:\n  optimizer: {name: adagrad}\n"),
        Contains("semantic.optimizer.name: unknown value 'adagrad'; choices: sgd, adamw, adam, "
                 "lamb, lars"));
  }
  SECTION("unknown model and model option") {
    CHECK_THAT(
        error_of("semantic:\n  model: {name: resnet9}\n"),
        Contains(
            "job.yaml:2:17: semantic.model.name: unknown model 'resnet9'; choices: mlp, convnet"));
    CHECK_THAT(error_of("semantic:\n  model:\n    name: convnet\n    options: {chanels: [8]}\n"),
               Contains("job.yaml:4:15: semantic.model.options.chanels: unknown key"));
  }
  SECTION("unknown data set option") {
    CHECK_THAT(error_of("semantic:\n  data: {name: synthetic, options: {size: 10}}\n"),
               Contains("semantic.data.options.size: unknown key"));
    CHECK_THAT(error_of("semantic:\n  data: {name: synthetic, options: {shape: []}}\n"),
               Contains("semantic.data.options.shape: needs at least one dimension"));
    CHECK_THAT(error_of("semantic:\n  data:\n    name: text-classes\n    options:\n"
                        "      classes: [{name: a, paths: [x]}, {paths: [y]}]\n"),
               Contains("semantic.data.options.classes[1].name: every class needs a name"));
    CHECK_THAT(
        error_of("semantic:\n  data:\n    name: text-classes\n    options:\n"
                 "      classes: [{name: a, paths: [x]}]\n"),
        Contains("job.yaml:5:16: semantic.data.options.classes: needs at least two classes"));
    CHECK_THAT(error_of("semantic:\n  data: {name: text-lm}\n"),
               Contains("semantic.data.options.paths: needs text files or directories"));
  }
  SECTION("steps and epochs together") {
    CHECK_THAT(error_of("semantic:\n  steps: 10\n  epochs: 2\n"),
               Contains("job.yaml:2:10: semantic.steps: give either steps or epochs"));
  }
  SECTION("more workers than vnodes, and an unknown device") {
    CHECK_THAT(error_of("semantic: {virtual_nodes: 2}\nresources: {workers: 3}\n"),
               Contains("resources.workers: 3 workers but only 2 virtual nodes"));
    CHECK_THAT(error_of("resources: {device: tpu}\n"),
               Contains("resources.device: unknown device 'tpu'"));
    CHECK_THAT(error_of("resources: {device: 'cuda:x'}\n"),
               Contains("resources.device: unknown device 'cuda:x'"));
  }
  SECTION("relaxed vnode sizes that do not add up") {
    CHECK_THAT(error_of("semantic: {global_batch: 16, vnode_sizes: [8, 4]}\n"),
               Contains("semantic.vnode_sizes: the sizes sum to 12, not to global_batch 16"));
    CHECK_THAT(error_of("semantic: {global_batch: 16, virtual_nodes: 3, vnode_sizes: [8, 8]}\n"),
               Contains("semantic.vnode_sizes: 2 sizes for virtual_nodes 3"));
  }
  SECTION("a backend that does not fit the device") {
    CHECK_THAT(error_of("resources: {backend: nccl}\n"),
               Contains("job.yaml:1:22: resources.backend: nccl needs every worker on a CUDA "
                        "device, but resources.device (and every worker that joins) is on the "
                        "cpu"));
    CHECK_THAT(error_of("resources:\n  device: cuda\n  backend: nccl\n  workers: 2\n  layout:\n"
                        "    - {vnodes: 4}\n    - {vnodes: 4, device: cpu}\n"),
               Contains("job.yaml:3:12: resources.backend: nccl needs every worker on a CUDA "
                        "device, but resources.layout[1] is on the cpu"));
    CHECK_THAT(error_of("resources: {backend: mpi}\n"),
               Contains("resources.backend: unknown value 'mpi'"));
  }
  SECTION("a planned worker on an unknown device") {
    CHECK_THAT(error_of("resources:\n  workers: 2\n  layout:\n    - {vnodes: 4}\n"
                        "    - {vnodes: 4, device: gpu1}\n"),
               Contains("job.yaml:5:27: resources.layout[1].device: unknown device 'gpu1'"));
  }
  SECTION("YAML syntax error") {
    CHECK_THAT(error_of("semantic:\n  global_batch: [1,\n"), Contains("job.yaml:"));
  }
  SECTION("a missing file") {
    CHECK_THROWS_WITH(
        load_job_spec("/nonexistent/job.yaml"),
        Contains("/nonexistent/job.yaml: cannot read the job spec: cannot open: No such file"));
  }
}

TEST_CASE("command-line overrides go through the same validation", "[unit]") {
  CHECK(error_of("{}\n", {"semantic.global_batch=128", "semantic.virtual_nodes=16"}) == "");
  CHECK_THAT(
      error_of("{}\n", {"semantic.virtual_nodes=7"}),
      Contains("--set semantic.virtual_nodes=7: semantic.virtual_nodes: global_batch 256 is not "
               "divisible by virtual_nodes 7"));
  CHECK_THAT(error_of("{}\n", {"semantic.optimzer.lr=0.1"}),
             Contains("--set semantic.optimzer.lr=0.1: semantic.optimzer: unknown key"));
  CHECK_THROWS_WITH(
      load_job_spec("", {"semantic.optimizer.name=adamw"}),
      Contains("semantic.optimizer.momentum: momentum is an sgd or lars option; optimizer "
               "adamw takes"));
  const auto spec =
      load_job_spec("", {"semantic.seed=42", "semantic.optimizer={name: adamw, lr: 0.001}"});
  CHECK(spec.semantic.seed == 42);
  CHECK(spec.semantic.optimizer.name == "adamw");
}

TEST_CASE("the semantic digest ignores resources and output", "[unit]") {
  const auto a = load_job_spec("", {"resources.threads=1", "output.logging.every_steps=5"});
  const auto b = load_job_spec("", {"resources.threads=2"});
  const auto c = load_job_spec("", {"semantic.seed=2"});
  CHECK(a.semantic_yaml() == b.semantic_yaml());
  CHECK(a.semantic_yaml() != c.semantic_yaml());
}

TEST_CASE("specs built in code are validated too", "[unit]") {
  auto spec = load_job_spec("");
  spec.semantic.virtual_nodes = 3;
  CHECK_THROWS_WITH(vflow::engine::validate(spec), Contains("not divisible by virtual_nodes 3"));
}

TEST_CASE("the printed spec reads back as the same spec", "[unit]") {
  // Non-default values in every section, both optimizers and every schedule.
  const std::vector<std::vector<std::string>> variants{
      {},
      {"semantic.optimizer={name: adamw, beta2: 0.99}",
       "semantic.schedule={name: step, gamma: 0.5}", "semantic.epochs=null", "semantic.steps=40",
       "semantic.precision=bf16"},
      {"semantic.vnode_sizes=[100, 100, 56]", "semantic.virtual_nodes=null",
       "semantic.optimizer={momentum: 0}", "semantic.schedule={name: constant}",
       "semantic.data.drop_last=true", "semantic.deterministic=true", "semantic.seed=9"},
      {"resources.workers=2", "resources.threads=1", "resources.prefetch=false",
       "resources.timeout_s=2.5", "resources.replace_failed=true", "resources.max_workers=4",
       "resources.layout=[{vnodes: 5, threads: 1}, {vnodes: 3, cpu_quota: 0.5}]",
       "output.evaluation={enabled: false, every_steps: 7}", "output.checkpoint.dir=ck",
       "output.checkpoint.resume=latest", "output.logging={metrics: m.jsonl, level: warn}"},
  };
  for (const auto& overrides : variants) {
    CAPTURE(overrides);
    const auto spec = load_job_spec("", overrides);
    const std::string text = spec.yaml();
    vflow::testing::TempDir dir;
    vflow::testing::write_file(dir.file("again.yaml"), text);
    const auto again = load_job_spec(dir.file("again.yaml"));
    CHECK(again.yaml() == text);
    CHECK(again.semantic_yaml() == spec.semantic_yaml());
  }
}

TEST_CASE("a key of another variant is refused, naming the keys that apply", "[unit]") {
  CHECK_THAT(error_of("semantic:\n  schedule: {name: cosine, step_size: 5}\n"),
             Contains("semantic.schedule.step_size: step_size is a step option; schedule cosine "
                      "takes warmup_steps, warmup_start, min_factor"));
  CHECK_THAT(error_of("semantic:\n  optimizer: {name: sgd, eps: 1e-6}\n"),
             Contains("semantic.optimizer.eps: eps is an adamw, adam or lamb option; optimizer sgd "
                      "takes lr, weight_decay, momentum, dampening, nesterov"));
  CHECK_THAT(error_of("output:\n  evaluation: {use_ema: true}\n"),
             Contains("job.yaml:2:25: output.evaluation.use_ema: use_ema needs a weight average: "
                      "set semantic.ema.decay"));
  // A null value of such a key is unset, as everywhere.
  CHECK(error_of("semantic:\n  optimizer: {name: adamw, momentum: null}\n") == "");
  CHECK_THAT(
      error_of("resources:\n  workers: 2\n  layout: [{vnodes: 4}, {threads: 1}]\n"),
      Contains("job.yaml:3:25: resources.layout[1].vnodes: every layout entry needs vnodes"));
}

TEST_CASE("the key tables come from the schema the parser reads", "[unit]") {
  const std::string tables = vflow::engine::job_spec_key_tables();
  for (const char* part : {"semantic", "resources", "output"}) {
    CHECK_THAT(tables, Contains(std::string("<!-- keys: ") + part + " -->"));
  }
  // Defaults come from the structs, computed defaults from their declaration.
  CHECK_THAT(tables, Contains("| `global_batch` | `256` |"));
  CHECK_THAT(
      tables,
      Contains("| `optimizer.weight_decay` | `0.0005` (sgd, lars), `0.01` (adamw, lamb), `0` "
               "(adam) |"));
  CHECK_THAT(tables, Contains("| `optimizer.beta1` | `0.9` | adamw, adam, lamb only: "));
  CHECK_THAT(tables, Contains("| `layout[].cpu_quota` | `0` |"));
  CHECK_THAT(tables, Contains("| `checkpoint.dir` | empty |"));
  // Every registered model and data set has its options' table, from its own schema.
  for (const auto& name : vflow::models::ModelRegistry::global().names()) {
    CHECK_THAT(tables, Contains("<!-- keys: model." + name + " -->\n`" + name + "`: "));
  }
  for (const auto& name : vflow::data::DataRegistry::global().names()) {
    CHECK_THAT(tables, Contains("<!-- keys: data." + name + " -->\n`" + name + "`: "));
  }
  CHECK_THAT(tables, Contains("| `channels` | `[32, 64]` | output channels of each block |"));
  CHECK_THAT(tables, Contains("| `heads` | the preset's |"));
  CHECK_THAT(tables, Contains("| `classes[].paths` | required |"));
  // Every key of a printed spec has a row.
  const auto spec =
      load_job_spec("", {"resources.layout=[{vnodes: 8, device: cuda, cpu_quota: 0.5}]"});
  const std::string text = spec.yaml();
  for (const char* key : {"drop_last", "warmup_start", "min_factor", "memory_limit_mb",
                          "replace_failed", "cpu_quota", "every_epochs", "keep", "examples"}) {
    CAPTURE(key);
    CHECK_THAT(text, Contains(std::string(key) + ":"));
    CHECK_THAT(tables, Contains(std::string(key) + "` |"));
  }
}

TEST_CASE("a layout entry travels as YAML and reads back", "[unit][hetero]") {
  vflow::engine::ResourcesSpec::Worker w;
  w.vnodes = 3;
  w.device = "cuda:1";
  w.threads = 2;
  w.cpu_quota = 0.5;
  const auto back = vflow::engine::parse_layout_entry(vflow::engine::layout_entry_yaml(w), "entry");
  CHECK(back.vnodes == 3);
  CHECK(back.device == "cuda:1");
  CHECK(back.threads == 2);
  CHECK(back.cpu_quota == 0.5);
  CHECK_THROWS_WITH(vflow::engine::parse_layout_entry("{vnodes: 2, device: tpu}", "entry"),
                    Contains("entry:1:21: device: unknown device 'tpu'"));
}

TEST_CASE("cross-checks are refused outside deterministic mode and their switches are checked",
          "[unit]") {
  // The default (every 100 steps) applies to deterministic jobs only; asked for elsewhere
  // it is an error naming the key.
  CHECK(error_of("semantic: {deterministic: false}\n") == "");
  CHECK_THAT(error_of("resources:\n  verify_every_steps: 5\n"),
             Contains("job.yaml:2:") && Contains("resources.verify_every_steps") &&
                 Contains("deterministic"));
  CHECK(error_of("semantic: {deterministic: true}\nresources: {verify_every_steps: 5}\n") == "");
  CHECK(error_of("resources: {verify_every_steps: 0}\n") == "");
  CHECK_THAT(error_of("resources: {on_mismatch: retry}\n"),
             Contains("resources.on_mismatch") && Contains("warn") && Contains("evict"));
  const auto spec = load_job_spec("", {"semantic.deterministic=true"});
  CHECK(spec.resources.verify_every_steps == 100);
  CHECK(spec.resources.on_mismatch == vflow::engine::OnMismatch::kStop);
}

TEST_CASE("sharded optimizer state is for the fused optimizers, with one or two homes",
          "[unit][shard]") {
  CHECK(error_of("semantic: {optimizer: {name: adamw}}\nresources: {shard_optimizer: true}\n") ==
        "");
  CHECK(error_of("resources: {shard_optimizer: true, shard_replicas: 1}\n") == "");
  CHECK(error_of("semantic: {optimizer: {name: lamb}}\nresources: {shard_optimizer: true}\n") ==
        "");
  CHECK(error_of("semantic: {optimizer: {name: lars}}\nresources: {shard_optimizer: true}\n") ==
        "");
  CHECK_THAT(error_of("semantic: {optimizer: {name: adam}}\nresources:\n  shard_optimizer: true\n"),
             Contains("job.yaml:3:") && Contains("resources.shard_optimizer") &&
                 Contains("sgd, adamw, lamb and lars") && Contains("adam"));
  CHECK_THAT(error_of("resources: {shard_optimizer: true, shard_replicas: 3}\n"),
             Contains("resources.shard_replicas"));
  CHECK_FALSE(load_job_spec("").resources.shard_optimizer);
  CHECK(load_job_spec("").resources.shard_replicas == 2);
}
