#include "vflow/scheduler/trace.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>

#include "vflow/core/error.h"
#include "vflow/scheduler/config.h"
#include "vflow/scheduler/workload.h"

using namespace vflow::scheduler;
using Catch::Matchers::Contains;

TEST_CASE("Gavel-style trace: good rows", "[unit][scheduler]") {
  std::istringstream in(
      "# job_type\ttotal_steps\tscale_factor\tpriority_weight\tarrival_time\n"
      "resnet50\t1000\t4\t1\t0\n"
      "\n"
      "ResNet-50 (batch size 64)\t2.5e3\t2\t5\t12.5\t1\t4\n");
  const auto records = read_gavel_trace(in, "t.tsv");
  REQUIRE(records.size() == 2);
  CHECK(records[0].model == "resnet50");
  CHECK(records[0].demand == 4);
  CHECK(records[1].model == "ResNet-50 (batch size 64)");
  CHECK(records[1].total_steps == 2500);
  CHECK(records[1].weight == 5);
  CHECK(records[1].arrival_s == 12.5);
  CHECK(records[1].max_workers == 4);
  CHECK(records[1].origin == "t.tsv:4");
}

TEST_CASE("Gavel-style trace: a bad row names file and line", "[unit][scheduler]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a\t10\t0\t1\t0\n", "t.tsv:2: field 3 (scale_factor)"},
      {"a\t-5\t1\t1\t0\n", "t.tsv:2: field 2 (total_steps)"},
      {"a\t10\t1\t1\n", "t.tsv:2: expected 5 to 7 fields, found 4"},
      {"a\t10\t1\tx\t0\n", "t.tsv:2: field 4 (priority_weight): 'x' is not a number"},
      {"a\t10\t2\t1\t0\t3\t4\n", "t.tsv:2: need min_workers <= scale_factor"},
      {"a\t10\t1\t1\t-1\n", "t.tsv:2: field 5 (arrival_time): negative"},
  };
  for (const auto& [row, message] : cases) {
    std::istringstream in("ok\t10\t1\t1\t0\n" + row);
    CHECK_THROWS_WITH(read_gavel_trace(in, "t.tsv"), Contains(message));
  }
  CHECK_THROWS_AS(read_gavel_trace("/nonexistent/trace.tsv"), vflow::DataError);
}

TEST_CASE("Philly CSV: header, shift to zero, bad rows", "[unit][scheduler]") {
  std::istringstream in("timestamp,duration,num_gpus\n1000,60,1\n990, 120 ,8\n");
  const auto records = read_philly_trace(in, "p.csv", "default");
  REQUIRE(records.size() == 2);
  CHECK(records[0].arrival_s == 10);
  CHECK(records[1].arrival_s == 0);
  CHECK(records[1].duration_s == 120);
  CHECK(records[1].demand == 8);
  std::istringstream bad("timestamp,duration,num_gpus\n0,60,1\n5,60,1.5\n");
  CHECK_THROWS_WITH(read_philly_trace(bad, "p.csv", "m"), Contains("p.csv:3: field 3 (num_gpus)"));
  std::istringstream short_row("0,60\n");
  CHECK_THROWS_WITH(read_philly_trace(short_row, "p.csv", "m"), Contains("p.csv:1: expected 3"));
}

TEST_CASE("binding rejects jobs that cannot run and converts durations", "[unit][scheduler]") {
  const Cluster cluster = Cluster::parse("4");
  ThroughputTable table;
  table.add("m", "gpu", ThroughputCurve::linear(2.0));
  JobRecord r;
  r.model = "m";
  r.duration_s = 100;
  r.demand = 2;
  const auto workload = bind_workload({r}, table, cluster);
  CHECK(workload.jobs[0].total_work == Approx(400));  // 100 s at 2 workers x 2 steps/s
  CHECK(workload.jobs[0].max_workers == 2);
  r.demand = 8;
  r.origin = "x.tsv:9";
  CHECK_THROWS_WITH(bind_workload({r}, table, cluster), Contains("x.tsv:9: demand 8"));
  ThroughputTable partial;
  partial.add("m", "v100", ThroughputCurve::linear(1.0));
  r.demand = 1;
  CHECK_THROWS_WITH(bind_workload({r}, partial, Cluster::parse("v100:2,k80:2")),
                    Contains("no throughput for device type 'k80'"));
}

TEST_CASE("throughput file: good and bad rows", "[unit][scheduler]") {
  std::istringstream in(
      "# comment\n"
      "table a v100 1 4\n"
      "table a v100 4 10\n"
      "amdahl b v100 2.0 0.5\n"
      "linear c k80 3\n");
  const auto table = ThroughputTable::parse(in, "tp.tsv");
  REQUIRE(table.find("a", "v100") != nullptr);
  CHECK(table.find("a", "v100")->at(2) == Approx(6));
  CHECK(table.find("b", "v100")->at(2) == Approx(2.0 / 0.75));
  CHECK(table.find("c", "k80")->at(3) == Approx(9));
  CHECK(table.models() == std::vector<std::string>{"a", "b", "c"});
  std::istringstream bad("table a v100 1 4\nspline a v100 1 2\n");
  CHECK_THROWS_WITH(ThroughputTable::parse(bad, "tp.tsv"), Contains("tp.tsv:2: unknown row kind"));
  std::istringstream dup("table a v100 1 4\ntable a v100 1 5\n");
  CHECK_THROWS_WITH(ThroughputTable::parse(dup, "tp.tsv"), Contains("tp.tsv:1"));
  std::istringstream frac("amdahl a v100 1 1.5\n");
  CHECK_THROWS_WITH(ThroughputTable::parse(frac, "tp.tsv"), Contains("tp.tsv:1: parallel"));
}

TEST_CASE("config file: keys apply, unknown keys name file and line", "[unit][scheduler]") {
  const std::string path = "sched_config_test.yaml";
  {
    std::ofstream out(path);
    out << "cluster: {v100: 4, k80: 2}\nrestart_s: 45\nlas_thresholds: [10, 20]\n";
  }
  SchedulerConfig config;
  load_config(path, config);
  CHECK(config.cluster == "v100:4,k80:2");
  CHECK(config.sim.restart_s == 45);
  CHECK(config.policy.las_thresholds == std::vector<double>{10, 20});
  {
    std::ofstream out(path);
    out << "restart_s: 45\nresize_pause: 3\n";
  }
  CHECK_THROWS_WITH(load_config(path, config), Contains(path + ":2:1: resize_pause: unknown key"));
  {
    std::ofstream out(path);
    out << "restart_s: -1\n";
  }
  CHECK_THROWS_WITH(load_config(path, config), Contains(":1:12: restart_s: must be >= 0"));
  std::remove(path.c_str());
}

TEST_CASE("cluster strings", "[unit][scheduler]") {
  CHECK(Cluster::parse("8").total_devices() == 8);
  const auto c = Cluster::parse("v100:36,p100:36,k80:36");
  CHECK(c.total_devices() == 108);
  CHECK(c.index_of("k80") == 2);
  CHECK(c.describe() == "v100:36,p100:36,k80:36");
  CHECK_THROWS_AS(Cluster::parse("v100:0"), vflow::SpecError);
  CHECK_THROWS_AS(Cluster::parse("v100:4,v100:4"), vflow::SpecError);
  CHECK_THROWS_AS(Cluster::parse("eight"), vflow::SpecError);
}
