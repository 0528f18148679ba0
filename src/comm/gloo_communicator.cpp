#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <torch/torch.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

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

  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
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
