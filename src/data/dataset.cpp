#include "vflow/data/dataset.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "vflow/core/error.h"
#include "vflow/data/fashion_mnist.h"
#include "vflow/data/synthetic.h"
#include "vflow/data/text.h"

namespace vflow::data {

TensorDataset::TensorDataset(torch::Tensor inputs, torch::Tensor targets, int64_t num_classes,
                             int64_t vocab_size)
    : inputs_(std::move(inputs)),
      targets_(std::move(targets)),
      num_classes_(num_classes),
      vocab_size_(vocab_size) {
  VFLOW_ASSERT(inputs_.dim() >= 1 && targets_.dim() >= 1 && inputs_.size(0) == targets_.size(0),
               "inputs and targets must have the same number of examples");
  inputs_ = inputs_.contiguous();
  targets_ = targets_.to(torch::kInt64).contiguous();
}

DataInfo TensorDataset::info() const {
  DataInfo info;
  info.input_shape.assign(inputs_.sizes().begin() + 1, inputs_.sizes().end());
  info.num_classes = num_classes_;
  info.vocab_size = vocab_size_;
  return info;
}

Batch TensorDataset::get(const torch::Tensor& indices) const {
  return Batch{inputs_.index_select(0, indices), targets_.index_select(0, indices)};
}

// ---- registry ------------------------------------------------------------------

namespace {

PreparedData prepare_fashion_mnist(OptionReader& opt) {
  const std::string path = opt.get_string("path", kFashionMnistDefaultPath);
  const bool normalize = opt.get_bool("normalize", true);
  PreparedData p;
  p.info = DataInfo{{1, 28, 28}, 10};
  p.load = [path, normalize] {
    return DataSplits{load_fashion_mnist(path, "train", normalize),
                      load_fashion_mnist(path, "test", normalize)};
  };
  return p;
}

PreparedData prepare_synthetic(OptionReader& opt) {
  SyntheticOptions train;
  train.size = opt.get_int("train_size", 4096, 1, int64_t{1} << 32);
  const int64_t test_size = opt.get_int("test_size", 1024, 0, int64_t{1} << 32);
  train.classes = opt.get_int("classes", 10, 2, 100000);
  train.shape = opt.get_int_list("shape", {1, 28, 28}, 1, 1 << 20);
  if (train.shape.empty()) opt.fail("shape", "needs at least one dimension");
  train.noise = opt.get_double("noise", 1.0, 0.0, 1e6);
  train.seed = static_cast<uint64_t>(opt.get_int("seed", 0, 0, INT64_MAX));
  SyntheticOptions test = train;
  test.size = test_size;
  test.split = 1;
  PreparedData p;
  p.info = DataInfo{train.shape, train.classes};
  p.load = [train, test] {
    return DataSplits{make_synthetic(train), test.size > 0 ? make_synthetic(test) : nullptr};
  };
  return p;
}

std::vector<std::pair<std::string, std::vector<std::string>>> read_text_classes(
    OptionReader& opt, const std::string& root) {
  const auto& items = opt.list("classes");
  if (items.empty()) {
    if (root.empty()) opt.fail("classes", "needs at least two classes ({name, paths})");
    return fortunes_language_classes(root);
  }
  std::vector<std::pair<std::string, std::vector<std::string>>> classes;
  for (const auto& item : items) {
    OptionReader c(item);
    std::string name = c.get_string("name", "");
    auto paths = c.get_string_list("paths", {});
    if (name.empty()) c.fail("name", "every class needs a name");
    if (paths.empty()) c.fail("paths", "every class needs files or directories");
    c.finish();
    classes.emplace_back(std::move(name), std::move(paths));
  }
  if (classes.size() < 2) opt.fail("classes", "needs at least two classes");
  return classes;
}

// `preset`: the fortune-package language task, whose classes default to the languages
// under `root`.
PreparedData prepare_text_classes(OptionReader& opt, bool preset) {
  const std::string root = preset ? opt.get_string("root", kFortunesRoot) : std::string();
  TextClassesOptions o;
  o.classes = read_text_classes(opt, root);
  o.max_length = opt.get_int("max_length", o.max_length, 3, 1 << 16);
  o.min_bytes = opt.get_int("min_bytes", o.min_bytes, 1, 1 << 16);
  o.per_class = opt.get_int("per_class", o.per_class, 0, int64_t{1} << 32);
  o.test_every = opt.get_int("test_every", o.test_every, 2, 1 << 20);
  PreparedData p;
  p.info =
      DataInfo{{o.max_length}, static_cast<int64_t>(o.classes.size()), ByteTokenizer::kVocabSize};
  p.load = [o] { return load_text_classes(o); };
  return p;
}

PreparedData prepare_text_lm(OptionReader& opt, bool preset) {
  TextLmOptions o;
  if (preset) {
    o.paths = fortunes_english_files(opt.get_string("root", kFortunesRoot));
  } else {
    o.paths = opt.get_string_list("paths", {});
    if (o.paths.empty()) opt.fail("paths", "needs text files or directories");
  }
  o.context = opt.get_int("context", o.context, 1, 1 << 16);
  o.test_every = opt.get_int("test_every", o.test_every, 2, 1 << 20);
  PreparedData p;
  p.info = DataInfo{{o.context}, ByteTokenizer::kVocabSize, ByteTokenizer::kVocabSize};
  p.load = [o] { return load_text_lm(o); };
  return p;
}

}  // namespace

DataRegistry::DataRegistry() : Registry("data set") {
  add("fashion-mnist", "Fashion-MNIST idx files (options: path, normalize)", prepare_fashion_mnist);
  add("synthetic",
      "class prototypes plus noise (options: train_size, test_size, classes, shape, noise, seed)",
      prepare_synthetic);
  add("text-classes",
      "sentence classification over text files, byte tokens (options: classes [{name, paths}], "
      "max_length, min_bytes, per_class, test_every)",
      [](OptionReader& o) { return prepare_text_classes(o, false); });
  add("text-lm",
      "next-byte language modelling over text files (options: paths, context, test_every)",
      [](OptionReader& o) { return prepare_text_lm(o, false); });
  add("fortunes-langid",
      "language identification (de, es, it, pt) of sentences from Debian's fortunes-de/-es/-it/-br "
      "(options: root, classes, max_length, min_bytes, per_class, test_every)",
      [](OptionReader& o) { return prepare_text_classes(o, true); });
  add("fortunes-lm",
      "next-byte language modelling on Debian's English fortunes package (options: root, "
      "context, test_every)",
      [](OptionReader& o) { return prepare_text_lm(o, true); });
}

DataRegistry& DataRegistry::global() {
  static DataRegistry registry;
  return registry;
}

PreparedData DataRegistry::prepare(const std::string& name, const SpecNode& name_node,
                                   const SpecNode& options) const {
  const DataFactory& factory = find(name, name_node);
  OptionReader reader(options);
  PreparedData prepared = factory(reader);
  reader.finish();
  return prepared;
}

}  // namespace vflow::data
