// A worker's step watch (job/step_watch.h) fetches what rank 0 relays in the control word
// off the step's critical path: the stop request and the latest generation, seen through
// the news counter; it publishes the step and the measured speed; and it says when the
// store is lost. Checked on the embedded store a real coordinator hosts (its poll) and on
// a real etcd (its watch).
#include "job/step_watch.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <thread>

#include "support.h"
#include "vflow/job/launcher.h"

using namespace std::chrono_literals;
using vflow::job::ControlPlane;
using vflow::job::StepWatch;

namespace {

/// Whether `condition` holds within `limit` (checked every 10 ms).
bool within(std::chrono::milliseconds limit, const std::function<bool()>& condition) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

vflow::job::Generation generation(int64_t id) {
  vflow::job::Generation g;
  g.id = id;
  g.members = {"m0", "m1"};
  g.donor = "m0";
  return g;
}

/// The watch's contract on one store: `control` is the coordinator's client, `watch` was
/// given a client of its own.
void relays_the_news(ControlPlane& control, StepWatch& watch) {
  control.publish_limits({4, 1, 4});  // the job has started
  CHECK_FALSE(watch.stop_requested());
  CHECK(watch.latest_generation() == 0);
  // Not rank 0: it publishes its speed, and does not follow the news.
  watch.report(/*rank0=*/false, 3, {0.02, 0.005});
  REQUIRE(within(10s, [&] { return control.speed("m1").has_value(); }));
  CHECK(control.speed("m1")->seconds_per_vnode == Approx(0.02));
  control.publish(generation(1));
  std::this_thread::sleep_for(300ms);
  CHECK(watch.latest_generation() == 0);
  // Rank 0: it follows the news and publishes the step.
  watch.report(/*rank0=*/true, 4, {0.02, 0.005});
  REQUIRE(within(10s, [&] { return watch.latest_generation() == 1; }));
  CHECK(within(10s, [&] { return control.status().step == 4; }));
  control.publish(generation(2));
  CHECK(within(10s, [&] { return watch.latest_generation() == 2; }));
  CHECK_FALSE(watch.stop_requested());
  control.request_stop();
  CHECK(within(10s, [&] { return watch.stop_requested(); }));
  CHECK(watch.lost().empty());
}

}  // namespace

TEST_CASE(
    "the step watch relays stop requests and generations from the embedded store, and "
    "says when the store is lost",
    "[unit]") {
  auto host = std::make_unique<vflow::job::StoreHost>("127.0.0.1", 0, 5s);
  ControlPlane control(vflow::job::connect_embedded_store("127.0.0.1", host->port(), 5s));
  StepWatch watch(ControlPlane(vflow::job::connect_embedded_store("127.0.0.1", host->port(), 5s)),
                  "m1");
  relays_the_news(control, watch);
  host.reset();  // the coordinator dies
  REQUIRE(within(20s, [&] { return !watch.lost().empty(); }));
  CHECK_THAT(watch.lost(), Catch::Contains("127.0.0.1"));
}

TEST_CASE("the step watch relays stop requests and generations from etcd, through a watch",
          "[unit][etcd]") {
  vflow::testing::EtcdCluster etcd;
  auto control = ControlPlane::on_cluster(etcd.url(), "job-w", 5s);
  StepWatch watch(ControlPlane::on_cluster(etcd.url(), "job-w", 5s), "m1");
  relays_the_news(control, watch);
}
