// Batch normalization (cudnnBatchNormalization*): forward training / inference, backward, and the fused
// Ex forms (residual add, ReLU, mask in the reserve space). See batchnorm_params.h for the geometry and
// pydnn/ops/batchnorm.py for how the host chooses among the kernels:
//
//   row kernels (features contiguous in every operand: NHWC SPATIAL, NCHW PER_ACTIVATION)
//     fwd_stats / bwd_stats  block = (bx feature vectors) x (by row threads), one chunk of rows: each thread
//                            keeps per-feature statistics over its rows (kUnroll rows per step, merged
//                            into the running ones with Chan's formula), the block merges its by threads
//                            in a fixed tree, and writes one partial per (chunk, feature).
//     fwd_final / bwd_final  per feature: merge the chunks' partials in chunk order (in double), write the
//                            saved / running statistics or dscale / dbias, and 4 constants per feature.
//     fwd_apply / bwd_apply  one pass over the rows [row_begin, row_end): y (dx, dz) from x (dy, z, mask)
//                            and the constants. 16-byte accesses when the layout and pointers allow.
//     fwd_head_batched / bwd_head_batched  one block: the rows [row_begin, row_end) whose bytes held the constants
//                            (non-Ex calls keep partials and constants in y / dx, see the host); the
//                            block copies every constant to shared memory before it writes anything.
//     fwd_apply_saved        the plain forward's apply when the call keeps the saved statistics: the
//                            constants from bnScale / bnBias and the saved mean / inverse std, every row
//                            (no head); infer_rows_smem's code (rows_affine)
//     infer_rows / infer_rows_smem  inference over the rows; _smem (vector launches) computes each feature's
//                            constants once per block into shared memory, after the first loads are out.
//   super-rows (SR = true: bwd_stats / bwd_final / bwd_apply): packed NHWC whose C is no multiple of the
//                            16-byte vector (odd C). The rows are read as a matrix of R = rows / sr_k super-rows
//                            of L = sr_k * C elements (sr_k = VEC / gcd(C, VEC): L is a whole number of vectors),
//                            so a thread's 16-byte position j in a super-row holds the fixed channels (j + e) mod
//                            C: the row kernels' code at the full vector width, constants in registers. Partials
//                            per (chunk, slot of L) are, read as C-wide rows, (chunk * sr_k + k, channel): final
//                            merges them as chunk items (part_count<.., 1>). The rows past R * sr_k (fewer
//                            than sr_k) are one extra stats chunk (each element its own partial: count 1 or 0)
//                            and the apply's last block writes them element by element. With one position tile
//                            (L / VEC <= 256) the stats block merges each channel's sr_k slots itself (and the
//                            last one the rows past R * sr_k): one partial per (chunk, channel), part_count<.., 2>.
//   gen kernels (any strides): one block per feature walks its reduction elements twice (statistics,
//     then the outputs), so no memory outside the operands is needed; infer_gen: one thread per element.
//
// Statistics: Welford / Chan, never sum-of-squares minus square-of-sum: per thread, per step, the batch's
// mean and M2 are taken exactly from registers, then merged (M2 += M2b + d^2 n nb / (n + nb)); blocks and
// chunks merge the same way. Every merge order is fixed, so results are bitwise reproducible.
// Backward recomputes or takes the saved mean / inverse std; it merges the co-moment
// C = sum (x - mean_x)(dy - mean_dy) the same way, so sum(dy * xhat) never cancels catastrophically.
#include "common/params.h"
#include "common/types.cuh"
#include "batchnorm_params.h"

namespace pydnn {
namespace bn {

constexpr int kThreads = 256;          // row kernels and head kernels: threads per block
constexpr int kUnroll = 4;             // rows in flight per thread
constexpr int kUnroll16 = 8;           // the same for 16-bit data in the fwd_stats (bf16) / fwd_apply_plain
                                       // variants: a 16-byte vector holds half the bytes per element, so
                                       // twice the rows keep as many bytes in flight per thread
constexpr int kFinalX = 8, kFinalY = 32;  // final kernels: features x chunk lanes (32 lanes: the chunks'
                                          // merge chains stay short; loads batched kFinalU deep)
constexpr int kFinalU = 4;
constexpr int kHeadSmemBytes = 32768;  // head kernels: constants of every feature (host limits feats)
constexpr int kHeadThreads = 1024;     // head kernels: threads of their one block
constexpr int kGenThreads = 1024;      // gen kernels: threads per block at most (one block per feature)
constexpr int kGenThreadsBwd = 512;    // backward gen: more registers per thread (no spills)

enum { X = PYDNN_BN_OP_X, Y = PYDNN_BN_OP_Y, Z = PYDNN_BN_OP_Z, DY = PYDNN_BN_OP_DY, DX = PYDNN_BN_OP_DX,
       DZ = PYDNN_BN_OP_DZ };

// ------------------------------------------------------------------ vector access

struct __align__(16) U4 { unsigned x, y, z, w; };
struct __align__(8) U2 { unsigned x, y; };
template <int B> struct Raw;
template <> struct Raw<16> { typedef U4 type; };
template <> struct Raw<8> { typedef U2 type; };
template <> struct Raw<4> { typedef unsigned type; };
template <> struct Raw<2> { typedef unsigned short type; };
template <> struct Raw<1> { typedef unsigned char type; };

// VEC elements of T as one access of sizeof(T) * VEC bytes (the address is aligned to it).
template <class T, int VEC> union Pack {
  typename Raw<sizeof(T) * VEC>::type raw;
  T e[VEC];
};

template <class T, int VEC, class A> __device__ __forceinline__ void vload(const T* p, A* out) {
  Pack<T, VEC> k;
  k.raw = *reinterpret_cast<const typename Raw<sizeof(T) * VEC>::type*>(p);
#pragma unroll
  for (int e = 0; e < VEC; ++e) out[e] = load<A>(k.e[e]);
}

template <class T, int VEC, class A> __device__ __forceinline__ void vstore(T* p, const A* v) {
  if constexpr (sizeof(T) == 2 && VEC % 2 == 0 && sizeof(A) == 4) {  // paired conversions
    Pack<unsigned, VEC / 2> k;
#pragma unroll
    for (int i = 0; i < VEC / 2; ++i) k.e[i] = pack16x2<T>(v[2 * i], v[2 * i + 1]);
    *reinterpret_cast<typename Raw<sizeof(T) * VEC>::type*>(p) = k.raw;
  } else {
    Pack<T, VEC> k;
#pragma unroll
    for (int e = 0; e < VEC; ++e) k.e[e] = store<T>(v[e]);
    *reinterpret_cast<typename Raw<sizeof(T) * VEC>::type*>(p) = k.raw;
  }
}
// Raw loads kept packed in registers until used (half the registers of converted 16-bit values).
template <class T, int VEC> __device__ __forceinline__ Pack<T, VEC> rload(const T* p) {
  Pack<T, VEC> k;
  k.raw = *reinterpret_cast<const typename Raw<sizeof(T) * VEC>::type*>(p);
  return k;
}
template <class T, int VEC, class A> __device__ __forceinline__ void unpack(const Pack<T, VEC>& k, A* out) {
#pragma unroll
  for (int e = 0; e < VEC; ++e) out[e] = load<A>(k.e[e]);
}
template <int VEC> __device__ __forceinline__ void mstore(unsigned char* p, const bool* m) {
  Pack<unsigned char, VEC> k;
#pragma unroll
  for (int e = 0; e < VEC; ++e) k.e[e] = m[e] ? 1 : 0;
  *reinterpret_cast<typename Raw<VEC>::type*>(p) = k.raw;
}
template <int VEC> __device__ __forceinline__ void mload(const unsigned char* p, bool* m) {
  Pack<unsigned char, VEC> k;
  k.raw = *reinterpret_cast<const typename Raw<VEC>::type*>(p);
#pragma unroll
  for (int e = 0; e < VEC; ++e) m[e] = k.e[e] != 0;
}

// ------------------------------------------------------------------ statistics

// Chan's merge of (nb, mb, m2b) into (n, m, m2).
template <class A> __device__ __forceinline__ void merge(A& n, A& m, A& m2, A nb, A mb, A m2b) {
  if (nb == A(0)) return;
  const A nn = n + nb, d = mb - m, f = nb / nn;
  m += d * f;
  m2 += m2b + d * d * n * f;
  n = nn;
}
// The same for (x, dy) pairs: means, M2 of x and the co-moment C = sum (x - mx)(dy - my).
template <class A>
__device__ __forceinline__ void merge2(A& n, A& mx, A& m2, A& my, A& c, A nb, A mxb, A m2b, A myb, A cb) {
  if (nb == A(0)) return;
  const A nn = n + nb, dx = mxb - mx, dy = myb - my, f = nb / nn;
  mx += dx * f;
  my += dy * f;
  m2 += m2b + dx * dx * n * f;
  c += cb + dx * dy * n * f;
  n = nn;
}

// Forward finish of feature f from its (n, mean, M2): saved and running statistics, and the constants
// of the apply pass (scale * invstd, bias, mean).
template <class A> __device__ void fwd_finish(const BnParams& p, i64 f, double n, double m, double m2, A* c) {
  const double var = m2 / n;
  const double invstd = 1.0 / sqrt(var + p.eps);
  if (p.flags & PYDNN_BN_FLAG_SAVE) {
    ((A*)p.save_mean)[f] = (A)m;
    ((A*)p.save_invvar)[f] = (A)invstd;
  }
  if (p.flags & PYDNN_BN_FLAG_RUNNING) {
    const double unbiased = n > 1 ? m2 / (n - 1) : var;  // cuDNN's running variance: N / (N - 1)
    A* rm = (A*)p.mean;
    A* rv = (A*)p.var;
    if (p.factor == 1.0) {  // the old values are not read (they may be uninitialized)
      rm[f] = (A)m;
      rv[f] = (A)unbiased;
    } else {
      rm[f] = (A)((1.0 - p.factor) * (double)rm[f] + p.factor * m);
      rv[f] = (A)((1.0 - p.factor) * (double)rv[f] + p.factor * unbiased);
    }
  }
  c[0] = (A)((double)((const A*)p.scale)[f] * invstd);
  c[1] = ((const A*)p.bias)[f];
  c[2] = (A)m;
  c[3] = A(0);
}

// Backward finish of feature f from (n, mean x, M2 x, mean dy, C): dscale, dbias and the constants of
// dx = k1 * (dy - mean dy) + k2 * (x - mean), i.e. (k1, k2, mean, mean dy).
template <class A>
__device__ void bwd_finish(const BnParams& p, i64 f, double n, double mx, double m2, double my, double cxy, A* c) {
  double mean, invstd;
  if (p.flags & PYDNN_BN_FLAG_SAVED) {
    mean = (double)((const A*)p.save_mean)[f];
    invstd = (double)((const A*)p.save_invvar)[f];
  } else {
    mean = mx;
    invstd = 1.0 / sqrt(m2 / n + p.eps);
  }
  const double sdyx = cxy + n * (mx - mean) * my;  // sum dy * (x - mean)
  const double dgamma = sdyx * invstd, dbeta = n * my;
  A* ds = (A*)p.dscale;
  A* db = (A*)p.dbias;
  double vs = p.alpha_p * dgamma, vb = p.alpha_p * dbeta;
  if (p.flags & PYDNN_BN_FLAG_PBETA) {
    vs += p.beta_p * (double)ds[f];
    vb += p.beta_p * (double)db[f];
  }
  ds[f] = (A)vs;
  db[f] = (A)vb;
  const double k1 = p.alpha * (double)((const A*)p.scale)[f] * invstd;
  c[0] = (A)k1;
  c[1] = (A)(-k1 * invstd * dgamma / n);
  c[2] = (A)mean;
  c[3] = (A)my;
}

// One forward output before alpha / beta: normalize, add z, ReLU (pos: the ReLU's input was > 0).
template <class A> __device__ __forceinline__ A fwd_value(A x, const A* c, A z, unsigned flags, bool& pos) {
  A v = (x - c[2]) * c[0] + c[1];
  if (flags & PYDNN_BN_FLAG_Z) v += z;
  pos = v > A(0);
  if (flags & PYDNN_BN_FLAG_RELU) v = pos ? v : A(0);
  return v;
}

// Elements behind partial c of a feature: row chunks (chunk_rows rows each, the last shorter), or with NC
// the nc kernels' items (nc_g planes x nc_l elements, the last of each shorter; see nc_stats).
// SR 1 (position tiles): item c is (super-row chunk c / sr_k, row k = c mod sr_k of the super-row); chunks
// past the R super-rows are the tail's: one element each for its rows k < rows - R * sr_k, none for the others.
// SR 2 (one tile, the block merged each channel's slots): item c is chunk c, its super-rows times sr_k rows, the
// last one with the rows past the super-rows. chunk_rows: super-rows.
template <bool NC, int SR = 0> __device__ __forceinline__ double part_count(const BnParams& p, i64 c) {
  if constexpr (SR == 1) {
    const i64 ch = c / p.sr_k, k = c - ch * p.sr_k, r = p.rows / p.sr_k, c0 = ch * p.chunk_rows;
    if (c0 < r) return (double)min(p.chunk_rows, r - c0);
    return k < p.rows - r * p.sr_k ? 1.0 : 0.0;
  } else if constexpr (SR == 2) {
    const i64 r = p.rows / p.sr_k;
    return (double)(min(p.chunk_rows, r - c * p.chunk_rows) * p.sr_k + (c == p.chunks - 1 ? p.rows - r * p.sr_k : 0));
  } else if constexpr (NC) {
    const i64 ng = c / p.nc_k, k = c - ng * p.nc_k;
    return (double)(min(p.nc_g, p.nc_n - ng * p.nc_g) * min(p.nc_l, p.nc_hw - k * p.nc_l));
  } else {
    return (double)min(p.chunk_rows, p.rows - c * p.chunk_rows);
  }
}

// ------------------------------------------------------------------ row kernels

// Per-thread statistics over the rows [r0, r1) of VEC features at f0 (x only: forward), U rows in flight
// (loads kept packed until used: a 16-bit row of 8 features holds 4 registers, not 8).
template <class T, int VEC, int U, class A>
__device__ __forceinline__ void row_stats_x(const BnParams& p, i64 f0, i64 r0, i64 r1, i64 ld, A& n, A* m, A* m2) {
  typedef Pack<T, VEC> P;
  const T* x = (const T*)p.x + f0;
  const int by = blockDim.y;
  for (i64 r = r0; r < r1; r += (i64)by * U) {
    P raw[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const i64 rr = r + (i64)u * by;
      if (rr < r1) raw[u] = rload<T, VEC>(x + rr * ld);
      else raw[u].raw = typename Raw<sizeof(T) * VEC>::type{};  // all-zero bits: +0 in every type
    }
    const int k = (int)min((i64)U, (r1 - r + by - 1) / by);
    const A kb = (A)k, inv = A(1) / kb, nn = n + kb, f = kb / nn;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {  // converted where used: the packed rows are all that stays live
      A s = 0;
#pragma unroll
      for (int u = 0; u < U; ++u) s += load<A>(raw[u].e[e]);  // rows past r1 hold 0
      const A mb = s * inv;
      A q = 0;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const A d = load<A>(raw[u].e[e]) - mb;
        if (u < k) q += d * d;
      }
      const A d = mb - m[e];
      m[e] += d * f;
      m2[e] += q + d * d * n * f;
    }
    n = nn;
  }
}

// U: rows in flight per thread (kUnroll16 for 16-bit vectors, launched as one wave of long blocks).
// SR: the super-row view (see the top): feats, rows and the leading dim are L, R and L.
template <class T, int VEC, int U = kUnroll, bool SR = false>
__global__ void __launch_bounds__(kThreads, U == kUnroll ? 1 : 3) fwd_stats(const BnParams p) {
  typedef typename AccOf<T>::type A;
  __shared__ A s_n[kThreads], s_m[kThreads * VEC], s_m2[kThreads * VEC];
  const int bx = blockDim.x, by = blockDim.y, tx = threadIdx.x, ty = threadIdx.y, idx = ty * bx + tx;
  const i64 feats = SR ? p.feats * p.sr_k : p.feats, rows = SR ? p.rows / p.sr_k : p.rows;
  const i64 f0 = ((i64)blockIdx.x * bx + tx) * VEC;
  const bool live = f0 < feats;
  const i64 r0 = (i64)blockIdx.y * p.chunk_rows, r1 = min(rows, r0 + p.chunk_rows);
  A n = 0, m[VEC], m2[VEC];
#pragma unroll
  for (int e = 0; e < VEC; ++e) m[e] = m2[e] = A(0);
  if (live) row_stats_x<T, VEC, U>(p, f0, r0 + ty, r1, SR ? feats : p.ld[X], n, m, m2);
  s_n[idx] = n;
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    s_m[idx * VEC + e] = m[e];
    s_m2[idx * VEC + e] = m2[e];
  }
  __syncthreads();
  for (int s = by / 2; s > 0; s >>= 1) {  // fixed tree over the row threads
    if (ty < s) {
      const int o = idx + s * bx;
      const A nb = s_n[o];
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        A nn = n;
        merge(nn, m[e], m2[e], nb, s_m[o * VEC + e], s_m2[o * VEC + e]);
        s_m[idx * VEC + e] = m[e];
        s_m2[idx * VEC + e] = m2[e];
      }
      n += nb;
      s_n[idx] = n;
    }
    __syncthreads();
  }
  if (SR && gridDim.x == 1) {  // one position tile (SR 2): each channel's sr_k slots merged here, in order, and
    // the last chunk's block adds the rows past the super-rows: one partial per (chunk, channel)
    const i64 C = p.feats, t = blockIdx.y == gridDim.y - 1 ? p.rows - rows * p.sr_k : 0;
    for (i64 c = idx; c < C; c += bx * by) {
      A cn = 0, cm = 0, cm2 = 0;
      for (i64 i = 0; i < p.sr_k; ++i) {
        const i64 j = c + i * C;
        merge(cn, cm, cm2, s_n[j / VEC], s_m[j], s_m2[j]);
      }
      for (i64 r = 0; r < t; ++r) merge(cn, cm, cm2, A(1), load<A>(((const T*)p.x)[rows * feats + r * C + c]), A(0));
      A* part = (A*)p.partial + ((i64)blockIdx.y * C + c) * 2;
      part[0] = cm;
      part[1] = cm2;
    }
    return;
  }
  if (SR && r0 >= rows && ty == 0 && live) {  // the tail chunk: element f0 + e of super-row R, if it exists
    const i64 tail = (p.rows - rows * p.sr_k) * p.feats;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      m[e] = f0 + e < tail ? load<A>(((const T*)p.x)[rows * feats + f0 + e]) : A(0);
      m2[e] = A(0);
    }
  }
  if (ty == 0 && live) {
    A* part = (A*)p.partial + ((i64)blockIdx.y * feats + f0) * 2;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      part[2 * e] = m[e];
      part[2 * e + 1] = m2[e];
    }
  }
}

// Per feature: merge the chunks' partials (chunk order, double), then finish. Block kFinalX x kFinalY.
template <class A, bool NC = false, int SR = 0>
__global__ void __launch_bounds__(kFinalX * kFinalY) fwd_final(const BnParams p) {
  __shared__ double s_n[kFinalY][kFinalX], s_m[kFinalY][kFinalX], s_m2[kFinalY][kFinalX];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const i64 f = (i64)blockIdx.x * kFinalX + tx;
  const bool live = f < p.feats;
  double n = 0, m = 0, m2 = 0;
  const A* part = (const A*)p.partial;
  if (live) {
    for (i64 c0 = ty; c0 < p.chunks; c0 += kFinalY * kFinalU) {
      A q[kFinalU][2];
#pragma unroll
      for (int u = 0; u < kFinalU; ++u) {  // loads first: one L2 round trip per kFinalU chunks
        const i64 c = c0 + (i64)u * kFinalY;
        if (c < p.chunks) {
          q[u][0] = part[(c * p.feats + f) * 2];
          q[u][1] = part[(c * p.feats + f) * 2 + 1];
        }
      }
#pragma unroll
      for (int u = 0; u < kFinalU; ++u) {
        const i64 c = c0 + (i64)u * kFinalY;
        if (c < p.chunks)
          merge(n, m, m2, part_count<NC, SR>(p, c), (double)q[u][0], (double)q[u][1]);
      }
    }
  }
  s_n[ty][tx] = n;
  s_m[ty][tx] = m;
  s_m2[ty][tx] = m2;
  __syncthreads();
  for (int s = kFinalY / 2; s > 0; s >>= 1) {
    if (ty < s) {
      merge(n, m, m2, s_n[ty + s][tx], s_m[ty + s][tx], s_m2[ty + s][tx]);
      s_n[ty][tx] = n;
      s_m[ty][tx] = m;
      s_m2[ty][tx] = m2;
    }
    __syncthreads();
  }
  if (ty == 0 && live) {
    A c[4];
    fwd_finish<A>(p, f, n, m, m2, c);
    A* out = (A*)p.consts + f * 4;
#pragma unroll
    for (int k = 0; k < 4; ++k) out[k] = c[k];
  }
}

// y over rows [row_begin + blockIdx.y * chunk_rows, ...) for the VEC features of this thread. Loads stay
// packed until used; 2 blocks per SM at least (the register cap keeps 16 warps resident).
// SR: the super-row view (row_begin / row_end in super-rows); the last chunk's block (blockIdx.y 0) also
// writes the rows past them. SC: the constants from scale, bias and the saved statistics fwd_final wrote
// (FLAG_SAVE calls; the host's FWD_APPLY_SAVED: every row, no head).
template <class T, int VEC, int U = kUnroll, bool SR = false, bool SC = false>
__global__ void __launch_bounds__(kThreads, 3) fwd_apply(const BnParams p) {
  typedef typename AccOf<T>::type A;
  typedef Pack<T, VEC> P;
  const int bx = blockDim.x, by = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
  const i64 feats = SR ? p.feats * p.sr_k : p.feats;
  const i64 f0 = ((i64)blockIdx.x * bx + tx) * VEC;
  if (f0 >= feats) return;
  const unsigned flags = p.flags;
  const A alpha = (A)p.alpha, beta = (A)p.beta;
  A c[VEC][4];
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    const i64 f = SR ? (f0 + e) % p.feats : f0 + e;
    if constexpr (SC) {  // (fwd_finish's constants from its outputs: scale * saved invstd, bias, saved mean)
      c[e][0] = ((const A*)p.scale)[f] * ((const A*)p.save_invvar)[f];
      c[e][1] = ((const A*)p.bias)[f];
      c[e][2] = ((const A*)p.save_mean)[f];
    } else {
      const A* cs = (const A*)p.consts + f * 4;
#pragma unroll
      for (int k = 0; k < 3; ++k) c[e][k] = cs[k];
    }
    c[e][3] = A(0);
  }
  // Last chunk first: the stats pass read the rows in order, so the end of x is what L2 still holds.
  const i64 start = p.row_begin + (i64)(gridDim.y - 1 - blockIdx.y) * p.chunk_rows;
  const i64 end = min(p.row_end, start + p.chunk_rows);
  const T* x = (const T*)p.x + f0;
  const T* z = (const T*)p.z + f0;
  T* y = (T*)p.y + f0;
  const i64 lx = SR ? feats : p.ld[X], ly = SR ? feats : p.ld[Y], lz = SR ? feats : p.ld[Z];
  for (i64 r = start + ty; r < end; r += (i64)by * U) {
    P xv[U];  // only x is prefetched: z and the old y (Ex, blending) are loaded where used, so the
                    // plain forward keeps few registers (3 blocks of 256 per SM)
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const i64 rr = r + (i64)u * by;
      if (rr < end) xv[u] = rload<T, VEC>(x + rr * lx);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const i64 rr = r + (i64)u * by;
      if (rr < end) {
        A xa[VEC], za[VEC], o[VEC];
        bool pos[VEC];
        unpack(xv[u], xa);
        if (flags & PYDNN_BN_FLAG_Z) unpack(rload<T, VEC>(z + rr * lz), za);
#pragma unroll
        for (int e = 0; e < VEC; ++e) o[e] = alpha * fwd_value(xa[e], c[e], (flags & PYDNN_BN_FLAG_Z) ? za[e] : A(0), flags, pos[e]);
        if (flags & PYDNN_BN_FLAG_BETA) {
          A ya[VEC];
          unpack(rload<T, VEC>(y + rr * ly), ya);
#pragma unroll
          for (int e = 0; e < VEC; ++e) o[e] += beta * ya[e];
        }
        vstore<T, VEC>(y + rr * ly, o);
        if (flags & PYDNN_BN_FLAG_MASK) mstore<VEC>(p.mask + rr * lx + f0, pos);
      }
    }
  }
  if (SR && blockIdx.y == 0 && ty == 0) {  // the rows past the super-rows: element f0 + e of super-row R
    const i64 r = p.rows / p.sr_k, tail = (p.rows - r * p.sr_k) * p.feats, i0 = r * feats;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      if (f0 + e < tail) {
        const i64 i = i0 + e;
        bool pos;
        A o = alpha * fwd_value(load<A>(x[i]), c[e], (flags & PYDNN_BN_FLAG_Z) ? load<A>(z[i]) : A(0), flags, pos);
        if (flags & PYDNN_BN_FLAG_BETA) o += beta * load<A>(y[i]);
        y[i] = store<T>(o);
        if (flags & PYDNN_BN_FLAG_MASK) p.mask[i0 + f0 + e] = pos ? 1 : 0;
      }
    }
  }
}

// Plain forward (no z, ReLU, mask or blending), 16-bit vectors: y = (x - mean) * (alpha * scale * invstd)
// + alpha * bias with the VEC channels' three constants in registers, U rows in flight per thread. With
// alpha == 1 every value is bitwise the one fwd_apply gives.
template <class T, int VEC, int U>
__global__ void __launch_bounds__(kThreads, 3) fwd_apply_plain(const BnParams p) {
  typedef typename AccOf<T>::type A;
  typedef Pack<T, VEC> P;
  const int by = blockDim.y, ty = threadIdx.y;
  const int f0 = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;  // feats < 2^31 (host: shared-memory limit)
  if (f0 >= p.feats) return;
  const A alpha = (A)p.alpha;
  A s[VEC], t[VEC], mu[VEC];
  const A* cs = (const A*)p.consts + f0 * 4;
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    s[e] = alpha * cs[e * 4];
    t[e] = alpha * cs[e * 4 + 1];
    mu[e] = cs[e * 4 + 2];
  }
  const i64 start = p.row_begin + (i64)(gridDim.y - 1 - blockIdx.y) * p.chunk_rows;  // last chunk first (L2)
  const i64 end = min(p.row_end, start + p.chunk_rows);
  const i64 lx = p.ld[X], ly = p.ld[Y];
  const T* x = (const T*)p.x + f0 + (start + ty) * lx;
  T* y = (T*)p.y + f0 + (start + ty) * ly;
  const i64 sx = (i64)by * lx, sy = (i64)by * ly;  // one row thread's stride
  for (i64 r = start + ty; r < end; r += (i64)by * U, x += sx * U, y += sy * U) {
    P xv[U];  // every load of the step issued before the first use
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (r + (i64)u * by < end) xv[u] = rload<T, VEC>(x + u * sx);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (r + (i64)u * by < end) {
        A xa[VEC], o[VEC];
        unpack(xv[u], xa);
#pragma unroll
        for (int e = 0; e < VEC; ++e) o[e] = (xa[e] - mu[e]) * s[e] + t[e];
        vstore<T, VEC>(y + u * sy, o);
      }
    }
  }
}

// The rows whose bytes held the constants (non-Ex calls): one block of kHeadThreads, every constant copied to
// shared memory before the first write over them, then a thread per channel (its constants in registers) over
// the rows, H at a time with every load of a batch issued before the first use. (The one-element-per-step heads
// of 256 threads waited one memory round trip per element: ~8 us for 8 rows of 256 channels, ~30 us for 1305
// channels; a flat walk of 1024 x 8 elements with a division per element was instruction-bound on its one SM:
// 10.6 us for 8 rows of 1305, 5.5 us for 4 of 1315; H200, tools/profile_memory_points.py.)
template <class A, int H> __device__ __forceinline__ void head_consts(const BnParams& p, A* s_c) {
  const int t = threadIdx.x, G = blockDim.x, nc = (int)p.feats * 4;
  const A* cs = (const A*)p.consts;
  for (int i0 = t; i0 < nc; i0 += G * H) {
    A v[H];
#pragma unroll
    for (int k = 0; k < H; ++k)
      if (i0 + k * G < nc) v[k] = cs[i0 + k * G];
#pragma unroll
    for (int k = 0; k < H; ++k)
      if (i0 + k * G < nc) s_c[i0 + k * G] = v[k];
  }
  __syncthreads();  // every constant read before the first write over them
}

template <class T, int H> __global__ void __launch_bounds__(kHeadThreads) fwd_head_batched(const BnParams p) {
  typedef typename AccOf<T>::type A;
  __shared__ A s_c[kHeadSmemBytes / sizeof(A)];
  head_consts<A, H>(p, s_c);
  const int feats = (int)p.feats;
  const A alpha = (A)p.alpha, beta = (A)p.beta;
  const unsigned flags = p.flags;
  const T* x = (const T*)p.x;
  const T* z = (const T*)p.z;
  T* y = (T*)p.y;
  const i64 lx = p.ld[X], ly = p.ld[Y], lz = p.ld[Z];
  for (int f = threadIdx.x; f < feats; f += blockDim.x) {
    const A c[4] = {s_c[f * 4], s_c[f * 4 + 1], s_c[f * 4 + 2], s_c[f * 4 + 3]};
    for (i64 r0 = p.row_begin; r0 < p.row_end; r0 += H) {
      A xv[H], zv[H];
#pragma unroll
      for (int k = 0; k < H; ++k) {
        const i64 r = r0 + k;
        xv[k] = zv[k] = A(0);
        if (r < p.row_end) {
          xv[k] = load<A>(x[r * lx + f]);
          if (flags & PYDNN_BN_FLAG_Z) zv[k] = load<A>(z[r * lz + f]);
        }
      }
#pragma unroll
      for (int k = 0; k < H; ++k) {
        const i64 r = r0 + k;
        if (r < p.row_end) {
          T* yp = y + r * ly + f;
          bool pos;
          A o = alpha * fwd_value(xv[k], c, zv[k], flags, pos);
          if (flags & PYDNN_BN_FLAG_BETA) o += beta * load<A>(*yp);
          *yp = store<T>(o);
          if (flags & PYDNN_BN_FLAG_MASK) p.mask[r * lx + f] = pos ? 1 : 0;
        }
      }
    }
  }
}

// Backward: x, dy (masked by the reserve's ReLU mask) of VEC features at f0 over rows [r0, r1).
template <class T, int VEC, class A>
__device__ __forceinline__ void row_load_xdy(const BnParams& p, i64 f0, i64 rr, i64 lx, i64 ldy, A* xv, A* dv) {
  vload<T, VEC>((const T*)p.x + rr * lx + f0, xv);
  vload<T, VEC>((const T*)p.dy + rr * ldy + f0, dv);
  if (p.flags & PYDNN_BN_FLAG_MASK) {
    bool m[VEC];
    mload<VEC>(p.mask + rr * lx + f0, m);
#pragma unroll
    for (int e = 0; e < VEC; ++e) dv[e] = m[e] ? dv[e] : A(0);
  }
}

// SR: the super-row view (see the top): feats, rows and the leading dims are L, R and L.
template <class T, int VEC, int U = kUnroll, bool SR = false>
__global__ void __launch_bounds__(kThreads) bwd_stats(const BnParams p) {
  typedef typename AccOf<T>::type A;
  __shared__ A s_n[kThreads], s_s[4][kThreads * VEC];
  const int bx = blockDim.x, by = blockDim.y, tx = threadIdx.x, ty = threadIdx.y, idx = ty * bx + tx;
  const i64 feats = SR ? p.feats * p.sr_k : p.feats, rows = SR ? p.rows / p.sr_k : p.rows;
  const i64 lx = SR ? feats : p.ld[X], ldy = SR ? feats : p.ld[DY];
  const i64 f0 = ((i64)blockIdx.x * bx + tx) * VEC;
  const bool live = f0 < feats;
  const i64 r0 = (i64)blockIdx.y * p.chunk_rows, r1 = min(rows, r0 + p.chunk_rows);
  A n = 0, mx[VEC], m2[VEC], my[VEC], cc[VEC];
#pragma unroll
  for (int e = 0; e < VEC; ++e) mx[e] = m2[e] = my[e] = cc[e] = A(0);
  if (live) {
    for (i64 r = r0 + ty; r < r1; r += (i64)by * U) {
      A xv[U][VEC], dv[U][VEC];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const i64 rr = r + (i64)u * by;
        if (rr < r1) row_load_xdy<T, VEC>(p, f0, rr, lx, ldy, xv[u], dv[u]);
        else {
#pragma unroll
          for (int e = 0; e < VEC; ++e) xv[u][e] = dv[u][e] = A(0);
        }
      }
      const int k = (int)min((i64)U, (r1 - r + by - 1) / by);
      const A kb = (A)k, inv = A(1) / kb;
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        A sx = 0, sy = 0;
#pragma unroll
        for (int u = 0; u < U; ++u) {
          sx += xv[u][e];
          sy += dv[u][e];
        }
        const A bx_ = sx * inv, by_ = sy * inv;
        A q = 0, cb = 0;
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const A d = xv[u][e] - bx_, g = dv[u][e] - by_;
          if (u < k) {
            q += d * d;
            cb += d * g;
          }
        }
        A nn = n;
        merge2(nn, mx[e], m2[e], my[e], cc[e], kb, bx_, q, by_, cb);
      }
      n += kb;
    }
  }
  s_n[idx] = n;
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    s_s[0][idx * VEC + e] = mx[e];
    s_s[1][idx * VEC + e] = m2[e];
    s_s[2][idx * VEC + e] = my[e];
    s_s[3][idx * VEC + e] = cc[e];
  }
  __syncthreads();
  for (int s = by / 2; s > 0; s >>= 1) {
    if (ty < s) {
      const int o = idx + s * bx;
      const A nb = s_n[o];
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        A nn = n;
        const int j = o * VEC + e, i = idx * VEC + e;
        merge2(nn, mx[e], m2[e], my[e], cc[e], nb, s_s[0][j], s_s[1][j], s_s[2][j], s_s[3][j]);
        s_s[0][i] = mx[e];
        s_s[1][i] = m2[e];
        s_s[2][i] = my[e];
        s_s[3][i] = cc[e];
      }
      n += nb;
      s_n[idx] = n;
    }
    __syncthreads();
  }
  if (SR && gridDim.x == 1) {  // one position tile (SR 2): as fwd_stats, with (x, dy') pairs
    const i64 C = p.feats, t = blockIdx.y == gridDim.y - 1 ? p.rows - rows * p.sr_k : 0;
    for (i64 c = idx; c < C; c += bx * by) {
      A cn = 0, cx = 0, c2 = 0, cy = 0, cc_ = 0;
      for (i64 i = 0; i < p.sr_k; ++i) {
        const i64 j = c + i * C;
        merge2(cn, cx, c2, cy, cc_, s_n[j / VEC], s_s[0][j], s_s[1][j], s_s[2][j], s_s[3][j]);
      }
      for (i64 r = 0; r < t; ++r) {
        const i64 i = rows * feats + r * C + c;
        A dv = load<A>(((const T*)p.dy)[i]);
        if ((p.flags & PYDNN_BN_FLAG_MASK) && !p.mask[i]) dv = A(0);
        merge2(cn, cx, c2, cy, cc_, A(1), load<A>(((const T*)p.x)[i]), A(0), dv, A(0));
      }
      A* part = (A*)p.partial + ((i64)blockIdx.y * C + c) * 4;
      part[0] = cx;
      part[1] = c2;
      part[2] = cy;
      part[3] = cc_;
    }
    return;
  }
  if (SR && r0 >= rows && ty == 0 && live) {  // the tail chunk: element f0 + e of super-row R, if it exists
    const i64 tail = (p.rows - rows * p.sr_k) * p.feats;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const i64 i = rows * feats + f0 + e;
      const bool in = f0 + e < tail;
      A dv = in ? load<A>(((const T*)p.dy)[i]) : A(0);
      if (in && (p.flags & PYDNN_BN_FLAG_MASK) && !p.mask[i]) dv = A(0);
      mx[e] = in ? load<A>(((const T*)p.x)[i]) : A(0);
      my[e] = dv;
      m2[e] = cc[e] = A(0);
    }
  }
  if (ty == 0 && live) {
    A* part = (A*)p.partial + ((i64)blockIdx.y * feats + f0) * 4;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      part[4 * e] = mx[e];
      part[4 * e + 1] = m2[e];
      part[4 * e + 2] = my[e];
      part[4 * e + 3] = cc[e];
    }
  }
}

template <class A, bool NC = false, int SR = 0>
__global__ void __launch_bounds__(kFinalX * kFinalY) bwd_final(const BnParams p) {
  __shared__ double s[5][kFinalY][kFinalX];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const i64 f = (i64)blockIdx.x * kFinalX + tx;
  const bool live = f < p.feats;
  double n = 0, mx = 0, m2 = 0, my = 0, cc = 0;
  const A* part = (const A*)p.partial;
  if (live) {
    for (i64 c0 = ty; c0 < p.chunks; c0 += kFinalY * kFinalU) {
      A q[kFinalU][4];
#pragma unroll
      for (int u = 0; u < kFinalU; ++u) {
        const i64 c = c0 + (i64)u * kFinalY;
        if (c < p.chunks) {
#pragma unroll
          for (int k = 0; k < 4; ++k) q[u][k] = part[(c * p.feats + f) * 4 + k];
        }
      }
#pragma unroll
      for (int u = 0; u < kFinalU; ++u) {
        const i64 c = c0 + (i64)u * kFinalY;
        if (c < p.chunks)
          merge2(n, mx, m2, my, cc, part_count<NC, SR>(p, c), (double)q[u][0],
                 (double)q[u][1], (double)q[u][2], (double)q[u][3]);
      }
    }
  }
  s[0][ty][tx] = n;
  s[1][ty][tx] = mx;
  s[2][ty][tx] = m2;
  s[3][ty][tx] = my;
  s[4][ty][tx] = cc;
  __syncthreads();
  for (int h = kFinalY / 2; h > 0; h >>= 1) {
    if (ty < h) {
      merge2(n, mx, m2, my, cc, s[0][ty + h][tx], s[1][ty + h][tx], s[2][ty + h][tx], s[3][ty + h][tx],
             s[4][ty + h][tx]);
      s[0][ty][tx] = n;
      s[1][ty][tx] = mx;
      s[2][ty][tx] = m2;
      s[3][ty][tx] = my;
      s[4][ty][tx] = cc;
    }
    __syncthreads();
  }
  if (ty == 0 && live) {
    A c[4];
    bwd_finish<A>(p, f, n, mx, m2, my, cc, c);
    A* out = (A*)p.consts + f * 4;
#pragma unroll
    for (int k = 0; k < 4; ++k) out[k] = c[k];
  }
}

// Backward statistics with the saved mean (FLAG_SAVED; the host's BWD_SUMS): what bwd_finish needs of x and dy
// when the mean and inverse std are given is sum dy' and sum dy' (x - mean), so each thread keeps those two sums
// per feature (PyTorch's channels-last reduce does the same) instead of bwd_stats's four moments merged every
// kUnroll rows: a few operations per element, far fewer registers. Partials: 2 per (chunk, feature) in the same
// places as bwd_stats's 4 (every mode: rows, the 1-element rows, the super-rows with one or several position
// tiles, the tail's chunk); bwd_sums_final adds them in chunk order. The thread's rows, the block's tree and the
// chunks are summed in fixed orders: bitwise reproducible. The mean is subtracted before the products, so the
// sums never cancel more than the data do.
template <class T, int VEC, int U = kUnroll, bool SR = false>
__global__ void __launch_bounds__(kThreads) bwd_sums(const BnParams p) {
  typedef typename AccOf<T>::type A;
  typedef Pack<T, VEC> P;
  __shared__ A s_s[2][kThreads * VEC];
  const int bx = blockDim.x, by = blockDim.y, tx = threadIdx.x, ty = threadIdx.y, idx = ty * bx + tx;
  const i64 feats = SR ? p.feats * p.sr_k : p.feats, rows = SR ? p.rows / p.sr_k : p.rows;
  const i64 lx = SR ? feats : p.ld[X], ldy = SR ? feats : p.ld[DY];
  const i64 f0 = ((i64)blockIdx.x * bx + tx) * VEC;
  const bool live = f0 < feats, msk = p.flags & PYDNN_BN_FLAG_MASK;
  const i64 r0 = (i64)blockIdx.y * p.chunk_rows, r1 = min(rows, r0 + p.chunk_rows);
  const A* sm = (const A*)p.save_mean;
  A mean[VEC], sy[VEC], sxy[VEC];
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    sy[e] = sxy[e] = A(0);
    mean[e] = live ? sm[SR ? (f0 + e) % p.feats : f0 + e] : A(0);
  }
  if (live) {
    const T* x = (const T*)p.x + f0;
    const T* dy = (const T*)p.dy + f0;
    for (i64 r = r0 + ty; r < r1; r += (i64)by * U) {
      P xv[U], dv[U];
      Pack<unsigned char, VEC> mv[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const i64 rr = r + (i64)u * by;
        if (rr < r1) {
          xv[u] = rload<T, VEC>(x + rr * lx);
          dv[u] = rload<T, VEC>(dy + rr * ldy);
          if (msk) mv[u].raw = *reinterpret_cast<const typename Raw<VEC>::type*>(p.mask + rr * lx + f0);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (r + (i64)u * by < r1) {
          A xa[VEC], da[VEC];
          unpack(xv[u], xa);
          unpack(dv[u], da);
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            const A d = (msk && !mv[u].e[e]) ? A(0) : da[e];
            sy[e] += d;
            sxy[e] += (xa[e] - mean[e]) * d;
          }
        }
      }
    }
  }
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    s_s[0][idx * VEC + e] = sy[e];
    s_s[1][idx * VEC + e] = sxy[e];
  }
  __syncthreads();
  for (int s = by / 2; s > 0; s >>= 1) {
    if (ty < s) {
      const int o = (idx + s * bx) * VEC, i = idx * VEC;
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        sy[e] += s_s[0][o + e];
        sxy[e] += s_s[1][o + e];
        s_s[0][i + e] = sy[e];
        s_s[1][i + e] = sxy[e];
      }
    }
    __syncthreads();
  }
  if (SR && gridDim.x == 1) {  // one position tile: each channel's sr_k slots (and the last block the rows past
                               // the super-rows), one partial per (chunk, channel)
    const i64 C = p.feats, t = blockIdx.y == gridDim.y - 1 ? p.rows - rows * p.sr_k : 0;
    for (i64 c = idx; c < C; c += bx * by) {
      A cy = 0, cxy = 0;
      for (i64 i = 0; i < p.sr_k; ++i) {
        cy += s_s[0][c + i * C];
        cxy += s_s[1][c + i * C];
      }
      const A m = sm[c];
      for (i64 r = 0; r < t; ++r) {
        const i64 i = rows * feats + r * C + c;
        A dv = load<A>(((const T*)p.dy)[i]);
        if (msk && !p.mask[i]) dv = A(0);
        cy += dv;
        cxy += (load<A>(((const T*)p.x)[i]) - m) * dv;
      }
      A* part = (A*)p.partial + ((i64)blockIdx.y * C + c) * 2;
      part[0] = cy;
      part[1] = cxy;
    }
    return;
  }
  if (SR && r0 >= rows && ty == 0 && live) {  // the tail chunk: element f0 + e of super-row R, if it exists
    const i64 tail = (p.rows - rows * p.sr_k) * p.feats;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const i64 i = rows * feats + f0 + e;
      const bool in = f0 + e < tail;
      A dv = in ? load<A>(((const T*)p.dy)[i]) : A(0);
      if (in && msk && !p.mask[i]) dv = A(0);
      sy[e] = dv;
      sxy[e] = in ? (load<A>(((const T*)p.x)[i]) - mean[e]) * dv : A(0);
    }
  }
  if (ty == 0 && live) {
    A* part = (A*)p.partial + ((i64)blockIdx.y * feats + f0) * 2;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      part[2 * e] = sy[e];
      part[2 * e + 1] = sxy[e];
    }
  }
}

// bwd_sums's partials of feature f: item c at (c * feats + f) * 2 in every mode (super-rows with position tiles:
// chunks x sr_k items, read as C-wide rows), summed in item order in double, then bwd_finish with the saved mean.
template <class A> __global__ void __launch_bounds__(kFinalX * kFinalY) bwd_sums_final(const BnParams p) {
  __shared__ double s[2][kFinalY][kFinalX];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const i64 f = (i64)blockIdx.x * kFinalX + tx;
  const bool live = f < p.feats;
  double sy = 0, sxy = 0;
  const A* part = (const A*)p.partial;
  if (live) {
    for (i64 c0 = ty; c0 < p.chunks; c0 += kFinalY * kFinalU) {
      A q[kFinalU][2];
#pragma unroll
      for (int u = 0; u < kFinalU; ++u) {
        const i64 c = c0 + (i64)u * kFinalY;
        if (c < p.chunks) {
          q[u][0] = part[(c * p.feats + f) * 2];
          q[u][1] = part[(c * p.feats + f) * 2 + 1];
        }
      }
#pragma unroll
      for (int u = 0; u < kFinalU; ++u) {
        if (c0 + (i64)u * kFinalY < p.chunks) {
          sy += (double)q[u][0];
          sxy += (double)q[u][1];
        }
      }
    }
  }
  s[0][ty][tx] = sy;
  s[1][ty][tx] = sxy;
  __syncthreads();
  for (int h = kFinalY / 2; h > 0; h >>= 1) {
    if (ty < h) {
      sy += s[0][ty + h][tx];
      sxy += s[1][ty + h][tx];
      s[0][ty][tx] = sy;
      s[1][ty][tx] = sxy;
    }
    __syncthreads();
  }
  if (ty == 0 && live) {
    const double n = (double)p.rows, mean = (double)((const A*)p.save_mean)[f];
    A c[4];
    bwd_finish<A>(p, f, n, mean, 0.0, sy / n, sxy, c);  // (mx = the saved mean: sum dy' (x - mean) is sxy)
    A* out = (A*)p.consts + f * 4;
#pragma unroll
    for (int k = 0; k < 4; ++k) out[k] = c[k];
  }
}

// dx = k1 * (dy' - mean dy) + k2 * (x - mean) (+ beta * dx); dz = alpha * dy' (+ beta * dz), dy' masked.
template <class A> __device__ __forceinline__ A bwd_value(A x, A d, const A* c) {
  return c[0] * (d - c[3]) + c[1] * (x - c[2]);
}

// The backward's 4 constants of feature f from the outputs and inputs instead of p.consts (SC, the host's
// BWD_APPLY_SAVED: saved mean / inverse std given, dscale / dbias not blended, alpha_p != 0): bwd_finish's with
// dgamma = dscale / alpha_p and n * mean dy = dbias / alpha_p, in A (nc_apply calls it at every channel change:
// double there took 94 registers against 80). Nothing of dx then holds constants: no head.
template <class A> __device__ __forceinline__ void bwd_consts_saved(const BnParams& p, i64 f, A* c) {
  const A invstd = ((const A*)p.save_invvar)[f], rn = A(1) / (A)p.rows, rap = A(1) / (A)p.alpha_p;
  const A k1 = (A)p.alpha * ((const A*)p.scale)[f] * invstd;
  c[0] = k1;
  c[1] = -k1 * invstd * (((const A*)p.dscale)[f] * rap) * rn;
  c[2] = ((const A*)p.save_mean)[f];
  c[3] = ((const A*)p.dbias)[f] * rap * rn;
}

// SR: the super-row view (row_begin / row_end in super-rows); the last chunk's block (blockIdx.y 0) also
// writes the rows past them. SC: the constants from bwd_consts_saved.
template <class T, int VEC, int U = kUnroll, bool SR = false, bool SC = false>
__global__ void __launch_bounds__(kThreads, 2) bwd_apply(const BnParams p) {
  typedef typename AccOf<T>::type A;
  typedef Pack<T, VEC> P;
  const int bx = blockDim.x, by = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
  const i64 feats = SR ? p.feats * p.sr_k : p.feats;
  const i64 f0 = ((i64)blockIdx.x * bx + tx) * VEC;
  if (f0 >= feats) return;
  const unsigned flags = p.flags;
  const A alpha = (A)p.alpha, beta = (A)p.beta;
  A c[VEC][4];
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    const i64 f = SR ? (f0 + e) % p.feats : f0 + e;
    if constexpr (SC) {
      bwd_consts_saved<A>(p, f, c[e]);
    } else {
      const A* cs = (const A*)p.consts + f * 4;
#pragma unroll
      for (int k = 0; k < 4; ++k) c[e][k] = cs[k];
    }
  }
  const i64 start = p.row_begin + (i64)(gridDim.y - 1 - blockIdx.y) * p.chunk_rows;  // last chunk first (L2)
  const i64 end = min(p.row_end, start + p.chunk_rows);
  const T* x = (const T*)p.x + f0;
  const T* dy = (const T*)p.dy + f0;
  T* dx = (T*)p.dx + f0;
  T* dz = (T*)p.dz + f0;
  const i64 lx = SR ? feats : p.ld[X], ldy = SR ? feats : p.ld[DY], ldx = SR ? feats : p.ld[DX],
            ldz = SR ? feats : p.ld[DZ];
  const bool blend = flags & PYDNN_BN_FLAG_BETA, wdz = flags & PYDNN_BN_FLAG_DZ, msk = flags & PYDNN_BN_FLAG_MASK;
  for (i64 r = start + ty; r < end; r += (i64)by * U) {
    P xv[U], dv[U];  // the old dx / dz (blending) are loaded where used
    Pack<unsigned char, VEC> mv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const i64 rr = r + (i64)u * by;
      if (rr < end) {
        xv[u] = rload<T, VEC>(x + rr * lx);
        dv[u] = rload<T, VEC>(dy + rr * ldy);
        if (msk) mv[u].raw = *reinterpret_cast<const typename Raw<VEC>::type*>(p.mask + rr * lx + f0);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const i64 rr = r + (i64)u * by;
      if (rr < end) {
        A xa[VEC], da[VEC], o[VEC];
        unpack(xv[u], xa);
        unpack(dv[u], da);
        if (msk) {
#pragma unroll
          for (int e = 0; e < VEC; ++e) da[e] = mv[u].e[e] ? da[e] : A(0);
        }
#pragma unroll
        for (int e = 0; e < VEC; ++e) o[e] = bwd_value(xa[e], da[e], c[e]);
        if (blend) {
          A oa[VEC];
          unpack(rload<T, VEC>(dx + rr * ldx), oa);
#pragma unroll
          for (int e = 0; e < VEC; ++e) o[e] += beta * oa[e];
        }
        vstore<T, VEC>(dx + rr * ldx, o);
        if (wdz) {
#pragma unroll
          for (int e = 0; e < VEC; ++e) o[e] = alpha * da[e];
          if (blend) {
            A oa[VEC];
            unpack(rload<T, VEC>(dz + rr * ldz), oa);
#pragma unroll
            for (int e = 0; e < VEC; ++e) o[e] += beta * oa[e];
          }
          vstore<T, VEC>(dz + rr * ldz, o);
        }
      }
    }
  }
  if (SR && blockIdx.y == 0 && ty == 0) {  // the rows past the super-rows: element f0 + e of super-row R
    const i64 r = p.rows / p.sr_k, tail = (p.rows - r * p.sr_k) * p.feats, i0 = r * feats;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      if (f0 + e < tail) {
        const i64 i = i0 + e;
        A d = load<A>(dy[i]);
        if (msk && !p.mask[i0 + f0 + e]) d = A(0);
        A o = bwd_value(load<A>(x[i]), d, c[e]);
        if (blend) o += beta * load<A>(dx[i]);
        dx[i] = store<T>(o);
        if (wdz) {
          A oz = alpha * d;
          if (blend) oz += beta * load<A>(dz[i]);
          dz[i] = store<T>(oz);
        }
      }
    }
  }
}

// The backward's head (fwd_head_batched's shape): dx (dz) of the rows whose bytes held the constants.
template <class T, int H> __global__ void __launch_bounds__(kHeadThreads) bwd_head_batched(const BnParams p) {
  typedef typename AccOf<T>::type A;
  __shared__ A s_c[kHeadSmemBytes / sizeof(A)];
  head_consts<A, H>(p, s_c);
  const int feats = (int)p.feats;
  const A alpha = (A)p.alpha, beta = (A)p.beta;
  const unsigned flags = p.flags;
  const bool msk = flags & PYDNN_BN_FLAG_MASK, blend = flags & PYDNN_BN_FLAG_BETA, wdz = flags & PYDNN_BN_FLAG_DZ;
  const T* x = (const T*)p.x;
  const T* dy = (const T*)p.dy;
  T* dx = (T*)p.dx;
  T* dz = (T*)p.dz;
  const i64 lx = p.ld[X], ldy = p.ld[DY], ldx = p.ld[DX], ldz = p.ld[DZ];
  for (int f = threadIdx.x; f < feats; f += blockDim.x) {
    const A c[4] = {s_c[f * 4], s_c[f * 4 + 1], s_c[f * 4 + 2], s_c[f * 4 + 3]};
    for (i64 r0 = p.row_begin; r0 < p.row_end; r0 += H) {
      A xv[H], dv[H];
      bool mv[H];
#pragma unroll
      for (int k = 0; k < H; ++k) {
        const i64 r = r0 + k;
        xv[k] = dv[k] = A(0);
        mv[k] = true;
        if (r < p.row_end) {
          xv[k] = load<A>(x[r * lx + f]);
          dv[k] = load<A>(dy[r * ldy + f]);
          if (msk) mv[k] = p.mask[r * lx + f] != 0;
        }
      }
#pragma unroll
      for (int k = 0; k < H; ++k) {
        const i64 r = r0 + k;
        if (r < p.row_end) {
          const A d = mv[k] ? dv[k] : A(0);
          T* dxp = dx + r * ldx + f;
          A o = bwd_value(xv[k], d, c);
          if (blend) o += beta * load<A>(*dxp);
          *dxp = store<T>(o);
          if (wdz) {
            T* dzp = dz + r * ldz + f;
            A oz = alpha * d;
            if (blend) oz += beta * load<A>(*dzp);
            *dzp = store<T>(oz);
          }
        }
      }
    }
  }
}

// Inference: y = alpha * ((x - mean) * scale / sqrt(var + eps) + bias) + beta * y.
template <class T, int VEC, int U = kUnroll>
__global__ void __launch_bounds__(kThreads, 3) infer_rows(const BnParams p) {
  typedef typename AccOf<T>::type A;
  typedef Pack<T, VEC> P;
  const int bx = blockDim.x, by = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
  const i64 f0 = ((i64)blockIdx.x * bx + tx) * VEC;
  if (f0 >= p.feats) return;
  const A alpha = (A)p.alpha, beta = (A)p.beta;
  A a[VEC], b[VEC];  // y = x * a + b: a = alpha * scale / sqrt(var + eps), b = alpha * (bias - mean * a)
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    const i64 f = f0 + e;
    const A s = ((const A*)p.scale)[f] / m_sqrt(((const A*)p.var)[f] + (A)p.eps);
    a[e] = alpha * s;
    b[e] = alpha * (((const A*)p.bias)[f] - ((const A*)p.mean)[f] * s);
  }
  const bool blend = p.flags & PYDNN_BN_FLAG_BETA;
  const i64 start = p.row_begin + (i64)blockIdx.y * p.chunk_rows, end = min(p.row_end, start + p.chunk_rows);
  const i64 lx = p.ld[X], ly = p.ld[Y], sx = (i64)by * lx, sy = (i64)by * ly;  // sx, sy: one row thread's step
  const T* x = (const T*)p.x + f0 + (start + ty) * lx;
  T* y = (T*)p.y + f0 + (start + ty) * ly;
  for (i64 r = start + ty; r < end; r += (i64)by * U, x += sx * U, y += sy * U) {
    P xv[U];  // the old y (blending) is loaded where used: few registers, 3 blocks per SM at least
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (r + (i64)u * by < end) xv[u] = rload<T, VEC>(x + u * sx);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (r + (i64)u * by < end) {
        A xa[VEC], o[VEC];
        unpack(xv[u], xa);
#pragma unroll
        for (int e = 0; e < VEC; ++e) o[e] = xa[e] * a[e] + b[e];
        if (blend) {
          A ya[VEC];
          unpack(rload<T, VEC>(y + u * sy), ya);
#pragma unroll
          for (int e = 0; e < VEC; ++e) o[e] += beta * ya[e];
        }
        vstore<T, VEC>(y + u * sy, o);
      }
    }
  }
}

// infer_rows_smem: infer_rows with the per-feature set-up shared and overlapped. infer_rows has each of
// the by row threads of a feature vector compute the same VEC (a, b) pairs (4 parameter loads, a division
// and a square root per feature) before it issues any load of x: per byte of x, 16-bit data pays twice
// fp32's set-up, and every block starts with a gap in its memory traffic. Here the block's first U rows are
// loaded first, then each thread computes (a, b) for at most a few of the block's bx * VEC features into
// shared memory (the same expressions, so bitwise infer_rows' values), one barrier, and the rows stream on.
// bf16 inference 88.3% of copy against infer_rows' 82.2% at 2-step blocks (H200, tools/bench_batchnorm.py).
// The streaming pass of infer_rows_smem and fwd_apply_saved: y = (x - mu) * a (+ b) (+ beta * y) with each
// feature's (a, b, mu) computed once per block into shared memory, after the block's first rows' loads are out.
// TRAIN false (inference): a = alpha * scale / sqrt(var + eps), b = alpha * (bias - mean * a / alpha), mu = 0
// (y = x * a + b, bitwise infer_rows'). TRAIN true (the training forward's apply): a = alpha * scale *
// saved invstd, b = alpha * bias, mu = saved mean (fwd_apply_plain's expression, a within an ulp of its
// constant); its blocks take the rows last chunk first, as fwd_apply does (the stats pass left the end of x
// in L2).
template <class T, int VEC, int U, bool TRAIN>
__device__ __forceinline__ void rows_affine(const BnParams& p) {
  typedef typename AccOf<T>::type A;
  typedef Pack<T, VEC> P;
  __shared__ A s_ab[3][32 * VEC];  // the block's bx * VEC features (the host's bx is at most 32)
  const int bx = blockDim.x, by = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
  const i64 fb = (i64)blockIdx.x * bx * VEC, f0 = fb + (i64)tx * VEC;  // the block's and the thread's first
  const bool live = f0 < p.feats;  // no early return: every thread takes part in the set-up and the barrier
  const i64 chunk = TRAIN ? (i64)(gridDim.y - 1 - blockIdx.y) : (i64)blockIdx.y;
  const i64 start = p.row_begin + chunk * p.chunk_rows, end = min(p.row_end, start + p.chunk_rows);
  const i64 lx = p.ld[X], ly = p.ld[Y], sx = (i64)by * lx, sy = (i64)by * ly;
  const T* x = (const T*)p.x + f0 + (start + ty) * lx;
  T* y = (T*)p.y + f0 + (start + ty) * ly;
  i64 r = start + ty;
  P xv[U];
#pragma unroll
  for (int u = 0; u < U; ++u)  // the first step's loads go out before the set-up
    if (live && r + (i64)u * by < end) xv[u] = rload<T, VEC>(x + u * sx);
  const A alpha = (A)p.alpha, beta = (A)p.beta;
  const int nf = (int)min((i64)bx * VEC, p.feats - fb);
  for (int i = ty * bx + tx; i < nf; i += bx * by) {
    const i64 f = fb + i;
    if (TRAIN) {
      s_ab[0][i] = alpha * (((const A*)p.scale)[f] * ((const A*)p.save_invvar)[f]);
      s_ab[1][i] = alpha * ((const A*)p.bias)[f];
      s_ab[2][i] = ((const A*)p.save_mean)[f];
    } else {
      const A s = ((const A*)p.scale)[f] / m_sqrt(((const A*)p.var)[f] + (A)p.eps);
      s_ab[0][i] = alpha * s;
      s_ab[1][i] = alpha * (((const A*)p.bias)[f] - ((const A*)p.mean)[f] * s);
    }
  }
  __syncthreads();
  if (!live) return;
  A a[VEC], b[VEC], mu[VEC];
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    a[e] = s_ab[0][tx * VEC + e];
    b[e] = s_ab[1][tx * VEC + e];
    mu[e] = TRAIN ? s_ab[2][tx * VEC + e] : A(0);
  }
  const bool blend = p.flags & PYDNN_BN_FLAG_BETA;
  for (;;) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (r + (i64)u * by < end) {
        A xa[VEC], o[VEC];
        unpack(xv[u], xa);
#pragma unroll
        for (int e = 0; e < VEC; ++e) o[e] = TRAIN ? (xa[e] - mu[e]) * a[e] + b[e] : xa[e] * a[e] + b[e];
        if (blend) {
          A ya[VEC];
          unpack(rload<T, VEC>(y + u * sy), ya);
#pragma unroll
          for (int e = 0; e < VEC; ++e) o[e] += beta * ya[e];
        }
        vstore<T, VEC>(y + u * sy, o);
      }
    }
    r += (i64)by * U;
    if (r >= end) break;
    x += sx * U;
    y += sy * U;
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (r + (i64)u * by < end) xv[u] = rload<T, VEC>(x + u * sx);
  }
}

template <class T, int VEC, int U = kUnroll>
__global__ void __launch_bounds__(kThreads, 3) infer_rows_smem(const BnParams p) {
  rows_affine<T, VEC, U, false>(p);
}

// The training forward's apply where the call keeps the saved statistics (the host's APPLY_SAVED): the
// constants come from the caller's bnScale / bnBias and the saved mean / inverse std that fwd_final wrote,
// not from the scratch, so a non-Ex call needs no head pass over the rows that held the constants, and its
// short blocks (infer_rows_smem's geometry) stream as the inference does.
template <class T, int VEC, int U = kUnroll>
__global__ void __launch_bounds__(kThreads, 3) fwd_apply_saved(const BnParams p) {
  rows_affine<T, VEC, U, true>(p);
}

// ------------------------------------------------------------------ gen kernels (any strides)

__device__ __forceinline__ void feat_off(const BnParams& p, i64 f, i64* off) {
#pragma unroll
  for (int k = 0; k < PYDNN_BN_OPS; ++k) off[k] = 0;
  for (int d = p.nfd - 1; d >= 0; --d) {
    const i64 s = p.fsize[d], q = f / s, c = f - q * s;
#pragma unroll
    for (int k = 0; k < PYDNN_BN_OPS; ++k) off[k] += c * p.fstride[k][d];
    f = q;
  }
}
__device__ __forceinline__ void red_off(const BnParams& p, i64 i, const i64* base, i64* off) {
#pragma unroll
  for (int k = 0; k < PYDNN_BN_OPS; ++k) off[k] = base[k];
  if (p.flags & PYDNN_BN_FLAG_IDX32) {  // 32-bit divisions (a quarter of the 64-bit cost)
    unsigned r = (unsigned)i;
    for (int d = p.nrd - 1; d >= 0; --d) {
      const unsigned s = (unsigned)p.rsize[d], q = r / s;
      const i64 c = (i64)(r - q * s);
#pragma unroll
      for (int k = 0; k < PYDNN_BN_OPS; ++k) off[k] += c * p.rstride[k][d];
      r = q;
    }
    return;
  }
  for (int d = p.nrd - 1; d >= 0; --d) {
    const i64 s = p.rsize[d], q = i / s, c = i - q * s;
#pragma unroll
    for (int k = 0; k < PYDNN_BN_OPS; ++k) off[k] += c * p.rstride[k][d];
    i = q;
  }
}

// Fixed-order tree over the block's threads (blockDim.x a power of two <= kThreads) of NV values each.
template <class A, int NV, int NT> __device__ __forceinline__ void block_merge(A* v, A (*sm)[NT]) {
  const int t = threadIdx.x;
#pragma unroll
  for (int k = 0; k < NV; ++k) sm[k][t] = v[k];
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s) {
      if constexpr (NV == 3) merge(v[0], v[1], v[2], sm[0][t + s], sm[1][t + s], sm[2][t + s]);
      else merge2(v[0], v[1], v[2], v[3], v[4], sm[0][t + s], sm[1][t + s], sm[2][t + s], sm[3][t + s], sm[4][t + s]);
#pragma unroll
      for (int k = 0; k < NV; ++k) sm[k][t] = v[k];
    }
    __syncthreads();
  }
}

template <class T> __global__ void __launch_bounds__(kGenThreads) fwd_fused_gen(const BnParams p) {
  typedef typename AccOf<T>::type A;
  __shared__ double sm[3][kGenThreads];  // statistics in double: one thread may see millions of values
  __shared__ A s_c[4];
  const T* x = (const T*)p.x;
  const T* z = (const T*)p.z;
  T* y = (T*)p.y;
  const A alpha = (A)p.alpha, beta = (A)p.beta;
  const int t = threadIdx.x, G = blockDim.x;
  for (i64 f = blockIdx.x; f < p.feats; f += gridDim.x) {
    i64 fo[PYDNN_BN_OPS], o[PYDNN_BN_OPS];
    feat_off(p, f, fo);
    double v[3] = {0, 0, 0};  // n, mean, M2: kUnroll loads in flight, their batch merged (Chan)
    for (i64 i0 = t; i0 < p.rows; i0 += (i64)G * kUnroll) {
      double xv[kUnroll];
      int k = 0;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        xv[u] = 0;
        const i64 i = i0 + (i64)u * G;
        if (i < p.rows) {
          red_off(p, i, fo, o);
          xv[u] = load<double>(x[o[X]]);
          k = u + 1;
        }
      }
      double sx = 0, q = 0;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) sx += xv[u];
      const double mb = sx / k;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (u < k) q += (xv[u] - mb) * (xv[u] - mb);
      merge(v[0], v[1], v[2], (double)k, mb, q);
    }
    block_merge<double, 3, kGenThreads>(v, sm);
    if (t == 0) {
      A c[4];
      fwd_finish<A>(p, f, v[0], v[1], v[2], c);
#pragma unroll
      for (int k = 0; k < 4; ++k) s_c[k] = c[k];
    }
    __syncthreads();
    A c[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) c[k] = s_c[k];
    for (i64 i = t; i < p.rows; i += G) {
      red_off(p, i, fo, o);
      const A xv = load<A>(x[o[X]]);
      const A zv = (p.flags & PYDNN_BN_FLAG_Z) ? load<A>(z[o[Z]]) : A(0);
      bool pos;
      A r = alpha * fwd_value(xv, c, zv, p.flags, pos);
      if (p.flags & PYDNN_BN_FLAG_BETA) r += beta * load<A>(y[o[Y]]);
      y[o[Y]] = store<T>(r);
      if (p.flags & PYDNN_BN_FLAG_MASK) p.mask[o[X]] = pos ? 1 : 0;
    }
    __syncthreads();  // s_c and sm are reused by the next feature
  }
}

template <class T> __global__ void __launch_bounds__(kGenThreadsBwd) bwd_fused_gen(const BnParams p) {
  typedef typename AccOf<T>::type A;
  __shared__ double sm[5][kGenThreadsBwd];
  __shared__ A s_c[4];
  const T* x = (const T*)p.x;
  const T* dy = (const T*)p.dy;
  T* dx = (T*)p.dx;
  T* dz = (T*)p.dz;
  const A alpha = (A)p.alpha, beta = (A)p.beta;
  const bool blend = p.flags & PYDNN_BN_FLAG_BETA, mask = p.flags & PYDNN_BN_FLAG_MASK;
  const int t = threadIdx.x, G = blockDim.x;
  for (i64 f = blockIdx.x; f < p.feats; f += gridDim.x) {
    i64 fo[PYDNN_BN_OPS], o[PYDNN_BN_OPS];
    feat_off(p, f, fo);
    double v[5] = {0, 0, 0, 0, 0};  // n, mean x, M2 x, mean dy, co-moment
    for (i64 i0 = t; i0 < p.rows; i0 += (i64)G * kUnroll) {
      double xv[kUnroll], dv[kUnroll];
      int k = 0;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        xv[u] = dv[u] = 0;
        const i64 i = i0 + (i64)u * G;
        if (i < p.rows) {
          red_off(p, i, fo, o);
          xv[u] = load<double>(x[o[X]]);
          dv[u] = load<double>(dy[o[DY]]);
          if (mask && !p.mask[o[X]]) dv[u] = 0;
          k = u + 1;
        }
      }
      double sx = 0, sy = 0, q = 0, c = 0;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        sx += xv[u];
        sy += dv[u];
      }
      const double mx = sx / k, my = sy / k;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (u < k) {
          q += (xv[u] - mx) * (xv[u] - mx);
          c += (xv[u] - mx) * (dv[u] - my);
        }
      merge2(v[0], v[1], v[2], v[3], v[4], (double)k, mx, q, my, c);
    }
    block_merge<double, 5, kGenThreadsBwd>(v, sm);
    if (t == 0) {
      A c[4];
      bwd_finish<A>(p, f, v[0], v[1], v[2], v[3], v[4], c);
#pragma unroll
      for (int k = 0; k < 4; ++k) s_c[k] = c[k];
    }
    __syncthreads();
    A c[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) c[k] = s_c[k];
    for (i64 i = t; i < p.rows; i += G) {
      red_off(p, i, fo, o);
      const A xv = load<A>(x[o[X]]);
      A dv = load<A>(dy[o[DY]]);
      if (mask && !p.mask[o[X]]) dv = A(0);
      A r = bwd_value(xv, dv, c);
      if (blend) r += beta * load<A>(dx[o[DX]]);
      dx[o[DX]] = store<T>(r);
      if (p.flags & PYDNN_BN_FLAG_DZ) {
        A rz = alpha * dv;
        if (blend) rz += beta * load<A>(dz[o[DZ]]);
        dz[o[DZ]] = store<T>(rz);
      }
    }
    __syncthreads();
  }
}

// Inference, any strides: one thread per element (feature-major order: f = j / rows).
template <class T> __global__ void __launch_bounds__(kThreads) infer_gen(const BnParams p) {
  typedef typename AccOf<T>::type A;
  const A alpha = (A)p.alpha, beta = (A)p.beta, eps = (A)p.eps;
  const i64 total = p.rows * p.feats, step = (i64)gridDim.x * blockDim.x;
  for (i64 j = (i64)blockIdx.x * blockDim.x + threadIdx.x; j < total; j += step) {
    const i64 f = (p.flags & PYDNN_BN_FLAG_IDX32) ? (i64)((unsigned)j / (unsigned)p.rows) : j / p.rows;
    const i64 i = j - f * p.rows;
    i64 fo[PYDNN_BN_OPS], o[PYDNN_BN_OPS];
    feat_off(p, f, fo);
    red_off(p, i, fo, o);
    const A a = ((const A*)p.scale)[f] / m_sqrt(((const A*)p.var)[f] + eps);
    A r = alpha * ((load<A>(((const T*)p.x)[o[X]]) - ((const A*)p.mean)[f]) * a + ((const A*)p.bias)[f]);
    T* yp = (T*)p.y + o[Y];
    if (p.flags & PYDNN_BN_FLAG_BETA) r += beta * load<A>(*yp);
    *yp = store<T>(r);
  }
}


// ------------------------------------------------------------------ planes: gen with VEC-element vectors

// fwd_fused_gen / bwd_fused_gen for layouts whose innermost reduction dim is contiguous (stride 1) in
// every operand, its size and every other reduction / feature stride a multiple of VEC, pointers (and the
// mask) aligned to the vector (NCHW SPATIAL: x as (N, C, H*W) planes). Item i of a feature is the VEC
// elements from reduction index i * VEC (a vector never straddles the contiguous dim), so the division
// of red_off runs once per vector and every access moves 16 bytes (the mask: VEC bytes). One block per
// feature, the same two passes; each step's kUnroll vectors (loads kept packed until used) are one Chan
// batch of up to kUnroll * VEC values. A fixed order: reproducible (not bitwise the scalar gen kernels).
constexpr int kPlanesBwdU = 2;       // bwd_planes: vectors per step of the output pass
constexpr int kPlanesThreads = 512;  // fwd_planes: threads per block at most (1024 spills at 64 registers)

template <class T, int VEC> __global__ void __launch_bounds__(kPlanesThreads, 1) fwd_planes(const BnParams p) {
  typedef typename AccOf<T>::type A;
  __shared__ double sm[3][kPlanesThreads];
  __shared__ A s_c[4];
  const T* x = (const T*)p.x;
  const T* z = (const T*)p.z;
  T* y = (T*)p.y;
  const A alpha = (A)p.alpha, beta = (A)p.beta;
  const int t = threadIdx.x, G = blockDim.x;
  const i64 nv = p.rows / VEC;
  for (i64 f = blockIdx.x; f < p.feats; f += gridDim.x) {
    i64 fo[PYDNN_BN_OPS], o[PYDNN_BN_OPS];
    feat_off(p, f, fo);
    double v[3] = {0, 0, 0};
    for (i64 i0 = t; i0 < nv; i0 += (i64)G * kUnroll) {
      Pack<T, VEC> k[kUnroll];
      int cnt = 0;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const i64 i = i0 + (i64)u * G;
        if (i < nv) {
          red_off(p, i * VEC, fo, o);
          k[u] = rload<T, VEC>(x + o[X]);
          cnt = u + 1;
        }
      }
      double sx = 0, q = 0;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (u < cnt)
#pragma unroll
          for (int e = 0; e < VEC; ++e) sx += load<double>(k[u].e[e]);
      const double n = (double)(cnt * VEC), mb = sx / n;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (u < cnt)
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            const double d = load<double>(k[u].e[e]) - mb;
            q += d * d;
          }
      merge(v[0], v[1], v[2], n, mb, q);
    }
    block_merge<double, 3, kPlanesThreads>(v, sm);
    if (t == 0) {
      A c[4];
      fwd_finish<A>(p, f, v[0], v[1], v[2], c);
#pragma unroll
      for (int k = 0; k < 4; ++k) s_c[k] = c[k];
    }
    __syncthreads();
    A c[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) c[k] = s_c[k];
    // outputs: kUnroll vectors per step, their x (and z) loads all issued before the first store
    for (i64 i0 = t; i0 < nv; i0 += (i64)G * kUnroll) {
      i64 ou[kUnroll][PYDNN_BN_OPS];
      Pack<T, VEC> kx[kUnroll], kz[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const i64 i = i0 + (i64)u * G;
        if (i < nv) {
          red_off(p, i * VEC, fo, ou[u]);
          kx[u] = rload<T, VEC>(x + ou[u][X]);
          if (p.flags & PYDNN_BN_FLAG_Z) kz[u] = rload<T, VEC>(z + ou[u][Z]);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (i0 + (i64)u * G >= nv) break;
        A xv[VEC], zv[VEC], r[VEC];
        bool pos[VEC];
        unpack<T, VEC>(kx[u], xv);
        if (p.flags & PYDNN_BN_FLAG_Z) unpack<T, VEC>(kz[u], zv);
        else
#pragma unroll
          for (int e = 0; e < VEC; ++e) zv[e] = A(0);
#pragma unroll
        for (int e = 0; e < VEC; ++e) r[e] = alpha * fwd_value(xv[e], c, zv[e], p.flags, pos[e]);
        if (p.flags & PYDNN_BN_FLAG_BETA) {
          A yv[VEC];
          vload<T, VEC>(y + ou[u][Y], yv);
#pragma unroll
          for (int e = 0; e < VEC; ++e) r[e] += beta * yv[e];
        }
        vstore<T, VEC>(y + ou[u][Y], r);
        if (p.flags & PYDNN_BN_FLAG_MASK) mstore<VEC>(p.mask + ou[u][X], pos);
      }
    }
    __syncthreads();
  }
}

template <class T, int VEC> __global__ void __launch_bounds__(kGenThreadsBwd) bwd_planes(const BnParams p) {
  typedef typename AccOf<T>::type A;
  __shared__ double sm[5][kGenThreadsBwd];
  __shared__ A s_c[4];
  const T* x = (const T*)p.x;
  const T* dy = (const T*)p.dy;
  T* dx = (T*)p.dx;
  T* dz = (T*)p.dz;
  const A alpha = (A)p.alpha, beta = (A)p.beta;
  const bool blend = p.flags & PYDNN_BN_FLAG_BETA, mask = p.flags & PYDNN_BN_FLAG_MASK;
  const int t = threadIdx.x, G = blockDim.x;
  const i64 nv = p.rows / VEC;
  for (i64 f = blockIdx.x; f < p.feats; f += gridDim.x) {
    i64 fo[PYDNN_BN_OPS], o[PYDNN_BN_OPS];
    feat_off(p, f, fo);
    double v[5] = {0, 0, 0, 0, 0};
    for (i64 i0 = t; i0 < nv; i0 += (i64)G * kUnroll) {
      Pack<T, VEC> kx[kUnroll], kd[kUnroll];
      bool mk[kUnroll][VEC];
      int cnt = 0;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const i64 i = i0 + (i64)u * G;
        if (i < nv) {
          red_off(p, i * VEC, fo, o);
          kx[u] = rload<T, VEC>(x + o[X]);
          kd[u] = rload<T, VEC>(dy + o[DY]);
          if (mask) mload<VEC>(p.mask + o[X], mk[u]);
          cnt = u + 1;
        }
      }
      double sx = 0, sy = 0, q = 0, cc = 0;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (u < cnt)
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            sx += load<double>(kx[u].e[e]);
            sy += (mask && !mk[u][e]) ? 0.0 : load<double>(kd[u].e[e]);
          }
      const double n = (double)(cnt * VEC), mx = sx / n, my = sy / n;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (u < cnt)
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            const double a = load<double>(kx[u].e[e]) - mx;
            const double b = ((mask && !mk[u][e]) ? 0.0 : load<double>(kd[u].e[e])) - my;
            q += a * a;
            cc += a * b;
          }
      merge2(v[0], v[1], v[2], v[3], v[4], n, mx, q, my, cc);
    }
    block_merge<double, 5, kGenThreadsBwd>(v, sm);
    if (t == 0) {
      A c[4];
      bwd_finish<A>(p, f, v[0], v[1], v[2], v[3], v[4], c);
#pragma unroll
      for (int k = 0; k < 4; ++k) s_c[k] = c[k];
    }
    __syncthreads();
    A c[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) c[k] = s_c[k];
    // outputs: kPlanesBwdU vectors per step, their x / dy / mask loads all issued before the first store
    // (kUnroll spills at the 128-register cap of 512 threads)
    for (i64 i0 = t; i0 < nv; i0 += (i64)G * kPlanesBwdU) {
      i64 ou[kPlanesBwdU][PYDNN_BN_OPS];
      Pack<T, VEC> kx[kPlanesBwdU], kd[kPlanesBwdU];
      Pack<unsigned char, VEC> km[kPlanesBwdU];  // the mask bytes, packed until used
#pragma unroll
      for (int u = 0; u < kPlanesBwdU; ++u) {
        const i64 i = i0 + (i64)u * G;
        if (i < nv) {
          red_off(p, i * VEC, fo, ou[u]);
          kx[u] = rload<T, VEC>(x + ou[u][X]);
          kd[u] = rload<T, VEC>(dy + ou[u][DY]);
          if (mask) km[u] = rload<unsigned char, VEC>(p.mask + ou[u][X]);
        }
      }
#pragma unroll
      for (int u = 0; u < kPlanesBwdU; ++u) {
        if (i0 + (i64)u * G >= nv) break;
        A xv[VEC], dv[VEC], r[VEC];
        unpack<T, VEC>(kx[u], xv);
        unpack<T, VEC>(kd[u], dv);
        if (mask)
#pragma unroll
          for (int e = 0; e < VEC; ++e)
            if (!km[u].e[e]) dv[e] = A(0);
#pragma unroll
        for (int e = 0; e < VEC; ++e) r[e] = bwd_value(xv[e], dv[e], c);
        if (blend) {
          A old[VEC];
          vload<T, VEC>(dx + ou[u][DX], old);
#pragma unroll
          for (int e = 0; e < VEC; ++e) r[e] += beta * old[e];
        }
        vstore<T, VEC>(dx + ou[u][DX], r);
        if (p.flags & PYDNN_BN_FLAG_DZ) {
          A rz[VEC];
#pragma unroll
          for (int e = 0; e < VEC; ++e) rz[e] = alpha * dv[e];
          if (blend) {
            A old[VEC];
            vload<T, VEC>(dz + ou[u][DZ], old);
#pragma unroll
            for (int e = 0; e < VEC; ++e) rz[e] += beta * old[e];
          }
          vstore<T, VEC>(dz + ou[u][DZ], rz);
        }
      }
    }
    __syncthreads();
  }
}


// ------------------------------------------------------------------ nc: packed NCHW SPATIAL, split
//
// x (and y, z, dy, dx, dz, the mask) packed NCHW (or NCDHW): element (n, c, s) at (n * C + c) * HW + s,
// any HW. The gen / planes kernels give each channel one block, so few channels or large planes leave
// most SMs idle and every block streams alone; here every pass spreads over the whole GPU:
//   nc_stats   one block per item: nc_g planes x nc_l elements of one channel (items j-major: block
//              j * C + c, so neighbouring blocks read neighbouring memory). Each plane segment is walked in
//              VEC-aligned slots (a slot is a VEC-aligned vector of addresses; slots partly outside the
//              segment load their lanes one by one), kNcU slots in flight per thread, each step one Chan
//              batch; the block's fixed tree; one partial (mean, M2 [, mean dy, co-moment]) per item, at
//              (j * C + c), the layout fwd_final / bwd_final<A, true> merge (part_count<true>).
//   nc_apply   flat over the elements [row_begin, row_end): VEC-element vectors (the last one partial),
//              each lane's channel from its plane ((i / HW) % C, a lane past the plane's end moves on),
//              constants per channel: MODE kNcInfer (estimated statistics, infer_rows' expressions),
//              kNcFwd (the 4 constants fwd_final wrote), kNcFwdSaved (scale * saved invstd, bias, saved
//              mean: no head), kNcBwd (bwd_final's 4 constants). Training passes take their blocks last
//              first (the end of x is what the stats pass left in L2).
//   nc_head    one block, the elements [0, row_end) whose bytes held the constants (non-Ex calls keep
//              constants and partials in y / dx, as the row kernels do): constants to shared memory first.
constexpr int kNcThreads = 256;  // nc_stats / nc_apply: threads per block
constexpr int kNcU = 4;          // vectors (slots) in flight per thread
enum { kNcInfer = 0, kNcFwd = 1, kNcBwd = 2, kNcFwdSaved = 3, kNcBwdSaved = 4 };  // kNcBwdSaved: the backward's
                                                                               // constants from bwd_consts_saved

__device__ __forceinline__ i64 nc_div(i64 a, i64 b, bool i32) {
  return i32 ? (i64)((unsigned)a / (unsigned)b) : a / b;
}

// SUMS (the backward with the saved mean, BWD_SUMS; see bwd_sums): each thread's sums of dy' and dy' (x - mean),
// a fixed tree of sums over the block, 2 partials per item (bwd_sums_final's layout: item j * C + c).
template <class T, int VEC, bool BWD, bool SUMS = false>
__global__ void __launch_bounds__(kNcThreads) nc_stats(const BnParams p) {
  typedef typename AccOf<T>::type A;
  typedef Pack<T, VEC> P;
  typedef Pack<unsigned char, VEC> M;
  static_assert(!SUMS || BWD, "nc_stats: sums are the backward's");
  constexpr int NV = SUMS ? 2 : BWD ? 5 : 3;
  __shared__ A sm[NV][kNcThreads];
  const i64 C = p.feats, HW = p.nc_hw;
  const i64 item = blockIdx.x, j = item / C, c = item - j * C;
  const i64 ng = j / p.nc_k, k = j - ng * p.nc_k;
  const i64 n0 = ng * p.nc_g, gcount = min(p.nc_g, p.nc_n - n0);
  const i64 s0 = k * p.nc_l, len = min(p.nc_l, HW - s0);
  const unsigned wp = VEC == 1 ? (unsigned)len : (unsigned)((len + 2 * VEC - 2) / VEC);  // slots per plane
  const unsigned nslots = (unsigned)gcount * wp;  // an item is at most a few NC_ITEM_MAX elements
  const T* x = (const T*)p.x;
  const T* dy = (const T*)p.dy;
  const bool msk = BWD && (p.flags & PYDNN_BN_FLAG_MASK);
  const A mc = SUMS ? ((const A*)p.save_mean)[c] : A(0);
  A v[NV];
#pragma unroll
  for (int q = 0; q < NV; ++q) v[q] = A(0);
  for (unsigned w0 = threadIdx.x; w0 < nslots; w0 += kNcThreads * kNcU) {
    P xr[kNcU], dr[kNcU];  // raw, converted where used; lanes outside [lo, hi) hold +0
    M mr[kNcU];
    int lo[kNcU], hi[kNcU];
#pragma unroll
    for (int u = 0; u < kNcU; ++u) {
      lo[u] = hi[u] = 0;
      xr[u].raw = typename Raw<sizeof(T) * VEC>::type{};  // +0 in every lane a slot does not load
      dr[u].raw = typename Raw<sizeof(T) * VEC>::type{};
      const unsigned w = w0 + u * kNcThreads;
      if (w < nslots) {
        const unsigned g = w / wp, q = w - g * wp;
        const i64 base = ((n0 + g) * C + c) * HW + s0, end = base + len;
        const i64 a = (base / VEC) * VEC + (i64)q * VEC;
        lo[u] = (int)max((i64)0, min((i64)VEC, base - a));
        hi[u] = (int)max((i64)0, min((i64)VEC, end - a));
        if (lo[u] == 0 && hi[u] == VEC) {
          xr[u] = rload<T, VEC>(x + a);
          if (BWD) dr[u] = rload<T, VEC>(dy + a);
          if (msk) mr[u].raw = *reinterpret_cast<const typename Raw<VEC>::type*>(p.mask + a);
        } else {
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            mr[u].e[e] = 1;
            if (e >= lo[u] && e < hi[u]) {
              xr[u].e[e] = x[a + e];
              if (BWD) dr[u].e[e] = dy[a + e];
              if (msk) mr[u].e[e] = p.mask[a + e];
            }
          }
        }
      }
    }
    if constexpr (SUMS) {  // (lanes outside [lo, hi) hold +0 in dy: they add 0 to both)
#pragma unroll
      for (int u = 0; u < kNcU; ++u)
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const A d = (msk && !mr[u].e[e]) ? A(0) : load<A>(dr[u].e[e]);
          v[0] += d;
          v[1] += (load<A>(xr[u].e[e]) - mc) * d;
        }
      continue;
    }
    A cnt = 0, sx = 0, sy = 0;
#pragma unroll
    for (int u = 0; u < kNcU; ++u) {
      cnt += (A)(hi[u] > lo[u] ? hi[u] - lo[u] : 0);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        sx += load<A>(xr[u].e[e]);  // lanes outside hold 0
        if (BWD) sy += (msk && !mr[u].e[e]) ? A(0) : load<A>(dr[u].e[e]);
      }
    }
    if (cnt > A(0)) {
      const A mx = sx / cnt, my = BWD ? sy / cnt : A(0);
      A q = 0, cc = 0;
#pragma unroll
      for (int u = 0; u < kNcU; ++u)
#pragma unroll
        for (int e = 0; e < VEC; ++e)
          if (e >= lo[u] && e < hi[u]) {
            const A d = load<A>(xr[u].e[e]) - mx;
            q += d * d;
            if (BWD) cc += d * (((msk && !mr[u].e[e]) ? A(0) : load<A>(dr[u].e[e])) - my);
          }
      if constexpr (BWD) merge2(v[0], v[1], v[2], v[3], v[4], cnt, mx, q, my, cc);
      else merge(v[0], v[1], v[2], cnt, mx, q);
    }
  }
  if constexpr (SUMS) {
    const int t = threadIdx.x;
    sm[0][t] = v[0];
    sm[1][t] = v[1];
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (t < s) {
        v[0] += sm[0][t + s];
        v[1] += sm[1][t + s];
        sm[0][t] = v[0];
        sm[1][t] = v[1];
      }
      __syncthreads();
    }
    if (t == 0) {
      A* part = (A*)p.partial + item * 2;
      part[0] = v[0];
      part[1] = v[1];
    }
    return;
  }
  block_merge<A, NV, kNcThreads>(v, sm);
  if (threadIdx.x == 0) {
    A* part = (A*)p.partial + item * (BWD ? 4 : 2);
    part[0] = v[1];
    part[1] = v[2];
    if (BWD) {
      part[2] = v[3];
      part[3] = v[4];
    }
  }
}

// The 4 constants of channel ch for MODE (cs: fwd_final / bwd_final's constants, global or shared).
template <int MODE, class A> __device__ __forceinline__ void nc_consts(const BnParams& p, const A* cs, i64 ch, A* k) {
  if constexpr (MODE == kNcInfer) {
    const A s = ((const A*)p.scale)[ch] / m_sqrt(((const A*)p.var)[ch] + (A)p.eps);
    k[0] = (A)p.alpha * s;
    k[1] = (A)p.alpha * (((const A*)p.bias)[ch] - ((const A*)p.mean)[ch] * s);
    k[2] = k[3] = A(0);
  } else if constexpr (MODE == kNcFwdSaved) {
    k[0] = ((const A*)p.scale)[ch] * ((const A*)p.save_invvar)[ch];
    k[1] = ((const A*)p.bias)[ch];
    k[2] = ((const A*)p.save_mean)[ch];
    k[3] = A(0);
  } else if constexpr (MODE == kNcBwdSaved) {
    bwd_consts_saved<A>(p, ch, k);
  } else {
#pragma unroll
    for (int q = 0; q < 4; ++q) k[q] = cs[ch * 4 + q];
  }
}

// Vectors w = w0, w0 + step, ... < w1 (elements w * VEC .. + VEC, those below p.row_end), kNcU in flight
// (raw, converted where used). The last, partial vector of the range: VEC = 1 lanes by its owner.
template <class T, int VEC, int MODE, int U = kNcU>
__device__ __forceinline__ void nc_body(const BnParams& p, const typename AccOf<T>::type* cs, i64 w0, i64 w1,
                                        i64 step) {
  typedef typename AccOf<T>::type A;
  typedef Pack<T, VEC> P;
  typedef Pack<unsigned char, VEC> M;
  constexpr bool BWD = MODE == kNcBwd || MODE == kNcBwdSaved, INFER = MODE == kNcInfer;
  const unsigned flags = p.flags;
  const bool i32 = flags & PYDNN_BN_FLAG_IDX32;
  const bool blend = flags & PYDNN_BN_FLAG_BETA;
  const bool zin = !BWD && !INFER && (flags & PYDNN_BN_FLAG_Z);
  const bool msk = !INFER && (flags & PYDNN_BN_FLAG_MASK);
  const bool wdz = BWD && (flags & PYDNN_BN_FLAG_DZ);
  const A alpha = (A)p.alpha, beta = (A)p.beta;
  const i64 C = p.feats, HW = p.nc_hw, total = p.row_end;
  const T* x = (const T*)p.x;
  const T* in2 = (const T*)(BWD ? p.dy : p.z);  // dy (backward) or z (forward)
  T* out = (T*)(BWD ? p.dx : p.y);
  T* dz = (T*)p.dz;
  const i64 wfull = total / VEC, wend = min(w1, wfull);
  if constexpr (VEC > 1) {
    if (w1 > wfull && wfull >= w0 && (wfull - w0) % step == 0)  // the partial vector is this thread's
      nc_body<T, 1, MODE, 1>(p, cs, wfull * VEC, total, 1);
  }
  i64 cur = -1;
  A kc[4] = {A(0), A(0), A(0), A(0)};
  for (i64 w = w0; w < wend; w += step * U) {
    P xr[U], sr[U];
    M mr[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const i64 i0 = (w + u * step) * VEC;
      if (w + u * step < wend) {
        xr[u] = rload<T, VEC>(x + i0);
        if (BWD || zin) sr[u] = rload<T, VEC>(in2 + i0);
        if (BWD && msk) mr[u].raw = *reinterpret_cast<const typename Raw<VEC>::type*>(p.mask + i0);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const i64 wu = w + u * step;
      if (wu >= wend) break;
      const i64 i0 = wu * VEC;
      const i64 plane = nc_div(i0, HW, i32);
      i64 r = i0 - plane * HW;
      i64 ch = plane - nc_div(plane, C, i32) * C;
      if (ch != cur) {
        nc_consts<MODE, A>(p, cs, ch, kc);
        cur = ch;
      }
      A kk[4] = {kc[0], kc[1], kc[2], kc[3]};
      A o[VEC], o2[VEC];
      bool pos[VEC];
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        if (VEC > 1 && r == HW) {  // the next plane: the next channel
          r = 0;
          ch = ch + 1 == C ? 0 : ch + 1;
          nc_consts<MODE, A>(p, cs, ch, kk);
        }
        ++r;
        const A xa = load<A>(xr[u].e[e]);
        if constexpr (INFER) {
          o[e] = xa * kk[0] + kk[1];
        } else if constexpr (BWD) {
          const A d = (msk && !mr[u].e[e]) ? A(0) : load<A>(sr[u].e[e]);
          o[e] = bwd_value(xa, d, kk);
          o2[e] = alpha * d;
        } else {
          o[e] = alpha * fwd_value(xa, kk, zin ? load<A>(sr[u].e[e]) : A(0), flags, pos[e]);
        }
      }
      if (blend) {
        A ya[VEC];
        vload<T, VEC>(out + i0, ya);
#pragma unroll
        for (int e = 0; e < VEC; ++e) o[e] += beta * ya[e];
      }
      vstore<T, VEC>(out + i0, o);
      if (!BWD && !INFER && msk) mstore<VEC>(p.mask + i0, pos);
      if (wdz) {
        if (blend) {
          A za[VEC];
          vload<T, VEC>(dz + i0, za);
#pragma unroll
          for (int e = 0; e < VEC; ++e) o2[e] += beta * za[e];
        }
        vstore<T, VEC>(dz + i0, o2);
      }
    }
  }
}

// Blocks of chunk_rows vectors over [row_begin, row_end) (row_begin a multiple of VEC).
template <class T, int VEC, int MODE> __global__ void __launch_bounds__(kNcThreads) nc_apply(const BnParams p) {
  typedef typename AccOf<T>::type A;
  const i64 blk = MODE == kNcInfer ? (i64)blockIdx.x : (i64)(gridDim.x - 1 - blockIdx.x);
  const i64 vb = p.row_begin / VEC + blk * p.chunk_rows;
  const i64 ve = min((p.row_end + VEC - 1) / VEC, vb + p.chunk_rows);
  nc_body<T, VEC, MODE>(p, (const A*)p.consts, vb + threadIdx.x, ve, kNcThreads);
}

// One block: the elements [0, row_end) (they overlap the constants' bytes; row_end a multiple of 16, so of
// VEC), constants to shared memory first, then VEC-element vectors, kNcU per thread in flight (one round of
// loads for up to kNcHeadThreads * kNcU vectors: 2048 channels' head in fp32 or 16-bit).
constexpr int kNcHeadThreads = 512;
template <class T, int VEC, int MODE> __global__ void __launch_bounds__(kNcHeadThreads) nc_head(const BnParams p) {
  typedef typename AccOf<T>::type A;
  __shared__ A s_c[kHeadSmemBytes / sizeof(A)];
  const A* cs = (const A*)p.consts;
  const i64 planes = (p.row_end + p.nc_hw - 1) / p.nc_hw;
  const i64 nch = min(p.feats, planes);  // channels 0 .. nch - 1 are all the head touches
  for (i64 i = threadIdx.x; i < nch * 4; i += blockDim.x) s_c[i] = cs[i];
  __syncthreads();
  nc_body<T, VEC, MODE>(p, s_c, threadIdx.x, p.row_end / VEC, blockDim.x);
}


// ------------------------------------------------------------------ nc_res: a channel in one block's registers

// Packed NCHW / NCDHW SPATIAL training forward and backward whose channels hold at most PER x blockDim.x
// elements (M = N x HW, the host's NC_RES_MAX): one block per channel loads the channel into registers once
// (thread t holds elements j = t + k * blockDim.x, k < PER: plane j / HW, offset j mod HW, walked
// incrementally), reduces in a fixed order (per thread in A, then double: warp butterflies, identical in every
// lane, and the warps' sums in warp order, read by every thread), and writes the outputs from the registers.
// One launch, x (and dy) read once, no scratch. Forward: the exact two-pass moments from the registers (the
// sum, then the squares about the mean); backward: with the saved statistics the sums of dy' and dy' (x - mean),
// else the mean first, then M2, dy' and dy' (x - mean) about it. The finishes are the other paths' (fwd_finish,
// bwd_finish: saved / running statistics, dscale / dbias, alpha / beta blending, z, ReLU, mask, dz).
constexpr int kResThreads = 1024;  // threads per block at most (the host: NC_RES_THREADS)

// 1 / a in double without a division (a >= 1, a small integer here): a double division's slow-path call made
// ptxas keep the register-resident elements on the stack (nc_res<float, 16, ..>: 304 bytes, 32 registers).
__device__ __forceinline__ double res_rcp(double a) {
  double r = (double)__fdividef(1.0f, (float)a);
  r = r * (2.0 - a * r);
  return r * (2.0 - a * r);
}

// fwd_finish / bwd_finish without double divisions (res_rcp, rsqrt): the same values to a few ulp of double.
template <class A> __device__ __forceinline__ void res_fwd_finish(const BnParams& p, i64 f, double n, double rn, double m,
                                                                  double m2, A* c) {
  const double var = m2 * rn;
  const double invstd = rsqrt(var + p.eps);
  if (p.flags & PYDNN_BN_FLAG_SAVE) {
    ((A*)p.save_mean)[f] = (A)m;
    ((A*)p.save_invvar)[f] = (A)invstd;
  }
  if (p.flags & PYDNN_BN_FLAG_RUNNING) {
    const double unbiased = n > 1 ? m2 * res_rcp(n - 1) : var;  // cuDNN's running variance: N / (N - 1)
    A* rm = (A*)p.mean;
    A* rv = (A*)p.var;
    if (p.factor == 1.0) {
      rm[f] = (A)m;
      rv[f] = (A)unbiased;
    } else {
      rm[f] = (A)((1.0 - p.factor) * (double)rm[f] + p.factor * m);
      rv[f] = (A)((1.0 - p.factor) * (double)rv[f] + p.factor * unbiased);
    }
  }
  c[0] = (A)((double)((const A*)p.scale)[f] * invstd);
  c[1] = ((const A*)p.bias)[f];
  c[2] = (A)m;
  c[3] = A(0);
}

template <class A>
__device__ __forceinline__ void res_bwd_finish(const BnParams& p, i64 f, double n, double rn, double mean, double m2,
                                               double sdy, double sdyx, A* c) {
  const double invstd = (p.flags & PYDNN_BN_FLAG_SAVED) ? (double)((const A*)p.save_invvar)[f] : rsqrt(m2 * rn + p.eps);
  const double dgamma = sdyx * invstd, dbeta = sdy;
  A* ds = (A*)p.dscale;
  A* db = (A*)p.dbias;
  double vs = p.alpha_p * dgamma, vb = p.alpha_p * dbeta;
  if (p.flags & PYDNN_BN_FLAG_PBETA) {
    vs += p.beta_p * (double)ds[f];
    vb += p.beta_p * (double)db[f];
  }
  ds[f] = (A)vs;
  db[f] = (A)vb;
  const double k1 = p.alpha * (double)((const A*)p.scale)[f] * invstd;
  c[0] = (A)k1;
  c[1] = (A)(-k1 * invstd * dgamma * rn);
  c[2] = (A)mean;
  c[3] = (A)(sdy * rn);
}

template <int NV> __device__ __forceinline__ void res_reduce(double* v, double (*sm)[32]) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
#pragma unroll
  for (int q = 0; q < NV; ++q)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v[q] += __shfl_xor_sync(0xffffffffu, v[q], o);
  if (lane == 0)
#pragma unroll
    for (int q = 0; q < NV; ++q) sm[q][w] = v[q];
  __syncthreads();
#pragma unroll
  for (int q = 0; q < NV; ++q) {
    double s = 0;
    for (int i = 0; i < nw; ++i) s += sm[q][i];
    v[q] = s;
  }
}

// One output of nc_res at offset o of the channel's base: y (and the mask) or dx (and dz).
template <class T, bool BWD, class A>
__device__ __forceinline__ void res_out(const BnParams& p, i64 base, unsigned o, A xv, A dv, const A* c) {
  const A alpha = (A)p.alpha, beta = (A)p.beta;
  const bool blend = p.flags & PYDNN_BN_FLAG_BETA;
  if constexpr (!BWD) {
    T* y = (T*)p.y + base;
    const A zv = (p.flags & PYDNN_BN_FLAG_Z) ? load<A>(((const T*)p.z + base)[o]) : A(0);
    bool pos;
    A r = alpha * fwd_value(xv, c, zv, p.flags, pos);
    if (blend) r += beta * load<A>(y[o]);
    y[o] = store<T>(r);
    if (p.flags & PYDNN_BN_FLAG_MASK) p.mask[base + o] = pos ? 1 : 0;
  } else {
    T* dx = (T*)p.dx + base;
    A r = bwd_value(xv, dv, c);
    if (blend) r += beta * load<A>(dx[o]);
    dx[o] = store<T>(r);
    if (p.flags & PYDNN_BN_FLAG_DZ) {
      T* dz = (T*)p.dz + base;
      A rz = alpha * dv;
      if (blend) rz += beta * load<A>(dz[o]);
      dz[o] = store<T>(rz);
    }
  }
}

// The (plane, offset) walk of elements j0, j0 + G, j0 + 2G, ... of a channel (planes of hw elements, plane stride cs).
struct ResWalk {
  int n, s, qg, rg, hw;
  __device__ __forceinline__ void init(int j0, int G, int hw_) {
    hw = hw_;
    qg = G / hw;
    rg = G - qg * hw;
    n = j0 / hw;
    s = j0 - n * hw;
  }
  __device__ __forceinline__ unsigned off(unsigned cs) const { return (unsigned)n * cs + (unsigned)s; }
  __device__ __forceinline__ void next() {
    s += rg;
    n += qg;
    if (s >= hw) {
      s -= hw;
      ++n;
    }
  }
};

// STREAM: the elements past the registers' PER x blockDim.x (j >= PER G) are read from memory in each pass instead
// (the sums, the squares about the mean / the backward's sums, the outputs: the later reads mostly from L2), so a
// small block (PER 4) serves any N * H * W at full occupancy. Without STREAM the host keeps m <= PER G.
// STREAM: SU (kResSU unless the host asks for 1: tuning.batchnorm.NC_RES_SU) elements a thread loaded together per
// step of the streaming passes (their loads in flight at once; one a step left each thread a chain of dependent
// memory round trips). x (and dy' with BWD) of elements j + u G, u < SU, below m (0 past it); w advances SU elements.
constexpr int kResSU = 4;
template <class T, bool BWD, int SU, class A>
__device__ __forceinline__ void res_stream_load(const BnParams& p, const T* x, const T* dyp, const unsigned char* mk,
                                                bool msk, unsigned cs, ResWalk& w, int j, int m, int G, A* xs, A* gs) {
  unsigned o[SU];
#pragma unroll
  for (int u = 0; u < SU; ++u) {
    o[u] = w.off(cs);
    w.next();
  }
#pragma unroll
  for (int u = 0; u < SU; ++u) {
    xs[u] = A(0);
    if constexpr (BWD) gs[u] = A(0);
    if (j + u * G < m) {
      xs[u] = load<A>(x[o[u]]);
      if constexpr (BWD) {
        gs[u] = load<A>(dyp[o[u]]);
        if (msk && !mk[o[u]]) gs[u] = A(0);
      }
    }
  }
}

template <class T, int PER, bool BWD, bool STREAM = false, int SU = kResSU>
__global__ void __launch_bounds__(kResThreads) nc_res(const BnParams p) {
  typedef typename AccOf<T>::type A;
  __shared__ double sm0[3][32], sm1[3][32];
  __shared__ A s_c[4];
  __shared__ int s_hw;
  const i64 ch = blockIdx.x, hw = p.nc_hw;
  const unsigned cs = (unsigned)(p.feats * hw);  // (the host: N * C * HW < 2^31, so 32-bit offsets)
  const int m = (int)p.rows, G = blockDim.x, t = threadIdx.x;
  const int ihw = (int)hw;
  const int j1 = PER * G;  // STREAM: the first element not held in registers
  const i64 base = ch * hw;
  const T* x = (const T*)p.x + base;
  const T* dyp = (const T*)p.dy + base;
  const unsigned char* mk = p.mask + base;
  const bool msk = p.flags & PYDNN_BN_FLAG_MASK;
  A xv[PER], dv[PER];
  {
    ResWalk w;
    w.init(t, G, ihw);
#pragma unroll
    for (int k = 0; k < PER; ++k) {
      xv[k] = A(0);
      dv[k] = A(0);
      if (t + k * G < m) {
        const unsigned o = w.off(cs);
        xv[k] = load<A>(x[o]);
        if constexpr (BWD) {
          dv[k] = load<A>(dyp[o]);
          if (msk && !mk[o]) dv[k] = A(0);
        }
      }
      w.next();
    }
  }
  if (t == 0) s_hw = ihw;
  const double dm = (double)m, rn = res_rcp(dm);
  if constexpr (!BWD) {
    A sx = A(0);
#pragma unroll
    for (int k = 0; k < PER; ++k) sx += xv[k];
    if constexpr (STREAM) {
      ResWalk w;
      w.init(j1 + t, G, ihw);
      for (int j = j1 + t; j < m; j += SU * G) {
        A xs[SU];
        res_stream_load<T, false, SU>(p, x, dyp, mk, msk, cs, w, j, m, G, xs, xs);
#pragma unroll
        for (int u = 0; u < SU; ++u) sx += xs[u];
      }
    }
    double v[1] = {(double)sx};
    res_reduce<1>(v, sm0);
    const double md = v[0] * rn;
    const A ma = (A)md;
    A q = A(0);
#pragma unroll
    for (int k = 0; k < PER; ++k)
      if (t + k * G < m) q += (xv[k] - ma) * (xv[k] - ma);
    if constexpr (STREAM) {
      ResWalk w;
      w.init(j1 + t, G, ihw);
      for (int j = j1 + t; j < m; j += SU * G) {
        A xs[SU];
        res_stream_load<T, false, SU>(p, x, dyp, mk, msk, cs, w, j, m, G, xs, xs);
#pragma unroll
        for (int u = 0; u < SU; ++u)
          if (j + u * G < m) q += (xs[u] - ma) * (xs[u] - ma);
      }
    }
    double w2[1] = {(double)q};
    res_reduce<1>(w2, sm1);
    if (t == 0) {
      const double e = md - (double)ma;  // the squares were about ma: M2 about md
      A c[4];
      res_fwd_finish<A>(p, ch, dm, rn, md, fmax(0.0, w2[0] - dm * e * e), c);
#pragma unroll
      for (int k = 0; k < 4; ++k) s_c[k] = c[k];
    }
  } else {
    double md, m2 = 0;
    A ma;
    if (p.flags & PYDNN_BN_FLAG_SAVED) {
      ma = ((const A*)p.save_mean)[ch];
      md = (double)ma;
    } else {
      A sx = A(0);
#pragma unroll
      for (int k = 0; k < PER; ++k) sx += xv[k];
      if constexpr (STREAM) {
        ResWalk w;
        w.init(j1 + t, G, ihw);
        for (int j = j1 + t; j < m; j += SU * G) {
          A xs[SU];
          res_stream_load<T, false, SU>(p, x, dyp, mk, msk, cs, w, j, m, G, xs, xs);
#pragma unroll
          for (int u = 0; u < SU; ++u) sx += xs[u];
        }
      }
      double v[1] = {(double)sx};
      res_reduce<1>(v, sm1);
      md = v[0] * rn;
      ma = (A)md;
    }
    A sy = A(0), sxy = A(0), q = A(0);
#pragma unroll
    for (int k = 0; k < PER; ++k) {
      const A d = t + k * G < m ? xv[k] - ma : A(0);
      sy += dv[k];
      sxy += dv[k] * d;
      q += d * d;
    }
    if constexpr (STREAM) {
      ResWalk w;
      w.init(j1 + t, G, ihw);
      for (int j = j1 + t; j < m; j += SU * G) {
        A xs[SU], gs[SU];
        res_stream_load<T, true, SU>(p, x, dyp, mk, msk, cs, w, j, m, G, xs, gs);
#pragma unroll
        for (int u = 0; u < SU; ++u) {
          const A d = j + u * G < m ? xs[u] - ma : A(0);
          sy += gs[u];
          sxy += gs[u] * d;
          q += d * d;
        }
      }
    }
    double v[3] = {(double)sy, (double)sxy, (double)q};
    res_reduce<3>(v, sm0);
    if (t == 0) {
      const double e = md - (double)ma;  // (0 with the saved mean) the sums were about ma: about md
      m2 = fmax(0.0, v[2] - dm * e * e);
      A c[4];
      res_bwd_finish<A>(p, ch, dm, rn, md, m2, v[0], v[1] - e * v[0], c);
#pragma unroll
      for (int k = 0; k < 4; ++k) s_c[k] = c[k];
    }
  }
  __syncthreads();
  A c[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) c[k] = s_c[k];
  // the offsets again from the plane size read back from shared memory: computed, not kept (kept, the compiler held
  // PER 32-bit offsets live across the reductions: nc_res<float, 16, true> spilled 84 bytes at 64 registers)
  const int hw2 = s_hw;
  ResWalk w;
  w.init(t, G, hw2);
  const int jend = STREAM ? m : min(m, j1);
#pragma unroll
  for (int k = 0; k < PER; ++k) {
    if (t + k * G < m) res_out<T, BWD>(p, base, w.off(cs), xv[k], dv[k], c);
    w.next();
  }
  if constexpr (STREAM) {
    for (int j = j1 + t; j < jend; j += SU * G) {
      A xs[SU], gs[SU];
      ResWalk w0 = w;
      res_stream_load<T, BWD, SU>(p, x, dyp, mk, msk, cs, w, j, jend, G, xs, gs);
#pragma unroll
      for (int u = 0; u < SU; ++u) {
        if (j + u * G < jend) res_out<T, BWD>(p, base, w0.off(cs), xs[u], gs[u], c);
        w0.next();
      }
    }
  }
}

}  // namespace bn
}  // namespace pydnn
