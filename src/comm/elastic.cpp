#include "vflow/comm/elastic.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <sstream>
#include <string_view>
#include <thread>

#include "comm/control_records.h"
#include "comm/store.h"
#include "vflow/comm/communicator.h"
#include "vflow/core/exit_code.h"

namespace vflow::comm {

namespace {

// Store keys of the protocol (docs/elasticity.md). Generation data lives under
// "elastic/<id>/", apart from "gen/<id>/", the communicator's own prefix.
const char* const kLimits = "job/limits";
const char* const kTarget = "job/target";
const char* const kStep = "job/step";
const char* const kDone = "job/done";
const char* const kStop = "ctl/stop";
const char* const kResizeSeq = "ctl/resize_seq";
const char* const kResizeWorkers = "ctl/resize_workers";
const char* const kLatest = "elastic/latest";
// Counters that let pollers skip work when nothing changed: kRequests counts what the
// coordinator reacts to, kNews what rank 0 relays to the workers (generations, stop).
const char* const kRequests = "ctl/requests";
const char* const kNews = "elastic/news";

std::string generation_key(int64_t id) { return fmt::format("elastic/{}/generation", id); }
std::string member_key(int64_t id, const char* what, const std::string& member) {
  return fmt::format("elastic/{}/{}/{}", id, what, member);
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ",") + item;
  return out;
}

int64_t to_int(const std::string& text, const std::string& key) {
  return records::decode_int(text, key);
}

}  // namespace

int Generation::rank_of(const std::string& member) const {
  const auto it = std::find(members.begin(), members.end(), member);
  return it == members.end() ? -1 : static_cast<int>(it - members.begin());
}

std::string Generation::describe() const {
  std::vector<std::string> counts;
  for (const int64_t c : vnodes) counts.push_back(std::to_string(c));
  return fmt::format("generation {}: {} worker(s) [{}]{}{}{}", id, members.size(), join(members),
                     counts.empty() ? "" : fmt::format(" holding [{}] vnodes", join(counts)),
                     transfer_state ? fmt::format(", state from {}", donor) : "",
                     stop ? ", stopping" : "");
}

// ---- control plane -------------------------------------------------------------

struct ControlPlane::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

ControlPlane::ControlPlane(const std::string& host, int port, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()), host_(host), port_(port) {
  try {
    impl_->store = open_store(host, port, timeout, /*server=*/false);
  } catch (const std::exception& e) {
    throw PeerFailure(fmt::format("[elastic] cannot reach the job's coordinator at {}:{}: {}", host,
                                  port, e.what()));
  }
}

ControlPlane::~ControlPlane() = default;

template <typename F>
auto guarded(const std::string& host, int port, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const vflow::Error&) {
    throw;
  } catch (const std::exception& e) {
    const std::string what = e.what();
    throw PeerFailure(fmt::format("[elastic] lost the job's coordinator at {}:{}: {}", host, port,
                                  what.substr(0, what.find('\n'))));
  }
}

std::optional<std::string> ControlPlane::get(const std::string& key) {
  return guarded(host_, port_, [&]() -> std::optional<std::string> {
    if (!impl_->store->check({key})) return std::nullopt;
    const auto bytes = impl_->store->get(key);
    return std::string(bytes.begin(), bytes.end());
  });
}

void ControlPlane::set(const std::string& key, const std::string& value) {
  guarded(host_, port_,
          [&] { impl_->store->set(key, std::vector<uint8_t>(value.begin(), value.end())); });
}

std::string ControlPlane::compare_set(const std::string& key, const std::string& value) {
  return guarded(host_, port_, [&] {
    const auto stored = impl_->store->compareSet(key, std::vector<uint8_t>(),
                                                 std::vector<uint8_t>(value.begin(), value.end()));
    return std::string(stored.begin(), stored.end());
  });
}

int64_t ControlPlane::add(const std::string& key, int64_t delta) {
  return guarded(host_, port_, [&] { return impl_->store->add(key, delta); });
}

void ControlPlane::request_resize(int64_t workers) {
  const auto l = limits();
  if (workers < l.min_workers || workers > l.max_workers) {
    throw RequestRefused(
        fmt::format("cannot resize to {} workers: this job allows {} to {} (resources.min_workers, "
                    "resources.max_workers; at most its {} virtual nodes)",
                    workers, l.min_workers, l.max_workers, l.virtual_nodes));
  }
  set(kResizeWorkers, std::to_string(workers));
  add(kResizeSeq, 1);
  add(kRequests, 1);
}

void ControlPlane::request_stop() {
  limits();  // refused unless this is an elastic job's coordinator
  set(kStop, "1");
  add(kNews, 1);
}
bool ControlPlane::stop_requested() { return get(kStop).has_value(); }
void ControlPlane::request_leave(const std::string& member) {
  set("ctl/leave/" + member, "1");
  add(kRequests, 1);
}
int64_t ControlPlane::requests() { return add(kRequests, 0); }
int64_t ControlPlane::news() { return add(kNews, 0); }
bool ControlPlane::leave_requested(const std::string& member) {
  return get("ctl/leave/" + member).has_value();
}

void ControlPlane::publish_limits(const JobLimits& l) { set(kLimits, records::encode_limits(l)); }

JobLimits ControlPlane::limits() {
  const auto text = get(kLimits);
  if (!text) {
    throw RequestRefused(
        fmt::format("{}:{} is not the coordinator of an elastic vflow job", host_, port_));
  }
  return records::decode_limits(*text, kLimits);
}

std::pair<int64_t, int64_t> ControlPlane::resize_request() {
  const int64_t seq = add(kResizeSeq, 0);
  if (seq == 0) return {0, 0};
  return {seq, to_int(get(kResizeWorkers).value_or("0"), kResizeWorkers)};
}

void ControlPlane::publish(const Generation& g) {
  set(generation_key(g.id), records::encode_generation(g));
  set(kLatest, std::to_string(g.id));
  add(kNews, 1);
}

void ControlPlane::set_target(int64_t workers) { set(kTarget, std::to_string(workers)); }

int64_t ControlPlane::latest_generation() {
  const auto text = get(kLatest);
  return text ? to_int(*text, kLatest) : 0;
}

Generation ControlPlane::generation(int64_t id) {
  const auto text = get(generation_key(id));
  if (!text) throw Error(fmt::format("[elastic] generation {} was never published", id));
  return records::decode_generation(id, *text, generation_key(id));
}

void ControlPlane::mark_ready(const std::string& member, int64_t pid) {
  set("member/" + member + "/pid", std::to_string(pid));
  add(kRequests, 1);
}
bool ControlPlane::ready(const std::string& member) {
  return get("member/" + member + "/pid").has_value();
}
void ControlPlane::mark_joined(int64_t generation, const std::string& member) {
  set(member_key(generation, "joined", member), "1");
  add(kRequests, 1);
}
bool ControlPlane::joined(int64_t generation, const std::string& member) {
  return get(member_key(generation, "joined", member)).has_value();
}
void ControlPlane::report_survivor(int64_t generation, const std::string& member, int64_t step) {
  set(member_key(generation, "alive", member), std::to_string(step));
  add(fmt::format("elastic/{}/failed", generation), 1);
  add(kRequests, 1);
}
RegroupAnswer ControlPlane::agree_regroup(int64_t generation,
                                          const std::vector<std::string>& members,
                                          const std::string& me, const RegroupOffer& offer,
                                          std::chrono::milliseconds timeout) {
  set(member_key(generation, "offer", me), records::encode_offer(offer));
  // The first member that knows the answer (every offer read, or its deadline passed)
  // settles it once with compare-and-set; every member follows the settled answer, so a
  // member that gave up waiting cannot leave the others regrouping without it.
  const auto settled_key = fmt::format("elastic/{}/regroup", generation);
  constexpr std::string_view kMissing = "missing ";
  auto follow = [&](const std::string& settled) {
    if (settled.rfind(kMissing, 0) == 0) {
      throw PeerFailure(fmt::format(
          "[elastic] generation {}: member {} did not say how it makes the communicator "
          "within {} s",
          generation, settled.substr(kMissing.size()),
          std::chrono::duration<double>(timeout).count()));
    }
    return records::decode_regroup_answer(settled, settled_key);
  };
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<std::string> offers;
  for (const auto& member : members) {
    const auto key = member_key(generation, "offer", member);
    auto text = get(key);
    while (!text) {
      if (const auto settled = get(settled_key)) return follow(*settled);
      if (std::chrono::steady_clock::now() > deadline) {
        return follow(compare_set(settled_key, std::string(kMissing) + member));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      text = get(key);
    }
    offers.push_back(*text);
  }
  return follow(compare_set(settled_key, records::regroup_answer(offers)));
}

std::optional<int64_t> ControlPlane::survivor_step(int64_t generation, const std::string& member) {
  const auto key = member_key(generation, "alive", member);
  const auto text = get(key);
  if (!text) return std::nullopt;
  return to_int(*text, key);
}
bool ControlPlane::failure_reported(int64_t generation) {
  return add(fmt::format("elastic/{}/failed", generation), 0) > 0;
}
void ControlPlane::publish_step(int64_t step) { set(kStep, std::to_string(step)); }

void ControlPlane::publish_speed(const std::string& member, double seconds_per_vnode) {
  set("speed/" + member, fmt::format("{:.9g}", seconds_per_vnode));
}

std::optional<double> ControlPlane::speed(const std::string& member) {
  const auto text = get("speed/" + member);
  if (!text) return std::nullopt;
  try {
    return std::stod(*text);
  } catch (const std::exception&) {
    return std::nullopt;  // not written by a worker of this version: ignore it
  }
}

std::vector<int64_t> plan_by_speed(const std::vector<double>& seconds_per_vnode,
                                   int64_t virtual_nodes) {
  std::vector<double> known;
  for (const double t : seconds_per_vnode) {
    if (t > 0) known.push_back(t);
  }
  const auto members = static_cast<int64_t>(seconds_per_vnode.size());
  if (known.empty() || members == 0 || virtual_nodes < members) return {};
  // Joiners start like the launcher's other workers, without limits: count them as fast
  // as the fastest measured member until they are measured themselves.
  const double fastest = *std::min_element(known.begin(), known.end());
  std::vector<double> t;
  for (const double v : seconds_per_vnode) t.push_back(v > 0 ? v : fastest);
  std::vector<int64_t> counts(static_cast<size_t>(members), 1);
  for (int64_t given = members; given < virtual_nodes; ++given) {
    size_t best = 0;
    for (size_t m = 1; m < counts.size(); ++m) {
      if (static_cast<double>(counts[m] + 1) * t[m] <
          static_cast<double>(counts[best] + 1) * t[best]) {
        best = m;
      }
    }
    ++counts[best];
  }
  return counts;
}
void ControlPlane::mark_done(const std::string& state) {
  set(kDone, state);
  add(kRequests, 1);
}
std::string ControlPlane::done() { return get(kDone).value_or(""); }

JobStatus ControlPlane::status() {
  JobStatus s;
  s.limits = limits();
  const int64_t latest = latest_generation();
  if (latest > 0) s.generation = generation(latest);
  s.step = to_int(get(kStep).value_or("0"), kStep);
  s.target = to_int(get(kTarget).value_or("0"), kTarget);
  const auto done_state = done();
  s.state = done_state.empty() ? "running" : done_state;
  for (const auto& m : s.generation.members) {
    if (const auto pid = get("member/" + m + "/pid")) s.pids[m] = to_int(*pid, "pid");
  }
  return s;
}

// ---- generation manager ------------------------------------------------------------

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
    next.vnodes = plan_by_speed(times, options_.limits.virtual_nodes);
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
    handle_requests();
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

}  // namespace vflow::comm
