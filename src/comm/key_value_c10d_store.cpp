// A comm::KeyValueStore seen as a c10d Store (src/comm/store.h): the rendezvous of a
// process group through a cluster's control store instead of the coordinator's TCPStore.
#include <fmt/format.h>

#include <mutex>
#include <stdexcept>

#include "comm/store.h"

namespace vflow::comm {

namespace {

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string text_of(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

class KeyValueC10dStore final : public c10d::Store {
 public:
  KeyValueC10dStore(std::shared_ptr<KeyValueStore> store, std::shared_ptr<std::mutex> lock,
                    std::chrono::milliseconds timeout)
      : c10d::Store(timeout), store_(std::move(store)), lock_(std::move(lock)) {}

  // LibTorch 2.x makes clone() part of the interface (no `override`: 1.13 has none).
  virtual c10::intrusive_ptr<c10d::Store> clone() {
    return c10::make_intrusive<KeyValueC10dStore>(store_, lock_, timeout_);
  }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    std::lock_guard<std::mutex> hold(*lock_);
    store_->set(key, text_of(value));
  }

  // TCPStore's rule: the value held afterwards; `expected` empty means "absent".
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    std::lock_guard<std::mutex> hold(*lock_);
    if (expected.empty()) return bytes_of(store_->set_if_absent(key, text_of(desired)));
    if (expected != desired) store_->compare_and_set(key, text_of(expected), text_of(desired));
    const auto now = store_->get(key);
    return now ? bytes_of(*now) : expected;
  }

  std::vector<uint8_t> get(const std::string& key) override {
    std::lock_guard<std::mutex> hold(*lock_);
    auto value = store_->get(key);  // most keys are there already: one round trip
    if (!value) {
      await({key}, timeout_);
      value = store_->get(key);
    }
    if (!value) throw std::runtime_error(fmt::format("rendezvous key {} was removed", key));
    return bytes_of(*value);
  }

  int64_t add(const std::string& key, int64_t value) override {
    std::lock_guard<std::mutex> hold(*lock_);
    return store_->add(key, value);
  }

  bool deleteKey(const std::string& key) override {
    std::lock_guard<std::mutex> hold(*lock_);
    return store_->remove(key);
  }

  bool check(const std::vector<std::string>& keys) override {
    std::lock_guard<std::mutex> hold(*lock_);
    for (const auto& key : keys) {
      if (!store_->get(key)) return false;
    }
    return true;
  }

  int64_t getNumKeys() override {
    std::lock_guard<std::mutex> hold(*lock_);
    return static_cast<int64_t>(store_->list("").size());
  }

  void wait(const std::vector<std::string>& keys) override {
    std::lock_guard<std::mutex> hold(*lock_);
    await(keys, timeout_);
  }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    std::lock_guard<std::mutex> hold(*lock_);
    await(keys, timeout);
  }

 private:
  void await(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
    // c10d's "no timeout" (0) is bounded by the store's own timeout.
    if (timeout <= std::chrono::milliseconds(0)) timeout = timeout_;
    if (!store_->wait(keys, timeout)) {
      throw std::runtime_error(fmt::format("Wait timeout after {} ms for rendezvous key {}",
                                           timeout.count(), keys.empty() ? "" : keys.front()));
    }
  }

  std::shared_ptr<KeyValueStore> store_;
  std::shared_ptr<std::mutex> lock_;
};

}  // namespace

c10::intrusive_ptr<c10d::Store> c10d_store_over(std::shared_ptr<KeyValueStore> store,
                                                std::chrono::milliseconds timeout) {
  return c10::make_intrusive<KeyValueC10dStore>(std::move(store), std::make_shared<std::mutex>(),
                                                timeout);
}

}  // namespace vflow::comm
