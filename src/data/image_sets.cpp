#include "vflow/data/image_sets.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "core/input_file.h"
#include "core/output_file.h"
#include "vflow/core/error.h"
#include "vflow/data/image_codec.h"
#include "vflow/data/tar_index.h"

namespace vflow::data {

namespace fs = std::filesystem;

namespace {

/// A file's bytes at [offset, offset + n), or a DataError naming it.
std::vector<uint8_t> read_bytes(int fd, uint64_t offset, size_t n, const std::string& name) {
  std::vector<uint8_t> bytes(n);
  core::read_exactly_at(fd, offset, n, bytes.data(), name);
  return bytes;
}

/// The batches' pixel tensors, used again once nobody else holds them. A batch of images is
/// large (64 at 224 x 224 are 38 MiB), and memory that large comes fresh from the kernel
/// for each allocation (glibc maps every block over 32 MiB): a page fault for each 4 KiB
/// written, a fifth of two data threads' time. Every value of a batch is written by the
/// read that takes it, so a tensor used again holds nothing of the batch before.
class BatchTensors {
 public:
  torch::Tensor take(const std::vector<int64_t>& sizes) {
    std::lock_guard<std::mutex> hold(mutex_);
    torch::Tensor* free = nullptr;
    for (auto& t : kept_) {
      // Only this list holds it: no batch, view or saved activation uses its memory.
      if (t.use_count() != 1 || t.weak_use_count() != 1 || t.storage().use_count() != 1) {
        continue;
      }
      // A tensor of its own over the memory: whatever its holder changes of it (its
      // shape, requires_grad) leaves the kept one as it is.
      if (t.sizes() == c10::IntArrayRef(sizes)) return t.detach();
      free = &t;
    }
    auto made = torch::empty(sizes, torch::kFloat32);
    if (kept_.size() < kKept) {
      kept_.push_back(made);
    } else if (free != nullptr) {
      *free = made;  // of another size (a last, shorter batch): replaced
    }
    return made.detach();
  }

 private:
  /// Batches in flight at once: the one computed, the one read, and those prefetched.
  static constexpr size_t kKept = 4;
  std::mutex mutex_;
  std::vector<torch::Tensor> kept_;
};

/// What the image data sets share: an example is a file's bytes (or a tar member's) and a
/// class; reading decodes and transforms each on the data threads.
class ImageSet : public Dataset {
 public:
  ImageSet(std::shared_ptr<const ImagePipeline> pipeline, int64_t classes)
      : pipeline_(std::move(pipeline)), classes_(classes) {}

  DataInfo info() const override {
    return DataInfo{
        {pipeline_->channels(), pipeline_->out_height(), pipeline_->out_width()}, classes_, 0};
  }

  Batch get(const torch::Tensor& indices) const override { return read(indices, ReadContext{}); }

  Batch read(const torch::Tensor& indices, const ReadContext& context) const override {
    const auto idx = indices.to(torch::kInt64).contiguous();
    const int64_t n = idx.numel();
    auto input =
        batches_.take({n, pipeline_->channels(), pipeline_->out_height(), pipeline_->out_width()});
    auto target = torch::empty({n}, torch::kInt64);
    const int64_t* k = idx.data_ptr<int64_t>();
    float* out = input.data_ptr<float>();
    int64_t* labels = target.data_ptr<int64_t>();
    const int64_t stride = pipeline_->out_size();
    context.for_each(n, [&](int64_t i) {
      VFLOW_ASSERT(k[i] >= 0 && k[i] < size(), "example index out of range");
      labels[i] = label(k[i]);
      try {
        std::string name;
        const auto bytes = load(k[i], name);
        ExampleRandom random(context.seed, context.epoch, k[i]);
        pipeline_->run(bytes.data(), bytes.size(), name, random, out + i * stride);
      } catch (const DataError& e) {
        throw CorruptExample(k[i], e.what());
      }
    });
    return Batch{input, target};
  }

 protected:
  /// Example k's bytes; `name` is set to what messages call it (its file, or its shard
  /// and offset).
  virtual std::vector<uint8_t> load(int64_t k, std::string& name) const = 0;
  virtual int64_t label(int64_t k) const = 0;

 private:
  std::shared_ptr<const ImagePipeline> pipeline_;
  int64_t classes_;
  mutable BatchTensors batches_;
};

// ---- image-folder ------------------------------------------------------------------------

bool is_image_name(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot != std::string::npos && is_image_extension(name.substr(dot + 1));
}

int64_t modified_ns(const fs::path& dir) {
  std::error_code ec;
  const auto t = fs::last_write_time(dir, ec);
  return ec ? -1 : static_cast<int64_t>(t.time_since_epoch().count());
}

/// The folder's files: names (NUL-separated, relative to their class folder) and where each
/// class's files end. About the length of a name per file.
struct FolderIndex {
  std::vector<std::string> classes;
  std::vector<int64_t> modified;  ///< each class folder's modification time, ns
  std::vector<int64_t> ends;      ///< files in classes 0..c
  std::string names;
  std::vector<uint64_t> name_at;

  int64_t files() const { return ends.empty() ? 0 : ends.back(); }
};

FolderIndex build_index(const std::string& root, const std::vector<std::string>& classes) {
  FolderIndex index;
  index.classes = classes;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto last = start;
  for (size_t c = 0; c < classes.size(); ++c) {
    const fs::path dir = fs::path(root) / classes[c];
    index.modified.push_back(modified_ns(dir));
    std::vector<std::string> names;
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      std::error_code type_ec;
      if (is_image_name(name) && it->is_regular_file(type_ec)) names.push_back(name);
    }
    if (ec)
      throw DataError(
          fmt::format("{}: cannot list the class folder: {}", dir.string(), ec.message()));
    if (names.empty()) {
      throw DataError(
          fmt::format("{}: a class folder without images (.jpg, .jpeg or .png)", dir.string()));
    }
    std::sort(names.begin(), names.end());
    for (const auto& name : names) {
      index.name_at.push_back(index.names.size());
      index.names.append(name);
      index.names.push_back('\0');
    }
    index.ends.push_back(static_cast<int64_t>(index.name_at.size()));
    if (Clock::now() - last > std::chrono::seconds(2)) {
      last = Clock::now();
      spdlog::info("image-folder {}: indexed {} files in {} of {} classes", root, index.files(),
                   c + 1, classes.size());
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (seconds > 2) {
    spdlog::info("image-folder {}: {} files in {} classes indexed in {:.1f} s", root, index.files(),
                 classes.size(), seconds);
  }
  return index;
}

constexpr const char* kIndexMagic = "vflow image-folder index 1";

std::string cache_path(const std::string& cache_dir, const std::string& root) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the folder's absolute path
  for (const unsigned char c : root) h = (h ^ c) * 1099511628211ull;
  return (fs::path(cache_dir) / fmt::format("image-folder-{:016x}.idx", h)).string();
}

void save_index(const FolderIndex& index, const std::string& root, const std::string& path) {
  std::string text = fmt::format("{}\n{}\n{}\n", kIndexMagic, root, index.classes.size());
  for (size_t c = 0; c < index.classes.size(); ++c) {
    if (index.classes[c].find_first_of("\t\n") != std::string::npos) return;
    text += fmt::format("{}\t{}\t{}\n", index.classes[c], index.modified[c],
                        index.ends[c] - (c == 0 ? 0 : index.ends[c - 1]));
  }
  for (const uint64_t at : index.name_at) {
    const char* name = index.names.c_str() + at;
    if (std::strchr(name, '\n')) return;  // not kept: a name this format cannot hold
    text += name;
    text += '\n';
  }
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  if (const std::string error = core::write_file_atomically(path, text); !error.empty()) {
    spdlog::warn("image-folder {}: the index is not cached: {}", root, error);
  }
}

/// The cached index when it still describes the folder: the same class folders, each
/// modified when it was (a file added, removed or renamed changes its folder's time).
std::optional<FolderIndex> load_index(const std::string& path, const std::string& root,
                                      const std::vector<std::string>& classes) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string line;
  size_t count = 0;
  if (!std::getline(in, line) || line != kIndexMagic || !std::getline(in, line) || line != root ||
      !(in >> count) || count != classes.size()) {
    return std::nullopt;
  }
  std::getline(in, line);
  FolderIndex index;
  index.classes = classes;
  int64_t total = 0;
  for (size_t c = 0; c < count; ++c) {
    if (!std::getline(in, line)) return std::nullopt;
    std::istringstream fields(line);
    std::string name;
    int64_t modified = 0, files = 0;
    if (!std::getline(fields, name, '\t') || !(fields >> modified >> files) || name != classes[c] ||
        modified != modified_ns(fs::path(root) / name) || files <= 0) {
      if (name == classes[c])
        spdlog::info("image-folder {}: class {} changed; indexing again", root, name);
      return std::nullopt;
    }
    index.modified.push_back(modified);
    total += files;
    index.ends.push_back(total);
  }
  while (std::getline(in, line)) {
    index.name_at.push_back(index.names.size());
    index.names.append(line);
    index.names.push_back('\0');
  }
  if (static_cast<int64_t>(index.name_at.size()) != total) return std::nullopt;
  return index;
}

class ImageFolder final : public ImageSet {
 public:
  ImageFolder(std::string root, FolderIndex index, std::shared_ptr<const ImagePipeline> pipeline)
      : ImageSet(std::move(pipeline), static_cast<int64_t>(index.classes.size())),
        root_(std::move(root)),
        index_(std::move(index)) {}

  int64_t size() const override { return index_.files(); }

 protected:
  std::vector<uint8_t> load(int64_t k, std::string& path) const override {
    path = root_;
    path += '/';
    path += index_.classes[static_cast<size_t>(label(k))];
    path += '/';
    path += index_.names.c_str() + index_.name_at[static_cast<size_t>(k)];
    auto in = core::open_input_file(path);
    if (!in.ok()) throw DataError(fmt::format("{}: cannot read: {}", path, in.error));
    return read_bytes(in.fd.get(), 0, static_cast<size_t>(in.size), path);
  }
  int64_t label(int64_t k) const override {
    return std::upper_bound(index_.ends.begin(), index_.ends.end(), k) - index_.ends.begin();
  }

 private:
  std::string root_;
  FolderIndex index_;
};

// ---- image-shards ------------------------------------------------------------------------

class ImageShards final : public ImageSet {
 public:
  ImageShards(const std::vector<std::string>& paths, int64_t classes,
              std::shared_ptr<const ImagePipeline> pipeline)
      : ImageSet(std::move(pipeline), classes) {
    if (paths.empty()) throw DataError("image shards: no shard files given");
    using Clock = std::chrono::steady_clock;
    auto last = Clock::now();
    for (size_t s = 0; s < paths.size(); ++s) {
      auto in = core::open_input_file(paths[s]);
      if (!in.ok()) throw DataError(fmt::format("{}: cannot read: {}", paths[s], in.error));
      if (in.size == 0) throw DataError(fmt::format("{}: an empty shard", paths[s]));
      const int fd = in.fd.get();
      const ReadAt read = [fd, &paths, s](uint64_t offset, size_t n, uint8_t* out) {
        std::string error;
        const size_t got = core::read_at(fd, offset, n, out, error);
        if (!error.empty()) {
          throw DataError(fmt::format("{}: cannot read at offset {}: {}", paths[s], offset, error));
        }
        return got;
      };
      const auto members = index_tar(read, in.size, paths[s]);
      for (const auto& e : webdataset_examples(members, read, classes, paths[s])) {
        if (e.image.size > UINT32_MAX) {
          throw DataError(
              fmt::format("{}: the image at offset {} has {} bytes, more than an "
                          "image may have (4 GiB)",
                          paths[s], e.image.header, e.image.size));
        }
        examples_.push_back(Example{e.image.offset, static_cast<uint32_t>(s),
                                    static_cast<uint32_t>(e.image.size),
                                    static_cast<int32_t>(e.label)});
      }
      paths_.push_back(paths[s]);
      fds_.push_back(std::move(in.fd));
      if (Clock::now() - last > std::chrono::seconds(2)) {
        last = Clock::now();
        spdlog::info("image-shards: indexed {} of {} shards, {} examples", s + 1, paths.size(),
                     examples_.size());
      }
    }
  }

  int64_t size() const override { return static_cast<int64_t>(examples_.size()); }

 protected:
  std::vector<uint8_t> load(int64_t k, std::string& name) const override {
    const Example& e = examples_[static_cast<size_t>(k)];
    // A member's header is the block before its data.
    name = fmt::format("{} (member at offset {})", paths_[e.shard], e.offset - kTarBlock);
    return read_bytes(fds_[e.shard].get(), e.offset, e.size, name);
  }
  int64_t label(int64_t k) const override { return examples_[static_cast<size_t>(k)].label; }

 private:
  /// 24 bytes an example: where its image is, and its class.
  struct Example {
    uint64_t offset;
    uint32_t shard;
    uint32_t size;
    int32_t label;
  };
  std::vector<std::string> paths_;
  std::vector<core::InputFd> fds_;
  std::vector<Example> examples_;
  static_assert(sizeof(Example) == 24);
};

}  // namespace

std::vector<std::string> image_folder_classes(const std::string& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) throw DataError(fmt::format("{}: not a folder", root));
  std::vector<std::string> classes;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (it->is_directory(type_ec)) classes.push_back(it->path().filename().string());
  }
  if (ec) throw DataError(fmt::format("{}: cannot list the folder: {}", root, ec.message()));
  if (classes.empty()) {
    throw DataError(fmt::format("{}: no class folders (root/<class>/<image>)", root));
  }
  std::sort(classes.begin(), classes.end());
  return classes;
}

std::shared_ptr<Dataset> open_image_folder(const std::string& root,
                                           std::shared_ptr<const ImagePipeline> pipeline,
                                           const std::string& cache_dir) {
  std::error_code ec;
  const std::string absolute = fs::absolute(root, ec).lexically_normal().string();
  const auto classes = image_folder_classes(absolute);
  const std::string cache = cache_dir.empty() ? std::string() : cache_path(cache_dir, absolute);
  std::optional<FolderIndex> index;
  if (!cache.empty()) index = load_index(cache, absolute, classes);
  if (!index) {
    index = build_index(absolute, classes);
    if (!cache.empty()) save_index(*index, absolute, cache);
  }
  return std::make_shared<ImageFolder>(absolute, std::move(*index), std::move(pipeline));
}

std::shared_ptr<Dataset> open_image_shards(const std::vector<std::string>& paths, int64_t classes,
                                           std::shared_ptr<const ImagePipeline> pipeline) {
  return std::make_shared<ImageShards>(paths, classes, std::move(pipeline));
}

std::string default_index_cache() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
    return (fs::path(xdg) / "vflow").string();
  }
  if (const char* home = std::getenv("HOME"); home && *home) {
    return (fs::path(home) / ".cache" / "vflow").string();
  }
  return {};
}

}  // namespace vflow::data
