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
#include "vflow/data/token_files.h"

namespace vflow::data {

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

}  // namespace vflow::data
