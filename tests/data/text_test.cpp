// Text corpora: the reader, the byte tokenizer, the two tasks, and Debian's
// fortune packages as real data.
#include "vflow/data/text.h"

#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <set>

#include "support.h"
#include "vflow/core/error.h"

using Catch::Matchers::Contains;
using vflow::data::ByteTokenizer;
using vflow::testing::TempDir;
using vflow::testing::write_file;

namespace {

std::string sentence_of(const torch::Tensor& ids) {
  return ByteTokenizer::decode(
      std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel()));
}

}  // namespace

TEST_CASE("text files are read as fortune entries or as lines", "[unit][text]") {
  TempDir dir;
  write_file(dir.file("fortunes"),
             "First entry\nspans two lines.\n%\nSecond one.\n%\n%\nThird.  \n");
  write_file(dir.file("lines.txt"), "one line\n\n  \nanother line\n");
  CHECK(vflow::data::read_text_entries(dir.file("fortunes")) ==
        std::vector<std::string>{"First entry\nspans two lines.", "Second one.", "Third."});
  CHECK(vflow::data::read_text_entries(dir.file("lines.txt")) ==
        std::vector<std::string>{"one line", "another line"});

  write_file(dir.file("binary"), std::string("text\0more", 9));
  CHECK_THROWS_WITH(vflow::data::read_text_entries(dir.file("binary")),
                    Contains("binary: byte 4 is NUL: not a text file"));
  CHECK_THROWS_AS(vflow::data::read_text_entries(dir.file("missing")), vflow::DataError);
  CHECK_THROWS_WITH(vflow::data::expand_text_paths({dir.file("missing")}),
                    Contains("missing: no such text file or directory"));

  // Directories: their files in name order, without fortune's index files.
  write_file(dir.file("fortunes.dat"), std::string("\0\0\0\2", 4));
  const auto files = vflow::data::expand_text_paths({dir.path()});
  CHECK(files ==
        std::vector<std::string>{dir.file("binary"), dir.file("fortunes"), dir.file("lines.txt")});
}

TEST_CASE("entries split into sentences and bytes into tokens", "[unit][text]") {
  CHECK(vflow::data::split_sentences("Hello there.  How are\n you? Fine!", 1) ==
        std::vector<std::string>{"Hello there.", "How are you?", "Fine!"});
  CHECK(vflow::data::split_sentences("Short. A longer sentence here.", 10) ==
        std::vector<std::string>{"A longer sentence here."});
  CHECK(vflow::data::split_sentences("3.14 is pi", 1) == std::vector<std::string>{"3.14 is pi"});
  CHECK(ByteTokenizer::id('a') == ByteTokenizer::kFirstByte + 97);
  CHECK(ByteTokenizer::decode({ByteTokenizer::kStart, ByteTokenizer::id('h'),
                               ByteTokenizer::id(0xc3), ByteTokenizer::id(0xa4),
                               ByteTokenizer::kEnd, ByteTokenizer::kPad}) == "h\xc3\xa4");
}

TEST_CASE("sentence classification: balanced classes, disjoint splits, fixed length",
          "[unit][text]") {
  TempDir dir;
  std::string a, b;
  for (int i = 0; i < 60; ++i) a += "Sentence number " + std::to_string(i) + " of class a.\n";
  for (int i = 0; i < 30; ++i) b += "Class b has its own sentence " + std::to_string(i) + ".\n";
  a += "Sentence number 0 of class a.\n";  // a duplicate: kept once
  write_file(dir.file("a.txt"), a);
  write_file(dir.file("b.txt"), b);
  vflow::data::TextClassesOptions o;
  o.classes = {{"a", {dir.file("a.txt")}}, {"b", {dir.file("b.txt")}}};
  o.max_length = 40;
  o.min_bytes = 5;
  o.test_every = 5;
  const auto splits = vflow::data::load_text_classes(o);
  const auto info = splits.train->info();
  CHECK(info.input_shape == std::vector<int64_t>{40});
  CHECK(info.num_classes == 2);
  CHECK(info.vocab_size == ByteTokenizer::kVocabSize);
  auto* train = dynamic_cast<vflow::data::TensorDataset*>(splits.train.get());
  auto* test = dynamic_cast<vflow::data::TensorDataset*>(splits.test.get());
  REQUIRE(train);
  REQUIRE(test);
  // Balanced: as many of each class as the smaller one has, interleaved a, b, a, b...
  const auto counts = torch::bincount(train->targets());
  CHECK(counts[0].item<int64_t>() == counts[1].item<int64_t>());
  CHECK(train->targets()[0].item<int64_t>() == 0);
  CHECK(train->targets()[1].item<int64_t>() == 1);
  std::set<std::string> train_text, test_text;
  for (int64_t i = 0; i < train->size(); ++i) {
    const auto ids = train->inputs()[i];
    CHECK(ids[0].item<int64_t>() == ByteTokenizer::kStart);
    train_text.insert(sentence_of(ids));
  }
  for (int64_t i = 0; i < test->size(); ++i) test_text.insert(sentence_of(test->inputs()[i]));
  CHECK(static_cast<int64_t>(train_text.size()) == train->size());  // no duplicates
  for (const auto& t : test_text) CHECK(train_text.count(t) == 0);  // disjoint splits
  // [start] bytes [end] padding.
  const auto first = train->inputs()[0];
  const auto bytes = static_cast<int64_t>(sentence_of(first).size());
  CHECK(first[1 + bytes].item<int64_t>() == ByteTokenizer::kEnd);
  CHECK(first.slice(0, 2 + bytes).eq(ByteTokenizer::kPad).all().item<bool>());
  // A sentence longer than max_length is cut and still ends with [end].
  o.max_length = 8;
  const auto cut =
      dynamic_cast<vflow::data::TensorDataset&>(*vflow::data::load_text_classes(o).train);
  CHECK(sentence_of(cut.inputs()[0]).size() == 6);
  CHECK(cut.inputs()[0][7].item<int64_t>() == ByteTokenizer::kEnd);

  o.classes.push_back({"empty", {dir.file("a.txt")}});  // all its sentences seen before
  CHECK_THROWS_WITH(vflow::data::load_text_classes(o), Contains("text class 'empty'"));
}

TEST_CASE("language modelling windows predict the next byte", "[unit][text]") {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 200; ++i) text += "line " + std::to_string(i) + "\n";
  write_file(dir.file("corpus.txt"), text);
  vflow::data::TextLmOptions o;
  o.paths = {dir.file("corpus.txt")};
  o.context = 16;
  o.test_every = 4;
  const auto splits = vflow::data::load_text_lm(o);
  auto* train = dynamic_cast<vflow::data::TensorDataset*>(splits.train.get());
  REQUIRE(train);
  REQUIRE(splits.test);
  const auto windows = (static_cast<int64_t>(text.size()) - 1) / 16;
  CHECK(train->size() + splits.test->size() == windows);
  CHECK(splits.test->size() == windows / 4);
  CHECK(train->targets().sizes() == torch::IntArrayRef({train->size(), 16}));
  // Targets are the inputs shifted by one byte; window 0 starts the text.
  CHECK(torch::equal(train->inputs()[0].slice(0, 1, 16), train->targets()[0].slice(0, 0, 15)));
  CHECK(sentence_of(train->inputs()[0]) == text.substr(0, 16));
  CHECK(train->info().num_classes == ByteTokenizer::kVocabSize);
}

TEST_CASE("The Italian fortunes are found in Debian 12's and Debian 13's layouts", "[unit][text]") {
  auto italian = [](const std::string& root) {
    for (const auto& [language, paths] : vflow::data::fortunes_language_classes(root)) {
      if (language == "it") return paths;
    }
    return std::vector<std::string>{};
  };
  // Debian 12: an it/ directory (the top-level names link into it).
  TempDir debian12;
  std::filesystem::create_directories(debian12.file("it"));
  vflow::testing::write_file(debian12.file("it/formiche"), "Una\n%\nDue\n%\n");
  CHECK(italian(debian12.path()) == std::vector<std::string>{debian12.file("it")});
  // Debian 13: the Italian files at the top level, beside English ones.
  TempDir debian13;
  for (const char* name : {"zuse", "formiche", "computers", "art"}) {
    vflow::testing::write_file(debian13.file(name), "Una\n%\nDue\n%\n");
  }
  CHECK(italian(debian13.path()) ==
        std::vector<std::string>{debian13.file("formiche"), debian13.file("zuse")});
  // Neither: the error names Debian 12's place.
  TempDir none;
  vflow::data::TextClassesOptions langid;
  langid.classes = vflow::data::fortunes_language_classes(none.path());
  CHECK(italian(none.path()) == std::vector<std::string>{none.file("it")});
  CHECK_THROWS_WITH(vflow::data::load_text_classes(langid),
                    Catch::Contains("no such text file or directory"));
}

TEST_CASE("Debian's fortune packages give the language-ID and language-model tasks",
          "[integration][text]") {
  vflow::data::TextClassesOptions langid;
  langid.classes = vflow::data::fortunes_language_classes(vflow::data::kFortunesRoot);
  const auto splits = vflow::data::load_text_classes(langid);
  const auto counts =
      torch::bincount(dynamic_cast<vflow::data::TensorDataset&>(*splits.train).targets(), {}, 4);
  INFO(counts);
  CHECK(splits.train->size() > 4 * 1000);
  CHECK(counts.min().item<int64_t>() == counts.max().item<int64_t>());
  CHECK(splits.test->size() > 4 * 100);

  vflow::data::TextLmOptions lm;
  lm.paths = vflow::data::fortunes_english_files(vflow::data::kFortunesRoot);
  const auto text = vflow::data::load_text_lm(lm);
  CHECK(text.train->size() > 10000);
}
