#include "vflow/data/data_threads.h"

#include <atomic>
#include <exception>

namespace vflow::data {

struct DataThreads::Job {
  const std::function<void(int64_t)>* fn = nullptr;
  int64_t n = 0;
  std::atomic<int64_t> next{0};
  std::mutex mutex;
  std::condition_variable cv;
  int64_t done = 0;
  int64_t first_error = -1;
  std::exception_ptr error;
};

DataThreads::DataThreads(int threads) {
  for (int i = 1; i < threads; ++i) helpers_.emplace_back([this] { help(); });
}

DataThreads::~DataThreads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    quit_ = true;
  }
  cv_.notify_all();
  for (auto& t : helpers_) t.join();
}

void DataThreads::work(Job& job) {
  int64_t finished = 0;
  int64_t error_at = -1;
  std::exception_ptr error;
  for (int64_t i = job.next.fetch_add(1); i < job.n; i = job.next.fetch_add(1)) {
    try {
      (*job.fn)(i);
    } catch (...) {
      if (error_at < 0 || i < error_at) {
        error_at = i;
        error = std::current_exception();
      }
    }
    ++finished;
  }
  if (finished == 0) return;
  std::lock_guard<std::mutex> lock(job.mutex);
  if (error && (job.first_error < 0 || error_at < job.first_error)) {
    job.first_error = error_at;
    job.error = error;
  }
  job.done += finished;
  if (job.done == job.n) job.cv.notify_all();
}

void DataThreads::help() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    cv_.wait(lock, [this] { return quit_ || !jobs_.empty(); });
    if (quit_) return;
    auto job = jobs_.front();
    if (job->next.load() >= job->n) {  // all taken: the next job, if any
      jobs_.pop_front();
      continue;
    }
    lock.unlock();
    work(*job);
    lock.lock();
  }
}

void DataThreads::for_each(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  auto job = std::make_shared<Job>();
  job->fn = &fn;
  job->n = n;
  if (!helpers_.empty() && n > 1) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back(job);
    }
    cv_.notify_all();
  }
  work(*job);
  std::unique_lock<std::mutex> lock(job->mutex);
  job->cv.wait(lock, [&job] { return job->done == job->n; });
  if (job->error) std::rethrow_exception(job->error);
}

}  // namespace vflow::data
