// Fused attention forward on Hopper, warp specialized as FlashAttention-3 builds it (sm_90a units only;
// the host side is pydnn/ops/attention_ws.py, the problem attention_params.h's).
//
//   fwd_ws<T, D, BN, STAGES>: 384 threads, one CTA per SM, persistent.
//     warpgroup 0, the producer (setmaxnreg down to 32 registers): copies each work unit's Q tile (128
//       rows) and its K / V tiles of BN keys into rings of STAGES buffers (wgmma's 128B-swizzled layout,
//       rows past a length zero filled) with cp.async; each copy's completion arrives on the buffer's
//       "full" mbarrier (cp.async.mbarrier.arrive.noinc: one arrival per producer thread when its own
//       copies have landed), and a buffer is refilled after its "empty" mbarrier saw every consumer warp
//       release it. Order: K_0, Q, then K_j, V_{j-1} ..., V_last (what the consumers need first).
//       (cp.async rather than TMA: no tensor map to encode on the host, every stride and the per-batch
//       lengths as the other kernels take them; TMA is the next step, see tools/PERF.md "attn".)
//     warpgroups 1 and 2, the consumers (setmaxnreg up to 232): 64 query rows each of the unit's 128;
//       per key tile j, FA3's intra-warpgroup overlap: S_j = Q K_j^T and O += P_{j-1} V_{j-1} issued as
//       two wgmma groups, wait for S_j only, softmax of tile j while P_{j-1} V_{j-1} runs, then rescale O.
//       Ping-pong between the two: a warpgroup issues its wgmmas only on its turn (named barrier 1 + its
//       index, bar.sync over the 256 consumer threads) and hands the turn over (bar.arrive on the other's)
//       right after issuing, so one warpgroup's softmax runs while the other's GEMMs hold the tensor cores.
//     Work units (128 query rows of one (batch, head)) go round the CTAs in a snake order (round r:
//       CTA i takes unit r * G + i, odd rounds G - 1 - i), units ordered by sections of sched_heads
//       (batch, head) pairs (their K / V fit in L2 together: host), within a section the longest
//       (causal) row blocks first, heads fastest.
//     Epilogue: 1 / l, lse, O staged in the warpgroup's own 64 Q rows (free once its last S is done) for
//       16-byte stores; then the Q buffer is released for the next unit's copy.
//   Variants (fwd_ws_body's template parameters, session 30; pydnn/ops/attention_ws.py pick): QS = 2 Q
//   buffers, EMU eighths of the exponentials by polynomial, ROT rotated key order, NC = 3 consumer
//   warpgroups (d 64), CL = 2 CTA clusters sharing K / V by multicast, XU the next unit's S_0 with the last
//   P V; session 31: GH ghost tiles (a warpgroup computes only the key tiles its rows see), AL end-aligned
//   row blocks. Their comments are at the static_asserts below.
#include "common/types.cuh"
#include "common/attn_mma.cuh"
#include "common/attn_pipe.cuh"
#include "common/tma.cuh"
#include "common/attn_problem.cuh"
#include "common/wgmma.cuh"
#include "common/attn_wg.cuh"
#include "common/attn_wgmma_wide.cuh"
#include "attention_params.h"

namespace pydnn {
namespace attn_ws {

using attn::at;
using attn::bar_arrive;
using attn::bar_sync;
using attn::cp_async_wait;
using attn::mbar_arrive;
using attn::mbar_arrive_cp_async;
using attn::mbar_init;
using attn::mbar_wait;
using attn::Seq;
using attn::seq_of;
using attn::smem_addr;
using attn_wg::kBM;
using attn_wg::kInf;
using attn_wg::kLn2;

constexpr int kThreadsWS = 384;  // warpgroup 0 the producer, 1 and 2 the consumers
constexpr int kProducer = 128;
// 32 x 128 + 232 x 256 = 63488 <= 168 x 384 = 64512, what the launch gave (an inc past the CTA's pool
// hangs). FA3's 24 / 240 left the producer's loop state 20 bytes of spills; 232 is enough for the
// consumers (ptxas: no spills either side).
constexpr int kProdRegs = 32, kConsRegs = 232;
constexpr int kBarTurn = 1;  // named barriers 1, 2: consumer warpgroup 0's / 1's turn to issue wgmmas
// named barriers 1 + NC on: consumer warpgroup i's own (128 threads; fwd_ws_body's BAR_WG + i)

// Work unit u -> (row block, batch, head): sections of hs (batch, head) pairs, row blocks descending
// within a section, heads fastest.
struct Unit {
  int mb, b, h;
};
__device__ __forceinline__ Unit unit_of(const AttnParams& p, int u, int nmb, int nheads, int hs) {
  const int per = nmb * hs, sec = u / per, r = u - sec * per;
  const int nh = min(hs, nheads - sec * hs);
  Unit w;
  w.mb = nmb - 1 - r / nh;
  const int hh = sec * hs + r % nh;
  w.b = hh / p.heads_q;
  w.h = hh - w.b * p.heads_q;
  return w;
}

// The unit a CTA takes in round r (snake order; >= total: none).
__device__ __forceinline__ int unit_at(int r) {
  return r * (int)gridDim.x + ((r & 1) ? (int)gridDim.x - 1 - (int)blockIdx.x : (int)blockIdx.x);
}

// The producer's copy of ROWS rows of D elements (global row stride ld) into the 128B-swizzled tile at
// shared address s, rows >= valid zero filled: attn_wg::load_tile's arithmetic over NT threads, as a
// loop (fully unrolled, its 16 precomputed addresses spilled 808 bytes out of the producer's registers).
template <class T, int D, int ROWS, int NT>
__device__ __forceinline__ void copy_tile(unsigned s, const T* g, long long ld, int valid, int tid) {
  // a thread copies chunks c and (D = 256) c + 16 of rows r0 + RS i: 16 threads a row at most, so RS is
  // a multiple of 8 and every pass is in the same swizzle phase (addresses advance by constants)
  constexpr int CH = D / 8, TPR = CH < 16 ? CH : 16, PER = CH / TPR, RS = NT / TPR, N = ROWS / RS;
  static_assert(RS % 8 == 0 && ROWS % RS == 0 && PER <= 2, "tile chunks must divide among the threads");
  const int r0 = tid / TPR, c = tid % TPR;
  const T* src = g + (long long)r0 * ld + c * 8;
  const long long step = (long long)RS * ld;
  unsigned dst = s + 2u * (unsigned)wgmma::sw128<ROWS>(r0, c);
  constexpr unsigned HALF = (ROWS * 64 * 2) * 2;  // chunk c + 16: two 64-column slabs on
  int row = r0;
#pragma unroll 4
  for (int i = 0; i < N; ++i) {
    const bool ok = row < valid;
    attn::cp_async16(dst, ok ? src : g, ok);
    if (PER == 2) attn::cp_async16(dst + HALF, ok ? src + 128 : g, ok);
    src += step;
    dst += RS * 128;
    row += RS;
  }
}

// copy_tile from a page pool (paged K / V, attention_params.h): tile row r is key n0 + r, row
// (n0 + r) % ps of page tab[((n0 + r) / ps) * ts] (pool: the K/V head's base, pst elements a page, ld a
// row); rows >= valid zero filled, reading no page id. Any page size: a division a row, a page id (from
// L1) where the row's page is not the previous row's.
template <class T, int D, int ROWS, int NT>
__device__ __forceinline__ void copy_tile_paged(unsigned s, const T* pool, long long ld, long long pst, const int* tab,
                                                long long ts, int ps, int n0, int valid, int tid) {
  constexpr int CH = D / 8, TPR = CH < 16 ? CH : 16, PER = CH / TPR, RS = NT / TPR, N = ROWS / RS;
  static_assert(RS % 8 == 0 && ROWS % RS == 0 && PER <= 2, "tile chunks must divide among the threads");
  const int r0 = tid / TPR, c = tid % TPR;
  unsigned dst = s + 2u * (unsigned)wgmma::sw128<ROWS>(r0, c);
  constexpr unsigned HALF = (ROWS * 64 * 2) * 2;
  int row = r0, cur = -1, pg = 0;  // (a thread's rows are RS apart: a page id loaded once per page it meets)
#pragma unroll 4
  for (int i = 0; i < N; ++i) {
    const bool ok = row < valid;
    const T* src = pool;
    if (ok) {
      const int key = n0 + row, pi = key / ps;
      if (pi != cur) {
        pg = __ldg(tab + (long long)pi * ts);
        cur = pi;
      }
      src = pool + (long long)pg * pst + (long long)(key - pi * ps) * ld + c * 8;
    }
    attn::cp_async16(dst, src, ok);
    if (PER == 2) attn::cp_async16(dst + HALF, ok ? src + 128 : pool, ok);
    dst += RS * 128;
    row += RS;
  }
}

// One K / V tile of keys [n0, n0 + BN) by TMA from a page pool map (d, page size, heads, pages): boxes
// of min(ps, BN) rows (the host's map), one page a box: a page of BN or more keys is one box a slab
// (row n0 % ps of page tab[n0 / ps]); pages of 8 .. BN / 2 keys (dividing BN) are BN / ps boxes, box b at
// row b * ps of the tile (1024-byte aligned: the swizzle atoms stay whole). A box wholly past the
// sequence's keys reads no page id: it loads the tile's first page again (live), rows the consumers mask
// (K) and zero (V) as any row past the length.
template <int D, int BN>
__device__ __forceinline__ void load_paged(unsigned dst, const tma::TensorMap* map, unsigned bar, const int* tab,
                                           long long ts, int ps, int n0, int len_kv, int hk, int pg0) {
  // pg0: the page of key n0, loaded by the caller before its wait for the buffer (first_page)
  if (ps >= BN) {
#pragma unroll
    for (int sl = 0; sl < D / 64; ++sl) tma::load_4d(dst + sl * BN * 128, map, bar, sl * 64, n0 % ps, hk, pg0);
    return;
  }
  // the page ids of NB boxes loaded together, then their copies (one at a time, a dependent L2 load each,
  // the 8 boxes of 16-key pages would cost 8 latencies a tile: about the consumers' time for it). ptxas
  // (sm_90a): 8 at a time spilled 80-88 bytes of the producer's 32 registers, 4 28 bytes; so 4 with the
  // producer at 40 registers (consumers 224: no spill at d 64 / 128), and at d 256 (consumers need 232)
  // 2 at a time on 32 (8 bytes spilled, in the one producer thread: cheaper than a latency a box)
  const int* t0 = tab + (long long)(n0 / ps) * ts;  // (pg0 = t0[0]; n0 < len_kv: a live page)
  constexpr int NB = D > 128 ? 2 : 4;
  for (int r = 0; r < BN; r += NB * ps) {
    int pg[NB];
#pragma unroll
    for (int u = 0; u < NB; ++u) {
      const int rr = r + u * ps;
      pg[u] = rr > 0 && rr < BN && n0 + rr < len_kv ? __ldg(t0 + (long long)(rr / ps) * ts) : pg0;
    }
#pragma unroll
    for (int u = 0; u < NB; ++u) {
      const int rr = r + u * ps;
      if (rr < BN) {
#pragma unroll
        for (int sl = 0; sl < D / 64; ++sl)
          tma::load_4d(dst + sl * BN * 128 + rr * 128, map, bar, sl * 64, 0, hk, pg[u]);
      }
    }
  }
}

// The page id of key n0 (load_paged's pg0): issued before the producer waits for the buffer, so its
// latency overlaps the wait instead of delaying the copy.
__device__ __forceinline__ int first_page(const int* tab, long long ts, int ps, int n0) {
  return __ldg(tab + (long long)(n0 / ps) * ts);
}

// Key tiles of a unit (0: its rows are past the length or see no key; O = 0, lse = -inf).
template <int BN, int BM = kBM> __device__ __forceinline__ int tiles_of(const Seq& sq, int m0) {
  return m0 < sq.len_q ? (attn::key_end(sq, m0, BM) + BN - 1) / BN : 0;
}

// exp2 on the FMA pipe (FlashAttention-4's trick, here for a share of a tile's elements): x <= 0 from
// an unmasked tile (finite; clamped at -126, where 2^x is a denormal's worth, not 0: never on a masked
// tile, whose -inf must give 0). Round-to-nearest by the 1.5 x 2^23 magic add, 2^f on [-0.5, 0.5] by a
// degree-3 polynomial (relative error 7.5e-5, fitted in float32: below half an ulp of f16's 11 bits and
// bf16's 8, the P V operand), the integer part added into the exponent field. 3 FADD + 3 FFMA + FMNMX +
// one integer op against one MUFU.EX2 (16 a clock an SM, 8 clocks a warp instruction on a sub-partition).
__device__ __forceinline__ float exp2_poly(float x) {
  x = fmaxf(x, -126.f);
  const float t = x + 12582912.f;  // 1.5 x 2^23: t's low mantissa bits hold round(x) in two's complement
  const float f = x - (t - 12582912.f);
  float p = fmaf(0.0551716685295105f, f, 0.24261115491390228f);
  p = fmaf(p, f, 0.6932609677314758f);
  p = fmaf(p, f, 0.9999280571937561f);
  return __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
}

// attn_wg::softmax_tile with EMU of every 8 column groups (j % 8 < EMU: 8 keys of the tile's 128 / BN a
// group) exponentiated by exp2_poly instead of MUFU.EX2: the softmax of a d 64 tile is as long on the
// special-function units (64 MUFU a thread a tile) as its two GEMMs on the tensor cores. Unmasked tiles
// only (exp2_poly's clamp); EMU = 0 is softmax_tile.
template <int BN, int EMU>
__device__ __forceinline__ void softmax_emu(float (&s)[BN / 2], float (&m)[2], float (&l)[2], float (&corr)[2],
                                            float scale_log2) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = -kInf;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[h], mx * scale_log2);  // (finite: an unmasked tile)
    corr[h] = attn::exp2_fast(m[h] - m_new);
    m[h] = m_new;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float x = fmaf(s[4 * j + 2 * h + e], scale_log2, -m_new);
        const float pv = (j % 8) < EMU ? exp2_poly(x) : attn::exp2_fast(x);
        s[4 * j + 2 * h + e] = pv;
        sum += pv;
      }
    l[h] = l[h] * corr[h] + sum;
  }
}

// One tile's mask (where it reaches past the keys or across the causal diagonal) and softmax: the
// masked tiles by MUFU alone, the others with EMU eighths emulated (softmax_emu).
template <int BN, int EMU>
__device__ __forceinline__ void mask_softmax(bool masked, float (&s)[BN / 2], float (&m)[2], float (&l)[2],
                                             float (&corr)[2], float scale_log2, int row0, int n0, const Seq& sq) {
  if (EMU == 0) {
    if (masked) attn_wg::mask_tile<BN>(s, row0, n0, sq.len_kv, sq.causal, sq.offset);
    attn_wg::softmax_tile<BN>(s, m, l, corr, scale_log2);
  } else if (masked) {
    attn_wg::mask_tile<BN>(s, row0, n0, sq.len_kv, sq.causal, sq.offset);
    attn_wg::softmax_tile<BN>(s, m, l, corr, scale_log2);
  } else {
    softmax_emu<BN, EMU>(s, m, l, corr, scale_log2);
  }
}

// ----------------------------------------------------------------------------- 2-CTA clusters (CL = 2)
// A 4-d TMA box multicast into the CTAs of the cluster in mask (the same shared offset in each, its bytes
// completing on the barrier at `bar`'s offset in each).
__device__ __forceinline__ void load_4d_mc(unsigned dst, const tma::TensorMap* map, unsigned bar, int c0, int c1, int c2,
                                           int c3, unsigned short mask) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%3, %4, "
      "%5, %6}], [%2], %7;\n" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "h"(mask)
      : "memory");
}

// One arrival on the barrier at shared offset bar of the cluster's CTA rank (CUTLASS's ClusterBarrier
// arrive: the default .release.cta; .release.cluster put a MEMBAR.ALL.GPU before every arrival, 4 a tile a
// warp: the stage's reads are wgmma's, complete at the wait before it, and the peer's refill is a TMA write).
__device__ __forceinline__ void mbar_arrive_rank(unsigned bar, unsigned rank) {
  asm volatile(
      "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\nmbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(bar),
      "r"(rank)
      : "memory");
}

// The cluster barrier for threads that may have diverged (the producer's idle lanes leave before its one
// TMA thread): the non-.aligned forms.
__device__ __forceinline__ void cluster_sync_any() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

__device__ __forceinline__ unsigned cta_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// PP: ping-pong between the consumer warpgroups (false: each issues its wgmmas when its data is there;
// benchmark-only, tools/bench_attention.py --fwd-ab's [new no pingpong] rows).
// The TMA variant's tensor maps: Q, K, V as 4-d (d, sequence, heads, batch) tensors, boxes of 64
// columns (one 128B-swizzled slab) x the tile's rows (Q 128, K / V BN).
struct TmaMaps {
  tma::TensorMap q, k, v;
};

// TMA: the producer's copies are one thread's cp.async.bulk.tensor loads completing on the full
// barriers' transaction counts (host: only without per-batch key lengths, since a box past len_kv but
// inside seq_kv would bring in rows that are not zero); else the producer warpgroup's cp.async.
// PAGED: K / V from page pools through the page tables (attention_params.h). cp.async: copy_tile_paged
// (any page size). TMA: the K / V maps are the pools as (d, page_size, heads_kv, pages) tensors, a tile
// one box in one page or BN / ps boxes of whole pages (load_paged; host: page_size a multiple of BN, or
// a multiple of 8 dividing BN); a last tile reaching past the batch's key length brings in whatever its
// page holds there, so the consumers zero those V rows before their P V (S there is masked to -inf,
// P = 0, but 0 x NaN is NaN).
template <class T, int D, int BN, int STAGES, bool PP, bool TMA, bool PAGED = false, int QS = 1, int EMU = 0,
          bool ROT = false, int NC = 2, int CL = 1, bool XU = false, bool GH = false, bool AL = false>
__device__ __forceinline__ void fwd_ws_body(const AttnParams& p, const TmaMaps* tm) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(sizeof(T) == 0, "attention_ws needs the sm_90a target (KernelUnit archs)");
#endif
  // D = 256: O is 128 registers a thread, so 64-key tiles (S 32 + P 16), smem (128 + 4 x 64) x 512 B.
  // D = 128, BN = 176 (units attention.ws.n176.*, tuning.attention.WS_BN176): FA3's non-causal d 128 tile,
  // S 88 + P 44 + O 64 registers a consumer thread, smem (128 + 4 x 176) x 256 B.
  // D = 64, BN = 192 (units attention.ws.n192.*, tuning.attention.WS_BN192): S 96 + P 48 + O 32 registers.
  static_assert((((D == 64 || D == 128) && BN == 128) || (D == 128 && BN == 176) || (D == 64 && BN == 192) ||
                 (D == 256 && BN == 64)) && STAGES >= 2, "fwd_ws tile");
  // QS = 2: two Q buffers, the next unit's Q copied while this one runs (its K_0 / V_0 come through the
  // rings anyway); with one, the consumers wait a copy's latency at every unit (its Q is copied only after
  // both warpgroups' epilogues released the buffer). d 64 / 128 at 128-key tiles only (smem: d 128 2 x 32 +
  // 4 x 32 KiB; d 256 or 176-key tiles would not fit).
  static_assert(QS == 1 || (QS == 2 && D <= 128 && BN == 128), "fwd_ws Q buffers");
  static_assert(EMU >= 0 && EMU <= 8, "fwd_ws exp2 share");
  // ROT: a non-causal unit walks its key tiles from tile blockIdx.x % nt on, round to tile 0 and on (the
  // online softmax takes the tiles in any order; a tile past the keys is masked wherever it falls). The
  // persistent CTAs of one head otherwise read the same K / V tile from L2 at the same time (some 40 of
  // them at s 16384, 32 heads: sections of 3 heads). TMA without pages only.
  static_assert(!ROT || (TMA && !PAGED), "fwd_ws rotated key order");
  // NC consumer warpgroups of 64 query rows (a unit BMW rows): 3 at d 64 (FlashAttention-3's 192-row d 64
  // tile: a tile's softmax as long on the special-function units as its GEMMs on the tensor cores, so two
  // warpgroups leave both half idle), 512 threads, setmaxnreg 24 / 160; they take turns round robin.
  static_assert(NC == 2 || (NC == 3 && D == 64 && BN == 128 && QS == 2 && !PAGED), "fwd_ws consumer warpgroups");
  constexpr int BMW = 64 * NC, NCW = 4 * NC, BAR_WG = kBarTurn + NC;  // BAR_WG + cw: a warpgroup's own
  // CL = 2 (fwd_ws_tma_cl, units attention.ws.cl.<tag>): clusters of 2 CTAs on the row blocks 2i, 2i + 1
  // of one (batch, head) share K / V: each CTA's producer copies half of a tile's rows (boxes of BN / 2)
  // multicast into both (each full barrier still expects the whole tile's bytes), so L2 -> SM traffic for
  // K / V halves. A K / V stage is refilled only when the consumers of both CTAs released it (empty
  // barriers count 2 x NCW arrivals: each consumer warp arrives on its own CTA's and the peer's). Non-causal
  // calls without per-batch lengths only (host): both CTAs walk the same key tiles; a row block past the
  // sequence (odd row blocks) computes on zero Q and stores nothing. A CTA leaves only after the cluster
  // barrier at the end (no copy or arrival of its peer may still be aimed at its shared memory).
  static_assert(CL == 1 || (CL == 2 && TMA && !PAGED && !ROT && NC == 2 && QS == 2), "fwd_ws clusters");
  // XU (units attention.ws.xu.<tag>): across units, a warpgroup issues the next unit's S_0 with this unit's
  // last P V (one turn, as inside a unit), runs the next unit's first softmax under that P V, then this
  // unit's epilogue: the unit boundary no longer leaves the tensor cores a lone S and a lone P V (the next
  // Q is in the other buffer: QS = 2).
  static_assert(!XU || (TMA && !PAGED && !ROT && QS == 2 && CL == 1), "fwd_ws across units");
  // GH (units attention.ws.gh.<tag>, session 31): each consumer warpgroup computes only the key tiles its
  // own 64 rows see (tiles_of over them: the causal diagonal, rows past the length) and walks the unit's other tiles
  // as ghosts: it waits for each K / V stage and releases it, and takes its turn without issuing. Without
  // it every warpgroup computes the unit's nt tiles: at NC = 3 (192-row units, 128-key tiles) the causal
  // diagonal costs the first warpgroups 1-2 masked tiles a unit and the last unit's rows past the sequence
  // compute on TMA's zeros (s 1024 causal: 96 warpgroup tiles where 72 are needed, 74 with GH; d 256, 64-key tiles:
  // warpgroup 0 one masked tile a unit). A ghost's waits are a subset of the computing program's before
  // each of its turns and its releases no later, so the ring and the turn order stay deadlock free (the
  // CPU emulation in tests/ops/attention/test_attention_ws_gh_cpu.py).
  // AL (with GH): row blocks aligned to the sequence's end (m0 = mb BMW - shift, shift the 64-row multiple
  // of nmb BMW - seq_q): the partial block is the first, whose warpgroups above row 0 are ghosts, instead
  // of the last, which under a causal mask sees every key (s 1024, 192-row units: unit tiles 2,3,5,6,8,8 ->
  // 1,2,4,5,7,8). Its Q box starts at a negative row (TMA fills zeros); stores skip rows < 0.
  static_assert(!GH || (TMA && !PAGED && !XU && !ROT && CL == 1), "fwd_ws ghost tiles");
  static_assert(!AL || GH, "fwd_ws end-aligned row blocks need ghost tiles");
  constexpr unsigned Q_BYTES = BMW * D * 2, KV_BYTES = BN * D * 2;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const unsigned raw = smem_addr(smem_raw);
  unsigned char* smem = smem_raw + (((raw + 1023u) & ~1023u) - raw);
  const unsigned aQ = smem_addr(smem), aK = aQ + QS * Q_BYTES, aV = aK + STAGES * KV_BYTES;
  // mbarriers after the tiles: K full [STAGES], K empty, V full, V empty, Q full [QS], Q empty [QS]
  const unsigned aBar = aV + STAGES * KV_BYTES;
  auto qfull = [&](unsigned s) { return aBar + 32u * STAGES + 8u * s; };
  auto qempty = [&](unsigned s) { return aBar + 32u * STAGES + 8u * (QS + s); };
  auto kfull = [&](unsigned s) { return aBar + 8u * s; };
  auto kempty = [&](unsigned s) { return aBar + 8u * (STAGES + s); };
  auto vfull = [&](unsigned s) { return aBar + 8u * (2 * STAGES + s); };
  auto vempty = [&](unsigned s) { return aBar + 8u * (3 * STAGES + s); };
  auto kbuf = [&](unsigned s) { return aK + s * KV_BYTES; };
  auto vbuf = [&](unsigned s) { return aV + s * KV_BYTES; };
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(kfull(s), TMA ? 1 : kProducer);
      mbar_init(vfull(s), TMA ? 1 : kProducer);
      mbar_init(kempty(s), NCW * CL);
      mbar_init(vempty(s), NCW * CL);
    }
    for (int s = 0; s < QS; ++s) {
      mbar_init(qfull(s), TMA ? 1 : kProducer);
      mbar_init(qempty(s), NCW);
    }
    if (CL > 1) asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  if (CL > 1)
    cluster_sync_any();  // the peer's barriers exist before any copy or arrival reaches them
  else
    __syncthreads();
  const unsigned rank = CL > 1 ? cta_rank() : 0u;
  const int G = (int)gridDim.x / CL, gi = (int)blockIdx.x / CL;  // clusters; this CTA's
  // The unit a cluster takes in round r (snake order over the clusters; >= total: none)
  auto unit_r = [&](int r) { return CL == 1 ? unit_at(r) : r * G + ((r & 1) ? G - 1 - gi : gi); };

  // (CL = 2: a unit is a pair of row blocks)
  const int nmb = ((p.seq_q + BMW - 1) / BMW + CL - 1) / CL, nheads = p.batch * p.heads_q, total = nmb * nheads;
  const int shift = AL ? (nmb * BMW - p.seq_q) / 64 * 64 : 0;  // (AL: rows the first block starts above 0)
  const int hs = max(1, min(p.sched_heads, nheads));
  const int rounds = (total + G - 1) / G;
  const int wg = threadIdx.x >> 7;

  // BN = 176 with TMA: FA3's 24 / 240 (the one-thread TMA producer needs few; 232 left the consumers 12
  // bytes of spills, ptxas sm_90a); 24 x 128 + 240 x 256 = 168 x 384
  // paged TMA: the producer's page-id batches need more than 32 (28 bytes spilled): 40 / 224
  // (d 256: the consumers need their 232; its producer takes page ids 2 at a time instead)
  constexpr bool PT = TMA && PAGED && D <= 128;
  // NC = 3: 24 x 128 + 160 x 384 <= 128 x 512 (the 512-thread launch's pool); TMA only (the cp.async
  // producer spilled 12 / 4 bytes at 24 / 32), EMU 0 only (EMU 2 spilled 36 bytes of the consumers' 160)
  static_assert(NC == 2 || (TMA && EMU == 0), "fwd_ws NC = 3: TMA, no EMU");
  // CL = 2: the producer's cluster state spilled 8 bytes at 32 (d 64): 40 / 224, as paged TMA
  constexpr int PREGS = (TMA && BN == 176) || NC == 3 ? 24 : PT || CL > 1 ? 40 : kProdRegs;
  constexpr int CREGS = NC == 3 ? 160 : (TMA && BN == 176) ? 240 : PT || CL > 1 ? 224 : kConsRegs;
  if (wg == 0) {  // ------------------------------------------------------------------ producer
    attn::setmaxnreg_dec<PREGS>();
    const int tid = threadIdx.x;
    if (TMA && tid != 0) {  // one thread issues the loads
      if (CL > 1) cluster_sync_any();
      return;
    }
    unsigned kc = 0, tc = 0;  // K / V tiles and Q tiles copied so far (ring positions and phases)
    for (int r = 0; r < rounds; ++r) {
      const int u = unit_r(r);
      if (u >= total) continue;
      const Unit w = unit_of(p, u, nmb, nheads, hs);
      const Seq sq = seq_of(p, w.b);
      const int m0 = (w.mb * CL + (int)rank) * BMW - shift;
      const int nt = CL > 1 ? (sq.len_kv + BN - 1) / BN : tiles_of<BN, BMW>(sq, m0);  // (CL: the pair's alike)
      if (nt == 0) continue;
      const int hk = w.h / p.group;
      const int rot = ROT && !sq.causal ? (int)blockIdx.x % nt : 0;
      auto key0 = [&](int j) { return (j + rot < nt ? j + rot : j + rot - nt) * BN; };  // tile j's first key
      const long long ldq = p.stride[PYDNN_ATTN_T_Q][2];
      const T* gq = at<T>(p.q, p, PYDNN_ATTN_T_Q, w.b, w.h) + (long long)m0 * ldq;
      const T* gk = PAGED ? (const T*)p.k + (long long)hk * p.stride[PYDNN_ATTN_T_K][1] : at<T>(p.k, p, PYDNN_ATTN_T_K, w.b, hk);
      const T* gv = PAGED ? (const T*)p.v + (long long)hk * p.stride[PYDNN_ATTN_T_V][1] : at<T>(p.v, p, PYDNN_ATTN_T_V, w.b, hk);
      const long long ldk = p.stride[PYDNN_ATTN_T_K][2], ldv = p.stride[PYDNN_ATTN_T_V][2];
      const int* tabk = PAGED ? p.ptab_k + (long long)w.b * p.ptab_stride[0][0] : nullptr;
      const int* tabv = PAGED ? p.ptab_v + (long long)w.b * p.ptab_stride[1][0] : nullptr;
      auto load_q = [&]() {
        const unsigned qs = tc % QS;
        mbar_wait(qempty(qs), ((tc / QS) & 1) ^ 1);
        const unsigned aq = aQ + qs * Q_BYTES;
        if (TMA) {
          tma::mbar_arrive_expect_tx(qfull(qs), Q_BYTES);
#pragma unroll
          for (int sl = 0; sl < D / 64; ++sl)
            tma::load_4d(aq + sl * BMW * 128, &tm->q, qfull(qs), sl * 64, m0, w.h, w.b);
        } else {
          copy_tile<T, D, BMW, kProducer>(aq, gq, ldq, sq.len_q - m0, tid);
          mbar_arrive_cp_async(qfull(qs));
        }
      };
      // QS = 2: Q first (its buffer was released a unit ago: no wait), while the consumers still run the
      // previous unit
      if (QS > 1) load_q();
      for (int j = 0; j <= nt; ++j) {
        if (j < nt) {
          const unsigned c = kc + j, s = c % STAGES;
          const int pk0 = TMA && PAGED ? first_page(tabk, p.ptab_stride[0][1], p.page_size, j * BN) : 0;
          mbar_wait(kempty(s), ((c / STAGES) & 1) ^ 1);
          if (TMA && PAGED) {
            tma::mbar_arrive_expect_tx(kfull(s), KV_BYTES);
            load_paged<D, BN>(kbuf(s), &tm->k, kfull(s), tabk, p.ptab_stride[0][1], p.page_size, j * BN, sq.len_kv, hk,
                              pk0);
          } else if (TMA && CL > 1) {  // this CTA's half of the rows, into both CTAs
            tma::mbar_arrive_expect_tx(kfull(s), KV_BYTES);
#pragma unroll
            for (int sl = 0; sl < D / 64; ++sl)
              load_4d_mc(kbuf(s) + sl * BN * 128 + rank * (BN / 2) * 128, &tm->k, kfull(s), sl * 64,
                         key0(j) + (int)rank * (BN / 2), hk, w.b, 3);
          } else if (TMA) {
            tma::mbar_arrive_expect_tx(kfull(s), KV_BYTES);
#pragma unroll
            for (int sl = 0; sl < D / 64; ++sl)
              tma::load_4d(kbuf(s) + sl * BN * 128, &tm->k, kfull(s), sl * 64, key0(j), hk, w.b);
          } else if (PAGED) {
            copy_tile_paged<T, D, BN, kProducer>(kbuf(s), gk, ldk, p.stride[PYDNN_ATTN_T_K][0], tabk, p.ptab_stride[0][1],
                                                 p.page_size, j * BN, sq.len_kv - j * BN, tid);
            mbar_arrive_cp_async(kfull(s));
          } else {
            copy_tile<T, D, BN, kProducer>(kbuf(s), gk + (long long)j * BN * ldk, ldk, sq.len_kv - j * BN, tid);
            mbar_arrive_cp_async(kfull(s));
          }
        }
        if (j == 0 && QS == 1) load_q();  // after K_0: K_0 is not held up by the previous unit's epilogue
        if (j > 0) {
          const unsigned c = kc + j - 1, s = c % STAGES;
          const int pv0 = TMA && PAGED ? first_page(tabv, p.ptab_stride[1][1], p.page_size, (j - 1) * BN) : 0;
          mbar_wait(vempty(s), ((c / STAGES) & 1) ^ 1);
          if (TMA && PAGED) {
            tma::mbar_arrive_expect_tx(vfull(s), KV_BYTES);
            load_paged<D, BN>(vbuf(s), &tm->v, vfull(s), tabv, p.ptab_stride[1][1], p.page_size, (j - 1) * BN,
                              sq.len_kv, hk, pv0);
          } else if (TMA && CL > 1) {
            tma::mbar_arrive_expect_tx(vfull(s), KV_BYTES);
#pragma unroll
            for (int sl = 0; sl < D / 64; ++sl)
              load_4d_mc(vbuf(s) + sl * BN * 128 + rank * (BN / 2) * 128, &tm->v, vfull(s), sl * 64,
                         key0(j - 1) + (int)rank * (BN / 2), hk, w.b, 3);
          } else if (TMA) {
            tma::mbar_arrive_expect_tx(vfull(s), KV_BYTES);
#pragma unroll
            for (int sl = 0; sl < D / 64; ++sl)
              tma::load_4d(vbuf(s) + sl * BN * 128, &tm->v, vfull(s), sl * 64, key0(j - 1), hk, w.b);
          } else if (PAGED) {
            copy_tile_paged<T, D, BN, kProducer>(vbuf(s), gv, ldv, p.stride[PYDNN_ATTN_T_V][0], tabv, p.ptab_stride[1][1],
                                                 p.page_size, (j - 1) * BN, sq.len_kv - (j - 1) * BN, tid);
            mbar_arrive_cp_async(vfull(s));
          } else {
            copy_tile<T, D, BN, kProducer>(vbuf(s), gv + (long long)(j - 1) * BN * ldv, ldv,
                                           sq.len_kv - (j - 1) * BN, tid);
            mbar_arrive_cp_async(vfull(s));
          }
        }
      }
      kc += nt;
      ++tc;
    }
    if (!TMA) cp_async_wait<0>();
    if (CL > 1) cluster_sync_any();
    return;
  }

  // -------------------------------------------------------------------------------------- consumers
  attn::setmaxnreg_inc<CREGS>();
  const int cw = wg - 1, warp = (threadIdx.x >> 5) & 3, l = threadIdx.x & 31;
  const int my_turn = kBarTurn + cw, other_turn = kBarTurn + (cw + 1) % NC;  // (the next one's, round robin)
  if (PP && cw == NC - 1) bar_arrive(kBarTurn, 256);  // consumer 0 goes first
  // a K / V stage's release: this CTA's empty barrier, and (CL = 2) the peer's (it copies into both)
  auto release = [&](unsigned bar) {
    if (CL == 1) {
      mbar_arrive(bar);
    } else {
      mbar_arrive_rank(bar, 0u);
      mbar_arrive_rank(bar, 1u);
    }
  };
  unsigned kc = 0, tc = 0;
  float o[D / 2];
  float m[2], lsum[2];
  float s[BN / 2];
  unsigned pa[BN / 16][4];
  bool carry = false;  // (XU) this unit's tile 0 was issued and its softmax run in the previous unit's tail
  for (int r = 0; r < rounds; ++r) {
    const int u = unit_r(r);
    if (u >= total) continue;
    const Unit w = unit_of(p, u, nmb, nheads, hs);
    const Seq sq = seq_of(p, w.b);
    const int m0 = (w.mb * CL + (int)rank) * BMW - shift;
    const int nt = CL > 1 ? (sq.len_kv + BN - 1) / BN : tiles_of<BN, BMW>(sq, m0);
    const int wrow0 = m0 + cw * 64, row0 = wrow0 + warp * 16 + (l >> 2);
    // (GH) the tiles this warpgroup computes, the unit's others it walks as ghosts; at least tile 0 (rows
    // that see nothing, AL's rows above 0, compute it masked or on TMA's zero rows, and store nothing): a
    // branch around tile 0's wgmma spilled 12-16 bytes (d 64, NC 3) / 112 (d 256) of the consumers' registers
    const int ntw = GH ? max(1, AL && wrow0 + 64 <= 0 ? 0 : tiles_of<BN, 64>(sq, wrow0)) : nt;
    T* go = (T*)at<T>(p.o, p, PYDNN_ATTN_T_O, w.b, w.h);
    const long long ldo = p.stride[PYDNN_ATTN_T_O][2];
    float* glse = p.lse ? p.lse + (long long)w.b * p.stride[PYDNN_ATTN_T_LSE][0] +
                              (long long)w.h * p.stride[PYDNN_ATTN_T_LSE][1] : nullptr;
    const long long ldl = p.stride[PYDNN_ATTN_T_LSE][2];
    if (nt == 0) {  // nothing visible (no Q copied: the producer may be filling sQ for a later unit)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int row = row0 + hh * 8;
        if (row < p.seq_q && (!AL || row >= 0)) {
          if (glse && (l & 3) == 0) glse[(long long)row * ldl] = -kInf;
#pragma unroll
          for (int j = 0; j < D / 8; ++j)
            *reinterpret_cast<unsigned*>(go + (long long)row * ldo + 8 * j + 2 * (l & 3)) = 0u;
        }
      }
      continue;
    }

    const unsigned qs = tc % QS, aQs = aQ + qs * Q_BYTES;
    const int rot = ROT && !sq.causal ? (int)blockIdx.x % nt : 0;  // (the producer's)
    auto key0 = [&](int j) { return (j + rot < nt ? j + rot : j + rot - nt) * BN; };
    const unsigned aQw = aQs + cw * 64 * 128;  // this warpgroup's rows of Q (slab 0)
    if (!XU || !carry) {  // tile 0: S only (peeled: a wgmma issued under a branch inside the loop made ptxas
                          // serialize them)
#pragma unroll
      for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
      m[0] = m[1] = -kInf;
      lsum[0] = lsum[1] = 0.f;
      mbar_wait(qfull(qs), (tc / QS) & 1);
      const unsigned sc = kc % STAGES;
      mbar_wait(kfull(sc), (kc / STAGES) & 1);
      if (!TMA) wgmma::fence_proxy_async();  // the producer's cp.async writes (generic proxy) seen by wgmma
      if (PP) bar_sync(my_turn, 256);
      wgmma::fence();
      attn_wg::tile_qk<T, D, BN>(s, aQw, kbuf(sc));
      wgmma::commit();
      if (PP) bar_arrive(other_turn, 256);
      wgmma::wait<0>();
      wgmma::fence_operands(s);
      __syncwarp();
      if (l == 0) release(kempty(sc));
      float corr[2];  // (the mask test is warpgroup-uniform)
      const int n0 = key0(0);
      mask_softmax<BN, EMU>(n0 + BN > sq.len_kv || (sq.causal && n0 + BN - 1 > wrow0 + sq.offset), s, m, lsum, corr,
                            p.scale_log2, row0, n0, sq);
      attn_wg::pack_p<T, BN>(pa, s);
    }
    carry = false;
    for (int j = 1; j < ntw; ++j) {
      const int n0 = key0(j);
      const unsigned c = kc + j, sc = c % STAGES, cp = c - 1, sp = cp % STAGES;
      mbar_wait(kfull(sc), (c / STAGES) & 1);
      mbar_wait(vfull(sp), (cp / STAGES) & 1);
      if (!TMA) wgmma::fence_proxy_async();
      if (PP) bar_sync(my_turn, 256);
      wgmma::fence();
      attn_wg::tile_qk<T, D, BN>(s, aQw, kbuf(sc));
      wgmma::commit();
      attn_wg::tile_pv<T, D, BN>(o, pa, vbuf(sp));
      wgmma::commit();
      if (PP) bar_arrive(other_turn, 256);
      wgmma::wait<1>();  // S_j done; P_{j-1} V_{j-1} may still run
      wgmma::fence_operands(s);
      __syncwarp();
      if (l == 0) release(kempty(sc));
      float corr[2];  // (the mask test is warpgroup-uniform)
      mask_softmax<BN, EMU>(n0 + BN > sq.len_kv || (sq.causal && n0 + BN - 1 > wrow0 + sq.offset), s, m, lsum,
                            corr, p.scale_log2, row0, n0, sq);
      wgmma::wait<0>();  // P_{j-1} V_{j-1} done: O may be rescaled, pa rewritten, V_{j-1} released
      wgmma::fence_operands(o);
      __syncwarp();
      if (l == 0) release(vempty(sp));
      attn_wg::rescale<D>(o, corr);
      attn_wg::pack_p<T, BN>(pa, s);
    }
    // XU: the next unit of this CTA (the next round's, when it sees a key) starts in this one's tail
    int nt2 = 0;
    Seq sq2{};
    int m02 = 0;
    if (XU && r + 1 < rounds) {
      const int u2 = unit_r(r + 1);
      if (u2 < total) {
        const Unit w2 = unit_of(p, u2, nmb, nheads, hs);
        sq2 = seq_of(p, w2.b);
        m02 = w2.mb * BMW;
        nt2 = tiles_of<BN, BMW>(sq2, m02);
      }
    }
    float m2[2] = {-kInf, -kInf}, l2[2] = {0.f, 0.f};  // (XU) the next unit's first softmax
    if (XU && nt2 > 0) {  // the last tile's P V with the next unit's S_0
      const unsigned c = kc + nt - 1, sc = c % STAGES, c2 = kc + nt, sc2 = c2 % STAGES;
      const unsigned tc2 = tc + 1, qs2 = tc2 % QS, aQw2 = aQ + qs2 * Q_BYTES + cw * 64 * 128;
      mbar_wait(vfull(sc), (c / STAGES) & 1);
      mbar_wait(qfull(qs2), (tc2 / QS) & 1);
      mbar_wait(kfull(sc2), (c2 / STAGES) & 1);
      if (PP) bar_sync(my_turn, 256);
      wgmma::fence();
      attn_wg::tile_qk<T, D, BN>(s, aQw2, kbuf(sc2));
      wgmma::commit();
      attn_wg::tile_pv<T, D, BN>(o, pa, vbuf(sc));
      wgmma::commit();
      if (PP) bar_arrive(other_turn, 256);
      wgmma::wait<1>();  // the next unit's S_0 done; this unit's last P V may still run
      wgmma::fence_operands(s);
      __syncwarp();
      if (l == 0) release(kempty(sc2));
      float corr2[2];
      const int wrow02 = m02 + cw * 64, row02 = wrow02 + warp * 16 + (l >> 2);
      mask_softmax<BN, EMU>(BN > sq2.len_kv || (sq2.causal && BN - 1 > wrow02 + sq2.offset), s, m2, l2, corr2,
                            p.scale_log2, row02, 0, sq2);
      wgmma::wait<0>();
      wgmma::fence_operands(o);
      __syncwarp();
      if (l == 0) release(vempty(sc));
      attn_wg::pack_p<T, BN>(pa, s);  // (pa is free: the P V is done; the next unit's P_0)
    } else if (!GH || ntw > 0) {  // the last tile's P V (GH: this warpgroup's last; ntw >= 1: a test that kept ptxas from spilling)
      const unsigned c = kc + ntw - 1, sc = c % STAGES;
      mbar_wait(vfull(sc), (c / STAGES) & 1);
      if (TMA && PAGED) {
        // rows [keep, BN) of the box came from the page past the batch's keys: zero them (each slab's rows
        // are 128 contiguous bytes, the swizzle moves chunks only within a row). Both warpgroups write the
        // same zeros; each reads only after its own writes and barrier.
        const int keep = sq.len_kv - (nt - 1) * BN;  // (warpgroup-uniform)
        if (keep < BN) {
          const int t = threadIdx.x & 127;
#pragma unroll
          for (int sl = 0; sl < D / 64; ++sl) {
            unsigned char* base = smem + (vbuf(sc) - aQ) + sl * BN * 128;  // (aQ: smem's address)
            for (int off = keep * 128 + t * 16; off < BN * 128; off += 128 * 16)
              *reinterpret_cast<uint4*>(base + off) = make_uint4(0, 0, 0, 0);
          }
          wgmma::fence_proxy_async();
          bar_sync(BAR_WG + cw, 128);
        }
      }
      if (!TMA) wgmma::fence_proxy_async();
      if (PP) bar_sync(my_turn, 256);
      wgmma::fence();
      attn_wg::tile_pv<T, D, BN>(o, pa, vbuf(sc));
      wgmma::commit();
      if (PP) bar_arrive(other_turn, 256);
      wgmma::wait<0>();
      wgmma::fence_operands(o);
      __syncwarp();
      if (l == 0) release(vempty(sc));
    }
    if (GH) {  // the unit's tiles past this warpgroup's: wait for each stage, release it, take the turn
      for (int j = ntw; j < nt; ++j) {
        const unsigned c = kc + j, sc = c % STAGES;
        mbar_wait(kfull(sc), (c / STAGES) & 1);
        __syncwarp();
        if (l == 0) release(kempty(sc));
        if (PP) {
          bar_sync(my_turn, 256);
          bar_arrive(other_turn, 256);
        }
        mbar_wait(vfull(sc), (c / STAGES) & 1);
        __syncwarp();
        if (l == 0) release(vempty(sc));
      }
    }
    kc += nt;
    ++tc;

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
      if (glse && (l & 3) == 0 && row < p.seq_q && (!AL || row >= 0)) glse[(long long)row * ldl] = live ? m[hh] * kLn2 + __logf(t) : -kInf;
    }
    // Stage this warp's 16 rows in its own rows of sQ, then 16-byte stores along the rows. The
    // warpgroup's S wgmmas are the only readers of its 64 rows; every warp's wait for them is behind it
    // once the warpgroup meets here (named barrier 3 + its index, once a unit).
    bar_sync(BAR_WG + cw, 128);
    T* const sQ = reinterpret_cast<T*>(smem + qs * Q_BYTES);  // this unit's Q buffer
    const int srow = cw * 64 + warp * 16;
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int rr = srow + (l >> 2) + hh * 8;
        *reinterpret_cast<unsigned*>(sQ + wgmma::sw128<BMW>(rr, j) + (l & 3) * 2) =
            pack16x2<T>(o[4 * j + 2 * hh] * inv[hh], o[4 * j + 2 * hh + 1] * inv[hh]);
      }
    __syncwarp();
    constexpr int CH = D / 8;
#pragma unroll
    for (int i = 0; i < 16 * CH / 32; ++i) {
      const int idx = l + i * 32, rr = idx / CH, cc = idx % CH;
      const int grow = m0 + srow + rr;
      if (grow < p.seq_q && (!AL || grow >= 0)) {
        uint4 v = *reinterpret_cast<const uint4*>(sQ + wgmma::sw128<BMW>(srow + rr, cc));
        if (grow >= sq.len_q) v = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(go + (long long)grow * ldo + cc * 8) = v;
      }
    }
    wgmma::fence_proxy_async();  // these generic-proxy accesses to sQ before the next Q's copy (TMA: async proxy)
    __syncwarp();
    if (l == 0) mbar_arrive(qempty(qs));  // this warp's rows of sQ may take a later unit's Q
    if (XU && nt2 > 0) {  // the next unit goes on from its tile 0 (issued above)
#pragma unroll
      for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
      m[0] = m2[0], m[1] = m2[1], lsum[0] = l2[0], lsum[1] = l2[1];
      carry = true;
    }
  }
  if (CL > 1) cluster_sync_any();  // (the producer's threads meet it too)
}

// QS: Q buffers (2: the next unit's Q copied under this one), EMU: eighths of an unmasked tile's
// exponentials on the FMA pipe (softmax_emu); units attention.ws.q2.<tag> (pydnn/ops/attention_ws.py)
// NC: consumer warpgroups (3: d 64, 192-row units, 512 threads; units attention.ws.c3.<tag>)
template <class T, int D, int BN, int STAGES, bool PP = true, int QS = 1, int EMU = 0, int NC = 2>
__global__ void __launch_bounds__(128 * (NC + 1), 1) fwd_ws(const AttnParams p) {
  fwd_ws_body<T, D, BN, STAGES, PP, false, false, QS, EMU, false, NC>(p, nullptr);
}

// XU: the next unit's S_0 issued with this one's last P V (units attention.ws.xu.<tag>)
// GH: ghost tiles, AL: end-aligned row blocks (units attention.ws.gh.<tag>, session 31)
template <class T, int D, int BN, int STAGES, bool PP = true, int QS = 1, int EMU = 0, bool ROT = false, int NC = 2,
          bool XU = false, bool GH = false, bool AL = false>
__global__ void __launch_bounds__(128 * (NC + 1), 1) fwd_ws_tma(const AttnParams p, const __grid_constant__ TmaMaps tm) {
  fwd_ws_body<T, D, BN, STAGES, PP, true, false, QS, EMU, ROT, NC, 1, XU, GH, AL>(p, &tm);
}

// 2-CTA clusters sharing K / V by multicast (CL = 2; units attention.ws.cl.<tag>, two Q buffers)
template <class T, int D, int BN, int STAGES, int EMU = 0>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreadsWS, 1)
    fwd_ws_tma_cl(const AttnParams p, const __grid_constant__ TmaMaps tm) {
  fwd_ws_body<T, D, BN, STAGES, true, true, false, 2, EMU, false, 2, 2>(p, &tm);
}

// paged K / V (units attention.ws.paged.<tag>): the cp.async producer (any page size) and TMA (page size
// a multiple of BN; tm's K / V maps over the page pools)
template <class T, int D, int BN, int STAGES, bool PP = true>
__global__ void __launch_bounds__(kThreadsWS, 1) fwd_ws_paged(const AttnParams p) {
  fwd_ws_body<T, D, BN, STAGES, PP, false, true>(p, nullptr);
}

template <class T, int D, int BN, int STAGES, bool PP = true>
__global__ void __launch_bounds__(kThreadsWS, 1) fwd_ws_tma_paged(const AttnParams p, const __grid_constant__ TmaMaps tm) {
  fwd_ws_body<T, D, BN, STAGES, PP, true, true>(p, &tm);
}

}  // namespace attn_ws
}  // namespace pydnn
