#include "vflow/scheduler/policy.h"

#include <catch2/catch.hpp>
#include <limits>
#include <map>
#include <random>
#include <tuple>

#include "support.h"
#include "vflow/core/error.h"

using namespace vflow::scheduler;
using namespace vflow::scheduler::testing;

TEST_CASE("water fill splits by weight", "[unit][scheduler]") {
  CHECK(weighted_water_fill({1, 3}, {1, 1}, {8, 8}, 8) == std::vector<int>{2, 6});
  CHECK(weighted_water_fill({1, 1}, {1, 1}, {8, 8}, 8) == std::vector<int>{4, 4});
  // Not powers of two: 8 / 3 = 2.67 each; the two extra workers go to the first jobs.
  CHECK(weighted_water_fill({1, 1, 1}, {1, 1, 1}, {8, 8, 8}, 8) == std::vector<int>{3, 3, 2});
  CHECK(weighted_water_fill({1, 2, 4}, {1, 1, 1}, {7, 7, 7}, 7) == std::vector<int>{1, 2, 4});
}

TEST_CASE("water fill respects min and max and redistributes leftovers", "[unit][scheduler]") {
  // Job 1 wants 6 of 8 by weight but is capped at 3; the 3 left go to job 0.
  CHECK(weighted_water_fill({1, 3}, {1, 1}, {8, 3}, 8) == std::vector<int>{5, 3});
  // Job 0's weight gives it 1, its minimum is 4.
  CHECK(weighted_water_fill({1, 7}, {4, 1}, {8, 8}, 8) == std::vector<int>{4, 4});
  // Everyone capped below capacity: every job gets its max, devices stay idle.
  CHECK(weighted_water_fill({1, 1}, {1, 1}, {2, 3}, 8) == std::vector<int>{2, 3});
  CHECK(weighted_water_fill({}, {}, {}, 8).empty());
  // Sum of shares equals capacity for awkward weights.
  const auto shares =
      weighted_water_fill({0.3, 1.7, 2.9, 5.1, 0.01}, {1, 1, 1, 1, 1}, {13, 13, 13, 13, 13}, 13);
  CHECK(shares[0] + shares[1] + shares[2] + shares[3] + shares[4] == 13);
  CHECK(shares[4] == 1);
  CHECK_THROWS_AS(weighted_water_fill({1, 1}, {5, 5}, {8, 8}, 8), vflow::InternalError);
}

TEST_CASE("water fill of many jobs of a few weights and bounds is fair to one worker",
          "[unit][scheduler]") {
  // Thousands of jobs whose breakpoints fall on a few levels (the bucketed ordering) or on
  // many (the sorted one). After rounding, no worker can move from a job above its minimum
  // to one below its maximum and leave the receiver's share per weight still below the
  // giver's: (x_i + 1) / w_i > (x_j - 1) / w_j.
  std::mt19937_64 rng(7);
  for (int round = 0; round < 60; ++round) {
    const bool few = round % 2 == 0;
    const size_t n = 1 + rng() % 3000;
    std::vector<double> w(n);
    std::vector<int> lo(n), hi(n);
    long lo_sum = 0, hi_sum = 0;
    for (size_t i = 0; i < n; ++i) {
      w[i] = few ? std::vector<double>{1, 5}[rng() % 2] : 0.5 + (rng() % 1000) / 100.0;
      lo[i] = 1 + static_cast<int>(rng() % 2);
      hi[i] = lo[i] + std::vector<int>{0, 1, 3, 7}[rng() % 4];
      lo_sum += lo[i];
      hi_sum += hi[i];
    }
    const int capacity = static_cast<int>(lo_sum + rng() % (hi_sum - lo_sum + 10));
    const auto x = weighted_water_fill(w, lo, hi, capacity);
    long total = 0;
    double below = std::numeric_limits<double>::infinity(), above = 0;
    for (size_t i = 0; i < n; ++i) {
      REQUIRE(x[i] >= lo[i]);
      REQUIRE(x[i] <= hi[i]);
      total += x[i];
      if (x[i] < hi[i]) below = std::min(below, (x[i] + 1) / w[i]);
      if (x[i] > lo[i]) above = std::max(above, (x[i] - 1) / w[i]);
    }
    REQUIRE(total == std::min<long>(capacity, hi_sum));
    CHECK(below > above - 1e-6);
  }
}

TEST_CASE("elastic WFS gives weighted shares of a homogeneous cluster", "[unit][scheduler]") {
  const Cluster cluster({{"gpu", 8}});
  std::vector<Job> jobs = {linear_job(0, 0, 100, 4, 1, 8, 1), linear_job(1, 0, 100, 4, 1, 8, 3)};
  auto policy = make_policy("wfs-elastic");
  CHECK(policy->elastic());
  CHECK(workers_of(policy->allocate(cluster, views_of(jobs), 0), 2) == std::vector<int>{2, 6});
  // max_workers = demand caps job 1 at 4; job 0 takes the rest.
  jobs[1].max_workers = 4;
  CHECK(workers_of(policy->allocate(cluster, views_of(jobs), 0), 2) == std::vector<int>{4, 4});
}

TEST_CASE("elastic WFS admits by priority when minimums exceed the cluster", "[unit][scheduler]") {
  const Cluster cluster({{"gpu", 6}});
  std::vector<Job> jobs = {linear_job(0, 0, 100, 4, 4, 4, 1), linear_job(1, 1, 100, 2, 2, 6, 10),
                           linear_job(2, 2, 100, 3, 3, 6, 5)};
  // By weight: job 1 (10), job 2 (5), then job 0 (needs 4, only 1 left) waits.
  auto by_weight = make_policy("wfs-elastic")->allocate(cluster, views_of(jobs), 0);
  CHECK(workers_of(by_weight, 3) == std::vector<int>{0, 3, 3});
  // FIFO admits job 0 first, then job 1; job 2's minimum 3 does not fit.
  auto by_arrival = make_policy("wfs-fifo")->allocate(cluster, views_of(jobs), 0);
  CHECK(workers_of(by_arrival, 3) == std::vector<int>{4, 2, 0});
}

TEST_CASE("elastic WFS-SRTF favours the job with less work left", "[unit][scheduler]") {
  const Cluster cluster({{"gpu", 8}});
  std::vector<Job> jobs = {linear_job(0, 0, 1000, 4, 1, 8), linear_job(1, 0, 1000, 4, 1, 8)};
  auto views = views_of(jobs);
  views[1].remaining_work = 100;  // weight 10x job 0's
  const auto w = workers_of(make_policy("wfs-srtf")->allocate(cluster, views, 0), 2);
  CHECK(w[1] > w[0]);
  CHECK(w[0] + w[1] == 8);
}

TEST_CASE(
    "elastic WFS moves a running job to a type that is faster at its share, also where "
    "that type's curve falls before the job's bound",
    "[unit][scheduler]") {
  const Cluster cluster({{"a", 4}, {"b", 4}});
  // Job 0 (weight 3) runs fast only on b and goes there first. Job 1 runs on a, where its
  // share of 4 runs at 4 steps/s (5 with the migration gain). On b its share is 1 worker,
  // at 10 steps/s, though b's curve falls to 1 step/s at its bound of 4: it moves.
  std::vector<Job> jobs = {linear_job(0, 0, 100, 4, 1, 4, 3), linear_job(1, 0, 100, 4, 1, 4, 1)};
  jobs[0].throughput = make_curves({ThroughputCurve::linear(0.1), ThroughputCurve::linear(10.0)});
  jobs[1].throughput =
      make_curves({ThroughputCurve::linear(1.0), ThroughputCurve::table({{1, 10.0}, {4, 1.0}})});
  auto views = views_of(jobs);
  views[1].device_type = 0;
  views[1].workers = 2;
  using Placements = std::vector<std::pair<int, int>>;  // (type, workers) per job
  CHECK(placements_of(make_policy("wfs-elastic")->allocate(cluster, views, 0)) ==
        Placements{{1, 3}, {1, 1}});
  // Where b's curve is no faster than a's at any count, job 1 stays on a.
  jobs[1].throughput =
      make_curves({ThroughputCurve::linear(1.0), ThroughputCurve::table({{1, 4.0}, {4, 1.0}})});
  CHECK(placements_of(make_policy("wfs-elastic")->allocate(cluster, views, 0)) ==
        Placements{{1, 4}, {0, 4}});
}

TEST_CASE("the marginal policy runs the job nearest completion as wide as it can use",
          "[unit][scheduler]") {
  const Cluster cluster({{"gpu", 8}});
  // Linear scaling: every device advances job 1 (100 steps left) ten times as much as job 0,
  // so job 1 gets its maximum, 6, and job 0 the rest.
  std::vector<Job> jobs = {linear_job(0, 0, 1000, 4, 1, 8), linear_job(1, 0, 100, 4, 1, 6)};
  auto policy = make_policy("marginal");
  CHECK(policy->elastic());
  CHECK(workers_of(policy->allocate(cluster, views_of(jobs), 0), 2) == std::vector<int>{2, 6});
  // A minimum that does not fit beside the first job's maximum waits. Weights do not count:
  // the policy minimises the mean completion time.
  jobs[0].min_workers = 4;
  jobs[0].weight = 20;
  CHECK(workers_of(policy->allocate(cluster, views_of(jobs), 0), 2) == std::vector<int>{0, 6});
  // With 5000 steps left job 1 is the longer one: job 0 takes every device.
  auto views = views_of(jobs);
  views[1].remaining_work = 5000;
  CHECK(workers_of(policy->allocate(cluster, views, 0), 2) == std::vector<int>{8, 0});
}

TEST_CASE("the marginal policy spreads devices where a job's next worker gains little",
          "[unit][scheduler]") {
  const Cluster cluster({{"gpu", 8}});
  std::vector<Job> jobs = {linear_job(0, 0, 100, 8, 1, 8), linear_job(1, 0, 200, 8, 1, 8)};
  // Amdahl with p = 0.5: 1 worker 1 step/s, 2 workers 1.33, 8 workers 1.78. Job 0's second
  // worker adds 0.0033 of its work a second, job 1's first 0.005: job 1 runs too.
  for (auto& job : jobs) job.throughput = make_curves({ThroughputCurve::amdahl(1.0, 0.5)});
  const auto w = workers_of(make_policy("marginal")->allocate(cluster, views_of(jobs), 0), 2);
  CHECK(w[0] >= 1);
  CHECK(w[1] >= 1);
  CHECK(w[0] + w[1] == 8);
  CHECK(w[0] >= w[1]);
}

TEST_CASE("the marginal policy keeps a running job on its type and starts others on the fastest",
          "[unit][scheduler]") {
  const Cluster cluster({{"fast", 4}, {"slow", 4}});
  std::vector<Job> jobs = {linear_job(0, 0, 100, 2, 1, 4), linear_job(1, 0, 1000, 2, 1, 4)};
  for (auto& job : jobs) {
    job.throughput = make_curves({ThroughputCurve::linear(2.0), ThroughputCurve::linear(1.0)});
  }
  auto views = views_of(jobs);
  views[1].device_type = 1;  // job 1 runs on the slow type
  views[1].workers = 2;
  CHECK(placements_of(make_policy("marginal")->allocate(cluster, views, 0)) ==
        std::vector<std::pair<int, int>>{{0, 4}, {1, 4}});
}

TEST_CASE("marginal-span adds workers of other types where the split over them gains",
          "[unit][scheduler]") {
  // Job 0 wants 4 workers; only 2 fast ones exist. On 2 fast it runs at 4 steps/s; with 2
  // slow ones too, 8 vnodes split 6 / 2 (Job::mixed_rate) give 8 / 1.5 = 5.33 before the
  // cross-type overhead. One slow worker alone gives 4.57 before it.
  const Cluster cluster({{"fast", 2}, {"slow", 2}});
  std::vector<Job> jobs = {linear_job(0, 0, 100, 4, 1, 4)};
  jobs[0].throughput = make_curves({ThroughputCurve::linear(2.0), ThroughputCurve::linear(1.0)});
  jobs[0].vnodes = 8;
  const auto spans_at = [&](double overhead) {
    jobs[0].span_overhead = overhead;
    const auto a = make_policy("marginal-span")->allocate(cluster, views_of(jobs), 0);
    REQUIRE(a.assignments.size() == 1);
    CHECK(a.assignments[0].device_type == 0);
    CHECK(a.assignments[0].workers == 2);
    return a.spans;
  };
  const auto with_both = spans_at(0.0);
  REQUIRE(with_both.size() == 1);
  CHECK(with_both[0].job_id == 0);
  CHECK(with_both[0].device_type == 1);
  CHECK(with_both[0].workers == 2);
  // Overhead 0.2: one slow worker loses (4.57 / 1.2 = 3.81 < 4), two gain (4.44): the grant
  // is both at once.
  const auto two_at_once = spans_at(0.2);
  REQUIRE(two_at_once.size() == 1);
  CHECK(two_at_once[0].workers == 2);
  CHECK(spans_at(0.5).empty());  // 3.56 < 4: it stays on the fast type
  // The plain marginal policy never spans.
  CHECK(make_policy("marginal")->allocate(cluster, views_of(jobs), 0).spans.empty());
  // A waiting job that fits on the slow type gets it first.
  jobs[0].span_overhead = 0;
  jobs.push_back(linear_job(1, 0, 1000, 2, 1, 2));
  jobs[1].throughput = jobs[0].throughput;
  const auto shared = make_policy("marginal-span")->allocate(cluster, views_of(jobs), 0);
  CHECK(shared.spans.empty());
  CHECK(workers_of(shared, 2) == std::vector<int>{2, 2});
}

TEST_CASE("non-elastic policies run jobs at exactly their demand", "[unit][scheduler]") {
  const Cluster cluster({{"gpu", 8}});
  // Time at demand: job 0 25 s, job 1 50 s, job 2 25 s.
  std::vector<Job> jobs = {linear_job(0, 0, 100, 4, 1, 8, 1), linear_job(1, 1, 400, 8, 1, 8, 5),
                           linear_job(2, 2, 50, 2, 1, 8, 1)};
  // FIFO without backfilling: job 1 (8) blocks job 2.
  CHECK(workers_of(make_policy("fifo")->allocate(cluster, views_of(jobs), 0), 3) ==
        std::vector<int>{4, 0, 0});
  // Priority: job 1 first, nothing else fits.
  CHECK(workers_of(make_policy("priority")->allocate(cluster, views_of(jobs), 0), 3) ==
        std::vector<int>{0, 8, 0});
  // SRTF: jobs 0 and 2 (25 s each, ties by id) fit; job 1 (50 s) waits.
  CHECK(workers_of(make_policy("srtf")->allocate(cluster, views_of(jobs), 0), 3) ==
        std::vector<int>{4, 0, 2});
}

TEST_CASE("non-elastic placement prefers the fastest device type", "[unit][scheduler]") {
  const Cluster cluster({{"slow", 4}, {"fast", 4}});
  Job job = linear_job(0, 0, 100, 2, 1, 2);
  job.throughput = make_curves({ThroughputCurve::linear(1.0), ThroughputCurve::linear(3.0)});
  std::vector<Job> jobs = {job};
  const auto allocation = make_policy("priority")->allocate(cluster, views_of(jobs), 0);
  REQUIRE(allocation.assignments.size() == 1);
  CHECK(allocation.assignments[0].device_type == 1);
}

TEST_CASE("policy names", "[unit][scheduler]") {
  for (const auto& name : policy_names()) CHECK(make_policy(name)->name() == name);
  CHECK_THROWS_AS(make_policy("round-robin"), vflow::SpecError);
}

TEST_CASE("a policy's allocation depends on the jobs it sees, not on its earlier decisions",
          "[unit][scheduler]") {
  // Policies keep state between decisions to go faster (the previous ranking); a policy that
  // has decided 300 times must decide as a fresh one would. Jobs mix linear, Amdahl and a
  // table curve whose gains rise again (4 -> 8 workers), and minimums of 1 and 2.
  const Cluster cluster({{"a", 6}, {"b", 5}, {"c", 4}});
  const Curves table = make_curves(
      {ThroughputCurve::table({{1, 4.4}, {2, 7.9}, {4, 9.5}, {8, 17.3}}),
       ThroughputCurve::table({{1, 2.4}, {2, 4.4}, {4, 5.2}}), ThroughputCurve::linear(0.5)});
  const Curves amdahl =
      make_curves({ThroughputCurve::amdahl(3.0, 0.9), ThroughputCurve::amdahl(2.0, 0.95),
                   ThroughputCurve::amdahl(1.0, 0.8)});
  const Curves linear = make_curves(
      {ThroughputCurve::linear(1.0), ThroughputCurve::linear(1.5), ThroughputCurve::linear(0.7)});
  std::mt19937 random(7);
  const auto uniform = [&](int lo, int hi) {
    return lo + static_cast<int>(random() % static_cast<unsigned>(hi - lo + 1));
  };
  std::vector<Job> jobs;
  for (int id = 0; id < 400; ++id) {
    const int demand = uniform(1, 4);
    Job job = linear_job(id, id * 10.0, uniform(100, 5000), demand, uniform(1, std::min(2, demand)),
                         demand * uniform(1, 2), uniform(0, 3) == 0 ? 5 : 1);
    job.throughput = id % 3 == 0 ? table : id % 3 == 1 ? amdahl : linear;
    job.demand_rate = job.rate(0, demand);
    job.vnodes = 4 * job.max_workers;  // so that marginal-span can split jobs over types
    job.span_overhead = 0.1;
    jobs.push_back(job);
  }
  for (const auto& name : policy_names()) {
    DYNAMIC_SECTION(name) {
      auto policy = make_policy(name);
      std::vector<JobView> active;
      std::map<int, std::vector<int>> counts;  // workers per type of jobs on several types
      size_t spanned = 0;
      int next = 0;
      for (int step = 0; step < 300; ++step) {
        // A few jobs finish, a few arrive (ids ascending), the others advance.
        for (size_t i = active.size(); i-- > 0;) {
          if (uniform(0, 9) == 0) active.erase(active.begin() + static_cast<std::ptrdiff_t>(i));
        }
        for (int k = uniform(0, 3); k > 0 && next < static_cast<int>(jobs.size()); --k) {
          active.push_back({&jobs[next], jobs[next].total_work, 0, -1, 0});
          ++next;
        }
        for (auto& v : active) {
          if (v.workers > 0) v.remaining_work *= 0.9, v.attained_service += 60.0 * v.workers;
        }
        const double now = step * 60.0;
        const Allocation kept = policy->allocate(cluster, active, now);
        const Allocation fresh = make_policy(name)->allocate(cluster, active, now);
        REQUIRE(kept.assignments.size() == fresh.assignments.size());
        for (size_t k = 0; k < kept.assignments.size(); ++k) {
          const auto& a = kept.assignments[k];
          const auto& b = fresh.assignments[k];
          REQUIRE(std::tie(a.job_id, a.device_type, a.workers) ==
                  std::tie(b.job_id, b.device_type, b.workers));
        }
        REQUIRE(kept.spans.size() == fresh.spans.size());
        for (size_t k = 0; k < kept.spans.size(); ++k) {
          const auto& a = kept.spans[k];
          const auto& b = fresh.spans[k];
          REQUIRE(std::tie(a.job_id, a.device_type, a.workers) ==
                  std::tie(b.job_id, b.device_type, b.workers));
        }
        spanned += kept.spans.size();
        size_t k = 0, m = 0;  // the jobs run as allocated
        for (auto& v : active) {
          const bool held = k < kept.assignments.size() && kept.assignments[k].job_id == v.job->id;
          v.device_type = held ? kept.assignments[k].device_type : -1;
          v.workers = held ? kept.assignments[k].workers : 0;
          v.counts = nullptr;
          if (held) ++k;
          if (m < kept.spans.size() && kept.spans[m].job_id == v.job->id) {
            std::vector<int>& per_type = counts[v.job->id];
            per_type.assign(cluster.num_types(), 0);
            per_type[v.device_type] = v.workers;
            for (; m < kept.spans.size() && kept.spans[m].job_id == v.job->id; ++m) {
              per_type[kept.spans[m].device_type] = kept.spans[m].workers;
              v.workers += kept.spans[m].workers;
            }
            v.counts = per_type.data();
          }
        }
      }
      // The spanning policy must have split jobs over types here, or its check above is empty.
      if (name == "marginal-span") CHECK(spanned > 0);
    }
  }
}

TEST_CASE("marginal gives a fast type to the jobs it saves the most seconds", "[unit][scheduler]") {
  // One fast device (2 steps/s) and one slow one (1 step/s). The jobs the devices hold are
  // chosen shortest first, as in SRTF; among those the fast type goes to the job whose
  // remaining work it shortens most: the 20-step job (10 s saved) before the 10-step one
  // (5 s), and a long job before both.
  const Cluster cluster({{"fast", 1}, {"slow", 1}});
  const auto job_of = [](int id, double work) {
    Job job = linear_job(id, 0, work, 1, 1, 1);
    job.throughput = make_curves({ThroughputCurve::linear(2.0), ThroughputCurve::linear(1.0)});
    job.demand_rate = 2;
    return job;
  };
  const auto types_of = [&](const std::vector<Job>& jobs) {
    const Allocation a = make_policy("marginal")->allocate(cluster, views_of(jobs), 0);
    std::vector<int> type(jobs.size(), -1);
    for (const auto& x : a.assignments) type.at(x.job_id) = x.device_type;
    return type;
  };
  // The 1000-step job waits: the two shorter ones fill both devices.
  CHECK(types_of({job_of(0, 10), job_of(1, 20), job_of(2, 1000)}) == std::vector<int>{1, 0, -1});
  CHECK(types_of({job_of(0, 10), job_of(1, 1000)}) == std::vector<int>{1, 0});
  // On one type it is SRTF's choice of who runs.
  const Cluster one({{"gpu", 1}});
  std::vector<Job> jobs = {linear_job(0, 0, 1000, 1, 1, 1), linear_job(1, 0, 10, 1, 1, 1)};
  CHECK(workers_of(make_policy("marginal")->allocate(one, views_of(jobs), 0), 2) ==
        std::vector<int>{0, 1});
}

TEST_CASE("the marginal policy weighs the pause of resizing a running job", "[unit][scheduler]") {
  // Two devices, linear jobs (a step a second a worker). Job 0 runs on one worker with 100
  // steps left; job 1 waits with 110. Job 0's second worker saves it 50 s and job 1's first
  // saves 110 s of waiting, per step left alike: 1/100 against 1/110, so without pauses
  // job 0 grows. Growing costs job 0 a pause at its new rate of 2: with a 10 s pause, as if
  // 120 steps were left, and job 1 starts instead.
  const Cluster cluster({{"gpu", 2}});
  std::vector<Job> jobs = {linear_job(0, 0, 100, 1, 1, 2), linear_job(1, 0, 110, 1, 1, 2)};
  auto views = views_of(jobs);
  views[0].device_type = 0;
  views[0].workers = 1;
  const auto decide = [&](const std::string& policy, double restart_s, double pause_s) {
    PolicyOptions options;
    options.restart_s = restart_s;
    options.resize_pause_s = pause_s;
    return workers_of(make_policy(policy, options)->allocate(cluster, views, 0), 2);
  };
  for (const char* policy : {"marginal", "marginal-span"}) {
    CHECK(decide(policy, 0, 0) == std::vector<int>{2, 0});
    CHECK(decide(policy, 0, 10) == std::vector<int>{1, 1});
  }
  // Job 0 runs on both devices with 100 left; job 1 arrives with 95. Stopping job 0 costs a
  // 30 s restart, so its first worker stays (gain 1/70); its second gains 1/100 against job
  // 1's 1/95 and goes, unless keeping job 0 at two workers saves it a 10 s pause: 1/80.
  views[0].workers = 2;
  views[0].remaining_work = 100;
  views[1].remaining_work = 95;
  CHECK(decide("marginal", 30, 0) == std::vector<int>{1, 1});
  CHECK(decide("marginal", 30, 10) == std::vector<int>{2, 0});
  // The same where a waiting job's first grant is two workers (a long job here), which
  // takes the decision's other path (one grant at a time from a heap).
  jobs.push_back(linear_job(2, 0, 10000, 2, 2, 2));
  views = {views[0], views[1], views_of(jobs)[2]};
  views[0].job = &jobs[0];
  views[1].job = &jobs[1];
  const auto decide3 = [&](double pause_s) {
    PolicyOptions options;
    options.restart_s = 30;
    options.resize_pause_s = pause_s;
    return workers_of(make_policy("marginal", options)->allocate(cluster, views, 0), 3);
  };
  CHECK(decide3(0) == std::vector<int>{1, 1, 0});
  CHECK(decide3(10) == std::vector<int>{2, 0, 0});
}

TEST_CASE("the marginal policy stops a running job only where the restart it costs is worth it",
          "[unit][scheduler]") {
  // One device; job 0 runs with 100 s of work left, job 1 arrives with 80 s. Running job 1
  // first saves 100 - 80 s of the sum of completion times but costs job 0 its restart: SRTF
  // with a switching cost runs job 1 first only when 80 + restart < 100.
  const Cluster cluster({{"gpu", 1}});
  std::vector<Job> jobs = {linear_job(0, 0, 100, 1, 1, 1), linear_job(1, 10, 80, 1, 1, 1)};
  auto views = views_of(jobs);
  views[0].device_type = 0;
  views[0].workers = 1;
  const auto running = [&](double restart_s, const std::vector<JobView>& v) {
    PolicyOptions options;
    options.restart_s = restart_s;
    return workers_of(make_policy("marginal", options)->allocate(cluster, v, 10), 2);
  };
  CHECK(running(0, views) == std::vector<int>{0, 1});   // no cost: plain SRTF
  CHECK(running(10, views) == std::vector<int>{0, 1});  // 90 < 100: still worth it
  CHECK(running(30, views) == std::vector<int>{1, 0});  // 110 > 100: job 0 keeps running
  // A job that is not running gets no credit: with neither running, job 1 goes first.
  views[0].workers = 0;
  views[0].device_type = -1;
  CHECK(running(30, views) == std::vector<int>{0, 1});
  // Only marginal weighs it: srtf stops job 0 whatever the restart costs.
  views[0].workers = 1;
  views[0].device_type = 0;
  PolicyOptions options;
  options.restart_s = 30;
  CHECK(workers_of(make_policy("srtf", options)->allocate(cluster, views, 10), 2) ==
        std::vector<int>{0, 1});
  // A job's measured cost (live mode) replaces the estimate, and srtf still ignores it.
  views[0].restart_s = 10;
  CHECK(running(30, views) == std::vector<int>{0, 1});
  views[0].restart_s = 30;
  CHECK(running(10, views) == std::vector<int>{1, 0});
  CHECK(workers_of(make_policy("srtf", options)->allocate(cluster, views, 10), 2) ==
        std::vector<int>{0, 1});
  // An estimate of 0 weighs no restart, measured or not.
  CHECK(running(0, views) == std::vector<int>{0, 1});
}
