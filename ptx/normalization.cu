// Layer, group, instance and RMS normalization (pydnn extensions); see normalization_params.h for how a
// problem is described and pydnn/ops/normalization.py for the choice of kernel. The kernels:
//
//   fwd, bwd   the fast path: one normalization set per G threads (a sub-warp up to a 1024-thread block;
//              several sets per block when G is small), each thread holding ITEMS vectors of VEC
//              elements in registers: one read of x (and dy), one write of y (dx). The elements of a set
//              are at most two levels deep (an outer dim with a stride, an inner contiguous dim), which
//              covers layer / RMS norm rows, NCHW groups (contiguous) and NHWC groups (S positions of C/G
//              contiguous channels).
//   fwd_cluster, bwd_cluster   the same body for sets too large for one block (sm_90): a cluster of 8
//              blocks shares a set, the block partials meet through distributed shared memory.
//   fwd_rows   forward of contiguous layer / RMS rows without activation: G threads per row, R rows per
//              group, one-shot blocks, exact statistics from registers (see its comment below).
//   fwd_persist   fwd_rows for 16-bit rows in a persistent grid: scale / bias in registers once per thread,
//              a register ring of DEPTH rows of x (see its comment below).
//   bwd_rows   backward of the same rows: persistent, a ring of DEPTH rows of x / dy in registers, one
//              reduction per row, dscale / dbias partials in registers (see its comment below).
//   bwd_ring   bwd_rows with the ring in shared memory (cp.async), deeper and without the register cost;
//              bwd_ring_cl: the same in clusters whose blocks add their dscale / dbias partials.
//   gn_fwd, gn_bwd   group norm with channels innermost (NHWC): a cluster of 8 blocks per (sample, GC
//              groups), each block's positions x channels tile in shared memory between the statistics
//              (reduced over the cluster) and the output, so x (and dy) are read once.
//   gn_reg, gn_reg_cl   the NHWC forward on gn_fwd's units with half of each block's share in registers and
//              half in the threads' own shared-memory slots (more bytes in flight per SM than either).
//   gen_fwd, gen_bwd   any layout (up to 8 element dims, any strides): one block per set, coordinates per
//              element, statistics in a first pass over memory, the output in a second.
//   finish     backward: dscale / dbias = alpha2 * (sum of the per-block partials) + beta2 * old.
//   zero       clears the partials of gen_bwd (which adds into them with atomics).
//
// Statistics: mean and M2 = sum (x - mean)^2 per thread from its registers (two passes over registers),
// merged across threads with Chan's formula (one reduction, no cancellation); the variance is biased
// (M2 / len), invstd = 1 / sqrt(var + eps). RMS norm: invstd = 1 / sqrt(sum x^2 / len + eps), no mean.
// All arithmetic is float32 (the 16-bit types are converted on load); statistics, scale and bias are
// float32 tensors.
//
// Backward: xhat = (x - mean) * invstd; z = xhat * scale + bias (only for the activation's derivative);
// dz = dy * act'(z); dxhat = dz * scale; dx = invstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
// (RMS: no mean(dxhat) term); dscale = sum dz * xhat, dbias = sum dz over every set.
#include "common/params.h"
#include "common/types.cuh"
#include "normalization_params.h"

namespace pydnn {
namespace norm {

constexpr int kGenThreads = 256;
constexpr int kCluster = 8;

// The epilogue hook of fwd_rows and gen_fwd (as ptx/matmul.cu's Epi): epi(z, s, e) maps the normalized,
// scaled and shifted value z of element e (its index in the set, x's memory order) of set s, before the
// alpha / beta blend (gen_fwd: after the activation). Install-time units take NoEpi (the identity,
// inlined: the same code as without the hook); the graph API generates a functor from a pointwise chain
// (pydnn/graph/norm_nodes.py) and instantiates fwd_rows_body / gen_fwd_body with it in its own unit.
// fwd_rows calls epi.run(a, s, c0) on the VEC values of elements c0 .. c0 + VEC - 1 of row s at once (so a
// generated functor reads its operands' runs of VEC elements as 16-byte vectors where it can).
struct NoEpi {
  __device__ __forceinline__ float operator()(float z, long long, long long) const { return z; }
  template <int V> __device__ __forceinline__ void run(float (&)[V], long long, long long) const {}
};
static_assert(kCluster == 8, "CLUSTER in pydnn/ops/normalization.py");

template <class A, class B> struct Same { static constexpr bool value = false; };
template <class A> struct Same<A, A> { static constexpr bool value = true; };

struct __align__(16) U4 { unsigned x, y, z, w; };

// VEC consecutive elements of T as 32-bit words: one access of sizeof(T) * VEC bytes.
template <class T, int VEC> struct Frag {
  static constexpr int BYTES = (int)sizeof(T) * VEC;
  static constexpr int WORDS = BYTES < 4 ? 1 : BYTES / 4;
  unsigned w[WORDS];

  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < WORDS; ++i) w[i] = 0;
  }
  __device__ __forceinline__ void load(const T* p) {
    if constexpr (BYTES == 16) {
      const U4 q = *reinterpret_cast<const U4*>(p);
      w[0] = q.x; w[1] = q.y; w[2] = q.z; w[3] = q.w;
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
    } else if constexpr (BYTES == 4) {
      *reinterpret_cast<unsigned*>(p) = w[0];
    } else {
      *reinterpret_cast<unsigned short*>(p) = (unsigned short)w[0];
    }
  }
  __device__ __forceinline__ void get(float* a) const {
    if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) a[e] = __uint_as_float(w[e]);
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const unsigned short b = (unsigned short)(w[e / 2] >> (16 * (e & 1)));
        if constexpr (Same<T, bf16_t>::value) a[e] = __uint_as_float((unsigned)b << 16);
        else { half_t h; h.bits = b; a[e] = to_float(h); }
      }
    }
  }
  __device__ __forceinline__ void set(const float* a) {
    if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) w[e] = __float_as_uint(a[e]);
    } else if constexpr (VEC == 1) {
      w[0] = pydnn::store<T>(a[0]).bits;
    } else {
#pragma unroll
      for (int e = 0; e < VEC; e += 2) w[e / 2] = pydnn::pack16x2<T>(a[e], a[e + 1]);
    }
  }
};

// ------------------------------------------------------------------ activations on z

// FAST (16-bit data): hardware exp and division, whose error is far below the output's rounding.
template <bool FAST> __device__ __forceinline__ float ex(float x) { return FAST ? __expf(x) : expf(x); }
template <bool FAST> __device__ __forceinline__ float sigm(float x) {
  const float e = ex<FAST>(-fabsf(x));
  const float s = FAST ? __fdividef(1.0f, 1.0f + e) : 1.0f / (1.0f + e);
  return x >= 0.0f ? s : e * s;
}
#define PYDNN_NORM_SQRT_2_OVER_PI 0.7978845608028654f
#define PYDNN_NORM_INV_SQRT_2PI 0.3989422804014327f
#define PYDNN_NORM_INV_SQRT_2 0.7071067811865476f

template <bool FAST> __device__ __forceinline__ float act_f(int act, float z, float c, float c2) {
  switch (act) {
    case PYDNN_NORM_ACT_RELU: return z > 0.0f ? z : 0.0f;
    case PYDNN_NORM_ACT_SIGMOID: return sigm<FAST>(z);
    case PYDNN_NORM_ACT_TANH: return tanhf(z);
    case PYDNN_NORM_ACT_CLIPPED_RELU: return z > 0.0f ? (z < c ? z : c) : 0.0f;
    case PYDNN_NORM_ACT_ELU: return z > 0.0f ? z : c * expm1f(z);
    case PYDNN_NORM_ACT_SWISH: return z * sigm<FAST>(c2 * z);
    case PYDNN_NORM_ACT_GELU_ERF: return 0.5f * z * (1.0f + erff(z * PYDNN_NORM_INV_SQRT_2));
    case PYDNN_NORM_ACT_GELU_TANH: {
      const float u = PYDNN_NORM_SQRT_2_OVER_PI * (z + 0.044715f * z * z * z);
      return z * sigm<FAST>(2.0f * u);
    }
    default: return z;
  }
}

// d act / d z at z
template <bool FAST> __device__ __forceinline__ float act_d(int act, float z, float c, float c2) {
  switch (act) {
    case PYDNN_NORM_ACT_RELU: return z > 0.0f ? 1.0f : 0.0f;
    case PYDNN_NORM_ACT_SIGMOID: { const float s = sigm<FAST>(z); return s * (1.0f - s); }
    case PYDNN_NORM_ACT_TANH: { const float t = tanhf(z); return 1.0f - t * t; }
    case PYDNN_NORM_ACT_CLIPPED_RELU: return (z > 0.0f && z < c) ? 1.0f : 0.0f;
    case PYDNN_NORM_ACT_ELU: return z > 0.0f ? 1.0f : c * ex<FAST>(z);
    case PYDNN_NORM_ACT_SWISH: { const float s = sigm<FAST>(c2 * z); return s + c2 * z * s * (1.0f - s); }
    case PYDNN_NORM_ACT_GELU_ERF: {
      const float cdf = 0.5f * (1.0f + erff(z * PYDNN_NORM_INV_SQRT_2));
      return cdf + z * PYDNN_NORM_INV_SQRT_2PI * ex<FAST>(-0.5f * z * z);
    }
    case PYDNN_NORM_ACT_GELU_TANH: {
      const float k = PYDNN_NORM_SQRT_2_OVER_PI;
      const float u = k * (z + 0.044715f * z * z * z), du = k * (1.0f + 3.0f * 0.044715f * z * z);
      const float s = sigm<FAST>(2.0f * u), sm = sigm<FAST>(-2.0f * u);
      return s + 2.0f * z * s * sm * du;
    }
    default: return 1.0f;
  }
}

// ------------------------------------------------------------------ reductions

// Three floats reduced together: Chan's (count, mean, M2) merge, or plain sums.
struct R3 { float a, b, c; };

__device__ __forceinline__ R3 merge(R3 lo, R3 hi, bool chan) {
  R3 r;
  if (!chan) {
    r.a = lo.a + hi.a; r.b = lo.b + hi.b; r.c = lo.c + hi.c;
    return r;
  }
  const float n = lo.a + hi.a;
  if (n == 0.0f) return lo;
  const float d = hi.b - lo.b, wh = hi.a / n;
  r.a = n;
  r.b = lo.b + d * wh;
  r.c = lo.c + hi.c + d * d * lo.a * wh;
  return r;
}
__device__ __forceinline__ R3 shfl(R3 v, int m) {
  R3 r;
  r.a = __shfl_xor_sync(0xffffffffu, v.a, m);
  r.b = __shfl_xor_sync(0xffffffffu, v.b, m);
  r.c = __shfl_xor_sync(0xffffffffu, v.c, m);
  return r;
}

// Shared-memory add of a parameter-gradient run (dscale / dbias partials). When the whole warp adds to
// one address (NCHW group norm: a warp's vectors lie in one channel), one lane adds the warp's sum: 32
// atomics on one address would be serialised. Lanes not converged here, or adding elsewhere, add alone.
__device__ __forceinline__ void add_run(float* p, float v) {
  const unsigned active = __activemask();
  if (active == 0xffffffffu && __match_any_sync(active, (unsigned long long)p) == active) {
#pragma unroll
    for (int m = 16; m; m >>= 1) v += __shfl_xor_sync(active, v, m);
    const unsigned tid = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
    if ((tid & 31u) == 0) atomicAdd(p, v);
  } else {
    atomicAdd(p, v);
  }
}

__device__ __forceinline__ void cluster_sync() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r = 0;
#if __CUDA_ARCH__ >= 900
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#endif
  return r;
}
// A float in block `rank`'s shared memory, at the address `p` has in ours.
__device__ __forceinline__ float ld_dsmem(const float* p, unsigned rank) {
  float v = 0.0f;
#if __CUDA_ARCH__ >= 900
  unsigned a, r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(r) : "memory");
#endif
  return v;
}

// Reduce over the G threads of a set (G a power of two; lane order fixed so that every thread of the set
// ends with the same bits). CL == 1: the set is G consecutive threads of the block. CL > 1: the set is
// the whole cluster (each block's threads; blockDim.x >= 64). sm: 32 entries, slot: 1 entry, both
// double-buffered by the caller (a buffer is written again only two reductions later).
template <int CL>
__device__ __forceinline__ R3 set_reduce(R3 r, bool chan, int G, R3* sm, R3* slot) {
  const int lane = threadIdx.x & 31;
  const int W = (CL == 1 && G < 32) ? G : 32;
  for (int m = 1; m < W; m <<= 1) {
    const R3 o = shfl(r, m);
    r = (lane & m) ? merge(o, r, chan) : merge(r, o, chan);
  }
  const int GB = CL == 1 ? G : (int)blockDim.x;
  if (GB > 32) {
    if (lane == 0) sm[threadIdx.x >> 5] = r;
    __syncthreads();
    const int first = (int)(threadIdx.x & ~(unsigned)(GB - 1)) >> 5;
    r = sm[first];
    for (int w = 1; w < (GB >> 5); ++w) r = merge(r, sm[first + w], chan);
  }
  if constexpr (CL > 1) {
    if (threadIdx.x == 0) *slot = r;
    cluster_sync();
    const float* f = &slot->a;
    R3 acc;
    acc.a = ld_dsmem(f, 0); acc.b = ld_dsmem(f + 1, 0); acc.c = ld_dsmem(f + 2, 0);
#pragma unroll
    for (int k = 1; k < CL; ++k) {
      R3 o;
      o.a = ld_dsmem(f, k); o.b = ld_dsmem(f + 1, k); o.c = ld_dsmem(f + 2, k);
      acc = merge(acc, o, chan);
    }
    r = acc;
  }
  return r;
}

// ------------------------------------------------------------------ addressing

// Start of set `s` in x, out, dy and the statistics, and its first parameter index.
__device__ __forceinline__ void set_base(const NormParams& p, i64 s, i64* off, i64& pbase) {
  off[0] = off[1] = off[2] = off[3] = 0;
  pbase = 0;
  for (int d = p.set_ndim - 1; d >= 0; --d) {
    const i64 n = p.set_size[d], q = s / n, c = s - q * n;
#pragma unroll
    for (int k = 0; k < 4; ++k) off[k] += c * p.set_stride[k][d];
    pbase += c * p.set_pstride[d];
    s = q;
  }
}

// The two-level element layout of the fast kernels.
struct Geo {
  unsigned I;       // inner (contiguous) elements
  i64 os[3];        // outer strides of x, out, dy
  i64 po, pi;       // parameter strides: outer, inner
  int one;          // el_ndim == 1: no outer dim
  int sh;           // I a power of two: log2(I), else -1 (a division per vector)
  __device__ __forceinline__ Geo(const NormParams& p) {
    one = p.el_ndim == 1;
    if (one) {
      I = (unsigned)p.len;
      os[0] = os[1] = os[2] = 0;
      po = 0;
      pi = p.el_pstride[0];
    } else {
      I = (unsigned)p.el_size[1];
#pragma unroll
      for (int k = 0; k < 3; ++k) os[k] = p.el_stride[k][0];
      po = p.el_pstride[0];
      pi = p.el_pstride[1];
    }
    sh = (I & (I - 1)) == 0 ? __ffs(I) - 1 : -1;
  }
  // element e (the first of a vector, which never crosses an inner row): outer index and inner offset
  __device__ __forceinline__ void split(unsigned e, unsigned& o, unsigned& i) const {
    if (one) {
      o = 0;
      i = e;
    } else if (sh >= 0) {
      o = e >> sh;
      i = e & (I - 1);
    } else {
      o = e / I;
      i = e - o * I;
    }
  }
};

// VEC parameters from `base` (float32) starting at index idx, step pi (0: broadcast).
template <int VEC>
__device__ __forceinline__ void load_params(const float* base, i64 idx, i64 pi, float* out) {
  if (pi == 0) {
    const float v = __ldg(base + idx);
#pragma unroll
    for (int j = 0; j < VEC; ++j) out[j] = v;
  } else if (VEC % 4 == 0 && pi == 1 && (reinterpret_cast<unsigned long long>(base + idx) & 15) == 0) {
#pragma unroll
    for (int j = 0; j < VEC; j += 4) {
      const float4 q = __ldg(reinterpret_cast<const float4*>(base + idx + j));
      out[j] = q.x; out[j + 1] = q.y; out[j + 2] = q.z; out[j + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) out[j] = __ldg(base + idx + j * pi);
  }
}

// Thread position inside its set: lane (0 .. G-1), which of the block's sets (sub), sets per block,
// and the sequence of sets (first, step) this thread's block (or cluster) walks.
template <int CL> struct Pos {
  int G, lane, sub, spb;
  i64 first, step;
  __device__ __forceinline__ Pos(const NormParams& p) {
    G = p.group;
    if (CL == 1) {
      lane = threadIdx.x & (G - 1);
      sub = threadIdx.x / G;
      spb = blockDim.x / G;
      first = (i64)blockIdx.x * spb;
      step = (i64)gridDim.x * spb;
    } else {
      lane = (int)(cluster_rank() * blockDim.x + threadIdx.x);
      sub = 0;
      spb = 1;
      first = blockIdx.x / CL;
      step = gridDim.x / CL;
    }
  }
};

// ------------------------------------------------------------------ forward (fast)

template <class T, int VEC, int ITEMS, int CL>
__device__ __forceinline__ void fwd_body(const NormParams& p) {
  typedef Frag<T, VEC> F;
  constexpr bool FAST = sizeof(T) == 2;
  __shared__ R3 sm[2][32];
  __shared__ R3 slot[2];
  const Pos<CL> ps(p);
  const Geo g(p);
  const unsigned nvec = (unsigned)p.len / VEC;
  const bool rms = p.flags & PYDNN_NORM_FLAG_RMS, blend = p.flags & PYDNN_FLAG_BETA;
  const float alpha = (float)p.alpha, beta = (float)p.beta, eps = (float)p.eps;
  const float c1 = (float)p.coef, c2 = (float)p.coef2;
  const float inv_len = 1.0f / (float)p.len;
  const T* xb = (const T*)p.x;
  T* yb = (T*)p.out;
  int it = 0;
  for (i64 first = ps.first; first < p.sets; first += ps.step, ++it) {
    const i64 s = first + ps.sub;
    const bool live = s < p.sets;
    i64 off[4], pbase;
    set_base(p, live ? s : first, off, pbase);
    F v[ITEMS];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const unsigned vi = ps.lane + k * ps.G;
      v[k].zero();
      if (live && vi < nvec) {
        unsigned o, i;
        g.split(vi * VEC, o, i);
        v[k].load(xb + off[0] + o * g.os[0] + i);
      }
    }
    // this thread's count, mean and M2 (RMS: sum of squares in c)
    R3 r;
    r.a = 0.0f; r.b = 0.0f; r.c = 0.0f;
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      float a[VEC];
      v[k].get(a);
      const bool lv = live && ps.lane + k * ps.G < nvec;
      if (lv) r.a += VEC;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        sum += a[j];
        r.c += a[j] * a[j];
      }
    }
    if (!rms) {
      r.b = r.a > 0.0f ? sum / r.a : 0.0f;
      r.c = 0.0f;
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        float a[VEC];
        v[k].get(a);
        if (live && ps.lane + k * ps.G < nvec) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) r.c += (a[j] - r.b) * (a[j] - r.b);
        }
      }
    }
    r = set_reduce<CL>(r, !rms, ps.G, sm[it & 1], &slot[it & 1]);
    const float mean = rms ? 0.0f : r.b;
    const float var = fmaxf(r.c * inv_len, 0.0f);
    const float inv = 1.0f / sqrtf(var + eps);
    if (live && ps.lane == 0 && (p.flags & PYDNN_NORM_FLAG_STATS)) {
      if (p.mean) p.mean[off[3]] = mean;
      if (p.invstd) p.invstd[off[3]] = inv;
    }
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const unsigned vi = ps.lane + k * ps.G;
      if (live && vi < nvec) {
        unsigned o, i;
        g.split(vi * VEC, o, i);
        const i64 pidx = pbase + o * g.po + i * g.pi;
        float a[VEC], sc[VEC], bi[VEC];
        v[k].get(a);
        load_params<VEC>(p.scale, pidx, g.pi, sc);
        if (p.bias) load_params<VEC>(p.bias, pidx, g.pi, bi);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          float z = (a[j] - mean) * inv * sc[j];
          if (p.bias) z += bi[j];
          if (p.act) z = act_f<FAST>(p.act, z, c1, c2);
          a[j] = alpha * z;
        }
        T* dst = yb + off[1] + o * g.os[1] + i;
        if (blend) {
          F old;
          old.load(dst);
          float b[VEC];
          old.get(b);
#pragma unroll
          for (int j = 0; j < VEC; ++j) a[j] += beta * b[j];
        }
        v[k].set(a);
        v[k].store(dst);
      }
    }
  }
  if (CL > 1) cluster_sync();  // no block leaves while another may still read its shared memory
}

template <class T, int VEC, int ITEMS>
__global__ void __launch_bounds__(1024) fwd(const NormParams p) { fwd_body<T, VEC, ITEMS, 1>(p); }

#if __CUDA_ARCH__ >= 900
template <class T, int VEC, int ITEMS>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(1024) fwd_cluster(const NormParams p) {
  fwd_body<T, VEC, ITEMS, kCluster>(p);
}
#else
template <class T, int VEC, int ITEMS>
__global__ void fwd_cluster(const NormParams) { __trap(); }  // the host never picks it before sm_90
#endif

// ------------------------------------------------------------------ forward, rows (layer / RMS norm)

// Contiguous rows with one row stride (set_ndim 1), parameters 1:1 with the row's elements (el_pstride 1,
// set_pstride 0), 16-byte vectors. A group of G threads (a power of two) holds R rows at once, ITEMS
// vectors of each per thread: every load of the R rows is issued before any is used, and a thread's
// scale / bias (the same in every row) sit in registers for all R rows (R == 1: loaded at the output,
// from L1). Statistics are exact from registers: mean = sum / len, then var = sum (x - mean)^2 / len
// (RMS: one sum of x^2), invstd = rsqrt(var + eps); one reduction of R floats per statistic, one barrier
// each. Row offsets are one 64-bit multiply per row, everything else 32-bit.

// A 16-byte load that does not allocate in L1: x is read once, while L1 keeps scale / bias for the
// next rows. (.nc is safe with y == x: each element is read before its own thread writes it.)
template <class T, int VEC>
__device__ __forceinline__ void load_once(Frag<T, VEC>& f, const T* p) {
  static_assert(Frag<T, VEC>::BYTES == 16, "16-byte fragments only");
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(f.w[0]), "=r"(f.w[1]), "=r"(f.w[2]), "=r"(f.w[3])
               : "l"(p));
}

// L2 prefetch (p.pf): the line holding a pulled into L2 (prefetch.global.L2; the lanes of a warp on
// consecutive addresses: its prefetches coalesce into whole lines). A hint: no register waits for it and
// nothing depends on it for correctness. Why: a one-shot block has its loads in flight only until they
// land, so the bytes an SM keeps in flight fall while its blocks reduce and store (LN bf16 forward on the
// H200: 88.6% of copy in steady state against RMS's 100%); block b pulling in what block b + pf will read
// keeps DRAM busy through those phases, independently of registers and slots, and that block's own loads
// then hit L2. Measured (H100, tools/bench_normalization.py): gn_reg +0.8-0.9 point at 8 MiB ahead (on);
// fwd_rows no gain on its benchmark (off); 16 MiB ahead loses 7-11 points (the lines leave L2 before they
// are read).
__device__ __forceinline__ void l2_prefetch_line(const void* a) { asm volatile("prefetch.global.L2 [%0];" ::"l"(a)); }

// A 16-byte store with the evict-first (streaming) policy, st.global.cs: y / dx are written once and not
// read again by the kernel (PYDNN_NORM_FLAG_STREAM, a measured choice of the host).
template <class T, int VEC>
__device__ __forceinline__ void store_stream(const Frag<T, VEC>& f, T* p) {
  static_assert(Frag<T, VEC>::BYTES == 16, "16-byte fragments only");
  asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(f.w[0]), "r"(f.w[1]), "r"(f.w[2]),
               "r"(f.w[3])
               : "memory");
}
template <class T, int VEC>
__device__ __forceinline__ void store_out(const Frag<T, VEC>& f, T* p, bool stream) {
  if (stream) store_stream<T, VEC>(f, p);
  else f.store(p);
}

// Sum of R floats each over the G consecutive threads of a group (every thread of the block calls it;
// with G > 32 it passes one barrier and uses sm: 32 x R floats, reusable after the next barrier). Every
// thread of a group ends with the same bits (xor butterfly, then the same warp sums in the same order).
template <int R>
__device__ __forceinline__ void rows_sum(float (&v)[R], int G, float (*sm)[R]) {
  for (int m = (G < 32 ? G : 32) >> 1; m > 0; m >>= 1)
#pragma unroll
    for (int r = 0; r < R; ++r) v[r] += __shfl_xor_sync(0xffffffffu, v[r], m);
  if (G > 32) {
    if ((threadIdx.x & 31) == 0)
#pragma unroll
      for (int r = 0; r < R; ++r) sm[threadIdx.x >> 5][r] = v[r];
    __syncthreads();
    const int first = (int)(threadIdx.x & ~(unsigned)(G - 1)) >> 5;
#pragma unroll
    for (int r = 0; r < R; ++r) v[r] = sm[first][r];
    for (int w = 1; w < (G >> 5); ++w)
#pragma unroll
      for (int r = 0; r < R; ++r) v[r] += sm[first + w][r];
  }
}

// VEC float32 parameters from p + i: 16-byte loads when aligned (vec4), else scalar ones.
template <int VEC>
__device__ __forceinline__ void rows_params(const float* p, int i, bool vec4, float* out) {
  if (vec4 && VEC % 4 == 0) {
#pragma unroll
    for (int j = 0; j < VEC; j += 4) {
      const float4 q = __ldg(reinterpret_cast<const float4*>(p + i + j));
      out[j] = q.x; out[j + 1] = q.y; out[j + 2] = q.z; out[j + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) out[j] = __ldg(p + i + j);
  }
}

// The floats of a fragment, unpacked again at each use (volatile: the compiler must not keep the
// unpacked copies of every row alive across the reductions, which spills; packed 16-bit data is half
// the registers).
template <class T, int VEC>
__device__ __forceinline__ void rows_get(const Frag<T, VEC>& f, float* a) {
  if constexpr (sizeof(T) == 4) {
    f.get(a);
  } else {
#pragma unroll
    for (int e = 0; e < VEC; e += 2) {
      float lo, hi;
      if constexpr (Same<T, bf16_t>::value)
        asm volatile("{ shl.b32 %0, %2, 16; and.b32 %1, %2, 0xffff0000; }" : "=f"(lo), "=f"(hi) : "r"(f.w[e / 2]));
      else
        asm volatile("{ .reg .b16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }"
                     : "=f"(lo), "=f"(hi) : "r"(f.w[e / 2]));
      a[e] = lo;
      a[e + 1] = hi;
    }
  }
}

// One-pass shifted statistics of R rows (see ONE below): the shift c is each row's first element, read
// once more by every thread (one scalar load per row, an L1 broadcast); S and Q of the R rows in one
// reduction of 2R floats. Dead rows (zero fragments, c = 0) give mean 0 and var 0, never stored.
template <class T, int VEC, int ITEMS, int R>
__device__ __forceinline__ void rows_stats_one(const Frag<T, VEC> (&v)[R][ITEMS], const T* x0, int sx, int live,
                                               int lane, int G, int nvec, float inv_len, float* mean, float* var,
                                               float (*sm)[2 * R]) {
  float c[R], sq[2 * R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    c[r] = r < live ? to_float(x0[r * sx]) : 0.0f;  // dead rows: zeroed fragments, c = 0
    sq[r] = sq[R + r] = 0.0f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      float a[VEC];
      rows_get<T, VEC>(v[r][k], a);
      if (lane + k * G < nvec)
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float d = a[j] - c[r];
          sq[r] += d;
          sq[R + r] = fmaf(d, d, sq[R + r]);
        }
    }
  }
  rows_sum<2 * R>(sq, G, sm);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float ms = sq[r] * inv_len;
    mean[r] = c[r] + ms;
    var[r] = fmaxf(fmaf(-ms, ms, sq[R + r] * inv_len), 0.0f);
  }
}

// ONE (layer norm, 16-bit data): one-pass statistics, ONE reduction of 2R floats per row group (one
// barrier instead of two): with c = the row's first element (the same for every thread of the row),
// d_i = x_i - c, S = sum d_i, Q = sum d_i^2: mean = c + S / n, var = Q / n - (S / n)^2.
// Error bound. For 16-bit data d_i is exact in fp32: x_i and c have at most 11 significant bits and
// exponents within fp32's range, so x_i - c needs at most 11 + (e_max - e_min) <= 24 bits unless the two
// differ by more than 2^13 in magnitude, when |d_i| ~ max(|x_i|, |c|) and the one rounding is relative
// 2^-24. S and Q are sums of m = ITEMS * VEC terms per thread, then log2(G) butterfly steps, then G / 32
// warp sums: |dQ| <= g Q, |dS| <= g sum |d_i| with g = (m + log2 G + G / 32) * 2^-24 (<= 43 * 2^-24 =
// 2.6e-6 at ITEMS 4, G 128). Since Q / n = var + (mean - c)^2 and (S / n)^2 = (mean - c)^2:
//   |d var| <= 3 g (var + (mean - c)^2) + 2^-24 var,
// i.e. relative to var: 3 g (1 + (x_0 - mean)^2 / var). The shift removes the mean's cancellation (a
// row of mean 1000 and std 1 costs nothing: (x_0 - mean)^2 / var is a few, as for mean 0); only the first
// element's own distance from the mean counts, in units of std (<= sqrt(n) in the worst case: one
// outlier in the first place; ~3 for any ordinary row: relative error ~1e-4 of var, 5e-5 of invstd, below
// a 16-bit output's half ulp of 2e-3 / 2.4e-4). For 16-bit data near a large mean the d_i are small
// multiples of the ulp and S, Q are usually exact (tests: mean 1000, std 1). fp32 data keep the two-pass
// statistics (ONE = false).
// Blocks of at most 1024 / R threads (ROWS_MAX_GROUP // R on the host): R > 1 gets 128 registers and more.
template <class T, int VEC, int ITEMS, int R, bool ONE, class Epi>
__device__ __forceinline__ void fwd_rows_body(const NormParams& p, const Epi& epi) {
  typedef Frag<T, VEC> F;
  constexpr bool PRE = R > 1;  // scale / bias held in registers across the R rows
  __shared__ __align__(16) float sm[2][32][ONE ? 2 * R : R];
  const int G = p.group, lane = threadIdx.x & (G - 1), sub = threadIdx.x / G;
  const int per_block = (int)(blockDim.x / G) * R;  // rows per block
  const int nvec = (int)p.len / VEC;
  const bool rms = p.flags & PYDNN_NORM_FLAG_RMS, blend = p.flags & PYDNN_FLAG_BETA;
  const bool stats = p.flags & PYDNN_NORM_FLAG_STATS, has_bias = p.bias != nullptr;
  const bool stream = p.flags & PYDNN_NORM_FLAG_STREAM;
  const float alpha = (float)p.alpha, beta = (float)p.beta, eps = (float)p.eps;
  const float inv_len = 1.0f / (float)p.len;
  const bool pvec = ((reinterpret_cast<unsigned long long>(p.scale) |
                      reinterpret_cast<unsigned long long>(p.bias)) & 15) == 0;
  const i64 sx = p.set_stride[0][0], sy = p.set_stride[1][0], ss = p.set_stride[3][0];
  const T* xb = (const T*)p.x;
  T* yb = (T*)p.out;

  float sc[PRE ? ITEMS : 1][VEC], bi[PRE ? ITEMS : 1][VEC];
  if constexpr (PRE) {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int vi = lane + k * G;
#pragma unroll
      for (int j = 0; j < VEC; ++j) sc[k][j] = bi[k][j] = 0.0f;
      if (vi < nvec) {
        rows_params<VEC>(p.scale, vi * VEC, pvec, sc[k]);
        if (has_bias) rows_params<VEC>(p.bias, vi * VEC, pvec, bi[k]);
      }
    }
  }

  {  // one-shot: a block's rows, then exit (the host keeps the grid within range)
    const i64 first = (i64)blockIdx.x * per_block + sub * R;
    const T* x0 = xb + first * sx;
    T* y0 = yb + first * sy;
    // p.pf (see l2_prefetch_line): the rows of block blockIdx.x + pf pulled into L2, each thread
    // prefetching the vectors it loads, pf blocks ahead (one 64-bit offset live: a separate sector loop
    // spilled 8-24 bytes at the 64-register cap)
    const i64 ahead = first + (i64)p.pf * per_block, pfd = (i64)p.pf * per_block * sx;
    F v[R][ITEMS];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const bool live = first + r < p.sets, pf = p.pf > 0 && ahead + r < p.sets;
      const T* x = x0 + r * (int)sx;  // R row strides fit in 32 bits (host check)
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        const int vi = lane + k * G;
        v[r][k].zero();
        if (live && vi < nvec) load_once<T, VEC>(v[r][k], x + vi * VEC);
        if (pf && vi < nvec) l2_prefetch_line(x + pfd + vi * VEC);
      }
    }
    // mean (RMS: mean of squares), then the centred second moment from the same registers
    float mean[R], var[R];
    bool done = false;
    if constexpr (ONE) {
      if (!rms) {
        const i64 left = p.sets - first;
        rows_stats_one<T, VEC, ITEMS, R>(v, x0, (int)sx, left < R ? (int)left : R, lane, G, nvec, inv_len, mean,
                                         var, reinterpret_cast<float(*)[2 * R]>(sm[0]));
        done = true;
      }
    }
    if (!done) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      mean[r] = 0.0f;
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        float a[VEC];
        rows_get<T, VEC>(v[r][k], a);
#pragma unroll
        for (int j = 0; j < VEC; ++j) mean[r] += rms ? a[j] * a[j] : a[j];
      }
    }
    rows_sum<R>(mean, G, reinterpret_cast<float(*)[R]>(sm[0]));
    if (rms) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        var[r] = mean[r] * inv_len;
        mean[r] = 0.0f;
      }
    } else {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        mean[r] /= (float)p.len;  // one rounding, not two (sum * (1/len)): a constant row's mean is exact, so its
        var[r] = 0.0f;            // variance is 0 (found by the centred-row tests: invstd off by 4e-5 at len 48)
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
          float a[VEC];
          rows_get<T, VEC>(v[r][k], a);
          if (lane + k * G < nvec)
#pragma unroll
            for (int j = 0; j < VEC; ++j) var[r] += (a[j] - mean[r]) * (a[j] - mean[r]);
        }
      }
      rows_sum<R>(var, G, reinterpret_cast<float(*)[R]>(sm[1]));
#pragma unroll
      for (int r = 0; r < R; ++r) var[r] *= inv_len;
    }
    }
    float inv[R];
#pragma unroll
    for (int r = 0; r < R; ++r) inv[r] = rsqrtf(var[r] + eps);
    if (stats && lane == 0)
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (first + r < p.sets) {
          if (p.mean) p.mean[(first + r) * ss] = mean[r];
          if (p.invstd) p.invstd[(first + r) * ss] = inv[r];
        }
    // y = alpha * ((x - mean) * invstd * scale + bias) + beta * y
    {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (first + r >= p.sets) continue;
        T* y = y0 + r * (int)sy;
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
          const int vi = lane + k * G;
          if (vi >= nvec) continue;
          float a[VEC], s_[VEC], b_[VEC];
          const float* scv = s_;
          const float* biv = b_;
          if constexpr (PRE) {
            scv = sc[k];
            biv = bi[k];
          } else {
#pragma unroll
            for (int j = 0; j < VEC; ++j) b_[j] = 0.0f;
            rows_params<VEC>(p.scale, vi * VEC, pvec, s_);
            if (has_bias) rows_params<VEC>(p.bias, vi * VEC, pvec, b_);
          }
          rows_get<T, VEC>(v[r][k], a);
#pragma unroll
          for (int j = 0; j < VEC; ++j) a[j] = (a[j] - mean[r]) * inv[r] * scv[j] + biv[j];
          epi.template run<VEC>(a, first + r, (i64)vi * VEC);
#pragma unroll
          for (int j = 0; j < VEC; ++j) a[j] *= alpha;
          if (blend) {
            F old;
            old.load(y + vi * VEC);
            float b[VEC];
            old.get(b);
#pragma unroll
            for (int j = 0; j < VEC; ++j) a[j] += beta * b[j];
          }
          F o;
          o.set(a);
          store_out<T, VEC>(o, y + vi * VEC, stream);
        }
      }
    }
  }
}

template <class T, int VEC, int ITEMS, int R, bool ONE>
__global__ void __launch_bounds__(1024 / R) fwd_rows(const NormParams p) {
  fwd_rows_body<T, VEC, ITEMS, R, ONE>(p, NoEpi{});
}

// fwd_persist: fwd_rows' per-row work for 16-bit layer / RMS rows in a persistent grid laid out as
// bwd_rows (group sub of block b walks rows b * spb + sub + t * step, step = grid * spb). Why: fwd_rows (4,
// 1, ONE) reads a thread's 32 floats of scale and 32 of bias from L1 after each row's reduction (16
// LDG.128, 32 KiB per 8 KiB row), and its loads are in flight only until the reduction; RMS (16 KiB of
// scale, no shift) is 8 points faster on the same code. Here scale / bias are loaded ONCE per thread into
// registers, and x of DEPTH rows sits in a register ring: while one row is reduced and written, the
// loads of the next DEPTH - 1 rows are in flight, and the freed slot is refilled at once. Statistics as
// fwd_rows: layer norm ONE (shift c = the row's first element, S and Q in one reduction of 2 floats, the
// error bound stated at fwd_rows, here with m = ITEMS * VEC terms per thread and G threads per row);
// RMS one sum of squares (reduced in the same 2-float call, the second float 0). One barrier per row
// (G > 32), two alternating shared arrays as bwd_rows. 16-bit only (fp32 rows already reach 91% of copy
// in fwd_rows). __launch_bounds__(512 / ITEMS, MINB): ITEMS 2 -> blocks up to 256 threads, ITEMS 4 -> 128;
// MINB blocks per SM set the register cap (65536 / (512 / ITEMS * MINB)).
template <class T, int VEC, int ITEMS, int DEPTH, int MINB>
__global__ void __launch_bounds__(512 / ITEMS, MINB) fwd_persist(const NormParams p) {
  static_assert(sizeof(T) == 2, "fwd_persist: 16-bit data only");
  typedef Frag<T, VEC> F;
  __shared__ __align__(16) float sm[2][32][2];
  const int G = p.group, lane = threadIdx.x & (G - 1), sub = threadIdx.x / G;
  const int spb = (int)(blockDim.x / G);
  const i64 step = (i64)gridDim.x * spb;
  const int nvec = (int)p.len / VEC;
  const bool rms = p.flags & PYDNN_NORM_FLAG_RMS, blend = p.flags & PYDNN_FLAG_BETA;
  const bool stats = p.flags & PYDNN_NORM_FLAG_STATS, stream = p.flags & PYDNN_NORM_FLAG_STREAM;
  const float alpha = (float)p.alpha, beta = (float)p.beta, eps = (float)p.eps;
  const float inv_len = 1.0f / (float)p.len;
  const bool pvec = ((reinterpret_cast<unsigned long long>(p.scale) |
                      reinterpret_cast<unsigned long long>(p.bias)) & 15) == 0;
  const i64 sx = p.set_stride[0][0], sy = p.set_stride[1][0], ss = p.set_stride[3][0];
  const T* xb = (const T*)p.x;
  T* yb = (T*)p.out;

  float sc[ITEMS][VEC], bi[ITEMS][VEC];  // this thread's parameters, the same in every row
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int vi = lane + k * G;
#pragma unroll
    for (int j = 0; j < VEC; ++j) sc[k][j] = bi[k][j] = 0.0f;
    if (vi < nvec) {
      rows_params<VEC>(p.scale, vi * VEC, pvec, sc[k]);
      if (p.bias) rows_params<VEC>(p.bias, vi * VEC, pvec, bi[k]);
    }
  }

  F bx[DEPTH][ITEMS];
  float bc[DEPTH];  // each ring row's shift (its first element; 0 for RMS and dead rows)
  auto issue = [&](int b, i64 row) {
    const bool live = row < p.sets;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int vi = lane + k * G;
      bx[b][k].zero();
      if (live && vi < nvec) load_once<T, VEC>(bx[b][k], xb + row * sx + vi * VEC);
    }
    bc[b] = (live && !rms) ? to_float(xb[row * sx]) : 0.0f;
  };

  const i64 first = (i64)blockIdx.x * spb;  // the block's first row; this group's is first + sub
#pragma unroll
  for (int b = 0; b < DEPTH; ++b) issue(b, first + sub + b * step);
  int it = 0;
  for (i64 base = first; base < p.sets; base += DEPTH * step) {  // uniform over the block: every barrier
#pragma unroll
    for (int b = 0; b < DEPTH; ++b) {
      const i64 row = base + sub + b * step;
      const float c = bc[b];
      float r[2] = {0.0f, 0.0f};
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        float a[VEC];
        rows_get<T, VEC>(bx[b][k], a);
        if (lane + k * G < nvec)  // (a dead lane's zeros minus c would count)
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            const float d = a[j] - c;
            r[0] += rms ? 0.0f : d;
            r[1] = fmaf(d, d, r[1]);
          }
      }
      rows_sum<2>(r, G, sm[it & 1]);
      ++it;
      float mean = 0.0f, var;
      if (rms) {
        var = r[1] * inv_len;
      } else {
        const float ms = r[0] * inv_len;
        mean = c + ms;
        var = fmaxf(fmaf(-ms, ms, r[1] * inv_len), 0.0f);
      }
      const float inv = rsqrtf(var + eps);
      if (row < p.sets) {
        if (stats && lane == 0) {
          if (p.mean) p.mean[row * ss] = mean;
          if (p.invstd) p.invstd[row * ss] = inv;
        }
        T* y = yb + row * sy;
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
          const int vi = lane + k * G;
          if (vi >= nvec) continue;
          float a[VEC];
          rows_get<T, VEC>(bx[b][k], a);
#pragma unroll
          for (int j = 0; j < VEC; ++j) a[j] = alpha * ((a[j] - mean) * inv * sc[k][j] + bi[k][j]);
          if (blend) {
            F old;
            old.load(y + vi * VEC);
            float o[VEC];
            old.get(o);
#pragma unroll
            for (int j = 0; j < VEC; ++j) a[j] += beta * o[j];
          }
          F o;
          o.set(a);
          store_out<T, VEC>(o, y + vi * VEC, stream);
        }
      }
      issue(b, row + DEPTH * step);
    }
  }
}

// ------------------------------------------------------------------ backward, rows (layer / RMS norm)

// The backward of contiguous rows without activation (fwd_rows' layouts; dy and dx with their own row
// strides): a persistent grid, G threads per row (spb = blockDim / G groups per block), a group walking
// the rows first, first + step, ... (step = gridDim * spb). x and dy of DEPTH rows sit in registers: the
// loads of rows i + 1 .. i + DEPTH - 1 are in flight while row i is reduced and written, and row
// i + DEPTH is issued into row i's registers as soon as they are free (a register ring, no shared
// memory staging, no cp.async). Per row: xhat = (x - mean) * invstd, g = dy * scale, ONE reduction of
// (sum g, sum g * xhat) (one barrier when G > 32; two alternating shared arrays, so the next row's
// writes never meet this one's reads), dx = alpha * invstd * (g - sum g / n - xhat * sum (g xhat) / n)
// (RMS: no sum g term) + beta * dx. scale stays in registers, and dscale / dbias (sum dy * xhat, sum dy)
// are summed in registers over the group's rows and written once to the group's workspace slot
// (blockIdx * spb + sub) for `finish`. The block's loop is uniform (rows past the end are dead: zeroed
// fragments that add nothing), so every thread takes every barrier.
// __launch_bounds__(512 / ITEMS, 2): ITEMS 1 -> blocks up to 512 threads at 64 registers, ITEMS 2 -> 256
// at 128 (ROWS_BWD_* in pydnn/ops/normalization.py).
// Vector vi of a row's dx (o: the row) from x (a), dy (d) and the row's sums: alpha * invstd * (g - m1 - xhat *
// m2) (+ beta * the old dx) (bwd_rows; bwd_split_dx in normalization_rowx.cu). a and d are overwritten.
template <class T, int VEC>
__device__ __forceinline__ void rows_dx(T* o, int vi, float* a, float* d, const float* sc, float ai, float m1,
                                        float mean, float inv, float m2, bool blend, float beta) {
  typedef Frag<T, VEC> F;
#pragma unroll
  for (int j = 0; j < VEC; ++j) a[j] = ai * (d[j] * sc[j] - m1 - (a[j] - mean) * inv * m2);
  if (blend) {
    F old;
    old.load(o + vi * VEC);
    old.get(d);
#pragma unroll
    for (int j = 0; j < VEC; ++j) a[j] += beta * d[j];
  }
  F out;
  out.set(a);
  out.store(o + vi * VEC);
}

template <class T, int VEC, int ITEMS, int DEPTH>
__global__ void __launch_bounds__(512 / ITEMS, 2) bwd_rows(const NormParams p) {
  typedef Frag<T, VEC> F;
  __shared__ __align__(16) float sm[2][32][2];
  const int G = p.group, lane = threadIdx.x & (G - 1), sub = threadIdx.x / G;
  const int spb = (int)(blockDim.x / G);
  const i64 step = (i64)gridDim.x * spb;
  const int nvec = (int)p.len / VEC;
  const i64 np = p.nparams;
  const bool rms = p.flags & PYDNN_NORM_FLAG_RMS, blend = p.flags & PYDNN_FLAG_BETA;
  const float alpha = (float)p.alpha, beta = (float)p.beta;
  const float inv_len = 1.0f / (float)p.len;
  const bool pvec = (reinterpret_cast<unsigned long long>(p.scale) & 15) == 0;
  const i64 sx = p.set_stride[0][0], so = p.set_stride[1][0], sd = p.set_stride[2][0], ss = p.set_stride[3][0];
  const T* xb = (const T*)p.x;
  const T* db = (const T*)p.dy;
  T* ob = (T*)p.out;

  float sc[ITEMS][VEC], acc_s[ITEMS][VEC], acc_b[ITEMS][VEC];
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) sc[k][j] = acc_s[k][j] = acc_b[k][j] = 0.0f;
    if (lane + k * G < nvec) rows_params<VEC>(p.scale, (lane + k * G) * VEC, pvec, sc[k]);
  }

  F bx[DEPTH][ITEMS], bd[DEPTH][ITEMS];
  float bm[DEPTH], bi[DEPTH];
  // row -> ring slot b: its x, dy, mean and invstd loads issued (dead rows: zeros)
  auto issue = [&](int b, i64 row) {
    const bool live = row < p.sets;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int vi = lane + k * G;
      bx[b][k].zero();
      bd[b][k].zero();
      if (live && vi < nvec) {
        load_once<T, VEC>(bx[b][k], xb + row * sx + vi * VEC);
        load_once<T, VEC>(bd[b][k], db + row * sd + vi * VEC);
      }
    }
    bm[b] = (live && !rms) ? p.mean[row * ss] : 0.0f;
    bi[b] = live ? p.invstd[row * ss] : 0.0f;
  };

  const i64 first = (i64)blockIdx.x * spb;  // the block's first row; this group's is first + sub
#pragma unroll
  for (int b = 0; b < DEPTH; ++b) issue(b, first + sub + b * step);
  int it = 0;
  for (i64 base = first; base < p.sets; base += DEPTH * step) {
#pragma unroll
    for (int b = 0; b < DEPTH; ++b) {
      const i64 row = base + sub + b * step;
      const float mean = bm[b], inv = bi[b];
      float r[2] = {0.0f, 0.0f};
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        float a[VEC], d[VEC];
        rows_get<T, VEC>(bx[b][k], a);
        rows_get<T, VEC>(bd[b][k], d);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {  // dead rows and lanes: zeros (inv = 0), they add nothing
          const float xh = (a[j] - mean) * inv, g = d[j] * sc[k][j];
          r[0] += g;
          r[1] = fmaf(g, xh, r[1]);
          acc_s[k][j] = fmaf(d[j], xh, acc_s[k][j]);
          acc_b[k][j] += d[j];
        }
      }
      rows_sum<2>(r, G, sm[it & 1]);
      ++it;
      const float m1 = rms ? 0.0f : r[0] * inv_len, m2 = r[1] * inv_len, ai = alpha * inv;
      if (row < p.sets) {
        T* o = ob + row * so;
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
          const int vi = lane + k * G;
          if (vi >= nvec) continue;
          float a[VEC], d[VEC];
          rows_get<T, VEC>(bx[b][k], a);
          rows_get<T, VEC>(bd[b][k], d);
          rows_dx<T, VEC>(o, vi, a, d, sc[k], ai, m1, mean, inv, m2, blend, beta);
        }
      }
      issue(b, row + DEPTH * step);
    }
  }
  float* ws_s = p.ws + ((i64)blockIdx.x * spb + sub) * 2 * np;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int vi = lane + k * G;
    if (vi < nvec)
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        ws_s[vi * VEC + j] = acc_s[k][j];
        ws_s[np + vi * VEC + j] = acc_b[k][j];
      }
  }
}

// ------------------------------------------------------------------ backward (fast)

// Parameter partials (dscale, dbias), by the host's choice (flags):
//   PREG   the parameter of each (thread, item, lane) is the same in every set and no two threads of a
//          slot share one (layer / RMS norm): sums in registers across the sets, one write per slot.
//   PLANE  every item of a thread has the same VEC parameters (NHWC groups): summed over items, then
//          over the lanes that share them, then one shared-memory atomic per parameter and warp.
//   else   shared-memory atomics per run of equal parameters (NCHW groups: a run is a vector).
// Without PREG the block's shared array [2][nparams] is written to its slot at the end.
template <class T, int VEC, int ITEMS, int CL, bool PREG>
__device__ __forceinline__ void bwd_body(const NormParams& p) {
  typedef Frag<T, VEC> F;
  constexpr bool FAST = sizeof(T) == 2;
  __shared__ R3 sm[2][32];
  __shared__ R3 slot[2];
  extern __shared__ float psm[];  // [2][nparams] unless PREG
  const Pos<CL> ps(p);
  const Geo g(p);
  const unsigned nvec = (unsigned)p.len / VEC;
  const bool rms = p.flags & PYDNN_NORM_FLAG_RMS, blend = p.flags & PYDNN_FLAG_BETA;
  const bool plane = !PREG && (p.flags & PYDNN_NORM_FLAG_PLANE);
  const float alpha = (float)p.alpha, beta = (float)p.beta;
  const float c1 = (float)p.coef, c2 = (float)p.coef2;
  const float inv_len = 1.0f / (float)p.len;
  const i64 np = p.nparams;
  const T* xb = (const T*)p.x;
  const T* dyb = (const T*)p.dy;
  T* dxb = (T*)p.out;
  float acc_s[ITEMS][VEC], acc_b[ITEMS][VEC];
#pragma unroll
  for (int k = 0; k < ITEMS; ++k)
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc_s[k][j] = acc_b[k][j] = 0.0f;
  if (!PREG) {
    for (i64 q = threadIdx.x; q < 2 * np; q += blockDim.x) psm[q] = 0.0f;
    __syncthreads();
  }
  int it = 0;
  for (i64 first = ps.first; first < p.sets; first += ps.step, ++it) {
    const i64 s = first + ps.sub;
    const bool live = s < p.sets;
    i64 off[4], pbase;
    set_base(p, live ? s : first, off, pbase);
    const float mean = (live && !rms) ? p.mean[off[3]] : 0.0f;
    const float inv = live ? p.invstd[off[3]] : 0.0f;
    F vx[ITEMS], vd[ITEMS];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const unsigned vi = ps.lane + k * ps.G;
      vx[k].zero();
      vd[k].zero();
      if (live && vi < nvec) {
        unsigned o, i;
        g.split(vi * VEC, o, i);
        vx[k].load(xb + off[0] + o * g.os[0] + i);
        vd[k].load(dyb + off[2] + o * g.os[2] + i);
      }
    }
    R3 r;
    r.a = r.b = r.c = 0.0f;
    float ls[VEC], lb[VEC];  // PLANE: this thread's sums over its items
#pragma unroll
    for (int j = 0; j < VEC; ++j) ls[j] = lb[j] = 0.0f;
    i64 run_p = -1;
    float run_s = 0.0f, run_b = 0.0f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const unsigned vi = ps.lane + k * ps.G;
      if (live && vi < nvec) {
        unsigned o, i;
        g.split(vi * VEC, o, i);
        const i64 pidx = pbase + o * g.po + i * g.pi;
        float a[VEC], d[VEC], sc[VEC], bi[VEC];
        vx[k].get(a);
        vd[k].get(d);
        load_params<VEC>(p.scale, pidx, g.pi, sc);
        if (p.act && p.bias) load_params<VEC>(p.bias, pidx, g.pi, bi);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float xh = (a[j] - mean) * inv;
          float dz = d[j];
          if (p.act) dz *= act_d<FAST>(p.act, xh * sc[j] + (p.bias ? bi[j] : 0.0f), c1, c2);
          const float dxh = dz * sc[j];
          r.a += dxh;
          r.b += dxh * xh;
          if constexpr (PREG) {
            acc_s[k][j] += dz * xh;
            acc_b[k][j] += dz;
          } else if (plane) {
            ls[j] += dz * xh;
            lb[j] += dz;
          } else {
            const i64 q = pidx + j * g.pi;
            if (q != run_p) {
              if (run_p >= 0) {
                add_run(psm + run_p, run_s);
                add_run(psm + np + run_p, run_b);
              }
              run_p = q;
              run_s = run_b = 0.0f;
            }
            run_s += dz * xh;
            run_b += dz;
          }
        }
      }
    }
    if (run_p >= 0) {
      add_run(psm + run_p, run_s);
      add_run(psm + np + run_p, run_b);
    }
    if (plane) {
      // lanes lane ^ m (m a multiple of I / VEC) hold the same parameters
      const int q = (int)(g.I / VEC), W = ps.G < 32 ? ps.G : 32;
      for (int m = q; m < W; m <<= 1)
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          ls[j] += __shfl_xor_sync(0xffffffffu, ls[j], m);
          lb[j] += __shfl_xor_sync(0xffffffffu, lb[j], m);
        }
      if (live && (ps.lane & 31) < q && (unsigned)ps.lane < nvec) {
        unsigned o, i;
        g.split(ps.lane * VEC, o, i);
        const i64 pidx = pbase + i;  // PLANE: pi == 1, po == 0
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          atomicAdd(psm + pidx + j, ls[j]);
          atomicAdd(psm + np + pidx + j, lb[j]);
        }
      }
    }
    r = set_reduce<CL>(r, false, ps.G, sm[it & 1], &slot[it & 1]);
    const float m1 = rms ? 0.0f : r.a * inv_len, m2 = r.b * inv_len;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const unsigned vi = ps.lane + k * ps.G;
      if (live && vi < nvec) {
        unsigned o, i;
        g.split(vi * VEC, o, i);
        const i64 pidx = pbase + o * g.po + i * g.pi;
        float a[VEC], d[VEC], sc[VEC], bi[VEC];
        vx[k].get(a);
        vd[k].get(d);
        load_params<VEC>(p.scale, pidx, g.pi, sc);
        if (p.act && p.bias) load_params<VEC>(p.bias, pidx, g.pi, bi);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float xh = (a[j] - mean) * inv;
          float dz = d[j];
          if (p.act) dz *= act_d<FAST>(p.act, xh * sc[j] + (p.bias ? bi[j] : 0.0f), c1, c2);
          a[j] = alpha * inv * (dz * sc[j] - m1 - xh * m2);
        }
        T* dst = dxb + off[1] + o * g.os[1] + i;
        if (blend) {
          F old;
          old.load(dst);
          old.get(d);
#pragma unroll
          for (int j = 0; j < VEC; ++j) a[j] += beta * d[j];
        }
        vx[k].set(a);
        vx[k].store(dst);
      }
    }
  }
  // this slot's partials
  float* ws_s;
  if constexpr (PREG) {
    const i64 slot_id = CL == 1 ? (i64)blockIdx.x * ps.spb + ps.sub : (i64)(blockIdx.x / CL);
    ws_s = p.ws + slot_id * 2 * np;
    const bool owner = CL > 1 || ps.sub < ps.spb;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const unsigned vi = ps.lane + k * ps.G;
      if (owner && vi < nvec) {
        // PREG: the parameter index is the element index
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          ws_s[vi * VEC + j] = acc_s[k][j];
          ws_s[np + vi * VEC + j] = acc_b[k][j];
        }
      }
    }
  } else {
    __syncthreads();
    ws_s = p.ws + (i64)blockIdx.x * 2 * np;
    for (i64 q = threadIdx.x; q < 2 * np; q += blockDim.x) ws_s[q] = psm[q];
  }
  if (CL > 1) cluster_sync();
}

template <class T, int VEC, int ITEMS, bool PREG>
__global__ void __launch_bounds__(512) bwd(const NormParams p) { bwd_body<T, VEC, ITEMS, 1, PREG>(p); }

#if __CUDA_ARCH__ >= 900
template <class T, int VEC, int ITEMS, bool PREG>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(512) bwd_cluster(const NormParams p) {
  bwd_body<T, VEC, ITEMS, kCluster, PREG>(p);
}
#else
template <class T, int VEC, int ITEMS, bool PREG>
__global__ void bwd_cluster(const NormParams) { __trap(); }
#endif

// ------------------------------------------------------------------ staged (pipelined) fast kernels

// The 16-byte-vector launches of fwd / bwd as persistent kernels with a two-stage cp.async pipeline: while
// a block works on one set (statistics, reduction, output), the copies of its next set are already in
// flight into the other shared-memory stage. The register-tile kernels above keep loads in flight only
// until a set's reduction starts: on rows of 4096 bf16 the staged backward is 1.6x theirs (44% vs 28% of
// copy on the H200), while the staged forward measured no better (the forward is bound by its per-set
// fixed cost, not by latency), so the host uses fwd_staged only when told to (STAGED_FWD). Each
// thread copies, and later reads, only its own 16-byte slots, so the stages need no barrier; stage
// layout [stage][operand][item][thread] keeps a warp's slots consecutive (no bank conflicts).

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  unsigned a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}
// 16 bytes global -> shared, asynchronously; pred false: zero-filled, nothing read.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_u32(dst)), "l"(src), "r"(pred ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Where a block's (or cluster's) sets are, for the pipeline: set_base of `first + sub`.
struct SetAt {
  i64 off[4], pbase;
  bool live;
  __device__ __forceinline__ void at(const NormParams& p, i64 first, int sub) {
    const i64 s = first + sub;
    live = s < p.sets;
    set_base(p, live ? s : 0, off, pbase);
  }
};

// Issue the copies of one set's vectors of NOPS operands (x; x and dy) into stage `buf`.
template <class T, int VEC, int ITEMS, int NOPS, int CL>
__device__ __forceinline__ void stage_issue(const NormParams& p, const Pos<CL>& ps, const Geo& g, const SetAt& at,
                                            unsigned nvec, U4* stage, int buf) {
  const T* src[2] = {(const T*)p.x, (const T*)p.dy};
  const int opnd[2] = {0, 2};
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const unsigned vi = ps.lane + k * ps.G;
    const bool pred = at.live && vi < nvec;
    unsigned o = 0, i = 0;
    if (pred) g.split(vi * VEC, o, i);
#pragma unroll
    for (int q = 0; q < NOPS; ++q) {
      const T* a = pred ? src[q] + at.off[opnd[q]] + o * g.os[opnd[q]] + i : src[q];
      cp_async16(stage + ((buf * NOPS + q) * ITEMS + k) * blockDim.x + threadIdx.x, a, pred);
    }
  }
  cp_async_commit();
}

template <class T, int VEC, int ITEMS, int CL>
__device__ __forceinline__ void fwd_staged_body(const NormParams& p) {
  static_assert(VEC * sizeof(T) == 16, "16-byte vectors");
  typedef Frag<T, VEC> F;
  constexpr bool FAST = sizeof(T) == 2;
  __shared__ R3 sm[2][32];
  __shared__ R3 slot[2];
  extern __shared__ U4 stage[];  // [2][1][ITEMS][blockDim]
  const Pos<CL> ps(p);
  const Geo g(p);
  const unsigned nvec = (unsigned)p.len / VEC;
  const bool rms = p.flags & PYDNN_NORM_FLAG_RMS, blend = p.flags & PYDNN_FLAG_BETA;
  const bool has_bias = p.bias != nullptr;
  const float alpha = (float)p.alpha, beta = (float)p.beta, eps = (float)p.eps;
  const float c1 = (float)p.coef, c2 = (float)p.coef2;
  const float inv_len = 1.0f / (float)p.len;
  T* yb = (T*)p.out;
  SetAt cur, nxt;
  cur.at(p, ps.first, ps.sub);
  stage_issue<T, VEC, ITEMS, 1, CL>(p, ps, g, cur, nvec, stage, 0);
  int it = 0;
  for (i64 first = ps.first; first < p.sets; first += ps.step, ++it) {
    const int buf = it & 1;
    nxt.at(p, first + ps.step, ps.sub);
    stage_issue<T, VEC, ITEMS, 1, CL>(p, ps, g, nxt, nvec, stage, buf ^ 1);
    cp_async_wait<1>();
    const U4* st = stage + buf * ITEMS * blockDim.x + threadIdx.x;
    R3 r;
    r.a = r.b = r.c = 0.0f;
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      F v;
      const U4 q = st[k * blockDim.x];
      v.w[0] = q.x; v.w[1] = q.y; v.w[2] = q.z; v.w[3] = q.w;
      float a[VEC];
      v.get(a);
      if (cur.live && ps.lane + k * ps.G < nvec) r.a += VEC;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        sum += a[j];
        r.c += a[j] * a[j];  // zero-filled slots add nothing
      }
    }
    if (!rms) {
      r.b = r.a > 0.0f ? sum / r.a : 0.0f;
      r.c = 0.0f;
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        if (cur.live && ps.lane + k * ps.G < nvec) {
          F v;
          const U4 q = st[k * blockDim.x];
          v.w[0] = q.x; v.w[1] = q.y; v.w[2] = q.z; v.w[3] = q.w;
          float a[VEC];
          v.get(a);
#pragma unroll
          for (int j = 0; j < VEC; ++j) r.c += (a[j] - r.b) * (a[j] - r.b);
        }
      }
    }
    r = set_reduce<CL>(r, !rms, ps.G, sm[it & 1], &slot[it & 1]);
    const float mean = rms ? 0.0f : r.b;
    const float inv = 1.0f / sqrtf(fmaxf(r.c * inv_len, 0.0f) + eps);
    if (cur.live && ps.lane == 0 && (p.flags & PYDNN_NORM_FLAG_STATS)) {
      if (p.mean) p.mean[cur.off[3]] = mean;
      if (p.invstd) p.invstd[cur.off[3]] = inv;
    }
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const unsigned vi = ps.lane + k * ps.G;
      if (cur.live && vi < nvec) {
        unsigned o, i;
        g.split(vi * VEC, o, i);
        const i64 pidx = cur.pbase + o * g.po + i * g.pi;
        F v;
        const U4 q = st[k * blockDim.x];
        v.w[0] = q.x; v.w[1] = q.y; v.w[2] = q.z; v.w[3] = q.w;
        float a[VEC], sc[VEC], bi[VEC];
        v.get(a);
        load_params<VEC>(p.scale, pidx, g.pi, sc);
        if (has_bias) load_params<VEC>(p.bias, pidx, g.pi, bi);
        else
#pragma unroll
          for (int j = 0; j < VEC; ++j) bi[j] = 0.0f;
#pragma unroll
        for (int j = 0; j < VEC; ++j) a[j] = (a[j] - mean) * (inv * sc[j]) + bi[j];
        if (p.act)
#pragma unroll
          for (int j = 0; j < VEC; ++j) a[j] = act_f<FAST>(p.act, a[j], c1, c2);
#pragma unroll
        for (int j = 0; j < VEC; ++j) a[j] *= alpha;
        T* dst = yb + cur.off[1] + o * g.os[1] + i;
        if (blend) {
          F old;
          old.load(dst);
          float b[VEC];
          old.get(b);
#pragma unroll
          for (int j = 0; j < VEC; ++j) a[j] += beta * b[j];
        }
        v.set(a);
        v.store(dst);
      }
    }
    cur = nxt;
  }
  cp_async_wait<0>();
  if (CL > 1) cluster_sync();
}

template <class T, int VEC, int ITEMS>
__global__ void __launch_bounds__(1024) fwd_staged(const NormParams p) { fwd_staged_body<T, VEC, ITEMS, 1>(p); }

#if __CUDA_ARCH__ >= 900
template <class T, int VEC, int ITEMS>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(1024) fwd_staged_cluster(const NormParams p) {
  fwd_staged_body<T, VEC, ITEMS, kCluster>(p);
}
#else
template <class T, int VEC, int ITEMS>
__global__ void fwd_staged_cluster(const NormParams) { __trap(); }
#endif

// Backward, staged: x and dy of the next set in flight while this one is summed, reduced and written.
// Parameter partials as bwd_body (PREG in registers, PLANE, or runs of shared-memory atomics into the
// dynamic array psm, which then precedes the stages). Blocks of at most kStagedBwdThreads threads.
constexpr int kStagedBwdThreads = 256;
constexpr int kStagedBwdMinBlocks = 2;

template <class T, int VEC, int ITEMS, int CL, bool PREG>
__device__ __forceinline__ void bwd_staged_body(const NormParams& p) {
  static_assert(VEC * sizeof(T) == 16, "16-byte vectors");
  typedef Frag<T, VEC> F;
  constexpr bool FAST = sizeof(T) == 2;
  __shared__ R3 sm[2][32];
  __shared__ R3 slot[2];
  extern __shared__ U4 dyn[];
  const i64 np = p.nparams;
  float* psm = reinterpret_cast<float*>(dyn);  // [2][nparams] unless PREG
  U4* stage = dyn + (PREG ? 0 : (2 * np * 4 + 15) / 16);  // [2][2][ITEMS][blockDim]
  const Pos<CL> ps(p);
  const Geo g(p);
  const unsigned nvec = (unsigned)p.len / VEC;
  const bool rms = p.flags & PYDNN_NORM_FLAG_RMS, blend = p.flags & PYDNN_FLAG_BETA;
  const bool plane = !PREG && (p.flags & PYDNN_NORM_FLAG_PLANE);
  const bool act_bias = p.act && p.bias;
  const float alpha = (float)p.alpha, beta = (float)p.beta;
  const float c1 = (float)p.coef, c2 = (float)p.coef2;
  const float inv_len = 1.0f / (float)p.len;
  T* dxb = (T*)p.out;
  float acc_s[ITEMS][VEC], acc_b[ITEMS][VEC];
#pragma unroll
  for (int k = 0; k < ITEMS; ++k)
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc_s[k][j] = acc_b[k][j] = 0.0f;
  if (!PREG) {
    for (i64 q = threadIdx.x; q < 2 * np; q += blockDim.x) psm[q] = 0.0f;
    __syncthreads();
  }
  SetAt cur, nxt;
  cur.at(p, ps.first, ps.sub);
  stage_issue<T, VEC, ITEMS, 2, CL>(p, ps, g, cur, nvec, stage, 0);
  int it = 0;
  for (i64 first = ps.first; first < p.sets; first += ps.step, ++it) {
    const int buf = it & 1;
    nxt.at(p, first + ps.step, ps.sub);
    stage_issue<T, VEC, ITEMS, 2, CL>(p, ps, g, nxt, nvec, stage, buf ^ 1);
    const float mean = (cur.live && !rms) ? p.mean[cur.off[3]] : 0.0f;
    const float inv = cur.live ? p.invstd[cur.off[3]] : 0.0f;
    cp_async_wait<1>();
    const U4* sx = stage + (buf * 2 * ITEMS) * blockDim.x + threadIdx.x;
    const U4* sd = sx + ITEMS * blockDim.x;
    R3 r;
    r.a = r.b = r.c = 0.0f;
    float ls[VEC], lb[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) ls[j] = lb[j] = 0.0f;
    i64 run_p = -1;
    float run_s = 0.0f, run_b = 0.0f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const unsigned vi = ps.lane + k * ps.G;
      if (cur.live && vi < nvec) {
        unsigned o, i;
        g.split(vi * VEC, o, i);
        const i64 pidx = cur.pbase + o * g.po + i * g.pi;
        F vx, vd;
        U4 q = sx[k * blockDim.x];
        vx.w[0] = q.x; vx.w[1] = q.y; vx.w[2] = q.z; vx.w[3] = q.w;
        q = sd[k * blockDim.x];
        vd.w[0] = q.x; vd.w[1] = q.y; vd.w[2] = q.z; vd.w[3] = q.w;
        float a[VEC], d[VEC], sc[VEC];
        vx.get(a);
        vd.get(d);
        load_params<VEC>(p.scale, pidx, g.pi, sc);
#pragma unroll
        for (int j = 0; j < VEC; ++j) a[j] = (a[j] - mean) * inv;  // xhat
        if (p.act) {
          float bi[VEC];
          if (act_bias) load_params<VEC>(p.bias, pidx, g.pi, bi);
#pragma unroll
          for (int j = 0; j < VEC; ++j) d[j] *= act_d<FAST>(p.act, a[j] * sc[j] + (act_bias ? bi[j] : 0.0f), c1, c2);
        }
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float dxh = d[j] * sc[j];
          r.a += dxh;
          r.b += dxh * a[j];
          if constexpr (PREG) {
            acc_s[k][j] += d[j] * a[j];
            acc_b[k][j] += d[j];
          } else if (plane) {
            ls[j] += d[j] * a[j];
            lb[j] += d[j];
          } else {
            const i64 qq = pidx + j * g.pi;
            if (qq != run_p) {
              if (run_p >= 0) {
                add_run(psm + run_p, run_s);
                add_run(psm + np + run_p, run_b);
              }
              run_p = qq;
              run_s = run_b = 0.0f;
            }
            run_s += d[j] * a[j];
            run_b += d[j];
          }
        }
      }
    }
    if (run_p >= 0) {
      add_run(psm + run_p, run_s);
      add_run(psm + np + run_p, run_b);
    }
    if (plane) {
      const int q = (int)(g.I / VEC), W = ps.G < 32 ? ps.G : 32;
      for (int m = q; m < W; m <<= 1)
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          ls[j] += __shfl_xor_sync(0xffffffffu, ls[j], m);
          lb[j] += __shfl_xor_sync(0xffffffffu, lb[j], m);
        }
      if (cur.live && (ps.lane & 31) < q && (unsigned)ps.lane < nvec) {
        unsigned o, i;
        g.split(ps.lane * VEC, o, i);
        const i64 pidx = cur.pbase + i;
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          atomicAdd(psm + pidx + j, ls[j]);
          atomicAdd(psm + np + pidx + j, lb[j]);
        }
      }
    }
    r = set_reduce<CL>(r, false, ps.G, sm[it & 1], &slot[it & 1]);
    const float m1 = rms ? 0.0f : r.a * inv_len, m2 = r.b * inv_len;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const unsigned vi = ps.lane + k * ps.G;
      if (cur.live && vi < nvec) {
        unsigned o, i;
        g.split(vi * VEC, o, i);
        const i64 pidx = cur.pbase + o * g.po + i * g.pi;
        F vx, vd;
        U4 q = sx[k * blockDim.x];
        vx.w[0] = q.x; vx.w[1] = q.y; vx.w[2] = q.z; vx.w[3] = q.w;
        q = sd[k * blockDim.x];
        vd.w[0] = q.x; vd.w[1] = q.y; vd.w[2] = q.z; vd.w[3] = q.w;
        float a[VEC], d[VEC], sc[VEC];
        vx.get(a);
        vd.get(d);
        load_params<VEC>(p.scale, pidx, g.pi, sc);
#pragma unroll
        for (int j = 0; j < VEC; ++j) a[j] = (a[j] - mean) * inv;
        if (p.act) {
          float bi[VEC];
          if (act_bias) load_params<VEC>(p.bias, pidx, g.pi, bi);
#pragma unroll
          for (int j = 0; j < VEC; ++j) d[j] *= act_d<FAST>(p.act, a[j] * sc[j] + (act_bias ? bi[j] : 0.0f), c1, c2);
        }
#pragma unroll
        for (int j = 0; j < VEC; ++j) a[j] = alpha * inv * (d[j] * sc[j] - m1 - a[j] * m2);
        T* dst = dxb + cur.off[1] + o * g.os[1] + i;
        if (blend) {
          F old;
          old.load(dst);
          old.get(d);
#pragma unroll
          for (int j = 0; j < VEC; ++j) a[j] += beta * d[j];
        }
        vx.set(a);
        vx.store(dst);
      }
    }
    cur = nxt;
  }
  cp_async_wait<0>();
  float* ws_s;
  if constexpr (PREG) {
    const i64 slot_id = CL == 1 ? (i64)blockIdx.x * ps.spb + ps.sub : (i64)(blockIdx.x / CL);
    ws_s = p.ws + slot_id * 2 * np;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const unsigned vi = ps.lane + k * ps.G;
      if (vi < nvec) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          ws_s[vi * VEC + j] = acc_s[k][j];
          ws_s[np + vi * VEC + j] = acc_b[k][j];
        }
      }
    }
  } else {
    __syncthreads();
    ws_s = p.ws + (i64)blockIdx.x * 2 * np;
    for (i64 q = threadIdx.x; q < 2 * np; q += blockDim.x) ws_s[q] = psm[q];
  }
  if (CL > 1) cluster_sync();
}

template <class T, int VEC, int ITEMS, bool PREG>
__global__ void __launch_bounds__(kStagedBwdThreads, kStagedBwdMinBlocks) bwd_staged(const NormParams p) {
  bwd_staged_body<T, VEC, ITEMS, 1, PREG>(p);
}

#if __CUDA_ARCH__ >= 900
template <class T, int VEC, int ITEMS, bool PREG>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kStagedBwdThreads, kStagedBwdMinBlocks)
    bwd_staged_cluster(const NormParams p) {
  bwd_staged_body<T, VEC, ITEMS, kCluster, PREG>(p);
}
#else
template <class T, int VEC, int ITEMS, bool PREG>
__global__ void bwd_staged_cluster(const NormParams) { __trap(); }
#endif

// ------------------------------------------------------------------ finish (backward parameters)

// dscale[q] = alpha2 * sum over slots of ws[slot][0][q] + beta2 * dscale[q]; dbias likewise from
// ws[slot][1][q]. Block (32, FY): 32 parameters, FY interleaved slot groups summed in a fixed order.
// (FX, FY) = (32, 32) has 4x the loads in flight of (32, 8) (one block per 32 parameters is only 128
// blocks at 4096 parameters, one per SM, and each thread's slot loop is a chain of L2 round trips), and
// the loop is unrolled by 4 so that four slots' loads are issued together: +1.5-1.7 points of copy on the
// LN / RMS backward over (32, 8) (H200); (8, 128), 4x the blocks again, was no better.
template <int FX, int FY>
__global__ void __launch_bounds__(FX * FY) finish(const NormParams p) {
  __shared__ float part[2][FY][FX + 1];
  const i64 np = p.nparams;
  const bool blend = p.flags & PYDNN_NORM_FLAG_BETA2;
  const float alpha = (float)p.alpha2, beta = (float)p.beta2;
  for (i64 q0 = (i64)blockIdx.x * FX; q0 < np; q0 += (i64)gridDim.x * FX) {
    const i64 q = q0 + threadIdx.x;
    float s = 0.0f, b = 0.0f;
    if (q < np)
#pragma unroll 4
      for (i64 sl = threadIdx.y; sl < p.slots; sl += FY) {
        s += p.ws[sl * 2 * np + q];
        b += p.ws[sl * 2 * np + np + q];
      }
    part[0][threadIdx.y][threadIdx.x] = s;
    part[1][threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y < 2 && q < np) {
      float t = 0.0f;
      for (int y = 0; y < FY; ++y) t += part[threadIdx.y][y][threadIdx.x];
      float* dst = threadIdx.y == 0 ? p.dscale : p.dbias;
      if (dst) {
        float r = alpha * t;
        if (blend) r += beta * dst[q];
        dst[q] = r;
      }
    }
    __syncthreads();
  }
}

// ws[0 .. 2 * nparams) = 0 (gen_bwd adds into it).
__global__ void __launch_bounds__(256) zero(const NormParams p) {
  for (i64 q = (i64)blockIdx.x * blockDim.x + threadIdx.x; q < 2 * p.nparams; q += (i64)gridDim.x * blockDim.x)
    p.ws[q] = 0.0f;
}

// ------------------------------------------------------------------ gen (any layout)

// Offsets of element e of a set in x, out, dy and its parameter offset (from the set's first).
__device__ __forceinline__ void el_offsets(const NormParams& p, i64 e, i64* off, i64& pq) {
  off[0] = off[1] = off[2] = 0;
  pq = 0;
  for (int d = p.el_ndim - 1; d >= 0; --d) {
    const i64 n = p.el_size[d], q = e / n, c = e - q * n;
#pragma unroll
    for (int k = 0; k < 3; ++k) off[k] += c * p.el_stride[k][d];
    pq += c * p.el_pstride[d];
    e = q;
  }
}

template <class T, class Epi>
__device__ __forceinline__ void gen_fwd_body(const NormParams& p, const Epi& epi) {
  constexpr bool FAST = sizeof(T) == 2;
  __shared__ R3 sm[2][32];
  const bool rms = p.flags & PYDNN_NORM_FLAG_RMS, blend = p.flags & PYDNN_FLAG_BETA;
  const float alpha = (float)p.alpha, beta = (float)p.beta, eps = (float)p.eps;
  const float c1 = (float)p.coef, c2 = (float)p.coef2;
  const T* xb = (const T*)p.x;
  T* yb = (T*)p.out;
  int it = 0;
  for (i64 s = blockIdx.x; s < p.sets; s += gridDim.x, ++it) {
    i64 off[4], pbase;
    set_base(p, s, off, pbase);
    // Welford per thread, Chan across threads (RMS: sum of squares)
    R3 r;
    r.a = r.b = r.c = 0.0f;
    for (i64 e = threadIdx.x; e < p.len; e += kGenThreads) {
      i64 eo[3], pq;
      el_offsets(p, e, eo, pq);
      const float a = load<float>(xb[off[0] + eo[0]]);
      if (rms) {
        r.c += a * a;
      } else {
        r.a += 1.0f;
        const float d = a - r.b;
        r.b += d / r.a;
        r.c += d * (a - r.b);
      }
    }
    r = set_reduce<1>(r, !rms, kGenThreads, sm[it & 1], nullptr);
    const float mean = rms ? 0.0f : r.b;
    const float inv = 1.0f / sqrtf(fmaxf(r.c / (float)p.len, 0.0f) + eps);
    if (threadIdx.x == 0 && (p.flags & PYDNN_NORM_FLAG_STATS)) {
      if (p.mean) p.mean[off[3]] = mean;
      if (p.invstd) p.invstd[off[3]] = inv;
    }
    for (i64 e = threadIdx.x; e < p.len; e += kGenThreads) {
      i64 eo[3], pq;
      el_offsets(p, e, eo, pq);
      const float a = load<float>(xb[off[0] + eo[0]]);
      float z = (a - mean) * inv * __ldg(p.scale + pbase + pq);
      if (p.bias) z += __ldg(p.bias + pbase + pq);
      if (p.act) z = act_f<FAST>(p.act, z, c1, c2);
      z = epi(z, s, e);
      T* dst = yb + off[1] + eo[1];
      float out = alpha * z;
      if (blend) out += beta * load<float>(*dst);
      *dst = store<T>(out);
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kGenThreads) gen_fwd(const NormParams p) { gen_fwd_body<T>(p, NoEpi{}); }

// Parameter partials go straight to ws[0] with global atomics (cleared by `zero` first).
template <class T>
__global__ void __launch_bounds__(kGenThreads) gen_bwd(const NormParams p) {
  constexpr bool FAST = sizeof(T) == 2;
  __shared__ R3 sm[2][32];
  const bool rms = p.flags & PYDNN_NORM_FLAG_RMS, blend = p.flags & PYDNN_FLAG_BETA;
  const float alpha = (float)p.alpha, beta = (float)p.beta;
  const float c1 = (float)p.coef, c2 = (float)p.coef2;
  const float inv_len = 1.0f / (float)p.len;
  const i64 np = p.nparams;
  const T* xb = (const T*)p.x;
  const T* dyb = (const T*)p.dy;
  T* dxb = (T*)p.out;
  int it = 0;
  for (i64 s = blockIdx.x; s < p.sets; s += gridDim.x, ++it) {
    i64 off[4], pbase;
    set_base(p, s, off, pbase);
    const float mean = rms ? 0.0f : p.mean[off[3]], inv = p.invstd[off[3]];
    R3 r;
    r.a = r.b = r.c = 0.0f;
    for (i64 e = threadIdx.x; e < p.len; e += kGenThreads) {
      i64 eo[3], pq;
      el_offsets(p, e, eo, pq);
      const float xh = (load<float>(xb[off[0] + eo[0]]) - mean) * inv;
      const float sc = __ldg(p.scale + pbase + pq);
      float dz = load<float>(dyb[off[2] + eo[2]]);
      if (p.act) dz *= act_d<FAST>(p.act, xh * sc + (p.bias ? __ldg(p.bias + pbase + pq) : 0.0f), c1, c2);
      r.a += dz * sc;
      r.b += dz * sc * xh;
      atomicAdd(p.ws + pbase + pq, dz * xh);
      atomicAdd(p.ws + np + pbase + pq, dz);
    }
    r = set_reduce<1>(r, false, kGenThreads, sm[it & 1], nullptr);
    const float m1 = rms ? 0.0f : r.a * inv_len, m2 = r.b * inv_len;
    for (i64 e = threadIdx.x; e < p.len; e += kGenThreads) {
      i64 eo[3], pq;
      el_offsets(p, e, eo, pq);
      const float xh = (load<float>(xb[off[0] + eo[0]]) - mean) * inv;
      const float sc = __ldg(p.scale + pbase + pq);
      float dz = load<float>(dyb[off[2] + eo[2]]);
      if (p.act) dz *= act_d<FAST>(p.act, xh * sc + (p.bias ? __ldg(p.bias + pbase + pq) : 0.0f), c1, c2);
      T* dst = dxb + off[1] + eo[1];
      float out = alpha * inv * (dz * sc - m1 - xh * m2);
      if (blend) out += beta * load<float>(*dst);
      *dst = store<T>(out);
    }
  }
}

// ------------------------------------------------------------------ backward, rows, cp.async ring

// bwd_ring: bwd_rows with its ring of x / dy rows in shared memory (cp.async) instead of registers: the
// registers the ring held go to scale and the dscale / dbias partials, and the ring can be deeper (DEPTH
// rows of both operands per group, all in flight but the one being processed). Row order, reduction,
// output and workspace slots as bwd_rows. Ring layout [depth][operand][item][thread], then the rows'
// mean / invstd [depth][2][thread] (4-byte copies): each thread copies and reads only its own slots, so
// the ring needs no barrier; a slot is refilled with the row DEPTH steps ahead as soon as its row is in
// registers. One commit group per row (empty past the end: the count stays uniform).
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool pred) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_u32(dst)), "l"(src), "r"(pred ? 4 : 0)
               : "memory");
}

// A 16-byte vector in block `rank`'s shared memory, at the address `p` has in ours.
__device__ __forceinline__ float4 ld_dsmem4(const float4* p, unsigned rank) {
  float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#if __CUDA_ARCH__ >= 900
  unsigned a, r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(r) : "memory");
#endif
  return v;
}

// The partials. Each thread's dscale / dbias partials are 2 x ITEMS x VEC floats, 32 B apart between
// lanes: written straight to the workspace, every 4-byte store of a warp would touch 32 sectors (CL 1
// measured 72.3% of copy on the LN bf16 backward that way, 83.2% as below; H200). So the block first puts
// its groups' [spb][2][nparams] partials in its ring (free after the last row; they fit: spb * nparams <= blockDim * ITEMS * VEC, and the ring holds DEPTH >= 2 times that in x and dy),
// then copies them out in consecutive 16-byte vectors (4-byte ones when the workspace is not 16-byte
// aligned; it need only be 4-byte aligned). CL == 1 (bwd_ring): one workspace slot per group.
// CL > 1 (bwd_ring_cl, a cluster of CL blocks, sm_90): rank r sums the vectors r * blockDim + t, + CL *
// blockDim, ... of all CL blocks' partials through distributed shared memory, in rank order (the same sum
// whichever block computes it), and the cluster writes ONE set of spb slots: the workspace written here
// and read by finish is CL times smaller.
__device__ __forceinline__ void put4(float* dst, float4 v, bool a16) {
  if (a16) {
    *reinterpret_cast<float4*>(dst) = v;
  } else {
    dst[0] = v.x; dst[1] = v.y; dst[2] = v.z; dst[3] = v.w;
  }
}

template <class T, int VEC, int ITEMS, int DEPTH, int CL>
__device__ __forceinline__ void bwd_ring_body(const NormParams& p) {
  typedef Frag<T, VEC> F;
  __shared__ __align__(16) float sm[2][32][2];
  extern __shared__ U4 ring[];  // [DEPTH][2][ITEMS][blockDim], then float [DEPTH][2][blockDim]
  const int G = p.group, lane = threadIdx.x & (G - 1), sub = threadIdx.x / G;
  const int spb = (int)(blockDim.x / G);
  const i64 step = (i64)gridDim.x * spb;
  const int nvec = (int)p.len / VEC;
  const i64 np = p.nparams;
  const bool rms = p.flags & PYDNN_NORM_FLAG_RMS, blend = p.flags & PYDNN_FLAG_BETA;
  const bool stream = p.flags & PYDNN_NORM_FLAG_STREAM;
  // WARPSTAT: a row's mean / invstd copied once per warp (lane 0) instead of once per thread, read back
  // by the warp after its wait and a __syncwarp (2 x 4-byte copies per warp and row instead of 64). Only
  // when a warp lies in one row's group (G >= 32; smaller groups put several rows in a warp).
  const bool warpstat = (p.flags & PYDNN_NORM_FLAG_WARPSTAT) && G >= 32;
  const int stat_at = warpstat ? (int)(threadIdx.x & ~31u) : (int)threadIdx.x;
  const bool stat_copy = !warpstat || (threadIdx.x & 31) == 0;
  const float alpha = (float)p.alpha, beta = (float)p.beta;
  const float inv_len = 1.0f / (float)p.len;
  const bool pvec = (reinterpret_cast<unsigned long long>(p.scale) & 15) == 0;
  const i64 sx = p.set_stride[0][0], so = p.set_stride[1][0], sd = p.set_stride[2][0], ss = p.set_stride[3][0];
  const T* xb = (const T*)p.x;
  const T* db = (const T*)p.dy;
  T* ob = (T*)p.out;
  float* rstat = reinterpret_cast<float*>(ring + DEPTH * 2 * ITEMS * blockDim.x);

  float sc[ITEMS][VEC], acc_s[ITEMS][VEC], acc_b[ITEMS][VEC];
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) sc[k][j] = acc_s[k][j] = acc_b[k][j] = 0.0f;
    if (lane + k * G < nvec) rows_params<VEC>(p.scale, (lane + k * G) * VEC, pvec, sc[k]);
  }
  auto issue = [&](int b, i64 row) {
    const bool live = row < p.sets;
    const i64 r = live ? row : 0;
    U4* dst = ring + b * 2 * ITEMS * blockDim.x + threadIdx.x;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int vi = lane + k * G;
      const bool on = live && vi < nvec;
      cp_async16(dst + k * blockDim.x, xb + r * sx + (on ? vi * VEC : 0), on);
      cp_async16(dst + (ITEMS + k) * blockDim.x, db + r * sd + (on ? vi * VEC : 0), on);
    }
    if (stat_copy) {
      float* st = rstat + b * 2 * blockDim.x + threadIdx.x;
      cp_async4(st, rms ? (const float*)p.invstd : p.mean + r * ss, live && !rms);
      cp_async4(st + blockDim.x, p.invstd + r * ss, live);
    }
    cp_async_commit();
  };

  const i64 first = (i64)blockIdx.x * spb;
#pragma unroll
  for (int b = 0; b < DEPTH; ++b) issue(b, first + sub + b * step);
  int it = 0, slot = 0;
  for (i64 base = first; base < p.sets; base += step) {
    const i64 row = base + sub;
    cp_async_wait<DEPTH - 1>();  // this slot's group is the oldest
    F vx[ITEMS], vd[ITEMS];
    {
      const U4* src = ring + slot * 2 * ITEMS * blockDim.x + threadIdx.x;
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        U4 q = src[k * blockDim.x];
        vx[k].w[0] = q.x; vx[k].w[1] = q.y; vx[k].w[2] = q.z; vx[k].w[3] = q.w;
        q = src[(ITEMS + k) * blockDim.x];
        vd[k].w[0] = q.x; vd[k].w[1] = q.y; vd[k].w[2] = q.z; vd[k].w[3] = q.w;
      }
    }
    if (warpstat) __syncwarp();  // lane 0's copies, complete for lane 0 after its wait, seen by the warp
    const float mean = rstat[slot * 2 * blockDim.x + stat_at];
    const float inv = rstat[(slot * 2 + 1) * blockDim.x + stat_at];
    if (warpstat) __syncwarp();  // every lane has read them before lane 0 refills the slot
    issue(slot, row + DEPTH * step);
    slot = slot == DEPTH - 1 ? 0 : slot + 1;
    float r[2] = {0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      float a[VEC], d[VEC];
      rows_get<T, VEC>(vx[k], a);
      rows_get<T, VEC>(vd[k], d);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {  // dead rows and lanes: zeros (inv = 0), they add nothing
        const float xh = (a[j] - mean) * inv, g = d[j] * sc[k][j];
        r[0] += g;
        r[1] = fmaf(g, xh, r[1]);
        acc_s[k][j] = fmaf(d[j], xh, acc_s[k][j]);
        acc_b[k][j] += d[j];
      }
    }
    rows_sum<2>(r, G, sm[it & 1]);
    ++it;
    const float m1 = rms ? 0.0f : r[0] * inv_len, m2 = r[1] * inv_len, ai = alpha * inv;
    if (row < p.sets) {
      T* o = ob + row * so;
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        const int vi = lane + k * G;
        if (vi >= nvec) continue;
        float a[VEC], d[VEC];
        rows_get<T, VEC>(vx[k], a);
        rows_get<T, VEC>(vd[k], d);
#pragma unroll
        for (int j = 0; j < VEC; ++j) a[j] = ai * (d[j] * sc[k][j] - m1 - (a[j] - mean) * inv * m2);
        if (blend) {
          F old;
          old.load(o + vi * VEC);
          old.get(d);
#pragma unroll
          for (int j = 0; j < VEC; ++j) a[j] += beta * d[j];
        }
        F out;
        out.set(a);
        store_out<T, VEC>(out, o + vi * VEC, stream);
      }
    }
  }
  cp_async_wait<0>();
  static_assert(VEC % 4 == 0 && DEPTH >= 2, "float4 partials that fit the ring");
  __syncthreads();  // every thread is done with the ring (its last rows' copies and reads)
  float* red = reinterpret_cast<float*>(ring);  // [spb][2][np]
  float* mine = red + (i64)sub * 2 * np;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int vi = lane + k * G;
    if (vi < nvec)
#pragma unroll
      for (int j = 0; j < VEC; j += 4) {
        *reinterpret_cast<float4*>(mine + vi * VEC + j) =
            make_float4(acc_s[k][j], acc_s[k][j + 1], acc_s[k][j + 2], acc_s[k][j + 3]);
        *reinterpret_cast<float4*>(mine + np + vi * VEC + j) =
            make_float4(acc_b[k][j], acc_b[k][j + 1], acc_b[k][j + 2], acc_b[k][j + 3]);
      }
  }
  const int n4 = (int)(spb * 2 * np / 4);
  const float4* red4 = reinterpret_cast<const float4*>(red);
  const bool a16 = (reinterpret_cast<unsigned long long>(p.ws) & 15) == 0;
  if constexpr (CL == 1) {
    __syncthreads();
    float* out = p.ws + (i64)blockIdx.x * spb * 2 * np;
    for (int i = (int)threadIdx.x; i < n4; i += (int)blockDim.x) put4(out + 4 * i, red4[i], a16);
  } else {
    cluster_sync();  // every block's partials are in its shared memory
    const unsigned rank = cluster_rank();
    float* out = p.ws + (i64)(blockIdx.x / CL) * spb * 2 * np;
    for (int i = (int)(rank * blockDim.x + threadIdx.x); i < n4; i += CL * (int)blockDim.x) {
      float4 a = ld_dsmem4(red4 + i, 0);
#pragma unroll
      for (int c = 1; c < CL; ++c) {
        const float4 b = ld_dsmem4(red4 + i, c);
        a.x += b.x; a.y += b.y; a.z += b.z; a.w += b.w;
      }
      put4(out + 4 * i, a, a16);
    }
    cluster_sync();  // no block leaves while another may still read its shared memory
  }
}

template <class T, int VEC, int ITEMS, int DEPTH>
__global__ void __launch_bounds__(256, 2) bwd_ring(const NormParams p) { bwd_ring_body<T, VEC, ITEMS, DEPTH, 1>(p); }
#if __CUDA_ARCH__ >= 900
template <class T, int VEC, int ITEMS, int DEPTH, int CL>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(256, 2) bwd_ring_cl(const NormParams p) {
  bwd_ring_body<T, VEC, ITEMS, DEPTH, CL>(p);
}
#else
template <class T, int VEC, int ITEMS, int DEPTH, int CL>
__global__ void bwd_ring_cl(const NormParams) { __trap(); }  // the host never picks it before sm_90
#endif

// ------------------------------------------------------------------ group norm, channels innermost (NHWC)

// gn_fwd: the forward of group norm when a sample's channels are contiguous at each spatial position
// (NHWC, channels_last). A set (n, g) is cg channels x P positions, 32 B of every 1 KB row on the
// benchmark's 32 x 512 x 64 x 64; read set by set it costs scattered 32-byte accesses, and a set (128 KiB)
// is too large for one SM's registers. Here a cluster of 8 blocks owns a UNIT: one sample's GC
// consecutive groups (UC = GC * cg contiguous channels per position) over all P positions; block `rank`
// takes positions [rank * ppb, (rank + 1) * ppb) and copies its tile (ppb x UC elements, <= ~64 KiB) into
// shared memory with cp.async, all copies in flight at once. x is read from memory exactly once: the
// statistics are two passes over shared memory (sum, then the centred sum of squares: exact two-pass
// variance, any dtype), each reduced over the cluster through distributed shared memory; then y is
// written from the tile. Each thread always holds the same 16-byte channel vector (cv = tid % VPP, VPP =
// UC / VEC a power of two dividing 32), so its scale / bias sit in registers and its group is fixed, and
// it reads back only the tile slots it copied itself. One unit per cluster (persistent clusters walking
// units with a double-buffered tile measured 37% of copy against 65%: see tools/bench_normalization.py).
// Params: set_size[0] = N, set_size[1] = G; set_stride[k][0] / [1] (k = x, y, dy, stats): sample / group
// strides (x, y, dy group strides are cg); el_size[0] = P, el_stride[k][0]: position strides; el_size[1] =
// cg; group = GC. Grid: N * G / GC clusters of 8 blocks; dynamic shared memory: the tile (the backward:
// the x tile, then the dy tile).
constexpr int kGnReduceWarps = 32;

// Sums of each thread's NV values over the cluster, per group of the unit: v becomes the totals of this
// thread's group (every thread of a group gets the same bits; the order is fixed). red: [32][32][NV],
// cvs / tot: [32][NV], slot: [32][NV] (this reduction's own buffer: other blocks read it after the cluster
// barrier, so it is not written again).
template <int NV>
__device__ __forceinline__ void gn_cluster_sum(float (&v)[NV], int VPP, int cpg, int GC, float (*red)[32][NV],
                                               float (*cvs)[NV], float (*slot)[NV], float (*tot)[NV]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int m = 16; m >= VPP; m >>= 1)
#pragma unroll
    for (int i = 0; i < NV; ++i) v[i] += __shfl_xor_sync(0xffffffffu, v[i], m);
  if (lane < VPP)
#pragma unroll
    for (int i = 0; i < NV; ++i) red[warp][lane][i] = v[i];
  __syncthreads();
  if ((int)threadIdx.x < VPP) {
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      float s = red[0][threadIdx.x][i];
      for (int w = 1; w < nw; ++w) s += red[w][threadIdx.x][i];
      cvs[threadIdx.x][i] = s;
    }
  }
  __syncthreads();
  if ((int)threadIdx.x < GC) {
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      float s = cvs[threadIdx.x * cpg][i];
      for (int c = 1; c < cpg; ++c) s += cvs[threadIdx.x * cpg + c][i];
      slot[threadIdx.x][i] = s;
    }
  }
  cluster_sync();
  if ((int)threadIdx.x < GC) {
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      float s = ld_dsmem(&slot[threadIdx.x][i], 0);
#pragma unroll
      for (int k = 1; k < kCluster; ++k) s += ld_dsmem(&slot[threadIdx.x][i], k);
      tot[threadIdx.x][i] = s;
    }
  }
  __syncthreads();
  const int gi = ((int)threadIdx.x & (VPP - 1)) / cpg;
#pragma unroll
  for (int i = 0; i < NV; ++i) v[i] = tot[gi][i];
}

__device__ __forceinline__ void cluster_arrive() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// A unit's place (see gn_fwd): sample n, first group g0, this block's rank, first position p0 and
// positions npos, the thread's channel vector cv (VPP of them per position) and log2(VPP).
struct GnAt {
  int GC, cg, cpg, VPP, rank, p0, npos, nv, cv, sh;
  i64 n, g0;
  __device__ __forceinline__ GnAt(const NormParams& p, int VEC) {
    GC = p.group;
    cg = (int)p.el_size[1];
    cpg = cg / VEC;
    VPP = GC * cpg;
    const i64 units_per_n = p.set_size[1] / GC, unit = (i64)(blockIdx.x / kCluster);
    rank = (int)cluster_rank();
    n = unit / units_per_n;
    g0 = (unit - n * units_per_n) * GC;
    const int P = (int)p.el_size[0], ppb = (P + kCluster - 1) / kCluster;
    p0 = rank * ppb;
    npos = max(0, min(ppb, P - p0));
    nv = npos * VPP;
    cv = (int)threadIdx.x & (VPP - 1);
    sh = __ffs(VPP) - 1;
  }
  // this thread's first vector of operand k (0 x, 1 out, 2 dy) in the tile's first position
  template <class T> __device__ __forceinline__ T* base(const NormParams& p, const void* b, int k, int VEC) const {
    return (T*)b + n * p.set_stride[k][0] + g0 * p.set_stride[k][1] + (i64)p0 * p.el_stride[k][0] + cv * VEC;
  }
};

template <class T, int VEC> __device__ __forceinline__ void tile_get(const U4* tile, int v, float* a) {
  Frag<T, VEC> f;
  const U4 q = tile[v];
  f.w[0] = q.x; f.w[1] = q.y; f.w[2] = q.z; f.w[3] = q.w;
  f.get(a);
}

// ONE (16-bit data only): the statistics in one pass and ONE cluster reduction instead of two: with
// c = the group's first element (x at position 0, channel 0: the same for every block of the cluster),
// S = sum (x - c), Q = sum (x - c)^2 reduced together; mean = c + S / len, var = Q / len - (S / len)^2.
// The error bound is fwd_rows' ONE (d = x - c exact for 16-bit data; |d var| <= 3 g (var + (x_0 -
// mean)^2) + 2^-24 var) with g = (m + 5 + 8 + cg / VEC + 8) * 2^-24, m = a thread's terms (<= 128 at
// 64 KiB tiles and 256 threads): relative to var 2.6e-5 (1 + z_0^2), z_0 the first element's distance
// from the mean in units of std. And the tile's copies are issued in kGnChunks commit groups whose
// sums start as soon as each lands (the two-pass version waits for the whole tile first).
constexpr int kGnChunks = 4;
__device__ __forceinline__ void gn_wait_chunk(int c) {
  static_assert(kGnChunks == 4, "one case per outstanding count");
  switch (kGnChunks - 1 - c) {
    case 3: cp_async_wait<3>(); break;
    case 2: cp_async_wait<2>(); break;
    case 1: cp_async_wait<1>(); break;
    default: cp_async_wait<0>(); break;
  }
}

template <class T, int VEC, bool ONE>
__device__ __forceinline__ void gn_fwd_body(const NormParams& p) {
  static_assert(VEC * sizeof(T) == 16, "16-byte vectors");
  static_assert(!ONE || sizeof(T) == 2, "one-pass statistics: 16-bit data only (exact x - c)");
  typedef Frag<T, VEC> F;
  constexpr bool FAST = sizeof(T) == 2;
  __shared__ float red[kGnReduceWarps][32][ONE ? 2 : 1];
  __shared__ float cvs[32][ONE ? 2 : 1], slot[2][32][ONE ? 2 : 1], tot[2][32][ONE ? 2 : 1];
  extern __shared__ U4 tile[];
  const GnAt u(p, VEC);
  const T* xb = u.base<const T>(p, p.x, 0, VEC);
  const i64 sxp = p.el_stride[0][0];
  // ONE: vectors per chunk, a multiple of the block so that v stays tid + i * blockDim (xb is this thread's
  // channel vector: v must keep it; and each thread reads back only its own copies)
  const int bd = (int)blockDim.x, per = ((u.nv + bd - 1) / bd + kGnChunks - 1) / kGnChunks * bd;
  if constexpr (ONE) {
    for (int c = 0; c < kGnChunks; ++c) {
      const int end = min(u.nv, (c + 1) * per);
      for (int v = c * per + threadIdx.x; v < end; v += blockDim.x)
        cp_async16(tile + v, xb + (i64)(v >> u.sh) * sxp, true);
      cp_async_commit();
    }
  } else {
    for (int v = threadIdx.x; v < u.nv; v += blockDim.x) cp_async16(tile + v, xb + (i64)(v >> u.sh) * sxp, true);
    cp_async_commit();
  }
  // this thread's channels: scale / bias in registers while the copies fly
  const i64 c0 = u.g0 * u.cg + u.cv * VEC;
  float sc[VEC], bi[VEC];
  load_params<VEC>(p.scale, c0, 1, sc);
  if (p.bias) load_params<VEC>(p.bias, c0, 1, bi);
  else
#pragma unroll
    for (int j = 0; j < VEC; ++j) bi[j] = 0.0f;
  const float len = (float)p.len;
  float mean, var;
  if constexpr (ONE) {
    const T* x0 = (const T*)p.x + u.n * p.set_stride[0][0] + (u.g0 + u.cv / u.cpg) * p.set_stride[0][1];
    const float shift = to_float(*x0);  // the group's first element (an L1 / L2 broadcast)
    float sq[2] = {0.0f, 0.0f};
    for (int c = 0; c < kGnChunks; ++c) {
      gn_wait_chunk(c);
      const int end = min(u.nv, (c + 1) * per);
      for (int v = c * per + threadIdx.x; v < end; v += blockDim.x) {
        float a[VEC];
        tile_get<T, VEC>(tile, v, a);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float d = a[j] - shift;
          sq[0] += d;
          sq[1] = fmaf(d, d, sq[1]);
        }
      }
    }
    gn_cluster_sum<2>(sq, u.VPP, u.cpg, u.GC, red, cvs, slot[0], tot[0]);
    cluster_arrive();  // done reading the others' slots; wait before exiting (they may still read ours)
    const float ms = sq[0] / len;
    mean = shift + ms;
    var = fmaf(-ms, ms, sq[1] / len);
  } else {
    cp_async_wait<0>();
    float s[1] = {0.0f};
    for (int v = threadIdx.x; v < u.nv; v += blockDim.x) {
      float a[VEC];
      tile_get<T, VEC>(tile, v, a);
#pragma unroll
      for (int j = 0; j < VEC; ++j) s[0] += a[j];
    }
    gn_cluster_sum<1>(s, u.VPP, u.cpg, u.GC, red, cvs, slot[0], tot[0]);
    mean = s[0] / len;  // one rounding: a constant set's mean is exact
    s[0] = 0.0f;
    for (int v = threadIdx.x; v < u.nv; v += blockDim.x) {
      float a[VEC];
      tile_get<T, VEC>(tile, v, a);
#pragma unroll
      for (int j = 0; j < VEC; ++j) s[0] = fmaf(a[j] - mean, a[j] - mean, s[0]);
    }
    // (red / cvs are free again: the first reduction's last barrier follows their last reads)
    gn_cluster_sum<1>(s, u.VPP, u.cpg, u.GC, red, cvs, slot[1], tot[1]);
    cluster_arrive();  // done reading the others' slots; wait before exiting (they may still read ours)
    var = s[0] / len;
  }
  const float inv = 1.0f / sqrtf(fmaxf(var, 0.0f) + (float)p.eps);
  if (u.rank == 0 && (int)threadIdx.x < u.VPP && u.cv % u.cpg == 0 && (p.flags & PYDNN_NORM_FLAG_STATS)) {
    const i64 so = u.n * p.set_stride[3][0] + (u.g0 + u.cv / u.cpg) * p.set_stride[3][1];
    if (p.mean) p.mean[so] = mean;
    if (p.invstd) p.invstd[so] = inv;
  }
  const bool blend = p.flags & PYDNN_FLAG_BETA, stream = p.flags & PYDNN_NORM_FLAG_STREAM;
  const float alpha = (float)p.alpha, beta = (float)p.beta, c1 = (float)p.coef, c2 = (float)p.coef2;
  float k1[VEC];  // z = (x - mean) * k1 + bias (not x * k1 + k0: no cancellation when |mean| >> std)
#pragma unroll
  for (int j = 0; j < VEC; ++j) k1[j] = inv * sc[j];
  T* yb = u.base<T>(p, p.out, 1, VEC);
  const i64 syp = p.el_stride[1][0];
  for (int v = threadIdx.x; v < u.nv; v += blockDim.x) {
    float a[VEC];
    tile_get<T, VEC>(tile, v, a);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      float z = fmaf(a[j] - mean, k1[j], bi[j]);
      if (p.act) z = act_f<FAST>(p.act, z, c1, c2);
      a[j] = alpha * z;
    }
    T* dst = yb + (i64)(v >> u.sh) * syp;
    if (blend) {
      F old;
      old.load(dst);
      float b[VEC];
      old.get(b);
#pragma unroll
      for (int j = 0; j < VEC; ++j) a[j] += beta * b[j];
    }
    F f;
    f.set(a);
    store_out<T, VEC>(f, dst, stream);
  }
  cluster_wait();
}

// gn_bwd: the backward on gn_fwd's units and tiles: x and dy of the block's positions copied into shared
// memory (the two tiles back to back), then per group (sum dxhat, sum dxhat * xhat) with dxhat = dz *
// scale, dz = dy * act'(z), reduced over the cluster in one pass; dx written from the tiles. dscale /
// dbias: each thread sums dz * xhat and dz of its channel vector over its positions, the warps' lanes of
// one channel vector are added by shuffles and the warps by shared-memory atomics, and the block writes
// its unit's UC channels of workspace slot (n * 8 + rank): the G / GC units of a sample cover every
// channel of its 8 slots once (`finish` adds the N * 8 slots).
template <class T, int VEC>
__device__ __forceinline__ void gn_bwd_body(const NormParams& p) {
  static_assert(VEC * sizeof(T) == 16, "16-byte vectors");
  typedef Frag<T, VEC> F;
  constexpr bool FAST = sizeof(T) == 2;
  __shared__ float red[kGnReduceWarps][32][2];
  __shared__ float cvs[32][2], slot[32][2], tot[32][2];
  __shared__ float psum[2][32 * 8];  // dscale / dbias of the unit's channels (UC <= 32 vectors of <= 8)
  extern __shared__ U4 tile[];       // x: [nvmax], then dy
  const GnAt u(p, VEC);
  const int nvmax = (int)(((p.el_size[0] + kCluster - 1) / kCluster) * u.VPP);
  U4* tx = tile;
  U4* td = tile + nvmax;
  const T* xb = u.base<const T>(p, p.x, 0, VEC);
  const T* db = u.base<const T>(p, p.dy, 2, VEC);
  const i64 sxp = p.el_stride[0][0], sdp = p.el_stride[2][0];
  for (int v = threadIdx.x; v < u.nv; v += blockDim.x) {
    cp_async16(tx + v, xb + (i64)(v >> u.sh) * sxp, true);
    cp_async16(td + v, db + (i64)(v >> u.sh) * sdp, true);
  }
  cp_async_commit();
  const int UC = u.VPP * VEC;
  for (int c = threadIdx.x; c < UC; c += blockDim.x) psum[0][c] = psum[1][c] = 0.0f;
  const i64 c0 = u.g0 * u.cg + u.cv * VEC;
  float sc[VEC], bi[VEC];
  load_params<VEC>(p.scale, c0, 1, sc);
  const bool act_bias = p.act && p.bias;
  if (act_bias) load_params<VEC>(p.bias, c0, 1, bi);
  else
#pragma unroll
    for (int j = 0; j < VEC; ++j) bi[j] = 0.0f;
  const i64 so = u.n * p.set_stride[3][0] + (u.g0 + u.cv / u.cpg) * p.set_stride[3][1];
  const float mean = (p.flags & PYDNN_NORM_FLAG_RMS) ? 0.0f : p.mean[so], inv = p.invstd[so];
  const float c1 = (float)p.coef, c2 = (float)p.coef2;
  cp_async_wait<0>();
  float r[2] = {0.0f, 0.0f}, as[VEC], ab[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) as[j] = ab[j] = 0.0f;
  for (int v = threadIdx.x; v < u.nv; v += blockDim.x) {
    float a[VEC], d[VEC];
    tile_get<T, VEC>(tx, v, a);
    tile_get<T, VEC>(td, v, d);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float xh = (a[j] - mean) * inv;
      if (p.act) d[j] *= act_d<FAST>(p.act, xh * sc[j] + bi[j], c1, c2);
      const float g = d[j] * sc[j];
      r[0] += g;
      r[1] = fmaf(g, xh, r[1]);
      as[j] = fmaf(d[j], xh, as[j]);
      ab[j] += d[j];
    }
  }
  gn_cluster_sum<2>(r, u.VPP, u.cpg, u.GC, red, cvs, slot, tot);
  cluster_arrive();
  // parameter partials: lanes of one channel vector (lane ^ m, m >= VPP), then the warps (psum was
  // cleared before the reduction's barriers)
  for (int m = 16; m >= u.VPP; m >>= 1)
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      as[j] += __shfl_xor_sync(0xffffffffu, as[j], m);
      ab[j] += __shfl_xor_sync(0xffffffffu, ab[j], m);
    }
  if ((threadIdx.x & 31) < (unsigned)u.VPP)
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      atomicAdd(&psum[0][u.cv * VEC + j], as[j]);
      atomicAdd(&psum[1][u.cv * VEC + j], ab[j]);
    }
  const float len = (float)p.len;
  const float m1 = (p.flags & PYDNN_NORM_FLAG_RMS) ? 0.0f : r[0] / len, m2 = r[1] / len;
  const bool blend = p.flags & PYDNN_FLAG_BETA;
  const float alpha = (float)p.alpha, beta = (float)p.beta, ai = alpha * inv;
  T* ob = u.base<T>(p, p.out, 1, VEC);
  const i64 sop = p.el_stride[1][0];
  for (int v = threadIdx.x; v < u.nv; v += blockDim.x) {
    float a[VEC], d[VEC];
    tile_get<T, VEC>(tx, v, a);
    tile_get<T, VEC>(td, v, d);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float xh = (a[j] - mean) * inv;
      if (p.act) d[j] *= act_d<FAST>(p.act, xh * sc[j] + bi[j], c1, c2);
      a[j] = ai * (d[j] * sc[j] - m1 - xh * m2);
    }
    T* dst = ob + (i64)(v >> u.sh) * sop;
    if (blend) {
      F old;
      old.load(dst);
      old.get(d);
#pragma unroll
      for (int j = 0; j < VEC; ++j) a[j] += beta * d[j];
    }
    F f;
    f.set(a);
    f.store(dst);
  }
  __syncthreads();  // psum complete
  const i64 np = p.nparams;
  float* ws = p.ws + (u.n * kCluster + u.rank) * 2 * np + u.g0 * u.cg;
  for (int c = threadIdx.x; c < UC; c += blockDim.x) {
    ws[c] = psum[0][c];
    ws[np + c] = psum[1][c];
  }
  cluster_wait();
}

// gn_reg: the NHWC group-norm forward with the unit's x held in REGISTERS and in the threads' own
// shared-memory slots instead of gn_fwd's shared-memory tile alone. A unit is gn_fwd's (one sample, GC
// consecutive groups, all P positions) split by positions over a cluster of CL blocks (CL == 1: one block
// owns the unit, no cluster); thread t keeps one channel vector cv = t % VPP and positions t / VPP + k *
// (block / VPP), k < ITEMS + SI: items k < ITEMS as 16-byte fragments in registers (ITEMS 8: 32 registers),
// items ITEMS + s in slot s * block + t of a shared-memory tile (cp.async; read back only by the thread that
// copied it: no barrier). Every load of the block is issued before any is used (x by ld.global.nc without
// L1 allocation); the statistics come from registers and slots (16-bit: ONE, gn_fwd's one-pass shifted sums
// and error bound; fp32: two passes, each reduced over the unit), then y is written from them. Why: the
// bytes an SM can hold in flight ordered every measured config of gn_fwd and gn_reg (H200,
// tools/bench_normalization.py):
// gn_fwd's tiles hold 192 KiB per SM (3 x 64 KiB), registers alone 128 KiB (1024 threads x 32 registers
// of x); registers and shared memory together 256 KiB ((CL, GC, SI) = (8, 4, 8): 4 blocks of 256 threads,
// each 32 KiB in registers + 32 KiB in slots). The output of register items is unrolled without the
// activation (compact code: an unrolled copy of the activation's switch per element was ~130 KB of code and
// thrashed the instruction cache); with one, a loop that is not unrolled.
// Params as gn_fwd; grid = N * (G / GC) * CL blocks; dynamic shared memory SI * block * 16 bytes.

// Sums of each thread's NV values over its group of the unit (gn_cluster_sum for clusters of CL blocks;
// CL == 1: the block alone, no cluster barrier). red: [32][32][NV], cvs: [32][NV], slot / tot: [32][NV]
// (slot: this reduction's own buffer, read by the other blocks after the cluster barrier).
template <int NV, int CL>
__device__ __forceinline__ void gn_unit_sum(float (&v)[NV], int VPP, int cpg, int GC, float (*red)[32][NV],
                                            float (*cvs)[NV], float (*slot)[NV], float (*tot)[NV]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int m = 16; m >= VPP; m >>= 1)
#pragma unroll
    for (int i = 0; i < NV; ++i) v[i] += __shfl_xor_sync(0xffffffffu, v[i], m);
  if (nw > 1) {
    if (lane < VPP)
#pragma unroll
      for (int i = 0; i < NV; ++i) red[warp][lane][i] = v[i];
    __syncthreads();
    if ((int)threadIdx.x < VPP)
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        float s = red[0][threadIdx.x][i];
        for (int w = 1; w < nw; ++w) s += red[w][threadIdx.x][i];
        cvs[threadIdx.x][i] = s;
      }
  } else if (lane < VPP) {
#pragma unroll
    for (int i = 0; i < NV; ++i) cvs[lane][i] = v[i];
  }
  __syncthreads();
  float (*own)[NV] = CL > 1 ? slot : tot;
  if ((int)threadIdx.x < GC)
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      float s = cvs[threadIdx.x * cpg][i];
      for (int c = 1; c < cpg; ++c) s += cvs[threadIdx.x * cpg + c][i];
      own[threadIdx.x][i] = s;
    }
  if constexpr (CL > 1) {
    cluster_sync();
    if ((int)threadIdx.x < GC)
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        float s = ld_dsmem(&slot[threadIdx.x][i], 0);
#pragma unroll
        for (int k = 1; k < CL; ++k) s += ld_dsmem(&slot[threadIdx.x][i], k);
        tot[threadIdx.x][i] = s;
      }
  }
  __syncthreads();
  const int gi = ((int)threadIdx.x & (VPP - 1)) / cpg;
#pragma unroll
  for (int i = 0; i < NV; ++i) v[i] = tot[gi][i];
}

// One item of gn_reg's output: y = alpha * act((x - mean) * k1 + bias) (+ beta * y), stored from the fragment.
template <class T, int VEC, bool ACT, bool FAST>
__device__ __forceinline__ void gn_reg_store(const Frag<T, VEC>& f, T* dst, float mean, const float* k1, const float* bi,
                                             int act, float c1, float c2, float alpha, float beta, bool blend,
                                             bool stream) {
  float a[VEC];
  rows_get<T, VEC>(f, a);
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    float z = fmaf(a[j] - mean, k1[j], bi[j]);
    if constexpr (ACT) z = act_f<FAST>(act, z, c1, c2);
    a[j] = alpha * z;
  }
  if (blend) {
    Frag<T, VEC> old;
    old.load(dst);
    float b[VEC];
    old.get(b);
#pragma unroll
    for (int j = 0; j < VEC; ++j) a[j] += beta * b[j];
  }
  Frag<T, VEC> o;
  o.set(a);
  store_out<T, VEC>(o, dst, stream);
}

// p.pf: block fb's share of x (positions [p0, p0 + npos) x the unit's VPP 16-byte channel vectors, one
// chunk per position) pulled into L2 by this block's threads, sector by sector (see l2_prefetch_line); the chunk's
// sectors from its start rounded down to 32 bytes (a misaligned chunk's last few bytes may be left out: a hint).
template <class T, int CL>
__device__ __forceinline__ void gn_reg_prefetch(const NormParams& p, i64 fb, int ppb, int VPP) {
  if (fb >= (i64)gridDim.x) return;
  const int GC = p.group, P = (int)p.el_size[0];
  const i64 units_per_n = p.set_size[1] / GC, unit = fb / CL;
  const i64 n = unit / units_per_n, g0 = (unit - n * units_per_n) * GC;
  const int p0 = (int)(fb % CL) * ppb, npos = max(0, min(ppb, P - p0));
  const char* b = (const char*)((const T*)p.x + n * p.set_stride[0][0] + g0 * p.set_stride[0][1] +
                                (i64)p0 * p.el_stride[0][0]);
  const i64 pstride = p.el_stride[0][0] * (i64)sizeof(T);
  const int spp = (VPP * 16 + 31) / 32;  // sectors per position (a power of two: VPP is one)
  const unsigned long long b0 = reinterpret_cast<unsigned long long>(b) & ~31ull;
  for (int j = (int)threadIdx.x; j < npos * spp; j += (int)blockDim.x) {
    const int pos = j / spp, sct = j - pos * spp;
    l2_prefetch_line(reinterpret_cast<const void*>(b0 + (unsigned long long)(pos * pstride) + 32ull * sct));
  }
}

template <class T, int VEC, int ITEMS, int SI, int CL, bool ONE>
__device__ __forceinline__ void gn_reg_body(const NormParams& p) {
  static_assert(VEC * sizeof(T) == 16, "16-byte vectors");
  static_assert(!ONE || sizeof(T) == 2, "one-pass statistics: 16-bit data only (exact x - c)");
  typedef Frag<T, VEC> F;
  constexpr bool FAST = sizeof(T) == 2;
  constexpr int NV = ONE ? 2 : 1;
  __shared__ float red[kGnReduceWarps][32][NV];
  __shared__ float cvs[32][NV], slot[2][32][NV], tot[2][32][NV];
  // the unit and this thread's place in it (see gn_fwd's GnAt; CL blocks per unit)
  const int GC = p.group, cg = (int)p.el_size[1], cpg = cg / VEC, VPP = GC * cpg;
  const i64 units_per_n = p.set_size[1] / GC, unit = (i64)(blockIdx.x / CL);
  const int rank = CL > 1 ? (int)cluster_rank() : 0;
  const i64 n = unit / units_per_n, g0 = (unit - n * units_per_n) * GC;
  const int P = (int)p.el_size[0], ppb = (P + CL - 1) / CL, p0 = rank * ppb, npos = max(0, min(ppb, P - p0));
  const int cv = (int)threadIdx.x & (VPP - 1), sh = __ffs(VPP) - 1;
  const int pt = (int)threadIdx.x >> sh, pstep = (int)blockDim.x >> sh;
  const i64 sxp = p.el_stride[0][0], syp = p.el_stride[1][0];
  const T* xb = (const T*)p.x + n * p.set_stride[0][0] + g0 * p.set_stride[0][1] + (i64)(p0 + pt) * sxp + cv * VEC;
  const int nk = pt < npos ? (npos - pt + pstep - 1) / pstep : 0;  // this thread's live items: k < nk
  F v[ITEMS];
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    v[k].zero();
    if (k < nk) load_once<T, VEC>(v[k], xb);
    xb += pstep * sxp;
  }
  // SI more items in this thread's own slots of a shared-memory tile (slot s at s * block + t: read back only
  // by the thread that copied it, so no barrier), all in flight with the register loads
  extern __shared__ U4 rtile[];
  const int bd = (int)blockDim.x;
  if constexpr (SI > 0) {
#pragma unroll
    for (int s = 0; s < SI; ++s) {
      cp_async16(rtile + s * bd + threadIdx.x, xb, ITEMS + s < nk);
      xb += pstep * sxp;
    }
    cp_async_commit();
  }
  if (p.pf > 0) gn_reg_prefetch<T, CL>(p, (i64)blockIdx.x + p.pf, ppb, VPP);
  const int grp = cv / cpg;  // this thread's group in the unit
  const float len = (float)p.len;
  float mean, var;
  if constexpr (ONE) {
    const float shift = to_float(((const T*)p.x)[n * p.set_stride[0][0] + (g0 + grp) * p.set_stride[0][1]]);
    float sq[2] = {0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      float a[VEC];
      rows_get<T, VEC>(v[k], a);
      if (k < nk)
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float d = a[j] - shift;
          sq[0] += d;
          sq[1] = fmaf(d, d, sq[1]);
        }
    }
    if constexpr (SI > 0) {
      cp_async_wait<0>();
#pragma unroll 1
      for (int s = 0; s < SI && ITEMS + s < nk; ++s) {
        float a[VEC];
        tile_get<T, VEC>(rtile, s * bd + threadIdx.x, a);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float d = a[j] - shift;
          sq[0] += d;
          sq[1] = fmaf(d, d, sq[1]);
        }
      }
    }
    gn_unit_sum<2, CL>(sq, VPP, cpg, GC, red, cvs, slot[0], tot[0]);
    const float ms = sq[0] / len;
    mean = shift + ms;
    var = fmaf(-ms, ms, sq[1] / len);
  } else {
    float s[1] = {0.0f};
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      float a[VEC];
      rows_get<T, VEC>(v[k], a);
#pragma unroll
      for (int j = 0; j < VEC; ++j) s[0] += a[j];  // (zero fragments add nothing)
    }
    if constexpr (SI > 0) {
      cp_async_wait<0>();
#pragma unroll 1
      for (int q = 0; q < SI && ITEMS + q < nk; ++q) {
        float a[VEC];
        tile_get<T, VEC>(rtile, q * bd + threadIdx.x, a);
#pragma unroll
        for (int j = 0; j < VEC; ++j) s[0] += a[j];
      }
    }
    gn_unit_sum<1, CL>(s, VPP, cpg, GC, red, cvs, slot[0], tot[0]);
    mean = s[0] / len;  // one rounding: a constant set's mean is exact
    s[0] = 0.0f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      float a[VEC];
      rows_get<T, VEC>(v[k], a);
      if (k < nk)
#pragma unroll
        for (int j = 0; j < VEC; ++j) s[0] = fmaf(a[j] - mean, a[j] - mean, s[0]);
    }
#pragma unroll 1
    for (int q = 0; q < SI && ITEMS + q < nk; ++q) {
      float a[VEC];
      tile_get<T, VEC>(rtile, q * bd + threadIdx.x, a);
#pragma unroll
      for (int j = 0; j < VEC; ++j) s[0] = fmaf(a[j] - mean, a[j] - mean, s[0]);
    }
    gn_unit_sum<1, CL>(s, VPP, cpg, GC, red, cvs, slot[1], tot[1]);
    var = s[0] / len;
  }
  if constexpr (CL > 1) cluster_arrive();  // done reading the others' slots; wait before exiting
  const float inv = 1.0f / sqrtf(fmaxf(var, 0.0f) + (float)p.eps);
  if (rank == 0 && (int)threadIdx.x < VPP && cv % cpg == 0 && (p.flags & PYDNN_NORM_FLAG_STATS)) {
    const i64 so = n * p.set_stride[3][0] + (g0 + grp) * p.set_stride[3][1];
    if (p.mean) p.mean[so] = mean;
    if (p.invstd) p.invstd[so] = inv;
  }
  // this thread's channels (after the statistics: fewer registers live while x is)
  const i64 c0 = g0 * cg + cv * VEC;
  float k1[VEC], bi[VEC];  // z = (x - mean) * k1 + bias, k1 = invstd * scale (as gn_fwd)
  load_params<VEC>(p.scale, c0, 1, k1);
  if (p.bias) load_params<VEC>(p.bias, c0, 1, bi);
  else
#pragma unroll
    for (int j = 0; j < VEC; ++j) bi[j] = 0.0f;
#pragma unroll
  for (int j = 0; j < VEC; ++j) k1[j] *= inv;
  const bool blend = p.flags & PYDNN_FLAG_BETA, stream = p.flags & PYDNN_NORM_FLAG_STREAM;
  const float alpha = (float)p.alpha, beta = (float)p.beta, c1 = (float)p.coef, c2 = (float)p.coef2;
  T* const dst0 = (T*)p.out + n * p.set_stride[1][0] + g0 * p.set_stride[1][1] + (i64)(p0 + pt) * syp + cv * VEC;
  const i64 dstep = pstep * syp;
  T* dst = dst0;
  if (!p.act) {
    // plain: the items unrolled straight from their registers (compact code: one short body per item)
#pragma unroll
    for (int k = 0; k < ITEMS; ++k, dst += dstep) {
      if (k >= nk) break;
      gn_reg_store<T, VEC, false, FAST>(v[k], dst, mean, k1, bi, 0, c1, c2, alpha, beta, blend, stream);
    }
#pragma unroll 1
    for (int q = 0; q < SI && ITEMS + q < nk; ++q) {
      const U4 u = rtile[q * bd + threadIdx.x];
      F f;
      f.w[0] = u.x; f.w[1] = u.y; f.w[2] = u.z; f.w[3] = u.w;
      gn_reg_store<T, VEC, false, FAST>(f, dst0 + (ITEMS + q) * dstep, mean, k1, bi, 0, c1, c2, alpha, beta, blend,
                                        stream);
    }
  } else {
    // fused activation: the fragments copied to a local array and walked by a loop that is NOT unrolled, so
    // that the activation's switch is compiled once, not once per element of every item (an unrolled
    // version was ~130 KB of code, which thrashed the instruction cache on the plain path too)
    F w[ITEMS];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) w[k] = v[k];
#pragma unroll 1
    for (int k = 0; k < nk && k < ITEMS; ++k, dst += dstep)
      gn_reg_store<T, VEC, true, FAST>(w[k], dst, mean, k1, bi, p.act, c1, c2, alpha, beta, blend, stream);
#pragma unroll 1
    for (int q = 0; q < SI && ITEMS + q < nk; ++q) {
      const U4 u = rtile[q * bd + threadIdx.x];
      F f;
      f.w[0] = u.x; f.w[1] = u.y; f.w[2] = u.z; f.w[3] = u.w;
      gn_reg_store<T, VEC, true, FAST>(f, dst0 + (ITEMS + q) * dstep, mean, k1, bi, p.act, c1, c2, alpha, beta,
                                       blend, stream);
    }
  }
  if constexpr (CL > 1) cluster_wait();
}

template <class T, int VEC, int ITEMS, int SI, bool ONE>
__global__ void __launch_bounds__(1024) gn_reg(const NormParams p) { gn_reg_body<T, VEC, ITEMS, SI, 1, ONE>(p); }

#if __CUDA_ARCH__ >= 900
template <class T, int VEC, bool ONE>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(1024) gn_fwd(const NormParams p) {
  gn_fwd_body<T, VEC, ONE>(p);
}
template <class T, int VEC>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(1024) gn_bwd(const NormParams p) {
  gn_bwd_body<T, VEC>(p);
}
template <class T, int VEC, int ITEMS, int SI, int CL, bool ONE>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(1024) gn_reg_cl(const NormParams p) {
  gn_reg_body<T, VEC, ITEMS, SI, CL, ONE>(p);
}
#else
template <class T, int VEC, bool ONE>
__global__ void gn_fwd(const NormParams) { __trap(); }  // the host never picks it before sm_90
template <class T, int VEC>
__global__ void gn_bwd(const NormParams) { __trap(); }
template <class T, int VEC, int ITEMS, int SI, int CL, bool ONE>
__global__ void gn_reg_cl(const NormParams) { __trap(); }  // the host never picks it before sm_90
#endif

}  // namespace norm
}  // namespace pydnn
