// The batches of the vnodes one worker holds, in the job's data order (docs/design.md §2,
// "Data order"): vnode v of step s reads the examples at its slice of the step's positions
// in the epoch's permutation. With prefetch on, the next held vnodes' batches (up to
// resources.prefetch_depth of them) are loaded and copied to the device in the background
// while the current vnode computes (§3).
#pragma once

#include <c10/core/Device.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/background_task.h"
#include "engine/copy_stream.h"
#include "engine/example_reader.h"
#include "vflow/data/dataset.h"
#include "vflow/vnode/plan.h"

namespace vflow::engine {

class VnodeBatches {
 public:
  /// Reads `train` through `reader`, which must outlive this.
  VnodeBatches(vnode::DataOrder order, vnode::VirtualNodePlan plan, int64_t total_steps,
               std::shared_ptr<data::Dataset> train, c10::Device device,
               const ExampleReader& reader);

  /// Loads the next `depth` held vnodes' batches in the background (resources.prefetch,
  /// resources.prefetch_depth).
  void set_prefetch(bool on, int64_t depth = 1) {
    prefetch_ = on;
    depth_ = std::max<int64_t>(1, depth);
  }
  bool prefetch() const { return prefetch_; }

  /// The vnodes this worker holds from now on; a background load is discarded.
  void hold(vnode::VnodeRange held);

  /// Vnode `vnode`'s batch of step `step` on the device, ready for the calling thread's
  /// stream; a load error (a corrupt file, say) is thrown here.
  data::Batch take(int64_t step, int64_t vnode);

  /// Vnode `vnode`'s batch of step `step` for a worker that does not hold it (a
  /// cross-check), read at once; the background loads are discarded first (the reader
  /// serves one thread at a time) and resumed by the next take().
  data::Batch take_extra(int64_t step, int64_t vnode);

  /// Discards the background loads (the step failed, or a new generation holds other vnodes).
  void discard();

  /// Positions of vnode `vnode`'s examples in the epoch permutation, for step `step`.
  vnode::Slice positions(int64_t step, int64_t vnode) const;
  /// The data set indices vnode `vnode` reads in step `step`, in order.
  std::vector<int64_t> example_indices(int64_t step, int64_t vnode) const;
  /// The data set indices of step `step`'s whole global batch, in order.
  std::vector<int64_t> batch_indices(int64_t step) const;

 private:
  /// One unit of vnode work: vnode `vnode` of step `step` (step -1: none).
  struct WorkItem {
    int64_t step = -1;
    int64_t vnode = -1;
    bool operator==(const WorkItem& o) const { return step == o.step && vnode == o.vnode; }
  };

  /// The epoch's permutation as a tensor; the two most recent are kept. Thread-safe.
  at::Tensor permutation(int64_t epoch) const;
  std::vector<int64_t> indices(int64_t step, vnode::Slice positions) const;
  CopiedBatch load(const WorkItem& item) const;
  /// The non-empty held vnode work that follows `item`, or step -1 at the end of training.
  WorkItem next_item(WorkItem item) const;

  vnode::DataOrder order_;
  vnode::VirtualNodePlan plan_;
  int64_t total_steps_;
  std::shared_ptr<data::Dataset> train_;
  const ExampleReader& reader_;
  vnode::VnodeRange held_;
  bool prefetch_ = false;
  int64_t depth_ = 1;

  mutable std::mutex perm_mutex_;  // the permutations are shared with the loading thread
  mutable std::map<int64_t, at::Tensor> perms_;

  CopyStream copy_stream_;
  std::deque<WorkItem> pending_;  ///< the loader's jobs, in the order submitted
  BackgroundTask<CopiedBatch> loader_;
};

}  // namespace vflow::engine
