// One persistent worker thread that runs one job at a time: the next vnode's
// batch is loaded while the current vnode computes, without starting a thread
// per vnode.
#pragma once

#include <condition_variable>
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

  /// Starts `job`; a previous job's result must have been collected with wait().
  void submit(std::function<T()> job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      VFLOW_ASSERT(!job_ && !result_ && !error_, "submit() while a job is outstanding");
      job_ = std::move(job);
    }
    cv_.notify_all();
  }

  bool outstanding() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return job_ || result_ || error_ || running_;
  }

  /// The submitted job's result; rethrows its exception.
  T wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [this] { return result_.has_value() || error_ != nullptr; });
    if (error_) {
      auto e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
    T out = std::move(*result_);
    result_.reset();
    return out;
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      cv_.wait(lock, [this] { return quit_ || job_ != nullptr; });
      if (quit_) return;
      auto job = std::move(job_);
      job_ = nullptr;
      running_ = true;
      lock.unlock();
      std::optional<T> result;
      std::exception_ptr error;
      try {
        result = job();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      running_ = false;
      result_ = std::move(result);
      error_ = error;
      cv_.notify_all();
    }
  }

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::function<T()> job_;
  std::optional<T> result_;
  std::exception_ptr error_;
  bool running_ = false;
  bool quit_ = false;
  std::thread thread_;  // last: starts after the other members exist
};

}  // namespace vflow::engine
