// vflow-train as a user runs it: exit codes and messages.
#include <catch2/catch.hpp>
#include <filesystem>
#include <regex>

#include "support.h"
#include "vflow/engine/checkpoint.h"

using Catch::Matchers::Contains;
using vflow::testing::run_command;
using vflow::testing::TempDir;

namespace {
const std::string kTrain = VFLOW_TRAIN_BINARY;
const std::string kSmall =
    " --set semantic.data='{name: synthetic, options: {train_size: 256, test_size: 64, shape: [1, "
    "8, 8], classes: 3}}'"
    " --set semantic.model.options='{channels: [4], hidden: 8}' --set semantic.global_batch=32"
    " --set semantic.virtual_nodes=4 --set semantic.steps=10 --set semantic.epochs=null"
    " --set resources.threads=1";
}  // namespace

TEST_CASE("vflow-train rejects a bad job file with exit code 2 and file:line:key",
          "[integration]") {
  TempDir dir;
  vflow::testing::write_file(dir.file("bad.yaml"),
                             "semantic:\n  global_batch: 100\n  virtual_nodes: 8\n");
  const auto r = run_command(kTrain + " " + dir.file("bad.yaml"));
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output,
             Contains(dir.file("bad.yaml") + ":3:18: semantic.virtual_nodes: global_batch 100 is "
                                             "not divisible by virtual_nodes 8"));
  const auto o = run_command(kTrain + " --set semantic.optimizer.lr=fast");
  CHECK(o.exit_code == 2);
  CHECK_THAT(
      o.output,
      Contains("--set semantic.optimizer.lr=fast: semantic.optimizer.lr: expected a number"));
}

TEST_CASE("vflow-train reports unreadable data with exit code 3", "[integration]") {
  TempDir dir;
  const auto r = run_command(kTrain + " --set semantic.data.options.path=" + dir.path());
  CHECK(r.exit_code == 3);
  CHECK_THAT(r.output, Contains(dir.path() + "/train-images-idx3-ubyte(.gz): file not found"));
}

TEST_CASE("vflow-train --check and --print-spec", "[integration]") {
  CHECK(run_command(kTrain + " --check").exit_code == 0);
  const auto p = run_command(kTrain + " --print-spec --set semantic.seed=5");
  CHECK(p.exit_code == 0);
  CHECK_THAT(p.output, Contains("seed: 5"));
}

TEST_CASE("vflow-train trains, prints the fingerprint and resumes", "[integration]") {
  TempDir dir;
  const auto full = run_command(kTrain + kSmall + " --set semantic.deterministic=true");
  REQUIRE(full.exit_code == 0);
  std::smatch m;
  REQUIRE(std::regex_search(full.output, m, std::regex("fingerprint ([0-9a-f]{16})")));
  const std::string fingerprint = m[1];
  CHECK_THAT(full.output, Contains("test accuracy"));

  const std::string ckpt = " --set output.checkpoint.dir=" + dir.path();
  const auto part =
      run_command(kTrain + kSmall + ckpt +
                  " --set semantic.deterministic=true"
                  " --set output.checkpoint.every_steps=4 --set output.checkpoint.keep=5");
  REQUIRE(part.exit_code == 0);
  std::filesystem::remove(dir.file("step-00000010.pt"));
  std::filesystem::remove(dir.file("step-00000008.pt"));
  const auto resumed =
      run_command(kTrain + kSmall + ckpt + " --set semantic.deterministic=true --resume latest");
  REQUIRE(resumed.exit_code == 0);
  CHECK_THAT(resumed.output, Contains("resumed from") && Contains("at step 4"));
  CHECK_THAT(resumed.output, Contains("fingerprint " + fingerprint));
}

TEST_CASE("the default job reaches over 85% test accuracy on Fashion-MNIST",
          "[slow][integration]") {
  const auto r = run_command(kTrain + " --set output.logging.progress=lines");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  std::smatch m;
  REQUIRE(std::regex_search(r.output, m, std::regex("test accuracy ([0-9.]+)%")));
  CHECK(std::stod(m[1]) > 85.0);
}

TEST_CASE("SIGTERM stops vflow-train at a step boundary with a checkpoint", "[integration]") {
  TempDir dir;
  const std::string metrics = dir.file("metrics.jsonl");
  const std::string script =
      kTrain + kSmall + " --set semantic.steps=1000000 --set output.logging.every_steps=1" +
      " --set output.logging.metrics=" + metrics + " --set output.checkpoint.dir=" + dir.path() +
      " & pid=$!; for i in $(seq 600); do grep -q '\"event\":\"step\"' " + metrics +
      " 2>/dev/null && break; sleep 0.1; done; kill -TERM $pid; wait $pid; echo \"exit=$?\"";
  const auto r =
      run_command("bash -c '" + std::regex_replace(script, std::regex("'"), "'\\''") + "'");
  INFO(r.output);
  CHECK_THAT(r.output, Contains("exit=130"));
  CHECK_THAT(r.output, Contains("stopped at step"));
  CHECK_THAT(r.output, Contains("[checkpoint] wrote"));
  CHECK(vflow::engine::list_checkpoints(dir.path()).size() == 1);
}

TEST_CASE("a vnode too big for resources.memory_limit_mb fails with exit code 6; more vnodes fit",
          "[integration]") {
  // 512 examples of 64x64 through a 64-channel convolution: about 1 GiB per activation
  // tensor as one vnode, 32 MiB as 32 vnodes of 16.
  const std::string job =
      " --set semantic.data='{name: synthetic, options: {train_size: 512, test_size: 0, shape: "
      "[1, 64, 64], classes: 3}}'"
      " --set semantic.model.options='{channels: [64], hidden: 8}' --set semantic.global_batch=512"
      " --set semantic.steps=2 --set semantic.epochs=null --set resources.threads=1"
      " --set resources.memory_limit_mb=1200";
  const auto big = run_command(kTrain + job + " --set semantic.virtual_nodes=1");
  CHECK(big.exit_code == 6);
  CHECK_THAT(big.output, Contains("step 0: out of memory under resources.memory_limit_mb = 1200: "
                                  "a vnode of 512 examples"));
  const auto small = run_command(kTrain + job + " --set semantic.virtual_nodes=32");
  INFO(small.output);
  CHECK(small.exit_code == 0);
}

TEST_CASE("the example jobs are valid", "[integration]") {
  TempDir dir;
  // The TorchScript example trains convnet.pt from the working directory.
  vflow::testing::export_torchscript("convnet", dir.file("convnet.pt"));
  int checked = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(VFLOW_SOURCE_DIR) + "/examples/jobs")) {
    if (entry.path().extension() != ".yaml") continue;
    const auto r = run_command("cd " + dir.path() + " && " + kTrain + " " + entry.path().string() +
                               " --check 2>&1");
    INFO(entry.path().string() << "\n" << r.output);
    CHECK(r.exit_code == 0);
    ++checked;
  }
  CHECK(checked >= 4);
}
