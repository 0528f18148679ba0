#include "engine/sharded_reducer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include "engine/fused_update.h"
#include "engine/verification.h"
#include "vflow/comm/communicator.h"
#include "vflow/core/error.h"
#include "vflow/vnode/shards.h"
#include "vflow/vnode/step_packet.h"

namespace vflow::engine {

namespace {

/// What each rank tells the others before shards move: [its optimizer's step count, its
/// parameters are incomplete (1/0), it kept a step whose commit failed (1; 2 where it has
/// taken a transferred state of a step ahead since, 0 where it kept none), the training
/// step it begins (-1 outside begin_step), then 1/0 per shard it holds or kept that step's
/// reduced gradients of].
constexpr int64_t kHeader = 4;

class ShardedReducer : public Reducer {
 public:
  ShardedReducer(std::unique_ptr<Reducer> inner, ShardedState& state, int64_t replicas,
                 vnode::StepPacket& packet, const ClipSpec& clip)
      : inner_(std::move(inner)), state_(state), replicas_(replicas), packet_(packet), clip_(clip) {
    if (const auto fault = injected_fault()) {
      if (fault->dies_in_gather) dies_at_ = fault->step;
      if (fault->late_to_commit) late_at_ = fault->step;
    }
    // LAMB's and LARS's per-shard norms, summed inside the update over the step's group
    // (set by begin_step): through shared memory where the workers share a host. The
    // step's commit follows, the update after it. A step taken late (catch_up) uses the
    // sums its commit had.
    state_.set_exchange([this](torch::Tensor& figures) {
      if (pending_ && pending_->taking) {
        figures.copy_(pending_->figures);
        return;
      }
      if (comm_->size() == 1) return;
      sum_over_group(figures);
      commit(figures);
    });
  }

  void begin_step(comm::Communicator& comm, int64_t step, bool overlap) override {
    comm_ = &comm;
    step_ = step;
    if (params_incomplete_ || moved_ || pending_) {
      // Before the step's sums: the shards go where the group's layout wants them.
      beginning_ = step;
      redistribute(comm);
      beginning_ = -1;
      moved_ = false;
      set_shares(comm);
    }
    if (!logged_) {
      const auto& shards = state_.layout();
      const auto owned = shards.of_vnodes(layout_[static_cast<size_t>(rank_)]);
      spdlog::info(
          "[shards] worker {} of {} owns shards {} ({} parameters) and keeps the optimizer "
          "state of shards {}: {:.3g} MB ({} of {} shards of at most {} elements)",
          rank_, layout_.size(), vnode::shard_list(owned_shards()), owned.numel(),
          vnode::shard_list(state_.kept()), static_cast<double>(kept_bytes()) / 1e6,
          state_.kept().size(), shards.shards(), shards.largest());
      logged_ = true;
    }
    inner_->begin_step(comm, step, overlap);
  }
  void absorb() override { inner_->absorb(); }
  void arm() override { inner_->arm(); }
  void finish() override { inner_->finish(); }

  std::optional<double> update() override {
    // The kept shards' parameters and state are updated (the owner's and the second
    // home's bitwise alike: the same reduced gradient and state); the owners' parameters
    // are then gathered by every rank.
    // The sum reached this worker only in the shards it keeps (set_shares): it holds no
    // other (shards moved to it are trimmed before the step).
    const auto held = state_.held();
    VFLOW_ASSERT(
        std::includes(state_.kept().begin(), state_.kept().end(), held.begin(), held.end()),
        "a sharded update of shards this worker does not keep");
    // semantic.clip on the shards kept (those the update steps), from every shard's sums
    // (each owner's), before the commit: a step kept after a failed commit is clipped
    // already.
    std::optional<double> norm;
    if (clip_.enabled()) {
      const ClipShards mine{state_.kept(), owned_shards(),
                            [this](torch::Tensor& sums) { sum_over_group(sums); }};
      norm = clip_gradients(packet_.gradients(), clip_, state_.layout().shards(), &mine);
    }
    if (!state_.exchanges()) commit(torch::Tensor());
    inner_->step_clipped();
    if (step_ == dies_at_) raise(SIGKILL);  // VFLOW_INJECT_FAULT=STEP:MEMBER:gather
    try {
      gather_parameters(*comm_);
    } catch (const PeerFailure& e) {
      // The step is taken on this worker (its shards are updated and cannot be undone):
      // the parameters of the others' shards are gathered again from their holders when
      // the group regroups, which the failed peer forces at the next collective.
      spdlog::warn("[shards] the parameters' gather failed: {}", e.what());
      params_incomplete_ = true;
    }
    return norm;
  }

  void abandon() override {
    // A step whose commit failed keeps its sums until the next group shows whether it
    // was taken (catch_up).
    if (!pending_) inner_->abandon();
  }

  void set_layout(const std::vector<vnode::VnodeRange>& layout, int rank) override {
    layout_ = layout;
    rank_ = rank;
    state_.set_kept(vnode::ShardLayout::kept_by(layout_, rank_, replicas_));
    state_.set_owned(owned_shards());
    moved_ = true;
    logged_ = false;
    beginning_ = -1;  // where a failure left it set
  }

  void hand_off(comm::Communicator& comm, const std::vector<int>& next_rank,
                const std::vector<vnode::VnodeRange>& next_layout) override {
    // What the next group keeps, by this group's ranks; a shard that only new members
    // will keep goes to the first member that stays, which passes it on.
    const int ranks = comm.size();
    std::vector<std::vector<int64_t>> kept(static_cast<size_t>(ranks));
    int first_stayer = -1;
    for (int r = 0; r < ranks; ++r) {
      if (next_rank[r] < 0) continue;
      if (first_stayer < 0) first_stayer = r;
      kept[r] = vnode::ShardLayout::kept_by(next_layout, next_rank[r], replicas_);
    }
    if (first_stayer < 0) return;  // nobody stays: the job ends
    const auto keeps = [&](int r, int64_t s) {
      return std::binary_search(kept[r].begin(), kept[r].end(), s);
    };
    move_shards(comm, [&](int r, int64_t s) {
      if (keeps(r, s)) return true;
      if (r != first_stayer) return false;
      for (int q = 0; q < ranks; ++q) {
        if (keeps(q, s)) return false;
      }
      return true;
    });
  }

  int64_t write_state_shards(comm::Communicator& comm, const ShardWriter& write) override {
    settle(comm);
    const auto info = holdings(comm);
    if (info.steps == 0) return 0;  // no shard has state yet
    const auto& shards = state_.layout();
    std::vector<int64_t> lost;
    for (int64_t s = 0; s < shards.shards(); ++s) {
      const int source = info.first_holder(s);
      if (source < 0) {
        lost.push_back(s);
        continue;
      }
      // From the first holder to rank 0 (a broadcast: what the group offers), one shard
      // at a time; nothing moves where rank 0 holds it.
      if (source == 0) {
        if (comm.rank() == 0) write(s, info.steps, state_.shard(s));
        continue;
      }
      const auto packed = shard_from(comm, s, source);
      if (comm.rank() == 0) write(s, info.steps, packed);
    }
    if (!lost.empty()) {
      throw Error(
          fmt::format("the optimizer state of shard(s) {} is held by no worker, so no "
                      "checkpoint can hold it",
                      vnode::shard_list(lost)));
    }
    return info.steps;
  }

  void settle(comm::Communicator& comm) override {
    // Every rank learns whether any rank's parameters are incomplete (the same answer on
    // all); if so the shards' holders send them (move_shards), and the kept shards stay.
    if (holdings(comm).incomplete) redistribute(comm);
  }

  bool parameters_complete() const override { return !params_incomplete_; }
  bool transfers_optimizer() const override { return false; }
  void state_transferred(bool moved) override {
    // Of the step before the donor's, unless this worker can take that step (catch_up).
    if (moved && !pending_) state_.drop_all();
    if (moved && pending_) pending_->moved = true;
    moved_ = true;
  }
  void step_clipped() override {
    VFLOW_ASSERT(false, "a sharded reducer takes a step late itself (catch_up)");
  }

 private:
  /// Bytes of the optimizer state of the shards this worker keeps.
  int64_t kept_bytes() {
    int64_t elements = 0;
    for (const int64_t s : state_.kept()) elements += state_.layout().shard(s).numel();
    return elements * state_.state_tensors() * state_.flat_parameters().element_size();
  }

  std::vector<int64_t> owned_shards() const {
    std::vector<int64_t> out;
    const auto& r = layout_[static_cast<size_t>(rank_)];
    for (int64_t s = r.first; s < r.last; ++s) out.push_back(s);
    return out;
  }

  /// The step's shares (after the shards moved): each rank owns its vnodes' shards; it
  /// needs the reduced gradients of the shards it keeps (the inner reducer's sum leaves the
  /// rest unspecified where scatter_), and the parameters of the others from their owners.
  /// So a worker receives the sum of its own shards, the sums of those it keeps for its
  /// ring neighbour, and the parameters of the rest: what one allreduce brings it.
  void set_shares(comm::Communicator& comm) {
    const auto& shards = state_.layout();
    comm::Shares gradients;
    for (int r = 0; r < comm.size(); ++r) {
      gradients.bounds.push_back(shards.of_vnodes(layout_[static_cast<size_t>(r)]).begin);
    }
    gradients.bounds.push_back(shards.numel());
    parameters_ = gradients;
    for (int r = 0; r < comm.size(); ++r) {
      const auto kept = vnode::ShardLayout::kept_by(layout_, r, replicas_);
      auto& sums = gradients.wanted.emplace_back();
      auto& values = parameters_.wanted.emplace_back();
      for (int64_t s = 0; s < shards.shards(); ++s) {
        const auto range = shards.shard(s);
        auto& into = std::binary_search(kept.begin(), kept.end(), s) ? sums : values;
        if (!into.empty() && into.back().second == range.begin) {
          into.back().second = range.end;
        } else {
          into.emplace_back(range.begin, range.end);
        }
      }
    }
    inner_->scatter_sums(comm.size() > 1 ? &gradients : nullptr);
  }

  /// Every rank's parameters become the owners' values of each rank's owned shards,
  /// copied only into the shards it does not keep (a rank whose gather fails thus still has
  /// every held shard's values, from which the next group's first step sends them): on one
  /// host through shared memory, elsewhere by one broadcast from each owner, in place
  /// (Gloo's all-gather would copy every part twice through buffers of its own, which a
  /// worker's peak memory then includes).
  void gather_parameters(comm::Communicator& comm) {
    if (comm.size() == 1) return;
    auto flat = state_.flat_parameters();
    comm.gather_shares(flat, parameters_);
  }

  /// Moves shards so that every rank holds the shards it keeps; then drops those it does
  /// not keep.
  void redistribute(comm::Communicator& comm) {
    std::vector<std::vector<int64_t>> kept;
    for (int r = 0; r < comm.size(); ++r) {
      kept.push_back(vnode::ShardLayout::kept_by(layout_, r, replicas_));
    }
    move_shards(comm, [&](int r, int64_t s) {
      return std::binary_search(kept[r].begin(), kept[r].end(), s);
    });
    state_.trim();
  }

  /// Every rank holds shard s where wants(rank, s), each sent by the first rank that holds
  /// it; where a rank's parameters are incomplete, every shard's parameters are sent from
  /// a holder too. Throws Error naming the shards no rank holds.
  void move_shards(comm::Communicator& comm, const std::function<bool(int, int64_t)>& wants) {
    const auto& shards = state_.layout();
    const int64_t n = shards.shards();
    const int ranks = comm.size();
    const auto every = holdings(comm);
    const int64_t steps = every.steps;
    const bool incomplete = every.incomplete;
    const int me = comm.rank();
    auto flat = state_.flat_parameters();
    if (steps == 0) {
      // No step was taken: every shard's state is zero, made by the first update where it
      // is kept.
      state_.drop_all();
      params_incomplete_ = false;
      return;
    }
    std::vector<int64_t> lost;
    int64_t moved = 0;
    for (int64_t s = 0; s < n; ++s) {
      const int source = every.first_holder(s);
      if (source < 0) {
        lost.push_back(s);
        continue;
      }
      bool needed = false;
      for (int r = 0; r < ranks; ++r) needed = needed || (wants(r, s) && !every.holds(r, s));
      if (needed) {
        const auto packed = shard_from(comm, s, source);
        if (wants(me, s) && !every.holds(me, s)) state_.set_shard(s, packed);
        ++moved;
      }
      if (incomplete) {
        auto range = flat.narrow(0, shards.shard(s).begin, shards.shard(s).numel());
        comm.broadcast(range, source);
      }
    }
    if (!lost.empty()) {
      throw Error(fmt::format(
          "the optimizer state of shard(s) {} is held by no remaining worker (each shard is "
          "kept by resources.shard_replicas = {} worker(s) in ring order, and all of them "
          "failed, or were behind the others' step): resume from the last checkpoint",
          vnode::shard_list(lost), replicas_));
    }
    state_.set_steps(steps);
    params_incomplete_ = false;
    if (moved > 0 && me == 0) {
      spdlog::info("[shards] {} shard(s) of optimizer state moved to their new workers", moved);
    }
  }

  /// What every rank holds (a collective): the first rank's view of each is the same.
  struct Holdings {
    std::vector<std::vector<int64_t>> ranks;  // per rank: kHeader values, then 1/0 per shard
    int64_t steps = 0;                        // the largest optimizer step count
    bool incomplete = false;                  // some rank's parameters are incomplete
    bool holds(int r, int64_t s) const { return ranks[static_cast<size_t>(r)][kHeader + s] != 0; }
    /// The first rank that holds shard s, -1 for none.
    int first_holder(int64_t s) const {
      for (size_t r = 0; r < ranks.size(); ++r) {
        if (holds(static_cast<int>(r), s)) return static_cast<int>(r);
      }
      return -1;
    }
  };
  Holdings holdings(comm::Communicator& comm) {
    // A checkpoint's shards, loaded before the group was known, are read now: this
    // worker's kept ones, by the group's layout.
    state_.read_pending();
    auto mine = torch::zeros({kHeader + state_.layout().shards()}, torch::kInt64);
    auto* m = mine.data_ptr<int64_t>();
    m[0] = state_.steps();
    m[1] = params_incomplete_ ? 1 : 0;
    m[2] = !pending_ ? 0 : pending_->moved ? 2 : 1;
    m[3] = beginning_;
    for (const int64_t s : state_.held()) m[kHeader + s] = 1;
    if (pending_) {
      for (const int64_t s : pending_->shards) m[kHeader + s] = 1;
    }
    Holdings out;
    for (const auto& t : comm.all_gather(mine.to(comm_device()))) {
      const auto host = t.to(torch::kCPU).contiguous();
      out.ranks.emplace_back(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
      out.steps = std::max(out.steps, out.ranks.back()[0]);
      out.incomplete = out.incomplete || out.ranks.back()[1] != 0;
    }
    catch_up(out, comm.rank());
    return out;
  }

  /// The step's commit, after its sums (and LAMB's exchange) and before the update: every
  /// rank gives one word and takes every other's, which it has only once every rank has
  /// reached the commit (one barrier through shared memory, a message from each rank over
  /// Gloo). So where a rank passes it and takes the step, every other rank has its step's
  /// reduced gradients even if its commit fails: it keeps them (pending_, with the
  /// learning rate and LAMB's sums, `figures`) and takes the step in the next group
  /// (catch_up) instead of losing the shards that only it kept.
  void commit(const torch::Tensor& figures) {
    if (comm_->size() == 1) return;
    if (step_ == late_at_) {  // VFLOW_INJECT_FAULT=STEP:MEMBER:late, once
      late_at_ = -1;
      std::this_thread::sleep_for(comm_->timeout() + std::chrono::seconds(2));
    }
    comm::Shares words;
    for (int r = 0; r <= comm_->size(); ++r) words.bounds.push_back(r);
    words.wanted.assign(static_cast<size_t>(comm_->size()), {{0, comm_->size()}});
    auto word =
        torch::zeros({comm_->size()}, torch::TensorOptions(torch::kInt64).device(comm_device()));
    try {
      comm_->gather_shares(word, words);
    } catch (const comm::PeerFailure& e) {
      pending_ = Pending{state_.lr(), state_.kept(), figures.defined() ? figures.clone() : figures};
      spdlog::warn(
          "[shards] step {}'s commit failed; its reduced gradients of shards {} are kept "
          "for the next group, should another worker have taken the step: {}",
          step_, vnode::shard_list(pending_->shards), e.what());
      throw;
    }
  }

  /// After a failed commit (pending_), from what every rank told (`every`, this worker rank
  /// `me`): where a rank took the step (its optimizer is a step ahead), each rank that kept
  /// that step's reduced gradients takes it on those of its shards that no rank ahead
  /// holds, bitwise as their other home took it, and drops the rest; ranks behind
  /// without them hold nothing. Where no rank took it, the step is redone: the kept sums
  /// go. `every` then says what each rank holds, at the step of the ranks ahead.
  void catch_up(Holdings& every, int me) {
    const int64_t ahead = every.steps;
    const int64_t n = state_.layout().shards();
    check_in_step(every, ahead);
    std::vector<char> ahead_holds(static_cast<size_t>(n), 0);
    for (int r = 0; r < static_cast<int>(every.ranks.size()); ++r) {
      for (int64_t s = 0; s < n && every.ranks[static_cast<size_t>(r)][0] == ahead; ++s) {
        if (every.holds(r, s)) ahead_holds[static_cast<size_t>(s)] = 1;
      }
    }
    for (size_t r = 0; r < every.ranks.size(); ++r) {
      auto& row = every.ranks[r];
      if (row[0] == ahead) continue;
      const bool takes = row[2] != 0 && row[0] == ahead - 1;
      for (int64_t s = 0; s < n; ++s) {
        if (!takes || ahead_holds[static_cast<size_t>(s)] != 0) row[kHeader + s] = 0;
      }
      if (takes) {
        row[0] = ahead;
        every.incomplete = true;  // the ranks ahead lack the parameters it updates
      }
      if (static_cast<int>(r) != me) continue;
      if (takes) {
        take_pending_step(ahead_holds, ahead);
      } else {
        state_.drop_all();
      }
    }
    if (pending_) {  // nobody took the step: it is redone
      inner_->abandon();
      pending_.reset();
    }
  }

  /// The step whose commit failed, on the shards this worker kept then that no rank ahead
  /// holds (ahead_holds), from the sums the inner reducer kept; the others go.
  void take_pending_step(const std::vector<char>& ahead_holds, int64_t ahead) {
    auto& pending = *pending_;
    const auto kept = state_.kept();
    if (state_.steps() == 0) {  // its first step: the state is made now, where it was kept
      state_.set_kept(pending.shards);
      state_.start_fresh();
    }
    std::vector<int64_t> taking;
    for (const int64_t s : pending.shards) {
      if (ahead_holds[static_cast<size_t>(s)] == 0) taking.push_back(s);
    }
    state_.set_kept(taking);
    state_.trim();
    if (!taking.empty()) {
      const double lr = state_.lr();
      state_.set_lr(pending.lr);
      state_.set_owned({});  // LAMB's and LARS's sums are the commit's
      pending.taking = true;
      const auto restore = [&] {
        state_.set_lr(lr);
        state_.set_owned(owned_shards());
        state_.set_kept(kept);
        pending.taking = false;
      };
      try {
        // The commit came after the clip (and inside LAMB's and LARS's update, after
        // their exchanged sums, `figures`): what is left is the optimizer step.
        inner_->step_clipped();
      } catch (...) {
        restore();
        throw;
      }
      restore();
      spdlog::info(
          "[shards] step {} was taken by another worker: this worker takes it on shards {} "
          "from the reduced gradients it kept",
          ahead - 1, vnode::shard_list(taking));
    }
    state_.set_kept(kept);
    state_.set_steps(ahead);
    inner_->abandon();
    pending_.reset();
    params_incomplete_ = true;
  }

  /// Stops the job (on every rank alike: `every` is the same on all) where the group is not
  /// at one training step, or where a rank that kept a step's sums has taken the state of
  /// a step ahead from a rank no longer here: that rank's update reached parameters that
  /// the kept sums cannot bring their state to, so the step can be neither taken nor redone.
  void check_in_step(const Holdings& every, int64_t ahead) const {
    std::vector<int64_t> steps;
    for (const auto& row : every.ranks) {
      if (row[3] >= 0) steps.push_back(row[3]);
      if (row[2] == 2 && row[0] == ahead) {
        throw Error(
            "the optimizer state of the shards kept by the worker that took the last step is "
            "lost: it left after sending its state and before its shards went out, and the "
            "others' state is a step behind its parameters; resume from the last checkpoint");
      }
    }
    if (std::adjacent_find(steps.begin(), steps.end(), std::not_equal_to<>()) != steps.end()) {
      throw Error(fmt::format(
          "the workers of this group begin different training steps ({}), which a sharded "
          "optimizer state cannot follow; resume from the last checkpoint",
          fmt::join(steps, ", ")));
    }
  }

  /// Shard s's state on every rank, broadcast from rank `source`, which holds it.
  torch::Tensor shard_from(comm::Communicator& comm, int64_t s, int source) {
    auto packed = comm.rank() == source
                      ? state_.shard(s)
                      : torch::empty({state_.state_tensors(), state_.layout().shard(s).numel()},
                                     state_.flat_parameters().options());
    comm.broadcast(packed, source);
    return packed;
  }

  /// `values` summed over the step's group (per-shard figures: each rank gives those of the
  /// shards it owns, zeros elsewhere, so the sum is exactly the owner's).
  void sum_over_group(torch::Tensor& values) {
    if (comm_->size() == 1) return;
    auto on_device = values.to(comm_device());
    comm_->allreduce_sum(on_device);
    if (!on_device.is_same(values)) values.copy_(on_device);
  }

  /// Where the group's collectives take their tensors: the worker's device.
  c10::Device comm_device() { return state_.flat_parameters().device(); }

  std::unique_ptr<Reducer> inner_;
  ShardedState& state_;
  const int64_t replicas_;
  vnode::StepPacket& packet_;  // its gradients, reduced in the shards this worker keeps
  const ClipSpec clip_;
  comm::Communicator* comm_ = nullptr;
  comm::Shares parameters_;  // the parameters' gather: by owner, wanted where not held
  int64_t step_ = -1;        // the step begun last
  int64_t dies_at_ = -1;     // the step whose gather this worker dies in (a test switch)
  int64_t late_at_ = -1;     // the step whose commit this worker is late to (a test switch)
  int64_t beginning_ = -1;   // the training step whose begin_step moves shards now
  /// A step whose commit failed here after its sums completed (commit): its reduced
  /// gradients stay in the inner reducer (not abandoned) until the next group's first
  /// collective shows whether another worker took it (catch_up).
  struct Pending {
    double lr = 0;                // its learning rate
    std::vector<int64_t> shards;  // the shards kept then: those its sums reached
    torch::Tensor figures;        // LAMB's and LARS's exchanged sums (after the clip), or undefined
    bool moved = false;           // a transferred state of a step ahead came since
    bool taking = false;          // being taken now: the exchange gives `figures`
  };
  std::optional<Pending> pending_;
  std::vector<vnode::VnodeRange> layout_;
  int rank_ = 0;
  bool moved_ = false;              // the layout or the state changed: shards move first
  bool logged_ = false;             // this layout's shards were logged
  bool params_incomplete_ = false;  // a gather of the parameters failed
};

}  // namespace

std::unique_ptr<Reducer> make_sharded_reducer(std::unique_ptr<Reducer> inner, ShardedState& state,
                                              int64_t replicas, vnode::StepPacket& packet,
                                              const ClipSpec& clip) {
  return std::make_unique<ShardedReducer>(std::move(inner), state, replicas, packet, clip);
}

}  // namespace vflow::engine
