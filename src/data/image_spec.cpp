#include "data/image_spec.h"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

#include "core/spec_schema.h"
#include "vflow/core/error.h"
#include "vflow/data/image_sets.h"
#include "vflow/data/token_files.h"

namespace vflow::data {

namespace {

[[noreturn]] void fail(const SpecNode& at, const std::string& message) {
  throw SpecError(fmt::format("{}: {}", at.describe(), message));
}

/// A side in pixels.
int64_t pixels(const SpecNode& n) { return read_int(n, 1, 65536); }

/// `224` (both sides; for resize, the shorter side) or `[height, width]`.
void read_size(const SpecNode& n, Transform& t, bool shorter_side) {
  if (n.is_sequence()) {
    if (n.items().size() != 2) fail(n, "expected a size: one number, or [height, width]");
    t.height = pixels(n.items()[0]);
    t.width = pixels(n.items()[1]);
    return;
  }
  t.width = pixels(n);
  t.height = shorter_side ? 0 : t.width;
}

void read_range(OptionReader& r, const std::string& key, double& lo, double& hi, double min,
                double max) {
  const auto v = r.get_double_list(key, {lo, hi}, min, max);
  if (v.size() != 2 || !(v[0] <= v[1])) r.fail(key, "expected [low, high] with low <= high");
  lo = v[0];
  hi = v[1];
}

Transform read_transform(const SpecNode& item) {
  std::string name;
  const SpecNode* arg = nullptr;
  if (item.is_scalar()) {
    name = item.value();
  } else if (item.is_map() && item.entries().size() == 1) {
    name = item.entries()[0].first;
    arg = &item.entries()[0].second;
    if (arg->is_null()) arg = nullptr;
  } else {
    fail(item, "a transform is a name, or one `name: options` entry");
  }
  const SpecNode& at = arg ? *arg : item;
  Transform t;
  if (name == "resize" || name == "center_crop") {
    t.kind = name == "resize" ? Transform::Kind::kResize : Transform::Kind::kCenterCrop;
    if (!arg) fail(item, fmt::format("{} needs a size", name));
    read_size(*arg, t, t.kind == Transform::Kind::kResize);
  } else if (name == "random_resized_crop") {
    t.kind = Transform::Kind::kRandomResizedCrop;
    if (!arg) fail(item, "random_resized_crop needs a size");
    if (!arg->is_map()) {
      read_size(*arg, t, false);
    } else {
      OptionReader r(*arg);
      const SpecNode* size = r.value("size");
      if (!size) r.fail("size", "random_resized_crop needs a size");
      read_size(*size, t, false);
      read_range(r, "scale", t.scale_min, t.scale_max, 1e-6, 1.0);
      read_range(r, "ratio", t.ratio_min, t.ratio_max, 1e-3, 1e3);
      r.finish();
    }
  } else if (name == "horizontal_flip") {
    t.kind = Transform::Kind::kHorizontalFlip;
    if (arg && arg->is_map()) {
      OptionReader r(*arg);
      t.p = r.get_double("p", 0.5, 0.0, 1.0);
      r.finish();
    } else if (arg) {
      t.p = read_double(*arg, 0.0, 1.0);
    }
  } else if (name == "normalize") {
    t.kind = Transform::Kind::kNormalize;
    if (!arg || !arg->is_map()) fail(at, "normalize needs {mean: [...], std: [...]}");
    OptionReader r(*arg);
    t.mean = r.get_double_list("mean", {}, -1e6, 1e6);
    t.std = r.get_double_list("std", {}, 1e-9, 1e6);
    if (t.mean.empty()) r.fail("mean", "normalize needs the mean of each channel");
    if (t.std.empty()) r.fail("std", "normalize needs the standard deviation of each channel");
    r.finish();
  } else {
    fail(item, fmt::format("unknown transform '{}'; vflow has center_crop, horizontal_flip, "
                           "normalize, random_resized_crop and resize",
                           name));
  }
  return t;
}

/// The transforms as a pipeline for `channels`; its mistakes named at `list`.
std::shared_ptr<const ImagePipeline> pipeline(const SpecNode& list, std::vector<Transform> steps,
                                              int channels) {
  try {
    return std::make_shared<const ImagePipeline>(std::move(steps), channels);
  } catch (const std::invalid_argument& e) {
    fail(list, e.what());
  }
}

/// The usual evaluation of a training pipeline: resize to 8/7 of the output (256 for 224),
/// center crop, and the training's normalize.
std::vector<Transform> evaluation_steps(const ImagePipeline& train) {
  std::vector<Transform> steps(2);
  steps[0].kind = Transform::Kind::kResize;
  steps[0].width = std::llround(
      static_cast<double>(std::max(train.out_height(), train.out_width())) * 8.0 / 7.0);
  steps[1].kind = Transform::Kind::kCenterCrop;
  steps[1].height = train.out_height();
  steps[1].width = train.out_width();
  for (const auto& t : train.steps()) {
    if (t.kind == Transform::Kind::kNormalize) steps.push_back(t);
  }
  return steps;
}

/// The keys both image data sets have.
struct ImageKeys {
  int64_t channels = 3;
  SpecNode transforms;
  SpecNode eval_transforms;
};

template <class O>
void image_keys(SpecSchema<O>& s) {
  s.integer("channels", &O::channels, 1, 3,
            "`3`: RGB; `1`: grayscale (a colour image is converted, as PIL's `L` does)")
      .after([](OptionReader& r, O& o) {
        if (o.channels == 2) r.fail("channels", "expected 1 (grayscale) or 3 (RGB)");
      });
  s.node("transforms", &O::transforms,
         "the training transforms, in order, each `name` or `name: options`: "
         "`resize: S` (the shorter side to S) or `resize: [H, W]`; `center_crop: S` or `[H, W]`; "
         "`random_resized_crop: S` or `{size: S, scale: [0.08, 1.0], ratio: [0.75, 1.333]}` "
         "(torchvision's); `horizontal_flip` (p 0.5) or `horizontal_flip: P`; "
         "`normalize: {mean: [...], std: [...]}` (on x / 255, last). They must end in one size "
         "(a crop, or resize [H, W]); without normalize the inputs are x / 255")
      .default_text("required");
  s.node("eval_transforms", &O::eval_transforms,
         "the evaluation transforms, alike; empty = resize to 8/7 of the training size, "
         "center_crop to it, and the training's normalize");
}

/// The two pipelines of `keys`, checked.
std::pair<std::shared_ptr<const ImagePipeline>, std::shared_ptr<const ImagePipeline>> pipelines(
    OptionReader& r, const ImageKeys& keys) {
  const int channels = static_cast<int>(keys.channels);
  if (keys.transforms.is_null() || keys.transforms.items().empty()) {
    r.fail("transforms", "needs the training transforms (at least a crop to one size)");
  }
  auto train = pipeline(keys.transforms, read_transforms(keys.transforms), channels);
  auto eval = keys.eval_transforms.is_null() || keys.eval_transforms.items().empty()
                  ? pipeline(keys.transforms, evaluation_steps(*train), channels)
                  : pipeline(keys.eval_transforms, read_transforms(keys.eval_transforms), channels);
  if (eval->out_height() != train->out_height() || eval->out_width() != train->out_width()) {
    r.fail("eval_transforms",
           fmt::format("end in {} x {}, the training transforms in {} x {}: a model takes one size",
                       eval->out_height(), eval->out_width(), train->out_height(),
                       train->out_width()));
  }
  return {train, eval};
}

DataInfo image_info(const ImagePipeline& p, int64_t classes) {
  return DataInfo{{p.channels(), p.out_height(), p.out_width()}, classes, 0};
}

// ---- image-folder ------------------------------------------------------------------------

struct ImageFolderKeys : ImageKeys {
  std::string train;
  std::string eval;
  std::string index_cache;
};

const SpecSchema<ImageFolderKeys>& image_folder_schema() {
  static const auto schema = [] {
    using O = ImageFolderKeys;
    SpecSchema<O> s("image-folder");
    s.text("train", &O::train,
           "the training folder: `train/<class>/<image>.{jpg,jpeg,png}`, classes sorted by name")
        .default_text("required")
        .after([](OptionReader& r, O& o) {
          if (o.train.empty()) r.fail("train", "needs the training folder");
        });
    s.text("eval", &O::eval, "the evaluation folder, alike (the same classes); empty = none");
    s.text("index_cache", &O::index_cache,
           "where the folders' file indexes are kept (one file per folder, checked against the "
           "class folders' times at start); `off` = index at every start")
        .default_text("$XDG_CACHE_HOME/vflow or ~/.cache/vflow");
    image_keys(s);
    return s;
  }();
  return schema;
}

PreparedData prepare_image_folder(OptionReader& opt) {
  ImageFolderKeys keys;
  image_folder_schema().read(opt, keys);
  auto [train, eval] = pipelines(opt, keys);
  // The classes are the training folder's sub-folders: listed now, their files at load.
  std::vector<std::string> classes;
  try {
    classes = image_folder_classes(keys.train);
  } catch (const DataError& e) {
    opt.fail("train", e.what());
  }
  if (!keys.eval.empty()) {
    std::vector<std::string> eval_classes;
    try {
      eval_classes = image_folder_classes(keys.eval);
    } catch (const DataError& e) {
      opt.fail("eval", e.what());
    }
    if (eval_classes != classes) {
      opt.fail("eval", fmt::format("{} has other class folders than {}", keys.eval, keys.train));
    }
  }
  const std::string cache = keys.index_cache == "off"  ? std::string()
                            : keys.index_cache.empty() ? default_index_cache()
                                                       : keys.index_cache;
  PreparedData p;
  p.info = image_info(*train, static_cast<int64_t>(classes.size()));
  p.load = [keys, train = train, eval = eval, cache] {
    return DataSplits{open_image_folder(keys.train, train, cache),
                      keys.eval.empty() ? nullptr : open_image_folder(keys.eval, eval, cache)};
  };
  return p;
}

// ---- image-shards ------------------------------------------------------------------------

struct ImageShardsKeys : ImageKeys {
  std::vector<std::string> train;
  std::vector<std::string> eval;
  int64_t classes = 0;
};

const SpecSchema<ImageShardsKeys>& image_shards_schema() {
  static const auto schema = [] {
    using O = ImageShardsKeys;
    SpecSchema<O> s("image-shards");
    s.texts("train", &O::train,
            "the training shards: tar files or glob patterns (`shards/train-*.tar`, each "
            "pattern's matches in name order) in the WebDataset layout: `KEY.jpg` (or `.jpeg`, "
            "`.png`) beside `KEY.cls`, a decimal class")
        .default_text("required")
        .after([](OptionReader& r, O& o) {
          if (o.train.empty()) r.fail("train", "needs the training shards");
        });
    s.texts("eval", &O::eval, "the evaluation shards, alike; empty = no evaluation");
    s.integer("classes", &O::classes, 1, int64_t{1} << 30,
              "how many classes: every `.cls` is below it")
        .default_text("required")
        .after([](OptionReader& r, O& o) {
          if (o.classes == 0) r.fail("classes", "needs the number of classes");
        });
    image_keys(s);
    return s;
  }();
  return schema;
}

PreparedData prepare_image_shards(OptionReader& opt) {
  ImageShardsKeys keys;
  image_shards_schema().read(opt, keys);
  auto [train, eval] = pipelines(opt, keys);
  const auto train_paths = shard_files(opt, "train", keys.train);
  const auto eval_paths = shard_files(opt, "eval", keys.eval);
  PreparedData p;
  p.info = image_info(*train, keys.classes);
  p.load = [train_paths, eval_paths, classes = keys.classes, train = train, eval = eval] {
    return DataSplits{open_image_shards(train_paths, classes, train),
                      eval_paths.empty() ? nullptr : open_image_shards(eval_paths, classes, eval)};
  };
  return p;
}

}  // namespace

std::vector<std::string> shard_files(OptionReader& opt, const char* key,
                                     const std::vector<std::string>& patterns) {
  try {
    return expand_shard_paths(patterns, key);
  } catch (const DataError& e) {
    opt.fail(key, e.what());
  }
}

std::vector<Transform> read_transforms(const SpecNode& list) {
  if (!list.is_sequence()) fail(list, "expected a list of transforms");
  std::vector<Transform> steps;
  for (const auto& item : list.items()) steps.push_back(read_transform(item));
  return steps;
}

void register_image_sets(DataRegistry& registry) {
  registry.add("image-folder",
               "images in class folders (ImageNet's layout), JPEG or PNG, read, decoded and "
               "transformed as examples are needed; inputs `[channels, H, W]`",
               prepare_image_folder, image_folder_schema().rows());
  registry.add("image-shards",
               "images in tar shards (the WebDataset layout), read directly by the members' "
               "offsets; inputs `[channels, H, W]`",
               prepare_image_shards, image_shards_schema().rows());
}

}  // namespace vflow::data
