// One persistent worker thread that runs jobs in the order submitted: the next vnodes'
// batches are loaded while the current vnode computes, without starting a thread per
// vnode. Results are collected in the same order.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "vflow/core/error.h"

namespace vflow::engine {

template <typename T>
class BackgroundTask {
 public:
  BackgroundTask() : thread_([this] { loop(); }) {}

  ~BackgroundTask() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      quit_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  BackgroundTask(const BackgroundTask&) = delete;
  BackgroundTask& operator=(const BackgroundTask&) = delete;

  /// Queues `job` after those not yet collected.
  void submit(std::function<T()> job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_all();
  }

  /// Jobs submitted and not yet collected with wait().
  size_t outstanding() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return jobs_.size() + results_.size() + (running_ ? 1 : 0);
  }

  /// The oldest uncollected job's result; rethrows its exception.
  T wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    VFLOW_ASSERT(!jobs_.empty() || !results_.empty() || running_, "wait() without a job");
    cv_.wait(lock, [this] { return !results_.empty(); });
    Result r = std::move(results_.front());
    results_.pop_front();
    if (r.error) std::rethrow_exception(r.error);
    return std::move(*r.value);
  }

 private:
  struct Result {
    std::optional<T> value;
    std::exception_ptr error;
  };

  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      cv_.wait(lock, [this] { return quit_ || !jobs_.empty(); });
      if (quit_) return;
      auto job = std::move(jobs_.front());
      jobs_.pop_front();
      running_ = true;
      lock.unlock();
      Result r;
      try {
        r.value = job();
      } catch (...) {
        r.error = std::current_exception();
      }
      lock.lock();
      running_ = false;
      results_.push_back(std::move(r));
      cv_.notify_all();
    }
  }

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<T()>> jobs_;
  std::deque<Result> results_;
  bool running_ = false;
  bool quit_ = false;
  std::thread thread_;  // last: starts after the other members exist
};

}  // namespace vflow::engine
