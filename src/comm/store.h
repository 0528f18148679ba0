// The job's c10d TCPStore, opened one way everywhere (internal: the communicators and the
// job module's control plane and coordinator).
#pragma once

#include <chrono>
#include <string>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "core/torch_compat.h"

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

}  // namespace vflow::comm
