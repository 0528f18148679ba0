// The storage of a job's control plane (docs/design.md §1 "control store", §6b).
//
// The get/set/compare-and-set part is comm::KeyValueStore's, so that the same store
// also serves the communicators' rendezvous (comm::Rendezvous::store).
//
// Every record of the elastic protocol (requests, generations, readiness, survivors,
// regroup offers) lives in a key-value store the coordinator reaches and every worker
// reaches. ControlPlane speaks the protocol over this interface, so the store can be
// the embedded single-machine one (job/embedded_store: a small server the coordinator
// hosts on one address, the default) or a cluster's (etcd, with revisions and leases).
//
// Read-modify-write is never a read followed by a write: it is add (a counter),
// set_if_absent (settle a value once) or compare_and_set. Liveness is a heartbeat
// with a time to live, which an etcd store maps onto a lease.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "vflow/comm/key_value_store.h"

namespace vflow::job {

class ControlStore : public comm::KeyValueStore {
 public:
  /// Stores `value` without waiting for the store to confirm it (other clients see it a
  /// moment later): for figures published often from inside a training step, which
  /// must not wait on a slow store.
  virtual void publish(const std::string& key, const std::string& value) = 0;
  /// Removes every key that starts with `prefix` ("" : all of the job's keys, when it has
  /// finished); returns how many there were.
  virtual int64_t remove_all(const std::string& prefix) = 0;

  // ---- liveness ----
  /// Says that `name` is alive for the next `ttl`; a name not renewed within it is gone.
  virtual void heartbeat(const std::string& name, std::chrono::milliseconds ttl) = 0;
  /// Whether `name`'s last heartbeat is still within its time to live.
  virtual bool alive(const std::string& name) = 0;
  /// The names under `prefix` whose heartbeat is within its time to live, sorted (one
  /// round trip on etcd).
  virtual std::vector<std::string> alive_names(const std::string& prefix) = 0;

  /// Where the store is, for messages ("127.0.0.1:29500").
  virtual std::string address() const = 0;
};

/// One change under a watched prefix (ClusterStore::watch).
struct StoreEvent {
  std::string key;                   ///< relative to the store's prefix
  std::optional<std::string> value;  ///< the new value; nullopt: the key was removed
};

/// A cluster's control store (etcd), with what only a cluster store offers: claims held
/// under a lease (the coordinator's election, docs/design.md §1), and reading and watching a
/// whole prefix (node agents follow every job this way). One client is used by one
/// thread at a time.
class ClusterStore : public ControlStore {
 public:
  /// Claims `name` for `me` unless a live claim exists; the claim lives for `ttl` after
  /// each renew() and ends with this client. Returns the holder afterwards (`me` when this
  /// client now holds it).
  virtual std::string campaign(const std::string& name, const std::string& me,
                               std::chrono::milliseconds ttl) = 0;
  /// Renews this client's claim on `name`; false when it holds none (its lease expired,
  /// or it never won). Throws PeerFailure when the store cannot be reached.
  virtual bool renew(const std::string& name) = 0;
  /// Ends this client's claim on `name` now (nothing when it holds none).
  virtual void resign(const std::string& name) = 0;
  /// Who holds a live claim on `name`, if anyone.
  virtual std::optional<std::string> holder(const std::string& name) = 0;
  /// Every key under `prefix` with its value; `revision` (when given) gets the store's
  /// revision at the read, from which watch() follows.
  virtual std::map<std::string, std::string> scan(const std::string& prefix,
                                                  int64_t* revision = nullptr) = 0;
  /// The changes under `prefix` after `revision`, waiting up to `timeout` for the first;
  /// `revision` advances past those returned (empty after the timeout). nullopt when the
  /// store no longer holds that history (compacted): scan again.
  virtual std::optional<std::vector<StoreEvent>> watch(const std::string& prefix, int64_t& revision,
                                                       std::chrono::milliseconds timeout) = 0;
};

/// A client of the embedded store: the one a job's coordinator hosts at host:port
/// (job::StoreHost), bound to that address alone (loopback for a job on one machine).
/// Liveness is kept on the server's clock. One client is used by one thread at a time.
/// Throws PeerFailure when the store cannot be reached within `timeout`, and on every
/// call after it was lost (a connection that failed once may be out of step with the
/// store).
std::unique_ptr<ControlStore> connect_embedded_store(const std::string& host, int port,
                                                     std::chrono::milliseconds timeout);

/// How to reach a cluster's etcd (v3, through its gRPC JSON gateway) for one job.
struct EtcdOptions {
  std::vector<std::string> endpoints;  ///< HOST:PORT of each member, tried in turn
  bool tls = false;                    ///< https; the server's certificate is verified
  std::string ca_file;                 ///< TLS: the CA to trust (empty: the system's)
  /// TLS: a client certificate and its key, for clusters that require one. etcd's gateway
  /// refuses a certificate with a common name, so it must have none: the identity is the
  /// user below.
  std::string cert_file, key_file;
  std::string user, password;  ///< etcd authentication; empty user: none
  /// The job whose keys this client reads and writes, under /vflow/jobs/<job>/ (letters,
  /// digits, '-', '_' and '.'); a role granted that prefix confines it to the job.
  std::string job;
  std::chrono::milliseconds timeout{30000};  ///< per request, and per wait at most
};

/// Hosts the embedded store on host:port (bound to that address alone; port 0: any free
/// one) and returns a client of it that keeps it served while the client lives: how rank 0
/// of a job under an external launcher hosts the job's store at MASTER_ADDR:MASTER_PORT.
std::unique_ptr<ControlStore> host_embedded_store(const std::string& host, int port,
                                                  std::chrono::milliseconds timeout);

/// Whether `host` is a loopback address ("127.0.0.1", "localhost", "::1"): a store there
/// cannot be reached from another machine.
bool is_loopback_host(const std::string& host);

/// Refuses (SpecError) a job whose store at `host` other machines can reach, unless
/// `allowed` (resources.unauthenticated_store): such a store has no authentication.
void check_store_exposure(const std::string& host, bool allowed, const std::string& what);

/// The options of `--control URL`: "etcd://H:P,H:P,..." (http) or "etcds://..." (https),
/// with the credentials from the environment: VFLOW_ETCD_CA, VFLOW_ETCD_CERT,
/// VFLOW_ETCD_KEY, VFLOW_ETCD_USER and VFLOW_ETCD_PASSWORD_FILE (a file holding the
/// password, so that it is not in the process list or the environment of every child).
/// Throws SpecError for a malformed URL or job name, or an unreadable password file.
EtcdOptions etcd_options(const std::string& url, const std::string& job,
                         std::chrono::milliseconds timeout);

/// The TLS files `options` names, each with the environment variable that named it
/// ("VFLOW_ETCD_CA", "VFLOW_ETCD_CERT", "VFLOW_ETCD_KEY"); those not set are left out.
std::vector<std::pair<std::string, std::string>> etcd_tls_files(const EtcdOptions& options);

/// Whether `address` names a cluster's control store (etcd://, etcds://) rather than an
/// embedded store's HOST:PORT.
bool is_cluster_store(const std::string& address);

/// The control store at `address`: a cluster's ("etcd://...", for `job`) or the embedded
/// store at HOST:PORT (`job` unused).
std::unique_ptr<ControlStore> connect_control_store(const std::string& address,
                                                    const std::string& job,
                                                    std::chrono::milliseconds timeout);

/// The host of the first endpoint of a cluster store's address, or the embedded store's:
/// where a communicator's peers are reached from (Gloo picks its interface towards it).
std::string control_store_host(const std::string& address);

/// The names of the jobs running on the etcd cluster (each job whose launcher took its
/// name), sorted; `options.job` is unused. Needs read access to all of /vflow/jobs/ (a
/// user confined to one job gets an Error saying permission denied).
std::vector<std::string> etcd_jobs(const EtcdOptions& options);

/// A client of etcd for one job: every read-modify-write is a transaction comparing
/// revisions, wait() watches the keys it waits for, and heartbeat() keeps a lease alive
/// whose key expires with it. Throws PeerFailure naming every endpoint when none can be
/// reached, and Error when etcd refuses the credentials or the key (another job's).
std::unique_ptr<ClusterStore> connect_etcd_store(const EtcdOptions& options);

/// A client of the whole of vflow's tree on etcd (/vflow/; `options.job` unused): the
/// node agents' records under "agents/" and every job's keys under "jobs/<job>/". What a
/// node agent reads and watches; a user confined to one job may read "agents/" only.
std::unique_ptr<ClusterStore> connect_etcd_root(const EtcdOptions& options);

/// The cluster store at `address` ("etcd://...") for `job`; throws SpecError for an
/// address that names no cluster store.
std::unique_ptr<ClusterStore> connect_cluster_store(const std::string& address,
                                                    const std::string& job,
                                                    std::chrono::milliseconds timeout);

}  // namespace vflow::job
