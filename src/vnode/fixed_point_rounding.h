// The rounding of deterministic mode's exact sum (vnode/fixed_point.h), apart from
// LibTorch so that the fused update's kernels (engine/update_kernels.cpp) round alike.
// Both compile with -ffp-contract=off: every operation here is exact or rounds once.
#pragma once

#include <cmath>

namespace vflow::vnode::rounding {

constexpr float kScale = 68719476736.0f;        // 2^36
constexpr float kUnit = 1.0f / 68719476736.0f;  // 2^-36, exact

/// The nearest integer to x, ties to even, for any finite float: below 2^23 in
/// magnitude, adding and subtracting 2^23 (with x's sign) leaves the rounded value;
/// above, every float is an integer already. Both sides are computed, so that the
/// select vectorises (even without SSE4.1's roundps).
inline float round_even(float x) {
  constexpr float kBig = 8388608.0f;  // 2^23
  const float big = std::copysign(kBig, x);
  const float rounded = (x + big) - big;
  return std::fabs(x) < kBig ? rounded : x;
}

/// x (in the sum's range) as a multiple of 2^-36, what one vnode alone contributes: a
/// float that is an integer times 2^-36 is exact, so no integer step is needed.
inline float to_unit(float x) { return round_even(x * kScale) * kUnit; }

}  // namespace vflow::vnode::rounding
