// The generation manager: the coordinator's policy that decides generations from the
// requests, readiness reports and failures in the job's store (docs/design.md §4).
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "vflow/job/control_plane.h"

namespace vflow::job {

/// Options of the generation manager.
struct ElasticOptions {
  JobLimits limits;
  std::chrono::milliseconds timeout{30000};  ///< how long survivors and joiners are awaited
  bool replace_failed = false;               ///< start a joiner for each failed worker
  /// The job's store is a cluster's, and the coordinator may change: everything this
  /// manager decides by is kept in the store (a successor resumes from it), workers are
  /// watched through their liveness leases, and their exits are read from the store
  /// (ControlPlane::report_exit) where node agents report them.
  bool cluster = false;
  /// Seconds per vnode by device type, from the job's profiles (resources.profiles): the
  /// time a member not yet measured is planned with.
  std::map<std::string, double> profiled;
};

/// Starts the workers a generation manager asks for: as children of the launcher, or on
/// the slots of node agents.
class WorkerSource {
 public:
  virtual ~WorkerSource() = default;
  /// Starts (or places) worker `member`; false when it cannot now (no free slot: the
  /// manager asks again a little later).
  virtual bool start(const std::string& member) = 0;
  /// Worker `member` ended before it was ever ready (e.g. its host lacks the data), with
  /// `exit`: a source that places workers avoids that place for this job.
  virtual void failed_at_start(const std::string& member, const WorkerExit& exit) {}
};

/// Decides generations (runs inside the coordinator). Not thread-safe: one thread calls
/// it, e.g. the launcher's loop every few milliseconds.
class GenerationManager {
 public:
  /// `source` starts joiners (a resize, a replacement); null when this coordinator cannot
  /// start workers (joiners then come from elsewhere). It must outlive the manager.
  GenerationManager(ControlPlane& control, ElasticOptions options, WorkerSource* source);

  /// The first generation's members, with `vnodes` per member for a planned split (empty:
  /// even); published once all of them are ready. Later generations of several members
  /// split the vnodes by the members' speeds (hetero::plan_by_speed): measured, else their
  /// device type's profiled time, else (nothing known of any) evenly.
  void start(const std::vector<std::string>& members, std::vector<int64_t> vnodes = {});
  /// Takes over a job on a cluster store whose coordinator is gone, from what it left in
  /// the store: the current generation, the target, the joiners, the requests handled,
  /// the profiled times.
  void resume();
  /// A member's process ended with `exit_code` (from a launcher that watches processes).
  void on_exit(const std::string& member, int exit_code);
  /// Publishes the next generation when one is due.
  void tick();
  const Generation& current() const { return current_; }

 private:
  using Clock = std::chrono::steady_clock;
  /// Vnodes per member by their speeds (see start); empty: an even split.
  std::vector<int64_t> plan(const std::vector<std::string>& members);
  void handle_failure();
  /// Volunteers (workers started elsewhere) become joiners, each raising the target.
  void adopt_volunteers();
  /// Cluster stores: workers whose liveness lease expired count as exited (a lost host,
  /// a killed agent, a volunteer no launcher watches), and so do placed joiners that never
  /// came alive within the timeout.
  void check_liveness();
  /// Cluster stores: the exits node agents reported.
  void read_exits();
  void handle_requests();
  std::vector<std::string> ready_joiners();
  void spawn_joiners(int64_t wanted);
  void add_joiner(const std::string& member);
  void drop_joiner(const std::string& member);
  void publish(std::vector<std::string> members, std::string donor, bool transfer, bool stop,
               std::vector<int64_t> vnodes = {});
  /// Makes `published` the current generation (this manager's, or one decided before it).
  void adopt(const Generation& published);
  /// Cluster stores: joiners recorded by another coordinator (one that lost its claim
  /// while it placed them) become this one's.
  void adopt_recorded_joiners();
  bool established();
  /// A first-generation worker that cannot start fails the job on a cluster store (its
  /// submitter may be on another host): the job is marked failed, naming it.
  void fail_start(const std::string& member, int exit_code);

  ControlPlane& control_;
  ElasticOptions options_;
  WorkerSource* source_;
  Generation current_;
  bool established_ = false;
  int64_t target_ = 0;
  int64_t resize_seq_ = 0;
  std::set<std::string> dead_;
  std::vector<std::string> joiners_;  // started, not yet members, alive
  std::map<std::string, Clock::time_point> joiner_since_;
  std::set<std::string> seen_alive_;     // cluster: workers whose lease was seen
  std::set<std::string> exited_;         // exits already handled
  std::set<std::string> lost_by_lease_;  // counted as exited because their lease lapsed
  std::optional<Clock::time_point> failure_since_;
  std::optional<Clock::time_point> short_since_;  // waiting for joiners to reach min_workers
  std::vector<int64_t> first_vnodes_;
  int64_t seen_requests_ = -1;         // the request counter at the last tick
  bool dirty_ = false;                 // a member died since the last tick
  bool unplaced_ = false;              // a joiner could not be started: try again
  Clock::time_point next_spawn_{};     // not before (no free slot a moment ago)
  std::set<std::string> volunteers_;   // every volunteer seen (they are never reused)
  Clock::time_point last_liveness_{};  // when liveness was last checked
  int64_t forgotten_ = 0;              // generations up to this one were forgotten
};

}  // namespace vflow::job
