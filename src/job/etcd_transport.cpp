#include "job/etcd_transport.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "vflow/core/error.h"

namespace vflow::job::etcd {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// gRPC status codes etcd answers with.
constexpr int kInvalidArgument = 3;
constexpr int kDeadlineExceeded = 4;
constexpr int kPermissionDenied = 7;
constexpr int kUnavailable = 14;
constexpr int kUnauthenticated = 16;

const char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

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

struct Headers {
  curl_slist* list = nullptr;
  explicit Headers(const std::string& token) {
    list = curl_slist_append(list, "Content-Type: application/json");
    if (!token.empty()) list = curl_slist_append(list, ("Authorization: " + token).c_str());
  }
  ~Headers() { curl_slist_free_all(list); }
};

}  // namespace

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

Transport::Transport(EtcdOptions options, std::string scope)
    : options_(std::move(options)), scope_(std::move(scope)) {
  VFLOW_ASSERT(!options_.endpoints.empty(), "an etcd store with no endpoints");
  init_curl();
  for (const auto& e : options_.endpoints) {
    address_ += (address_.empty() ? "" : ",") + e;
  }
  curl_.reset(curl_easy_init());
  if (!curl_) throw Error("libcurl could not make a handle");
  if (!options_.user.empty()) authenticate();
}

Transport::~Transport() = default;

void Transport::limit_timeout(milliseconds timeout) {
  options_.timeout = std::min(options_.timeout, timeout);
}

void Transport::authenticate() {
  const auto reply =
      call("/v3/auth/authenticate", {{"name", options_.user}, {"password", options_.password}},
           "authentication", std::nullopt, /*with_token=*/false);
  token_ = reply.value("token", "");
  if (token_.empty()) {
    throw Error(fmt::format("etcd at {} gave user {} no token", address_, options_.user));
  }
}

void Transport::configure(CURL* curl, const std::string& url, const std::string& body,
                          curl_slist* headers, milliseconds timeout) const {
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
    if (!options_.ca_file.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, options_.ca_file.c_str());
    if (!options_.cert_file.empty()) {
      curl_easy_setopt(curl, CURLOPT_SSLCERT, options_.cert_file.c_str());
      curl_easy_setopt(curl, CURLOPT_SSLKEY, options_.key_file.c_str());
    }
  }
}

std::string Transport::url(size_t endpoint, const std::string& path) const {
  return fmt::format("{}://{}{}", options_.tls ? "https" : "http", options_.endpoints[endpoint],
                     path);
}

Json Transport::call(const std::string& path, const Json& request, const std::string& what,
                     std::optional<milliseconds> attempt, bool with_token) {
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
    const int code = static_cast<int>(number(error, error.contains("code") ? "code" : "grpc_code"));
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
      throw RequestRefused(fmt::format("etcd at {} refused {} under {} to user '{}': {}",
                                       options_.endpoints[e], what, scope_, options_.user,
                                       message));
    }
    if (code == kInvalidArgument && message.find("user name is empty") != std::string::npos) {
      throw SpecError(
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

Transport::WatchEnd Transport::stream_watch(const Json& create, milliseconds timeout,
                                            const std::string& what,
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
        throw RequestRefused(fmt::format("etcd at {} refused {} to user '{}': {}",
                                         options_.endpoints[e], what, options_.user, refused));
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

}  // namespace vflow::job::etcd
