// The exact split sum over real Gloo ranks (threads, loopback store): the dense int32
// parts and the listed int64 values add up to the plain int64 sum, whether the lists ride
// in the allreduce, need an all-gather, or a dense int64 sum.
#include "vflow/comm/split_sum.h"

#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <utility>

#include "support.h"
#include "vflow/comm/communicator.h"
#include "vflow/job/control_plane.h"

using vflow::comm::SplitSum;

namespace {

/// Rank r's values: small ones everywhere, and `listed` large ones at indices of its own
/// and shared with the other ranks.
torch::Tensor rank_values(int64_t n, int rank, int64_t listed, int world) {
  torch::manual_seed(100 + rank);
  const int64_t limit = SplitSum::dense_limit(world);
  auto v = torch::randint(-(limit - 1), limit, {n}, torch::kInt64);
  const auto where = torch::randperm(n, torch::kInt64).narrow(0, 0, listed);
  const auto big = torch::randint(int64_t{1} << 40, int64_t{1} << 58, {listed}, torch::kInt64);
  v.index_put_({where}, big * (rank % 2 == 0 ? 1 : -1));
  if (listed > 0) v[0] = int64_t{1} << 50;  // a large value at one index of every rank
  return v;
}

}  // namespace

TEST_CASE("the split sum over 3 ranks is the exact int64 sum", "[integration]") {
  constexpr int kRanks = 3;
  const int64_t n = 40000;
  // none listed; some, carried in the allreduce (capacity 16384 / 3 = 5461 a rank here);
  // beyond the capacity (all-gather); very many (dense int64 sum).
  const int64_t listed = GENERATE(as<int64_t>{}, 0, 40, 1500, 6000, 8000, 30000);
  // In one sum, or in parts as a reduction in buckets sums it: the part at offset 0,
  // with the lists, last.
  const bool in_parts = GENERATE(false, true);
  // With a reserve of 3000 (1000 a rank), 6000 listed values ride in the allreduce.
  const int64_t reserved = GENERATE(as<int64_t>{}, 0, 3000);
  CAPTURE(listed, in_parts, reserved);
  std::vector<torch::Tensor> values;
  auto expected = torch::zeros({n}, torch::kInt64);
  for (int r = 0; r < kRanks; ++r) {
    values.push_back(rank_values(n, r, listed, kRanks));
    expected.add_(values.back());
  }
  vflow::job::StoreHost coordinator("127.0.0.1", 0, std::chrono::seconds(10));
  std::vector<torch::Tensor> results(kRanks);
  const auto errors = vflow::testing::run_gloo_ranks(
      coordinator, kRanks,
      "s" + std::to_string(listed) + (in_parts ? "p" : "") + "r" + std::to_string(reserved),
      [&](int rank, vflow::comm::Communicator& comm) {
        SplitSum sum(n, torch::kCPU, reserved);
        const int64_t limit = SplitSum::dense_limit(kRanks);
        const auto& v = values[rank];
        const auto large = v.abs().ge(limit);
        auto dense = sum.dense(kRanks);
        dense.copy_(v.masked_fill(large, 0).to(torch::kInt32));
        const auto index = large.nonzero().view({-1});
        SplitSum::Listed listed_sum;
        if (in_parts) {
          for (const auto& [offset, count] :
               {std::pair<int64_t, int64_t>{30000, 10000}, {12345, 17655}, {0, 12345}}) {
            if (offset == 0) sum.list(rank, index, v.index_select(0, index));
            auto part = sum.carrier_part(offset, count);
            comm.allreduce_sum(part);
          }
          listed_sum = sum.merge(comm);
        } else {
          listed_sum = sum.reduce(comm, index, v.index_select(0, index));
        }
        auto total = dense.to(torch::kInt64);
        total.index_add_(0, listed_sum.index, listed_sum.value);
        results[rank] = total;
      });
  for (int rank = 0; rank < kRanks; ++rank) {
    CAPTURE(rank, errors[rank]);
    REQUIRE(errors[rank].empty());
    CHECK(torch::equal(results[rank], expected));
  }
}

TEST_CASE("the split sum's regions hold each rank's share of the reserve", "[unit]") {
  CHECK(SplitSum::capacity(40000, 3) == 5461);  // 16384 / 3
  CHECK(SplitSum::capacity(40000, 16) == 2048);
  CHECK(SplitSum::capacity(5824522, 2) == 11376);
  // ResNet-18's table of 19,208 statistics over two ranks: 9,604 each on top.
  CHECK(SplitSum::capacity(720389, 2, 19208) == 8192 + 9604);
  CHECK(SplitSum::capacity(40000, 3, 10) == 5461 + 4);  // a share rounded up
}

TEST_CASE("the split sum's dense limit leaves room for every rank's part", "[unit]") {
  CHECK(SplitSum::dense_limit(1) == int64_t{1} << 31);
  CHECK(SplitSum::dense_limit(2) == int64_t{1} << 30);
  CHECK(SplitSum::dense_limit(3) == int64_t{1} << 29);
  CHECK(SplitSum::dense_limit(4) == int64_t{1} << 29);
  for (int w = 1; w <= 300; ++w) CHECK((SplitSum::dense_limit(w) - 1) * w < int64_t{1} << 31);
}
