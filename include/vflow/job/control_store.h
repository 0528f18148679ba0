// The storage of a job's control plane (DESIGN.md §1 "control store", §6b).
//
// Every record of the elastic protocol (requests, generations, readiness, survivors,
// regroup offers) lives in a key-value store the coordinator reaches and every worker
// reaches. ControlPlane speaks the protocol over this interface, so the store can be
// the embedded single-machine one (the coordinator's c10d TCPStore, the default) or a
// cluster's (etcd, with revisions and leases).
//
// Read-modify-write is never a read followed by a write: it is add (a counter),
// set_if_absent (settle a value once) or compare_and_set. Liveness is a heartbeat
// with a time to live, which an etcd store maps onto a lease.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace vflow::job {

class ControlStore {
 public:
  virtual ~ControlStore() = default;

  /// The value of `key`, or nullopt when it holds none.
  virtual std::optional<std::string> get(const std::string& key) = 0;
  /// Stores `value`; every client sees it once this returns.
  virtual void set(const std::string& key, const std::string& value) = 0;
  /// Stores `value` without waiting for the store to confirm it (other clients see it a
  /// moment later): for figures published often from inside a training step, which
  /// must not wait on a slow store.
  virtual void publish(const std::string& key, const std::string& value) = 0;
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

  // ---- liveness ----
  /// Says that `name` is alive for the next `ttl`; a name not renewed within it is gone.
  virtual void heartbeat(const std::string& name, std::chrono::milliseconds ttl) = 0;
  /// Whether `name`'s last heartbeat is still within its time to live.
  virtual bool alive(const std::string& name) = 0;

  /// Where the store is, for messages ("127.0.0.1:29500").
  virtual std::string address() const = 0;
};

/// A client of the embedded store: the c10d TCPStore the coordinator hosts at host:port
/// (job::Coordinator). What TCPStore lacks is emulated: list keeps an index of every key
/// this job's clients created (list costs one round trip per key ever created, fine for
/// the hundreds of keys of a job, not for a cluster); liveness compares heartbeat times
/// on one machine's monotonic clock (the embedded store serves one machine unless the
/// user opts in). Values must not be empty: TCPStore's compare-and-set cannot tell an
/// empty value from none. One client is used by one thread at a time. Throws PeerFailure
/// when the store cannot be reached, and on every call after it was lost (a connection
/// that failed once may be out of step with the store).
std::unique_ptr<ControlStore> connect_embedded_store(const std::string& host, int port,
                                                     std::chrono::milliseconds timeout);

}  // namespace vflow::job
