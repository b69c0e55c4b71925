// Group / instance norm, split kernels (gs_*), a unit of their own (normalization_gs.<dtype>) beside
// normalization.cu, whose Frag and cluster helpers are repeated here. Packed NCHW or packed NHWC x / y (dy / dx) with
// no activation; any N, C, spatial size S (H * W ...), groups G (cg = C / G channels per group). Chosen by
// _gs_* in pydnn/ops/normalization.py when the fast kernels would not serve the shape at full bandwidth
// (large or oddly sized sets, few sets).
//
// NormParams as these kernels read it: set_size[0..3] = N, C, S, G; set_stride[3][0] / [3][1]: the
// statistics' strides of n and g; el_size[0]: gsc: the slab width W (channels per unit); el_size[1]: the
// backward's chunks per plane (NCHW) or per sample (NHWC) K; el_size[2]: gs_bset: set blocks; el_size[3]:
// the backward's chunk length (elements, NCHW; rows, NHWC); el_size[4]: where the (n, c) totals end in the
// workspace (floats; gs_table aligns the table past it). flags: PYDNN_FLAG_BETA, PYDNN_NORM_FLAG_STATS,
// PYDNN_NORM_FLAG_BETA2, GS_FLAG_NHWC.
//
// Forward (one kernel, no workspace): gsp_fwd for sets that are one contiguous run (NCHW; NHWC with G == 1)
// and gsc_fwd for NHWC (a unit: one sample's W channels = whole groups, all positions). CL blocks (a
// cluster, sm_90, CL > 1) share a unit: pass 1 sums d = x - K and d^2 (K = the set's first element: one-pass
// shifted statistics), the block partials meet in a fixed order (warps, then the cluster's blocks through
// distributed shared memory), every block derives the same mean / invstd; a[c] = invstd * scale[c], b[c] =
// bias[c] - mean * a[c] go to shared memory; pass 2 reads x again (in reverse order, so that what is still
// in L2 is read first) and writes y = alpha * (a x + b) + beta * y.
//
// Backward (workspace): gsp_bpart (NCHW, a warp per chunk of one plane) / gsc_bpart (NHWC, a block per
// chunk of one sample's positions, threads across channels) write per (n, c, chunk) A = sum dy and B = sum
// dy * xhat; gs_bred sums the chunks of each (n, c); gs_bset per (n, g): c1 = sum scale A / len, c2 = sum
// scale B / len, and the table (k1, mean, q, r) per (n, c) with dx = k1 dy - q (x - mean) - r (k1 = invstd
// scale[c], q = invstd^2 c2, r = invstd c1); its last blocks write dscale / dbias (sums over n in order);
// gs_bapply: dx over the flat tensor. Every sum is in a fixed order: results are bitwise reproducible.

#include "common/params.h"
#include "common/types.cuh"
#include "normalization_params.h"

namespace pydnn {
namespace norm_gs {

constexpr int kCluster = 8;

template <class A, class B> struct Same { static constexpr bool value = false; };
template <class A> struct Same<A, A> { static constexpr bool value = true; };

struct __align__(16) U4 { unsigned x, y, z, w; };

// VEC consecutive elements of T as 32-bit words: one access of sizeof(T) * VEC bytes.
template <class T, int VEC> struct Frag {
  static constexpr int BYTES = (int)sizeof(T) * VEC;
  static_assert(BYTES == 16 || BYTES == 8 || BYTES == 4 || BYTES == 2, "one access of 2, 4, 8 or 16 bytes");
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
    } else if constexpr (BYTES == 8) {  // (not in normalization.cu's Frag: gsc's 4 x 16-bit and 2 x fp32 vectors)
      const uint2 q = *reinterpret_cast<const uint2*>(p);
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
      uint2 q;
      q.x = w[0]; q.y = w[1];
      *reinterpret_cast<uint2*>(p) = q;
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

// ------------------------------------------------------------------ gs

#define GS_FLAG_NHWC 512u

constexpr int kGsThreads = 512;     // gsp_fwd / gsc_fwd blocks (at most)
constexpr int kGsBpThreads = 256;   // gsp_bpart / gsc_bpart / gs_bred / gs_bset / gs_bapply blocks

// Deterministic sum of NV floats over the block (every thread ends with the same bits). sm: 32 * NV floats.
template <int NV>
__device__ __forceinline__ void gs_block_sum(float (&v)[NV], float* sm) {
#pragma unroll
  for (int m = 16; m; m >>= 1)
#pragma unroll
    for (int i = 0; i < NV; ++i) v[i] += __shfl_xor_sync(0xffffffffu, v[i], m);
  const int w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  __syncthreads();
  if ((threadIdx.x & 31) == 0)
#pragma unroll
    for (int i = 0; i < NV; ++i) sm[w * NV + i] = v[i];
  __syncthreads();
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    float t = 0.0f;
    for (int k = 0; k < nw; ++k) t += sm[k * NV + i];
    v[i] = t;
  }
}

template <class T>
__device__ __forceinline__ float gs_ld(const T* p, i64 i) { return pydnn::load<float>(p[i]); }

// y[i] = alpha * v + beta * y[i] (beta only with PYDNN_FLAG_BETA)
template <class T>
__device__ __forceinline__ void gs_st(T* y, i64 i, float v, float alpha, float beta, bool blend) {
  float r = alpha * v;
  if (blend) r += beta * pydnn::load<float>(y[i]);
  y[i] = pydnn::store<T>(r);
}

template <class T, int VEC>
__device__ __forceinline__ void gs_stv(T* y, Frag<T, VEC>& f, float (&v)[VEC], float alpha, float beta, bool blend) {
  if (blend) {
    Frag<T, VEC> o;
    o.load(y);
    float ov[VEC];
    o.get(ov);
#pragma unroll
    for (int e = 0; e < VEC; ++e) v[e] = alpha * v[e] + beta * ov[e];
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) v[e] *= alpha;
  }
  f.set(v);
  f.store(y);
}

// One element into the forward's sums: v[0] += x - K, v[1] += (x - K)^2, and (NS == 3) v[2] += x.
template <int NS>
__device__ __forceinline__ void gs_acc(float (&v)[NS], float a, float K) {
  const float d = a - K;
  v[0] += d;
  v[1] += d * d;
  if constexpr (NS == 3) v[2] += a;
}

// mean and invstd of a set from shifted sums (s1 = sum d, s2 = sum d^2, d = x - K) over len elements; with
// `s0` (float data: s0 = sum x, unshifted) the mean is s0 / len instead of K + s1 / len.
//
// Why the float forward sums x a third time: the shift K (the set's first element) keeps the variance free of
// cancellation when the mean is large, but it makes the partials of s1 grow as n * |mean - K|, so the float
// rounding of s1 puts an error ~ eps * |K| (times the summation's growth) into the mean. y = (x - mean) a + b
// then misses the fp32 tolerance where x is close to a small mean: the reference's error model counts
// (|x| + |mean|) * invstd * |scale| (pydnn/reference/normalization.py forward_terms), and |K| can be 3 where
// |x| + |mean| is 1e-3. That was the H200 failure of 2026-11-28 (NCHW 3 x 103 x 19 x 21, one group, y off by
// 1.4e-7 at x ~ 1e-3: a numpy emulation of gsp_fwd's summation order on that shape gives mean errors up to
// 1.6e-7 shifted, 2.8e-9 from s0; tests/kernels/test_gs_stats_emulation.py). Unshifted partials are a random
// walk (|mean| * n plus sqrt(n) * sigma), so s0's error stays ~ eps * (|mean| + sigma / sqrt(n)): inside the
// model. 16-bit data keeps the two sums (its tolerance is 2^-8 relative; the shifted mean's error is far
// below it) and its registers.
__device__ __forceinline__ void gs_stats(float s1, float s2, float K, i64 len, double eps, float& mean, float& inv,
                                         float& m1f, const float* s0 = nullptr) {
  const double m1 = (double)s1 / (double)len;
  double var = (double)s2 / (double)len - m1 * m1;
  if (var < 0.0) var = 0.0;
  mean = s0 ? (float)((double)*s0 / (double)len) : (float)((double)K + m1);
  inv = (float)(1.0 / sqrt(var + eps));
  m1f = (float)m1;
}

// The backward's (k1, mean, q, r) table: 16-byte aligned past the partials and the (n, c) totals (the host
// sizes the workspace with 16 bytes to spare; the workspace itself need only be 4-byte aligned).
__device__ __forceinline__ float4* gs_table(const NormParams& p) {
  const unsigned long long a = reinterpret_cast<unsigned long long>(p.ws + p.el_size[4]);
  return reinterpret_cast<float4*>((a + 15ull) & ~15ull);
}

// gsp_fwd's output of vector w (elements h + w * VEC ..) of its set, x's values in f; reverse order over w
// (the most recently read lines first)
template <class T, int VEC>
__device__ __forceinline__ void gsp_apply(Frag<T, VEC>& f, T* yv, i64 w, i64 h, i64 S, i64 cg, bool nhwc, float M,
                                          const float* ta, const float* tb, float alpha, float beta, bool blend) {
  float a[VEC];
  f.get(a);
  const i64 i0 = h + w * VEC;
  i64 q, r;
  if (nhwc) { q = i0 % cg; r = 0; } else { q = i0 / S; r = i0 - q * S; }
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    a[e] = (a[e] - M) * ta[q] + tb[q];
    if (nhwc) { if (++q == cg) q = 0; }
    else if (++r == S) { r = 0; ++q; }
  }
  gs_stv<T, VEC>(yv + w * VEC, f, a, alpha, beta, blend);
}

// ------------------------------------------------------------------ gsp_fwd: contiguous sets

template <class T, int VEC, int CL>
__device__ __forceinline__ void gsp_fwd_body(const NormParams& p) {
  extern __shared__ __align__(16) float gs_dyn[];  // a[cg], b[cg]
  __shared__ float red[96];
  __shared__ float slot[3];
  const i64 C = p.set_size[1], S = p.set_size[2], G = p.set_size[3];
  const i64 cg = C / G, L = cg * S;
  const bool nhwc = p.flags & GS_FLAG_NHWC;
  const i64 s = (i64)blockIdx.x / CL;
  const unsigned rank = CL > 1 ? cluster_rank() : 0u;
  const i64 n = s / G, g = s - n * G;
  const i64 base = s * L;
  const T* x = static_cast<const T*>(p.x) + base;
  T* y = static_cast<T*>(p.out) + base;
  const i64 NT = (i64)CL * blockDim.x, tid = (i64)rank * blockDim.x + threadIdx.x;
  const i64 h = min((i64)((VEC - base % VEC) % VEC), L);
  const i64 nv = (L - h) / VEC, t0 = h + nv * VEC;
  const float K = gs_ld(x, 0);
  constexpr bool X0 = sizeof(T) == 4;  // float: s0 = sum x as well (the mean's accuracy: see gs_stats)
  constexpr int NSUM = X0 ? 3 : 2;
  float v[NSUM];
#pragma unroll
  for (int k = 0; k < NSUM; ++k) v[k] = 0.0f;
  for (i64 i = tid; i < h; i += NT) gs_acc<NSUM>(v, gs_ld(x, i), K);
  for (i64 i = t0 + tid; i < L; i += NT) gs_acc<NSUM>(v, gs_ld(x, i), K);
  const T* xv = x + h;
  i64 j = tid;
  for (; j + 3 * NT < nv; j += 4 * NT) {
    Frag<T, VEC> f[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) f[u].load(xv + (j + u * NT) * VEC);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      float a[VEC];
      f[u].get(a);
#pragma unroll
      for (int e = 0; e < VEC; ++e) gs_acc<NSUM>(v, a[e], K);
    }
  }
  for (; j < nv; j += NT) {
    Frag<T, VEC> f;
    f.load(xv + j * VEC);
    float a[VEC];
    f.get(a);
#pragma unroll
    for (int e = 0; e < VEC; ++e) gs_acc<NSUM>(v, a[e], K);
  }
  gs_block_sum<NSUM>(v, red);
  if constexpr (CL > 1) {
    if (threadIdx.x == 0)
#pragma unroll
      for (int i = 0; i < NSUM; ++i) slot[i] = v[i];
    cluster_sync();
    float a[NSUM];
#pragma unroll
    for (int i = 0; i < NSUM; ++i) a[i] = 0.0f;
#pragma unroll
    for (int k = 0; k < CL; ++k)
#pragma unroll
      for (int i = 0; i < NSUM; ++i) a[i] += ld_dsmem(&slot[i], k);
#pragma unroll
    for (int i = 0; i < NSUM; ++i) v[i] = a[i];
    cluster_sync();  // (no block leaves while another reads its slot)
  }
  float mean, inv, m1;
  gs_stats(v[0], v[1], K, L, p.eps, mean, inv, m1, X0 ? &v[NSUM - 1] : nullptr);
  if ((p.flags & PYDNN_NORM_FLAG_STATS) && rank == 0 && threadIdx.x == 0) {
    const i64 si = n * p.set_stride[3][0] + g * p.set_stride[3][1];
    if (p.mean) p.mean[si] = mean;
    if (p.invstd) p.invstd[si] = inv;
  }
  float* ta = gs_dyn;
  float* tb = gs_dyn + cg;
  for (i64 q = threadIdx.x; q < cg; q += blockDim.x) {
    const i64 c = g * cg + q;
    const float a = inv * p.scale[c];
    ta[q] = a;
    tb[q] = p.bias ? p.bias[c] : 0.0f;  // y = (x - mean) a + bias
  }
  __syncthreads();
  const float alpha = (float)p.alpha, beta = (float)p.beta;
  const bool blend = p.flags & PYDNN_FLAG_BETA;
  // element i of the set -> its channel q (NCHW: i / S; NHWC, G == 1: i % C)
  for (i64 i = tid; i < h; i += NT) {
    const i64 q = nhwc ? i % cg : i / S;
    gs_st(y, i, (gs_ld(x, i) - mean) * ta[q] + tb[q], alpha, beta, blend);
  }
  for (i64 i = t0 + tid; i < L; i += NT) {
    const i64 q = nhwc ? i % cg : i / S;
    gs_st(y, i, (gs_ld(x, i) - mean) * ta[q] + tb[q], alpha, beta, blend);
  }
  T* yv = y + h;
  i64 u = tid;
  for (; u + NT < nv; u += 2 * NT) {  // two vectors in flight per thread
    Frag<T, VEC> f[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) f[k].load(xv + (nv - 1 - (u + k * NT)) * VEC);
#pragma unroll
    for (int k = 0; k < 2; ++k)
      gsp_apply<T, VEC>(f[k], yv, nv - 1 - (u + k * NT), h, S, cg, nhwc, mean, ta, tb, alpha, beta, blend);
  }
  if (u < nv) {
    Frag<T, VEC> f;
    f.load(xv + (nv - 1 - u) * VEC);
    gsp_apply<T, VEC>(f, yv, nv - 1 - u, h, S, cg, nhwc, mean, ta, tb, alpha, beta, blend);
  }
}

template <class T, int VEC>
__global__ void __launch_bounds__(kGsThreads, 2) gsp_fwd(const NormParams p) { gsp_fwd_body<T, VEC, 1>(p); }

// ------------------------------------------------------------------ gsc_fwd: NHWC, one sample's slab

// Thread layout of a slab of W channels (NCV = W / VEC channel vectors, NCV <= blockDim.x): thread t holds
// channel vector t % NCV of rows t / NCV, t / NCV + R, ... (R = blockDim.x / NCV rows per step).
// FLAT (gsf_fwd): the unit is one sample's whole (S x C) block walked in super-rows of P = lcm(C, VEC)
// elements (KR = P / C rows, S % KR == 0, the host's checks): position j of a super-row is channel j % C, so
// a thread's VEC positions keep their channels in every super-row and its loads are 16-byte vectors for any
// C (gsc_fwd's channel vectors shrink to 1 element for odd C). W = P, the tables per channel (C of them).
// One body for both (FLAT = false: gsc_fwd). Against the two copies it replaced (sm_90 PTX, 2026-11-28): the same
// floating-point instructions in the same order, so the same results bit for bit; the integer address code
// and the register allocation moved (gsc_fwd<float, 4> spills 12 bytes, gsc_fwd_cl<float, 2> no longer 4).
template <class T, int VEC, int CL, bool FLAT = false>
__device__ __forceinline__ void gsc_fwd_body(const NormParams& p) {
  extern __shared__ __align__(16) float gs_dyn[];  // red[NSUM][R * NCV * VEC], grp[NSUM][W / cg], gk[W / cg], ta[W], tb[W]
  constexpr bool X0 = sizeof(T) == 4;  // float: s0 = sum x as well (the mean's accuracy: see gs_stats)
  constexpr int NSUM = X0 ? 3 : 2;
  const i64 C = p.set_size[1], S = p.set_size[2], G = p.set_size[3];
  const i64 cg = C / G, W = p.el_size[0], NS = FLAT ? 1 : C / W;
  const i64 RS = FLAT ? W : C;                         // elements from one row (super-row) to the next
  const i64 SR = FLAT ? S / (W / C) : S;               // rows (super-rows) of the unit
  const int NCH = (int)(FLAT ? C : W);                 // channels of the unit (its tables' length)
  const int NCV = (int)(W / VEC), R = (int)blockDim.x / NCV, ngs = (int)(FLAT ? NCH / cg : W / cg);
  const i64 u = (i64)blockIdx.x / CL;
  const unsigned rank = CL > 1 ? cluster_rank() : 0u;
  const i64 n = u / NS, w0 = (u - n * NS) * W;
  const T* x = static_cast<const T*>(p.x) + n * S * C + w0;
  T* y = static_cast<T*>(p.out) + n * S * C + w0;
  const int cv = (int)threadIdx.x % NCV, rr = (int)threadIdx.x / NCV;
  const bool act = rr < R;
  const i64 RT = (i64)R * CL, r0 = (i64)rank * R + rr;
  float* red = gs_dyn;                         // [NSUM][R][NCV * VEC]
  float* grp = red + NSUM * R * NCV * VEC;       // [NSUM][ngs]
  float* gk = grp + NSUM * ngs;                  // [ngs]: each group's shift K (its element at position 0)
  float* ta = gk + ngs;                        // [NCH]
  float* tb = ta + NCH;
  for (int q = threadIdx.x; q < ngs; q += blockDim.x) gk[q] = gs_ld(x, (i64)q * cg);  // (read before any y)
  int ce[FLAT ? VEC : 1];  // FLAT: the channels of this thread's positions (j mod C)
  if constexpr (FLAT)
#pragma unroll
    for (int e = 0; e < VEC; ++e) ce[e] = (int)((cv * VEC + e) % C);
  // each channel's shift K: the group's first element (position 0). Float (3 sums a channel): read from
  // shared memory at each use (ta, free until after pass 1), the registers go to loads in flight (in
  // registers, gsc_fwd_cl<float, 4> spilled 24 bytes; 16-bit keeps K in registers as before).
  float K[X0 ? 1 : VEC], sv[VEC][NSUM];
  if constexpr (X0) {
    for (int c = threadIdx.x; c < NCH; c += blockDim.x) ta[c] = gs_ld(x, (c / cg) * cg);
    __syncthreads();
  }
  float Kf[FLAT && X0 ? VEC : 1];  // (FLAT float: the positions' channels are not contiguous: K in registers)
  const float* Ks = FLAT && X0 ? Kf : X0 ? ta + cv * VEC : K;
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    const int q = FLAT ? ce[FLAT ? e : 0] : cv * VEC + e;
    if constexpr (!X0) K[e] = gs_ld(x, (q / cg) * cg);
    if constexpr (FLAT && X0) Kf[e] = ta[q];
#pragma unroll
    for (int i = 0; i < NSUM; ++i) sv[e][i] = 0.0f;
  }
  if (act) {
    constexpr int UN = VEC >= 8 ? 2 : VEC >= 4 ? 4 : 8;  // rows in flight per thread
    i64 r = r0;
    for (; r + (UN - 1) * RT < SR; r += UN * RT) {
      Frag<T, VEC> f[UN];
#pragma unroll
      for (int k = 0; k < UN; ++k) f[k].load(x + (r + k * RT) * RS + cv * VEC);
#pragma unroll
      for (int k = 0; k < UN; ++k) {
        float a[VEC];
        f[k].get(a);
#pragma unroll
        for (int e = 0; e < VEC; ++e) gs_acc<NSUM>(sv[e], a[e], Ks[e]);
      }
    }
    for (; r < SR; r += RT) {
      Frag<T, VEC> f;
      f.load(x + r * RS + cv * VEC);
      float a[VEC];
      f.get(a);
#pragma unroll
      for (int e = 0; e < VEC; ++e) gs_acc<NSUM>(sv[e], a[e], Ks[e]);
    }
#pragma unroll
    for (int e = 0; e < VEC; ++e)
#pragma unroll
      for (int i = 0; i < NSUM; ++i) red[i * R * NCV * VEC + (rr * NCV + cv) * VEC + e] = sv[e][i];
  }
  __syncthreads();
  // per group of the slab: its channels, each over the R rows, in order
  for (int q = threadIdx.x; q < ngs; q += blockDim.x) {
    float a[NSUM];
#pragma unroll
    for (int i = 0; i < NSUM; ++i) a[i] = 0.0f;
    for (int c = q * (int)cg; c < (q + 1) * (int)cg; ++c)
      for (int j = c; j < (FLAT ? NCV * VEC : c + 1); j += (FLAT ? NCH : 1))  // (FLAT: the channel's KR positions)
        for (int k = 0; k < R; ++k)
#pragma unroll
          for (int i = 0; i < NSUM; ++i) a[i] += red[i * R * NCV * VEC + k * NCV * VEC + j];
#pragma unroll
    for (int i = 0; i < NSUM; ++i) grp[i * ngs + q] = a[i];
  }
  if constexpr (CL > 1) {
    cluster_sync();
    // every block sums the cluster's group partials in rank order, into its red (free: our threads are past
    // the loop above; NSUM * ngs <= NSUM * W <= NSUM * R * NCV * VEC)
    for (int q = threadIdx.x; q < ngs; q += blockDim.x) {
      float a[NSUM];
#pragma unroll
      for (int i = 0; i < NSUM; ++i) a[i] = 0.0f;
#pragma unroll
      for (int k = 0; k < CL; ++k)
#pragma unroll
        for (int i = 0; i < NSUM; ++i) a[i] += ld_dsmem(&grp[i * ngs + q], k);
#pragma unroll
      for (int i = 0; i < NSUM; ++i) red[i * ngs + q] = a[i];
    }
    cluster_sync();
    for (int q = threadIdx.x; q < ngs; q += blockDim.x)
#pragma unroll
      for (int i = 0; i < NSUM; ++i) grp[i * ngs + q] = red[i * ngs + q];
  }
  __syncthreads();
  const i64 L = cg * S;
  float* tm = red;  // [NCH] (red is free from here: NCH <= W <= R * NCV * VEC)
  for (int c = threadIdx.x; c < NCH; c += blockDim.x) {
    const int q = c / (int)cg;
    float mean, inv, m1;
    gs_stats(grp[q], grp[ngs + q], gk[q], L, p.eps, mean, inv, m1, X0 ? &grp[2 * ngs + q] : nullptr);
    const i64 ch = w0 + c;
    const float a = inv * p.scale[ch];
    ta[c] = a;
    tb[c] = p.bias ? p.bias[ch] : 0.0f;  // fp32: y = (x - mean) a + bias (the mean per channel in tm)
    tm[c] = mean;
    if constexpr (sizeof(T) == 2) tb[c] -= mean * a;  // 16-bit: y = x a + (bias - mean a): fewer registers, and
                                                      // the rounding of x a is far below y's
    if ((p.flags & PYDNN_NORM_FLAG_STATS) && rank == 0 && c == q * (int)cg) {
      const i64 si = n * p.set_stride[3][0] + (w0 / cg + q) * p.set_stride[3][1];
      if (p.mean) p.mean[si] = mean;
      if (p.invstd) p.invstd[si] = inv;
    }
  }
  __syncthreads();
  if (!act) return;
  const float alpha = (float)p.alpha, beta = (float)p.beta;
  const bool blend = p.flags & PYDNN_FLAG_BETA;
  const float* A = ta + (FLAT ? 0 : cv * VEC);  // (read from shared memory at each use: registers go to loads
  const float* B = tb + (FLAT ? 0 : cv * VEC);  // in flight; FLAT: at the positions' channels)
  const float* Mc = tm + (FLAT ? 0 : cv * VEC);
#define GS_CI(e) (FLAT ? ce[FLAT ? (e) : 0] : (e))
  // reverse row order: the most recently read lines first
  const i64 steps = SR > r0 ? (SR - 1 - r0) / RT + 1 : 0;
  constexpr int U2 = VEC * sizeof(T) >= 16 ? 2 : 4;  // rows in flight per thread
  i64 k = steps - 1;
  for (; k >= U2 - 1; k -= U2) {
    Frag<T, VEC> f[U2];
#pragma unroll
    for (int j = 0; j < U2; ++j) f[j].load(x + (r0 + (k - j) * RT) * RS + cv * VEC);
#pragma unroll
    for (int j = 0; j < U2; ++j) {
      float a[VEC];
      f[j].get(a);
#pragma unroll
      for (int e = 0; e < VEC; ++e) a[e] = (sizeof(T) == 2 ? a[e] : a[e] - Mc[GS_CI(e)]) * A[GS_CI(e)] + B[GS_CI(e)];
      gs_stv<T, VEC>(y + (r0 + (k - j) * RT) * RS + cv * VEC, f[j], a, alpha, beta, blend);
    }
  }
  for (; k >= 0; --k) {
    Frag<T, VEC> f;
    f.load(x + (r0 + k * RT) * RS + cv * VEC);
    float a[VEC];
    f.get(a);
#pragma unroll
    for (int e = 0; e < VEC; ++e) a[e] = (sizeof(T) == 2 ? a[e] : a[e] - Mc[GS_CI(e)]) * A[GS_CI(e)] + B[GS_CI(e)];
    gs_stv<T, VEC>(y + (r0 + k * RT) * RS + cv * VEC, f, a, alpha, beta, blend);
  }
}

#undef GS_CI

template <class T, int VEC>
__global__ void __launch_bounds__(kGsThreads, 2) gsc_fwd(const NormParams p) { gsc_fwd_body<T, VEC, 1>(p); }
template <class T, int VEC>
__global__ void __launch_bounds__(kGsThreads, 2) gsf_fwd(const NormParams p) { gsc_fwd_body<T, VEC, 1, true>(p); }

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
template <class T, int VEC>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kGsThreads, 2) gsp_fwd_cl(const NormParams p) {
  gsp_fwd_body<T, VEC, kCluster>(p);
}
template <class T, int VEC>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kGsThreads, 2) gsc_fwd_cl(const NormParams p) {
  gsc_fwd_body<T, VEC, kCluster>(p);
}
template <class T, int VEC>
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kGsThreads, 2) gsf_fwd_cl(const NormParams p) {
  gsc_fwd_body<T, VEC, kCluster, true>(p);
}
#else
template <class T, int VEC>
__global__ void gsp_fwd_cl(const NormParams) { __trap(); }  // the host never picks it before sm_90
template <class T, int VEC>
__global__ void gsc_fwd_cl(const NormParams) { __trap(); }
template <class T, int VEC>
__global__ void gsf_fwd_cl(const NormParams) { __trap(); }
#endif

// ------------------------------------------------------------------ backward

// Partials: A (sum dy) at ws[idx], B (sum dy * xhat) at ws[U + idx], U = N * C * K partials; idx = (n * C + c)
// * K + k (NCHW) or (n * K + k) * C + c (NHWC).

// gsp_bpart (NCHW): a warp per (plane n * C + c, chunk k of p.el_size[3] elements).
template <class T, int VEC>
__global__ void __launch_bounds__(kGsBpThreads) gsp_bpart(const NormParams p) {
  const i64 C = p.set_size[1], S = p.set_size[2], G = p.set_size[3], cg = C / G;
  const i64 K = p.el_size[1], CH = p.el_size[3], U = p.set_size[0] * C * K;
  const i64 unit = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (unit >= U) return;
  const int lane = threadIdx.x & 31;
  const i64 pl = unit / K, k = unit - pl * K;
  const i64 n = pl / C, c = pl - n * C, g = c / cg;
  const i64 si = n * p.set_stride[3][0] + g * p.set_stride[3][1];
  const float mean = p.mean[si], inv = p.invstd[si];
  const i64 start = pl * S + k * CH, end = min(start + CH, (pl + 1) * S);
  const T* x = static_cast<const T*>(p.x);
  const T* dy = static_cast<const T*>(p.dy);
  const i64 a0 = min(end, (start + VEC - 1) / VEC * VEC);
  const i64 nv = (end - a0) / VEC, t0 = a0 + nv * VEC;
  float sa = 0.0f, sb = 0.0f;
  for (i64 i = start + lane; i < a0; i += 32) { const float d = gs_ld(dy, i); sa += d; sb += d * (gs_ld(x, i) - mean); }
  for (i64 i = t0 + lane; i < end; i += 32) { const float d = gs_ld(dy, i); sa += d; sb += d * (gs_ld(x, i) - mean); }
  i64 j = lane;
  for (; j + 96 < nv; j += 128) {
    Frag<T, VEC> fx[4], fd[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) { fx[u].load(x + a0 + (j + 32 * u) * VEC); fd[u].load(dy + a0 + (j + 32 * u) * VEC); }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      float ax[VEC], ad[VEC];
      fx[u].get(ax); fd[u].get(ad);
#pragma unroll
      for (int e = 0; e < VEC; ++e) { sa += ad[e]; sb += ad[e] * (ax[e] - mean); }
    }
  }
  for (; j < nv; j += 32) {
    Frag<T, VEC> fx, fd;
    fx.load(x + a0 + j * VEC); fd.load(dy + a0 + j * VEC);
    float ax[VEC], ad[VEC];
    fx.get(ax); fd.get(ad);
#pragma unroll
    for (int e = 0; e < VEC; ++e) { sa += ad[e]; sb += ad[e] * (ax[e] - mean); }
  }
#pragma unroll
  for (int m = 16; m; m >>= 1) {
    sa += __shfl_xor_sync(0xffffffffu, sa, m);
    sb += __shfl_xor_sync(0xffffffffu, sb, m);
  }
  if (lane == 0) {
    p.ws[unit] = sa;
    p.ws[U + unit] = sb * inv;
  }
}

// gsc_bpart (NHWC): a block per (n, chunk k of p.el_size[3] positions), threads across the C / VEC channel
// vectors (blocks of channel vectors in turn when there are more of them than threads).
template <class T, int VEC>
__global__ void __launch_bounds__(kGsBpThreads) gsc_bpart(const NormParams p) {
  extern __shared__ __align__(16) float gs_dyn[];  // [2][R][NCVB * VEC]
  const i64 N = p.set_size[0], C = p.set_size[1], S = p.set_size[2], G = p.set_size[3], cg = C / G;
  const i64 K = p.el_size[1], RC = p.el_size[3], U = N * C * K;
  const i64 n = (i64)blockIdx.x / K, k = (i64)blockIdx.x - n * K;
  const i64 rs = k * RC, re = min(rs + RC, S);
  const int NCV = (int)(C / VEC), NCVB = min(NCV, (int)blockDim.x), R = (int)blockDim.x / NCVB;
  const int rr = (int)threadIdx.x / NCVB, cvl = (int)threadIdx.x % NCVB;
  const T* x = static_cast<const T*>(p.x) + n * S * C;
  const T* dy = static_cast<const T*>(p.dy) + n * S * C;
  float* red = gs_dyn;
  for (int cvb = 0; cvb < NCV; cvb += NCVB) {
    const int cv = cvb + cvl;
    const bool act = rr < R && cv < NCV;
    float sa[VEC], sb[VEC], mean[VEC], inv[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      sa[e] = 0.0f; sb[e] = 0.0f; mean[e] = 0.0f; inv[e] = 0.0f;
      if (act) {
        const i64 si = n * p.set_stride[3][0] + ((i64)cv * VEC + e) / cg * p.set_stride[3][1];
        mean[e] = p.mean[si];
        inv[e] = p.invstd[si];
      }
    }
    if (act) {
      i64 r = rs + rr;
      constexpr int UB = VEC >= 8 ? 4 : 8;  // rows in flight per thread (narrow vectors: more of them)
      for (; r + (UB - 1) * R < re; r += UB * R) {
        Frag<T, VEC> fx[UB], fd[UB];
#pragma unroll
        for (int u = 0; u < UB; ++u) {
          fx[u].load(x + (r + u * R) * C + cv * VEC);
          fd[u].load(dy + (r + u * R) * C + cv * VEC);
        }
#pragma unroll
        for (int u = 0; u < UB; ++u) {
          float ax[VEC], ad[VEC];
          fx[u].get(ax); fd[u].get(ad);
#pragma unroll
          for (int e = 0; e < VEC; ++e) { sa[e] += ad[e]; sb[e] += ad[e] * (ax[e] - mean[e]); }
        }
      }
      for (; r < re; r += R) {
        Frag<T, VEC> fx, fd;
        fx.load(x + r * C + cv * VEC); fd.load(dy + r * C + cv * VEC);
        float ax[VEC], ad[VEC];
        fx.get(ax); fd.get(ad);
#pragma unroll
        for (int e = 0; e < VEC; ++e) { sa[e] += ad[e]; sb[e] += ad[e] * (ax[e] - mean[e]); }
      }
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        red[(rr * NCVB + cvl) * VEC + e] = sa[e];
        red[R * NCVB * VEC + (rr * NCVB + cvl) * VEC + e] = sb[e] * inv[e];
      }
    }
    __syncthreads();
    for (int q = threadIdx.x; q < NCVB * VEC; q += blockDim.x) {
      const i64 c = (i64)cvb * VEC + q;
      if (c < C) {
        float a0 = 0.0f, a1 = 0.0f;
        for (int t = 0; t < R; ++t) { a0 += red[t * NCVB * VEC + q]; a1 += red[R * NCVB * VEC + t * NCVB * VEC + q]; }
        const i64 idx = (n * K + k) * C + c;
        p.ws[idx] = a0;
        p.ws[U + idx] = a1;
      }
    }
    __syncthreads();
  }
}

// gs_bred: per (n, c) the sums of its K chunks (in order) -> tot[n * C + c] (A) and tot[N * C + n * C + c]
// (B), tot = ws + 2 U. A thread per (n, c).
__global__ void __launch_bounds__(kGsBpThreads) gs_bred(const NormParams p) {
  const i64 N = p.set_size[0], C = p.set_size[1], K = p.el_size[1], U = N * C * K, NC = N * C;
  const bool nhwc = p.flags & GS_FLAG_NHWC;
  float* tot = p.ws + 2 * U;
  for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < NC; t += (i64)gridDim.x * blockDim.x) {
    const i64 n = t / C, c = t - n * C;
    float a = 0.0f, b = 0.0f;
    if (nhwc) {
      for (i64 k = 0; k < K; ++k) { const i64 i = (n * K + k) * C + c; a += p.ws[i]; b += p.ws[U + i]; }
    } else {
      for (i64 k = 0; k < K; ++k) { const i64 i = t * K + k; a += p.ws[i]; b += p.ws[U + i]; }
    }
    tot[t] = a;
    tot[NC + t] = b;
  }
}

// gs_bset: blocks [0, el_size[2]): a warp per (n, g): c1, c2 and the table tab[n * C + c] = (k1, mean, q, r)
// (gs_table: past the totals, 16-byte aligned); the other blocks: 32 channels each,
// dscale / dbias = alpha2 * (sum over n in order) + beta2 * old.
__global__ void __launch_bounds__(kGsBpThreads) gs_bset(const NormParams p) {
  __shared__ float part[2][8][33];
  const i64 N = p.set_size[0], C = p.set_size[1], S = p.set_size[2], G = p.set_size[3], cg = C / G;
  const i64 K = p.el_size[1], U = N * C * K, NC = N * C;
  const float* tot = p.ws + 2 * U;
  float4* tab = gs_table(p);
  const i64 nsb = p.el_size[2];
  if ((i64)blockIdx.x < nsb) {
    const i64 s = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (s >= N * G) return;
    const int lane = threadIdx.x & 31;
    const i64 n = s / G, g = s - n * G;
    float a = 0.0f, b = 0.0f;
    for (i64 q = lane; q < cg; q += 32) {
      const i64 c = g * cg + q;
      const float sc = p.scale[c];
      a += sc * tot[n * C + c];
      b += sc * tot[NC + n * C + c];
    }
#pragma unroll
    for (int m = 16; m; m >>= 1) {
      a += __shfl_xor_sync(0xffffffffu, a, m);
      b += __shfl_xor_sync(0xffffffffu, b, m);
    }
    const i64 si = n * p.set_stride[3][0] + g * p.set_stride[3][1];
    const float mean = p.mean[si], inv = p.invstd[si];
    const float len = (float)(cg * S);
    const float c1 = a / len, c2 = b / len;
    for (i64 q = lane; q < cg; q += 32) {
      const i64 c = g * cg + q;
      float4 v;
      v.x = inv * p.scale[c];
      v.y = mean;
      v.z = inv * inv * c2;
      v.w = inv * c1;
      tab[n * C + c] = v;
    }
    return;
  }
  // parameter gradients: 32 channels x 8 lanes over n
  const i64 c = ((i64)blockIdx.x - nsb) * 32 + (threadIdx.x & 31);
  const int ly = threadIdx.x >> 5;
  float a = 0.0f, b = 0.0f;
  if (c < C)
    for (i64 n = ly; n < N; n += 8) { a += tot[n * C + c]; b += tot[NC + n * C + c]; }
  part[0][ly][threadIdx.x & 31] = b;  // dscale: sum dy * xhat
  part[1][ly][threadIdx.x & 31] = a;  // dbias: sum dy
  __syncthreads();
  if (ly < 2 && c < C) {
    float t = 0.0f;
    for (int k = 0; k < 8; ++k) t += part[ly][k][threadIdx.x & 31];
    float* dst = ly == 0 ? p.dscale : p.dbias;
    if (dst) {
      float r = (float)p.alpha2 * t;
      if (p.flags & PYDNN_NORM_FLAG_BETA2) r += (float)p.beta2 * dst[c];
      dst[c] = r;
    }
  }
}

// dx of vector v (elements v * VEC ..), x and dy in fx, fd: dx = k1 dy - q (x - mean) - r from the table
template <class T, int VEC>
__device__ __forceinline__ void gs_bapply_vec(Frag<T, VEC>& fx, Frag<T, VEC>& fd, T* dx, const float4* tab, i64 v,
                                              i64 S, i64 C, bool nhwc, float alpha, float beta, bool blend) {
  float ax[VEC], ad[VEC];
  fx.get(ax); fd.get(ad);
  const i64 i0 = v * VEC;
  // (n * C + c) of element i: NCHW i / S; NHWC (i / (S C)) C + i % C
  i64 row, r;
  if (nhwc) { const i64 q = i0 / C; r = i0 - q * C; row = (q / S) * C + r; }
  else { row = i0 / S; r = i0 - row * S; }
  float4 t = tab[row];
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    ad[e] = t.x * ad[e] - t.z * (ax[e] - t.y) - t.w;
    if (e + 1 < VEC) {
      bool next;
      if (nhwc) {
        ++row;
        if (++r == C) { r = 0; row = ((i0 + e + 1) / (S * C)) * C; }
        next = true;
      } else {
        next = ++r == S;
        if (next) { r = 0; ++row; }
      }
      if (next) t = tab[row];
    }
  }
  gs_stv<T, VEC>(dx + v * VEC, fx, ad, alpha, beta, blend);
}

// gs_bapply: dx over the flat packed tensor, a grid-stride walk two vectors at a time.
template <class T, int VEC>
__global__ void __launch_bounds__(kGsBpThreads) gs_bapply(const NormParams p) {
  const i64 N = p.set_size[0], C = p.set_size[1], S = p.set_size[2];
  const i64 total = N * C * S, nv = total / VEC;
  const bool nhwc = p.flags & GS_FLAG_NHWC;
  const float4* tab = gs_table(p);
  const T* x = static_cast<const T*>(p.x);
  const T* dy = static_cast<const T*>(p.dy);
  T* dx = static_cast<T*>(p.out);
  const float alpha = (float)p.alpha, beta = (float)p.beta;
  const bool blend = p.flags & PYDNN_FLAG_BETA;
  const i64 step = (i64)gridDim.x * blockDim.x;
  for (i64 v = (i64)blockIdx.x * blockDim.x + threadIdx.x; v < nv; v += 2 * step) {  // two vectors in flight
    Frag<T, VEC> fx[2], fd[2];
    const bool two = v + step < nv;
    fx[0].load(x + v * VEC);
    fd[0].load(dy + v * VEC);
    if (two) {
      fx[1].load(x + (v + step) * VEC);
      fd[1].load(dy + (v + step) * VEC);
    }
    gs_bapply_vec<T, VEC>(fx[0], fd[0], dx, tab, v, S, C, nhwc, alpha, beta, blend);
    if (two) gs_bapply_vec<T, VEC>(fx[1], fd[1], dx, tab, v + step, S, C, nhwc, alpha, beta, blend);
  }
  // the tail (total % VEC elements): the first threads of block 0
  if (blockIdx.x == 0 && threadIdx.x < total - nv * VEC) {
    const i64 i = nv * VEC + threadIdx.x;
    const i64 row = nhwc ? (i / (S * C)) * C + i % C : i / S;
    const float4 t = tab[row];
    gs_st(dx, i, t.x * gs_ld(dy, i) - t.z * (gs_ld(x, i) - t.y) - t.w, alpha, beta, blend);
  }
}

}  // namespace norm_gs
}  // namespace pydnn
