#include "comm/host_memory.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <thread>
#include <type_traits>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace vflow::comm {

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kLine = 64;  // one counter per cache line
constexpr size_t kPage = 4096;
constexpr size_t kMiB = size_t{1} << 20;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

/// What makes two processes able to share memory and pids: the same boot of the same
/// kernel, and the same network, mount, IPC and PID namespaces. Ranks in network
/// namespaces of their own stand for separate hosts, and must not share memory even
/// where they could. 0 where it cannot be read.
int64_t host_identity() {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string text;
  if (!(boot >> text)) return 0;
  for (const char* ns : {"net", "mnt", "ipc", "pid"}) {
    struct stat st {};
    if (stat(fmt::format("/proc/self/ns/{}", ns).c_str(), &st) != 0) return 0;
    text += fmt::format("/{}:{}", ns, static_cast<uint64_t>(st.st_ino));
  }
  const auto h = static_cast<int64_t>(std::hash<std::string>{}(text) >> 1);
  return h == 0 ? 1 : h;
}

/// Each rank's slot: two halves, used by alternate pieces of a sum, so that one
/// piece's last reads never race the next piece's writes (docs/design.md, "Ranks on
/// one host").
size_t slot_bytes(int ranks) {
  return round_up(std::clamp<size_t>(64 * kMiB / static_cast<size_t>(ranks), kMiB, 8 * kMiB),
                  2 * kPage);
}

/// The header: the abandoned flag, then each rank's phase, then each rank's figure (the
/// result its part of a combination reported), each on a cache line of its own.
size_t header_bytes(int ranks) {
  return round_up(kLine * (1 + 2 * static_cast<size_t>(ranks)), kPage);
}

uint64_t as_bits(double x) {
  uint64_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

double as_double(uint64_t bits) {
  double x = 0;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

/// The larger of two figures; NaN when either is.
double larger(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  return std::max(a, b);
}

/// An unnamed mapping of the group's segment.
struct Mapping {
  void* base = nullptr;
  size_t bytes = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (base != nullptr) munmap(base, bytes);
  }
  /// Maps `fd` (which it closes); false on failure, with errno set by mmap.
  bool map(int fd, size_t size) {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int error = errno;
    close(fd);
    errno = error;
    if (p == MAP_FAILED) return false;
    base = p;
    bytes = size;
    return true;
  }
};

/// Creates and reserves the segment `name` of `bytes` (rank 0): an error text, or "".
std::string create_segment(const std::string& name, size_t bytes, Mapping& mapping) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return fmt::format("shm_open({}): {}", name, std::strerror(errno));
  // Reserve every page now: a full /dev/shm is an error here, not a SIGBUS mid-step.
  int error = ftruncate(fd, static_cast<off_t>(bytes)) != 0 ? errno : 0;
  if (error == 0) error = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (error != 0) {
    close(fd);
    shm_unlink(name.c_str());
    return fmt::format("reserving {} MiB in /dev/shm: {}", bytes / kMiB, std::strerror(error));
  }
  if (!mapping.map(fd, bytes)) {
    shm_unlink(name.c_str());
    return fmt::format("mmap: {}", std::strerror(errno));
  }
  return "";
}

std::string open_segment(const std::string& name, size_t bytes, Mapping& mapping) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) return fmt::format("shm_open({}): {}", name, std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
    close(fd);
    return fmt::format("{} is not the group's segment", name);
  }
  if (!mapping.map(fd, bytes)) return fmt::format("mmap: {}", std::strerror(errno));
  return "";
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/// dst[i] = src[0][i] + src[1][i] + ... + src[n-1][i], left to right (so every rank that
/// reads the result gets the same bits); integers wrap as Gloo's sums do.
template <typename T, bool = std::is_integral_v<T>>
struct Adder {
  using type = T;
};
template <typename T>
struct Adder<T, true> {
  using type = std::make_unsigned_t<T>;
};

template <typename T>
void sum_parts(T* dst, const T* const* src, int n, int64_t count) {
  using Add = typename Adder<T>::type;
  const T* a = src[0];
  const T* b = src[1];
  for (int64_t i = 0; i < count; ++i) {
    dst[i] = static_cast<T>(static_cast<Add>(a[i]) + static_cast<Add>(b[i]));
  }
  for (int k = 2; k < n; ++k) {
    const T* c = src[k];
    for (int64_t i = 0; i < count; ++i) {
      dst[i] = static_cast<T>(static_cast<Add>(dst[i]) + static_cast<Add>(c[i]));
    }
  }
}

class HostMemoryCommunicator final : public Communicator {
 public:
  HostMemoryCommunicator(std::unique_ptr<Communicator> base, std::unique_ptr<Mapping> mapping,
                         std::vector<int64_t> pids, std::chrono::milliseconds timeout)
      : base_(std::move(base)),
        mapping_(std::move(mapping)),
        pids_(std::move(pids)),
        timeout_(timeout),
        rank_(base_->rank()),
        size_(base_->size()),
        slot_(slot_bytes(size_)),
        header_(header_bytes(size_)) {
    for (int k = 0; k < size_; ++k) {
      if (k == rank_ || pids_[k] == getpid()) continue;
      const int fd = static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(pids_[k]), 0));
      if (fd >= 0) {
        watched_.push_back({fd, k});
      } else {
        spdlog::debug(
            "[comm] rank {} cannot watch rank {} (pid {}): {}; a peer that exits is "
            "seen after the timeout",
            rank_, k, pids_[k], std::strerror(errno));
      }
    }
  }

  ~HostMemoryCommunicator() override {
    set_aborted();
    for (const auto& w : watched_) close(w.fd);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // Every rank must take the same path whatever its tensor's device and layout (a job
  // may mix CPU and CUDA workers): only the element type decides.
  void allreduce_sum(torch::Tensor& tensor) override {
    collective_ = "allreduce";
    sum_shares(tensor, whole(tensor.numel()));
  }

  void reduce_scatter_sum(torch::Tensor& tensor, const Shares& shares) override {
    collective_ = "reduce-scatter";
    sum_shares(tensor, shares);
  }

  /// allreduce_sum and reduce_scatter_sum: the sum of the ranks' tensors where `shares` say.
  void sum_shares(torch::Tensor& tensor, const Shares& shares) {
    const auto type = tensor.scalar_type();
    if (type != torch::kFloat && type != torch::kDouble && type != torch::kInt &&
        type != torch::kLong) {
      return guarded([&] { base_->allreduce_sum(tensor); });
    }
    on_host(tensor, [&](torch::Tensor& host) {
      if (type == torch::kFloat) sum(host.data_ptr<float>(), shares);
      if (type == torch::kDouble) sum(host.data_ptr<double>(), shares);
      if (type == torch::kInt) sum(host.data_ptr<int32_t>(), shares);
      if (type == torch::kLong) sum(host.data_ptr<int64_t>(), shares);
      return 0.0;
    });
  }

  bool can_combine() const override { return true; }

  double allreduce_combine(torch::Tensor& tensor, const Combine& combine) override {
    collective_ = "allreduce";
    return combine_shares(tensor, combine, whole(tensor.numel()));
  }

  double reduce_scatter_combine(torch::Tensor& tensor, const Combine& combine,
                                const Shares& shares) override {
    collective_ = "reduce-scatter";
    return combine_shares(tensor, combine, shares);
  }

  /// allreduce_combine and reduce_scatter_combine.
  double combine_shares(torch::Tensor& tensor, const Combine& combine, const Shares& shares) {
    VFLOW_ASSERT(tensor.scalar_type() == torch::kFloat, "only float tensors are combined");
    return on_host(tensor, [&](torch::Tensor& host) {
      return exchange(host.data_ptr<float>(), shares, true,
                      [&](float* dst, const float* const* parts, int64_t count) {
                        return combine(parts, size_, dst, count);
                      });
    });
  }

  void gather_shares(torch::Tensor& tensor, const Shares& shares) override {
    collective_ = "gather";
    const auto bytes = static_cast<int64_t>(tensor.element_size());
    if (bytes != 4 && bytes != 8) return Communicator::gather_shares(tensor, shares);
    on_host(tensor, [&](torch::Tensor& host) {
      // The bits are copied as they are, whatever the element type.
      const auto no_part = [](auto*, auto, int64_t) { return 0.0; };
      if (bytes == 4) exchange(static_cast<uint32_t*>(host.data_ptr()), shares, false, no_part);
      if (bytes == 8) exchange(static_cast<uint64_t*>(host.data_ptr()), shares, false, no_part);
      return 0.0;
    });
  }

  int64_t received_bytes() const override { return received_; }

  std::unique_ptr<PendingWork> start_allreduce_sum(torch::Tensor& tensor) override {
    return guarded([&] { return base_->start_allreduce_sum(tensor); });
  }
  bool asynchronous() const override { return base_->asynchronous(); }
  std::chrono::milliseconds timeout() const override { return base_->timeout(); }
  void broadcast(torch::Tensor& tensor, int root) override {
    guarded([&] { base_->broadcast(tensor, root); });
  }
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor) override {
    return guarded([&] { return base_->all_gather(tensor); });
  }
  void barrier() override {
    guarded([&] { base_->barrier(); });
  }
  void leave() override { base_->leave(); }
  void abort() override {
    set_aborted();
    base_->abort();
  }

 private:
  struct Watched {
    int fd;
    int rank;
  };

  /// run(host) on `tensor` itself when it is a contiguous host tensor, else on a
  /// contiguous host copy that is then copied back; returns run's figure.
  template <typename Run>
  static double on_host(torch::Tensor& tensor, Run run) {
    if (tensor.is_cpu() && tensor.is_contiguous()) return run(tensor);
    auto host = tensor.to(torch::kCPU).contiguous();
    const double figure = run(host);
    tensor.copy_(host);
    return figure;
  }

  /// `run()`, marking the group failed for the peers when it fails.
  template <typename Run>
  auto guarded(Run run) -> decltype(run()) {
    try {
      return run();
    } catch (const PeerFailure&) {
      set_aborted();
      throw;
    }
  }

  uint64_t* counter(size_t line) const {
    return reinterpret_cast<uint64_t*>(static_cast<char*>(mapping_->base) + kLine * line);
  }
  uint64_t* aborted() const { return counter(0); }
  uint64_t* phase_of(int rank) const { return counter(1 + static_cast<size_t>(rank)); }
  uint64_t* figure_of(int rank) const { return counter(1 + static_cast<size_t>(size_ + rank)); }
  void set_aborted() {
    if (mapping_) __atomic_store_n(aborted(), 1, __ATOMIC_RELEASE);
  }

  template <typename T>
  T* part(int rank, uint64_t half) const {
    return reinterpret_cast<T*>(static_cast<char*>(mapping_->base) + header_ +
                                static_cast<size_t>(rank) * slot_ + half * (slot_ / 2));
  }

  std::string failed() const {
    return fmt::format("[comm] {} failed on rank {} of {}", collective_, rank_, size_);
  }

  /// Announces this rank's next phase and waits until every rank has reached it.
  void arrive_and_wait() {
    ++phase_;
    __atomic_store_n(phase_of(rank_), phase_, __ATOMIC_RELEASE);
    const auto start = Clock::now();
    const auto deadline = start + timeout_;
    for (uint64_t spin = 0;; ++spin) {
      // Read the flag first: a peer that finished and then left arrived before it set it.
      const bool abandoned = __atomic_load_n(aborted(), __ATOMIC_ACQUIRE) != 0;
      int missing = -1;
      for (int k = 0; k < size_ && missing < 0; ++k) {
        if (__atomic_load_n(phase_of(k), __ATOMIC_ACQUIRE) < phase_) missing = k;
      }
      if (missing < 0) return;
      if (abandoned) {
        throw PeerFailure(fmt::format("{}: a peer failed or left the group", failed()));
      }
      if (spin < 256) {
        cpu_relax();
        continue;
      }
      const auto now = Clock::now();
      if (spin % 16 == 0) check_peers_alive();
      if (now > deadline) {
        set_aborted();
        throw PeerFailure(fmt::format("{}: rank {} did not arrive within {} ms", failed(), missing,
                                      timeout_.count()));
      }
      if (now - start < std::chrono::milliseconds(1)) {
        sched_yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  /// Fails the barrier where a peer that has not arrived at it exited. One that arrived
  /// and then exited fails it on no rank: a rank that arrives after finds every rank
  /// arrived and passes, so every survivor must pass (else the survivors of a step's last
  /// barrier would be a step apart); the dead peer fails the next barrier on all.
  void check_peers_alive() {
    if (watched_.empty()) return;
    std::vector<pollfd> fds;
    for (const auto& w : watched_) fds.push_back({w.fd, POLLIN, 0});
    if (poll(fds.data(), fds.size(), 0) <= 0) return;
    for (size_t i = 0; i < fds.size(); ++i) {
      // Its arrival, stored before it exited, is seen once its exit is.
      if (fds[i].revents != 0 &&
          __atomic_load_n(phase_of(watched_[i].rank), __ATOMIC_ACQUIRE) < phase_) {
        set_aborted();
        throw PeerFailure(fmt::format("{}: rank {} (pid {}) exited", failed(), watched_[i].rank,
                                      pids_[watched_[i].rank]));
      }
    }
  }

  /// The shares of an allreduce of `n` elements: balanced, 16-element aligned, every
  /// element wanted.
  Shares whole(int64_t n) const {
    Shares shares;
    const int64_t share = ((n + size_ - 1) / size_ + 15) & ~int64_t{15};
    for (int k = 0; k <= size_; ++k) shares.bounds.push_back(std::min(n, k * share));
    shares.wanted.assign(static_cast<size_t>(size_), {{0, n}});
    return shares;
  }

  /// The sum of `n` elements at `x` over all ranks (ranks in order), where `shares` says.
  template <typename T>
  void sum(T* x, const Shares& shares) {
    exchange(x, shares, true, [&](T* dst, const T* const* sources, int64_t count) {
      sum_parts(dst, sources, size_, count);
      return 0.0;
    });
  }

  /// Rank k's share [bounds[k], bounds[k + 1]) of the elements at `x` becomes
  /// reduce_part of every rank's values there, computed by rank k, and each rank copies
  /// out the others' reduced values its wanted ranges cover. In rounds, each of which
  /// takes the next chunk of every share: each rank publishes its values of the others'
  /// chunks in its slot (unless `publish` is false: a gather, where each owner's values
  /// are taken as they are and reduce_part is not called), reduces its own chunk into `x`
  /// and its slot, and after a barrier takes what it wants of the others'. Halves of the
  /// slots alternate by round, so that a round's last reads never race the writes of the
  /// round after next (docs/design.md, "Ranks on one host"). reduce_part(dst, sources,
  /// count) writes dst from the ranks' sources (in rank order) and returns a figure; the
  /// largest over every rank's parts (NaN if any) is returned on every rank.
  template <typename T, typename ReducePart>
  double exchange(T* x, const Shares& shares, bool publish, ReducePart reduce_part) {
    shares.check(size_);
    const auto& bounds = shares.bounds;
    // A published round holds one chunk for every rank in each slot, a gather only the
    // owner's.
    const auto region_bytes = slot_ / 2 / (publish ? static_cast<size_t>(size_) : 1);
    const int64_t chunk = std::max<int64_t>(16, (region_bytes / sizeof(T)) & ~size_t{15});
    const auto region = [&](int k, int owner, uint64_t half) {
      return part<T>(k, half) + (publish ? static_cast<size_t>(owner) * chunk : 0);
    };
    int64_t longest = 0;
    for (int k = 0; k < size_; ++k) longest = std::max(longest, bounds[k + 1] - bounds[k]);
    if (longest == 0) return 0;
    std::vector<const T*> sources(static_cast<size_t>(size_));
    double figure = 0;
    for (int64_t done = 0; done < longest; done += chunk) {
      const auto begin = [&](int k) { return std::min(bounds[k] + done, bounds[k + 1]); };
      const auto end = [&](int k) { return std::min(bounds[k] + done + chunk, bounds[k + 1]); };
      const uint64_t half = pieces_++ % 2;
      if (publish) {
        for (int k = 0; k < size_; ++k) {
          if (k != rank_ && end(k) > begin(k)) {
            std::memcpy(region(rank_, k, half), x + begin(k), sizeof(T) * (end(k) - begin(k)));
          }
        }
        arrive_and_wait();
      }
      const int64_t mine = end(rank_) - begin(rank_);
      T* out = region(rank_, rank_, half);
      if (mine > 0 && publish) {
        for (int k = 0; k < size_; ++k) {
          sources[k] = k == rank_ ? x + begin(rank_) : region(k, rank_, half);
        }
        figure = larger(figure, reduce_part(out, sources.data(), mine));
        std::memcpy(x + begin(rank_), out, sizeof(T) * mine);
        received_ += static_cast<int64_t>(sizeof(T)) * mine * (size_ - 1);
      } else if (mine > 0) {
        std::memcpy(out, x + begin(rank_), sizeof(T) * mine);
      }
      // Published before the barrier, which orders it for the readers after it; rewritten
      // only after the next published round's first barrier, which every reader has passed
      // by then (a gather, whose one barrier follows its writes, publishes none).
      if (publish) __atomic_store_n(figure_of(rank_), as_bits(figure), __ATOMIC_RELAXED);
      arrive_and_wait();
      for (int k = 0; k < size_; ++k) {
        if (k == rank_) continue;
        for (const auto& [from, to] : shares.wanted[static_cast<size_t>(rank_)]) {
          const int64_t b = std::max(from, begin(k));
          const int64_t e = std::min(to, end(k));
          if (e <= b) continue;
          std::memcpy(x + b, region(k, k, half) + (b - begin(k)), sizeof(T) * (e - b));
          received_ += static_cast<int64_t>(sizeof(T)) * (e - b);
        }
      }
    }
    double all = 0;
    for (int k = 0; k < size_ && publish; ++k) {
      all = larger(all, as_double(__atomic_load_n(figure_of(k), __ATOMIC_RELAXED)));
    }
    return all;
  }

  std::unique_ptr<Communicator> base_;
  std::unique_ptr<Mapping> mapping_;
  std::vector<int64_t> pids_;
  std::vector<Watched> watched_;
  std::chrono::milliseconds timeout_;
  int rank_;
  int size_;
  size_t slot_;
  size_t header_;
  uint64_t phase_ = 0;
  uint64_t pieces_ = 0;
  int64_t received_ = 0;                  // bytes copied out of the peers' slots
  const char* collective_ = "allreduce";  // the one in progress, named when it fails
};

}  // namespace

bool sums_through_host_memory(const Communicator& comm) {
  return dynamic_cast<const HostMemoryCommunicator*>(&comm) != nullptr;
}

std::unique_ptr<Communicator> over_host_memory(std::unique_ptr<Communicator> base,
                                               std::chrono::milliseconds timeout) {
  const int ranks = base->size();
  const int rank = base->rank();
  if (ranks < 2) return base;
  const auto ids = base->all_gather(torch::tensor({host_identity(), int64_t{getpid()}}));
  std::vector<int64_t> pids;
  for (const auto& id : ids) {
    const auto* p = id.data_ptr<int64_t>();
    if (p[0] == 0 || p[0] != ids[0].data_ptr<int64_t>()[0]) return base;
    pids.push_back(p[1]);
  }
  const size_t bytes = header_bytes(ranks) + static_cast<size_t>(ranks) * slot_bytes(ranks);
  auto mapping = std::make_unique<Mapping>();
  auto token = torch::zeros({1}, torch::kLong);
  std::string error;
  std::string name;
  if (rank == 0) {
    std::random_device random;
    const uint64_t t = (uint64_t{random()} << 32 | random()) | 1;
    name = fmt::format("/vflow-{:016x}", t);
    error = create_segment(name, bytes, *mapping);
    if (error.empty()) token[0] = static_cast<int64_t>(t);
  }
  const bool created = rank == 0 && error.empty();
  auto failures = torch::zeros({1}, torch::kInt);
  try {
    base->broadcast(token, 0);
    const auto t = static_cast<uint64_t>(token[0].item<int64_t>());
    if (rank != 0 && t != 0) {
      name = fmt::format("/vflow-{:016x}", t);
      error = open_segment(name, bytes, *mapping);
    }
    failures[0] = (t == 0 || !error.empty()) ? 1 : 0;
    base->allreduce_sum(failures);
  } catch (...) {
    if (created) shm_unlink(name.c_str());  // a peer failed meanwhile: nothing is left behind
    throw;
  }
  // Every rank has mapped it or given up: the name can go, the memory stays while mapped.
  if (created) shm_unlink(name.c_str());
  if (failures[0].item<int>() > 0) {
    if (!error.empty()) {
      spdlog::info("[comm] rank {}: sums stay on sockets, shared memory failed: {}", rank, error);
    }
    return base;
  }
  if (rank == 0) {
    spdlog::debug("[comm] the {} ranks share this host's memory: host sums go through {} MiB of it",
                  ranks, bytes / kMiB);
  }
  return std::make_unique<HostMemoryCommunicator>(std::move(base), std::move(mapping),
                                                  std::move(pids), timeout);
}

}  // namespace vflow::comm
