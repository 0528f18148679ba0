#include "job/periodic.h"

#include <spdlog/spdlog.h>

namespace vflow::job {

Periodic::Periodic(std::function<void()> beat, std::chrono::milliseconds period, std::string what)
    : beat_(std::move(beat)), period_(period), what_(std::move(what)) {
  thread_ = std::thread([this] { run(); });
}

Periodic::~Periodic() {
  {
    std::lock_guard<std::mutex> hold(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Periodic::run() {
  std::unique_lock<std::mutex> hold(mutex_);
  while (!wake_.wait_for(hold, period_, [this] { return stop_; })) {
    hold.unlock();
    try {
      beat_();
    } catch (const std::exception& e) {
      spdlog::warn("[elastic] {}: {}", what_, e.what());
    }
    hold.lock();
  }
}

}  // namespace vflow::job
