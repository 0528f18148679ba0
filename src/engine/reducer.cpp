// The float reducers (the whole-packet allreduce and the bucketed one) and the factory.
#include "engine/reducer.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <cmath>
#include <numeric>

#include "engine/bucketed_reduction.h"
#include "engine/exact_reducer.h"
#include "engine/fused_update.h"
#include "engine/update_kernels.h"
#include "vflow/comm/communicator.h"
#include "vflow/vnode/shards.h"
#include "vflow/vnode/step_packet.h"

namespace vflow::engine {

namespace {

/// out[s] = shard s's sum of squares of `gradients`, for each shard s of `which`.
void square_sums_of(const torch::Tensor& gradients, const vnode::ShardLayout& layout,
                    const std::vector<int64_t>& which, double* out) {
  if (gradients.is_cpu() && gradients.scalar_type() == torch::kFloat && gradients.is_contiguous()) {
    // The shards are summed side by side, each in its own order: the same on any threads.
    const float* g = gradients.data_ptr<float>();
    at::parallel_for(0, static_cast<int64_t>(which.size()), 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const auto range = layout.shard(which[static_cast<size_t>(i)]);
        out[which[static_cast<size_t>(i)]] = square_sum(g + range.begin, range.numel());
      }
    });
    return;
  }
  for (const int64_t s : which) {
    const auto range = layout.shard(s);
    out[s] = gradients.narrow(0, range.begin, range.numel())
                 .to(torch::kFloat64)
                 .square()
                 .sum()
                 .item<double>();
  }
}

}  // namespace

std::optional<double> clip_gradients(const torch::Tensor& gradients, const ClipSpec& clip,
                                     int64_t shards, const ClipShards* sharded) {
  if (!clip.enabled()) return std::nullopt;
  const vnode::ShardLayout layout(gradients.numel(), shards);
  std::vector<int64_t> every(static_cast<size_t>(shards));
  std::iota(every.begin(), every.end(), 0);
  const auto& held = sharded != nullptr ? sharded->held : every;
  const auto& given = sharded != nullptr ? sharded->given : every;
  const auto each_held = [&](const std::function<void(torch::Tensor)>& f) {
    if (sharded == nullptr) return f(gradients);
    for (const int64_t s : held) {
      const auto range = layout.shard(s);
      f(gradients.narrow(0, range.begin, range.numel()));
    }
  };
  // The sums before clipping (the norm returned) and, where the scale needs them, after
  // the clamp.
  const bool both = clip.value > 0 && clip.max_norm > 0;
  auto sums = torch::zeros({(both ? 2 : 1) * shards}, torch::kFloat64);
  square_sums_of(gradients, layout, given, sums.data_ptr<double>());
  if (clip.value > 0) each_held([&](torch::Tensor g) { g.clamp_(-clip.value, clip.value); });
  if (both) square_sums_of(gradients, layout, given, sums.data_ptr<double>() + shards);
  if (sharded != nullptr) sharded->sum_over_group(sums);
  const double* s = sums.data_ptr<double>();
  const auto norm_of = [&](const double* x) {
    double total = 0;
    for (int64_t i = 0; i < shards; ++i) total += x[i];  // in shard order
    return std::sqrt(total);
  };
  const double norm = norm_of(s);
  if (clip.max_norm > 0) {
    // As PyTorch's clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is < 1.
    const double scale = clip.max_norm / ((both ? norm_of(s + shards) : norm) + 1e-6);
    if (scale < 1) each_held([&](torch::Tensor g) { g.mul_(scale); });
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
                   const ReducerOptions& options)
      : packet_(packet),
        optimizer_(optimizer),
        clip_(options.clip),
        virtual_nodes_(options.virtual_nodes) {}

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
    const auto norm = clip_gradients(packet_.gradients(), clip_, virtual_nodes_);
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
  const int64_t virtual_nodes_;         // the clip's canonical shards
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
      : AllreduceReducer(packet, optimizer, options),
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
  return std::make_unique<AllreduceReducer>(packet, optimizer, options);
}

}  // namespace vflow::engine
