#include "vflow/data/tar_index.h"

#include <fmt/format.h>
#include <strings.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "vflow/core/error.h"
#include "vflow/data/image_codec.h"

namespace vflow::data {

namespace {

/// Long names and pax records longer than this are refused: no path is that long.
constexpr uint64_t kMaxNameRecord = 1 << 20;

std::string field(const uint8_t* header, size_t at, size_t n) {
  const auto* p = reinterpret_cast<const char*>(header + at);
  return std::string(p, strnlen(p, n));
}

/// A numeric header field: octal ASCII (space or NUL terminated), or GNU's base-256 (the
/// first byte's high bit set) for sizes of 8 GiB and more.
bool parse_number(const uint8_t* p, size_t n, uint64_t& value) {
  value = 0;
  if (p[0] & 0x80) {
    if (p[0] != 0x80) return false;  // negative, or beyond 64 bits
    for (size_t i = 1; i < n; ++i) {
      if (value >> 56) return false;
      value = value << 8 | p[i];
    }
    return true;
  }
  size_t i = 0;
  while (i < n && p[i] == ' ') ++i;
  bool digits = false;
  for (; i < n && p[i] >= '0' && p[i] <= '7'; ++i) {
    if (value >> 60) return false;
    value = value << 3 | static_cast<uint64_t>(p[i] - '0');
    digits = true;
  }
  for (; i < n; ++i) {
    if (p[i] != ' ' && p[i] != '\0') return false;
  }
  return digits;
}

bool checksum_ok(const uint8_t* h) {
  uint64_t stored = 0;
  if (!parse_number(h + 148, 8, stored)) return false;
  uint64_t unsigned_sum = 0;
  int64_t signed_sum = 0;
  for (size_t i = 0; i < kTarBlock; ++i) {
    const uint8_t b = (i >= 148 && i < 156) ? ' ' : h[i];
    unsigned_sum += b;
    signed_sum += static_cast<int8_t>(b);
  }
  return stored == unsigned_sum || static_cast<int64_t>(stored) == signed_sum;
}

bool all_zero(const uint8_t* h) {
  return std::all_of(h, h + kTarBlock, [](uint8_t b) { return b == 0; });
}

uint64_t padded(uint64_t n) { return (n + kTarBlock - 1) / kTarBlock * kTarBlock; }

/// The `path` record of a pax extended header, or "".
std::string pax_path(const std::string& records) {
  size_t at = 0;
  while (at < records.size()) {
    const size_t space = records.find(' ', at);
    if (space == std::string::npos) break;
    size_t length = 0;
    for (size_t i = at; i < space; ++i) {
      if (records[i] < '0' || records[i] > '9' || length > kMaxNameRecord) return {};
      length = length * 10 + static_cast<size_t>(records[i] - '0');
    }
    if (length <= space - at + 1 || at + length > records.size()) break;
    const std::string record = records.substr(space + 1, length - (space - at) - 2);
    if (record.rfind("path=", 0) == 0) return record.substr(5);
    at += length;
  }
  return {};
}

}  // namespace

std::vector<TarMember> index_tar(const ReadAt& read, uint64_t size, const std::string& name) {
  std::vector<TarMember> members;
  uint8_t h[kTarBlock];
  std::string long_name;  // a GNU long name or a pax path for the next member
  uint64_t at = 0;
  while (at < size) {
    if (size - at < kTarBlock || read(at, kTarBlock, h) != kTarBlock) {
      throw DataError(fmt::format("{}: a truncated tar: {} bytes of a header at offset {}", name,
                                  size - at, at));
    }
    if (all_zero(h)) break;  // the end-of-archive blocks
    if (!checksum_ok(h)) {
      throw DataError(
          fmt::format("{}: a damaged tar header at offset {} (its checksum does not "
                      "match, or this is not a tar)",
                      name, at));
    }
    uint64_t member_size = 0;
    if (!parse_number(h + 124, 12, member_size)) {
      throw DataError(fmt::format("{}: the tar header at offset {} has no valid size", name, at));
    }
    const uint64_t data = at + kTarBlock;
    if (member_size > size - data) {
      throw DataError(
          fmt::format("{}: a truncated tar: the member at offset {} ({}) has {} "
                      "bytes, but the file ends {} bytes after its header",
                      name, at, field(h, 0, 100), member_size, size - data));
    }
    const char type = static_cast<char>(h[156]);
    if (type == 'L' || type == 'x') {
      if (member_size > kMaxNameRecord) {
        throw DataError(
            fmt::format("{}: a {}-byte long-name record at offset {}", name, member_size, at));
      }
      std::string text(member_size, '\0');
      if (read(data, member_size, reinterpret_cast<uint8_t*>(text.data())) != member_size) {
        throw DataError(fmt::format("{}: cannot read the record at offset {}", name, data));
      }
      long_name = type == 'L' ? std::string(text.c_str()) : pax_path(text);
    } else if (type == '0' || type == '\0' || type == '7') {
      TarMember m;
      if (!long_name.empty()) {
        m.name = std::move(long_name);
      } else {
        const std::string prefix =
            std::memcmp(h + 257, "ustar", 5) == 0 ? field(h, 345, 155) : std::string();
        m.name = prefix.empty() ? field(h, 0, 100) : prefix + "/" + field(h, 0, 100);
      }
      long_name.clear();
      m.offset = data;
      m.size = member_size;
      m.header = at;
      members.push_back(std::move(m));
    } else {
      long_name.clear();  // directories, links, pax globals: nothing to read
    }
    at = data + padded(member_size);
  }
  return members;
}

std::vector<ShardExample> webdataset_examples(const std::vector<TarMember>& members,
                                              const ReadAt& read, int64_t classes,
                                              const std::string& name) {
  struct Parts {
    const TarMember* image = nullptr;
    const TarMember* cls = nullptr;
  };
  std::vector<std::string> order;
  std::map<std::string, Parts> parts;
  for (const auto& m : members) {
    const size_t slash = m.name.rfind('/');
    const size_t dot = m.name.find('.', slash == std::string::npos ? 0 : slash + 1);
    if (dot == std::string::npos) continue;
    const std::string key = m.name.substr(0, dot);
    const std::string ext = m.name.substr(dot + 1);
    const bool image = is_image_extension(ext);
    if (!image && strcasecmp(ext.c_str(), "cls") != 0) continue;
    auto [it, added] = parts.try_emplace(key);
    if (added) order.push_back(key);
    const TarMember*& slot = image ? it->second.image : it->second.cls;
    if (slot) {
      throw DataError(fmt::format("{}: key {} has two {} members (offsets {} and {})", name, key,
                                  image ? "image" : "class", slot->header, m.header));
    }
    slot = &m;
  }
  std::vector<ShardExample> out;
  out.reserve(order.size());
  for (const auto& key : order) {
    const Parts& p = parts[key];
    if (!p.image || !p.cls) {
      const TarMember* has = p.image ? p.image : p.cls;
      throw DataError(fmt::format("{}: key {} (offset {}) has {} but no {}", name, key, has->header,
                                  p.image ? "an image" : "a class (.cls)",
                                  p.image ? "class (.cls)" : "image (.jpg, .jpeg or .png)"));
    }
    char text[32] = {};
    const size_t n = std::min<uint64_t>(p.cls->size, sizeof text - 1);
    const size_t got = read(p.cls->offset, n, reinterpret_cast<uint8_t*>(text));
    int64_t label = -1;
    size_t i = 0;
    while (i < got && (text[i] == ' ' || text[i] == '\n' || text[i] == '\r')) ++i;
    if (i < got && text[i] >= '0' && text[i] <= '9') {
      label = 0;
      for (; i < got && text[i] >= '0' && text[i] <= '9' && label <= classes; ++i) {
        label = label * 10 + (text[i] - '0');
      }
    }
    while (i < got && (text[i] == ' ' || text[i] == '\n' || text[i] == '\r')) ++i;
    if (p.cls->size >= sizeof text || i != got || label < 0 || label >= classes) {
      throw DataError(fmt::format("{}: {} (offset {}) is not a class in [0, {}): \"{}\"", name,
                                  p.cls->name, p.cls->offset, classes,
                                  std::string(text, strnlen(text, got))));
    }
    out.push_back(ShardExample{key, *p.image, label});
  }
  if (out.empty()) {
    throw DataError(fmt::format("{}: an empty shard: no image with a class ({} members)", name,
                                members.size()));
  }
  return out;
}

}  // namespace vflow::data
