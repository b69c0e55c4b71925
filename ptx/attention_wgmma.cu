// Fused scaled dot-product attention forward on Hopper warpgroup MMA (wgmma, sm_90a units only; the
// mma.sync kernels of ptx/attention.cu serve every other arch, dropout and the backward). The problem is
// attention_params.h's; the host side is pydnn/ops/attention_wgmma.py.
//
//   fwd<T, D, BN, PIPE, STAGES, DIAG>
//     one CTA per (128 query rows, query head, batch): two warpgroups of 128 threads, each owning 64 rows
//     (wgmma's M). Q (128 x D), and K / V tiles of BN keys (STAGES buffers each), sit in shared memory in
//     wgmma's 128B-swizzled layout (common/wgmma.cuh), filled with cp.async by all 256 threads.
//     Per key tile j of a warpgroup:
//       S = Q K^T        SS wgmma m64nBNk16, Q and K both K-major (the head dim is contiguous in both);
//       masking, online softmax on the accumulator fragment (exp2, scale pre-multiplied by log2 e);
//       P (16-bit, packed in registers: the accumulator fragment is the register-A fragment) feeds
//       O += P V         RS wgmma m64nDk16 (A = P from registers, B = V [key][d]: MN-major).
//     PIPE (FlashAttention-3's intra-warpgroup overlap): iteration j issues S_j = Q K_j^T and then
//     O += P_{j-1} V_{j-1} as two groups, waits for the first only, and runs tile j's softmax while the
//     tensor cores do P_{j-1} V_{j-1}; O is rescaled after that group is done. The last P V follows the
//     loop. Copies: iteration j, before it issues its wgmmas, fetches K_{j+STAGES-1} into the buffer
//     K_{j-1} used and V_{j+STAGES-2} into the one V_{j-2} used (every warpgroup finished both before
//     the iteration's barrier), so a copy has STAGES - 1 iterations to land. Without PIPE (STAGES 2):
//     S_j, wait, softmax, P_j V_j, wait; K/V_{j+1} fetched at the start of iteration j.
//     The epilogue (1 / l, lse, O staged through the warp's own Q rows for 16-byte stores) is
//     ptx/attention.cu's, on the wgmma fragment (per warp the mma.sync C layout, warps stacked along M).
#include "common/types.cuh"
#include "common/attn_mma.cuh"
#include "common/attn_problem.cuh"
#include "common/wgmma.cuh"
#include "common/attn_wg.cuh"
#include "attention_params.h"

namespace pydnn {
namespace attn_wg {

// Dynamic shared memory: Q, STAGES K and STAGES V tiles, +1 KiB to align the swizzle atoms (host:
// smem_bytes). STAGES (PIPE only; plain is 2): with 3, the copies of iteration j fetch K_{j+2} and
// V_{j+1}, two iterations ahead of their use (measured no faster: not instantiated, kept for a TMA
// version where the balance may differ; the tests cover what is instantiated). DIAG (benchmark-only
// diagnostics, wrong results; not in the build's units): 1 = no masking / softmax / rescale (the MMA
// and copy floor), 2 = no wgmma (the softmax and copy floor).
template <class T, int D, int BN, bool PIPE, int STAGES, int DIAG>
__global__ void __launch_bounds__(kThreads, 1) fwd(const AttnParams p) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(sizeof(T) == 0, "attention_wgmma needs the sm_90a target (KernelUnit archs)");
#endif
  // D = 256: O is 128 registers a thread (64 rows x 256 per warpgroup), so 64-key tiles (S 32 + P 16);
  // smem (128 + 2 x 2 x 64) x 256 x 2 + 1 KiB = 193 KiB, one CTA per SM as at D = 128.
  static_assert(((D == 64 || D == 96 || D == 128) && (BN == 64 || BN == 128)) || (D == 256 && BN == 64), "fwd tile");
  static_assert(STAGES == 2 || (PIPE && STAGES == 3), "fwd stages");
  constexpr int DP = Pad<D>::v;
  constexpr unsigned Q_BYTES = kBM * DP * 2, KV_BYTES = BN * DP * 2;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const unsigned raw = smem_addr(smem_raw);
  unsigned char* smem = smem_raw + (((raw + 1023u) & ~1023u) - raw);
  T* sQ = reinterpret_cast<T*>(smem);
  const unsigned aQ = smem_addr(smem), aK = aQ + Q_BYTES, aV = aK + STAGES * KV_BYTES;

  const int mb = gridDim.x - 1 - blockIdx.x;  // longest (causal) blocks first
  const int h = blockIdx.y, b = blockIdx.z, hk = h / p.group;
  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, l = threadIdx.x & 31;
  const Seq sq = seq_of(p, b);
  const int m0 = mb * kBM;
  int n_end = 0;  // keys [0, n_end) can be visible to this CTA's rows
  if (m0 < sq.len_q) n_end = sq.causal ? min(sq.len_kv, max(0, m0 + kBM + sq.offset)) : sq.len_kv;
  const int ntiles = (n_end + BN - 1) / BN;
  const int wrow0 = m0 + wg * 64;                     // this warpgroup's first row
  const int row0 = wrow0 + warp * 16 + (l >> 2);      // this thread's rows: row0, row0 + 8

  const T* gq = at<T>(p.q, p, PYDNN_ATTN_T_Q, b, h) + (long long)m0 * p.stride[PYDNN_ATTN_T_Q][2];
  const T* gk = at<T>(p.k, p, PYDNN_ATTN_T_K, b, hk);
  const T* gv = at<T>(p.v, p, PYDNN_ATTN_T_V, b, hk);
  const int ldk = (int)p.stride[PYDNN_ATTN_T_K][2], ldv = (int)p.stride[PYDNN_ATTN_T_V][2];  // < 2^31 (host)

  // K tile t lives in buffer t % STAGES (kbuf), V tile t likewise (vbuf).
  auto kbuf = [&](int t) { return aK + (unsigned)(t % STAGES) * KV_BYTES; };
  auto vbuf = [&](int t) { return aV + (unsigned)(t % STAGES) * KV_BYTES; };
  auto load_k = [&](int t) { load_tile<T, D, BN>(kbuf(t), gk + (long long)t * BN * ldk, ldk, sq.len_kv - t * BN, threadIdx.x); };
  auto load_v = [&](int t) { load_tile<T, D, BN>(vbuf(t), gv + (long long)t * BN * ldv, ldv, sq.len_kv - t * BN, threadIdx.x); };
  // Copy groups: Q with K_0 (plain: and V_0); with 3 stages a second group K_1, V_0. Iteration j then
  // commits one group (possibly empty), so "the group of iteration j - STAGES + 2" is always the one
  // holding K_j and V_{j-1} (plain: K_j, V_j).
  load_tile<T, D, kBM>(aQ, gq, p.stride[PYDNN_ATTN_T_Q][2], sq.len_q - m0, threadIdx.x);
  if (ntiles > 0) {
    load_k(0);
    if (!PIPE) load_v(0);
  }
  cp_async_commit();
  if (STAGES == 3) {
    if (ntiles > 1) load_k(1);
    if (ntiles > 0) load_v(0);
    cp_async_commit();
  }

  float o[DP / 2];
#pragma unroll
  for (int i = 0; i < DP / 2; ++i) o[i] = 0.f;
  float m[2] = {-kInf, -kInf}, lsum[2] = {0.f, 0.f};
  float s[BN / 2];
  unsigned pa[BN / 16][4];
  if (DIAG == 2) {  // (no S wgmma: defined scores, carried over the loop)
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) s[i] = 0.f;
  }
  const unsigned aQw = aQ + wg * 64 * 128;

  for (int j = 0; j < ntiles; ++j) {
    const int n0 = j * BN;
    cp_async_wait<STAGES - 2>();  // this thread's copies of K_j and V_{j-1} (plain: V_j) landed ...
    wgmma::fence_proxy_async();   // ... visible to the async proxy ...
    __syncthreads();              // ... for every thread's chunks; and the buffers refilled below are free
    // The copies: plain fetches K/V_{j+1} into the buffers of K/V_{j-1}; PIPE K_{j+S-1} into the one
    // of K_{j-1} and V_{j+S-2} into the one of V_{j-2} (all read by wgmmas every warpgroup waited for
    // before this barrier). Issued before this iteration's wgmmas: issued after their wait<1> they
    // delay the softmax (-3% at D = 128, -8% at D = 64), and between the wgmmas and that wait they
    // make ptxas serialize the wgmmas (C7514).
    if (!PIPE) {
      if (j + 1 < ntiles) {
        load_k(j + 1);
        load_v(j + 1);
      }
    } else {
      if (j + STAGES - 1 < ntiles) load_k(j + STAGES - 1);
      if (j + STAGES - 2 < ntiles) load_v(j + STAGES - 2);
    }
    cp_async_commit();

    wgmma::fence();  // s, pa and o were written by ordinary instructions since the last wgmma
    if (DIAG != 2) tile_qk<T, D, BN>(s, aQw, kbuf(j));
    wgmma::commit();
    if (PIPE && j > 0) {
      if (DIAG != 2) tile_pv<T, D, BN>(o, pa, vbuf(j - 1));
      wgmma::commit();
      wgmma::wait<1>();  // S_j done; P_{j-1} V_{j-1} may still run
    } else {
      wgmma::wait<0>();
    }
    wgmma::fence_operands(s);
    if (n0 + BN > sq.len_kv || (sq.causal && n0 + BN - 1 > wrow0 + sq.offset))  // (warpgroup-uniform)
      mask_tile<BN>(s, row0, n0, sq.len_kv, sq.causal, sq.offset);
    float corr[2] = {1.f, 1.f};
    if (DIAG != 1) softmax_tile<BN>(s, m, lsum, corr, p.scale_log2);
    if (PIPE) {
      wgmma::wait<0>();  // P_{j-1} V_{j-1} done: O may be rescaled and pa rewritten
      wgmma::fence_operands(o);
    }
    if (DIAG != 1) rescale<DP>(o, corr);
    pack_p<T, BN>(pa, s);
    if (!PIPE) {
      wgmma::fence();
      if (DIAG != 2) tile_pv<T, D, BN>(o, pa, vbuf(j));
      wgmma::commit();
      wgmma::wait<0>();
      wgmma::fence_operands(o);
    }
  }
  if (PIPE && ntiles > 0) {  // the last tile's P V: V_last was fetched in the last iteration
    cp_async_wait<0>();
    wgmma::fence_proxy_async();
    __syncthreads();
    wgmma::fence();
    if (DIAG != 2) tile_pv<T, D, BN>(o, pa, vbuf(ntiles - 1));
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operands(o);
  }
  // Before O is staged in sQ: Q's copies (spread over every thread) have all landed, and every
  // warpgroup's S wgmmas, which read sQ, are done (once per CTA: not worth a finer argument).
  cp_async_wait<0>();
  __syncthreads();

  // epilogue: full row sums, 1 / l, lse; rows past the length or with nothing visible -> O = 0, lse = -inf
  float inv[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    float t = lsum[hh];
    t += __shfl_xor_sync(0xffffffffu, t, 1);
    t += __shfl_xor_sync(0xffffffffu, t, 2);
    const int row = row0 + hh * 8;
    const bool live = row < sq.len_q && t > 0.f;
    inv[hh] = live ? 1.f / t : 0.f;
    if (p.lse && (l & 3) == 0 && row < p.seq_q) {
      const float lse = live ? m[hh] * kLn2 + __logf(t) : -kInf;
      p.lse[(long long)b * p.stride[PYDNN_ATTN_T_LSE][0] + (long long)h * p.stride[PYDNN_ATTN_T_LSE][1] +
            (long long)row * p.stride[PYDNN_ATTN_T_LSE][2]] = lse;
    }
  }
  // Stage this warp's 16 rows in its own rows of sQ, then 16-byte stores along the rows.
  const int srow = wg * 64 + warp * 16;
#pragma unroll
  for (int j = 0; j < D / 8; ++j)  // (D = 96: the 12 real column chunks)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = srow + (l >> 2) + hh * 8;
      *reinterpret_cast<unsigned*>(sQ + wgmma::sw128<kBM>(r, j) + (l & 3) * 2) =
          pack16x2<T>(o[4 * j + 2 * hh] * inv[hh], o[4 * j + 2 * hh + 1] * inv[hh]);
    }
  __syncwarp();
  T* go = (T*)at<T>(p.o, p, PYDNN_ATTN_T_O, b, h);
  const long long ldo = p.stride[PYDNN_ATTN_T_O][2];
  constexpr int CH = D / 8;
#pragma unroll
  for (int i = 0; i < 16 * CH / 32; ++i) {
    const int idx = l + i * 32, r = idx / CH, c = idx % CH;
    const int grow = m0 + srow + r;
    if (grow < p.seq_q) {
      uint4 v = *reinterpret_cast<const uint4*>(sQ + wgmma::sw128<kBM>(srow + r, c));
      if (grow >= sq.len_q) v = make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(go + (long long)grow * ldo + c * 8) = v;
    }
  }
}

}  // namespace attn_wg
}  // namespace pydnn
