#include "vflow/job/elastic_worker.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>

#include "job/coordination.h"
#include "job/periodic.h"
#include "job/step_watch.h"
#include "vflow/core/clock.h"
#include "vflow/core/zygote.h"
#include "vflow/engine/run_job.h"
#include "vflow/engine/runtime.h"
#include "vflow/job/build_identity.h"
#include "vflow/job/control_plane.h"

namespace vflow::job {

namespace {

using Clock = std::chrono::steady_clock;

/// Waits for a generation newer than `after` that holds `member`. Returns nullopt when
/// the job is over, or when `member` was in the job and a newer generation left it out.
std::optional<Generation> await_generation(ControlPlane& control, int64_t after,
                                           const std::string& member, bool was_member,
                                           std::chrono::milliseconds patience,
                                           const std::atomic<bool>* leave_flag) {
  const auto start = Clock::now();
  auto looked = start;  // when the job was last seen to exist
  int64_t seen = after;
  while (true) {
    const int64_t latest = control.latest_generation();
    if (latest > seen) {
      auto g = control.generation(latest);
      if (g.rank_of(member) >= 0) return g;
      if (was_member) return std::nullopt;
      seen = latest;  // a joiner not taken in yet keeps waiting
    }
    if (control.state() != JobState::kRunning) return std::nullopt;
    // A worker that holds no vnodes yet can leave at once.
    if (!was_member && leave_flag && leave_flag->load()) return std::nullopt;
    // A joiner still waiting when the job's keys went (it ended meanwhile) is not needed.
    if (!was_member && Clock::now() - looked > std::chrono::seconds(1)) {
      if (!control.has_limits()) return std::nullopt;
      looked = Clock::now();
    }
    if (was_member && Clock::now() - start > patience) {
      throw comm::PeerFailure(fmt::format(
          "[elastic] worker {}: the coordinator published no generation after {} within {} s",
          member, after, std::chrono::duration<double>(patience).count()));
    }
    // A member's next generation is usually there (it was told so); a joiner waits longer.
    std::this_thread::sleep_for(std::chrono::milliseconds(was_member ? 2 : 10));
  }
}

/// The ranks of `before` that `after` leaves out, when `after` keeps the others in their
/// order and adds no one (so a backend's shrink numbers the survivors as `after` does).
std::optional<std::vector<int>> excluded_ranks(const std::vector<std::string>& before,
                                               const std::vector<std::string>& after) {
  std::vector<int> excluded;
  size_t kept = 0;
  for (size_t i = 0; i < before.size(); ++i) {
    if (kept < after.size() && before[i] == after[kept]) {
      ++kept;
    } else {
      excluded.push_back(static_cast<int>(i));
    }
  }
  if (kept != after.size()) return std::nullopt;
  return excluded;
}

/// What this member offers towards the next generation's communicator, for a backend
/// with `caps`: to shrink or grow `parent` (generation `parent_generation`'s, held since a
/// clean regroup) when `after` drops members of `before` or appends to it; to join a grown
/// one when it is new.
RegroupOffer regroup_offer(const comm::BackendCapabilities& caps, const comm::Communicator* parent,
                           const std::vector<std::string>& before, int64_t parent_generation,
                           const std::vector<std::string>& after, bool was_member) {
  using Kind = RegroupOffer::Kind;
  RegroupOffer offer;
  if (!parent) {
    if (!was_member && caps.can_grow) offer.kind = Kind::kJoin;
    return offer;
  }
  const auto excluded = excluded_ranks(before, after);
  const bool appends =
      after.size() > before.size() && std::equal(before.begin(), before.end(), after.begin());
  if (excluded && !excluded->empty() && caps.can_shrink) {
    offer.kind = Kind::kShrink;
  } else if (appends && caps.can_grow) {
    offer.kind = Kind::kGrow;
    offer.members = static_cast<int64_t>(before.size());
  } else {
    return offer;
  }
  offer.parent = parent_generation;
  return offer;
}

}  // namespace

void transfer_state(engine::Trainer& trainer, comm::Communicator& communicator, int donor) {
  const bool giving = communicator.rank() == donor;
  std::string bytes = giving ? trainer.state_bytes() : std::string();
  auto size = torch::tensor({static_cast<int64_t>(bytes.size())}, torch::kInt64);
  communicator.broadcast(size, donor);
  auto buffer = torch::empty({size.item<int64_t>()}, torch::kUInt8);
  if (giving) std::memcpy(buffer.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  communicator.broadcast(buffer, donor);
  if (giving) {
    trainer.state_donated();
  } else {
    trainer.load_state_bytes(
        std::string(reinterpret_cast<const char*>(buffer.data_ptr<uint8_t>()), buffer.numel()));
  }
}

namespace {

/// One worker of an elastic job, through its generations: connect() checks it against the
/// job and starts its lease, control_steps() gives the trainer its step control, regroup()
/// makes each generation's communicator, finish() publishes the result.
class ElasticWorker {
 public:
  ElasticWorker(const engine::JobSpec& spec, const ElasticWorkerOptions& options)
      : spec_(spec),
        options_(options),
        me_(options.member),
        cluster_(!options.control.empty()),
        control_(connect()) {}

  ElasticOutcome run();

 private:
  std::unique_ptr<ControlStore> connect() const {
    return cluster_
               ? connect_control_store(options_.control, options_.job, options_.timeout)
               : connect_embedded_store(options_.store_host, options_.store_port, options_.timeout);
  }
  /// Refuses a worker of another build or spec, starts the liveness lease on a cluster.
  void join_job();
  void control_steps();
  /// Generation `g`'s communicator for this worker, and how it was made (" init",
  /// " shrink", " grow", or "" for a fresh one a backend cannot derive from).
  std::shared_ptr<comm::Communicator> regroup(const Generation& g, comm::Rendezvous& r,
                                              comm::BackendCapabilities& caps, std::string& made);
  ElasticOutcome finish(const engine::TrainResult& result);
  /// Generation `g` regroups cleanly into `next_id`: what only leaving members hold of the
  /// training state passes to members that stay (Trainer::hand_off_state).
  void hand_off(const Generation& g, int64_t next_id);

  const engine::JobSpec& spec_;
  const ElasticWorkerOptions& options_;
  const std::string me_;
  const bool cluster_;
  ControlPlane control_;
  /// The rendezvous's own client of the job's store: the step's control calls and a
  /// regroup's rendezvous never share a connection.
  std::shared_ptr<comm::KeyValueStore> rendezvous_store_;
  std::unique_ptr<Periodic> lease_;
  std::unique_ptr<StepWatch> watch_;
  std::shared_ptr<engine::Trainer> trainer_;
  int64_t generation_ = 0;
  bool was_member_ = false;  // a generation held this worker
  bool leave_sent_ = false;
  bool lost_logged_ = false;
  // The last generation's communicator after a regroup without failure, kept where the
  // backend can derive the next one from it (BackendCapabilities; NCCL): a shrink when the
  // next generation drops members and keeps the others in order, a grow when it appends new
  // members. The members agree through the store first (a member that failed meanwhile holds
  // no communicator; a new one may not be able to join); otherwise they initialise afresh.
  std::shared_ptr<comm::Communicator> previous_;
  std::vector<std::string> previous_members_;
  int64_t previous_generation_ = 0;
};

void ElasticWorker::join_job() {
  rendezvous_store_ = connect();
  if (options_.volunteer) control_.require_job(options_.job, options_.control);
  if (cluster_) {
    // Hosts of one job run one build: a worker of another is refused before it trains.
    if (const auto record = control_.record(); record && record->version != build_identity()) {
      throw RequestRefused(fmt::format(
          "this worker runs {}, job '{}' runs {}: every host of a job must run the same build",
          build_identity(), options_.job, record->version));
    }
  }
  // Every worker trains the job the launcher was given, or none: a worker started by hand
  // or on another host with another spec is refused before it trains.
  if (const auto published = control_.spec(); published && *published != spec_.semantic_yaml()) {
    throw SpecError(fmt::format(
        "this worker's job spec differs from the job's in its semantic part (vflow-train "
        "--print-spec shows it); the job's:\n{}",
        *published));
  }
  if (cluster_) {
    // On a cluster the coordinator may be on another host, or may change: the lease says
    // this process lives (a lost host's workers are noticed by their leases expiring). It
    // starts before the data and the model load, which may take long, and is renewed from
    // a thread of its own, with a client of its own.
    const auto ttl = lease_ttl(options_.timeout);
    auto store = connect();
    store->heartbeat(ControlPlane::liveness_name(me_), ttl);
    lease_ = std::make_unique<Periodic>(
        [s = std::shared_ptr<ControlStore>(std::move(store)),
         name = ControlPlane::liveness_name(me_), ttl] { s->heartbeat(name, ttl); },
        ttl / 4, "renewing worker " + me_ + "'s liveness");
  }
  if (!options_.device_type.empty()) control_.publish_device_type(me_, options_.device_type);
}

void ElasticWorker::control_steps() {
  watch_ = std::make_unique<StepWatch>(ControlPlane(connect()), me_);
  trainer_->set_step_control([this](const engine::Trainer& t) {
    engine::StepControl c;
    if (options_.leave_flag && options_.leave_flag->load() && !leave_sent_) {
      spdlog::info("[elastic] worker {} asked to leave at the next step boundary", me_);
      control_.request_leave(me_);
      leave_sent_ = true;
    }
    // Every worker reports its measured per-vnode and update times, which the watch
    // publishes now and then: the coordinator splits the vnodes by them on a resize.
    watch_->report(t.rank() == 0, t.step(), {t.seconds_per_vnode(), t.update_seconds()});
    if (t.rank() != 0) return c;
    // Rank 0 relays what its watch found; everyone learns it through the collective.
    if (const auto why = watch_->lost(); !why.empty()) {
      if (!lost_logged_) spdlog::error("{}; stopping the job with a checkpoint", why);
      lost_logged_ = true;
      c.stop = true;
    }
    if (watch_->stop_requested()) c.stop = true;
    if (const int64_t latest = watch_->latest_generation(); latest > generation_) {
      c.next_generation = latest;
    }
    return c;
  });
}

std::shared_ptr<comm::Communicator> ElasticWorker::regroup(const Generation& g, comm::Rendezvous& r,
                                                           comm::BackendCapabilities& caps,
                                                           std::string& made) {
  std::shared_ptr<comm::Communicator> communicator;
  // Where the peers are reached from (Gloo's interface faces it), the same every regroup.
  r.store_host = cluster_ ? control_store_host(options_.control) : options_.store_host;
  r.store_port = options_.store_port;
  r.store = rendezvous_store_;
  r.rank = g.rank_of(me_);
  r.world_size = static_cast<int>(g.members.size());
  r.generation = std::to_string(g.id);
  r.timeout = options_.timeout;
  engine::choose_backend(spec_.resources, trainer_->device(), r);
  caps = comm::backend_capabilities(r.backend);
  if (caps.can_derive()) {
    // Released at the end of this block whatever happens (the trainer keeps its own
    // reference until it gets the next communicator).
    const auto parent = std::move(previous_);
    const auto offer = regroup_offer(caps, parent.get(), previous_members_, previous_generation_,
                                     g.members, was_member_);
    const auto answer = control_.agree_regroup(g.id, g.members, me_, offer, options_.timeout);
    const auto how = answer.how;
    if (how == Regroup::kShrink) {
      communicator = parent->shrink(*excluded_ranks(previous_members_, g.members),
                                    /*after_failure=*/false);
      if (communicator) made = " shrink";
    } else if (how == Regroup::kGrow && parent) {
      communicator = parent->grow(r);
      if (!communicator) {
        throw comm::PeerFailure(
            fmt::format("[elastic] worker {} could not grow the communicator of generation {}", me_,
                        previous_generation_));
      }
      made = " grow";
    } else if (how == Regroup::kGrow) {
      r.grown_from = static_cast<int>(answer.grown_from);  // a new member joins
      made = " grow";
    }
    if (made.empty()) made = " init";
    VFLOW_ASSERT(!communicator || communicator->rank() == r.rank,
                 "a derived communicator numbers the members as the generation does");
  }
  if (!communicator) communicator = comm::make_communicator(r);
  control_.mark_joined(g.id, me_);
  if (g.transfer_state) {
    transfer_state(*trainer_, *communicator, g.rank_of(g.donor));
  } else if (g.donor == me_) {
    // Everyone is at the donor's step already; its observers still learn that the
    // job goes on from it (rank 0 may have died before logging the last step).
    trainer_->state_donated();
  }
  return communicator;
}

void ElasticWorker::hand_off(const Generation& g, int64_t next_id) {
  if (!spec_.resources.shard_optimizer) return;  // every member holds the whole state
  try {
    const auto next = control_.generation(next_id);
    std::vector<int> next_rank;
    for (const auto& m : g.members) next_rank.push_back(next.rank_of(m));
    trainer_->hand_off_state(next_rank, static_cast<int>(next.members.size()), next.vnodes);
  } catch (const comm::PeerFailure& e) {
    // The next generation finds out what is left (and says what is lost).
    spdlog::warn("[elastic] worker {}: handing on state to generation {} failed: {}", me_, next_id,
                 e.what());
  }
}

ElasticOutcome ElasticWorker::finish(const engine::TrainResult& result) {
  if (trainer_->rank() == 0) {
    try {
      control_.publish_step(trainer_->step());
      if (cluster_) {
        std::string text =
            fmt::format("fingerprint {} after {} steps", result.fingerprint, result.steps);
        if (result.evaluation) {
          text += fmt::format(", test accuracy {:.2f}%", 100.0 * result.evaluation->accuracy);
        }
        control_.publish_result(text);
      }
      control_.mark_done(result.completed ? JobState::kCompleted : JobState::kStopped);
    } catch (const comm::PeerFailure& e) {
      spdlog::warn("{}", e.what());  // the coordinator is gone; the result stands
    }
  }
  ElasticOutcome out;
  out.result = result;
  return out;
}

ElasticOutcome ElasticWorker::run() {
  join_job();
  trainer_ = engine::make_trainer(spec_, nullptr, /*elastic=*/true);
  trainer_->set_stop_flag(options_.stop_flag);
  if (options_.prepare) options_.prepare(*trainer_);
  control_steps();
  control_.mark_ready(me_, static_cast<int64_t>(getpid()));
  if (options_.volunteer) {
    control_.volunteer(me_);
    spdlog::info("[elastic] worker {} offers to join job '{}'", me_, options_.job);
  }
  spdlog::info("[elastic] worker {} ready{}", me_,
               started_by_zygote() ? " (forked from its launcher's zygote)" : "");

  // Survivors wait for the coordinator to collect every report (up to its timeout).
  const auto patience = 3 * options_.timeout + std::chrono::seconds(5);
  while (true) {
    const auto g =
        await_generation(control_, generation_, me_, was_member_, patience, options_.leave_flag);
    if (!g) {
      ElasticOutcome out;
      out.kind = was_member_ ? ElasticOutcome::Kind::kLeft : ElasticOutcome::Kind::kNotNeeded;
      spdlog::info("[elastic] worker {} {}", me_,
                   was_member_ ? "left the job" : "was not needed: the job is over");
      return out;
    }
    const auto t0 = Clock::now();
    generation_ = g->id;
    std::shared_ptr<comm::Communicator> communicator;
    comm::Rendezvous r;
    comm::BackendCapabilities caps;
    std::string made;  // how a communicator that can be derived was made: init, shrink or grow
    try {
      communicator = regroup(*g, r, caps, made);
    } catch (const comm::PeerFailure& e) {
      spdlog::warn("[elastic] worker {}: {}", me_, e.what());
      // A worker that never joined a generation holds only what it started with, not the
      // job's state (-1): were it the donor, the job would start again from its beginning.
      control_.report_survivor(g->id, me_, was_member_ ? trainer_->step() : -1);
      continue;
    }
    trainer_->set_communicator(communicator, g->vnodes);
    was_member_ = true;
    spdlog::info(
        "[elastic] worker {} is rank {} of {} in {} at step {} (regrouped in {:.3f} s, {})", me_,
        communicator->rank(), communicator->size(), g->describe(), trainer_->step(),
        seconds_since(t0), to_string(r.backend) + made);
    if (g->stop) trainer_->stop_now();
    engine::TrainResult result;
    try {
      result = trainer_->run();
    } catch (const comm::PeerFailure& e) {
      spdlog::warn("[elastic] worker {}: {}; redoing step {} in the next generation", me_, e.what(),
                   trainer_->step());
      trainer_->set_communicator(nullptr);
      communicator.reset();  // closes this worker's connections, so peers notice at once
      control_.report_survivor(g->id, me_, trainer_->step());
      continue;
    }
    if (result.next_generation > 0) {
      hand_off(*g, result.next_generation);
      if (caps.can_derive()) {
        previous_ = communicator;
        previous_members_ = g->members;
        previous_generation_ = g->id;
      }
      continue;
    }
    return finish(result);
  }
}

}  // namespace

ElasticOutcome run_elastic_worker(const engine::JobSpec& spec,
                                  const ElasticWorkerOptions& options) {
  return ElasticWorker(spec, options).run();
}

}  // namespace vflow::job
