// vflow-profile and vflow-plan as a user runs them: profile two CPU device types, plan a
// split, and run the printed layout.
#include <catch2/catch.hpp>

#include "apps/multiworker_support.h"
#include "support.h"

using namespace vflow::testing;

namespace {
const std::string kProfile = VFLOW_PROFILE_BINARY;
const std::string kPlan = VFLOW_PLAN_BINARY;
}  // namespace

TEST_CASE("profiles, a plan and its printed layout run as a job", "[integration][hetero]") {
  TempDir dir;
  // The default name says how the type runs; a second type with a name of its own.
  const auto fast = run_command(kProfile + kJob + " --sizes 2,4 --repeats 2 --out " +
                                dir.file("fast.yaml") + " 2>&1");
  INFO(fast.output);
  REQUIRE(fast.exit_code == 0);
  CHECK_THAT(fast.output, Catch::Matchers::Contains("device type cpu-1t,"));
  const auto slow =
      run_command(kProfile + kJob + " --device cpu --device-type slow" +
                  " --sizes 2,4 --repeats 2 --out " + dir.file("slow.yaml") + " 2>&1");
  INFO(slow.output);
  REQUIRE(slow.exit_code == 0);
  CHECK_THAT(read_file(dir.file("slow.yaml")),
             Catch::Matchers::Contains("device_type: slow\n") &&
                 Catch::Matchers::Contains("device: cpu\nthreads: 1\n"));

  const auto plan =
      run_command(kPlan + kJob + " --profile " + dir.file("fast.yaml") + " --profile " +
                  dir.file("slow.yaml") + " --devices cpu-1t:1 --devices slow:1 2>&1");
  INFO(plan.output);
  REQUIRE(plan.exit_code == 0);
  const auto at = plan.output.find("resources:\n");
  const auto end = plan.output.find("baselines:");
  REQUIRE(at != std::string::npos);
  REQUIRE(end != std::string::npos);
  const std::string resources = plan.output.substr(at, end - at);
  CHECK_THAT(resources, Catch::Matchers::Contains("device: cpu, threads: 1}"));
  // The printed part is the job's resources part as it stands.
  write_file(dir.file("job.yaml"), resources);
  const auto run = run_command(kTrain + " " + dir.file("job.yaml") + kJob + " 2>&1");
  INFO(run.output);
  CHECK(run.exit_code == 0);
  CHECK_THAT(run.output, Catch::Matchers::Contains("[worker 0]"));  // through the launcher
  CHECK(fingerprints_in(run.output).size() == 1);
}

TEST_CASE("profiling a device this machine lacks is refused clearly", "[integration][hetero]") {
  TempDir dir;
  const auto r =
      run_command(kProfile + kJob + " --device cuda:99 --out " + dir.file("p.yaml") + " 2>&1");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Matchers::Contains("resources.device: ") &&
                           Catch::Matchers::Contains("cuda:99"));
  CHECK(run_command("test -e " + dir.file("p.yaml")).exit_code != 0);
}
