// Token shards: llm.c's and raw token files read as next-token windows, checked on open,
// read on demand with flat resident memory, and named in every error.
#include "vflow/data/token_shards.h"

#include <malloc.h>
#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "support.h"
#include "vflow/core/error.h"
#include "vflow/core/spec_node.h"

using Catch::Matchers::Contains;
using vflow::data::TokenFormat;
using vflow::data::TokenShardsOptions;
using vflow::testing::TempDir;

namespace {

template <class T>
void write_raw(const std::string& path, const std::vector<T>& tokens) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(tokens.data()),
            static_cast<std::streamsize>(tokens.size() * sizeof(T)));
}

std::vector<uint16_t> iota16(size_t n, uint16_t from = 0) {
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint16_t>(from + i);
  return v;
}

TokenShardsOptions options(std::vector<std::string> paths, TokenFormat format, int64_t context,
                           int64_t vocab) {
  TokenShardsOptions o;
  o.paths = std::move(paths);
  o.format = format;
  o.context = context;
  o.vocab_size = vocab;
  return o;
}

std::string error_of(const TokenShardsOptions& o) {
  try {
    vflow::data::open_token_shards(o);
  } catch (const vflow::DataError& e) {
    return e.what();
  }
  return "no DataError";
}

/// The process's resident memory in KiB: all of it, and the part that maps files (or
/// shared memory, where the temporary directory is a tmpfs).
struct Resident {
  int64_t total = 0;
  int64_t mapped = 0;
};

/// The process's resident memory, after glibc's allocator has returned the free memory it
/// keeps (malloc_trim): what the reads themselves hold, not the freed batches the heap kept.
Resident resident() {
  malloc_trim(0);
  std::ifstream in("/proc/self/status");
  std::string line;
  Resident r;
  while (std::getline(in, line)) {
    const auto value = [&] { return std::stoll(line.substr(line.find(':') + 1)); };
    if (line.rfind("VmRSS:", 0) == 0) r.total = value();
    if (line.rfind("RssFile:", 0) == 0 || line.rfind("RssShmem:", 0) == 0) r.mapped += value();
  }
  return r;
}

}  // namespace

TEST_CASE("token shards are read as next-token windows that count across the shards in order",
          "[unit][data]") {
  TempDir dir;
  vflow::testing::write_llmc_shard(dir.file("a.bin"), iota16(21));       // (21 - 1) / 4 = 5 windows
  vflow::testing::write_llmc_shard(dir.file("b.bin"), iota16(10, 100));  // (10 - 1) / 4 = 2 windows
  const auto data = vflow::data::open_token_shards(
      options({dir.file("a.bin"), dir.file("b.bin")}, TokenFormat::kLlmc, 4, 200));
  REQUIRE(data->size() == 7);
  CHECK(data->info().input_shape == std::vector<int64_t>{4});
  CHECK(data->info().vocab_size == 200);
  CHECK(data->info().num_classes == 200);
  const auto batch = data->get(torch::tensor({1, 4, 5, 6}, torch::kInt64));
  // Window w of a shard starts at token w * context; the target is the next token.
  CHECK(torch::equal(batch.input[0], torch::tensor({4, 5, 6, 7}, torch::kInt64)));
  CHECK(torch::equal(batch.target[0], torch::tensor({5, 6, 7, 8}, torch::kInt64)));
  CHECK(torch::equal(batch.target[1], torch::tensor({17, 18, 19, 20}, torch::kInt64)));
  CHECK(torch::equal(batch.input[2], torch::tensor({100, 101, 102, 103}, torch::kInt64)));
  CHECK(torch::equal(batch.target[3], torch::tensor({105, 106, 107, 108}, torch::kInt64)));

  // Raw files: uint32 ids above 65535, and uint16 ones.
  write_raw<uint32_t>(dir.file("c.u32"), {70000, 70001, 70002, 5, 6});
  const auto wide =
      vflow::data::open_token_shards(options({dir.file("c.u32")}, TokenFormat::kUint32, 2, 70003));
  REQUIRE(wide->size() == 2);
  CHECK(torch::equal(wide->get(torch::tensor({0}, torch::kInt64)).target[0],
                     torch::tensor({70001, 70002}, torch::kInt64)));
  write_raw<uint16_t>(dir.file("d.u16"), iota16(9));
  CHECK(vflow::data::open_token_shards(options({dir.file("d.u16")}, TokenFormat::kUint16, 8, 9))
            ->size() == 1);

  // Paths and patterns, in order; each pattern's matches sorted by name.
  const auto files =
      vflow::data::expand_shard_paths({dir.file("d.u16"), dir.file("?.bin")}, "train");
  CHECK(files == std::vector<std::string>{dir.file("d.u16"), dir.file("a.bin"), dir.file("b.bin")});
  CHECK_THROWS_WITH(vflow::data::expand_shard_paths({dir.file("x_*.bin")}, "eval"),
                    Contains("eval: " + dir.file("x_*.bin") + ": no file matches"));
  CHECK_THROWS_WITH(vflow::data::expand_shard_paths({dir.file("none.bin")}, "train"),
                    Contains("none.bin: no such file"));
}

TEST_CASE("a bad token file is refused, naming the file and what is wrong", "[unit][data]") {
  TempDir dir;
  const auto llmc = [&](const std::string& name) {
    return options({dir.file(name)}, TokenFormat::kLlmc, 4, 1000);
  };
  vflow::testing::write_llmc_shard(dir.file("magic.bin"), iota16(20), 12345);
  CHECK_THAT(error_of(llmc("magic.bin")),
             Contains("magic.bin: magic number 12345 at offset 0, not llm.c's 20240520"));
  vflow::testing::write_llmc_shard(dir.file("version.bin"), iota16(20), vflow::data::kLlmcMagic, 7);
  CHECK_THAT(error_of(llmc("version.bin")), Contains("version.bin: version 7 at offset 4"));
  vflow::testing::write_llmc_shard(dir.file("cut.bin"), iota16(20), vflow::data::kLlmcMagic, 1,
                                   30);  // truncated
  CHECK_THAT(error_of(llmc("cut.bin")),
             Contains("cut.bin: the header (offset 8) counts 30 tokens, 1084 bytes with the "
                      "header, but the file has 1064 bytes"));
  vflow::testing::write_file(dir.file("short.bin"), std::string(100, 'x'));
  CHECK_THAT(error_of(llmc("short.bin")), Contains("shorter than llm.c's 1024-byte header"));
  vflow::testing::write_file(dir.file("empty.bin"), "");
  CHECK_THAT(error_of(llmc("empty.bin")), Contains("empty.bin: an empty shard"));
  vflow::testing::write_llmc_shard(dir.file("none.bin"), {});
  CHECK_THAT(error_of(llmc("none.bin")), Contains("none.bin: an empty shard (no tokens)"));
  vflow::testing::write_file(dir.file("odd.u16"), std::string(9, '\0'));
  CHECK_THAT(error_of(options({dir.file("odd.u16")}, TokenFormat::kUint16, 2, 10)),
             Contains("odd.u16: 9 bytes of tokens are not a whole number of 2-byte tokens"));
  vflow::testing::write_llmc_shard(dir.file("tiny.bin"), iota16(4));
  CHECK_THAT(error_of(llmc("tiny.bin")), Contains("fewer than context + 1 = 5 tokens"));
  CHECK_THAT(error_of(llmc("missing.bin")), Contains("missing.bin: cannot read"));
  CHECK_THAT(error_of(options({}, TokenFormat::kLlmc, 4, 10)), Contains("no shard files"));
  CHECK_THAT(error_of(llmc(".")), Contains("cannot read"));  // a directory
  // A token id beyond the vocabulary: at the read, with its place.
  vflow::testing::write_llmc_shard(dir.file("big.bin"), {1, 2, 3, 4, 5, 6, 7, 999, 9});
  const auto small =
      vflow::data::open_token_shards(options({dir.file("big.bin")}, TokenFormat::kLlmc, 4, 500));
  CHECK_THROWS_WITH(small->get(torch::tensor({1}, torch::kInt64)),
                    Contains("big.bin: token 7 (byte offset 1038) is 999, not below the "
                             "vocabulary's 500 ids"));
}

TEST_CASE("reading every window of a large shard leaves the resident memory flat",
          "[integration][data]") {
  TempDir dir;
  // 64 Mi tokens (128 MiB) in raw uint16: one pass over it in batches of 2048 windows.
  const int64_t tokens = int64_t{64} << 20;
  {
    std::ofstream out(dir.file("big.u16"), std::ios::binary);
    std::vector<uint16_t> chunk(1 << 20);
    for (int64_t done = 0; done < tokens; done += static_cast<int64_t>(chunk.size())) {
      for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<uint16_t>((done + i) % 5000);
      out.write(reinterpret_cast<const char*>(chunk.data()),
                static_cast<std::streamsize>(chunk.size() * 2));
    }
  }
  const auto data = vflow::data::open_token_shards(
      options({dir.file("big.u16")}, TokenFormat::kUint16, 256, 5000));
  REQUIRE(data->size() == (tokens - 1) / 256);
  data->get(torch::arange(0, 2048, torch::kInt64));  // the batch buffers, allocated once
  const Resident before = resident();
  Resident peak = before;
  int64_t checksum = 0;
  // In a shuffled order, as training reads them: every read lands somewhere new.
  torch::manual_seed(3);
  const auto order = torch::randperm(data->size(), torch::kInt64);
  for (int64_t first = 0; first < data->size(); first += 2048) {
    const auto batch = data->get(order.slice(0, first, std::min(first + 2048, data->size())));
    checksum += batch.target[0][0].item<int64_t>() + 1;
    const Resident now = resident();
    peak.total = std::max(peak.total, now.total);
    peak.mapped = std::max(peak.mapped, now.mapped);
  }
  INFO("resident before " << before.total << " KiB (" << before.mapped << " mapping files), peak "
                          << peak.total << " KiB (" << peak.mapped << ")");
  CHECK(checksum > 0);
  // The shard is 131072 KiB. The process maps none of its pages; a batch (8 MiB) is the
  // rest. Without the trim, what glibc kept of the freed batches had grown the heap by
  // 71 MiB in one machine's runs and not in others'.
  CHECK(peak.mapped - before.mapped < 16 * 1024);
  CHECK(peak.total - before.total < 64 * 1024);
}
