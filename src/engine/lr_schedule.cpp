#include "vflow/engine/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace vflow::engine {

LrSchedule::LrSchedule(const ScheduleSpec& spec, double base_lr, int64_t total_steps)
    : spec_(spec), base_lr_(base_lr), total_steps_(std::max<int64_t>(total_steps, 1)) {}

double LrSchedule::at(int64_t step) const {
  double factor = 1.0;
  if (spec_.name == "step") {
    factor = std::pow(spec_.gamma, static_cast<double>(step / spec_.step_size));
  } else if (spec_.name == "cosine") {
    const int64_t span = std::max<int64_t>(total_steps_ - spec_.warmup_steps, 1);
    const double progress = std::clamp(
        static_cast<double>(step - spec_.warmup_steps) / static_cast<double>(span), 0.0, 1.0);
    factor = spec_.min_factor + (1.0 - spec_.min_factor) * 0.5 * (1.0 + std::cos(M_PI * progress));
  }
  if (step < spec_.warmup_steps) {
    const double t = static_cast<double>(step) / static_cast<double>(spec_.warmup_steps);
    factor *= spec_.warmup_start + (1.0 - spec_.warmup_start) * t;
  }
  return base_lr_ * factor;
}

}  // namespace vflow::engine
