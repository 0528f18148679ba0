// Child processes, started one way for the launcher and the scheduler.
#include "vflow/core/process.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "support.h"
#include "vflow/core/zygote.h"

namespace {
/// Runs `options` with standard output into a pipe; returns (exit code, output).
std::pair<int, std::string> run(vflow::SpawnOptions options) {
  int out[2];
  REQUIRE(pipe(out) == 0);
  options.stdout_fd = out[1];
  const pid_t pid = vflow::spawn_process(options);
  close(out[1]);
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = read(out[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  close(out[0]);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  return {vflow::exit_code_of_status(status), text};
}
}  // namespace

TEST_CASE("a spawned process gets its environment and only its standard streams", "[unit]") {
  // An inherited descriptor without close-on-exec, as a store socket would be, at a
  // number no child opens by itself.
  const int stray = 100;
  const int null = open("/dev/null", O_RDONLY);
  REQUIRE(dup2(null, stray) == stray);
  close(null);
  setenv("VFLOW_TEST_VALUE", "inherited", 1);  // the added value overrides this one
  vflow::SpawnOptions options;
  options.command = {"/bin/sh", "-c", "echo \"$VFLOW_TEST_VALUE\"; ls /proc/self/fd"};
  options.environment = {"VFLOW_TEST_VALUE=forty two"};
  const auto [code, text] = run(options);
  close(stray);
  unsetenv("VFLOW_TEST_VALUE");
  CHECK(code == 0);
  CHECK(text.rfind("forty two\n", 0) == 0);
  CHECK(text.find("\n0\n1\n2\n") != std::string::npos);
  CHECK(text.find("\n100\n") == std::string::npos);
}

TEST_CASE("a spawned process can lead a group of its own and is reported like a shell would",
          "[unit]") {
  vflow::SpawnOptions options;
  options.command = {"/bin/sh", "-c", "kill -TERM $$"};
  options.own_process_group = true;
  const pid_t pid = vflow::spawn_process(options);
  CHECK(getpgid(pid) == pid);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  CHECK(vflow::exit_code_of_status(status) == 128 + SIGTERM);

  vflow::SpawnOptions missing;
  missing.command = {"/nonexistent/program"};
  CHECK(run(missing).first == 127);
}

TEST_CASE("a cgroup's memory limit reads as bytes, and no limit as none", "[unit]") {
  using vflow::cgroup_memory_bytes;
  CHECK(cgroup_memory_bytes("1073741824\n") == 1073741824.0);  // v2 memory.max, v1 alike
  CHECK(cgroup_memory_bytes("max\n") == 0);
  CHECK(cgroup_memory_bytes("9223372036854771712\n") == 0);  // v1's none, rounded to a page
  CHECK(cgroup_memory_bytes("") == 0);
  CHECK(cgroup_memory_bytes("12k") == 0);
  CHECK(cgroup_memory_bytes("1 2") == 0);
  // This process's, whatever the machine sets: none, or a limit below 2^62 bytes.
  const double limit = vflow::cgroup_memory_limit();
  CHECK(limit >= 0);
  CHECK(limit < 4.7e18);
}

TEST_CASE("a cgroup's CPU quota reads as cores, and no limit as none", "[unit]") {
  using vflow::cgroup_quota_cores;
  CHECK(cgroup_quota_cores("50000 100000\n") == 0.5);  // cgroup v2 cpu.max
  CHECK(cgroup_quota_cores("250000 100000") == 2.5);
  CHECK(cgroup_quota_cores("max 100000\n") == 0);
  CHECK(cgroup_quota_cores("-1\n 100000\n") == 0);  // cgroup v1: no quota
  CHECK(cgroup_quota_cores("5000\n 10000\n") == 0.5);
  CHECK(cgroup_quota_cores("") == 0);  // unreadable files
  CHECK(cgroup_quota_cores(" ") == 0);
  CHECK(cgroup_quota_cores("12x 100000") == 0);
  CHECK(cgroup_quota_cores("50000 0") == 0);
}

TEST_CASE("a cgroup's path is found below the root its hierarchy is mounted from", "[unit]") {
  using vflow::cgroup_path_in_mount;
  CHECK(cgroup_path_in_mount("/", "/vflow-9-1") == "/vflow-9-1");
  // A v1 container without its own cgroup namespace: the host's path, mounted from below.
  CHECK(cgroup_path_in_mount("/docker/abc", "/docker/abc/vflow-9-1") == "/vflow-9-1");
  CHECK(cgroup_path_in_mount("/docker/abc", "/docker/abc") == "/");
  // Not below the mount's root: that hierarchy does not show this cgroup.
  CHECK_FALSE(cgroup_path_in_mount("/docker/abc", "/docker/abcd/x").has_value());
  CHECK_FALSE(cgroup_path_in_mount("/docker/abc", "/other").has_value());
}

TEST_CASE("the usable cores follow the CPU affinity", "[unit]") {
  cpu_set_t all;
  REQUIRE(sched_getaffinity(0, sizeof all, &all) == 0);
  const int64_t allowed = CPU_COUNT(&all);
  CHECK(vflow::usable_cores() >= 1);
  CHECK(vflow::usable_cores() <= allowed);
  CHECK(vflow::testing::on_one_cpu([] { return vflow::usable_cores(); }) == 1);
  cpu_set_t after;  // and the affinity is the whole mask again
  REQUIRE(sched_getaffinity(0, sizeof after, &after) == 0);
  CHECK(CPU_EQUAL(&after, &all));
}

TEST_CASE("a child is forked from the zygote only where the environment leaves it as executed",
          "[unit]") {
  const std::vector<std::string> start{"PATH=/usr/bin", "OMP_NUM_THREADS=2", "VFLOW_STORE=a:1"};
  // The engine's own variables are read once main runs: they may differ.
  CHECK(vflow::fork_runs_as_executed(
      {"PATH=/usr/bin", "OMP_NUM_THREADS=2", "VFLOW_STORE=b:2", "VFLOW_MEMBER=3"}, start));
  // Others may be read as the libraries load, which a fork does not repeat.
  CHECK_FALSE(vflow::fork_runs_as_executed(
      {"PATH=/usr/bin", "OMP_NUM_THREADS=1", "VFLOW_STORE=a:1"}, start));
  CHECK_FALSE(vflow::fork_runs_as_executed(
      {"PATH=/usr/bin", "OMP_NUM_THREADS=2", "OPENBLAS_CORETYPE=Haswell"}, start));
  CHECK_FALSE(vflow::fork_runs_as_executed({"PATH=/usr/bin", "VFLOW_STORE=a:1"}, start));
  // This test program started no zygote: its children are executed.
  CHECK_FALSE(vflow::started_by_zygote());
  vflow::SpawnOptions options;
  options.command = {vflow::this_executable(""), "--help"};
  CHECK_FALSE(vflow::spawn_from_zygote(options, start).has_value());
}
