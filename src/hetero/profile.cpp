#include "vflow/hetero/profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "core/output_file.h"
#include "vflow/core/error.h"
#include "vflow/core/process.h"
#include "vflow/core/spec_node.h"

namespace vflow::hetero {

namespace {

/// Linear interpolation of `value` over the measured sizes (through the origin below
/// the smallest one).
template <typename Value>
double interpolate(const DeviceProfile& p, int64_t size, Value value) {
  if (p.points.empty()) {
    throw SpecError(fmt::format("profile of {} has no measurements", p.device_type));
  }
  const auto& first = p.points.front();
  if (size <= first.vnode_size) {
    return static_cast<double>(value(first)) * static_cast<double>(size) /
           static_cast<double>(first.vnode_size);
  }
  for (size_t i = 1; i < p.points.size(); ++i) {
    const auto& a = p.points[i - 1];
    const auto& b = p.points[i];
    if (size <= b.vnode_size) {
      const double f = static_cast<double>(size - a.vnode_size) /
                       static_cast<double>(b.vnode_size - a.vnode_size);
      return static_cast<double>(value(a)) +
             f * (static_cast<double>(value(b)) - static_cast<double>(value(a)));
    }
  }
  throw SpecError(fmt::format(
      "profile of {} was measured up to vnode size {}; profile again with larger sizes to plan "
      "vnodes of {}",
      p.device_type, p.points.back().vnode_size, size));
}

}  // namespace

double DeviceProfile::vnode_seconds(int64_t size) const {
  return interpolate(*this, size, [](const Point& p) { return p.seconds; });
}

int64_t DeviceProfile::vnode_peak_bytes(int64_t size) const {
  return static_cast<int64_t>(
      interpolate(*this, size, [](const Point& p) { return p.peak_bytes; }));
}

double DeviceProfile::vnode_spread(int64_t size) const {
  if (!points.empty() && size <= points.front().vnode_size) return points.front().spread;
  return interpolate(*this, size, [](const Point& p) { return p.spread; });
}

DeviceProfile load_profile(const std::string& path) {
  const SpecNode root = load_yaml_file(path, "profile");
  OptionReader r(root);
  DeviceProfile p;
  p.device_type = r.get_string("device_type", "");
  p.model = r.get_string("model", "");
  p.device = r.get_choice("device", "", {"", "cpu", "cuda"});
  p.threads = r.get_int("threads", 0, 0, 4096);
  p.cpu_quota = r.get_double("cpu_quota", 0, 0, 4096);
  p.optimizer_seconds = r.get_double("optimizer_seconds", 0, 0, 1e9);
  p.allreduce_seconds = r.get_double("allreduce_seconds", 0, 0, 1e9);
  p.gradient_bytes = r.get_int("gradient_bytes", 0, 0, int64_t{1} << 50);
  if (p.device_type.empty()) r.fail("device_type", "a profile names its device type");
  const auto& points = r.list("points");
  if (points.empty()) {
    r.fail("points", "a profile needs a list of {vnode_size, seconds, peak_bytes} measurements");
  }
  for (const auto& item : points) {
    if (!item.is_map()) {
      throw SpecError(fmt::format("{}: expected a measurement {{vnode_size, seconds, peak_bytes}}",
                                  item.describe()));
    }
    OptionReader pr(item);
    DeviceProfile::Point point;
    if (!pr.has("vnode_size") || !pr.has("seconds")) {
      pr.fail(pr.has("vnode_size") ? "seconds" : "vnode_size", "every measurement needs it");
    }
    point.vnode_size = pr.get_int("vnode_size", 0, 1, int64_t{1} << 40);
    point.seconds = pr.get_double("seconds", 0, 0, 1e9);
    point.peak_bytes = pr.get_int("peak_bytes", 0, 0, int64_t{1} << 62);
    point.spread = pr.get_double("spread", 0, 0, 1e9);
    pr.finish();
    if (!p.points.empty() && point.vnode_size <= p.points.back().vnode_size) {
      pr.fail("vnode_size", "measurements must be in ascending vnode_size order");
    }
    p.points.push_back(point);
  }
  r.finish();
  return p;
}

void save_profile(const DeviceProfile& p, const std::string& path) {
  std::string text = fmt::format(
      "# vflow device profile (docs/heterogeneous.md)\n"
      "device_type: {}\nmodel: {}\n",
      p.device_type, p.model);
  if (!p.device.empty()) {
    text += fmt::format("device: {}\nthreads: {}\ncpu_quota: {:.9g}\n", p.device, p.threads,
                        p.cpu_quota);
  }
  text += fmt::format("optimizer_seconds: {:.9g}\nallreduce_seconds: {:.9g}\n", p.optimizer_seconds,
                      p.allreduce_seconds);
  if (p.gradient_bytes > 0) text += fmt::format("gradient_bytes: {}\n", p.gradient_bytes);
  text += "points:\n";
  for (const auto& point : p.points) {
    text += fmt::format("  - {{vnode_size: {}, seconds: {:.9g}, peak_bytes: {}", point.vnode_size,
                        point.seconds, point.peak_bytes);
    text += point.spread > 0 ? fmt::format(", spread: {:.4g}}}\n", point.spread) : "}\n";
  }
  if (const std::string error = core::write_file_atomically(path, text); !error.empty()) {
    throw Error(fmt::format("{}: cannot write the profile: {}", path, error));
  }
}

std::string default_device_type(bool cuda, std::string gpu_name, int64_t threads,
                                double cpu_quota) {
  if (cuda) {
    std::replace(gpu_name.begin(), gpu_name.end(), ' ', '-');
    return gpu_name.empty() ? "cuda" : "cuda-" + gpu_name;
  }
  if (threads <= 0) threads = usable_cores();
  return cpu_quota > 0 ? fmt::format("cpu-{}t-q{}", threads, cpu_quota)
                       : fmt::format("cpu-{}t", threads);
}

}  // namespace vflow::hetero
