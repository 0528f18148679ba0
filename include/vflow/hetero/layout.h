// One worker's entry of a job's first generation (`resources.layout`): what the planner
// chooses and the job spec reads, through the one layout-entry schema of the job spec.
#pragma once

#include <cstdint>
#include <string>

namespace vflow::hetero {

struct LayoutEntry {
  int64_t vnodes = 0;       ///< vnodes this worker holds (exact mode: equal vnode sizes)
  std::string device;       ///< cpu | cuda | cuda:K; empty = resources.device
  int64_t threads = 0;      ///< its intra-op threads; 0 = resources.threads
  double cpu_quota = 0;     ///< cores it may use (cgroup cpu controller); 0 = no limit
  std::string device_type;  ///< its device type's name (profiles); empty = the default name
};

}  // namespace vflow::hetero
