// The control plane's records read back as written, a damaged record is an error naming
// its key, and a worker's launch environment is read with usage errors for what is wrong.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "job/control_records.h"
#include "vflow/core/error.h"
#include "vflow/job/environment.h"

namespace records = vflow::job::records;
using Catch::Matchers::Contains;

TEST_CASE("the control plane's records read back as written", "[unit]") {
  vflow::job::Generation g;
  g.members = {"w0", "w1", "w2"};
  g.donor = "w1";
  g.transfer_state = true;
  g.vnodes = {3, 4, 1};
  const auto back = records::decode_generation(7, records::encode_generation(g), "gen/7");
  CHECK(back.id == 7);
  CHECK(back.members == g.members);
  CHECK(back.donor == "w1");
  CHECK(back.transfer_state);
  CHECK_FALSE(back.stop);
  CHECK(back.vnodes == g.vnodes);

  const vflow::job::JobLimits limits{12, 2, 5};
  const auto l = records::decode_limits(records::encode_limits(limits), "limits");
  CHECK((l.virtual_nodes == 12 && l.min_workers == 2 && l.max_workers == 5));

  vflow::job::JobRecord job;
  job.device = "cuda";
  job.timeout = std::chrono::milliseconds(4500);
  job.replace_failed = true;
  const auto j = records::decode_job_record(records::encode_job_record(job), "job");
  CHECK(j.device == "cuda");
  CHECK(j.timeout == std::chrono::milliseconds(4500));
  CHECK(j.replace_failed);

  const std::map<std::string, double> speeds{{"cpu-2t", 0.25}, {"cuda-NVIDIA H100 80GB", 0.004}};
  CHECK(records::decode_profiled(records::encode_profiled(speeds), "speeds") == speeds);

  const auto e = records::decode_exit(records::encode_exit({3, "bad data in a.idx"}), "exit");
  CHECK(e.code == 3);
  CHECK(e.why == "bad data in a.idx");
  CHECK(records::decode_exit(records::encode_exit({0, ""}), "exit").why.empty());
}

TEST_CASE("a damaged record is an error naming its key, never a crash", "[unit]") {
  // What vflow never wrote: the store's fault, not the user's (exit code 1).
  const auto not_usage = [](auto decode) {
    try {
      decode();
    } catch (const vflow::SpecError&) {
      return false;
    } catch (const vflow::Error&) {
      return true;
    }
    return false;
  };
  CHECK_THROWS_WITH(records::decode_int("12x", "jobs/a/step"), Contains("jobs/a/step"));
  CHECK(not_usage([] { records::decode_int("", "k"); }));
  CHECK_THROWS_WITH(records::decode_generation(2, "w0|1|0", "gen/2"), Contains("gen/2"));
  CHECK_THROWS_WITH(records::decode_generation(2, "w0|1|0|w0,w1|3", "gen/2"),
                    Contains("vnode counts do not match the members"));
  CHECK_THROWS_WITH(records::decode_generation(2, "w0|1|0|w0|-4", "gen/2"),
                    Contains("out of range"));
  CHECK(not_usage([] { records::decode_limits("12 2", "limits"); }));
  CHECK(not_usage([] { records::decode_regroup_answer("sideways", "answer"); }));
  CHECK(not_usage([] { records::decode_placement("agent-only", "place"); }));
}

namespace {

/// Sets the launch variables for one scope; every one the tests use is cleared first.
class LaunchEnvironment {
 public:
  using Values = std::map<std::string, std::string>;
  explicit LaunchEnvironment(const Values& values) {
    for (const char* name : kNames) {
      if (const char* v = std::getenv(name)) saved_[name] = v;
      unsetenv(name);
    }
    for (const auto& [name, value] : values) setenv(name.c_str(), value.c_str(), 1);
  }
  ~LaunchEnvironment() {
    for (const char* name : kNames) unsetenv(name);
    for (const auto& [name, value] : saved_) setenv(name.c_str(), value.c_str(), 1);
  }
  LaunchEnvironment(const LaunchEnvironment&) = delete;
  LaunchEnvironment& operator=(const LaunchEnvironment&) = delete;

 private:
  static constexpr const char* kNames[] = {
      "VFLOW_RANK",   "VFLOW_WORLD_SIZE",     "VFLOW_STORE",
      "VFLOW_MEMBER", "VFLOW_CONTROL",        "VFLOW_JOB",
      "RANK",         "WORLD_SIZE",           "MASTER_ADDR",
      "MASTER_PORT",  "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
      "SLURM_PROCID", "SLURM_NTASKS"};
  std::map<std::string, std::string> saved_;
};

std::optional<vflow::comm::Rendezvous> rendezvous() {
  return vflow::job::rendezvous_from_environment(std::chrono::milliseconds(1000));
}

}  // namespace

TEST_CASE("a worker reads its launcher's environment, and what is wrong there is a usage error",
          "[unit]") {
  {
    LaunchEnvironment env({});
    CHECK_FALSE(rendezvous().has_value());
    CHECK_FALSE(vflow::job::elastic_worker_from_environment().has_value());
  }
  {
    LaunchEnvironment env(
        {{"VFLOW_RANK", "1"}, {"VFLOW_WORLD_SIZE", "3"}, {"VFLOW_STORE", "127.0.0.1:29500"}});
    const auto r = rendezvous();
    REQUIRE(r.has_value());
    CHECK(r->rank == 1);
    CHECK(r->world_size == 3);
    CHECK(r->store_host == "127.0.0.1");
    CHECK(r->store_port == 29500);
    CHECK_FALSE(r->host_store);
  }
  {
    LaunchEnvironment env(
        {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "1234"}});
    const auto r = rendezvous();
    REQUIRE(r.has_value());
    CHECK(r->host_store);  // torchrun's rank 0 hosts the store
    CHECK(r->store_host == "10.0.0.1");
  }
  const auto usage = [](const std::map<std::string, std::string>& values, const char* message) {
    LaunchEnvironment env(values);
    CAPTURE(message);
    CHECK_THROWS_AS(rendezvous(), vflow::SpecError);
    CHECK_THROWS_WITH(rendezvous(), Contains(message));
  };
  usage({{"VFLOW_RANK", "0"}}, "must be set together");
  usage({{"VFLOW_RANK", "x"}, {"VFLOW_WORLD_SIZE", "2"}, {"VFLOW_STORE", "127.0.0.1:1"}},
        "VFLOW_RANK='x' is not a non-negative integer");
  usage({{"VFLOW_RANK", "2"}, {"VFLOW_WORLD_SIZE", "2"}, {"VFLOW_STORE", "127.0.0.1:1"}},
        "rank 2 is not below the world size 2");
  usage({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}, "MASTER_ADDR and MASTER_PORT");
  {
    LaunchEnvironment env(LaunchEnvironment::Values{{"VFLOW_MEMBER", "w3"}});
    CHECK_THROWS_AS(vflow::job::elastic_worker_from_environment(), vflow::SpecError);
  }
  {
    LaunchEnvironment env({{"VFLOW_MEMBER", "w3"}, {"VFLOW_CONTROL", "etcd://127.0.0.1:2379"}});
    CHECK_THROWS_WITH(vflow::job::elastic_worker_from_environment(), Contains("VFLOW_JOB"));
  }
}
