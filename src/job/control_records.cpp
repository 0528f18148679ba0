#include "job/control_records.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

#include "vflow/core/error.h"
#include "vflow/core/spec_node.h"

namespace vflow::job::records {

namespace {

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ",") + item;
  return out;
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, sep)) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

[[noreturn]] void bad_record(const std::string& key, const std::string& text,
                             const std::string& expected) {
  const std::string shown = text.size() > 120 ? text.substr(0, 120) + "..." : text;
  throw Error(
      fmt::format("[elastic] store key '{}' holds '{}', not {}", key, printable(shown), expected));
}

bool decode_flag(const std::string& text, const std::string& key, const std::string& record) {
  if (text == "1") return true;
  if (text == "0") return false;
  bad_record(key, record, "a record whose flags are 0 or 1");
}

}  // namespace

int64_t decode_int(const std::string& text, const std::string& key) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE ||
      text.find_first_of(" \t\n") != std::string::npos) {
    bad_record(key, text, "a number");
  }
  return v;
}

std::string encode_limits(const JobLimits& l) {
  return fmt::format("{} {} {}", l.virtual_nodes, l.min_workers, l.max_workers);
}

JobLimits decode_limits(const std::string& text, const std::string& key) {
  const auto parts = split(text, ' ');
  if (parts.size() != 3) bad_record(key, text, "job limits");
  JobLimits l;
  l.virtual_nodes = decode_int(parts[0], key);
  l.min_workers = decode_int(parts[1], key);
  l.max_workers = decode_int(parts[2], key);
  if (l.virtual_nodes < 1 || l.min_workers < 1 || l.max_workers < l.min_workers ||
      l.max_workers > l.virtual_nodes) {
    bad_record(key, text, "job limits (1 <= min <= max <= virtual nodes)");
  }
  return l;
}

std::string encode_generation(const Generation& g) {
  std::vector<std::string> counts;
  for (const int64_t c : g.vnodes) counts.push_back(std::to_string(c));
  return fmt::format("{}|{}|{}|{}|{}", g.donor, g.transfer_state ? 1 : 0, g.stop ? 1 : 0,
                     join(g.members), join(counts));
}

Generation decode_generation(int64_t id, const std::string& text, const std::string& key) {
  std::vector<std::string> parts;
  std::string rest = text;
  for (int i = 0; i < 4; ++i) {
    const auto bar = rest.find('|');
    if (bar == std::string::npos) bad_record(key, text, "a generation record");
    parts.push_back(rest.substr(0, bar));
    rest = rest.substr(bar + 1);
  }
  parts.push_back(rest);
  Generation g;
  g.id = id;
  g.donor = parts[0];
  g.transfer_state = decode_flag(parts[1], key, text);
  g.stop = decode_flag(parts[2], key, text);
  g.members = split(parts[3], ',');
  for (const auto& c : split(parts[4], ',')) {
    const int64_t count = decode_int(c, key);
    // No job has more vnodes than this; sums of counts stay far from overflowing.
    if (count < 0 || count > (int64_t{1} << 31)) {
      bad_record(key, text, "a generation record (a vnode count out of range)");
    }
    g.vnodes.push_back(count);
  }
  if (!g.vnodes.empty() && g.vnodes.size() != g.members.size()) {
    bad_record(key, text, "a generation record (vnode counts do not match the members)");
  }
  return g;
}

std::string encode_offer(const RegroupOffer& offer) {
  switch (offer.kind) {
    case RegroupOffer::Kind::kShrink:
      return fmt::format("shrink {}", offer.parent);
    case RegroupOffer::Kind::kGrow:
      return fmt::format("grow {} {}", offer.parent, offer.members);
    case RegroupOffer::Kind::kJoin:
      return "join";
    case RegroupOffer::Kind::kNone:
      break;
  }
  return "none";
}

std::string regroup_answer(const std::vector<std::string>& offers) {
  if (offers.empty()) return "fresh";
  const auto& first = offers.front();
  // Members offering the same shrink or grow of one generation, from the first rank on.
  size_t same = 0;
  while (same < offers.size() && offers[same] == first) ++same;
  if (first.rfind("shrink ", 0) == 0) return same == offers.size() ? "shrink" : "fresh";
  if (first.rfind("grow ", 0) != 0) return "fresh";
  // "grow <parent> <members>": exactly the earlier members first, then only new ones.
  const auto parts = split(first, ' ');
  if (parts.size() != 3 || parts[2] != std::to_string(same) || same == offers.size()) {
    return "fresh";
  }
  for (size_t m = same; m < offers.size(); ++m) {
    if (offers[m] != "join") return "fresh";
  }
  return fmt::format("grow {}", same);
}

RegroupAnswer decode_regroup_answer(const std::string& text, const std::string& key) {
  RegroupAnswer answer;
  if (text == "shrink") {
    answer.how = Regroup::kShrink;
  } else if (text.rfind("grow ", 0) == 0) {
    answer.how = Regroup::kGrow;
    answer.grown_from = decode_int(text.substr(5), key);
    if (answer.grown_from < 1) bad_record(key, text, "a regroup answer");
  } else if (text != "fresh") {
    bad_record(key, text, "a regroup answer");
  }
  return answer;
}

// The third field is unused (it said whether the first generation was planned); kept so
// that a build before or after reads the record, and refuses to run by the version alone.
std::string encode_job_record(const JobRecord& r) {
  return fmt::format("{} {} 0 {}", r.timeout.count(), r.replace_failed ? 1 : 0, r.device);
}

JobRecord decode_job_record(const std::string& text, const std::string& key) {
  const auto parts = split(text, ' ');
  if (parts.size() != 4) bad_record(key, text, "a job record");
  JobRecord r;
  r.timeout = std::chrono::milliseconds(decode_int(parts[0], key));
  r.replace_failed = decode_flag(parts[1], key, text);
  (void)decode_flag(parts[2], key, text);
  r.device = parts[3];
  if (r.timeout.count() < 1) bad_record(key, text, "a job record (a positive timeout)");
  return r;
}

std::string encode_profiled(const std::map<std::string, double>& seconds_per_vnode) {
  std::string text;
  for (const auto& [type, seconds] : seconds_per_vnode) {
    text += fmt::format("{:.9g} {}\n", seconds, type);
  }
  return text;
}

std::map<std::string, double> decode_profiled(const std::string& text, const std::string& key) {
  std::map<std::string, double> out;
  for (const auto& line : split(text, '\n')) {
    if (line.empty()) continue;
    const auto space = line.find(' ');
    if (space == std::string::npos || space + 1 == line.size()) {
      bad_record(key, text, "profiled times ('<seconds> <device type>' lines)");
    }
    double seconds = 0;
    try {
      size_t used = 0;
      seconds = std::stod(line.substr(0, space), &used);
      if (used != space) throw std::invalid_argument(line);
    } catch (const std::exception&) {
      bad_record(key, text, "profiled times ('<seconds> <device type>' lines)");
    }
    if (!(seconds > 0)) bad_record(key, text, "profiled times (seconds > 0)");
    out[line.substr(space + 1)] = seconds;
  }
  return out;
}

Placement decode_placement(const std::string& text, const std::string& key) {
  const auto parts = split(text, ' ');
  if (parts.size() != 2) bad_record(key, text, "a placement ('<agent> <slot>')");
  Placement p;
  p.agent = parts[0];
  p.slot = decode_int(parts[1], key);
  if (p.slot < 0) bad_record(key, text, "a placement (a slot >= 0)");
  return p;
}

std::string encode_exit(const WorkerExit& exit) {
  return exit.why.empty() ? std::to_string(exit.code) : fmt::format("{} {}", exit.code, exit.why);
}

WorkerExit decode_exit(const std::string& text, const std::string& key) {
  const auto space = text.find(' ');
  WorkerExit exit;
  exit.code = static_cast<int>(decode_int(text.substr(0, space), key));
  if (space != std::string::npos) exit.why = text.substr(space + 1);
  return exit;
}

}  // namespace vflow::job::records
