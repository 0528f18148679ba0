#include "vflow/data/image_codec.h"

#include <fmt/format.h>
#include <png.h>
#include <turbojpeg.h>

#include <csetjmp>
#include <cstdio>  // jpeglib.h needs FILE
#include <cstring>
// clang-format off
#include <jpeglib.h>
#include <jerror.h>
// clang-format on
#include <algorithm>
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
  // Each side first: a PNG's are 32-bit, and their product may not fit 64 bits.
  if (width <= 0 || height <= 0 || width > kMaxPixels || height > kMaxPixels ||
      width * height > kMaxPixels) {
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

void decode_jpeg(const uint8_t* bytes, size_t size, const std::string& name, int channels,
                 Scale scale, Image& image) {
  const ImageHeader header = jpeg_header(bytes, size, name);
  tjhandle h = decompressor();
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
}

void decode_png(const uint8_t* bytes, size_t size, const std::string& name, int channels,
                Image& image) {
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
  image.width = static_cast<int>(png.width);
  image.height = static_cast<int>(png.height);
  image.channels = channels;
  image.x0 = image.y0 = 0;
  image.full_width = image.width;
  image.full_height = image.height;
  image.pixels.resize(PNG_IMAGE_SIZE(png));
  if (!png_image_finish_read(&png, nullptr, image.pixels.data(), 0, nullptr)) {
    throw DataError(fmt::format("{}: a corrupt or truncated PNG: {}", name, png.message));
  }
}

/// libjpeg's error handling for one decode: errors jump back to the decode (no C++ object
/// with a destructor lives between the two), a warning that the data ended is kept.
struct JpegErrors {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  bool ended_early = false;
  int64_t width = 0, height = 0;  ///< the header's size, when it is too large to read
  char message[JMSG_LENGTH_MAX] = {};
};

void jpeg_failed(j_common_ptr cinfo) {
  auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, errors->message);
  std::longjmp(errors->jump, 1);
}

void jpeg_message(j_common_ptr cinfo, int level) {
  auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF && !errors->ended_early) {
    errors->ended_early = true;
    (*cinfo->err->format_message)(cinfo, errors->message);
  }
}

/// The region decode; false with errors.message set when libjpeg refused the file.
bool jpeg_region(const uint8_t* bytes, size_t size, int channels, Scale scale,
                 const std::function<Region(int, int)>& region_of, Image& image,
                 jpeg_decompress_struct& cinfo, JpegErrors& errors) {
  cinfo.err = jpeg_std_error(&errors.mgr);
  errors.mgr.error_exit = jpeg_failed;
  errors.mgr.emit_message = jpeg_message;
  if (setjmp(errors.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, bytes, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  // The size checks, before libjpeg allocates for the image.
  if (int64_t{cinfo.image_width} * cinfo.image_height > kMaxPixels) {
    errors.width = cinfo.image_width;
    errors.height = cinfo.image_height;
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  cinfo.out_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  cinfo.scale_num = static_cast<unsigned>(scale.num);
  cinfo.scale_denom = static_cast<unsigned>(scale.denom);
  cinfo.dct_method = JDCT_ISLOW;
  jpeg_start_decompress(&cinfo);
  const int full_width = static_cast<int>(cinfo.output_width);
  const int full_height = static_cast<int>(cinfo.output_height);
  Region r = region_of(full_width, full_height);
  r.x0 = std::clamp(r.x0, 0, full_width - 1);
  r.x1 = std::clamp(r.x1, r.x0 + 1, full_width);
  r.y0 = std::clamp(r.y0, 0, full_height - 1);
  r.y1 = std::clamp(r.y1, r.y0 + 1, full_height);
  JDIMENSION x0 = static_cast<JDIMENSION>(r.x0), width = static_cast<JDIMENSION>(r.x1 - r.x0);
  if (static_cast<int>(width) < full_width) jpeg_crop_scanline(&cinfo, &x0, &width);
  if (r.y0 > 0) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(r.y0));
  image.width = static_cast<int>(width);
  image.height = r.y1 - r.y0;
  image.channels = channels;
  image.x0 = static_cast<int>(x0);
  image.y0 = r.y0;
  image.full_width = full_width;
  image.full_height = full_height;
  image.pixels.resize(static_cast<size_t>(image.width) * static_cast<size_t>(image.height) *
                      static_cast<size_t>(channels));
  const size_t line = static_cast<size_t>(image.width) * static_cast<size_t>(channels);
  JSAMPROW rows[16];
  while (static_cast<int>(cinfo.output_scanline) < r.y1) {
    const int at = static_cast<int>(cinfo.output_scanline) - r.y0;
    const int n = std::min(16, r.y1 - static_cast<int>(cinfo.output_scanline));
    for (int i = 0; i < n; ++i) rows[i] = image.pixels.data() + static_cast<size_t>(at + i) * line;
    jpeg_read_scanlines(&cinfo, rows, static_cast<JDIMENSION>(n));
  }
  if (r.y1 == full_height) {
    jpeg_finish_decompress(&cinfo);
  } else {
    jpeg_abort_decompress(&cinfo);
  }
  jpeg_destroy_decompress(&cinfo);
  return !errors.ended_early;
}

}  // namespace

bool is_image_extension(const std::string& extension) {
  std::string ext = extension;
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == "jpg" || ext == "jpeg" || ext == "png";
}

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
    // Only 1/2, 1/4 and 1/8: libjpeg-turbo's SIMD code has those reduced inverse DCTs; the
    // others (3/8, 5/8, ...) run its plain C code and decode slower than the full size.
    if (f.num != 1 || (f.denom != 2 && f.denom != 4 && f.denom != 8)) continue;
    const double r = static_cast<double>(f.num) / f.denom;
    if (box_width * r >= need_width && box_height * r >= need_height && r * best.denom < best.num) {
      best = Scale{f.num, f.denom};
    }
  }
  return best;
}

void decode_image_into(const uint8_t* bytes, size_t size, const std::string& name, int channels,
                       Scale scale, Image& image) {
  VFLOW_ASSERT(channels == 1 || channels == 3, "images decode to 1 or 3 channels");
  if (is_jpeg(bytes, size)) {
    decode_jpeg(bytes, size, name, channels, scale, image);
  } else if (is_png(bytes, size)) {
    decode_png(bytes, size, name, channels, image);
  } else {
    read_image_header(bytes, size, name);  // throws, naming what the bytes are not
  }
}

void decode_image_region(const uint8_t* bytes, size_t size, const std::string& name, int channels,
                         Scale scale, const std::function<Region(int, int)>& region_of,
                         Image& image) {
  VFLOW_ASSERT(channels == 1 || channels == 3, "images decode to 1 or 3 channels");
  if (!is_jpeg(bytes, size)) {
    decode_image_into(bytes, size, name, channels, scale, image);
    region_of(image.full_width, image.full_height);  // asked all the same: the caller plans on it
    return;
  }
  jpeg_decompress_struct cinfo;
  JpegErrors errors;
  if (!jpeg_region(bytes, size, channels, scale, region_of, image, cinfo, errors)) {
    if (errors.width > 0) check_size(name, errors.width, errors.height);  // throws
    throw DataError(fmt::format("{}: a corrupt or truncated JPEG: {}", name, errors.message));
  }
}

Image decode_image(const uint8_t* bytes, size_t size, const std::string& name, int channels,
                   Scale scale) {
  Image image;
  decode_image_into(bytes, size, name, channels, scale, image);
  return image;
}

}  // namespace vflow::data
