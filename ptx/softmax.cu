// Softmax forward and backward (cudnnSoftmaxForward / cudnnSoftmaxBackward); see softmax_params.h for
// how a problem is described. Five kernels, chosen on the host from the strides (pydnn/ops/softmax.py):
//
//   row      the row is contiguous in every operand and fits in registers: G threads per row (a sub-warp
//            or warp for short rows, up to a 1024-thread block for long ones), each holding ITEMS
//            vectors of VEC elements. One read of the input, one write of the output. Vector accesses
//            are 16 bytes; a row whose start is not 16-byte aligned has a scalar head and tail (fewer
//            than VEC elements each) held as one extra element by the first threads of the group.
//   row_loop the row is contiguous but too long for registers: a block per row streams it twice (an
//            online max / rescaled-sum pass, then the write pass; the second read mostly hits L2).
//   col      the reduced axis is strided (CHANNEL on NCHW: stride H*W) and the innermost row dim is
//            contiguous: blockDim.x threads run along that dim (16-byte vectors when aligned), so each
//            load of a warp is coalesced; blockDim.y threads split the channels, kColItems each, held
//            in registers. Partials meet through warp shuffles and shared memory.
//   col_loop the same tiling for channels too many for registers: streamed twice (online max / sum).
//   gen      anything else (any strides, up to 8 reduce dims): G threads per row walk its elements with
//            an incremental coordinate walker; online max / sum, then a write pass.
//
// Every algorithm subtracts the row maximum before exp, so nothing overflows. The fast exp (ex2.approx,
// a few float32 ulps) serves FAST and all 16-bit data; float ACCURATE / LOG use expf, double uses exp.
// NaN: the max skips NaN (fmax), but the NaN then reaches the sum, so a row holding a NaN is all NaN.
// A row of nothing but -inf gives NaN (0/0), as the float64 reference does.
//
// Every kernel loops over its row groups (grid-stride), so any number of rows works with a capped grid;
// barriers are reached by every thread of a block (dead rows compute on fill values and write nothing).
#include "common/params.h"
#include "common/types.cuh"
#include "softmax_params.h"

namespace pydnn {
namespace softmax {

enum { kFast = PYDNN_SOFTMAX_KIND_FAST, kAccurate = PYDNN_SOFTMAX_KIND_ACCURATE, kLog = PYDNN_SOFTMAX_KIND_LOG };
constexpr int kColItems = 4;     // channels per thread in col
constexpr int kColThreads = 256; // col block (blockDim.x * blockDim.y)
constexpr int kColMinBlocks = 1;  // (a 64-register cap made the 16-byte variants spill; they take ~80)
constexpr int kUnroll = 4;       // loads in flight per thread in the looping kernels' read passes
constexpr int kWrite = 2;        // loads in flight per thread in their write passes (they hold more)
constexpr int kGenThreads = 256; // gen block

// ------------------------------------------------------------------ arithmetic

__device__ __forceinline__ float amax(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double amax(double a, double b) { return fmax(a, b); }
template <class A> __device__ __forceinline__ A neg_inf() { return -m_inf(A(0)); }

// 2^(z log2 e) on the MUFU unit; subnormal results flush to zero (they are below every output's atol).
__device__ __forceinline__ float fast_exp(float z) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(z * 1.4426950408889634f));
  return r;
}
// exp for data type T: fast for FAST and for 16-bit data, accurate otherwise; double is always exact.
template <class T> __device__ __forceinline__ float exp_of(float z, bool fast) {
  return (fast || sizeof(T) == 2) ? fast_exp(z) : expf(z);
}
template <class T> __device__ __forceinline__ double exp_of(double z, bool) { return exp(z); }

template <class A, class B> struct Same { static constexpr bool value = false; };
template <class A> struct Same<A, A> { static constexpr bool value = true; };

// Bit patterns of -inf.
template <class T> struct Bits;
template <> struct Bits<float> { static constexpr unsigned long long neg_inf = 0xff800000ull; };
template <> struct Bits<double> { static constexpr unsigned long long neg_inf = 0xfff0000000000000ull; };
template <> struct Bits<half_t> { static constexpr unsigned long long neg_inf = 0xfc00ull; };
template <> struct Bits<bf16_t> { static constexpr unsigned long long neg_inf = 0xff80ull; };

struct __align__(16) U4 { unsigned x, y, z, w; };
struct __align__(8) U2 { unsigned x, y; };

// VEC consecutive elements of T in registers, as 32-bit words (a 16-bit scalar takes one word): the
// unit of every load and store. Loads and stores are one access of sizeof(T) * VEC bytes (the address
// must be aligned to it); get / set convert to and from the arithmetic type, two 16-bit values per
// instruction where the hardware has it.
template <class T, int VEC> struct Frag {
  static constexpr int BYTES = (int)sizeof(T) * VEC;
  static constexpr int WORDS = BYTES < 4 ? 1 : BYTES / 4;
  unsigned w[WORDS];

  __device__ __forceinline__ void load(const T* p) {
    if constexpr (BYTES == 16) {
      const U4 q = *reinterpret_cast<const U4*>(p);
      w[0] = q.x; w[1] = q.y; w[2] = q.z; w[3] = q.w;
    } else if constexpr (BYTES == 8) {
      const U2 q = *reinterpret_cast<const U2*>(p);
      w[0] = q.x; w[1] = q.y;
    } else if constexpr (BYTES == 4) {
      w[0] = *reinterpret_cast<const unsigned*>(p);
    } else {
      w[0] = *reinterpret_cast<const unsigned short*>(p);
    }
  }
  __device__ __forceinline__ void store(T* p) const {
    if constexpr (BYTES == 16) {
      U4 q;
      q.x = w[0]; q.y = w[1]; q.z = w[2]; q.w = w[3];
      *reinterpret_cast<U4*>(p) = q;
    } else if constexpr (BYTES == 8) {
      U2 q;
      q.x = w[0]; q.y = w[1];
      *reinterpret_cast<U2*>(p) = q;
    } else if constexpr (BYTES == 4) {
      *reinterpret_cast<unsigned*>(p) = w[0];
    } else {
      *reinterpret_cast<unsigned short*>(p) = (unsigned short)w[0];
    }
  }
  // every element set to the value with these bits
  __device__ __forceinline__ void fill(unsigned long long bits) {
#pragma unroll
    for (int i = 0; i < WORDS; ++i) {
      if constexpr (sizeof(T) == 8) w[i] = (unsigned)(i % 2 ? bits >> 32 : bits);
      else if constexpr (sizeof(T) == 4) w[i] = (unsigned)bits;
      else w[i] = (unsigned)(bits | (VEC > 1 ? bits << 16 : 0));
    }
  }
  template <class A> __device__ __forceinline__ void get(A* a) const {
    if constexpr (sizeof(T) == 8) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) a[e] = (A)__hiloint2double((int)w[2 * e + 1], (int)w[2 * e]);
    } else if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) a[e] = (A)__uint_as_float(w[e]);
    } else {
#pragma unroll
      for (int e = 0; e < VEC; e += 2) {
        float lo, hi;
        unpack2(w[e / 2], lo, hi);
        a[e] = (A)lo;
        if (e + 1 < VEC) a[e + 1] = (A)hi;
      }
    }
  }
  template <class A> __device__ __forceinline__ void set(const A* a) {
    if constexpr (sizeof(T) == 8) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const double d = (double)a[e];
        w[2 * e] = (unsigned)__double2loint(d);
        w[2 * e + 1] = (unsigned)__double2hiint(d);
      }
    } else if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) w[e] = __float_as_uint(pydnn::store<float>(a[e]));
    } else if constexpr (VEC == 1) {
      w[0] = pydnn::store<T>(a[0]).bits;
    } else {
#pragma unroll
      for (int e = 0; e < VEC; e += 2) w[e / 2] = pack2(a[e], a[e + 1]);
    }
  }

 private:
  __device__ __forceinline__ static void unpack2(unsigned v, float& lo, float& hi) { unpack16x2<T>(v, lo, hi); }
  template <class A> __device__ __forceinline__ static unsigned pack2(A lo, A hi) {
    return pack16x2<T>((float)lo, (float)hi);
  }
};

// ------------------------------------------------------------------ addressing

// Offsets of row `row` in operands 0 .. NOPS-1 (0 out, 1 in0, 2 in1) from the row dims.
template <int NOPS>
__device__ __forceinline__ void row_offsets(const SoftmaxParams& p, i64 row, i64* off) {
  if (p.row_ndim == 1) {
#pragma unroll
    for (int k = 0; k < NOPS; ++k) off[k] = row * p.row_stride[k][0];
    return;
  }
#pragma unroll
  for (int k = 0; k < NOPS; ++k) off[k] = 0;
  if (p.flags & PYDNN_SOFTMAX_FLAG_ROWS32) {
    unsigned r = (unsigned)row;
    for (int d = p.row_ndim - 1; d >= 0; --d) {
      const unsigned s = (unsigned)p.row_size[d], q = r / s;
      const i64 c = (i64)(r - q * s);
#pragma unroll
      for (int k = 0; k < NOPS; ++k) off[k] += c * p.row_stride[k][d];
      r = q;
    }
  } else {
    for (int d = p.row_ndim - 1; d >= 0; --d) {
      const i64 s = p.row_size[d], q = row / s, c = row - q * s;
#pragma unroll
      for (int k = 0; k < NOPS; ++k) off[k] += c * p.row_stride[k][d];
      row = q;
    }
  }
}

// A contiguous row of `len` elements starting at `x`: `head` scalar elements up to the first VEC-element
// boundary, `nvec` whole vectors, `tail` scalar elements after them (head, tail < VEC). The other
// operands of a row share x's misalignment (the host checks it).
template <class I> struct Split {
  I head, nvec, tail;
};
template <class T, int VEC, class I> __device__ __forceinline__ Split<I> split(const T* x, I len) {
  Split<I> s;
  if (VEC == 1) {
    s.head = 0;
    s.nvec = len;
    s.tail = 0;
    return s;
  }
  const I mis = (I)((reinterpret_cast<unsigned long long>(x) / sizeof(T)) & (VEC - 1));
  s.head = min(len, (I)((VEC - mis) & (VEC - 1)));
  s.nvec = (len - s.head) / VEC;
  s.tail = len - s.head - s.nvec * VEC;
  return s;
}
// The head or tail element thread `lane` of a group holds (-1: none). The host makes G >= 2 * VEC - 2,
// so that every head and tail element has a thread.
template <int VEC, class I> __device__ __forceinline__ I extra_index(const Split<I>& s, int lane, bool live) {
  if (VEC == 1 || !live) return -1;
  if (lane < s.head) return lane;
  if (lane - s.head < s.tail) return s.nvec * VEC + lane;  // head + nvec * VEC + (lane - head)
  return -1;
}

// ------------------------------------------------------------------ reductions

template <class A> __device__ __forceinline__ A shfl_xor(A v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }
template <bool MAX, class A> __device__ __forceinline__ A combine(A a, A b) { return MAX ? amax(a, b) : a + b; }

// Max or sum over a group of G threads with consecutive ids (G a power of two dividing blockDim.x, a
// multiple of 32). Every thread of the block calls it; with G > 32 it passes one barrier and uses sm
// (32 entries). A buffer may be written again only after a later barrier of every thread.
template <bool MAX, class A> __device__ __forceinline__ A group_reduce(A v, int G, A* sm) {
  for (int m = (G < 32 ? G : 32) >> 1; m > 0; m >>= 1) v = combine<MAX>(v, shfl_xor(v, m));
  if (G > 32) {
    if ((threadIdx.x & 31) == 0) sm[threadIdx.x >> 5] = v;
    __syncthreads();
    const int first = (int)(threadIdx.x & ~(unsigned)(G - 1)) >> 5;
    v = sm[first];
    for (int w = 1; w < (G >> 5); ++w) v = combine<MAX>(v, sm[first + w]);
  }
  return v;
}

// Online (max, sum of exp(x - max)) over a batch of N values. The max skips NaN (fmax) but each value
// still enters the sum, so a NaN makes the sum NaN for good. While everything seen is -inf (or NaN) the
// exps are taken against 0 instead of the max, which counts -inf as 0 where exp(-inf - -inf) would be
// NaN; the first finite max then rescales that sum (0, or NaN) by exp(-inf) = 0.
template <class T, int N, class A>
__device__ __forceinline__ void online_add(A& m, A& s, const A* a, bool fast) {
  A bm = a[0];
#pragma unroll
  for (int j = 1; j < N; ++j) bm = amax(bm, a[j]);
  const A nm = amax(m, bm);
  const A base = nm == neg_inf<A>() ? A(0) : nm;
  A acc = 0;
#pragma unroll
  for (int j = 0; j < N; ++j) acc += exp_of<T>(a[j] - base, fast);
  s = s * exp_of<T>(m - base, fast) + acc;
  m = nm;
}

// The group's (max, sum) from each thread's online (m, s): the max first, then sums rescaled to it (a
// thread that saw nothing finite has s = 0, or NaN, which must stay NaN).
template <class T, class A>
__device__ __forceinline__ void online_finish(A& m, A& s, int G, A* sm_max, A* sm_sum, bool fast) {
  const A M = group_reduce<true>(m, G, sm_max);
  const A t = (s == A(0)) ? A(0) : s * exp_of<T>(m - M, fast);
  s = group_reduce<false>(t, G, sm_sum);
  m = M;
}

// The forward output of one element from z = x - max: c = alpha / sum (softmax, z then holds exp(z))
// or log(sum) (LOG).
template <bool LOG, class A> __device__ __forceinline__ A fwd_out(A f, A c, A alpha) {
  return LOG ? alpha * (f - c) : f * c;
}
// The backward output of one element (before beta): s = sum(dy * y) or sum(dy) (LOG).
template <class T, bool LOG, class A> __device__ __forceinline__ A bwd_out(A y, A dy, A s, A alpha) {
  return alpha * (LOG ? dy - exp_of<T>(y, false) * s : y * (dy - s));
}

// ------------------------------------------------------------------ row (registers)

// What thread `lane` of a row's group holds of the row's input: ITEMS fragments (vectors lane, lane + G,
// ...; -inf past the row's end, which changes neither max nor sum) and at most one head / tail element
// (index xi, -1: none).
template <class T, int VEC, int ITEMS> struct RowPart {
  typedef typename AccOf<T>::type A;
  Frag<T, VEC> v[ITEMS];
  A xe;
  int xi;

  __device__ __forceinline__ void fetch(const T* x, const Split<int>& sp, int lane, int G, bool live) {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = lane + k * G;
      v[k].fill(Bits<T>::neg_inf);
      if (live && i < sp.nvec) v[k].load(x + sp.head + i * VEC);
    }
    xi = -1;
    xe = neg_inf<A>();
    if constexpr (VEC > 1) {
      xi = extra_index<VEC>(sp, lane, live);
      if (xi >= 0) xe = pydnn::load<A>(x[xi]);
    }
  }
};

// Softmax of one row held in registers (every thread of the block calls it: group_reduce may pass a
// barrier), written to y. K: kFast / kAccurate / kLog.
template <class T, int VEC, int ITEMS, int K, class A>
__device__ __forceinline__ void fwd_row(const RowPart<T, VEC, ITEMS>& in, T* y, const Split<int>& sp, int lane,
                                        int G, bool live, bool blend, A alpha, A beta, A* sm_max, A* sm_sum) {
  typedef Frag<T, VEC> F;
  A f[ITEMS][VEC];
  A m = in.xe;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    in.v[k].get(f[k]);
#pragma unroll
    for (int e = 0; e < VEC; ++e) m = amax(m, f[k][e]);
  }
  m = group_reduce<true>(m, G, sm_max);
  A s = 0;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k)
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const A z = f[k][e] - m, ex = exp_of<T>(z, K == kFast);
      s += ex;
      f[k][e] = K == kLog ? z : ex;
    }
  A xe = in.xe;
  if constexpr (VEC > 1) {
    const A z = xe - m, ex = exp_of<T>(z, K == kFast);
    s += ex;
    xe = K == kLog ? z : ex;
  }
  s = group_reduce<false>(s, G, sm_sum);
  const A c = K == kLog ? m_log(s) : alpha / s;
  T* yv = y + sp.head;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int i = lane + k * G;
    if (live && i < sp.nvec) {
      A o[VEC];
#pragma unroll
      for (int e = 0; e < VEC; ++e) o[e] = fwd_out<K == kLog>(f[k][e], c, alpha);
      if (blend) {
        F old;
        old.load(yv + i * VEC);
        A b[VEC];
        old.get(b);
#pragma unroll
        for (int e = 0; e < VEC; ++e) o[e] += beta * b[e];
      }
      F r;
      r.set(o);
      r.store(yv + i * VEC);
    }
  }
  if (in.xi >= 0) {
    A o = fwd_out<K == kLog>(xe, c, alpha);
    if (blend) o += beta * load<A>(y[in.xi]);
    y[in.xi] = store<T>(o);
  }
}

// Forward. ITEMS fragments of VEC elements per thread, G = p.group threads per row, blockDim.x / G rows
// per block, one block per row group (grid-stride past the grid's end).
template <class T, int VEC, int ITEMS, int K>
__global__ void __launch_bounds__(1024) row_fwd(const SoftmaxParams p) {
  typedef typename AccOf<T>::type A;
  __shared__ A sm_max[32], sm_sum[32];
  const int G = p.group, lane = threadIdx.x & (G - 1), sub = threadIdx.x / G;
  const int per_block = blockDim.x / G;
  const bool blend = p.flags & PYDNN_FLAG_BETA;
  const A alpha = (A)p.alpha, beta = (A)p.beta;
  for (i64 first = (i64)blockIdx.x * per_block; first < p.rows; first += (i64)gridDim.x * per_block) {
    const i64 row = first + sub;
    const bool live = row < p.rows;
    i64 off[2];
    row_offsets<2>(p, live ? row : first, off);
    const T* x = (const T*)p.in0 + off[1];
    const Split<int> sp = split<T, VEC>(x, (int)p.len);
    RowPart<T, VEC, ITEMS> in;
    in.fetch(x, sp, lane, G, live);
    fwd_row<T, VEC, ITEMS, K>(in, (T*)p.out + off[0], sp, lane, G, live, blend, alpha, beta, sm_max, sm_sum);
  }
}

// Backward: dx = alpha * y * (dy - sum(dy * y)) (K = kAccurate) or alpha * (dy - exp(y) * sum(dy))
// (K = kLog), + beta * dx. y and dy stay packed in registers between the two passes; slots past the
// row's end hold 0.
template <class T, int VEC, int ITEMS, int K>
__global__ void __launch_bounds__(1024) row_bwd(const SoftmaxParams p) {
  typedef typename AccOf<T>::type A;
  typedef Frag<T, VEC> F;
  __shared__ A sm[2][32];
  const int G = p.group, lane = threadIdx.x & (G - 1), sub = threadIdx.x / G;
  const int per_block = blockDim.x / G;
  const bool blend = p.flags & PYDNN_FLAG_BETA;
  const A alpha = (A)p.alpha, beta = (A)p.beta;
  int it = 0;
  for (i64 first = (i64)blockIdx.x * per_block; first < p.rows; first += (i64)gridDim.x * per_block, ++it) {
    const i64 row = first + sub;
    const bool live = row < p.rows;
    i64 off[3];
    row_offsets<3>(p, live ? row : first, off);
    const T* yp = (const T*)p.in0 + off[1];
    const T* dyp = (const T*)p.in1 + off[2];
    T* dxp = (T*)p.out + off[0];
    const Split<int> sp = split<T, VEC>(yp, (int)p.len);
    F vy[ITEMS], vd[ITEMS];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = lane + k * G;
      vy[k].fill(0);
      vd[k].fill(0);
      if (live && i < sp.nvec) {
        vy[k].load(yp + sp.head + i * VEC);
        vd[k].load(dyp + sp.head + i * VEC);
      }
    }
    int xi = -1;
    A ye = 0, de = 0;
    if constexpr (VEC > 1) {
      xi = extra_index<VEC>(sp, lane, live);
      if (xi >= 0) {
        ye = load<A>(yp[xi]);
        de = load<A>(dyp[xi]);
      }
    }
    A s = K == kLog ? de : de * ye;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      A a[VEC], d[VEC];
      vy[k].get(a);
      vd[k].get(d);
#pragma unroll
      for (int e = 0; e < VEC; ++e) s += K == kLog ? d[e] : d[e] * a[e];
    }
    s = group_reduce<false>(s, G, sm[it & 1]);
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int i = lane + k * G;
      if (live && i < sp.nvec) {
        A a[VEC], d[VEC];
        vy[k].get(a);
        vd[k].get(d);
#pragma unroll
        for (int e = 0; e < VEC; ++e) a[e] = bwd_out<T, K == kLog>(a[e], d[e], s, alpha);
        if (blend) {
          F old;
          old.load(dxp + sp.head + i * VEC);
          old.get(d);
#pragma unroll
          for (int e = 0; e < VEC; ++e) a[e] += beta * d[e];
        }
        vy[k].set(a);
        vy[k].store(dxp + sp.head + i * VEC);
      }
    }
    if (xi >= 0) {
      A o = bwd_out<T, K == kLog>(ye, de, s, alpha);
      if (blend) o += beta * load<A>(dxp[xi]);
      dxp[xi] = store<T>(o);
    }
  }
}

// ------------------------------------------------------------------ row_loop (long contiguous rows)

// Forward, kind at run time. Pass 1: online (max, sum) over kUnroll fragments at a time; pass 2
// re-reads the row (from L2 when it was read recently) and writes.
template <class T, int VEC>
__global__ void __launch_bounds__(1024) row_loop_fwd(const SoftmaxParams p) {
  typedef typename AccOf<T>::type A;
  typedef Frag<T, VEC> F;
  constexpr int U = sizeof(A) == 8 ? 1 : kUnroll;  // double exps are long: one at a time, no spills
  constexpr int UW = sizeof(A) == 8 ? 1 : kWrite;
  __shared__ A sm_max[32], sm_sum[32];
  const int G = p.group, lane = threadIdx.x & (G - 1), sub = threadIdx.x / G;
  const int per_block = blockDim.x / G;
  const bool blend = p.flags & PYDNN_FLAG_BETA;
  const A alpha = (A)p.alpha, beta = (A)p.beta;
  const bool fast = p.kind == kFast, lg = p.kind == kLog;
  for (i64 first = (i64)blockIdx.x * per_block; first < p.rows; first += (i64)gridDim.x * per_block) {
    const i64 row = first + sub;
    const bool live = row < p.rows;
    i64 off[2];
    row_offsets<2>(p, live ? row : first, off);
    const T* x = (const T*)p.in0 + off[1];
    T* y = (T*)p.out + off[0];
    const Split<i64> sp = split<T, VEC>(x, p.len);
    const i64 nvec = live ? sp.nvec : 0;
    const T* xv = x + sp.head;
    T* yv = y + sp.head;
    A m = neg_inf<A>(), s = 0;
    i64 i = lane;
    for (; i + (U - 1) * (i64)G < nvec; i += U * (i64)G) {
      F v[U];
#pragma unroll
      for (int u = 0; u < U; ++u) v[u].load(xv + (i + u * (i64)G) * VEC);
#pragma unroll
      for (int u = 0; u < U; ++u) {  // one fragment at a time: fewer values live than one batch of all
        A a[VEC];
        v[u].get(a);
        online_add<T, VEC>(m, s, a, fast);
      }
    }
    for (; i < nvec; i += G) {
      F v;
      v.load(xv + i * VEC);
      A a[VEC];
      v.get(a);
      online_add<T, VEC>(m, s, a, fast);
    }
    const i64 xi = extra_index<VEC>(sp, lane, live);
    if (xi >= 0) {
      const A a = load<A>(x[xi]);
      online_add<T, 1>(m, s, &a, fast);
    }
    online_finish<T>(m, s, G, sm_max, sm_sum, fast);
    const A c = lg ? m_log(s) : alpha / s;
    // UW loads before the first store (x and y may be one buffer, so the compiler cannot hoist them)
    for (i = lane; i < nvec; i += UW * (i64)G) {
      F v[UW];
#pragma unroll
      for (int u = 0; u < UW; ++u)
        if (i + u * (i64)G < nvec) v[u].load(xv + (i + u * (i64)G) * VEC);
#pragma unroll
      for (int u = 0; u < UW; ++u) {
        const i64 iu = i + u * (i64)G;
        if (iu < nvec) {
          A o[VEC];
          v[u].get(o);
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            const A z = o[e] - m;
            o[e] = lg ? alpha * (z - c) : exp_of<T>(z, fast) * c;
          }
          if (blend) {
            F old;
            old.load(yv + iu * VEC);
            A b[VEC];
            old.get(b);
#pragma unroll
            for (int e = 0; e < VEC; ++e) o[e] += beta * b[e];
          }
          v[u].set(o);
          v[u].store(yv + iu * VEC);
        }
      }
    }
    if (xi >= 0) {
      const A z = load<A>(x[xi]) - m;
      A o = lg ? alpha * (z - c) : exp_of<T>(z, fast) * c;
      if (blend) o += beta * load<A>(y[xi]);
      y[xi] = store<T>(o);
    }
  }
}

template <class T, int VEC>
__global__ void __launch_bounds__(1024) row_loop_bwd(const SoftmaxParams p) {
  typedef typename AccOf<T>::type A;
  typedef Frag<T, VEC> F;
  __shared__ A sm[2][32];
  const int G = p.group, lane = threadIdx.x & (G - 1), sub = threadIdx.x / G;
  const int per_block = blockDim.x / G;
  const bool blend = p.flags & PYDNN_FLAG_BETA;
  const A alpha = (A)p.alpha, beta = (A)p.beta;
  const bool lg = p.kind == kLog;
  int it = 0;
  for (i64 first = (i64)blockIdx.x * per_block; first < p.rows; first += (i64)gridDim.x * per_block, ++it) {
    const i64 row = first + sub;
    const bool live = row < p.rows;
    i64 off[3];
    row_offsets<3>(p, live ? row : first, off);
    const T* yp = (const T*)p.in0 + off[1];
    const T* dyp = (const T*)p.in1 + off[2];
    T* dxp = (T*)p.out + off[0];
    const Split<i64> sp = split<T, VEC>(yp, p.len);
    const i64 nvec = live ? sp.nvec : 0;
    const T* yv = yp + sp.head;
    const T* dyv = dyp + sp.head;
    T* dxv = dxp + sp.head;
    A s = 0;
    i64 i = lane;
    for (; i + (kUnroll - 1) * (i64)G < nvec; i += kUnroll * (i64)G) {
      F a[kUnroll], d[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        a[u].load(yv + (i + u * (i64)G) * VEC);
        d[u].load(dyv + (i + u * (i64)G) * VEC);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        A ya[VEC], da[VEC];
        a[u].get(ya);
        d[u].get(da);
#pragma unroll
        for (int e = 0; e < VEC; ++e) s += lg ? da[e] : da[e] * ya[e];
      }
    }
    for (; i < nvec; i += G) {
      F a, d;
      a.load(yv + i * VEC);
      d.load(dyv + i * VEC);
      A ya[VEC], da[VEC];
      a.get(ya);
      d.get(da);
#pragma unroll
      for (int e = 0; e < VEC; ++e) s += lg ? da[e] : da[e] * ya[e];
    }
    const i64 xi = extra_index<VEC>(sp, lane, live);
    if (xi >= 0) s += lg ? load<A>(dyp[xi]) : load<A>(dyp[xi]) * load<A>(yp[xi]);
    s = group_reduce<false>(s, G, sm[it & 1]);
    for (i = lane; i < nvec; i += kWrite * (i64)G) {  // loads before the first store, as in the forward
      F a[kWrite], d[kWrite];
#pragma unroll
      for (int u = 0; u < kWrite; ++u)
        if (i + u * (i64)G < nvec) {
          a[u].load(yv + (i + u * (i64)G) * VEC);
          d[u].load(dyv + (i + u * (i64)G) * VEC);
        }
#pragma unroll
      for (int u = 0; u < kWrite; ++u) {
        const i64 iu = i + u * (i64)G;
        if (iu < nvec) {
          A ya[VEC], da[VEC];
          a[u].get(ya);
          d[u].get(da);
#pragma unroll
          for (int e = 0; e < VEC; ++e)
            ya[e] = alpha * (lg ? da[e] - exp_of<T>(ya[e], false) * s : ya[e] * (da[e] - s));
          if (blend) {
            d[u].load(dxv + iu * VEC);
            d[u].get(da);
#pragma unroll
            for (int e = 0; e < VEC; ++e) ya[e] += beta * da[e];
          }
          a[u].set(ya);
          a[u].store(dxv + iu * VEC);
        }
      }
    }
    if (xi >= 0) {
      const A ya = load<A>(yp[xi]), da = load<A>(dyp[xi]);
      A o = alpha * (lg ? da - exp_of<T>(ya, false) * s : ya * (da - s));
      if (blend) o += beta * load<A>(dxp[xi]);
      dxp[xi] = store<T>(o);
    }
  }
}

// ------------------------------------------------------------------ col (strided reduced axis)

// Max or sum over the threads of a block that share threadIdx.x (blockDim.x * blockDim.y ==
// kColThreads, both powers of two), for each of VEC lanes: shuffles across the blockDim.y threads
// inside a warp (when blockDim.x < 32), then shared memory across warps (at most 8 partials per
// column). sm holds VEC * kColThreads values, [lane e][slot].
template <bool MAX, int VEC, class A> __device__ __forceinline__ void col_reduce(A* v, A* sm) {
  const int BX = blockDim.x, t = threadIdx.y * BX + threadIdx.x;
  if (BX < 32)
    for (int mk = BX; mk < 32; mk <<= 1)
#pragma unroll
      for (int e = 0; e < VEC; ++e) v[e] = combine<MAX>(v[e], shfl_xor(v[e], mk));
  const int W = BX > 32 ? BX : 32;  // threads whose partials are combined before shared memory
  if (t % W < BX) {
#pragma unroll
    for (int e = 0; e < VEC; ++e) sm[e * kColThreads + (t / W) * BX + threadIdx.x] = v[e];
  }
  __syncthreads();
  const int R = kColThreads / W;
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    A r = sm[e * kColThreads + threadIdx.x];
    for (int q = 1; q < R; ++q) r = combine<MAX>(r, sm[e * kColThreads + q * BX + threadIdx.x]);
    v[e] = r;
  }
}

// Forward, channels in registers. Block (BX, BY): thread (tx, ty) takes VEC adjacent inner positions
// (fragment column tile * BX + tx) of outer position o, and channels ty, ty + BY, ..., kColItems of them
// (the host makes BY * kColItems >= len). One read, one write.
template <class T, int VEC, int K>
__global__ void __launch_bounds__(kColThreads, kColMinBlocks) col_fwd(const SoftmaxParams p) {
  typedef typename AccOf<T>::type A;
  typedef Frag<T, VEC> F;
  constexpr bool LOG = K == kLog, FAST = K == kFast;
  __shared__ A sm_max[VEC * kColThreads], sm_sum[VEC * kColThreads];
  const int BX = blockDim.x, BY = blockDim.y, ty = threadIdx.y;
  const int C = (int)p.len;
  const i64 nv = p.cols / VEC;
  const i64 cx = p.red_stride[1][0], cy = p.red_stride[0][0];
  const bool blend = p.flags & PYDNN_FLAG_BETA;
  const A alpha = (A)p.alpha, beta = (A)p.beta;
  const i64 blocks = p.rows * p.tiles;
  for (i64 b = blockIdx.x; b < blocks; b += gridDim.x) {
    const i64 o = b / p.tiles, j = (b - o * p.tiles) * BX + threadIdx.x;
    const bool live = j < nv;
    i64 off[2];
    row_offsets<2>(p, o, off);
    const T* x = (const T*)p.in0 + off[1] + j * VEC;
    T* y = (T*)p.out + off[0] + j * VEC;
    A m[VEC], s[VEC];
    F v[kColItems];
#pragma unroll
    for (int k = 0; k < kColItems; ++k) {
      const int c = ty + k * BY;
      v[k].fill(Bits<T>::neg_inf);
      if (live && c < C) v[k].load(x + c * cx);
    }
    A f[kColItems][VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) m[e] = neg_inf<A>();
#pragma unroll
    for (int k = 0; k < kColItems; ++k) {
      v[k].get(f[k]);
#pragma unroll
      for (int e = 0; e < VEC; ++e) m[e] = amax(m[e], f[k][e]);
    }
    col_reduce<true, VEC>(m, sm_max);
#pragma unroll
    for (int e = 0; e < VEC; ++e) s[e] = 0;
#pragma unroll
    for (int k = 0; k < kColItems; ++k)
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const A z = f[k][e] - m[e], ex = exp_of<T>(z, FAST);
        s[e] += ex;
        f[k][e] = LOG ? z : ex;
      }
    col_reduce<false, VEC>(s, sm_sum);
#pragma unroll
    for (int e = 0; e < VEC; ++e) s[e] = LOG ? m_log(s[e]) : alpha / s[e];
#pragma unroll
    for (int k = 0; k < kColItems; ++k) {
      const int c = ty + k * BY;
      if (live && c < C) {
        A r[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) r[e] = fwd_out<LOG>(f[k][e], s[e], alpha);
        if (blend) {
          F old;
          old.load(y + c * cy);
          A bb[VEC];
          old.get(bb);
#pragma unroll
          for (int e = 0; e < VEC; ++e) r[e] += beta * bb[e];
        }
        v[k].set(r);
        v[k].store(y + c * cy);
      }
    }
  }
}

template <class T, int VEC, int K>
__global__ void __launch_bounds__(kColThreads, kColMinBlocks) col_bwd(const SoftmaxParams p) {
  typedef typename AccOf<T>::type A;
  typedef Frag<T, VEC> F;
  constexpr bool LOG = K == kLog;
  __shared__ A sm[2][VEC * kColThreads];
  const int BX = blockDim.x, BY = blockDim.y, ty = threadIdx.y;
  const int C = (int)p.len;
  const i64 nv = p.cols / VEC;
  const i64 cdx = p.red_stride[0][0], cy = p.red_stride[1][0], cdy = p.red_stride[2][0];
  const bool blend = p.flags & PYDNN_FLAG_BETA;
  const A alpha = (A)p.alpha, beta = (A)p.beta;
  const i64 blocks = p.rows * p.tiles;
  int it = 0;
  for (i64 b = blockIdx.x; b < blocks; b += gridDim.x, ++it) {
    const i64 o = b / p.tiles, j = (b - o * p.tiles) * BX + threadIdx.x;
    const bool live = j < nv;
    i64 off[3];
    row_offsets<3>(p, o, off);
    const T* yp = (const T*)p.in0 + off[1] + j * VEC;
    const T* dyp = (const T*)p.in1 + off[2] + j * VEC;
    T* dxp = (T*)p.out + off[0] + j * VEC;
    A s[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) s[e] = 0;
    F vy[kColItems], vd[kColItems];
#pragma unroll
    for (int k = 0; k < kColItems; ++k) {
      const int c = ty + k * BY;
      vy[k].fill(0);
      vd[k].fill(0);
      if (live && c < C) {
        vy[k].load(yp + c * cy);
        vd[k].load(dyp + c * cdy);
      }
    }
#pragma unroll
    for (int k = 0; k < kColItems; ++k) {
      A a[VEC], d[VEC];
      vy[k].get(a);
      vd[k].get(d);
#pragma unroll
      for (int e = 0; e < VEC; ++e) s[e] += LOG ? d[e] : d[e] * a[e];
    }
    col_reduce<false, VEC>(s, sm[it & 1]);
#pragma unroll
    for (int k = 0; k < kColItems; ++k) {
      const int c = ty + k * BY;
      if (live && c < C) {
        A a[VEC], d[VEC];
        vy[k].get(a);
        vd[k].get(d);
#pragma unroll
        for (int e = 0; e < VEC; ++e) a[e] = bwd_out<T, LOG>(a[e], d[e], s[e], alpha);
        if (blend) {
          F old;
          old.load(dxp + c * cdx);
          old.get(d);
#pragma unroll
          for (int e = 0; e < VEC; ++e) a[e] += beta * d[e];
        }
        vy[k].set(a);
        vy[k].store(dxp + c * cdx);
      }
    }
  }
}

// col_loop: the same tiling when the channels do not fit (len > BY * kColItems): each thread streams its
// channels ty, ty + BY, ... twice, an online (max, sum) pass kUnroll at a time, then the write pass. The
// kind is a run-time value, as in row_loop.
template <class T, int VEC>
__global__ void __launch_bounds__(kColThreads, kColMinBlocks) col_loop_fwd(const SoftmaxParams p) {
  typedef typename AccOf<T>::type A;
  typedef Frag<T, VEC> F;
  const bool LOG = p.kind == kLog, FAST = p.kind == kFast;
  __shared__ A sm_max[VEC * kColThreads], sm_sum[VEC * kColThreads];
  const int BX = blockDim.x, BY = blockDim.y, ty = threadIdx.y;
  const int C = (int)p.len;
  const i64 nv = p.cols / VEC;
  const i64 cx = p.red_stride[1][0], cy = p.red_stride[0][0];
  const bool blend = p.flags & PYDNN_FLAG_BETA;
  const A alpha = (A)p.alpha, beta = (A)p.beta;
  const i64 blocks = p.rows * p.tiles;
  for (i64 b = blockIdx.x; b < blocks; b += gridDim.x) {
    const i64 o = b / p.tiles, j = (b - o * p.tiles) * BX + threadIdx.x;
    const bool live = j < nv;
    i64 off[2];
    row_offsets<2>(p, o, off);
    const T* x = (const T*)p.in0 + off[1] + j * VEC;
    T* y = (T*)p.out + off[0] + j * VEC;
    A m[VEC], s[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      m[e] = neg_inf<A>();
      s[e] = 0;
    }
    const int Cl = live ? C : 0;
    int c = ty;
    for (; c + (kUnroll - 1) * BY < Cl; c += kUnroll * BY) {
      F v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u].load(x + (c + u * BY) * cx);
      A a[kUnroll][VEC];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u].get(a[u]);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        A t[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) t[u] = a[u][e];
        online_add<T, kUnroll>(m[e], s[e], t, FAST);
      }
    }
    for (; c < Cl; c += BY) {
      F v;
      v.load(x + c * cx);
      A a[VEC];
      v.get(a);
#pragma unroll
      for (int e = 0; e < VEC; ++e) online_add<T, 1>(m[e], s[e], a + e, FAST);
    }
    A M[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) M[e] = m[e];
    col_reduce<true, VEC>(M, sm_max);
#pragma unroll
    for (int e = 0; e < VEC; ++e) s[e] = s[e] == A(0) ? A(0) : s[e] * exp_of<T>(m[e] - M[e], FAST);
    col_reduce<false, VEC>(s, sm_sum);
#pragma unroll
    for (int e = 0; e < VEC; ++e) s[e] = LOG ? m_log(s[e]) : alpha / s[e];
    for (c = ty; c < Cl; c += kWrite * BY) {  // loads before the first store (x and y may alias)
      F v[kWrite];
#pragma unroll
      for (int u = 0; u < kWrite; ++u)
        if (c + u * BY < Cl) v[u].load(x + (c + u * BY) * cx);
#pragma unroll
      for (int u = 0; u < kWrite; ++u) {
        const int cu = c + u * BY;
        if (cu < Cl) {
          A r[VEC];
          v[u].get(r);
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            const A z = r[e] - M[e];
            r[e] = LOG ? alpha * (z - s[e]) : exp_of<T>(z, FAST) * s[e];
          }
          if (blend) {
            F old;
            old.load(y + cu * cy);
            A bb[VEC];
            old.get(bb);
#pragma unroll
            for (int e = 0; e < VEC; ++e) r[e] += beta * bb[e];
          }
          v[u].set(r);
          v[u].store(y + cu * cy);
        }
      }
    }
  }
}

template <class T, int VEC>
__global__ void __launch_bounds__(kColThreads, kColMinBlocks) col_loop_bwd(const SoftmaxParams p) {
  typedef typename AccOf<T>::type A;
  typedef Frag<T, VEC> F;
  const bool LOG = p.kind == kLog;
  __shared__ A sm[2][VEC * kColThreads];
  const int BX = blockDim.x, BY = blockDim.y, ty = threadIdx.y;
  const int C = (int)p.len;
  const i64 nv = p.cols / VEC;
  const i64 cdx = p.red_stride[0][0], cy = p.red_stride[1][0], cdy = p.red_stride[2][0];
  const bool blend = p.flags & PYDNN_FLAG_BETA;
  const A alpha = (A)p.alpha, beta = (A)p.beta;
  const i64 blocks = p.rows * p.tiles;
  int it = 0;
  for (i64 b = blockIdx.x; b < blocks; b += gridDim.x, ++it) {
    const i64 o = b / p.tiles, j = (b - o * p.tiles) * BX + threadIdx.x;
    const bool live = j < nv;
    i64 off[3];
    row_offsets<3>(p, o, off);
    const T* yp = (const T*)p.in0 + off[1] + j * VEC;
    const T* dyp = (const T*)p.in1 + off[2] + j * VEC;
    T* dxp = (T*)p.out + off[0] + j * VEC;
    A s[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) s[e] = 0;
    const int Cl = live ? C : 0;
    int c = ty;
    for (; c + (kUnroll - 1) * BY < Cl; c += kUnroll * BY) {
      F vy[kUnroll], vd[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        vy[u].load(yp + (c + u * BY) * cy);
        vd[u].load(dyp + (c + u * BY) * cdy);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        A a[VEC], d[VEC];
        vy[u].get(a);
        vd[u].get(d);
#pragma unroll
        for (int e = 0; e < VEC; ++e) s[e] += LOG ? d[e] : d[e] * a[e];
      }
    }
    for (; c < Cl; c += BY) {
      F vy, vd;
      vy.load(yp + c * cy);
      vd.load(dyp + c * cdy);
      A a[VEC], d[VEC];
      vy.get(a);
      vd.get(d);
#pragma unroll
      for (int e = 0; e < VEC; ++e) s[e] += LOG ? d[e] : d[e] * a[e];
    }
    col_reduce<false, VEC>(s, sm[it & 1]);
    for (c = ty; c < Cl; c += kWrite * BY) {
      F vy[kWrite], vd[kWrite];
#pragma unroll
      for (int u = 0; u < kWrite; ++u)
        if (c + u * BY < Cl) {
          vy[u].load(yp + (c + u * BY) * cy);
          vd[u].load(dyp + (c + u * BY) * cdy);
        }
#pragma unroll
      for (int u = 0; u < kWrite; ++u) {
        const int cu = c + u * BY;
        if (cu < Cl) {
          A a[VEC], d[VEC];
          vy[u].get(a);
          vd[u].get(d);
#pragma unroll
          for (int e = 0; e < VEC; ++e) a[e] = alpha * (LOG ? d[e] - exp_of<T>(a[e], false) * s[e] : a[e] * (d[e] - s[e]));
          if (blend) {
            vd[u].load(dxp + cu * cdx);
            vd[u].get(d);
#pragma unroll
            for (int e = 0; e < VEC; ++e) a[e] += beta * d[e];
          }
          vy[u].set(a);
          vy[u].store(dxp + cu * cdx);
        }
      }
    }
  }
}

// ------------------------------------------------------------------ gen (any layout)

// A thread's position among a row's elements: reduce coordinates (outermost first) and the offsets in
// operands 0 .. NOPS-1. next() advances by the group size G, written in the dims' radix in red_step.
template <int NOPS> struct Walk {
  i64 c[PYDNN_MAX_DIMS];
  i64 off[NOPS];
  __device__ __forceinline__ Walk(const SoftmaxParams& p, i64 e) {
#pragma unroll
    for (int d = PYDNN_MAX_DIMS - 1; d >= 0; --d) {
      c[d] = 0;
      if (d < p.red_ndim) {
        if (d > 0) {
          const i64 q = e / p.red_size[d];
          c[d] = e - q * p.red_size[d];
          e = q;
        } else {
          c[d] = e;
        }
      }
    }
    offsets(p);
  }
  __device__ __forceinline__ void offsets(const SoftmaxParams& p) {
#pragma unroll
    for (int k = 0; k < NOPS; ++k) off[k] = 0;
#pragma unroll
    for (int d = 0; d < PYDNN_MAX_DIMS; ++d)
      if (d < p.red_ndim)
#pragma unroll
        for (int k = 0; k < NOPS; ++k) off[k] += c[d] * p.red_stride[k][d];
  }
  __device__ __forceinline__ void next(const SoftmaxParams& p) {
    if (p.red_ndim == 1) {
      c[0] += p.red_step[0];
#pragma unroll
      for (int k = 0; k < NOPS; ++k) off[k] += p.red_step[0] * p.red_stride[k][0];
      return;
    }
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
    offsets(p);
  }
};

template <class T>
__global__ void __launch_bounds__(kGenThreads) gen_fwd(const SoftmaxParams p) {
  typedef typename AccOf<T>::type A;
  constexpr int U = sizeof(A) == 8 ? 1 : kUnroll / 2;  // a walker step costs registers; fewer loads in flight
  __shared__ A sm_max[32], sm_sum[32];
  const int G = p.group, lane = threadIdx.x & (G - 1), sub = threadIdx.x / G;
  const int per_block = blockDim.x / G;
  const bool blend = p.flags & PYDNN_FLAG_BETA;
  const A alpha = (A)p.alpha, beta = (A)p.beta;
  const bool fast = p.kind == kFast, lg = p.kind == kLog;
  for (i64 first = (i64)blockIdx.x * per_block; first < p.rows; first += (i64)gridDim.x * per_block) {
    const i64 row = first + sub;
    const bool live = row < p.rows;
    const i64 len = live ? p.len : 0;
    i64 off[2];
    row_offsets<2>(p, live ? row : first, off);
    const T* x = (const T*)p.in0 + off[1];
    T* y = (T*)p.out + off[0];
    A m = neg_inf<A>(), s = 0;
    {
      Walk<2> w(p, lane);
      i64 e = lane;
      for (; e + (U - 1) * (i64)G < len; e += U * (i64)G) {
        T v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          v[u] = x[w.off[1]];
          w.next(p);
        }
        A a[U];
#pragma unroll
        for (int u = 0; u < U; ++u) a[u] = load<A>(v[u]);
        online_add<T, U>(m, s, a, fast);
      }
      for (; e < len; e += G) {
        const A a = load<A>(x[w.off[1]]);
        w.next(p);
        online_add<T, 1>(m, s, &a, fast);
      }
    }
    online_finish<T>(m, s, G, sm_max, sm_sum, fast);
    const A c = lg ? m_log(s) : alpha / s;
    Walk<2> w(p, lane);
    for (i64 e = lane; e < len; e += G) {
      const A z = load<A>(x[w.off[1]]) - m;
      T* dst = y + w.off[0];
      A r = lg ? alpha * (z - c) : exp_of<T>(z, fast) * c;
      if (blend) r += beta * load<A>(*dst);
      *dst = store<T>(r);
      w.next(p);
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kGenThreads) gen_bwd(const SoftmaxParams p) {
  typedef typename AccOf<T>::type A;
  constexpr int U = kUnroll / 2;
  __shared__ A sm[2][32];
  const int G = p.group, lane = threadIdx.x & (G - 1), sub = threadIdx.x / G;
  const int per_block = blockDim.x / G;
  const bool blend = p.flags & PYDNN_FLAG_BETA;
  const A alpha = (A)p.alpha, beta = (A)p.beta;
  const bool lg = p.kind == kLog;
  int it = 0;
  for (i64 first = (i64)blockIdx.x * per_block; first < p.rows; first += (i64)gridDim.x * per_block, ++it) {
    const i64 row = first + sub;
    const bool live = row < p.rows;
    const i64 len = live ? p.len : 0;
    i64 off[3];
    row_offsets<3>(p, live ? row : first, off);
    const T* yp = (const T*)p.in0 + off[1];
    const T* dyp = (const T*)p.in1 + off[2];
    T* dxp = (T*)p.out + off[0];
    A s = 0;
    {
      Walk<3> w(p, lane);
      i64 e = lane;
      for (; e + (U - 1) * (i64)G < len; e += U * (i64)G) {
        T a[U], d[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          a[u] = yp[w.off[1]];
          d[u] = dyp[w.off[2]];
          w.next(p);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) s += lg ? load<A>(d[u]) : load<A>(d[u]) * load<A>(a[u]);
      }
      for (; e < len; e += G) {
        s += lg ? load<A>(dyp[w.off[2]]) : load<A>(dyp[w.off[2]]) * load<A>(yp[w.off[1]]);
        w.next(p);
      }
    }
    s = group_reduce<false>(s, G, sm[it & 1]);
    Walk<3> w(p, lane);
    for (i64 e = lane; e < len; e += G) {
      const A ya = load<A>(yp[w.off[1]]), da = load<A>(dyp[w.off[2]]);
      T* dst = dxp + w.off[0];
      A r = alpha * (lg ? da - exp_of<T>(ya, false) * s : ya * (da - s));
      if (blend) r += beta * load<A>(*dst);
      *dst = store<T>(r);
      w.next(p);
    }
  }
}

}  // namespace softmax
}  // namespace pydnn
