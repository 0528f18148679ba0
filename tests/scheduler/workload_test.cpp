#include "vflow/scheduler/workload.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <map>

#include "vflow/core/error.h"
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

TEST_CASE("a curve's peak is its highest rate at any count up to the one asked",
          "[unit][scheduler]") {
  // Rises to 10 at 2 workers, falls to 3 at 4, rises again towards 50 at 100.
  const auto c = ThroughputCurve::table({{1, 4.0}, {2, 10.0}, {4, 3.0}, {100, 50.0}});
  CHECK(c.peak(0) == 0);
  CHECK(c.peak(1) == 4.0);
  CHECK(c.peak(2) == 10.0);
  CHECK(c.peak(4) == 10.0);
  CHECK(c.peak(18) == 10.0);      // at(18) = 9.85
  CHECK(c.peak(19) == c.at(19));  // 10.34
  CHECK(c.peak(64) == c.at(64));
  CHECK(c.peak(80) == c.at(80));  // past the counts computed ahead
  CHECK(c.peak(200) == c.at(200));
  // Past those counts a table may fall again: its highest point stays the peak.
  const auto falls = ThroughputCurve::table({{1, 1.0}, {70, 100.0}, {90, 5.0}});
  CHECK(falls.peak(69) == falls.at(69));
  CHECK(falls.peak(95) == 100.0);
  CHECK(falls.at(95) < 6);
  const auto amdahl = ThroughputCurve::amdahl(2.0, 0.9);
  for (int n : {1, 7, 64, 65, 300}) CHECK(amdahl.peak(n) == amdahl.at(n));
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

TEST_CASE("a job's rate on several device types is the exact-mode split of its vnodes",
          "[unit][scheduler]") {
  Job job;
  job.throughput = make_curves({ThroughputCurve::linear(2.0), ThroughputCurve::linear(1.0)});
  job.vnodes = 3;
  const int one_each[] = {1, 1};
  // A step of the whole batch takes 0.5 s on a fast worker, 1 s on a slow one. Two of three
  // vnodes on the fast one: both types take 1/3 s, rate 3, the sum of the two.
  CHECK(job.mixed_rate(one_each, 2) == Approx(3.0));
  job.vnodes = 2;  // one vnode each: the slow worker takes 1/2 s, no gain over the fast alone
  CHECK(job.mixed_rate(one_each, 2) == Approx(2.0));
  job.vnodes = 3;
  job.span_overhead = 0.5;  // the synchronisation across types: 1.5x the step
  CHECK(job.mixed_rate(one_each, 2) == Approx(2.0));
  const int fast_only[] = {3, 0};  // on one type: its curve, no overhead
  CHECK(job.mixed_rate(fast_only, 2) == Approx(6.0));
  // 8 vnodes over 2 fast and 2 slow workers: 6 and 2 vnodes, 1.5 s and 1 s; 8 / 1.5.
  job.vnodes = 8;
  job.span_overhead = 0;
  const int two_each[] = {2, 2};
  CHECK(job.mixed_rate(two_each, 2) == Approx(8.0 / 1.5));
  const int too_many[] = {6, 3};  // more workers than vnodes
  CHECK_THROWS_AS(job.mixed_rate(too_many, 2), vflow::InternalError);
  // Any number of types: 17 here, one worker on the first and one on the last.
  Job wide;
  wide.throughput = make_curves(std::vector<ThroughputCurve>(17, ThroughputCurve::linear(1.0)));
  wide.vnodes = 4;
  std::vector<int> ends(17, 0);
  ends.front() = ends.back() = 1;
  CHECK(wide.mixed_rate(ends.data(), 17) == Approx(2.0));
}

TEST_CASE("binding gives each job its vnodes and the span overhead", "[unit][scheduler]") {
  const Cluster cluster = Cluster::parse("a:8,b:8");
  JobRecord r;
  r.demand = 2;
  r.duration_s = 100;
  BindOptions bind;
  bind.max_workers_factor = 4;
  bind.span_overhead = 0.25;
  Workload w = bind_workload({r}, ThroughputTable(), cluster, bind);
  CHECK(w.jobs[0].vnodes == 8);  // max(max_workers 8, 4 x demand 2)
  CHECK(w.jobs[0].span_overhead == 0.25);
  bind.vnodes_per_worker = 1;
  w = bind_workload({r}, ThroughputTable(), cluster, bind);
  CHECK(w.jobs[0].vnodes == 8);  // never fewer than max_workers
}
