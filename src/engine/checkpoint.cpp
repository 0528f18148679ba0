#include "vflow/engine/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <regex>

#include "vflow/core/error.h"

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
      found.emplace_back(std::stoll(m[1]), entry.path().string());
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
  }
}

namespace {
void fsync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0)
    throw CheckpointError(fmt::format("{}: cannot open for fsync: {}", path, std::strerror(errno)));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw CheckpointError(fmt::format("{}: fsync failed: {}", path, std::strerror(err)));
}
}  // namespace

void write_atomically(const std::string& path,
                      const std::function<void(const std::string&)>& write) {
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw CheckpointError(
        fmt::format("{}: cannot create directory: {}", dir.string(), ec.message()));
  const std::string tmp = fmt::format("{}.tmp-{}", path, ::getpid());
  try {
    write(tmp);
    fsync_path(tmp, O_RDONLY);
    fs::rename(tmp, target);
    fsync_path(dir.string(), O_RDONLY | O_DIRECTORY);
  } catch (const CheckpointError&) {
    fs::remove(tmp, ec);
    throw;
  } catch (const std::exception& e) {
    fs::remove(tmp, ec);
    throw CheckpointError(fmt::format("{}: cannot write checkpoint: {}", path, e.what()));
  }
}

}  // namespace vflow::engine
