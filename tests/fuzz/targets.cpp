// The fuzz targets (fuzz_target.h). Each names the parser it drives.
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <string>
#include <string_view>

#include "fuzz_target.h"
#include "job/control_records.h"
#include "vflow/core/spec_node.h"
#include "vflow/data/fashion_mnist.h"
#include "vflow/data/image_transforms.h"
#include "vflow/data/tar_index.h"
#include "vflow/data/text.h"
#include "vflow/data/token_shards.h"
#include "vflow/engine/job_spec.h"
#include "vflow/engine/run_job.h"
#include "vflow/engine/trainer.h"
#include "vflow/hetero/profile.h"
#include "vflow/scheduler/config.h"
#include "vflow/scheduler/live.h"
#include "vflow/scheduler/throughput.h"
#include "vflow/scheduler/trace.h"

namespace vflow::fuzz {
namespace {

/// vflow logs through spdlog; a fuzzer's output is its findings only.
const bool kQuiet = [] {
  spdlog::set_level(spdlog::level::err);
  return true;
}();

std::string text_of(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

/// The input split at lines that hold only `separator`.
std::vector<std::string> sections(const std::string& text, std::string_view separator) {
  std::vector<std::string> out(1);
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line == separator) {
      out.emplace_back();
    } else {
      out.back() += line + "\n";
    }
  }
  return out;
}

/// Job spec YAML, then optionally a line "--set" and one override per line: the same
/// path as `vflow-train job.yaml --set ...` (parse, override, validate with the model
/// and data factories, print the semantic part).
std::string job_spec(const uint8_t* data, size_t size) {
  const auto parts = sections(text_of(data, size), "--set");
  const std::string refusal = expect_clean_refusal([&] {
    SpecNode root = parse_yaml(parts[0], "fuzz.yaml");
    for (size_t i = 1; i < parts.size(); ++i) {
      std::istringstream lines(parts[i]);
      for (std::string line; std::getline(lines, line);) apply_override(root, line);
    }
    const auto spec = engine::parse_job_spec(root);
    (void)spec.semantic_yaml();
    (void)spec.model_digest();
    engine::validate(spec);
  });
  // Every error names the file or the override it is about.
  if (!refusal.empty() && refusal.rfind("fuzz.yaml", 0) != 0 && refusal.rfind("--set ", 0) != 0) {
    finding("an error that names neither the file nor the override: " + refusal);
  }
  return refusal;
}

/// An idx file (gzip-compressed or not) as Fashion-MNIST's reader takes it, read as
/// images (3 dimensions) and as labels (1).
std::string idx(const uint8_t* data, size_t size) {
  const MemoryFile file(data, size);
  const auto images = expect_clean_refusal(
      [&] { (void)data::read_idx_file(file.path(), 0x00000803); }, file.path());
  const auto labels = expect_clean_refusal(
      [&] { (void)data::read_idx_file(file.path(), 0x00000801); }, file.path());
  return images.empty() || labels.empty() ? "" : images;
}

/// A text file (fortune format or one entry per line) and its sentences.
std::string text(const uint8_t* data, size_t size) {
  const MemoryFile file(data, size);
  return expect_clean_refusal(
      [&] {
        for (const auto& entry : data::read_text_entries(file.path())) {
          (void)data::split_sentences(entry, 8);
        }
      },
      file.path());
}

/// An image file through the image data sets' decoding: its header, then the training
/// transforms (a random crop, a flip, normalize) to gray and to RGB at a DCT scale.
std::string image(const uint8_t* data, size_t size) {
  static const auto steps = [] {
    std::vector<data::Transform> t(3);
    t[0].kind = data::Transform::Kind::kRandomResizedCrop;
    t[0].height = t[0].width = 12;
    t[1].kind = data::Transform::Kind::kHorizontalFlip;
    t[2].kind = data::Transform::Kind::kNormalize;
    t[2].mean = {0.5};
    t[2].std = {0.25};
    return t;
  }();
  static const data::ImagePipeline gray(steps, 1), rgb(steps, 3);
  return expect_clean_refusal(
      [&] {
        const auto header = data::read_image_header(data, size, "image");
        // Larger images decode too, but slowly: the fuzzer's time goes to smaller ones.
        if (int64_t{header.width} * header.height > (1 << 18)) return;
        std::vector<float> out(static_cast<size_t>(rgb.out_size()));
        for (const auto* p : {&gray, &rgb}) {
          data::ExampleRandom random(1, 0, static_cast<int64_t>(size));
          p->run(data, size, "image", random, out.data());
        }
      },
      "image");
}

/// A tar shard as image-shards indexes it: its members, the WebDataset examples they
/// form, and each example's image decoded (the first 16).
std::string tar_shard(const uint8_t* data, size_t size) {
  const data::ReadAt read = [data, size](uint64_t at, size_t n, uint8_t* out) {
    const size_t got = at >= size ? 0 : static_cast<size_t>(std::min<uint64_t>(n, size - at));
    std::memcpy(out, data + at, got);
    return got;
  };
  std::vector<data::Transform> steps(1);
  steps[0].kind = data::Transform::Kind::kCenterCrop;
  steps[0].height = steps[0].width = 8;
  const data::ImagePipeline pipeline(steps, 3);
  return expect_clean_refusal(
      [&] {
        const auto members = data::index_tar(read, size, "shard.tar");
        const auto examples = data::webdataset_examples(members, read, 1000, "shard.tar");
        std::vector<float> out(static_cast<size_t>(pipeline.out_size()));
        for (size_t i = 0; i < examples.size() && i < 16; ++i) {
          const auto& m = examples[i].image;
          data::ExampleRandom random(0, 0, static_cast<int64_t>(i));
          const auto header =
              data::read_image_header(data + m.offset, m.size, "shard.tar: " + m.name);
          if (int64_t{header.width} * header.height > (1 << 18)) continue;
          pipeline.run(data + m.offset, m.size, "shard.tar: " + m.name, random, out.data());
        }
      },
      "shard.tar");
}

/// A token shard, opened in each format and read window by window (the first 256 windows):
/// accepted when one format takes it whole, else llm.c's refusal.
std::string token_shard(const uint8_t* data, size_t size) {
  const MemoryFile file(data, size);
  std::string llmc_refusal;
  bool accepted = false;
  for (const auto format :
       {data::TokenFormat::kLlmc, data::TokenFormat::kUint16, data::TokenFormat::kUint32}) {
    const auto refusal = expect_clean_refusal(
        [&] {
          data::TokenShardsOptions o;
          o.paths = {file.path()};
          o.format = format;
          o.context = 3;
          o.vocab_size = 50000;  // below the magic number's low half as uint16, 55432
          const auto shards = data::open_token_shards(o);
          const int64_t n = std::min<int64_t>(shards->size(), 256);
          for (int64_t k = 0; k < n; ++k) (void)shards->get(torch::tensor({k}, torch::kInt64));
        },
        file.path());
    if (format == data::TokenFormat::kLlmc) llmc_refusal = refusal;
    accepted = accepted || refusal.empty();
  }
  return accepted ? "" : llmc_refusal;
}

/// A device profile as vflow-plan reads it.
std::string profile(const uint8_t* data, size_t size) {
  const MemoryFile file(data, size);
  return expect_clean_refusal([&] { (void)hetero::load_profile(file.path()); }, file.path());
}

std::string gavel_trace(const uint8_t* data, size_t size) {
  std::istringstream in(text_of(data, size));
  return expect_clean_refusal([&] { (void)scheduler::read_gavel_trace(in, "t.tsv"); }, "t.tsv");
}

std::string philly_trace(const uint8_t* data, size_t size) {
  std::istringstream in(text_of(data, size));
  return expect_clean_refusal([&] { (void)scheduler::read_philly_trace(in, "p.csv", "resnet50"); },
                              "p.csv");
}

std::string throughput(const uint8_t* data, size_t size) {
  std::istringstream in(text_of(data, size));
  return expect_clean_refusal([&] { (void)scheduler::ThroughputTable::parse(in, "tp.tsv"); },
                              "tp.tsv");
}

std::string sched_config(const uint8_t* data, size_t size) {
  const MemoryFile file(data, size);
  return expect_clean_refusal(
      [&] {
        scheduler::SchedulerConfig config;
        scheduler::load_config(file.path(), config);
      },
      file.path());
}

/// A live-mode jobs file; its spec paths resolve against /proc/self/fd, so only "N" (the
/// file itself) names an existing file.
std::string sched_jobs(const uint8_t* data, size_t size) {
  const MemoryFile file(data, size);
  return expect_clean_refusal([&] { (void)scheduler::read_live_jobs(file.path()); }, file.path());
}

/// The job every checkpoint input is loaded into: small, so that a matching checkpoint
/// (the seed corpus holds one) is a few kilobytes.
const char* const kCheckpointJob = R"(
semantic:
  model: {name: mlp, options: {hidden: [4]}}
  data: {name: synthetic, options: {train_size: 16, test_size: 8, shape: [2], classes: 2}}
  global_batch: 4
  virtual_nodes: 2
  optimizer: {name: sgd, lr: 0.1, momentum: 0.9}
  steps: 4
  seed: 1
resources: {threads: 1}
output:
  logging: {progress: off, level: error}
  evaluation: {enabled: false}
)";

/// A checkpoint file as `vflow-train --resume` reads it (LibTorch's archive, then vflow's
/// format, semantic-text and fingerprint checks).
std::string checkpoint(const uint8_t* data, size_t size) {
  static const auto trainer = [] {
    return engine::make_trainer(engine::parse_job_spec(parse_yaml(kCheckpointJob, "fuzz")));
  }();
  const MemoryFile file(data, size);
  return expect_clean_refusal([&] { trainer->load_checkpoint(file.path()); }, file.path());
}

/// Values read from a job's store: the first byte picks the record.
std::string control_records(const uint8_t* data, size_t size) {
  if (size == 0) return "";
  const std::string value = text_of(data + 1, size - 1);
  return expect_clean_refusal([&] {
    namespace r = job::records;
    switch (data[0] % 6) {
      case 0:
        (void)r::decode_int(value, "k");
        break;
      case 1:
        (void)r::decode_limits(value, "k");
        break;
      case 2: {
        const auto g = r::decode_generation(1, value, "k");
        if (r::decode_generation(1, r::encode_generation(g), "k").members != g.members) {
          finding("a generation record does not survive encode/decode");
        }
        (void)g.describe();
        break;
      }
      case 3:
        (void)r::decode_regroup_answer(value, "k");
        break;
      case 5: {
        // Times are written to 9 digits: after one round they stay as they are.
        const auto once =
            r::decode_profiled(r::encode_profiled(r::decode_profiled(value, "k")), "k");
        if (r::decode_profiled(r::encode_profiled(once), "k") != once) {
          finding("profiled times do not survive encode/decode");
        }
        break;
      }
      default: {
        std::vector<std::string> offers;
        std::istringstream in(value);
        for (std::string line; std::getline(in, line);) offers.push_back(line);
        (void)r::decode_regroup_answer(r::regroup_answer(offers), "k");
        break;
      }
    }
  });
}

}  // namespace

const std::vector<Target>& targets() {
  static const std::vector<Target> all = {
      {"job_spec", job_spec},
      {"idx", idx},
      {"text", text},
      {"token_shard", token_shard},
      {"image", image},
      {"tar_shard", tar_shard},
      {"profile", profile},
      {"gavel_trace", gavel_trace},
      {"philly_trace", philly_trace},
      {"throughput", throughput},
      {"sched_config", sched_config},
      {"sched_jobs", sched_jobs},
      {"checkpoint", checkpoint},
      {"control_records", control_records},
  };
  return all;
}

const Target* find_target(const std::string& name) {
  for (const auto& t : targets()) {
    if (name == t.name) return &t;
  }
  return nullptr;
}

}  // namespace vflow::fuzz
