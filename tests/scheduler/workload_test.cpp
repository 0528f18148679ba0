#include "vflow/scheduler/workload.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <map>

#include "vflow/scheduler/throughput.h"

using namespace vflow::scheduler;

TEST_CASE("table throughput interpolates and extrapolates", "[unit][scheduler]") {
  const auto c = ThroughputCurve::table({{8, 17.3}, {1, 4.39}, {2, 7.92}, {4, 9.45}});
  CHECK(c.at(0) == 0);
  CHECK(c.at(1) == Approx(4.39));
  CHECK(c.at(3) == Approx((7.92 + 9.45) / 2));
  CHECK(c.at(6) == Approx((9.45 + 17.3) / 2));
  CHECK(c.at(16) == Approx(17.3 * 2));  // constant per-worker rate beyond the table
  const auto sparse = ThroughputCurve::table({{2, 6.0}});
  CHECK(sparse.at(1) == Approx(3.0));
  CHECK(ThroughputCurve::amdahl(2.0, 0.9).at(10) == Approx(2.0 / (0.1 + 0.09)));
  CHECK(ThroughputCurve::linear(1.5).at(4) == Approx(6));
}

TEST_CASE("Gavel-shape generator matches its distributions", "[unit][scheduler]") {
  SyntheticOptions o;
  o.num_jobs = 20000;
  o.jobs_per_hour = 30;
  o.seed = 11;
  const auto records = generate_synthetic(o);
  REQUIRE(records.size() == 20000);
  std::map<int, int> scales;
  int long_jobs = 0, high = 0;
  double log_sum = 0;
  for (const auto& r : records) {
    ++scales[r.demand];
    const double x = std::log10(r.duration_s / 60);
    REQUIRE(x >= 1.5);
    REQUIRE(x <= 4);
    long_jobs += x > 3;
    high += r.weight == 5;
    log_sum += x;
  }
  const double n = records.size();
  CHECK(scales[1] / n == Approx(0.70).margin(0.02));
  CHECK(scales[2] / n == Approx(0.10).margin(0.02));
  CHECK(scales[4] / n == Approx(0.15).margin(0.02));
  CHECK(scales[8] / n == Approx(0.05).margin(0.02));
  CHECK(long_jobs / n == Approx(0.2).margin(0.02));
  CHECK(high / n == Approx(0.2).margin(0.02));
  CHECK(log_sum / n == Approx(0.8 * 2.25 + 0.2 * 3.5).margin(0.03));
  // Poisson arrivals: mean gap 120 s at 30 jobs/hour.
  CHECK(records.back().arrival_s / n == Approx(120).epsilon(0.05));
}

TEST_CASE("generator is deterministic for a seed", "[unit][scheduler]") {
  SyntheticOptions o;
  o.shape = WorkloadShape::kPaper;
  o.models = {"a", "b"};
  const auto a = generate_synthetic(o), b = generate_synthetic(o);
  o.seed = 2;
  const auto c = generate_synthetic(o);
  bool same = true, differs = false;
  for (size_t i = 0; i < a.size(); ++i) {
    same = same && a[i].arrival_s == b[i].arrival_s && a[i].model == b[i].model &&
           a[i].duration_s == b[i].duration_s && a[i].weight == b[i].weight;
    differs = differs || a[i].arrival_s != c[i].arrival_s;
  }
  CHECK(same);
  CHECK(differs);
  for (const auto& r : a) CHECK((r.weight == 1 || r.weight == 5 || r.weight == 10));
}
