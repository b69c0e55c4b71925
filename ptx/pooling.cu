// Pooling forward and backward (cudnnPoolingForward / cudnnPoolingBackward and the pydnn adaptive and
// global-average extensions); see pooling_params.h for how a problem is described. Two kernels, each a
// template over the element type T and VEC, the channels one thread handles:
//
//   fwd  one thread per VEC channels of one y element: reads its window of x (VEC channels at a time, 16
//        bytes when VEC > 1: NHWC-like layouts, channels contiguous), up to kFwdBatch loads in flight,
//        writes y once. Overlapping windows re-read x, but those reads hit L1 / L2. Max uses the packed
//        max instructions (max{.NaN}.bf16x2 / .f16x2 / .f32), so the words never leave their 16-bit form.
//   fwd_rows  the vector forward of 1-d / 2-d pooling with 32-bit offsets: one thread per VEC channels of
//        kRowOut outputs along w, coordinates from the launch shape (see the kernel); full 3 x 3 windows
//        load with straight-line offsets (FAST3), 16-bit outputs convert in pairs.
//   bwd  one thread per VEC channels of one dx element: GATHERS from the pooled elements whose windows
//        cover it (no atomics, no scatter), so dx is written once, in a fixed order: bitwise reproducible.
//        Average: sum of dy * (1 / count). Max: the element receives dy of window o where it is the
//        window's FIRST element matching y[o] (equal, or both NaN): x[e] is compared with y[o], and only on a
//        match are the window's earlier elements scanned for an earlier match (ties are rare), then dy read.
//
// Max pooling's element, per channel, in window order (d, then h, then w, in-bounds elements only):
//   PROPAGATE_NAN      the first NaN if there is one, else the first element equal to the maximum
//   NOT_PROPAGATE_NAN  NaN elements are skipped: the first element equal to the maximum of the others;
//                      a window of nothing but NaN gives NaN, its gradient going to its first element.
// Forward computes exactly that value (as a packed max: +0 and -0 compare equal, so either may be stored);
// backward finds that element by matching y (it must be the forward's output, as with cuDNN). MAX and
// MAX_DETERMINISTIC are the same deterministic path.
#include "common/params.h"
#include "common/types.cuh"
#include "pooling_params.h"

namespace pydnn {
namespace pooling {

constexpr int kThreads = 256;
constexpr int kFwdBatch = 9;   // forward: window loads in flight per thread (a 3x3 window in one go)
constexpr int kFwdBlocks = 3;  // forward: blocks per SM the register budget must allow (85 registers)
constexpr int kBwdBatch = 4;   // backward of max: earlier-element loads in flight while checking a tie
constexpr int kCov = 4;        // backward: covering windows whose dy (and y) loads go out together
constexpr int kBwdMaxBlocks = 2;  // backward of max pooling: 128 registers (no spills)
constexpr int kBwdAvgBlocks = 4;  // backward of averages: 64 registers

template <class A, class B> struct Same { static constexpr bool value = false; };
template <class A> struct Same<A, A> { static constexpr bool value = true; };

struct __align__(16) U4 { unsigned x, y, z, w; };

// VEC elements of T as 32-bit words: loaded / stored in one access (16 bytes when VEC > 1), converted to
// and from the arithmetic type A.
template <class T, int VEC> struct Frag {
  static constexpr int BYTES = (int)sizeof(T) * VEC;
  static constexpr int WORDS = BYTES < 4 ? 1 : BYTES / 4;
  unsigned w[WORDS];

  __device__ __forceinline__ void load(const T* p) {
    if constexpr (BYTES == 16) {
      const U4 q = *reinterpret_cast<const U4*>(p);
      w[0] = q.x; w[1] = q.y; w[2] = q.z; w[3] = q.w;
    } else if constexpr (sizeof(T) == 8) {  // one double
      const unsigned long long q = *reinterpret_cast<const unsigned long long*>(p);
      w[0] = (unsigned)q; w[1] = (unsigned)(q >> 32);
    } else if constexpr (sizeof(T) == 4) {
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
    } else if constexpr (sizeof(T) == 8) {
      *reinterpret_cast<unsigned long long*>(p) = (unsigned long long)w[0] | ((unsigned long long)w[1] << 32);
    } else if constexpr (sizeof(T) == 4) {
      *reinterpret_cast<unsigned*>(p) = w[0];
    } else {
      *reinterpret_cast<unsigned short*>(p) = (unsigned short)w[0];
    }
  }
  template <class A> __device__ __forceinline__ A get(int e) const {
    if constexpr (sizeof(T) == 8) {
      return (A)__hiloint2double((int)w[2 * e + 1], (int)w[2 * e]);
    } else if constexpr (sizeof(T) == 4) {
      return (A)__uint_as_float(w[e]);
    } else {
      T t;
      t.bits = (unsigned short)(w[e / 2] >> (16 * (e % 2)));
      return pydnn::load<A>(t);
    }
  }
  template <class A> __device__ __forceinline__ void set(int e, A v) {
    if constexpr (sizeof(T) == 8) {
      const double d = (double)v;
      w[2 * e] = (unsigned)__double2loint(d);
      w[2 * e + 1] = (unsigned)__double2hiint(d);
    } else if constexpr (sizeof(T) == 4) {
      w[e] = __float_as_uint(pydnn::store<float>(v));
    } else {
      const unsigned b = pydnn::store<T>(v).bits;
      if (e % 2) w[e / 2] = (w[e / 2] & 0xffffu) | (b << 16);
      else w[e / 2] = (w[e / 2] & 0xffff0000u) | b;
    }
  }
  // Element-wise max with o, in the storage type (exact): NAN_PROP: NaN if either is NaN; else fmax's rule
  // (NaN only if both are). 16-bit words hold two elements; a VEC == 1 word's upper half is 0 in both.
  template <bool NAN_PROP> __device__ __forceinline__ void max_with(const Frag& o) {
#pragma unroll
    for (int i = 0; i < WORDS; ++i) {
      if constexpr (sizeof(T) == 2) {
        if constexpr (Same<T, bf16_t>::value) {
          if constexpr (NAN_PROP) asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(w[i]) : "r"(w[i]), "r"(o.w[i]));
          else asm("max.bf16x2 %0, %1, %2;" : "=r"(w[i]) : "r"(w[i]), "r"(o.w[i]));
        } else {
          if constexpr (NAN_PROP) asm("max.NaN.f16x2 %0, %1, %2;" : "=r"(w[i]) : "r"(w[i]), "r"(o.w[i]));
          else asm("max.f16x2 %0, %1, %2;" : "=r"(w[i]) : "r"(w[i]), "r"(o.w[i]));
        }
      } else if constexpr (sizeof(T) == 4) {
        if constexpr (NAN_PROP) asm("max.NaN.f32 %0, %1, %2;" : "=r"(w[i]) : "r"(w[i]), "r"(o.w[i]));
        else w[i] = __float_as_uint(fmaxf(__uint_as_float(w[i]), __uint_as_float(o.w[i])));
      }
    }
    if constexpr (sizeof(T) == 8) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const double a = get<double>(e), b = o.template get<double>(e);
        set<double>(e, NAN_PROP ? (a != a ? a : (b != b ? b : fmax(a, b))) : fmax(a, b));
      }
    }
  }
};


// ------------------------------------------------------------------ addressing and windows

// Coordinates (n, c, d, h, w) of work item `item`; c is in elements (group * VEC).
template <int VEC>
__device__ __forceinline__ void coords(const PoolParams& p, i64 item, i64* c) {
  if (p.flags & PYDNN_POOL_FLAG_IDX32) {  // 32-bit division is several times cheaper
    const unsigned it = (unsigned)item;
#pragma unroll
    for (int k = 0; k < PYDNN_POOL_DIMS; ++k) c[k] = (it / (unsigned)p.div[k]) % (unsigned)p.size[k];
  } else {
#pragma unroll
    for (int k = 0; k < PYDNN_POOL_DIMS; ++k) c[k] = (item / p.div[k]) % p.size[k];
  }
  c[1] *= VEC;
}

__device__ __forceinline__ i64 offset(const long long* s, const i64* c) {
  return c[0] * s[0] + c[1] * s[1] + c[2] * s[2] + c[3] * s[3] + c[4] * s[4];
}

// The in-bounds window [lo, hi) of pooled coordinate o along spatial dim k (32-bit: see the params).
__device__ __forceinline__ void window(const PoolParams& p, int k, int o, int& lo, int& hi) {
  const int in = (int)p.in_dim[k];
  if (p.flags & PYDNN_POOL_FLAG_ADAPTIVE) {
    const int out = (int)p.out_dim[k];
    lo = o * in / out;
    hi = ((o + 1) * in + out - 1) / out;
  } else {
    const int s = o * (int)p.stride[k] - (int)p.pad[k], win = (int)p.win[k];
    lo = s < 0 ? 0 : s;
    hi = s + win < in ? s + win : in;
  }
}

// The pooled coordinates [lo, hi] whose windows along spatial dim k contain input coordinate e (lo > hi:
// none, possible when stride > window).
__device__ __forceinline__ void covering(const PoolParams& p, int k, int e, int& lo, int& hi) {
  const int out = (int)p.out_dim[k];
  if (p.flags & PYDNN_POOL_FLAG_ADAPTIVE) {
    const int in = (int)p.in_dim[k];
    lo = e * out / in;
    hi = ((e + 1) * out + in - 1) / in - 1;
  } else {
    const int s = (int)p.stride[k], a = e + (int)p.pad[k], win = (int)p.win[k];
    lo = a - win < 0 ? 0 : (a - win) / s + 1;
    hi = a / s;
  }
  if (hi > out - 1) hi = out - 1;
}

// The first `count` elements of the window [lo, hi) in window order, from its first element `first`:
// f(j, frag) for the j-th. Loads go BATCH at a time (all issued before any is used); a running pointer
// walks w, wrapping to the next row / plane. f returns false to stop early (checked between batches).
// S: the stride type (long long; int in fwd_rows, whose offsets fit 32 bits).
template <class T, int VEC, int BATCH, class S, class F>
__device__ __forceinline__ void scan(const T* first, const S* xs, const int* lo, const int* hi, int count, F&& f) {
  const int nw = hi[2] - lo[2], nh = hi[1] - lo[1];
  const S step_h = xs[3] - (S)nw * xs[4], step_d = xs[2] - (S)nh * xs[3];
  const T* q = first;
  int iw = 0, ih = 0;
  for (int j0 = 0; j0 < count; j0 += BATCH) {
    Frag<T, VEC> v[BATCH];
#pragma unroll
    for (int u = 0; u < BATCH; ++u) {
      if (j0 + u < count) {
        v[u].load(q);
        q += xs[4];
        if (++iw == nw) {
          iw = 0;
          q += step_h;
          if (++ih == nh) {
            ih = 0;
            q += step_d;
          }
        }
      }
    }
    bool go = true;
#pragma unroll
    for (int u = 0; u < BATCH; ++u)
      if (j0 + u < count) go = f(j0 + u, v[u]);
    if (!go) return;
  }
}

// v[0 .. VEC) converted into out's words: 16-bit pairs with one paired conversion (cvt.rn.bf16x2.f32 /
// .f16x2: each half rounded as the single conversion rounds it, so the same bits as Frag::set, without its
// per-element merge into the word).
template <class T, int VEC>
__device__ __forceinline__ void convert_out(Frag<T, VEC>& out, const typename AccOf<T>::type* v) {
  if constexpr (sizeof(T) == 2 && VEC % 2 == 0) {
#pragma unroll
    for (int i = 0; i < VEC / 2; ++i) {
      out.w[i] = pack16x2<T>(v[2 * i], v[2 * i + 1]);
    }
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) out.set(e, v[e]);
  }
}

template <class T, int VEC>
__device__ __forceinline__ void store_blend(T* dst, const typename AccOf<T>::type* r, const PoolParams& p) {
  typedef typename AccOf<T>::type A;
  const A alpha = (A)p.alpha, beta = (A)p.beta;
  Frag<T, VEC> out;
  A v[VEC];
  if (p.flags & PYDNN_FLAG_BETA) {
    out.load(dst);
#pragma unroll
    for (int e = 0; e < VEC; ++e) v[e] = alpha * r[e] + beta * out.template get<A>(e);
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) v[e] = alpha * r[e];
  }
  convert_out<T, VEC>(out, v);
  out.store(dst);
}

// The 9 elements of a full 3 x 3 window in window order (fwd_rows, PYDNN_POOL_FLAG_FAST3): straight-line
// loads at the thread's fixed offsets o[] from the first element, all in flight together, then f(j, v) for
// each in turn (scan's order and values, without its per-load wrap arithmetic).
template <class T, int VEC, class F>
__device__ __forceinline__ void scan3x3(const T* first, const int* o, F&& f) {
  Frag<T, VEC> v[9];
#pragma unroll
  for (int j = 0; j < 9; ++j) v[j].load(first + o[j]);
#pragma unroll
  for (int j = 0; j < 9; ++j) f(j, v[j]);
}

// f(j, v) over the window's elements in window order: scan3x3 for a full 3 x 3 window (full3), else scan.
template <class T, int VEC, class F>
__device__ __forceinline__ void reduce_window(bool full3, const T* first, const int* o9, const int* xs, const int* lo,
                                              const int* hi, int count, F&& f) {
  if (full3) scan3x3<T, VEC>(first, o9, f);
  else scan<T, VEC, kFwdBatch>(first, xs, lo, hi, count, f);
}

// Column sums of NC consecutive 3-row columns (fwd_rows' COLS path): out[c] = (x0 + x1) + x2 down column
// c, its 3 * NC loads all in flight first. xs4 / xs3: the strides along w and h.
template <class T, int VEC, int NC>
__device__ __forceinline__ void col_sums(const T* top, int xs4, int xs3, typename AccOf<T>::type (*out)[VEC]) {
  typedef typename AccOf<T>::type A;
  Frag<T, VEC> v[NC][3];
#pragma unroll
  for (int c = 0; c < NC; ++c)
#pragma unroll
    for (int i = 0; i < 3; ++i) v[c][i].load(top + c * xs4 + i * xs3);
#pragma unroll
  for (int c = 0; c < NC; ++c)
#pragma unroll
    for (int e = 0; e < VEC; ++e)
      out[c][e] = (v[c][0].template get<A>(e) + v[c][1].template get<A>(e)) + v[c][2].template get<A>(e);
}

// ------------------------------------------------------------------ kernels

template <class T, int VEC, bool IS_MAX>
__global__ void __launch_bounds__(kThreads, kFwdBlocks) fwd(const PoolParams p) {
  typedef typename AccOf<T>::type A;
  const T* __restrict__ x = static_cast<const T*>(p.x);
  T* __restrict__ y = static_cast<T*>(p.out);
  for (i64 item = (i64)blockIdx.x * kThreads + threadIdx.x; item < p.total; item += (i64)gridDim.x * kThreads) {
    i64 c[PYDNN_POOL_DIMS];
    int lo[3], hi[3];
    coords<VEC>(p, item, c);
#pragma unroll
    for (int k = 0; k < 3; ++k) window(p, k, (int)c[2 + k], lo[k], hi[k]);
    const T* first = x + c[0] * p.xs[0] + c[1] * p.xs[1] + lo[0] * p.xs[2] + lo[1] * p.xs[3] + lo[2] * p.xs[4];
    const int count = (hi[0] - lo[0]) * (hi[1] - lo[1]) * (hi[2] - lo[2]);
    A r[VEC];
    if constexpr (IS_MAX) {  // the host launches fwd<.., true> exactly for PYDNN_POOL_MODE_MAX
      Frag<T, VEC> m;
      if (p.flags & PYDNN_FLAG_NAN_PROP) {
        scan<T, VEC, kFwdBatch>(first, p.xs, lo, hi, count, [&](int j, const Frag<T, VEC>& v) {
          if (j == 0) m = v; else m.template max_with<true>(v);
          return true;
        });
      } else {
        scan<T, VEC, kFwdBatch>(first, p.xs, lo, hi, count, [&](int j, const Frag<T, VEC>& v) {
          if (j == 0) m = v; else m.template max_with<false>(v);
          return true;
        });
      }
#pragma unroll
      for (int e = 0; e < VEC; ++e) r[e] = m.template get<A>(e);
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e) r[e] = A(0);
      scan<T, VEC, kFwdBatch>(first, p.xs, lo, hi, count, [&](int, const Frag<T, VEC>& v) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) r[e] += v.template get<A>(e);
        return true;
      });
      const A n = p.mode == PYDNN_POOL_MODE_AVG_INCLUDE ? (A)p.win[0] * (A)p.win[1] * (A)p.win[2] : (A)count;
#pragma unroll
      for (int e = 0; e < VEC; ++e) r[e] /= n;
    }
    store_blend<T, VEC>(y + offset(p.os, c), r, p);
  }
}

// Forward of 1-d / 2-d pooling (no adaptive windows) with 16-byte channel vectors and every offset of x and
// y below 2^31 elements (the host checks): the coordinates come from the launch's shape instead of
// dividing a flat index. Block (bx, by): threadIdx.x a channel group (VEC channels), threadIdx.y a strip of
// kRowOut consecutive outputs along w; grid (N * OH rows, w strips / by, channel groups / bx). A strip
// shares its row, its h window, its base offsets and the blend set-up, so the fixed work per output is a
// quarter of fwd's; each output still reduces its window in fwd's order (max: bitwise fwd's values).
constexpr int kRowOut = 4;

template <class T, int VEC, bool IS_MAX>
__global__ void __launch_bounds__(kThreads, kFwdBlocks) fwd_rows(const PoolParams p) {
  typedef typename AccOf<T>::type A;
  const int cg = blockIdx.z * blockDim.x + threadIdx.x, ow0 = (blockIdx.y * blockDim.y + threadIdx.y) * kRowOut;
  const int OH = (int)p.size[3], OW = (int)p.size[4];
  if (cg >= (int)p.size[1] || ow0 >= OW) return;
  const int row = blockIdx.x, n = row / OH, oh = row - n * OH;
  int lo[3] = {0, 0, 0}, hi[3] = {1, 0, 0};
  window(p, 1, oh, lo[1], hi[1]);
  const int xs[5] = {(int)p.xs[0], (int)p.xs[1], (int)p.xs[2], (int)p.xs[3], (int)p.xs[4]};
  const T* xrow = static_cast<const T*>(p.x) + (n * xs[0] + cg * VEC * xs[1] + lo[1] * xs[3]);
  T* yrow = static_cast<T*>(p.out) + (n * (int)p.os[0] + cg * VEC * (int)p.os[1] + oh * (int)p.os[3]);
  const int ys = (int)p.os[4], sw = (int)p.stride[2], pw = (int)p.pad[2], kw = (int)p.win[2], W = (int)p.in_dim[2];
  const int nh = hi[1] - lo[1];
  const bool plain = !(p.flags & PYDNN_FLAG_BETA) && p.alpha == 1.0;  // y = pool(x): no conversion needed
  // FAST3: outputs whose in-bounds window is 3 x 3 (the interior of 3 x 3 pooling) take scan3x3
  const bool fast3 = (p.flags & PYDNN_POOL_FLAG_FAST3) && nh == 3;
  const int o9[9] = {0, xs[4], 2 * xs[4], xs[3], xs[3] + xs[4], xs[3] + 2 * xs[4], 2 * xs[3], 2 * xs[3] + xs[4],
                     2 * xs[3] + 2 * xs[4]};
  const int uend = OW - ow0 < kRowOut ? OW - ow0 : kRowOut;
  if constexpr (!IS_MAX) {
    // COLS (a benchmark variant): 3 x 3 / 2 averages over a strip of full windows sum each x column once
    // (3 loads, 2 adds) and each output adds its 3 column sums, the column between two outputs shared:
    // 27 loads and ~2/3 of the unpacks and adds of 4 separate windows. The order of the additions differs
    // from scan's (columns first), so not bitwise the other paths.
    const int s0 = ow0 * sw - pw;
    if ((p.flags & PYDNN_POOL_FLAG_COLS) && nh == 3 && (int)p.win[1] == 3 && kw == 3 && sw == 2 &&
        uend == kRowOut && s0 >= 0 && s0 + 2 * kRowOut + 1 <= W) {
      const A inv = A(1) / A(9);  // 9 in-bounds elements of a 3 x 3 window: both averages divide by 9
      const T* top = xrow + s0 * xs[4];
      A c3[3][VEC], prev[VEC];
      col_sums<T, VEC, 3>(top, xs[4], xs[3], c3);
#pragma unroll
      for (int u = 0; u < kRowOut; ++u) {
        A r[VEC];
        if (u == 0) {
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            r[e] = ((c3[0][e] + c3[1][e]) + c3[2][e]) * inv;
            prev[e] = c3[2][e];
          }
        } else {
          A c2[2][VEC];
          col_sums<T, VEC, 2>(top + (2 * u + 1) * xs[4], xs[4], xs[3], c2);
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            r[e] = ((prev[e] + c2[0][e]) + c2[1][e]) * inv;
            prev[e] = c2[1][e];
          }
        }
        T* dst = yrow + (ow0 + u) * ys;
        if (plain) {
          Frag<T, VEC> out;
          convert_out<T, VEC>(out, r);
          out.store(dst);
        } else {
          store_blend<T, VEC>(dst, r, p);
        }
      }
      return;
    }
  }
#pragma unroll 1
  for (int u = 0; u < uend; ++u) {
    const int ow = ow0 + u, s = ow * sw - pw;
    lo[2] = s < 0 ? 0 : s;
    hi[2] = s + kw < W ? s + kw : W;
    const int count = nh * (hi[2] - lo[2]);
    const T* first = xrow + lo[2] * xs[4];
    T* dst = yrow + ow * ys;
    const bool full3 = fast3 && hi[2] - lo[2] == 3;
    A r[VEC];
    if constexpr (IS_MAX) {
      Frag<T, VEC> m;
      if (p.flags & PYDNN_FLAG_NAN_PROP) {
        reduce_window<T, VEC>(full3, first, o9, xs, lo, hi, count, [&](int j, const Frag<T, VEC>& v) {
          if (j == 0) m = v; else m.template max_with<true>(v);
          return true;
        });
      } else {
        reduce_window<T, VEC>(full3, first, o9, xs, lo, hi, count, [&](int j, const Frag<T, VEC>& v) {
          if (j == 0) m = v; else m.template max_with<false>(v);
          return true;
        });
      }
      if (plain) {  // the maximum is one of x's values: stored as it is
        m.store(dst);
        continue;
      }
#pragma unroll
      for (int e = 0; e < VEC; ++e) r[e] = m.template get<A>(e);
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e) r[e] = A(0);
      reduce_window<T, VEC>(full3, first, o9, xs, lo, hi, count, [&](int, const Frag<T, VEC>& v) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) r[e] += v.template get<A>(e);
        return true;
      });
      // one division per output instead of VEC (within an ulp of r / n before the final rounding)
      const A inv = A(1) / (p.mode == PYDNN_POOL_MODE_AVG_INCLUDE ? (A)p.win[1] * (A)p.win[2] : (A)count);
#pragma unroll
      for (int e = 0; e < VEC; ++e) r[e] *= inv;
      if (plain) {  // alpha 1, beta 0: store_blend's values (1 * r == r) without its set-up
        Frag<T, VEC> out;
        convert_out<T, VEC>(out, r);
        out.store(dst);
        continue;
      }
    }
    store_blend<T, VEC>(dst, r, p);
  }
}

// a matches the window's output m: equal, or both NaN (a NaN output came from a NaN element)
template <class A> __device__ __forceinline__ bool match(A a, A m) { return a == m || (a != a && m != m); }

// Steps (od, oh, ow) to the next pooled element of the box [lo, hi] (inclusive), w fastest.
__device__ __forceinline__ void next_pooled(int* o, const int* lo, const int* hi) {
  if (++o[2] > hi[2]) {
    o[2] = lo[2];
    if (++o[1] > hi[1]) {
      o[1] = lo[1];
      ++o[0];
    }
  }
}

// The tie check of max backward in packed form (bwd<T, VEC, true, true>): M = the packed max of the
// window's `self` (> 0) elements before x[e], with the forward's NaN rule (4 instructions per 16-byte
// vector instead of VEC unpacked matches). y[o] = mv is the window's maximum, so no earlier element matches
// it exactly when: y not NaN: M != y (M < y, or M NaN: every earlier element NaN, skipped);
// y NaN: PROPAGATE: M not NaN (no earlier NaN); NOT_PROPAGATE: never (an all-NaN window's gradient goes to
// its first element). Same elements as matching each one, so bitwise the same dx.
template <class T, int VEC>
__device__ __forceinline__ void earlier_max_rule(const PoolParams& p, const T* first, const int* lo, const int* hi,
                                                 int self, const typename AccOf<T>::type* mv, bool* mine) {
  typedef typename AccOf<T>::type A;
  Frag<T, VEC> m;
  const bool prop = p.flags & PYDNN_FLAG_NAN_PROP;
  if (prop) {
    scan<T, VEC, kBwdBatch>(first, p.xs, lo, hi, self, [&](int j, const Frag<T, VEC>& v) {
      if (j == 0) m = v; else m.template max_with<true>(v);
      return true;
    });
  } else {
    scan<T, VEC, kBwdBatch>(first, p.xs, lo, hi, self, [&](int j, const Frag<T, VEC>& v) {
      if (j == 0) m = v; else m.template max_with<false>(v);
      return true;
    });
  }
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    const A me = m.template get<A>(e);
    mine[e] = mine[e] && (mv[e] != mv[e] ? prop && me == me : !(me == mv[e]));
  }
}

// PACKED (max only): the tie check by earlier_max_rule, else by matching each earlier element.
template <class T, int VEC, bool IS_MAX, bool PACKED = false>
__global__ void __launch_bounds__(kThreads, IS_MAX ? kBwdMaxBlocks : kBwdAvgBlocks) bwd(const PoolParams p) {
  // the host launches bwd<.., true[, ..]> exactly for PYDNN_POOL_MODE_MAX
  typedef typename AccOf<T>::type A;
  const T* __restrict__ x = static_cast<const T*>(p.x);
  const T* __restrict__ dy = static_cast<const T*>(p.dy);
  const T* __restrict__ yv = static_cast<const T*>(p.y);
  T* __restrict__ dx = static_cast<T*>(p.out);
  for (i64 item = (i64)blockIdx.x * kThreads + threadIdx.x; item < p.total; item += (i64)gridDim.x * kThreads) {
    i64 c[PYDNN_POOL_DIMS];
    int e3[3], olo[3], ohi[3];
    coords<VEC>(p, item, c);
    int ncov = 1;
#pragma unroll
    for (int k = 0; k < 3; ++k) {
      e3[k] = (int)c[2 + k];
      covering(p, k, e3[k], olo[k], ohi[k]);
      ncov *= ohi[k] >= olo[k] ? ohi[k] - olo[k] + 1 : 0;
    }
    const i64 xnc = c[0] * p.xs[0] + c[1] * p.xs[1];
    const T* gb = dy + c[0] * p.ps[0] + c[1] * p.ps[1];
    const T* yb = yv + c[0] * p.ys[0] + c[1] * p.ys[1];
    A xe[IS_MAX ? VEC : 1], acc[VEC];
    if constexpr (IS_MAX) {
      Frag<T, VEC> f;
      f.load(x + xnc + e3[0] * p.xs[2] + e3[1] * p.xs[3] + e3[2] * p.xs[4]);
#pragma unroll
      for (int e = 0; e < VEC; ++e) xe[e] = f.template get<A>(e);
    }
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc[e] = A(0);
    // The covering windows in a fixed order (od, oh, ow ascending), so the sum is the same on every run;
    // kCov at a time with their dy (and y) loads all in flight.
    int o[3] = {olo[0], olo[1], olo[2]};
    for (int k0 = 0; k0 < ncov; k0 += kCov) {
      Frag<T, VEC> g[kCov], m[IS_MAX ? kCov : 1];
      const int o0[3] = {o[0], o[1], o[2]};
#pragma unroll
      for (int u = 0; u < kCov; ++u) {
        if (k0 + u < ncov) {
          g[u].load(gb + o[0] * p.ps[2] + o[1] * p.ps[3] + o[2] * p.ps[4]);
          if constexpr (IS_MAX) m[u].load(yb + o[0] * p.ys[2] + o[1] * p.ys[3] + o[2] * p.ys[4]);
          next_pooled(o, olo, ohi);
        }
      }
      int q[3] = {o0[0], o0[1], o0[2]};
#pragma unroll
      for (int u = 0; u < kCov; ++u) {
        if (k0 + u >= ncov) break;
        int lo[3], hi[3];
#pragma unroll
        for (int k = 0; k < 3; ++k) window(p, k, q[k], lo[k], hi[k]);
        next_pooled(q, olo, ohi);
        if constexpr (IS_MAX) {
          A mv[VEC];
          bool mine[VEC], any = false;
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            mv[e] = m[u].template get<A>(e);
            mine[e] = match(xe[e], mv[e]);
            any |= mine[e];
          }
          if (!any) continue;
          // a tie is possible: an earlier element of the window that matches takes the gradient
          const int self = ((e3[0] - lo[0]) * (hi[1] - lo[1]) + (e3[1] - lo[1])) * (hi[2] - lo[2]) + (e3[2] - lo[2]);
          const T* first = x + xnc + lo[0] * p.xs[2] + lo[1] * p.xs[3] + lo[2] * p.xs[4];
          if constexpr (PACKED) {
            if (self > 0) earlier_max_rule<T, VEC>(p, first, lo, hi, self, mv, mine);
          } else {  // each earlier element matched in turn, stopping when no channel is left
            scan<T, VEC, kBwdBatch>(first, p.xs, lo, hi, self, [&](int, const Frag<T, VEC>& v) {
              bool left = false;
#pragma unroll
              for (int e = 0; e < VEC; ++e) {
                mine[e] = mine[e] && !match(v.template get<A>(e), mv[e]);
                left |= mine[e];
              }
              return left;
            });
          }
#pragma unroll
          for (int e = 0; e < VEC; ++e)
            if (mine[e]) acc[e] += g[u].template get<A>(e);
        } else {
          const A n = p.mode == PYDNN_POOL_MODE_AVG_INCLUDE
                          ? (A)p.win[0] * (A)p.win[1] * (A)p.win[2]
                          : (A)((hi[0] - lo[0]) * (hi[1] - lo[1]) * (hi[2] - lo[2]));
          const A inv = A(1) / n;
#pragma unroll
          for (int e = 0; e < VEC; ++e) acc[e] += g[u].template get<A>(e) * inv;
        }
      }
    }
    store_blend<T, VEC>(dx + offset(p.os, c), acc, p);
  }
}


// ------------------------------------------------------------------ win2: non-overlapping 2-wide windows along w

// Pooling with windows kh x 2, stride kh x 2, no padding, tiling x exactly (H = OH * kh, W = OW * 2), w
// contiguous in every operand (NCHW-like layouts, where the channel vectors of fwd / bwd do not apply). One
// thread per kIn = 16 / sizeof(T) consecutive x elements along w of each of the kh rows of one window row:
// kOut = kIn / 2 outputs. x / dx rows move as 16-byte vectors, y / dy as 8-byte ones; every dx element is
// written exactly once (its own window's gather has one window: no memset, no atomics, no tie scan over
// other windows). Items: p.size / p.div over (n, c, 1, oh, w group), w group fastest; p.total of them.
//   forward   y[o] = the window's max (packed max in window order, as fwd) or sum / (kh * 2) (as fwd)
//   backward  max: dy[o] to the window's first element matching y[o] (fwd / bwd's rule), 0 to the rest;
//             average: dy[o] * (1 / (kh * 2)) to each element. dx blended with alpha / beta as bwd does.
template <class T> struct Win2 {
  static constexpr int kIn = 16 / (int)sizeof(T);
  static constexpr int kOut = kIn / 2;
};

// 8 bytes (kOut elements of T) as a Frag's two words
template <class T, int N>
__device__ __forceinline__ void load8(Frag<T, N>& f, const T* p) {
  const uint2 q = *reinterpret_cast<const uint2*>(p);
  f.w[0] = q.x; f.w[1] = q.y;
}
template <class T, int N>
__device__ __forceinline__ void store8(const Frag<T, N>& f, T* p) {
  *reinterpret_cast<uint2*>(p) = make_uint2(f.w[0], f.w[1]);
}

// element e of a 16-byte Frag as a one-element Frag (the words fwd<T, 1, ..> would have loaded)
template <class T, int N>
__device__ __forceinline__ Frag<T, 1> elem(const Frag<T, N>& f, int e) {
  Frag<T, 1> r;
  if constexpr (sizeof(T) == 8) {
    r.w[0] = f.w[2 * e]; r.w[1] = f.w[2 * e + 1];
  } else if constexpr (sizeof(T) == 4) {
    r.w[0] = f.w[e];
  } else {
    r.w[0] = (f.w[e / 2] >> (16 * (e % 2))) & 0xffffu;
  }
  return r;
}

template <class T, bool IS_MAX>
__global__ void __launch_bounds__(kThreads) win2_fwd(const PoolParams p) {
  typedef typename AccOf<T>::type A;
  constexpr int kIn = Win2<T>::kIn, kOut = Win2<T>::kOut;
  const T* __restrict__ x = static_cast<const T*>(p.x);
  T* __restrict__ y = static_cast<T*>(p.out);
  const int kh = (int)p.win[1];
  for (i64 item = (i64)blockIdx.x * kThreads + threadIdx.x; item < p.total; item += (i64)gridDim.x * kThreads) {
    i64 c[PYDNN_POOL_DIMS];
    coords<1>(p, item, c);
    const T* xr = x + c[0] * p.xs[0] + c[1] * p.xs[1] + c[3] * kh * p.xs[3] + c[4] * kIn;
    A r[kOut];
    if constexpr (IS_MAX) {
      Frag<T, 1> m[kOut];
      const bool prop = p.flags & PYDNN_FLAG_NAN_PROP;
      for (int i = 0; i < kh; ++i) {
        Frag<T, kIn> v;
        v.load(xr + i * p.xs[3]);
#pragma unroll
        for (int j = 0; j < kOut; ++j) {
#pragma unroll
          for (int s = 0; s < 2; ++s) {
            const Frag<T, 1> u = elem(v, 2 * j + s);
            if (i == 0 && s == 0) m[j] = u;
            else if (prop) m[j].template max_with<true>(u);
            else m[j].template max_with<false>(u);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kOut; ++j) r[j] = m[j].template get<A>(0);
    } else {
#pragma unroll
      for (int j = 0; j < kOut; ++j) r[j] = A(0);
      for (int i = 0; i < kh; ++i) {
        Frag<T, kIn> v;
        v.load(xr + i * p.xs[3]);
#pragma unroll
        for (int j = 0; j < kOut; ++j) {
          r[j] += v.template get<A>(2 * j);
          r[j] += v.template get<A>(2 * j + 1);
        }
      }
      const A n = (A)(kh * 2);
#pragma unroll
      for (int j = 0; j < kOut; ++j) r[j] /= n;
    }
    T* yp = y + c[0] * p.os[0] + c[1] * p.os[1] + c[3] * p.os[3] + c[4] * kOut;
    const A alpha = (A)p.alpha, beta = (A)p.beta;
    Frag<T, kOut> o;
    if (p.flags & PYDNN_FLAG_BETA) {
      load8(o, yp);
#pragma unroll
      for (int j = 0; j < kOut; ++j) r[j] = alpha * r[j] + beta * o.template get<A>(j);
    } else {
#pragma unroll
      for (int j = 0; j < kOut; ++j) r[j] = alpha * r[j];
    }
    convert_out<T, kOut>(o, r);
    store8(o, yp);
  }
}

template <class T, bool IS_MAX>
__global__ void __launch_bounds__(kThreads) win2_bwd(const PoolParams p) {
  typedef typename AccOf<T>::type A;
  constexpr int kIn = Win2<T>::kIn, kOut = Win2<T>::kOut;
  const T* __restrict__ x = static_cast<const T*>(p.x);
  const T* __restrict__ dy = static_cast<const T*>(p.dy);
  const T* __restrict__ yv = static_cast<const T*>(p.y);
  T* __restrict__ dx = static_cast<T*>(p.out);
  const int kh = (int)p.win[1];
  const A alpha = (A)p.alpha, beta = (A)p.beta;
  const bool blend = p.flags & PYDNN_FLAG_BETA;
  for (i64 item = (i64)blockIdx.x * kThreads + threadIdx.x; item < p.total; item += (i64)gridDim.x * kThreads) {
    i64 c[PYDNN_POOL_DIMS];
    coords<1>(p, item, c);
    Frag<T, kOut> g, m;
    load8(g, dy + c[0] * p.ps[0] + c[1] * p.ps[1] + c[3] * p.ps[3] + c[4] * kOut);
    if constexpr (IS_MAX) load8(m, yv + c[0] * p.ys[0] + c[1] * p.ys[1] + c[3] * p.ys[3] + c[4] * kOut);
    const i64 xo = c[0] * p.xs[0] + c[1] * p.xs[1] + c[3] * kh * p.xs[3] + c[4] * kIn;
    const i64 oo = c[0] * p.os[0] + c[1] * p.os[1] + c[3] * kh * p.os[3] + c[4] * kIn;
    A gv[kOut], mv[kOut];
    bool found[kOut];
#pragma unroll
    for (int j = 0; j < kOut; ++j) {
      A a = A(0);  // as bwd's acc: 0 + dy (a -0 gradient lands as +0)
      if constexpr (IS_MAX) {
        a += g.template get<A>(j);
        mv[j] = m.template get<A>(j);
      } else {
        a += g.template get<A>(j) * (A(1) / (A)(kh * 2));
      }
      gv[j] = a;
      found[j] = false;
    }
    for (int i = 0; i < kh; ++i) {
      A r[kIn];
      if constexpr (IS_MAX) {
        Frag<T, kIn> v;
        v.load(x + xo + i * p.xs[3]);
#pragma unroll
        for (int j = 0; j < kOut; ++j) {
#pragma unroll
          for (int s = 0; s < 2; ++s) {
            const bool mine = !found[j] && match(v.template get<A>(2 * j + s), mv[j]);
            found[j] = found[j] || mine;
            r[2 * j + s] = mine ? gv[j] : A(0);
          }
        }
      } else {
#pragma unroll
        for (int j = 0; j < kOut; ++j) r[2 * j] = r[2 * j + 1] = gv[j];
      }
      T* dp = dx + oo + i * p.os[3];
      Frag<T, kIn> o;
      if (blend) {
        o.load(dp);
#pragma unroll
        for (int e = 0; e < kIn; ++e) r[e] = alpha * r[e] + beta * o.template get<A>(e);
      } else {
#pragma unroll
        for (int e = 0; e < kIn; ++e) r[e] = alpha * r[e];
      }
      convert_out<T, kIn>(o, r);
      o.store(dp);
    }
  }
}


// ------------------------------------------------------------------ p2: 2-d pooling, one element per thread
//
// 2-d non-adaptive pooling of layouts that take the scalar (VEC = 1) kernels, written along w (NCHW-like) or
// along c (CLAST: channels-last with channels that take no vectors), every offset below 2^31 elements (the
// host checks): one thread per written element, its coordinates from the flat index by four 32-bit
// divisions, the window fixed-size and unrolled instead of fwd / bwd's 5-d coordinates, 3-d window walk and
// batched scan.
//   p2_fwd  windows of at most 3 x 3 (host): the in-bounds elements loaded together (predicated 3 x 3), then
//           reduced in window order (max: the packed max with the NaN rule, as fwd; average: the sum in
//           window order over the count, as fwd).
//   p2_bwd  at most 2 covering windows per dim (ceil(window / stride) <= 2, host): their y / dy loaded
//           together, visited in (oh, ow) order; max: the element takes dy[o] when it is the FIRST element
//           of window o (window order) that matches y[o], as bwd (earlier elements read only on a match,
//           all at once for windows of at most 3 x 3).
// Item layout: p.size = the written tensor's (n, c, 1, h, w); total = their product.
constexpr int kP2Win = 3;  // p2_fwd: window per dim at most
constexpr int kP2Cov = 2;  // p2_bwd: covering windows per dim at most

// CLAST false: w fastest, then h, c, n (NCHW-like: threads along w); true: c fastest, then w, h, n
// (channels-last layouts whose channels take no vectors: threads along c).
template <bool CLAST>
__device__ __forceinline__ void p2_coords(const PoolParams& p, unsigned item, int& n, int& c, int& h, int& w) {
  const unsigned W = (unsigned)p.size[4], H = (unsigned)p.size[3], C = (unsigned)p.size[1];
  if constexpr (CLAST) {
    const unsigned q = item / C;
    c = (int)(item - q * C);
    const unsigned r = q / W;
    w = (int)(q - r * W);
    n = (int)(r / H);
    h = (int)(r - (unsigned)n * H);
  } else {
    const unsigned row = item / W;
    w = (int)(item - row * W);
    const unsigned nc = row / H;
    h = (int)(row - nc * H);
    n = (int)(nc / C);
    c = (int)(nc - (unsigned)n * C);
  }
}

template <class T, bool IS_MAX, bool CLAST = false>
__global__ void __launch_bounds__(kThreads) p2_fwd(const PoolParams p) {
  typedef typename AccOf<T>::type A;
  const T* __restrict__ x = static_cast<const T*>(p.x);
  T* __restrict__ y = static_cast<T*>(p.out);
  const unsigned total = (unsigned)p.total;
  const int xs3 = (int)p.xs[3], xs4 = (int)p.xs[4];
  for (unsigned item = blockIdx.x * kThreads + threadIdx.x; item < total; item += gridDim.x * kThreads) {
    int n, c, oh, ow, hlo, hhi, wlo, whi;
    p2_coords<CLAST>(p, item, n, c, oh, ow);
    window(p, 1, oh, hlo, hhi);
    window(p, 2, ow, wlo, whi);
    const T* first = x + (int)(n * p.xs[0] + c * p.xs[1]) + hlo * xs3 + wlo * xs4;
    Frag<T, 1> v[kP2Win * kP2Win];
#pragma unroll
    for (int i = 0; i < kP2Win; ++i)
#pragma unroll
      for (int j = 0; j < kP2Win; ++j)
        if (hlo + i < hhi && wlo + j < whi) v[i * kP2Win + j].load(first + i * xs3 + j * xs4);
    A r[1];
    if constexpr (IS_MAX) {
      Frag<T, 1> m = v[0];  // the window's first element (windows are never empty)
      const bool prop = p.flags & PYDNN_FLAG_NAN_PROP;
#pragma unroll
      for (int k = 1; k < kP2Win * kP2Win; ++k) {
        const int i = k / kP2Win, j = k % kP2Win;
        if (hlo + i < hhi && wlo + j < whi) {
          if (prop) m.template max_with<true>(v[k]);
          else m.template max_with<false>(v[k]);
        }
      }
      r[0] = m.template get<A>(0);
    } else {
      A s = A(0);
#pragma unroll
      for (int k = 0; k < kP2Win * kP2Win; ++k) {
        const int i = k / kP2Win, j = k % kP2Win;
        if (hlo + i < hhi && wlo + j < whi) s += v[k].template get<A>(0);
      }
      const A cnt = p.mode == PYDNN_POOL_MODE_AVG_INCLUDE ? (A)p.win[1] * (A)p.win[2]
                                                           : (A)((hhi - hlo) * (whi - wlo));
      r[0] = s / cnt;
    }
    store_blend<T, 1>(y + (int)(n * p.os[0] + c * p.os[1] + oh * p.os[3] + ow * p.os[4]), r, p);
  }
}

template <class T, bool IS_MAX, bool CLAST = false>
__global__ void __launch_bounds__(kThreads) p2_bwd(const PoolParams p) {
  typedef typename AccOf<T>::type A;
  const T* __restrict__ x = static_cast<const T*>(p.x);
  const T* __restrict__ dy = static_cast<const T*>(p.dy);
  const T* __restrict__ yv = static_cast<const T*>(p.y);
  T* __restrict__ dx = static_cast<T*>(p.out);
  const unsigned total = (unsigned)p.total;
  const int xs3 = (int)p.xs[3], xs4 = (int)p.xs[4];
  for (unsigned item = blockIdx.x * kThreads + threadIdx.x; item < total; item += gridDim.x * kThreads) {
    int n, c, h, w, ohlo, ohhi, owlo, owhi;
    p2_coords<CLAST>(p, item, n, c, h, w);
    covering(p, 1, h, ohlo, ohhi);
    covering(p, 2, w, owlo, owhi);
    const int xnc = (int)(n * p.xs[0] + c * p.xs[1]);
    const T* gb = dy + (int)(n * p.ps[0] + c * p.ps[1]);
    const T* yb = yv + (int)(n * p.ys[0] + c * p.ys[1]);
    Frag<T, 1> g[kP2Cov * kP2Cov], m[IS_MAX ? kP2Cov * kP2Cov : 1], xf;
    if constexpr (IS_MAX) xf.load(x + xnc + h * xs3 + w * xs4);
#pragma unroll
    for (int i = 0; i < kP2Cov; ++i)
#pragma unroll
      for (int j = 0; j < kP2Cov; ++j)
        if (ohlo + i <= ohhi && owlo + j <= owhi) {
          const int oh = ohlo + i, ow = owlo + j;
          g[i * kP2Cov + j].load(gb + oh * (int)p.ps[3] + ow * (int)p.ps[4]);
          if constexpr (IS_MAX) m[i * kP2Cov + j].load(yb + oh * (int)p.ys[3] + ow * (int)p.ys[4]);
        }
    A acc = A(0);
    const A xe = IS_MAX ? xf.template get<A>(0) : A(0);
#pragma unroll
    for (int i = 0; i < kP2Cov; ++i)
#pragma unroll
      for (int j = 0; j < kP2Cov; ++j) {
        if (!(ohlo + i <= ohhi && owlo + j <= owhi)) continue;
        const int oh = ohlo + i, ow = owlo + j, k = i * kP2Cov + j;
        int hlo, hhi, wlo, whi;
        window(p, 1, oh, hlo, hhi);
        window(p, 2, ow, wlo, whi);
        if constexpr (IS_MAX) {
          const A mv = m[k].template get<A>(0);
          if (!match(xe, mv)) continue;
          bool mine = true;  // unless an earlier element of the window (window order) matches too
          if (hhi - hlo <= kP2Win && whi - wlo <= kP2Win) {  // the earlier elements' loads all in flight
            Frag<T, 1> ev[kP2Win * kP2Win];
#pragma unroll
            for (int a = 0; a < kP2Win; ++a)
#pragma unroll
              for (int b = 0; b < kP2Win; ++b) {
                const int hh = hlo + a, ww = wlo + b;
                if (hh < hhi && ww < whi && (hh < h || (hh == h && ww < w)))
                  ev[a * kP2Win + b].load(x + xnc + hh * xs3 + ww * xs4);
              }
#pragma unroll
            for (int a = 0; a < kP2Win; ++a)
#pragma unroll
              for (int b = 0; b < kP2Win; ++b) {
                const int hh = hlo + a, ww = wlo + b;
                if (hh < hhi && ww < whi && (hh < h || (hh == h && ww < w)) &&
                    match(ev[a * kP2Win + b].template get<A>(0), mv))
                  mine = false;
              }
          } else {
            for (int hh = hlo; hh <= h && mine; ++hh) {
              const int wend = hh < h ? whi : w;
              for (int ww = wlo; ww < wend; ++ww) {
                Frag<T, 1> e;
                e.load(x + xnc + hh * xs3 + ww * xs4);
                if (match(e.template get<A>(0), mv)) {
                  mine = false;
                  break;
                }
              }
            }
          }
          if (mine) acc += g[k].template get<A>(0);
        } else {
          const A cnt = p.mode == PYDNN_POOL_MODE_AVG_INCLUDE ? (A)p.win[1] * (A)p.win[2]
                                                               : (A)((hhi - hlo) * (whi - wlo));
          acc += g[k].template get<A>(0) * (A(1) / cnt);
        }
      }
    A r[1] = {acc};
    store_blend<T, 1>(dx + (int)(n * p.os[0] + c * p.os[1] + h * p.os[3] + w * p.os[4]), r, p);
  }
}


// ------------------------------------------------------------------ p2t: max backward over a shared-memory tile
//
// p2t_bwd  max pooling backward of p2_bwd's problems (2-d, non-adaptive, NCHW-like: dx contiguous along w,
//          offsets below 2^31 elements) whose windows are at most 3 x 3 with at most 2 covering windows per
//          dim (host). p2_bwd spends its time on index math: each dx element recomputes up to 4 covering
//          windows and re-scans a window on every match (max 3x3/2 NCHW fp32 101x38x50x50: 0.474 ms, PyTorch
//          0.122 from saved indices; H200, tools/sweep_memory.py). Here a block owns one band of input rows
//          [h0, h0 + p.div[1]) of one (n, c) plane (block b: plane b / p.div[0], band b % p.div[0]):
//   1. a thread per covering window (output rows covering(h0).lo .. covering(h1 - 1).hi, every ow): the
//      window's FIRST element (window order) matching y[o] (equal, or both NaN: bwd / p2_bwd's rule), its
//      plane offset h * W + w (-1: none) and dy[o] to shared memory;
//   2. a thread per dx element of the band: dy of its covering windows (oh, ow ascending, as p2_bwd) whose
//      winner it is, summed, blended, stored (dx along w: coalesced).
// Same elements, same order, same arithmetic as p2_bwd: the same bits. The host keeps the band's windows
// within kP2tWin (p.div[0] = bands per plane, p.div[1] = rows per band; grid = planes * bands).
constexpr int kP2tWin = 2048;  // windows a block holds (shared memory: an int and an A each)

template <class T>
__global__ void __launch_bounds__(kThreads) p2t_bwd(const PoolParams p) {
  typedef typename AccOf<T>::type A;
  __shared__ int s_win[kP2tWin];
  __shared__ A s_g[kP2tWin];
  const T* __restrict__ x = static_cast<const T*>(p.x);
  const T* __restrict__ dy = static_cast<const T*>(p.dy);
  const T* __restrict__ yv = static_cast<const T*>(p.y);
  T* __restrict__ dx = static_cast<T*>(p.out);
  const int bands = (int)p.div[0], th = (int)p.div[1];
  const int C = (int)p.size[1], H = (int)p.size[3], W = (int)p.size[4];
  const int OW = (int)p.out_dim[2];
  const int plane = (int)(blockIdx.x / (unsigned)bands), band = (int)(blockIdx.x - (unsigned)plane * bands);
  const int n = plane / C, c = plane - n * C;
  const int h0 = band * th, h1 = h0 + th < H ? h0 + th : H;
  int ohlo, ohhi, tmp;
  covering(p, 1, h0, ohlo, tmp);
  covering(p, 1, h1 - 1, tmp, ohhi);
  const int nwin = ohhi >= ohlo ? (ohhi - ohlo + 1) * OW : 0;
  const int xs3 = (int)p.xs[3], xs4 = (int)p.xs[4];
  const T* xb = x + (int)(n * p.xs[0] + c * p.xs[1]);
  const T* gb = dy + (int)(n * p.ps[0] + c * p.ps[1]);
  const T* yb = yv + (int)(n * p.ys[0] + c * p.ys[1]);
  for (int t = threadIdx.x; t < nwin; t += kThreads) {
    const int r = t / OW, ow = t - r * OW, oh = ohlo + r;
    int hlo, hhi, wlo, whi;
    window(p, 1, oh, hlo, hhi);
    window(p, 2, ow, wlo, whi);
    Frag<T, 1> m, g, ev[kP2Win * kP2Win];
    m.load(yb + oh * (int)p.ys[3] + ow * (int)p.ys[4]);
    g.load(gb + oh * (int)p.ps[3] + ow * (int)p.ps[4]);
    const T* first = xb + hlo * xs3 + wlo * xs4;
#pragma unroll
    for (int a = 0; a < kP2Win; ++a)
#pragma unroll
      for (int b = 0; b < kP2Win; ++b)
        if (hlo + a < hhi && wlo + b < whi) ev[a * kP2Win + b].load(first + a * xs3 + b * xs4);
    const A mv = m.template get<A>(0);
    int win = -1;
#pragma unroll
    for (int k = kP2Win * kP2Win - 1; k >= 0; --k) {  // backwards: the last assignment is the first match
      const int a = k / kP2Win, b = k % kP2Win;
      if (hlo + a < hhi && wlo + b < whi && match(ev[k].template get<A>(0), mv)) win = (hlo + a) * W + wlo + b;
    }
    s_win[t] = win;
    s_g[t] = g.template get<A>(0);
  }
  __syncthreads();
  const int count = (h1 - h0) * W;
  T* db = dx + (int)(n * p.os[0] + c * p.os[1]);
  for (int t = threadIdx.x; t < count; t += kThreads) {
    const int r = t / W, w = t - r * W, h = h0 + r, self = h * W + w;
    int eh_lo, eh_hi, ew_lo, ew_hi;
    covering(p, 1, h, eh_lo, eh_hi);
    covering(p, 2, w, ew_lo, ew_hi);
    A acc = A(0);
#pragma unroll
    for (int i = 0; i < kP2Cov; ++i)
#pragma unroll
      for (int j = 0; j < kP2Cov; ++j)
        if (eh_lo + i <= eh_hi && ew_lo + j <= ew_hi) {
          const int k = (eh_lo + i - ohlo) * OW + ew_lo + j;
          if (s_win[k] == self) acc += s_g[k];
        }
    A res[1] = {acc};
    store_blend<T, 1>(db + h * (int)p.os[3] + w * (int)p.os[4], res, p);
  }
}

}  // namespace pooling
}  // namespace pydnn
