// Softmax forward and backward over rows (see softmax_params.h for how rows and their elements are
// addressed). Two kernels serve every layout:
//   softmax_*_regs : a row's elements are contiguous (stride 1 in every operand) and fit in registers:
//                    one read, one write; VEC-element vector accesses; G threads per row.
//   softmax_*_loop : anything else (strided rows, rows too long for registers): an online max/sum pass,
//                    then a write pass; with G = 1 each thread owns a row, which coalesces when the
//                    rows (not the elements) are contiguous, e.g. CHANNEL mode on NCHW.
// Every algorithm subtracts the row maximum, so exp never overflows; FAST uses the hardware exp.
#include "common/params.h"
#include "common/types.cuh"
#include "softmax_params.h"

namespace pydnn {
namespace softmax {

enum { kFast = 0, kAccurate = 1, kLog = 2 };

// exp of a non-positive argument. The hardware approximation (a few float32 ulps) serves FAST, and every
// algorithm on 16-bit data, where it is far below the output's rounding; float ACCURATE/LOG and double
// use the exact functions.
template <class A> __device__ __forceinline__ A exp_a(A x, int algo, bool lowp = false) { return m_exp(x); }
template <> __device__ __forceinline__ float exp_a<float>(float x, int algo, bool lowp) {
  return (algo == kFast || lowp) ? __expf(x) : expf(x);
}

__device__ __forceinline__ i64 row_offset(const SoftmaxParams& p, i64 row, int k) {
  i64 off = 0;
  for (int d = p.row_ndim - 1; d >= 0; --d) {
    i64 c = row % p.row_size[d];
    row /= p.row_size[d];
    off += c * p.row_stride[k][d];
  }
  return off;
}

__device__ __forceinline__ i64 elem_offset(const SoftmaxParams& p, i64 e, int k) {
  if (p.red_ndim == 1) return e * p.red_stride[k][0];
  i64 off = 0;
  for (int d = p.red_ndim - 1; d >= 0; --d) {
    i64 c = e % p.red_size[d];
    e /= p.red_size[d];
    off += c * p.red_stride[k][d];
  }
  return off;
}

// ---- reductions across the G threads of a row (G a power of two; blockDim a multiple of G) ----
template <class A> __device__ __forceinline__ A shfl_xor(A v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }

template <class A, class F>
__device__ __forceinline__ A group_reduce(A v, int G, A* smem, F op) {
  for (int m = (G < 32 ? G : 32) >> 1; m > 0; m >>= 1) v = op(v, shfl_xor(v, m));
  if (G > 32) {  // combine the G/32 warps of this group through shared memory
    const int warp = threadIdx.x >> 5, first = (threadIdx.x / G) * (G >> 5);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) smem[warp] = v;
    __syncthreads();
    v = smem[first];
    for (int w = 1; w < (G >> 5); ++w) v = op(v, smem[first + w]);
  }
  return v;
}

template <class A> struct MaxOp { __device__ A operator()(A a, A b) const { return (a > b || a != a) ? a : b; } };
template <class A> struct SumOp { __device__ A operator()(A a, A b) const { return a + b; } };

// online (max, sum of exp(x - max)) merge; a NaN anywhere makes the row NaN
template <class A> __device__ __forceinline__ void merge(A& m, A& s, A m2, A s2, int algo) {
  if (m != m || m2 != m2) {
    m = (m != m) ? m : m2;
    s += s2;
    return;
  }
  A mm = m > m2 ? m : m2;
  if (mm == -m_inf(mm)) {  // nothing but -inf so far: keep counting (exp(-inf - -inf) is NaN)
    s += s2;
    return;
  }
  s = s * exp_a(m - mm, algo) + s2 * exp_a(m2 - mm, algo);
  m = mm;
}

// ------------------------------------------------------------------ forward, row in registers
template <class T, int VEC, int MAXV>
__global__ void __launch_bounds__(1024) softmax_fwd_regs(const SoftmaxParams p) {
  typedef typename AccOf<T>::type A;
  typedef Vec<T, VEC> V;
  __shared__ A smem[32];
  const int G = p.group, lane = threadIdx.x % G;
  const i64 row = (i64)blockIdx.x * (blockDim.x / G) + threadIdx.x / G;
  const bool live = row < p.rows;
  const T* x = (const T*)p.in0 + (live ? row_offset(p, row, 1) : 0);
  T* y = (T*)p.out + (live ? row_offset(p, row, 0) : 0);
  const i64 nvec = p.len / VEC;
  V v[MAXV];
  A m = -m_inf(A(0));
#pragma unroll
  for (int k = 0; k < MAXV; ++k) {
    i64 i = lane + (i64)k * G;
    if (live && i < nvec) {
      v[k] = reinterpret_cast<const V*>(x)[i];
#pragma unroll
      for (int e = 0; e < VEC; ++e) m = MaxOp<A>()(m, load<A>(v[k].v[e]));
    }
  }
  m = group_reduce(m, G, smem, MaxOp<A>());
  const bool lowp = sizeof(T) == 2;
  A ex[MAXV][VEC];  // exp(x - max), computed once and kept for the write
  A s = 0;
#pragma unroll
  for (int k = 0; k < MAXV; ++k) {
    i64 i = lane + (i64)k * G;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      ex[k][e] = (live && i < nvec) ? exp_a(load<A>(v[k].v[e]) - m, p.algo, lowp) : A(0);
      s += ex[k][e];
    }
  }
  s = group_reduce(s, G, smem, SumOp<A>());
  const A inv = A(1) / s, logs = m_log(s);
  const A alpha = (A)p.alpha, beta = (A)p.beta;
#pragma unroll
  for (int k = 0; k < MAXV; ++k) {
    i64 i = lane + (i64)k * G;
    if (live && i < nvec) {
      V o, old;
      if (p.flags & PYDNN_FLAG_BETA) old = reinterpret_cast<const V*>(y)[i];
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        A f = p.algo == kLog ? (load<A>(v[k].v[e]) - m) - logs : ex[k][e] * inv;
        A r = alpha * f;
        if (p.flags & PYDNN_FLAG_BETA) r += beta * load<A>(old.v[e]);
        o.v[e] = store<T>(r);
      }
      reinterpret_cast<V*>(y)[i] = o;
    }
  }
}

// ------------------------------------------------------------------ forward, any layout
template <class T>
__global__ void __launch_bounds__(256) softmax_fwd_loop(const SoftmaxParams p) {
  typedef typename AccOf<T>::type A;
  __shared__ A smem[32];
  __shared__ A smem2[32];
  const int G = p.group, lane = threadIdx.x % G;
  const i64 row = (i64)blockIdx.x * (blockDim.x / G) + threadIdx.x / G;
  const bool live = row < p.rows;
  const T* x = (const T*)p.in0 + (live ? row_offset(p, row, 1) : 0);
  T* y = (T*)p.out + (live ? row_offset(p, row, 0) : 0);
  A m = -m_inf(A(0)), s = 0;
  if (live)
    for (i64 e = lane; e < p.len; e += G) merge(m, s, load<A>(x[elem_offset(p, e, 1)]), A(1), p.algo);
  // combine (m, s) across the group: max first, then rescaled sums
  A gm = group_reduce(m, G, smem, MaxOp<A>());
  A scaled = (s == A(0)) ? A(0) : ((gm == m || gm != gm) ? s : s * exp_a(m - gm, p.algo));
  if (gm != gm) scaled = gm;
  A gs = group_reduce(scaled, G, smem2, SumOp<A>());
  if (!live) return;
  const A alpha = (A)p.alpha, beta = (A)p.beta, inv = A(1) / gs, logs = m_log(gs);
  const bool lowp = sizeof(T) == 2;
  for (i64 e = lane; e < p.len; e += G) {
    i64 oy = elem_offset(p, e, 0);
    A z = load<A>(x[elem_offset(p, e, 1)]) - gm;
    A r = alpha * (p.algo == kLog ? z - logs : exp_a(z, p.algo, lowp) * inv);
    if (p.flags & PYDNN_FLAG_BETA) r += beta * load<A>(y[oy]);
    y[oy] = store<T>(r);
  }
}

// ------------------------------------------------------------------ backward
// ACCURATE/FAST: dx = alpha * y * (dy - sum(dy * y)) + beta * dx
// LOG:           dx = alpha * (dy - exp(y) * sum(dy)) + beta * dx
template <class A> __device__ __forceinline__ A bwd_term(A y, A dy, int algo) { return algo == kLog ? dy : dy * y; }
template <class A> __device__ __forceinline__ A finish_bwd(A y, A dy, A s, int algo) {
  return algo == kLog ? dy - m_exp(y) * s : y * (dy - s);
}

template <class T, int VEC, int MAXV>
__global__ void __launch_bounds__(1024) softmax_bwd_regs(const SoftmaxParams p) {
  typedef typename AccOf<T>::type A;
  typedef Vec<T, VEC> V;
  __shared__ A smem[32];
  const int G = p.group, lane = threadIdx.x % G;
  const i64 row = (i64)blockIdx.x * (blockDim.x / G) + threadIdx.x / G;
  const bool live = row < p.rows;
  const T* y = (const T*)p.in0 + (live ? row_offset(p, row, 1) : 0);
  const T* dy = (const T*)p.in1 + (live ? row_offset(p, row, 2) : 0);
  T* dx = (T*)p.out + (live ? row_offset(p, row, 0) : 0);
  const i64 nvec = p.len / VEC;
  V vy[MAXV], vd[MAXV];
  A s = 0;
#pragma unroll
  for (int k = 0; k < MAXV; ++k) {
    i64 i = lane + (i64)k * G;
    if (live && i < nvec) {
      vy[k] = reinterpret_cast<const V*>(y)[i];
      vd[k] = reinterpret_cast<const V*>(dy)[i];
#pragma unroll
      for (int e = 0; e < VEC; ++e) s += bwd_term(load<A>(vy[k].v[e]), load<A>(vd[k].v[e]), p.algo);
    }
  }
  s = group_reduce(s, G, smem, SumOp<A>());
  const A alpha = (A)p.alpha, beta = (A)p.beta;
#pragma unroll
  for (int k = 0; k < MAXV; ++k) {
    i64 i = lane + (i64)k * G;
    if (live && i < nvec) {
      V o, old;
      if (p.flags & PYDNN_FLAG_BETA) old = reinterpret_cast<const V*>(dx)[i];
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        A r = alpha * finish_bwd(load<A>(vy[k].v[e]), load<A>(vd[k].v[e]), s, p.algo);
        if (p.flags & PYDNN_FLAG_BETA) r += beta * load<A>(old.v[e]);
        o.v[e] = store<T>(r);
      }
      reinterpret_cast<V*>(dx)[i] = o;
    }
  }
}

template <class T>
__global__ void __launch_bounds__(256) softmax_bwd_loop(const SoftmaxParams p) {
  typedef typename AccOf<T>::type A;
  __shared__ A smem[32];
  const int G = p.group, lane = threadIdx.x % G;
  const i64 row = (i64)blockIdx.x * (blockDim.x / G) + threadIdx.x / G;
  const bool live = row < p.rows;
  const T* y = (const T*)p.in0 + (live ? row_offset(p, row, 1) : 0);
  const T* dy = (const T*)p.in1 + (live ? row_offset(p, row, 2) : 0);
  T* dx = (T*)p.out + (live ? row_offset(p, row, 0) : 0);
  A s = 0;
  if (live)
    for (i64 e = lane; e < p.len; e += G)
      s += bwd_term(load<A>(y[elem_offset(p, e, 1)]), load<A>(dy[elem_offset(p, e, 2)]), p.algo);
  s = group_reduce(s, G, smem, SumOp<A>());
  if (!live) return;
  const A alpha = (A)p.alpha, beta = (A)p.beta;
  for (i64 e = lane; e < p.len; e += G) {
    i64 o = elem_offset(p, e, 0);
    A r = alpha * finish_bwd(load<A>(y[elem_offset(p, e, 1)]), load<A>(dy[elem_offset(p, e, 2)]), s, p.algo);
    if (p.flags & PYDNN_FLAG_BETA) r += beta * load<A>(dx[o]);
    dx[o] = store<T>(r);
  }
}

}  // namespace softmax
}  // namespace pydnn
