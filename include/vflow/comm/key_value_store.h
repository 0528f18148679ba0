// A key-value store the processes of a job share: what the ranks of a communicator meet
// through (Rendezvous::store), and what the job's control store (job::ControlStore)
// extends with liveness. Keys and values are bytes; implementations (the embedded store's
// client, etcd) say where they differ.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace vflow::comm {

class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;

  /// The value of `key`, or nullopt when it holds none.
  virtual std::optional<std::string> get(const std::string& key) = 0;
  /// Stores `value`; every client sees it once this returns.
  virtual void set(const std::string& key, const std::string& value) = 0;
  /// Stores `value` unless `key` holds a value already; returns what it holds afterwards.
  virtual std::string set_if_absent(const std::string& key, const std::string& value) = 0;
  /// Stores `desired` when `key` holds exactly `expected` (nullopt: holds nothing). Returns
  /// whether `key` holds `desired` afterwards through this call, or because an equal change
  /// came first (two callers making the same change both succeed). `expected` and
  /// `desired` differ.
  virtual bool compare_and_set(const std::string& key, const std::optional<std::string>& expected,
                               const std::string& desired) = 0;
  /// Adds `delta` to the counter `key` (absent: 0) and returns the new value; delta 0 reads.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  /// Waits until every key holds a value; false when `timeout` passed first.
  virtual bool wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  /// Removes `key`; false when it held nothing.
  virtual bool remove(const std::string& key) = 0;
  /// The keys that hold a value and start with `prefix`, sorted.
  virtual std::vector<std::string> list(const std::string& prefix) = 0;
};

}  // namespace vflow::comm
