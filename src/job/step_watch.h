// What a worker's step needs from the job's store, fetched off the step's critical path
// (docs/design.md §4). A thread of its own, with a store client of its own, follows the
// coordinator's news counter while this worker is rank 0 (a watch on etcd, a poll every few
// milliseconds on the embedded store) and, when it changes, reads the stop request and the
// latest generation; it also publishes the step rank 0 reached and this worker's measured
// speed now and then. The step's control word reads only what the thread found: no store
// round trip inside a step.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "vflow/job/control_plane.h"

namespace vflow::job {

class StepWatch {
 public:
  /// Follows the job through `control` (a client no other thread uses) for member `member`.
  StepWatch(ControlPlane control, std::string member);
  ~StepWatch();
  StepWatch(const StepWatch&) = delete;
  StepWatch& operator=(const StepWatch&) = delete;

  /// What the trainer's thread tells the watch after each step (cheap: atomics).
  void report(bool rank0, int64_t step, const MeasuredSpeed& speed);

  /// A stop was requested (vflow-ctl stop, the library API).
  bool stop_requested() const { return stop_.load(); }
  /// The latest published generation seen (0: none yet).
  int64_t latest_generation() const { return latest_.load(); }
  /// Why the job's store was lost, once rank 0 could not reach it (empty while it can).
  std::string lost() const;

 private:
  void run();
  /// One pass: the news when rank 0, the step and the speed when due.
  void look();

  ControlPlane control_;
  std::string member_;

  std::atomic<bool> rank0_{false};
  std::atomic<int64_t> step_{-1};
  std::atomic<double> seconds_per_vnode_{0};
  std::atomic<double> update_seconds_{0};

  std::atomic<bool> stop_{false};
  std::atomic<int64_t> latest_{0};
  std::atomic<bool> lost_flag_{false};

  // Owned by the watch's thread.
  int64_t seen_news_ = -1;
  int64_t published_step_ = -1;
  std::chrono::steady_clock::time_point last_published_;
  std::chrono::steady_clock::time_point last_speed_;

  mutable std::mutex mutex_;  // guards lost_, quit_
  std::condition_variable wake_;
  std::string lost_;
  bool quit_ = false;
  std::thread thread_;
};

}  // namespace vflow::job
