#include "vflow/job/generation_manager.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "vflow/core/error.h"
#include "vflow/core/exit_code.h"
#include "vflow/hetero/speed_plan.h"

namespace vflow::job {

namespace {

bool contains(const std::vector<std::string>& items, const std::string& item) {
  return std::find(items.begin(), items.end(), item) != items.end();
}

bool records_differ(const Generation& a, const Generation& b) {
  return a.members != b.members || a.donor != b.donor || a.transfer_state != b.transfer_state ||
         a.stop != b.stop || a.vnodes != b.vnodes;
}

}  // namespace

GenerationManager::GenerationManager(ControlPlane& control, ElasticOptions options,
                                     WorkerSource* source)
    : control_(control), options_(options), source_(source) {}

void GenerationManager::start(const std::vector<std::string>& members,
                              std::vector<int64_t> vnodes) {
  first_vnodes_ = std::move(vnodes);
  // The profiled times first: the limits say the job has started, and a coordinator taking
  // over from then on reads both.
  if (!options_.profiled.empty()) control_.publish_profiled(options_.profiled);
  control_.publish_limits(options_.limits);
  target_ = static_cast<int64_t>(members.size());
  control_.set_target(target_);
  for (const auto& m : members) add_joiner(m);
}

void GenerationManager::resume() {
  options_.profiled = control_.profiled();
  const int64_t latest = control_.latest_generation();
  if (latest > 0) current_ = control_.generation(latest);
  target_ = control_.target();
  resize_seq_ = control_.resize_handled();
  adopt_recorded_joiners();
  // A generation decided but not announced (its coordinator died in between) stands.
  while (const auto undeclared = control_.undeclared_generation()) {
    spdlog::warn("[elastic] announcing {}, decided by the coordinator before",
                 undeclared->describe());
    adopt(control_.publish(*undeclared));
  }
  for (const auto& v : control_.volunteers()) {
    if (control_.volunteer_adopted(v)) volunteers_.insert(v);
  }
  forgotten_ = std::max<int64_t>(0, current_.id - 2);
  spdlog::info("[elastic] took over coordinating at {} (target {}, {} joiner(s) waiting)",
               current_.id > 0 ? current_.describe() : "the first generation", target_,
               joiners_.size());
}

void GenerationManager::adopt_recorded_joiners() {
  const auto now = Clock::now();
  for (const auto& j : control_.joiners()) {
    if (current_.rank_of(j) >= 0) {
      control_.remove_joiner(j);  // its generation was published
      continue;
    }
    if (exited_.count(j) != 0 || contains(joiners_, j)) continue;
    joiners_.push_back(j);
    joiner_since_[j] = now;
  }
}

void GenerationManager::add_joiner(const std::string& member) {
  if (options_.cluster) control_.add_joiner(member);
  joiners_.push_back(member);
  joiner_since_[member] = Clock::now();
}

void GenerationManager::drop_joiner(const std::string& member) {
  if (!contains(joiners_, member)) return;
  joiners_.erase(std::remove(joiners_.begin(), joiners_.end(), member), joiners_.end());
  joiner_since_.erase(member);
  if (options_.cluster) control_.remove_joiner(member);
}

void GenerationManager::fail_start(const std::string& member, int exit_code) {
  spdlog::error("[elastic] worker {} exited with status {} at start-up; the job fails", member,
                exit_code);
  control_.mark_done(JobState::kFailed);
  current_.stop = true;
}

void GenerationManager::on_exit(const std::string& member, int exit_code) {
  if (!exited_.insert(member).second) return;
  const bool joining = contains(joiners_, member);
  drop_joiner(member);
  if (current_.id == 0 && joining && exit_code != 0 && options_.cluster && !current_.stop) {
    // Only a cluster job's coordinator decides this: the local launcher stops its own
    // workers itself and passes the worker's code on.
    fail_start(member, exit_code);
    return;
  }
  // Status 0 is a worker that left or finished; 130 after a requested stop is a worker
  // that stopped as asked; anything else died.
  if (current_.rank_of(member) >= 0 && exit_code == kExitStopped && control_.stop_requested()) {
    spdlog::info("[elastic] worker {} of generation {} stopped as requested", member, current_.id);
    return;
  }
  if (current_.rank_of(member) >= 0 && exit_code != 0) {
    if (exit_code == kExitMismatch) {
      // A cross-check (docs/verification.md): outvoted, or the job stops after a mismatch.
      spdlog::warn(
          "[elastic] worker {} of generation {} left after a cross-check mismatch "
          "(status {})",
          member, current_.id, exit_code);
    } else {
      spdlog::warn("[elastic] worker {} of generation {} died (status {})", member, current_.id,
                   exit_code);
    }
    dead_.insert(member);
    dirty_ = true;
  }
}

bool GenerationManager::established() {
  if (established_) return true;
  for (const auto& m : current_.members) {
    if (!control_.joined(current_.id, m)) return false;
  }
  established_ = true;
  spdlog::info("[elastic] generation {} established", current_.id);
  // A cluster store keeps what it is given: the rendezvous and records of generations no
  // member can still be reading (the one before this may be, for a moment) go.
  if (options_.cluster) {
    for (; forgotten_ < current_.id - 1; ++forgotten_) control_.forget_generation(forgotten_ + 1);
  }
  return true;
}

std::vector<std::string> GenerationManager::ready_joiners() {
  std::vector<std::string> out;
  for (const auto& j : joiners_) {
    if (control_.ready(j)) out.push_back(j);
  }
  return out;
}

void GenerationManager::spawn_joiners(int64_t wanted) {
  unplaced_ = false;
  if (!source_) return;
  while (static_cast<int64_t>(joiners_.size()) < wanted) {
    if (Clock::now() < next_spawn_) {
      unplaced_ = true;
      return;
    }
    // Recorded before it starts, so that a coordinator taking over knows of it.
    const std::string member = control_.next_member();
    add_joiner(member);
    if (!source_->start(member)) {
      drop_joiner(member);
      unplaced_ = true;
      next_spawn_ = Clock::now() + std::chrono::milliseconds(500);
      return;
    }
  }
}

void GenerationManager::publish(std::vector<std::string> members, std::string donor, bool transfer,
                                bool stop, std::vector<int64_t> vnodes) {
  Generation next;
  next.id = current_.id + 1;
  next.members = std::move(members);
  next.donor = std::move(donor);
  next.transfer_state = transfer;
  next.stop = stop;
  next.vnodes = std::move(vnodes);
  // The first generation runs the layout, or an even split; later ones split by speed.
  if (next.vnodes.empty() && next.id > 1 && next.members.size() > 1) {
    next.vnodes = plan(next.members);
  }
  const auto published = control_.publish(next);
  if (records_differ(published, next)) {
    spdlog::warn("[elastic] generation {} was decided already (by another coordinator): {}",
                 next.id, published.describe());
  } else {
    spdlog::info("[elastic] published {}", next.describe());
  }
  adopt(published);
}

std::vector<int64_t> GenerationManager::plan(const std::vector<std::string>& members) {
  std::vector<double> times, updates;
  std::string sources;
  for (const auto& m : members) {
    const auto measured = control_.speed(m).value_or(MeasuredSpeed{});
    double t = measured.seconds_per_vnode;
    std::string source = fmt::format("measured, update {:.4g} s", measured.update_seconds);
    if (!(t > 0)) {
      const auto type = control_.device_type(m);
      const auto profiled = type ? options_.profiled.find(*type) : options_.profiled.end();
      t = profiled != options_.profiled.end() ? profiled->second : 0;
      source = t > 0 ? "profile of " + *type : "not known: as the fastest";
    }
    times.push_back(t);
    updates.push_back(measured.seconds_per_vnode > 0 ? measured.update_seconds : -1);
    sources += fmt::format("{}{} {:.4g} s ({})", sources.empty() ? "" : ", ", m, t, source);
  }
  auto vnodes = hetero::plan_by_speed(times, options_.limits.virtual_nodes, updates);
  if (!vnodes.empty()) spdlog::info("[elastic] split by time per vnode: {}", sources);
  return vnodes;
}

void GenerationManager::adopt(const Generation& published) {
  for (const auto& m : published.members) {
    drop_joiner(m);
    // A member counted as exited by its lease that then reported as a survivor lives: it is
    // judged afresh in this generation.
    dead_.erase(m);
    exited_.erase(m);
    lost_by_lease_.erase(m);
  }
  current_ = published;
  established_ = false;
  failure_since_.reset();
  short_since_.reset();
}

void GenerationManager::tick() {
  if (options_.cluster) check_liveness();
  // One round trip when nothing happened; waits with a deadline poll every time.
  const int64_t requests = control_.requests();
  if (options_.cluster && requests != seen_requests_) read_exits();
  if (current_.id == 0) {
    seen_requests_ = requests;
    if (current_.stop) return;
    // The first generation: every initial worker has loaded its data and built its model.
    if (ready_joiners().size() == joiners_.size() && !joiners_.empty()) {
      // The planned split (if any) holds for the first generation.
      publish(joiners_, joiners_.front(), false, false, first_vnodes_);
    }
    return;
  }
  const bool waiting = failure_since_ || short_since_ || !joiners_.empty() || unplaced_;
  if (requests == seen_requests_ && !dirty_ && !waiting) return;
  seen_requests_ = requests;
  dirty_ = false;
  if (current_.stop || control_.state() != JobState::kRunning) return;
  bool failed = control_.failure_reported(current_.id);
  for (const auto& m : current_.members) failed = failed || dead_.count(m) > 0;
  if (failed) {
    handle_failure();
  } else if (established()) {
    adopt_volunteers();
    handle_requests();
  }
}

void GenerationManager::read_exits() {
  for (const auto& [member, exit] : control_.exits()) {
    if (exited_.count(member) != 0) continue;
    if (exit.code == kPlacementDeclined) {
      // Its agent could not take it up: placed again, elsewhere, as if it never was.
      exited_.insert(member);
      if (!contains(joiners_, member)) continue;
      spdlog::info("[elastic] worker {} is placed again: {}", member, exit.why);
      drop_joiner(member);
      unplaced_ = true;
      next_spawn_ = {};
      if (current_.id == 0) spawn_joiners(target_);  // the first generation's own
      continue;
    }
    if (contains(joiners_, member) && !control_.ready(member) && exit.code != 0) {
      spdlog::warn("[elastic] worker {} could not start (status {}){}", member, exit.code,
                   exit.why.empty() ? "" : ": " + exit.why);
      if (source_) source_->failed_at_start(member, exit);
    }
    on_exit(member, exit.code);
  }
}

void GenerationManager::adopt_volunteers() {
  for (const auto& v : control_.volunteers()) {
    if (!volunteers_.insert(v).second) continue;
    if (exited_.count(v) != 0) continue;
    target_ = std::min(target_ + 1, options_.limits.max_workers);
    control_.set_target(target_);
    control_.adopt_volunteer(v);
    add_joiner(v);
    spdlog::info("[elastic] worker {} (started outside the launcher) offers to join; target {}", v,
                 target_);
  }
}

void GenerationManager::check_liveness() {
  if (Clock::now() - last_liveness_ < std::chrono::milliseconds(250)) return;
  last_liveness_ = Clock::now();
  // A finished job's workers end and revoke their leases: no failure.
  if (current_.stop || control_.state() != JobState::kRunning) return;
  adopt_recorded_joiners();
  const auto living = control_.store().alive_names(ControlPlane::liveness_name(""));
  const auto alive = [&](const std::string& m) {
    return std::binary_search(living.begin(), living.end(), ControlPlane::liveness_name(m));
  };
  std::vector<std::string> lost;
  for (const auto& m : current_.members) {
    if (dead_.count(m) != 0 || exited_.count(m) != 0) continue;
    if (alive(m)) {
      seen_alive_.insert(m);
    } else {
      lost.push_back(m);
    }
  }
  for (const auto& j : joiners_) {
    if (alive(j)) {
      seen_alive_.insert(j);
    } else if (seen_alive_.count(j) != 0 || Clock::now() - joiner_since_[j] > options_.timeout) {
      lost.push_back(j);  // died, or never started (its agent died first)
    }
  }
  for (const auto& m : lost) {
    spdlog::warn(
        "[elastic] worker {}'s liveness lease {}", m,
        seen_alive_.count(m) != 0 || current_.rank_of(m) >= 0 ? "expired" : "never appeared");
    const bool joining = contains(joiners_, m) && current_.rank_of(m) < 0;
    if (joining && volunteers_.count(m) != 0 &&
        target_ > static_cast<int64_t>(current_.members.size())) {
      --target_;  // a volunteer raised the target: it goes with it
      control_.set_target(target_);
    }
    lost_by_lease_.insert(m);
    on_exit(m, kExitPeerFailure);
  }
}

void GenerationManager::handle_failure() {
  const auto now = Clock::now();
  if (!failure_since_) failure_since_ = now;
  // Wait until every member that is not known dead has reported, or the timeout passed.
  // A member that failed before it had joined holds none of the job's state (it reports
  // step -1): it is not a donor, and takes the donor's state like a joiner.
  std::vector<std::string> alive, fresh;
  std::string donor;
  int64_t donor_step = -1;
  std::set<int64_t> steps;
  size_t expected = 0;
  for (const auto& m : current_.members) {
    if (dead_.count(m) == 0) ++expected;
    const auto step = control_.survivor_step(current_.id, m);
    if (!step) continue;
    if (*step < 0) {
      fresh.push_back(m);
      continue;
    }
    alive.push_back(m);
    steps.insert(*step);
    if (*step > donor_step) {  // the member furthest ahead (first on ties)
      donor_step = *step;
      donor = m;
    }
  }
  const size_t reported = alive.size() + fresh.size();
  // Nobody reported yet: wait for reports (a collective that failed on the others ends
  // within the timeout) before anyone is given up.
  if ((reported < expected || reported == 0) && now - *failure_since_ < options_.timeout) {
    return;
  }
  // Only members without state reported: the ones holding it may fail later in their
  // regroup (each of its phases waits up to the timeout), and are awaited longer; the
  // survivors wait for the next generation longer still (ElasticWorker's patience).
  if (alive.empty() && !fresh.empty() && reported < expected &&
      now - *failure_since_ < 3 * options_.timeout) {
    return;
  }
  if (alive.empty() && !fresh.empty()) {
    if (current_.id > 1) {
      // Taking the state of a member that had just joined would start the job afresh.
      spdlog::error(
          "[elastic] no worker holding the job's state survived generation {}: worker(s) {} "
          "had not joined it yet and hold none; the job fails (resume it from a checkpoint)",
          current_.id, fmt::join(fresh, ", "));
      control_.mark_done(JobState::kFailed);
      current_.stop = true;
      return;
    }
    donor = fresh.front();  // the first generation: every member holds the job's start
    alive.swap(fresh);      // all at that start: nothing to transfer
  }
  if (alive.empty() && !control_.failure_reported(current_.id)) {
    // Members were lost by their leases while no collective failed: the others are
    // training on, all at one step boundary, and take the next generation at the next. A
    // lease that lapsed while the store was unreachable and is back counts as alive.
    const auto living = control_.store().alive_names(ControlPlane::liveness_name(""));
    for (const auto& m : current_.members) {
      const bool renewed =
          lost_by_lease_.count(m) != 0 &&
          std::binary_search(living.begin(), living.end(), ControlPlane::liveness_name(m));
      if (dead_.count(m) == 0 || renewed) alive.push_back(m);
    }
    if (!alive.empty()) {
      donor = alive.front();
      spdlog::warn("[elastic] no collective of generation {} failed; going on with {} worker(s)",
                   current_.id, alive.size());
    }
  }
  // Survivors at one step hold the same state; otherwise the ones behind take the donor's,
  // and so do members without state.
  bool transfer = steps.size() > 1 || !fresh.empty();
  alive.insert(alive.end(), fresh.begin(), fresh.end());
  if (!options_.replace_failed) target_ = std::max<int64_t>(1, static_cast<int64_t>(alive.size()));
  spawn_joiners(std::max<int64_t>(0, target_ - static_cast<int64_t>(alive.size())));
  // Joiners that are ready now come in; the rest join in a later generation.
  for (const auto& j : ready_joiners()) {
    if (static_cast<int64_t>(alive.size()) < target_) {
      alive.push_back(j);
      transfer = true;
    }
  }
  if (alive.empty()) {
    spdlog::error("[elastic] no worker of generation {} survived", current_.id);
    control_.mark_done(JobState::kFailed);
    current_.stop = true;
    return;
  }
  const bool too_few = static_cast<int64_t>(alive.size()) < options_.limits.min_workers;
  if (too_few) {
    if (!short_since_) short_since_ = now;
    if (!joiners_.empty() && now - *short_since_ < options_.timeout) return;
    spdlog::error("[elastic] only {} worker(s) left, below resources.min_workers = {}; stopping",
                  alive.size(), options_.limits.min_workers);
  }
  control_.set_target(target_);
  publish(alive, donor, transfer, too_few);
}

void GenerationManager::handle_requests() {
  const auto [seq, workers] = control_.resize_request();
  if (seq != resize_seq_) {
    resize_seq_ = seq;
    target_ = std::clamp(workers, options_.limits.min_workers, options_.limits.max_workers);
    control_.set_target(target_);
    if (options_.cluster) control_.mark_resize_handled(seq);
    spdlog::info("[elastic] resize to {} worker(s) requested", target_);
  }
  std::vector<std::string> keep;
  bool leaving = false;
  for (const auto& m : current_.members) {
    if (control_.leave_requested(m)) {
      leaving = true;
    } else {
      keep.push_back(m);
    }
  }
  if (leaving && static_cast<int64_t>(keep.size()) < target_) {
    // A preempted worker is replaced only when failures are; otherwise the job shrinks.
    if (!options_.replace_failed) target_ = std::max<int64_t>(1, keep.size());
    control_.set_target(target_);
  }
  if (static_cast<int64_t>(keep.size()) > target_) keep.resize(static_cast<size_t>(target_));
  const int64_t missing = target_ - static_cast<int64_t>(keep.size());
  bool joined = false;
  if (missing > 0) {
    spawn_joiners(missing);
    const auto ready = ready_joiners();
    if (static_cast<int64_t>(ready.size()) < missing && !leaving) return;  // still warming up
    for (const auto& j : ready) {
      if (static_cast<int64_t>(keep.size()) < target_) {
        keep.push_back(j);
        joined = true;
      }
    }
  } else {
    unplaced_ = false;
  }
  if (keep == current_.members) return;
  if (keep.empty() || static_cast<int64_t>(keep.size()) < options_.limits.min_workers) {
    spdlog::error(
        "[elastic] workers are leaving and fewer than resources.min_workers = {} would "
        "remain; stopping with a checkpoint",
        options_.limits.min_workers);
    publish(current_.members, current_.members.front(), false, true);
    return;
  }
  // The donor must be a member of both generations; joiners have no state to give.
  const auto donor = std::find_if(keep.begin(), keep.end(),
                                  [&](const std::string& m) { return current_.rank_of(m) >= 0; });
  if (donor == keep.end()) return;
  const std::string donor_name = *donor;
  publish(std::move(keep), donor_name, joined, false);
}

}  // namespace vflow::job
