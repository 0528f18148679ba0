#include "vflow/data/image_transforms.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "vflow/core/error.h"

namespace vflow::data {

namespace {

uint64_t splitmix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// Fixed-point resampling: weights of 22 fraction bits, sums in int32 (255 × 2^22 fits).
constexpr int kWeightBits = 22;

/// For each output pixel along one axis, the source pixels it reads and their weights:
/// a triangle (bilinear) filter, widened by the reduction so that a smaller output
/// averages its area instead of aliasing (as PIL's antialiased resize does).
struct Taps {
  std::vector<int> first;
  std::vector<int> count;
  std::vector<int32_t> weights;  ///< `stride` per output pixel
  int stride = 0;
};

Taps make_taps(int in_size, double origin, double extent, int64_t out_size) {
  const double scale = extent / static_cast<double>(out_size);
  const double widen = std::max(scale, 1.0);
  const double support = widen;  // the triangle's radius, 1 source pixel at scale 1
  Taps taps;
  taps.stride = static_cast<int>(std::ceil(support)) * 2 + 1;
  taps.first.resize(static_cast<size_t>(out_size));
  taps.count.resize(static_cast<size_t>(out_size));
  taps.weights.assign(static_cast<size_t>(out_size * taps.stride), 0);
  std::vector<double> w(static_cast<size_t>(taps.stride));
  for (int64_t i = 0; i < out_size; ++i) {
    const double center = origin + (static_cast<double>(i) + 0.5) * scale;
    int lo = static_cast<int>(std::floor(center - support + 0.5));
    int hi = static_cast<int>(std::floor(center + support + 0.5));
    lo = std::clamp(lo, 0, in_size - 1);
    hi = std::clamp(hi, lo + 1, in_size);
    hi = std::min(hi, lo + taps.stride);
    double sum = 0;
    for (int j = lo; j < hi; ++j) {
      const double t = std::abs((static_cast<double>(j) + 0.5 - center) / widen);
      w[static_cast<size_t>(j - lo)] = t < 1.0 ? 1.0 - t : 0.0;
      sum += w[static_cast<size_t>(j - lo)];
    }
    if (sum <= 0) {  // the view lies beyond this edge: repeat the edge pixel
      lo = center < 0 ? 0 : in_size - 1;
      hi = lo + 1;
      w[0] = sum = 1.0;
    }
    taps.first[static_cast<size_t>(i)] = lo;
    taps.count[static_cast<size_t>(i)] = hi - lo;
    int32_t* out = &taps.weights[static_cast<size_t>(i * taps.stride)];
    for (int j = 0; j < hi - lo; ++j) {
      out[j] = static_cast<int32_t>(
          std::lround(w[static_cast<size_t>(j)] / sum * static_cast<double>(1 << kWeightBits)));
    }
  }
  return taps;
}

/// The source pixels [first, last) that `taps` read.
std::pair<int, int> span(const Taps& taps) {
  int lo = INT32_MAX, hi = 0;
  for (size_t i = 0; i < taps.first.size(); ++i) {
    lo = std::min(lo, taps.first[i]);
    hi = std::max(hi, taps.first[i] + taps.count[i]);
  }
  return {lo, hi};
}

/// acc[j] += weight × pixels[j] for j < n: both passes' one hot loop. Also built for AVX2,
/// which the CPU picks at run time where it has it (eight 32-bit products an instruction;
/// baseline x86-64 has no 32-bit vector multiply). Integer sums: the same bits either way.
[[gnu::target_clones("avx2", "default")]] void add_weighted(int32_t* __restrict acc,
                                                            const uint8_t* __restrict pixels,
                                                            int32_t weight, size_t n) {
  for (size_t j = 0; j < n; ++j) acc[j] += weight * pixels[j];
}

uint8_t to_pixel(int32_t acc) {
  return static_cast<uint8_t>(std::clamp(acc >> kWeightBits, 0, 255));
}

/// The region [offset, offset + size) of a `extent`-pixel axis mapped into the view's
/// source coordinates, mirrored where the view is.
void narrow(double& origin, double& length, double extent, bool flip, double offset, double size) {
  const double from = flip ? extent - offset - size : offset;
  origin += from * length / extent;
  length = size * length / extent;
}

std::invalid_argument bad(const std::string& message) { return std::invalid_argument(message); }

/// `image` resampled by `cols` and `rows` (mirrored where `flip`) to out_height ×
/// out_width, written channel-major as pixel × gain + offset. Down the columns first, whole
/// source rows at a time (the compiler vectorises it), so that the across pass, which sums
/// each output pixel's taps one by one, runs on the output's rows only. Integer sums, with
/// one rounding to 8 bits between the passes: the same bits on every machine.
template <int C>
void resample(const Image& image, const Taps& cols, const Taps& rows, bool flip, int64_t out_height,
              int64_t out_width, const std::vector<float>& gain, const std::vector<float>& offset,
              float* out) {
  int col_lo = image.width, col_hi = 0;
  for (int64_t i = 0; i < out_width; ++i) {
    col_lo = std::min(col_lo, cols.first[static_cast<size_t>(i)]);
    col_hi =
        std::max(col_hi, cols.first[static_cast<size_t>(i)] + cols.count[static_cast<size_t>(i)]);
  }
  const size_t span = static_cast<size_t>(col_hi - col_lo) * C;  // the columns read
  thread_local std::vector<uint8_t> down;
  thread_local std::vector<int32_t> sums;
  down.resize(static_cast<size_t>(out_height) * span);
  sums.resize(span);
  const size_t stride = static_cast<size_t>(image.width) * C;
  const uint8_t* base = image.pixels.data() + static_cast<size_t>(col_lo) * C;
  for (int64_t r = 0; r < out_height; ++r) {
    const int first = rows.first[static_cast<size_t>(r)];
    const int n = rows.count[static_cast<size_t>(r)];
    const int32_t* w = &rows.weights[static_cast<size_t>(r * rows.stride)];
    int32_t* acc = sums.data();
    std::fill(sums.begin(), sums.end(), 1 << (kWeightBits - 1));
    for (int k = 0; k < n; ++k) {
      add_weighted(acc, base + static_cast<size_t>(first + k) * stride, w[k], span);
    }
    uint8_t* dst = down.data() + static_cast<size_t>(r) * span;
    for (size_t j = 0; j < span; ++j) dst[j] = to_pixel(acc[j]);
  }
  // Across, as another pass down columns: each channel transposed (a source column's
  // values over the output rows side by side), so that an output column sums whole
  // columns of taps at a time. The same integer sums as tap by tap.
  const int64_t plane = out_height * out_width;
  const size_t columns = span / C;
  const size_t height = static_cast<size_t>(out_height);
  thread_local std::vector<uint8_t> transposed;
  transposed.resize(span * height);
  // Eight rows at a time: a source column's eight values gathered into one 8-byte store.
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the gather's byte order");
  size_t r0 = 0;
  for (; r0 + 8 <= height; r0 += 8) {
    for (size_t x = 0; x < columns; ++x) {
      for (int c = 0; c < C; ++c) {
        const uint8_t* d = down.data() + r0 * span + x * C + static_cast<size_t>(c);
        uint64_t eight = 0;
        for (size_t r = 0; r < 8; ++r) eight |= static_cast<uint64_t>(d[r * span]) << (8 * r);
        std::memcpy(transposed.data() + (static_cast<size_t>(c) * columns + x) * height + r0,
                    &eight, sizeof eight);
      }
    }
  }
  for (size_t x = 0; x < columns; ++x) {
    for (int c = 0; c < C; ++c) {
      uint8_t* t = transposed.data() + (static_cast<size_t>(c) * columns + x) * height;
      const uint8_t* d = down.data() + x * C + static_cast<size_t>(c);
      for (size_t r = r0; r < height; ++r) t[r] = d[r * span];
    }
  }
  sums.resize(height);
  int32_t* acc = sums.data();
  for (int c = 0; c < C; ++c) {
    const float g = gain[static_cast<size_t>(c)], b = offset[static_cast<size_t>(c)];
    const uint8_t* channel = transposed.data() + static_cast<size_t>(c) * columns * height;
    for (int64_t i = 0; i < out_width; ++i) {
      const int n = cols.count[static_cast<size_t>(i)];
      const int32_t* w = &cols.weights[static_cast<size_t>(i * cols.stride)];
      const uint8_t* first =
          channel + static_cast<size_t>(cols.first[static_cast<size_t>(i)] - col_lo) * height;
      std::fill(sums.begin(), sums.end(), 1 << (kWeightBits - 1));
      for (int k = 0; k < n; ++k) {
        add_weighted(acc, first + static_cast<size_t>(k) * height, w[k], height);
      }
      float* dst = out + c * plane + (flip ? out_width - 1 - i : i);
      for (size_t r = 0; r < height; ++r) {
        dst[static_cast<int64_t>(r) * out_width] = static_cast<float>(to_pixel(acc[r])) * g + b;
      }
    }
  }
}

/// The taps of a view of a `source_width` × `source_height` image, on its decode of
/// `full_width` × `full_height` pixels.
struct ViewTaps {
  Taps cols, rows;
};

ViewTaps view_taps(const ImageView& view, int source_width, int source_height, int full_width,
                   int full_height, int64_t out_height, int64_t out_width) {
  const double sx = static_cast<double>(full_width) / source_width;
  const double sy = static_cast<double>(full_height) / source_height;
  return ViewTaps{make_taps(full_width, view.x * sx, view.width * sx, out_width),
                  make_taps(full_height, view.y * sy, view.height * sy, out_height)};
}

/// `taps` applied to `image`, which may hold a region of the decode: the taps count from
/// its corner.
void draw(const Image& image, ViewTaps taps, bool flip, int64_t out_height, int64_t out_width,
          const std::vector<float>& gain, const std::vector<float>& offset, float* out) {
  VFLOW_ASSERT(static_cast<size_t>(image.channels) == gain.size(),
               "the image's channels are not the pipeline's");
  const auto [col_lo, col_hi] = span(taps.cols);
  const auto [row_lo, row_hi] = span(taps.rows);
  VFLOW_ASSERT(col_lo >= image.x0 && col_hi <= image.x0 + image.width && row_lo >= image.y0 &&
                   row_hi <= image.y0 + image.height,
               "the decoded region does not hold the pixels the resampling reads");
  for (int& f : taps.cols.first) f -= image.x0;
  for (int& f : taps.rows.first) f -= image.y0;
  if (image.channels == 1) {
    resample<1>(image, taps.cols, taps.rows, flip, out_height, out_width, gain, offset, out);
  } else {
    resample<3>(image, taps.cols, taps.rows, flip, out_height, out_width, gain, offset, out);
  }
}

}  // namespace

ExampleRandom::ExampleRandom(uint64_t seed, int64_t epoch, int64_t example)
    : state_(seed ^ 0x5DA7A5E7D1CE0001ull) {
  state_ = splitmix(state_) ^ static_cast<uint64_t>(epoch);
  state_ = splitmix(state_) ^ static_cast<uint64_t>(example);
  state_ = splitmix(state_);
}

uint64_t ExampleRandom::next() { return splitmix(state_); }

double ExampleRandom::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

int64_t ExampleRandom::below(int64_t lo, int64_t hi) {
  const auto range = static_cast<unsigned __int128>(hi - lo);
  return lo + static_cast<int64_t>((static_cast<unsigned __int128>(next()) * range) >> 64);
}

std::string describe(const Transform& t) {
  const auto size = [&t] {
    return t.height == t.width ? fmt::format("{}", t.height)
                               : fmt::format("[{}, {}]", t.height, t.width);
  };
  switch (t.kind) {
    case Transform::Kind::kResize:
      return t.height == 0 ? fmt::format("resize({})", t.width) : fmt::format("resize({})", size());
    case Transform::Kind::kCenterCrop:
      return fmt::format("center_crop({})", size());
    case Transform::Kind::kRandomResizedCrop:
      return fmt::format("random_resized_crop({}, scale [{:g}, {:g}], ratio [{:g}, {:g}])", size(),
                         t.scale_min, t.scale_max, t.ratio_min, t.ratio_max);
    case Transform::Kind::kHorizontalFlip:
      return fmt::format("horizontal_flip(p {:g})", t.p);
    case Transform::Kind::kNormalize:
      return fmt::format("normalize(mean [{:g}], std [{:g}])", fmt::join(t.mean, ", "),
                         fmt::join(t.std, ", "));
  }
  return "?";
}

ImagePipeline::ImagePipeline(std::vector<Transform> steps, int channels)
    : steps_(std::move(steps)), channels_(channels) {
  if (channels != 1 && channels != 3) throw bad("channels must be 1 or 3");
  bool fixed = false;
  gain_.assign(static_cast<size_t>(channels), 1.0f / 255.0f);
  offset_.assign(static_cast<size_t>(channels), 0.0f);
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Transform& t = steps_[i];
    switch (t.kind) {
      case Transform::Kind::kResize:
        fixed = t.height > 0;
        out_height_ = t.height;
        out_width_ = t.width;
        break;
      case Transform::Kind::kCenterCrop:
      case Transform::Kind::kRandomResizedCrop:
        fixed = true;
        out_height_ = t.height;
        out_width_ = t.width;
        break;
      case Transform::Kind::kHorizontalFlip:
        break;
      case Transform::Kind::kNormalize: {
        if (i + 1 != steps_.size()) throw bad("normalize must be the last transform");
        const auto per_channel = [channels](const std::vector<double>& v, const char* what) {
          if (v.size() != 1 && v.size() != static_cast<size_t>(channels)) {
            throw bad(fmt::format("normalize's {} has {} values for {} channel{}", what, v.size(),
                                  channels, channels == 1 ? "" : "s"));
          }
        };
        per_channel(t.mean, "mean");
        per_channel(t.std, "std");
        for (int c = 0; c < channels; ++c) {
          const double mean = t.mean[t.mean.size() == 1 ? 0 : static_cast<size_t>(c)];
          const double sd = t.std[t.std.size() == 1 ? 0 : static_cast<size_t>(c)];
          if (!(sd > 0)) throw bad("normalize's std must be positive");
          gain_[static_cast<size_t>(c)] = static_cast<float>(1.0 / (255.0 * sd));
          offset_[static_cast<size_t>(c)] = static_cast<float>(-mean / sd);
        }
        break;
      }
    }
  }
  if (!fixed) {
    throw bad(
        "the transforms must end in one size for every image: add center_crop or "
        "random_resized_crop, or give resize [height, width]");
  }
}

std::string ImagePipeline::describe() const {
  std::vector<std::string> parts;
  for (const auto& t : steps_) parts.push_back(data::describe(t));
  return fmt::format("{}", fmt::join(parts, ", "));
}

ImageView ImagePipeline::plan(int width, int height, ExampleRandom& random) const {
  ImageView view{0, 0, static_cast<double>(width), static_cast<double>(height), false};
  // The image as the transforms so far have made it: its size in whole pixels.
  int64_t w = width, h = height;
  for (const Transform& t : steps_) {
    switch (t.kind) {
      case Transform::Kind::kResize:
        if (t.height > 0) {
          w = t.width;
          h = t.height;
        } else if (w <= h) {  // torchvision: the shorter side to the size, the other scaled
          h = static_cast<int64_t>(static_cast<double>(t.width) * static_cast<double>(h) /
                                   static_cast<double>(w));
          w = t.width;
        } else {
          w = static_cast<int64_t>(static_cast<double>(t.width) * static_cast<double>(w) /
                                   static_cast<double>(h));
          h = t.width;
        }
        break;
      case Transform::Kind::kCenterCrop: {
        const double top = std::round(static_cast<double>(h - t.height) / 2.0);
        const double left = std::round(static_cast<double>(w - t.width) / 2.0);
        narrow(view.x, view.width, static_cast<double>(w), view.flip, left,
               static_cast<double>(t.width));
        narrow(view.y, view.height, static_cast<double>(h), false, top,
               static_cast<double>(t.height));
        w = t.width;
        h = t.height;
        break;
      }
      case Transform::Kind::kRandomResizedCrop: {
        // torchvision's RandomResizedCrop.get_params: up to ten tries at an area and an
        // aspect ratio (log-uniform) that fit, else the whole image clipped to the ratios.
        const double area = static_cast<double>(w * h);
        const double log_lo = std::log(t.ratio_min), log_hi = std::log(t.ratio_max);
        int64_t cw = 0, ch = 0, top = 0, left = 0;
        bool found = false;
        for (int attempt = 0; attempt < 10 && !found; ++attempt) {
          const double target =
              area * (t.scale_min + (t.scale_max - t.scale_min) * random.uniform());
          const double aspect = std::exp(log_lo + (log_hi - log_lo) * random.uniform());
          cw = std::llround(std::sqrt(target * aspect));
          ch = std::llround(std::sqrt(target / aspect));
          if (cw > 0 && cw <= w && ch > 0 && ch <= h) {
            top = random.below(0, h - ch + 1);
            left = random.below(0, w - cw + 1);
            found = true;
          }
        }
        if (!found) {
          const double in_ratio = static_cast<double>(w) / static_cast<double>(h);
          if (in_ratio < t.ratio_min) {
            cw = w;
            ch = std::llround(static_cast<double>(cw) / t.ratio_min);
          } else if (in_ratio > t.ratio_max) {
            ch = h;
            cw = std::llround(static_cast<double>(ch) * t.ratio_max);
          } else {
            cw = w;
            ch = h;
          }
          top = (h - ch) / 2;
          left = (w - cw) / 2;
        }
        narrow(view.x, view.width, static_cast<double>(w), view.flip, static_cast<double>(left),
               static_cast<double>(cw));
        narrow(view.y, view.height, static_cast<double>(h), false, static_cast<double>(top),
               static_cast<double>(ch));
        w = t.width;
        h = t.height;
        break;
      }
      case Transform::Kind::kHorizontalFlip:
        if (random.uniform() < t.p) view.flip = !view.flip;
        break;
      case Transform::Kind::kNormalize:
        break;
    }
  }
  return view;
}

void ImagePipeline::run(const uint8_t* bytes, size_t size, const std::string& name,
                        ExampleRandom& random, float* out) const {
  const ImageHeader header = read_image_header(bytes, size, name);
  const ImageView view = plan(header.width, header.height, random);
  const Scale scale = jpeg_scale_for(header, view.width, view.height, static_cast<int>(out_width_),
                                     static_cast<int>(out_height_));
  // Only the pixels the filters read are decoded; the taps are made once, on the size the
  // decode has.
  ViewTaps taps;
  const auto region_of = [&](int width, int height) {
    taps = view_taps(view, header.width, header.height, width, height, out_height_, out_width_);
    const auto [col_lo, col_hi] = span(taps.cols);
    const auto [row_lo, row_hi] = span(taps.rows);
    // A pixel's margin: the decode's outermost columns, where a crop cuts through a
    // chroma block, are upsampled without their neighbours.
    return Region{col_lo - 1, row_lo - 1, col_hi + 1, row_hi + 1};
  };
  thread_local Image image;  // its pixels' memory kept from one image to the next
  decode_image_region(bytes, size, name, channels_, scale, region_of, image);
  draw(image, std::move(taps), view.flip, out_height_, out_width_, gain_, offset_, out);
  // An unusually large image's memory is not kept for the thread's life.
  if (image.pixels.capacity() > (size_t{64} << 20)) std::vector<uint8_t>().swap(image.pixels);
}

void ImagePipeline::render(const Image& image, int source_width, int source_height,
                           const ImageView& view, float* out) const {
  draw(image,
       view_taps(view, source_width, source_height, image.full_width, image.full_height,
                 out_height_, out_width_),
       view.flip, out_height_, out_width_, gain_, offset_, out);
}

}  // namespace vflow::data
