// Pre-tokenized corpora as training data: token shards on disk, read on demand.
//
// A shard is one file of token ids, in llm.c's format (a header of 256 little-endian int32:
// magic 20240520, version 1, the token count; then the tokens as uint16) or raw (uint16 or
// uint32 tokens, nothing else). Example k is a window of context + 1 consecutive tokens of
// one shard: the input is its first `context`, the target its last `context` (the next
// token at every position). Windows do not overlap or cross shards, and the shards count in
// the order given, so example k is the same window on any worker and in any run.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "vflow/data/dataset.h"

namespace vflow::data {

enum class TokenFormat { kLlmc, kUint16, kUint32 };
/// "llmc", "uint16", "uint32": as the job spec names it.
std::string to_string(TokenFormat format);

/// llm.c's shard header: its magic number, its version, and its size in bytes.
inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int32_t kLlmcVersion = 1;
inline constexpr int64_t kLlmcHeaderBytes = 256 * 4;

struct TokenShardsOptions {
  std::vector<std::string> paths;  ///< the shards, in this order
  TokenFormat format = TokenFormat::kLlmc;
  int64_t context = 64;    ///< tokens per example's input
  int64_t vocab_size = 0;  ///< every token id is below it
};

/// Opens and checks every shard (header, size); the tokens are read as examples are asked
/// for, so memory does not grow with the shards' size. A file that cannot be read, a wrong
/// header, a size that does not fit the format or the header's count, an empty shard, and
/// (at read time) a token id not below vocab_size are DataErrors naming the file (and the
/// token's offset).
std::shared_ptr<Dataset> open_token_shards(const TokenShardsOptions& options);

/// The files a list of paths and glob patterns names, in order (each pattern's matches
/// sorted); a pattern that matches nothing, or a path that does not exist, is named in the
/// message (`what` names the list: "train").
std::vector<std::string> expand_shard_paths(const std::vector<std::string>& patterns,
                                            const std::string& what);

}  // namespace vflow::data
