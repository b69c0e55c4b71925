// ReduceTensor: C = alpha * reduce(A) + beta * C over the dims where C has 1 (see reduce_params.h).
// reduce_rows: G threads per (output, segment) accumulate with a strided loop, then combine across the
// group in a fixed tree order; one segment finishes the output directly, several write partials that
// reduce_combine folds in segment order. No float atomics anywhere: results are bitwise reproducible.
#include "common/params.h"
#include "common/types.cuh"
#include "reduce_params.h"

namespace pydnn {
namespace reduce {

enum { kAdd = 0, kMul = 1, kMin = 2, kMax = 3, kAmax = 4, kAvg = 5, kNorm1 = 6, kNorm2 = 7, kMulNoZeros = 8 };

// An accumulator: a value and, for MIN / MAX / AMAX, the flat index of the chosen element.
template <class A> struct Acc { A v; int i; };

template <class A> __device__ __forceinline__ Acc<A> identity(int op) {
  Acc<A> a;
  a.i = 0x7fffffff;
  switch (op) {
    case kMul: case kMulNoZeros: a.v = A(1); break;
    case kMin: a.v = m_inf(A(0)); break;
    case kMax: a.v = -m_inf(A(0)); break;
    default: a.v = A(0);
  }
  return a;
}

__device__ __forceinline__ bool is_sum(int op) { return op == kAdd || op == kAvg || op == kNorm1 || op == kNorm2; }

// the value an element contributes
template <class A> __device__ __forceinline__ A lift(A x, int op) {
  switch (op) {
    case kAmax: case kNorm1: return m_abs(x);
    case kNorm2: return x * x;
    case kMulNoZeros: return x == A(0) ? A(1) : x;
    default: return x;
  }
}

// combine two accumulators; `b` comes after `a` in element order (ties keep the lower index)
template <class A> __device__ __forceinline__ Acc<A> combine(Acc<A> a, Acc<A> b, int op, bool nan_prop) {
  switch (op) {
    case kMul: case kMulNoZeros: a.v *= b.v; return a;
    case kMin: case kMax: case kAmax: {
      bool an = m_isnan(a.v), bn = m_isnan(b.v);
      if (an || bn) {
        if (nan_prop) return an ? (bn && b.i < a.i ? b : a) : b;  // the first NaN wins
        return an ? (bn ? (b.i < a.i ? b : a) : b) : a;           // NaN is skipped
      }
      bool take = (op == kMin) ? (b.v < a.v) : (b.v > a.v);
      if (b.v == a.v && b.i < a.i) take = true;
      return take ? b : a;
    }
    default: a.v += b.v; return a;
  }
}

template <class A> __device__ __forceinline__ A finish(A v, int op, long long len) {
  if (op == kAvg) return v / (A)len;
  if (op == kNorm2) return m_sqrt(v);
  return v;
}

__device__ __forceinline__ long long row_off(const ReduceParams& p, long long row, int k) {
  long long off = 0;
  for (int d = p.row_ndim - 1; d >= 0; --d) {
    long long c = row % p.row_size[d];
    row /= p.row_size[d];
    off += c * p.row_stride[k][d];
  }
  return off;
}

__device__ __forceinline__ long long elem_off(const ReduceParams& p, long long e) {
  if (p.red_ndim == 1) return e * p.red_stride[0];
  long long off = 0;
  for (int d = p.red_ndim - 1; d >= 0; --d) {
    long long c = e % p.red_size[d];
    e /= p.red_size[d];
    off += c * p.red_stride[d];
  }
  return off;
}

template <class A> __device__ __forceinline__ Acc<A> shfl(Acc<A> a, int m) {
  a.v = __shfl_xor_sync(0xffffffffu, a.v, m);
  a.i = __shfl_xor_sync(0xffffffffu, a.i, m);
  return a;
}

// Tree over the G threads of a group, always pairing lane l with l ^ m (a fixed order).
template <class A>
__device__ __forceinline__ Acc<A> group_combine(Acc<A> a, int G, int op, bool nan_prop, Acc<A>* smem) {
  const int lane = threadIdx.x % G;
  for (int m = (G < 32 ? G : 32) >> 1; m > 0; m >>= 1) {
    Acc<A> o = shfl(a, m);
    a = (lane & m) ? combine(o, a, op, nan_prop) : combine(a, o, op, nan_prop);
  }
  if (G > 32) {
    const int warp = threadIdx.x >> 5, first = (threadIdx.x / G) * (G >> 5);
    if ((threadIdx.x & 31) == 0) smem[warp] = a;
    __syncthreads();
    a = smem[first];
    for (int w = 1; w < (G >> 5); ++w) a = combine(a, smem[first + w], op, nan_prop);
  }
  return a;
}

template <class TI, class TO, class A>
__device__ __forceinline__ void write_out(const ReduceParams& p, long long row, Acc<A> a) {
  TO* c = (TO*)p.out + row_off(p, row, 0);
  A r = (A)p.alpha * finish(a.v, p.op, p.len);
  if (p.flags & PYDNN_FLAG_BETA) r += (A)p.beta * load<A>(*c);
  *c = store<TO>(r);
  if (p.indices) ((int*)p.indices)[row_off(p, row, 2)] = a.i;
}

template <class TI, class TO>
__global__ void __launch_bounds__(256) reduce_rows(const ReduceParams p) {
  typedef typename WiderAcc<typename AccOf<TI>::type, typename AccOf<TO>::type>::type A;
  __shared__ Acc<A> smem[8];
  const int G = p.group, lane = threadIdx.x % G;
  const long long slot = (long long)blockIdx.x * (blockDim.x / G) + threadIdx.x / G;  // (row, segment)
  const long long row = slot / p.segments;
  const int seg = (int)(slot % p.segments);
  const bool live = row < p.rows;
  const bool nan_prop = p.flags & PYDNN_FLAG_NAN_PROP;
  Acc<A> a = identity<A>(p.op);
  if (live) {
    const TI* in = (const TI*)p.in + row_off(p, row, 1);
    const long long lo = (long long)seg * p.chunk;
    const long long hi = lo + p.chunk < p.len ? lo + p.chunk : p.len;
    for (long long e = lo + lane; e < hi; e += G) {
      Acc<A> b;
      b.v = lift(load<A>(in[elem_off(p, e)]), p.op);
      b.i = (int)e;
      a = combine(a, b, p.op, nan_prop);
    }
  }
  a = group_combine(a, G, p.op, nan_prop, smem);
  if (!live || lane != 0) return;
  if (p.segments == 1) {
    write_out<TI, TO, A>(p, row, a);
  } else {
    ((double*)p.workspace)[slot] = (double)a.v;
    ((int*)((double*)p.workspace + p.rows * p.segments))[slot] = a.i;
  }
}

// Folds the segments' partials (kept in double) in segment order, in double.
template <class TI, class TO>
__global__ void __launch_bounds__(256) reduce_combine(const ReduceParams p) {
  typedef double A;
  const long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= p.rows) return;
  const double* vals = (const double*)p.workspace;
  const int* idx = (const int*)(vals + p.rows * p.segments);
  const bool nan_prop = p.flags & PYDNN_FLAG_NAN_PROP;
  Acc<A> a = identity<A>(p.op);
  for (int s = 0; s < p.segments; ++s) {
    Acc<A> b;
    b.v = (A)vals[row * p.segments + s];
    b.i = idx[row * p.segments + s];
    a = combine(a, b, p.op, nan_prop);
  }
  write_out<TI, TO, A>(p, row, a);
}

}  // namespace reduce
}  // namespace pydnn
