// vflow-profile and vflow-plan as a user runs them: profile two CPU device types, plan a
// split, and run the printed layout.
#include <catch2/catch.hpp>
#include <map>
#include <sstream>

#include "apps/multiworker_support.h"
#include "support.h"
#include "vflow/hetero/profile.h"

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
  CHECK(vflow::hetero::load_profile(dir.file("slow.yaml")).gradient_bytes > 0);
  // How much a step varies, from the timed steps (two timings alike to the nanosecond
  // would give 0).
  for (const auto& point : vflow::hetero::load_profile(dir.file("fast.yaml")).points) {
    CHECK(point.spread > 0);
    CHECK(point.spread < 10);
  }

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

  // The same profiles as the scheduler's throughput rows: one worker runs all 12 vnodes of 4
  // and the optimizer step; more workers never run slower (the plan may leave some idle).
  const auto rows = run_command(kPlan + kJob + " --profile " + dir.file("fast.yaml") +
                                " --profile " + dir.file("slow.yaml") + " --throughput convnet:3");
  INFO(rows.output);
  REQUIRE(rows.exit_code == 0);
  std::istringstream in(rows.output);
  std::map<std::string, std::vector<double>> rates;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string kind, model, type;
    int workers = 0;
    double rate = 0;
    REQUIRE(fields >> kind >> model >> type >> workers >> rate);
    CHECK(kind == "table");
    CHECK(model == "convnet");
    CHECK(workers == static_cast<int>(rates[type].size()) + 1);
    rates[type].push_back(rate);
  }
  REQUIRE(rates.size() == 2);
  for (const char* type : {"cpu-1t", "slow"}) {
    const auto profile = vflow::hetero::load_profile(
        dir.file(type == std::string("slow") ? "slow.yaml" : "fast.yaml"));
    REQUIRE(rates[type].size() == 3);
    CHECK(rates[type][0] ==
          Approx(1 / (12 * profile.vnode_seconds(4) + profile.optimizer_seconds)).epsilon(1e-6));
    CHECK(rates[type][1] >= rates[type][0]);
    CHECK(rates[type][2] >= rates[type][1]);
  }
  const auto bad = run_command(kPlan + kJob + " --profile " + dir.file("fast.yaml") +
                               " --throughput convnet:0 2>&1");
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.output, Catch::Matchers::Contains("--throughput: 'convnet:0'"));
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
