// Text corpora as training data: a byte-level tokenizer, a reader for
// line-based text files (fortune files included), and two tasks built on them:
// sentence classification (e.g. language identification) and next-byte
// language modelling.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "vflow/data/dataset.h"
#include "vflow/data/text_files.h"

namespace vflow::data {

/// Byte-level tokens: every UTF-8 byte is one token, so any text is representable
/// and nothing needs downloading. Ids 0..2 are special; byte b is id 3 + b.
struct ByteTokenizer {
  static constexpr int64_t kPad = 0;    ///< fills a sequence up to its fixed length
  static constexpr int64_t kStart = 1;  ///< first token of a classified sequence ([CLS])
  static constexpr int64_t kEnd = 2;    ///< follows the last byte of a classified sequence
  static constexpr int64_t kFirstByte = 3;
  static constexpr int64_t kVocabSize = kFirstByte + 256;

  static int64_t id(unsigned char byte) { return kFirstByte + byte; }
  /// Bytes of the byte tokens; special tokens are dropped.
  static std::string decode(const std::vector<int64_t>& ids);
};

/// Default location of Debian's fortune packages.
inline constexpr const char* kFortunesRoot = "/usr/share/games/fortunes";

/// One class of sentences: its name and its files or directories.
struct TextClass {
  std::string name;
  std::vector<std::string> paths;
};

/// Sentence classification: each class is a list of files or directories.
struct TextClassesOptions {
  std::vector<TextClass> classes;
  int64_t max_length = 64;  ///< tokens per example: [start] bytes... [end] padding
  int64_t min_bytes = 24;   ///< shorter sentences are dropped
  /// Training sentences per class; 0 = as many as the smallest class has (balanced).
  int64_t per_class = 0;
  int64_t test_every = 10;  ///< about one sentence in k (by a hash of its text) is held out
};

/// Loads both splits: inputs int64 [n, max_length] token ids, targets the class index.
/// Identical sentences are kept once (so none is in both splits). A class without
/// sentences is a DataError naming it.
DataSplits load_text_classes(const TextClassesOptions& options);

/// Next-byte language modelling over the concatenated entries of `paths`.
struct TextLmOptions {
  std::vector<std::string> paths;
  int64_t context = 64;     ///< tokens per example; the target is the input shifted by one
  int64_t test_every = 20;  ///< every k-th window is held out
};

/// Loads both splits: inputs and targets int64 [n, context] (targets are the next bytes).
DataSplits load_text_lm(const TextLmOptions& options);

/// The language-identification preset: sentences of Debian's fortunes-de, fortunes-es,
/// fortunes-it and fortunes-br (Brazilian Portuguese) packages under `root`.
std::vector<TextClass> fortunes_language_classes(const std::string& root);
/// The English fortune files of Debian's fortunes package under `root`.
std::vector<std::string> fortunes_english_files(const std::string& root);

}  // namespace vflow::data
