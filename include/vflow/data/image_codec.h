// Image files to pixels: JPEG through libjpeg-turbo (with its DCT scaling), PNG through
// libpng. No LibTorch. Pixels are 8-bit, interleaved, row after row (HWC).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace vflow::data {

enum class ImageFormat { kJpeg, kPng };

/// Whether a file name's extension (the part after the dot, in any case) is one the image
/// data sets read as an image: jpg, jpeg or png.
bool is_image_extension(const std::string& extension);

/// An image's size and format, read from its header alone.
struct ImageHeader {
  ImageFormat format = ImageFormat::kJpeg;
  int width = 0;
  int height = 0;
};

/// Decoded pixels: height rows of width × channels bytes. They may be a region of the
/// decoded image: its top-left pixel is (x0, y0) of the full_width × full_height decode.
struct Image {
  int width = 0;
  int height = 0;
  int channels = 0;
  std::vector<uint8_t> pixels;
  int x0 = 0, y0 = 0;
  int full_width = 0, full_height = 0;
};

/// Columns [x0, x1) and rows [y0, y1) of a decode.
struct Region {
  int x0 = 0, y0 = 0, x1 = 0, y1 = 0;
};

/// The format (by its signature) and size of the image in `bytes`. Anything else, or a
/// header cut short or damaged, is a DataError naming `name` (a file, or a tar member).
ImageHeader read_image_header(const uint8_t* bytes, size_t size, const std::string& name);

/// The largest reduction libjpeg-turbo's DCT scaling offers (1/2, 1/4 or 1/8 of each side)
/// that keeps a `box_width` × `box_height` region of a `width` × `height` JPEG at least
/// `need_width` × `need_height` pixels; 1 for a PNG. Returns numerator / denominator.
struct Scale {
  int num = 1;
  int denom = 1;
};
Scale jpeg_scale_for(const ImageHeader& header, double box_width, double box_height, int need_width,
                     int need_height);

/// Decodes the image to `channels` (1: grayscale, 3: RGB) at `scale` (a JPEG's DCT scaling;
/// a PNG is always decoded whole). A corrupt or truncated file is a DataError naming `name`.
Image decode_image(const uint8_t* bytes, size_t size, const std::string& name, int channels,
                   Scale scale = {});
/// Decodes at least `region_of(full_width, full_height)` (called once, with the decode's
/// size, for every format) of the image at `scale` into
/// `image`, whose pixels' memory is reused: a JPEG decodes only the rows down to the
/// region's last (those above entropy-decoded and skipped) and the columns of the iMCUs it
/// spans (libjpeg-turbo's jpeg_skip_scanlines and jpeg_crop_scanline); a PNG whole. Within
/// the region asked for the pixels are those of the full decode (the columns beyond it, up
/// to whole iMCUs, may not be: their chroma is upsampled without neighbours). A corrupt file is a
/// DataError naming `name`; a JPEG that ends early is one only where the rows read run past its
/// end.
void decode_image_region(const uint8_t* bytes, size_t size, const std::string& name, int channels,
                         Scale scale, const std::function<Region(int, int)>& region_of,
                         Image& image);
/// The whole image into `image`, whose pixels' memory is reused.
void decode_image_into(const uint8_t* bytes, size_t size, const std::string& name, int channels,
                       Scale scale, Image& image);

}  // namespace vflow::data
