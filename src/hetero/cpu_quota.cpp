#include "vflow/hetero/cpu_quota.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "vflow/core/error.h"

namespace vflow::hetero {

namespace {

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

void write(const std::string& path, const std::string& value) {
  std::ofstream out(path);
  out << value;
  out.flush();
  if (!out) {
    throw Error(fmt::format("cannot set a CPU quota: writing '{}' to {} failed ({})", value, path,
                            std::strerror(errno)));
  }
}

void make_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    throw Error(fmt::format("cannot set a CPU quota: cannot create cgroup {} ({})", path,
                            std::strerror(errno)));
  }
}

}  // namespace

void apply_cpu_quota(double cores, const std::string& name) {
  if (!(cores > 0)) throw InternalError(fmt::format("a CPU quota must be positive, got {}", cores));
  // A 10 ms period (the kernel's default is 100 ms): a worker at half a core then runs
  // 5 ms of every 10 rather than 50 of every 100, so a vnode of tens of milliseconds
  // meets the quota as a slower CPU would, in proportion to its work.
  constexpr long kPeriodUs = 10000;
  const long quota = std::max(1000L, static_cast<long>(cores * kPeriodUs));
  const std::string pid = std::to_string(::getpid());
  const std::string v1 = "/sys/fs/cgroup/cpu";
  if (exists(v1 + "/cpu.cfs_quota_us")) {
    const std::string dir = v1 + "/" + name;
    make_dir(dir);
    write(dir + "/cpu.cfs_period_us", std::to_string(kPeriodUs));
    write(dir + "/cpu.cfs_quota_us", std::to_string(quota));
    write(dir + "/cgroup.procs", pid);
    return;
  }
  const std::string v2 = "/sys/fs/cgroup";
  if (exists(v2 + "/cgroup.controllers")) {
    const std::string dir = v2 + "/" + name;
    make_dir(dir);
    write(dir + "/cpu.max", fmt::format("{} {}", quota, kPeriodUs));
    write(dir + "/cgroup.procs", pid);
    return;
  }
  throw Error(
      "cannot set a CPU quota: this machine mounts no cgroup cpu controller (neither "
      "/sys/fs/cgroup/cpu/cpu.cfs_quota_us nor /sys/fs/cgroup/cgroup.controllers)");
}

void release_cpu_quota(const std::string& name) {
  const std::string pid = std::to_string(::getpid());
  for (const std::string root : {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup"}) {
    const std::string dir = root + "/" + name;
    if (!exists(dir)) continue;
    std::ofstream(root + "/cgroup.procs") << pid;
    ::rmdir(dir.c_str());
  }
}

}  // namespace vflow::hetero
