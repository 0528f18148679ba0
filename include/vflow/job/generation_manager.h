// The generation manager: the coordinator's policy that decides generations from the
// requests, readiness reports and failures in the job's store (DESIGN.md §4).
#pragma once

#include <chrono>
#include <functional>
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
};

/// Decides generations (runs inside the coordinator). Not thread-safe: one thread calls
/// it, e.g. the launcher's loop every few milliseconds.
class GenerationManager {
 public:
  /// `spawn` starts a joining worker process and returns its member name; null when this
  /// coordinator cannot start processes (joiners then come from elsewhere).
  GenerationManager(ControlPlane& control, ElasticOptions options,
                    std::function<std::string()> spawn);

  /// The first generation's members, with `vnodes` per member for a planned split (empty:
  /// even); published once all of them are ready. Later generations split evenly, or,
  /// when the first was planned, by the members' measured speeds (hetero::plan_by_speed).
  void start(const std::vector<std::string>& members, std::vector<int64_t> vnodes = {});
  /// A member's process ended with `exit_code` (from a launcher that watches processes).
  void on_exit(const std::string& member, int exit_code);
  /// Publishes the next generation when one is due.
  void tick();
  const Generation& current() const { return current_; }
  /// Members that joined the job but are not in the current generation any more.
  bool is_member(const std::string& member) const { return current_.rank_of(member) >= 0; }

 private:
  using Clock = std::chrono::steady_clock;
  void handle_failure();
  /// Volunteers (workers started elsewhere) become joiners, each raising the target.
  void adopt_volunteers();
  /// Volunteers whose liveness lease expired count as exited (no launcher watches them).
  void check_volunteers();
  void handle_requests();
  std::vector<std::string> ready_joiners();
  void spawn_joiners(int64_t wanted);
  void publish(std::vector<std::string> members, std::string donor, bool transfer, bool stop,
               std::vector<int64_t> vnodes = {});
  bool established();

  ControlPlane& control_;
  ElasticOptions options_;
  std::function<std::string()> spawn_;
  Generation current_;
  bool established_ = false;
  int64_t target_ = 0;
  int64_t resize_seq_ = 0;
  std::set<std::string> dead_;
  std::vector<std::string> joiners_;  // started, not yet members, alive
  std::optional<Clock::time_point> failure_since_;
  std::optional<Clock::time_point> short_since_;  // waiting for joiners to reach min_workers
  std::vector<int64_t> first_vnodes_;
  int64_t seen_requests_ = -1;         // the request counter at the last tick
  bool dirty_ = false;                 // a member died since the last tick
  std::set<std::string> volunteers_;   // every volunteer seen (they are never reused)
  Clock::time_point last_liveness_{};  // when volunteers' liveness was last checked
};

}  // namespace vflow::job
