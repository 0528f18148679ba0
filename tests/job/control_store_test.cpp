// The control plane's storage (job::ControlStore) over the embedded store a real
// coordinator hosts: two clients, as a coordinator and a worker would be.
#include "vflow/job/control_store.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "vflow/core/error.h"
#include "vflow/job/launcher.h"

using namespace std::chrono_literals;

namespace {
struct Stores {
  vflow::job::Coordinator coordinator{"127.0.0.1", 0, std::chrono::seconds(5)};
  std::unique_ptr<vflow::job::ControlStore> a =
      vflow::job::connect_embedded_store("127.0.0.1", coordinator.port(), 5s);
  std::unique_ptr<vflow::job::ControlStore> b =
      vflow::job::connect_embedded_store("127.0.0.1", coordinator.port(), 5s);
};
}  // namespace

TEST_CASE("the embedded control store gets, sets, settles once and counts", "[unit]") {
  Stores s;
  CHECK_FALSE(s.a->get("job/x"));
  s.a->set("job/x", "1");
  CHECK(s.b->get("job/x") == std::optional<std::string>("1"));
  // Settled once: the first value stays, whoever asks later.
  CHECK(s.a->set_if_absent("answer", "shrink") == "shrink");
  CHECK(s.b->set_if_absent("answer", "fresh") == "shrink");
  CHECK(s.a->add("count", 2) == 2);
  CHECK(s.b->add("count", 3) == 5);
  CHECK(s.a->add("count", 0) == 5);
  CHECK(s.a->address() == "127.0.0.1:" + std::to_string(s.coordinator.port()));
}

TEST_CASE("the embedded control store's compare-and-set changes only the expected value",
          "[unit]") {
  Stores s;
  CHECK(s.a->compare_and_set("leader", std::nullopt, "a"));  // nothing there: taken
  CHECK_FALSE(s.b->compare_and_set("leader", std::nullopt, "b"));
  CHECK(s.b->get("leader") == std::optional<std::string>("a"));
  CHECK_FALSE(s.b->compare_and_set("leader", std::string("x"), "b"));  // not what it holds
  CHECK(s.b->compare_and_set("leader", std::string("a"), "b"));
  CHECK(s.a->get("leader") == std::optional<std::string>("b"));
  CHECK_FALSE(s.a->compare_and_set("missing", std::string("a"), "b"));  // holds nothing
  CHECK_FALSE(s.a->get("missing"));
}

TEST_CASE("the embedded control store waits with a bound and removes keys", "[unit]") {
  Stores s;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(s.a->wait({"late"}, 100ms));
  CHECK(std::chrono::steady_clock::now() - t0 >= 100ms);
  struct Joined {
    std::thread thread;
    ~Joined() { thread.join(); }
  } writer{std::thread([&] {
    std::this_thread::sleep_for(50ms);
    s.b->set("late", "here");
  })};
  CHECK(s.a->wait({"late"}, 5s));
  CHECK(s.a->remove("late"));
  CHECK_FALSE(s.a->remove("late"));
  CHECK_FALSE(s.b->get("late"));
}

TEST_CASE("the embedded control store lists keys by prefix across clients", "[unit]") {
  Stores s;
  s.a->set("elastic/1/ready/0", "1");
  s.b->set("elastic/1/ready/1", "1");
  s.b->set_if_absent("elastic/1/answer", "fresh");
  s.a->add("elastic/2/joined", 1);
  s.a->set("elastic/1/ready/0", "2");  // set twice: listed once
  s.a->set("job/step", "3");
  CHECK(s.b->list("elastic/1/") ==
        std::vector<std::string>{"elastic/1/answer", "elastic/1/ready/0", "elastic/1/ready/1"});
  CHECK(s.a->list("elastic/1/ready/") ==
        std::vector<std::string>{"elastic/1/ready/0", "elastic/1/ready/1"});
  CHECK(s.a->list("elastic/2/") == std::vector<std::string>{"elastic/2/joined"});
  s.b->remove("elastic/1/ready/1");
  CHECK(s.a->list("elastic/1/ready/") == std::vector<std::string>{"elastic/1/ready/0"});
  s.b->set("elastic/1/ready/1", "again");  // created anew after its removal
  CHECK(s.a->list("elastic/1/ready/").size() == 2);
  CHECK(s.a->list("nothing/").empty());
  s.b->add("ctl/requests", 0);  // reading a counter creates it, and it is listed
  CHECK(s.a->list("ctl/") == std::vector<std::string>{"ctl/requests"});
  s.a->publish("job/step", "4");  // unconfirmed, but ordered before the next call
  CHECK(s.a->get("job/step") == std::optional<std::string>("4"));
}

TEST_CASE("the embedded control store's heartbeats expire after their time to live", "[unit]") {
  Stores s;
  CHECK_FALSE(s.a->alive("worker-0"));
  s.b->heartbeat("worker-0", 2s);  // long enough for a loaded machine's round trips
  CHECK(s.a->alive("worker-0"));
  std::this_thread::sleep_for(2500ms);
  CHECK_FALSE(s.a->alive("worker-0"));
  s.b->heartbeat("worker-0", 10s);  // renewed
  CHECK(s.a->alive("worker-0"));
  s.a->set("store/alive/bad", "soon");  // a damaged record is an error naming the key
  CHECK_THROWS_WITH(s.a->alive("bad"), Catch::Contains("store/alive/bad"));
}

TEST_CASE("an unreachable or lost embedded store is a peer failure naming its address", "[unit]") {
  std::unique_ptr<vflow::job::ControlStore> lost;
  int port = 0;
  {
    vflow::job::Coordinator coordinator("127.0.0.1", 0, 5s);
    port = coordinator.port();
    lost = vflow::job::connect_embedded_store("127.0.0.1", port, 1s);
    lost->set("k", "v");
  }  // the coordinator is gone
  CHECK_THROWS_AS(lost->get("k"), vflow::PeerFailure);
  CHECK_THROWS_WITH(
      vflow::job::connect_embedded_store("127.0.0.1", port, 300ms),
      Catch::Contains("cannot reach the job's coordinator at 127.0.0.1:" + std::to_string(port)));
}
