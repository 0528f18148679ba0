// The sharded reducer (docs/design.md, "Optimizer state sharded by vnode"): another
// reducer's sum, left where the shards are kept, then an update of the shards this worker
// keeps and a gather of the parameters from their owners; shards move with their vnodes when the
// group changes.
#pragma once

#include <memory>

#include "engine/reducer.h"

namespace vflow::vnode {
class StepPacket;
}

namespace vflow::engine {

class ShardedState;

/// `inner`'s reduction of `packet` with the optimizer state kept by canonical shard in
/// `state` (the optimizer `inner` steps, which must outlive it), each shard by `replicas`
/// workers; a worker needs the reduced gradients of the shards it keeps only, which
/// `clip` (semantic.clip) clips by canonical shard.
std::unique_ptr<Reducer> make_sharded_reducer(std::unique_ptr<Reducer> inner, ShardedState& state,
                                              int64_t replicas, vnode::StepPacket& packet,
                                              const ClipSpec& clip);

}  // namespace vflow::engine
