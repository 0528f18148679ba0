// The checkpoint archive check (engine::check_archive) on archives made by hand: what
// vflow refuses before LibTorch's reader, which checks no CRC, sees a file.
#include "vflow/engine/checkpoint.h"

#include <zlib.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "support.h"
#include "vflow/core/error.h"

using Catch::Matchers::Contains;

namespace {

void le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

struct Entry {
  std::string name;
  std::string data;
  uint32_t crc = 0;    ///< 0: the data's true CRC-32
  int64_t local = -1;  ///< -1: where this entry's local header was written
};

/// A zip archive of stored entries, with its central directory as `entries` says.
std::string zip(std::vector<Entry> entries, const std::vector<size_t>& directory_order) {
  std::string out;
  std::vector<uint64_t> offsets;
  for (auto& e : entries) {
    if (e.crc == 0) {
      e.crc = static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(e.data.data()),
                                          static_cast<uInt>(e.data.size())));
    }
    offsets.push_back(out.size());
    le(out, 0x04034b50, 4);
    le(out, 20, 2), le(out, 0, 2), le(out, 0, 2), le(out, 0, 2), le(out, 0, 2);
    le(out, e.crc, 4), le(out, e.data.size(), 4), le(out, e.data.size(), 4);
    le(out, e.name.size(), 2), le(out, 0, 2);
    out += e.name + e.data;
  }
  const uint64_t directory = out.size();
  for (const size_t i : directory_order) {
    const Entry& e = entries[i];
    le(out, 0x02014b50, 4);
    le(out, 20, 2), le(out, 20, 2), le(out, 0, 2), le(out, 0, 2), le(out, 0, 2), le(out, 0, 2);
    le(out, e.crc, 4), le(out, e.data.size(), 4), le(out, e.data.size(), 4);
    le(out, e.name.size(), 2), le(out, 0, 2), le(out, 0, 2), le(out, 0, 2), le(out, 0, 2);
    le(out, 0, 4);
    le(out, e.local >= 0 ? static_cast<uint64_t>(e.local) : offsets[i], 4);
    out += e.name;
  }
  const uint64_t size = out.size() - directory;
  le(out, 0x06054b50, 4);
  le(out, 0, 2), le(out, 0, 2), le(out, directory_order.size(), 2);
  le(out, directory_order.size(), 2), le(out, size, 4), le(out, directory, 4), le(out, 0, 2);
  return out;
}

std::string refusal(const std::string& bytes) {
  try {
    vflow::engine::check_archive(bytes, "c.pt");
  } catch (const vflow::CheckpointError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the archive check refuses damaged, overlapping and repeated entries", "[unit]") {
  const Entry pkl{"archive/data.pkl", "pickle bytes"};
  const Entry tensor{"archive/data/0", std::string(64, '\x01')};
  CHECK(refusal(zip({pkl, tensor}, {0, 1})).empty());
  // One byte of an entry changed: its CRC-32 no longer matches.
  auto damaged = zip({pkl, tensor}, {0, 1});
  damaged[damaged.find("pickle") + 2] ^= 0x20;
  CHECK_THAT(refusal(damaged), Contains("c.pt: not a usable checkpoint: entry archive/data.pkl "
                                        "fails its CRC-32 check"));
  // Two directory entries for the same bytes: reading one archive many times over.
  Entry again = tensor;
  again.name = "archive/data/1";
  again.local = 0;
  CHECK_THAT(refusal(zip({pkl, again}, {0, 1})), Contains("has a local header of another name"));
  CHECK_THAT(refusal(zip({pkl, tensor}, {0, 0})), Contains("overlaps the entry before it"));
  CHECK_THAT(refusal(zip({pkl, tensor}, {1, 0})), Contains("overlaps the entry before it"));
  // Truncated, not a zip, no data.pkl.
  const auto whole = zip({pkl, tensor}, {0, 1});
  CHECK_THAT(refusal(whole.substr(0, whole.size() - 30)), Contains("no zip end-of-directory"));
  CHECK_THAT(refusal("PK\x03\x04 not a zip at all, but long enough to look"),
             Contains("no zip end-of-directory"));
  CHECK_THAT(refusal(zip({tensor}, {0})), Contains("holds no data.pkl"));
}

TEST_CASE("a checkpoint vflow wrote passes the archive check", "[unit]") {
  const std::string seed =
      std::string(VFLOW_SOURCE_DIR) + "/tests/fuzz/corpus/checkpoint/accept-step-2.pt";
  CHECK(refusal(vflow::testing::read_file(seed)).empty());
}
