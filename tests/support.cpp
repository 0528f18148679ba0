#include "support.h"

#include <fmt/format.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "vflow/core/address.h"
#include "vflow/core/process.h"
#include "vflow/core/spec_node.h"
#include "vflow/job/control_store.h"

namespace vflow::testing {

TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "vflow-test-XXXXXX").string();
  if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void write_file(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary);
  out << content;
}

void write_llmc_shard(const std::string& path, const std::vector<uint16_t>& tokens, int32_t magic,
                      int32_t version, int64_t count) {
  int32_t header[256] = {};
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(count < 0 ? static_cast<int64_t>(tokens.size()) : count);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header), sizeof header);
  out.write(reinterpret_cast<const char*>(tokens.data()),
            static_cast<std::streamsize>(tokens.size() * sizeof(uint16_t)));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

namespace {
std::string test_threads() {
  const char* v = std::getenv("VFLOW_TEST_THREADS");
  return v && *v ? std::string(v) : std::string();
}
}  // namespace

std::string threads_flag() {
  const auto threads = test_threads();
  return threads.empty() ? "" : " --set resources.threads=" + threads;
}

engine::JobSpec small_job(const std::vector<std::string>& overrides) {
  static const char* text = R"(
semantic:
  model: {name: convnet, options: {channels: [4, 8], hidden: 16, dropout: 0.25, batch_norm: true}}
  data: {name: synthetic, options: {train_size: 480, test_size: 128, shape: [1, 12, 12], classes: 4, noise: 1.5}}
  global_batch: 48
  virtual_nodes: 12
  optimizer: {name: sgd, lr: 0.05, momentum: 0.9, nesterov: true, weight_decay: 0.0005}
  schedule: {name: cosine, warmup_steps: 3}
  steps: 20
  seed: 3
resources: {threads: 1}
output:
  logging: {progress: off}
  evaluation: {enabled: true}
)";
  SpecNode root = parse_yaml(text, "<small test job>");
  for (const auto& o : overrides) apply_override(root, o);
  if (const auto threads = test_threads(); !threads.empty()) {
    apply_override(root, "resources.threads=" + threads);
  }
  return engine::parse_job_spec(root);
}

comm::Rendezvous rendezvous_at(const job::StoreHost& coordinator, int rank, int size,
                               const std::string& generation, int timeout_ms) {
  return coordinator.rendezvous(rank, size, generation, std::chrono::milliseconds(timeout_ms));
}

std::vector<std::string> run_gloo_ranks(const job::StoreHost& coordinator, int ranks,
                                        const std::string& generation,
                                        const std::function<void(int, comm::Communicator&)>& body,
                                        bool shared_memory) {
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        auto r = rendezvous_at(coordinator, rank, ranks, generation);
        r.shared_memory = shared_memory;
        auto comm = comm::make_gloo_communicator(r);
        body(rank, *comm);
      } catch (const std::exception& e) {
        errors[rank] = e.what();
        if (errors[rank].empty()) errors[rank] = "(an exception without a message)";
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

std::string export_torchscript(const std::string& model, const std::string& path) {
  const auto r =
      run_command(fmt::format("/usr/bin/python3 {}/scripts/export_torchscript.py --model "
                              "{} --out {} 2>&1",
                              VFLOW_SOURCE_DIR, model, path));
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  return path;
}

void skip_test(const std::string& why) {
  std::printf("SKIPPED: %s\n", why.c_str());
  std::fflush(stdout);
  if (std::getenv("VFLOW_TEST_SKIP_EXIT") != nullptr) std::_Exit(kSkipped);
  WARN("SKIPPED: " << why);
}

int free_port() { return free_loopback_port(); }

CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) throw std::runtime_error("popen failed: " + command);
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) result.output.append(buf.data(), n);
  const int status = ::pclose(pipe);
  result.exit_code = vflow::exit_code_of_status(status);
  return result;
}

EtcdCluster::EtcdCluster(int members, const std::string& options) {
  const auto r = run_command(fmt::format("{}/scripts/etcd-local.sh start {}/etcd --members {} {}",
                                         VFLOW_SOURCE_DIR, dir_.path(), members, options));
  if (r.exit_code != 0) throw std::runtime_error("etcd did not start: " + r.output);
  url_ = read_file(dir_.path() + "/etcd/endpoints");
  while (!url_.empty() && (url_.back() == '\n' || url_.back() == ' ')) url_.pop_back();
}

EtcdCluster::~EtcdCluster() {
  run_command(fmt::format("{}/scripts/etcd-local.sh stop {}/etcd", VFLOW_SOURCE_DIR, dir_.path()));
}

void EtcdCluster::script(const std::string& command, const std::string& args) {
  const auto r = run_command(fmt::format("{}/scripts/etcd-local.sh {} {}/etcd {}", VFLOW_SOURCE_DIR,
                                         command, dir_.path(), args));
  if (r.exit_code != 0) {
    throw std::runtime_error(fmt::format("etcd-local.sh {} failed: {}", command, r.output));
  }
}

SlurmCluster::SlurmCluster() {
  const auto r = run_command(
      fmt::format("{}/scripts/slurm-local.sh start {}/slurm", VFLOW_SOURCE_DIR, dir_.path()));
  if (r.exit_code != 0) throw std::runtime_error("Slurm did not start: " + r.output);
  conf_ = r.output.substr(r.output.rfind('\n', r.output.size() - 2) + 1);
  while (!conf_.empty() && (conf_.back() == '\n' || conf_.back() == ' ')) conf_.pop_back();
}

SlurmCluster::~SlurmCluster() {
  run_command(
      fmt::format("{}/scripts/slurm-local.sh stop {}/slurm", VFLOW_SOURCE_DIR, dir_.path()));
}

int64_t on_one_cpu(const std::function<int64_t()>& f) {
  cpu_set_t all;
  REQUIRE(sched_getaffinity(0, sizeof all, &all) == 0);
  int first = 0;
  while (!CPU_ISSET(first, &all)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  REQUIRE(sched_setaffinity(0, sizeof one, &one) == 0);
  struct Restore {
    const cpu_set_t& all;
    ~Restore() { sched_setaffinity(0, sizeof all, &all); }
  } restore{all};
  return f();
}

}  // namespace vflow::testing
