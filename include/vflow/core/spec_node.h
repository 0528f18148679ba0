// A configuration tree that remembers where each value came from.
//
// Job specs are parsed from YAML (or built in code) into SpecNode trees; every
// node carries its source location and dotted key path, so that validation
// errors name file, line and key. OptionReader reads a map node strictly:
// typed getters with ranges, and finish() rejects keys nobody asked for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace vflow {

/// Where a configuration value came from: a file position or a command-line override.
struct SpecLocation {
  std::string file;  ///< file name, or a description such as "--set" or "<built-in default job>"
  int line = 0;      ///< 1-based; 0 when unknown
  int column = 0;    ///< 1-based; 0 when unknown

  /// "job.yaml:12:5", "job.yaml" or the bare description.
  std::string str() const;
};

class SpecNode {
 public:
  enum class Kind { Null, Scalar, Map, Sequence };

  SpecNode() = default;
  static SpecNode scalar(std::string value, SpecLocation where = {}, std::string path = {});
  static SpecNode map(SpecLocation where = {}, std::string path = {});
  static SpecNode sequence(SpecLocation where = {}, std::string path = {});
  /// A null value that still knows where it was written (`key:` or `- ` with nothing after).
  static SpecNode none(SpecLocation where, std::string path = {});

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::Null; }
  bool is_map() const { return kind_ == Kind::Map; }
  bool is_scalar() const { return kind_ == Kind::Scalar; }
  bool is_sequence() const { return kind_ == Kind::Sequence; }

  const std::string& value() const { return value_; }
  const SpecLocation& where() const { return where_; }
  const std::string& path() const { return path_; }

  /// Map entries in source order; the location of each key is the child's key_where().
  const std::vector<std::pair<std::string, SpecNode>>& entries() const { return entries_; }
  const std::vector<SpecNode>& items() const { return items_; }
  const SpecLocation& key_where() const { return key_where_; }

  const SpecNode* find(const std::string& key) const;
  /// Inserts or replaces a map entry; the child's path becomes "<path>.<key>".
  SpecNode& set(const std::string& key, SpecNode child, SpecLocation key_where = {});
  /// Appends an entry for a key this map does not hold yet (the caller checked: no search).
  SpecNode& add_new(const std::string& key, SpecNode child, SpecLocation key_where = {});
  void append(SpecNode item);

  /// Re-roots the paths of this subtree under `path` (used when a tree is grafted).
  void reroot(const std::string& path);

  /// Gives this subtree one location (used for command-line overrides).
  void relocate(const SpecLocation& where);

  /// Deterministic YAML-flow rendering, used for digests and --print-spec.
  std::string to_yaml(int indent = 0) const;
  /// The same on one line: maps as {key: value, ...}, sequences as [a, b].
  std::string to_flow() const;

  /// "<location>: <path>" prefix for error messages about this node.
  std::string describe() const;

 private:
  Kind kind_ = Kind::Null;
  std::string value_;
  std::vector<std::pair<std::string, SpecNode>> entries_;
  std::vector<SpecNode> items_;
  SpecLocation where_;
  SpecLocation key_where_;
  std::string path_;
};

/// Bounds on every YAML input (job specs, overrides, profiles, scheduler files): deeper
/// nesting, more values (aliases expanded), longer values or larger files are a SpecError.
inline constexpr int kYamlMaxDepth = 64;
inline constexpr size_t kYamlMaxValues = 200'000;
inline constexpr size_t kYamlMaxScalarBytes = 1 << 20;
inline constexpr size_t kYamlMaxKeyBytes = 1024;
inline constexpr size_t kYamlMaxFileBytes = 64 << 20;
inline constexpr size_t kYamlMaxTreeBytes = 64 << 20;

/// Applies "a.b.c=value" to a tree; the value is parsed as a YAML scalar or flow collection.
/// "a.b.c=" or "a.b.c=null" unsets the key. Errors name the override itself.
void apply_override(SpecNode& root, const std::string& assignment);

/// Parses YAML text into a SpecNode tree. Text that is not UTF-8 or holds control
/// characters, syntax errors and the bounds above become SpecError with file:line.
/// An empty text is a Null node.
SpecNode parse_yaml(const std::string& text, const std::string& source_name);
/// Reads and parses a YAML file that holds a `what` ("job spec", "profile", ...). A
/// missing, unreadable or empty file, or one that is not a regular file (a directory, a
/// FIFO, a device), is a SpecError naming it.
SpecNode load_yaml_file(const std::string& path, const std::string& what);

/// A value that is not a key of a map (a list item, say) read as OptionReader reads a key's:
/// an integer, or a finite number, in [min, max]; otherwise a SpecError naming where.
int64_t read_int(const SpecNode& node, int64_t min, int64_t max);
double read_double(const SpecNode& node, double min, double max);

/// `text` as a YAML double-quoted scalar, for building an override from a value that is
/// not YAML (a path with '#' or ': ' in it): `--set key=` + yaml_quoted(path).
std::string yaml_quoted(const std::string& text);

/// `text` with bytes that a terminal would not show as themselves written as \xNN.
std::string printable(const std::string& text);

/// One row of a key table in the reference docs: dotted key, default, meaning.
struct SpecKeyRow {
  std::string key;
  std::string default_text;
  std::string doc;
};

/// Strict, typed reader over one map node. Every getter marks its key as known;
/// finish() throws SpecError for keys that no getter asked for, naming the choices.
class OptionReader {
 public:
  /// `node` may be Null (an absent section): every getter then returns its default.
  explicit OptionReader(const SpecNode& node);

  bool has(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t fallback, int64_t min, int64_t max);
  double get_double(const std::string& key, double fallback, double min, double max);
  bool get_bool(const std::string& key, bool fallback);
  std::string get_string(const std::string& key, const std::string& fallback);
  std::string get_choice(const std::string& key, const std::string& fallback,
                         const std::vector<std::string>& choices);
  std::vector<int64_t> get_int_list(const std::string& key, std::vector<int64_t> fallback,
                                    int64_t min, int64_t max);
  std::vector<double> get_double_list(const std::string& key, std::vector<double> fallback,
                                      double min, double max);
  /// A value of any kind (nullptr when absent or null), for keys that take several forms.
  const SpecNode* value(const std::string& key);
  /// A list of strings; a single scalar counts as a list of one.
  std::vector<std::string> get_string_list(const std::string& key,
                                           std::vector<std::string> fallback);
  /// A nested section (a map or absent); marks the key as known.
  const SpecNode& section(const std::string& key);
  /// A nested list (empty when absent); marks the key as known.
  const std::vector<SpecNode>& list(const std::string& key);

  /// Throws SpecError on the first key that no getter asked for.
  void finish() const;

  /// Error naming this reader's node (for cross-field checks).
  [[noreturn]] void fail(const std::string& key, const std::string& message) const;
  const SpecNode& node() const { return node_; }

 private:
  const SpecNode* lookup(const std::string& key);
  const SpecNode& node_;
  std::vector<std::string> known_;
  std::deque<SpecNode> absent_;  ///< the sections section() found absent, with their place
};

}  // namespace vflow
