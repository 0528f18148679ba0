#include "image_support.h"

#include <fmt/format.h>
#include <png.h>
#include <turbojpeg.h>

#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "support.h"
#include "vflow/data/fashion_mnist.h"

namespace vflow::testing {

std::string encode_jpeg(const std::vector<uint8_t>& pixels, int width, int height, int channels,
                        int quality) {
  tjhandle h = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  const int rc =
      tjCompress2(h, pixels.data(), width, 0, height, channels == 1 ? TJPF_GRAY : TJPF_RGB, &out,
                  &size, channels == 1 ? TJSAMP_GRAY : TJSAMP_420, quality, 0);
  std::string bytes = rc == 0 ? std::string(reinterpret_cast<char*>(out), size) : std::string();
  tjFree(out);
  tjDestroy(h);
  if (rc != 0) throw std::runtime_error("tjCompress2 failed");
  return bytes;
}

std::string encode_png(const std::vector<uint8_t>& pixels, int width, int height, int channels) {
  png_image png;
  std::memset(&png, 0, sizeof png);
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(width);
  png.height = static_cast<png_uint_32>(height);
  png.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&png, nullptr, &size, 0, pixels.data(), 0, nullptr)) {
    throw std::runtime_error(png.message);
  }
  std::string bytes(size, '\0');
  if (!png_image_write_to_memory(&png, bytes.data(), &size, 0, pixels.data(), 0, nullptr)) {
    throw std::runtime_error(png.message);
  }
  bytes.resize(size);
  return bytes;
}

std::string tar_of(const std::vector<std::pair<std::string, std::string>>& members) {
  std::string tar;
  for (const auto& [name, bytes] : members) {
    char h[512] = {};
    std::snprintf(h, 100, "%s", name.c_str());
    std::snprintf(h + 100, 8, "%07o", 0644);
    std::snprintf(h + 108, 8, "%07o", 0);
    std::snprintf(h + 116, 8, "%07o", 0);
    std::snprintf(h + 124, 12, "%011llo", static_cast<unsigned long long>(bytes.size()));
    std::snprintf(h + 136, 12, "%011o", 0);
    h[156] = '0';
    std::memcpy(h + 257,
                "ustar\0"
                "00",
                8);
    std::memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (unsigned char c : h) sum += c;
    std::snprintf(h + 148, 8, "%06o", sum);
    tar.append(h, 512);
    tar += bytes;
    tar.append((512 - bytes.size() % 512) % 512, '\0');
  }
  tar.append(1024, '\0');
  return tar;
}

FashionImages fashion_images(int64_t n, int64_t first) {
  const auto images = data::read_idx_file(
      std::string(data::kFashionMnistDefaultPath) + "/train-images-idx3-ubyte.gz", 0x803);
  const auto labels = data::read_idx_file(
      std::string(data::kFashionMnistDefaultPath) + "/train-labels-idx1-ubyte.gz", 0x801);
  FashionImages out;
  for (int64_t i = first; i < first + n; ++i) {
    const auto* p = images.data.data() + i * 28 * 28;
    out.pixels.emplace_back(p, p + 28 * 28);
    out.labels.push_back(labels.data[static_cast<size_t>(i)]);
  }
  return out;
}

std::string write_image_folder(const std::string& root, const FashionImages& images, bool png) {
  for (size_t i = 0; i < images.pixels.size(); ++i) {
    const std::string dir = fmt::format("{}/{}", root, images.labels[i]);
    std::filesystem::create_directories(dir);
    write_file(
        fmt::format("{}/{:05d}.{}", dir, i, png ? "png" : "jpg"),
        png ? encode_png(images.pixels[i], 28, 28, 1) : encode_jpeg(images.pixels[i], 28, 28, 1));
  }
  return root;
}

}  // namespace vflow::testing
