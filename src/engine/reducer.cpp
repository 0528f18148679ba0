// The float reducers (the whole-packet allreduce and the bucketed one) and the factory.
#include "engine/reducer.h"

#include <torch/torch.h>

#include "engine/bucketed_reduction.h"
#include "engine/exact_reducer.h"
#include "engine/fused_update.h"
#include "vflow/comm/communicator.h"
#include "vflow/vnode/step_packet.h"

namespace vflow::engine {

std::optional<double> clip_gradients(vnode::StepPacket& packet, const ClipSpec& clip) {
  if (!clip.enabled()) return std::nullopt;
  // Every worker holds the same reduced gradient, so the clipped update is the same for
  // every worker count.
  auto gradients = packet.gradients();
  const double norm = gradients.norm().item<double>();
  if (clip.value > 0) gradients.clamp_(-clip.value, clip.value);
  if (clip.max_norm > 0) {
    // As PyTorch's clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is < 1.
    const double clipped = clip.value > 0 ? gradients.norm().item<double>() : norm;
    const double scale = clip.max_norm / (clipped + 1e-6);
    if (scale < 1) gradients.mul_(scale);
  }
  return norm;
}

std::optional<comm::Shares> packet_shares(const vnode::StepPacket& packet,
                                          const comm::Shares* gradients) {
  if (gradients == nullptr) return std::nullopt;
  return gradients->around(0, packet.numel() - gradients->bounds.back());
}

namespace {

/// One sum-allreduce of the whole packet after the last backward pass.
class AllreduceReducer : public Reducer {
 public:
  AllreduceReducer(vnode::StepPacket& packet, torch::optim::Optimizer& optimizer,
                   const ClipSpec& clip)
      : packet_(packet), optimizer_(optimizer), clip_(clip) {}

  void begin_step(comm::Communicator& comm, int64_t step, bool overlap) override {
    packet_.clear();
    comm_ = &comm;
  }

  void finish() override {
    if (shares_) return comm_->reduce_scatter_sum(packet_.flat(), *shares_);
    comm_->allreduce_sum(packet_.flat());
  }

  void scatter_sums(const comm::Shares* gradients) override {
    shares_ = packet_shares(packet_, gradients);
  }

  std::optional<double> update() override {
    const auto norm = clip_gradients(packet_, clip_);
    step_clipped();
    return norm;
  }
  void step_clipped() override { optimizer_.step(); }

  void abandon() override {
    packet_.clear();
    comm_ = nullptr;
  }

 protected:
  vnode::StepPacket& packet_;
  torch::optim::Optimizer& optimizer_;
  const ClipSpec clip_;
  comm::Communicator* comm_ = nullptr;  // the step's, from begin_step on
  std::optional<comm::Shares> shares_;  // scatter_sums'
};

/// The packet's sum in buckets that start during the last backward pass, as each
/// bucket's gradients become final (engine/bucketed_reduction.h); the whole-packet
/// allreduce where that cannot overlap (one worker, a backend whose sums block).
class BucketedReducer : public AllreduceReducer {
 public:
  BucketedReducer(vnode::StepPacket& packet, torch::optim::Optimizer& optimizer,
                  const ReducerOptions& options)
      : AllreduceReducer(packet, optimizer, options.clip),
        device_(options.device),
        buckets_(packet, options.bucket_bytes) {}

  void begin_step(comm::Communicator& comm, int64_t step, bool overlap) override {
    AllreduceReducer::begin_step(comm, step, overlap);
    // Every rank of the group decides alike: the collectives must match.
    bucketed_ = overlap && comm.size() > 1 && comm.asynchronous();
  }

  void arm() override {
    // On a GPU the buckets start after the backward pass (finish), not from its hooks.
    if (bucketed_ && device_.is_cpu()) buckets_.arm(*comm_);
  }

  void finish() override {
    if (!bucketed_) return AllreduceReducer::finish();
    bucketed_ = false;
    buckets_.finish(*comm_);
  }

  void abandon() override {
    if (bucketed_) buckets_.abandon(*comm_);
    bucketed_ = false;
    AllreduceReducer::abandon();
  }

 private:
  const c10::Device device_;
  BucketedReduction buckets_;
  bool bucketed_ = false;  // this step reduces in buckets
};

}  // namespace

std::unique_ptr<Reducer> make_reducer(vnode::StepPacket& packet, torch::optim::Optimizer& optimizer,
                                      const ReducerOptions& options) {
  if (options.exact) {
    // The fused optimizers read the exact sum where it lies (one pass less over the
    // buffer); not on a GPU, nor when clipping changes the gradient before the update.
    FixedPointStep* fused = nullptr;
    if (options.device.is_cpu() && !options.clip.enabled()) {
      fused = dynamic_cast<FixedPointStep*>(&optimizer);
    }
    return make_exact_reducer(packet, optimizer, fused, options);
  }
  if (options.bucket_bytes > 0) {
    return std::make_unique<BucketedReducer>(packet, optimizer, options);
  }
  return std::make_unique<AllreduceReducer>(packet, optimizer, options.clip);
}

}  // namespace vflow::engine
