// A worker's CPU quota (a cgroup of its own) counts in the cores it may use.
#include "vflow/hetero/cpu_quota.h"

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <exception>
#include <string>

#include "support.h"
#include "vflow/core/process.h"

namespace {
/// In a child process (the test runner stays in its cgroup): the usable cores under a
/// quota of `cores`, or -1 where this machine cannot set a quota (no cpu controller, not
/// root).
int64_t usable_cores_under(double cores) {
  const std::string name = "vflow-test-quota-" + std::to_string(::getpid());
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int code = 0;
    try {
      vflow::hetero::apply_cpu_quota(cores, name);
      code = static_cast<int>(std::min<int64_t>(vflow::usable_cores(), 100));
      vflow::hetero::release_cpu_quota(name);
    } catch (const std::exception&) {
      code = 255;
    }
    _exit(code);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  return WEXITSTATUS(status) == 255 ? -1 : WEXITSTATUS(status);
}
}  // namespace

TEST_CASE("a CPU quota bounds the usable cores, rounded up", "[integration][hetero]") {
  cpu_set_t all;
  REQUIRE(sched_getaffinity(0, sizeof all, &all) == 0);
  const int64_t allowed = CPU_COUNT(&all);
  const int64_t half = usable_cores_under(0.5);
  if (half < 0) {
    vflow::testing::skip_test(
        "this machine cannot set a CPU quota (no cgroup cpu controller, or not root)");
    return;
  }
  CHECK(half == 1);
  // The group is made at the hierarchy's root: a runner under a quota of its own (a slice,
  // a container's limit) may keep it or leave it there, so only a free runner gets exact
  // counts.
  const int64_t here = vflow::usable_cores();
  CHECK(here <= allowed);
  if (here == allowed) {
    CHECK(usable_cores_under(1.5) == std::min<int64_t>(allowed, 2));
    CHECK(usable_cores_under(64.0) == std::min<int64_t>(allowed, 64));
  } else {
    CHECK(usable_cores_under(1.5) <= 2);
    CHECK(usable_cores_under(64.0) <= std::min<int64_t>(allowed, 64));
  }
}
