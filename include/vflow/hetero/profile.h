// Device profiles (docs/design.md §5, "Profile"): what one vnode costs on one device type.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vflow::hetero {

/// The measured costs of one model on one device type. Written by vflow-profile, read
/// by the planner; the file format is in docs/heterogeneous.md.
struct DeviceProfile {
  struct Point {
    int64_t vnode_size = 0;  ///< examples in the vnode
    double seconds = 0;      ///< forward + backward + accumulation of one vnode
    int64_t peak_bytes = 0;  ///< peak memory while processing it (0 = not measured)
    /// How much a step's compute varies from step to step: the standard deviation of the
    /// measured steps over their median (0 = not measured).
    double spread = 0;
  };
  std::string device_type;  ///< e.g. "cpu-1t" or "cuda-NVIDIA-H200"
  /// How a worker of this type runs (vflow-plan writes them into the job's layout):
  /// its device kind, cpu or cuda (empty = not recorded), its intra-op threads (0 = all
  /// cores) and its CPU quota in cores (0 = no limit).
  std::string device;
  int64_t threads = 0;
  double cpu_quota = 0;
  std::string model;             ///< digest of the model and data part it was measured with
  std::vector<Point> points;     ///< ascending vnode sizes
  double optimizer_seconds = 0;  ///< one optimizer step (and the stateful-kernel update)
  double allreduce_seconds = 0;  ///< one allreduce of the gradient buffer between 2 workers
  int64_t gradient_bytes = 0;    ///< size of that buffer (0 = not recorded)

  /// Time of one vnode of `size` examples: linear between measured sizes, proportional
  /// to the size below the smallest; throws Error above the largest measured size.
  double vnode_seconds(int64_t size) const;
  /// Peak memory for a vnode of `size` (same interpolation; 0 when not measured).
  int64_t vnode_peak_bytes(int64_t size) const;
  /// The relative spread of a worker's compute at vnode `size`: linear between measured
  /// sizes, the smallest size's below it (a ratio, not a time).
  double vnode_spread(int64_t size) const;
};

/// The name a device type gets when none is given (vflow-profile's, and a worker's for
/// matching profiles): cpu-<threads>t[-q<quota>] (`threads` 0 = this host's cores), or for
/// a CUDA device cuda-<gpu_name> (spaces as dashes; "cuda" when the name is not known).
std::string default_device_type(bool cuda, std::string gpu_name, int64_t threads, double cpu_quota);

/// Reads a profile file; errors name the file, line and key.
DeviceProfile load_profile(const std::string& path);
/// Writes `profile` as YAML (atomically).
void save_profile(const DeviceProfile& profile, const std::string& path);

}  // namespace vflow::hetero
