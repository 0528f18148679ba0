// The token-shards data set's read rate and resident memory, at one corpus size and at
// `--scale` times it: windows (examples) per second read in a shuffled order, as training
// draws them, and the reading process's peak resident memory. Each measurement runs in a
// process of its own (this program with --measure), so that its peak is its own; the sizes
// alternate over the repeats so that drift in the machine's speed affects both alike.
//   token_shards [--mib 64] [--scale 10] [--context 1024] [--batch 64] [--batches 2000]
//                [--repeats 5] [--dir DIR]
#include "vflow/data/token_shards.h"

#include <fmt/format.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "peak_memory.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

/// `count` shards of `mib` MiB each of raw uint16 tokens (below 50257, GPT-2's vocabulary).
void make_shards(const std::string& dir, int count, int64_t mib) {
  fs::create_directories(dir);
  std::vector<uint16_t> chunk(1 << 20);
  std::mt19937 random(7);
  for (int s = 0; s < count; ++s) {
    const std::string path = fmt::format("{}/shard_{:03d}.bin", dir, s);
    if (fs::exists(path) && static_cast<int64_t>(fs::file_size(path)) == (mib << 20)) continue;
    std::ofstream out(path, std::ios::binary);
    for (int64_t done = 0; done < (mib << 20); done += 2 * static_cast<int64_t>(chunk.size())) {
      for (auto& t : chunk) t = static_cast<uint16_t>(random() % 50257);
      out.write(reinterpret_cast<const char*>(chunk.data()),
                static_cast<std::streamsize>(chunk.size() * 2));
    }
  }
}

/// Reads `batches` batches of `batch` windows in a shuffled order; prints
/// "<windows/s> <peak KiB> <windows in the corpus>".
int measure(const std::string& dir, int count, int64_t context, int64_t batch, int64_t batches) {
  torch::set_num_threads(1);
  vflow::data::TokenShardsOptions o;
  for (int s = 0; s < count; ++s) o.paths.push_back(fmt::format("{}/shard_{:03d}.bin", dir, s));
  o.format = vflow::data::TokenFormat::kUint16;
  o.context = context;
  o.vocab_size = 50257;
  const auto data = vflow::data::open_token_shards(o);
  const auto order = torch::randperm(data->size(), torch::kInt64);
  const int64_t n = std::min(batches, data->size() / batch);
  int64_t sink = 0;
  const auto start = Clock::now();
  for (int64_t b = 0; b < n; ++b) {
    const auto got = data->get(order.narrow(0, b * batch, batch));
    sink += got.target[0][0].item<int64_t>();
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("%.1f %lld %lld %lld\n", static_cast<double>(n * batch) / seconds,
              static_cast<long long>(vflow::bench::peak_resident_kib()),
              static_cast<long long>(data->size()), static_cast<long long>(sink % 2));
  return 0;
}

struct Sample {
  double windows_per_s = 0;
  int64_t peak_kib = 0;
  int64_t windows = 0;
};

Sample run_child(const std::string& self, const std::string& dir, int count, int64_t context,
                 int64_t batch, int64_t batches) {
  const std::string command =
      fmt::format("'{}' --measure --dir '{}' --shards {} --context {} --batch {} --batches {}",
                  self, dir, count, context, batch, batches);
  FILE* pipe = ::popen(command.c_str(), "r");
  Sample s;
  long long peak = 0, windows = 0, sink = 0;
  if (!pipe ||
      std::fscanf(pipe, "%lf %lld %lld %lld", &s.windows_per_s, &peak, &windows, &sink) != 4) {
    std::fprintf(stderr, "the measurement failed: %s\n", command.c_str());
    std::exit(1);
  }
  ::pclose(pipe);
  s.peak_kib = peak;
  s.windows = windows;
  return s;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"token-shards read rate and resident memory at two corpus sizes"};
  int64_t mib = 64;
  int scale = 10;
  int64_t context = 1024;
  int64_t batch = 64;
  int64_t batches = 2000;
  int repeats = 5;
  std::string dir = "/var/tmp/vflow-token-shards-bench";
  bool measure_only = false;
  int shards = 1;
  app.add_option("--mib", mib, "MiB of tokens at 1x (one shard)");
  app.add_option("--scale", scale, "the larger corpus: this many such shards");
  app.add_option("--context", context, "tokens per example");
  app.add_option("--batch", batch, "windows per read");
  app.add_option("--batches", batches, "reads per measurement");
  app.add_option("--repeats", repeats, "measurements per size, alternating");
  app.add_option("--dir", dir, "where the shards are made (kept for the next run)");
  app.add_flag("--measure", measure_only)->group("");
  app.add_option("--shards", shards)->group("");
  CLI11_PARSE(app, argc, argv);
  if (measure_only) return measure(dir, shards, context, batch, batches);

  std::printf("making %d shards of %lld MiB in %s\n", scale, static_cast<long long>(mib),
              dir.c_str());
  make_shards(dir, scale, mib);
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  std::vector<double> rate[2], peak[2];
  int64_t windows[2] = {0, 0};
  for (int r = 0; r < repeats; ++r) {
    for (int k = 0; k < 2; ++k) {
      const int count = k == 0 ? 1 : scale;
      const Sample s = run_child(self, dir, count, context, batch, batches);
      rate[k].push_back(s.windows_per_s);
      peak[k].push_back(static_cast<double>(s.peak_kib) / 1024);
      windows[k] = s.windows;
      std::printf("repeat %d, %dx: %.0f windows/s, peak RSS %.1f MiB\n", r + 1, k == 0 ? 1 : scale,
                  s.windows_per_s, static_cast<double>(s.peak_kib) / 1024);
    }
  }
  std::printf("\n| corpus | windows | windows/s (median, min-max) | tokens/s | peak RSS MiB |\n");
  std::printf("|---|---|---|---|---|\n");
  for (int k = 0; k < 2; ++k) {
    const auto [lo, hi] = std::minmax_element(rate[k].begin(), rate[k].end());
    std::printf("| %lld MiB | %lld | %.0f (%.0f-%.0f) | %.2e | %.1f (%.1f-%.1f) |\n",
                static_cast<long long>(mib * (k == 0 ? 1 : scale)),
                static_cast<long long>(windows[k]), median(rate[k]), *lo, *hi,
                median(rate[k]) * static_cast<double>(context), median(peak[k]),
                *std::min_element(peak[k].begin(), peak[k].end()),
                *std::max_element(peak[k].begin(), peak[k].end()));
  }
  return 0;
}
