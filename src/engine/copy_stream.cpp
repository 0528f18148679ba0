#include "engine/copy_stream.h"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace vflow::engine {

CopyStream::CopyStream(c10::Device device) : device_(device) {
  if (device_.is_cuda()) {
    stream_ = c10::impl::VirtualGuardImpl(device_.type()).getStreamFromGlobalPool(device_);
  }
}

CopiedBatch CopyStream::copy(data::Batch batch) const {
  CopiedBatch out;
  if (!stream_) {
    out.batch = std::move(batch);
    return out;
  }
  // The copies and the device memory they fill belong to the side stream. The pinned
  // host buffers stay alive until their copies finish: LibTorch's pinned-memory
  // allocator records the copy on the stream before it reuses them.
  c10::StreamGuard guard(*stream_);
  out.batch.input = batch.input.pin_memory().to(device_, /*non_blocking=*/true);
  out.batch.target = batch.target.pin_memory().to(device_, /*non_blocking=*/true);
  out.copied.emplace(device_.type());
  out.copied->record(*stream_);
  return out;
}

data::Batch CopyStream::ready(CopiedBatch copied) const {
  if (!copied.copied) return std::move(copied.batch);
  const c10::impl::VirtualGuardImpl impl(device_.type());
  const auto compute = impl.getStream(device_);
  copied.copied->block(compute);
  for (const auto* t : {&copied.batch.input, &copied.batch.target}) {
    impl.recordDataPtrOnStream(t->storage().data_ptr(), compute);
  }
  return std::move(copied.batch);
}

}  // namespace vflow::engine
