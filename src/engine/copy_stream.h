// Host-to-device copies of a vnode's batch on a side stream of the worker's device, so
// that the next vnode's copy overlaps the current vnode's kernels (docs/design.md §4: the
// loader prefetches the next vnode while the current one computes). Uses c10's
// device-generic streams and events: no CUDA headers, and a CPU build of LibTorch
// compiles and links it unchanged.
#pragma once

#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <optional>

#include "vflow/data/dataset.h"

namespace vflow::engine {

/// A batch on its way to the device: usable once CopyStream::ready() has run.
struct CopiedBatch {
  data::Batch batch;
  std::optional<c10::Event> copied;  ///< recorded on the side stream after the copy
};

class CopyStream {
 public:
  /// A side stream for CUDA devices; on the CPU copies are not needed.
  explicit CopyStream(c10::Device device);

  /// Starts copying `batch` (CPU tensors) to the device from pinned memory, without
  /// waiting for it. Thread-safe: the loader thread calls it.
  CopiedBatch copy(data::Batch batch) const;

  /// Orders the calling thread's current stream after the copy and hands the device
  /// memory to that stream (so it is not reused while kernels read it).
  data::Batch ready(CopiedBatch copied) const;

 private:
  c10::Device device_;
  std::optional<c10::Stream> stream_;
};

}  // namespace vflow::engine
