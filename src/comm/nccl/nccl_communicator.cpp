// The NCCL communicator (libvflow_nccl): collectives between CUDA devices on raw device
// pointers and a CUDA stream of its own, so it compiles without a CUDA build of
// LibTorch. Loaded by src/comm/nccl_loader.cpp through the three C entry points at the
// end of this file.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <nccl.h>
#include <spdlog/spdlog.h>
#include <torch/types.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "comm/store.h"
#include "vflow/comm/nccl.h"

namespace vflow::comm {
namespace {

using Clock = std::chrono::steady_clock;

std::string where(const char* file, int line) {
  const char* slash = std::strrchr(file, '/');
  return fmt::format("{}:{}", slash ? slash + 1 : file, line);
}

/// A CUDA runtime call that failed: the call, file:line and CUDA's message.
void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  throw Error(fmt::format("[comm] {} failed at {}: {} ({})", call, where(file, line),
                          cudaGetErrorString(status), cudaGetErrorName(status)));
}

#define VFLOW_CUDA_CHECK(call) check_cuda((call), #call, __FILE__, __LINE__)

ncclDataType_t nccl_type(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat32:
      return ncclFloat32;
    case torch::kFloat64:
      return ncclFloat64;
    case torch::kFloat16:
      return ncclFloat16;
    case torch::kBFloat16:
      return ncclBfloat16;
    case torch::kInt64:
      return ncclInt64;
    case torch::kInt32:
      return ncclInt32;
    case torch::kInt8:
      return ncclInt8;
    case torch::kUInt8:
      return ncclUint8;
    default:
      throw InternalError(fmt::format("[comm] NCCL has no type for tensors of {}",
                                      std::string(c10::toString(t.scalar_type()))));
  }
}

/// The UUIDs of the ranks' devices, exchanged through the store before NCCL starts, so
/// that two ranks on one GPU get a clear message rather than NCCL's refusal or a hang.
bool shares_a_device(c10d::Store& store, int rank, int size, int device) {
  cudaDeviceProp props{};
  VFLOW_CUDA_CHECK(cudaGetDeviceProperties(&props, device));
  const auto* bytes = reinterpret_cast<const uint8_t*>(&props.uuid);
  store.set(fmt::format("nccl/device/{}", rank), std::vector<uint8_t>(bytes, bytes + 16));
  std::set<std::vector<uint8_t>> seen;
  for (int r = 0; r < size; ++r) seen.insert(store.get(fmt::format("nccl/device/{}", r)));
  return static_cast<int>(seen.size()) < size;
}

// ncclCommShrink came with NCCL 2.27, ncclCommGrow and ncclCommGetUniqueId with 2.29.
// They are weak references, so that a backend built against newer headers still loads
// with an older libnccl (and does without them).
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
#define VFLOW_NCCL_HAS_SHRINK 1
#pragma weak ncclCommShrink
#else
#define VFLOW_NCCL_HAS_SHRINK 0
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 29, 0)
#define VFLOW_NCCL_HAS_GROW 1
#pragma weak ncclCommGrow
#pragma weak ncclCommGetUniqueId
#else
#define VFLOW_NCCL_HAS_GROW 0
#endif

bool runs_at_least(int major, int minor) {
  int version = 0;
  return ncclGetVersion(&version) == ncclSuccess && version >= NCCL_VERSION(major, minor, 0);
}

/// Whether this build and the NCCL loaded at run time can shrink a communicator.
bool can_shrink() {
#if VFLOW_NCCL_HAS_SHRINK
  return ncclCommShrink != nullptr && runs_at_least(2, 27);
#else
  return false;
#endif
}

/// Whether this build and the NCCL loaded at run time can grow a communicator.
bool can_grow() {
#if VFLOW_NCCL_HAS_GROW
  return ncclCommGrow != nullptr && ncclCommGetUniqueId != nullptr && runs_at_least(2, 29);
#else
  return false;
#endif
}

void publish_id(c10d::Store& store, const std::string& key, const ncclUniqueId& id) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
  store.set(key, std::vector<uint8_t>(bytes, bytes + sizeof id));
}

ncclUniqueId read_id(c10d::Store& store, const std::string& key) {
  ncclUniqueId id{};
  const auto bytes = store.get(key);
  if (bytes.size() != sizeof id) {
    throw Error(
        fmt::format("the store holds an NCCL id of {} bytes, not {}", bytes.size(), sizeof id));
  }
  std::memcpy(&id, bytes.data(), sizeof id);
  return id;
}

const char* const kUniqueIdKey = "nccl/unique_id";
const char* const kGrowIdKey = "nccl/grow_id";
/// How many earlier ranks have called ncclCommGrow: the new ranks call it after them.
const char* const kGrowStartedKey = "nccl/grow_started";

class NcclCommunicator final : public Communicator {
 public:
  /// A fresh communicator, or a new rank joining a grown one (`r.grown_from` > 0): the
  /// id travels through the generation's store prefix.
  explicit NcclCommunicator(const Rendezvous& r)
      : rank_(r.rank), size_(r.world_size), device_(r.cuda_device), timeout_(r.timeout) {
    const bool joins = r.grown_from > 0;
    const char* const call = joins ? "ncclCommGrow" : "ncclCommInitRankConfig";
    if (joins && (!can_grow() || rank_ < r.grown_from || size_ <= r.grown_from)) {
      throw Error(fmt::format(
          "[comm] rank {} of {} cannot join a communicator grown from {} rank(s){}", rank_, size_,
          r.grown_from, can_grow() ? "" : ": ncclCommGrow needs NCCL 2.29 or later"));
    }
    VFLOW_CUDA_CHECK(cudaSetDevice(device_));
    ncclUniqueId id{};
    exchange(r, [&](c10d::Store& prefixed) {
      if (joins) {
        await_count(prefixed, kGrowStartedKey, r.grown_from, "the earlier ranks to grow");
        id = read_id(prefixed, kGrowIdKey);  // made by rank 0 before it counted itself
      } else if (rank_ == 0) {
        check("ncclGetUniqueId", ncclGetUniqueId(&id), __FILE__, __LINE__);
        publish_id(prefixed, kUniqueIdKey, id);
      } else {
        id = read_id(prefixed, kUniqueIdKey);
      }
    });
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    try {
#if VFLOW_NCCL_HAS_GROW
      if (joins) {
        check(call, ncclCommGrow(nullptr, size_, &id, rank_, &comm_, &config), __FILE__, __LINE__);
      } else {
        check(call, ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), __FILE__, __LINE__);
      }
#else
      check(call, ncclCommInitRankConfig(&comm_, size_, id, rank_, &config), __FILE__, __LINE__);
#endif
      await_ready(call, __FILE__, __LINE__);
      create_stream();
    } catch (...) {
      abort_now();  // no destructor runs for a constructor that throws
      if (ready_) cudaEventDestroy(ready_);
      if (stream_) cudaStreamDestroy(stream_);
      throw;
    }
    spdlog::debug("[comm] NCCL rank {} of {} on cuda:{} ready (generation {}{})", rank_, size_,
                  device_, r.generation, joins ? ", joined by growth" : "");
  }

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  ~NcclCommunicator() override {
    if (abort_requested_) abort_now();
    if (comm_ && !aborted_) {
      // A healthy communicator finalizes (its peers are alive, or it would have failed);
      // if even that does not finish in time, abort rather than hang in destroy.
      try {
        check("ncclCommFinalize", ncclCommFinalize(comm_), __FILE__, __LINE__);
        await_ready("ncclCommFinalize", __FILE__, __LINE__);
        ncclCommDestroy(comm_);
      } catch (const std::exception& e) {
        spdlog::warn("{}", e.what());
        abort_now();
      }
    }
    if (scratch_) cudaFree(scratch_);
    if (ready_) cudaEventDestroy(ready_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allreduce_sum(torch::Tensor& tensor) override {
    const auto count = static_cast<size_t>(tensor.numel());
    const auto type = nccl_type(tensor);
    in_place("ncclAllReduce", tensor, [&](void* data) {
      return ncclAllReduce(data, data, count, type, ncclSum, comm_, stream_);
    });
  }

  void broadcast(torch::Tensor& tensor, int root) override {
    const auto count = static_cast<size_t>(tensor.numel());
    const auto type = nccl_type(tensor);
    in_place("ncclBroadcast", tensor, [&](void* data) {
      return ncclBroadcast(data, data, count, type, root, comm_, stream_);
    });
  }

  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor) override {
    const auto input = tensor.contiguous();
    const auto count = static_cast<size_t>(input.numel());
    const auto type = nccl_type(input);
    auto sizes = input.sizes().vec();
    sizes.insert(sizes.begin(), size_);
    auto gathered = torch::empty(sizes, input.options());
    if (input.is_cuda()) {
      check_device(input);
      collective("ncclAllGather", __FILE__, __LINE__, [&] {
        return ncclAllGather(input.data_ptr(), gathered.data_ptr(), count, type, comm_, stream_);
      });
    } else {
      const size_t bytes = input.nbytes();
      auto* recv = static_cast<char*>(scratch(bytes * (size_ + 1)));
      auto* send = recv + bytes * size_;
      VFLOW_CUDA_CHECK(
          cudaMemcpyAsync(send, input.data_ptr(), bytes, cudaMemcpyHostToDevice, stream_));
      collective("ncclAllGather", __FILE__, __LINE__,
                 [&] { return ncclAllGather(send, recv, count, type, comm_, stream_); });
      VFLOW_CUDA_CHECK(
          cudaMemcpy(gathered.data_ptr(), recv, bytes * size_, cudaMemcpyDeviceToHost));
    }
    std::vector<torch::Tensor> out;
    for (int r = 0; r < size_; ++r) out.push_back(gathered[r]);
    return out;
  }

  void barrier() override {
    auto one = torch::ones({1});
    allreduce_sum(one);
  }

  void leave() override {
    try {
      if (store_) store_->add(kLeftKey, 1);
    } catch (const std::exception& e) {
      spdlog::warn("[comm] rank {} could not tell the coordinator it left: {}", rank_, e.what());
    }
  }

  /// A healthy communicator shrinks to the ranks that stay (a planned scale-in). After a
  /// failure the communicator was already aborted (a kernel waiting for a dead peer must
  /// not keep writing into the caller's buffer), and an empty exclusion list is no shrink
  /// for NCCL: both return nullptr, and the caller initialises afresh.
  std::unique_ptr<Communicator> shrink(const std::vector<int>& excluded,
                                       bool after_failure) override {
#if VFLOW_NCCL_HAS_SHRINK
    std::lock_guard<std::mutex> lock(calls_);
    if (aborted_ || abort_requested_ || after_failure || excluded.empty() || !can_shrink()) {
      return nullptr;
    }
    VFLOW_CUDA_CHECK(cudaSetDevice(device_));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    std::vector<int> ranks(excluded);  // NCCL sorts the list in place
    ncclComm_t child = nullptr;
    const auto status = ncclCommShrink(comm_, ranks.data(), static_cast<int>(ranks.size()), &child,
                                       &config, NCCL_SHRINK_DEFAULT);
    try {
      await_child("ncclCommShrink", status, child);
    } catch (const Error& e) {
      spdlog::warn("[comm] ncclCommShrink on rank {} of {} failed ({}); initialising afresh", rank_,
                   size_, e.what());
      return nullptr;
    }
    return adopt(child, "ncclCommShrink");
#else
    return nullptr;  // NCCL before 2.27 has no shrink: the caller initialises afresh
#endif
  }

  /// A healthy communicator grows by the ranks that come after its own (a planned
  /// scale-out). Rank 0 makes the grow id; every earlier rank calls ncclCommGrow and then
  /// counts itself under the next generation's prefix, and the new ranks call it once all
  /// have (NCCL's documentation does not say that another order works). Any failure is a
  /// PeerFailure: the new ranks are already waiting, so the generation fails as a whole.
  std::unique_ptr<Communicator> grow(const Rendezvous& next) override {
#if VFLOW_NCCL_HAS_GROW
    std::lock_guard<std::mutex> lock(calls_);
    if (aborted_ || abort_requested_ || next.world_size <= size_ || next.rank != rank_ ||
        !can_grow()) {
      return nullptr;
    }
    ncclComm_t child = nullptr;
    try {
      VFLOW_CUDA_CHECK(cudaSetDevice(device_));
      ncclResult_t status = ncclSuccess;
      exchange(next, [&](c10d::Store& prefixed) {
        ncclUniqueId id{};
        if (rank_ == 0) {
          const auto made = ncclCommGetUniqueId(comm_, &id);
          if (made != ncclSuccess) fail("ncclCommGetUniqueId", made, __FILE__, __LINE__);
        }
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;
        status =
            ncclCommGrow(comm_, next.world_size, rank_ == 0 ? &id : nullptr, -1, &child, &config);
        check("ncclCommGrow", status, __FILE__, __LINE__);
        if (rank_ == 0) publish_id(prefixed, kGrowIdKey, id);
        prefixed.add(kGrowStartedKey, 1);
      });
      await_child("ncclCommGrow", status, child);
    } catch (const std::exception& e) {
      abort_now();  // joins NCCL's job before `child` is read
      if (child) ncclCommAbort(child);
      if (dynamic_cast<const PeerFailure*>(&e)) throw;
      throw PeerFailure(e.what());
    }
    return adopt(child, "ncclCommGrow");
#else
    (void)next;
    return nullptr;  // NCCL before 2.29 cannot grow: everyone initialises afresh
#endif
  }

  void abort() override {
    // No thread may be inside another NCCL call during ncclCommAbort: when a collective
    // is being waited for, its waiting loop aborts on our behalf.
    if (calls_.try_lock()) {
      abort_now();
      calls_.unlock();
    } else {
      abort_requested_ = true;
    }
  }

 private:
  /// The child of a shrink or grow: shares the parent's device, timeout and store.
  NcclCommunicator(ncclComm_t child, const NcclCommunicator& parent)
      : comm_(child),
        rank_(parent.rank_),
        size_(parent.size_),
        device_(parent.device_),
        timeout_(parent.timeout_),
        store_(parent.store_) {}

  /// Meets the generation's other ranks in the job's store: checks that no two of them
  /// share a device (NCCL refuses that, or hangs), then runs `body` on the generation's
  /// prefix (the id exchange). A store that fails or peers that do not come within the
  /// timeout are a PeerFailure.
  template <typename Body>
  void exchange(const Rendezvous& r, Body body) {
    try {
      if (!store_) store_ = rendezvous_store(r);
      auto prefixed = c10::make_intrusive<c10d::PrefixStore>("gen/" + r.generation, store_);
      if (r.world_size > 1 && shares_a_device(*prefixed, r.rank, r.world_size, device_)) {
        allow_shared_device();
      }
      body(*prefixed);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      const std::string what = e.what();
      throw PeerFailure(
          fmt::format("[comm] rank {} of {} could not exchange the NCCL id of generation {} at "
                      "{}:{} within {} ms: {}",
                      r.rank, r.world_size, r.generation, r.store_host, r.store_port,
                      timeout_.count(), what.substr(0, what.find('\n'))));
    }
  }

  /// Waits until the store's counter `key` reaches `count` (PeerFailure after the
  /// timeout, saying what it waited for).
  void await_count(c10d::Store& store, const std::string& key, int count, const char* what) {
    const auto deadline = Clock::now() + timeout_;
    int64_t seen = 0;
    while ((seen = store.add(key, 0)) < count) {
      if (Clock::now() > deadline) {
        throw PeerFailure(fmt::format("[comm] rank {} of {} waited {} ms for {} ({} of {})", rank_,
                                      size_, timeout_.count(), what, seen, count));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  /// Waits until NCCL has made the child of a shrink or grow. In non-blocking mode the
  /// child's handle is written when the parent's asynchronous state leaves
  /// ncclInProgress: wait on the parent, never read `child` before that. A failure or
  /// timeout aborts the parent (joining NCCL's job) and the child, and throws.
  void await_child(const char* call, ncclResult_t status, ncclComm_t& child) {
    try {
      check(call, status, __FILE__, __LINE__);
      await_ready(call, __FILE__, __LINE__);
      if (!child) {
        throw PeerFailure(
            fmt::format("[comm] {} on rank {} of {} gave no communicator", call, rank_, size_));
      }
    } catch (...) {
      abort_now();  // (already done by a failure) joins the job before `child` is read
      if (child) ncclCommAbort(child);
      child = nullptr;
      throw;
    }
  }

  /// The child NCCL made on the parent's side, once it is ready on its own.
  std::unique_ptr<Communicator> adopt(ncclComm_t child, const char* call) {
    auto next = std::unique_ptr<NcclCommunicator>(new NcclCommunicator(child, *this));
    next->await_ready(call, __FILE__, __LINE__);
    int rank = 0;
    int count = 0;
    next->check("ncclCommUserRank", ncclCommUserRank(child, &rank), __FILE__, __LINE__);
    next->check("ncclCommCount", ncclCommCount(child, &count), __FILE__, __LINE__);
    next->rank_ = rank;
    next->size_ = count;
    next->create_stream();
    return next;
  }

  void create_stream() {
    VFLOW_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    VFLOW_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  }

  /// NCCL >= 2.30 takes two ranks on one GPU only when asked; older versions refuse.
  void allow_shared_device() {
    int version = 0;
    ncclGetVersion(&version);
    if (version < NCCL_VERSION(2, 30, 0)) {
      throw SpecError(fmt::format(
          "[comm] two ranks of this job are on one GPU (rank {} on cuda:{}), which NCCL {} "
          "refuses (2.30 and later allow it); give each worker its own device, or use "
          "resources.backend: gloo",
          rank_, device_, version));
    }
    // NCCL_MULTI_RANK_GPU_ENABLE is set by the loader (src/comm/nccl_loader.cpp) before any
    // NCCL call, unless the user set it (NCCL reads its variables once per process).
  }

  void ensure_usable(const char* call) {
    if (abort_requested_) abort_now();
    if (aborted_) {
      throw PeerFailure(
          fmt::format("[comm] {} on rank {} of {}: the NCCL communicator was "
                      "aborted after an earlier failure",
                      call, rank_, size_));
    }
  }

  void check(const char* call, ncclResult_t status, const char* file, int line) {
    if (status != ncclSuccess && status != ncclInProgress) fail(call, status, file, line);
  }

  /// Aborts the communicator (no later call can hang on it, and no kernel keeps waiting
  /// for a dead peer) and throws: a misuse (an invalid argument or usage) is a plain
  /// Error, everything else (a peer, the network, CUDA under NCCL) a PeerFailure.
  [[noreturn]] void fail(const char* call, ncclResult_t status, const char* file, int line) {
    const char* last = comm_ ? ncclGetLastError(comm_) : nullptr;
    const auto message = fmt::format("[comm] {} failed on rank {} of {} at {}: {}{}{}", call, rank_,
                                     size_, where(file, line), ncclGetErrorString(status),
                                     last && *last ? ": " : "", last ? last : "");
    abort_now();
    if (status == ncclInvalidArgument || status == ncclInvalidUsage) throw InternalError(message);
    throw PeerFailure(message);
  }

  /// Polls the communicator's asynchronous state until it leaves ncclInProgress.
  void await_ready(const char* call, const char* file, int line) {
    const auto deadline = Clock::now() + timeout_;
    while (true) {
      ncclResult_t state = ncclSuccess;
      const auto polled = ncclCommGetAsyncError(comm_, &state);
      if (polled != ncclSuccess) fail("ncclCommGetAsyncError", polled, file, line);
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(call, state, file, line);
      give_up_after(deadline, call, file, line);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  void give_up_after(Clock::time_point deadline, const char* call, const char* file, int line) {
    if (abort_requested_) {
      abort_now();
      throw PeerFailure(fmt::format("[comm] {} on rank {} of {} was aborted at {}", call, rank_,
                                    size_, where(file, line)));
    }
    if (Clock::now() < deadline) return;
    abort_now();
    throw PeerFailure(
        fmt::format("[comm] {} on rank {} of {} did not finish within {} ms at {}; "
                    "a peer is dead or silent (the communicator was aborted)",
                    call, rank_, size_, timeout_.count(), where(file, line)));
  }

  /// Enqueues a collective after the work the caller queued on the legacy default stream
  /// (where LibTorch runs unless told otherwise) and waits for it to finish.
  template <typename Enqueue>
  void collective(const char* call, const char* file, int line, Enqueue enqueue) {
    std::lock_guard<std::mutex> lock(calls_);
    ensure_usable(call);
    VFLOW_CUDA_CHECK(cudaSetDevice(device_));
    VFLOW_CUDA_CHECK(cudaEventRecord(ready_, cudaStreamLegacy));
    VFLOW_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
    check(call, enqueue(), file, line);
    const auto deadline = Clock::now() + timeout_;
    while (true) {
      ncclResult_t state = ncclSuccess;
      const auto polled = ncclCommGetAsyncError(comm_, &state);
      if (polled != ncclSuccess) fail("ncclCommGetAsyncError", polled, file, line);
      if (state != ncclSuccess && state != ncclInProgress) fail(call, state, file, line);
      if (state == ncclSuccess) {
        const auto done = cudaStreamQuery(stream_);
        if (done == cudaSuccess) return;
        if (done != cudaErrorNotReady) check_cuda(done, "cudaStreamQuery", file, line);
      }
      give_up_after(deadline, call, file, line);
      std::this_thread::yield();
    }
  }

  void check_device(const torch::Tensor& t) const {
    if (t.device().index() != device_ || !t.is_contiguous()) {
      throw InternalError(fmt::format(
          "[comm] NCCL rank {} works on contiguous tensors of cuda:{}, got "
          "a {}tensor on {}",
          rank_, device_, t.is_contiguous() ? "" : "non-contiguous ", t.device().str()));
    }
  }

  /// Runs an in-place collective on a CUDA tensor, or on a CPU tensor staged through
  /// device memory.
  template <typename Enqueue>
  void in_place(const char* call, torch::Tensor& tensor, Enqueue enqueue) {
    if (tensor.is_cuda()) {
      check_device(tensor);
      collective(call, __FILE__, __LINE__, [&] { return enqueue(tensor.data_ptr()); });
      return;
    }
    auto host = tensor.contiguous();
    const size_t bytes = host.nbytes();
    void* device = scratch(bytes);
    VFLOW_CUDA_CHECK(
        cudaMemcpyAsync(device, host.data_ptr(), bytes, cudaMemcpyHostToDevice, stream_));
    collective(call, __FILE__, __LINE__, [&] { return enqueue(device); });
    VFLOW_CUDA_CHECK(cudaMemcpy(host.data_ptr(), device, bytes, cudaMemcpyDeviceToHost));
    if (!tensor.is_contiguous()) tensor.copy_(host);
  }

  void* scratch(size_t bytes) {
    if (bytes > scratch_bytes_) {
      if (scratch_) VFLOW_CUDA_CHECK(cudaFree(scratch_));
      scratch_ = nullptr;
      VFLOW_CUDA_CHECK(cudaSetDevice(device_));
      VFLOW_CUDA_CHECK(cudaMalloc(&scratch_, bytes));
      scratch_bytes_ = bytes;
    }
    return scratch_;
  }

  void abort_now() noexcept {
    if (comm_ && !aborted_) {
      aborted_ = true;
      ncclCommAbort(comm_);
    }
  }

  ncclComm_t comm_ = nullptr;
  int rank_;
  int size_;
  int device_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Store> store_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  std::mutex calls_;
  std::atomic<bool> abort_requested_{false};
  bool aborted_ = false;
};

}  // namespace
}  // namespace vflow::comm

// The entry points the loader looks up (C names, so that dlsym finds them).
extern "C" {

__attribute__((visibility("default"))) int vflow_nccl_version() {
  int version = 0;
  return ncclGetVersion(&version) == ncclSuccess ? version : 0;
}

/// The path of the NCCL library this backend runs on (the dynamic loader's choice).
__attribute__((visibility("default"))) const char* vflow_nccl_library() {
  static const std::string path = [] {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&ncclGetVersion), &info) == 0 || !info.dli_fname) {
      return std::string("an unknown path");
    }
    return std::string(info.dli_fname);
  }();
  return path.c_str();
}

/// 1 when this build and the NCCL loaded can grow a communicator (NCCL >= 2.29).
__attribute__((visibility("default"))) int vflow_nccl_can_grow() {
  return vflow::comm::can_grow() ? 1 : 0;
}

/// CUDA devices visible, or -1 with CUDA's reason in `why`.
__attribute__((visibility("default"))) int vflow_nccl_devices(char* why, size_t capacity) {
  int count = 0;
  const auto status = cudaGetDeviceCount(&count);
  if (status == cudaSuccess) return count;
  std::snprintf(why, capacity, "%s (%s)", cudaGetErrorString(status), cudaGetErrorName(status));
  return -1;
}

/// The name of CUDA device `index` (e.g. "NVIDIA H200"), or false.
__attribute__((visibility("default"))) bool vflow_nccl_device_name(int index, char* name,
                                                                   size_t capacity) {
  cudaDeviceProp properties{};
  if (cudaGetDeviceProperties(&properties, index) != cudaSuccess) return false;
  std::snprintf(name, capacity, "%s", properties.name);
  return true;
}

/// Bytes of CUDA device `index` in use by anyone (total - free), or -1.
__attribute__((visibility("default"))) long long vflow_nccl_memory_used(int index) {
  int current = 0;
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaGetDevice(&current) != cudaSuccess || cudaSetDevice(index) != cudaSuccess) return -1;
  const bool ok = cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess;
  cudaSetDevice(current);
  return ok ? static_cast<long long>(total_bytes - free_bytes) : -1;
}

__attribute__((visibility("default"))) vflow::comm::Communicator* vflow_nccl_create(
    const vflow::comm::Rendezvous* rendezvous) {
  return new vflow::comm::NcclCommunicator(*rendezvous);
}
}
