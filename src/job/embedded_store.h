// The embedded control store's server: the key-value store a job's launcher hosts on one
// machine (docs/design.md §1, §6b), bound to one address (loopback unless the user opts in),
// with compare-and-set, counters, listing by prefix, blocking waits and heartbeats kept
// on the server's own clock. connect_embedded_store() is its client.
#pragma once

#include <chrono>
#include <memory>
#include <string>

namespace vflow::job {

class EmbeddedStoreServer {
 public:
  /// Listens on host:port (port 0: any free port) and serves from a thread of its own
  /// until destroyed. Throws Error when it cannot listen there.
  EmbeddedStoreServer(const std::string& host, int port);
  ~EmbeddedStoreServer();
  EmbeddedStoreServer(const EmbeddedStoreServer&) = delete;
  EmbeddedStoreServer& operator=(const EmbeddedStoreServer&) = delete;
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace vflow::job
