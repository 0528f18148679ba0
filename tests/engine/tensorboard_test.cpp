#include "vflow/engine/tensorboard.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "support.h"
#include "vflow/core/error.h"

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using vflow::engine::crc32c;
using vflow::engine::find_tensorboard_file;
using vflow::engine::read_tensorboard_scalars;
using vflow::engine::TensorBoardWriter;
using vflow::testing::read_file;
using vflow::testing::TempDir;
using vflow::testing::write_file;

namespace {

/// The message of the vflow::Error that reading `path` throws; empty if it reads cleanly.
std::string read_error(const std::string& path) {
  try {
    read_tensorboard_scalars(path);
  } catch (const vflow::DataError& e) {
    return e.what();
  }
  return "";
}

uint64_t le64(const std::string& bytes, size_t at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<uint8_t>(bytes[at + i])} << (8 * i);
  return v;
}

/// Byte offsets at which the TFRecords of `content` start, walking the length fields.
std::vector<size_t> record_offsets(const std::string& content) {
  std::vector<size_t> offsets;
  for (size_t at = 0; at < content.size(); at += 16 + le64(content, at)) offsets.push_back(at);
  return offsets;
}

/// A file with a header event and five scalars; returns its path.
std::string write_sample(const TempDir& dir) {
  TensorBoardWriter writer(dir.path());
  for (int step = 0; step < 5; ++step) writer.scalar("loss", step, 1.0 / (step + 1), 1000.0 + step);
  return writer.path();
}

// A minimal protobuf encoder, independent of the one under test, to build events with fields
// the writer never emits.
void varint(std::string& out, uint64_t v) {
  for (; v >= 0x80; v >>= 7) out.push_back(static_cast<char>((v & 0x7f) | 0x80));
  out.push_back(static_cast<char>(v));
}
void key(std::string& out, uint32_t field, uint32_t wire_type) {
  varint(out, (uint64_t{field} << 3) | wire_type);
}
void fixed(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void length_delimited(std::string& out, uint32_t field, const std::string& bytes) {
  key(out, field, 2);
  varint(out, bytes.size());
  out += bytes;
}
uint32_t masked(const std::string& bytes) {
  const uint32_t crc = crc32c(bytes.data(), bytes.size());
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}
std::string tf_record(const std::string& data) {
  std::string length;
  fixed(length, data.size(), 8);
  std::string out = length;
  fixed(out, masked(length), 4);
  out += data;
  fixed(out, masked(data), 4);
  return out;
}

}  // namespace

TEST_CASE("crc32c matches the Castagnoli check value", "[unit][tensorboard]") {
  CHECK(crc32c("123456789", 9) == 0xE3069283u);
  CHECK(crc32c("", 0) == 0u);
}

TEST_CASE("TensorBoard scalars written are read back", "[unit][tensorboard]") {
  TempDir dir;
  const std::string log_dir = dir.file("runs/a");
  std::string path;
  {
    TensorBoardWriter writer(log_dir);
    path = writer.path();
    writer.scalar("train/loss", 0, 2.5, 1700000000.25);
    writer.scalar("train/loss", 1, 0.1, 1700000001.5);
    writer.scalar("train/lr", 1, 1e-3, 1700000001.5);
    writer.scalar("train/loss", int64_t{1} << 40, -7.0, 1700000002.0);
    writer.scalar("eval/accuracy", 3, 0.875);
  }
  const std::string name = std::filesystem::path(path).filename().string();
  CHECK_THAT(name, StartsWith("events.out.tfevents."));
  CHECK(std::filesystem::path(path).parent_path() == std::filesystem::path(log_dir));
  CHECK(find_tensorboard_file(log_dir) == path);

  const auto scalars = read_tensorboard_scalars(path);
  REQUIRE(scalars.size() == 5);
  CHECK(scalars[0].tag == "train/loss");
  CHECK(scalars[0].step == 0);
  CHECK(scalars[0].value == 2.5f);
  CHECK(scalars[0].wall_time == 1700000000.25);
  CHECK(scalars[1].tag == "train/loss");
  CHECK(scalars[1].step == 1);
  CHECK(scalars[1].value == 0.1f);
  CHECK(scalars[2].tag == "train/lr");
  CHECK(scalars[2].value == 1e-3f);
  CHECK(scalars[3].step == int64_t{1} << 40);
  CHECK(scalars[3].value == -7.0f);
  CHECK(scalars[3].wall_time == 1700000002.0);
  CHECK(scalars[4].tag == "eval/accuracy");
  CHECK(scalars[4].step == 3);
  CHECK(scalars[4].value == 0.875f);
  CHECK(scalars[4].wall_time > 1.6e9);
}

TEST_CASE("a flushed TensorBoard file is readable while the writer is open",
          "[unit][tensorboard]") {
  TempDir dir;
  TensorBoardWriter writer(dir.path());
  CHECK(read_tensorboard_scalars(writer.path()).empty());
  writer.scalar("x", 7, 1.0);
  writer.flush();
  const auto scalars = read_tensorboard_scalars(writer.path());
  REQUIRE(scalars.size() == 1);
  CHECK(scalars[0].step == 7);
}

TEST_CASE("writers sharing a TensorBoard directory get their own files", "[unit][tensorboard]") {
  TempDir dir;
  write_file(dir.file("events.out.tfevents.1000000000.oldhost"), "");
  write_file(dir.file("notes.txt"), "");
  TensorBoardWriter first(dir.path());
  TensorBoardWriter second(dir.path());
  CHECK(first.path() != second.path());
  const std::string newest = find_tensorboard_file(dir.path());
  CHECK((newest == first.path() || newest == second.path()));
}

TEST_CASE("a corrupted byte anywhere in a TensorBoard file is reported with its record",
          "[unit][tensorboard]") {
  TempDir dir;
  const std::string path = write_sample(dir);
  const std::string good = read_file(path);
  const auto offsets = record_offsets(good);
  REQUIRE(offsets.size() == 6);
  REQUIRE(read_error(path) == "");

  const std::string bad = dir.file("bad");
  size_t record = 0;
  for (size_t at = 0; at < good.size(); ++at) {
    if (record + 1 < offsets.size() && at == offsets[record + 1]) ++record;
    std::string content = good;
    content[at] = static_cast<char>(content[at] ^ 0x10);
    write_file(bad, content);
    const std::string message = read_error(bad);
    INFO("flipped byte " << at << ": " << message);
    CHECK_THAT(message, Contains(bad));
    CHECK_THAT(message, Contains("byte offset " + std::to_string(offsets[record]) + ":"));
    CHECK_THAT(message, Contains("CRC mismatch"));
    const bool in_length = at - offsets[record] < 12;
    CHECK_THAT(message, Contains(in_length ? "length CRC" : "data CRC"));
  }
}

TEST_CASE("a truncated TensorBoard file is rejected with the offset of the cut record",
          "[unit][tensorboard]") {
  TempDir dir;
  const std::string path = write_sample(dir);
  const std::string good = read_file(path);
  const auto offsets = record_offsets(good);

  const std::string cut = dir.file("cut");
  size_t record = 0;
  for (size_t size = 1; size < good.size(); ++size) {
    if (record + 1 < offsets.size() && size == offsets[record + 1]) {
      ++record;
      // Cut between records: a shorter but valid file.
      write_file(cut, good.substr(0, size));
      CHECK(read_tensorboard_scalars(cut).size() == record - 1);
      continue;
    }
    write_file(cut, good.substr(0, size));
    const std::string message = read_error(cut);
    INFO("cut at " << size << ": " << message);
    CHECK_THAT(message, Contains(cut));
    CHECK_THAT(message, Contains("byte offset " + std::to_string(offsets[record]) + ":"));
    CHECK_THAT(message, Contains("truncated"));
  }
}

TEST_CASE("TensorBoard events with fields the writer never emits are decoded",
          "[unit][tensorboard]") {
  std::string value;
  length_delimited(value, 7, "node");                      // node_name
  length_delimited(value, 9, std::string("\x0a\x00", 2));  // metadata
  length_delimited(value, 1, "acc");                       // tag
  key(value, 2, 5);                                        // simple_value = 0.5f
  fixed(value, 0x3f000000u, 4);
  std::string image_value;
  length_delimited(image_value, 1, "img");
  length_delimited(image_value, 4, "\x08\x01");  // image: not a scalar
  std::string summary;
  length_delimited(summary, 1, image_value);
  length_delimited(summary, 1, value);

  std::string event;
  length_delimited(event, 5, summary);  // summary before step and wall_time on the wire
  length_delimited(event, 4, "graph");
  key(event, 20, 0);
  varint(event, 300);
  key(event, 21, 5);
  fixed(event, 1, 4);
  key(event, 22, 1);
  fixed(event, 2, 8);
  key(event, 23, 3);  // a proto2 group holding one varint
  key(event, 1, 0);
  varint(event, 1);
  key(event, 23, 4);
  key(event, 1, 1);  // wall_time = 2.0
  fixed(event, 0x4000000000000000u, 8);
  key(event, 2, 0);  // step = -1, a ten-byte varint
  varint(event, ~uint64_t{0});

  TempDir dir;
  write_file(dir.file("events"), tf_record(event));
  const auto scalars = read_tensorboard_scalars(dir.file("events"));
  REQUIRE(scalars.size() == 1);
  CHECK(scalars[0].tag == "acc");
  CHECK(scalars[0].value == 0.5f);
  CHECK(scalars[0].step == -1);
  CHECK(scalars[0].wall_time == 2.0);

  std::string wrong_type;
  key(wrong_type, 2, 2);  // step as a string
  varint(wrong_type, 0);
  write_file(dir.file("wrong"), tf_record(wrong_type));
  CHECK_THAT(read_error(dir.file("wrong")), Contains("byte offset 0: malformed Event"));
}

TEST_CASE("TensorBoard file errors name the path", "[unit][tensorboard]") {
  TempDir dir;
  CHECK_THAT(read_error(dir.file("missing")), Contains(dir.file("missing")));
  CHECK_THROWS_WITH(find_tensorboard_file(dir.path()), Contains(dir.path()));
  write_file(dir.file("plain"), "");
  CHECK_THROWS_AS(TensorBoardWriter(dir.file("plain/sub")), vflow::Error);
  CHECK_THROWS_WITH(TensorBoardWriter(dir.file("plain/sub")), Contains(dir.file("plain/sub")));
}
