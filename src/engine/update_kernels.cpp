// Compiled with -ffp-contract=off (no multiply-add fused into one rounding),
// -fno-trapping-math and -fno-math-errno (so that the loops, square roots included,
// vectorise; no value changes): every operation rounds once by IEEE rules, so the
// baseline, AVX2 and AVX-512 versions and hosts of different instruction sets give the
// same bits.
#include "engine/update_kernels.h"

#include <cmath>

#include "vnode/fixed_point_rounding.h"

namespace vflow::engine {

// Plain loops over restrict pointers, with loop-invariant branches the compiler hoists.
// Each body is written once, over a gradient source G: floats, int32 values times a unit,
// or floats rounded as they are read. The bodies are always inlined, so each clone
// compiles them for its own target.
#define VFLOW_KERNEL __attribute__((target_clones("avx2", "default")))
// The kernels that round as they read are bound by their instructions more than by memory
// (about 0.7 ms more than the plain SGD on the 5.8 M-parameter MLP in AVX2, 0.15 ms in
// AVX-512), so they have an AVX-512 version too; the same bits, as for the others.
#define VFLOW_ROUNDING_KERNEL __attribute__((target_clones("avx512f", "avx2", "default")))
#define VFLOW_BODY __attribute__((always_inline)) inline

namespace {

struct FloatGradients {
  const float* __restrict g;
  float operator[](int64_t i) const { return g[i]; }
};

/// An int32 rounded to float, times a power of two (exact): what
/// vnode::FixedPointSum::assemble writes for an element that is not listed.
struct FixedGradients {
  const int32_t* __restrict q;
  float unit;
  float operator[](int64_t i) const { return static_cast<float>(q[i]) * unit; }
};

/// A float gradient rounded to a multiple of 2^-36 as it is read.
struct RoundedFloatGradients {
  const float* __restrict g;
  float operator[](int64_t i) const { return vnode::rounding::to_unit(g[i]); }
};

template <typename G>
VFLOW_BODY void sgd_body(float* __restrict p, G g, float* __restrict buf, int64_t n,
                         const SgdScalars& s) {
  const float lr = s.minus_lr, wd = s.weight_decay, m = s.momentum, keep = s.keep;
  const bool decay = s.decay, use_momentum = s.use_momentum, nesterov = s.nesterov, first = s.first;
  for (int64_t i = 0; i < n; ++i) {
    float d = g[i];
    if (decay) d = d + wd * p[i];  // d_p.add(p, weight_decay)
    if (use_momentum) {
      // buf.mul_(momentum).add_(d_p, 1 - dampening), or a copy of d_p at first.
      const float b = first ? d : buf[i] * m + keep * d;
      buf[i] = b;
      d = nesterov ? d + m * b : b;  // d_p.add(buf, momentum), or buf
    }
    p[i] = p[i] + lr * d;  // p.add_(d_p, -lr)
  }
}

template <typename G>
VFLOW_BODY void adamw_body(float* __restrict p, G g, float* __restrict m, float* __restrict v,
                           int64_t n, const AdamWScalars& s) {
  const float f = s.decay_factor, b1 = s.beta1, c1 = s.one_minus_beta1, b2 = s.beta2,
              c2 = s.one_minus_beta2, root = s.sqrt_correction2, eps = s.eps,
              step = s.minus_step_size;
  const bool decay = s.decay;
  for (int64_t i = 0; i < n; ++i) {
    float w = p[i];
    if (decay) w = w * f;  // p.mul_(1 - lr · weight_decay)
    const float gi = g[i];
    const float mi = m[i] * b1 + c1 * gi;       // exp_avg.mul_(β1).add_(grad, 1 − β1)
    const float vi = v[i] * b2 + c2 * gi * gi;  // exp_avg_sq.mul_(β2).addcmul_(grad, grad, 1 − β2)
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / root + eps;  // (exp_avg_sq.sqrt() / √c2).add_(eps)
    p[i] = w + step * (mi / denom);                  // p.addcdiv_(exp_avg, denom, −step_size)
  }
}

/// LAMB's direction of one element, with the moments m' and v' after gradient gi.
VFLOW_BODY float lamb_direction(float w, float gi, float& mi, float& vi, const LambScalars& s) {
  mi = mi * s.beta1 + s.one_minus_beta1 * gi;  // exp_avg.mul_(β1).add_(grad, 1 − β1)
  vi = vi * s.beta2 +
       s.one_minus_beta2 * gi * gi;  // exp_avg_sq.mul_(β2).addcmul_(grad, grad, 1 − β2)
  float u = (mi / s.correction1) / (std::sqrt(vi / s.correction2) + s.eps);
  if (s.decay) u = u + s.weight_decay * w;  // u.add_(p, λ)
  return u;
}

/// Σa², Σb² over n elements, where a(i) and b(i) give element i's floats: in 8 double
/// lanes (element i in lane i mod 8, so that a vectorised loop adds in each lane's order),
/// the lanes then added in order.
template <typename A, typename B>
VFLOW_BODY void lane_sums(int64_t n, A a, B b, double out[2]) {
  constexpr int kLanes = 8;
  double sa[kLanes] = {};
  double sb[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const double x = a(i + j);
      const double y = b(i + j);
      sa[j] += x * x;
      sb[j] += y * y;
    }
  }
  for (int j = 0; i < n; ++i, ++j) {
    const double x = a(i);
    const double y = b(i);
    sa[j] += x * x;
    sb[j] += y * y;
  }
  out[0] = sa[0];
  out[1] = sb[0];
  for (int j = 1; j < kLanes; ++j) {
    out[0] += sa[j];
    out[1] += sb[j];
  }
}

}  // namespace

VFLOW_KERNEL void lamb_norms(const float* __restrict p, const float* __restrict g,
                             const float* __restrict m, const float* __restrict v, int64_t n,
                             const LambScalars& s, double out[2]) {
  lane_sums(
      n, [&](int64_t i) { return p[i]; },
      [&](int64_t i) {
        float mi = m[i];
        float vi = v[i];
        return lamb_direction(p[i], g[i], mi, vi, s);
      },
      out);
}

VFLOW_KERNEL void lamb_kernel(float* __restrict p, const float* __restrict g, float* __restrict m,
                              float* __restrict v, int64_t n, const LambScalars& s,
                              float minus_rate) {
  for (int64_t i = 0; i < n; ++i) {
    float mi = m[i];
    float vi = v[i];
    const float u = lamb_direction(p[i], g[i], mi, vi, s);
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] + minus_rate * u;  // p.add_(u, −lr · ratio)
  }
}

VFLOW_KERNEL void square_sums(const float* __restrict p, const float* __restrict g, int64_t n,
                              double out[2]) {
  lane_sums(
      n, [&](int64_t i) { return p[i]; }, [&](int64_t i) { return g[i]; }, out);
}

VFLOW_KERNEL double square_sum(const float* __restrict g, int64_t n) {
  double out[2];
  lane_sums(
      n, [&](int64_t i) { return g[i]; }, [](int64_t) { return 0.0F; }, out);
  return out[0];
}

VFLOW_KERNEL void lars_kernel(float* __restrict p, const float* __restrict g, float* __restrict buf,
                              int64_t n, const LarsScalars& s) {
  for (int64_t i = 0; i < n; ++i) {
    float d = g[i];
    if (s.decay) d = d + s.weight_decay * p[i];        // grad.add(p, λ)
    const float b = buf[i] * s.momentum + s.rate * d;  // buffer.mul_(momentum).add_(d, rate)
    buf[i] = b;
    p[i] = p[i] - b;  // p.sub_(buffer)
  }
}

void read_gradients(float* __restrict out, ReducedGradients g, int64_t n) {
  const FixedGradients r{g.q, g.unit};
  for (int64_t i = 0; i < n; ++i) out[i] = r[i];
}

void read_gradients(float* __restrict out, RoundedGradients g, int64_t n) {
  const RoundedFloatGradients r{g.g};
  for (int64_t i = 0; i < n; ++i) out[i] = r[i];
}

VFLOW_KERNEL void sgd_kernel(float* __restrict p, const float* __restrict g, float* __restrict buf,
                             int64_t n, const SgdScalars& s) {
  sgd_body(p, FloatGradients{g}, buf, n, s);
}

VFLOW_KERNEL void sgd_kernel(float* __restrict p, ReducedGradients g, float* __restrict buf,
                             int64_t n, const SgdScalars& s) {
  sgd_body(p, FixedGradients{g.q, g.unit}, buf, n, s);
}

VFLOW_ROUNDING_KERNEL void sgd_kernel(float* __restrict p, RoundedGradients g,
                                      float* __restrict buf, int64_t n, const SgdScalars& s) {
  sgd_body(p, RoundedFloatGradients{g.g}, buf, n, s);
}

VFLOW_KERNEL void adamw_kernel(float* __restrict p, const float* __restrict g, float* __restrict m,
                               float* __restrict v, int64_t n, const AdamWScalars& s) {
  adamw_body(p, FloatGradients{g}, m, v, n, s);
}

VFLOW_KERNEL void adamw_kernel(float* __restrict p, ReducedGradients g, float* __restrict m,
                               float* __restrict v, int64_t n, const AdamWScalars& s) {
  adamw_body(p, FixedGradients{g.q, g.unit}, m, v, n, s);
}

VFLOW_ROUNDING_KERNEL void adamw_kernel(float* __restrict p, RoundedGradients g,
                                        float* __restrict m, float* __restrict v, int64_t n,
                                        const AdamWScalars& s) {
  adamw_body(p, RoundedFloatGradients{g.g}, m, v, n, s);
}

#undef VFLOW_ROUNDING_KERNEL
#undef VFLOW_BODY
#undef VFLOW_KERNEL

}  // namespace vflow::engine
