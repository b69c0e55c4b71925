// Host (g++) stand-in for ptx/common/types.cuh and the CUDA builtins ptx/rnn.cu uses, so that the RNN
// kernels' own source runs on the CPU (tests/ops/rnn/test_rnn_kernels_host_cpu.py): a kernel is called once
// per (block, thread) in order, thread 0 of a block first (rnn.cu's only __syncthreads follows a value
// thread 0 computes). half_t converts through _Float16 (round to nearest even, as cvt.rn.f16.f32);
// bf16_t rounds to nearest even in integer arithmetic (as cvt.rn.bf16.f32).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct pydnn_dim3 { unsigned x, y, z; };
extern thread_local pydnn_dim3 blockIdx, threadIdx, blockDim, gridDim;
inline void __syncthreads() {}
inline float __expf(float v) { return std::exp(v); }
using std::exp;
using std::fmax;
using std::fmin;
using std::tanh;
inline float tanhf(float v) { return std::tanh(v); }
inline int min(int a, int b) { return a < b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }

namespace pydnn {
typedef long long i64;
typedef unsigned long long u64;
struct half_t { unsigned short bits; };
struct bf16_t { unsigned short bits; };

inline float to_float(half_t h) { _Float16 v; std::memcpy(&v, &h.bits, 2); return (float)v; }
inline float to_float(bf16_t b) { return __uint_as_float(((unsigned)b.bits) << 16); }
inline half_t to_half(float f) { _Float16 v = (_Float16)f; half_t h; std::memcpy(&h.bits, &v, 2); return h; }
inline bf16_t to_bf16(float f) {
  unsigned u = __float_as_uint(f);
  bf16_t b;
  if (f != f) { b.bits = (unsigned short)((u >> 16) | 0x40); return b; }
  u += 0x7FFFu + ((u >> 16) & 1u);
  b.bits = (unsigned short)(u >> 16);
  return b;
}
template <class A> inline A load(float v) { return (A)v; }
template <class A> inline A load(double v) { return (A)v; }
template <class A> inline A load(half_t v) { return (A)to_float(v); }
template <class A> inline A load(bf16_t v) { return (A)to_float(v); }
template <class T> struct Store;
template <> struct Store<float> {
  static float from(float v) { return v; }
  static float from(double v) { return (float)v; }
};
template <> struct Store<double> {
  static double from(float v) { return v; }
  static double from(double v) { return v; }
};
template <> struct Store<half_t> {
  static half_t from(float v) { return to_half(v); }
  static half_t from(double v) { return to_half((float)v); }
};
template <> struct Store<bf16_t> {
  static bf16_t from(float v) { return to_bf16(v); }
  static bf16_t from(double v) { return to_bf16((float)v); }
};
}  // namespace pydnn
