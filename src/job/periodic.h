// A beat on a thread of its own: liveness leases and a coordinator's claim are renewed
// from here, so that a long step, a state transfer or a fully loaded machine cannot delay
// them past their time to live.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace vflow::job {

class Periodic {
 public:
  /// Calls `beat` every `period` (the first time after one period) until destroyed. An exception
  /// from `beat` is logged (as `what`) and the beat goes on.
  Periodic(std::function<void()> beat, std::chrono::milliseconds period, std::string what);
  ~Periodic();
  Periodic(const Periodic&) = delete;
  Periodic& operator=(const Periodic&) = delete;

 private:
  void run();
  std::function<void()> beat_;
  std::chrono::milliseconds period_;
  std::string what_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace vflow::job
