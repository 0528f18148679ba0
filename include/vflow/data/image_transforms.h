// The job spec's image transforms, applied to one example at a time. No LibTorch.
//
// The geometric transforms (resize, center_crop, random_resized_crop, horizontal_flip)
// compose into one region of the source image, one output size and a flip, so each example
// is resampled once, from the smallest decode that still covers it (libjpeg-turbo's DCT
// scaling). Pixels stay 8-bit until the last step writes floats: normalize's (x/255 - mean)
// / std, or x/255 without it. Every random choice comes from ExampleRandom(seed, epoch,
// example): never from a thread, a worker or how far ahead the loader reads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "vflow/data/image_codec.h"

namespace vflow::data {

/// A counter-based random stream of one example in one epoch (splitmix64).
class ExampleRandom {
 public:
  ExampleRandom(uint64_t seed, int64_t epoch, int64_t example);
  uint64_t next();
  /// Uniform in [0, 1), 53 bits.
  double uniform();
  /// Uniform in [lo, hi), lo < hi.
  int64_t below(int64_t lo, int64_t hi);

 private:
  uint64_t state_;
};

struct Transform {
  enum class Kind { kResize, kCenterCrop, kRandomResizedCrop, kHorizontalFlip, kNormalize };
  Kind kind = Kind::kResize;
  /// resize: height 0 = width is the shorter side's length; else the output size. The crops:
  /// the output size.
  int64_t height = 0;
  int64_t width = 0;
  double scale_min = 0.08, scale_max = 1.0;             ///< random_resized_crop: area fraction
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;  ///< random_resized_crop: aspect
  double p = 0.5;                                       ///< horizontal_flip's probability
  std::vector<double> mean, std;                        ///< normalize, per channel (or one)
};

/// "random_resized_crop(size [224, 224], scale [0.08, 1], ratio [0.75, 1.3333])"
std::string describe(const Transform& t);

/// Where one example's pixels come from: a region of the source (in its pixels, perhaps
/// partly outside it: the edge repeats), and whether the output is mirrored.
struct ImageView {
  double x = 0, y = 0, width = 0, height = 0;
  bool flip = false;
};

class ImagePipeline {
 public:
  /// Checks the list: it must end in a fixed size (a crop, or resize to [h, w]), and
  /// normalize may only come last. `channels`: 1 (grayscale) or 3 (RGB). A mistake throws
  /// std::invalid_argument with the message; the caller adds where it was written.
  ImagePipeline(std::vector<Transform> steps, int channels);

  int channels() const { return channels_; }
  int64_t out_height() const { return out_height_; }
  int64_t out_width() const { return out_width_; }
  /// Floats one example takes: channels × height × width.
  int64_t out_size() const { return channels_ * out_height_ * out_width_; }
  const std::vector<Transform>& steps() const { return steps_; }
  /// The steps, one line: "resize(256), center_crop(224), normalize(...)".
  std::string describe() const;

  /// The view of a `width` × `height` image the transforms make, drawing from `random`.
  ImageView plan(int width, int height, ExampleRandom& random) const;

  /// Decodes the image in `bytes` (at the smallest DCT scale that covers the view),
  /// transforms it and writes out_size() floats, channel-major, to `out`. A corrupt image
  /// is a DataError naming `name`.
  void run(const uint8_t* bytes, size_t size, const std::string& name, ExampleRandom& random,
           float* out) const;

  /// The last step on decoded pixels: resamples `view` (in `source_width` ×
  /// `source_height` pixels of the undecimated image) from `image`, and writes floats.
  void render(const Image& image, int source_width, int source_height, const ImageView& view,
              float* out) const;

 private:
  std::vector<Transform> steps_;
  int channels_;
  int64_t out_height_ = 0;
  int64_t out_width_ = 0;
  std::vector<float> gain_, offset_;  ///< per channel: out = pixel * gain + offset
};

}  // namespace vflow::data
