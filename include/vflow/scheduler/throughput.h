// Throughput (optimizer steps per second) of a job as a function of its worker count
// on one device type. Three forms:
//   table   measured points, linear interpolation between measured worker counts; below the
//           smallest and above the largest count the curve is the straight line from the
//           origin through that end point (constant per-worker throughput), so every
//           count >= 1 has a positive rate;
//   linear  ideal scaling, rate(n) = n * rate(1);
//   amdahl  rate(n) = rate(1) / ((1 - p) + p / n) with parallel fraction p in [0, 1].
// The throughput file (docs/scheduler.md, "Throughput file") maps (model, device type) to
// a curve.
#pragma once

#include <iosfwd>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace vflow::scheduler {

class ThroughputCurve {
 public:
  /// Points (workers >= 1, steps/s > 0) with distinct worker counts, any order.
  static ThroughputCurve table(std::vector<std::pair<int, double>> points);
  static ThroughputCurve linear(double one_worker);
  static ThroughputCurve amdahl(double one_worker, double parallel_fraction);

  /// Steps per second with `workers` workers; 0 for workers <= 0.
  double at(int workers) const {
    if (static_cast<size_t>(workers) < known_.size()) return known_[workers];
    return workers <= 0 ? 0.0 : compute(workers);
  }
  /// The highest of at(1..workers): at least the rate of any count up to `workers`, for a
  /// policy that needs a bound on a curve that need not be monotone (a table). 0 for
  /// workers <= 0.
  double peak(int workers) const {
    if (static_cast<size_t>(workers) < peak_.size()) return peak_[workers];
    return workers <= 0 ? 0.0 : compute_peak(workers);
  }
  std::string describe() const;

 private:
  enum class Kind { kTable, kLinear, kAmdahl };
  static constexpr int kKnown = 64;  ///< worker counts whose rates are computed once
  double compute(int workers) const;
  double compute_peak(int workers) const;
  ThroughputCurve& remember();  // fills known_; every factory ends with it
  Kind kind_ = Kind::kLinear;
  std::vector<std::pair<int, double>> points_;  // sorted by worker count
  double one_worker_ = 1.0;
  double parallel_fraction_ = 1.0;
  // at(0..kKnown), as compute() gives them: policies ask for rates at every decision, and
  // a lookup is several times cheaper than the divisions.
  std::vector<double> known_;
  std::vector<double> peak_;  // peak(0..kKnown)
};

class ThroughputTable {
 public:
  /// Replaces any curve already stored for (model, device_type).
  void add(const std::string& model, const std::string& device_type, ThroughputCurve curve);
  /// nullptr when the table has no curve for the pair.
  const ThroughputCurve* find(const std::string& model, const std::string& device_type) const;
  bool has_model(const std::string& model) const;
  /// Model names in sorted order.
  std::vector<std::string> models() const;
  bool empty() const { return curves_.empty(); }

  /// Reads a throughput file; throws vflow::DataError naming file:line on a bad row.
  static ThroughputTable load(const std::string& path);
  static ThroughputTable parse(std::istream& in, const std::string& source);

 private:
  std::map<std::pair<std::string, std::string>, ThroughputCurve> curves_;
};

}  // namespace vflow::scheduler
