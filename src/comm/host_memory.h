// Sums through one host's shared memory for ranks that share it (internal: the Gloo
// communicator wraps itself in it; docs/design.md, "Ranks on one host").
#pragma once

#include <chrono>
#include <memory>

#include "vflow/comm/communicator.h"

namespace vflow::comm {

/// `base` (a communicator of ranks on any hosts) with allreduce_sum of contiguous host
/// tensors done through a shared-memory segment, when every rank of `base` runs on this
/// host, in the same network, mount, IPC and PID namespaces, and the segment can be
/// reserved; otherwise `base` unchanged. Every rank of `base` must call it together (it
/// runs collectives of `base`). Everything else, the asynchronous sums of
/// start_allreduce_sum included, stays `base`'s. A rank that exits, fails or is destroyed
/// makes its peers' sums fail at once; a silent one, within `timeout`.
std::unique_ptr<Communicator> over_host_memory(std::unique_ptr<Communicator> base,
                                               std::chrono::milliseconds timeout);

/// Whether `comm` sums host tensors through shared memory (over_host_memory took).
bool sums_through_host_memory(const Communicator& comm);

}  // namespace vflow::comm
