#include "engine/exact_reducer.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <exception>
#include <functional>
#include <vector>

#include "engine/background_task.h"
#include "engine/bucketed_reduction.h"
#include "engine/fused_update.h"
#include "vflow/comm/communicator.h"
#include "vflow/comm/split_sum.h"
#include "vflow/core/error.h"
#include "vflow/vnode/fixed_point.h"
#include "vflow/vnode/step_packet.h"

namespace vflow::engine {

namespace {

/// Each vnode's contributions (gradients, stateful-kernel rows, loss) become exact
/// integers: the previous vnode's when the next one begins (absorb), the last one's on
/// their way into the reduction. Integer addition is associative, so the total is bitwise
/// the same however vnodes are spread over workers and in whatever order the collective
/// adds the workers' parts.
class ExactReducer : public Reducer {
 public:
  ExactReducer(vnode::StepPacket& packet, torch::optim::Optimizer& optimizer, FixedPointStep* fused,
               const ReducerOptions& options)
      : packet_(packet),
        optimizer_(optimizer),
        fused_(fused),
        clip_(options.clip),
        device_(options.device),
        virtual_nodes_(options.virtual_nodes),
        sum_(packet.numel(), options.device),
        split_(packet.numel(), options.device, options.table_numel) {
    if (options.second_thread && options.device.is_cpu()) {
      second_thread_ = std::make_unique<BackgroundTask<bool>>();
      sum_.share_passes([task = second_thread_.get()](const std::function<void()>& theirs,
                                                      const std::function<void()>& mine) {
        task->submit([&theirs] {
          theirs();
          return true;
        });
        std::exception_ptr error;
        try {
          mine();
        } catch (...) {  // rethrown once the other half is done with the buffer
          error = std::current_exception();
        }
        task->wait();
        if (error) std::rethrow_exception(error);
      });
    }
    if (options.bucket_bytes > 0) {
      buckets_ = std::make_unique<BucketedReduction>(
          packet, options.bucket_bytes,
          [this](const BucketedReduction::Bucket& b) { return prepare_bucket(b); });
    }
  }

  void begin_step(comm::Communicator& comm, int64_t step, bool overlap) override {
    packet_.clear();
    sum_.clear();
    comm_ = &comm;
    step_ = step;
    // Every rank of the group decides alike: the collectives must match.
    bucketed_ = overlap && buckets_ && comm.size() > 1 && comm.asynchronous();
    if (bucketed_) {
      bucket_dense_ = split_.dense(comm.size());
      bucket_index_.clear();
      bucket_value_.clear();
    }
  }

  void absorb() override { check_range(sum_.absorb(packet_.flat())); }

  void arm() override {
    // On a GPU the buckets start after the backward pass (finish), not from its hooks.
    if (bucketed_ && device_.is_cpu()) buckets_->arm(*comm_);
  }

  /// The packet as exact fixed-point integers, 32 bits an element on the wire.
  void finish() override {
    auto& comm = *comm_;  // the buckets not started yet start in finish and prepare on it
    auto& flat = packet_.flat();
    if (bucketed_) {
      bucketed_ = false;
      buckets_->finish(comm);
      const auto listed = split_.merge(comm);
      sum_.clear();
      take_sums(bucket_dense_, listed);
      return;
    }
    const int world = comm.size();
    if (world == 1) {
      if (fused_ != nullptr && sum_.empty()) {
        // This worker's only vnode: every value's range is checked now, the gradients are
        // rounded by the update as it reads them, the rest of the packet here.
        check_range(sum_.round_in_place_from(flat, packet_.gradients().numel()));
        rounding_ = true;
        return;
      }
      check_range(sum_.round_in_place(flat));
      return;
    }
    if (comm.can_combine() && virtual_nodes_ == world) {
      // One vnode a worker, on one host: the exact sum is formed inside the reduction,
      // each element converted once, and every rank checks the range of all the parts.
      VFLOW_ASSERT(sum_.empty(), "a worker of one vnode absorbed none before the reduction");
      check_range(
          shares_ ? comm.reduce_scatter_combine(flat, vnode::FixedPointSum::sum_rounded, *shares_)
                  : comm.allreduce_combine(flat, vnode::FixedPointSum::sum_rounded));
      sum_.clear();
      return;
    }
    auto dense = split_.dense(world);
    torch::Tensor index, value;
    check_range(sum_.split(flat, comm::SplitSum::dense_limit(world), dense, index, value));
    take_sums(dense, split_.reduce(comm, index, value, shares_ ? &*shares_ : nullptr));
  }

  std::optional<double> update() override {
    const auto norm = clip_gradients(packet_.gradients(), clip_, virtual_nodes_);
    step_clipped();
    return norm;
  }

  void step_clipped() override {
    if (reduced_) {
      fused_->step_fixed_point(*reduced_);
      reduced_.reset();
    } else if (rounding_) {
      fused_->step_rounding();
      rounding_ = false;
    } else {
      optimizer_.step();
    }
  }

  void scatter_sums(const comm::Shares* gradients) override {
    shares_ = packet_shares(packet_, gradients);
  }

  void abandon() override {
    if (bucketed_) buckets_->abandon(*comm_);
    bucketed_ = false;
    comm_ = nullptr;
    packet_.clear();
    sum_.clear();
    reduced_.reset();
    rounding_ = false;
  }

 private:
  /// What bucket `b` sums: its range of the packet as exact integers (split while the rest
  /// of the backward pass runs). The bucket at offset 0 starts last and carries every
  /// bucket's listed values.
  torch::Tensor prepare_bucket(const BucketedReduction::Bucket& b) {
    torch::Tensor index, value;
    check_range(sum_.split_part(packet_.flat(), comm::SplitSum::dense_limit(comm_->size()),
                                bucket_dense_, index, value, b.offset, b.numel));
    bucket_index_.push_back(std::move(index));
    bucket_value_.push_back(std::move(value));
    if (b.offset == 0) {
      split_.list(comm_->rank(), torch::cat(bucket_index_), torch::cat(bucket_value_));
    }
    return split_.carrier_part(b.offset, b.numel);
  }

  /// The packet from the summed parts. A fused update reads the gradients' sums where they
  /// lie (bitwise the same step, one pass less); the rest of the packet is assembled as
  /// floats.
  void take_sums(const torch::Tensor& dense, const comm::SplitSum::Listed& listed) {
    auto& flat = packet_.flat();
    if (fused_ != nullptr) {
      const int64_t gradients = packet_.gradients().numel();
      vnode::FixedPointSum::assemble(dense, listed.index, listed.value, flat, gradients);
      reduced_ = vnode::FixedPointSum::reduced(dense, listed.index, listed.value, gradients);
      return;
    }
    vnode::FixedPointSum::assemble(dense, listed.index, listed.value, flat);
  }

  /// `largest`, the largest magnitude of a vnode's contributions (NaN if one is NaN), must
  /// be in the exact sum's range.
  void check_range(double largest) const {
    if (!(largest < vnode::FixedPointSum::kLimit)) {
      throw Error(fmt::format(
          "step {}: a gradient value of {} is outside the deterministic reduction's range "
          "(|g| < {}); the run diverged or needs deterministic: false",
          step_, largest, vnode::FixedPointSum::kLimit));
    }
  }

  vnode::StepPacket& packet_;
  torch::optim::Optimizer& optimizer_;
  FixedPointStep* const fused_;
  const ClipSpec clip_;
  const c10::Device device_;
  const int64_t virtual_nodes_;
  vnode::FixedPointSum sum_;  // this worker's vnodes so far this step
  comm::SplitSum split_;      // the sum's reduction across workers
  // The thread that runs half of each of the sum's passes (options.second_thread).
  std::unique_ptr<BackgroundTask<bool>> second_thread_;
  std::unique_ptr<BucketedReduction> buckets_;  // options.bucket_bytes > 0
  comm::Communicator* comm_ = nullptr;          // the step's, from begin_step on
  int64_t step_ = 0;
  bool bucketed_ = false;  // this step reduces in buckets
  // In buckets: the dense part the buckets fill, and the large values each listed so far.
  torch::Tensor bucket_dense_;
  std::vector<torch::Tensor> bucket_index_, bucket_value_;
  /// The summed gradient for this step's fused update, read where it lies.
  std::optional<vnode::FixedPointSum::Reduced> reduced_;
  /// Where the sums are needed (scatter_sums), as shares of the packet.
  std::optional<comm::Shares> shares_;
  /// Or: this step's fused update rounds one worker's only vnode's gradients as it reads them.
  bool rounding_ = false;
};

}  // namespace

std::unique_ptr<Reducer> make_exact_reducer(vnode::StepPacket& packet,
                                            torch::optim::Optimizer& optimizer,
                                            FixedPointStep* fused, const ReducerOptions& options) {
  return std::make_unique<ExactReducer>(packet, optimizer, fused, options);
}

}  // namespace vflow::engine
