#include "vflow/core/spec_node.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

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
  path_ = path;
  for (auto& [k, v] : entries_) v.reroot(child_path(path_, k));
  for (size_t i = 0; i < items_.size(); ++i) items_[i].reroot(fmt::format("{}[{}]", path_, i));
}

std::string SpecNode::to_yaml(int indent) const {
  const std::string pad(static_cast<size_t>(indent), ' ');
  auto inline_form = [](const SpecNode& n) -> std::optional<std::string> {
    if (n.is_null()) return std::string("null");
    if (n.is_scalar()) {
      const bool plain = !n.value_.empty() &&
                         n.value_.find_first_of(":#{}[],&*!|>'\"%@`\n") == std::string::npos &&
                         n.value_.front() != ' ' && n.value_.back() != ' ';
      return plain ? n.value_ : fmt::format("\"{}\"", n.value_);
    }
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

SpecNode convert(const YAML::Node& y, const std::string& source, const std::string& path) {
  const SpecLocation where = location_of(y.Mark(), source);
  switch (y.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null: {
      SpecNode n;
      n.reroot(path);
      return n;
    }
    case YAML::NodeType::Scalar:
      return SpecNode::scalar(y.Scalar(), where, path);
    case YAML::NodeType::Sequence: {
      SpecNode n = SpecNode::sequence(where, path);
      for (const auto& item : y) n.append(convert(item, source, ""));
      return n;
    }
    case YAML::NodeType::Map: {
      SpecNode n = SpecNode::map(where, path);
      for (const auto& kv : y) {
        const SpecLocation key_where = location_of(kv.first.Mark(), source);
        if (!kv.first.IsScalar()) {
          throw SpecError(fmt::format("{}: {}: map keys must be plain names", key_where.str(),
                                      path.empty() ? "<top level>" : path));
        }
        const std::string key = kv.first.Scalar();
        if (n.find(key)) {
          throw SpecError(
              fmt::format("{}: {}: duplicate key", key_where.str(), child_path(path, key)));
        }
        n.set(key, convert(kv.second, source, ""), key_where);
      }
      return n;
    }
  }
  return {};
}

}  // namespace

SpecNode parse_yaml(const std::string& text, const std::string& source_name) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw SpecError(
        fmt::format("{}: YAML syntax error: {}", location_of(e.mark, source_name).str(), e.msg));
  }
  return convert(root, source_name, "");
}

SpecNode load_yaml_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw SpecError(fmt::format("{}: cannot open job spec: {}", path, std::strerror(errno)));
  std::stringstream buf;
  buf << in.rdbuf();
  return parse_yaml(buf.str(), path);
}

void apply_override(SpecNode& root, const std::string& assignment) {
  const auto eq = assignment.find('=');
  const SpecLocation where{fmt::format("--set {}", assignment), 0, 0};
  if (eq == std::string::npos || eq == 0) {
    throw SpecError(fmt::format("{}: expected key=value, e.g. --set semantic.seed=7", where.str()));
  }
  const std::string key = assignment.substr(0, eq);
  SpecNode value;
  try {
    value = convert(YAML::Load(assignment.substr(eq + 1)), where.file, "");
  } catch (const YAML::Exception& e) {
    throw SpecError(fmt::format("{}: cannot parse the value: {}", where.str(), e.msg));
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

void throw_unknown_name(const SpecNode& name_node, const std::string& kind, const std::string& name,
                        const std::vector<std::string>& choices) {
  throw SpecError(fmt::format("{}: unknown {} '{}'; choices: {}", name_node.describe(), kind, name,
                              fmt::join(choices, ", ")));
}

// ---- OptionReader ------------------------------------------------------------

namespace {
const SpecNode& null_node() {
  static const SpecNode n;
  return n;
}
}  // namespace

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
    throw SpecError(fmt::format("{}: expected {}, got a {}", n.describe(), what,
                                n.is_map() ? "section" : "list"));
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
  if (v < min || v > max) {
    throw SpecError(
        fmt::format("{}: value {} is out of range [{}, {}]", n.describe(), v, min, max));
  }
}

}  // namespace

int64_t OptionReader::get_int(const std::string& key, int64_t fallback, int64_t min, int64_t max) {
  const SpecNode* n = lookup(key);
  if (!n) return fallback;
  const int64_t v = parse_int(*n);
  check_range(*n, v, min, max);
  return v;
}

double OptionReader::get_double(const std::string& key, double fallback, double min, double max) {
  const SpecNode* n = lookup(key);
  if (!n) return fallback;
  const double v = parse_double(*n);
  check_range(*n, v, min, max);
  return v;
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

std::vector<int64_t> OptionReader::get_int_list(const std::string& key,
                                                std::vector<int64_t> fallback, int64_t min,
                                                int64_t max) {
  const SpecNode* n = lookup(key);
  if (!n) return fallback;
  if (!n->is_sequence()) {
    throw SpecError(fmt::format("{}: expected a list of integers, e.g. [32, 64]", n->describe()));
  }
  std::vector<int64_t> out;
  for (const auto& item : n->items()) {
    const int64_t v = parse_int(item);
    check_range(item, v, min, max);
    out.push_back(v);
  }
  return out;
}

const SpecNode& OptionReader::section(const std::string& key) {
  const SpecNode* n = lookup(key);
  if (!n) return null_node();
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
