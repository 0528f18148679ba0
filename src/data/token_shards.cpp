#include "vflow/data/token_shards.h"

#include <fmt/format.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "core/input_file.h"
#include "vflow/core/error.h"

namespace vflow::data {

namespace {

/// One shard, open for reading. Each read copies its tokens with pread: the kernel's page
/// cache holds the file, the process only what one batch needs, however large the shards.
/// (A mapping would keep the pages around each read that the kernel maps ahead of a fault,
/// so the resident memory would grow with the shards read.)
class Shard {
 public:
  Shard(const std::string& path, TokenFormat format) : path_(path) {
    auto in = core::open_input_file(path);
    if (!in.ok()) throw DataError(fmt::format("{}: cannot read: {}", path, in.error));
    const uint64_t size = in.size;
    if (size == 0) throw DataError(fmt::format("{}: an empty shard", path));
    width_ = format == TokenFormat::kUint32 ? 4 : 2;
    if (format == TokenFormat::kLlmc) read_header(in.fd.get(), size);
    if ((size - static_cast<uint64_t>(offset_)) % static_cast<uint64_t>(width_) != 0) {
      throw DataError(
          fmt::format("{}: {} bytes of tokens are not a whole number of {}-byte "
                      "tokens (a truncated file, or another format)",
                      path, size - static_cast<uint64_t>(offset_), width_));
    }
    tokens_ = static_cast<int64_t>((size - static_cast<uint64_t>(offset_)) /
                                   static_cast<uint64_t>(width_));
    if (tokens_ == 0) throw DataError(fmt::format("{}: an empty shard (no tokens)", path));
    fd_ = std::move(in.fd);
  }
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  const std::string& path() const { return path_; }
  int64_t tokens() const { return tokens_; }

  /// Tokens [first, first + n) as int64 into `out`; an id not below `vocab` is a DataError.
  void read(int64_t first, int64_t n, int64_t vocab, int64_t* out) const {
    const int64_t from = offset_ + first * width_;
    std::vector<unsigned char> bytes(static_cast<size_t>(n * width_));
    core::read_exactly_at(fd_.get(), static_cast<uint64_t>(from), bytes.size(), bytes.data(),
                          path_);
    const unsigned char* at = bytes.data();
    for (int64_t i = 0; i < n; ++i, at += width_) {
      uint32_t v = 0;
      if (width_ == 2) {
        v = static_cast<uint32_t>(at[0]) | static_cast<uint32_t>(at[1]) << 8;
      } else {
        v = static_cast<uint32_t>(at[0]) | static_cast<uint32_t>(at[1]) << 8 |
            static_cast<uint32_t>(at[2]) << 16 | static_cast<uint32_t>(at[3]) << 24;
      }
      if (v >= static_cast<uint64_t>(vocab)) {
        throw DataError(
            fmt::format("{}: token {} (byte offset {}) is {}, not below the "
                        "vocabulary's {} ids",
                        path_, first + i, offset_ + (first + i) * width_, v, vocab));
      }
      out[i] = v;
    }
  }

 private:
  void read_header(int fd, uint64_t size) {
    int32_t header[256] = {};
    if (size < static_cast<uint64_t>(kLlmcHeaderBytes) ||
        ::pread(fd, header, sizeof header, 0) != static_cast<ssize_t>(sizeof header)) {
      throw DataError(fmt::format("{}: {} bytes, shorter than llm.c's {}-byte header", path_, size,
                                  kLlmcHeaderBytes));
    }
    if (header[0] != kLlmcMagic) {
      throw DataError(
          fmt::format("{}: magic number {} at offset 0, not llm.c's {} (format: "
                      "uint16 or uint32 reads a raw token file)",
                      path_, header[0], kLlmcMagic));
    }
    if (header[1] != kLlmcVersion) {
      throw DataError(
          fmt::format("{}: version {} at offset 4; llm.c's uint16 shards are "
                      "version {}",
                      path_, header[1], kLlmcVersion));
    }
    const uint64_t expected = static_cast<uint64_t>(kLlmcHeaderBytes) +
                              2 * static_cast<uint64_t>(std::max<int32_t>(header[2], 0));
    if (header[2] < 0 || expected != size) {
      throw DataError(
          fmt::format("{}: the header (offset 8) counts {} tokens, {} bytes with "
                      "the header, but the file has {} bytes",
                      path_, header[2], expected, size));
    }
    offset_ = kLlmcHeaderBytes;
  }

  std::string path_;
  int64_t width_ = 2;
  int64_t offset_ = 0;
  int64_t tokens_ = 0;
  core::InputFd fd_;
};

class TokenShards final : public Dataset {
 public:
  explicit TokenShards(const TokenShardsOptions& o) : context_(o.context), vocab_(o.vocab_size) {
    VFLOW_ASSERT(o.context >= 1 && o.vocab_size >= 1, "token shards need a context and a vocab");
    if (o.paths.empty()) throw DataError("token shards: no shard files given");
    ends_.reserve(o.paths.size());
    int64_t total = 0;
    for (const auto& path : o.paths) {
      shards_.push_back(std::make_unique<Shard>(path, o.format));
      // Each window takes context + 1 tokens; a shard shorter than one adds none.
      total += (shards_.back()->tokens() - 1) / context_;
      ends_.push_back(total);
    }
    if (total == 0) {
      throw DataError(fmt::format("{}{}: fewer than context + 1 = {} tokens, not one example",
                                  o.paths.front(), o.paths.size() > 1 ? " and the others" : "",
                                  context_ + 1));
    }
  }

  int64_t size() const override { return ends_.back(); }

  DataInfo info() const override { return DataInfo{{context_}, vocab_, vocab_}; }

  Batch get(const torch::Tensor& indices) const override {
    const auto idx = indices.to(torch::kInt64).contiguous();
    const int64_t n = idx.numel();
    auto input = torch::empty({n, context_}, torch::kInt64);
    auto target = torch::empty({n, context_}, torch::kInt64);
    std::vector<int64_t> window(static_cast<size_t>(context_ + 1));
    const int64_t* k = idx.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      VFLOW_ASSERT(k[i] >= 0 && k[i] < size(), "example index out of range");
      const size_t s =
          static_cast<size_t>(std::upper_bound(ends_.begin(), ends_.end(), k[i]) - ends_.begin());
      const int64_t local = k[i] - (s == 0 ? 0 : ends_[s - 1]);
      shards_[s]->read(local * context_, context_ + 1, vocab_, window.data());
      std::memcpy(input[i].data_ptr<int64_t>(), window.data(),
                  static_cast<size_t>(context_) * sizeof(int64_t));
      std::memcpy(target[i].data_ptr<int64_t>(), window.data() + 1,
                  static_cast<size_t>(context_) * sizeof(int64_t));
    }
    return Batch{input, target};
  }

 private:
  int64_t context_;
  int64_t vocab_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::vector<int64_t> ends_;  ///< examples in shards 0..s, for each s
};

}  // namespace

std::shared_ptr<Dataset> open_token_shards(const TokenShardsOptions& options) {
  return std::make_shared<TokenShards>(options);
}

}  // namespace vflow::data
