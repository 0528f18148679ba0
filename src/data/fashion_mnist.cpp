#include "vflow/data/fashion_mnist.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/input_file.h"
#include "vflow/core/error.h"

namespace vflow::data {

namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned byte, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned byte, 1 dimension
constexpr int64_t kSide = 28;
constexpr int64_t kClasses = 10;
// Per-pixel statistics of the Fashion-MNIST training images (scaled to [0, 1]).
constexpr double kMean = 0.2860;
constexpr double kStd = 0.3530;

class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path) {
    core::OpenedInput in = core::open_input_file(path);
    if (!in.ok()) throw DataError(fmt::format("{}: cannot read: {}", path, in.error));
    file_ = gzdopen(in.fd.get(), "rb");
    if (!file_) throw DataError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
    in.fd.release();  // gzclose closes it
  }
  ~GzReader() { gzclose(file_); }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  /// Reads up to n bytes; returns how many were read. Decompression errors throw.
  size_t read(void* out, size_t n) {
    size_t done = 0;
    while (done < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - done, 1U << 30));
      const int got = gzread(file_, static_cast<char*>(out) + done, chunk);
      if (got < 0) {
        int code = 0;
        const char* msg = gzerror(file_, &code);
        throw DataError(fmt::format("{}: corrupt compressed data: {}", path_, msg));
      }
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    // A truncated gzip stream reads short without an error code; gzerror tells.
    int code = 0;
    const char* msg = gzerror(file_, &code);
    if (code != Z_OK && code != Z_STREAM_END) {
      throw DataError(fmt::format("{}: corrupt compressed data: {}", path_, msg));
    }
    return done;
  }

 private:
  std::string path_;
  gzFile file_ = nullptr;
};

/// The largest data section an idx file may announce (Fashion-MNIST's training images are
/// 47 MB; the images become 4-byte floats): a header is checked against it before
/// anything is allocated, and a small gzip file cannot inflate past it.
constexpr uint64_t kMaxIdxBytes = uint64_t{2} << 30;
/// Data is read in pieces of this size, so that a header that lies about the size ends in
/// "truncated" after reading what is there, not in one huge allocation.
constexpr size_t kIdxReadChunk = size_t{64} << 20;

uint32_t big_endian(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

std::string find_file(const std::string& directory, const std::string& stem) {
  for (const char* suffix : {".gz", ""}) {
    const auto path = std::filesystem::path(directory) / (stem + suffix);
    if (std::filesystem::exists(path)) return path.string();
  }
  throw DataError(fmt::format(
      "{}/{}(.gz): file not found (Fashion-MNIST comes with Debian's dataset-fashion-mnist "
      "package; set semantic.data.options.path to another directory)",
      directory, stem));
}

}  // namespace

IdxFile read_idx_file(const std::string& path, uint32_t expected_magic) {
  GzReader in(path);
  uint8_t header[4];
  if (in.read(header, 4) != 4) throw DataError(fmt::format("{}: truncated: no idx header", path));
  const uint32_t magic = big_endian(header);
  if (magic != expected_magic) {
    throw DataError(
        fmt::format("{}: bad magic number 0x{:08x}, expected 0x{:08x} (not an idx file "
                    "of the expected kind)",
                    path, magic, expected_magic));
  }
  IdxFile file;
  const int ndims = static_cast<int>(magic & 0xFF);
  uint64_t total = 1;
  for (int i = 0; i < ndims; ++i) {
    uint8_t dim[4];
    if (in.read(dim, 4) != 4) {
      throw DataError(
          fmt::format("{}: truncated in the header (dimension {} of {})", path, i + 1, ndims));
    }
    const uint64_t size = big_endian(dim);
    file.dims.push_back(static_cast<int64_t>(size));
    // Checked before multiplying: the product of three 32-bit sizes overflows 64 bits.
    total = size != 0 && total > kMaxIdxBytes / size ? kMaxIdxBytes + 1 : total * size;
    if (total > kMaxIdxBytes) {
      throw DataError(
          fmt::format("{}: the header announces dimensions {}, more than the {} GiB "
                      "an idx file may hold",
                      path, fmt::join(file.dims, " x "), kMaxIdxBytes >> 30));
    }
  }
  size_t got = 0;
  while (got < total) {
    const size_t want = std::min<uint64_t>(total - got, kIdxReadChunk);
    file.data.resize(got + want);
    const size_t n = in.read(file.data.data() + got, want);
    got += n;
    if (n < want) break;
  }
  if (got != total) {
    throw DataError(fmt::format("{}: truncated: header announces {} bytes of data, found {}", path,
                                total, got));
  }
  uint8_t extra;
  if (in.read(&extra, 1) != 0) {
    throw DataError(
        fmt::format("{}: unexpected bytes after the {} announced by the header", path, total));
  }
  return file;
}

std::shared_ptr<TensorDataset> load_fashion_mnist(const std::string& directory,
                                                  const std::string& split, bool normalize) {
  VFLOW_ASSERT(split == "train" || split == "test", "split must be train or test");
  const std::string prefix = split == "train" ? "train" : "t10k";
  const std::string images_path = find_file(directory, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_file(directory, prefix + "-labels-idx1-ubyte");
  IdxFile images = read_idx_file(images_path, kImagesMagic);
  IdxFile labels = read_idx_file(labels_path, kLabelsMagic);
  if (images.dims[1] != kSide || images.dims[2] != kSide) {
    throw DataError(fmt::format("{}: images are {}x{}, expected {}x{}", images_path, images.dims[1],
                                images.dims[2], kSide, kSide));
  }
  if (images.dims[0] != labels.dims[0]) {
    throw DataError(fmt::format("{} holds {} images but {} holds {} labels", images_path,
                                images.dims[0], labels_path, labels.dims[0]));
  }
  for (size_t i = 0; i < labels.data.size(); ++i) {
    if (labels.data[i] >= kClasses) {
      throw DataError(fmt::format("{}: label {} at index {} is outside 0..{}", labels_path,
                                  labels.data[i], i, kClasses - 1));
    }
  }
  const int64_t n = images.dims[0];
  auto pixels = torch::from_blob(images.data.data(), {n, 1, kSide, kSide}, torch::kUInt8)
                    .to(torch::kFloat32)
                    .div_(255.0);
  if (normalize) pixels.sub_(kMean).div_(kStd);
  auto targets = torch::from_blob(labels.data.data(), {n}, torch::kUInt8).to(torch::kInt64);
  return std::make_shared<TensorDataset>(pixels, targets, kClasses);
}

}  // namespace vflow::data
