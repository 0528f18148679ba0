#include "vflow/engine/tensorboard.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <tuple>

#include "core/input_file.h"
#include "core/output_file.h"
#include "vflow/core/error.h"

namespace vflow::engine {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFilePrefix = "events.out.tfevents.";

constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? 0x82F63B78u : 0u);
    table[i] = crc;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

// TFRecord stores CRCs masked: checksumming data that itself contains CRCs is weak otherwise.
uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// ---- protobuf wire format ------------------------------------------------------------

enum WireType : uint32_t {
  kVarint = 0,
  kFixed64 = 1,
  kLengthDelimited = 2,
  kStartGroup = 3,
  kEndGroup = 4,
  kFixed32 = 5
};

void put_fixed32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_fixed64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, uint32_t field, WireType type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | type);
}

void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

void put_double(std::string& out, uint32_t field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed64);
  put_fixed64(out, bits);
}

void put_float(std::string& out, uint32_t field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed32);
  put_fixed32(out, bits);
}

// Field numbers from tensorflow/core/util/event.proto and framework/summary.proto.
namespace event_field {
constexpr uint32_t kWallTime = 1;     // double
constexpr uint32_t kStep = 2;         // int64
constexpr uint32_t kFileVersion = 3;  // string
constexpr uint32_t kSummary = 5;      // Summary
}  // namespace event_field
namespace summary_field {
constexpr uint32_t kValue = 1;  // repeated Summary.Value
}
namespace value_field {
constexpr uint32_t kTag = 1;          // string
constexpr uint32_t kSimpleValue = 2;  // float
}  // namespace value_field

/// Reads one protobuf message held in [data, data + size). Throws std::runtime_error with a
/// short reason; the caller adds the file and offset.
class ProtoReader {
 public:
  ProtoReader(const char* data, size_t size) : p_(data), end_(data + size) {}

  bool done() const { return p_ == end_; }

  /// Reads the next key; false at the end of the message.
  bool next(uint32_t& field, WireType& type) {
    if (done()) return false;
    const uint64_t key = varint();
    field = static_cast<uint32_t>(key >> 3);
    type = static_cast<WireType>(key & 7);
    if (field == 0) throw std::runtime_error("field number 0");
    return true;
  }

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      need(1);
      const auto byte = static_cast<uint8_t>(*p_++);
      v |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return v;
    }
    throw std::runtime_error("varint longer than 10 bytes");
  }

  uint64_t fixed64() {
    need(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p_[i])) << (8 * i);
    p_ += 8;
    return v;
  }

  uint32_t fixed32() {
    need(4);
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p_[i])) << (8 * i);
    p_ += 4;
    return v;
  }

  /// A length-delimited field's payload, as a sub-reader over it.
  ProtoReader bytes() {
    const uint64_t size = varint();
    if (size > static_cast<uint64_t>(end_ - p_)) {
      throw std::runtime_error("length-delimited field runs past the end of its message");
    }
    ProtoReader sub(p_, static_cast<size_t>(size));
    p_ += size;
    return sub;
  }

  std::string text() {
    const ProtoReader sub = bytes();
    return std::string(sub.p_, sub.end_);
  }

  double as_double() {
    const uint64_t bits = fixed64();
    double v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }

  float as_float() {
    const uint32_t bits = fixed32();
    float v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }

  /// Skips the value of a field whose key was just read.
  void skip(uint32_t field, WireType type) {
    switch (type) {
      case kVarint:
        varint();
        return;
      case kFixed64:
        fixed64();
        return;
      case kLengthDelimited:
        bytes();
        return;
      case kFixed32:
        fixed32();
        return;
      case kStartGroup: {
        // Deprecated proto2 groups: skip nested fields up to the matching end key.
        uint32_t inner_field;
        WireType inner_type;
        while (next(inner_field, inner_type)) {
          if (inner_type == kEndGroup) {
            if (inner_field != field) throw std::runtime_error("mismatched end of group");
            return;
          }
          skip(inner_field, inner_type);
        }
        throw std::runtime_error("unterminated group");
      }
      case kEndGroup:
        throw std::runtime_error("unexpected end of group");
    }
    throw std::runtime_error(fmt::format("unknown wire type {}", static_cast<uint32_t>(type)));
  }

  /// Rejects a known field with an unexpected wire type: skipping it would hide a file that
  /// means something else by this field number.
  void expect(uint32_t field, WireType type, WireType expected) {
    if (type != expected) {
      throw std::runtime_error(fmt::format("field {} has wire type {}, expected {}", field,
                                           static_cast<uint32_t>(type),
                                           static_cast<uint32_t>(expected)));
    }
  }

 private:
  void need(size_t n) const {
    if (static_cast<size_t>(end_ - p_) < n) {
      throw std::runtime_error("field runs past the end of its message");
    }
  }

  const char* p_;
  const char* end_;
};

void decode_summary(ProtoReader summary, int64_t step, double wall_time,
                    std::vector<TensorBoardScalar>& out) {
  uint32_t field;
  WireType type;
  while (summary.next(field, type)) {
    if (field != summary_field::kValue) {
      summary.skip(field, type);
      continue;
    }
    summary.expect(field, type, kLengthDelimited);
    ProtoReader value = summary.bytes();
    TensorBoardScalar scalar;
    scalar.step = step;
    scalar.wall_time = wall_time;
    bool has_simple_value = false;
    while (value.next(field, type)) {
      if (field == value_field::kTag) {
        value.expect(field, type, kLengthDelimited);
        scalar.tag = value.text();
      } else if (field == value_field::kSimpleValue) {
        value.expect(field, type, kFixed32);
        scalar.value = value.as_float();
        has_simple_value = true;
      } else {
        value.skip(field, type);
      }
    }
    if (has_simple_value) out.push_back(std::move(scalar));
  }
}

/// Appends the scalars of one serialized Event to `out`.
void decode_event(const char* data, size_t size, std::vector<TensorBoardScalar>& out) {
  ProtoReader event(data, size);
  double wall_time = 0;
  int64_t step = 0;
  // Summary may precede step and wall_time on the wire, so decode it last.
  std::vector<ProtoReader> summaries;
  uint32_t field;
  WireType type;
  while (event.next(field, type)) {
    switch (field) {
      case event_field::kWallTime:
        event.expect(field, type, kFixed64);
        wall_time = event.as_double();
        break;
      case event_field::kStep:
        event.expect(field, type, kVarint);
        step = static_cast<int64_t>(event.varint());
        break;
      case event_field::kSummary:
        event.expect(field, type, kLengthDelimited);
        summaries.push_back(event.bytes());
        break;
      default:
        event.skip(field, type);
    }
  }
  for (const auto& summary : summaries) decode_summary(summary, step, wall_time, out);
}

uint64_t load_le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

uint32_t load_le32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}

std::string read_whole_file(const std::string& path) {
  auto in = core::read_input_file(path, uint64_t{1} << 40);
  if (!in.ok())
    throw DataError(fmt::format("{}: cannot read TensorBoard event file: {}", path, in.error));
  return std::move(in.bytes);
}

std::string hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) crc = kCrc32cTable[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

// ---- writer --------------------------------------------------------------------------

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    throw Error(fmt::format("{}: cannot create TensorBoard log directory: {}", dir, ec.message()));
  }
  const double now = unix_now();
  const std::string base =
      (fs::path(dir) /
       fmt::format("{}{}.{}.{}", kFilePrefix, static_cast<int64_t>(now), hostname(), ::getpid()))
          .string();
  // Exclusive: two writers started in the same second must not append to one file.
  for (int attempt = 0; !file_; ++attempt) {
    path_ = attempt == 0 ? base : fmt::format("{}.{}", base, attempt);
    auto file = std::make_unique<core::AppendFile>(path_, /*exclusive=*/true);
    if (!file->is_open()) {
      if (file->error_number() == EEXIST && attempt < 1000) continue;
      throw Error(
          fmt::format("{}: cannot create TensorBoard event file: {}", path_, file->error()));
    }
    file_ = std::move(file);
  }
  std::string event;
  put_double(event, event_field::kWallTime, now);
  put_bytes(event, event_field::kFileVersion, "brain.Event:2");
  write_record(event);
  // Flushed at once so that the file is a valid event file from the start; a file whose
  // first event could not be written is removed, not left empty for readers to pick.
  if (const std::string error = try_flush(); !error.empty()) {
    file_.reset();
    ::unlink(path_.c_str());
    throw Error(fmt::format("{}: cannot write TensorBoard event file: {}", path_, error));
  }
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ && !pending_.empty()) file_->append(pending_);
}

void TensorBoardWriter::scalar(const std::string& tag, int64_t step, double value,
                               double wall_time) {
  std::string summary_value;
  put_bytes(summary_value, value_field::kTag, tag);
  put_float(summary_value, value_field::kSimpleValue, static_cast<float>(value));
  std::string summary;
  put_bytes(summary, summary_field::kValue, summary_value);
  std::string event;
  put_double(event, event_field::kWallTime, wall_time);
  put_key(event, event_field::kStep, kVarint);
  put_varint(event, static_cast<uint64_t>(step));
  put_bytes(event, event_field::kSummary, summary);
  write_record(event);
}

void TensorBoardWriter::scalar(const std::string& tag, int64_t step, double value) {
  scalar(tag, step, value, unix_now());
}

std::string TensorBoardWriter::try_flush() {
  if (pending_.empty()) return "";
  std::string error = file_->append(pending_);
  pending_.clear();
  return error;
}

void TensorBoardWriter::flush() {
  if (const std::string error = try_flush(); !error.empty()) {
    throw Error(fmt::format("{}: cannot write TensorBoard event file: {}", path_, error));
  }
}

// TFRecord framing: uint64 length, masked CRC of the length bytes, data, masked CRC of the
// data; all integers little-endian.
void TensorBoardWriter::write_record(const std::string& data) {
  std::string record;
  record.reserve(data.size() + 16);
  put_fixed64(record, data.size());
  put_fixed32(record, masked_crc32c(record.data(), 8));
  record += data;
  put_fixed32(record, masked_crc32c(data.data(), data.size()));
  pending_ += record;
}

// ---- reader --------------------------------------------------------------------------

std::vector<TensorBoardScalar> read_tensorboard_scalars(const std::string& path) {
  const std::string content = read_whole_file(path);
  const auto* bytes = reinterpret_cast<const unsigned char*>(content.data());
  std::vector<TensorBoardScalar> scalars;
  size_t offset = 0;
  while (offset < content.size()) {
    const size_t left = content.size() - offset;
    const auto corrupt = [&](const std::string& what) {
      return DataError(
          fmt::format("{}: corrupt TensorBoard record at byte offset {}: {}", path, offset, what));
    };
    if (left < 12) {
      throw corrupt(fmt::format("truncated: record header needs 12 bytes, file has {} left", left));
    }
    const uint32_t length_crc = load_le32(bytes + offset + 8);
    if (length_crc != masked_crc32c(bytes + offset, 8)) {
      throw corrupt("length CRC mismatch");
    }
    // Trusted only now that its CRC matched.
    const uint64_t length = load_le64(bytes + offset);
    if (left < 16 || length > left - 16) {
      throw corrupt(fmt::format("truncated: record of {} data bytes, file has {} left", length,
                                left < 16 ? 0 : left - 16));
    }
    const unsigned char* data = bytes + offset + 12;
    if (load_le32(data + length) != masked_crc32c(data, length)) {
      throw corrupt("data CRC mismatch");
    }
    try {
      decode_event(reinterpret_cast<const char*>(data), length, scalars);
    } catch (const std::runtime_error& e) {
      throw corrupt(fmt::format("malformed Event: {}", e.what()));
    }
    offset += 16 + length;
  }
  return scalars;
}

std::string find_tensorboard_file(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw DataError(fmt::format("{}: not a directory, no TensorBoard event file to read", dir));
  }
  const std::string prefix = kFilePrefix;
  bool found = false;
  std::tuple<long long, fs::file_time_type, std::string> newest;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    std::error_code entry_ec;
    if (name.compare(0, prefix.size(), prefix) != 0 || !entry.is_regular_file(entry_ec)) continue;
    const long long created = std::strtoll(name.c_str() + prefix.size(), nullptr, 10);
    auto key = std::make_tuple(created, entry.last_write_time(entry_ec), entry.path().string());
    if (!found || key > newest) newest = std::move(key);
    found = true;
  }
  if (ec) throw DataError(fmt::format("{}: cannot list directory: {}", dir, ec.message()));
  if (!found) throw DataError(fmt::format("{}: no {}* file in this directory", dir, prefix));
  return std::get<2>(newest);
}

}  // namespace vflow::engine
