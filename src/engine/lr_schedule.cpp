#include "vflow/engine/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace vflow::engine {

LrSchedule::LrSchedule(const ScheduleSpec& spec, double base_lr, int64_t total_steps)
    : spec_(spec), base_lr_(base_lr), total_steps_(std::max<int64_t>(total_steps, 1)) {}

double LrSchedule::at(int64_t step) const {
  // Decays run over the steps after warmup: progress 0 at its end, 1 at the last step.
  const int64_t span = std::max<int64_t>(total_steps_ - spec_.warmup_steps, 1);
  const double progress = std::clamp(
      static_cast<double>(step - spec_.warmup_steps) / static_cast<double>(span), 0.0, 1.0);
  const double low = spec_.min_factor;
  double factor = 1.0;
  if (spec_.name == "step") {
    factor = std::pow(spec_.gamma, static_cast<double>(step / spec_.step_size));
  } else if (spec_.name == "cosine") {
    factor = low + (1.0 - low) * 0.5 * (1.0 + std::cos(M_PI * progress));
  } else if (spec_.name == "linear") {
    factor = low + (1.0 - low) * (1.0 - progress);
  } else if (spec_.name == "polynomial") {
    factor = low + (1.0 - low) * std::pow(1.0 - progress, spec_.power);
  } else if (spec_.name == "inverse_sqrt") {
    const auto w = static_cast<double>(std::max<int64_t>(spec_.warmup_steps, 1));
    factor = std::sqrt(w / std::max(static_cast<double>(step), w));
  }
  if (step < spec_.warmup_steps) {
    const double t = static_cast<double>(step) / static_cast<double>(spec_.warmup_steps);
    factor *= spec_.warmup_start + (1.0 - spec_.warmup_start) * t;
  }
  return base_lr_ * factor;
}

}  // namespace vflow::engine
