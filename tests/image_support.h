// Image files for the image data sets' tests: encoded here with libjpeg-turbo and libpng,
// from Debian's Fashion-MNIST, as image folders and WebDataset tar shards.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace vflow::testing {

/// `pixels` (height rows of width × channels bytes) as a JPEG of `quality`, or a PNG.
std::string encode_jpeg(const std::vector<uint8_t>& pixels, int width, int height, int channels,
                        int quality = 90);
std::string encode_png(const std::vector<uint8_t>& pixels, int width, int height, int channels);

/// A tar (POSIX ustar) of `members` (name, bytes), in order, with its end-of-archive blocks.
std::string tar_of(const std::vector<std::pair<std::string, std::string>>& members);

/// The first `n` Fashion-MNIST training images (28 × 28, one channel) and their labels.
struct FashionImages {
  std::vector<std::vector<uint8_t>> pixels;
  std::vector<int64_t> labels;
};
FashionImages fashion_images(int64_t n, int64_t first = 0);

/// Writes `images` as `root/<label>/<i>.jpg` (or .png with `png`); returns `root`.
std::string write_image_folder(const std::string& root, const FashionImages& images,
                               bool png = false);

}  // namespace vflow::testing
