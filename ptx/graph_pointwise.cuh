// Device helpers of the graph API's generated pointwise kernels (ptx/graph_pointwise.cu is the template).
// The expressions pydnn/graph/pointwise_ops.py writes call only these and CUDA's float math functions;
// the same names exist in numpy form there, so the CPU tests evaluate the very expressions emitted here.
#pragma once
#include "common/types.cuh"
#include "graph_params.h"

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

namespace pydnn {
namespace graph {

__device__ __forceinline__ float sel(float c, float a, float b) { return c != 0.0f ? a : b; }
__device__ __forceinline__ float lt(float a, float b) { return a < b ? 1.0f : 0.0f; }
__device__ __forceinline__ float gt(float a, float b) { return a > b ? 1.0f : 0.0f; }
__device__ __forceinline__ float le(float a, float b) { return a <= b ? 1.0f : 0.0f; }
__device__ __forceinline__ float ge(float a, float b) { return a >= b ? 1.0f : 0.0f; }
__device__ __forceinline__ float eq(float a, float b) { return a == b ? 1.0f : 0.0f; }
__device__ __forceinline__ float nz(float a) { return a != 0.0f ? 1.0f : 0.0f; }
__device__ __forceinline__ float land(float a, float b) { return (a != 0.0f && b != 0.0f) ? 1.0f : 0.0f; }
__device__ __forceinline__ float lor(float a, float b) { return (a != 0.0f || b != 0.0f) ? 1.0f : 0.0f; }
__device__ __forceinline__ float gelu_tanh_grad(float v) {
  const float k = 0.79788456080286536f;
  float th = tanhf(k * (v + 0.044715f * v * v * v));
  return 0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * k * (1.0f + 3.0f * 0.044715f * v * v);
}
// tanhf of a value the generator proved lies in [0, 9] (or is NaN): a RELU_FWD with lower clip >= 0, slope 0
// and upper clip <= 9 feeding TANH_FWD (codegen.expressions). The steps of CUDA 13's tanhf (its SASS for
// sm_90: 1 - 2 / (2^(2x log2 e) + 1) with MUFU.EX2 / MUFU.RCP from 0.6 up, the odd polynomial below) with
// the two that cannot change such a value left out: the saturation to 1 from |x| >= 9.0109 and the copy
// of x's sign (a FSETP, a FSEL and a LOP3 an element: ~6% of the 8-op chain's instructions). Bitwise
// tanhf's result on [-0, 9] (tests/graph/test_graph_gpu.py sweeps it).
__device__ __forceinline__ float tanh_nonneg(float x) {
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x * 2.8853900432586669922f));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(e + 1.0f));
  const float big = fmaf(r, -2.0f, 1.0f);
  const float x2 = x * x;
  float q = fmaf(x2, __int_as_float(0x3c80f082), -0.052303962409496307373f);
  q = fmaf(x2, q, 0.1331529766321182251f);
  q = fmaf(x2, q, -0.33332768082618713379f);
  q = fmaf(x2, q, 0.0f);
  const float small = fmaf(x, q, x);
  return x >= 0.6f ? big : small;
}
// GELU (erf form) by the activation family's 16-bit approximation (ptx/activation.cu: phi_fast_parts /
// gelu_fast, copied: that file is a kernel unit, not a header): <= 7.9e-6 relative error, >= 30x below a
// 16-bit output's rounding, ~15 instructions with 2 MUFU where 0.5 x (1 + erff(x / sqrt 2)) takes ~25.
// Emitted only with tuning.graph.PW_GELU_FAST (off: GELU_FWD's rule in the graph is erff's accuracy) and
// where every output of the kernel is 16-bit (codegen.expressions).
__device__ __forceinline__ float gelu_fast(float x) {
  float t, e;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(t) : "f"(fmaf(fabsf(x), 0.35355339059327373f, 1.0f)));
  float q = -2.649681568e-01f;
  q = fmaf(q, t, 1.058929324e+00f);
  q = fmaf(q, t, -1.399595976e+00f);
  q = fmaf(q, t, 4.629840851e-01f);
  q = fmaf(q, t, -3.489094973e-02f);
  q = fmaf(q, t, 5.615798235e-01f);
  q = fmaf(q, t, 1.441725373e+00f);
  q = fmaf(q, t, -2.825764418e+00f);
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(fmaf(x * x, -0.72134752044448170f, q)));
  const float u = fminf(fabsf(x), 1e30f) * t;
  return fmaf(-u, e, fmaxf(x, 0.0f));
}
// TANH_FWD by the hardware's tanh.approx.f32 (MUFU.TANH, sm_75 on; max relative error 2^-10.987, the
// RNN's PERSIST_FAST_MATH form): one instruction where tanhf takes ~15 (tanh_nonneg 12). Emitted only with
// tuning.graph.PW_TANH_FAST and where every output of the kernel is bfloat16, whose half ulp (2^-9
// relative) is 4x the approximation's error (codegen.expressions); sm_80's and sm_90's PTX both have it.
__device__ __forceinline__ float tanh_fast(float x) {
  float r;
  asm("tanh.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
// gelu_fast with a degree-5 polynomial (pydnn's own fit, the same Lawson-reweighted least squares on
// t in [1/6, 1], coefficients rounded to float): <= 1.5e-5 relative (float32 emulation with exact rcp / ex2,
// at x ~ -12 from rounding x^2; <= 8.6e-6 for |x| <= 6), 130x below bfloat16's half ulp, 2 FFMA an element
// less. Emitted only with tuning.graph.PW_GELU_DEG5 and where every output is bfloat16 (for half outputs it
// would be ~16x below a half ulp, under the 30x the 16-bit forms keep).
__device__ __forceinline__ float gelu_fast5(float x) {
  float t, e;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(t) : "f"(fmaf(fabsf(x), 0.35355339059327373f, 1.0f)));
  float q = 3.300778188e-01f;
  q = fmaf(q, t, -1.023156179e+00f);
  q = fmaf(q, t, 6.845609517e-01f);
  q = fmaf(q, t, 3.670772804e-01f);
  q = fmaf(q, t, 1.468684776e+00f);
  q = fmaf(q, t, -2.827233663e+00f);
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(fmaf(x * x, -0.72134752044448170f, q)));
  const float u = fminf(fabsf(x), 1e30f) * t;
  return fmaf(-u, e, fmaxf(x, 0.0f));
}
// GELU with ONE MUFU (issue 22, the fused matmul epilogue): GELU(x) = max(x, 0) - a Phi(-a) with a = |x| and
// Phi(-a) = 2^h(a), h = log2 Phi(-a) smooth on [0, inf), held by one degree-9 polynomial in a itself on [0, 12.95]
// (tools/gelu_ex2.py fits it: minimax, coefficients rounded to float from the top down). gelu_fast5 takes 2 MUFU
// (RCP, EX2) and 15 instructions an output with the bias add; this 1 MUFU and 14 (min.NaN, 9 FFMA, EX2, max, FFMA).
// a is clamped at 13 (min.NaN: NaN stays NaN): 2^h(13) = 2^-126.9 flushes to 0 (.ftz), so x >= 13 gives x and
// x <= -13 (or -inf) -0. Exhaustive float32 scan of this exact sequence (tools/gelu_ex2.py scan, every bit
// pattern): relative error <= 3.97e-5 for x > -12.9 (at x = -12.615; 1.9e-5 for |x| <= 6; 49x below bfloat16's half
// ulp, 2^-9; the 16-bit rule's 30x is 6.5e-5), subnormal results likewise beyond their rounding; below x = -12.9,
// Phi(x) nears 2^-126 and outputs of magnitude <= 1.53e-37 flush to -0 (.ftz). Emitted only with
// tuning.graph.EPI_GELU_EX2, in fused matmul epilogues whose every output is bfloat16 (codegen.expressions).
__device__ __forceinline__ float gelu_ex2(float x) {
  float a, e;
  asm("{\n\t.reg .f32 t;\n\tabs.f32 t, %1;\n\tmin.NaN.f32 %0, t, 0f41500000;\n\t}" : "=f"(a) : "f"(x));
  float q = -2.035227986e-09f;
  q = fmaf(q, a, 1.465483734e-07f);
  q = fmaf(q, a, -4.646262823e-06f);
  q = fmaf(q, a, 8.588754281e-05f);
  q = fmaf(q, a, -1.036967617e-03f);
  q = fmaf(q, a, 8.734164760e-03f);
  q = fmaf(q, a, -5.411468074e-02f);
  q = fmaf(q, a, -4.586054087e-01f);
  q = fmaf(q, a, -1.151065230e+00f);
  q = fmaf(q, a, -1.000024796e+00f);
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(q));
  return fmaf(-a, e, fmaxf(x, 0.0f));
}
__device__ __forceinline__ float swish_grad(float v, float beta) {
  float s = 1.0f / (1.0f + expf(-beta * v));
  return s + beta * v * s * (1.0f - s);
}

// Read-only loads of graph inputs as float (ld.global.nc: the compiler may move them across the kernel's
// stores, which it must otherwise assume alias them), single and as aligned pairs.
__device__ __forceinline__ float ldf(const float* p) { return __ldg(p); }
__device__ __forceinline__ float ldf(const half_t* p) {
  unsigned short b;
  asm("ld.global.nc.u16 %0, [%1];" : "=h"(b) : "l"(p));
  half_t h;
  h.bits = b;
  return to_float(h);
}
__device__ __forceinline__ float ldf(const bf16_t* p) {
  unsigned short b;
  asm("ld.global.nc.u16 %0, [%1];" : "=h"(b) : "l"(p));
  return __uint_as_float(((unsigned)b) << 16);
}
__device__ __forceinline__ void ldf2(const float* p, float& a, float& b) {
  const float2 v = __ldg(reinterpret_cast<const float2*>(p));
  a = v.x;
  b = v.y;
}
template <class T> __device__ __forceinline__ void ldf2(const T* p, float& a, float& b) {
  unsigned w;
  asm("ld.global.nc.b32 %0, [%1];" : "=r"(w) : "l"(p));
  unpack16x2<T>(w, a, b);
}
// A pair from shared memory (s: a shared-window address, 2-element aligned): a fused GEMM epilogue's column
// operand staged once per tile (codegen's stage_bn; ptx/matmul.cu's gemm_tma_body), as float.
template <class T> __device__ __forceinline__ void lds2(unsigned s, float& a, float& b) {
  if constexpr (sizeof(T) == 4) {
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(a), "=f"(b) : "r"(s) : "memory");
  } else {
    unsigned w;
    asm volatile("ld.shared.b32 %0, [%1];" : "=r"(w) : "r"(s) : "memory");
    unpack16x2<T>(w, a, b);
  }
}

// A staged 16-bit chunk (8 values, w) widened to 8 floats at shared address s (32-byte aligned): a fused GEMM
// epilogue's column operand held as float in its staged buffer (codegen's widen, tuning.matmul.EPI_WIDEN), so
// the epilogue reads pairs of floats with no conversion (bfloat16: 2 instructions a pair, 64 a thread a tile).
template <class T> __device__ __forceinline__ void sts_widen(unsigned s, const uint4& w) {
  float f[8];
  unpack16x2<T>(w.x, f[0], f[1]);
  unpack16x2<T>(w.y, f[2], f[3]);
  unpack16x2<T>(w.z, f[4], f[5]);
  unpack16x2<T>(w.w, f[6], f[7]);
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(s), "f"(f[0]), "f"(f[1]), "f"(f[2]), "f"(f[3])
               : "memory");
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(s + 16u), "f"(f[4]), "f"(f[5]), "f"(f[6]), "f"(f[7])
               : "memory");
}

// A run of E consecutive elements as one aligned vector, to / from float (Run; `a` points at E floats of a
// register array, indexed by constants once the callers' loops unroll); Run16 (16-bit types, E
// even: the generator picks it) goes through 32-bit words (one shift or mask per element in, one paired conversion per two elements out) instead of a
// widening move and a per-element conversion plus merge.
template <class T, int E> struct Run {
  __device__ static __forceinline__ void load(const T* p, float* a) {
    const Vec<T, E> w = *reinterpret_cast<const Vec<T, E>*>(p);
#pragma unroll
    for (int e = 0; e < E; ++e) a[e] = pydnn::load<float>(w.v[e]);
  }
  __device__ static __forceinline__ void store(T* p, const float* a) {
    Vec<T, E> w;
#pragma unroll
    for (int e = 0; e < E; ++e) w.v[e] = pydnn::store<T>(a[e]);
    *reinterpret_cast<Vec<T, E>*>(p) = w;
  }
};
template <class T, int E> struct Run16 {
  static_assert(E % 2 == 0, "pairs");
  __device__ static __forceinline__ void load(const T* p, float* a) {
    const Vec<unsigned, E / 2> w = *reinterpret_cast<const Vec<unsigned, E / 2>*>(p);
#pragma unroll
    for (int e = 0; e < E / 2; ++e) unpack16x2<T>(w.v[e], a[2 * e], a[2 * e + 1]);
  }
  __device__ static __forceinline__ void store(T* p, const float* a) {
    Vec<unsigned, E / 2> w;
#pragma unroll
    for (int e = 0; e < E / 2; ++e) w.v[e] = pack16x2<T>(a[2 * e], a[2 * e + 1]);
    *reinterpret_cast<Vec<unsigned, E / 2>*>(p) = w;
  }
};

// A run held as loaded (the prefetch form, tuning.graph.PW_PREFETCH: the next iteration's runs are loaded
// before this one's arithmetic and kept in their storage form, two 16-bit elements a register, until
// get() widens them where they are used). Raw16: 16-bit types, E even; Raw: any.
template <class T, int E> struct Raw {
  Vec<T, E> w;
  __device__ __forceinline__ void load(const T* p) { w = *reinterpret_cast<const Vec<T, E>*>(p); }
  __device__ __forceinline__ void get(float* a) const {
#pragma unroll
    for (int e = 0; e < E; ++e) a[e] = pydnn::load<float>(w.v[e]);
  }
};
template <class T, int E> struct Raw16 {
  static_assert(E % 2 == 0, "pairs");
  Vec<unsigned, E / 2> w;
  __device__ __forceinline__ void load(const T* p) { w = *reinterpret_cast<const Vec<unsigned, E / 2>*>(p); }
  __device__ __forceinline__ void get(float* a) const {
#pragma unroll
    for (int e = 0; e < E / 2; ++e) unpack16x2<T>(w.v[e], a[2 * e], a[2 * e + 1]);
  }
};

// Element offsets of NOPS operands for the linear output index i over NDIM dims (outermost first), in the
// index type I (int when the launch proved every offset fits).
// With I = int (the launch proved every index fits in 31 bits) the div / mod by each dim is a multiply-high
// and shifts by the host's magic numbers (p.magic / p.shift, codegen.magic_u32) instead of the ~20
// instructions of a 32-bit division by a value the compiler does not know.
__device__ __forceinline__ unsigned udiv_magic(unsigned n, unsigned magic, int shift) {
  if (shift == 0) return n;
  const unsigned t = __umulhi(n, magic);
  return (t + ((n - t) >> 1)) >> (shift - 1);
}

template <int NOPS, int NDIM, class I>
__device__ __forceinline__ void offsets(const GraphPwParams& p, I i, I (&off)[NOPS]) {
#pragma unroll
  for (int k = 0; k < NOPS; ++k) off[k] = 0;
#pragma unroll
  for (int d = NDIM - 1; d >= 0; --d) {
    I c = i;
    if (d > 0) {
      const I n = (I)p.dims[d];
      I q;
      if constexpr (sizeof(I) == 4)
        q = (I)udiv_magic((unsigned)i, p.magic[d], p.shift[d]);
      else
        q = i / n;
      c = i - q * n;
      i = q;
    }
#pragma unroll
    for (int k = 0; k < NOPS; ++k) off[k] += c * (I)p.stride[k][d];
  }
}

}  // namespace graph
}  // namespace pydnn
