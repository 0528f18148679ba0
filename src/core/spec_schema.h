// The keys of one configuration section, each declared once.
//
// A SpecSchema<T> lists a section's keys in order, each bound to a member of T with
// its type, range or choices and its doc line; the default is the member's value in a
// default-constructed T. The parser (read), the printed tree (tree) and the key tables
// of the reference docs (rows) all come from this one declaration, so a key cannot be
// parsed but not printed, or documented with a default the parser does not use.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "vflow/core/spec_node.h"

namespace vflow {

template <class T>
class SpecSchema {
 public:
  using Predicate = std::function<bool(const T&)>;
  /// Runs after its key is read, with the section read so far: cross-key checks (which
  /// call reader.fail) and values derived from others.
  using After = std::function<void(OptionReader&, T&)>;
  /// Sets a key's default from keys read before it (absent keys only).
  using Fallback = std::function<void(T&)>;

 private:
  struct KeyData {
    std::string name;
    std::string doc;
    std::string default_text;       ///< the docs' default column; empty = the member's default
    std::vector<std::string> only;  ///< selector values the key applies to; empty = all
    Predicate shown;                ///< printed when true; null = whenever it applies
    Fallback fallback;
    After after;
    std::function<void(OptionReader&, T&)> read;     ///< absent = leave the member as it is
    std::function<void(SpecNode&, const T&)> print;  ///< adds the key to a map; null = never
    std::function<void(const std::string&, std::vector<SpecKeyRow>&)> nested_rows;
  };

 public:
  /// Fluent extras of one key.
  class Key {
   public:
    explicit Key(KeyData& data) : data_(data) {}
    /// Applies only when the section's selector holds one of `values` (see variants()).
    Key& only_for(std::vector<std::string> values) {
      data_.only = std::move(values);
      return *this;
    }
    /// Printed in the tree only when `pred` holds (default: whenever the key applies).
    Key& shown(Predicate pred) {
      data_.shown = std::move(pred);
      return *this;
    }
    /// A default computed from earlier keys; `text` is the docs' default column.
    Key& fallback(Fallback set, std::string text) {
      data_.fallback = std::move(set);
      data_.default_text = std::move(text);
      return *this;
    }
    Key& after(After check) {
      data_.after = std::move(check);
      return *this;
    }
    /// The docs' default column, where the member's own default says too little ("unset").
    Key& default_text(std::string text) {
      data_.default_text = std::move(text);
      return *this;
    }

   private:
    KeyData& data_;
  };

  /// `label` names the section in messages ("optimizer").
  explicit SpecSchema(std::string label = {}) : label_(std::move(label)) {}

  /// Keys declared only_for(...) apply when `selector` (the key `selector_key`) holds one
  /// of their values. `articles` gives the article a message puts before each value
  /// ({"sgd", "an"}: "momentum is an sgd or lars option"); absent = "a".
  void variants(std::string T::*selector, std::string selector_key,
                std::vector<std::pair<std::string, std::string>> articles) {
    selector_ = selector;
    selector_key_ = std::move(selector_key);
    articles_ = std::move(articles);
  }

  Key integer(std::string key, int64_t T::*m, int64_t min, int64_t max, std::string doc) {
    return add(
        std::move(key), std::move(doc),
        [m, min, max](OptionReader& r, const std::string& k, T& v) {
          v.*m = r.get_int(k, v.*m, min, max);
        },
        [m](const T& v) { return SpecNode::scalar(std::to_string(v.*m)); });
  }
  Key integer(std::string key, uint64_t T::*m, uint64_t max, std::string doc) {
    return add(
        std::move(key), std::move(doc),
        [m, max](OptionReader& r, const std::string& k, T& v) {
          v.*m = static_cast<uint64_t>(
              r.get_int(k, static_cast<int64_t>(v.*m), 0, static_cast<int64_t>(max)));
        },
        [m](const T& v) { return SpecNode::scalar(std::to_string(v.*m)); });
  }
  Key real(std::string key, double T::*m, double min, double max, std::string doc) {
    return add(
        std::move(key), std::move(doc),
        [m, min, max](OptionReader& r, const std::string& k, T& v) {
          v.*m = r.get_double(k, v.*m, min, max);
        },
        [m](const T& v) { return SpecNode::scalar(fmt::format("{}", v.*m)); });
  }
  Key boolean(std::string key, bool T::*m, std::string doc) {
    return add(
        std::move(key), std::move(doc),
        [m](OptionReader& r, const std::string& k, T& v) { v.*m = r.get_bool(k, v.*m); },
        [m](const T& v) { return SpecNode::scalar(v.*m ? "true" : "false"); });
  }
  Key text(std::string key, std::string T::*m, std::string doc) {
    return add(
        std::move(key), std::move(doc),
        [m](OptionReader& r, const std::string& k, T& v) { v.*m = r.get_string(k, v.*m); },
        [m](const T& v) { return SpecNode::scalar(v.*m); });
  }
  Key choice(std::string key, std::string T::*m, std::vector<std::string> choices,
             std::string doc) {
    return add(
        std::move(key), std::move(doc),
        [m, choices](OptionReader& r, const std::string& k, T& v) {
          v.*m = r.get_choice(k, v.*m, choices);
        },
        [m](const T& v) { return SpecNode::scalar(v.*m); });
  }
  /// An enumeration, read and written by name: `values` in the order the doc line gives
  /// them, each named by `to_string(E)` (found beside E), so that its names are spelled once.
  template <class E, class = std::enable_if_t<std::is_enum_v<E>>>
  Key choice(std::string key, E T::*m, std::vector<E> values, std::string doc) {
    std::vector<std::string> names;
    for (const E e : values) names.push_back(to_string(e));
    return add(
        std::move(key), std::move(doc),
        [m, values, names](OptionReader& r, const std::string& k, T& v) {
          const std::string chosen = r.get_choice(k, to_string(v.*m), names);
          v.*m = values[std::find(names.begin(), names.end(), chosen) - names.begin()];
        },
        [m](const T& v) { return SpecNode::scalar(to_string(v.*m)); });
  }
  Key integers(std::string key, std::vector<int64_t> T::*m, int64_t min, int64_t max,
               std::string doc) {
    return add(
        std::move(key), std::move(doc),
        [m, min, max](OptionReader& r, const std::string& k, T& v) {
          v.*m = r.get_int_list(k, v.*m, min, max);
        },
        [m](const T& v) {
          SpecNode list = SpecNode::sequence();
          for (const int64_t x : v.*m) list.append(SpecNode::scalar(std::to_string(x)));
          return list;
        });
  }
  /// A list of strings; a single string counts as a list of one.
  Key texts(std::string key, std::vector<std::string> T::*m, std::string doc) {
    return add(
        std::move(key), std::move(doc),
        [m](OptionReader& r, const std::string& k, T& v) { v.*m = r.get_string_list(k, v.*m); },
        [m](const T& v) {
          SpecNode list = SpecNode::sequence();
          for (const auto& x : v.*m) list.append(SpecNode::scalar(x));
          return list;
        });
  }
  /// A map of options that another reader checks (a model's or data set's factory). An
  /// absent map keeps its place, so that errors about its defaults name where it would be.
  Key options(std::string key, SpecNode T::*m, std::string doc) {
    return add(
        std::move(key), std::move(doc),
        [m](OptionReader& r, const std::string& k, T& v) {
          if (r.has(k) || (v.*m).is_null()) {
            v.*m = r.section(k);
          } else {
            r.value(k);  // set before (a shorthand): keep it, and know the key
          }
        },
        [m](const T& v) { return (v.*m).is_null() ? SpecNode::map() : v.*m; });
  }
  /// A value of any form that the caller checks itself (a list of transforms, say); kept
  /// with its place for messages, and printed as written.
  Key node(std::string key, SpecNode T::*m, std::string doc) {
    return add(
        std::move(key), std::move(doc),
        [m](OptionReader& r, const std::string& k, T& v) {
          if (const SpecNode* n = r.value(k)) v.*m = *n;
        },
        [m](const T& v) { return (v.*m).is_null() ? SpecNode::sequence() : v.*m; });
  }
  /// A nested section with its own schema.
  template <class S>
  Key section(std::string key, S T::*m, const SpecSchema<S>& schema) {
    Key k = add(
        std::move(key), {},
        [m, &schema](OptionReader& r, const std::string& name, T& v) {
          schema.read_section(r.section(name), v.*m);
        },
        [m, &schema](const T& v) { return schema.tree(v.*m); });
    nest_rows(schema, ".");
    return k;
  }
  /// A list of entries, each a section of `schema`; absent or empty = the member's default.
  template <class S>
  Key list(std::string key, std::vector<S> T::*m, const SpecSchema<S>& schema, std::string doc) {
    Key k = add(
        std::move(key), std::move(doc),
        [m, &schema](OptionReader& r, const std::string& name, T& v) {
          const auto& items = r.list(name);
          if (items.empty()) return;
          (v.*m).clear();
          for (const auto& item : items) {
            S value{};
            schema.read_section(item, value);
            (v.*m).push_back(std::move(value));
          }
        },
        [m, &schema](const T& v) {
          SpecNode list = SpecNode::sequence();
          for (const auto& item : v.*m) list.append(schema.tree(item));
          return list;
        });
    keys_.back()->default_text = "empty";
    nest_rows(schema, "[].");
    return k;
  }
  /// A key read by hand (a shorthand); it is neither printed nor given a row.
  Key custom(std::string key, std::function<void(OptionReader&, T&)> read) {
    auto data = std::make_unique<KeyData>();
    data->name = std::move(key);
    data->read = std::move(read);
    keys_.push_back(std::move(data));
    return Key(*keys_.back());
  }

  /// Reads every key of the section in declaration order into `value`, which holds the
  /// defaults. A key given for another variant is refused, naming the keys that apply.
  /// The caller runs reader.finish() (after its own cross-section checks).
  void read(OptionReader& r, T& value) const {
    for (const auto& key : keys_) {
      if (!applies(*key, value)) {
        if (r.has(key->name)) r.fail(key->name, not_applicable(*key, value));
        r.value(key->name);  // a null value of such a key is unset, not unknown
        continue;
      }
      if (key->fallback && !r.has(key->name)) key->fallback(value);
      key->read(r, value);
      if (key->after) key->after(r, value);
    }
  }

  /// Reads a whole section node into `value` (holding the defaults) and refuses keys that
  /// are not in the schema: for sections without checks across their parent's keys.
  void read_section(const SpecNode& node, T& value) const {
    OptionReader r(node);
    read(r, value);
    r.finish();
  }

  /// The section as a map of the keys that are shown, in declaration order.
  SpecNode tree(const T& value) const {
    SpecNode map = SpecNode::map();
    for (const auto& key : keys_) {
      if (!key->print) continue;
      const bool show = key->shown ? key->shown(value) : applies(*key, value);
      if (show) key->print(map, value);
    }
    return map;
  }

  /// The key table: one row per key, nested sections' keys as "prefix.key".
  std::vector<SpecKeyRow> rows(const std::string& prefix = {}) const {
    std::vector<SpecKeyRow> out;
    const T defaults{};
    for (const auto& key : keys_) {
      if (!key->print) continue;
      if (!key->doc.empty()) {
        std::string doc = key->doc;
        if (!key->only.empty()) doc = fmt::format("{} only: {}", fmt::join(key->only, ", "), doc);
        out.push_back({prefix + key->name, default_of(*key, defaults), doc});
      }
      if (key->nested_rows) key->nested_rows(prefix, out);
    }
    return out;
  }

 private:
  Key add(std::string key, std::string doc,
          std::function<void(OptionReader&, const std::string&, T&)> read,
          std::function<SpecNode(const T&)> value) {
    auto data = std::make_unique<KeyData>();
    data->name = std::move(key);
    data->doc = std::move(doc);
    data->read = [read = std::move(read), name = data->name](OptionReader& r, T& v) {
      read(r, name, v);
    };
    data->print = [value = std::move(value), name = data->name](SpecNode& map, const T& v) {
      map.set(name, value(v));
    };
    keys_.push_back(std::move(data));
    return Key(*keys_.back());
  }

  /// The last key's rows are those of `schema`, under "<prefix><key><separator>".
  template <class S>
  void nest_rows(const SpecSchema<S>& schema, const char* separator) {
    KeyData& data = *keys_.back();
    data.nested_rows = [&schema, stem = data.name + separator](const std::string& prefix,
                                                               std::vector<SpecKeyRow>& rows) {
      for (auto& row : schema.rows(prefix + stem)) rows.push_back(std::move(row));
    };
  }

  bool applies(const KeyData& key, const T& value) const {
    return key.only.empty() ||
           std::find(key.only.begin(), key.only.end(), value.*selector_) != key.only.end();
  }

  /// "an sgd or lars option", "an adamw, adam or lamb option"
  std::string phrase(const std::vector<std::string>& values) const {
    std::string article = "a";
    for (const auto& [v, a] : articles_) {
      if (v == values.front()) article = a;
    }
    std::string names = values.front();
    for (size_t i = 1; i < values.size(); ++i) {
      names += (i + 1 == values.size() ? " or " : ", ") + values[i];
    }
    return fmt::format("{} {} option", article, names);
  }

  /// "momentum is an sgd or lars option; optimizer adamw takes lr, weight_decay, ..."
  std::string not_applicable(const KeyData& key, const T& value) const {
    std::vector<std::string> taken;
    for (const auto& k : keys_) {
      if (k->name != selector_key_ && k->print && applies(*k, value)) taken.push_back(k->name);
    }
    return fmt::format("{} is {}; {} {} takes {}", key.name, phrase(key.only), label_,
                       value.*selector_, fmt::join(taken, ", "));
  }

  static std::string default_of(const KeyData& key, const T& defaults) {
    if (!key.default_text.empty()) return key.default_text;
    SpecNode map = SpecNode::map();
    key.print(map, defaults);
    const SpecNode& node = map.entries().front().second;
    if (node.is_map() && node.entries().empty()) return "`{}`";
    if ((node.is_scalar() && node.value().empty()) ||
        (node.is_sequence() && node.items().empty())) {
      return "empty";
    }
    if (node.is_sequence()) {  // a list of scalars, as a flow list: `[32, 64]`
      std::vector<std::string> items;
      for (const auto& item : node.items()) {
        if (item.is_scalar()) items.push_back(item.value());
      }
      if (items.size() == node.items().size()) return fmt::format("`[{}]`", fmt::join(items, ", "));
    }
    std::string text = node.to_yaml();
    while (!text.empty() && text.back() == '\n') text.pop_back();
    return "`" + text + "`";
  }

  std::string label_;
  std::string T::*selector_ = nullptr;
  std::string selector_key_;
  std::vector<std::pair<std::string, std::string>> articles_;
  std::vector<std::unique_ptr<KeyData>> keys_;  // stable addresses: Key refers to its data
};

}  // namespace vflow
