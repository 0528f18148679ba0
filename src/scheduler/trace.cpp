#include "vflow/scheduler/trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <istream>
#include <limits>
#include <ostream>
#include <sstream>

#include "core/input_file.h"
#include "parse.h"
#include "vflow/core/error.h"

namespace vflow::scheduler {
namespace {

std::string trim(const std::string& s) {
  const auto begin = s.find_first_not_of(" \t\r");
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(" \t\r") - begin + 1);
}

std::vector<std::string> split(const std::string& line, char delimiter) {
  std::vector<std::string> fields;
  if (delimiter != 0) {
    size_t begin = 0;
    while (true) {
      const size_t end = line.find(delimiter, begin);
      fields.push_back(trim(line.substr(begin, end - begin)));
      if (end == std::string::npos) break;
      begin = end + 1;
    }
    return fields;
  }
  size_t pos = 0;
  while ((pos = line.find_first_not_of(" \t\r", pos)) != std::string::npos) {
    const size_t end = line.find_first_of(" \t\r", pos);
    fields.push_back(line.substr(pos, end - pos));
    pos = end;
  }
  return fields;
}

std::istringstream open_or_throw(const std::string& path) {
  auto in = core::read_input_file(path, kMaxTableFileBytes);
  if (!in.ok()) throw DataError(fmt::format("{}: cannot read the trace: {}", path, in.error));
  return std::istringstream(std::move(in.bytes));
}

}  // namespace

std::string RowReader::origin() const { return fmt::format("{}:{}", source_, line_); }

void RowReader::fail(const std::string& message) const {
  throw DataError(fmt::format("{}: {}", origin(), message));
}

const std::string& RowReader::text(size_t i, const char* name) const {
  if (i >= fields_.size()) fail(fmt::format("missing field {} ({})", i + 1, name));
  if (fields_[i].empty()) fail(fmt::format("empty field {} ({})", i + 1, name));
  return fields_[i];
}

double RowReader::number(size_t i, const char* name) const {
  const std::string& s = text(i, name);
  const auto value = parse_whole<double>(s);
  if (!value || !std::isfinite(*value)) {
    fail(fmt::format("field {} ({}): '{}' is not a number", i + 1, name, s));
  }
  return *value;
}

double RowReader::positive(size_t i, const char* name) const {
  const double value = number(i, name);
  if (!(value > 0)) fail(fmt::format("field {} ({}): {} is not > 0", i + 1, name, value));
  return value;
}

int RowReader::integer(size_t i, const char* name, int min_value) const {
  const double value = number(i, name);
  if (value != std::floor(value) || value < min_value || value > std::numeric_limits<int>::max()) {
    fail(fmt::format("field {} ({}): {} is not an integer >= {}", i + 1, name, text(i, name),
                     min_value));
  }
  return static_cast<int>(value);
}

void RowReader::expect_fields(size_t min_fields, size_t max_fields) const {
  if (max_fields == 0) max_fields = min_fields;
  if (fields_.size() < min_fields || fields_.size() > max_fields) {
    fail(min_fields == max_fields
             ? fmt::format("expected {} fields, found {}", min_fields, fields_.size())
             : fmt::format("expected {} to {} fields, found {}", min_fields, max_fields,
                           fields_.size()));
  }
}

void for_each_row(std::istream& in, const std::string& source,
                  const std::function<void(const RowReader&)>& on_row, char delimiter) {
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    const std::string stripped = trim(line);
    if (stripped.empty() || stripped[0] == '#') continue;
    on_row(RowReader(source, number, split(line, delimiter)));
  }
  if (in.bad()) throw DataError(fmt::format("{}: read error after line {}", source, number));
}

std::vector<JobRecord> read_gavel_trace(const std::string& path) {
  auto in = open_or_throw(path);
  return read_gavel_trace(in, path);
}

std::vector<JobRecord> read_gavel_trace(std::istream& in, const std::string& source) {
  std::vector<JobRecord> records;
  for_each_row(
      in, source,
      [&](const RowReader& row) {
        row.expect_fields(5, 7);
        if (row.size() == 6) row.fail("give both min_workers and max_workers, or neither");
        JobRecord r;
        r.model = row.text(0, "job_type");
        r.total_steps = row.positive(1, "total_steps");
        r.demand = row.integer(2, "scale_factor", 1);
        r.weight = row.positive(3, "priority_weight");
        r.arrival_s = row.number(4, "arrival_time");
        if (r.arrival_s < 0) row.fail("field 5 (arrival_time): negative");
        if (row.size() == 7) {
          r.min_workers = row.integer(5, "min_workers", 1);
          r.max_workers = row.integer(6, "max_workers", 1);
          if (r.min_workers > r.demand || r.max_workers < r.demand) {
            row.fail("need min_workers <= scale_factor <= max_workers");
          }
        }
        r.origin = row.origin();
        records.push_back(std::move(r));
      },
      '\t');
  return records;
}

std::vector<JobRecord> read_philly_trace(const std::string& path, const std::string& model) {
  auto in = open_or_throw(path);
  return read_philly_trace(in, path, model);
}

std::vector<JobRecord> read_philly_trace(std::istream& in, const std::string& source,
                                         const std::string& model) {
  std::vector<JobRecord> records;
  for_each_row(
      in, source,
      [&](const RowReader& row) {
        row.expect_fields(3);
        if (records.empty() && row.text(0, "timestamp") == "timestamp") {
          if (row.text(1, "duration") != "duration" || row.text(2, "num_gpus") != "num_gpus") {
            row.fail("header must be 'timestamp,duration,num_gpus'");
          }
          return;
        }
        JobRecord r;
        r.model = model;
        r.arrival_s = row.number(0, "timestamp");
        r.duration_s = row.positive(1, "duration");
        r.demand = row.integer(2, "num_gpus", 1);
        r.origin = row.origin();
        records.push_back(std::move(r));
      },
      ',');
  if (!records.empty()) {
    const double first = std::min_element(records.begin(), records.end(), [](auto& a, auto& b) {
                           return a.arrival_s < b.arrival_s;
                         })->arrival_s;
    for (auto& r : records) r.arrival_s -= first;
  }
  return records;
}

void write_gavel_trace(const std::vector<JobRecord>& records, std::ostream& out) {
  out << "# job_type\ttotal_steps\tscale_factor\tpriority_weight\tarrival_time_s\tmin_workers\t"
         "max_workers\n";
  for (const auto& r : records) {
    if (!(r.total_steps > 0)) {
      throw InternalError("write_gavel_trace: a record has no total_steps; bind it first");
    }
    out << fmt::format("{}\t{:.10g}\t{}\t{:g}\t{:.3f}", r.model, r.total_steps, r.demand, r.weight,
                       r.arrival_s);
    if (r.min_workers > 0 && r.max_workers > 0) {
      out << fmt::format("\t{}\t{}", r.min_workers, r.max_workers);
    }
    out << '\n';
  }
}

}  // namespace vflow::scheduler
