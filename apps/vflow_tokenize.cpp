// vflow-tokenize: text files to token shards through a SentencePiece model, for the
// token-shards data set (docs/workloads.md).
//
//   vflow-tokenize train --vocab-size 4000 --model fortunes.model FILES...
//   vflow-tokenize encode --model fortunes.model --out shards/ FILES...
#include <fmt/format.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "command_line.h"
#include "vflow/core/error.h"
#include "vflow/data/text_files.h"
#include "vflow/data/token_files.h"

namespace {

namespace fs = std::filesystem;

/// Every entry of the text files under `paths` (files, or directories' files), in order:
/// fortune entries, or non-empty lines (data::read_text_entries).
std::vector<std::string> read_entries(const std::vector<std::string>& paths) {
  std::vector<std::string> entries;
  for (const auto& file : vflow::data::expand_text_paths(paths)) {
    auto more = vflow::data::read_text_entries(file);
    std::cerr << fmt::format("[tokenize] {}: {} entries\n", file, more.size());
    entries.insert(entries.end(), std::make_move_iterator(more.begin()),
                   std::make_move_iterator(more.end()));
  }
  if (entries.empty()) throw vflow::DataError("the files hold no text");
  return entries;
}

/// The entries, one a sentence, for SentencePiece's trainer.
class Entries final : public sentencepiece::SentenceIterator {
 public:
  explicit Entries(const std::vector<std::string>& entries) : entries_(entries) {}
  bool done() const override { return at_ >= entries_.size(); }
  void Next() override { ++at_; }
  const std::string& value() const override { return entries_[at_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& entries_;
  size_t at_ = 0;
};

/// "x.model" -> "x": SentencePiece adds ".model" and ".vocab" to its prefix.
std::string model_prefix(const std::string& model) {
  const std::string suffix = ".model";
  if (model.size() <= suffix.size() ||
      model.compare(model.size() - suffix.size(), suffix.size(), suffix) != 0) {
    throw vflow::SpecError("--model: '" + model + "' does not end in .model");
  }
  return model.substr(0, model.size() - suffix.size());
}

int train(const std::vector<std::string>& paths, const std::string& model, int vocab_size,
          const std::string& type, int threads) {
  const auto entries = read_entries(paths);
  // The text as it is (identity normalisation, whitespace kept), every character of it in
  // the vocabulary, the entries in their order: the model is a function of the files.
  const std::unordered_map<std::string, std::string> options{
      {"model_prefix", model_prefix(model)},
      {"vocab_size", std::to_string(vocab_size)},
      {"model_type", type},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"character_coverage", "1.0"},
      {"max_sentence_length", "65536"},
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"num_threads", std::to_string(threads)},
      {"minloglevel", "1"},
  };
  Entries iterator(entries);
  std::cerr << fmt::format("[tokenize] training a {} model of {} pieces on {} entries\n", type,
                           vocab_size, entries.size());
  const auto status = sentencepiece::SentencePieceTrainer::Train(options, &iterator);
  if (!status.ok()) throw vflow::SpecError("SentencePiece cannot train: " + status.ToString());
  std::cout << fmt::format("{}: a {} model of {} pieces\n", model, type, vocab_size);
  return vflow::kExitOk;
}

/// Collects the tokens of one split and writes them as numbered shards.
class ShardWriter {
 public:
  ShardWriter(std::string stem, vflow::data::TokenFormat format, size_t shard_tokens)
      : stem_(std::move(stem)), format_(format), shard_tokens_(shard_tokens) {}

  void add(const std::vector<int>& ids, int end) {
    for (const int id : ids) tokens_.push_back(static_cast<uint32_t>(id));
    if (end >= 0) tokens_.push_back(static_cast<uint32_t>(end));
    if (tokens_.size() >= shard_tokens_) flush();
  }
  void flush() {
    if (tokens_.empty()) return;
    const std::string path = fmt::format("{}_{:06d}.bin", stem_, shards_++);
    vflow::data::write_token_shard(path, tokens_, format_);
    std::cerr << fmt::format("[tokenize] {}: {} tokens\n", path, tokens_.size());
    total_ += tokens_.size();
    tokens_.clear();
  }
  size_t total() const { return total_; }
  int shards() const { return shards_; }

 private:
  std::string stem_;
  vflow::data::TokenFormat format_;
  size_t shard_tokens_;
  std::vector<uint32_t> tokens_;
  size_t total_ = 0;
  int shards_ = 0;
};

int encode(const std::vector<std::string>& paths, const std::string& model, const std::string& out,
           size_t shard_tokens, int eval_every) {
  sentencepiece::SentencePieceProcessor sp;
  if (const auto status = sp.Load(model); !status.ok()) {
    throw vflow::SpecError("--model: " + model + ": " + status.ToString());
  }
  const auto entries = read_entries(paths);
  const int vocab = sp.GetPieceSize();
  const auto format =
      vocab <= 65536 ? vflow::data::TokenFormat::kLlmc : vflow::data::TokenFormat::kUint32;
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) throw vflow::Error(fmt::format("{}: cannot create: {}", out, ec.message()));
  ShardWriter train(out + "/train", format, shard_tokens);
  ShardWriter eval(out + "/eval", format, shard_tokens);
  std::vector<int> ids;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (const auto status = sp.Encode(entries[i], &ids); !status.ok()) {
      throw vflow::DataError(fmt::format("entry {}: {}", i, status.ToString()));
    }
    // Each entry ends with the end-of-text id, so a window that spans two entries sees
    // where one ends; every eval_every-th entry is held out for evaluation.
    const bool held_out = eval_every > 0 && i % static_cast<size_t>(eval_every) ==
                                                static_cast<size_t>(eval_every - 1);
    (held_out ? eval : train).add(ids, sp.eos_id());
  }
  train.flush();
  eval.flush();
  std::cout << fmt::format(
      "{} training tokens in {} shard(s), {} evaluation tokens in {}; vocabulary {}\n"
      "in a job spec:\n  data:\n    name: token-shards\n    options: {{train: {}/train_*.bin{}, "
      "format: {}, vocab_size: {}}}\n",
      train.total(), train.shards(), eval.total(), eval.shards(), vocab, out,
      eval.shards() > 0 ? fmt::format(", eval: {}/eval_*.bin", out) : "",
      vflow::data::to_string(format), vocab);
  return vflow::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"vflow-tokenize: text files to token shards through a SentencePiece model"};
  app.require_subcommand(1);
  std::vector<std::string> paths;
  std::string model;

  auto* train_cmd = app.add_subcommand("train", "train a SentencePiece model on the files");
  int vocab_size = 4000;
  std::string type = "unigram";
  int threads = 1;
  train_cmd->add_option("--model", model, "the model file to write (NAME.model, and NAME.vocab)")
      ->required();
  train_cmd->add_option("--vocab-size", vocab_size, "pieces in the vocabulary")
      ->check(vflow::apps::at_least(2));
  train_cmd->add_option("--type", type, "unigram or bpe")->check(CLI::IsMember({"unigram", "bpe"}));
  train_cmd
      ->add_option("--threads", threads,
                   "trainer threads (1, the default, gives the same model every time)")
      ->check(vflow::apps::at_least(1));
  train_cmd->add_option("files", paths, "text files or directories (fortune files too)")
      ->required();

  auto* encode_cmd = app.add_subcommand("encode", "write the files' tokens as shards");
  std::string out;
  size_t shard_tokens = 100'000'000;
  int eval_every = 20;
  encode_cmd->add_option("--model", model, "a SentencePiece model (vflow-tokenize train)")
      ->required();
  encode_cmd->add_option("--out", out, "the folder of the shards (train_*.bin, eval_*.bin)")
      ->required();
  encode_cmd->add_option("--shard-tokens", shard_tokens, "tokens per shard at most, about")
      ->check(vflow::apps::at_least(1));
  encode_cmd
      ->add_option("--eval-every", eval_every,
                   "every k-th entry goes to the evaluation shards; 0 = none")
      ->check(vflow::apps::at_least(0));
  encode_cmd->add_option("files", paths, "text files or directories (fortune files too)")
      ->required();

  if (const int code = vflow::apps::parse_command_line(app, argc, argv); code >= 0) return code;
  return vflow::apps::run_reporting_errors([&]() -> int {
    if (*train_cmd) return train(paths, model, vocab_size, type, threads);
    return encode(paths, model, out, shard_tokens, eval_every);
  });
}
