#include "vflow/job/generation_manager.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "vflow/core/error.h"
#include "vflow/core/exit_code.h"
#include "vflow/hetero/speed_plan.h"

namespace vflow::job {

GenerationManager::GenerationManager(ControlPlane& control, ElasticOptions options,
                                     std::function<std::string()> spawn)
    : control_(control), options_(options), spawn_(std::move(spawn)) {}

void GenerationManager::start(const std::vector<std::string>& members,
                              std::vector<int64_t> vnodes) {
  first_vnodes_ = std::move(vnodes);
  control_.publish_limits(options_.limits);
  target_ = static_cast<int64_t>(members.size());
  control_.set_target(target_);
  joiners_ = members;
}

void GenerationManager::on_exit(const std::string& member, int exit_code) {
  joiners_.erase(std::remove(joiners_.begin(), joiners_.end(), member), joiners_.end());
  // Status 0 is a worker that left or finished; 130 after a requested stop is a worker
  // that stopped as asked; anything else died.
  if (current_.rank_of(member) >= 0 && exit_code == kExitStopped && control_.stop_requested()) {
    spdlog::info("[elastic] worker {} of generation {} stopped as requested", member, current_.id);
    return;
  }
  if (current_.rank_of(member) >= 0 && exit_code != 0) {
    spdlog::warn("[elastic] worker {} of generation {} died (status {})", member, current_.id,
                 exit_code);
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
  if (!spawn_) return;
  while (static_cast<int64_t>(joiners_.size()) < wanted) joiners_.push_back(spawn_());
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
  if (next.vnodes.empty() && !first_vnodes_.empty() && next.members.size() > 1) {
    // A job that started with a planned split re-plans over the new members by the
    // per-vnode times they measured (joiners not yet measured count as the fastest).
    std::vector<double> times;
    for (const auto& m : next.members) times.push_back(control_.speed(m).value_or(0));
    next.vnodes = hetero::plan_by_speed(times, options_.limits.virtual_nodes);
  }
  for (const auto& m : next.members) {
    joiners_.erase(std::remove(joiners_.begin(), joiners_.end(), m), joiners_.end());
  }
  control_.publish(next);
  spdlog::info("[elastic] published {}", next.describe());
  current_ = next;
  established_ = false;
  failure_since_.reset();
  short_since_.reset();
}

void GenerationManager::tick() {
  if (current_.id == 0) {
    // The first generation: every initial worker has loaded its data and built its model.
    if (ready_joiners().size() == joiners_.size() && !joiners_.empty()) {
      // The planned split (if any) holds for the first generation.
      publish(joiners_, joiners_.front(), false, false, first_vnodes_);
    }
    return;
  }
  check_volunteers();
  // One round trip when nothing happened; waits with a deadline poll every time.
  const int64_t requests = control_.requests();
  const bool waiting = failure_since_ || short_since_ || !joiners_.empty();
  if (requests == seen_requests_ && !dirty_ && !waiting) return;
  seen_requests_ = requests;
  dirty_ = false;
  if (current_.stop || !control_.done().empty()) return;
  bool failed = control_.failure_reported(current_.id);
  for (const auto& m : current_.members) failed = failed || dead_.count(m) > 0;
  if (failed) {
    handle_failure();
  } else if (established()) {
    adopt_volunteers();
    handle_requests();
  }
}

void GenerationManager::adopt_volunteers() {
  for (const auto& v : control_.volunteers()) {
    if (!volunteers_.insert(v).second) continue;
    target_ = std::min(target_ + 1, options_.limits.max_workers);
    control_.set_target(target_);
    joiners_.push_back(v);
    spdlog::info("[elastic] worker {} (started outside the launcher) offers to join; target {}", v,
                 target_);
  }
}

void GenerationManager::check_volunteers() {
  if (volunteers_.empty() || Clock::now() - last_liveness_ < std::chrono::milliseconds(250)) {
    return;
  }
  last_liveness_ = Clock::now();
  // A finished job's workers end and revoke their leases: no failure.
  if (current_.stop || !control_.done().empty()) return;
  for (const auto& v : volunteers_) {
    const bool member = current_.rank_of(v) >= 0;
    const bool joining = std::find(joiners_.begin(), joiners_.end(), v) != joiners_.end();
    if ((member && dead_.count(v) == 0) || joining) {
      if (!control_.store().alive(ControlPlane::liveness_name(v))) {
        spdlog::warn("[elastic] worker {}'s liveness lease expired", v);
        if (joining && !member && target_ > static_cast<int64_t>(current_.members.size())) {
          --target_;
        }
        on_exit(v, kExitPeerFailure);
      }
    }
  }
}

void GenerationManager::handle_failure() {
  const auto now = Clock::now();
  if (!failure_since_) failure_since_ = now;
  // Wait until every member that is not known dead has reported, or the timeout passed.
  std::vector<std::string> alive;
  std::string donor;
  int64_t donor_step = -1;
  std::set<int64_t> steps;
  size_t expected = 0;
  for (const auto& m : current_.members) {
    if (dead_.count(m) == 0) ++expected;
    const auto step = control_.survivor_step(current_.id, m);
    if (!step) continue;
    alive.push_back(m);
    steps.insert(*step);
    if (*step > donor_step) {  // the member furthest ahead (first on ties)
      donor_step = *step;
      donor = m;
    }
  }
  if (alive.size() < expected && now - *failure_since_ < options_.timeout) return;
  if (!options_.replace_failed) target_ = std::max<int64_t>(1, static_cast<int64_t>(alive.size()));
  spawn_joiners(std::max<int64_t>(0, target_ - static_cast<int64_t>(alive.size())));
  // Survivors at one step hold the same state; otherwise the ones behind take the donor's.
  bool transfer = steps.size() > 1;
  // Joiners that are ready now come in; the rest join in a later generation.
  for (const auto& j : ready_joiners()) {
    if (static_cast<int64_t>(alive.size()) < target_) {
      alive.push_back(j);
      transfer = true;
    }
  }
  if (alive.empty()) {
    spdlog::error("[elastic] no worker of generation {} survived", current_.id);
    control_.mark_done("failed");
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
