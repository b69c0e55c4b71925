// Element types and their arithmetic ("accumulator") types, without cuda_fp16.h / cuda_bf16.h:
// the NVRTC wheel ships no CUDA headers, and we need only storage types plus conversions.
#pragma once

namespace pydnn {

typedef long long i64;
typedef unsigned long long u64;

struct __align__(2) half_t { unsigned short bits; };
struct __align__(2) bf16_t { unsigned short bits; };

// Conversions (round to nearest even; NaN and infinities preserved).
__device__ __forceinline__ float to_float(half_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
  return f;
}
__device__ __forceinline__ float to_float(bf16_t b) { return __uint_as_float(((unsigned)b.bits) << 16); }
__device__ __forceinline__ half_t to_half(float f) {
  half_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}
__device__ __forceinline__ bf16_t to_bf16(float f) {
  bf16_t b;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b.bits) : "f"(f));
  return b;
}

// Pairs of 16-bit values in one 32-bit word (lo in the low half): one paired conversion rounds each half
// exactly as to_bf16 / to_half round it, without the per-element merge into the word.
template <class T> __device__ __forceinline__ unsigned pack16x2(float lo, float hi);
template <> __device__ __forceinline__ unsigned pack16x2<bf16_t>(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
template <> __device__ __forceinline__ unsigned pack16x2<half_t>(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
template <class T> __device__ __forceinline__ void unpack16x2(unsigned w, float& lo, float& hi);
template <> __device__ __forceinline__ void unpack16x2<bf16_t>(unsigned w, float& lo, float& hi) {
  lo = __uint_as_float(w << 16);  // a bfloat16 is the upper half of a float
  hi = __uint_as_float(w & 0xFFFF0000u);
}
template <> __device__ __forceinline__ void unpack16x2<half_t>(unsigned w, float& lo, float& hi) {
  asm("{.reg .f16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;}" : "=f"(lo), "=f"(hi) : "r"(w));
}

// Acc<T>: the type arithmetic on T happens in; double for 64-bit types, float otherwise.
template <class T> struct AccOf { typedef float type; };
template <> struct AccOf<double> { typedef double type; };
template <> struct AccOf<int> { typedef double type; };
template <> struct AccOf<i64> { typedef double type; };
template <class A, class B> struct WiderAcc { typedef float type; };
template <class B> struct WiderAcc<double, B> { typedef double type; };
template <class A> struct WiderAcc<A, double> { typedef double type; };
template <> struct WiderAcc<double, double> { typedef double type; };

// load<Acc>(T) / store<T>(Acc): element <-> arithmetic value. Integer stores round to nearest even and
// saturate (as cuDNN's transform does for INT8); NaN becomes 0 (checked explicitly: the saturating cvt
// does not map NaN to 0 on the H100).
template <class A> __device__ __forceinline__ A load(float v) { return (A)v; }
template <class A> __device__ __forceinline__ A load(double v) { return (A)v; }
template <class A> __device__ __forceinline__ A load(half_t v) { return (A)to_float(v); }
template <class A> __device__ __forceinline__ A load(bf16_t v) { return (A)to_float(v); }
template <class A> __device__ __forceinline__ A load(signed char v) { return (A)v; }
template <class A> __device__ __forceinline__ A load(unsigned char v) { return (A)v; }
template <class A> __device__ __forceinline__ A load(int v) { return (A)v; }
template <class A> __device__ __forceinline__ A load(i64 v) { return (A)v; }

template <class T> struct Store;
template <> struct Store<float> {
  __device__ static float from(float v) { return v; }
  __device__ static float from(double v) { return (float)v; }
};
template <> struct Store<double> {
  __device__ static double from(float v) { return v; }
  __device__ static double from(double v) { return v; }
};
template <> struct Store<half_t> {
  __device__ static half_t from(float v) { return to_half(v); }
  __device__ static half_t from(double v) {
    half_t h;
    asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h.bits) : "d"(v));
    return h;
  }
};
template <> struct Store<bf16_t> {
  __device__ static bf16_t from(float v) { return to_bf16(v); }
  __device__ static bf16_t from(double v) {
    bf16_t b;
#if __CUDA_ARCH__ >= 900
    asm("cvt.rn.bf16.f64 %0, %1;" : "=h"(b.bits) : "d"(v));
#else
    // No direct f64 -> bf16 before sm_90: narrow to float rounding to odd (truncate, then set the last
    // bit if anything was dropped), so the final rounding to bf16 is the only one that counts.
    float f = __double2float_rz(v);
    if ((double)f != v && v == v) f = __uint_as_float(__float_as_uint(f) | 1u);
    b = to_bf16(f);
#endif
    return b;
  }
};
template <> struct Store<signed char> {
  __device__ static signed char from(float v) { if (v != v) return 0; int r; asm("cvt.rni.sat.s8.f32 %0, %1;" : "=r"(r) : "f"(v)); return (signed char)r; }
  __device__ static signed char from(double v) { if (v != v) return 0; int r; asm("cvt.rni.sat.s8.f64 %0, %1;" : "=r"(r) : "d"(v)); return (signed char)r; }
};
template <> struct Store<unsigned char> {
  __device__ static unsigned char from(float v) { if (v != v) return 0; unsigned r; asm("cvt.rni.sat.u8.f32 %0, %1;" : "=r"(r) : "f"(v)); return (unsigned char)r; }
  __device__ static unsigned char from(double v) { if (v != v) return 0; unsigned r; asm("cvt.rni.sat.u8.f64 %0, %1;" : "=r"(r) : "d"(v)); return (unsigned char)r; }
};
template <> struct Store<int> {
  __device__ static int from(float v) { if (v != v) return 0; int r; asm("cvt.rni.sat.s32.f32 %0, %1;" : "=r"(r) : "f"(v)); return r; }
  __device__ static int from(double v) { if (v != v) return 0; int r; asm("cvt.rni.sat.s32.f64 %0, %1;" : "=r"(r) : "d"(v)); return r; }
};
template <> struct Store<i64> {
  __device__ static i64 from(float v) { if (v != v) return 0; i64 r; asm("cvt.rni.sat.s64.f32 %0, %1;" : "=l"(r) : "f"(v)); return r; }
  __device__ static i64 from(double v) { if (v != v) return 0; i64 r; asm("cvt.rni.sat.s64.f64 %0, %1;" : "=l"(r) : "d"(v)); return r; }
};
template <class T, class A> __device__ __forceinline__ T store(A v) { return Store<T>::from(v); }

// Math on the accumulator type: one name for float and double.
__device__ __forceinline__ float m_exp(float x) { return expf(x); }
__device__ __forceinline__ double m_exp(double x) { return exp(x); }
__device__ __forceinline__ float m_expm1(float x) { return expm1f(x); }
__device__ __forceinline__ double m_expm1(double x) { return expm1(x); }
__device__ __forceinline__ float m_log(float x) { return logf(x); }
__device__ __forceinline__ double m_log(double x) { return log(x); }
__device__ __forceinline__ float m_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double m_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float m_erf(float x) { return erff(x); }
__device__ __forceinline__ double m_erf(double x) { return erf(x); }
__device__ __forceinline__ float m_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double m_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float m_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double m_abs(double x) { return fabs(x); }
__device__ __forceinline__ bool m_isnan(float x) { return x != x; }
__device__ __forceinline__ bool m_isnan(double x) { return x != x; }
__device__ __forceinline__ float m_inf(float) { return __int_as_float(0x7f800000); }
__device__ __forceinline__ double m_inf(double) { return __longlong_as_double(0x7ff0000000000000LL); }

// Sigmoid that never overflows: exp of a non-positive number only.
template <class A> __device__ __forceinline__ A sigmoid(A x) {
  A e = m_exp(-m_abs(x));
  A s = A(1) / (A(1) + e);
  return x >= A(0) ? s : e * s;
}

// A VEC-element vector of T, aligned so that its load is one (or two) 16-byte accesses.
template <class T, int N> struct __align__(sizeof(T) * N) Vec { T v[N]; };

}  // namespace pydnn
