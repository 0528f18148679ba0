#include "vflow/data/image_codec.h"

#include <fmt/format.h>
#include <png.h>
#include <turbojpeg.h>

#include <cstring>
#include <memory>

#include "vflow/core/error.h"

namespace vflow::data {

namespace {

/// Larger images are refused rather than decoded: a damaged header can claim 65535 × 65535
/// pixels (12 GiB), and no training image comes near this (ImageNet's largest has 15 M).
constexpr int64_t kMaxPixels = int64_t{1} << 27;

bool is_jpeg(const uint8_t* b, size_t n) {
  return n >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF;
}
bool is_png(const uint8_t* b, size_t n) {
  static const uint8_t kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  return n >= 8 && std::memcmp(b, kSignature, 8) == 0;
}

void check_size(const std::string& name, int64_t width, int64_t height) {
  if (width <= 0 || height <= 0 || width * height > kMaxPixels) {
    throw DataError(fmt::format("{}: the image claims {} x {} pixels (at most {} M are read)", name,
                                width, height, kMaxPixels >> 20));
  }
}

/// One TurboJPEG decompressor per thread: a handle is not safe to share, and making one
/// per image costs an allocation of its tables.
tjhandle decompressor() {
  struct Handle {
    tjhandle h = tjInitDecompress();
    ~Handle() {
      if (h) tjDestroy(h);
    }
  };
  thread_local Handle handle;
  if (!handle.h) throw Error(fmt::format("libjpeg-turbo: {}", tjGetErrorStr2(nullptr)));
  return handle.h;
}

/// Whether a TurboJPEG failure leaves a usable image: a warning about extraneous bytes or
/// a damaged marker that the decoder skipped, as photographs in the wild carry. A file that
/// ends early ("Premature end of JPEG file") is refused: its rows are grey filler.
bool tolerable(tjhandle h) {
  if (tjGetErrorCode(h) != TJERR_WARNING) return false;
  return std::strstr(tjGetErrorStr2(h), "Premature end") == nullptr;
}

ImageHeader jpeg_header(const uint8_t* bytes, size_t size, const std::string& name) {
  tjhandle h = decompressor();
  int width = 0, height = 0, subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(h, bytes, static_cast<unsigned long>(size), &width, &height, &subsamp,
                          &colorspace) != 0) {
    throw DataError(fmt::format("{}: a corrupt JPEG header: {}", name, tjGetErrorStr2(h)));
  }
  if (width <= 0 || height <= 0) {
    throw DataError(fmt::format("{}: a corrupt or truncated JPEG header (no image size)", name));
  }
  check_size(name, width, height);
  return ImageHeader{ImageFormat::kJpeg, width, height};
}

ImageHeader png_header(const uint8_t* bytes, size_t size, const std::string& name) {
  // The IHDR chunk follows the signature: length, "IHDR", width, height (big-endian).
  if (size < 24 || std::memcmp(bytes + 12, "IHDR", 4) != 0) {
    throw DataError(fmt::format("{}: a PNG without its IHDR chunk at offset 8", name));
  }
  const auto be32 = [bytes](size_t at) {
    return static_cast<int64_t>(bytes[at]) << 24 | static_cast<int64_t>(bytes[at + 1]) << 16 |
           static_cast<int64_t>(bytes[at + 2]) << 8 | static_cast<int64_t>(bytes[at + 3]);
  };
  const int64_t width = be32(16), height = be32(20);
  check_size(name, width, height);
  return ImageHeader{ImageFormat::kPng, static_cast<int>(width), static_cast<int>(height)};
}

Image decode_jpeg(const uint8_t* bytes, size_t size, const std::string& name, int channels,
                  Scale scale) {
  const ImageHeader header = jpeg_header(bytes, size, name);
  tjhandle h = decompressor();
  Image image;
  image.width = (header.width * scale.num + scale.denom - 1) / scale.denom;  // TJSCALED
  image.height = (header.height * scale.num + scale.denom - 1) / scale.denom;
  image.channels = channels;
  image.pixels.resize(static_cast<size_t>(image.width) * static_cast<size_t>(image.height) *
                      static_cast<size_t>(channels));
  const int format = channels == 1 ? TJPF_GRAY : TJPF_RGB;
  if (tjDecompress2(h, bytes, static_cast<unsigned long>(size), image.pixels.data(), image.width, 0,
                    image.height, format, 0) != 0 &&
      !tolerable(h)) {
    throw DataError(fmt::format("{}: a corrupt or truncated JPEG: {}", name, tjGetErrorStr2(h)));
  }
  return image;
}

Image decode_png(const uint8_t* bytes, size_t size, const std::string& name, int channels) {
  png_image png;
  std::memset(&png, 0, sizeof png);
  png.version = PNG_IMAGE_VERSION;
  // Frees libpng's state on every path out (png_image_free is a no-op once it is freed).
  const std::unique_ptr<png_image, void (*)(png_imagep)> guard(&png, png_image_free);
  if (!png_image_begin_read_from_memory(&png, bytes, size)) {
    throw DataError(fmt::format("{}: a corrupt PNG: {}", name, png.message));
  }
  check_size(name, png.width, png.height);
  png.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  Image image;
  image.width = static_cast<int>(png.width);
  image.height = static_cast<int>(png.height);
  image.channels = channels;
  image.pixels.resize(PNG_IMAGE_SIZE(png));
  if (!png_image_finish_read(&png, nullptr, image.pixels.data(), 0, nullptr)) {
    throw DataError(fmt::format("{}: a corrupt or truncated PNG: {}", name, png.message));
  }
  return image;
}

}  // namespace

ImageHeader read_image_header(const uint8_t* bytes, size_t size, const std::string& name) {
  if (is_jpeg(bytes, size)) return jpeg_header(bytes, size, name);
  if (is_png(bytes, size)) return png_header(bytes, size, name);
  throw DataError(
      fmt::format("{}: neither a JPEG nor a PNG ({} bytes, starting with neither's "
                  "signature)",
                  name, size));
}

Scale jpeg_scale_for(const ImageHeader& header, double box_width, double box_height, int need_width,
                     int need_height) {
  Scale best;
  if (header.format != ImageFormat::kJpeg) return best;
  int count = 0;
  const tjscalingfactor* factors = tjGetScalingFactors(&count);
  for (int i = 0; factors && i < count; ++i) {
    const tjscalingfactor f = factors[i];
    if (f.num > f.denom) continue;
    const double r = static_cast<double>(f.num) / f.denom;
    if (box_width * r >= need_width && box_height * r >= need_height && r * best.denom < best.num) {
      best = Scale{f.num, f.denom};
    }
  }
  return best;
}

Image decode_image(const uint8_t* bytes, size_t size, const std::string& name, int channels,
                   Scale scale) {
  VFLOW_ASSERT(channels == 1 || channels == 3, "images decode to 1 or 3 channels");
  if (is_jpeg(bytes, size)) return decode_jpeg(bytes, size, name, channels, scale);
  if (is_png(bytes, size)) return decode_png(bytes, size, name, channels);
  read_image_header(bytes, size, name);  // throws, naming what the bytes are not
  return {};
}

}  // namespace vflow::data
