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
#include "vflow/core/clock.h"
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
    if (!control.done().empty()) return std::nullopt;
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

ElasticOutcome run_elastic_worker(const engine::JobSpec& spec,
                                  const ElasticWorkerOptions& options) {
  const bool cluster = !options.control.empty();
  ControlPlane control(
      cluster ? connect_control_store(options.control, options.job, options.timeout)
              : connect_embedded_store(options.store_host, options.store_port, options.timeout));
  // The rendezvous's own client of the job's store: the step's control calls and a
  // regroup's rendezvous never share a connection.
  const std::shared_ptr<comm::KeyValueStore> rendezvous_store =
      cluster ? connect_control_store(options.control, options.job, options.timeout)
              : connect_embedded_store(options.store_host, options.store_port, options.timeout);
  // Where the peers are reached from (Gloo's interface faces it), the same every regroup.
  const std::string rendezvous_host =
      cluster ? control_store_host(options.control) : options.store_host;
  std::unique_ptr<Periodic> lease;
  if (options.volunteer) control.require_job(options.job, options.control);
  if (cluster) {
    // Hosts of one job run one build: a worker of another is refused before it trains.
    if (const auto record = control.record(); record && record->version != build_identity()) {
      throw RequestRefused(fmt::format(
          "this worker runs {}, job '{}' runs {}: every host of a job must run the same build",
          build_identity(), options.job, record->version));
    }
  }
  // Every worker trains the job the launcher was given, or none: a worker started by hand
  // or on another host with another spec is refused before it trains.
  if (const auto published = control.spec(); published && *published != spec.semantic_yaml()) {
    throw SpecError(fmt::format(
        "this worker's job spec differs from the job's in its semantic part (vflow-train "
        "--print-spec shows it); the job's:\n{}",
        *published));
  }
  const std::string& me = options.member;
  if (cluster) {
    // On a cluster the coordinator may be on another host, or may change: the lease says
    // this process lives (a lost host's workers are noticed by their leases expiring). It
    // starts before the data and the model load, which may take long, and is renewed from
    // a thread of its own, with a client of its own.
    const auto ttl = lease_ttl(options.timeout);
    auto store = connect_control_store(options.control, options.job, options.timeout);
    store->heartbeat(ControlPlane::liveness_name(me), ttl);
    lease = std::make_unique<Periodic>(
        [s = std::shared_ptr<ControlStore>(std::move(store)),
         name = ControlPlane::liveness_name(me), ttl] { s->heartbeat(name, ttl); },
        ttl / 4, "renewing worker " + me + "'s liveness");
  }
  if (!options.device_type.empty()) control.publish_device_type(me, options.device_type);
  const auto trainer = engine::make_trainer(spec, nullptr, /*elastic=*/true);
  trainer->set_stop_flag(options.stop_flag);
  if (options.prepare) options.prepare(*trainer);

  int64_t generation = 0;
  bool leave_sent = false;
  int64_t seen_news = -1;
  Clock::time_point last_published;
  Clock::time_point last_speed;
  trainer->set_step_control([&](const engine::Trainer& t) {
    engine::StepControl c;
    if (options.leave_flag && options.leave_flag->load() && !leave_sent) {
      spdlog::info("[elastic] worker {} asked to leave at the next step boundary", me);
      control.request_leave(me);
      leave_sent = true;
    }
    // Every worker reports its measured per-vnode and update times now and then; the
    // coordinator splits the vnodes by them on a resize.
    const auto now = Clock::now();
    if (now - last_speed > std::chrono::seconds(1) && t.seconds_per_vnode() > 0) {
      try {
        control.publish_speed(me, {t.seconds_per_vnode(), t.update_seconds()});
      } catch (const comm::PeerFailure&) {
        // the coordinator is gone: rank 0 finds out below, or the next collective does
      }
      last_speed = now;
    }
    if (t.rank() != 0) return c;
    // Rank 0 polls the coordinator once per step (one round trip when nothing changed);
    // everyone learns the outcome through the collective.
    try {
      if (now - last_published > std::chrono::milliseconds(200)) {
        control.publish_step(t.step());
        last_published = now;
      }
      const int64_t news = control.news();
      if (news != seen_news) {
        c.stop = control.stop_requested();
        const int64_t latest = control.latest_generation();
        if (latest > generation) c.next_generation = latest;
        seen_news = news;
      }
    } catch (const comm::PeerFailure& e) {
      spdlog::error("{}; stopping the job with a checkpoint", e.what());
      c.stop = true;
    }
    return c;
  });
  control.mark_ready(me, static_cast<int64_t>(getpid()));
  if (options.volunteer) {
    control.volunteer(me);
    spdlog::info("[elastic] worker {} offers to join job '{}'", me, options.job);
  }
  spdlog::info("[elastic] worker {} ready", me);

  // Survivors wait for the coordinator to collect every report (up to its timeout).
  const auto patience = 3 * options.timeout + std::chrono::seconds(5);
  bool was_member = false;
  // The last generation's communicator after a regroup without failure, kept where the
  // backend can derive the next one from it (BackendCapabilities; NCCL): a shrink when the next
  // generation drops members and keeps the others in order, a grow when it appends new members. The
  // members agree through the store first (a member that failed meanwhile holds no communicator; a
  // new one may not be able to join); otherwise they initialise afresh.
  std::shared_ptr<comm::Communicator> previous;
  std::vector<std::string> previous_members;
  int64_t previous_generation = 0;
  while (true) {
    const auto g =
        await_generation(control, generation, me, was_member, patience, options.leave_flag);
    if (!g) {
      ElasticOutcome out;
      out.kind = was_member ? ElasticOutcome::Kind::kLeft : ElasticOutcome::Kind::kNotNeeded;
      spdlog::info("[elastic] worker {} {}", me,
                   was_member ? "left the job" : "was not needed: the job is over");
      return out;
    }
    const auto t0 = Clock::now();
    generation = g->id;
    std::shared_ptr<comm::Communicator> communicator;
    comm::Rendezvous r;
    comm::BackendCapabilities caps;
    std::string made;  // how a communicator that can be derived was made: init, shrink or grow
    try {
      r.store_host = rendezvous_host;
      r.store_port = options.store_port;
      r.store = rendezvous_store;
      r.rank = g->rank_of(me);
      r.world_size = static_cast<int>(g->members.size());
      r.generation = std::to_string(g->id);
      r.timeout = options.timeout;
      engine::choose_backend(spec.resources, trainer->device(), r);
      caps = comm::backend_capabilities(r.backend);
      if (caps.can_derive()) {
        // Released at the end of this block whatever happens (the trainer keeps its own
        // reference until it gets the next communicator).
        const auto parent = std::move(previous);
        const auto offer = regroup_offer(caps, parent.get(), previous_members, previous_generation,
                                         g->members, was_member);
        const auto answer = control.agree_regroup(g->id, g->members, me, offer, options.timeout);
        const auto how = answer.how;
        if (how == Regroup::kShrink) {
          communicator = parent->shrink(*excluded_ranks(previous_members, g->members),
                                        /*after_failure=*/false);
          if (communicator) made = " shrink";
        } else if (how == Regroup::kGrow && parent) {
          communicator = parent->grow(r);
          if (!communicator) {
            throw comm::PeerFailure(
                fmt::format("[elastic] worker {} could not grow the communicator of generation {}",
                            me, previous_generation));
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
      control.mark_joined(g->id, me);
      if (g->transfer_state) {
        transfer_state(*trainer, *communicator, g->rank_of(g->donor));
      } else if (g->donor == me) {
        // Everyone is at the donor's step already; its observers still learn that the
        // job goes on from it (rank 0 may have died before logging the last step).
        trainer->state_donated();
      }
    } catch (const comm::PeerFailure& e) {
      spdlog::warn("[elastic] worker {}: {}", me, e.what());
      control.report_survivor(g->id, me, trainer->step());
      continue;
    }
    trainer->set_communicator(communicator, g->vnodes);
    was_member = true;
    spdlog::info(
        "[elastic] worker {} is rank {} of {} in {} at step {} (regrouped in {:.3f} s, {})", me,
        communicator->rank(), communicator->size(), g->describe(), trainer->step(),
        seconds_since(t0), r.backend + made);
    if (g->stop) trainer->stop_now();
    engine::TrainResult result;
    try {
      result = trainer->run();
    } catch (const comm::PeerFailure& e) {
      spdlog::warn("[elastic] worker {}: {}; redoing step {} in the next generation", me, e.what(),
                   trainer->step());
      trainer->set_communicator(nullptr);
      communicator.reset();  // closes this worker's connections, so peers notice at once
      control.report_survivor(g->id, me, trainer->step());
      continue;
    }
    if (result.next_generation > 0) {
      if (caps.can_derive()) {
        previous = communicator;
        previous_members = g->members;
        previous_generation = g->id;
      }
      continue;
    }
    if (trainer->rank() == 0) {
      try {
        control.publish_step(trainer->step());
        if (cluster) {
          std::string text =
              fmt::format("fingerprint {} after {} steps", result.fingerprint, result.steps);
          if (result.evaluation) {
            text += fmt::format(", test accuracy {:.2f}%", 100.0 * result.evaluation->accuracy);
          }
          control.publish_result(text);
        }
        control.mark_done(result.completed ? "completed" : "stopped");
      } catch (const comm::PeerFailure& e) {
        spdlog::warn("{}", e.what());  // the coordinator is gone; the result stands
      }
    }
    ElasticOutcome out;
    out.result = result;
    return out;
  }
}

}  // namespace vflow::job
