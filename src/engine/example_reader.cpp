#include "engine/example_reader.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

namespace vflow::engine {

void ExampleReader::set_threads(int64_t threads) {
  if (threads == this->threads()) return;
  threads_ = threads > 1 ? std::make_unique<data::DataThreads>(static_cast<int>(threads)) : nullptr;
}

int64_t ExampleReader::replacement(const data::Dataset& data, int64_t bad,
                                   const data::ReadContext& context) const {
  const int64_t n = data.size();
  for (int64_t step = 1; step < n; ++step) {
    const int64_t k = (bad + step) % n;
    try {
      data.read(torch::tensor({k}, torch::kInt64), data::ReadContext{context.seed, context.epoch});
      return k;
    } catch (const data::CorruptExample&) {
    }
  }
  throw DataError(fmt::format("every one of the data set's {} examples is corrupt", n));
}

data::Batch ExampleReader::read(const data::Dataset& data, const torch::Tensor& indices,
                                int64_t epoch) const {
  const data::ReadContext context{seed_, epoch, threads_.get()};
  torch::Tensor idx = indices;
  while (true) {
    try {
      return data.read(idx, context);
    } catch (const data::CorruptExample& e) {
      if (on_corrupt_ == OnCorrupt::kFail) throw;
      const int64_t bad = e.example();
      const int64_t k = replacement(data, bad, context);
      const auto hits = idx.eq(bad);
      const int64_t count = hits.sum().item<int64_t>();
      if (count == 0) throw;  // the data set named an example it was not asked for
      idx = torch::where(hits, torch::full_like(idx, k), idx);
      const int64_t total = replaced_.fetch_add(count) + count;
      spdlog::warn("{}; example {} takes its place (data.on_corrupt: skip; {} replaced so far)",
                   e.what(), k, total);
    }
  }
}

}  // namespace vflow::engine
