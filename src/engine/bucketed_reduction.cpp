#include "engine/bucketed_reduction.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <mutex>

#include "vflow/comm/communicator.h"
#include "vflow/core/error.h"
#include "vflow/vnode/step_packet.h"

namespace vflow::engine {

struct BucketedReduction::State {
  std::mutex mutex;
  torch::Tensor flat;
  std::vector<torch::Tensor> parameters;
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of;     // per parameter
  std::vector<int64_t> size;         // per bucket: its parameters
  std::vector<int64_t> outstanding;  // per bucket: parameters not final yet this step
  // The gradient-accumulator nodes carrying the hooks: autograd holds them only weakly,
  // so they are kept here (and re-hooked if autograd ever makes a new one).
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  comm::Communicator* comm = nullptr;  // armed: hooks start buckets
  size_t next = 0;                     // the next bucket to start
  std::vector<std::unique_ptr<comm::PendingWork>> started;
  Prepare prepare;           // what a bucket sums, if not its range of `flat`
  std::exception_ptr error;  // a start that failed inside the backward pass

  void reset() {
    comm = nullptr;
    next = 0;
    outstanding = size;
    started.clear();
    error = nullptr;
  }

  void start(comm::Communicator& c) {
    const auto& b = buckets[next];
    auto part = prepare ? prepare(b) : flat.narrow(0, b.offset, b.numel);
    ++next;
    started.push_back(c.start_allreduce_sum(part));
  }

  /// Parameter i's gradient is final.
  void final(size_t i) {
    std::lock_guard<std::mutex> lock(mutex);
    if (comm == nullptr || error) return;
    --outstanding[bucket_of[i]];
    try {
      while (next < buckets.size() && outstanding[next] <= 0) start(*comm);
    } catch (...) {
      error = std::current_exception();  // not through autograd: finish() rethrows it
    }
  }
};

namespace {

/// Tells the reduction that one parameter's gradient has been accumulated.
class FinalHook final : public torch::autograd::FunctionPostHook {
 public:
  FinalHook(std::weak_ptr<BucketedReduction::State> state, size_t index)
      : state_(std::move(state)), index_(index) {}

  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    if (auto s = state_.lock()) s->final(index_);
    return outputs;
  }

 private:
  std::weak_ptr<BucketedReduction::State> state_;
  size_t index_;
};

}  // namespace

BucketedReduction::BucketedReduction(vnode::StepPacket& packet, int64_t bucket_bytes,
                                     Prepare prepare)
    : state_(std::make_shared<State>()) {
  auto& s = *state_;
  s.prepare = std::move(prepare);
  const auto& layout = packet.gradient_buffer().layout();
  s.flat = packet.flat();
  s.parameters = layout.parameters;
  const size_t n = s.parameters.size();
  VFLOW_ASSERT(n > 0, "a bucketed reduction needs parameters");
  const int64_t element = static_cast<int64_t>(s.flat.element_size());
  s.bucket_of.assign(n, 0);
  s.accumulators.assign(n, nullptr);
  // Bucket 0 ends at the packet's end: the part after the gradients rides in it.
  int64_t end = packet.numel();
  int64_t members = 0;
  for (size_t k = n; k-- > 0;) {
    s.bucket_of[k] = s.buckets.size();
    ++members;
    const int64_t begin = layout.offsets[k];
    const int64_t gradient_bytes = (std::min(end, layout.numel) - begin) * element;
    if (k == 0 && begin == end && !s.buckets.empty()) {
      // A first parameter of no elements joins the bucket before it: only one bucket, the
      // last, begins at offset 0 (deterministic mode's regions ride in it).
      for (size_t j = 0; j < static_cast<size_t>(members); ++j) {
        s.bucket_of[j] = s.buckets.size() - 1;  // it and any empty ones after it
      }
      s.size.back() += members;
      break;
    }
    if (k == 0 || gradient_bytes >= bucket_bytes) {
      s.buckets.push_back(Bucket{begin, end - begin});
      s.size.push_back(members);
      end = begin;
      members = 0;
    }
  }
  s.reset();
}

BucketedReduction::~BucketedReduction() = default;

const std::vector<BucketedReduction::Bucket>& BucketedReduction::buckets() const {
  return state_->buckets;
}

size_t BucketedReduction::started() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->next;
}

void BucketedReduction::arm(comm::Communicator& comm) {
  auto& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  VFLOW_ASSERT(s.next == 0 && s.started.empty(), "a bucketed reduction armed twice in a step");
  for (size_t i = 0; i < s.parameters.size(); ++i) {
    auto node = torch::autograd::impl::grad_accumulator(s.parameters[i]);
    if (node == s.accumulators[i]) continue;
    // A parameter without an accumulator node (not a leaf) has no hook: its bucket
    // starts after the backward pass.
    if (node) node->add_post_hook(std::make_unique<FinalHook>(state_, i));
    s.accumulators[i] = std::move(node);
  }
  s.comm = &comm;
}

void BucketedReduction::finish(comm::Communicator& comm) {
  auto& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  s.comm = nullptr;
  try {
    if (s.error) std::rethrow_exception(s.error);
    while (s.next < s.buckets.size()) s.start(comm);
    const auto deadline = std::chrono::steady_clock::now() + comm.timeout();
    for (auto& work : s.started) work->wait(deadline);
  } catch (const PeerFailure&) {
    comm.abort();
    s.reset();
    throw;
  } catch (...) {  // a bucket that could not be prepared: this rank's step ends here
    if (!s.started.empty()) comm.abort();
    s.reset();
    throw;
  }
  s.reset();
}

void BucketedReduction::abandon(comm::Communicator& comm) {
  auto& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.started.empty()) comm.abort();
  s.reset();
}

}  // namespace vflow::engine
