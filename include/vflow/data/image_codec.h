// Image files to pixels: JPEG through libjpeg-turbo (with its DCT scaling), PNG through
// libpng. No LibTorch. Pixels are 8-bit, interleaved, row after row (HWC).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace vflow::data {

enum class ImageFormat { kJpeg, kPng };

/// An image's size and format, read from its header alone.
struct ImageHeader {
  ImageFormat format = ImageFormat::kJpeg;
  int width = 0;
  int height = 0;
};

/// Decoded pixels: height rows of width × channels bytes.
struct Image {
  int width = 0;
  int height = 0;
  int channels = 0;
  std::vector<uint8_t> pixels;
};

/// The format (by its signature) and size of the image in `bytes`. Anything else, or a
/// header cut short or damaged, is a DataError naming `name` (a file, or a tar member).
ImageHeader read_image_header(const uint8_t* bytes, size_t size, const std::string& name);

/// The largest reduction libjpeg-turbo's DCT scaling offers (1, 7/8, ... 1/8 of each side)
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

}  // namespace vflow::data
