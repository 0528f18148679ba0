#include "vflow/comm/split_sum.h"

#include <torch/torch.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "vflow/comm/communicator.h"
#include "vflow/core/error.h"

namespace vflow::comm {

namespace {

/// A rank's region of the carrier: its count, then (index, low word, high word) pairs.
int64_t region_size(int64_t capacity) { return 1 + 3 * capacity; }

using Pairs = std::vector<std::pair<int64_t, int64_t>>;

int32_t low_word(int64_t v) {
  return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(v) & 0xffffffffu));
}
int32_t high_word(int64_t v) {
  return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(v) >> 32));
}
int64_t from_words(int32_t low, int32_t high) {
  return static_cast<int64_t>((static_cast<uint64_t>(static_cast<uint32_t>(high)) << 32) |
                              static_cast<uint64_t>(static_cast<uint32_t>(low)));
}

/// Sorted by index, equal indices summed.
SplitSum::Listed merged(Pairs pairs) {
  std::sort(pairs.begin(), pairs.end());
  Pairs out;
  for (const auto& p : pairs) {
    if (!out.empty() && out.back().first == p.first) {
      out.back().second += p.second;
    } else {
      out.push_back(p);
    }
  }
  const auto n = static_cast<int64_t>(out.size());
  SplitSum::Listed listed{torch::empty({n}, torch::kInt64), torch::empty({n}, torch::kInt64)};
  for (int64_t k = 0; k < n; ++k) {
    listed.index.data_ptr<int64_t>()[k] = out[k].first;
    listed.value.data_ptr<int64_t>()[k] = out[k].second;
  }
  return listed;
}

}  // namespace

SplitSum::SplitSum(int64_t numel, torch::Device device, int64_t reserved)
    : numel_(numel), device_(device), reserved_(reserved) {
  VFLOW_ASSERT(numel >= 0 && numel < (int64_t{1} << 31), "a split sum of 2^31 elements or more");
  VFLOW_ASSERT(reserved >= 0 && reserved <= numel, "a reserve outside the split sum");
}

int64_t SplitSum::dense_limit(int world) {
  VFLOW_ASSERT(world >= 1, "a split sum over no ranks");
  int64_t rounded = 1;
  while (rounded < world) rounded *= 2;
  return (int64_t{1} << 31) / rounded;
}

int64_t SplitSum::capacity(int64_t numel, int world, int64_t reserved) {
  VFLOW_ASSERT(world >= 1 && reserved >= 0, "a split sum's capacity over no ranks");
  const int64_t least = std::max<int64_t>(2048, 16384 / world);
  return std::max<int64_t>(least, numel / (int64_t{256} * world)) + (reserved + world - 1) / world;
}

torch::Tensor SplitSum::dense(int world) {
  if (world != world_) {
    world_ = world;
    capacity_ = capacity(numel_, world, reserved_);
    carrier_ = torch::zeros({world * region_size(capacity_) + numel_},
                            torch::TensorOptions(torch::kInt32).device(device_));
  }
  return carrier_.narrow(0, world_ * region_size(capacity_), numel_);
}

SplitSum::Listed SplitSum::reduce(Communicator& comm, const torch::Tensor& index,
                                  const torch::Tensor& value, const Shares* dense) {
  list(comm.rank(), index, value);
  auto whole = carrier_part(0, numel_);
  if (dense != nullptr) {
    comm.reduce_scatter_sum(whole, dense->around(world_ * region_size(capacity_), 0));
  } else {
    comm.allreduce_sum(whole);
  }
  return merge(comm);
}

void SplitSum::list(int rank, const torch::Tensor& index, const torch::Tensor& value) {
  VFLOW_ASSERT(carrier_.defined() && rank >= 0 && rank < world_,
               "a list before dense() for this world");
  VFLOW_ASSERT(index.device().is_cpu() && value.device().is_cpu() &&
                   index.scalar_type() == torch::kInt64 && value.scalar_type() == torch::kInt64 &&
                   index.numel() == value.numel(),
               "a rank's list must be int64 index and value tensors on the CPU");
  index_ = index.contiguous();
  value_ = value.contiguous();
  const int64_t* ip = index_.data_ptr<int64_t>();
  const int64_t* vp = value_.data_ptr<int64_t>();
  const int64_t count = index_.numel();
  const int64_t carried = std::min(count, capacity_);
  const int64_t region = region_size(capacity_);
  // This rank's region: its count and first pairs; every other rank leaves it zero, so
  // the sum delivers it unchanged to all.
  auto regions = carrier_.narrow(0, 0, world_ * region);
  regions.zero_();
  auto mine = torch::zeros({region}, torch::kInt32);
  auto* m = mine.data_ptr<int32_t>();
  m[0] = static_cast<int32_t>(count);
  for (int64_t k = 0; k < carried; ++k) {
    m[1 + 3 * k] = static_cast<int32_t>(ip[k]);
    m[2 + 3 * k] = low_word(vp[k]);
    m[3 + 3 * k] = high_word(vp[k]);
  }
  regions.narrow(0, rank * region, region).copy_(mine);
}

torch::Tensor SplitSum::carrier_part(int64_t offset, int64_t count) {
  VFLOW_ASSERT(carrier_.defined() && offset >= 0 && count >= 0 && offset + count <= numel_,
               "a carrier part outside the dense part");
  const int64_t regions = world_ * region_size(capacity_);
  return offset == 0 ? carrier_.narrow(0, 0, regions + count)
                     : carrier_.narrow(0, regions + offset, count);
}

SplitSum::Listed SplitSum::merge(Communicator& comm) {
  const int world = comm.size();
  VFLOW_ASSERT(world == world_ && index_.defined(), "merge before list() for this world");
  const int64_t* ip = index_.data_ptr<int64_t>();
  const int64_t* vp = value_.data_ptr<int64_t>();
  const int64_t count = index_.numel();
  const int64_t carried = std::min(count, capacity_);
  const int64_t region = region_size(capacity_);
  const auto all = carrier_.narrow(0, 0, world * region).to(torch::kCPU).contiguous();
  const auto* a = all.data_ptr<int32_t>();
  Pairs pairs;
  int64_t most_left = 0;  // the longest remainder beyond capacity_ of any rank
  std::vector<int64_t> left(static_cast<size_t>(world));
  for (int w = 0; w < world; ++w) {
    const int32_t* r = a + w * region;
    const int64_t n = r[0];
    for (int64_t k = 0; k < std::min(n, capacity_); ++k) {
      pairs.emplace_back(r[1 + 3 * k], from_words(r[2 + 3 * k], r[3 + 3 * k]));
    }
    left[w] = std::max<int64_t>(0, n - capacity_);
    most_left = std::max(most_left, left[w]);
  }
  if (most_left == 0) return merged(std::move(pairs));

  const auto on_device = torch::TensorOptions(torch::kInt64).device(device_);
  if (world * most_left * 2 > numel_) {
    // Many large values: one dense int64 sum of the remainders is the smaller message.
    auto rest = torch::zeros({numel_}, on_device);
    if (count > carried) {
      rest.index_put_({index_.narrow(0, carried, count - carried).to(device_)},
                      value_.narrow(0, carried, count - carried).to(device_));
    }
    comm.allreduce_sum(rest);
    const auto where = rest.nonzero().view({-1});
    const auto idx = where.to(torch::kCPU);
    const auto val = rest.index_select(0, where).to(torch::kCPU);
    for (int64_t k = 0; k < idx.numel(); ++k) {
      pairs.emplace_back(idx.data_ptr<int64_t>()[k], val.data_ptr<int64_t>()[k]);
    }
    return merged(std::move(pairs));
  }
  auto rest = torch::zeros({2 * most_left}, torch::kInt64);
  for (int64_t k = carried; k < count; ++k) {
    rest.data_ptr<int64_t>()[2 * (k - carried)] = ip[k];
    rest.data_ptr<int64_t>()[2 * (k - carried) + 1] = vp[k];
  }
  const auto gathered = comm.all_gather(rest.to(device_));
  for (int w = 0; w < world; ++w) {
    const auto g = gathered[w].to(torch::kCPU).contiguous();
    for (int64_t k = 0; k < left[w]; ++k) {
      pairs.emplace_back(g.data_ptr<int64_t>()[2 * k], g.data_ptr<int64_t>()[2 * k + 1]);
    }
  }
  return merged(std::move(pairs));
}

}  // namespace vflow::comm
