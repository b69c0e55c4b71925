// Fused attention backward, dK / dV (and the atomic dQ share) on Hopper warpgroup MMA (sm_90a only: the
// units are KernelUnit archs ("sm_90a",)). The problem is attention_params.h's; the host side is
// pydnn/ops/attention_wgmma_bwd.py (dispatch in pydnn/ops/attention.py's attention_backward). The
// preprocess (dsum = rowsum(dO * O), zeroing the dQ accumulator) and the dQ conversion stay the
// mma.sync unit's bwd_pre / bwd_dq_convert; the deterministic mode runs bwd_dkdv_wg without ATOMIC and
// then bwd_dq_wg (below); dropout stays on the mma.sync kernels entirely.
//
//   bwd_dkdv_wg<T, D, ATOMIC>
//     one CTA per (128 keys, K/V head, batch); two warpgroups, warpgroup w owns keys 64 w .. 64 w + 63
//     (wgmma's M = 64). The CTA loops over the query heads of the K/V head's group and their query tiles
//     of BM rows (BM = 64 at D = 128, 128 at D = 64: either way the S^T and dP^T accumulators plus
//     dK and dV take 192 registers a thread); Q, dO, lse, dsum of the next tile are copied with cp.async
//     (128B-swizzled, common/wgmma.cuh) while the current one is computed. Per tile, each warpgroup:
//       S^T = K Q^T, dP^T = V dO^T     SS wgmma (K, V, Q, dO all K-major: d is contiguous), a group
//                                      each, so that P^T's exponentials run while dP^T's MMAs do;
//       P^T = exp2(S^T scale log2 e - lse log2 e), masked; dS^T = P^T (dP^T - dsum)   in registers;
//       dV += P^T dO, dK += dS^T Q     register-A wgmma (MmaRS: the accumulators packed to 16 bits are
//                                      the A fragments as they stand), dO and Q MN-major B;
//       ATOMIC: dS^T to shared memory, barrier, dQ = dS K (SS wgmma: dS and K both MN-major), warpgroup
//       w taking dQ's columns 64 w.. (D = 128) or its query rows 64 w.. (D = 64), added to the fp32
//       accumulator with red.global.add.v2 (bwd_dq_convert scales and converts it afterwards).
//     dK (times the scale) and dV go straight from the accumulators to global memory at the end; keys
//     past their length get zeros. The sum over the group's query heads is in registers (deterministic).
// Masking: keys past len_kv and (causal) keys after the query's diagonal get S = -inf; queries past
// len_q have lse = +inf (P = 0) and zero-filled Q / dO rows.
#include "common/types.cuh"
#include "common/attn_mma.cuh"
#include "common/attn_problem.cuh"
#include "common/attn_bwd_tile.cuh"
#include "common/wgmma.cuh"
#include "attention_params.h"

namespace pydnn {
namespace attn_wgb {

using attn::cp_async16;
using attn::cp_async4;
using attn::cp_async_commit;
using attn::cp_async_wait;
using attn::exp2_fast;
using attn::red_add2;
using attn::smem_addr;

constexpr int kThreads = 256;  // two warpgroups
constexpr int kBN = 128;       // keys per CTA
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kInf = 1.0f / 0.0f;

// D = 96 runs as D = 128 with the last 32 columns of every tile zero in shared memory (a 96-column
// MN-major operand is not a whole number of the 128B swizzle's 64-column slabs): S^T / dP^T / S / dP take
// the 6 real k16 steps, dK / dV / dQ are computed over 128 columns and only the first 96 stored / added.
template <int D> struct Pad {
  static constexpr int v = D == 96 ? 128 : D;
};

// Tiles and the shared-memory layout (byte offsets from a 1024-aligned base; every tile a multiple of
// 1024 bytes so that the swizzle atoms stay aligned). pydnn/ops/attention_wgmma_bwd.py mirrors SMEM.
template <int D> struct Cfg {
  static constexpr int BM = D > 64 ? 64 : 128;       // query rows per tile
  static constexpr int KV_BYTES = kBN * Pad<D>::v * 2;  // K (or V): 128 rows, D / 64 slabs
  static constexpr int Q_BYTES = BM * Pad<D>::v * 2;    // one stage of Q (or dO)
  static constexpr int DS_BYTES = kBN * BM * 2;       // dS^T: 128 key rows, BM / 64 slabs of queries
  static constexpr int OFF_K = 0, OFF_V = KV_BYTES, OFF_Q = 2 * KV_BYTES, OFF_DO = OFF_Q + 2 * Q_BYTES,
                       OFF_DS = OFF_DO + 2 * Q_BYTES, OFF_L = OFF_DS + DS_BYTES;
  static constexpr int SMEM = OFF_L + 4 * BM * 4 + 1024;  // + lse, dsum [2][BM] each; + alignment slack
};

using attn::at;
using attn::Seq;
using attn::seq_of;

// A stored lse (natural log) in log2 units; rows past their length or that see nothing: +inf (P = 0).
__device__ __forceinline__ float lse2_of(float v, bool valid) { return (valid && v > -kInf) ? v * kLog2e : kInf; }

// ROWS rows of D elements (global row stride ld) into a 128B-swizzled tile at shared address s; rows at
// or past `valid` zero-filled (D = 96: the padding chunks too). All threads take part; the caller commits.
template <class T, int D, int ROWS>
__device__ __forceinline__ void load_sw(unsigned s, const T* g, long long ld, int valid) {
  constexpr int CH = Pad<D>::v / 8;
  static_assert(ROWS * CH % kThreads == 0, "tile copy");
#pragma unroll
  for (int i = 0; i < ROWS * CH / kThreads; ++i) {
    const int idx = threadIdx.x + i * kThreads;
    const int r = idx / CH, c = idx % CH;
    const bool ok = r < valid && (Pad<D>::v == D || c < D / 8);
    cp_async16(s + 2 * wgmma::sw128<ROWS>(r, c), ok ? g + (long long)r * ld + c * 8 : g, ok);
  }
}

template <class T, int D, bool ATOMIC>
__global__ void __launch_bounds__(kThreads, 1) bwd_dkdv_wg(const AttnParams p) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(sizeof(T) == 0, "bwd_dkdv_wg needs the sm_90a target (KernelUnit archs)");
#endif
  using C = Cfg<D>;
  constexpr int BM = C::BM, BN = kBN, DP = Pad<D>::v;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const unsigned raw = smem_addr(smem_raw);
  unsigned char* smem = smem_raw + (((raw + 1023u) & ~1023u) - raw);
  const unsigned sb = smem_addr(smem);
  const unsigned sK = sb + C::OFF_K, sV = sb + C::OFF_V, sQ = sb + C::OFF_Q, sdO = sb + C::OFF_DO;
  const unsigned sdS = sb + C::OFF_DS;
  float* sL = reinterpret_cast<float*>(smem + C::OFF_L);  // [2][BM] lse as stored (natural log)
  float* sDs = sL + 2 * BM;                                // [2][BM] dsum

  const int hk = blockIdx.y, b = blockIdx.z;
  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, l = threadIdx.x & 31, g = l >> 2, q4 = l & 3;
  const Seq sq = seq_of(p, b);
  const int n0 = blockIdx.x * BN;
  const int wkey = n0 + wg * 64;  // this warpgroup's first key

  // query rows that can see a key of this block: i >= n0 - offset (causal); all rows otherwise
  const int i_first = (sq.causal && n0 < sq.len_kv) ? max(0, n0 - sq.offset) : 0;
  const int mt0 = i_first / BM;
  const int mtiles = (n0 < sq.len_kv && i_first < sq.len_q) ? (sq.len_q + BM - 1) / BM - mt0 : 0;
  const int iters = mtiles * p.group;

  const long long ldq = p.stride[PYDNN_ATTN_T_Q][2], ldo = p.stride[PYDNN_ATTN_T_DO][2];
  load_sw<T, D, BN>(sK, at<T>(p.k, p, PYDNN_ATTN_T_K, b, hk) + (long long)n0 * p.stride[PYDNN_ATTN_T_K][2],
                    p.stride[PYDNN_ATTN_T_K][2], sq.len_kv - n0);
  load_sw<T, D, BN>(sV, at<T>(p.v, p, PYDNN_ATTN_T_V, b, hk) + (long long)n0 * p.stride[PYDNN_ATTN_T_V][2],
                    p.stride[PYDNN_ATTN_T_V][2], sq.len_kv - n0);

  // stage (Q, dO, lse, dsum) of iteration `it` (query head hk * group + it / mtiles, tile mt0 + it % mtiles)
  auto stage = [&](int it, int buf) {
    const int h = hk * p.group + it / mtiles, m0 = (mt0 + it % mtiles) * BM;
    load_sw<T, D, BM>(sQ + buf * C::Q_BYTES, at<T>(p.q, p, PYDNN_ATTN_T_Q, b, h) + (long long)m0 * ldq, ldq,
                      sq.len_q - m0);
    load_sw<T, D, BM>(sdO + buf * C::Q_BYTES, at<T>(p.dout, p, PYDNN_ATTN_T_DO, b, h) + (long long)m0 * ldo, ldo,
                      sq.len_q - m0);
    if (threadIdx.x < BM) {  // zero-filled past the length (lse2_of turns those rows' lse into +inf)
      const int row = m0 + threadIdx.x;
      const bool ok = row < sq.len_q;
      const long long lo = ok ? (long long)b * p.stride[PYDNN_ATTN_T_LSE][0] + (long long)h * p.stride[PYDNN_ATTN_T_LSE][1] +
                                    (long long)row * p.stride[PYDNN_ATTN_T_LSE][2] : 0;
      const long long dso = ok ? ((long long)b * p.heads_q + h) * p.seq_q + row : 0;
      cp_async4(smem_addr(sL + buf * BM + threadIdx.x), p.lse + lo, ok);
      cp_async4(smem_addr(sDs + buf * BM + threadIdx.x), p.dsum + dso, ok);
    }
  };
  if (iters > 0) stage(0, 0);
  cp_async_commit();

  float dk[DP / 2], dv[DP / 2];
#pragma unroll
  for (int i = 0; i < DP / 2; ++i) dk[i] = dv[i] = 0.f;

  for (int it = 0; it < iters; ++it) {
    const int buf = it & 1, h = hk * p.group + it / mtiles, m0 = (mt0 + it % mtiles) * BM;
    cp_async_wait<0>();           // this tile has landed (this thread's chunks) ...
    wgmma::fence_proxy_async();   // ... is visible to the async proxy ...
    __syncthreads();              // ... for all chunks; and every warpgroup is done with tile it - 1
    if (it + 1 < iters) stage(it + 1, buf ^ 1);  // into the buffer tile it - 1 used
    cp_async_commit();
    const unsigned q_s = sQ + buf * C::Q_BYTES, do_s = sdO + buf * C::Q_BYTES;

    // S^T = K Q^T and dP^T = V dO^T (64 keys x BM queries each; k16 steps along d: slab kk / 4 of the
    // tiles, 32 bytes per step within the swizzled rows)
    float s[BM / 2], dp[BM / 2];
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const unsigned ko = (kk >> 2) * (BN * 128) + wg * (64 * 128) + (kk & 3) * 32, qo = (kk >> 2) * (BM * 128) + (kk & 3) * 32;
      wgmma::Mma<T, BM, 0, 0>::run(s, wgmma::desc_sw128(sK + ko, 16, 1024), wgmma::desc_sw128(q_s + qo, 16, 1024), kk > 0);
    }
    wgmma::commit();  // S^T in its own group: P^T's exponentials overlap the dP^T MMAs
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const unsigned ko = (kk >> 2) * (BN * 128) + wg * (64 * 128) + (kk & 3) * 32, qo = (kk >> 2) * (BM * 128) + (kk & 3) * 32;
      wgmma::Mma<T, BM, 0, 0>::run(dp, wgmma::desc_sw128(sV + ko, 16, 1024), wgmma::desc_sw128(do_s + qo, 16, 1024), kk > 0);
    }
    wgmma::commit();
    wgmma::wait<1>();
    wgmma::fence_operands(s);

    // P^T and dS^T in registers. Accumulator element 4 j + 2 hh + e: key wkey + 16 warp + g + 8 hh,
    // query m0 + 8 j + 2 q4 + e. (Keys past their length have zero K / V rows, but exp2(-lse) of an
    // extreme lse could overflow and meet them as inf * 0 in dQ: they are masked too.)
    const int key0 = wkey + warp * 16 + g;
    const bool need_mask = (sq.causal && wkey + 63 > m0 + sq.offset) || wkey + 63 >= sq.len_kv;
    const float* lt = sL + buf * BM;
    const float* dt = sDs + buf * BM;
#pragma unroll
    for (int j = 0; j < BM / 8; ++j) {
      const int qc = j * 8 + 2 * q4;
      const float2 lv = *reinterpret_cast<const float2*>(lt + qc);
      const float l0 = lse2_of(lv.x, m0 + qc < sq.len_q), l1 = lse2_of(lv.y, m0 + qc + 1 < sq.len_q);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int idx = 4 * j + 2 * hh + e;
          float x = s[idx];
          if (need_mask) {
            const int key = key0 + 8 * hh, qi = m0 + qc + e;
            if (key >= sq.len_kv || (sq.causal && key > qi + sq.offset)) x = -kInf;
          }
          s[idx] = exp2_fast(fmaf(x, p.scale_log2, -(e ? l1 : l0)));
        }
    }
    wgmma::wait<0>();
    wgmma::fence_operands(dp);
    // dS^T, then both packed to 16 bits: k16 step ks (queries 16 ks ..) of the A operand is d[8 ks .. 8 ks + 7]
    unsigned pa[BM / 16][4], da[BM / 16][4];
    attn::bwd_ds_pack<T, BM>(s, dp, dt, q4, pa, da);

    // dV += P^T dO, dK += dS^T Q (B MN-major: k16 step = 16 query rows = 2048 bytes; LBO the slab stride)
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < BM / 16; ++ks)
      wgmma::MmaRS<T, DP, 1>::run(dv, pa[ks], wgmma::desc_sw128(do_s + ks * 2048, BM * 128, 1024), 1);
#pragma unroll
    for (int ks = 0; ks < BM / 16; ++ks)
      wgmma::MmaRS<T, DP, 1>::run(dk, da[ks], wgmma::desc_sw128(q_s + ks * 2048, BM * 128, 1024), 1);
    wgmma::commit();

    if constexpr (ATOMIC) {
      // dS^T into shared memory as [key][query] (swizzled rows of 64 queries; slab per 64 queries):
      // register c of step ks holds (key row + 8 (c & 1), queries 16 ks + 8 (c >> 1) + 2 q4 ..)
      unsigned short* ds = reinterpret_cast<unsigned short*>(smem + C::OFF_DS);
      const int kr = wg * 64 + warp * 16 + g;
#pragma unroll
      for (int ks = 0; ks < BM / 16; ++ks)
#pragma unroll
        for (int c = 0; c < 4; ++c)
          *reinterpret_cast<unsigned*>(ds + wgmma::sw128<BN>(kr + 8 * (c & 1), 2 * ks + (c >> 1)) + 2 * q4) = da[ks][c];
      wgmma::fence_proxy_async();
      __syncthreads();  // both warpgroups' dS^T
      // dQ = dS K: A = dS (queries x keys, stored key-major: MN-major), B = K ([key][d]: MN-major);
      // k16 step = 16 keys = 2048 bytes. D = 128: warpgroup w takes d columns 64 w.. (slab w of K);
      // D = 64: query rows 64 w.. (slab w of dS^T).
      float dq[32];
      const unsigned ao = D > 64 ? 0u : wg * (BN * 128), bo = D > 64 ? wg * (BN * 128) : 0u;
      wgmma::fence();
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk)
        wgmma::Mma<T, 64, 1, 1>::run(dq, wgmma::desc_sw128(sdS + ao + kk * 2048, BN * 128, 1024),
                                     wgmma::desc_sw128(sK + bo + kk * 2048, BN * 128, 1024), kk > 0);
      wgmma::commit();
      wgmma::wait<0>();
      wgmma::fence_operands(dq);
      float* base = p.dq_acc + ((long long)b * p.heads_q + h) * p.seq_q * D;
      const int r0 = m0 + (D > 64 ? 0 : wg * 64) + warp * 16 + g, c0 = (D > 64 ? wg * 64 : 0) + 2 * q4;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int row = r0 + 8 * hh;
        if (row < sq.len_q) {
          float* r = base + (long long)row * D + c0;
#pragma unroll
          for (int j = 0; j < 8; ++j)  // (D = 96: warpgroup 1's columns 96.. are padding)
            if (DP == D || c0 - 2 * q4 + 8 * j < D) red_add2(r + 8 * j, dq[4 * j + 2 * hh], dq[4 * j + 2 * hh + 1]);
        }
      }
    } else {
      wgmma::wait<0>();  // Q / dO of this tile are read until here (the next prefetch overwrites them)
    }
  }
  wgmma::fence_operands(dk);
  wgmma::fence_operands(dv);
  cp_async_wait<0>();  // (iters == 0: K / V copies may still be landing)

  // dK = scale * dK, dV: row key0 + 8 hh, columns 8 j + 2 q4; keys past the length written as zeros
  attn::bwd_store_dkdv<T, D>(p, sq, b, hk, wkey, warp, g, q4, dk, dv);
}

// ------------------------------------------------------------------ deterministic dQ

// Cfg of bwd_dq_wg: 128 query rows (64 per warpgroup), K / V tiles of 64 keys double-buffered.
template <int D> struct CfgDq {
  static constexpr int BM = 128, BN = 64;
  static constexpr int Q_BYTES = BM * Pad<D>::v * 2, KV_BYTES = BN * Pad<D>::v * 2;
  static constexpr int OFF_Q = 0, OFF_DO = Q_BYTES, OFF_K = 2 * Q_BYTES, OFF_V = OFF_K + 2 * KV_BYTES;
  static constexpr int SMEM = OFF_V + 2 * KV_BYTES + 1024;  // + alignment slack
};

// bwd_dq_wg<T, D>: dQ of the deterministic mode, one CTA per (128 query rows, query head, batch), two
// warpgroups of 64 rows. Per K / V tile: S = Q K^T and dP = dO V^T (SS wgmma, all K-major), P and
// dS = P (dP - dsum) in registers, dQ += dS K (register-A wgmma, K MN-major). Every dQ element is summed
// by one thread in a fixed order (bit-identical reruns); dQ = scale * the sum, rows past len_q zeros.
template <class T, int D>
__global__ void __launch_bounds__(kThreads, D > 64 ? 1 : 2) bwd_dq_wg(const AttnParams p) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(sizeof(T) == 0, "bwd_dq_wg needs the sm_90a target (KernelUnit archs)");
#endif
  using C = CfgDq<D>;
  constexpr int BM = C::BM, BN = C::BN, DP = Pad<D>::v;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const unsigned raw = smem_addr(smem_raw);
  unsigned char* smem = smem_raw + (((raw + 1023u) & ~1023u) - raw);
  const unsigned sb = smem_addr(smem);
  const unsigned sQ = sb + C::OFF_Q, sdO = sb + C::OFF_DO, sK = sb + C::OFF_K, sV = sb + C::OFF_V;

  const int mb = gridDim.x - 1 - blockIdx.x;  // longest (causal) blocks first
  const int h = blockIdx.y, b = blockIdx.z, hk = h / p.group;
  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, l = threadIdx.x & 31, g = l >> 2, q4 = l & 3;
  const Seq sq = seq_of(p, b);
  const int m0 = mb * BM, wrow = m0 + wg * 64;  // the CTA's and this warpgroup's first query row
  int n_end = 0;  // keys [0, n_end) can be visible to the CTA's rows
  if (m0 < sq.len_q) n_end = sq.causal ? min(sq.len_kv, max(0, m0 + BM + sq.offset)) : sq.len_kv;
  const int ntiles = (n_end + BN - 1) / BN;

  const T* gk = at<T>(p.k, p, PYDNN_ATTN_T_K, b, hk);
  const T* gv = at<T>(p.v, p, PYDNN_ATTN_T_V, b, hk);
  const long long ldk = p.stride[PYDNN_ATTN_T_K][2], ldv = p.stride[PYDNN_ATTN_T_V][2];
  load_sw<T, D, BM>(sQ, at<T>(p.q, p, PYDNN_ATTN_T_Q, b, h) + (long long)m0 * p.stride[PYDNN_ATTN_T_Q][2],
                    p.stride[PYDNN_ATTN_T_Q][2], sq.len_q - m0);
  load_sw<T, D, BM>(sdO, at<T>(p.dout, p, PYDNN_ATTN_T_DO, b, h) + (long long)m0 * p.stride[PYDNN_ATTN_T_DO][2],
                    p.stride[PYDNN_ATTN_T_DO][2], sq.len_q - m0);
  if (ntiles > 0) {
    load_sw<T, D, BN>(sK, gk, ldk, sq.len_kv);
    load_sw<T, D, BN>(sV, gv, ldv, sq.len_kv);
  }
  cp_async_commit();

  // this thread's rows (wrow + 16 warp + g + 8 hh): lse (log2 units; +inf: P = 0) and dsum
  float lse2[2], dsr[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int row = wrow + warp * 16 + g + 8 * hh;
    lse2[hh] = kInf;
    dsr[hh] = 0.f;
    if (row < sq.len_q) {
      lse2[hh] = lse2_of(p.lse[(long long)b * p.stride[PYDNN_ATTN_T_LSE][0] + (long long)h * p.stride[PYDNN_ATTN_T_LSE][1] +
                               (long long)row * p.stride[PYDNN_ATTN_T_LSE][2]], true);
      dsr[hh] = p.dsum[((long long)b * p.heads_q + h) * p.seq_q + row];
    }
  }
  float dq[DP / 2];
#pragma unroll
  for (int i = 0; i < DP / 2; ++i) dq[i] = 0.f;

  for (int j = 0; j < ntiles; ++j) {
    const int n0 = j * BN, buf = j & 1;
    cp_async_wait<0>();
    wgmma::fence_proxy_async();
    __syncthreads();  // tile j landed for all; every warpgroup is done with tile j - 1
    if (j + 1 < ntiles) {
      load_sw<T, D, BN>(sK + (buf ^ 1) * C::KV_BYTES, gk + (long long)(n0 + BN) * ldk, ldk, sq.len_kv - n0 - BN);
      load_sw<T, D, BN>(sV + (buf ^ 1) * C::KV_BYTES, gv + (long long)(n0 + BN) * ldv, ldv, sq.len_kv - n0 - BN);
    }
    cp_async_commit();
    const unsigned k_s = sK + buf * C::KV_BYTES, v_s = sV + buf * C::KV_BYTES;

    // S = Q K^T, dP = dO V^T (64 rows x 64 keys per warpgroup)
    float s[BN / 2], dp[BN / 2];
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const unsigned ao = (kk >> 2) * (BM * 128) + wg * (64 * 128) + (kk & 3) * 32, bo = (kk >> 2) * (BN * 128) + (kk & 3) * 32;
      wgmma::Mma<T, BN, 0, 0>::run(s, wgmma::desc_sw128(sQ + ao, 16, 1024), wgmma::desc_sw128(k_s + bo, 16, 1024), kk > 0);
    }
    wgmma::commit();  // S in its own group: P's exponentials overlap the dP MMAs
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const unsigned ao = (kk >> 2) * (BM * 128) + wg * (64 * 128) + (kk & 3) * 32, bo = (kk >> 2) * (BN * 128) + (kk & 3) * 32;
      wgmma::Mma<T, BN, 0, 0>::run(dp, wgmma::desc_sw128(sdO + ao, 16, 1024), wgmma::desc_sw128(v_s + bo, 16, 1024), kk > 0);
    }
    wgmma::commit();
    wgmma::wait<1>();
    wgmma::fence_operands(s);

    // element 4 jj + 2 hh + e: row wrow + 16 warp + g + 8 hh, key n0 + 8 jj + 2 q4 + e
    const bool need_mask = n0 + BN > sq.len_kv || (sq.causal && n0 + BN - 1 > wrow + sq.offset);
#pragma unroll
    for (int jj = 0; jj < BN / 8; ++jj)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int idx = 4 * jj + 2 * hh + e;
          float x = s[idx];
          if (need_mask) {
            const int key = n0 + 8 * jj + 2 * q4 + e, qi = wrow + warp * 16 + g + 8 * hh;
            if (key >= sq.len_kv || (sq.causal && key > qi + sq.offset)) x = -kInf;
          }
          s[idx] = exp2_fast(fmaf(x, p.scale_log2, -lse2[hh]));
        }
    wgmma::wait<0>();
    wgmma::fence_operands(dp);
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) dp[i] = s[i] * (dp[i] - dsr[(i >> 1) & 1]);
    unsigned da[BN / 16][4];
#pragma unroll
    for (int ks = 0; ks < BN / 16; ++ks)
#pragma unroll
      for (int c = 0; c < 4; ++c) da[ks][c] = pack16x2<T>(dp[8 * ks + 2 * c], dp[8 * ks + 2 * c + 1]);

    // dQ += dS K (K as [key][d]: MN-major B, k16 step = 16 keys = 2048 bytes, LBO = the slab stride)
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < BN / 16; ++ks)
      wgmma::MmaRS<T, DP, 1>::run(dq, da[ks], wgmma::desc_sw128(k_s + ks * 2048, BN * 128, 1024), 1);
    wgmma::commit();
    wgmma::wait<0>();  // K of this tile is read until here (the next prefetch overwrites it)
  }
  wgmma::fence_operands(dq);
  cp_async_wait<0>();  // (ntiles == 0: the Q / dO copies may still be landing)

  T* gq = const_cast<T*>(at<T>(p.dq, p, PYDNN_ATTN_T_DQ, b, h));
  const long long ldq = p.stride[PYDNN_ATTN_T_DQ][2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int row = wrow + warp * 16 + g + 8 * hh;
    if (row >= p.seq_q) continue;
    const bool live = row < sq.len_q;
    T* r = gq + (long long)row * ldq + 2 * q4;
#pragma unroll
    for (int jj = 0; jj < D / 8; ++jj)
      *reinterpret_cast<unsigned*>(r + 8 * jj) = live ? pack16x2<T>(dq[4 * jj + 2 * hh] * p.scale, dq[4 * jj + 2 * hh + 1] * p.scale) : 0u;
  }
}

}  // namespace attn_wgb
}  // namespace pydnn
