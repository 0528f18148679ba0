#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "vflow/comm/communicator.h"

namespace vflow::comm {

namespace {

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

class GlooCommunicator final : public Communicator {
 public:
  explicit GlooCommunicator(const Rendezvous& r) : rank_(r.rank), size_(r.world_size) {
    try {
      c10d::TCPStoreOptions options;
      options.port = static_cast<std::uint16_t>(r.store_port);
      options.isServer = r.host_store;
      options.waitWorkers = false;
      options.timeout = r.timeout;
      store_ = c10::make_intrusive<c10d::TCPStore>(r.store_host, options);
      auto prefixed = c10::make_intrusive<c10d::PrefixStore>("gen/" + r.generation, store_);
      auto gloo = c10d::ProcessGroupGloo::Options::create(r.timeout);
      gloo->devices.push_back(is_loopback(r.store_host)
                                  ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                  : c10d::ProcessGroupGloo::createDefaultDevice());
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

  void allreduce_sum(torch::Tensor& tensor) override {
    std::vector<torch::Tensor> tensors{tensor};
    run("allreduce", [&] { return group_->allreduce(tensors); });
  }

  void broadcast(torch::Tensor& tensor, int root) override {
    std::vector<torch::Tensor> tensors{tensor};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    run("broadcast", [&] { return group_->broadcast(tensors, options); });
  }

  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor) override {
    std::vector<std::vector<torch::Tensor>> outputs(1);
    for (int i = 0; i < size_; ++i) outputs[0].push_back(torch::empty_like(tensor));
    std::vector<torch::Tensor> inputs{tensor};
    run("all_gather", [&] { return group_->allgather(outputs, inputs); });
    return outputs[0];
  }

  void barrier() override {
    run("barrier", [&] { return group_->barrier(); });
  }

 private:
  static std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

  template <typename Start>
  void run(const char* what, Start start) {
    try {
      auto work = start();
      work->wait();
    } catch (const std::exception& e) {
      throw PeerFailure(fmt::format("[comm] {} failed on rank {} of {}: {}", what, rank_, size_,
                                    first_line(e.what())));
    }
  }

  int rank_;
  int size_;
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

std::unique_ptr<Communicator> make_gloo_communicator(const Rendezvous& rendezvous) {
  return std::make_unique<GlooCommunicator>(rendezvous);
}

std::unique_ptr<Communicator> make_local_communicator() {
  return std::make_unique<LocalCommunicator>();
}

}  // namespace vflow::comm
