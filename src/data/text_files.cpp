#include "vflow/data/text_files.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <sstream>

#include "core/input_file.h"
#include "vflow/core/error.h"

namespace vflow::data {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// Text files are read whole; larger ones than this belong in a format of their own.
constexpr uint64_t kMaxTextFileBytes = uint64_t{4} << 30;

std::string read_file_bytes(const std::string& path) {
  auto in = core::read_input_file(path, kMaxTextFileBytes);
  if (!in.ok()) throw DataError(fmt::format("{}: cannot read: {}", path, in.error));
  return std::move(in.bytes);
}

std::string trim_right(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

}  // namespace

std::vector<std::string> expand_text_paths(const std::vector<std::string>& paths) {
  std::vector<std::string> files;
  for (const auto& path : paths) {
    std::error_code ec;
    if (fs::is_regular_file(path, ec)) {
      files.push_back(path);
      continue;
    }
    if (!fs::is_directory(path, ec)) {
      if (!fs::exists(fs::symlink_status(path, ec))) {
        throw DataError(fmt::format("{}: no such text file or directory", path));
      }
      // A FIFO, a device or a socket: say which, without opening it for long.
      throw DataError(fmt::format("{}: {}", path, core::open_input_file(path).error));
    }
    std::vector<std::string> found;
    for (const auto& entry : fs::directory_iterator(path, ec)) {
      const std::string name = entry.path().filename().string();
      if (!entry.is_regular_file() || ends_with(name, ".dat") || ends_with(name, ".u8")) continue;
      found.push_back(entry.path().string());
    }
    if (found.empty()) throw DataError(fmt::format("{}: directory holds no text files", path));
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

std::vector<std::string> read_text_entries(const std::string& path) {
  const std::string text = read_file_bytes(path);
  if (const auto nul = text.find('\0'); nul != std::string::npos) {
    throw DataError(fmt::format("{}: byte {} is NUL: not a text file", path, nul));
  }
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(trim_right(line));
  const bool fortune = std::find(lines.begin(), lines.end(), "%") != lines.end();
  std::vector<std::string> entries;
  std::string current;
  for (const auto& line : lines) {
    if (fortune && line != "%") {
      current += current.empty() ? line : "\n" + line;
      continue;
    }
    if (fortune) {
      if (!trim_right(current).empty()) entries.push_back(trim_right(current));
      current.clear();
    } else if (!line.empty()) {
      entries.push_back(line);
    }
  }
  if (!trim_right(current).empty()) entries.push_back(trim_right(current));
  return entries;
}

std::vector<std::string> split_sentences(const std::string& entry, size_t min_bytes) {
  std::string flat;
  for (char c : entry) {
    const bool space = std::isspace(static_cast<unsigned char>(c)) != 0;
    if (space && (flat.empty() || flat.back() == ' ')) continue;
    flat.push_back(space ? ' ' : c);
  }
  std::vector<std::string> out;
  std::string current;
  for (size_t i = 0; i < flat.size(); ++i) {
    current.push_back(flat[i]);
    const bool end = (flat[i] == '.' || flat[i] == '!' || flat[i] == '?') &&
                     (i + 1 == flat.size() || flat[i + 1] == ' ');
    if (end || i + 1 == flat.size()) {
      std::string s = trim_right(current);
      if (!s.empty() && s.front() == ' ') s.erase(0, 1);
      if (s.size() >= min_bytes) out.push_back(std::move(s));
      current.clear();
    }
  }
  return out;
}

}  // namespace vflow::data
