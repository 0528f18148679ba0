// The fused optimizer update's element loops (engine/fused_update.h), apart from LibTorch
// so that they compile with their own floating-point flags: each expression is LibTorch's
// SGD's or AdamW's, in its order, with its scalars rounded to float as LibTorch's kernels
// round them.
#pragma once

#include <cstdint>

namespace vflow::engine {

struct SgdScalars {
  float minus_lr, weight_decay, momentum, keep;  // keep = 1 - dampening
  bool decay, use_momentum, nesterov, first;     // first: the buffer starts as d_p
};

/// n elements: parameters p, gradients g, momentum buffer buf (unused without momentum).
void sgd_kernel(float* __restrict p, const float* __restrict g, float* __restrict buf, int64_t n,
                const SgdScalars& s);
/// Gradients float(q[i]) · unit: deterministic mode's reduced integers.
struct ReducedGradients {
  const int32_t* q;
  float unit;
};

/// The same with reduced integers for gradients.
void sgd_kernel(float* __restrict p, ReducedGradients g, float* __restrict buf, int64_t n,
                const SgdScalars& s);

/// Gradients rounded to multiples of 2^-36 as they are read (deterministic mode's one
/// vnode on one worker: vnode/fixed_point_rounding.h), bitwise what
/// vnode::FixedPointSum::round_in_place leaves for values in its range.
struct RoundedGradients {
  const float* g;
};

/// The same with each gradient rounded as it is read.
void sgd_kernel(float* __restrict p, RoundedGradients g, float* __restrict buf, int64_t n,
                const SgdScalars& s);

struct AdamWScalars {
  float decay_factor;  // 1 - lr · weight_decay
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float sqrt_correction2, eps, minus_step_size;  // √(1 − β2^t), −lr / (1 − β1^t)
  bool decay;
};

/// n elements: parameters p, gradients g, first and second moments m and v.
void adamw_kernel(float* __restrict p, const float* __restrict g, float* __restrict m,
                  float* __restrict v, int64_t n, const AdamWScalars& s);
/// The same with reduced integers for gradients.
void adamw_kernel(float* __restrict p, ReducedGradients g, float* __restrict m, float* __restrict v,
                  int64_t n, const AdamWScalars& s);

/// The same with each gradient rounded as it is read.
void adamw_kernel(float* __restrict p, RoundedGradients g, float* __restrict m, float* __restrict v,
                  int64_t n, const AdamWScalars& s);

}  // namespace vflow::engine
