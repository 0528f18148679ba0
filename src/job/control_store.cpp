#include "vflow/job/control_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <unordered_set>

#include "comm/store.h"
#include "job/control_records.h"
#include "vflow/core/error.h"

namespace vflow::job {

namespace {

// The embedded store's own keys, apart from the protocol's: an index of every key
// created (for list) and the heartbeats.
const char* const kIndexCount = "store/index/count";
std::string index_entry(int64_t n) { return fmt::format("store/index/{}", n); }
std::string indexed_mark(const std::string& key) { return "store/indexed/" + key; }
std::string heartbeat_key(const std::string& name) { return "store/alive/" + name; }

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string text_of(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

/// Milliseconds on this machine's monotonic clock (CLOCK_MONOTONIC: the same for every
/// process on the machine, and never stepped by a clock adjustment).
int64_t monotonic_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void check_value(const std::string& key, const std::string& value) {
  VFLOW_ASSERT(!value.empty(), "the embedded store cannot hold an empty value (key " + key + ")");
}

class EmbeddedControlStore final : public ControlStore {
 public:
  EmbeddedControlStore(const std::string& host, int port, std::chrono::milliseconds timeout)
      : address_(fmt::format("{}:{}", host, port)) {
    try {
      store_ = comm::open_store(host, port, timeout, /*server=*/false);
    } catch (const std::exception& e) {
      throw PeerFailure(fmt::format("[elastic] cannot reach the job's coordinator at {}: {}",
                                    address_, e.what()));
    }
  }

  std::optional<std::string> get(const std::string& key) override {
    return guarded([&]() -> std::optional<std::string> {
      if (!store_->check({key})) return std::nullopt;
      return text_of(store_->get(key));
    });
  }

  void set(const std::string& key, const std::string& value) override {
    check_value(key, value);
    guarded([&] {
      index(key);
      store_->set(key, bytes_of(value));
      // TCPStore does not answer a set: a round trip on the same connection makes it
      // visible to every other client before this returns.
      store_->check({key});
    });
  }

  void publish(const std::string& key, const std::string& value) override {
    check_value(key, value);
    guarded([&] {
      index(key);
      store_->set(key, bytes_of(value));
    });
  }

  std::string set_if_absent(const std::string& key, const std::string& value) override {
    check_value(key, value);
    return guarded([&] {
      index(key);
      return text_of(store_->compareSet(key, {}, bytes_of(value)));
    });
  }

  bool compare_and_set(const std::string& key, const std::optional<std::string>& expected,
                       const std::string& desired) override {
    VFLOW_ASSERT(!expected || *expected != desired, "compare_and_set needs a change");
    check_value(key, desired);
    if (expected) check_value(key, *expected);
    return guarded([&] {
      index(key);
      if (!expected) return text_of(store_->compareSet(key, {}, bytes_of(desired))) == desired;
      // TCPStore answers a missing key with `expected` itself: never `desired`.
      return text_of(store_->compareSet(key, bytes_of(*expected), bytes_of(desired))) == desired;
    });
  }

  int64_t add(const std::string& key, int64_t delta) override {
    return guarded([&] {
      index(key);  // TCPStore creates the counter even for delta 0
      return store_->add(key, delta);
    });
  }

  bool wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    // Polled: a c10d wait that times out leaves its answer in the connection.
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      if (guarded([&] { return store_->check(keys); })) return true;
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  bool remove(const std::string& key) override {
    return guarded([&] { return store_->deleteKey(key); });
  }

  int64_t remove_all(const std::string& prefix) override {
    int64_t removed = 0;
    for (const auto& key : list(prefix)) removed += remove(key) ? 1 : 0;
    return removed;
  }

  std::vector<std::string> list(const std::string& prefix) override {
    return guarded([&] {
      std::vector<std::string> keys;
      const int64_t count = store_->add(kIndexCount, 0);
      for (int64_t n = 0; n < count; ++n) {
        const auto entry = index_entry(n);
        if (!store_->check({entry})) continue;  // a slot taken, its name not written yet
        auto key = text_of(store_->get(entry));
        if (key.compare(0, prefix.size(), prefix) == 0 && store_->check({key})) {
          keys.push_back(std::move(key));
        }
      }
      std::sort(keys.begin(), keys.end());
      keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
      return keys;
    });
  }

  void heartbeat(const std::string& name, std::chrono::milliseconds ttl) override {
    set(heartbeat_key(name), fmt::format("{} {}", monotonic_ms(), ttl.count()));
  }

  bool alive(const std::string& name) override {
    const auto key = heartbeat_key(name);
    const auto beat = get(key);
    if (!beat) return false;
    const auto space = beat->find(' ');
    if (space == std::string::npos) {
      throw Error(fmt::format("[elastic] store key {} holds '{}', not '<time> <ttl>'", key, *beat));
    }
    const int64_t at = records::decode_int(beat->substr(0, space), key);
    const int64_t ttl = records::decode_int(beat->substr(space + 1), key);
    return monotonic_ms() - at <= ttl;
  }

  std::string address() const override { return address_; }

 private:
  /// Store errors are the coordinator's loss, and stay so: a connection that failed
  /// once (a receive that timed out, say) may still get the answer it gave up on, and
  /// would read it as the answer to the next call. vflow's own errors pass as they are.
  template <typename F>
  auto guarded(F&& f) -> decltype(f()) {
    if (!lost_.empty()) throw PeerFailure(lost_);
    try {
      return f();
    } catch (const vflow::Error&) {
      throw;
    } catch (const std::exception& e) {
      const std::string what = e.what();
      lost_ = fmt::format("[elastic] lost the job's coordinator at {}: {}", address_,
                          what.substr(0, what.find('\n')));
      throw PeerFailure(lost_);
    }
  }

  /// Enters `key` into the index: at least once (two clients creating a key at the same
  /// moment may both enter it; list drops the duplicate), and once per client at most.
  void index(const std::string& key) {
    if (indexed_.count(key) != 0) return;
    const auto mark = indexed_mark(key);
    if (text_of(store_->compareSet(mark, {}, bytes_of("pending"))) == "pending") {
      const int64_t slot = store_->add(kIndexCount, 1) - 1;
      store_->set(index_entry(slot), bytes_of(key));
      store_->set(mark, bytes_of("indexed"));  // ordered before the caller's own write
    }
    indexed_.insert(key);
  }

  std::string address_;
  c10::intrusive_ptr<c10d::TCPStore> store_;
  std::unordered_set<std::string> indexed_;
  std::string lost_;  // why the connection is no longer usable; empty while it is
};

}  // namespace

std::unique_ptr<ControlStore> connect_embedded_store(const std::string& host, int port,
                                                     std::chrono::milliseconds timeout) {
  return std::make_unique<EmbeddedControlStore>(host, port, timeout);
}

}  // namespace vflow::job
