#include "job/coordination.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>
#include <sstream>

#include "job/control_records.h"
#include "vflow/core/error.h"
#include "vflow/job/build_identity.h"

namespace vflow::job {

namespace {

using Clock = std::chrono::steady_clock;
const char* const kCoordinator = "coordinator";

}  // namespace

bool device_suits(const std::string& slot, const std::string& job_device) {
  if (job_device.rfind("cuda", 0) == 0) return slot.rfind("cuda", 0) == 0;
  return slot == job_device;
}

std::chrono::milliseconds lease_ttl(std::chrono::milliseconds timeout) {
  return std::max<std::chrono::milliseconds>(std::chrono::seconds(3), timeout / 3);
}

// ---- the election --------------------------------------------------------------

CoordinatorCandidate::CoordinatorCandidate(const std::string& control, const std::string& job,
                                           std::string me, WorkerSource* source,
                                           std::chrono::milliseconds timeout, bool first)
    : control_url_(control),
      job_(job),
      me_(std::move(me)),
      source_(source),
      timeout_(timeout),
      ttl_(lease_ttl(timeout)),
      control_(connect_cluster_store(control, job, timeout)),
      claim_(connect_cluster_store(control, job, timeout)) {
  if (first) {
    const auto holder = claim_->campaign(kCoordinator, me_, ttl_);
    if (holder != me_) {
      throw RequestRefused(
          fmt::format("job '{}' on {} is coordinated by {} already", job_, control_url_, holder));
    }
    renewed_ = Clock::now();
    leading_ = true;
  }
  thread_ = std::make_unique<Periodic>([this] { campaign(); }, std::chrono::milliseconds(100),
                                       "coordinator election of job '" + job + "'");
}

CoordinatorCandidate::~CoordinatorCandidate() { retire(); }

void CoordinatorCandidate::retire() {
  thread_.reset();  // no campaign after this
  if (!leading_) return;
  leading_ = false;
  try {
    claim_->resign(kCoordinator);
  } catch (const std::exception& e) {
    spdlog::warn("[elastic] {} could not give up coordinating job '{}': {}", me_, job_, e.what());
  }
}

void CoordinatorCandidate::campaign() {
  const auto now = Clock::now();
  if (leading_) {
    if (now - renewed_ < ttl_ / 4) return;
    std::optional<bool> renewed;  // unknown while the store cannot answer
    try {
      renewed = claim_->renew(kCoordinator);
    } catch (const std::exception& e) {
      spdlog::warn("[elastic] {} could not renew its claim on job '{}': {}", me_, job_, e.what());
    }
    if (renewed == std::optional<bool>(true)) {
      renewed_ = now;
    } else if (renewed || now - renewed_ >= ttl_) {
      // Expired or gone, or unconfirmed for as long as it lives: another may hold it by now.
      leading_ = false;
      spdlog::warn("[elastic] {} lost its claim on coordinating job '{}'", me_, job_);
    }
    return;
  }
  // Only a job that is there is campaigned for (its keys may have gone meanwhile).
  if (claim_->holder(kCoordinator) || !claim_->get("job/record")) return;
  if (claim_->campaign(kCoordinator, me_, ttl_) == me_) {
    renewed_ = now;
    leading_ = true;
  }
}

void CoordinatorCandidate::start(const ElasticOptions& options,
                                 const std::vector<std::string>& members,
                                 const std::vector<int64_t>& vnodes) {
  if (!leading_ || manager_) {
    throw RequestRefused(
        fmt::format("job '{}' on {}: this submitter no longer holds the coordinator's "
                    "claim, or has started the job already",
                    job_, control_url_));
  }
  manager_ = std::make_unique<GenerationManager>(control_, options, source_);
  manager_->start(members, vnodes);
}

bool CoordinatorCandidate::tick() {
  if (!leading_) {
    if (manager_) {
      spdlog::warn("[elastic] {} no longer coordinates job '{}'", me_, job_);
      manager_.reset();
    }
    return false;
  }
  if (!manager_) {
    const auto record = control_.record();
    if (!record) return false;  // a job being submitted right now: its submitter starts it
    // An ended job has nothing to decide; one whose submitter died before it started (no
    // limits published) never will.
    if (control_.state() != JobState::kRunning) return true;
    if (!control_.has_limits()) {
      spdlog::error("[elastic] job '{}' was never started: its submitter is gone", job_);
      control_.mark_done(JobState::kFailed);
      return true;
    }
    ElasticOptions options;
    options.limits = control_.limits();
    options.timeout = record->timeout;
    options.replace_failed = record->replace_failed;
    options.cluster = true;
    spdlog::info("[elastic] {} coordinates job '{}' now", me_, job_);
    // Whole or not at all: a takeover that fails half-way (the store is struggling, which
    // is often why the coordinator changed) is tried again at the next tick.
    auto manager = std::make_unique<GenerationManager>(control_, options, source_);
    manager->resume();
    manager_ = std::move(manager);
  }
  manager_->tick();
  return true;
}

// ---- node agents' records -------------------------------------------------------

std::string agent_key(const std::string& agent) { return "agents/" + agent; }
std::string agent_slot_key(const std::string& agent, int64_t slot) {
  return fmt::format("agents/{}/slot/{}", agent, slot);
}
std::string agent_draining_key(const std::string& agent) { return "agents/" + agent + "/draining"; }
std::string agent_liveness(const std::string& agent) { return "agent/" + agent; }

std::string encode_agent(const AgentRecord& a) {
  std::string slots;
  for (const auto& s : a.slots) slots += (slots.empty() ? "" : ",") + s;
  return fmt::format("host {}\npid {}\nslots {}\nversion {}\n", a.host, a.pid, slots, a.version);
}

namespace {

AgentRecord decode_agent(const std::string& name, const std::string& text) {
  AgentRecord a;
  a.name = name;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const auto space = line.find(' ');
    const std::string field = line.substr(0, space);
    const std::string value = space == std::string::npos ? "" : line.substr(space + 1);
    if (field == "host") {
      a.host = value;
    } else if (field == "pid") {
      a.pid = records::decode_int(value, agent_key(name));
    } else if (field == "version") {
      a.version = value;
    } else if (field == "slots") {
      std::istringstream list(value);
      for (std::string slot; std::getline(list, slot, ',');) a.slots.push_back(slot);
    }
  }
  return a;
}

}  // namespace

int agent_slots(const std::string& control, const std::string& device,
                std::chrono::milliseconds timeout) {
  const auto root = connect_etcd_root(etcd_options(control, "job", timeout));
  int slots = 0;
  for (const auto& a : read_agents(*root)) {
    if (a.draining) continue;
    for (const auto& s : a.slots) slots += device_suits(s, device) ? 1 : 0;
  }
  return slots;
}

std::vector<AgentRecord> read_agents(ClusterStore& root) {
  const auto living = root.alive_names("agent/");
  const auto keys = root.scan("agents/");
  std::vector<AgentRecord> out;
  for (const auto& [key, value] : keys) {
    const std::string name = key.substr(std::string("agents/").size());
    if (name.find('/') != std::string::npos) continue;
    if (!std::binary_search(living.begin(), living.end(), agent_liveness(name))) continue;
    auto a = decode_agent(name, value);
    const std::string slots = agent_key(name) + "/slot/";
    for (auto it = keys.lower_bound(slots); it != keys.end() && it->first.rfind(slots, 0) == 0;
         ++it) {
      a.taken[records::decode_int(it->first.substr(slots.size()), it->first)] = it->second;
    }
    a.draining = keys.count(agent_draining_key(name)) != 0;
    out.push_back(std::move(a));
  }
  return out;
}

// ---- placement ---------------------------------------------------------------------

AgentPlacement::AgentPlacement(const std::string& control, ControlPlane& job,
                               const JobRecord& record, std::chrono::milliseconds timeout)
    : root_(connect_etcd_root(etcd_options(control, "job", timeout))),
      job_(job),
      device_(record.device),
      version_(record.version) {}

bool AgentPlacement::start(const std::string& member) {
  const auto agents = read_agents(*root_);
  // Slots this coordinator placed a worker on that its agent has not taken yet.
  std::set<std::string> pending;
  const auto exits = job_.exits();
  for (auto it = placed_.begin(); it != placed_.end();) {
    const bool ended = exits.count(it->first) != 0;
    bool taken = false;
    for (const auto& a : agents) {
      for (const auto& [slot, holder] : a.taken) {
        taken = taken || (fmt::format("{} {}", a.name, slot) == it->second &&
                          holder.substr(holder.find(' ') + 1) == it->first);
      }
    }
    if (ended || taken) {
      it = placed_.erase(it);
    } else {
      pending.insert(it->second);
      ++it;
    }
  }
  const AgentRecord* best = nullptr;
  int64_t best_slot = -1;
  size_t best_free = 0;
  for (const auto& a : agents) {
    if (a.draining || avoided_.count(a.name) != 0) continue;
    if (a.version != version_) {
      if (mismatched_.insert(a.name).second) {
        spdlog::warn("[elastic] agent {} on {} runs {}, the job {}: not used", a.name, a.host,
                     a.version, version_);
      }
      continue;
    }
    size_t free = 0;
    int64_t first = -1;
    for (int64_t s = 0; s < static_cast<int64_t>(a.slots.size()); ++s) {
      if (a.taken.count(s) != 0 || !device_suits(a.slots[static_cast<size_t>(s)], device_) ||
          pending.count(fmt::format("{} {}", a.name, s)) != 0) {
        continue;
      }
      ++free;
      if (first < 0) first = s;
    }
    if (free > best_free) {
      best = &a;
      best_slot = first;
      best_free = free;
    }
  }
  if (!best) return false;
  job_.place(member, Placement{best->name, best_slot});
  placed_[member] = fmt::format("{} {}", best->name, best_slot);
  spdlog::info("[elastic] worker {} placed on agent {} ({}), slot {}", member, best->name,
               best->host, best_slot);
  return true;
}

void AgentPlacement::failed_at_start(const std::string& member, const WorkerExit& exit) {
  const auto where = job_.placement(member);
  if (!where) return;
  if (avoided_.insert(where->agent).second) {
    spdlog::warn(
        "[elastic] agent {} is not used for this job any more: worker {} could not "
        "start there",
        where->agent, member);
  }
}

std::string AgentPlacement::describe() {
  std::string out;
  for (const auto& a : read_agents(*root_)) {
    int64_t free = 0;
    for (int64_t s = 0; s < static_cast<int64_t>(a.slots.size()); ++s) {
      free += a.taken.count(s) == 0 && device_suits(a.slots[static_cast<size_t>(s)], device_);
    }
    out += fmt::format("{}{} on {}: {} free {} slot(s) of {}{}", out.empty() ? "" : "; ", a.name,
                       a.host, free, device_, a.slots.size(),
                       a.version != version_ ? " (another build: " + a.version + ")" : "");
  }
  return out.empty() ? "no agent is registered" : out;
}

}  // namespace vflow::job
