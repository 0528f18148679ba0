#include "vflow/data/fashion_mnist.h"

#include <torch/torch.h>
#include <zlib.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include "support.h"
#include "vflow/core/error.h"

using Catch::Matchers::Contains;
using vflow::data::load_fashion_mnist;
using vflow::testing::TempDir;

namespace {

std::string be32(uint32_t v) {
  return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                     static_cast<char>(v >> 8), static_cast<char>(v)};
}

std::string images(uint32_t n, uint32_t side = 28, uint32_t magic = 0x803) {
  return be32(magic) + be32(n) + be32(side) + be32(side) + std::string(n * side * side, '\x40');
}

std::string labels(uint32_t n, char value = 3) {
  return be32(0x801) + be32(n) + std::string(n, value);
}

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

/// A data directory with a test split (t10k-*) made of the given file contents.
void make_split(const TempDir& dir, const std::string& image_bytes, const std::string& label_bytes,
                bool gz) {
  if (gz) {
    write_gz(dir.file("t10k-images-idx3-ubyte.gz"), image_bytes);
    write_gz(dir.file("t10k-labels-idx1-ubyte.gz"), label_bytes);
  } else {
    vflow::testing::write_file(dir.file("t10k-images-idx3-ubyte"), image_bytes);
    vflow::testing::write_file(dir.file("t10k-labels-idx1-ubyte"), label_bytes);
  }
}

}  // namespace

TEST_CASE("Debian's Fashion-MNIST loads with the documented shapes", "[integration]") {
  REQUIRE(std::filesystem::exists(vflow::data::kFashionMnistDefaultPath));
  const auto train = load_fashion_mnist(vflow::data::kFashionMnistDefaultPath, "train", true);
  const auto test = load_fashion_mnist(vflow::data::kFashionMnistDefaultPath, "test", false);
  CHECK(train->size() == 60000);
  CHECK(test->size() == 10000);
  CHECK(train->info().input_shape == std::vector<int64_t>{1, 28, 28});
  CHECK(test->inputs().min().item<float>() >= 0.0F);
  CHECK(test->inputs().max().item<float>() <= 1.0F);
  CHECK(std::abs(train->inputs().mean().item<double>()) < 0.01);           // normalised
  CHECK(torch::bincount(train->targets()).min().item<int64_t>() == 6000);  // balanced classes
}

TEST_CASE("well-formed idx files load, compressed or not", "[unit]") {
  for (const bool gz : {false, true}) {
    TempDir dir;
    make_split(dir, images(5), labels(5), gz);
    const auto d = load_fashion_mnist(dir.path(), "test", false);
    CHECK(d->size() == 5);
    CHECK(d->targets()[4].item<int64_t>() == 3);
  }
}

TEST_CASE("corrupt data files give errors that name the file and the problem", "[unit]") {
  TempDir dir;
  const std::string img = dir.file("t10k-images-idx3-ubyte");
  const std::string lbl = dir.file("t10k-labels-idx1-ubyte");
  SECTION("missing files") {
    CHECK_THROWS_WITH(load_fashion_mnist(dir.path(), "test", false),
                      Contains("t10k-images-idx3-ubyte(.gz): file not found"));
  }
  SECTION("bad magic number") {
    make_split(dir, images(5, 28, 0x801), labels(5), false);
    CHECK_THROWS_WITH(load_fashion_mnist(dir.path(), "test", false),
                      Contains(img) && Contains("bad magic number 0x00000801"));
  }
  SECTION("truncated data") {
    const std::string full = images(5);
    make_split(dir, full.substr(0, full.size() - 100), labels(5), false);
    CHECK_THROWS_WITH(
        load_fashion_mnist(dir.path(), "test", false),
        Contains(img) && Contains("truncated: header announces 3920 bytes of data, found 3820"));
  }
  SECTION("truncated header") {
    make_split(dir, images(5).substr(0, 6), labels(5), false);
    CHECK_THROWS_WITH(load_fashion_mnist(dir.path(), "test", false),
                      Contains(img) && Contains("truncated"));
  }
  SECTION("trailing bytes") {
    make_split(dir, images(5), labels(5) + "xx", false);
    CHECK_THROWS_WITH(load_fashion_mnist(dir.path(), "test", false),
                      Contains(lbl) && Contains("unexpected bytes after"));
  }
  SECTION("wrong image size") {
    make_split(dir, images(5, 32), labels(5), false);
    CHECK_THROWS_WITH(load_fashion_mnist(dir.path(), "test", false),
                      Contains(img) && Contains("32x32"));
  }
  SECTION("label out of range") {
    make_split(dir, images(5), labels(5, 12), false);
    CHECK_THROWS_WITH(load_fashion_mnist(dir.path(), "test", false),
                      Contains(lbl) && Contains("label 12 at index 0 is outside 0..9"));
  }
  SECTION("image and label counts differ") {
    make_split(dir, images(5), labels(4), false);
    CHECK_THROWS_WITH(load_fashion_mnist(dir.path(), "test", false),
                      Contains("holds 5 images but") && Contains("holds 4 labels"));
  }
  SECTION("corrupt gzip stream") {
    TempDir gz;
    make_split(gz, images(50), labels(50), true);
    std::string bytes = vflow::testing::read_file(gz.file("t10k-images-idx3-ubyte.gz"));
    for (size_t i = 20; i < bytes.size() - 8; i += 7) bytes[i] = static_cast<char>(bytes[i] ^ 0x5A);
    vflow::testing::write_file(gz.file("t10k-images-idx3-ubyte.gz"), bytes);
    CHECK_THROWS_AS(load_fashion_mnist(gz.path(), "test", false), vflow::DataError);
    CHECK_THROWS_WITH(load_fashion_mnist(gz.path(), "test", false),
                      Contains("t10k-images-idx3-ubyte.gz"));
  }
  SECTION("truncated gzip stream") {
    TempDir gz;
    make_split(gz, images(50), labels(50), true);
    const std::string bytes = vflow::testing::read_file(gz.file("t10k-images-idx3-ubyte.gz"));
    vflow::testing::write_file(gz.file("t10k-images-idx3-ubyte.gz"),
                               bytes.substr(0, bytes.size() / 2));
    CHECK_THROWS_WITH(load_fashion_mnist(gz.path(), "test", false),
                      Contains("t10k-images-idx3-ubyte.gz"));
  }
}
