// Token shard files: their formats, and writing and listing them. No LibTorch, so that
// vflow-tokenize (which links SentencePiece's own protobuf) can use it; the data set that
// reads them is data/token_shards.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vflow::data {

enum class TokenFormat { kLlmc, kUint16, kUint32 };
/// "llmc", "uint16", "uint32": as the job spec names it.
std::string to_string(TokenFormat format);

/// llm.c's shard header: its magic number, its version, and its size in bytes.
inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int32_t kLlmcVersion = 1;
inline constexpr int64_t kLlmcHeaderBytes = 256 * 4;

/// Writes `tokens` to `path` as one shard of `format` (llm.c's needs ids below 65536), whole
/// or not at all; a failure is an Error naming the file.
void write_token_shard(const std::string& path, const std::vector<uint32_t>& tokens,
                       TokenFormat format);

/// The files a list of paths and glob patterns names, in order (each pattern's matches
/// sorted); a pattern that matches nothing, or a path that does not exist, is named in the
/// message (`what` names the list: "train").
std::vector<std::string> expand_shard_paths(const std::vector<std::string>& patterns,
                                            const std::string& what);

}  // namespace vflow::data
