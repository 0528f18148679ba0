// The embedded control store: a small key-value server on one address and its client.
//
// Wire format, both ways: a frame is a 4-byte length (little-endian) and that many bytes.
// A request frame starts with an operation byte, then its fields: strings as a 4-byte
// length and bytes, integers as 8 little-endian bytes. A reply frame starts with a status
// byte (0: done) and the operation's results. kPublish has no reply.
#include "job/embedded_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <thread>
#include <vector>

#include "vflow/core/error.h"
#include "vflow/job/control_store.h"

namespace vflow::job {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

enum Op : uint8_t {
  kGet = 1,
  kSet = 2,
  kPublish = 3,
  kSetIfAbsent = 4,
  kCompareAndSet = 5,
  kAdd = 6,
  kRemove = 7,
  kList = 8,
  kHeartbeat = 9,
  kAlive = 10,
  kAliveNames = 11,
  kWait = 12,
};

// Larger frames are refused: no key or value of a job comes near (a training state goes
// over the collectives, never through the store).
constexpr uint32_t kMaxFrame = 64u << 20;
// A client with more replies unread, or more waits pending, is not one of a job's: it is
// disconnected, so that it cannot make the server hold memory without bound.
constexpr size_t kMaxPendingReply = 64u << 20;
constexpr size_t kMaxWaits = 4096;

/// Builds a frame.
class Writer {
 public:
  Writer& byte(uint8_t b) {
    data_.push_back(static_cast<char>(b));
    return *this;
  }
  Writer& integer(int64_t v) {
    for (int i = 0; i < 8; ++i)
      data_.push_back(static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff));
    return *this;
  }
  Writer& text(const std::string& s) {
    const auto n = static_cast<uint32_t>(s.size());
    for (int i = 0; i < 4; ++i) data_.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
    data_ += s;
    return *this;
  }
  /// The frame with its length in front.
  std::string frame() const {
    std::string out;
    const auto n = static_cast<uint32_t>(data_.size());
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
    return out + data_;
  }

 private:
  std::string data_;
};

/// Reads a frame's fields; a frame too short for them is a protocol error.
class Reader {
 public:
  explicit Reader(const std::string& data) : data_(data) {}
  uint8_t byte() {
    need(1);
    return static_cast<uint8_t>(data_[at_++]);
  }
  int64_t integer() {
    need(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i)
      v |= static_cast<uint64_t>(static_cast<uint8_t>(data_[at_ + i])) << (8 * i);
    at_ += 8;
    return static_cast<int64_t>(v);
  }
  std::string text() {
    need(4);
    uint32_t n = 0;
    for (int i = 0; i < 4; ++i)
      n |= static_cast<uint32_t>(static_cast<uint8_t>(data_[at_ + i])) << (8 * i);
    at_ += 4;
    need(n);
    std::string s = data_.substr(at_, n);
    at_ += n;
    return s;
  }

 private:
  void need(size_t n) const {
    if (at_ + n > data_.size()) throw Error("a truncated frame");
  }
  const std::string& data_;
  size_t at_ = 0;
};

uint32_t frame_length(const std::string& buffer) {
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i)
    n |= static_cast<uint32_t>(static_cast<uint8_t>(buffer[i])) << (8 * i);
  return n;
}

/// The address of `host` (a name or a numeric address), IPv4.
sockaddr_in resolve(const std::string& host, int port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &address.sin_addr) == 1) return address;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || !found) {
    throw Error(fmt::format("cannot resolve '{}'", host));
  }
  address.sin_addr = reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr;
  freeaddrinfo(found);
  return address;
}

}  // namespace

// ---- the server ----------------------------------------------------------------------

struct EmbeddedStoreServer::Impl {
  struct Connection {
    int fd = -1;
    std::string in, out;
  };
  struct Waiter {
    int fd;
    std::vector<std::string> keys;
    Clock::time_point deadline;
  };

  int listener = -1;
  int wake[2] = {-1, -1};
  int port = 0;
  std::atomic<bool> stop{false};
  std::map<int, Connection> connections;
  std::map<std::string, std::string> data;
  std::map<std::string, Clock::time_point> beats;  // name -> when it expires
  std::deque<Waiter> waiters;
  std::thread thread;

  bool holds(const std::vector<std::string>& keys) const {
    return std::all_of(keys.begin(), keys.end(),
                       [&](const std::string& k) { return data.count(k) != 0; });
  }

  void reply(int fd, const Writer& w) { connections[fd].out += w.frame(); }

  /// Answers the waiters whose keys are all there, or whose time is up.
  void settle_waiters() {
    const auto now = Clock::now();
    for (auto it = waiters.begin(); it != waiters.end();) {
      const bool ready = holds(it->keys);
      if (ready || now >= it->deadline) {
        if (connections.count(it->fd) != 0) reply(it->fd, Writer().byte(0).byte(ready ? 1 : 0));
        it = waiters.erase(it);
      } else {
        ++it;
      }
    }
  }

  void handle(int fd, const std::string& frame) {
    Reader r(frame);
    const uint8_t op = r.byte();
    switch (op) {
      case kGet: {
        const auto it = data.find(r.text());
        reply(fd, it == data.end() ? Writer().byte(0).byte(0)
                                   : Writer().byte(0).byte(1).text(it->second));
        return;
      }
      case kSet:
      case kPublish: {
        auto key = r.text();
        data[key] = r.text();
        if (op == kSet) reply(fd, Writer().byte(0));
        return;
      }
      case kSetIfAbsent: {
        auto key = r.text();
        auto value = r.text();
        const auto it = data.emplace(std::move(key), std::move(value)).first;
        reply(fd, Writer().byte(0).text(it->second));
        return;
      }
      case kCompareAndSet: {
        const auto key = r.text();
        const bool has_expected = r.byte() != 0;
        const auto expected = r.text();
        const auto desired = r.text();
        const auto it = data.find(key);
        const bool matches =
            has_expected ? (it != data.end() && it->second == expected) : it == data.end();
        if (matches) data[key] = desired;
        reply(fd, Writer().byte(0).byte(data.count(key) && data[key] == desired ? 1 : 0));
        return;
      }
      case kAdd: {
        const auto key = r.text();
        const int64_t delta = r.integer();
        auto& value = data[key];
        int64_t now = 0;
        if (!value.empty()) {
          char* end = nullptr;
          now = std::strtoll(value.c_str(), &end, 10);
          if (*end != '\0') throw Error(fmt::format("key {} holds no counter", key));
        }
        now += delta;
        value = std::to_string(now);
        reply(fd, Writer().byte(0).integer(now));
        return;
      }
      case kRemove:
        reply(fd, Writer().byte(0).byte(data.erase(r.text()) != 0 ? 1 : 0));
        return;
      case kList: {
        const auto prefix = r.text();
        Writer w;
        w.byte(0);
        std::vector<std::string> keys;
        for (auto it = data.lower_bound(prefix);
             it != data.end() && it->first.rfind(prefix, 0) == 0; ++it) {
          keys.push_back(it->first);
        }
        w.integer(static_cast<int64_t>(keys.size()));
        for (const auto& k : keys) w.text(k);
        reply(fd, w);
        return;
      }
      case kHeartbeat: {
        const auto name = r.text();
        beats[name] = Clock::now() + milliseconds(r.integer());
        reply(fd, Writer().byte(0));
        return;
      }
      case kAlive: {
        const auto it = beats.find(r.text());
        reply(fd, Writer().byte(0).byte(it != beats.end() && it->second > Clock::now() ? 1 : 0));
        return;
      }
      case kAliveNames: {
        const auto prefix = r.text();
        std::vector<std::string> names;
        for (auto it = beats.lower_bound(prefix);
             it != beats.end() && it->first.rfind(prefix, 0) == 0; ++it) {
          if (it->second > Clock::now()) names.push_back(it->first);
        }
        Writer w;
        w.byte(0).integer(static_cast<int64_t>(names.size()));
        for (const auto& n : names) w.text(n);
        reply(fd, w);
        return;
      }
      case kWait: {
        if (waiters.size() >= kMaxWaits) throw Error("too many waits");
        Waiter waiter{fd, {}, Clock::now() + milliseconds(r.integer())};
        const int64_t n = r.integer();
        for (int64_t k = 0; k < n; ++k) waiter.keys.push_back(r.text());
        waiters.push_back(std::move(waiter));
        return;  // answered by settle_waiters
      }
      default:
        throw Error(fmt::format("unknown operation {}", op));
    }
  }

  void close_connection(int fd) {
    ::close(fd);
    connections.erase(fd);
    // The number may come back with the next connection: nothing pending may reach it.
    waiters.erase(std::remove_if(waiters.begin(), waiters.end(),
                                 [fd](const Waiter& w) { return w.fd == fd; }),
                  waiters.end());
  }

  void read_from(int fd) {
    auto& c = connections[fd];
    char buffer[65536];
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) {
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
      close_connection(fd);
      return;
    }
    c.in.append(buffer, static_cast<size_t>(n));
    while (c.in.size() >= 4) {
      const uint32_t length = frame_length(c.in);
      if (length > kMaxFrame) {
        close_connection(fd);  // not a client of this store
        return;
      }
      if (c.in.size() < 4 + length) break;
      const std::string frame = c.in.substr(4, length);
      c.in.erase(0, 4 + length);
      try {
        handle(fd, frame);
      } catch (const std::exception& e) {
        spdlog::warn("[elastic] the job's store closed a connection: {}", e.what());
        close_connection(fd);  // a malformed request: the client cannot be in step
        return;
      }
      if (connections[fd].out.size() > kMaxPendingReply) {
        spdlog::warn("[elastic] the job's store closed a connection that reads no replies");
        close_connection(fd);
        return;
      }
    }
  }

  void write_to(int fd) {
    auto& c = connections[fd];
    while (!c.out.empty()) {
      const ssize_t n = ::send(fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) return;
        close_connection(fd);
        return;
      }
      c.out.erase(0, static_cast<size_t>(n));
    }
  }

  void serve() {
    while (!stop) {
      try {
        serve_once();
      } catch (const std::exception& e) {
        // Out of memory, say: the store goes on for the clients it can serve.
        spdlog::error("[elastic] the job's store: {}", e.what());
        std::this_thread::sleep_for(milliseconds(10));
      }
    }
  }

  void serve_once() {
    {
      std::vector<pollfd> fds{{listener, POLLIN, 0}, {wake[0], POLLIN, 0}};
      for (const auto& [fd, c] : connections) {
        fds.push_back({fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
      }
      int wait_ms = 1000;
      for (const auto& w : waiters) {
        const auto left = std::chrono::ceil<milliseconds>(w.deadline - Clock::now()).count();
        wait_ms = static_cast<int>(std::clamp<int64_t>(left, 0, wait_ms));
      }
      if (::poll(fds.data(), fds.size(), wait_ms) < 0) return;  // EINTR: poll again
      if (fds[0].revents & POLLIN) {
        const int fd = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
          const int one = 1;
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          connections[fd].fd = fd;
        } else if (errno == EMFILE || errno == ENFILE) {
          // Out of descriptors: the connection waits in the backlog; do not spin on it.
          std::this_thread::sleep_for(milliseconds(50));
        }
      }
      for (size_t i = 2; i < fds.size(); ++i) {
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_from(fds[i].fd);
      }
      settle_waiters();
      std::vector<int> pending;
      for (const auto& [fd, c] : connections) {
        if (!c.out.empty()) pending.push_back(fd);
      }
      for (const int fd : pending) write_to(fd);
    }
  }
};

EmbeddedStoreServer::EmbeddedStoreServer(const std::string& host, int port)
    : impl_(std::make_unique<Impl>()) {
  const auto address = resolve(host, port);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd < 0 || ::bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0 ||
      ::listen(fd, 128) != 0) {
    const int e = errno;
    if (fd >= 0) ::close(fd);
    throw Error(fmt::format("cannot listen on {}:{}: {}", host, port, std::strerror(e)));
  }
  sockaddr_in bound{};
  socklen_t length = sizeof bound;
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
  impl_->listener = fd;
  impl_->port = ntohs(bound.sin_port);
  if (pipe2(impl_->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    ::close(fd);
    throw Error(fmt::format("pipe failed: {}", std::strerror(errno)));
  }
  impl_->thread = std::thread([this] { impl_->serve(); });
}

EmbeddedStoreServer::~EmbeddedStoreServer() {
  impl_->stop = true;
  (void)!::write(impl_->wake[1], "x", 1);
  impl_->thread.join();
  for (const auto& [fd, c] : impl_->connections) ::close(fd);
  ::close(impl_->listener);
  ::close(impl_->wake[0]);
  ::close(impl_->wake[1]);
}

int EmbeddedStoreServer::port() const { return impl_->port; }

// ---- the client ----------------------------------------------------------------------

namespace {

class EmbeddedControlStore final : public ControlStore {
 public:
  EmbeddedControlStore(const std::string& host, int port, milliseconds timeout)
      : address_(fmt::format("{}:{}", host, port)), timeout_(timeout) {
    const auto deadline = Clock::now() + timeout;
    std::string why;
    // The coordinator may be starting: connection refused is retried until the timeout.
    while (true) {
      try {
        const auto address = resolve(host, port);
        fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        timeval tv{};
        const auto ms = std::max<int64_t>(1, timeout.count());
        tv.tv_sec = ms / 1000;
        tv.tv_usec = (ms % 1000) * 1000;
        setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        const int one = 1;
        setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (::connect(fd_, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0) {
          return;
        }
        why = std::strerror(errno);
      } catch (const Error& e) {
        why = e.what();
      }
      if (fd_ >= 0) ::close(fd_);
      fd_ = -1;
      if (Clock::now() >= deadline) break;
      std::this_thread::sleep_for(milliseconds(20));
    }
    throw PeerFailure(
        fmt::format("[elastic] cannot reach the job's coordinator at {}: {}", address_, why));
  }

  ~EmbeddedControlStore() override {
    if (fd_ >= 0) ::close(fd_);
  }

  std::optional<std::string> get(const std::string& key) override {
    const auto reply = call(Writer().byte(kGet).text(key));
    Reader r(reply);
    r.byte();
    if (r.byte() == 0) return std::nullopt;
    return r.text();
  }

  void set(const std::string& key, const std::string& value) override {
    call(Writer().byte(kSet).text(key).text(value));
  }

  void publish(const std::string& key, const std::string& value) override {
    send(Writer().byte(kPublish).text(key).text(value));
  }

  std::string set_if_absent(const std::string& key, const std::string& value) override {
    const auto reply = call(Writer().byte(kSetIfAbsent).text(key).text(value));
    Reader r(reply);
    r.byte();
    return r.text();
  }

  bool compare_and_set(const std::string& key, const std::optional<std::string>& expected,
                       const std::string& desired) override {
    VFLOW_ASSERT(!expected || *expected != desired, "compare_and_set needs a change");
    const auto reply = call(Writer()
                                .byte(kCompareAndSet)
                                .text(key)
                                .byte(expected ? 1 : 0)
                                .text(expected.value_or(""))
                                .text(desired));
    Reader r(reply);
    r.byte();
    return r.byte() != 0;
  }

  int64_t add(const std::string& key, int64_t delta) override {
    const auto reply = call(Writer().byte(kAdd).text(key).integer(delta));
    Reader r(reply);
    r.byte();
    return r.integer();
  }

  bool wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    Writer w;
    w.byte(kWait).integer(timeout.count()).integer(static_cast<int64_t>(keys.size()));
    for (const auto& k : keys) w.text(k);
    const auto reply = call(w, timeout);
    Reader r(reply);
    r.byte();
    return r.byte() != 0;
  }

  bool remove(const std::string& key) override {
    const auto reply = call(Writer().byte(kRemove).text(key));
    Reader r(reply);
    r.byte();
    return r.byte() != 0;
  }

  int64_t remove_all(const std::string& prefix) override {
    int64_t removed = 0;
    for (const auto& key : list(prefix)) removed += remove(key) ? 1 : 0;
    return removed;
  }

  std::vector<std::string> list(const std::string& prefix) override {
    return names(Writer().byte(kList).text(prefix));
  }

  void heartbeat(const std::string& name, milliseconds ttl) override {
    call(Writer().byte(kHeartbeat).text(name).integer(ttl.count()));
  }

  bool alive(const std::string& name) override {
    const auto reply = call(Writer().byte(kAlive).text(name));
    Reader r(reply);
    r.byte();
    return r.byte() != 0;
  }

  std::vector<std::string> alive_names(const std::string& prefix) override {
    return names(Writer().byte(kAliveNames).text(prefix));
  }

  std::string address() const override { return address_; }

 private:
  std::vector<std::string> names(const Writer& request) {
    const auto reply = call(request);
    Reader r(reply);
    r.byte();
    std::vector<std::string> out(static_cast<size_t>(r.integer()));
    for (auto& name : out) name = r.text();
    return out;
  }

  /// Store errors are the coordinator's loss, and stay so: a connection that failed once
  /// (a reply that timed out, say) may still deliver the answer it gave up on, and would
  /// read it as the answer to the next call.
  [[noreturn]] void lose(const std::string& why) {
    lost_ = fmt::format("[elastic] lost the job's coordinator at {}: {}", address_, why);
    throw PeerFailure(lost_);
  }

  void send(const Writer& request) {
    if (!lost_.empty()) throw PeerFailure(lost_);
    const std::string frame = request.frame();
    size_t sent = 0;
    while (sent < frame.size()) {
      const ssize_t n = ::send(fd_, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) lose(std::strerror(errno));
      sent += static_cast<size_t>(n);
    }
  }

  void receive(char* at, size_t n, Clock::time_point deadline) {
    size_t got = 0;
    while (got < n) {
      const ssize_t k = ::recv(fd_, at + got, n - got, 0);
      if (k > 0) {
        got += static_cast<size_t>(k);
        continue;
      }
      if (k < 0 && (errno == EINTR ||
                    ((errno == EAGAIN || errno == EWOULDBLOCK) && Clock::now() < deadline))) {
        continue;  // a wait longer than the socket's timeout
      }
      lose(k == 0 ? "the connection was closed" : std::strerror(errno));
    }
  }

  /// One request and its reply; `extra` is how much longer than the timeout the server
  /// may take (a wait).
  std::string call(const Writer& request, milliseconds extra = milliseconds(0)) {
    send(request);
    const auto deadline = Clock::now() + timeout_ + extra;
    char head[4];
    receive(head, 4, deadline);
    const uint32_t length = frame_length(std::string(head, 4));
    if (length == 0 || length > kMaxFrame) lose("a malformed reply");
    std::string reply(length, '\0');
    receive(reply.data(), length, deadline);
    if (reply[0] != 0) lose("the request was refused");
    return reply;
  }

  std::string address_;
  milliseconds timeout_;
  int fd_ = -1;
  std::string lost_;  // why the connection is no longer usable; empty while it is
};

}  // namespace

std::unique_ptr<ControlStore> connect_embedded_store(const std::string& host, int port,
                                                     milliseconds timeout) {
  return std::make_unique<EmbeddedControlStore>(host, port, timeout);
}

namespace {

/// A client that keeps the server it talks to.
class HostedControlStore final : public ControlStore {
 public:
  HostedControlStore(const std::string& host, int port, milliseconds timeout) {
    try {
      server_ = std::make_unique<EmbeddedStoreServer>(host, port);
    } catch (const Error& e) {
      // Taken by another process, most likely a job on the same MASTER_PORT.
      throw PeerFailure(fmt::format("[comm] cannot host the job's store: {}", e.what()));
    }
    client_ = connect_embedded_store(host, server_->port(), timeout);
  }
  std::optional<std::string> get(const std::string& key) override { return client_->get(key); }
  void set(const std::string& key, const std::string& value) override { client_->set(key, value); }
  void publish(const std::string& key, const std::string& value) override {
    client_->publish(key, value);
  }
  std::string set_if_absent(const std::string& key, const std::string& value) override {
    return client_->set_if_absent(key, value);
  }
  bool compare_and_set(const std::string& key, const std::optional<std::string>& expected,
                       const std::string& desired) override {
    return client_->compare_and_set(key, expected, desired);
  }
  int64_t add(const std::string& key, int64_t delta) override { return client_->add(key, delta); }
  bool wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    return client_->wait(keys, timeout);
  }
  bool remove(const std::string& key) override { return client_->remove(key); }
  int64_t remove_all(const std::string& prefix) override { return client_->remove_all(prefix); }
  std::vector<std::string> list(const std::string& prefix) override {
    return client_->list(prefix);
  }
  void heartbeat(const std::string& name, milliseconds ttl) override {
    client_->heartbeat(name, ttl);
  }
  bool alive(const std::string& name) override { return client_->alive(name); }
  std::vector<std::string> alive_names(const std::string& prefix) override {
    return client_->alive_names(prefix);
  }
  std::string address() const override { return client_->address(); }

 private:
  std::unique_ptr<EmbeddedStoreServer> server_;
  std::unique_ptr<ControlStore> client_;
};

}  // namespace

std::unique_ptr<ControlStore> host_embedded_store(const std::string& host, int port,
                                                  milliseconds timeout) {
  return std::make_unique<HostedControlStore>(host, port, timeout);
}

bool is_loopback_host(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr address{};
  return inet_pton(AF_INET, host.c_str(), &address) == 1 && (ntohl(address.s_addr) >> 24) == 127;
}

void check_store_exposure(const std::string& host, bool allowed, const std::string& what) {
  if (allowed || is_loopback_host(host)) return;
  throw SpecError(fmt::format(
      "{} is on {}, which other machines can reach: the job's store has no authentication "
      "there (anyone who reaches it can stop or resize the job, or overwrite its keys). Use a "
      "cluster control store (--control etcds://..., docs/distributed.md), or set "
      "resources.unauthenticated_store: true on a network you trust",
      what, host));
}

}  // namespace vflow::job
