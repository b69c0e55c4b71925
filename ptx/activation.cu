// Activations, forward and backward, as element-wise map ops (see common/elementwise.cuh).
// Forward: in0 = x.  Backward: in0 = dy, in1 = y, in2 = x (each op reads only what it needs).
// p.coef: clipped-ReLU ceiling / ELU alpha; p.coef2: swish beta.
// FAST (used for half and bfloat16 storage): exp and division by the hardware approximations, whose
// float32 error (a few ulps) is far below the 16-bit output's rounding, and GELU's normal CDF by the
// approximation phi_fast below; float and double keep the library erf / erfc (see gelu_cdf).
#include "common/elementwise.cuh"

namespace pydnn {
namespace act {

template <bool FAST, class A> __device__ __forceinline__ A ex(A x) { return m_exp(x); }
template <> __device__ __forceinline__ float ex<true, float>(float x) { return __expf(x); }
template <bool FAST, class A> __device__ __forceinline__ A sigmoid(A x) { return pydnn::sigmoid(x); }
template <> __device__ __forceinline__ float sigmoid<true, float>(float x) {
  float e = __expf(-fabsf(x));
  float s = __fdividef(1.0f, 1.0f + e);
  return x >= 0.0f ? s : e * s;
}

// sqrt(2/pi) and 1/sqrt(2*pi), 1/sqrt(2), for the GELU forms.
#define PYDNN_SQRT_2_OVER_PI 0.7978845608028654
#define PYDNN_INV_SQRT_2PI 0.3989422804014327
#define PYDNN_INV_SQRT_2 0.7071067811865476

__device__ __forceinline__ float rcp_approx(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ float ex2_approx(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// tanh for 16-bit storage (Tanh<true>): tanhf evaluates a polynomial and an exponential form and selects
// one, and with the folded 16-bit conversions bf16 tanh ran at 94% of copy on the H200 (0.90-0.94x PyTorch at
// 12701 x 65536; the plain cache policy did not move it). The vector kernel's whole-tile path (map_contig<h16_t,
// h16_t, Tanh, 8, 128, 1, 1>, sm_90 SASS, load to store) is 19.1 instructions an element with tanhf and 16.0
// with this form (kernel 952 -> 840 instructions, 32 registers, no spills either way); bf16 12701 x 65536 then ran
// 0.985x PyTorch (0.891x with tanhf, same run: pydnn/ops/activation.py). |x| >= 1/8: (1 - t) / (1 + t),
// t = e^(-2|x|) by ex2.approx, the division by rcp.approx, the sign copied back; |x| < 1/8 (where 1 - t
// cancels): x (1 - x^2 / 3 + 2 x^4 / 15). Relative error, emulated
// in float32 with exact exp2 / reciprocal on 4.4M points of [-10, 10] and +-(1e-30..16): <= 3.9e-7 (2^-21.3),
// plus ex2.approx's ~2^-22 amplified by at most 0.78 / 0.22 at |x| = 1/8: < 1.5e-6 in all, >= 160x below a
// half ulp (2.4e-4 relative for fp16, 2.0e-3 for bf16). +-inf gives +-1, NaN stays NaN (it fails the
// |x| < 1/8 test), -0 stays -0. tanhf stays on Tanh<false> (float, double; 16-bit with tuning's TANH_FAST off).
__device__ __forceinline__ float tanh_fast(float x) {
  const float a = fabsf(x);
  const float t = ex2_approx(a * -2.8853900817779268f);  // e^(-2|x|): -2 log2(e)
  const float r = copysignf((1.0f - t) * rcp_approx(1.0f + t), x);
  const float x2 = x * x;
  const float p = x * fmaf(x2, fmaf(x2, 0.13333333333333333f, -0.33333333333333333f), 1.0f);
  return a < 0.125f ? p : r;
}
template <bool FAST, class A> __device__ __forceinline__ A tanh_of(A x) { return m_tanh(x); }
template <> __device__ __forceinline__ float tanh_of<true, float>(float x) { return tanh_fast(x); }

// Phi(x), the standard normal CDF, for 16-bit GELU (erf form): erff costs ~40 instructions with both of
// its branches taken in a warp of random inputs, which made bf16 GELU compute-bound (74% of copy on the
// H200). Here, branch-free, 2 MUFU + ~13 FMA-pipe instructions:
//   Phi(-|x|) = 0.5 erfc(z) = t * 2^(Q(t) - x^2 log2(e) / 2),  z = |x| / sqrt(2),  t = 1 / (1 + z / 2),
// Q a degree-7 polynomial fitted (minimax by reweighted least squares, pydnn's own fit) to
// log2(0.5 erfc(z) / t) + z^2 log2(e) on t in [1/6, 1] (z in [0, 10]; beyond, the result underflows every
// 16-bit type). The fit alone has relative error <= 7.1e-7 in Phi(-|x|); evaluated in float32 (emulated
// with the float32-rounded coefficients below) <= 4.6e-7 absolute in Phi everywhere and <= 7.9e-6
// relative (at |x| ~ 11, from rounding x^2), plus ~2^-22 each from rcp.approx / ex2.approx. A half ulp is
// 2.4e-4 relative for fp16 and 2.0e-3 for bf16: the error is >= 30x below the output's own rounding.
// phi_fast_parts returns e = 2^(Q(t) - x^2 log2(e) / 2) and t, so Phi(-|x|) = t * e.
__device__ __forceinline__ float phi_fast_parts(float x, float& t) {
  t = rcp_approx(fmaf(fabsf(x), 0.35355339059327373f, 1.0f));  // 1 / (1 + |x| / (2 sqrt 2))
  float q = -2.649681568e-01f;
  q = fmaf(q, t, 1.058929324e+00f);
  q = fmaf(q, t, -1.399595976e+00f);
  q = fmaf(q, t, 4.629840851e-01f);
  q = fmaf(q, t, -3.489094973e-02f);
  q = fmaf(q, t, 5.615798235e-01f);
  q = fmaf(q, t, 1.441725373e+00f);
  q = fmaf(q, t, -2.825764418e+00f);
  return ex2_approx(fmaf(x * x, -0.72134752044448170f, q));  // log2(e) / 2
}
// Phi(x) = Phi(-|x|) for x < 0, else 1 - Phi(-|x|); no cancellation in the negative tail. NaN stays NaN;
// x -> +-inf gives 1 / 0. float and double keep erff / erfc (gelu_cdf<false>).
__device__ __forceinline__ float phi_fast(float x) {
  float t;
  const float e = phi_fast_parts(x, t);  // sets t: not in the same expression as a read of t
  const float h = t * e;                 // Phi(-|x|)
  return x < 0.0f ? h : 1.0f - h;
}
// x Phi(x) for 16-bit GELU: max(x, 0) - |x| Phi(-|x|), the same value for either sign (x >= 0:
// x (1 - Phi(-x)); x < 0: x Phi(x)) without Phi's select and 1 - h: one fma after the exponential, 4
// instructions where x * phi_fast(x) takes 5 (bf16 GELU is compute-bound on the H200). |x| is capped at
// 1e30 in |x| t, which is 2 sqrt 2 / (1 + 2 sqrt 2 / |x|) and would be inf * 0 at x = +inf: GELU(+inf) =
// +inf, GELU(-inf) = 0 (the limit; 0.5 x (1 + erf) evaluates to NaN there), NaN stays NaN.
__device__ __forceinline__ float gelu_fast(float x) {
  float t;
  const float e = phi_fast_parts(x, t);
  const float u = fminf(fabsf(x), 1e30f) * t;
  return fmaf(-u, e, fmaxf(x, 0.0f));
}
// GELU's Phi(x) = 0.5 (1 + erf(x / sqrt 2)).
// double: as 0.5 erfc(-x / sqrt 2), which keeps its relative accuracy in the negative tail, where 1 + erf
// cancels. float: PyTorch's 0.5 (1 + erff(x / sqrt 2)), whose absolute error (~1e-7) becomes a large
// relative one below x ~ -4 (2% at x = -4.7); erfcf instead cost 20% of fp32 GELU's bandwidth on the H200
// (80% of copy, 0.81x PyTorch, against 99.6% and 1.00x), a price not paid for outputs below 1e-5.
__device__ __forceinline__ double m_erfc(double x) { return erfc(x); }
template <bool FAST, class A> __device__ __forceinline__ A gelu_cdf(A x) {
  return A(0.5) * m_erfc(-x * (A)PYDNN_INV_SQRT_2);
}
template <> __device__ __forceinline__ float gelu_cdf<false, float>(float x) {
  return 0.5f * (1.0f + erff(x * (float)PYDNN_INV_SQRT_2));
}
template <> __device__ __forceinline__ float gelu_cdf<true, float>(float x) { return phi_fast(x); }

template <bool FAST> struct Identity {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A x, A, A, const MapParams&, A alpha, A) { return alpha * x; }
};
template <bool FAST> struct Relu {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A x, A, A, const MapParams& p, A alpha, A) {
    A r = x > A(0) ? x : A(0);
    if ((p.flags & PYDNN_FLAG_NAN_PROP) && m_isnan(x)) r = x;
    return alpha * r;
  }
};
template <bool FAST> struct ClippedRelu {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A x, A, A, const MapParams& p, A alpha, A) {
    A c = (A)p.coef;
    A r = x > A(0) ? (x < c ? x : c) : A(0);
    if ((p.flags & PYDNN_FLAG_NAN_PROP) && m_isnan(x)) r = x;
    return alpha * r;
  }
};
template <bool FAST> struct Sigmoid {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A x, A, A, const MapParams&, A alpha, A) { return alpha * sigmoid<FAST>(x); }
};
template <bool FAST> struct Tanh {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A x, A, A, const MapParams&, A alpha, A) {
    return alpha * tanh_of<FAST>(x);
  }
};
template <bool FAST> struct Elu {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A x, A, A, const MapParams& p, A alpha, A) {
    return alpha * (x > A(0) ? x : (A)p.coef * m_expm1(x));
  }
};
template <bool FAST> struct Swish {  // x * sigmoid(beta * x)
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A x, A, A, const MapParams& p, A alpha, A) {
    return alpha * x * sigmoid<FAST>((A)p.coef2 * x);
  }
};
template <bool FAST, class A> __device__ __forceinline__ A gelu_erf(A x) { return x * gelu_cdf<FAST>(x); }
template <> __device__ __forceinline__ float gelu_erf<true, float>(float x) { return gelu_fast(x); }
template <bool FAST> struct GeluErf {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A x, A, A, const MapParams&, A alpha, A) {
    return alpha * gelu_erf<FAST>(x);
  }
};
template <bool FAST> struct GeluTanh {  // 0.5 x (1 + tanh(u)) = x * sigmoid(2u): no cancellation for negative x
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A x, A, A, const MapParams&, A alpha, A) {
    A u = (A)PYDNN_SQRT_2_OVER_PI * (x + A(0.044715) * x * x * x);
    return alpha * x * sigmoid<FAST>(A(2) * u);
  }
};

// ---- backward: dx = alpha * f'(.) * dy ----
template <bool FAST> struct IdentityBwd {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A dy, A, A, const MapParams&, A alpha, A) { return alpha * dy; }
};
template <bool FAST> struct ReluBwd {  // from x: dy where x > 0
  static constexpr unsigned reads = 1 | 4;
  template <class A> __device__ static A apply(A dy, A, A x, const MapParams&, A alpha, A) {
    return x > A(0) ? alpha * dy : A(0);
  }
};
template <bool FAST> struct ClippedReluBwd {
  static constexpr unsigned reads = 1 | 4;
  template <class A> __device__ static A apply(A dy, A, A x, const MapParams& p, A alpha, A) {
    return (x > A(0) && x < (A)p.coef) ? alpha * dy : A(0);
  }
};
template <bool FAST> struct SigmoidBwd {  // from y: y (1 - y)
  static constexpr unsigned reads = 1 | 2;
  template <class A> __device__ static A apply(A dy, A y, A, const MapParams&, A alpha, A) {
    return alpha * dy * y * (A(1) - y);
  }
};
template <bool FAST> struct TanhBwd {  // from y: 1 - y^2
  static constexpr unsigned reads = 1 | 2;
  template <class A> __device__ static A apply(A dy, A y, A, const MapParams&, A alpha, A) {
    return alpha * dy * (A(1) - y * y);
  }
};
template <bool FAST> struct EluBwd {  // from x: 1 for x > 0, alpha e^x otherwise
  static constexpr unsigned reads = 1 | 4;
  template <class A> __device__ static A apply(A dy, A, A x, const MapParams& p, A alpha, A) {
    return alpha * dy * (x > A(0) ? A(1) : (A)p.coef * ex<FAST>(x));
  }
};
template <bool FAST> struct SwishBwd {  // s + b x s (1 - s), s = sigmoid(b x)
  static constexpr unsigned reads = 1 | 4;
  template <class A> __device__ static A apply(A dy, A, A x, const MapParams& p, A alpha, A) {
    A b = (A)p.coef2, s = sigmoid<FAST>(b * x);
    return alpha * dy * (s + b * x * s * (A(1) - s));
  }
};
template <bool FAST> struct GeluErfBwd {  // Phi(x) + x phi(x)
  static constexpr unsigned reads = 1 | 4;
  template <class A> __device__ static A apply(A dy, A, A x, const MapParams&, A alpha, A) {
    A cdf = gelu_cdf<FAST>(x);
    A pdf = (A)PYDNN_INV_SQRT_2PI * ex<FAST>(A(-0.5) * x * x);
    return alpha * dy * (cdf + x * pdf);
  }
};
template <bool FAST> struct GeluTanhBwd {  // s + 2 x s (1 - s) u', s = sigmoid(2u), 1 - s = sigmoid(-2u)
  static constexpr unsigned reads = 1 | 4;
  template <class A> __device__ static A apply(A dy, A, A x, const MapParams&, A alpha, A) {
    A k = (A)PYDNN_SQRT_2_OVER_PI;
    A u = k * (x + A(0.044715) * x * x * x);
    A du = k * (A(1) + A(3 * 0.044715) * x * x);
    A s = sigmoid<FAST>(A(2) * u), sm = sigmoid<FAST>(A(-2) * u);
    return alpha * dy * (s + A(2) * x * s * sm * du);
  }
};

}  // namespace act
}  // namespace pydnn
