#include "vflow/core/spec_node.h"

#include <fmt/format.h>
#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <unordered_set>

#include "core/input_file.h"
#include "vflow/core/error.h"
#include "vflow/core/registry.h"

namespace vflow {

std::string SpecLocation::str() const {
  if (line <= 0) return file;
  if (column <= 0) return fmt::format("{}:{}", file, line);
  return fmt::format("{}:{}:{}", file, line, column);
}

SpecNode SpecNode::scalar(std::string value, SpecLocation where, std::string path) {
  SpecNode n;
  n.kind_ = Kind::Scalar;
  n.value_ = std::move(value);
  n.where_ = std::move(where);
  n.path_ = std::move(path);
  return n;
}

SpecNode SpecNode::map(SpecLocation where, std::string path) {
  SpecNode n;
  n.kind_ = Kind::Map;
  n.where_ = std::move(where);
  n.path_ = std::move(path);
  return n;
}

SpecNode SpecNode::sequence(SpecLocation where, std::string path) {
  SpecNode n;
  n.kind_ = Kind::Sequence;
  n.where_ = std::move(where);
  n.path_ = std::move(path);
  return n;
}

SpecNode SpecNode::none(SpecLocation where, std::string path) {
  SpecNode n;
  n.where_ = std::move(where);
  n.path_ = std::move(path);
  return n;
}

const SpecNode* SpecNode::find(const std::string& key) const {
  for (const auto& [k, v] : entries_) {
    if (k == key) return &v;
  }
  return nullptr;
}

namespace {
std::string child_path(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}
}  // namespace

SpecNode& SpecNode::set(const std::string& key, SpecNode child, SpecLocation key_where) {
  VFLOW_ASSERT(kind_ == Kind::Map || kind_ == Kind::Null, "set() on a non-map node " + path_);
  kind_ = Kind::Map;
  child.key_where_ = key_where.file.empty() ? child.where_ : std::move(key_where);
  child.reroot(child_path(path_, key));
  for (auto& [k, v] : entries_) {
    if (k == key) {
      v = std::move(child);
      return v;
    }
  }
  entries_.emplace_back(key, std::move(child));
  return entries_.back().second;
}

SpecNode& SpecNode::add_new(const std::string& key, SpecNode child, SpecLocation key_where) {
  VFLOW_ASSERT(kind_ == Kind::Map, "add_new() on a non-map node " + path_);
  child.key_where_ = key_where.file.empty() ? child.where_ : std::move(key_where);
  child.reroot(child_path(path_, key));
  entries_.emplace_back(key, std::move(child));
  return entries_.back().second;
}

void SpecNode::append(SpecNode item) {
  VFLOW_ASSERT(kind_ == Kind::Sequence, "append() on a non-sequence node " + path_);
  item.reroot(fmt::format("{}[{}]", path_, items_.size()));
  items_.push_back(std::move(item));
}

void SpecNode::relocate(const SpecLocation& where) {
  where_ = where;
  key_where_ = where;
  for (auto& [k, v] : entries_) v.relocate(where);
  for (auto& item : items_) item.relocate(where);
}

void SpecNode::reroot(const std::string& path) {
  // Children's paths always follow their parent's: a subtree already at `path` is done
  // (the YAML reader builds every node at its final path).
  if (path_ == path) return;
  path_ = path;
  for (auto& [k, v] : entries_) v.reroot(child_path(path_, k));
  for (size_t i = 0; i < items_.size(); ++i) items_[i].reroot(fmt::format("{}[{}]", path_, i));
}

namespace {

/// A scalar as YAML writes it: plain where it can be, else double-quoted.
std::string scalar_yaml(const std::string& value) {
  const bool plain = !value.empty() &&
                     value.find_first_of(":#{}[],&*!|>'\"%@`\n") == std::string::npos &&
                     value.front() != ' ' && value.back() != ' ';
  return plain ? value : fmt::format("\"{}\"", value);
}

}  // namespace

std::string SpecNode::to_flow() const {
  if (is_null()) return "null";
  if (is_scalar()) return scalar_yaml(value_);
  std::vector<std::string> parts;
  if (is_sequence()) {
    for (const auto& item : items_) parts.push_back(item.to_flow());
    return fmt::format("[{}]", fmt::join(parts, ", "));
  }
  for (const auto& [k, v] : entries_) parts.push_back(k + ": " + v.to_flow());
  return fmt::format("{{{}}}", fmt::join(parts, ", "));
}

std::string SpecNode::to_yaml(int indent) const {
  const std::string pad(static_cast<size_t>(indent), ' ');
  auto inline_form = [](const SpecNode& n) -> std::optional<std::string> {
    if (n.is_null()) return std::string("null");
    if (n.is_scalar()) return scalar_yaml(n.value_);
    if (n.is_sequence()) {
      std::string out = "[";
      for (size_t i = 0; i < n.items_.size(); ++i) {
        if (!n.items_[i].is_scalar()) return std::nullopt;
        out += (i ? ", " : "") + n.items_[i].value_;
      }
      return out + "]";
    }
    if (n.entries_.empty()) return std::string("{}");
    return std::nullopt;
  };
  std::string out;
  if (is_map()) {
    for (const auto& [k, v] : entries_) {
      if (auto s = inline_form(v)) {
        out += fmt::format("{}{}: {}\n", pad, k, *s);
      } else {
        out += fmt::format("{}{}:\n{}", pad, k, v.to_yaml(indent + 2));
      }
    }
  } else if (is_sequence()) {
    for (const auto& item : items_) {
      out += fmt::format("{}-\n{}", pad, item.to_yaml(indent + 2));
    }
  } else {
    out += pad + inline_form(*this).value_or("") + "\n";
  }
  return out;
}

std::string SpecNode::describe() const {
  const SpecLocation& loc = where_.file.empty() ? key_where_ : where_;
  return fmt::format("{}: {}", loc.str(), path_.empty() ? "<top level>" : path_);
}

// ---- YAML ------------------------------------------------------------------

namespace {

SpecLocation location_of(const YAML::Mark& mark, const std::string& source) {
  if (mark.is_null()) return SpecLocation{source, 0, 0};
  return SpecLocation{source, mark.line + 1, mark.column + 1};
}

/// What one document may hold once its aliases are expanded. A job spec nests a few
/// levels and holds a few hundred values; the bounds stop an alias that contains
/// itself (`a: &x [*x]`) or aliases that repeat one another exponentially.
struct ConvertBudget {
  size_t values_left = kYamlMaxValues;
  size_t bytes_left = kYamlMaxTreeBytes;  ///< values, keys and key paths, aliases expanded
};

/// The first control character (other than tab and line breaks) in a value or key, which
/// YAML's escapes ("\0", "\e") can put there although the text had none; -1 if none.
int control_byte(const std::string& text) {
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7F) return c;
  }
  return -1;
}

std::string where_text(const SpecLocation& where, const std::string& path) {
  return fmt::format("{}: {}", where.str(), path.empty() ? "<top level>" : path);
}

SpecNode convert(const YAML::Node& y, const std::string& source, const std::string& path, int depth,
                 ConvertBudget& budget) {
  const SpecLocation where = location_of(y.Mark(), source);
  if (depth > kYamlMaxDepth) {
    const std::string shown = path.size() > 48 ? path.substr(0, 48) + "..." : path;
    throw SpecError(
        fmt::format("{}: nested more than {} levels deep (an alias that contains "
                    "itself?)",
                    where_text(where, shown), kYamlMaxDepth));
  }
  if (budget.values_left == 0) {
    throw SpecError(
        fmt::format("{}: the document holds more than {} values once its aliases "
                    "are expanded",
                    where_text(where, path), kYamlMaxValues));
  }
  --budget.values_left;
  // Each node holds its dotted path: deep keys make every value below them large.
  const size_t cost =
      64 + path.size() + (y.Type() == YAML::NodeType::Scalar ? y.Scalar().size() : 0);
  if (cost > budget.bytes_left) {
    const std::string shown = path.size() > 48 ? path.substr(0, 48) + "..." : path;
    throw SpecError(
        fmt::format("{}: the document holds more than {} MiB of values and keys "
                    "once its aliases are expanded",
                    where_text(where, shown), kYamlMaxTreeBytes >> 20));
  }
  budget.bytes_left -= cost;
  switch (y.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      return SpecNode::none(where, path);
    case YAML::NodeType::Scalar:
      if (y.Scalar().size() > kYamlMaxScalarBytes) {
        throw SpecError(fmt::format("{}: a value of {} bytes; at most {} are accepted",
                                    where_text(where, path), y.Scalar().size(),
                                    kYamlMaxScalarBytes));
      }
      if (const int c = control_byte(y.Scalar()); c >= 0) {
        throw SpecError(fmt::format("{}: the value holds the control character 0x{:02x}",
                                    where_text(where, path), c));
      }
      return SpecNode::scalar(y.Scalar(), where, path);
    case YAML::NodeType::Sequence: {
      SpecNode n = SpecNode::sequence(where, path);
      size_t index = 0;
      for (const auto& item : y) {
        n.append(convert(item, source, fmt::format("{}[{}]", path, index++), depth + 1, budget));
      }
      return n;
    }
    case YAML::NodeType::Map: {
      SpecNode n = SpecNode::map(where, path);
      std::unordered_set<std::string> keys;
      for (const auto& kv : y) {
        const SpecLocation key_where = location_of(kv.first.Mark(), source);
        if (!kv.first.IsScalar()) {
          throw SpecError(
              fmt::format("{}: map keys must be plain names", where_text(key_where, path)));
        }
        const std::string key = kv.first.Scalar();
        if (key.size() > kYamlMaxKeyBytes) {
          throw SpecError(fmt::format("{}: a key of {} bytes; at most {} are accepted",
                                      where_text(key_where, path), key.size(), kYamlMaxKeyBytes));
        }
        if (const int c = control_byte(key); c >= 0) {
          throw SpecError(fmt::format("{}: a key holds the control character 0x{:02x}",
                                      where_text(key_where, path), c));
        }
        if (!keys.insert(key).second) {
          throw SpecError(
              fmt::format("{}: {}: duplicate key", key_where.str(), child_path(path, key)));
        }
        n.add_new(key, convert(kv.second, source, child_path(path, key), depth + 1, budget),
                  key_where);
      }
      return n;
    }
  }
  return {};
}

/// Length of the UTF-8 sequence starting at text[i] (1 to 4), or 0 if it is not one.
size_t utf8_length(const std::string& text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i);
  size_t n = 0;
  uint32_t code = 0;
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) {
    n = 2;
    code = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3;
    code = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4;
    code = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > text.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    code = (code << 6) | (byte(i + k) & 0x3F);
  }
  // Overlong forms, UTF-16 surrogates and values past Unicode's range.
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (code < kMin[n] || (code >= 0xD800 && code <= 0xDFFF) || code > 0x10FFFF) return 0;
  return n;
}

/// YAML text is UTF-8 without control characters other than tab and line breaks; the
/// first offending byte is named by line and column, and nothing else is parsed.
void check_yaml_text(const std::string& text, const std::string& source) {
  int line = 1;
  int column = 1;
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const size_t n = utf8_length(text, i);
    const bool control = c < 0x20 && c != '\t' && c != '\n' && c != '\r';
    if (n == 0 || control || c == 0x7F) {
      throw SpecError(
          fmt::format("{}: byte 0x{:02x} is not allowed in YAML text (it must be "
                      "UTF-8 without control characters)",
                      SpecLocation{source, line, column}.str(), c));
    }
    if (c == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
    i += n;
  }
}

SpecNode parse_checked(const std::string& text, const std::string& source_name,
                       const std::string& base_path = "") {
  check_yaml_text(text, source_name);
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::DeepRecursion& e) {
    // yaml-cpp's own bound; its message ("bad file") and position say nothing useful.
    throw SpecError(fmt::format("{}: nested more than {} levels deep", source_name,
                                std::max(e.depth() - 1, kYamlMaxDepth)));
  } catch (const YAML::Exception& e) {
    throw SpecError(
        fmt::format("{}: YAML syntax error: {}", location_of(e.mark, source_name).str(), e.msg));
  }
  ConvertBudget budget;
  return convert(root, source_name, base_path, 0, budget);
}

}  // namespace

SpecNode parse_yaml(const std::string& text, const std::string& source_name) {
  if (text.size() > kYamlMaxFileBytes) {
    throw SpecError(fmt::format("{}: {} of YAML; at most {} are accepted", source_name,
                                core::describe_size(text.size()),
                                core::describe_size(kYamlMaxFileBytes)));
  }
  return parse_checked(text, source_name);
}

SpecNode load_yaml_file(const std::string& path, const std::string& what) {
  const auto in = core::read_input_file(path, kYamlMaxFileBytes);
  if (!in.ok()) throw SpecError(fmt::format("{}: cannot read the {}: {}", path, what, in.error));
  SpecNode root = parse_checked(in.bytes, path);
  if (root.is_null()) {
    throw SpecError(fmt::format("{}: the {} is empty (no YAML document)", path, what));
  }
  return root;
}

void apply_override(SpecNode& root, const std::string& assignment) {
  const auto eq = assignment.find('=');
  // Every node of the override carries this location: a long override is shown short.
  const std::string shown =
      assignment.size() > 200 ? assignment.substr(0, 160) + "..." : assignment;
  const SpecLocation where{fmt::format("--set {}", printable(shown)), 0, 0};
  if (eq == std::string::npos || eq == 0) {
    throw SpecError(fmt::format("{}: expected key=value, e.g. --set semantic.seed=7", where.str()));
  }
  const std::string key = printable(assignment.substr(0, eq));
  if (assignment.size() > kYamlMaxScalarBytes) {
    throw SpecError(fmt::format("--set: an override of {} bytes; at most {} are accepted",
                                assignment.size(), kYamlMaxScalarBytes));
  }
  // Errors inside the value name the override itself, not a line of it.
  SpecNode value;
  try {
    value = parse_checked(assignment.substr(eq + 1), where.file, key);
  } catch (const SpecError& e) {
    const std::string what = e.what();
    const auto colon = what.find(": ", where.file.size());
    throw SpecError(fmt::format("{}: cannot parse the value: {}", where.str(),
                                colon == std::string::npos ? what : what.substr(colon + 2)));
  }
  // Every node of the override carries the override itself as its location.
  value.relocate(where);
  SpecNode* node = &root;
  std::stringstream parts(key);
  std::string part;
  std::vector<std::string> names;
  while (std::getline(parts, part, '.')) {
    if (part.empty()) throw SpecError(fmt::format("{}: empty key component", where.str()));
    names.push_back(part);
  }
  if (names.size() > static_cast<size_t>(kYamlMaxDepth)) {
    throw SpecError(
        fmt::format("{}: a key of more than {} components", where.str(), kYamlMaxDepth));
  }
  for (size_t i = 0; i + 1 < names.size(); ++i) {
    if (!node->is_map() && !node->is_null()) {
      throw SpecError(fmt::format("{}: {} is not a section", where.str(), node->path()));
    }
    SpecNode* next = const_cast<SpecNode*>(node->find(names[i]));
    if (!next || next->is_null()) next = &node->set(names[i], SpecNode::map(where), where);
    node = next;
  }
  if (!node->is_map() && !node->is_null()) {
    throw SpecError(fmt::format("{}: {} is not a section", where.str(), node->path()));
  }
  // "key=null" (or "key=") unsets a key, e.g. --set semantic.epochs=null with --set
  // semantic.steps=N.
  node->set(names.back(), std::move(value), where);
}

std::string yaml_quoted(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}

std::string printable(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const size_t n = utf8_length(text, i);
    if (n == 0 || c < 0x20 || c == 0x7F) {
      out += fmt::format("\\x{:02x}", c);
      ++i;
    } else {
      out.append(text, i, n);
      i += n;
    }
  }
  return out;
}

void throw_unknown_name(const SpecNode& name_node, const std::string& kind, const std::string& name,
                        const std::vector<std::string>& choices) {
  throw SpecError(fmt::format("{}: unknown {} '{}'; choices: {}", name_node.describe(), kind, name,
                              fmt::join(choices, ", ")));
}

// ---- OptionReader ------------------------------------------------------------

OptionReader::OptionReader(const SpecNode& node) : node_(node) {
  if (!node.is_null() && !node.is_map()) {
    throw SpecError(fmt::format("{}: expected a section (a map of key: value)", node.describe()));
  }
}

bool OptionReader::has(const std::string& key) const {
  const SpecNode* n = node_.find(key);
  return n && !n->is_null();
}

const SpecNode* OptionReader::lookup(const std::string& key) {
  known_.push_back(key);
  const SpecNode* n = node_.find(key);
  return (n && !n->is_null()) ? n : nullptr;
}

void OptionReader::fail(const std::string& key, const std::string& message) const {
  const SpecNode* n = node_.find(key);
  if (n) throw SpecError(fmt::format("{}: {}", n->describe(), message));
  const std::string path = node_.path().empty() ? key : node_.path() + "." + key;
  throw SpecError(fmt::format("{}: {}: {}", node_.where().str(), path, message));
}

namespace {

const SpecNode& expect_scalar(const SpecNode& n, const char* what) {
  if (!n.is_scalar()) {
    throw SpecError(fmt::format("{}: expected {}, got {}", n.describe(), what,
                                n.is_map()        ? "a section"
                                : n.is_sequence() ? "a list"
                                                  : "nothing"));
  }
  return n;
}

int64_t parse_int(const SpecNode& n) {
  const std::string& s = expect_scalar(n, "an integer").value();
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE) {
    throw SpecError(fmt::format("{}: expected an integer, got '{}'", n.describe(), s));
  }
  return v;
}

double parse_double(const SpecNode& n) {
  const std::string& s = expect_scalar(n, "a number").value();
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v)) {
    throw SpecError(fmt::format("{}: expected a number, got '{}'", n.describe(), s));
  }
  return v;
}

template <typename T>
void check_range(const SpecNode& n, T v, T min, T max) {
  if (v >= min && v <= max) return;
  // A bound at the type's limit is no bound worth printing.
  if (max == std::numeric_limits<T>::max()) {
    throw SpecError(fmt::format("{}: must be >= {}, got {}", n.describe(), min, v));
  }
  if (min == std::numeric_limits<T>::lowest()) {
    throw SpecError(fmt::format("{}: must be <= {}, got {}", n.describe(), max, v));
  }
  throw SpecError(fmt::format("{}: value {} is out of range [{}, {}]", n.describe(), v, min, max));
}

}  // namespace

int64_t read_int(const SpecNode& node, int64_t min, int64_t max) {
  const int64_t v = parse_int(node);
  check_range(node, v, min, max);
  return v;
}

double read_double(const SpecNode& node, double min, double max) {
  const double v = parse_double(node);
  check_range(node, v, min, max);
  return v;
}

int64_t OptionReader::get_int(const std::string& key, int64_t fallback, int64_t min, int64_t max) {
  const SpecNode* n = lookup(key);
  return n ? read_int(*n, min, max) : fallback;
}

double OptionReader::get_double(const std::string& key, double fallback, double min, double max) {
  const SpecNode* n = lookup(key);
  return n ? read_double(*n, min, max) : fallback;
}

bool OptionReader::get_bool(const std::string& key, bool fallback) {
  const SpecNode* n = lookup(key);
  if (!n) return fallback;
  std::string s = expect_scalar(*n, "true or false").value();
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "true" || s == "yes" || s == "on") return true;
  if (s == "false" || s == "no" || s == "off") return false;
  throw SpecError(fmt::format("{}: expected true or false, got '{}'", n->describe(), n->value()));
}

std::string OptionReader::get_string(const std::string& key, const std::string& fallback) {
  const SpecNode* n = lookup(key);
  if (!n) return fallback;
  return expect_scalar(*n, "a string").value();
}

std::string OptionReader::get_choice(const std::string& key, const std::string& fallback,
                                     const std::vector<std::string>& choices) {
  const SpecNode* n = lookup(key);
  if (!n) return fallback;
  const std::string& s = expect_scalar(*n, "a name").value();
  if (std::find(choices.begin(), choices.end(), s) == choices.end()) {
    throw SpecError(fmt::format("{}: unknown value '{}'; choices: {}", n->describe(), s,
                                fmt::join(choices, ", ")));
  }
  return s;
}

namespace {
template <typename T, typename Parse>
std::vector<T> parse_list(const SpecNode& n, T min, T max, Parse parse, const char* expected) {
  if (!n.is_sequence()) throw SpecError(fmt::format("{}: expected {}", n.describe(), expected));
  std::vector<T> out;
  for (const auto& item : n.items()) {
    const T v = parse(item);
    check_range(item, v, min, max);
    out.push_back(v);
  }
  return out;
}
}  // namespace

std::vector<int64_t> OptionReader::get_int_list(const std::string& key,
                                                std::vector<int64_t> fallback, int64_t min,
                                                int64_t max) {
  const SpecNode* n = lookup(key);
  if (!n) return fallback;
  return parse_list(*n, min, max, parse_int, "a list of integers, e.g. [32, 64]");
}

std::vector<double> OptionReader::get_double_list(const std::string& key,
                                                  std::vector<double> fallback, double min,
                                                  double max) {
  const SpecNode* n = lookup(key);
  if (!n) return fallback;
  return parse_list(*n, min, max, parse_double, "a list of numbers, e.g. [10, 20]");
}

const SpecNode* OptionReader::value(const std::string& key) { return lookup(key); }

const SpecNode& OptionReader::section(const std::string& key) {
  const SpecNode* n = lookup(key);
  if (!n) {
    // An absent section still knows where it would be, for errors about its defaults.
    absent_.push_back(SpecNode::none(node_.where(), child_path(node_.path(), key)));
    return absent_.back();
  }
  if (!n->is_map()) {
    throw SpecError(fmt::format("{}: expected a section (a map of key: value)", n->describe()));
  }
  return *n;
}

std::vector<std::string> OptionReader::get_string_list(const std::string& key,
                                                       std::vector<std::string> fallback) {
  const SpecNode* n = lookup(key);
  if (!n) return fallback;
  if (n->is_scalar()) return {n->value()};
  if (!n->is_sequence())
    throw SpecError(fmt::format("{}: expected a list of strings", n->describe()));
  std::vector<std::string> out;
  for (const auto& item : n->items()) out.push_back(expect_scalar(item, "a string").value());
  return out;
}

const std::vector<SpecNode>& OptionReader::list(const std::string& key) {
  static const std::vector<SpecNode> empty;
  const SpecNode* n = lookup(key);
  if (!n) return empty;
  if (!n->is_sequence()) {
    throw SpecError(fmt::format("{}: expected a list", n->describe()));
  }
  return n->items();
}

void OptionReader::finish() const {
  for (const auto& [k, v] : node_.entries()) {
    if (std::find(known_.begin(), known_.end(), k) == known_.end()) {
      std::vector<std::string> choices = known_;
      std::sort(choices.begin(), choices.end());
      choices.erase(std::unique(choices.begin(), choices.end()), choices.end());
      throw SpecError(fmt::format("{}: {}: unknown key; known keys here: {}", v.key_where().str(),
                                  v.path(), fmt::join(choices, ", ")));
    }
  }
}

}  // namespace vflow
