// ReduceTensor: C = alpha * reduce(A) + beta * C over the dims where C has 1 (see reduce_params.h).
//
// Three kernels cover the layouts, chosen on the host (pydnn/ops/reduce.py):
//   rows_vec : the reduced elements of an output are contiguous (one run, any alignment: a scalar head,
//              16-byte vectors, a scalar tail) or two dims whose inner one is contiguous and whose runs
//              are whole aligned vectors. G threads per output (a power of two, a warp or a block).
//   cols     : an output's elements are far apart but neighbouring outputs are neighbours in memory
//              (the innermost kept dim K has the smallest stride): threads run along K (16-byte vectors
//              when K is contiguous), blockDim.y threads split the reduced positions, and when K is
//              small `pack` positions share a warp so that a warp still reads one contiguous stretch.
//   rows_gen : anything else (any strides, up to 8 reduce dims); the op is a runtime value.
// When few outputs reduce long slices, each output's units are cut into segments: the main kernel
// writes one partial per (output, segment) to the caller's workspace and reduce_finish folds them in
// segment order, in double. Every combination happens in a fixed order and nothing uses atomics, so a
// result is the same bits on every run. Sums use Kahan compensation per thread.
#include "common/params.h"
#include "common/types.cuh"
#include "common/h16.cuh"
#include "reduce_params.h"

namespace pydnn {
namespace reduce {

// pydnnReduceTensorOp_t values
enum { kAdd = 0, kMul = 1, kMin = 2, kMax = 3, kAmax = 4, kAvg = 5, kNorm1 = 6, kNorm2 = 7, kMulNoZeros = 8 };
constexpr int kEmpty = 0x7fffffff;  // the index of an accumulator that has seen no element
constexpr int kThreads = 256;       // every block of these kernels has at most this many threads
constexpr int kUnroll = 4;          // loads a thread issues before it uses any of them
constexpr int kMinBlocks = 4;       // blocks per SM the register budget must allow (1024 threads)

__device__ __forceinline__ bool is_sum(int op) { return op == kAdd || op == kAvg || op == kNorm1 || op == kNorm2; }
__device__ __forceinline__ bool is_prod(int op) { return op == kMul || op == kMulNoZeros; }

__device__ __forceinline__ float nan_of(float) { return __int_as_float(0x7fffffff); }
__device__ __forceinline__ double nan_of(double) { return __longlong_as_double(0x7ff8000000000000LL); }

// The arithmetic type of a templated kernel: float (double for double data), and double for products,
// whose rounding errors would otherwise grow with the square root of the slice length.
template <class TI, int OP> struct AccT { typedef typename AccOf<TI>::type type; };
template <class TI> struct AccT<TI, kMul> { typedef double type; };
template <class TI> struct AccT<TI, kMulNoZeros> { typedef double type; };

// An input element as A. TI = pydnn::h16_t: half and bfloat16 in one instantiation (issue 21's install time),
// the format PYDNN_REDUCE_FLAG_IN_BF16 of the launch, converted by the same instructions as half_t's / bf16_t's.
template <class A, class TI> __device__ __forceinline__ A in_val(const ReduceParams&, TI x) { return load<A>(x); }
template <class A> __device__ __forceinline__ A in_val(const ReduceParams& p, h16_t x) {
  return (A)h16_to_float(x, (p.flags & PYDNN_REDUCE_FLAG_IN_BF16) != 0u);
}

// The hot walks of an h16_t kernel run on the launch's concrete format: hw_bf16 / hw_half view the input as bf16_t /
// half_t (the same 2-byte layout), so that the walk loop is the typed kernel's loop (no per-element format select
// there: the first fold cost reduce's column walk ~3% on the H200, tools/fold16.py --gpu) while the rest of the
// kernel stays one copy. Other types: unused.
template <class T> struct IsH16 { static constexpr bool value = false; };
template <> struct IsH16<h16_t> { static constexpr bool value = true; };
__device__ __forceinline__ bool in_bf16(const ReduceParams& p) { return (p.flags & PYDNN_REDUCE_FLAG_IN_BF16) != 0u; }

// A thread's running state: value, Kahan compensation (sums), index of the chosen element (MIN/MAX/AMAX).
template <class A> struct Acc { A v, c; int i; };

// max / min that propagate NaN (np) or skip it (IEEE fmax / fmin return the number when one is NaN).
__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float min_nan(float a, float b) {
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ double max_nan(double a, double b) { return (b > a || b != b) ? b : a; }
__device__ __forceinline__ double min_nan(double a, double b) { return (b < a || b != b) ? b : a; }
__device__ __forceinline__ float max_num(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ float min_num(float a, float b) { return fminf(a, b); }
__device__ __forceinline__ double max_num(double a, double b) { return fmax(a, b); }
__device__ __forceinline__ double min_num(double a, double b) { return fmin(a, b); }
template <class A> __device__ __forceinline__ A pick(A a, A b, bool is_min, bool np) {
  if (is_min) return np ? min_nan(a, b) : min_num(a, b);
  return np ? max_nan(a, b) : max_num(a, b);
}
// A finished partial: value and index.
template <class A> struct Part { A v; int i; };

// The value of an empty reduction. MIN/MAX/AMAX without NaN propagation start from NaN, which any number
// replaces, so a slice holding nothing but NaN gives NaN.
template <class A> __device__ __forceinline__ A identity(int op, bool np) {
  if (is_prod(op)) return A(1);
  if (op == kMin) return np ? m_inf(A(0)) : nan_of(A(0));
  if (op == kMax || op == kAmax) return np ? -m_inf(A(0)) : nan_of(A(0));
  return A(0);
}

template <class A> __device__ __forceinline__ Acc<A> start(int op, bool np) {
  Acc<A> a;
  a.v = identity<A>(op, np);
  a.c = A(0);
  a.i = kEmpty;
  return a;
}

// Adds element number `e` (value x) to a thread's state. A thread sees its elements in increasing `e`,
// so on ties the earlier element stays. `op`, `np` (NaN propagation) and `idx` (track the index) are
// compile-time constants in the templated kernels and runtime values in rows_gen.
template <class A>
__device__ __forceinline__ void add(Acc<A>& a, A x, int e, int op, bool np, bool idx) {
  if (is_sum(op)) {
    if (op == kNorm1) x = m_abs(x);
    const A y = (op == kNorm2 ? x * x : x) - a.c;
    const A t = a.v + y;
    const A c = (t - a.v) - y;
    a.c = c == c ? c : A(0);  // an infinite sum makes c NaN; drop it so that inf stays inf
    a.v = t;
  } else if (is_prod(op)) {
    a.v *= (op == kMulNoZeros && x == A(0)) ? A(1) : x;
  } else {
    if (op == kAmax) x = m_abs(x);
    if (!idx) {
      a.v = pick(a.v, x, op == kMin, np);
      return;
    }
    const bool better = op == kMin ? x < a.v : x > a.v;
    const bool xn = x != x, vn = a.v != a.v;
    // propagate: the first NaN wins; otherwise NaN loses to any number
    if (a.i == kEmpty || (np ? (xn ? !vn : better) : (vn ? !xn : better))) {
      a.v = x;
      a.i = e;
    }
  }
}

template <class A> __device__ __forceinline__ Part<A> close(const Acc<A>& a, int op) {
  Part<A> p;
  p.v = is_sum(op) ? a.v - a.c : a.v;
  p.i = a.i;
  return p;
}

// Combines two partials whose elements may interleave: ties go to the lower index.
template <class A>
__device__ __forceinline__ Part<A> merge(Part<A> a, Part<A> b, int op, bool np, bool idx) {
  if (is_sum(op)) {
    a.v += b.v;
    return a;
  }
  if (is_prod(op)) {
    a.v *= b.v;
    return a;
  }
  if (!idx) {
    a.v = pick(a.v, b.v, op == kMin, np);
    return a;
  }
  const bool better = op == kMin ? b.v < a.v : b.v > a.v;
  const bool an = a.v != a.v, bn = b.v != b.v;
  bool take;
  if (b.i == kEmpty) take = false;
  else if (a.i == kEmpty) take = true;
  else if (an || bn) take = (an && bn) ? b.i < a.i : (np ? bn : an);
  else take = better || (b.v == a.v && b.i < a.i);
  return take ? b : a;
}

template <class A> __device__ __forceinline__ Part<A> shfl(Part<A> a, int m, bool idx) {
  a.v = __shfl_xor_sync(0xffffffffu, a.v, m);
  if (idx) a.i = __shfl_xor_sync(0xffffffffu, a.i, m);
  return a;
}

// Combines the G threads of a group (G a power of two dividing blockDim.x, uniform over the block) in a
// fixed butterfly order, then across the group's warps through shared memory. Lane 0 holds the result.
template <class A>
__device__ __forceinline__ Part<A> group_reduce(Part<A> a, int G, int op, bool np, bool idx, Part<A>* sm) {
  for (int m = (G < 32 ? G : 32) >> 1; m > 0; m >>= 1) a = merge(a, shfl(a, m, idx), op, np, idx);
  if (G > 32) {
    const int warp = threadIdx.x >> 5, first = (threadIdx.x / G) * (G >> 5);
    if ((threadIdx.x & 31) == 0) sm[warp] = a;
    __syncthreads();
    a = sm[first];
    for (int w = 1; w < (G >> 5); ++w) a = merge(a, sm[first + w], op, np, idx);
  }
  return a;
}

// Offset of row `row` (kept coordinates, outermost first) in operand k: 0 C, 1 A, 2 indices.
__device__ __forceinline__ i64 row_offset(const ReduceParams& p, i64 row, int k) {
  i64 off = 0;
  if (p.flags & PYDNN_REDUCE_FLAG_SMALL_ROWS) {
    unsigned r = (unsigned)row;
    for (int d = p.row_ndim - 1; d >= 0; --d) {
      const unsigned s = (unsigned)p.row_size[d], q = r / s;
      off += (i64)(r - q * s) * p.row_stride[k][d];
      r = q;
    }
  } else {
    for (int d = p.row_ndim - 1; d >= 0; --d) {
      const i64 s = p.row_size[d], q = row / s;
      off += (row - q * s) * p.row_stride[k][d];
      row = q;
    }
  }
  return off;
}

template <class A> __device__ __forceinline__ A load_out(const ReduceParams& p, i64 off) {
  switch (p.out_type) {
    case PYDNN_REDUCE_OUT_F64: return (A)((const double*)p.out)[off];
    case PYDNN_REDUCE_OUT_F16: return load<A>(((const half_t*)p.out)[off]);
    case PYDNN_REDUCE_OUT_BF16: return load<A>(((const bf16_t*)p.out)[off]);
    default: return (A)((const float*)p.out)[off];
  }
}

// double -> bfloat16 rounded to nearest even, in the same instructions on every arch: rounded to odd into float
// (the float nearest v, moved one ulp toward zero if it lies beyond v, then its last bit set if inexact), then to
// bfloat16 (float keeps more than 8 + 2 bits, so the second rounding is the only one that counts). The value of
// types.cuh's Store<bf16_t>::from(double), whose sm_90 form (cvt.rn.bf16.f64) made this file's PTX differ by arch,
// so that reduce's sm_90 code had to be compiled by NVRTC again instead of sharing the sm_80 PTX through ptxas
// (issue 21's install time; pydnn/_build/ptxas.py). It runs once per output.
__device__ __forceinline__ bf16_t bf16_of(double v) {
  float f = __double2float_rn(v);
  if (v == v && (double)f != v) {
    unsigned b = __float_as_uint(f);
    if (fabs((double)f) > fabs(v)) b -= 1u;  // rounded away from zero (inf included): truncate instead
    f = __uint_as_float(b | 1u);
  }
  return to_bf16(f);
}
__device__ __forceinline__ bf16_t bf16_of(float v) { return to_bf16(v); }

template <class A> __device__ __forceinline__ void store_out(const ReduceParams& p, i64 off, A v) {
  switch (p.out_type) {
    case PYDNN_REDUCE_OUT_F64: ((double*)p.out)[off] = (double)v; break;
    case PYDNN_REDUCE_OUT_F16: ((half_t*)p.out)[off] = store<half_t>(v); break;
    case PYDNN_REDUCE_OUT_BF16: ((bf16_t*)p.out)[off] = bf16_of(v); break;
    default: ((float*)p.out)[off] = store<float>(v);
  }
}

// The final value of an output: AVG divides, NORM2 takes the root, then alpha / beta blending (beta == 0
// never reads C). The index goes to the indices buffer when there is one.
template <class A>
__device__ __forceinline__ void write_result(const ReduceParams& p, i64 c_off, i64 i_off, Part<A> r) {
  A v = r.v;
  if (p.op == kAvg) v = v / (A)p.len;
  else if (p.op == kNorm2) v = m_sqrt(v);
  A o = (A)p.alpha * v;
  if (p.flags & PYDNN_FLAG_BETA) o += (A)p.beta * load_out<A>(p, c_off);
  store_out<A>(p, c_off, o);
  if (p.indices) ((int*)p.indices)[i_off] = r.i;
}

template <class A> __device__ __forceinline__ void write_partial(const ReduceParams& p, i64 slot, Part<A> r) {
  double* vals = (double*)p.workspace;
  vals[slot] = (double)r.v;
  if (p.indices) ((int*)(vals + p.rows * p.segments))[slot] = r.i;
}

// One unit of a thread's walk: a 16-byte vector through the read-only path, or one element.
template <class V> __device__ __forceinline__ V load_unit(const V* ptr) {
  if constexpr (sizeof(V) == 16) {
    unsigned w0, w1, w2, w3;
    asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(w0), "=r"(w1), "=r"(w2), "=r"(w3) : "l"(ptr));
    V v;
    unsigned* w = reinterpret_cast<unsigned*>(&v);
    w[0] = w0;
    w[1] = w1;
    w[2] = w2;
    w[3] = w3;
    return v;
  } else {
    return *ptr;
  }
}

// A thread's walk over reduce units u, u + S, u + 2S, ... in one dim, or two dims (outer [0], inner [1])
// where the inner coordinate wraps; offsets in elements of A. The host writes the step S as
// red_step[1] (inner digit), step_off (its offset) and wrap_off (extra offset when the inner wraps).
template <bool TWO> struct Walk {
  i64 off, c1;
  __device__ __forceinline__ Walk(const ReduceParams& p, i64 u) {
    if (TWO) {
      const i64 n1 = p.red_size[1], q = u / n1;
      c1 = u - q * n1;
      off = q * p.red_stride[0] + c1 * p.red_stride[1];
    } else {
      c1 = 0;
      off = u * p.red_stride[0];
    }
  }
  __device__ __forceinline__ void next(const ReduceParams& p) {
    off += p.step_off;
    if (TWO) {
      c1 += p.red_step[1];
      if (c1 >= p.red_size[1]) {
        c1 -= p.red_size[1];
        off += p.wrap_off;
      }
    }
  }
};

// The same for any number of reduce dims: coordinates in registers (the loops unroll over all 8 dims),
// the step added digit by digit with carries (red_step holds the step in the dims' radix).
struct WalkN {
  i64 c[PYDNN_MAX_DIMS], off;
  __device__ __forceinline__ WalkN(const ReduceParams& p, i64 u) {
    off = 0;
#pragma unroll
    for (int d = PYDNN_MAX_DIMS - 1; d >= 0; --d) {
      c[d] = 0;
      if (d < p.red_ndim) {
        if (d > 0) {
          const i64 s = p.red_size[d], q = u / s;
          c[d] = u - q * s;
          u = q;
        } else {
          c[d] = u;
        }
        off += c[d] * p.red_stride[d];
      }
    }
  }
  __device__ __forceinline__ void next(const ReduceParams& p) {
    int carry = 0;
#pragma unroll
    for (int d = PYDNN_MAX_DIMS - 1; d > 0; --d) {
      if (d < p.red_ndim) {
        const i64 v = c[d] + p.red_step[d] + carry;
        carry = v >= p.red_size[d];
        c[d] = carry ? v - p.red_size[d] : v;
      }
    }
    c[0] += p.red_step[0] + carry;
    off = 0;
#pragma unroll
    for (int d = 0; d < PYDNN_MAX_DIMS; ++d)
      if (d < p.red_ndim) off += c[d] * p.red_stride[d];
  }
};

// A row thread's units u, u + G, ... below hi: VEC-element vectors (VEC == 1: elements). Unit u holds
// elements first + u * VEC + e.
template <class TI, class A, int VEC, bool TWO>
__device__ __forceinline__ void walk_row(const ReduceParams& p, const TI* base, i64 u, i64 hi, int G, i64 first,
                                         Acc<A>& acc, int op, bool np, bool idx) {
  typedef Vec<TI, VEC> V;
  Walk<TWO> w(p, u);
  for (; u + (kUnroll - 1) * (i64)G < hi; u += kUnroll * (i64)G) {
    V x[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      x[k] = load_unit(reinterpret_cast<const V*>(base + w.off));
      w.next(p);
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k)
#pragma unroll
      for (int e = 0; e < VEC; ++e)
        add(acc, in_val<A>(p, x[k].v[e]), (int)(first + (u + (i64)k * G) * VEC + e), op, np, idx);
  }
  // The last units (fewer than kUnroll) are loaded all at once, then added in order: one at a time, a
  // thread with units / G = 5.5 (rows of 2824 fp32, G 128) waited for three dependent memory round trips
  // instead of two (the issue-20 sweep: AVG 53513 x 2824 fp32 at 0.69x PyTorch on the H200).
  if (u < hi) {
    V x[kUnroll - 1];
#pragma unroll
    for (int k = 0; k < kUnroll - 1; ++k) {
      if (u + (i64)k * G < hi) {
        x[k] = load_unit(reinterpret_cast<const V*>(base + w.off));
        w.next(p);
      }
    }
#pragma unroll
    for (int k = 0; k < kUnroll - 1; ++k) {
      if (u + (i64)k * G < hi) {
#pragma unroll
        for (int e = 0; e < VEC; ++e)
          add(acc, in_val<A>(p, x[k].v[e]), (int)(first + (u + (i64)k * G) * VEC + e), op, np, idx);
      }
    }
  }
}

// ------------------------------------------------------------------ rows_vec
// G threads per (output, segment). red_ndim == 1: the output's `len` elements are contiguous; elements
// before the first 16-byte boundary (the head) and after the last whole vector (the tail) are read one
// by one by segment 0. red_ndim == 2: the host guarantees whole aligned vectors (red_size/red_stride in
// vectors on the inner dim).
template <class TI, int OP, bool IDX>
__global__ void __launch_bounds__(kThreads, kMinBlocks) rows_vec(const ReduceParams p) {
  typedef typename AccT<TI, OP>::type A;
  constexpr int VEC = 16 / sizeof(TI);
  __shared__ Part<A> sm[kThreads / 32];
  const bool np = p.flags & PYDNN_FLAG_NAN_PROP;
  const int G = p.group, lane = threadIdx.x & (G - 1);
  const i64 slot = (i64)blockIdx.x * (kThreads / G) + threadIdx.x / G;
  i64 row = slot;
  int seg = 0;
  if (p.segments > 1) {
    row = slot / p.segments;
    seg = (int)(slot - row * p.segments);
  }
  const bool live = row < p.rows;
  Acc<A> acc = start<A>(OP, np);
  if (live) {
    const TI* base = (const TI*)p.in + row_offset(p, row, 1);
    const i64 lo = (i64)seg * p.chunk;
    if (p.red_ndim == 2) {
      const i64 hi = min(p.units, lo + p.chunk);
      if constexpr (IsH16<TI>::value) {
        if (in_bf16(p)) walk_row<bf16_t, A, VEC, true>(p, (const bf16_t*)base, lo + lane, hi, G, 0, acc, OP, np, IDX);
        else walk_row<half_t, A, VEC, true>(p, (const half_t*)base, lo + lane, hi, G, 0, acc, OP, np, IDX);
      } else {
        walk_row<TI, A, VEC, true>(p, base, lo + lane, hi, G, 0, acc, OP, np, IDX);
      }
    } else {
      const int mis = (int)(((unsigned long long)base / sizeof(TI)) & (VEC - 1));
      const i64 head = min(p.len, (i64)((VEC - mis) & (VEC - 1)));
      const i64 nvec = (p.len - head) / VEC;
      if (seg == 0)
        for (i64 e = lane; e < head; e += G) add(acc, in_val<A>(p, base[e]), (int)e, OP, np, IDX);
      const i64 hi = min(nvec, lo + p.chunk);
      if constexpr (IsH16<TI>::value) {
        if (in_bf16(p))
          walk_row<bf16_t, A, VEC, false>(p, (const bf16_t*)(base + head), lo + lane, hi, G, head, acc, OP, np, IDX);
        else
          walk_row<half_t, A, VEC, false>(p, (const half_t*)(base + head), lo + lane, hi, G, head, acc, OP, np, IDX);
      } else {
        walk_row<TI, A, VEC, false>(p, base + head, lo + lane, hi, G, head, acc, OP, np, IDX);
      }
      if (seg == 0)
        for (i64 e = head + nvec * VEC + lane; e < p.len; e += G) add(acc, in_val<A>(p, base[e]), (int)e, OP, np, IDX);
    }
  }
  const Part<A> r = group_reduce(close(acc, OP), G, OP, np, IDX, sm);
  if (!live || lane != 0) return;
  if (p.segments == 1) write_result(p, row_offset(p, row, 0), IDX ? row_offset(p, row, 2) : 0, r);
  else write_partial(p, slot, r);
}

// ------------------------------------------------------------------ rows_gen
// Any layout: G threads per (output, segment) walk its elements with WalkN; op and indices at runtime,
// arithmetic in double.
template <class TI>
__global__ void __launch_bounds__(kThreads, kMinBlocks) rows_gen(const ReduceParams p) {
  typedef double A;  // the fallback: one kernel for every op, so the widest arithmetic
  __shared__ Part<A> sm[kThreads / 32];
  const int op = p.op;
  const bool np = p.flags & PYDNN_FLAG_NAN_PROP, idx = p.indices != nullptr;
  const int G = p.group, lane = threadIdx.x & (G - 1);
  const i64 slot = (i64)blockIdx.x * (kThreads / G) + threadIdx.x / G;
  i64 row = slot;
  int seg = 0;
  if (p.segments > 1) {
    row = slot / p.segments;
    seg = (int)(slot - row * p.segments);
  }
  const bool live = row < p.rows;
  Acc<A> acc = start<A>(op, np);
  if (live) {
    const TI* base = (const TI*)p.in + row_offset(p, row, 1);
    const i64 lo = (i64)seg * p.chunk, hi = min(p.len, lo + p.chunk);
    i64 u = lo + lane;
    WalkN w(p, u);
    for (; u + (kUnroll - 1) * (i64)G < hi; u += kUnroll * (i64)G) {
      TI x[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        x[k] = base[w.off];
        w.next(p);
      }
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) add(acc, in_val<A>(p, x[k]), (int)(u + (i64)k * G), op, np, idx);
    }
    for (; u < hi; u += G) {
      const TI x = base[w.off];
      w.next(p);
      add(acc, in_val<A>(p, x), (int)u, op, np, idx);
    }
  }
  const Part<A> r = group_reduce(close(acc, op), G, op, np, idx, sm);
  if (!live || lane != 0) return;
  if (p.segments == 1) write_result(p, row_offset(p, row, 0), idx ? row_offset(p, row, 2) : 0, r);
  else write_partial(p, slot, r);
}

// ------------------------------------------------------------------ cols
// Outputs (outer, k), k < K = p.cols along A's innermost kept dim. Block (BX, BY): x runs along K in
// VEC-element vectors (VEC > 1: K contiguous, everything aligned); with K/VEC < 32 a warp holds `pack`
// reduce positions side by side (x = sub * K/VEC + column). y and sub split the reduce positions of a
// segment: thread (sub, y) takes r = lo + sub + pack * y + j * pack * BY. Partials meet in shared
// memory and thread (0, column) folds them in (sub, y) order.
template <class TI, class A, int VEC, bool TWO>
__device__ __forceinline__ void walk_cols(const ReduceParams& p, const TI* base, i64 r, i64 hi, int S, Acc<A>* acc,
                                          int op, bool np, bool idx) {
  typedef Vec<TI, VEC> V;
  Walk<TWO> w(p, r);
  for (; r + (kUnroll - 1) * (i64)S < hi; r += kUnroll * (i64)S) {
    V x[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      x[k] = load_unit(reinterpret_cast<const V*>(base + w.off));
      w.next(p);
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k)
#pragma unroll
      for (int e = 0; e < VEC; ++e) add(acc[e], in_val<A>(p, x[k].v[e]), (int)(r + (i64)k * S), op, np, idx);
  }
  for (; r < hi; r += S) {
    const V x = load_unit(reinterpret_cast<const V*>(base + w.off));
    w.next(p);
#pragma unroll
    for (int e = 0; e < VEC; ++e) add(acc[e], in_val<A>(p, x.v[e]), (int)r, op, np, idx);
  }
}

template <class TI, int VEC, int OP, bool IDX>
__global__ void __launch_bounds__(kThreads, kMinBlocks) cols(const ReduceParams p) {
  typedef typename AccT<TI, OP>::type A;
  __shared__ Part<A> sm[kThreads * VEC];
  const bool np = p.flags & PYDNN_FLAG_NAN_PROP;
  const int BX = blockDim.x, BY = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
  const int P = p.pack;
  const i64 KV = p.cols / VEC;
  i64 b = blockIdx.x;
  int seg = 0;
  if (p.segments > 1) {
    const i64 q = b / p.segments;
    seg = (int)(b - q * p.segments);
    b = q;
  }
  const i64 outer = b / p.tiles, tile = b - outer * p.tiles;
  int sub = 0;
  i64 vcol;
  bool active;
  if (P > 1) {
    sub = tx / (int)KV;
    vcol = tx - sub * (int)KV;
    active = sub < P;
  } else {
    vcol = tile * BX + tx;
    active = vcol < KV;
  }
  Acc<A> acc[VEC];
#pragma unroll
  for (int e = 0; e < VEC; ++e) acc[e] = start<A>(OP, np);
  if (active) {
    const TI* base = (const TI*)p.in + row_offset(p, outer, 1) + vcol * VEC * p.col_stride[1];
    const i64 lo = (i64)seg * p.chunk, hi = min(p.units, lo + p.chunk);
    const i64 r = lo + sub + (i64)P * ty;
    if constexpr (IsH16<TI>::value) {
      const bool bf = in_bf16(p);
      if (p.red_ndim == 2 && bf) walk_cols<bf16_t, A, VEC, true>(p, (const bf16_t*)base, r, hi, P * BY, acc, OP, np, IDX);
      else if (p.red_ndim == 2) walk_cols<half_t, A, VEC, true>(p, (const half_t*)base, r, hi, P * BY, acc, OP, np, IDX);
      else if (bf) walk_cols<bf16_t, A, VEC, false>(p, (const bf16_t*)base, r, hi, P * BY, acc, OP, np, IDX);
      else walk_cols<half_t, A, VEC, false>(p, (const half_t*)base, r, hi, P * BY, acc, OP, np, IDX);
    } else {
      if (p.red_ndim == 2) walk_cols<TI, A, VEC, true>(p, base, r, hi, P * BY, acc, OP, np, IDX);
      else walk_cols<TI, A, VEC, false>(p, base, r, hi, P * BY, acc, OP, np, IDX);
    }
  }
  const int t = ty * BX + tx;
#pragma unroll
  for (int e = 0; e < VEC; ++e) sm[t * VEC + e] = close(acc[e], OP);
  __syncthreads();
  if (ty != 0 || !active || sub != 0) return;
  const int kv = P > 1 ? (int)KV : 0;
  const i64 c_base = p.segments == 1 ? row_offset(p, outer, 0) : 0;
  const i64 i_base = (p.segments == 1 && IDX) ? row_offset(p, outer, 2) : 0;
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    Part<A> r = sm[tx * VEC + e];
    for (int s = 0; s < P; ++s)
      for (int y = 0; y < BY; ++y)
        if (s | y) r = merge(r, sm[(y * BX + s * kv + tx) * VEC + e], OP, np, IDX);
    const i64 col = vcol * VEC + e;
    if (p.segments == 1) write_result(p, c_base + col * p.col_stride[0], i_base + col * p.col_stride[2], r);
    else write_partial(p, (outer * p.cols + col) * p.segments + seg, r);
  }
}

// ------------------------------------------------------------------ reduce_finish
// Second pass after a segmented kernel: fgroup threads per output fold its partials (double values,
// int32 indices) in a fixed order, in double, and write the result.
template <class TI>
__global__ void __launch_bounds__(kThreads, kMinBlocks) reduce_finish(const ReduceParams p) {
  typedef double A;
  __shared__ Part<A> sm[kThreads / 32];
  const int op = p.op;
  const bool np = p.flags & PYDNN_FLAG_NAN_PROP, idx = p.indices != nullptr;
  const int G = p.fgroup, lane = threadIdx.x & (G - 1);
  const i64 row = (i64)blockIdx.x * (kThreads / G) + threadIdx.x / G;
  const bool live = row < p.rows;
  const double* vals = (const double*)p.workspace;
  const int* inds = (const int*)(vals + p.rows * p.segments);
  Part<A> a;
  a.v = identity<A>(op, np);
  a.i = kEmpty;
  if (live) {
    for (int s = lane; s < p.segments; s += G) {
      Part<A> b;
      b.v = vals[row * p.segments + s];
      b.i = idx ? inds[row * p.segments + s] : 0;
      a = merge(a, b, op, np, idx);
    }
  }
  a = group_reduce(a, G, op, np, idx, sm);
  if (!live || lane != 0) return;
  i64 c_off, i_off = 0;
  if (p.cols) {
    const i64 outer = row / p.cols, k = row - outer * p.cols;
    c_off = row_offset(p, outer, 0) + k * p.col_stride[0];
    if (idx) i_off = row_offset(p, outer, 2) + k * p.col_stride[2];
  } else {
    c_off = row_offset(p, row, 0);
    if (idx) i_off = row_offset(p, row, 2);
  }
  write_result(p, c_off, i_off, a);
}

}  // namespace reduce
}  // namespace pydnn
