// The generation manager on a cluster store takes over from a coordinator that died: it
// resumes from what the store holds, announces a generation its predecessor decided but
// did not announce, and keeps the joiners the predecessor recorded. On the embedded store a
// real coordinator hosts, as the protocol is the same.
#include "vflow/job/generation_manager.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "job/control_records.h"
#include "vflow/job/launcher.h"

using namespace std::chrono_literals;

namespace {

/// A coordinator's store and a client of it, and options for a job of 12 vnodes.
struct Job {
  vflow::job::StoreHost coordinator{"127.0.0.1", 0, 5s};
  vflow::job::ControlPlane control{
      vflow::job::connect_embedded_store("127.0.0.1", coordinator.port(), 5s)};
  vflow::job::ElasticOptions options = [] {
    vflow::job::ElasticOptions o;
    o.limits = {12, 1, 12};
    o.timeout = 5s;
    return o;
  }();
};

}  // namespace

TEST_CASE("a coordinator taking over announces what its predecessor decided and keeps its joiners",
          "[unit]") {
  Job job;
  auto& control = job.control;
  auto& options = job.options;
  options.cluster = true;
  {
    vflow::job::GenerationManager first(control, options, nullptr);
    first.start({"0", "1"});
    for (const auto* m : {"0", "1"}) {
      control.store().heartbeat(vflow::job::ControlPlane::liveness_name(m), 30s);
      control.mark_ready(m, 1);
    }
    first.tick();
    REQUIRE(first.current().id == 1);
    control.mark_joined(1, "0");
    control.mark_joined(1, "1");
    control.set_target(3);
  }  // it dies having decided generation 2 (a joiner came in) but before announcing it
  vflow::job::Generation decided;
  decided.id = 2;
  decided.members = {"0", "1", "2"};
  decided.donor = "0";
  decided.transfer_state = true;
  control.store().set_if_absent("elastic/2/generation",
                                vflow::job::records::encode_generation(decided));
  control.add_joiner("3");  // and had placed one more worker
  control.store().heartbeat(vflow::job::ControlPlane::liveness_name("2"), 30s);
  control.store().heartbeat(vflow::job::ControlPlane::liveness_name("3"), 30s);
  CHECK(control.latest_generation() == 1);

  vflow::job::GenerationManager next(control, options, nullptr);
  next.resume();
  CHECK(next.current().id == 2);
  CHECK(next.current().members == std::vector<std::string>{"0", "1", "2"});
  CHECK(control.latest_generation() == 2);  // announced: the workers see it now
  // Its joiner is this coordinator's: once ready, it joins at the next change.
  CHECK(control.joiners() == std::vector<std::string>{"3"});
  // Deciding the same generation again adopts the one that stands.
  vflow::job::Generation other = decided;
  other.members = {"1", "0"};
  CHECK(control.publish(other).members == decided.members);
}

TEST_CASE(
    "a resize splits the vnodes by measured speeds, and by profiles for members not yet "
    "measured, also after a coordinator takes over",
    "[unit]") {
  Job job;
  auto& control = job.control;
  auto& options = job.options;
  options.profiled = {{"fast type", 0.01}};
  const auto join = [&](const std::string& member, const char* type) {
    control.volunteer(member);  // a worker started elsewhere: it raises the target by one
    control.publish_device_type(member, type);
    control.mark_ready(member, 1);
  };
  const auto establish = [&](const vflow::job::Generation& g) {
    for (const auto& m : g.members) control.mark_joined(g.id, m);
  };
  vflow::job::GenerationManager first(control, options, nullptr);
  first.start({"0", "1"});
  for (const auto* m : {"0", "1"}) control.mark_ready(m, 1);
  first.tick();
  REQUIRE(first.current().id == 1);
  CHECK(first.current().vnodes.empty());  // no layout: the first generation splits evenly
  establish(first.current());
  control.publish_speed("0", {0.04, 0.01});  // both measured at 40 ms per vnode
  control.publish_speed("1", {0.04, 0.01});
  join("2", "fast type");  // not measured yet; its type's profile says 10 ms
  first.tick();
  REQUIRE(first.current().id == 2);
  // As fast as the fastest member (the rule without a profile) it would get [4, 4, 4].
  CHECK(first.current().vnodes == std::vector<int64_t>{2, 2, 8});
  CHECK(control.profiled() == options.profiled);
  establish(first.current());

  // A coordinator taking over plans with the profiles the store holds.
  vflow::job::ElasticOptions bare = options;
  bare.profiled.clear();
  vflow::job::GenerationManager next(control, bare, nullptr);
  next.resume();
  join("3", "fast type");
  join("4", "unprofiled type");  // neither measured nor profiled: as the fastest
  next.tick();
  REQUIRE(next.current().id == 3);
  CHECK(next.current().members == std::vector<std::string>{"0", "1", "2", "3", "4"});
  CHECK(next.current().vnodes == std::vector<int64_t>{1, 1, 4, 3, 3});
}

TEST_CASE("a member's speed record carries its update time and reads one without it", "[unit]") {
  Job job;
  job.control.publish_speed("new", {0.04, 0.01});
  const auto speed = job.control.speed("new");
  REQUIRE(speed);
  CHECK(speed->seconds_per_vnode == Approx(0.04));
  CHECK(speed->update_seconds == Approx(0.01));
  // A worker of an earlier version published the per-vnode time alone: no update time.
  const auto raw = vflow::job::connect_embedded_store("127.0.0.1", job.coordinator.port(), 5s);
  raw->set("speed/old", "0.02");
  const auto old = job.control.speed("old");
  REQUIRE(old);
  CHECK(old->seconds_per_vnode == Approx(0.02));
  CHECK(old->update_seconds == 0);
  raw->set("speed/bad", "fast");
  CHECK_FALSE(job.control.speed("bad"));
  CHECK_FALSE(job.control.speed("none"));
}

namespace {

/// A job whose members 0 and 1 form the first generation (both ready), with a manager that
/// waits 200 ms for reports.
struct FirstGeneration {
  Job job;
  vflow::job::ControlPlane& control = job.control;
  vflow::job::GenerationManager manager{control, quick(job.options), nullptr};
  FirstGeneration() {
    manager.start({"0", "1"});
    for (const auto* m : {"0", "1"}) control.mark_ready(m, 1);
    manager.tick();
    REQUIRE(manager.current().id == 1);
  }
  static const vflow::job::ElasticOptions& quick(vflow::job::ElasticOptions& options) {
    options.timeout = 200ms;
    return options;
  }
};

}  // namespace

TEST_CASE(
    "after a failure a member that had not joined yet gives no state: the members holding it "
    "are awaited, and without them the job fails instead of starting again",
    "[unit]") {
  // Generation 2 of members 0, 1 and 2, where 2 had just been added (it holds no state of
  // the job). Member 1 dies while they regroup, and 2 reports first, without state (-1).
  enum class Then { kHolderReports, kHolderNeverReports };
  for (const auto then : {Then::kHolderReports, Then::kHolderNeverReports}) {
    CAPTURE(then == Then::kHolderReports);
    FirstGeneration job;
    auto& control = job.control;
    auto& manager = job.manager;
    for (const auto* m : {"0", "1"}) control.mark_joined(1, m);
    control.volunteer("2");
    control.mark_ready("2", 1);
    manager.tick();
    REQUIRE(manager.current().id == 2);
    REQUIRE(manager.current().members == std::vector<std::string>{"0", "1", "2"});

    manager.on_exit("1", 137);
    control.report_survivor(2, "2", -1);
    manager.tick();
    std::this_thread::sleep_for(300ms);  // past the timeout, not past three
    manager.tick();
    // Before, member 2 became the donor here: the job went on from its start.
    CHECK(control.latest_generation() == 2);
    if (then == Then::kHolderReports) {
      control.report_survivor(2, "0", 76);
      manager.tick();
      REQUIRE(control.latest_generation() == 3);
      const auto third = control.generation(3);
      CHECK(third.members == std::vector<std::string>{"0", "2"});
      CHECK(third.donor == "0");
      CHECK(third.transfer_state);
      CHECK(control.state() == vflow::job::JobState::kRunning);
    } else {
      std::this_thread::sleep_for(400ms);  // past three timeouts
      manager.tick();
      CHECK(control.latest_generation() == 2);
      CHECK(control.state() == vflow::job::JobState::kFailed);
    }
  }
}

TEST_CASE("after a failure in the first generation its members without state go on from its start",
          "[unit]") {
  FirstGeneration job;
  auto& control = job.control;
  auto& manager = job.manager;
  // Member 1 dies before either had joined: 0 holds what every worker starts with.
  manager.on_exit("1", 137);
  control.report_survivor(1, "0", -1);
  manager.tick();
  REQUIRE(control.latest_generation() == 2);
  const auto second = control.generation(2);
  CHECK(second.members == std::vector<std::string>{"0"});
  CHECK(second.donor == "0");
  CHECK_FALSE(second.transfer_state);
}
