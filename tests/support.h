// Helpers shared by the tests: temporary directories, small jobs, running the CLI.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "vflow/comm/communicator.h"
#include "vflow/engine/job_spec.h"
#include "vflow/job/launcher.h"

namespace vflow::testing {

/// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

void write_file(const std::string& path, const std::string& content);
/// Writes `tokens` as an llm.c token shard: a header of 256 int32 (`magic`, `version`, the
/// token count, or `count` where it is not negative) and the tokens as uint16.
void write_llmc_shard(const std::string& path, const std::vector<uint16_t>& tokens,
                      int32_t magic = 20240520, int32_t version = 1, int64_t count = -1);
std::string read_file(const std::string& path);

/// The numerically sensitive tests ([numeric]) must hold on any x86-64 CPU, BLAS kernel and
/// thread count (docs/testing.md). VFLOW_TEST_THREADS, set by hand for that check only,
/// replaces the intra-op thread count of small_job() and of the command lines that add
/// threads_flag().
std::string threads_flag();

/// A small job on synthetic data (fast enough for unit tests), validated.
engine::JobSpec small_job(const std::vector<std::string>& overrides = {});

struct CommandResult {
  int exit_code = -1;
  std::string output;  ///< stdout and stderr together
};
/// Exports one of scripts/export_torchscript.py's example models to `path` with
/// Python's torch (a test dependency) and returns `path`; fails the test if it cannot.
std::string export_torchscript(const std::string& model, const std::string& path);

/// Where rank `rank` of `size` meets its peers at a test coordinator, for generation
/// `generation` (a fresh store prefix), giving up after `timeout_ms`.
comm::Rendezvous rendezvous_at(const job::StoreHost& coordinator, int rank, int size,
                               const std::string& generation, int timeout_ms = 10000);

/// Runs `body(rank, communicator)` for ranks 0 .. ranks-1 of a Gloo group, each in a
/// thread of its own, over `coordinator`'s store. Returns each rank's error message, empty
/// where the rank finished without one. `shared_memory`: Rendezvous::shared_memory.
std::vector<std::string> run_gloo_ranks(const job::StoreHost& coordinator, int ranks,
                                        const std::string& generation,
                                        const std::function<void(int, comm::Communicator&)>& body,
                                        bool shared_memory = true);

/// ctest's SKIP_RETURN_CODE for the test programs' cases.
constexpr int kSkipped = 77;

/// The running test case cannot run on this machine: prints "SKIPPED: why". Under ctest
/// (VFLOW_TEST_SKIP_EXIT set, one test case a process) it ends the process with kSkipped,
/// so that ctest lists the test as skipped, never as passed; run by hand it returns after
/// a Catch2 warning, and the caller returns, so that the other test cases go on.
void skip_test(const std::string& why);

/// A TCP port on 127.0.0.1 that was free a moment ago.
int free_port();

/// `f()` with this thread's CPU affinity narrowed to one CPU (the first it may use), as
/// taskset -c would start a process; the affinity is restored before it returns or throws.
int64_t on_one_cpu(const std::function<int64_t()>& f);

/// Runs a shell command and captures its output.
CommandResult run_command(const std::string& command);

/// A real etcd cluster on loopback (Debian's etcd-server, through scripts/etcd-local.sh)
/// in a temporary directory, stopped when the object dies. Throws, failing the test
/// visibly, when it cannot start (etcd not installed, say).
class EtcdCluster {
 public:
  /// `members` members; `options` as etcd-local.sh start takes them ("--tls --auth PW").
  explicit EtcdCluster(int members = 1, const std::string& options = "");
  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;
  /// etcd://H:P,... (etcds:// with TLS), as --control takes it.
  const std::string& url() const { return url_; }
  const std::string& dir() const { return dir_.path(); }
  /// Runs `etcd-local.sh COMMAND DIR ARGS`; throws when it fails.
  void script(const std::string& command, const std::string& args = "");

 private:
  TempDir dir_;
  std::string url_;
};

/// A real single-machine Slurm (Debian's munge, slurmctld and slurmd, through
/// scripts/slurm-local.sh) in a temporary directory, stopped when the object dies. Throws,
/// failing the test visibly, when it cannot start.
class SlurmCluster {
 public:
  SlurmCluster();
  ~SlurmCluster();
  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;
  /// "SLURM_CONF=<its slurm.conf> ": put before sbatch, squeue, scancel.
  std::string env() const { return "SLURM_CONF=" + conf_ + " "; }

 private:
  TempDir dir_;
  std::string conf_;
};

}  // namespace vflow::testing
