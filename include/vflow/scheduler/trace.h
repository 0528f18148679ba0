// Job traces and the row reader shared by every text format of the scheduler.
//
// Gavel-style trace (TSV, tab-separated, '#' comments and blank lines skipped):
//   job_type  total_steps  scale_factor  priority_weight  arrival_time_s  [min_workers max_workers]
// Philly-derived trace (CSV, optional header "timestamp,duration,num_gpus"):
//   timestamp_s,duration_s,num_gpus
// where duration is the run time at num_gpus workers on the reference device type.
// Readers throw vflow::DataError "file:line: ..." on the first bad row.
#pragma once

#include <functional>
#include <iosfwd>
#include <string>
#include <vector>

namespace vflow::scheduler {

/// One job as a trace describes it, before it is bound to a cluster and a throughput table.
struct JobRecord {
  double arrival_s = 0;    ///< seconds since the trace's start
  std::string model;       ///< throughput-table model name; unknown names get the fallback curve
  double total_steps = 0;  ///< work in steps; 0: derived from duration_s
  double duration_s = 0;  ///< run time at `demand` workers on the reference type (if total_steps 0)
  int demand = 1;         ///< workers requested (Gavel's scale factor)
  int min_workers = 0;    ///< 0: BindOptions default
  int max_workers = 0;    ///< 0: BindOptions default
  double weight = 1;      ///< priority weight, > 0
  std::string origin;     ///< "file:line" for error messages; empty for generated jobs
};

/// A split row of a text file, with typed accessors that throw "source:line: ..." errors.
class RowReader {
 public:
  RowReader(std::string source, int line, std::vector<std::string> fields)
      : source_(std::move(source)), line_(line), fields_(std::move(fields)) {}
  int line() const { return line_; }
  size_t size() const { return fields_.size(); }
  std::string origin() const;
  const std::string& text(size_t i, const char* name) const;
  double number(size_t i, const char* name) const;
  double positive(size_t i, const char* name) const;
  int integer(size_t i, const char* name, int min_value) const;
  /// Throws unless the row has between `min_fields` and `max_fields` fields.
  void expect_fields(size_t min_fields, size_t max_fields = 0) const;
  [[noreturn]] void fail(const std::string& message) const;

 private:
  std::string source_;
  int line_;
  std::vector<std::string> fields_;
};

/// Calls `on_row` for each non-blank line not starting with '#'. `delimiter` 0 splits on runs
/// of spaces and tabs; otherwise on that character (fields are trimmed).
void for_each_row(std::istream& in, const std::string& source,
                  const std::function<void(const RowReader&)>& on_row, char delimiter = 0);

std::vector<JobRecord> read_gavel_trace(const std::string& path);
std::vector<JobRecord> read_gavel_trace(std::istream& in, const std::string& source);
/// Jobs get `model` (the fallback curve unless the throughput table knows it) and weight 1;
/// timestamps are shifted so that the earliest is 0.
std::vector<JobRecord> read_philly_trace(const std::string& path, const std::string& model);
std::vector<JobRecord> read_philly_trace(std::istream& in, const std::string& source,
                                         const std::string& model);
/// Writes records with total_steps > 0 in the Gavel-style format read_gavel_trace reads.
void write_gavel_trace(const std::vector<JobRecord>& records, std::ostream& out);

}  // namespace vflow::scheduler
