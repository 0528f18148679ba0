// The sharded reducer (docs/design.md, "Optimizer state sharded by vnode"): another
// reducer's sum, then an update of the shards this worker keeps and an all-gather of the
// parameters from their owners; shards move with their vnodes when the group changes.
#pragma once

#include <memory>

#include "engine/reducer.h"

namespace vflow::engine {

class ShardedState;

/// `inner`'s reduction with the optimizer state kept by canonical shard in `state` (the
/// optimizer `inner` steps, which must outlive it), each shard by `replicas` workers.
std::unique_ptr<Reducer> make_sharded_reducer(std::unique_ptr<Reducer> inner, ShardedState& state,
                                              int64_t replicas);

}  // namespace vflow::engine
