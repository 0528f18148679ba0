// Image data sets: decoding (libjpeg-turbo, libpng), the transforms, tar shards' index, the
// image folder's cached index, reading on data threads, and corrupt examples.
#include <fmt/format.h>
#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "engine/example_reader.h"
#include "image_support.h"
#include "support.h"
#include "vflow/core/error.h"
#include "vflow/core/spec_node.h"
#include "vflow/data/image_codec.h"
#include "vflow/data/image_sets.h"
#include "vflow/data/image_transforms.h"
#include "vflow/data/tar_index.h"

using Catch::Matchers::Contains;
using namespace vflow::data;
using vflow::testing::TempDir;
namespace fs = std::filesystem;

namespace {

const uint8_t* bytes_of(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

std::string decode_error(const std::string& bytes, const std::string& name) {
  try {
    decode_image(bytes_of(bytes), bytes.size(), name, 3);
  } catch (const vflow::DataError& e) {
    return e.what();
  }
  return "no DataError";
}

/// A colour test card: smooth gradients and a hard edge.
std::vector<uint8_t> card(int w, int h) {
  std::vector<uint8_t> p(static_cast<size_t>(w * h * 3));
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      uint8_t* q = &p[static_cast<size_t>((y * w + x) * 3)];
      q[0] = static_cast<uint8_t>(x * 255 / w);
      q[1] = static_cast<uint8_t>(y * 255 / h);
      q[2] = x < w / 2 ? 40 : 200;
    }
  }
  return p;
}

Transform crop(Transform::Kind kind, int64_t size) {
  Transform t;
  t.kind = kind;
  t.height = t.width = size;
  return t;
}

Transform flip(double p) {
  Transform t;
  t.kind = Transform::Kind::kHorizontalFlip;
  t.p = p;
  return t;
}

std::vector<float> run(const ImagePipeline& p, const std::string& bytes, uint64_t seed = 0,
                       int64_t epoch = 0, int64_t example = 0) {
  std::vector<float> out(static_cast<size_t>(p.out_size()));
  ExampleRandom random(seed, epoch, example);
  p.run(bytes_of(bytes), bytes.size(), "test", random, out.data());
  return out;
}

std::string tar_error(const std::string& tar, int64_t classes = 10) {
  try {
    const ReadAt read = [&tar](uint64_t at, size_t n, uint8_t* out) {
      const size_t got = at >= tar.size() ? 0 : std::min<size_t>(n, tar.size() - at);
      std::memcpy(out, tar.data() + at, got);
      return got;
    };
    webdataset_examples(index_tar(read, tar.size(), "s.tar"), read, classes, "s.tar");
  } catch (const vflow::DataError& e) {
    return e.what();
  }
  return "no DataError";
}

std::shared_ptr<const ImagePipeline> gray28() {
  return std::make_shared<const ImagePipeline>(
      std::vector<Transform>{crop(Transform::Kind::kRandomResizedCrop, 24), flip(0.5)}, 1);
}

}  // namespace

TEST_CASE(
    "JPEG and PNG files decode to their pixels, a large JPEG at a DCT scale that covers its target",
    "[unit]") {
  const auto fashion = vflow::testing::fashion_images(1);
  const auto& gray = fashion.pixels[0];
  const auto png = vflow::testing::encode_png(gray, 28, 28, 1);
  const auto header = read_image_header(bytes_of(png), png.size(), "a.png");
  CHECK((header.format == ImageFormat::kPng && header.width == 28 && header.height == 28));
  CHECK(decode_image(bytes_of(png), png.size(), "a.png", 1).pixels == gray);  // lossless
  const auto rgb = card(40, 30);
  const auto rgb_png = vflow::testing::encode_png(rgb, 40, 30, 3);
  CHECK(decode_image(bytes_of(rgb_png), rgb_png.size(), "c.png", 3).pixels == rgb);

  const auto jpeg = vflow::testing::encode_jpeg(gray, 28, 28, 1, 100);
  const Image decoded = decode_image(bytes_of(jpeg), jpeg.size(), "a.jpg", 1);
  REQUIRE(decoded.pixels.size() == gray.size());
  int worst = 0;
  for (size_t i = 0; i < gray.size(); ++i)
    worst = std::max(worst, std::abs(decoded.pixels[i] - gray[i]));
  CHECK(worst <= 8);  // quality 100: lossy by a few levels at most

  // 800 x 600 to 224: 1/2 keeps 300 rows, 1/4 would keep 150; to 100 x 75, 1/8.
  const ImageHeader big{ImageFormat::kJpeg, 800, 600};
  const Scale s = jpeg_scale_for(big, 800, 600, 224, 224);
  CHECK((s.num == 1 && s.denom == 2));
  CHECK(jpeg_scale_for(big, 800, 600, 100, 75).denom == 8);
  CHECK(jpeg_scale_for(big, 400, 300, 224, 224).denom == 1);  // a crop of half the image
  CHECK(jpeg_scale_for(big, 800, 600, 800, 600).num ==
        jpeg_scale_for(big, 800, 600, 800, 600).denom);
  CHECK(jpeg_scale_for(ImageHeader{ImageFormat::kPng, 800, 600}, 800, 600, 100, 75).denom == 1);
  const auto card_jpeg = vflow::testing::encode_jpeg(card(160, 120), 160, 120, 3);
  const Image half = decode_image(bytes_of(card_jpeg), card_jpeg.size(), "c.jpg", 3, Scale{1, 2});
  CHECK((half.width == 80 && half.height == 60 && half.pixels.size() == 80u * 60 * 3));
}

TEST_CASE("a region of a JPEG decodes to the full decode's pixels there", "[unit]") {
  // 4:2:0 colour, whose chroma is upsampled from neighbouring rows and columns; at full
  // size and at half.
  const auto jpeg = vflow::testing::encode_jpeg(card(160, 120), 160, 120, 3);
  for (const int denom : {1, 2}) {
    CAPTURE(denom);
    const Image full = decode_image(bytes_of(jpeg), jpeg.size(), "c.jpg", 3, Scale{1, denom});
    Image part;
    decode_image_region(
        bytes_of(jpeg), jpeg.size(), "c.jpg", 3, Scale{1, denom},
        [denom](int w, int h) {
          CHECK((w == 160 / denom && h == 120 / denom));
          return Region{37 / denom, 21 / denom, 101 / denom, 90 / denom};
        },
        part);
    REQUIRE((part.full_width == full.width && part.full_height == full.height));
    REQUIRE((part.x0 <= 37 / denom && part.x0 + part.width >= 101 / denom));
    REQUIRE((part.y0 == 21 / denom && part.height == 90 / denom - 21 / denom));
    // The region asked for (the decode may hold more: whole iMCUs across, whose outer
    // columns are upsampled without their neighbours).
    int differ = 0;
    for (int y = 21 / denom; y < 90 / denom; ++y) {
      for (int x = 37 / denom * 3; x < 101 / denom * 3; ++x) {
        differ +=
            part.pixels[static_cast<size_t>((y - part.y0) * part.width * 3 + x - part.x0 * 3)] !=
            full.pixels[static_cast<size_t>(y * full.width * 3 + x)];
      }
    }
    CHECK(differ == 0);
  }
}

TEST_CASE("corrupt, truncated and foreign image files are data errors naming the file", "[unit]") {
  const auto gray = vflow::testing::fashion_images(1).pixels[0];
  const auto jpeg = vflow::testing::encode_jpeg(card(64, 48), 64, 48, 3);
  const auto png = vflow::testing::encode_png(gray, 28, 28, 1);
  CHECK_THAT(decode_error(jpeg.substr(0, jpeg.size() * 2 / 3), "cut.jpg"),
             Contains("cut.jpg: a corrupt or truncated JPEG"));
  CHECK_THAT(decode_error(jpeg.substr(0, 40), "short.jpg"), Contains("short.jpg: a corrupt"));
  CHECK_THAT(decode_error(png.substr(0, png.size() / 2), "cut.png"),
             Contains("cut.png: a corrupt or truncated PNG"));
  std::string damaged = png;
  damaged[damaged.size() - 30] ^= 0x55;  // inside the image data: its CRC no longer matches
  CHECK_THAT(decode_error(damaged, "crc.png"), Contains("crc.png: a corrupt"));
  CHECK_THAT(decode_error("GIF89a......", "a.gif"), Contains("a.gif: neither a JPEG nor a PNG"));
  CHECK_THAT(decode_error("", "empty.jpg"),
             Contains("empty.jpg: neither a JPEG nor a PNG (0 bytes"));
}

TEST_CASE(
    "the transforms: crops of the whole image copy its pixels, flips mirror, normalize scales",
    "[unit]") {
  const auto gray = vflow::testing::fashion_images(1).pixels[0];
  const auto png = vflow::testing::encode_png(gray, 28, 28, 1);
  const ImagePipeline same({crop(Transform::Kind::kCenterCrop, 28)}, 1);
  const auto out = run(same, png);
  for (size_t i = 0; i < gray.size(); ++i)
    REQUIRE(out[i] == static_cast<float>(gray[i]) * (1.0f / 255.0f));
  const auto mirrored =
      run(ImagePipeline({crop(Transform::Kind::kCenterCrop, 28), flip(1.0)}, 1), png);
  for (int y = 0; y < 28; ++y) {
    for (int x = 0; x < 28; ++x)
      REQUIRE(mirrored[static_cast<size_t>(y * 28 + x)] ==
              out[static_cast<size_t>(y * 28 + 27 - x)]);
  }
  Transform norm;
  norm.kind = Transform::Kind::kNormalize;
  norm.mean = {0.5};
  norm.std = {0.25};
  const auto normalized =
      run(ImagePipeline({crop(Transform::Kind::kCenterCrop, 28), norm}, 1), png);
  CHECK(normalized[100] == Approx(gray[100] / 255.0 / 0.25 - 2.0).margin(1e-5));
  // A centre crop after a resize of the shorter side: 8 x 8 from the middle of a card.
  Transform resize;
  resize.width = 16;
  const ImagePipeline small({resize, crop(Transform::Kind::kCenterCrop, 8)}, 3);
  CHECK(small.describe() == "resize(16), center_crop(8)");
  const auto card_png = vflow::testing::encode_png(card(64, 32), 64, 32, 3);
  const auto view_out = run(small, card_png);
  CHECK(view_out.size() == 3u * 8 * 8);
  CHECK(view_out[2 * 64 + 0] == Approx(40 / 255.0).margin(0.02));   // blue: left half of the card
  CHECK(view_out[2 * 64 + 7] == Approx(200 / 255.0).margin(0.02));  // and right

  const auto refused = [](std::vector<Transform> steps) {
    try {
      ImagePipeline p(std::move(steps), 3);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK_THAT(refused({resize}), Contains("must end in one size"));
  CHECK_THAT(refused({norm, crop(Transform::Kind::kCenterCrop, 8)}),
             Contains("normalize must be the last"));
  CHECK(refused({crop(Transform::Kind::kCenterCrop, 8), flip(0.5), norm}) == "accepted");
}

TEST_CASE("a mistake in the transforms names the file, the line and the key", "[unit]") {
  const auto error = [](const std::string& options) {
    const auto root = vflow::parse_yaml("train: /nowhere\n" + options, "job.yaml");
    try {
      DataRegistry::global().prepare("image-folder", vflow::SpecNode::scalar("image-folder"), root);
    } catch (const vflow::SpecError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK_THAT(error("transforms: [{random_resized_crop: {size: 0}}]"),
             Contains("job.yaml:2:") && Contains("transforms[0].random_resized_crop.size: value 0 "
                                                 "is out of range [1, 65536]"));
  CHECK_THAT(error("transforms: [{center_crop: 8}, {horizontal_flip: 2}]"),
             Contains("job.yaml:2:") &&
                 Contains("transforms[1].horizontal_flip: value 2 is out of range [0, 1]"));
  CHECK_THAT(error("transforms: [{center_crop: big}]"),
             Contains("transforms[0].center_crop: expected an integer, got 'big'"));
  CHECK_THAT(error("transforms:\n  - blur: 3\n"),
             Contains("job.yaml:3:") && Contains("transforms[0]: unknown transform 'blur'"));
  CHECK_THAT(
      error("transforms: [{resize: 32}]"),
      Contains("job.yaml:2:") && Contains("transforms: the transforms must end in one size"));
  CHECK_THAT(error("channels: 1\ntransforms: [{center_crop: 8}, {normalize: {mean: [0.5, 0.5], "
                   "std: [1]}}]"),
             Contains("job.yaml:3:") && Contains("normalize's mean has 2 values for 1 channel"));
  CHECK_THAT(error("transforms: [{center_crop: 8}]\neval_transforms: [{center_crop: 9}]"),
             Contains("eval_transforms: end in 9 x 9, the training transforms in 8 x 8"));
  // Well formed: then the folder is what is wrong.
  CHECK_THAT(error("transforms: [{center_crop: 8}]"), Contains("/nowhere: not a folder"));
}

TEST_CASE(
    "random choices are a function of (seed, epoch, example): the same on any thread, new each "
    "epoch",
    "[unit]") {
  const ImagePipeline p({crop(Transform::Kind::kRandomResizedCrop, 32), flip(0.5)}, 3);
  int moved = 0;
  for (int64_t k = 0; k < 20; ++k) {
    ExampleRandom a(7, 0, k), b(7, 0, k), c(7, 1, k);
    const ImageView va = p.plan(500, 375, a), vb = p.plan(500, 375, b), vc = p.plan(500, 375, c);
    REQUIRE((va.x == vb.x && va.y == vb.y && va.width == vb.width && va.flip == vb.flip));
    moved += va.x != vc.x || va.width != vc.width;
    // torchvision's bounds: an area of 8% to 100% of the image, inside it
    CHECK(va.width * va.height >= 0.08 * 500 * 375 * 0.97);
    CHECK((va.x >= 0 && va.x + va.width <= 500 && va.y >= 0 && va.y + va.height <= 375));
  }
  CHECK(moved >= 18);

  // An image folder read on the calling thread and on 3 data threads: the same bits.
  TempDir dir;
  const auto root =
      vflow::testing::write_image_folder(dir.file("train"), vflow::testing::fashion_images(40));
  const auto data = open_image_folder(root, gray28(), "");
  const auto idx = torch::arange(0, 40, torch::kInt64);
  DataThreads threads(3);
  const auto one = data->read(idx, ReadContext{5, 2, nullptr});
  const auto three = data->read(idx, ReadContext{5, 2, &threads});
  CHECK(torch::equal(one.input, three.input));
  CHECK(torch::equal(one.target, three.target));
  CHECK(!torch::equal(one.input, data->read(idx, ReadContext{5, 3, &threads}).input));
}

TEST_CASE(
    "tar shards are indexed by member offsets and truncated or damaged or empty ones are named",
    "[unit]") {
  const std::string a(700, 'a'), b(10, 'b');
  const auto tar = vflow::testing::tar_of({{"x/0001.jpg", a},
                                           {"x/0001.cls", "3\n"},
                                           {"x/0002.png", b},
                                           {"x/0002.cls", "9"},
                                           {"notes.txt", "n"}});
  const ReadAt read = [&tar](uint64_t at, size_t n, uint8_t* out) {
    const size_t got = at >= tar.size() ? 0 : std::min<size_t>(n, tar.size() - at);
    std::memcpy(out, tar.data() + at, got);
    return got;
  };
  const auto members = index_tar(read, tar.size(), "s.tar");
  REQUIRE(members.size() == 5);
  CHECK((members[0].name == "x/0001.jpg" && members[0].offset == 512 && members[0].size == 700));
  CHECK((members[1].header == 512 + 1024 && members[1].offset == 512 + 1024 + 512));
  const auto examples = webdataset_examples(members, read, 10, "s.tar");
  REQUIRE(examples.size() == 2);
  CHECK((examples[0].key == "x/0001" && examples[0].label == 3 && examples[0].image.size == 700));
  CHECK((examples[1].key == "x/0002" && examples[1].label == 9));

  CHECK_THAT(tar_error(tar.substr(0, 1000)),
             Contains("s.tar: a truncated tar: the member at offset 0 (x/0001.jpg) has 700 bytes"));
  CHECK_THAT(tar_error(tar.substr(0, 1536 + 100)),
             Contains("s.tar: a truncated tar: 100 bytes of a header at offset 1536"));
  std::string damaged = tar;
  damaged[1536 + 3] ^= 1;
  CHECK_THAT(tar_error(damaged), Contains("s.tar: a damaged tar header at offset 1536"));
  CHECK_THAT(tar_error(std::string(1024, '\0')), Contains("s.tar: an empty shard"));
  CHECK_THAT(tar_error(vflow::testing::tar_of({{"k.jpg", a}})),
             Contains("key k (offset 0) has an image but no class"));
  CHECK_THAT(tar_error(tar, 5),
             Contains("x/0002.cls (offset 4096) is not a class in [0, 5): \"9\""));
}

TEST_CASE("an image set writes no batch anyone still holds and reuses the memory of those let go",
          "[unit]") {
  TempDir dir;
  const auto root =
      vflow::testing::write_image_folder(dir.file("train"), vflow::testing::fashion_images(16));
  const auto data = open_image_folder(root, gray28(), "");
  const auto first = torch::arange(0, 8, torch::kInt64);
  const auto second = torch::arange(8, 16, torch::kInt64);
  auto held = data->read(first, ReadContext{5, 0, nullptr}).input;
  const auto expected = held.clone();
  std::set<const void*> memory{held.data_ptr()};
  // Batches read while it is held (more than the tensors kept) go elsewhere.
  for (int i = 0; i < 6; ++i) {
    const auto other = data->read(second, ReadContext{5, 0, nullptr}).input;
    CHECK(other.data_ptr() != held.data_ptr());
    memory.insert(other.data_ptr());
  }
  CHECK(torch::equal(held, expected));
  // A view of it holds its memory as much as the batch does.
  const auto view = held.narrow(0, 2, 3);
  held = torch::Tensor();
  for (int i = 0; i < 6; ++i) data->read(second, ReadContext{5, 0, nullptr});
  CHECK(torch::equal(view, expected.narrow(0, 2, 3)));
  // Let go, the memory of earlier batches is used again, every value written anew.
  const auto again = data->read(first, ReadContext{5, 0, nullptr}).input;
  CHECK(memory.count(again.data_ptr()) == 1);
  CHECK(torch::equal(again, expected));
}

TEST_CASE("image folders: classes sorted by name, the index cached and checked against the folder",
          "[unit]") {
  TempDir dir;
  const auto images = vflow::testing::fashion_images(30);
  const auto root = vflow::testing::write_image_folder(dir.file("train"), images, /*png=*/true);
  const auto cache = dir.file("cache");
  auto data = open_image_folder(root, gray28(), cache);
  REQUIRE(data->size() == 30);
  std::set<int64_t> labels(images.labels.begin(), images.labels.end());
  CHECK(data->info().num_classes == static_cast<int64_t>(labels.size()));
  CHECK(data->info().input_shape == std::vector<int64_t>{1, 24, 24});
  const auto targets = data->get(torch::arange(0, 30, torch::kInt64)).target;
  CHECK(torch::equal(targets, std::get<0>(targets.sort())));  // class by class
  REQUIRE(fs::exists(cache));
  REQUIRE(std::distance(fs::directory_iterator(cache), fs::directory_iterator()) == 1);

  // A file added to a class folder whose time is put back is not seen: the cache is used.
  const std::string cls = fmt::format("{}/{}", root, *labels.begin());
  const auto before = fs::last_write_time(cls);
  vflow::testing::write_file(cls + "/zz.png",
                             vflow::testing::encode_png(images.pixels[0], 28, 28, 1));
  fs::last_write_time(cls, before);
  CHECK(open_image_folder(root, gray28(), cache)->size() == 30);
  // With the folder's time as the file system set it, the index is made again.
  fs::last_write_time(cls, before + std::chrono::seconds(1));
  CHECK(open_image_folder(root, gray28(), cache)->size() == 31);
  CHECK(open_image_folder(root, gray28(), "")->size() == 31);

  fs::create_directories(root + "/99-empty");
  vflow::testing::write_file(root + "/99-empty/readme.txt", "no images");
  const auto error = [&] {
    try {
      open_image_folder(root, gray28(), cache);
    } catch (const vflow::DataError& e) {
      return std::string(e.what());
    }
    return std::string("no DataError");
  }();
  CHECK_THAT(error, Contains("99-empty: a class folder without images"));
  CHECK_THROWS_WITH(image_folder_classes(dir.file("nowhere")), Contains("nowhere: not a folder"));
}

TEST_CASE(
    "a corrupt example stops the read, or is replaced by the next that reads, the same on any "
    "thread",
    "[unit]") {
  TempDir dir;
  const auto root =
      vflow::testing::write_image_folder(dir.file("train"), vflow::testing::fashion_images(12));
  auto data = open_image_folder(root, gray28(), "");
  // Example 4 is cut short, example 5 is not an image at all.
  std::vector<std::string> files;  // in the index's order: class by class, by name
  for (const auto& cls : image_folder_classes(root)) {
    std::vector<std::string> in;
    for (const auto& e : fs::directory_iterator(root + "/" + cls)) in.push_back(e.path().string());
    std::sort(in.begin(), in.end());
    files.insert(files.end(), in.begin(), in.end());
  }
  REQUIRE(files.size() == 12);
  const auto cut = vflow::testing::read_file(files[4]);
  vflow::testing::write_file(files[4], cut.substr(0, cut.size() / 2));
  vflow::testing::write_file(files[5], "not an image");
  data = open_image_folder(root, gray28(), "");
  const auto idx = torch::arange(0, 12, torch::kInt64);

  vflow::engine::ExampleReader fail(3, vflow::engine::OnCorrupt::kFail);
  try {
    fail.read(*data, idx, 0);
    FAIL("no error");
  } catch (const CorruptExample& e) {
    CHECK(e.example() == 4);
    CHECK_THAT(e.what(), Contains(files[4] + ": a corrupt or truncated JPEG"));
  }
  vflow::engine::ExampleReader skip(3, vflow::engine::OnCorrupt::kSkip);
  const auto batch = skip.read(*data, idx, 1);
  CHECK(skip.replaced() == 2);
  // 4 and 5 become 6, the next example that reads, augmented as example 6 is.
  const auto six = data->read(torch::tensor({int64_t{6}}), ReadContext{3, 1, nullptr});
  CHECK(torch::equal(batch.input[4], six.input[0]));
  CHECK(torch::equal(batch.input[5], six.input[0]));
  CHECK(batch.target[5].item<int64_t>() == six.target[0].item<int64_t>());
  vflow::engine::ExampleReader threaded(3, vflow::engine::OnCorrupt::kSkip);
  threaded.set_threads(3);
  CHECK(torch::equal(threaded.read(*data, idx, 1).input, batch.input));
}
