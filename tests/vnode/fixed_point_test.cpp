// Deterministic mode's exact sum: the fused kernels against the plain int64 formula
// (round each vnode's values to units of 2^-36, add as int64, convert once).
#include "vflow/vnode/fixed_point.h"

#include <torch/torch.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <thread>
#include <utility>
#include <vector>

#include "vflow/engine/runtime.h"
#include "vflow/engine/trainer.h"

using vflow::vnode::FixedPointSum;

namespace {

/// Values of every magnitude the sum must handle: ordinary gradients, values below the
/// unit (rounded away), exact ties of the unit, denormals, signed zeros, and values close
/// to the limit.
torch::Tensor awkward_values(int64_t n, uint64_t seed) {
  torch::manual_seed(seed);
  auto v = torch::randn({n}) * torch::pow(10.0, torch::randint(-14, 5, {n}).to(torch::kFloat));
  auto* p = v.data_ptr<float>();
  const float unit = std::ldexp(1.0f, -36);
  for (int64_t i = 0; i < n; i += 7) p[i] = unit * (static_cast<float>(i % 11) - 5.0f + 0.5f);
  for (int64_t i = 3; i < n; i += 97) p[i] = std::numeric_limits<float>::denorm_min() * 3;
  for (int64_t i = 5; i < n; i += 101) p[i] = -0.0f;
  for (int64_t i = 9; i < n; i += 211) p[i] = (i % 2 ? 1 : -1) * 1048575.9f;
  return v;
}

/// The reference: the sum of the rounded values as int64.
torch::Tensor reference_sum(const std::vector<torch::Tensor>& parts) {
  auto sum = torch::zeros({parts.front().numel()}, torch::kInt64);
  for (const auto& p : parts) {
    sum.add_(p.to(torch::kFloat64).mul_(FixedPointSum::kScale).round_().to(torch::kInt64));
  }
  return sum;
}

torch::Tensor as_floats(const torch::Tensor& sum) {
  return sum.to(torch::kFloat64).div_(FixedPointSum::kScale).to(torch::kFloat32);
}

bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(),
                     static_cast<size_t>(a.numel()) * a.element_size()) == 0;
}

/// A buffer whose values are a strided view, so that the kernels take their generic path
/// (the one a CUDA buffer takes).
torch::Tensor strided_copy(const torch::Tensor& values) {
  auto wide = torch::zeros({values.numel(), 2});
  wide.select(1, 0).copy_(values);
  return wide.select(1, 0);
}

}  // namespace

TEST_CASE("the fused exact sum equals the int64 sum of rounded values, bit for bit", "[unit]") {
  // Over two chunks' worth and a ragged end, with 1 and 2 intra-op threads.
  const int64_t n = (int64_t{1} << 16) + 4321;
  const int threads = GENERATE(1, 2);
  const bool strided = GENERATE(false, true);
  const int vnodes = GENERATE(1, 3);
  CAPTURE(threads, strided, vnodes);
  const int saved = torch::get_num_threads();
  vflow::engine::set_intra_op_threads(threads);
  std::vector<torch::Tensor> parts;
  for (int k = 0; k < vnodes; ++k) parts.push_back(awkward_values(n, 11 + k));
  const auto expected = reference_sum(parts);
  const auto prepare = [&](const torch::Tensor& v) {
    return strided ? strided_copy(v) : v.clone();
  };

  // A worker's sum before its last vnode: every other vnode absorbed.
  const auto all_but_last_absorbed = [&] {
    FixedPointSum sum(n, torch::kCPU);
    for (int k = 0; k + 1 < vnodes; ++k) {
      auto values = prepare(parts[k]);
      sum.absorb(values);
    }
    return sum;
  };

  SECTION("one worker: absorb every vnode but the last, round the last in place") {
    FixedPointSum sum(n, torch::kCPU);
    for (int k = 0; k + 1 < vnodes; ++k) {
      auto values = prepare(parts[k]);
      CHECK(sum.absorb(values) < FixedPointSum::kLimit);
      CHECK(values.abs().max().item<float>() == 0);  // cleared for the next vnode
    }
    auto values = prepare(parts.back());
    CHECK(sum.round_in_place(values) < FixedPointSum::kLimit);
    CHECK(same_bits(values.contiguous(), as_floats(expected)));
  }

  SECTION("split into a dense int32 part and the listed rest, assembled again") {
    const int64_t limit = int64_t{1} << 30;
    FixedPointSum sum = all_but_last_absorbed();
    const auto last = prepare(parts.back());
    auto dense = torch::empty({n}, torch::kInt32);
    torch::Tensor index, value;
    sum.split(last, limit, dense, index, value);
    const auto large = expected.abs().ge(limit);
    CHECK(same_bits(index, large.nonzero().view({-1})));
    CHECK(same_bits(value, expected.index_select(0, index)));
    CHECK(same_bits(dense, expected.masked_fill(large, 0).to(torch::kInt32)));
    CHECK(index.numel() > 0);

    auto out = prepare(torch::zeros({n}));
    FixedPointSum::assemble(dense, index, value, out);
    CHECK(same_bits(out.contiguous(), as_floats(expected)));
  }

  SECTION("split in parts, as buckets of the reduction, gives what one split gives") {
    const int64_t limit = int64_t{1} << 30;
    FixedPointSum sum = all_but_last_absorbed();
    const auto last = prepare(parts.back());
    // From the end to the start, as buckets start; ragged sizes, one across a chunk.
    const std::vector<int64_t> bounds = {n, n - 5, n - 40000, 1000, 999, 0};
    auto dense = torch::full({n}, 7, torch::kInt32);
    std::vector<torch::Tensor> indices, values;
    for (size_t k = 0; k + 1 < bounds.size(); ++k) {
      torch::Tensor index, value;
      const int64_t from = bounds[k + 1];
      CHECK(sum.split_part(last, limit, dense, index, value, from, bounds[k] - from) <
            FixedPointSum::kLimit);
      CHECK((index.numel() == 0 ||
             (index.min().item<int64_t>() >= from && index.max().item<int64_t>() < bounds[k])));
      indices.insert(indices.begin(), index);
      values.insert(values.begin(), value);
    }
    const auto large = expected.abs().ge(limit);
    CHECK(same_bits(torch::cat(indices), large.nonzero().view({-1})));
    CHECK(same_bits(torch::cat(values), expected.index_select(0, large.nonzero().view({-1}))));
    CHECK(same_bits(dense, expected.masked_fill(large, 0).to(torch::kInt32)));
  }
  vflow::engine::set_intra_op_threads(saved);
}

TEST_CASE("the 32-bit running sum lists what leaves its range and adds it back exactly", "[unit]") {
  // Values near 2^-6 (2^30 units), where a vnode's value or the running sum leaves the 32
  // bits the sum keeps an element in, in five vnodes: alone too large, small alone but
  // large together, large in one vnode and small in the next, cancelling, growing back.
  const float edge = std::ldexp(1.0f, -6);
  const int64_t n = 3000;  // three blocks of the kernels' 1024, the last one ragged
  std::vector<torch::Tensor> parts;
  for (int k = 0; k < 5; ++k) {
    torch::manual_seed(40 + k);
    auto v = (torch::rand({n}) * 2 - 1) * edge * 1.5f;  // about a third beyond the edge
    auto* p = v.data_ptr<float>();
    p[0] = 0.6f * edge;                                  // 0.6, 1.2, ...: over after two
    p[1] = (k % 2 == 0 ? 1 : -1) * 0.9f * edge;          // back and forth
    p[2] = k == 2 ? 1000.0f : 1e-9f;                     // one large value among small ones
    p[3] = k < 4 ? 0.99f * edge : -4 * edge;             // grows, then falls back
    for (int64_t i = 1024; i < 2048; ++i) p[i] = 1e-7f;  // a block that stays small
    parts.push_back(v);
  }
  const auto expected = reference_sum(parts);
  const auto absorbed = [&] {
    FixedPointSum sum(n, torch::kCPU);
    for (size_t k = 0; k + 1 < parts.size(); ++k) {
      auto values = parts[k].clone();
      CHECK(sum.absorb(values) < FixedPointSum::kLimit);
      CHECK(values.abs().max().item<float>() == 0);
    }
    return sum;
  };
  SECTION("rounded in place") {
    auto sum = absorbed();
    auto last = parts.back().clone();
    sum.round_in_place(last);
    CHECK(same_bits(last, as_floats(expected)));
  }
  SECTION("split whole and in parts") {
    const int64_t limit = int64_t{1} << 29;  // the dense limit of three or four ranks
    const auto large = expected.abs().ge(limit);
    CHECK(large.sum().item<int64_t>() > 100);
    auto sum = absorbed();
    auto dense = torch::full({n}, 7, torch::kInt32);
    std::vector<torch::Tensor> indices, values;
    for (const auto& [from, count] : {std::pair<int64_t, int64_t>{2, 2998}, {0, 2}}) {
      torch::Tensor index, value;
      sum.split_part(parts.back(), limit, dense, index, value, from, count);
      indices.push_back(index);
      values.push_back(value);
    }
    const auto index = torch::cat({indices[1], indices[0]});
    CHECK(same_bits(index, large.nonzero().view({-1})));
    CHECK(same_bits(torch::cat({values[1], values[0]}), expected.index_select(0, index)));
    CHECK(same_bits(dense, expected.masked_fill(large, 0).to(torch::kInt32)));
    torch::Tensor whole_index, whole_value;
    auto whole = torch::empty({n}, torch::kInt32);
    sum.split(parts.back(), limit, whole, whole_index, whole_value);
    CHECK(same_bits(whole, dense));
    CHECK(same_bits(whole_index, index));
  }
}

TEST_CASE("the exact sum's passes shared with a second thread give the same bits", "[unit]") {
  // Half of each pass's chunks on another thread: absorb, round_in_place and split, with
  // values that spill out of 32 bits.
  const int64_t n = (int64_t{1} << 17) + 4321;
  std::vector<torch::Tensor> parts;
  for (int k = 0; k < 4; ++k) parts.push_back(awkward_values(n, 90 + k));
  const auto expected = reference_sum(parts);
  int shared = 0;
  FixedPointSum sum(n, torch::kCPU);
  sum.share_passes([&](const std::function<void()>& theirs, const std::function<void()>& mine) {
    ++shared;
    std::thread other(theirs);
    mine();
    other.join();
  });
  const auto absorb_all_but_last = [&] {
    for (size_t k = 0; k + 1 < parts.size(); ++k) {
      auto values = parts[k].clone();
      CHECK(sum.absorb(values) < FixedPointSum::kLimit);
      CHECK(values.abs().max().item<float>() == 0);
    }
  };
  absorb_all_but_last();
  auto last = parts.back().clone();
  CHECK(sum.round_in_place(last) < FixedPointSum::kLimit);
  CHECK(same_bits(last, as_floats(expected)));
  absorb_all_but_last();
  const int64_t limit = int64_t{1} << 30;
  auto dense = torch::empty({n}, torch::kInt32);
  torch::Tensor index, value;
  sum.split(parts.back(), limit, dense, index, value);
  const auto large = expected.abs().ge(limit);
  CHECK(same_bits(index, large.nonzero().view({-1})));
  CHECK(same_bits(value, expected.index_select(0, index)));
  CHECK(same_bits(dense, expected.masked_fill(large, 0).to(torch::kInt32)));
  CHECK(shared == 2 * static_cast<int>(parts.size() - 1) + 2);  // every pass was shared
}

TEST_CASE("the exact sum reports values outside its range, NaN included", "[unit]") {
  const int64_t n = 40000;
  const bool strided = GENERATE(false, true);
  CAPTURE(strided);
  const auto make = [&](float bad) {
    auto v = torch::randn({n}) * 1e-3;
    v[n - 17] = bad;
    return strided ? strided_copy(v) : v;
  };
  FixedPointSum sum(n, torch::kCPU);
  auto at_limit = make(1048576.0f);
  CHECK(sum.absorb(at_limit) == 1048576.0);
  sum.clear();
  auto negative = make(-3e30f);
  CHECK(sum.round_in_place(negative) == Approx(3e30));
  auto nan = make(std::numeric_limits<float>::quiet_NaN());
  auto dense = torch::empty({n}, torch::kInt32);
  torch::Tensor index, value;
  CHECK(std::isnan(sum.split(nan, int64_t{1} << 30, dense, index, value)));
  auto inf = make(std::numeric_limits<float>::infinity());
  CHECK(std::isinf(sum.absorb(inf)));
  sum.clear();
  auto fine = make(0.5f);
  CHECK(sum.absorb(fine) == 0.5);
}

TEST_CASE("the exact sum formed inside the reduction is the int64 sum of rounded values, as floats",
          "[unit]") {
  const int ranks = GENERATE(1, 2, 3, 4, 5);  // 3 and 4 have kernels of their own
  CAPTURE(ranks);
  // Crosses the parallel chunks and the blocks, with a ragged end.
  const int64_t n = 3 * 32768 + 1031;
  std::vector<torch::Tensor> parts;
  std::vector<const float*> pointers;
  for (int k = 0; k < ranks; ++k) {
    parts.push_back(awkward_values(n, 40 + static_cast<uint64_t>(k)));
    pointers.push_back(parts.back().data_ptr<float>());
  }
  if (ranks >= 2) {
    // Sums on and beside a float's rounding tie: 2^19 (2^55 units, whose float spacing is
    // 2^32 units) plus half that spacing (2^-5), or the floats just above and below it
    // (2^-5 + 2^-28, 2^-5 - 2^-29), on an even and an odd mantissa, both signs. Two parts are
    // summed in float, the others in double or int64: all must round as the int64 total does.
    const float big = std::ldexp(1.0f, 19);
    const float odd = big + std::ldexp(1.0f, -4);
    const float half = std::ldexp(1.0f, -5);
    const float nudge = std::ldexp(1.0f, -28);
    const float firsts[] = {big, odd, -big, -odd};
    const float seconds[] = {half, -half, half + nudge, half - nudge / 2, 3 * half, 0.0f};
    int64_t at = 100;
    for (const float a : firsts) {
      for (const float b : seconds) {
        parts[0][at] = a;
        parts[1][at] = a < 0 ? -b : b;
        ++at;
      }
    }
  }
  auto dst = torch::empty({n});
  const double largest =
      FixedPointSum::sum_rounded(pointers.data(), ranks, dst.data_ptr<float>(), n);
  CHECK(same_bits(dst, as_floats(reference_sum(parts))));
  double expected = 0;
  for (const auto& p : parts) expected = std::max(expected, p.abs().max().item<double>());
  CHECK(largest == expected);

  // A value out of range, or NaN, in any part is reported.
  parts.back()[n - 3] = -2e6f;
  CHECK(FixedPointSum::sum_rounded(pointers.data(), ranks, dst.data_ptr<float>(), n) ==
        Approx(2e6));
  parts.front()[7] = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(FixedPointSum::sum_rounded(pointers.data(), ranks, dst.data_ptr<float>(), n)));
}

TEST_CASE("a contribution's hash is that of the exact sum's integers, whatever the threads",
          "[unit]") {
  const int64_t n = 200003;  // several parallel chunks and a ragged end
  const auto values = awkward_values(n, 11);
  const uint64_t h = FixedPointSum::contribution_hash(values, n);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  CHECK(FixedPointSum::contribution_hash(values, n) == h);
  at::set_num_threads(threads);
  // A change the rounding keeps (far below the unit of 2^-36) keeps the hash; another
  // value anywhere changes it.
  auto same = values.clone();
  same[5] = 0.0f;
  auto* p = same.data_ptr<float>();
  p[5] = std::ldexp(1.0f, -40);  // rounds to 0, as 0 does
  auto base = values.clone();
  base.data_ptr<float>()[5] = 0.0f;
  CHECK(FixedPointSum::contribution_hash(same, n) == FixedPointSum::contribution_hash(base, n));
  for (const int64_t at : {int64_t{0}, int64_t{77}, n - 1}) {
    CAPTURE(at);
    auto changed = base.clone();
    float& x = changed.data_ptr<float>()[at];
    x = x == 0.5f ? 0.25f : 0.5f;
    CHECK(FixedPointSum::contribution_hash(changed, n) !=
          FixedPointSum::contribution_hash(base, n));
  }
  // Two values swapped: the same multiset at other indices is another contribution.
  base.data_ptr<float>()[10] = 0.5f;
  base.data_ptr<float>()[20] = -0.25f;
  auto swapped = base.clone();
  std::swap(swapped.data_ptr<float>()[10], swapped.data_ptr<float>()[20]);
  CHECK(FixedPointSum::contribution_hash(swapped, n) != FixedPointSum::contribution_hash(base, n));
  // Only the first n elements count; other dtypes hash their rounded integers alike.
  auto longer = torch::cat({base, torch::ones({7})});
  CHECK(FixedPointSum::contribution_hash(longer, n) == FixedPointSum::contribution_hash(base, n));
  const auto small = torch::tensor({0.5f, -0.25f, 1e-3f, 0.0f});
  CHECK(FixedPointSum::contribution_hash(small.to(torch::kFloat64), 4) ==
        FixedPointSum::contribution_hash(small, 4));
}
