#include "vflow/scheduler/simulator.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <queue>
#include <tuple>
#include <unordered_map>

#include "vflow/core/clock.h"
#include "vflow/core/error.h"

namespace vflow::scheduler {
namespace {

// At one instant, completions free devices before arrivals and rounds are seen; all are
// applied before the single reallocation of that instant. kDecision: the decision point a
// decision interval deferred changes to.
enum class EventKind { kCompletion = 0, kArrival = 1, kRound = 2, kDecision = 3 };

struct Event {
  double time;
  EventKind kind;
  int job;           // -1 for rounds and decisions
  uint32_t version;  // completions: valid only while it matches the job's version
};

struct Later {
  bool operator()(const Event& a, const Event& b) const {
    return std::tie(a.time, a.kind, a.job) > std::tie(b.time, b.kind, b.job);
  }
};

struct alignas(64) JobState {      // one cache line: a decision reads every active job's
  double remaining = 0;            // steps left at anchor_s
  double anchor_s = 0;             // time of the last change of (type, workers)
  double rate = 0;                 // steps/s while not paused
  double pause_until = 0;          // no progress before this time
  double held_s = 0;               // device-seconds held until anchor_s
  double fastest_demand_rate = 0;  // JobView::fastest_demand_rate
  int type = -1;
  int workers = 0;
  uint32_t version = 0;
  bool ever_ran = false;
  bool finished = false;
  bool spanning = false;  // on several device types: workers per type in Simulation::spans_
};
static_assert(sizeof(JobState) == 64);

class Simulation {
 public:
  Simulation(const Cluster& cluster, const Workload& workload, Policy& policy,
             const SimOptions& options)
      : cluster_(cluster), workload_(workload), policy_(policy), options_(options) {
    state_.resize(workload.jobs.size());
    result_.policy = policy.name();
    result_.total_devices = cluster.total_devices();
    result_.jobs.reserve(workload.jobs.size());
    for (const auto& job : workload.jobs) {
      result_.jobs.push_back(job_result_for(job));
      state_[job.id].remaining = job.total_work;
      double& fastest = state_[job.id].fastest_demand_rate;
      for (int t = 0; t < cluster.num_types(); ++t)
        fastest = std::max(fastest, job.rate(t, job.demand));
    }
    if (policy.round_s() > 0 && !workload.jobs.empty()) {
      events_.push({workload.jobs.front().arrival_s + policy.round_s(), EventKind::kRound, -1, 0});
    }
  }

  SimResult run() {
    start_ = std::chrono::steady_clock::now();
    while (const Event* first = peek()) {
      const double now = first->time;
      bool changed = false;
      for (const Event* e = first; e != nullptr && e->time == now; e = peek()) {
        const Event event = *e;
        pop(e);
        changed |= handle(event, now);
      }
      if (changed) decide(now);
    }
    if (finished_ != static_cast<int>(workload_.jobs.size())) {
      throw InternalError(fmt::format("simulation stalled: policy {} left {} jobs unfinished",
                                      policy_.name(), workload_.jobs.size() - finished_));
    }
    result_.wall_s = seconds_since(start_);
    return std::move(result_);
  }

 private:
  // The next event in (time, kind, job) order, nullptr when none is left. Arrivals come
  // from the workload, in its order (by time, then id), not through the queue, which holds
  // only what the run creates.
  const Event* peek() {
    if (next_arrival_ < workload_.jobs.size()) {
      const Job& job = workload_.jobs[next_arrival_];
      arrival_ = {job.arrival_s, EventKind::kArrival, job.id, 0};
      if (events_.empty() || Later()(events_.top(), arrival_)) return &arrival_;
    }
    return events_.empty() ? nullptr : &events_.top();
  }
  void pop(const Event* e) {
    if (e == &arrival_) {
      ++next_arrival_;
    } else {
      events_.pop();
    }
  }

  bool handle(const Event& e, double now) {
    ++result_.events;
    switch (e.kind) {
      case EventKind::kArrival:
        active_.push_back(e.job);  // arrival order == id order
        return true;
      case EventKind::kCompletion:
        if (e.version != state_[e.job].version) return false;
        finish(e.job, now);
        return true;
      case EventKind::kRound:
        if (finished_ < static_cast<int>(workload_.jobs.size())) {
          events_.push({now + policy_.round_s(), EventKind::kRound, -1, 0});
        }
        return !active_.empty();
      case EventKind::kDecision:
        decision_pending_ = false;
        return true;
    }
    return false;
  }

  // Reallocates now, or with a decision interval at the next multiple of it (once for all
  // the changes until then).
  void decide(double now) {
    const double interval = options_.decision_interval_s;
    if (interval <= 0) return reallocate(now);
    if (decision_pending_) return;
    const double at = std::ceil(now / interval) * interval;
    if (at <= now) return reallocate(now);
    events_.push({at, EventKind::kDecision, -1, 0});
    decision_pending_ = true;
  }

  double productive_s(const JobState& s, double now) const {
    return std::max(0.0, now - std::max(s.anchor_s, s.pause_until));
  }

  void advance(int id, double now) {
    JobState& s = state_[id];
    const double work = s.rate * productive_s(s, now);
    s.remaining -= work;
    result_.jobs[id].work_done += work;
    s.held_s += s.workers * (now - s.anchor_s);
    if (s.spanning) result_.jobs[id].spanned_s += now - s.anchor_s;
    s.anchor_s = now;
  }

  void finish(int id, double now) {
    advance(id, now);
    JobState& s = state_[id];
    const double total = workload_.jobs[id].total_work;
    if (std::abs(s.remaining) > 1e-6 * total) {
      throw InternalError(
          fmt::format("job {} completed with {} of {} steps left", id, s.remaining, total));
    }
    result_.jobs[id].work_done += s.remaining;  // rounding residue only
    s.remaining = 0;
    s.finished = true;
    result_.jobs[id].finish_s = now;
    result_.jobs[id].device_seconds = s.held_s;
    allocated_ -= s.workers;
    s.workers = 0;
    s.type = -1;
    if (s.spanning) spans_.erase(id), s.spanning = false;
    ++s.version;
    active_.erase(std::lower_bound(active_.begin(), active_.end(), id));
    ++finished_;
    report_progress(now);
  }

  void report_progress(double now) {
    const int total = static_cast<int>(workload_.jobs.size());
    if (!options_.on_progress || finished_ % std::max(1, total / 100) != 0) return;
    options_.on_progress({finished_, total, now, seconds_since(start_), active_.size()});
  }

  void reallocate(double now) {
    views_.resize(active_.size());
    constexpr size_t kAhead = 8;  // active jobs lie far apart in state_: fetch ahead
    for (size_t n = 0; n < active_.size(); ++n) {
      if (n + kAhead < active_.size()) __builtin_prefetch(&state_[active_[n + kAhead]]);
      const int id = active_[n];
      const JobState& s = state_[id];
      JobView& v = views_[n];  // field by field: a whole view built aside and copied in
                               // costs more than the rest of this loop
      v.job = &workload_.jobs[id];
      v.remaining_work = s.remaining - s.rate * productive_s(s, now);
      v.attained_service = s.held_s + s.workers * (now - s.anchor_s);
      v.device_type = s.type;
      v.workers = s.workers;
      v.counts = s.spanning ? spans_.at(id).data() : nullptr;
      v.restart_s = -1;
      v.fastest_demand_rate = s.fastest_demand_rate;
    }
    const Allocation allocation = policy_.allocate(cluster_, views_, now);
    ++result_.allocations;
    check_and_list_changes(allocation);
    const auto& spans = allocation.spans;
    for (const Change& c : changes_) {
      if (c.span_begin == c.span_end) {
        apply(c.id, c.type, c.workers, nullptr, now);
        continue;
      }
      const int workers = span_counts(c.type, c.workers, spans, c.span_begin, c.span_end);
      apply(c.id, c.type, workers, &counts_, now);
    }
    record(now);
  }

  // Workers per type, into counts_, of `workers` of `type` and the job's other types
  // spans[begin, end); returns their sum.
  int span_counts(int type, int workers, const std::vector<Assignment>& spans, size_t begin,
                  size_t end) {
    counts_.assign(cluster_.num_types(), 0);
    counts_[type] = workers;
    for (size_t m = begin; m < end; ++m) {
      counts_[spans[m].device_type] = spans[m].workers;
      workers += spans[m].workers;
    }
    return workers;
  }

  // `counts`: workers per type when the job runs on several, else nullptr.
  void apply(int id, int type, int workers, const std::vector<int>* counts, double now) {
    advance(id, now);
    JobState& s = state_[id];
    JobResult& r = result_.jobs[id];
    if (s.workers > 0 && workers > 0) {
      // A job keeps running where it already had workers: a resize, also when the type of
      // its assignment becomes one it spanned; else it restarts on another type.
      const bool stays = type == s.type || (s.spanning && spans_.at(id)[type] > 0);
      ++(stays ? r.resizes : r.migrations);
      // A resize within a pause comes after it: a job still restarting or resizing does not
      // get its pause shortened to a resize's.
      s.pause_until =
          stays ? std::max(s.pause_until, now) + options_.resize_pause_s : now + options_.restart_s;
    } else if (workers > 0) {
      s.pause_until = now + (s.ever_ran ? options_.restart_s : options_.startup_s);
      if (!s.ever_ran) r.start_s = now;
      s.ever_ran = true;
    } else {
      ++r.preemptions;
    }
    allocated_ += workers - s.workers;
    s.type = workers > 0 ? type : -1;
    s.workers = workers;
    const Job& job = workload_.jobs[id];
    if (counts != nullptr) {
      spans_[id] = *counts;
      s.spanning = true;
      s.rate = job.mixed_rate(counts->data(), cluster_.num_types());
    } else {
      if (s.spanning) spans_.erase(id), s.spanning = false;
      s.rate = workers > 0 ? job.rate(type, workers) : 0;
    }
    ++s.version;
    if (workers > 0) {
      const double done_at = std::max(now, s.pause_until) + s.remaining / s.rate;
      events_.push({done_at, EventKind::kCompletion, id, s.version});
    }
  }

  // Validates the allocation against the active jobs (ascending ids; views_ in the same
  // order) and lists in changes_ the jobs whose (type, workers) or spans it changes: one walk
  // of both, so that nothing is applied from an allocation that breaks a rule.
  void check_and_list_changes(const Allocation& allocation) {
    changes_.clear();
    used_.assign(cluster_.num_types(), 0);
    const auto& as = allocation.assignments;
    const auto& spans = allocation.spans;
    const bool elastic = policy_.elastic();
    if (!spans.empty() && !elastic) fail("a non-elastic policy spans device types");
    const int n_types = cluster_.num_types();
    const auto valid_type = [n_types](int t) { return t >= 0 && t < n_types; };
    size_t n = 0, k = 0, m = 0;
    for (; n < active_.size() && k < as.size(); ++n) {
      const int id = active_[n];
      const Assignment& a = as[k];
      if (a.job_id < id) fail(fmt::format("job {} is not active or out of order", a.job_id));
      const JobView& view = views_[n];
      if (a.job_id > id) {  // no workers
        if (view.workers > 0 || view.counts != nullptr) changes_.push_back({id, -1, 0, m, m});
        continue;
      }
      ++k;
      const bool spanned = m < spans.size();  // spans left to match
      if (spanned && spans[m].job_id < a.job_id) {
        fail(fmt::format("job {} spans types without an assignment", spans[m].job_id));
      }
      if (!valid_type(a.device_type) || a.workers < 1) {
        fail(fmt::format("job {} gets {} workers of type {}", a.job_id, a.workers, a.device_type));
      }
      used_[a.device_type] += a.workers;
      int total = a.workers;
      const size_t first_span = m;
      for (int last = -1; spanned && m < spans.size() && spans[m].job_id == a.job_id; ++m) {
        const Assignment& extra = spans[m];
        if (!valid_type(extra.device_type) || extra.device_type == a.device_type ||
            extra.workers < 1 || extra.device_type <= last) {
          fail(fmt::format("job {} spans with {} workers of type {}", a.job_id, extra.workers,
                           extra.device_type));
        }
        last = extra.device_type;
        used_[extra.device_type] += extra.workers;
        total += extra.workers;
      }
      const Job& job = *view.job;
      const bool spans_ok = total == a.workers || total <= job.vnodes;  // a worker per vnode
      const bool bounds_ok = elastic
                                 ? total >= job.min_workers && total <= job.max_workers && spans_ok
                                 : total == job.demand;
      if (!bounds_ok) {
        fail(fmt::format("job {} gets {} workers in all (bounds {}..{}, demand {}, vnodes {})",
                         a.job_id, total, job.min_workers, job.max_workers, job.demand,
                         job.vnodes));
      }
      if (m > first_span) {  // on several types
        span_counts(a.device_type, a.workers, spans, first_span, m);
        const JobState& s = state_[id];
        if (a.device_type != s.type || !s.spanning || spans_.at(id) != counts_) {
          changes_.push_back({id, a.device_type, a.workers, first_span, m});
        }
      } else if (a.device_type != view.device_type || a.workers != view.workers ||
                 view.counts != nullptr) {
        changes_.push_back({id, a.device_type, a.workers, m, m});
      }
    }
    if (k < as.size()) fail(fmt::format("job {} is not active or out of order", as[k].job_id));
    if (m != spans.size()) {
      fail(fmt::format("job {} spans types without an assignment", spans[m].job_id));
    }
    for (; n < active_.size(); ++n) {  // after the last assignment: no workers
      const JobView& view = views_[n];
      if (view.workers > 0 || view.counts != nullptr) changes_.push_back({active_[n], -1, 0, m, m});
    }
    for (int t = 0; t < cluster_.num_types(); ++t) {
      if (used_[t] > cluster_.type(t).count) {
        fail(fmt::format("type {} over capacity ({} > {})", cluster_.type(t).name, used_[t],
                         cluster_.type(t).count));
      }
    }
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw InternalError(
        fmt::format("policy {} returned a bad allocation: {}", policy_.name(), what));
  }

  void record(double now) {
    if (!options_.record_timeline) return;
    auto& timeline = result_.timeline;
    if (!timeline.empty() && timeline.back().allocated == allocated_) return;
    if (!timeline.empty() && timeline.back().time_s == now) {
      timeline.back().allocated = allocated_;
    } else {
      timeline.push_back({now, allocated_});
    }
  }

  const Cluster& cluster_;
  const Workload& workload_;
  Policy& policy_;
  const SimOptions& options_;
  std::vector<JobState> state_;
  std::priority_queue<Event, std::vector<Event>, Later> events_;  // all but arrivals
  size_t next_arrival_ = 0;  // the workload's next job to arrive
  Event arrival_{};          // peek()'s, for that job
  std::vector<int> active_;  // arrived, unfinished job ids, ascending
  std::vector<JobView> views_;
  std::unordered_map<int, std::vector<int>> spans_;  // workers per type of jobs on several
  std::vector<int> counts_;                          // span_counts()'s
  struct Change {  // a job whose allocation changes, spans[span_begin, span_end) its others
    int id, type, workers;
    size_t span_begin, span_end;
  };
  // check_and_list_changes()'s: the jobs this reallocation changes; workers per type.
  std::vector<Change> changes_;
  std::vector<int> used_;
  int allocated_ = 0;
  int finished_ = 0;
  bool decision_pending_ = false;
  std::chrono::steady_clock::time_point start_;
  SimResult result_;
};

}  // namespace

JobResult job_result_for(const Job& job) {
  JobResult r;
  r.id = job.id;
  r.model = job.model;
  r.weight = job.weight;
  r.demand = job.demand;
  r.arrival_s = job.arrival_s;
  r.total_work = job.total_work;
  return r;
}

SimResult simulate(const Cluster& cluster, const Workload& workload, Policy& policy,
                   const SimOptions& options) {
  for (size_t i = 0; i < workload.jobs.size(); ++i) {
    const Job& job = workload.jobs[i];
    if (job.id != static_cast<int>(i) || !job.throughput ||
        job.throughput->size() != size_t(cluster.num_types()) ||
        (i > 0 && job.arrival_s < workload.jobs[i - 1].arrival_s)) {
      throw InternalError("simulate: the workload is not bound to this cluster (bind_workload)");
    }
  }
  return Simulation(cluster, workload, policy, options).run();
}

}  // namespace vflow::scheduler
