// TensorBoard event files without TensorFlow or protobuf: a scalar writer and a reader.
//
// An event file is a sequence of TFRecords, each holding one serialized tensorflow.Event
// (tensorflow/core/util/event.proto, summary.proto). The writer emits only what TensorBoard
// needs for scalar charts; the reader is strict about framing (both CRCs of every record are
// checked) and lenient about content (fields it does not know are skipped by wire type), so it
// also reads files written by TensorFlow, PyTorch or tensorboardX.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace vflow::core {
class AppendFile;
}

namespace vflow::engine {

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum TFRecord framing uses.
/// crc32c("123456789", 9) == 0xE3069283.
uint32_t crc32c(const void* data, size_t size);

/// Appends scalar summaries to a new event file in a directory, the layout `tensorboard
/// --logdir <dir>` reads. Each writer creates its own file
/// "events.out.tfevents.<unix seconds>.<hostname>.<pid>" (".<n>" appended if that name is
/// taken), so several writers may share a directory. Records are buffered: call flush() to
/// make them visible to readers and to learn about write errors; the destructor flushes too but
/// cannot report failure. A flush that fails (a full disk) leaves no partial record behind:
/// the file stays readable and its buffered records are dropped. Not thread-safe.
class TensorBoardWriter {
 public:
  /// Creates `dir` if needed and writes the file's first event (file_version "brain.Event:2").
  /// Throws vflow::Error naming the path if the directory or file cannot be created.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  /// One point of the chart `tag`. `wall_time` is in seconds since the Unix epoch; `value` is
  /// stored as a float (Summary.Value.simple_value).
  void scalar(const std::string& tag, int64_t step, double value, double wall_time);
  /// As above, stamped with the current time.
  void scalar(const std::string& tag, int64_t step, double value);

  /// Pushes buffered records to the file in one write; throws vflow::Error naming the file
  /// and the cause on failure, after dropping them.
  void flush();
  /// As flush(), but returns the cause of a failure ("" on success) instead of throwing.
  std::string try_flush();

  /// The event file this writer appends to.
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);

  std::string path_;
  std::unique_ptr<core::AppendFile> file_;
  std::string pending_;  ///< framed records not yet written
};

/// One Summary.Value with a simple_value, with the step and time of its Event.
struct TensorBoardScalar {
  std::string tag;
  int64_t step = 0;
  double wall_time = 0;  ///< seconds since the Unix epoch
  float value = 0;
};

/// Every simple_value scalar in the event file at `path`, in file order. Events without a
/// summary (such as the file_version header) and values of other kinds (images, histograms,
/// tensor-typed scalars) yield nothing. Throws vflow::DataError naming the file and the byte
/// offset of the record if the file cannot be read, a record is truncated, a CRC does not
/// match, or an event is not valid protobuf.
std::vector<TensorBoardScalar> read_tensorboard_scalars(const std::string& path);

/// The newest "events.out.tfevents.*" file in `dir`: latest creation time in its name, then
/// latest modification time. Throws vflow::Error if there is none.
std::string find_tensorboard_file(const std::string& dir);

}  // namespace vflow::engine
