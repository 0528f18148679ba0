// What a worker process sets up before it trains (docs/design.md, "Intra-op threads"): its
// device, intra-op threads, background loader, allocator and communication backend, and
// the seed of the model's initialisation.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

#include "vflow/engine/job_spec.h"

namespace vflow::comm {
struct Rendezvous;
}

namespace vflow::engine {

/// Seeds torch's default generator for parameter initialisation from the job's seed.
/// Build the model right after this call so that initialisation depends on the spec only.
void seed_initialisation(const SemanticSpec& semantic);

/// The intra-op threads of one of `local_workers` workers of `spec` on this host:
/// resources.threads, or where that is 0, one in deterministic mode (whose result must not
/// depend on the host's cores, and the thread count changes LibTorch's CPU results) and
/// otherwise the cores this process may use (its CPU affinity and its cgroup's CPU quota,
/// vflow::usable_cores) shared among this host's workers, at least one each.
int64_t intra_op_threads(const JobSpec& spec, int64_t local_workers);

/// Sets this process's intra-op threads: LibTorch's and those of the library's own loops.
void set_intra_op_threads(int64_t threads);

/// Logs that `spec` runs one intra-op thread, where it is deterministic, leaves
/// resources.threads at 0 and this host has more than one core; else nothing.
void note_deterministic_threads(const JobSpec& spec);

/// Whether `resources.prefetch` turns the background loader on for a worker that shares
/// this host with `local_workers` - 1 others (auto: when its intra-op threads times the
/// local workers leave a core free). The job layer decides auto for a launched worker.
bool prefetch_enabled(const ResourcesSpec& resources, int64_t local_workers);

/// resources.data_threads, resolved: as set, or the cores this host's `local_workers`
/// workers leave beside their intra-op threads, shared among them, at least 1.
int64_t data_threads(const ResourcesSpec& resources, int64_t local_workers);

/// Applies the resources part to this process: intra-op threads, a memory allocator that
/// keeps freed tensors' memory for the next step (glibc), and, for a deterministic job,
/// LibTorch's deterministic algorithms (cuDNN's too).
void configure_runtime(const JobSpec& spec);

/// Hands the memory that freed blocks leave in the heap back to the kernel (glibc's
/// malloc_trim): after the model's parameters were copied into the flat buffers they train
/// in, their first storage would otherwise stay resident for the whole job, in every
/// worker's peak memory.
void release_free_memory();

/// Inside a catch block: whether the exception in flight is a failed allocation
/// (std::bad_alloc, or LibTorch's CPU allocator refusing one: "can't allocate memory" when
/// malloc failed, "not enough memory" from its size checks), which resources.memory_limit_mb
/// makes an error the job names rather than a kill.
bool allocation_failed();

/// The device this worker trains on: resources.device, where plain "cuda" is the first
/// device (a launched worker's job layer makes it its local rank's, job::place_on_this_host).
/// Throws SpecError when CUDA is asked for and this LibTorch build or machine has none.
c10::Device worker_device(const ResourcesSpec& resources);
/// Checks that every device the job asks for (resources.device, for joiners and entries
/// without a device, and each layout entry's) exists on this machine; throws SpecError
/// naming the key.
void check_devices(const ResourcesSpec& resources);

/// Sets the rendezvous's backend and CUDA device from the resources part: backend auto
/// is nccl for a worker on a CUDA device when the NCCL backend is usable, gloo otherwise.
/// Throws SpecError when nccl is asked for and cannot be used.
void choose_backend(const ResourcesSpec& resources, c10::Device device, comm::Rendezvous& r);

}  // namespace vflow::engine
