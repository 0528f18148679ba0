// The transport to a cluster's etcd v3: its gRPC JSON gateway (POST /v3/...) over libcurl,
// with failover between the members, TLS and authentication (docs/design.md, "The cluster
// control store"). It knows requests and answers, not keys: the key-value semantics
// (job/etcd_store.cpp) are built on it.
#pragma once

#include <curl/curl.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "vflow/job/control_store.h"

namespace vflow::job::etcd {

using Json = nlohmann::json;

/// The gateway's encoding of keys and values.
std::string base64(const std::string& in);
/// Throws Error naming `what` for text that is not base64.
std::string unbase64(const std::string& in, const std::string& what);
/// etcd's 64-bit fields are JSON strings ("12"); an absent field is 0 (proto3).
int64_t number(const Json& j, const char* field);

class Transport {
 public:
  /// A client of the members `options.endpoints`, authenticated as `options.user` when
  /// one is given. `scope` names what it may reach, for messages (a key prefix).
  Transport(EtcdOptions options, std::string scope);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

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
            std::optional<std::chrono::milliseconds> attempt = std::nullopt,
            bool with_token = true);

  /// How a streamed watch ended.
  enum class WatchEnd { kStopped, kTimedOut, kCompacted };

  /// Streams the watch `create` (a create_request) until `on_events`, given each message's
  /// events, returns false, `timeout` passes, or the member cancels it (a compacted start
  /// revision: kCompacted; an expired token: kTimedOut after renewing it, so that the caller
  /// looks again). Members are tried in turn while they cannot be reached.
  WatchEnd stream_watch(const Json& create, std::chrono::milliseconds timeout,
                        const std::string& what, const std::function<bool(const Json&)>& on_events);

  /// Requests from now on give up after `timeout` at most (a client that is closing).
  void limit_timeout(std::chrono::milliseconds timeout);

  /// The members, "H:P,H:P", for messages.
  const std::string& address() const { return address_; }

 private:
  void authenticate();
  void configure(CURL* curl, const std::string& url, const std::string& body, curl_slist* headers,
                 std::chrono::milliseconds timeout) const;
  std::string url(size_t endpoint, const std::string& path) const;

  EtcdOptions options_;
  std::string scope_;
  std::string address_;
  struct Cleanup {
    void operator()(CURL* handle) const { curl_easy_cleanup(handle); }
  };
  std::unique_ptr<CURL, Cleanup> curl_;   // requests
  std::unique_ptr<CURL, Cleanup> watch_;  // a watch's stream, made when first needed
  size_t current_ = 0;                    // the member that answered last
  std::string token_;
};

}  // namespace vflow::job::etcd
