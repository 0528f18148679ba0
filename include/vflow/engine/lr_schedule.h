// Learning-rate schedules: a pure function of the step, so any worker (or a
// resumed run) computes the same rate without carrying schedule state.
#pragma once

#include <cstdint>

#include "vflow/engine/job_spec.h"

namespace vflow::engine {

class LrSchedule {
 public:
  LrSchedule(const ScheduleSpec& spec, double base_lr, int64_t total_steps);
  /// The learning rate of (0-based) step `step`.
  double at(int64_t step) const;

 private:
  ScheduleSpec spec_;
  double base_lr_;
  int64_t total_steps_;
};

}  // namespace vflow::engine
