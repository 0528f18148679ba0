// CPU workers slowed by a CPU quota (Linux cgroup cpu controller), so that slower and
// faster CPU "device types" can be profiled and trained with on one machine.
#pragma once

#include <string>
#include <utility>

namespace vflow::hetero {

/// Moves this process into a cgroup of its own named `name` whose CPU time is limited
/// to `cores` cores (e.g. 0.5). Uses cgroup v2 (cpu.max) or v1 (cpu.cfs_quota_us),
/// whichever is mounted and writable. Throws Error naming what is missing when the
/// machine does not allow it (no cpu controller, not root).
void apply_cpu_quota(double cores, const std::string& name);

/// Moves this process back to the root cgroup and removes the group `name` made by
/// apply_cpu_quota (best effort, never throws).
void release_cpu_quota(const std::string& name);

/// Releases the quota group `name` (release_cpu_quota) when it goes out of scope, also when
/// an error unwinds it; an empty name releases nothing.
class CpuQuotaRelease {
 public:
  explicit CpuQuotaRelease(std::string name) : name_(std::move(name)) {}
  ~CpuQuotaRelease() {
    if (!name_.empty()) release_cpu_quota(name_);
  }
  CpuQuotaRelease(const CpuQuotaRelease&) = delete;
  CpuQuotaRelease& operator=(const CpuQuotaRelease&) = delete;

 private:
  std::string name_;
};

}  // namespace vflow::hetero
