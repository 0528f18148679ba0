// The control store on a cluster's etcd v3, spoken through etcd's gRPC JSON gateway
// (POST /v3/...) over libcurl (docs/design.md, "The cluster control store").
//
// Keys live under /vflow/jobs/<job>/, base64-encoded on the wire as the gateway wants.
// A request goes to the member that answered last; a member that cannot be reached, or
// answers that it is unavailable, passes the request to the next. Every read-modify-write
// is one transaction (compare on a revision, then put); waits watch the keys from the
// revision at which they were seen missing, so no write between the look and the watch
// is missed.
#include <curl/curl.h>
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

#include "vflow/core/error.h"
#include "vflow/job/control_store.h"

namespace vflow::job {

namespace {

using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

const char* const kVflowRoot = "/vflow/";
const char* const kJobsRoot = "/vflow/jobs/";
// Heartbeats live here, each under the lease that keeps it.
const char* const kAlive = "store/alive/";
// Claims (ClusterStore::campaign) live here, each under its holder's lease.
const char* const kClaim = "store/claim/";

// gRPC status codes etcd answers with.
constexpr int kInvalidArgument = 3;
constexpr int kDeadlineExceeded = 4;
constexpr int kPermissionDenied = 7;
constexpr int kUnavailable = 14;
constexpr int kUnauthenticated = 16;

const char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string base64(const std::string& in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  for (size_t i = 0; i < in.size(); i += 3) {
    const size_t n = std::min<size_t>(3, in.size() - i);
    uint32_t v = 0;
    for (size_t k = 0; k < 3; ++k) {
      v = (v << 8) | (k < n ? static_cast<unsigned char>(in[i + k]) : 0u);
    }
    for (size_t k = 0; k < 4; ++k) {
      out += k <= n ? kAlphabet[(v >> (18 - 6 * k)) & 63u] : '=';
    }
  }
  return out;
}

std::string unbase64(const std::string& in, const std::string& what) {
  std::string out;
  uint32_t v = 0;
  int bits = 0;
  for (const char c : in) {
    if (c == '=') break;
    const char* at = std::strchr(kAlphabet, c);
    if (c == '\0' || at == nullptr)
      throw Error(fmt::format("etcd sent {} that is not base64", what));
    v = (v << 6) | static_cast<uint32_t>(at - kAlphabet);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((v >> bits) & 0xffu);
    }
  }
  return out;
}

/// etcd's 64-bit fields are JSON strings ("12"); an absent field is 0 (proto3).
int64_t number(const Json& j, const char* field) {
  const auto it = j.find(field);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_string()) return std::stoll(it->get<std::string>());
  return it->get<int64_t>();
}

/// The end of `prefix`'s key range: the prefix with its last byte incremented.
std::string prefix_end(std::string prefix) {
  while (!prefix.empty() && static_cast<unsigned char>(prefix.back()) == 0xff) prefix.pop_back();
  if (prefix.empty()) return std::string(1, '\0');  // every key
  prefix.back() = static_cast<char>(static_cast<unsigned char>(prefix.back()) + 1);
  return prefix;
}

void init_curl() {
  static const bool done = [] { return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK; }();
  if (!done) throw Error("libcurl could not be initialised");
}

size_t append_body(char* data, size_t size, size_t count, void* out) {
  static_cast<std::string*>(out)->append(data, size * count);
  return size * count;
}

/// A streamed answer (a watch): each complete line goes to `on_line`; false stops it.
struct Stream {
  std::string pending;
  std::function<bool(const std::string&)> on_line;
  bool stopped = false;
};

size_t stream_body(char* data, size_t size, size_t count, void* out) {
  auto& s = *static_cast<Stream*>(out);
  s.pending.append(data, size * count);
  size_t start = 0;
  for (size_t nl; (nl = s.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    if (!s.on_line(s.pending.substr(start, nl - start))) {
      s.stopped = true;
      return 0;  // ends the transfer
    }
  }
  s.pending.erase(0, start);
  return size * count;
}

/// etcd's leases count whole seconds, and it raises very short ones to its minimum.
int64_t lease_seconds(std::chrono::milliseconds ttl) {
  return std::max<int64_t>(1, (ttl.count() + 999) / 1000);
}

class EtcdControlStore final : public ClusterStore {
 public:
  /// The keys of job `options.job`, or with `prefix` given every key under it.
  explicit EtcdControlStore(EtcdOptions options, std::optional<std::string> prefix = std::nullopt)
      : options_(std::move(options)), prefix_(prefix ? *prefix : kJobsRoot + options_.job + "/") {
    VFLOW_ASSERT(!options_.endpoints.empty(), "an etcd store with no endpoints");
    init_curl();
    for (const auto& e : options_.endpoints) {
      address_ += (address_.empty() ? "" : ",") + e;
    }
    curl_.reset(curl_easy_init());
    if (!curl_) throw Error("libcurl could not make a handle");
    if (!options_.user.empty()) authenticate();
    // One round trip, so that an unreachable cluster or refused credentials show at once.
    // A key every user of this prefix may read: a job's own, or (the whole tree) the agents'.
    const std::string probe = prefix ? "agents/probe" : "store/probe";
    call("/v3/kv/range", {{"key", base64(prefix_ + probe)}}, "its first read");
  }

  ~EtcdControlStore() override {
    // The heartbeats end with this client: revoking their leases removes their keys now
    // rather than when the leases expire. Best effort, quickly.
    options_.timeout = std::min(options_.timeout, milliseconds(1000));
    for (const auto* held : {&leases_, &claims_}) {
      for (const auto& [name, lease] : *held) {
        try {
          call("/v3/lease/revoke", {{"ID", std::to_string(lease.id)}}, "a lease revoke");
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
        const auto reply = call("/v3/kv/range", {{"key", base64(full(key))}, {"count_only", true}},
                                "a read of " + key);
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
        call("/v3/kv/deleterange", {{"key", base64(full(key))}}, "a removal of " + key);
    return number(reply, "deleted") > 0;
  }

  int64_t remove_all(const std::string& prefix) override {
    const auto reply =
        call("/v3/kv/deleterange",
             {{"key", base64(full(prefix))}, {"range_end", base64(prefix_end(full(prefix)))}},
             "a removal of the keys under " + full(prefix));
    return number(reply, "deleted");
  }

  std::vector<std::string> list(const std::string& prefix) override {
    const auto reply = call("/v3/kv/range",
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
      call("/v3/lease/revoke", {{"ID", std::to_string(it->second.id)}}, "a lease revoke");
      leases_.erase(it);
    }
    const auto grant = call("/v3/lease/grant", {{"TTL", std::to_string(seconds)}}, "a lease grant");
    const Lease lease{number(grant, "ID"), seconds};
    call("/v3/kv/put",
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
    const auto grant = call("/v3/lease/grant", {{"TTL", std::to_string(seconds)}}, "a lease grant");
    const Lease lease{number(grant, "ID"), seconds};
    const std::string key = kClaim + name;
    Json request = Json::object();
    request["compare"] = Json::array({absent(key)});
    request["success"] = Json::array({Json{{"request_put",
                                            {{"key", base64(full(key))},
                                             {"value", base64(me)},
                                             {"lease", std::to_string(lease.id)}}}}});
    request["failure"] = Json::array({range_op(key)});
    const auto reply = call("/v3/kv/txn", request, "a claim of " + name);
    const auto kv = first_kv(reply);
    // A transaction whose answer was lost with a failing member is repeated on the next: it
    // then finds the claim this very lease made, which is a success too.
    if (reply.value("succeeded", false) || (kv && number(*kv, "lease") == lease.id)) {
      claims_[name] = lease;
      return me;
    }
    try {
      call("/v3/lease/revoke", {{"ID", std::to_string(lease.id)}}, "a lease revoke");
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
    call("/v3/lease/revoke", {{"ID", std::to_string(id)}}, "a lease revoke");
  }

  std::optional<std::string> holder(const std::string& name) override { return get(kClaim + name); }

  std::map<std::string, std::string> scan(const std::string& prefix, int64_t* revision) override {
    const auto reply =
        call("/v3/kv/range",
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
      const auto end =
          stream_watch(create, left, "a watch of " + full(prefix), [&](const Json& batch) {
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
      if (end == WatchEnd::kCompacted) return std::nullopt;
    }
    revision = last;
    return events;
  }

  std::string address() const override { return address_; }

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
    const auto reply = call("/v3/kv/range", {{"key", base64(full(key))}}, "a read of " + key);
    const auto kvs = reply.value("kvs", Json::array());
    if (kvs.empty()) return std::nullopt;
    return kvs.front();
  }

  void put(const std::string& key, const std::string& value) {
    call("/v3/kv/put", {{"key", base64(full(key))}, {"value", base64(value)}}, "a write of " + key);
  }

  /// One transaction: if `compare` holds, `success`, else the key's range.
  Json transaction(const Json& compare, const Json& success, const std::string& key) {
    Json request = Json::object();
    request["compare"] = Json::array({compare});
    request["success"] = Json::array({success});
    request["failure"] = Json::array({range_op(key)});
    return call("/v3/kv/txn", request, "a transaction on " + key);
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

  void authenticate() {
    const auto reply =
        call("/v3/auth/authenticate", {{"name", options_.user}, {"password", options_.password}},
             "authentication", std::nullopt, /*with_token=*/false);
    token_ = reply.value("token", "");
    if (token_.empty()) {
      throw Error(fmt::format("etcd at {} gave user {} no token", address_, options_.user));
    }
  }

  void configure(CURL* curl, const std::string& url, const std::string& body, curl_slist* headers,
                 milliseconds timeout) const {
    curl_easy_reset(curl);
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS,
                     static_cast<long>(std::max<int64_t>(1, timeout.count())));
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(std::clamp<int64_t>(timeout.count(), 1, 2000)));
    curl_easy_setopt(curl, CURLOPT_TCP_NODELAY, 1L);
    if (options_.tls) {
      if (!options_.ca_file.empty())
        curl_easy_setopt(curl, CURLOPT_CAINFO, options_.ca_file.c_str());
      if (!options_.cert_file.empty()) {
        curl_easy_setopt(curl, CURLOPT_SSLCERT, options_.cert_file.c_str());
        curl_easy_setopt(curl, CURLOPT_SSLKEY, options_.key_file.c_str());
      }
    }
  }

  std::string url(size_t endpoint, const std::string& path) const {
    return fmt::format("{}://{}{}", options_.tls ? "https" : "http", options_.endpoints[endpoint],
                       path);
  }

  /// A keep-alive of `lease`, a quarter of its life at each member (see call).
  Json keep_alive(const Lease& lease, const std::string& what) {
    return call("/v3/lease/keepalive", {{"ID", std::to_string(lease.id)}}, what,
                milliseconds(lease.seconds * 1000 / 4));
  }

  struct Headers {
    curl_slist* list = nullptr;
    explicit Headers(const std::string& token) {
      list = curl_slist_append(list, "Content-Type: application/json");
      if (!token.empty()) list = curl_slist_append(list, ("Authorization: " + token).c_str());
    }
    ~Headers() { curl_slist_free_all(list); }
  };

  /// One request, to the members in turn from the one that answered last; the answer's
  /// body. Throws PeerFailure when none answers within the timeout, Error when etcd
  /// refuses the request. Each member gets a share of the timeout (`attempt`, or the
  /// timeout over the members), and the members are asked round after round, each round
  /// with twice the share, until one answers or the timeout passes, unless none listens
  /// at all. A member that stopped answering (a hung machine, a cut link) thus takes only
  /// its share; and a keep-alive, which a member forwards to the leader and which can hang
  /// there for seconds when the leader is cut off, goes to another member, or to the same
  /// one after the election, before its lease runs out.
  Json call(const std::string& path, const Json& request, const std::string& what,
            std::optional<milliseconds> attempt = std::nullopt, bool with_token = true) {
    const auto deadline = Clock::now() + options_.timeout;
    const std::string body = request.dump();
    const size_t n = options_.endpoints.size();
    // Doubled after every round: members that all answer slowly (a loaded machine) are
    // waited for long enough in the end.
    milliseconds share =
        std::max(milliseconds(1), attempt ? *attempt : options_.timeout / static_cast<int64_t>(n));
    std::vector<std::string> failures(n);  // each member's last
    bool renewed = false;
    bool refused_only = true;  // in this round, every member refused the connection
    for (size_t tried = 0;;) {
      if (tried == n) {
        if (refused_only) break;  // nothing listens: no use waiting
        tried = 0;
        refused_only = true;
        std::this_thread::sleep_for(std::min(milliseconds(100), share));
        share *= 2;
      }
      const size_t e = (current_ + tried) % n;
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      if (left <= milliseconds(0)) break;
      Headers headers(with_token ? token_ : std::string());
      std::string answer;
      configure(curl_.get(), url(e, path), body, headers.list, std::min(left, share));
      curl_easy_setopt(curl_.get(), CURLOPT_WRITEFUNCTION, append_body);
      curl_easy_setopt(curl_.get(), CURLOPT_WRITEDATA, &answer);
      const CURLcode rc = curl_easy_perform(curl_.get());
      if (rc != CURLE_OK) {
        failures[e] = fmt::format("{}: {}", options_.endpoints[e], curl_easy_strerror(rc));
        refused_only = refused_only && rc == CURLE_COULDNT_CONNECT;
        ++tried;
        continue;
      }
      Json reply = Json::parse(answer, nullptr, /*allow_exceptions=*/false);
      if (reply.is_discarded() || !reply.is_object()) {
        throw Error(fmt::format("etcd at {} answered {} with '{}', not JSON", options_.endpoints[e],
                                what, answer.substr(0, 200)));
      }
      if (!reply.contains("code") && !(reply.contains("error") && reply["error"].is_object())) {
        current_ = e;
        return reply;
      }
      const auto& error = reply.contains("code") ? reply : reply.at("error");
      // A streamed answer (a keep-alive's) names its code grpc_code.
      const int code =
          static_cast<int>(number(error, error.contains("code") ? "code" : "grpc_code"));
      const std::string message = error.value("message", error.value("error", std::string("?")));
      if (code == kUnauthenticated && with_token && !options_.user.empty() && !renewed) {
        authenticate();  // the token expired: once more with a new one
        renewed = true;
        continue;
      }
      if (code == kUnavailable || code == kDeadlineExceeded) {  // no leader, say: ask again
        failures[e] = fmt::format("{}: {}", options_.endpoints[e], message);
        refused_only = false;
        ++tried;
        continue;
      }
      if (code == kPermissionDenied) {
        throw Error(fmt::format("etcd at {} refused {} under {} to user '{}': {}",
                                options_.endpoints[e], what, prefix_, options_.user, message));
      }
      if (code == kInvalidArgument && message.find("user name is empty") != std::string::npos) {
        throw Error(
            fmt::format("etcd at {} requires authentication: set VFLOW_ETCD_USER and "
                        "VFLOW_ETCD_PASSWORD_FILE",
                        options_.endpoints[e]));
      }
      throw Error(fmt::format("etcd at {} refused {}: {} (code {})", options_.endpoints[e], what,
                              message, code));
    }
    std::string why;
    for (const auto& f : failures) {
      if (!f.empty()) why += (why.empty() ? "" : "; ") + f;
    }
    throw PeerFailure(fmt::format("[elastic] cannot reach etcd at {} for {} within {} ms: {}",
                                  address_, what, options_.timeout.count(),
                                  why.empty() ? "timed out" : why));
  }

  /// How a streamed watch ended.
  enum class WatchEnd { kStopped, kTimedOut, kCompacted };

  /// Streams the watch `create` (a create_request) until `on_events`, given each message's
  /// events, returns false, `timeout` passes, or the member cancels it (a compacted start
  /// revision: kCompacted; an expired token: kTimedOut after renewing it, so that the caller
  /// looks again). Members are tried in turn while they cannot be reached.
  WatchEnd stream_watch(const Json& create, milliseconds timeout, const std::string& what,
                        const std::function<bool(const Json&)>& on_events) {
    const auto deadline = Clock::now() + timeout;
    const std::string body = Json{{"create_request", create}}.dump();
    if (!watch_) watch_.reset(curl_easy_init());
    if (!watch_) throw Error("libcurl could not make a handle");
    const size_t n = options_.endpoints.size();
    std::string last_failure;
    for (size_t tried = 0; tried < n; ++tried) {
      const size_t e = (current_ + tried) % n;
      const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
      if (left <= milliseconds(0)) return WatchEnd::kTimedOut;
      bool stopped = false;
      bool created = false;  // the member answered: a timeout from now on is the bound's
      bool compacted = false;
      std::string refused;
      Stream stream;
      stream.on_line = [&](const std::string& line) {
        const Json message = Json::parse(line, nullptr, false);
        if (message.is_discarded()) return true;
        if (message.contains("error")) {
          refused = message["error"].is_object() ? message["error"].value("message", line) : line;
          return false;
        }
        const auto& result = message.contains("result") ? message["result"] : message;
        created = true;
        if (result.value("canceled", false)) {
          compacted = number(result, "compact_revision") > 0;
          refused = result.value("cancel_reason", std::string("the watch was cancelled"));
          return false;
        }
        stopped = !on_events(result.value("events", Json::array()));
        return !stopped;
      };
      Headers headers(token_);
      configure(watch_.get(), url(e, "/v3/watch"), body, headers.list, left);
      curl_easy_setopt(watch_.get(), CURLOPT_WRITEFUNCTION, stream_body);
      curl_easy_setopt(watch_.get(), CURLOPT_WRITEDATA, &stream);
      const CURLcode rc = curl_easy_perform(watch_.get());
      if (stopped) return WatchEnd::kStopped;
      if (compacted) return WatchEnd::kCompacted;
      if (!refused.empty()) {
        if (refused.find("permission denied") != std::string::npos) {
          throw Error(fmt::format("etcd at {} refused {} to user '{}': {}", options_.endpoints[e],
                                  what, options_.user, refused));
        }
        // A token that expired: look again from now.
        if (!options_.user.empty()) authenticate();
        std::this_thread::sleep_for(milliseconds(20));
        return WatchEnd::kTimedOut;
      }
      if (rc == CURLE_OPERATION_TIMEDOUT &&
          (created || Clock::now() + milliseconds(50) >= deadline)) {
        return WatchEnd::kTimedOut;
      }
      last_failure = fmt::format("{}: {}", options_.endpoints[e], curl_easy_strerror(rc));
    }
    throw PeerFailure(
        fmt::format("[elastic] cannot reach etcd at {} for {}: {}", address_, what, last_failure));
  }

  /// Watches `key` from `revision` until it is put, the watch is cancelled (a compacted
  /// revision, an expired token) or `timeout` passes; the caller reads the key again.
  void watch_for_put(const std::string& key, int64_t revision, milliseconds timeout) {
    const Json create{{"key", base64(full(key))},
                      {"start_revision", std::to_string(revision)},
                      {"filters", Json::array({"NODELETE"})}};
    stream_watch(create, timeout, "a watch of " + full(key),
                 [](const Json& events) { return events.empty(); });
  }

  EtcdOptions options_;
  std::string prefix_;
  std::string address_;
  struct Cleanup {
    void operator()(CURL* handle) const { curl_easy_cleanup(handle); }
  };
  std::unique_ptr<CURL, Cleanup> curl_;   // requests
  std::unique_ptr<CURL, Cleanup> watch_;  // a watch's stream, made when first needed
  size_t current_ = 0;                    // the member that answered last
  std::string token_;
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
