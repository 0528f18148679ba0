// The pool of threads that decode and transform examples (resources.data_threads). No
// LibTorch. The thread that asks for a batch works too, so a pool of n threads runs n - 1
// of its own; several batches may be read at once (training's loader, evaluation).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace vflow::data {

class DataThreads {
 public:
  /// `threads` >= 1 threads in all, the caller's included.
  explicit DataThreads(int threads);
  ~DataThreads();
  DataThreads(const DataThreads&) = delete;
  DataThreads& operator=(const DataThreads&) = delete;

  int threads() const { return static_cast<int>(helpers_.size()) + 1; }

  /// Runs fn(0) ... fn(n - 1) on the pool and the calling thread, and returns when all are
  /// done. If any threw, the exception of the lowest index is rethrown (so which error a
  /// batch reports does not depend on the threads).
  void for_each(int64_t n, const std::function<void(int64_t)>& fn);

 private:
  struct Job;
  void help();
  static void work(Job& job);

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> jobs_;
  bool quit_ = false;
  std::vector<std::thread> helpers_;
};

}  // namespace vflow::data
