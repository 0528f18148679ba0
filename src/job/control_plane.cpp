#include "vflow/job/control_plane.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <sstream>
#include <string_view>
#include <thread>

#include "job/control_records.h"
#include "vflow/core/exit_code.h"

namespace vflow::job {

namespace {

// Store keys of the protocol (docs/elasticity.md). Generation data lives under
// "elastic/<id>/", apart from "gen/<id>/", the communicator's own prefix.
const char* const kLimits = "job/limits";
const char* const kProfiled = "job/profiled";  // seconds per vnode by device type
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
const char* const kResizeHandled = "job/resize_handled";
const char* const kMemberCount = "job/members";
const char* const kResult = "job/result";
// A job on a cluster store: what its agents and successors read (JobRecord).
const char* const kRecord = "job/record";
const char* const kRecordSpec = "job/record/spec";
const char* const kRecordVersion = "job/record/version";
const char* const kRecordDirectory = "job/record/directory";
const char* const kCredentials = "job/credentials";
const std::string kJoiners = "elastic/joiners/";
const std::string kPlacement = "placement/";
const std::string kExits = "elastic/exits/";

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
  std::unique_ptr<ControlStore> store;
};

ControlPlane::ControlPlane(const std::string& host, int port, std::chrono::milliseconds timeout)
    : ControlPlane(connect_embedded_store(host, port, timeout)) {}

ControlPlane::ControlPlane(std::unique_ptr<ControlStore> store) : impl_(std::make_unique<Impl>()) {
  VFLOW_ASSERT(store != nullptr, "a control plane needs a store");
  impl_->store = std::move(store);
  address_ = impl_->store->address();
}

ControlPlane::~ControlPlane() = default;
ControlPlane::ControlPlane(ControlPlane&&) noexcept = default;

ControlPlane ControlPlane::on_cluster(const std::string& control, const std::string& job,
                                      std::chrono::milliseconds timeout) {
  return ControlPlane(connect_cluster_store(control, job, timeout));
}

const std::string& ControlPlane::address() const { return address_; }

ControlStore& ControlPlane::store() { return *impl_->store; }

std::optional<std::string> ControlPlane::get(const std::string& key) {
  return impl_->store->get(key);
}

void ControlPlane::set(const std::string& key, const std::string& value) {
  impl_->store->set(key, value);
}

std::string ControlPlane::compare_set(const std::string& key, const std::string& value) {
  return impl_->store->set_if_absent(key, value);
}

int64_t ControlPlane::add(const std::string& key, int64_t delta) {
  return impl_->store->add(key, delta);
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

int64_t ControlPlane::await_news(int64_t seen, std::chrono::milliseconds wait) {
  if (auto* cluster = dynamic_cast<ClusterStore*>(impl_->store.get())) {
    int64_t revision = 0;
    const auto found = cluster->scan(kNews, &revision);
    const auto it = found.find(kNews);
    const int64_t now = it == found.end() ? 0 : to_int(it->second, kNews);
    if (now != seen) return now;
    const auto changes = cluster->watch(kNews, revision, wait);
    return changes && changes->empty() ? now : news();
  }
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (true) {
    const int64_t now = news();
    const auto left = deadline - std::chrono::steady_clock::now();
    if (now != seen || left <= std::chrono::steady_clock::duration::zero()) return now;
    std::this_thread::sleep_for(
        std::min<std::chrono::steady_clock::duration>(left, std::chrono::milliseconds(10)));
  }
}
bool ControlPlane::leave_requested(const std::string& member) {
  return get("ctl/leave/" + member).has_value();
}

void ControlPlane::publish_limits(const JobLimits& l) { set(kLimits, records::encode_limits(l)); }

JobLimits ControlPlane::limits() {
  const auto text = get(kLimits);
  if (!text) {
    throw RequestRefused(
        fmt::format("{} is not the coordinator of an elastic vflow job", address()));
  }
  return records::decode_limits(*text, kLimits);
}

bool ControlPlane::has_limits() { return get(kLimits).has_value(); }

void ControlPlane::require_job(const std::string& name, const std::string& where) {
  if (!has_limits()) throw RequestRefused(fmt::format("no job named '{}' runs on {}", name, where));
}

std::pair<int64_t, int64_t> ControlPlane::resize_request() {
  const int64_t seq = add(kResizeSeq, 0);
  if (seq == 0) return {0, 0};
  return {seq, to_int(get(kResizeWorkers).value_or("0"), kResizeWorkers)};
}

Generation ControlPlane::publish(const Generation& g) {
  const auto record = records::encode_generation(g);
  const auto held = compare_set(generation_key(g.id), record);
  set(kLatest, std::to_string(g.id));
  add(kNews, 1);
  return held == record ? g : records::decode_generation(g.id, held, generation_key(g.id));
}

std::optional<Generation> ControlPlane::undeclared_generation() {
  const int64_t next = latest_generation() + 1;
  const auto text = get(generation_key(next));
  if (!text) return std::nullopt;
  return records::decode_generation(next, *text, generation_key(next));
}

void ControlPlane::set_target(int64_t workers) { set(kTarget, std::to_string(workers)); }
int64_t ControlPlane::target() { return to_int(get(kTarget).value_or("0"), kTarget); }

void ControlPlane::mark_resize_handled(int64_t sequence) {
  set(kResizeHandled, std::to_string(sequence));
}
int64_t ControlPlane::resize_handled() {
  return to_int(get(kResizeHandled).value_or("0"), kResizeHandled);
}

void ControlPlane::forget_generation(int64_t id) {
  impl_->store->remove_all(fmt::format("gen/{}/", id));
  impl_->store->remove_all(fmt::format("elastic/{}/", id));
}

void ControlPlane::publish_record(const JobRecord& r) {
  set(kRecordSpec, r.spec);
  set(kRecordVersion, r.version);
  set(kRecordDirectory, r.directory.empty() ? "/" : r.directory);
  set(kRecord, records::encode_job_record(r));
}

std::optional<JobRecord> ControlPlane::record() {
  const auto text = get(kRecord);
  if (!text) return std::nullopt;
  auto r = records::decode_job_record(*text, kRecord);
  r.spec = get(kRecordSpec).value_or("");
  r.version = get(kRecordVersion).value_or("");
  r.directory = get(kRecordDirectory).value_or("");
  return r;
}

void ControlPlane::publish_credentials(const JobCredentials& c) {
  set(kCredentials, c.user + "\n" + c.password);
}

std::optional<JobCredentials> ControlPlane::credentials() {
  const auto text = get(kCredentials);
  if (!text) return std::nullopt;
  const auto newline = text->find('\n');
  if (newline == std::string::npos || newline == 0) {
    throw Error(fmt::format("the job's key {} holds no user and password", kCredentials));
  }
  return JobCredentials{text->substr(0, newline), text->substr(newline + 1)};
}

std::string ControlPlane::next_member() { return std::to_string(add(kMemberCount, 1) - 1); }

void ControlPlane::add_joiner(const std::string& member) { set(kJoiners + member, "1"); }
void ControlPlane::remove_joiner(const std::string& member) {
  impl_->store->remove(kJoiners + member);
}
std::vector<std::string> ControlPlane::joiners() { return names_under(kJoiners); }

void ControlPlane::place(const std::string& member, const Placement& where) {
  set(kPlacement + member, fmt::format("{} {}", where.agent, where.slot));
}

std::optional<Placement> ControlPlane::placement(const std::string& member) {
  const auto text = get(kPlacement + member);
  if (!text) return std::nullopt;
  return records::decode_placement(*text, kPlacement + member);
}

void ControlPlane::report_exit(const std::string& member, const WorkerExit& exit) {
  set(kExits + member, records::encode_exit(exit));
  add(kRequests, 1);
}

std::map<std::string, WorkerExit> ControlPlane::exits() {
  std::map<std::string, WorkerExit> out;
  for (const auto& member : names_under(kExits)) {
    if (const auto text = get(kExits + member)) {
      out[member] = records::decode_exit(*text, kExits + member);
    }
  }
  return out;
}

void ControlPlane::adopt_volunteer(const std::string& member) {
  set("elastic/volunteers/" + member, "adopted");
}
bool ControlPlane::volunteer_adopted(const std::string& member) {
  return get("elastic/volunteers/" + member) == std::optional<std::string>("adopted");
}

void ControlPlane::publish_result(const std::string& text) { set(kResult, text); }
std::optional<std::string> ControlPlane::result() { return get(kResult); }

std::vector<std::string> ControlPlane::names_under(const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& key : impl_->store->list(prefix)) out.push_back(key.substr(prefix.size()));
  return out;
}

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
void ControlPlane::volunteer(const std::string& member) {
  set("elastic/volunteers/" + member, "1");
  add(kRequests, 1);
}
std::vector<std::string> ControlPlane::volunteers() { return names_under("elastic/volunteers/"); }
std::string ControlPlane::liveness_name(const std::string& member) { return "worker/" + member; }
std::optional<std::string> ControlPlane::spec() { return get("job/spec"); }
void ControlPlane::publish_spec(const std::string& semantic_yaml) {
  set("job/spec", semantic_yaml);
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
void ControlPlane::publish_step(int64_t step) {
  impl_->store->publish(kStep, std::to_string(step));
}

void ControlPlane::publish_speed(const std::string& member, const MeasuredSpeed& speed) {
  // Per vnode first: a coordinator of an earlier version reads that number alone.
  impl_->store->publish("speed/" + member, fmt::format("{:.9g} {:.9g}", speed.seconds_per_vnode,
                                                       speed.update_seconds));
}

std::optional<MeasuredSpeed> ControlPlane::speed(const std::string& member) {
  const auto text = get("speed/" + member);
  if (!text) return std::nullopt;
  std::istringstream in(*text);
  MeasuredSpeed speed;
  if (!(in >> speed.seconds_per_vnode)) return std::nullopt;  // not a worker's: ignore it
  if (!(in >> speed.update_seconds)) speed.update_seconds = 0;
  return speed;
}

void ControlPlane::publish_device_type(const std::string& member, const std::string& type) {
  set("type/" + member, type);
}

std::optional<std::string> ControlPlane::device_type(const std::string& member) {
  return get("type/" + member);
}

void ControlPlane::publish_profiled(const std::map<std::string, double>& seconds_per_vnode) {
  set(kProfiled, records::encode_profiled(seconds_per_vnode));
}

std::map<std::string, double> ControlPlane::profiled() {
  const auto text = get(kProfiled);
  return text ? records::decode_profiled(*text, kProfiled) : std::map<std::string, double>{};
}

std::string to_string(JobState state) {
  switch (state) {
    case JobState::kCompleted:
      return "completed";
    case JobState::kStopped:
      return "stopped";
    case JobState::kFailed:
      return "failed";
    case JobState::kRunning:
      break;
  }
  return "running";
}

void ControlPlane::mark_done(JobState state) {
  VFLOW_ASSERT(state != JobState::kRunning, "mark_done needs a finished state");
  set(kDone, to_string(state));
  add(kRequests, 1);
}

JobState ControlPlane::state() {
  const auto text = get(kDone);
  if (!text) return JobState::kRunning;
  for (const auto s : {JobState::kCompleted, JobState::kStopped, JobState::kFailed}) {
    if (*text == to_string(s)) return s;
  }
  throw Error(
      fmt::format("the job's store holds '{}' under {}, not a state a job ends in "
                  "(completed, stopped, failed)",
                  *text, kDone));
}

JobStatus ControlPlane::status() {
  JobStatus s;
  s.limits = limits();
  const int64_t latest = latest_generation();
  if (latest > 0) s.generation = generation(latest);
  s.step = to_int(get(kStep).value_or("0"), kStep);
  s.target = to_int(get(kTarget).value_or("0"), kTarget);
  s.state = state();
  for (const auto& m : s.generation.members) {
    if (const auto pid = get("member/" + m + "/pid")) s.pids[m] = to_int(*pid, "pid");
  }
  return s;
}

// ---- generation manager ------------------------------------------------------------

}  // namespace vflow::job
