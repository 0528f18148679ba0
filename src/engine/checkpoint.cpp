#include "vflow/engine/checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <regex>

#include "core/zip_check.h"
#include "vflow/core/error.h"
#include "vflow/core/spec_node.h"

namespace vflow::engine {

namespace fs = std::filesystem;

std::string checkpoint_path(const std::string& dir, int64_t step) {
  return (fs::path(dir) / fmt::format("step-{:08d}.pt", step)).string();
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  static const std::regex name(R"(step-(\d+)\.pt)");
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string file = entry.path().filename().string();
    if (entry.is_regular_file() && std::regex_match(file, m, name)) {
      // A step too large for int64_t is not one of ours: skipped, never an exception.
      errno = 0;
      const long long step = std::strtoll(m[1].str().c_str(), nullptr, 10);
      if (errno != ERANGE) found.emplace_back(step, entry.path().string());
    }
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

std::string latest_checkpoint(const std::string& dir) {
  const auto all = list_checkpoints(dir);
  if (all.empty())
    throw CheckpointError(fmt::format("{}: no checkpoint (step-*.pt) to resume", dir));
  return all.back();
}

void prune_checkpoints(const std::string& dir, int64_t keep) {
  const auto all = list_checkpoints(dir);
  for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i) {
    std::error_code ec;
    fs::remove(all[i], ec);
    fs::remove_all(shard_directory(all[i]), ec);
  }
}

std::string shard_directory(const std::string& checkpoint) {
  fs::path p(checkpoint);
  if (p.extension() == ".pt") p.replace_extension();
  return p.string() + ".shards";
}

std::string shard_file(const std::string& directory, int64_t shard) {
  return (fs::path(directory) / fmt::format("shard-{:05d}.pt", shard)).string();
}

void check_archive(std::string_view bytes, const std::string& source) {
  if (const std::string problem = core::zip_archive_problem(bytes); !problem.empty()) {
    throw CheckpointError(fmt::format("{}: not a usable checkpoint: {}", source, problem));
  }
}

}  // namespace vflow::engine
