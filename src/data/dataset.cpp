#include "vflow/data/dataset.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <type_traits>

#include "core/spec_schema.h"
#include "data/image_spec.h"
#include "vflow/core/error.h"
#include "vflow/data/fashion_mnist.h"
#include "vflow/data/synthetic.h"
#include "vflow/data/text.h"
#include "vflow/data/token_shards.h"

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

void ReadContext::for_each(int64_t n, const std::function<void(int64_t)>& fn) const {
  if (threads) {
    threads->for_each(n, fn);
    return;
  }
  for (int64_t i = 0; i < n; ++i) fn(i);
}

Batch TensorDataset::get(const torch::Tensor& indices) const {
  return Batch{inputs_.index_select(0, indices), targets_.index_select(0, indices)};
}

// ---- registry ------------------------------------------------------------------

namespace {

struct FashionMnistOptions {
  std::string path = kFashionMnistDefaultPath;
  bool normalize = true;
};

const SpecSchema<FashionMnistOptions>& fashion_mnist_schema() {
  static const auto schema = [] {
    using O = FashionMnistOptions;
    SpecSchema<O> s("fashion-mnist");
    s.text("path", &O::path,
           "the folder of the idx files (`.gz` or plain); the default is where Debian's "
           "`dataset-fashion-mnist` installs them");
    s.boolean("normalize", &O::normalize, "standardise with mean 0.2860, std 0.3530");
    return s;
  }();
  return schema;
}

PreparedData prepare_fashion_mnist(OptionReader& opt) {
  FashionMnistOptions o;
  fashion_mnist_schema().read(opt, o);
  PreparedData p;
  p.info = DataInfo{{1, 28, 28}, 10};
  p.load = [o] {
    return DataSplits{load_fashion_mnist(o.path, "train", o.normalize),
                      load_fashion_mnist(o.path, "test", o.normalize)};
  };
  return p;
}

/// synthetic's options: one SyntheticOptions per split, less what the splits share.
struct SyntheticKeys {
  int64_t train_size = 4096;
  int64_t test_size = 1024;
  int64_t classes = 10;
  std::vector<int64_t> shape = {1, 28, 28};
  double noise = 1.0;
  uint64_t seed = 0;
};

const SpecSchema<SyntheticKeys>& synthetic_schema() {
  static const auto schema = [] {
    using O = SyntheticKeys;
    SpecSchema<O> s("synthetic");
    s.integer("train_size", &O::train_size, 1, int64_t{1} << 32, "training examples");
    s.integer("test_size", &O::test_size, 0, int64_t{1} << 32,
              "evaluation examples (the same prototypes, other noise); 0 = no evaluation");
    s.integer("classes", &O::classes, 2, 100000, "classes, one prototype each");
    s.integers("shape", &O::shape, 1, 1 << 20, "the shape of one example")
        .after([](OptionReader& r, O& o) {
          if (o.shape.empty()) r.fail("shape", "needs at least one dimension");
        });
    s.real("noise", &O::noise, 0.0, 1e6, "standard deviation of each example's Gaussian noise");
    s.integer("seed", &O::seed, INT64_MAX, "the data's own seed, independent of the job's");
    return s;
  }();
  return schema;
}

PreparedData prepare_synthetic(OptionReader& opt) {
  SyntheticKeys keys;
  synthetic_schema().read(opt, keys);
  SyntheticOptions train;
  train.size = keys.train_size;
  train.classes = keys.classes;
  train.shape = keys.shape;
  train.noise = keys.noise;
  train.seed = keys.seed;
  SyntheticOptions test = train;
  test.size = keys.test_size;
  test.split = 1;
  PreparedData p;
  p.info = DataInfo{train.shape, train.classes};
  p.load = [train, test] {
    return DataSplits{make_synthetic(train), test.size > 0 ? make_synthetic(test) : nullptr};
  };
  return p;
}

const SpecSchema<TextClass>& text_class_schema() {
  static const auto schema = [] {
    SpecSchema<TextClass> s("class");
    s.text("name", &TextClass::name, "the class's name")
        .default_text("required")
        .after([](OptionReader& r, TextClass& c) {
          if (c.name.empty()) r.fail("name", "every class needs a name");
        });
    s.texts("paths", &TextClass::paths,
            "its files or directories (their files, not recursive, without `*.dat`/`*.u8`)")
        .default_text("required")
        .after([](OptionReader& r, TextClass& c) {
          if (c.paths.empty()) r.fail("paths", "every class needs files or directories");
        });
    return s;
  }();
  return schema;
}

/// fortunes-langid's options: text-classes' and the fortune packages' root.
struct FortunesLangidOptions : TextClassesOptions {
  std::string root = kFortunesRoot;
};

/// text-classes' keys, or (T = FortunesLangidOptions) fortunes-langid's, whose classes
/// default to the languages under `root`.
template <class T>
SpecSchema<T> text_classes_schema() {
  constexpr bool preset = std::is_same_v<T, FortunesLangidOptions>;
  SpecSchema<T> s(preset ? "fortunes-langid" : "text-classes");
  if constexpr (preset) {
    s.text("root", &T::root, "where Debian's fortune packages install their files");
  }
  s.template list<TextClass>(
       "classes", &T::classes, text_class_schema(),
       "list of `{name, paths}`, at least two; `paths` are files or directories")
      .default_text(preset ? "de, es, it and pt under `root`" : "required")
      .after([](OptionReader& r, T& o) {
        if (o.classes.size() == 1) r.fail("classes", "needs at least two classes");
      });
  s.integer("max_length", &T::max_length, 3, 1 << 16,
            "tokens per example: [start], up to max_length − 2 bytes, [end], padding");
  s.integer("min_bytes", &T::min_bytes, 1, 1 << 16, "shorter sentences are dropped");
  s.integer("per_class", &T::per_class, 0, int64_t{1} << 32,
            "training sentences per class; 0 = as many as the smallest class has (balanced)");
  s.integer("test_every", &T::test_every, 2, 1 << 20,
            "about one sentence in k, chosen by a hash of its text, is held out for evaluation");
  return s;
}

template <class T>
PreparedData prepare_text_classes(OptionReader& opt) {
  static const SpecSchema<T> schema = text_classes_schema<T>();
  T read;
  schema.read(opt, read);
  if (read.classes.empty()) {
    if constexpr (std::is_same_v<T, FortunesLangidOptions>) {
      read.classes = fortunes_language_classes(read.root);
    } else {
      opt.fail("classes", "needs at least two classes ({name, paths})");
    }
  }
  const TextClassesOptions o = read;
  PreparedData p;
  p.info =
      DataInfo{{o.max_length}, static_cast<int64_t>(o.classes.size()), ByteTokenizer::kVocabSize};
  p.load = [o] { return load_text_classes(o); };
  return p;
}

/// fortunes-lm's options: text-lm's, with the fortune packages' root for the paths.
struct FortunesLmOptions : TextLmOptions {
  std::string root = kFortunesRoot;
};

/// text-lm's keys, or (T = FortunesLmOptions) fortunes-lm's.
template <class T>
SpecSchema<T> text_lm_schema() {
  constexpr bool preset = std::is_same_v<T, FortunesLmOptions>;
  SpecSchema<T> s(preset ? "fortunes-lm" : "text-lm");
  if constexpr (preset) {
    s.text("root", &T::root, "where Debian's `fortunes` package installs its files");
  } else {
    s.texts("paths", &T::paths, "text files or directories, concatenated in order")
        .default_text("required")
        .after([](OptionReader& r, T& o) {
          if (o.paths.empty()) r.fail("paths", "needs text files or directories");
        });
  }
  s.integer("context", &T::context, 1, 1 << 16,
            "tokens per example; targets are the inputs shifted by one");
  s.integer("test_every", &T::test_every, 2, 1 << 20, "every k-th window is held out");
  return s;
}

template <class T>
PreparedData prepare_text_lm(OptionReader& opt) {
  static const SpecSchema<T> schema = text_lm_schema<T>();
  T read;
  schema.read(opt, read);
  if constexpr (std::is_same_v<T, FortunesLmOptions>) {
    read.paths = fortunes_english_files(read.root);
  }
  const TextLmOptions o = read;
  PreparedData p;
  p.info = DataInfo{{o.context}, ByteTokenizer::kVocabSize, ByteTokenizer::kVocabSize};
  p.load = [o] { return load_text_lm(o); };
  return p;
}

/// token-shards' options: the training and evaluation shards, and how to read them.
struct TokenShardsKeys {
  std::vector<std::string> train;
  std::vector<std::string> eval;
  TokenFormat format = TokenFormat::kLlmc;
  int64_t context = 64;
  int64_t vocab_size = 0;
};

const SpecSchema<TokenShardsKeys>& token_shards_schema() {
  static const auto schema = [] {
    using O = TokenShardsKeys;
    SpecSchema<O> s("token-shards");
    s.texts("train", &O::train,
            "the training shards: files or glob patterns (`data/train_*.bin`, each pattern's "
            "matches in name order), relative to the working directory")
        .default_text("required")
        .after([](OptionReader& r, O& o) {
          if (o.train.empty()) r.fail("train", "needs the training shards");
        });
    s.texts("eval", &O::eval, "the evaluation shards, alike; empty = no evaluation");
    s.choice("format", &O::format, {TokenFormat::kLlmc, TokenFormat::kUint16, TokenFormat::kUint32},
             "`llmc`: llm.c's shards (a 1024-byte header: magic 20240520, version 1, the token "
             "count; then uint16 tokens); `uint16` or `uint32`: raw little-endian token ids");
    s.integer("context", &O::context, 1, 1 << 20,
              "tokens per example; targets are the inputs shifted by one (an example reads "
              "context + 1 tokens; examples do not overlap or cross shards)");
    s.integer("vocab_size", &O::vocab_size, 1, int64_t{1} << 32,
              "the tokenizer's vocabulary: every token id is below it (GPT-2's is 50257)")
        .default_text("required")
        .after([](OptionReader& r, O& o) {
          if (o.vocab_size == 0) r.fail("vocab_size", "needs the tokenizer's vocabulary size");
        });
    return s;
  }();
  return schema;
}

PreparedData prepare_token_shards(OptionReader& opt) {
  TokenShardsKeys keys;
  token_shards_schema().read(opt, keys);
  TokenShardsOptions train;
  train.format = keys.format;
  train.context = keys.context;
  train.vocab_size = keys.vocab_size;
  TokenShardsOptions eval = train;
  // Which files: listed now (cheap); their headers are read when the data loads.
  train.paths = shard_files(opt, "train", keys.train);
  eval.paths = shard_files(opt, "eval", keys.eval);
  PreparedData p;
  p.info = DataInfo{{keys.context}, keys.vocab_size, keys.vocab_size};
  p.load = [train, eval] {
    return DataSplits{open_token_shards(train),
                      eval.paths.empty() ? nullptr : open_token_shards(eval)};
  };
  return p;
}

}  // namespace

DataRegistry::DataRegistry() : Registry("data set") {
  add("fashion-mnist", "Zalando's Fashion-MNIST, from its idx files", prepare_fashion_mnist,
      fashion_mnist_schema().rows());
  add("synthetic", "class prototypes plus Gaussian noise, for tests and benchmarks",
      prepare_synthetic, synthetic_schema().rows());
  add("text-classes",
      "sentence classification over text files, one example per sentence; inputs "
      "`[max_length]` token ids",
      prepare_text_classes<TextClassesOptions>, text_classes_schema<TextClassesOptions>().rows());
  add("fortunes-langid",
      "`text-classes` whose classes default to German, Spanish, Italian and Brazilian "
      "Portuguese from Debian's `fortunes-de`, `fortunes-es`, `fortunes-it` and `fortunes-br`",
      prepare_text_classes<FortunesLangidOptions>,
      text_classes_schema<FortunesLangidOptions>().rows());
  add("text-lm", "next-byte prediction over text files; inputs and targets `[context]`",
      prepare_text_lm<TextLmOptions>, text_lm_schema<TextLmOptions>().rows());
  add("fortunes-lm", "`text-lm` over the English prose files of Debian's `fortunes` package",
      prepare_text_lm<FortunesLmOptions>, text_lm_schema<FortunesLmOptions>().rows());
  add("token-shards",
      "next-token prediction over pre-tokenized shards (llm.c's or raw token files), read "
      "from disk as examples are needed; inputs and targets `[context]`",
      prepare_token_shards, token_shards_schema().rows());
  register_image_sets(*this);
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
