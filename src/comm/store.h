// The communicators' rendezvous as a c10d Store (internal): a job's own key-value store
// seen through c10d's interface, or, for a program that gives a Rendezvous no store, a
// c10d TCPStore opened one way everywhere.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "core/torch_compat.h"
#include "vflow/comm/key_value_store.h"

namespace vflow::comm {

/// Hosts (`server`) or connects to the store at host:port. On failure throws
/// std::runtime_error with the first line of c10d's message, for the caller to wrap.
inline c10::intrusive_ptr<c10d::TCPStore> open_store(const std::string& host, int port,
                                                     std::chrono::milliseconds timeout,
                                                     bool server) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(port);
  options.isServer = server;
  options.waitWorkers = false;
  options.timeout = timeout;
  compat::use_classic_store(options);
  try {
    return c10::make_intrusive<c10d::TCPStore>(host, options);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    throw std::runtime_error(what.substr(0, what.find('\n')));
  }
}

/// `store` as a c10d Store, for a process group's rendezvous: get and wait block up to
/// `timeout` (c10d's "no timeout" too, so that no wait is unbounded), and a copy (clone)
/// shares the store and the lock that serialises its calls.
c10::intrusive_ptr<c10d::Store> c10d_store_over(std::shared_ptr<KeyValueStore> store,
                                                std::chrono::milliseconds timeout);

/// The rendezvous store of `r`: r.store as a c10d Store, else the TCPStore at
/// r.store_host:r.store_port (hosted when r.host_store).
template <typename Rendezvous>
c10::intrusive_ptr<c10d::Store> rendezvous_store(const Rendezvous& r) {
  if (r.store) return c10d_store_over(r.store, r.timeout);
  return open_store(r.store_host, r.store_port, r.timeout, r.host_store);
}

}  // namespace vflow::comm
