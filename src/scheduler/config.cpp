#include "vflow/scheduler/config.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <functional>
#include <map>

#include "vflow/core/error.h"

namespace vflow::scheduler {
namespace {

std::string where(const std::string& path, const YAML::Node& node, const std::string& key) {
  const auto mark = node.Mark();
  return fmt::format("{}:{}:{}: {}", path, mark.line + 1, mark.column + 1, key);
}

template <typename T>
T scalar(const std::string& path, const YAML::Node& node, const std::string& key, double min) {
  T value{};
  try {
    value = node.as<T>();
  } catch (const YAML::Exception&) {
    throw SpecError(fmt::format("{}: expected a number", where(path, node, key)));
  }
  if (!(static_cast<double>(value) >= min)) {
    throw SpecError(fmt::format("{}: must be >= {}", where(path, node, key), min));
  }
  return value;
}

std::string cluster_text(const std::string& path, const YAML::Node& node) {
  if (node.IsScalar()) return node.as<std::string>();
  if (!node.IsMap())
    throw SpecError(fmt::format("{}: expected a map or a string", where(path, node, "cluster")));
  std::string text;
  for (const auto& item : node) {
    const auto name = item.first.as<std::string>();
    const int count = scalar<int>(path, item.second, "cluster." + name, 1);
    text += fmt::format("{}{}:{}", text.empty() ? "" : ",", name, count);
  }
  return text;
}

std::string resolve(const std::string& config_path, const std::string& file) {
  if (file.empty() || file[0] == '/') return file;
  const auto slash = config_path.rfind('/');
  return slash == std::string::npos ? file : config_path.substr(0, slash + 1) + file;
}

}  // namespace

void load_config(const std::string& path, SchedulerConfig& config) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    throw SpecError(fmt::format("{}: cannot open config file", path));
  } catch (const YAML::ParserException& e) {
    throw SpecError(fmt::format("{}:{}:{}: {}", path, e.mark.line + 1, e.mark.column + 1, e.msg));
  }
  if (root.IsNull()) return;
  if (!root.IsMap()) throw SpecError(fmt::format("{}: the config must be a map", path));
  using Setter = std::function<void(const YAML::Node&, const std::string&)>;
  auto number = [&](double& field, double min) -> Setter {
    return [&, min](const YAML::Node& n, const std::string& k) {
      field = scalar<double>(path, n, k, min);
    };
  };
  std::map<std::string, Setter> keys = {
      {"cluster", [&](auto& n, auto&) { config.cluster = cluster_text(path, n); }},
      {"throughput",
       [&](auto& n, auto&) { config.throughput = resolve(path, n.template as<std::string>()); }},
      {"resize_pause_s", number(config.sim.resize_pause_s, 0)},
      {"restart_s", number(config.sim.restart_s, 0)},
      {"startup_s", number(config.sim.startup_s, 0)},
      {"min_workers",
       [&](auto& n, auto& k) { config.bind.min_workers = scalar<int>(path, n, k, 1); }},
      {"max_workers_factor", number(config.bind.max_workers_factor, 1)},
      {"fallback_parallel_fraction", number(config.bind.fallback_parallel_fraction, 0)},
      {"las_round_s", number(config.policy.las_round_s, 0)},
      {"gavel_round_s", number(config.policy.gavel_round_s, 0)},
      {"las_thresholds",
       [&](auto& n, auto& k) {
         config.policy.las_thresholds.clear();
         for (const auto& v : n)
           config.policy.las_thresholds.push_back(scalar<double>(path, v, k, 0));
       }},
  };
  for (const auto& item : root) {
    const auto key = item.first.as<std::string>();
    const auto it = keys.find(key);
    if (it == keys.end())
      throw SpecError(fmt::format("{}: unknown key", where(path, item.first, key)));
    it->second(item.second, key);
  }
  if (config.bind.fallback_parallel_fraction > 1) {
    throw SpecError(fmt::format("{}: fallback_parallel_fraction must be <= 1", path));
  }
}

}  // namespace vflow::scheduler
