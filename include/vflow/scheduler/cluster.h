// A cluster of typed devices (e.g. 36 V100 + 36 P100 + 36 K80). A job's workers share one
// type, except where a policy spans types (Allocation::spans, the marginal-span policy).
#pragma once

#include <string>
#include <vector>

namespace vflow::scheduler {

struct DeviceType {
  std::string name;  ///< unique, e.g. "v100"; the throughput table keys on it
  int count = 0;     ///< devices of this type; > 0
};

class Cluster {
 public:
  Cluster() = default;
  /// Throws vflow::SpecError on an empty list, a duplicate name or a count < 1.
  explicit Cluster(std::vector<DeviceType> types);

  /// "8" (eight devices of type "gpu") or "v100:36,p100:36,k80:36".
  static Cluster parse(const std::string& text);

  int num_types() const { return static_cast<int>(types_.size()); }
  const DeviceType& type(int index) const { return types_.at(index); }
  const std::vector<DeviceType>& types() const { return types_; }
  /// Index of the type named `name`, or -1.
  int index_of(const std::string& name) const;
  int total_devices() const { return total_; }
  /// "v100:36,p100:36", the form parse() reads.
  std::string describe() const;

 private:
  std::vector<DeviceType> types_;
  int total_ = 0;
};

}  // namespace vflow::scheduler
