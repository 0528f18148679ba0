#include "vflow/data/token_files.h"

#include <fmt/format.h>
#include <glob.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>

#include "core/output_file.h"
#include "vflow/core/error.h"

namespace vflow::data {

std::string to_string(TokenFormat format) {
  switch (format) {
    case TokenFormat::kLlmc:
      return "llmc";
    case TokenFormat::kUint16:
      return "uint16";
    case TokenFormat::kUint32:
      return "uint32";
  }
  return "?";
}

void write_token_shard(const std::string& path, const std::vector<uint32_t>& tokens,
                       TokenFormat format) {
  const size_t width = format == TokenFormat::kUint32 ? 4 : 2;
  std::string bytes;
  bytes.reserve((format == TokenFormat::kLlmc ? kLlmcHeaderBytes : 0) + tokens.size() * width);
  const auto put = [&bytes](uint32_t v, size_t n) {
    for (size_t i = 0; i < n; ++i) bytes.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  if (format == TokenFormat::kLlmc) {
    VFLOW_ASSERT(tokens.size() <= INT32_MAX, "an llm.c shard counts its tokens in an int32");
    put(static_cast<uint32_t>(kLlmcMagic), 4);
    put(static_cast<uint32_t>(kLlmcVersion), 4);
    put(static_cast<uint32_t>(tokens.size()), 4);
    bytes.resize(static_cast<size_t>(kLlmcHeaderBytes), '\0');
  }
  for (const uint32_t t : tokens) {
    VFLOW_ASSERT(width == 4 || t <= 0xffff, "a uint16 shard holds ids below 65536");
    put(t, width);
  }
  if (const std::string error = core::write_file_atomically(path, bytes); !error.empty()) {
    throw Error(error);
  }
}

std::vector<std::string> expand_shard_paths(const std::vector<std::string>& patterns,
                                            const std::string& what) {
  std::vector<std::string> out;
  for (const auto& pattern : patterns) {
    if (pattern.find_first_of("*?[") == std::string::npos) {
      std::error_code ec;
      if (!std::filesystem::exists(pattern, ec)) {
        throw DataError(fmt::format("{}: {}: no such file", what, pattern));
      }
      out.push_back(pattern);
      continue;
    }
    glob_t found{};
    const int rc = ::glob(pattern.c_str(), 0, nullptr, &found);
    std::vector<std::string> matches(found.gl_pathv, found.gl_pathv + found.gl_pathc);
    ::globfree(&found);
    if (rc != 0 || matches.empty()) {
      throw DataError(fmt::format("{}: {}: no file matches", what, pattern));
    }
    std::sort(matches.begin(), matches.end());
    out.insert(out.end(), matches.begin(), matches.end());
  }
  return out;
}

}  // namespace vflow::data
