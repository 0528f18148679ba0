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

/// LAMB's scalars at step t (You et al. 2019, Algorithm 2, with bias correction).
struct LambScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float correction1, correction2;  // 1 − β1^t, 1 − β2^t
  float eps, weight_decay;
  bool decay;
};

/// The squares of n elements' parameters p and LAMB's direction u = (m'/c1) / (√(v'/c2) + ε)
/// + λp, where m' and v' are the moments after gradient g (left unwritten): out[0] = Σp²,
/// out[1] = Σu², each summed as doubles in 8 lanes (element i in lane i mod 8) that are
/// then added in lane order, so that the sums do not depend on the instruction set.
void lamb_norms(const float* __restrict p, const float* __restrict g, const float* __restrict m,
                const float* __restrict v, int64_t n, const LambScalars& s, double out[2]);
/// The same step applied: m and v become m' and v', and p becomes p + minus_rate · u.
void lamb_kernel(float* __restrict p, const float* __restrict g, float* __restrict m,
                 float* __restrict v, int64_t n, const LambScalars& s, float minus_rate);

/// out[0] = Σp², out[1] = Σg² over n elements, summed as lamb_norms sums.
void square_sums(const float* __restrict p, const float* __restrict g, int64_t n, double out[2]);
/// Σg² over n elements, summed as square_sums sums (semantic.clip's norm by canonical shard).
double square_sum(const float* __restrict g, int64_t n);

struct LarsScalars {
  float rate, weight_decay, momentum;
  bool decay;
};
/// LARS's step of n elements: buf = buf · momentum + rate · (g + λp), then p = p − buf.
void lars_kernel(float* __restrict p, const float* __restrict g, float* __restrict buf, int64_t n,
                 const LarsScalars& s);

/// n gradients as the update kernels read them, written out as floats.
void read_gradients(float* __restrict out, ReducedGradients g, int64_t n);
void read_gradients(float* __restrict out, RoundedGradients g, int64_t n);

}  // namespace vflow::engine
