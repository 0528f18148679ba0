#include "job/step_watch.h"

#include "vflow/core/error.h"

namespace vflow::job {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

/// How long one wait for news lasts before the watch looks at its other duties (and at
/// whether it should end).
constexpr milliseconds kNewsWait{200};
/// How often a worker that is not rank 0 looks at its duties.
constexpr milliseconds kIdlePeriod{50};
/// Rank 0's step for `vflow-ctl status`, and every worker's measured speed for re-planning.
constexpr milliseconds kStepPeriod{200};
constexpr milliseconds kSpeedPeriod{1000};

}  // namespace

StepWatch::StepWatch(ControlPlane control, std::string member)
    : control_(std::move(control)), member_(std::move(member)) {
  thread_ = std::thread([this] { run(); });
}

StepWatch::~StepWatch() {
  {
    std::lock_guard<std::mutex> hold(mutex_);
    quit_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void StepWatch::report(bool rank0, int64_t step, const MeasuredSpeed& speed) {
  step_.store(step);
  seconds_per_vnode_.store(speed.seconds_per_vnode);
  update_seconds_.store(speed.update_seconds);
  if (rank0_.exchange(rank0) != rank0 && rank0) {
    std::lock_guard<std::mutex> hold(mutex_);  // wake an idle watch: rank 0 follows the news
    wake_.notify_all();
  }
}

std::string StepWatch::lost() const {
  if (!lost_flag_.load()) return {};
  std::lock_guard<std::mutex> hold(mutex_);
  return lost_;
}

void StepWatch::run() {
  std::unique_lock<std::mutex> hold(mutex_);
  while (!quit_) {
    hold.unlock();
    look();
    hold.lock();
    // Rank 0 waited for news inside look(); the others (and a rank 0 whose store is lost)
    // look again after a pause.
    if (!rank0_.load() || lost_flag_.load()) {
      wake_.wait_for(hold, kIdlePeriod,
                     [this] { return quit_ || (rank0_.load() && !lost_flag_.load()); });
    }
  }
}

void StepWatch::look() {
  const auto now = Clock::now();
  const double per_vnode = seconds_per_vnode_.load();
  if (now - last_speed_ >= kSpeedPeriod && per_vnode > 0) {
    try {
      control_.publish_speed(member_, {per_vnode, update_seconds_.load()});
    } catch (const PeerFailure&) {
      // the coordinator is gone: rank 0 finds out below, or the next collective does
    }
    last_speed_ = now;
  }
  if (!rank0_.load() || lost_flag_.load()) return;
  try {
    const int64_t step = step_.load();
    if (step != published_step_ && now - last_published_ >= kStepPeriod) {
      control_.publish_step(step);
      published_step_ = step;
      last_published_ = now;
    }
    const int64_t news = control_.await_news(seen_news_, kNewsWait);
    if (news != seen_news_) {
      if (control_.stop_requested()) stop_.store(true);
      latest_.store(control_.latest_generation());
      seen_news_ = news;
    }
  } catch (const PeerFailure& e) {
    std::lock_guard<std::mutex> hold(mutex_);
    lost_ = e.what();
    lost_flag_.store(true);
  }
}

}  // namespace vflow::job
