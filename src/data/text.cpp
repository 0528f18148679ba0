#include "vflow/data/text.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_set>

#include "core/input_file.h"
#include "vflow/core/error.h"

namespace vflow::data {

namespace fs = std::filesystem;

std::string ByteTokenizer::decode(const std::vector<int64_t>& ids) {
  std::string out;
  for (int64_t id : ids) {
    if (id >= kFirstByte && id < kVocabSize) out.push_back(static_cast<char>(id - kFirstByte));
  }
  return out;
}

namespace {

// FNV-1a: a stable hash of a sentence, so the split and the sampling order are the
// same on every machine and standard library.
uint64_t text_hash(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

torch::Tensor encode_sentence(const std::string& sentence, int64_t length) {
  auto ids = torch::full({length}, ByteTokenizer::kPad, torch::kInt64);
  auto* p = ids.data_ptr<int64_t>();
  p[0] = ByteTokenizer::kStart;
  const int64_t bytes = std::min<int64_t>(static_cast<int64_t>(sentence.size()), length - 2);
  for (int64_t i = 0; i < bytes; ++i) p[1 + i] = ByteTokenizer::id(sentence[i]);
  p[1 + bytes] = ByteTokenizer::kEnd;
  return ids;
}

std::shared_ptr<TensorDataset> sentence_set(
    const std::vector<std::pair<std::string, int64_t>>& examples, int64_t length, int64_t classes) {
  auto inputs = torch::empty({static_cast<int64_t>(examples.size()), length}, torch::kInt64);
  auto targets = torch::empty({static_cast<int64_t>(examples.size())}, torch::kInt64);
  for (size_t i = 0; i < examples.size(); ++i) {
    inputs[static_cast<int64_t>(i)].copy_(encode_sentence(examples[i].first, length));
    targets[static_cast<int64_t>(i)] = examples[i].second;
  }
  return std::make_shared<TensorDataset>(inputs, targets, classes, ByteTokenizer::kVocabSize);
}

}  // namespace

DataSplits load_text_classes(const TextClassesOptions& options) {
  const int64_t classes = static_cast<int64_t>(options.classes.size());
  std::unordered_set<std::string> seen;
  // Per class: its sentences, ordered by hash (a fixed pseudo-random order).
  std::vector<std::vector<std::pair<uint64_t, std::string>>> train(options.classes.size());
  std::vector<std::vector<std::pair<uint64_t, std::string>>> test(options.classes.size());
  for (size_t c = 0; c < options.classes.size(); ++c) {
    for (const auto& file : expand_text_paths(options.classes[c].paths)) {
      for (const auto& entry : read_text_entries(file)) {
        for (auto& s : split_sentences(entry, static_cast<size_t>(options.min_bytes))) {
          if (!seen.insert(s).second) continue;
          const uint64_t h = text_hash(s);
          auto& split = h % static_cast<uint64_t>(options.test_every) == 0 ? test[c] : train[c];
          split.emplace_back(h, std::move(s));
        }
      }
    }
    if (train[c].empty()) {
      throw DataError(fmt::format("text class '{}': no sentence of at least {} bytes in its files",
                                  options.classes[c].name, options.min_bytes));
    }
    std::sort(train[c].begin(), train[c].end());
    std::sort(test[c].begin(), test[c].end());
  }
  size_t per_class = static_cast<size_t>(options.per_class);
  if (per_class == 0) {
    per_class = train[0].size();
    for (const auto& t : train) per_class = std::min(per_class, t.size());
  }
  const size_t test_per_class = std::max<size_t>(
      1, per_class / static_cast<size_t>(std::max<int64_t>(1, options.test_every - 1)));
  // Interleave the classes so that a prefix of the set is balanced too.
  std::vector<std::pair<std::string, int64_t>> train_examples, test_examples;
  for (size_t i = 0; i < per_class; ++i) {
    for (int64_t c = 0; c < classes; ++c) {
      if (i < train[c].size()) train_examples.emplace_back(train[c][i].second, c);
    }
  }
  for (size_t i = 0; i < test_per_class; ++i) {
    for (int64_t c = 0; c < classes; ++c) {
      if (i < test[c].size()) test_examples.emplace_back(test[c][i].second, c);
    }
  }
  return DataSplits{
      sentence_set(train_examples, options.max_length, classes),
      test_examples.empty() ? nullptr : sentence_set(test_examples, options.max_length, classes)};
}

DataSplits load_text_lm(const TextLmOptions& options) {
  std::string text;
  for (const auto& file : expand_text_paths(options.paths)) {
    for (const auto& entry : read_text_entries(file)) {
      text += entry;
      text += '\n';
    }
  }
  const int64_t window = options.context + 1;
  const int64_t windows = (static_cast<int64_t>(text.size()) - 1) / options.context;
  if (windows < 2) {
    throw DataError(fmt::format("text-lm: {} bytes of text are too few for {}-byte windows",
                                text.size(), options.context));
  }
  auto ids = torch::empty({static_cast<int64_t>(text.size())}, torch::kInt64);
  auto* p = ids.data_ptr<int64_t>();
  for (size_t i = 0; i < text.size(); ++i) p[i] = ByteTokenizer::id(text[i]);
  std::vector<torch::Tensor> train, test;
  for (int64_t k = 0; k < windows; ++k) {
    auto w = ids.narrow(0, k * options.context, window);
    (k % options.test_every == options.test_every - 1 ? test : train).push_back(w);
  }
  auto make = [&](const std::vector<torch::Tensor>& ws) -> std::shared_ptr<TensorDataset> {
    if (ws.empty()) return nullptr;
    auto all = torch::stack(ws);
    return std::make_shared<TensorDataset>(all.narrow(1, 0, options.context).contiguous(),
                                           all.narrow(1, 1, options.context).contiguous(),
                                           ByteTokenizer::kVocabSize, ByteTokenizer::kVocabSize);
  };
  return DataSplits{make(train), make(test)};
}

namespace {

/// Debian 12's fortunes-it installs its files in it/ (linked from the top level);
/// Debian 13's installs them at the top level only, beside the English ones.
std::vector<std::string> italian_fortunes(const fs::path& root) {
  std::error_code ec;
  if (fs::is_directory(root / "it", ec)) return {(root / "it").string()};
  static const char* const kNames[] = {"adams",    "banner",        "computer", "definizioni",
                                       "formiche", "italia",        "itatrek",  "jackfr",
                                       "leggi",    "lercio",        "luke",     "luttazzi",
                                       "norm",     "paolotedeschi", "salvo",    "zuse"};
  std::vector<std::string> out;
  for (const char* name : kNames) {
    if (fs::is_regular_file(root / name, ec)) out.push_back((root / name).string());
  }
  if (out.empty()) return {(root / "it").string()};  // the error names Debian 12's place
  return out;
}

}  // namespace

std::vector<TextClass> fortunes_language_classes(const std::string& root) {
  const fs::path r(root);
  return {{"de", {(r / "de").string()}},
          {"es", {(r / "es").string()}},
          {"it", italian_fortunes(r)},
          {"pt", {(r / "brasil").string()}}};
}

std::vector<std::string> fortunes_english_files(const std::string& root) {
  static const char* const kNames[] = {
      "art",       "computers",     "cookie",      "definitions", "disclaimer", "drugs",
      "education", "ethnic",        "food",        "goedel",      "humorists",  "kids",
      "law",       "linux",         "linuxcookie", "love",        "magic",      "medicine",
      "men-women", "miscellaneous", "news",        "people",      "pets",       "platitudes",
      "politics",  "pratchett",     "science",     "songs-poems", "sports",     "startrek",
      "tao",       "wisdom",        "work",        "zippy"};
  std::vector<std::string> out;
  for (const char* name : kNames) out.push_back((fs::path(root) / name).string());
  return out;
}

}  // namespace vflow::data
