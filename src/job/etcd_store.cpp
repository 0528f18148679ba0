// The control store on a cluster's etcd v3: the key-value semantics, over the gateway's
// transport (job/etcd_transport: failover between members, TLS, authentication;
// docs/design.md, "The cluster control store").
//
// Keys live under /vflow/jobs/<job>/, base64-encoded on the wire as the gateway wants.
// Every read-modify-write is one transaction (compare on a revision, then put); waits
// watch the keys from the revision at which they were seen missing, so no write between
// the look and the watch is missed.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "job/etcd_transport.h"
#include "vflow/core/error.h"
#include "vflow/job/control_store.h"

namespace vflow::job {

namespace {

using etcd::base64;
using etcd::Json;
using etcd::number;
using etcd::unbase64;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

const char* const kVflowRoot = "/vflow/";
const char* const kJobsRoot = "/vflow/jobs/";
// Heartbeats live here, each under the lease that keeps it.
const char* const kAlive = "store/alive/";
// Claims (ClusterStore::campaign) live here, each under its holder's lease.
const char* const kClaim = "store/claim/";

/// The end of `prefix`'s key range: the prefix with its last byte incremented.
std::string prefix_end(std::string prefix) {
  while (!prefix.empty() && static_cast<unsigned char>(prefix.back()) == 0xff) prefix.pop_back();
  if (prefix.empty()) return std::string(1, '\0');  // every key
  prefix.back() = static_cast<char>(static_cast<unsigned char>(prefix.back()) + 1);
  return prefix;
}

/// etcd's leases count whole seconds, and it raises very short ones to its minimum.
int64_t lease_seconds(std::chrono::milliseconds ttl) {
  return std::max<int64_t>(1, (ttl.count() + 999) / 1000);
}

class EtcdControlStore final : public ClusterStore {
 public:
  /// The keys of job `options.job`, or with `prefix` given every key under it.
  explicit EtcdControlStore(const EtcdOptions& options,
                            std::optional<std::string> prefix = std::nullopt)
      : prefix_(prefix ? *prefix : kJobsRoot + options.job + "/"), transport_(options, prefix_) {
    // One round trip, so that an unreachable cluster or refused credentials show at once.
    // A key every user of this prefix may read: a job's own, or (the whole tree) the agents'.
    const std::string probe = prefix ? "agents/probe" : "store/probe";
    transport_.call("/v3/kv/range", {{"key", base64(prefix_ + probe)}}, "its first read");
  }

  ~EtcdControlStore() override {
    // The heartbeats end with this client: revoking their leases removes their keys now
    // rather than when the leases expire. Best effort, quickly.
    transport_.limit_timeout(milliseconds(1000));
    for (const auto* held : {&leases_, &claims_}) {
      for (const auto& [name, lease] : *held) {
        try {
          transport_.call("/v3/lease/revoke", {{"ID", std::to_string(lease.id)}}, "a lease revoke");
        } catch (const std::exception&) {
        }
      }
    }
  }

  std::optional<std::string> get(const std::string& key) override {
    const auto kv = range(key);
    if (!kv) return std::nullopt;
    return value_of(*kv);
  }

  void set(const std::string& key, const std::string& value) override { put(key, value); }

  // A put is one raft round on a healthy cluster (milliseconds); the figures published
  // this way are few a second.
  void publish(const std::string& key, const std::string& value) override { put(key, value); }

  std::string set_if_absent(const std::string& key, const std::string& value) override {
    const auto reply = transaction(absent(key), put_op(key, value), key);
    if (reply.value("succeeded", false)) return value;
    const auto kv = first_kv(reply);
    // Removed between the compare and the range: it holds nothing now; settle again.
    return kv ? value_of(*kv) : set_if_absent(key, value);
  }

  bool compare_and_set(const std::string& key, const std::optional<std::string>& expected,
                       const std::string& desired) override {
    VFLOW_ASSERT(!expected || *expected != desired, "compare_and_set needs a change");
    const Json compare = expected ? equal(key, "VALUE", "value", base64(*expected)) : absent(key);
    const auto reply = transaction(compare, put_op(key, desired), key);
    if (reply.value("succeeded", false)) return true;
    const auto kv = first_kv(reply);
    return kv && value_of(*kv) == desired;
  }

  // At least once: a transaction whose answer was lost with a failing member is tried
  // again on the next, and may then count twice. The protocol's counters only signal
  // that something changed (ControlPlane), for which that is harmless.
  int64_t add(const std::string& key, int64_t delta) override {
    auto kv = range(key);
    while (true) {
      const int64_t now = kv ? counter_of(*kv, key) : 0;
      if (delta == 0) return now;
      const Json compare =
          kv ? equal(key, "MOD", "mod_revision", std::to_string(number(*kv, "mod_revision")))
             : absent(key);
      const auto reply = transaction(compare, put_op(key, std::to_string(now + delta)), key);
      if (reply.value("succeeded", false)) return now + delta;
      kv = first_kv(reply);  // someone else's add came first: add to theirs
    }
  }

  bool wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    for (const auto& key : keys) {
      while (true) {
        const auto reply = transport_.call(
            "/v3/kv/range", {{"key", base64(full(key))}, {"count_only", true}}, "a read of " + key);
        if (number(reply, "count") > 0) break;
        const int64_t seen = number(reply.at("header"), "revision");
        // Against the clock itself: milliseconds rounded down would end the wait up to
        // one early.
        if (Clock::now() >= deadline) return false;
        const auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now());
        // The watch ends at a put, or when its own clock ran out (which may be a moment
        // early): the loop looks once more and returns only once the deadline has passed.
        watch_for_put(key, seen + 1, left);
      }
    }
    return true;
  }

  bool remove(const std::string& key) override {
    const auto reply =
        transport_.call("/v3/kv/deleterange", {{"key", base64(full(key))}}, "a removal of " + key);
    return number(reply, "deleted") > 0;
  }

  int64_t remove_all(const std::string& prefix) override {
    const auto reply = transport_.call(
        "/v3/kv/deleterange",
        {{"key", base64(full(prefix))}, {"range_end", base64(prefix_end(full(prefix)))}},
        "a removal of the keys under " + full(prefix));
    return number(reply, "deleted");
  }

  std::vector<std::string> list(const std::string& prefix) override {
    const auto reply = transport_.call("/v3/kv/range",
                                       {{"key", base64(full(prefix))},
                                        {"range_end", base64(prefix_end(full(prefix)))},
                                        {"keys_only", true}},
                                       "a listing of " + full(prefix));
    std::vector<std::string> keys;
    for (const auto& kv : reply.value("kvs", Json::array())) {
      keys.push_back(unbase64(kv.value("key", ""), "a key").substr(prefix_.size()));
    }
    std::sort(keys.begin(), keys.end());  // etcd sorts by key already; the contract says so
    return keys;
  }

  void heartbeat(const std::string& name, milliseconds ttl) override {
    const int64_t seconds = lease_seconds(ttl);
    auto it = leases_.find(name);
    if (it != leases_.end() && it->second.seconds == seconds) {
      const auto reply = keep_alive(it->second, "a lease keep-alive");
      const auto& result = reply.contains("result") ? reply.at("result") : reply;
      if (number(result, "TTL") > 0) return;  // renewed
      leases_.erase(it);                      // expired meanwhile: its key is gone too
    } else if (it != leases_.end()) {
      transport_.call("/v3/lease/revoke", {{"ID", std::to_string(it->second.id)}},
                      "a lease revoke");
      leases_.erase(it);
    }
    const auto grant =
        transport_.call("/v3/lease/grant", {{"TTL", std::to_string(seconds)}}, "a lease grant");
    const Lease lease{number(grant, "ID"), seconds};
    transport_.call("/v3/kv/put",
                    {{"key", base64(full(kAlive + name))},
                     {"value", base64(std::to_string(seconds))},
                     {"lease", std::to_string(lease.id)}},
                    "a heartbeat of " + name);
    leases_[name] = lease;
  }

  bool alive(const std::string& name) override { return range(kAlive + name).has_value(); }

  std::vector<std::string> alive_names(const std::string& prefix) override {
    std::vector<std::string> names;
    for (const auto& key : list(kAlive + prefix)) names.push_back(key.substr(std::strlen(kAlive)));
    return names;
  }

  std::string campaign(const std::string& name, const std::string& me, milliseconds ttl) override {
    if (claims_.count(name) != 0 && renew(name)) return me;
    const int64_t seconds = lease_seconds(ttl);
    const auto grant =
        transport_.call("/v3/lease/grant", {{"TTL", std::to_string(seconds)}}, "a lease grant");
    const Lease lease{number(grant, "ID"), seconds};
    const std::string key = kClaim + name;
    Json request = Json::object();
    request["compare"] = Json::array({absent(key)});
    request["success"] = Json::array({Json{{"request_put",
                                            {{"key", base64(full(key))},
                                             {"value", base64(me)},
                                             {"lease", std::to_string(lease.id)}}}}});
    request["failure"] = Json::array({range_op(key)});
    const auto reply = transport_.call("/v3/kv/txn", request, "a claim of " + name);
    const auto kv = first_kv(reply);
    // A transaction whose answer was lost with a failing member is repeated on the next: it
    // then finds the claim this very lease made, which is a success too.
    if (reply.value("succeeded", false) || (kv && number(*kv, "lease") == lease.id)) {
      claims_[name] = lease;
      return me;
    }
    try {
      transport_.call("/v3/lease/revoke", {{"ID", std::to_string(lease.id)}}, "a lease revoke");
    } catch (const PeerFailure&) {
      // it expires by itself
    }
    // Released between the compare and the read: try once more.
    return kv ? value_of(*kv) : campaign(name, me, ttl);
  }

  bool renew(const std::string& name) override {
    const auto it = claims_.find(name);
    if (it == claims_.end()) return false;
    const auto reply = keep_alive(it->second, "a claim's renewal");
    const auto& result = reply.contains("result") ? reply.at("result") : reply;
    // The lease lives, and the claim is still its key (the job's keys may have been removed).
    const auto kv = range(kClaim + name);
    if (number(result, "TTL") > 0 && kv && number(*kv, "lease") == it->second.id) return true;
    claims_.erase(it);  // expired or removed: someone else may hold it by now
    return false;
  }

  void resign(const std::string& name) override {
    const auto it = claims_.find(name);
    if (it == claims_.end()) return;
    const int64_t id = it->second.id;
    claims_.erase(it);
    transport_.call("/v3/lease/revoke", {{"ID", std::to_string(id)}}, "a lease revoke");
  }

  std::optional<std::string> holder(const std::string& name) override { return get(kClaim + name); }

  std::map<std::string, std::string> scan(const std::string& prefix, int64_t* revision) override {
    const auto reply = transport_.call(
        "/v3/kv/range",
        {{"key", base64(full(prefix))}, {"range_end", base64(prefix_end(full(prefix)))}},
        "a scan of " + full(prefix));
    if (revision) *revision = number(reply.at("header"), "revision");
    std::map<std::string, std::string> out;
    for (const auto& kv : reply.value("kvs", Json::array())) {
      out[unbase64(kv.value("key", ""), "a key").substr(prefix_.size())] = value_of(kv);
    }
    return out;
  }

  std::optional<std::vector<StoreEvent>> watch(const std::string& prefix, int64_t& revision,
                                               milliseconds timeout) override {
    const Json create{{"key", base64(full(prefix))},
                      {"range_end", base64(prefix_end(full(prefix)))},
                      {"start_revision", std::to_string(revision + 1)}};
    std::vector<StoreEvent> events;
    int64_t last = revision;
    const auto deadline = Clock::now() + timeout;
    // A watch's own clock may run out a moment early: the bound is the caller's.
    while (events.empty() && Clock::now() < deadline) {
      const auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now());
      const auto end = transport_.stream_watch(
          create, left, "a watch of " + full(prefix), [&](const Json& batch) {
            for (const auto& e : batch) {
              const auto& kv = e.at("kv");
              StoreEvent event;
              event.key = unbase64(kv.value("key", ""), "a key").substr(prefix_.size());
              if (e.value("type", std::string("PUT")) != "DELETE") {
                event.value = value_of(kv);
              }
              last = std::max(last, number(kv, "mod_revision"));
              events.push_back(std::move(event));
            }
            return events.empty();
          });
      if (end == etcd::Transport::WatchEnd::kCompacted) return std::nullopt;
    }
    revision = last;
    return events;
  }

  std::string address() const override { return transport_.address(); }

 private:
  struct Lease {
    int64_t id = 0;
    int64_t seconds = 0;
  };

  std::string full(const std::string& key) const { return prefix_ + key; }

  /// A transaction's comparison: `key`'s `target` (CREATE, MOD, VALUE) equals `value`,
  /// given in the request field `field`.
  Json equal(const std::string& key, const char* target, const char* field,
             const std::string& value) const {
    return {{"key", base64(full(key))}, {"target", target}, {"result", "EQUAL"}, {field, value}};
  }
  Json absent(const std::string& key) const { return equal(key, "CREATE", "create_revision", "0"); }
  Json put_op(const std::string& key, const std::string& value) const {
    return {{"request_put", {{"key", base64(full(key))}, {"value", base64(value)}}}};
  }
  Json range_op(const std::string& key) const {
    return {{"request_range", {{"key", base64(full(key))}}}};
  }

  static std::string value_of(const Json& kv) { return unbase64(kv.value("value", ""), "a value"); }

  int64_t counter_of(const Json& kv, const std::string& key) const {
    const auto text = value_of(kv);
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0') {
      throw Error(fmt::format("etcd key {} holds '{}', not a counter", full(key), text));
    }
    return v;
  }

  std::optional<Json> range(const std::string& key) {
    const auto reply =
        transport_.call("/v3/kv/range", {{"key", base64(full(key))}}, "a read of " + key);
    const auto kvs = reply.value("kvs", Json::array());
    if (kvs.empty()) return std::nullopt;
    return kvs.front();
  }

  void put(const std::string& key, const std::string& value) {
    transport_.call("/v3/kv/put", {{"key", base64(full(key))}, {"value", base64(value)}},
                    "a write of " + key);
  }

  /// One transaction: if `compare` holds, `success`, else the key's range.
  Json transaction(const Json& compare, const Json& success, const std::string& key) {
    Json request = Json::object();
    request["compare"] = Json::array({compare});
    request["success"] = Json::array({success});
    request["failure"] = Json::array({range_op(key)});
    return transport_.call("/v3/kv/txn", request, "a transaction on " + key);
  }

  /// The key-value of a transaction's range answer, if the key held one.
  static std::optional<Json> first_kv(const Json& reply) {
    for (const auto& r : reply.value("responses", Json::array())) {
      const auto range = r.find("response_range");
      if (range == r.end()) continue;
      const auto kvs = range->value("kvs", Json::array());
      if (!kvs.empty()) return kvs.front();
    }
    return std::nullopt;
  }

  /// A keep-alive of `lease`, a quarter of its life at each member (see call).
  Json keep_alive(const Lease& lease, const std::string& what) {
    return transport_.call("/v3/lease/keepalive", {{"ID", std::to_string(lease.id)}}, what,
                           milliseconds(lease.seconds * 1000 / 4));
  }

  /// Watches `key` from `revision` until it is put, the watch is cancelled (a compacted
  /// revision, an expired token) or `timeout` passes; the caller reads the key again.
  void watch_for_put(const std::string& key, int64_t revision, milliseconds timeout) {
    const Json create{{"key", base64(full(key))},
                      {"start_revision", std::to_string(revision)},
                      {"filters", Json::array({"NODELETE"})}};
    transport_.stream_watch(create, timeout, "a watch of " + full(key),
                            [](const Json& events) { return events.empty(); });
  }

  std::string prefix_;
  etcd::Transport transport_;
  std::map<std::string, Lease> leases_;
  std::map<std::string, Lease> claims_;
};

}  // namespace

std::vector<std::string> etcd_jobs(const EtcdOptions& options) {
  EtcdControlStore all(options, std::string(kJobsRoot));
  std::vector<std::string> jobs;
  const std::string owner = "/job/owner";  // set by the launcher that took the name
  for (const auto& key : all.list("")) {
    if (key.size() > owner.size() &&
        key.compare(key.size() - owner.size(), owner.size(), owner) == 0) {
      jobs.push_back(key.substr(0, key.size() - owner.size()));
    }
  }
  return jobs;  // sorted, as list() is
}

std::unique_ptr<ClusterStore> connect_etcd_store(const EtcdOptions& options) {
  return std::make_unique<EtcdControlStore>(options);
}

std::unique_ptr<ClusterStore> connect_etcd_root(const EtcdOptions& options) {
  return std::make_unique<EtcdControlStore>(options, std::string(kVflowRoot));
}

}  // namespace vflow::job
