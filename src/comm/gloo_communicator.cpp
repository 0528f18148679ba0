#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <deque>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <utility>

#include "comm/host_memory.h"
#include "comm/store.h"
#include "vflow/comm/communicator.h"

namespace vflow::comm {

namespace {

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

/// The local address this host uses to reach `host` (what Gloo should bind to), found by
/// connecting a UDP socket, which sends nothing. Falls back to Gloo's default device.
std::shared_ptr<::gloo::transport::Device> device_towards(const std::string& host, int port) {
  if (is_loopback(host)) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) == 0 && found) {
    const int fd = socket(AF_INET, SOCK_DGRAM, 0);
    sockaddr_in local{};
    socklen_t len = sizeof local;
    const bool ok = fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
                    getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
    if (fd >= 0) close(fd);
    freeaddrinfo(found);
    char text[INET_ADDRSTRLEN] = {};
    if (ok && inet_ntop(AF_INET, &local.sin_addr, text, sizeof text)) {
      return c10d::ProcessGroupGloo::createDeviceForHostname(text);
    }
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

/// `what` failed ("[comm] allreduce failed on rank r of n") because of `e`.
PeerFailure peer_failure(const std::string& what, const std::exception& e) {
  return PeerFailure(fmt::format("{}: {}", what, first_line(e.what())));
}

/// A sum already done when it was started.
class DoneWork final : public PendingWork {
 public:
  void wait(std::chrono::steady_clock::time_point) override {}
};

/// A Gloo collective in flight: c10d's work object, waited for up to a deadline.
template <typename Work>
class GlooWork final : public PendingWork {
 public:
  GlooWork(Work work, std::string what) : work_(std::move(work)), what_(std::move(what)) {}

  void wait(std::chrono::steady_clock::time_point deadline) override {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    try {
      // c10d reads 0 as "no timeout": wait at least a millisecond.
      work_->wait(std::max(left, std::chrono::milliseconds(1)));
    } catch (const std::exception& e) {
      throw peer_failure(what_, e);
    }
  }

 private:
  Work work_;
  std::string what_;
};

class GlooCommunicator final : public Communicator {
 public:
  explicit GlooCommunicator(const Rendezvous& r)
      : rank_(r.rank), size_(r.world_size), timeout_(r.timeout) {
    try {
      store_ = rendezvous_store(r);
      auto prefixed = c10::make_intrusive<c10d::PrefixStore>("gen/" + r.generation, store_);
      auto gloo = c10d::ProcessGroupGloo::Options::create(r.timeout);
      gloo->devices.push_back(device_towards(r.store_host, r.store_port));
      group_ = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, r.rank, r.world_size, gloo);
    } catch (const std::exception& e) {
      throw PeerFailure(
          fmt::format("[comm] rank {} of {} could not join generation {} at {}:{} within {} ms: {}",
                      r.rank, r.world_size, r.generation, r.store_host, r.store_port,
                      r.timeout.count(), first_line(e.what())));
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // Tensors on a GPU go through host memory, so that every rank runs Gloo's CPU
  // algorithms whatever its device: a job may mix CPU and CUDA workers.
  void allreduce_sum(torch::Tensor& tensor) override {
    std::vector<torch::Tensor> tensors{on_host(tensor)};
    run("allreduce", [&] { return group_->allreduce(tensors); });
    if (!tensor.is_cpu()) tensor.copy_(tensors[0]);
  }

  std::unique_ptr<PendingWork> start_allreduce_sum(torch::Tensor& tensor) override {
    if (!tensor.is_cpu()) return Communicator::start_allreduce_sum(tensor);
    std::vector<torch::Tensor> tensors{tensor};
    try {
      auto work = group_->allreduce(tensors);
      return std::make_unique<GlooWork<decltype(work)>>(std::move(work), failed("allreduce"));
    } catch (const std::exception& e) {
      throw peer_failure(failed("allreduce"), e);
    }
  }

  // LibTorch 1.13's Gloo has no reduce-scatter: point-to-point sends and receives. In
  // rounds, each rank sends every owner its values of the next chunk of the owner's share,
  // and the owner adds the ranks' values in rank order (the bits of the shared-memory sum);
  // then each owner sends every rank the sums it wants. A rank thus receives each element
  // it does not own once, as one allreduce brings it.
  void reduce_scatter_sum(torch::Tensor& tensor, const Shares& shares) override {
    const auto type = tensor.scalar_type();
    if (!tensor.is_cpu() || !tensor.is_contiguous() ||
        (type != torch::kFloat && type != torch::kDouble && type != torch::kInt &&
         type != torch::kLong)) {
      return allreduce_sum(tensor);
    }
    shares.check(size_);
    const auto& bounds = shares.bounds;
    const int64_t chunk = kChunkBytes / tensor.element_size();
    int64_t longest = 0;
    for (int k = 0; k < size_; ++k) longest = std::max(longest, bounds[k + 1] - bounds[k]);
    std::vector<torch::Tensor> inbox(static_cast<size_t>(size_));
    for (int k = 0; k < size_; ++k) {
      if (k != rank_) inbox[k] = torch::empty({std::min(chunk, longest)}, tensor.options());
    }
    for (int64_t done = 0; done < longest; done += chunk) {
      const auto begin = [&](int k) { return std::min(bounds[k] + done, bounds[k + 1]); };
      const auto count = [&](int k) {
        return std::min(bounds[k] + done + chunk, bounds[k + 1]) - begin(k);
      };
      // Message (from, to) is number from * size + to.
      Exchange exchange(*this, "reduce-scatter", int64_t{size_} * size_);
      for (int k = 0; k < size_; ++k) {
        if (k == rank_ || count(k) == 0) continue;
        exchange.send(tensor.narrow(0, begin(k), count(k)), k, int64_t{rank_} * size_ + k);
      }
      const int64_t mine = count(rank_);
      for (int k = 0; k < size_; ++k) {
        if (k == rank_ || mine == 0) continue;
        exchange.receive(inbox[k].narrow(0, 0, mine), k, int64_t{k} * size_ + rank_);
      }
      exchange.wait();
      if (mine == 0) continue;
      auto own = tensor.narrow(0, begin(rank_), mine);
      auto total = (rank_ == 0 ? own : inbox[0].narrow(0, 0, mine)).clone();
      for (int k = 1; k < size_; ++k) total.add_(k == rank_ ? own : inbox[k].narrow(0, 0, mine));
      own.copy_(total);
    }
    deliver(tensor, shares, "reduce-scatter");
  }

  void gather_shares(torch::Tensor& tensor, const Shares& shares) override {
    if (!tensor.is_cpu() || !tensor.is_contiguous()) {
      return Communicator::gather_shares(tensor, shares);
    }
    shares.check(size_);
    deliver(tensor, shares, "gather");
  }

  bool asynchronous() const override { return true; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  void broadcast(torch::Tensor& tensor, int root) override {
    std::vector<torch::Tensor> tensors{on_host(tensor)};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    run("broadcast", [&] { return group_->broadcast(tensors, options); });
    if (!tensor.is_cpu()) tensor.copy_(tensors[0]);
  }

  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor) override {
    std::vector<torch::Tensor> inputs{on_host(tensor)};
    std::vector<std::vector<torch::Tensor>> outputs(1);
    for (int i = 0; i < size_; ++i) outputs[0].push_back(torch::empty_like(inputs[0]));
    run("all_gather", [&] { return group_->allgather(outputs, inputs); });
    if (!tensor.is_cpu()) {
      for (auto& t : outputs[0]) t = t.to(tensor.device());
    }
    return outputs[0];
  }

  void barrier() override {
    run("barrier", [&] { return group_->barrier(); });
  }

  void leave() override {
    try {
      store_->add(kLeftKey, 1);
    } catch (const std::exception& e) {
      spdlog::warn("[comm] rank {} could not tell the coordinator it left: {}", rank_,
                   first_line(e.what()));
    }
  }

 private:
  static torch::Tensor on_host(const torch::Tensor& tensor) {
    return tensor.is_cpu() ? tensor : tensor.to(torch::kCPU).contiguous();
  }

  template <typename Start>
  void run(const char* what, Start start) {
    try {
      auto work = start();
      work->wait();
    } catch (const std::exception& e) {
      throw peer_failure(failed(what), e);
    }
  }

  std::string failed(const char* what) const {
    return fmt::format("[comm] {} failed on rank {} of {}", what, rank_, size_);
  }

  /// The largest message of a reduce-scatter's rounds, per peer.
  static constexpr int64_t kChunkBytes = int64_t{4} << 20;

  /// Point-to-point messages in flight together. Message i of an exchange of n has tag
  /// (the communicator's count of messages so far + i), which every rank numbers alike;
  /// waited for up to the timeout.
  class Exchange {
   public:
    Exchange(GlooCommunicator& comm, const char* what, int64_t messages)
        : comm_(comm), what_(what), base_(comm.tag_) {
      comm.tag_ += static_cast<uint64_t>(messages);
    }
    void send(const torch::Tensor& part, int to, int64_t message) {
      start(part, to, message, true);
    }
    void receive(const torch::Tensor& part, int from, int64_t message) {
      start(part, from, message, false);
    }
    void wait() {
      try {
        for (auto& w : works_) w->wait(comm_.timeout_);
      } catch (const std::exception& e) {
        throw peer_failure(comm_.failed(what_), e);
      }
    }

   private:
    void start(const torch::Tensor& part, int peer, int64_t message, bool sending) {
      const int tag = static_cast<int>((base_ + static_cast<uint64_t>(message)) & 0x3fffffff);
      auto& tensors = parts_.emplace_back(std::vector<torch::Tensor>{part});
      try {
        works_.push_back(sending ? comm_.group_->send(tensors, peer, tag)
                                 : comm_.group_->recv(tensors, peer, tag));
      } catch (const std::exception& e) {
        throw peer_failure(comm_.failed(what_), e);
      }
    }
    GlooCommunicator& comm_;
    const char* what_;
    uint64_t base_;
    std::deque<std::vector<torch::Tensor>> parts_;  // alive until waited for
    std::vector<decltype(std::declval<c10d::ProcessGroupGloo&>().send(
        std::declval<std::vector<torch::Tensor>&>(), 0, 0))>
        works_;
  };

  /// Each owner sends every other rank the parts of its share that rank wants, which the
  /// rank receives in place.
  void deliver(torch::Tensor& tensor, const Shares& shares, const char* what) {
    // (owner, rank, begin, end) of every message, in the same order on every rank.
    std::vector<std::array<int64_t, 4>> messages;
    for (int k = 0; k < size_; ++k) {
      for (int j = 0; j < size_; ++j) {
        for (const auto& [from, to] : shares.wanted[j]) {
          const int64_t lo = std::max(from, shares.bounds[k]);
          const int64_t hi = std::min(to, shares.bounds[k + 1]);
          if (j != k && hi > lo) messages.push_back({k, j, lo, hi});
        }
      }
    }
    Exchange exchange(*this, what, static_cast<int64_t>(messages.size()));
    for (size_t i = 0; i < messages.size(); ++i) {
      const auto [k, j, lo, hi] = messages[i];
      auto part = tensor.narrow(0, lo, hi - lo);
      if (rank_ == k) exchange.send(part, static_cast<int>(j), static_cast<int64_t>(i));
      if (rank_ == j) exchange.receive(part, static_cast<int>(k), static_cast<int64_t>(i));
    }
    exchange.wait();
  }

  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
  uint64_t tag_ = 0;  // point-to-point messages so far (their tags)
};

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allreduce_sum(torch::Tensor&) override {}
  void broadcast(torch::Tensor&, int) override {}
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor) override { return {tensor}; }
  void barrier() override {}
};

}  // namespace

double Communicator::allreduce_combine(torch::Tensor&, const Combine&) {
  throw InternalError("[comm] this communicator cannot combine tensors element by element");
}

Shares Shares::around(int64_t before, int64_t after) const {
  Shares out;
  for (size_t k = 0; k < bounds.size(); ++k) {
    out.bounds.push_back(k == 0 ? 0 : bounds[k] + before + (k + 1 == bounds.size() ? after : 0));
  }
  const int64_t end = bounds.back() + before;
  for (const auto& ranges : wanted) {
    auto& into = out.wanted.emplace_back();
    if (before > 0) into.emplace_back(0, before);
    for (const auto& [b, e] : ranges) into.emplace_back(b + before, e + before);
    if (after > 0) into.emplace_back(end, end + after);
  }
  return out;
}

void Shares::check(int ranks) const {
  VFLOW_ASSERT(static_cast<int>(bounds.size()) == ranks + 1 && bounds.front() == 0 &&
                   static_cast<int>(wanted.size()) == ranks &&
                   std::is_sorted(bounds.begin(), bounds.end()),
               "shares of another group, or out of order");
}

void Communicator::gather_shares(torch::Tensor& tensor, const Shares& shares) {
  shares.check(size());
  for (int r = 0; r < size(); ++r) {
    const int64_t begin = shares.bounds[r];
    auto part = tensor.narrow(0, begin, shares.bounds[r + 1] - begin);
    broadcast(part, r);
  }
}

std::unique_ptr<PendingWork> Communicator::start_allreduce_sum(torch::Tensor& tensor) {
  allreduce_sum(tensor);
  return std::make_unique<DoneWork>();
}

std::unique_ptr<Communicator> make_gloo_communicator(const Rendezvous& rendezvous) {
  auto gloo = std::make_unique<GlooCommunicator>(rendezvous);
  if (!rendezvous.shared_memory) return gloo;
  return over_host_memory(std::move(gloo), rendezvous.timeout);
}

std::unique_ptr<Communicator> make_local_communicator() {
  return std::make_unique<LocalCommunicator>();
}

}  // namespace vflow::comm
