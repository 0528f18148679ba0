#include "core/zip_check.h"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <unordered_set>

#include "vflow/core/spec_node.h"

namespace vflow::core {

namespace {

constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint32_t kCentralHeader = 0x02014b50;
constexpr uint32_t kEndOfDirectory = 0x06054b50;
constexpr uint32_t kZip64End = 0x06064b50;
constexpr uint32_t kZip64Locator = 0x07064b50;
/// Deflated entries of a checkpoint are TorchScript source, a few kilobytes; tensors are
/// stored. This bounds what damaged size fields can make the check allocate and inflate.
constexpr uint64_t kMaxDeflatedEntry = uint64_t{256} << 20;
constexpr uint64_t kMaxEntries = 10'000'000;

/// What is wrong with an archive; caught in zip_archive_problem.
struct Problem : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Little-endian reads that refuse to leave the archive.
class ArchiveBytes {
 public:
  explicit ArchiveBytes(std::string_view bytes) : b_(bytes) {}

  [[noreturn]] void fail(const std::string& what) const { throw Problem(what); }
  void need(uint64_t offset, uint64_t length, const char* what) const {
    if (offset > b_.size() || length > b_.size() - offset) {
      fail(fmt::format("the {} at byte {} runs past the end of the file", what, offset));
    }
  }
  uint64_t le(uint64_t offset, int width) const {
    need(offset, static_cast<uint64_t>(width), "record");
    uint64_t v = 0;
    for (int i = width - 1; i >= 0; --i) {
      v = (v << 8) | static_cast<unsigned char>(b_[offset + static_cast<uint64_t>(i)]);
    }
    return v;
  }
  uint64_t size() const { return b_.size(); }
  std::string_view view(uint64_t offset, uint64_t length) const {
    need(offset, length, "entry");
    return b_.substr(offset, length);
  }

 private:
  std::string_view b_;
};

uint32_t crc_of(std::string_view data) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (!data.empty()) {
    const auto n = static_cast<uInt>(std::min<size_t>(data.size(), 1U << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data.data()), n);
    data.remove_prefix(n);
  }
  return static_cast<uint32_t>(crc);
}

/// The CRC-32 of a raw-deflated entry that must inflate to exactly `size` bytes.
uint32_t crc_of_deflated(std::string_view data, uint64_t size, const ArchiveBytes& a,
                         const std::string& name) {
  if (size > kMaxDeflatedEntry || data.size() > kMaxDeflatedEntry) {
    a.fail(fmt::format("deflated entry {} claims {} bytes", name, size));
  }
  std::string out(static_cast<size_t>(size), '\0');
  z_stream z{};
  if (inflateInit2(&z, -MAX_WBITS) != Z_OK) a.fail("zlib cannot start inflating");
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  const int rc = inflate(&z, Z_FINISH);
  const uint64_t produced = z.total_out;
  inflateEnd(&z);
  if (rc != Z_STREAM_END || produced != size) {
    a.fail(
        fmt::format("entry {} does not inflate to its {} bytes (the file is damaged)", name, size));
  }
  return crc_of(out);
}

}  // namespace

std::string zip_archive_problem(std::string_view bytes) try {
  const ArchiveBytes a(bytes);
  if (a.size() < 22) a.fail("too short for a zip archive");
  // The end-of-directory record is in the last 22 + 65535 (comment) bytes.
  uint64_t end = a.size() - 22;
  const uint64_t lowest = a.size() > 22 + 65535 ? a.size() - 22 - 65535 : 0;
  while (a.le(end, 4) != kEndOfDirectory) {
    if (end == lowest) a.fail("no zip end-of-directory record (not a checkpoint, or truncated)");
    --end;
  }
  if (end + 22 + a.le(end + 20, 2) > a.size()) a.fail("the zip comment runs past the end");
  uint64_t entries = a.le(end + 10, 2);
  uint64_t directory_size = a.le(end + 12, 4);
  uint64_t directory = a.le(end + 16, 4);
  uint64_t directory_end = end;
  if (end >= 20 && a.le(end - 20, 4) == kZip64Locator) {
    const uint64_t record = a.le(end - 20 + 8, 8);
    if (record > end - 20 || a.le(record, 4) != kZip64End) a.fail("a bad ZIP64 end record");
    entries = a.le(record + 32, 8);
    directory_size = a.le(record + 40, 8);
    directory = a.le(record + 48, 8);
    directory_end = record;
  }
  if (directory > directory_end || directory_size > directory_end - directory) {
    a.fail("the zip central directory lies outside the file");
  }
  if (entries > kMaxEntries || entries > directory_size / 46) {
    a.fail(fmt::format("the zip directory claims {} entries in {} bytes", entries, directory_size));
  }
  bool has_data = false;
  uint64_t at = directory;
  // Entries lie one after another in the file, each read once: a directory that points
  // many entries at the same bytes would make this check (and LibTorch) work for ever.
  uint64_t next_free = 0;
  uint64_t inflated = 0;
  std::unordered_set<std::string> names;
  for (uint64_t i = 0; i < entries; ++i) {
    if (at + 46 > directory + directory_size || a.le(at, 4) != kCentralHeader) {
      a.fail(fmt::format("zip directory entry {} is damaged", i));
    }
    const uint64_t method = a.le(at + 10, 2);
    const auto crc = static_cast<uint32_t>(a.le(at + 16, 4));
    uint64_t packed = a.le(at + 20, 4);
    uint64_t size = a.le(at + 24, 4);
    const uint64_t name_length = a.le(at + 28, 2);
    const uint64_t extra_length = a.le(at + 30, 2);
    const uint64_t comment_length = a.le(at + 32, 2);
    uint64_t local = a.le(at + 42, 4);
    const uint64_t next = at + 46 + name_length + extra_length + comment_length;
    if (next > directory + directory_size)
      a.fail(fmt::format("zip directory entry {} is damaged", i));
    const std::string name(a.view(at + 46, name_length));
    // ZIP64: the fields that do not fit follow in an extra field of id 1, in this order.
    for (uint64_t x = at + 46 + name_length; x + 4 <= at + 46 + name_length + extra_length;) {
      const uint64_t id = a.le(x, 2);
      const uint64_t length = a.le(x + 2, 2);
      uint64_t field = x + 4;
      if (id == 1) {
        for (uint64_t* value : {&size, &packed, &local}) {
          if (*value == 0xFFFFFFFF && field + 8 <= x + 4 + length) {
            *value = a.le(field, 8);
            field += 8;
          }
        }
      }
      x += 4 + length;
    }
    if (local + 30 > directory || a.le(local, 4) != kLocalHeader) {
      a.fail(fmt::format("entry {} has no local header where the directory says", printable(name)));
    }
    if (a.le(local + 26, 2) != name_length || a.view(local + 30, name_length) != name) {
      a.fail(fmt::format("entry {} has a local header of another name", printable(name)));
    }
    const uint64_t data = local + 30 + name_length + a.le(local + 28, 2);
    if (data > directory || packed > directory - data) {
      a.fail(fmt::format("entry {} runs into the zip directory", printable(name)));
    }
    if (local < next_free) {
      a.fail(fmt::format("entry {} overlaps the entry before it", printable(name)));
    }
    next_free = data + packed;
    if (!names.insert(name).second) a.fail(fmt::format("entry {} is there twice", printable(name)));
    const std::string_view content = a.view(data, packed);
    uint32_t actual = 0;
    if (method == 0) {
      if (packed != size) a.fail(fmt::format("stored entry {} has two sizes", printable(name)));
      actual = crc_of(content);
    } else if (method == 8) {
      inflated += size;
      if (inflated > kMaxDeflatedEntry) {
        a.fail(fmt::format("deflated entries of more than {} MiB in all", kMaxDeflatedEntry >> 20));
      }
      actual = crc_of_deflated(content, size, a, printable(name));
    } else {
      a.fail(fmt::format("entry {} uses zip method {}; checkpoints are stored or deflated",
                         printable(name), method));
    }
    if (actual != crc) {
      a.fail(fmt::format("entry {} fails its CRC-32 check (the file is damaged)", printable(name)));
    }
    const std::string_view data_pkl = "/data.pkl";
    has_data =
        has_data || (name.size() > data_pkl.size() &&
                     name.compare(name.size() - data_pkl.size(), data_pkl.size(), data_pkl) == 0);
    at = next;
  }
  if (!has_data) a.fail("the archive holds no data.pkl (not a checkpoint)");
  return "";
} catch (const Problem& p) {
  return p.what();
}

}  // namespace vflow::core
