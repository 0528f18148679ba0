// The image loader's rate: images per second that vflow's image-folder reads, decodes and
// transforms, in a shuffled order, in batches, on a number of data threads; or the decode
// limit, libjpeg-turbo's rate decoding the same files whole on one thread. Run by
// bench/image_loader.py beside PyTorch's DataLoader; prints one line, "<images/s>" (and,
// for the loader, its peak resident memory in KiB).
//   image_loader_bench --root DIR [--mode loader|decode] [--threads 2] [--size 224]
//                      [--channels 3] [--batch 64] [--images 2000] [--transforms rrc|eval]
#include <fmt/format.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "engine/example_reader.h"
#include "peak_memory.h"
#include "vflow/data/image_codec.h"
#include "vflow/data/image_sets.h"
#include "vflow/data/image_transforms.h"

namespace {

using Clock = std::chrono::steady_clock;
using vflow::data::Transform;

std::vector<Transform> transforms(const std::string& which, int64_t size, int channels) {
  std::vector<Transform> steps;
  Transform t;
  if (which == "rrc") {  // ImageNet's training: random_resized_crop, flip
    t.kind = Transform::Kind::kRandomResizedCrop;
    t.height = t.width = size;
    steps.push_back(t);
    t = Transform{};
    t.kind = Transform::Kind::kHorizontalFlip;
    steps.push_back(t);
  } else {  // its evaluation: resize to 8/7, centre crop
    t.kind = Transform::Kind::kResize;
    t.width = size * 8 / 7;
    steps.push_back(t);
    t = Transform{};
    t.kind = Transform::Kind::kCenterCrop;
    t.height = t.width = size;
    steps.push_back(t);
  }
  t = Transform{};
  t.kind = Transform::Kind::kNormalize;
  t.mean = channels == 3 ? std::vector<double>{0.485, 0.456, 0.406} : std::vector<double>{0.5};
  t.std = channels == 3 ? std::vector<double>{0.229, 0.224, 0.225} : std::vector<double>{0.25};
  steps.push_back(t);
  return steps;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("image loader benchmark");
  std::string root, mode = "loader", which = "rrc";
  int threads = 2, channels = 3;
  int64_t size = 224, batch = 64, images = 2000;
  app.add_option("--root", root, "an image folder (root/<class>/<file>)")->required();
  app.add_option("--mode", mode, "loader | decode");
  app.add_option("--threads", threads, "data threads, the caller's included");
  app.add_option("--size", size, "output side");
  app.add_option("--channels", channels, "1 or 3");
  app.add_option("--batch", batch, "images a batch");
  app.add_option("--images", images, "images to read (whole batches)");
  app.add_option("--transforms", which, "rrc (training) | eval");
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(1);

  std::mt19937_64 random(11);
  if (mode == "decode") {
    // libjpeg-turbo's own rate: each file read and decoded whole, on this thread, in a
    // shuffled order.
    std::vector<std::string> files;
    for (const auto& cls : vflow::data::image_folder_classes(root)) {
      for (const auto& e : std::filesystem::directory_iterator(root + "/" + cls)) {
        files.push_back(e.path().string());
      }
    }
    std::sort(files.begin(), files.end());
    std::shuffle(files.begin(), files.end(), random);
    const auto begin = Clock::now();
    for (int64_t i = 0; i < images; ++i) {
      const auto& f = files[static_cast<size_t>(i % static_cast<int64_t>(files.size()))];
      std::ifstream in(f, std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
      const auto img = vflow::data::decode_image(reinterpret_cast<const uint8_t*>(bytes.data()),
                                                 bytes.size(), f, channels);
      if (img.pixels.empty()) return 1;
    }
    fmt::print("{:.1f}\n", static_cast<double>(images) /
                               std::chrono::duration<double>(Clock::now() - begin).count());
    return 0;
  }

  const auto pipeline = std::make_shared<const vflow::data::ImagePipeline>(
      transforms(which, size, channels), channels);
  const auto data = vflow::data::open_image_folder(root, pipeline, "");
  const int64_t n = data->size();
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  std::shuffle(order.begin(), order.end(), random);

  vflow::engine::ExampleReader reader(0, vflow::engine::OnCorrupt::kFail);
  reader.set_threads(threads);
  const auto begin = Clock::now();
  int64_t done = 0;
  while (done < images) {
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < batch; ++i) idx.push_back(order[static_cast<size_t>((done + i) % n)]);
    const auto out = reader.read(*data, torch::tensor(idx), done / n);
    if (out.input.size(0) != batch) return 1;
    done += batch;
  }
  fmt::print(
      "{:.1f} {}\n",
      static_cast<double>(done) / std::chrono::duration<double>(Clock::now() - begin).count(),
      vflow::bench::peak_resident_kib());
  return 0;
}
