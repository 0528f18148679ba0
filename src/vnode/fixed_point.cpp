// Compiled with -ffp-contract=off (no multiply-add fused into one rounding) and
// -fno-trapping-math (so that selects between computed floats vectorise; no value
// changes): every operation here is exact or rounds once by IEEE rules, so hosts of
// different instruction sets in one job compute the same integers and floats.
#include "vflow/vnode/fixed_point.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "vflow/core/error.h"
#include "vnode/fixed_point_rounding.h"

namespace vflow::vnode {

namespace {

using rounding::round_even;
constexpr float kScaleF = rounding::kScale;  // 2^36
constexpr float kUnitF = rounding::kUnit;    // 2^-36
static_assert(kUnitF == FixedPointSum::Reduced::kUnit && kScaleF == FixedPointSum::kScale);
constexpr double kUnit = 1.0 / FixedPointSum::kScale;
constexpr int64_t kChunk = int64_t{1} << 15;  // elements per parallel task
constexpr int64_t kBlock = 1024;              // split: the unit rescanned for its large values
// The 32-bit running sum's room: a value and a sum below 2^30 units add within int32.
constexpr int32_t kRoom = int32_t{1} << 30;
constexpr float kRoomF = 1073741824.0f;  // 2^30

/// The largest magnitude seen, as the bits of a non-negative float: their integer order
/// is the floats' order, and NaN's bits come above infinity's, so one integer maximum
/// finds both the largest value and a NaN (and vectorises, which a float maximum with
/// NaN semantics does not).
struct RangeSeen {
  uint32_t largest = 0;
  void merge(const RangeSeen& o) { largest = o.largest > largest ? o.largest : largest; }
  double result() const {
    float f = 0;
    std::memcpy(&f, &largest, sizeof f);
    return f;
  }
};

constexpr uint32_t kLimitBits = 0x49800000u;  // the bits of 2^20

/// x in units of 2^-36, rounded, or 0 when |x| is not below 2^20 (or NaN); the
/// magnitude's bits go into `largest`.
inline float scaled(float x, uint32_t& largest) {
  uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  bits &= 0x7fffffffu;
  largest = bits > largest ? bits : largest;
  const float q = round_even(x * kScaleF);
  return bits < kLimitBits ? q : 0.0f;
}

/// An integral float below 2^56 in magnitude as int64, in 32-bit vector steps: the
/// quotient by 2^31 (truncated, exact) and the exact remainder.
inline int64_t to_int64(float q) {
  constexpr float kWord = 2147483648.0f;  // 2^31
  const auto high = static_cast<int32_t>(q * (1.0f / kWord));
  const auto low = static_cast<int32_t>(q - static_cast<float>(high) * kWord);
  return static_cast<int64_t>(static_cast<uint64_t>(static_cast<int64_t>(high)) << 31) + low;
}

/// An int64 as the nearest double, in 32-bit vector steps: both halves convert exactly
/// and their sum rounds once, as the conversion of the whole does.
inline double to_double(int64_t t) {
  const auto high = static_cast<int32_t>(t >> 32);
  const auto low = static_cast<uint32_t>(static_cast<uint64_t>(t));
  const double low_d = static_cast<double>(static_cast<int32_t>(low ^ 0x80000000u)) + 2147483648.0;
  return static_cast<double>(high) * 4294967296.0 + low_d;
}

// The kernels of one chunk, in plain loops over restrict pointers with local
// accumulators so that the compiler vectorises them; compiled for AVX2 too, where the
// int64 steps vectorise, and for AVX-512, whose wider vectors shorten these passes where
// they are bound by the instructions rather than memory. Every operation is exact or
// rounds once by IEEE rules, so all versions give the same bits.
#define VFLOW_KERNEL __attribute__((target_clones("avx512f", "avx2", "default")))

/// absorb into the 32-bit running sum d (|d| < 2^30 on entry and exit; First: d is zero
/// on entry, not read): where the rounded value q and d + q stay below 2^30 in magnitude,
/// d += q and the value is cleared; elsewhere d is left (0 where First) and the value
/// too, for the caller to move both to the spilled int64 values. Returns how many it left.
template <bool First>
__attribute__((always_inline)) inline int32_t absorb32_body(float* __restrict v,
                                                            int32_t* __restrict d, int64_t n,
                                                            uint32_t& largest) {
  uint32_t seen = largest;
  int32_t left = 0;
  // Masks as integers rather than selects of floats and integers: the form the compiler
  // vectorises.
  for (int64_t i = 0; i < n; ++i) {
    const float x = v[i];
    const float q = scaled(x, seen);
    const int32_t small = std::fabs(q) < kRoomF ? 1 : 0;
    const auto qi = static_cast<int32_t>(small != 0 ? q : 0.0f);
    const int32_t s = First ? 0 : d[i];
    const int32_t t = s + qi;  // both below 2^30
    const int32_t ok = small & (t < kRoom ? 1 : 0) & (t > -kRoom ? 1 : 0);
    d[i] = s + (qi & -ok);  // t where ok, else s
    uint32_t bits = 0;
    std::memcpy(&bits, &x, sizeof bits);
    bits &= static_cast<uint32_t>(ok - 1);  // 0.0f where ok, else x
    float kept = 0;
    std::memcpy(&kept, &bits, sizeof kept);
    v[i] = kept;
    left += 1 - ok;
  }
  largest = seen;
  return left;
}

VFLOW_KERNEL int32_t absorb32_first(float* __restrict v, int32_t* __restrict d, int64_t n,
                                    uint32_t& largest) {
  return absorb32_body<true>(v, d, n, largest);
}

VFLOW_KERNEL int32_t absorb32_more(float* __restrict v, int32_t* __restrict d, int64_t n,
                                   uint32_t& largest) {
  return absorb32_body<false>(v, d, n, largest);
}

VFLOW_KERNEL RangeSeen round_alone(float* __restrict v, int64_t n) {
  uint32_t largest = 0;
  // A float that is an integer times 2^-36 converts to itself: no int64 step.
  for (int64_t i = 0; i < n; ++i) v[i] = scaled(v[i], largest) * kUnitF;
  return {largest};
}

VFLOW_KERNEL RangeSeen range_only(const float* __restrict v, int64_t n) {
  uint32_t largest = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits = 0;
    std::memcpy(&bits, &v[i], sizeof bits);
    bits &= 0x7fffffffu;
    largest = bits > largest ? bits : largest;
  }
  return {largest};
}

VFLOW_KERNEL RangeSeen round_with_sum(float* __restrict v, const int32_t* __restrict s, int64_t n) {
  uint32_t largest = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = static_cast<int64_t>(s[i]) + to_int64(scaled(v[i], largest));
    v[i] = static_cast<float>(to_double(t) * kUnit);
  }
  return {largest};
}

/// Splits alone: returns how many elements were too large for the dense part.
VFLOW_KERNEL int32_t split_alone(const float* __restrict v, int32_t* __restrict d, float limit,
                                 int64_t n, RangeSeen& seen) {
  uint32_t largest = 0;
  int32_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float q = scaled(v[i], largest);
    const bool small = std::fabs(q) < limit;
    d[i] = static_cast<int32_t>(small ? q : 0.0f);
    count += small ? 0 : 1;
  }
  seen = {largest};
  return count;
}

/// Splits with the running sum s (|s| < 2^30): in 32 bits, as absorb adds, where the rounded
/// value is below 2^30 in magnitude (then |s + q| < 2^31); any other element counts as
/// large, and the caller's rescan forms its total in int64 and lists it if it is.
/// `limit` is the dense limit, at most 2^31 - 1 here (2^31 itself: every 32-bit total is
/// below it).
VFLOW_KERNEL int32_t split_with_sum(const float* __restrict v, const int32_t* __restrict s,
                                    int32_t* __restrict d, int32_t limit, int64_t n,
                                    RangeSeen& seen) {
  uint32_t largest = 0;
  int32_t count = 0;
  // Masks as integers rather than selects: the form the compiler vectorises.
  for (int64_t i = 0; i < n; ++i) {
    const float q = scaled(v[i], largest);
    const int32_t fits = std::fabs(q) < kRoomF ? 1 : 0;
    const auto qi = static_cast<int32_t>(fits != 0 ? q : 0.0f);
    const int32_t t = s[i] + qi;
    const int32_t small = fits & (t < limit ? 1 : 0) & (t > -limit ? 1 : 0);
    d[i] = t & -small;
    count += 1 - small;
  }
  seen = {largest};
  return count;
}

VFLOW_KERNEL void assemble_dense(const int32_t* __restrict d, float* __restrict v, int64_t n) {
  // An int32 rounded to float, times 2^-36 (exact), is the int32 times 2^-36 rounded once.
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(d[i]) * kUnitF;
}

/// sum_rounded of at most kBlock elements, exactly: the rounded values as int64.
VFLOW_KERNEL RangeSeen sum_rounded_exact(const float* const* parts, int ranks,
                                         float* __restrict dst, int64_t n) {
  int64_t t[kBlock];
  uint32_t largest = 0;
  const float* __restrict first = parts[0];
  for (int64_t i = 0; i < n; ++i) t[i] = to_int64(scaled(first[i], largest));
  for (int k = 1; k < ranks; ++k) {
    const float* __restrict p = parts[k];
    for (int64_t i = 0; i < n; ++i) t[i] += to_int64(scaled(p[i], largest));
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(to_double(t[i]) * kUnit);
  return {largest};
}

/// sum_rounded of at most kBlock elements with the rounded values added as doubles. A
/// rounded value is an integer float, exact as a double, and every partial sum is exact
/// while it stays below 2^53; the first sum of two values rounds once, as the int64
/// total's conversion to double does. So this is exact for two parts, and for more as
/// long as every value is below 2^53 / ranks units (the caller checks).
VFLOW_KERNEL RangeSeen sum_rounded_double(const float* const* parts, int ranks,
                                          float* __restrict dst, int64_t n) {
  double t[kBlock];
  uint32_t largest = 0;
  const float* __restrict first = parts[0];
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<double>(scaled(first[i], largest));
  for (int k = 1; k < ranks; ++k) {
    const float* __restrict p = parts[k];
    for (int64_t i = 0; i < n; ++i) t[i] += static_cast<double>(scaled(p[i], largest));
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(t[i] * kUnit);
  return {largest};
}

/// sum_rounded_double of R parts in one pass, no partial sums stored: the same additions
/// in the same order, so the same bits.
template <int R>
__attribute__((always_inline)) inline RangeSeen sum_rounded_double_of(const float* const* parts,
                                                                      float* __restrict dst,
                                                                      int64_t n) {
  const float* __restrict p0 = parts[0];
  const float* __restrict p1 = parts[1];
  const float* __restrict p2 = parts[2];
  const float* __restrict p3 = parts[R - 1];
  uint32_t largest = 0;
  for (int64_t i = 0; i < n; ++i) {
    double t = static_cast<double>(scaled(p0[i], largest));
    t += static_cast<double>(scaled(p1[i], largest));
    t += static_cast<double>(scaled(p2[i], largest));
    if (R == 4) t += static_cast<double>(scaled(p3[i], largest));
    dst[i] = static_cast<float>(t * kUnit);
  }
  return {largest};
}

VFLOW_KERNEL RangeSeen sum_rounded_double3(const float* const* parts, float* __restrict dst,
                                           int64_t n) {
  return sum_rounded_double_of<3>(parts, dst, n);
}

VFLOW_KERNEL RangeSeen sum_rounded_double4(const float* const* parts, float* __restrict dst,
                                           int64_t n) {
  return sum_rounded_double_of<4>(parts, dst, n);
}

/// sum_rounded of two parts in float: each rounded value is an integer float, and their
/// float sum rounds the exact sum once. The reference rounds it to double first (the int64
/// total's conversion), but double rounding through a format of at least 2 * 24 + 2 bits
/// is innocuous for a sum, so both give the same float; the scaling by 2^-36 is exact.
VFLOW_KERNEL RangeSeen sum_rounded_pair(const float* __restrict a, const float* __restrict b,
                                        float* __restrict dst, int64_t n) {
  uint32_t largest = 0;
  for (int64_t i = 0; i < n; ++i) dst[i] = (scaled(a[i], largest) + scaled(b[i], largest)) * kUnitF;
  return {largest};
}

#undef VFLOW_KERNEL

bool fast_path(const torch::Tensor& values) {
  return values.device().is_cpu() && values.scalar_type() == torch::kFloat32 &&
         values.is_contiguous();
}

/// Runs f(begin, end, chunk) over chunks of [0, n) in parallel; returns the chunks'
/// RangeSeen merged.
/// With `both`, the first half of the chunks run on its other thread, one after another,
/// while this thread runs the rest.
template <typename F>
RangeSeen for_chunks(int64_t n, F f, const FixedPointSum::TwoThreads* both = nullptr) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<RangeSeen> seen(static_cast<size_t>(chunks));
  const auto run = [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      const int64_t b = c * kChunk;
      seen[c] = f(b, std::min(n, b + kChunk), c);
    }
  };
  if (both != nullptr && *both && chunks > 1) {
    const int64_t half = chunks / 2;
    (*both)([&] { run(0, half); }, [&] { at::parallel_for(half, chunks, 1, run); });
  } else {
    at::parallel_for(0, chunks, 1, run);
  }
  RangeSeen all;
  for (const auto& s : seen) all.merge(s);
  return all;
}

double generic_largest(const torch::Tensor& values) {
  return values.numel() == 0 ? 0.0 : values.abs().max().item<double>();
}

torch::Tensor generic_rounded(const torch::Tensor& values) {
  return values.to(torch::kFloat64).mul_(FixedPointSum::kScale).round_().to(torch::kInt64);
}

/// A spilled element's total with the last vnode's value x: its int32 sum, its listed
/// int64 value and x rounded.
inline int64_t spilled_total(int32_t sum, int64_t listed, float x) {
  uint32_t unused = 0;
  return static_cast<int64_t>(sum) + listed + to_int64(scaled(x, unused));
}

/// The first of `list` (ascending indices) at index `i` or beyond.
template <typename List>
auto first_at(const List& list, int64_t i) {
  return std::lower_bound(list.begin(), list.end(), i,
                          [](const auto& p, int64_t at) { return p.first < at; });
}

/// splitmix64's finaliser: every input bit reaches every output bit.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// One element's term of contribution_hash: its integer and its index, mixed. The terms
/// are added (mod 2^64), so the parts of [0, n) may be hashed in any order.
inline uint64_t hash_term(int64_t q, int64_t i) {
  return mix64(static_cast<uint64_t>(q) ^ mix64(static_cast<uint64_t>(i) + 0x9e3779b97f4a7c15ULL));
}

}  // namespace

FixedPointSum::FixedPointSum(int64_t numel, torch::Device device) : numel_(numel) {
  if (device.is_cpu()) {
    // Never read before the first absorb writes it (an empty sum is not read), so left
    // unwritten: a worker of one vnode, whose sum is formed inside the reduction, never
    // touches it, and a large one costs no resident memory there.
    sum32_ = torch::empty({numel}, torch::kInt32);
  } else {
    sum_ = torch::zeros({numel}, torch::TensorOptions(torch::kInt64).device(device));
  }
}

void FixedPointSum::clear() {
  empty_ = true;
  spilled_.clear();
}

torch::Tensor& FixedPointSum::generic_sum() {
  // Values that are not float32 on the CPU: the int64 sum of tensor operations (a CPU
  // sum allocates it at its first such value; a job's values are all of one kind).
  if (!sum_.defined()) sum_ = torch::zeros({numel_}, torch::kInt64);
  VFLOW_ASSERT(spilled_.empty(), "a fixed-point sum of two kinds at once");
  return sum_;
}

double FixedPointSum::absorb(torch::Tensor& values) {
  VFLOW_ASSERT(values.numel() == numel_, "a fixed-point sum of another size");
  if (!fast_path(values) || !sum32_.defined()) {
    const double largest = generic_largest(values);
    if (!(largest < kLimit)) return largest;
    const auto q = generic_rounded(values);
    if (empty_) {
      generic_sum().copy_(q);
    } else {
      generic_sum().add_(q);
    }
    values.zero_();
    empty_ = false;
    return largest;
  }
  float* v = values.data_ptr<float>();
  int32_t* d = sum32_.data_ptr<int32_t>();
  const bool first = empty_;
  std::vector<Spilled> spills(static_cast<size_t>((numel_ + kChunk - 1) / kChunk));
  const auto seen = for_chunks(
      numel_,
      [&](int64_t b, int64_t e, int64_t c) {
        uint32_t largest = 0;
        for (int64_t bb = b; bb < e; bb += kBlock) {
          const int64_t be = std::min(e, bb + kBlock);
          const int32_t left = first ? absorb32_first(v + bb, d + bb, be - bb, largest)
                                     : absorb32_more(v + bb, d + bb, be - bb, largest);
          if (left == 0) continue;
          // Rare: the values left are the block's nonzero ones. Each goes to the int64 list
          // with the element's int32 sum, which starts again from zero, so that an element
          // whose sum has grown large does not spill again at every vnode.
          uint32_t unused = 0;
          for (int64_t i = bb; i < be; ++i) {
            if (v[i] == 0.0f) continue;
            spills[c].emplace_back(i, static_cast<int64_t>(d[i]) + to_int64(scaled(v[i], unused)));
            d[i] = 0;
            v[i] = 0.0f;
          }
        }
        return RangeSeen{largest};
      },
      &both_);
  // The chunks' lists, in chunk order, are ascending; merged with what earlier vnodes
  // spilled, equal indices summed.
  Spilled fresh;
  for (auto& part : spills) fresh.insert(fresh.end(), part.begin(), part.end());
  const Spilled earlier = first ? Spilled{} : std::move(spilled_);
  spilled_.clear();
  spilled_.reserve(earlier.size() + fresh.size());
  auto a = earlier.begin();
  auto b = fresh.begin();
  while (a != earlier.end() || b != fresh.end()) {
    if (b == fresh.end() || (a != earlier.end() && a->first < b->first)) {
      spilled_.push_back(*a++);
    } else if (a == earlier.end() || b->first < a->first) {
      spilled_.push_back(*b++);
    } else {
      spilled_.emplace_back(a->first, a->second + b->second);
      ++a;
      ++b;
    }
  }
  empty_ = false;
  return seen.result();
}

double FixedPointSum::round_in_place(torch::Tensor& values) {
  VFLOW_ASSERT(values.numel() == numel_, "a fixed-point sum of another size");
  const bool alone = empty_;
  empty_ = true;
  if (!fast_path(values) || !sum32_.defined()) {
    const double largest = generic_largest(values);
    if (!(largest < kLimit)) return largest;
    auto t = generic_rounded(values);
    if (!alone) t.add_(generic_sum());
    values.copy_(t.to(torch::kFloat64).mul_(kUnit));
    return largest;
  }
  float* v = values.data_ptr<float>();
  const int32_t* s = sum32_.data_ptr<int32_t>();
  const Spilled& spilled = spilled_;
  const auto seen = for_chunks(
      values.numel(),
      [&](int64_t b, int64_t e, int64_t) {
        if (alone) return round_alone(v + b, e - b);
        // The chunk's spilled elements' totals, from the values before the pass overwrites
        // them (the chunk is then in cache for the pass), put in after it.
        const auto first = first_at(spilled, b);
        const auto last = first_at(spilled, e);
        std::vector<float> patched;
        patched.reserve(static_cast<size_t>(last - first));
        for (auto it = first; it != last; ++it) {
          const int64_t total = spilled_total(s[it->first], it->second, v[it->first]);
          patched.push_back(static_cast<float>(to_double(total) * kUnit));
        }
        const RangeSeen r = round_with_sum(v + b, s + b, e - b);
        for (auto it = first; it != last; ++it) v[it->first] = patched[it - first];
        return r;
      },
      &both_);
  spilled_.clear();
  return seen.result();
}

double FixedPointSum::round_in_place_from(torch::Tensor& values, int64_t from) {
  VFLOW_ASSERT(values.numel() == numel_, "a fixed-point sum of another size");
  VFLOW_ASSERT(empty_, "rounding from an offset needs a worker's only vnode");
  VFLOW_ASSERT(from >= 0 && from <= values.numel(), "rounding from outside the buffer");
  if (!fast_path(values)) {
    const double largest = generic_largest(values);
    if (largest < kLimit) {
      auto tail = values.narrow(0, from, values.numel() - from);
      tail.copy_(generic_rounded(tail).to(torch::kFloat64).mul_(kUnit));
    }
    return largest;
  }
  float* v = values.data_ptr<float>();
  const auto seen = for_chunks(
      values.numel(),
      [&](int64_t b, int64_t e, int64_t) {
        const int64_t split = std::clamp(from, b, e);
        RangeSeen r = range_only(v + b, split - b);
        r.merge(round_alone(v + split, e - split));
        return r;
      },
      &both_);
  return seen.result();
}

double FixedPointSum::sum_rounded(const float* const* parts, int ranks, float* dst, int64_t n) {
  VFLOW_ASSERT(ranks >= 1, "a sum of no parts");
  if (ranks == 2) {
    return for_chunks(n,
                      [&](int64_t b, int64_t e, int64_t) {
                        return sum_rounded_pair(parts[0] + b, parts[1] + b, dst + b, e - b);
                      })
        .result();
  }
  // More parts: blocks with a value of 2^53 / ranks units or more (2^17 / ranks in value; the
  // power of two at or below it) take the int64 sum.
  int shift = 0;
  while ((1 << shift) < ranks) ++shift;
  const float exact_from_value = std::ldexp(1.0f, 17 - shift);
  uint32_t exact_from = 0;
  std::memcpy(&exact_from, &exact_from_value, sizeof exact_from);
  const auto seen = for_chunks(n, [&](int64_t b, int64_t e, int64_t) {
    RangeSeen chunk;
    std::vector<const float*> at(static_cast<size_t>(ranks));
    for (int64_t bb = b; bb < e; bb += kBlock) {
      for (int k = 0; k < ranks; ++k) at[k] = parts[k] + bb;
      const int64_t m = std::min(e, bb + kBlock) - bb;
      RangeSeen r = ranks == 3   ? sum_rounded_double3(at.data(), dst + bb, m)
                    : ranks == 4 ? sum_rounded_double4(at.data(), dst + bb, m)
                                 : sum_rounded_double(at.data(), ranks, dst + bb, m);
      if (ranks > 2 && r.largest >= exact_from)
        r = sum_rounded_exact(at.data(), ranks, dst + bb, m);
      chunk.merge(r);
    }
    return chunk;
  });
  return seen.result();
}

double FixedPointSum::split(const torch::Tensor& values, int64_t dense_limit, torch::Tensor& dense,
                            torch::Tensor& index, torch::Tensor& value) {
  const double largest = split_part(values, dense_limit, dense, index, value, 0, numel_);
  clear();
  return largest;
}

double FixedPointSum::split_part(const torch::Tensor& values, int64_t dense_limit,
                                 torch::Tensor& dense, torch::Tensor& index, torch::Tensor& value,
                                 int64_t from, int64_t count) const {
  VFLOW_ASSERT(values.numel() == numel_ && dense.numel() == numel_ &&
                   dense.scalar_type() == torch::kInt32 && dense.is_contiguous(),
               "split into a dense part of another size or type");
  VFLOW_ASSERT(from >= 0 && count >= 0 && from + count <= numel_,
               "a split of elements outside the sum");
  VFLOW_ASSERT(dense_limit > 0 && dense_limit <= (int64_t{1} << 31) &&
                   (dense_limit & (dense_limit - 1)) == 0,
               "the dense limit must be a power of two up to 2^31");
  const bool alone = empty_;
  if (!fast_path(values) || !dense.device().is_cpu() || !sum32_.defined()) {
    VFLOW_ASSERT(alone || sum_.defined(), "a fixed-point sum split as another kind");
    const auto part = values.narrow(0, from, count);
    const double largest = generic_largest(part);
    if (!(largest < kLimit)) return largest;
    auto t = generic_rounded(part);
    if (!alone) t.add_(sum_.narrow(0, from, count));
    const auto large = t.abs().ge(dense_limit);
    dense.narrow(0, from, count).copy_(t.masked_fill(large, 0).to(torch::kInt32));
    const auto where = large.nonzero().view({-1});
    index = where.to(torch::kCPU) + from;  // not in place: on the CPU, `where` itself
    value = t.index_select(0, where).to(torch::kCPU);
    return largest;
  }
  const float* v = values.data_ptr<float>() + from;
  const int32_t* s = sum32_.data_ptr<int32_t>() + from;
  int32_t* d = dense.data_ptr<int32_t>() + from;
  const int64_t n = count;
  const float limit_f = static_cast<float>(dense_limit);
  const auto limit32 = static_cast<int32_t>(std::min<int64_t>(dense_limit, INT32_MAX));
  std::vector<Spilled> large(static_cast<size_t>((n + kChunk - 1) / kChunk));
  const auto seen = for_chunks(
      n,
      [&](int64_t b, int64_t e, int64_t c) {
        // The chunk's spilled elements with their totals, from the values as they are (the
        // chunk is then in cache for the pass); they replace what the pass writes for them.
        Spilled totals;
        if (!alone) {
          const auto last = first_at(spilled_, from + e);
          for (auto it = first_at(spilled_, from + b); it != last; ++it) {
            const int64_t i = it->first - from;
            totals.emplace_back(it->first, spilled_total(s[i], it->second, v[i]));
          }
        }
        RangeSeen chunk;
        for (int64_t bb = b; bb < e; bb += kBlock) {
          const int64_t be = std::min(e, bb + kBlock);
          RangeSeen r;
          const int32_t over = alone ? split_alone(v + bb, d + bb, limit_f, be - bb, r)
                                     : split_with_sum(v + bb, s + bb, d + bb, limit32, be - bb, r);
          chunk.merge(r);
          if (over == 0) continue;
          // List the block's large values, their totals recomputed in int64 while the block
          // is cached: the pass left 0 where its 32 bits could not tell, and wrote every
          // other element's total.
          uint32_t unused = 0;
          for (int64_t i = bb; i < be; ++i) {
            if (d[i] != 0) continue;
            const int64_t t =
                (alone ? 0 : static_cast<int64_t>(s[i])) + to_int64(scaled(v[i], unused));
            if (t >= dense_limit || t <= -dense_limit) {
              large[c].emplace_back(from + i, t);
            } else {
              d[i] = static_cast<int32_t>(t);
            }
          }
        }
        if (totals.empty()) return chunk;
        Spilled kept;
        auto sp = totals.begin();
        for (const auto& p : large[c]) {
          while (sp != totals.end() && sp->first < p.first) ++sp;
          if (sp == totals.end() || sp->first != p.first) kept.push_back(p);
        }
        for (const auto& [i, t] : totals) {
          const bool small = t < dense_limit && t > -dense_limit;
          d[i - from] = small ? static_cast<int32_t>(t) : 0;
          if (!small) kept.emplace_back(i, t);
        }
        std::sort(kept.begin(), kept.end(),
                  [](const auto& x, const auto& y) { return x.first < y.first; });
        large[c] = std::move(kept);
        return chunk;
      },
      &both_);
  // The chunks' lists, in chunk order, are ascending.
  Spilled listed;
  for (const auto& l : large) listed.insert(listed.end(), l.begin(), l.end());
  const auto total = static_cast<int64_t>(listed.size());
  index = torch::empty({total}, torch::kInt64);
  value = torch::empty({total}, torch::kInt64);
  for (int64_t k = 0; k < total; ++k) {
    index.data_ptr<int64_t>()[k] = listed[k].first;
    value.data_ptr<int64_t>()[k] = listed[k].second;
  }
  return seen.result();
}

namespace {

/// The listed element k's value: (dense + listed) · 2^-36, rounded to float once.
float listed_float(const int32_t* d, int64_t i, int64_t value) {
  return static_cast<float>(static_cast<double>(static_cast<int64_t>(d[i]) + value) * kUnit);
}

/// The first listed position whose index is at least `from` (indices ascending).
int64_t first_listed(const int64_t* ip, int64_t listed, int64_t from) {
  return std::lower_bound(ip, ip + listed, from) - ip;
}

}  // namespace

void FixedPointSum::assemble(const torch::Tensor& dense, const torch::Tensor& index,
                             const torch::Tensor& value, torch::Tensor& values, int64_t from) {
  VFLOW_ASSERT(dense.numel() == values.numel() && dense.scalar_type() == torch::kInt32,
               "assemble from a dense part of another size or type");
  VFLOW_ASSERT(index.device().is_cpu() && value.device().is_cpu() &&
                   index.scalar_type() == torch::kInt64 && value.scalar_type() == torch::kInt64,
               "the listed values must be int64 on the CPU");
  VFLOW_ASSERT(from >= 0 && from <= values.numel(), "assemble from outside the buffer");
  const auto ic = index.contiguous();
  const auto vc = value.contiguous();
  const int64_t* ip = ic.data_ptr<int64_t>();
  const int64_t* vp = vc.data_ptr<int64_t>();
  const int64_t listed = index.numel();
  // With from > 0, the indices are ascending (as reduce delivers them).
  const int64_t first = from == 0 ? 0 : first_listed(ip, listed, from);
  const int64_t n = values.numel() - from;
  if (!fast_path(values) || !dense.device().is_cpu() || !dense.is_contiguous()) {
    auto out = values.narrow(0, from, n);
    const auto part = dense.narrow(0, from, n);
    out.copy_(part.to(torch::kFloat64).mul_(kUnit));
    if (first == listed) return;
    const auto where = (ic.narrow(0, first, listed - first) - from).to(dense.device());
    const auto t = part.index_select(0, where)
                       .to(torch::kInt64)
                       .add_(vc.narrow(0, first, listed - first).to(dense.device()));
    out.index_put_({where}, t.to(torch::kFloat64).mul_(kUnit).to(values.scalar_type()));
    return;
  }
  const int32_t* d = dense.data_ptr<int32_t>();
  float* v = values.data_ptr<float>();
  for_chunks(n, [&](int64_t b, int64_t e, int64_t) {
    assemble_dense(d + from + b, v + from + b, e - b);
    return RangeSeen{};
  });
  for (int64_t k = first; k < listed; ++k) {
    const int64_t i = ip[k];
    VFLOW_ASSERT(i >= from && i < values.numel(), "a listed index outside the buffer");
    v[i] = listed_float(d, i, vp[k]);
  }
}

FixedPointSum::Reduced FixedPointSum::reduced(const torch::Tensor& dense,
                                              const torch::Tensor& index,
                                              const torch::Tensor& value, int64_t numel) {
  VFLOW_ASSERT(dense.device().is_cpu() && dense.scalar_type() == torch::kInt32 &&
                   dense.is_contiguous() && numel >= 0 && numel <= dense.numel(),
               "a reduced sum read from a dense part that is not int32 on the CPU");
  VFLOW_ASSERT(index.device().is_cpu() && value.device().is_cpu() &&
                   index.scalar_type() == torch::kInt64 && value.scalar_type() == torch::kInt64,
               "the listed values must be int64 on the CPU");
  const auto ic = index.contiguous();
  const auto vc = value.contiguous();
  const int64_t* ip = ic.data_ptr<int64_t>();
  const int64_t* vp = vc.data_ptr<int64_t>();
  Reduced r;
  r.dense = dense.data_ptr<int32_t>();
  r.numel = numel;
  const int64_t count = first_listed(ip, index.numel(), numel);
  r.index.assign(ip, ip + count);
  r.listed.reserve(static_cast<size_t>(count));
  for (int64_t k = 0; k < count; ++k) r.listed.push_back(listed_float(r.dense, ip[k], vp[k]));
  return r;
}

uint64_t FixedPointSum::contribution_hash(const torch::Tensor& values, int64_t n) {
  VFLOW_ASSERT(n >= 0 && n <= values.numel(), "a hash past the end of the values");
  const auto part = values.flatten().narrow(0, 0, n);
  // The integers the sum takes: float32 as the fast paths round it, anything else as
  // generic_rounded does; either way one int64 per element.
  torch::Tensor ints;
  const float* v = nullptr;
  torch::Tensor host;
  if (part.scalar_type() == torch::kFloat32) {
    host = part.to(torch::kCPU).contiguous();
    v = host.data_ptr<float>();
  } else {
    // A copy: generic_rounded scales a float64 tensor in place.
    const auto cpu = part.to(torch::kCPU, torch::kFloat64, /*non_blocking=*/false, /*copy=*/true);
    const auto outside = cpu.abs().ge(kLimit) | cpu.isnan();
    ints = generic_rounded(cpu).masked_fill_(outside, 0).contiguous();
  }
  const int64_t* q = ints.defined() ? ints.data_ptr<int64_t>() : nullptr;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<uint64_t> sums(static_cast<size_t>(chunks), 0);
  at::parallel_for(0, chunks, 1, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      uint64_t h = 0;
      uint32_t unused = 0;
      for (int64_t i = c * kChunk, e = std::min(n, (c + 1) * kChunk); i < e; ++i) {
        h += hash_term(q != nullptr ? q[i] : to_int64(scaled(v[i], unused)), i);
      }
      sums[static_cast<size_t>(c)] = h;
    }
  });
  uint64_t h = static_cast<uint64_t>(n);
  for (const uint64_t s : sums) h += s;
  return mix64(h);
}

}  // namespace vflow::vnode
