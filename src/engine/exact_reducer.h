// Deterministic mode's reducer: the exact fixed-point sum (docs/design.md, "Bitwise
// reproducibility across worker counts"), and what the float reducers share with it.
#pragma once

#include <memory>
#include <optional>

#include "engine/reducer.h"
#include "vflow/comm/communicator.h"

namespace vflow::engine {

class FixedPointStep;

/// The exact sum of the workers' vnode contributions over `packet`, whole or in buckets
/// (options.bucket_bytes). `fused`, where not null, is `optimizer` as an update that reads
/// the summed integers where they lie (and on one worker of one vnode, rounds the
/// gradients as it reads them).
std::unique_ptr<Reducer> make_exact_reducer(vnode::StepPacket& packet,
                                            torch::optim::Optimizer& optimizer,
                                            FixedPointStep* fused, const ReducerOptions& options);

/// Reducer::scatter_sums's `gradients` as shares of the whole packet (its gradients, then
/// the rest, which every rank wants), or nothing where `gradients` is null.
std::optional<comm::Shares> packet_shares(const vnode::StepPacket& packet,
                                          const comm::Shares* gradients);

}  // namespace vflow::engine
