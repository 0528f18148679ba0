#include "vflow/scheduler/throughput.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "core/input_file.h"
#include "parse.h"
#include "vflow/core/error.h"
#include "vflow/scheduler/trace.h"

namespace vflow::scheduler {

ThroughputCurve ThroughputCurve::table(std::vector<std::pair<int, double>> points) {
  if (points.empty()) throw DataError("throughput table curve: no points");
  std::sort(points.begin(), points.end());
  for (size_t i = 0; i < points.size(); ++i) {
    if (points[i].first < 1 || !(points[i].second > 0)) {
      throw DataError(fmt::format("throughput point ({}, {}): workers must be >= 1 and rate > 0",
                                  points[i].first, points[i].second));
    }
    if (i > 0 && points[i].first == points[i - 1].first) {
      throw DataError(
          fmt::format("throughput table: worker count {} given twice", points[i].first));
    }
  }
  ThroughputCurve curve;
  curve.kind_ = Kind::kTable;
  curve.points_ = std::move(points);
  return curve.remember();
}

ThroughputCurve ThroughputCurve::linear(double one_worker) {
  if (!(one_worker > 0)) throw DataError("linear throughput: rate must be > 0");
  ThroughputCurve curve;
  curve.kind_ = Kind::kLinear;
  curve.one_worker_ = one_worker;
  return curve.remember();
}

ThroughputCurve ThroughputCurve::amdahl(double one_worker, double parallel_fraction) {
  if (!(one_worker > 0)) throw DataError("amdahl throughput: rate must be > 0");
  if (!(parallel_fraction >= 0 && parallel_fraction <= 1)) {
    throw DataError("amdahl throughput: parallel fraction must be in [0, 1]");
  }
  ThroughputCurve curve;
  curve.kind_ = Kind::kAmdahl;
  curve.one_worker_ = one_worker;
  curve.parallel_fraction_ = parallel_fraction;
  return curve.remember();
}

ThroughputCurve& ThroughputCurve::remember() {
  known_.assign(1, 0.0);
  for (int n = 1; n <= kKnown; ++n) known_.push_back(compute(n));
  peak_.assign(1, 0.0);
  for (int n = 1; n <= kKnown; ++n) peak_.push_back(std::max(peak_.back(), known_[n]));
  return *this;
}

double ThroughputCurve::compute_peak(int workers) const {
  // Past kKnown workers: linear and Amdahl curves never fall, and a table's is linear
  // between its points and rising after the last, so its highest lies at a point or at
  // `workers`.
  double peak = std::max(peak_.back(), compute(workers));
  if (kind_ == Kind::kTable) {
    for (const auto& [n, rate] : points_) {
      if (n > kKnown && n <= workers) peak = std::max(peak, rate);
    }
  }
  return peak;
}

double ThroughputCurve::compute(int workers) const {
  const double n = workers;
  switch (kind_) {
    case Kind::kLinear:
      return one_worker_ * n;
    case Kind::kAmdahl:
      return one_worker_ / ((1.0 - parallel_fraction_) + parallel_fraction_ / n);
    case Kind::kTable:
      break;
  }
  const auto& first = points_.front();
  const auto& last = points_.back();
  if (workers <= first.first) return first.second * n / first.first;
  if (workers >= last.first) return last.second * n / last.first;
  const auto hi = std::lower_bound(points_.begin(), points_.end(), std::make_pair(workers, 0.0));
  if (hi->first == workers) return hi->second;
  const auto lo = hi - 1;
  const double t = (n - lo->first) / (hi->first - lo->first);
  return lo->second + t * (hi->second - lo->second);
}

std::string ThroughputCurve::describe() const {
  switch (kind_) {
    case Kind::kLinear:
      return fmt::format("linear({})", one_worker_);
    case Kind::kAmdahl:
      return fmt::format("amdahl({}, p={})", one_worker_, parallel_fraction_);
    case Kind::kTable:
      break;
  }
  std::string out = "table(";
  for (const auto& [n, r] : points_) out += fmt::format("{}{}:{}", out.size() > 6 ? " " : "", n, r);
  return out + ")";
}

void ThroughputTable::add(const std::string& model, const std::string& device_type,
                          ThroughputCurve curve) {
  curves_[{model, device_type}] = std::move(curve);
}

const ThroughputCurve* ThroughputTable::find(const std::string& model,
                                             const std::string& device_type) const {
  const auto it = curves_.find({model, device_type});
  return it == curves_.end() ? nullptr : &it->second;
}

bool ThroughputTable::has_model(const std::string& model) const {
  const auto it = curves_.lower_bound({model, std::string()});
  return it != curves_.end() && it->first.first == model;
}

std::vector<std::string> ThroughputTable::models() const {
  std::vector<std::string> out;
  for (const auto& entry : curves_) {
    if (out.empty() || out.back() != entry.first.first) out.push_back(entry.first.first);
  }
  return out;
}

ThroughputTable ThroughputTable::load(const std::string& path) {
  auto bytes = core::read_input_file(path, kMaxTableFileBytes);
  if (!bytes.ok()) {
    throw DataError(fmt::format("{}: cannot read the throughput file: {}", path, bytes.error));
  }
  std::istringstream in(std::move(bytes.bytes));
  return parse(in, path);
}

ThroughputTable ThroughputTable::parse(std::istream& in, const std::string& source) {
  using Key = std::pair<std::string, std::string>;
  std::map<Key, std::vector<std::pair<int, double>>> points;
  std::map<Key, int> first_line;
  ThroughputTable table;
  for_each_row(in, source, [&](const RowReader& row) {
    const std::string kind = row.text(0, "kind");
    const Key key{row.text(1, "model"), row.text(2, "device_type")};
    if (kind == "table") {
      row.expect_fields(5);
      points[key].emplace_back(row.integer(3, "workers", 1), row.positive(4, "steps_per_s"));
      first_line.emplace(key, row.line());
    } else if (kind == "linear") {
      row.expect_fields(4);
      table.add(key.first, key.second, ThroughputCurve::linear(row.positive(3, "steps_per_s")));
    } else if (kind == "amdahl") {
      row.expect_fields(5);
      const double p = row.number(4, "parallel_fraction");
      if (p < 0 || p > 1) row.fail("parallel_fraction must be in [0, 1]");
      table.add(key.first, key.second, ThroughputCurve::amdahl(row.positive(3, "steps_per_s"), p));
    } else {
      row.fail(fmt::format("unknown row kind '{}' (table | linear | amdahl)", kind));
    }
  });
  for (auto& [key, pts] : points) {
    try {
      table.add(key.first, key.second, ThroughputCurve::table(std::move(pts)));
    } catch (const DataError& e) {
      throw DataError(fmt::format("{}:{}: {} {}: {}", source, first_line[key], key.first,
                                  key.second, e.what()));
    }
  }
  return table;
}

}  // namespace vflow::scheduler
