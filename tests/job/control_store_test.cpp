// The control plane's storage (job::ControlStore): the same contract checked on the
// embedded store a real coordinator hosts and on a real etcd (Debian's etcd-server,
// started by scripts/etcd-local.sh), two clients each, as a coordinator and a worker
// would be; then what only etcd has: several members, leases, TLS and per-job access.
#include "vflow/job/control_store.h"

#include <fmt/format.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "support.h"
#include "vflow/core/error.h"
#include "vflow/job/launcher.h"

using namespace std::chrono_literals;
using vflow::job::ControlStore;

namespace {

struct Joined {
  std::thread thread;
  ~Joined() { thread.join(); }
};

struct EmbeddedStores {
  vflow::job::StoreHost coordinator{"127.0.0.1", 0, std::chrono::seconds(5)};
  std::unique_ptr<ControlStore> a =
      vflow::job::connect_embedded_store("127.0.0.1", coordinator.port(), 5s);
  std::unique_ptr<ControlStore> b =
      vflow::job::connect_embedded_store("127.0.0.1", coordinator.port(), 5s);
};

std::unique_ptr<vflow::job::ClusterStore> etcd_client(const std::string& url,
                                                      const std::string& job,
                                                      std::chrono::milliseconds timeout = 5s) {
  return vflow::job::connect_etcd_store(vflow::job::etcd_options(url, job, timeout));
}

struct EtcdStores {
  vflow::testing::EtcdCluster etcd;
  std::unique_ptr<ControlStore> a = etcd_client(etcd.url(), "job-a");
  std::unique_ptr<ControlStore> b = etcd_client(etcd.url(), "job-a");
};

void gets_sets_settles_and_counts(ControlStore& a, ControlStore& b) {
  CHECK_FALSE(a.get("job/x"));
  a.set("job/x", "1");
  CHECK(b.get("job/x") == std::optional<std::string>("1"));
  // Settled once: the first value stays, whoever asks later.
  CHECK(a.set_if_absent("answer", "shrink") == "shrink");
  CHECK(b.set_if_absent("answer", "fresh") == "shrink");
  CHECK(a.add("count", 2) == 2);
  CHECK(b.add("count", 3) == 5);
  CHECK(a.add("count", 0) == 5);
}

void compares_and_sets(ControlStore& a, ControlStore& b) {
  CHECK(a.compare_and_set("leader", std::nullopt, "a"));  // nothing there: taken
  CHECK_FALSE(b.compare_and_set("leader", std::nullopt, "b"));
  CHECK(b.get("leader") == std::optional<std::string>("a"));
  CHECK_FALSE(b.compare_and_set("leader", std::string("x"), "b"));  // not what it holds
  CHECK(b.compare_and_set("leader", std::string("a"), "b"));
  CHECK(a.get("leader") == std::optional<std::string>("b"));
  CHECK(a.compare_and_set("leader", std::string("a"), "b"));         // the same change came first
  CHECK_FALSE(a.compare_and_set("missing", std::string("a"), "b"));  // holds nothing
  CHECK_FALSE(a.get("missing"));
}

void waits_with_a_bound_and_removes(ControlStore& a, ControlStore& b) {
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(a.wait({"late"}, 100ms));
  CHECK(std::chrono::steady_clock::now() - t0 >= 100ms);
  {
    Joined writer{std::thread([&] {
      std::this_thread::sleep_for(50ms);
      b.set("late", "here");
    })};
    CHECK(a.wait({"late"}, 5s));
  }  // b is used by one thread at a time: the writer is done with it here
  CHECK(a.remove("late"));
  CHECK_FALSE(a.remove("late"));
  CHECK_FALSE(b.get("late"));
}

void lists_by_prefix(ControlStore& a, ControlStore& b) {
  a.set("elastic/1/ready/0", "1");
  b.set("elastic/1/ready/1", "1");
  b.set_if_absent("elastic/1/answer", "fresh");
  a.add("elastic/2/joined", 1);
  a.set("elastic/1/ready/0", "2");  // set twice: listed once
  a.set("job/step", "3");
  CHECK(b.list("elastic/1/") ==
        std::vector<std::string>{"elastic/1/answer", "elastic/1/ready/0", "elastic/1/ready/1"});
  CHECK(a.list("elastic/1/ready/") ==
        std::vector<std::string>{"elastic/1/ready/0", "elastic/1/ready/1"});
  CHECK(a.list("elastic/2/") == std::vector<std::string>{"elastic/2/joined"});
  b.remove("elastic/1/ready/1");
  CHECK(a.list("elastic/1/ready/") == std::vector<std::string>{"elastic/1/ready/0"});
  b.set("elastic/1/ready/1", "again");  // created anew after its removal
  CHECK(a.list("elastic/1/ready/").size() == 2);
  CHECK(a.list("nothing/").empty());
  a.publish("job/step", "4");  // unconfirmed, but ordered before the next call
  CHECK(a.get("job/step") == std::optional<std::string>("4"));
  CHECK(b.remove_all("elastic/") == 4);
  CHECK(a.list("elastic/").empty());
  CHECK(a.get("job/step") == std::optional<std::string>("4"));
}

}  // namespace

TEST_CASE("the embedded control store gets, sets, settles once and counts", "[unit]") {
  EmbeddedStores s;
  gets_sets_settles_and_counts(*s.a, *s.b);
  CHECK(s.a->address() == "127.0.0.1:" + std::to_string(s.coordinator.port()));
}

TEST_CASE("the embedded control store's compare-and-set changes only the expected value",
          "[unit]") {
  EmbeddedStores s;
  compares_and_sets(*s.a, *s.b);
}

TEST_CASE("the embedded control store waits with a bound and removes keys", "[unit]") {
  EmbeddedStores s;
  waits_with_a_bound_and_removes(*s.a, *s.b);
}

TEST_CASE("the embedded control store lists keys by prefix across clients", "[unit]") {
  EmbeddedStores s;
  lists_by_prefix(*s.a, *s.b);
  s.b->add("ctl/requests", 0);  // a counter that is read exists, and it is listed
  CHECK(s.a->list("ctl/") == std::vector<std::string>{"ctl/requests"});
}

TEST_CASE("the embedded control store's heartbeats expire after their time to live", "[unit]") {
  EmbeddedStores s;
  CHECK_FALSE(s.a->alive("worker-0"));
  s.b->heartbeat("worker-0", 2s);  // long enough for a loaded machine's round trips
  CHECK(s.a->alive("worker-0"));
  std::this_thread::sleep_for(2500ms);
  CHECK_FALSE(s.a->alive("worker-0"));
  s.b->heartbeat("worker-0", 10s);  // renewed
  CHECK(s.a->alive("worker-0"));
  // Kept on the server's clock, apart from the keys: a key cannot fake one.
  s.a->set("store/alive/fake", "1");
  CHECK_FALSE(s.b->alive("fake"));
  s.a->heartbeat("worker/1", 10s);
  s.a->heartbeat("agent/1", 10s);
  CHECK(s.b->alive_names("worker/") == std::vector<std::string>{"worker/1"});
}

TEST_CASE("an unreachable or lost embedded store is a peer failure naming its address", "[unit]") {
  std::unique_ptr<ControlStore> lost;
  int port = 0;
  {
    vflow::job::StoreHost coordinator("127.0.0.1", 0, 5s);
    port = coordinator.port();
    lost = vflow::job::connect_embedded_store("127.0.0.1", port, 1s);
    lost->set("k", "v");
  }  // the coordinator is gone
  CHECK_THROWS_AS(lost->get("k"), vflow::PeerFailure);
  CHECK_THROWS_WITH(
      vflow::job::connect_embedded_store("127.0.0.1", port, 300ms),
      Catch::Contains("cannot reach the job's coordinator at 127.0.0.1:" + std::to_string(port)));
}

// ---- etcd ----

TEST_CASE("the etcd control store keeps the control store's contract", "[integration][etcd]") {
  EtcdStores s;
  SECTION("get, set, settle once, count") { gets_sets_settles_and_counts(*s.a, *s.b); }
  SECTION("compare-and-set") { compares_and_sets(*s.a, *s.b); }
  SECTION("a bounded wait, by a watch") { waits_with_a_bound_and_removes(*s.a, *s.b); }
  SECTION("listing and removal by prefix") { lists_by_prefix(*s.a, *s.b); }
  // Binary values (c10d's rendezvous keeps addresses in the store) pass unchanged.
  const std::string bytes("\0\x01\xff\x80 z", 6);
  s.a->set("bytes", bytes);
  CHECK(s.b->get("bytes") == std::optional<std::string>(bytes));
  // Another job's keys are apart: the same key names another record there.
  const auto other = etcd_client(s.etcd.url(), "job-b");
  other->set("job/x", "of b");
  CHECK(s.a->get("job/x") != std::optional<std::string>("of b"));
  CHECK(s.a->remove_all("") >= 1);
  CHECK(other->get("job/x") == std::optional<std::string>("of b"));
}

TEST_CASE("etcd counts every add of concurrent clients once", "[integration][etcd]") {
  vflow::testing::EtcdCluster etcd;
  constexpr int kClients = 4, kAdds = 25;
  std::vector<std::thread> threads;
  std::vector<std::string> errors(kClients);
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      try {
        const auto store = etcd_client(etcd.url(), "job");
        for (int k = 0; k < kAdds; ++k) store->add("counter", 1);
        // Each settles its own key once and sees everyone's the same.
        store->set_if_absent("winner", std::to_string(c));
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(c)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) CHECK(e.empty());
  const auto store = etcd_client(etcd.url(), "job");
  CHECK(store->add("counter", 0) == kClients * kAdds);
  const auto winner = store->get("winner");
  REQUIRE(winner);
  CHECK(std::stoi(*winner) >= 0);
  CHECK(std::stoi(*winner) < kClients);
}

TEST_CASE("etcd heartbeats are leases: they expire, and end with their client",
          "[integration][etcd]") {
  EtcdStores s;
  CHECK_FALSE(s.a->alive("worker-0"));
  s.b->heartbeat("worker-0", 1s);  // etcd may raise a lease to its minimum (2 s by default)
  CHECK(s.a->alive("worker-0"));
  s.b->heartbeat("worker-0", 1s);  // kept alive
  CHECK(s.a->alive("worker-0"));
  std::this_thread::sleep_for(3500ms);
  CHECK_FALSE(s.a->alive("worker-0"));
  s.b->heartbeat("worker-0", 1s);  // the lease expired meanwhile: a new one
  CHECK(s.a->alive("worker-0"));
  s.b->heartbeat("worker-1", 30s);
  CHECK(s.a->alive("worker-1"));
  s.b.reset();  // a client that stops revokes its leases: gone at once, not in 30 s
  CHECK_FALSE(s.a->alive("worker-1"));
  CHECK_FALSE(s.a->alive("worker-0"));
}

TEST_CASE("an etcd claim has one holder at a time and passes on when its holder ends",
          "[integration][etcd]") {
  vflow::testing::EtcdCluster etcd;
  auto a = etcd_client(etcd.url(), "job");
  const auto b = etcd_client(etcd.url(), "job");
  CHECK_FALSE(b->holder("coordinator"));
  CHECK(a->campaign("coordinator", "a", 3s) == "a");
  CHECK(b->campaign("coordinator", "b", 3s) == "a");  // held: b learns who holds it
  CHECK(b->holder("coordinator") == std::optional<std::string>("a"));
  CHECK(a->renew("coordinator"));
  CHECK_FALSE(b->renew("coordinator"));               // b never held it
  CHECK(a->campaign("coordinator", "a", 3s) == "a");  // a holder campaigning keeps it
  // Given up: at once free for the next.
  a->resign("coordinator");
  CHECK_FALSE(a->renew("coordinator"));
  CHECK(b->campaign("coordinator", "b", 3s) == "b");
  CHECK(a->campaign("coordinator", "a", 3s) == "b");
  // A holder that stops renewing loses it when its lease expires; one that ends, at once.
  std::this_thread::sleep_for(4500ms);
  CHECK_FALSE(a->holder("coordinator"));
  CHECK_FALSE(b->renew("coordinator"));
  CHECK(a->campaign("coordinator", "a", 30s) == "a");
  a.reset();
  CHECK(b->campaign("coordinator", "b", 3s) == "b");
  // Living names by prefix come from one listing.
  b->heartbeat("worker/1", 30s);
  b->heartbeat("worker/2", 30s);
  b->heartbeat("agent/x", 30s);
  CHECK(b->alive_names("worker/") == std::vector<std::string>{"worker/1", "worker/2"});
}

TEST_CASE("an etcd scan and watch see every change under a prefix once, in order",
          "[integration][etcd]") {
  vflow::testing::EtcdCluster etcd;
  const auto watcher =
      vflow::job::connect_etcd_root(vflow::job::etcd_options(etcd.url(), "job", 5s));
  const auto a = etcd_client(etcd.url(), "a");
  a->set("job/record", "1");
  int64_t revision = 0;
  const auto all = watcher->scan("jobs/", &revision);
  CHECK(all == std::map<std::string, std::string>{{"jobs/a/job/record", "1"}});
  CHECK(revision > 0);
  // Nothing new: an empty answer after the bound.
  const auto t0 = std::chrono::steady_clock::now();
  const auto none = watcher->watch("jobs/", revision, 300ms);
  REQUIRE(none);
  CHECK(none->empty());
  CHECK(std::chrono::steady_clock::now() - t0 >= 300ms);
  // Changes made while nobody watched are not lost: the watch starts after `revision`.
  a->set("placement/3", "agent-1 0");
  a->remove("job/record");
  std::vector<vflow::job::StoreEvent> seen;
  while (seen.size() < 2) {
    const auto events = watcher->watch("jobs/", revision, 2s);
    REQUIRE(events);
    REQUIRE_FALSE(events->empty());
    seen.insert(seen.end(), events->begin(), events->end());
  }
  REQUIRE(seen.size() == 2);
  CHECK(seen[0].key == "jobs/a/placement/3");
  CHECK(seen[0].value == std::optional<std::string>("agent-1 0"));
  CHECK(seen[1].key == "jobs/a/job/record");
  CHECK_FALSE(seen[1].value);
  // A change during the watch ends it at once.
  Joined writer{std::thread([&] {
    std::this_thread::sleep_for(200ms);
    a->set("job/done", "completed");
  })};
  const auto t1 = std::chrono::steady_clock::now();
  const auto late = watcher->watch("jobs/", revision, 10s);
  REQUIRE(late);
  REQUIRE(late->size() == 1);
  CHECK(late->front().key == "jobs/a/job/done");
  CHECK(std::chrono::steady_clock::now() - t1 < 5s);
}

TEST_CASE("an etcd client goes on when the member it used stops", "[integration][etcd]") {
  vflow::testing::EtcdCluster etcd(3);
  const auto a = etcd_client(etcd.url(), "job");
  const auto b = etcd_client(etcd.url(), "job");
  a->set("k", "1");
  CHECK(b->add("n", 1) == 1);
  etcd.script("stop", "0");  // both clients were talking to the first member
  CHECK(a->get("k") == std::optional<std::string>("1"));
  CHECK(b->add("n", 1) == 2);
  Joined writer{std::thread([&] {
    std::this_thread::sleep_for(100ms);
    b->set("late", "here");
  })};
  CHECK(a->wait({"late"}, 5s));
  etcd.script("restart", "0");
}

/// Renews heartbeat `name` of `ttl` every quarter of it, as a worker renews its liveness,
/// until it is destroyed; counts the renewals that failed and keeps the first one's error.
class Renewing {
 public:
  Renewing(ControlStore& store, std::string name, std::chrono::milliseconds ttl)
      : thread_([this, &store, name, ttl] {
          while (!done_) {
            try {
              store.heartbeat(name, ttl);
            } catch (const std::exception& e) {
              const std::lock_guard<std::mutex> lock(mutex_);
              if (failures_++ == 0) first_failure_ = e.what();
            }
            std::this_thread::sleep_for(ttl / 4);
          }
        }) {}
  ~Renewing() {
    done_ = true;
    thread_.join();
  }
  int failures() const { return failures_; }
  std::string first_failure() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return first_failure_;
  }

 private:
  std::atomic<bool> done_{false};
  std::atomic<int> failures_{0};
  std::mutex mutex_;
  std::string first_failure_;
  std::thread thread_;  // last: it starts once the rest is there
};

TEST_CASE("an etcd heartbeat lives on when the member it used stops answering",
          "[integration][etcd]") {
  // A frozen member accepts requests and never answers, as one behind a cut link does; were
  // it the leader, the others forward keep-alives to it until they elect another. A
  // keep-alive waiting there for the whole timeout (10 s) would outlive its 3 s lease.
  vflow::testing::EtcdCluster etcd(3);
  const auto worker = etcd_client(etcd.url(), "job", 10s);
  // Reads wait through the election too (up to a few seconds): a watcher as patient.
  const auto watcher = etcd_client(etcd.url(), "job", 10s);
  worker->heartbeat("w", 3s);
  REQUIRE(watcher->alive("w"));
  etcd.script("freeze", "0");  // both clients were talking to the first member
  int checks = 0, lapses = 0;
  {
    Renewing renewing(*worker, "w", 3s);
    for (const auto end = std::chrono::steady_clock::now() + 10s;
         std::chrono::steady_clock::now() < end; ++checks) {
      if (!watcher->alive("w")) ++lapses;
      std::this_thread::sleep_for(50ms);
    }
    INFO(renewing.first_failure());
    CHECK(renewing.failures() == 0);
  }
  etcd.script("thaw", "0");
  CHECK(checks > 20);
  CHECK(lapses == 0);
}

TEST_CASE("an unreachable etcd is a peer failure naming every endpoint, within the timeout",
          "[integration][etcd]") {
  const int p1 = vflow::testing::free_port(), p2 = vflow::testing::free_port();
  const auto url = fmt::format("etcd://127.0.0.1:{},127.0.0.1:{}", p1, p2);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    etcd_client(url, "job", 1s);
    FAIL("connected to nothing");
  } catch (const vflow::PeerFailure& e) {
    CHECK_THAT(e.what(), Catch::Contains(fmt::format("127.0.0.1:{}", p1)) &&
                             Catch::Contains(fmt::format("127.0.0.1:{}", p2)));
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 3s);
}

TEST_CASE("control URLs (--control) and job names are checked before anything connects", "[unit]") {
  using vflow::job::etcd_options;
  const auto o = etcd_options("etcds://10.0.0.1:2379,h2:2380", "j.1_x-y", 2s);
  CHECK(o.tls);
  CHECK(o.endpoints == std::vector<std::string>{"10.0.0.1:2379", "h2:2380"});
  CHECK(o.job == "j.1_x-y");
  CHECK(o.timeout == 2s);
  CHECK_FALSE(etcd_options("etcd://h:1", "j", 1s).tls);
  CHECK_THROWS_AS(etcd_options("http://h:1", "j", 1s), vflow::SpecError);
  CHECK_THROWS_WITH(etcd_options("etcd://h:1,h", "j", 1s), Catch::Contains("'h' in"));
  CHECK_THROWS_AS(etcd_options("etcd://", "j", 1s), vflow::SpecError);
  CHECK_THROWS_WITH(etcd_options("etcd://h:1", "a/b", 1s), Catch::Contains("--job"));
  CHECK_THROWS_AS(etcd_options("etcd://h:1", "", 1s), vflow::SpecError);
  CHECK_THROWS_AS(etcd_options("etcd://h:1", "..", 1s), vflow::SpecError);
  // Credentials that cannot be read are named at once, not taken for members that cannot be
  // reached until the timeout.
  setenv("VFLOW_ETCD_CERT", "/nonexistent/client.pem", 1);
  CHECK_THROWS_WITH(etcd_options("etcds://h:1", "j", 1s),
                    Catch::Contains("VFLOW_ETCD_CERT: cannot read /nonexistent/client.pem: No such "
                                    "file or directory"));
  setenv("VFLOW_ETCD_CERT", "/dev/null", 1);
  CHECK_THROWS_WITH(etcd_options("etcds://h:1", "j", 1s),
                    Catch::Contains("VFLOW_ETCD_CERT and VFLOW_ETCD_KEY go together"));
  unsetenv("VFLOW_ETCD_CERT");
  setenv("VFLOW_ETCD_PASSWORD_FILE", "/nonexistent/pw", 1);
  CHECK_THROWS_WITH(etcd_options("etcds://h:1", "j", 1s),
                    Catch::Contains("VFLOW_ETCD_PASSWORD_FILE: cannot read /nonexistent/pw"));
  unsetenv("VFLOW_ETCD_PASSWORD_FILE");
}

TEST_CASE(
    "etcd over TLS with users: no credentials, a wrong password and another job's keys "
    "are refused",
    "[integration][etcd]") {
  vflow::testing::EtcdCluster etcd(1, "--tls --auth root-secret");
  etcd.script("job-user", "A alice alice-secret");
  etcd.script("job-user", "B bob bob-secret");
  const auto pki = etcd.dir() + "/etcd/pki/";
  auto options = [&](const std::string& job, const std::string& user, const std::string& pw) {
    auto o = vflow::job::etcd_options(etcd.url(), job, 5s);
    o.ca_file = pki + "ca.pem";
    o.cert_file = pki + "client.pem";
    o.key_file = pki + "client-key.pem";
    o.user = user;
    o.password = pw;
    return o;
  };
  using vflow::job::connect_etcd_store;
  const auto alice = connect_etcd_store(options("A", "alice", "alice-secret"));
  alice->set("job/step", "7");
  CHECK(alice->add("ctl/requests", 1) == 1);
  alice->heartbeat("worker-0", 5s);
  CHECK(alice->alive("worker-0"));
  const auto bob = connect_etcd_store(options("B", "bob", "bob-secret"));
  bob->set("job/step", "1");

  // Alice's credentials cannot touch job B's keys, neither read nor write.
  const auto alice_on_b = [&] { return connect_etcd_store(options("B", "alice", "alice-secret")); };
  CHECK_THROWS_WITH(alice_on_b(), Catch::Contains("permission denied"));
  CHECK_THROWS_AS(alice_on_b(), vflow::RequestRefused);  // exit code 7, not a failure
  CHECK(bob->get("job/step") == std::optional<std::string>("1"));
  // Listing every job needs access to all of them: root may, alice may not.
  alice->set("job/owner", "1");  // what a launcher that took the name writes
  CHECK(vflow::job::etcd_jobs(options("any", "root", "root-secret")) ==
        std::vector<std::string>{"A"});
  CHECK_THROWS_WITH(vflow::job::etcd_jobs(options("any", "alice", "alice-secret")),
                    Catch::Contains("permission denied"));

  CHECK_THROWS_WITH(connect_etcd_store(options("A", "", "")),
                    Catch::Contains("requires authentication"));
  CHECK_THROWS_AS(connect_etcd_store(options("A", "", "")), vflow::SpecError);
  CHECK_THROWS_AS(connect_etcd_store(options("A", "alice", "wrong")), vflow::Error);
  // Without the cluster's CA the server's certificate is not trusted.
  auto untrusted = options("A", "alice", "alice-secret");
  untrusted.ca_file.clear();
  CHECK_THROWS_AS(connect_etcd_store(untrusted), vflow::PeerFailure);
  // Credentials from the environment, the password from a file.
  vflow::testing::write_file(etcd.dir() + "/pw", "alice-secret\n");
  setenv("VFLOW_ETCD_CA", (pki + "ca.pem").c_str(), 1);
  setenv("VFLOW_ETCD_CERT", (pki + "client.pem").c_str(), 1);
  setenv("VFLOW_ETCD_KEY", (pki + "client-key.pem").c_str(), 1);
  setenv("VFLOW_ETCD_USER", "alice", 1);
  setenv("VFLOW_ETCD_PASSWORD_FILE", (etcd.dir() + "/pw").c_str(), 1);
  const auto from_env = etcd_client(etcd.url(), "A");
  for (const char* v : {"VFLOW_ETCD_CA", "VFLOW_ETCD_CERT", "VFLOW_ETCD_KEY", "VFLOW_ETCD_USER",
                        "VFLOW_ETCD_PASSWORD_FILE"}) {
    unsetenv(v);
  }
  CHECK(from_env->get("job/step") == std::optional<std::string>("7"));
}
