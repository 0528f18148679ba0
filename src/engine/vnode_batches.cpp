#include "engine/vnode_batches.h"

#include <torch/torch.h>

namespace vflow::engine {

VnodeBatches::VnodeBatches(vnode::DataOrder order, vnode::VirtualNodePlan plan, int64_t total_steps,
                           std::shared_ptr<data::Dataset> train, c10::Device device,
                           const ExampleReader& reader)
    : order_(std::move(order)),
      plan_(std::move(plan)),
      total_steps_(total_steps),
      train_(std::move(train)),
      reader_(reader),
      copy_stream_(device) {}

void VnodeBatches::hold(vnode::VnodeRange held) {
  discard();
  held_ = held;
}

at::Tensor VnodeBatches::permutation(int64_t epoch) const {
  std::lock_guard<std::mutex> lock(perm_mutex_);
  auto it = perms_.find(epoch);
  if (it != perms_.end()) return it->second;
  auto p = order_.permutation(epoch);
  auto t = torch::from_blob(p.data(), {static_cast<int64_t>(p.size())}, torch::kInt64).clone();
  while (perms_.size() >= 2) perms_.erase(perms_.begin());
  perms_.emplace(epoch, t);
  return t;
}

vnode::Slice VnodeBatches::positions(int64_t step, int64_t vnode) const {
  const auto batch = order_.batch(step % order_.steps_per_epoch());
  const auto part = plan_.slice(vnode, batch.size);
  return vnode::Slice{batch.offset + part.offset, part.size};
}

std::vector<int64_t> VnodeBatches::indices(int64_t step, vnode::Slice positions) const {
  const auto idx =
      permutation(step / order_.steps_per_epoch()).narrow(0, positions.offset, positions.size);
  return std::vector<int64_t>(idx.data_ptr<int64_t>(), idx.data_ptr<int64_t>() + positions.size);
}

std::vector<int64_t> VnodeBatches::example_indices(int64_t step, int64_t vnode) const {
  return indices(step, positions(step, vnode));
}

std::vector<int64_t> VnodeBatches::batch_indices(int64_t step) const {
  return indices(step, order_.batch(step % order_.steps_per_epoch()));
}

CopiedBatch VnodeBatches::load(const WorkItem& item) const {
  const auto pos = positions(item.step, item.vnode);
  const int64_t epoch = item.step / order_.steps_per_epoch();
  const auto idx = permutation(epoch).narrow(0, pos.offset, pos.size);
  return copy_stream_.copy(reader_.read(*train_, idx, epoch));
}

VnodeBatches::WorkItem VnodeBatches::next_item(WorkItem item) const {
  while (true) {
    if (++item.vnode == plan_.virtual_nodes()) {
      item.vnode = 0;
      ++item.step;
    }
    if (item.step >= total_steps_) return WorkItem{};
    if (item.vnode >= held_.first && item.vnode < held_.last &&
        positions(item.step, item.vnode).size > 0) {
      return item;
    }
  }
}

void VnodeBatches::discard() {
  while (loader_.outstanding()) {
    try {
      loader_.wait();
    } catch (const std::exception&) {
      // The load is not needed any more; a real data error shows again when retried.
    }
  }
  pending_.clear();
}

data::Batch VnodeBatches::take(int64_t step, int64_t vnode) {
  const WorkItem item{step, vnode};
  CopiedBatch batch;
  // The loads run in order; those before the asked-for vnode are not needed any more.
  while (!pending_.empty()) {
    const WorkItem front = pending_.front();
    pending_.pop_front();
    if (front == item) {
      batch = loader_.wait();  // rethrows a load error
      break;
    }
    try {
      loader_.wait();
    } catch (const std::exception&) {
    }
  }
  if (!batch.batch.input.defined()) {
    discard();  // none of what is queued follows this vnode
    batch = load(item);
  }
  if (prefetch_) {
    WorkItem last = pending_.empty() ? item : pending_.back();
    while (static_cast<int64_t>(pending_.size()) < depth_) {
      const WorkItem next = next_item(last);
      if (next.step < 0) break;
      pending_.push_back(next);
      loader_.submit([this, next] { return load(next); });
      last = next;
    }
  }
  return copy_stream_.ready(std::move(batch));
}

data::Batch VnodeBatches::take_extra(int64_t step, int64_t vnode) {
  discard();
  return copy_stream_.ready(load(WorkItem{step, vnode}));
}

}  // namespace vflow::engine
