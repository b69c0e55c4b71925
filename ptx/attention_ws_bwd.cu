// Fused attention backward on Hopper, warp specialized as FlashAttention-3 builds it (sm_90a units only;
// the host side is pydnn/ops/attention_ws_bwd.py, the problem attention_params.h's). The preprocess
// (dsum = rowsum(dO * O), the fp32 dQ accumulator zeroed) and the atomic mode's dQ conversion stay
// attention.cu's bwd_pre / bwd_dq_convert, the deterministic mode's dQ pass attention_wgmma_bwd.cu's
// bwd_dq_wg: this kernel replaces bwd_dkdv_wg (same problem, same workspace, same results up to the
// order of fp32 additions).
//
//   bwd_ws<T, D, DQ, STAGES>: 384 threads, one CTA per (128 keys, K/V head, batch).
//     warpgroup 0, the producer (setmaxnreg down to 24 registers; warps 1-3 leave at once): warp 0's
//       lane 0 loads the CTA's K and V tiles once (TMA, on the kv barrier), then, for each (query head of
//       the group, query tile of BM rows) the CTA walks, Q and dO by TMA into a ring of STAGES stages
//       (128B-swizzled slabs of 64 columns: wgmma's layout, the box's rows past the tensor zero filled)
//       completing on the stage's "full" barrier (expect_tx), while the warp's 32 lanes load the tile's
//       lse (turned into log2 units, +inf past len_q: P = 0) and dsum (0 past len_q) into the stage and
//       arrive on the same barrier (arrival count 1 + 32). A stage is refilled after its "empty" barrier
//       saw all 8 consumer warps release it.
//     warpgroups 1 and 2, the consumers (setmaxnreg up to 240): warpgroup w owns keys 64 w .. 64 w + 63
//       of the CTA's 128 (wgmma's M = 64) and keeps their dK and dV in registers across the whole walk.
//       Per stage (bwd_dkdv_wg's arithmetic): S^T = K Q^T, dP^T = V dO^T (SS wgmma, two groups: P^T's
//       exponentials run under dP^T's MMAs), P^T and dS^T = P^T (dP^T - dsum) in registers, dV += P^T dO
//       and dK += dS^T Q (register-A wgmma); DQ != kDqNone (ATOMIC): dS^T to shared memory (double
//       buffered), the two warpgroups meet on a named barrier, dQ = dS K (each warpgroup half of it: D = 128
//       64 columns, D = 64 64 query rows), added to the fp32 accumulator: kDqRed red.global.add.v2 from the
//       registers, kDqBulk FA3's way (below). Then the stage is released.
//     dK (times the scale) and dV go from the accumulators to global memory at the end; keys past their
//     length get zeros.
// TMA brings rows past len_q / len_kv but inside the tensor as they are (not zeros), so the host sends
// calls with per-batch lengths to bwd_dkdv_wg (pydnn/ops/attention_ws_bwd.py usable).
//
// Barrier protocol (ptx/common/tma.cuh's; emulated in tests/ops/attention/test_attention_ws_bwd_cpu.py):
//   kv: count 1, one phase (producer expect_tx + 4 D/64-slab boxes of K and V); consumers wait parity 0.
//   full[s]: count 33; use n of stage s: producer waits empty[s] parity (n & 1) ^ 1, lane 0
//     arrive_expect_tx(2 Q_BYTES) + the Q / dO boxes, every lane stores its lse / dsum rows and arrives;
//     consumers wait full[s] parity n & 1.
//   empty[s]: count 8 (one per consumer warp, after the warpgroup's last wgmma reading the stage waited).
//   named barrier kBarDS (256 consumer threads), ATOMIC only: both halves of dS^T written before either
//     warpgroup's dQ wgmma reads them; dS^T is double buffered, so a warpgroup writing buffer it & 1 at
//     iteration it is past the other's dQ of it - 2 (the other reached barrier it - 1 after that wait).
//   kDqRedPP (red, without the per-tile meeting): named barriers kBarTurn + w strictly alternate the
//     warpgroups' S^T / dP^T issue (bar.sync on its own, bar.arrive on the other's right after issuing;
//     warpgroup 1 pre-arrives once), so one's exponentials run under the other's MMAs; dS^T buffer i has
//     mbarriers dsfull[i] (8 warps: both halves written) and dsempty[i] (8 warps: both dQs that read it
//     done); iteration it writes buffer it & 1 after dsempty's phase for it - 2, arrives on dsfull, then
//     computes dQ of it - 1 (waits dsfull of it - 1) and releases that buffer; the last dQ after the loop.
//   kDqBulk: the fp32 dQ tile (one buffer): both halves stored, fence.proxy.async, named barrier kBarDQ,
//     then thread 128 issues the bulk tensor reductions; it waits for their reads (wait_group.read) before
//     it arrives on the next iteration's kBarDS, which every thread passes before storing its next half;
//     it waits for the reductions' completion before the CTA ends.
//   kDqBulkW: the same tile, no kBarDQ: dqfull count 8 (a consumer warp's half of the tile stored and
//     fenced), dqempty count 1 (the writer, thread 32, after wait_group.read of tile it's reductions);
//     consumers wait dqempty parity (it & 1) ^ 1 before storing tile it, the writer dqfull parity it & 1.
//     The writer waits for the reductions' completion before it exits.
//   kDqBulkWPP: kDqRedPP's protocol, the previous tile's dQ going through kDqBulkW's writer instead of red:
//     tile t in buffer t & 1, dqfull / dqempty per buffer (parities (t >> 1) & 1, the consumers' ^ 1).
//   kDqBulkWPP1: kDqBulkWPP with one buffer: tile t in buffer 0, parities t & 1 (the consumers' ^ 1).
#include "common/types.cuh"
#include "common/attn_mma.cuh"
#include "common/attn_pipe.cuh"
#include "common/attn_problem.cuh"
#include "common/attn_bwd_tile.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"
#include "attention_params.h"

namespace pydnn {
namespace attn_wsb {

using attn::at;
using attn::exp2_fast;
using attn::red_add2;
using attn::Seq;
using attn::seq_of;

constexpr int kThreads = 384;  // warpgroup 0 the producer, 1 and 2 the consumers
constexpr int kBN = 128;       // keys per CTA
// 24 x 128 + 240 x 256 = 64512 = 168 x 384, the launch's pool (FA3's split; an inc past the pool hangs)
constexpr int kProdRegs = 24, kConsRegs = 240;
constexpr int kBarDS = 1;      // named barrier: both warpgroups' dS^T in shared memory
constexpr int kConsumerWarps = 8;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kInf = 1.0f / 0.0f;

// Tiles and the shared-memory layout (byte offsets from a 1024-aligned base). pydnn/ops/attention_ws_bwd.py
// mirrors SMEM.
// dQ modes: kDqNone (deterministic: the older dQ pass computes it), kDqRed (red.global.add.v2 from the
// accumulator registers, bwd_dkdv_wg's way), kDqBulk (FA3's: the warpgroups' halves into one fp32 tile in
// shared memory, then one thread's cp.reduce.async.bulk .add.f32 of the whole tile: its rows are contiguous
// in the accumulator, [b][h][i][D]).
constexpr int kDqNone = 0, kDqRed = 1, kDqBulk = 2, kDqRedPP = 3;
// kDqBulkW: kDqBulk with FA3's dedicated dQ writer (warp 1 of the producer warpgroup): the consumer warps
// store their halves and arrive on dqfull; the writer issues the bulk tensor reductions, waits for their
// reads and arrives on dqempty, which the consumers wait for before storing the next tile's halves (the
// consumers no longer meet on kBarDQ, nor wait on one of their threads' issue and read wait).
constexpr int kDqBulkW = 4;
// kDqBulkWPP: kDqRedPP's ping-pong (the consumer warpgroups take turns at S^T / dP^T, each computes the
// previous tile's dQ) with kDqBulkW's writer, the dQ tile double buffered (the two warpgroups store their
// halves of a tile half an iteration apart).
constexpr int kDqBulkWPP = 5;
// kDqBulkW2 (bwd_ws256 only): kDqBulkW with the dQ tile split the other way over the stage's buffers: warpgroup
// w's first 64 columns into bytes 16 KiB w .. of the dO buffer, its last 64 into the same bytes of the Q buffer:
// the bytes its own dV (dO's head-dim slabs 2 w, 2 w + 1) and dK (Q's) read, every other reader of the stage
// (S^T, dP^T: all slabs) done before kBarDS. So no meeting: the first half goes in after its own dV (under dK's
// MMAs), the second after its own dK.
constexpr int kDqBulkW2 = 6;
// kDqBulkWPP1 (session 33): kDqBulkWPP with one dQ tile (kDqBulkW's): a warpgroup stores its half of tile t + 1
// after the writer's read of tile t (dqempty), half an iteration after the other warpgroup's half of t went in;
// 199800 bytes at d 64, where kDqBulkWPP's second tile does not fit (232568 > 232448): the ping-pong at d 64.
constexpr int kDqBulkWPP1 = 7;
template <int DQ> struct DqBufs { static constexpr int value = DQ == kDqBulkWPP ? 2 : 1; };
// The CTA order of a 1-d grid (launched when tuning.attention_bwd.WS_ORDER): chunks of kOrderChunk (K/V
// head, batch) pairs, inside a chunk the key blocks in order (the first, under a causal mask the longest
// walk, first) and the pairs fastest: a greedy list schedule of longest-first jobs. Chunks keep the
// CTAs running at once on a few heads (their Q / dO / dQ accumulator in L2). The schedule emulated
// (tests/ops/attention/test_attention_ws_bwd_cpu.py, 132 SMs, a CTA's cost its tiles + 1.5): the natural
// order's last wave ends 3.4% (b4 s4096 h32 causal) / 14% (GQA 64/8 causal: 8 heads' tiles a CTA) past
// the average SM's work; chunks of 4: 0.1% / 0.02% (2: 2.7% / 11%; non-causal 3.1% either way).
constexpr int kOrderChunk = 4;

template <int D, int STAGES, int NDQ = 1> struct Cfg {
  static constexpr int BM = D > 64 ? 64 : 128;  // query rows a stage (bwd_dkdv_wg's: 192 accumulator registers)
  static constexpr int KV_BYTES = kBN * D * 2;
  static constexpr int Q_BYTES = BM * D * 2;
  static constexpr int DS_BYTES = kBN * BM * 2;
  static constexpr int OFF_K = 0, OFF_V = KV_BYTES, OFF_Q = 2 * KV_BYTES, OFF_DO = OFF_Q + STAGES * Q_BYTES,
                       OFF_DS = OFF_DO + STAGES * Q_BYTES,
                       OFF_DQ = OFF_DS + 2 * DS_BYTES,    // kDqBulk(W): the fp32 dQ tile, D / 32 slabs of BM
                       DQ_BYTES = BM * D * 4,             //   rows of 128 bytes, 128B-swizzled (TMA's)
                       OFF_L = OFF_DQ + NDQ * DQ_BYTES,   // lse [STAGES][BM], then dsum [STAGES][BM] (after
                                                          //   the tile: 3 stages' 1536 bytes keep it aligned)
                       OFF_BAR = OFF_L + STAGES * BM * 8,
                       // kv, full, empty, dsfull [2], dsempty [2], dqfull [2], dqempty [2], then the dQ
                       // tiles' coordinates [2] (kDqBulkW / kDqBulkWPP)
                       OFF_XY = OFF_BAR + (2 * STAGES + 9) * 8;
  static constexpr int SMEM = OFF_XY + 16 + 1024;  // + slack
};

// Q, dO, K, V as 4-d (d, sequence, heads, batch) tensors, boxes of 64 columns (one 128B-swizzled slab) x
// BM rows (Q, dO) or 128 (K, V).
// dqacc (kDqBulk): the fp32 accumulator as (D, seq_q, batch x heads_q), boxes of 32 columns x BM rows.
struct Maps {
  tma::TensorMap q, dout, k, v, dqacc;
};

// The bulk tensor reduction (sm_90): the box at (c0, c1, c2) of `map` += the 128B-swizzled tile at shared
// address src (rows of the box past the tensor skipped), one thread; the bulk group's commit and waits
// (.read: the source may be overwritten; without: the additions done).
__device__ __forceinline__ void bulk_reduce_add_3d(const tma::TensorMap* map, unsigned src, int c0, int c1, int c2) {
  asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   reinterpret_cast<unsigned long long>(map)),
               "r"(src), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

constexpr int kBarDQ = 2;      // named barrier (kDqBulk): both warpgroups' dQ halves in the fp32 tile
constexpr int kBarTurn = 3;    // named barriers 3, 4 (kDqRedPP): consumer warpgroup 0's / 1's turn to issue S^T, dP^T
constexpr int kBarDQ2 = 3;     // (bwd_ws256 kDqBulkW, which has no kBarTurn) both warpgroups' dK done

// VAR (bwd_ws_var's last template argument; bwd_ws is VAR 0): tuning.attention_bwd.WS_VAR's probes, first-use
// instantiations that time a tile without one of its parts (wrong results): kVarNoExp no exponential (P = the scaled
// score), kVarNoRed the dQ tile's bulk reductions not issued, kVarNoLoad Q / dO loaded for the first STAGES tiles only
// (the ring's later phases complete on the producer's arrivals alone).
constexpr int kVarNoExp = 1, kVarNoRed = 2, kVarNoLoad = 4;
// kVarL2Pf (a variant, results kept; 1-d grid): halfway through its walk the producer asks L2 for the K / V boxes
// of the CTA %nsmid places after it in the grid's order (about the one that takes its SM next): that CTA's prologue
// then reads them from L2 instead of HBM, where a whole wave's CTAs would read 132 x 64 KiB (d 128) at once.
constexpr int kVarL2Pf = 8;

// The 1-d grid's item idx in kOrderChunk's order (bwd_ws's prologue): key block xb, K/V head hk, batch b.
__device__ __forceinline__ void order_item(const AttnParams& p, int idx, int& xb, int& hk, int& b) {
  const int nx = (p.seq_kv + kBN - 1) / kBN, c = idx / (nx * kOrderChunk);
  const int n = min(kOrderChunk, p.heads_kv * p.batch - c * kOrderChunk), r = idx - c * nx * kOrderChunk;
  const int hb = c * kOrderChunk + r % n;
  xb = r / n;
  hk = hb % p.heads_kv;
  b = hb / p.heads_kv;
}

// The bulk tensor prefetch into L2 (sm_90): the box at (c0 .. c3) of `map`, no shared memory, no barrier.
__device__ __forceinline__ void prefetch_l2_4d(const tma::TensorMap* map, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global.tile [%0, {%1, %2, %3, %4}];\n" ::"l"(
                   reinterpret_cast<unsigned long long>(map)),
               "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}

// P^T = 2^(S^T scale_log2 - lse) in place for a warpgroup's m64nNk16 accumulator (element 4 j + 2 hh + e: key
// key0 + 8 hh, query m0 + 8 j + 2 q4 + e; lt the tile's lse in log2 units). One warpgroup-uniform branch around two
// straight loops: the mask tested per element inside one loop (as before session 33) made ptxas branch around each
// element with a convergence barrier (BSSY / BRA / BSYNC: ~11 SASS instructions an element on unmasked tiles where
// FFMA + MUFU do, and no scheduling across elements); H200, session 33: the backward +10-15% at d 64, +6-8% at d 128
// (tools/PERF.md).
template <int VAR, int N>
__device__ __forceinline__ void bwd_exp(bool masked, float (&sc)[N], const float* lt, float scale_log2, int q4,
                                        int key0, int m0, const Seq& sq) {
  if (masked) {
    // key key0 + 8 hh is past the length when 8 hh > kl, past query m0 + 8 j + 2 q4 + e's diagonal when
    // 8 hh - 8 j - e > qd: one ISETP against an immediate an element (the || of the plain test made branches)
    const int kl = sq.len_kv - 1 - key0, qd = sq.causal ? m0 + 2 * q4 + sq.offset - key0 : (1 << 30);
#pragma unroll
    for (int j = 0; j < N / 4; ++j) {
      const float2 lv = *reinterpret_cast<const float2*>(lt + j * 8 + 2 * q4);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int idx = 4 * j + 2 * hh + e;
          const bool dead = (8 * hh > kl) | (8 * hh - 8 * j - e > qd);
          sc[idx] = exp2_fast(fmaf(dead ? -kInf : sc[idx], scale_log2, -(e ? lv.y : lv.x)));
        }
    }
  } else {
#pragma unroll
    for (int j = 0; j < N / 4; ++j) {
      const float2 lv = *reinterpret_cast<const float2*>(lt + j * 8 + 2 * q4);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float x = fmaf(sc[4 * j + i], scale_log2, -((i & 1) ? lv.y : lv.x));
        sc[4 * j + i] = (VAR & kVarNoExp) ? x : exp2_fast(x);
      }
    }
  }
}

// The kernel's body: bwd_ws<T, D, DQ, STAGES> (VAR 0) and bwd_ws_var<..., VAR> (a kernel of its own, so the
// default kernels keep their names) inline it; tm is the kernel's __grid_constant__ parameter (TMA reads its maps
// by address).
template <class T, int D, int DQ, int STAGES, int VAR>
__device__ __forceinline__ void bwd_ws_body(const AttnParams& p, const Maps& tm) {
  static_assert((D == 64 || D == 128) && STAGES >= 2 && ((DQ >= kDqNone && DQ <= kDqBulkWPP) || DQ == kDqBulkWPP1),
                "bwd_ws tile");
  constexpr bool PP = DQ == kDqRedPP || DQ == kDqBulkWPP || DQ == kDqBulkWPP1;
  constexpr bool WRITER = DQ == kDqBulkW || DQ == kDqBulkWPP || DQ == kDqBulkWPP1;
  constexpr int NDQ = DqBufs<DQ>::value;
  static_assert(Cfg<D, STAGES, NDQ>::OFF_DQ % 1024 == 0, "the swizzled dQ tile needs 1024-byte alignment");
  static_assert(Cfg<D, STAGES, NDQ>::SMEM <= 227 * 1024, "past sm_90's 232448 bytes of shared memory a block");
  constexpr bool ATOMIC = DQ != kDqNone;
  using C = Cfg<D, STAGES, NDQ>;
  constexpr int BM = C::BM, BN = kBN;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const unsigned raw = tma::smem_addr(smem_raw);
  unsigned char* smem = smem_raw + (((raw + 1023u) & ~1023u) - raw);
  const unsigned sb = tma::smem_addr(smem);
  const unsigned sK = sb + C::OFF_K, sV = sb + C::OFF_V, sQ = sb + C::OFF_Q, sdO = sb + C::OFF_DO;
  const unsigned sdS = sb + C::OFF_DS;
  float* sL = reinterpret_cast<float*>(smem + C::OFF_L);  // [STAGES][BM] lse in log2 units (+inf: P = 0)
  float* sDs = sL + STAGES * BM;                           // [STAGES][BM] dsum
  const unsigned kvbar = sb + C::OFF_BAR;
  auto full = [&](int s) { return kvbar + 8u * (1 + s); };
  auto empty = [&](int s) { return kvbar + 8u * (1 + STAGES + s); };
  auto dsfull = [&](int i) { return kvbar + 8u * (1 + 2 * STAGES + i); };   // (kDqRedPP)
  auto dsempty = [&](int i) { return kvbar + 8u * (3 + 2 * STAGES + i); };
  auto dqfull = [&](int i) { return kvbar + 8u * (5 + 2 * STAGES + i); };  // (kDqBulkW(PP), buffer i)
  auto dqempty = [&](int i) { return kvbar + 8u * (7 + 2 * STAGES + i); };
  // the dQ tile t: buffer t % NDQ, its use (t / NDQ); coordinates (m0, b heads_q + h) at OFF_XY + 8 buffer

  // (key block, K/V head, batch): the grid's, or (a 1-d grid) kOrderChunk's order
  int xb = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  if (gridDim.y == 1 && gridDim.z == 1) order_item(p, blockIdx.x, xb, hk, b);  // (one head and batch: the 3-d grid's)
  const Seq sq = seq_of(p, b);
  const int n0 = xb * BN;
  // query rows that can see a key of this block: i >= n0 - offset (causal); all rows otherwise
  const int i_first = (sq.causal && n0 < sq.len_kv) ? max(0, n0 - sq.offset) : 0;
  const int mt0 = i_first / BM;
  const int mtiles = (n0 < sq.len_kv && i_first < sq.len_q) ? (sq.len_q + BM - 1) / BM - mt0 : 0;
  const int iters = mtiles * p.group;

  if (threadIdx.x == 0) {
    tma::mbar_init(kvbar, 1);
    for (int s = 0; s < STAGES; ++s) {
      tma::mbar_init(full(s), 33);
      tma::mbar_init(empty(s), kConsumerWarps);
    }
    for (int i = 0; i < 2; ++i) {
      tma::mbar_init(dsfull(i), kConsumerWarps);
      tma::mbar_init(dsempty(i), kConsumerWarps);
    }
    for (int i = 0; i < 2; ++i) {
      tma::mbar_init(dqfull(i), kConsumerWarps);
      tma::mbar_init(dqempty(i), 1);
    }
    tma::fence_barrier_init();
  }
  __syncthreads();
  const int wg = threadIdx.x >> 7;

  if (wg == 0) {  // ------------------------------------------------------------------ producer
    tma::regs_dealloc<kProdRegs>();
    if constexpr (WRITER) {
      if (threadIdx.x == 32 && iters > 0) {  // the dQ writer: tile t's reductions once both halves are in
        // (the tile's coordinates come with it, from the consumers). At d 64 (bulkw) ptxas spills 28 bytes of the
        // prologue's values across the setmaxnreg (stored once, reloaded a few times an iteration from L1)
        // with this branch, in every form tried: coordinates computed here or handed over, the loop's end
        // from iters or from the consumers, a warp-uniform branch, 32 / 232 registers, the walk recomputed
        // after the split (worse: 64 bytes); accepted (tests/ops/attention/test_attention_ws_bwd_cpu.py SPILL_OK)
        for (int t = 0; t < iters; ++t) {
          const int i = t % NDQ;
          tma::mbar_wait(dqfull(i), (t / NDQ) & 1);
          const volatile int* xy = reinterpret_cast<const volatile int*>(smem + C::OFF_XY + 8 * i);
          const int m0 = xy[0], hb = xy[1];
          const unsigned src = sb + C::OFF_DQ + i * C::DQ_BYTES;
          if constexpr (!(VAR & kVarNoRed)) {
#pragma unroll
            for (int sl = 0; sl < D / 32; ++sl) bulk_reduce_add_3d(&tm.dqacc, src + sl * (BM * 128), sl * 32, m0, hb);
            bulk_commit();
          }
          bulk_wait_read();  // the tile read: the consumers may store into the buffer again
          tma::mbar_arrive(dqempty(i));
        }
        // (no wait for the additions themselves: the loop's last wait_group.read freed the tile, and the grid's end
        // orders the reductions before any later launch, as CUTLASS's TMA-store epilogues rely on)
        return;
      }
    }
    if (threadIdx.x >= 32 || iters == 0) return;
    const int lane = threadIdx.x;
    if (lane == 0) {
      tma::prefetch_map(&tm.q);
      tma::prefetch_map(&tm.dout);
      tma::mbar_arrive_expect_tx(kvbar, 2 * C::KV_BYTES);
#pragma unroll
      for (int sl = 0; sl < D / 64; ++sl) {
        tma::load_4d(sK + sl * BN * 128, &tm.k, kvbar, sl * 64, n0, hk, b);
        tma::load_4d(sV + sl * BN * 128, &tm.v, kvbar, sl * 64, n0, hk, b);
      }
    }
    const long long ls0 = p.stride[PYDNN_ATTN_T_LSE][0], ls1 = p.stride[PYDNN_ATTN_T_LSE][1],
                    ls2 = p.stride[PYDNN_ATTN_T_LSE][2];
    for (int it = 0; it < iters; ++it) {
      const int s = it % STAGES, n = it / STAGES;
      const int h = hk * p.group + it / mtiles, m0 = (mt0 + it % mtiles) * BM;
      tma::mbar_wait(empty(s), (n & 1) ^ 1);
      if ((VAR & kVarNoLoad) && it >= STAGES) {  // (probe: the stage's old Q / dO)
        if (lane == 0) tma::mbar_arrive(full(s));
      } else if (lane == 0) {
        tma::mbar_arrive_expect_tx(full(s), 2 * C::Q_BYTES);
#pragma unroll
        for (int sl = 0; sl < D / 64; ++sl) {
          tma::load_4d(sQ + s * C::Q_BYTES + sl * BM * 128, &tm.q, full(s), sl * 64, m0, h, b);
          tma::load_4d(sdO + s * C::Q_BYTES + sl * BM * 128, &tm.dout, full(s), sl * 64, m0, h, b);
        }
      }
      if constexpr ((VAR & kVarL2Pf) != 0) {
        if (lane == 0 && it == iters / 2 && gridDim.y == 1 && gridDim.z == 1) {
          unsigned nsm;
          asm("mov.u32 %0, %%nsmid;" : "=r"(nsm));
          if (blockIdx.x + nsm < gridDim.x) {
            int xb2, hk2, b2;
            order_item(p, blockIdx.x + nsm, xb2, hk2, b2);
#pragma unroll
            for (int sl = 0; sl < D / 64; ++sl) {
              prefetch_l2_4d(&tm.k, sl * 64, xb2 * BN, hk2, b2);
              prefetch_l2_4d(&tm.v, sl * 64, xb2 * BN, hk2, b2);
            }
          }
        }
      }
      const float* gl = p.lse + (long long)b * ls0 + (long long)h * ls1;
      const float* gd = p.dsum + ((long long)b * p.heads_q + h) * p.seq_q;
#pragma unroll
      for (int k = 0; k < BM / 32; ++k) {
        const int r = lane + 32 * k, row = m0 + r;
        float lv = kInf, dv = 0.f;
        if (row < sq.len_q) {
          const float x = gl[(long long)row * ls2];
          lv = x > -kInf ? x * kLog2e : kInf;  // a row that saw nothing: P = 0
          dv = gd[row];
        }
        sL[s * BM + r] = lv;
        sDs[s * BM + r] = dv;
      }
      tma::mbar_arrive(full(s));  // (release: the stores above before the phase completes)
    }
    return;
  }

  // -------------------------------------------------------------------------------------- consumers
  tma::regs_alloc<kConsRegs>();
  const int cw = wg - 1, warp = (threadIdx.x >> 5) & 3, l = threadIdx.x & 31, g = l >> 2, q4 = l & 3;
  const int wkey = n0 + cw * 64;  // this warpgroup's first key
  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
  if (iters > 0) tma::mbar_wait(kvbar, 0);
  if (PP && cw == 1) attn::bar_arrive(kBarTurn, 256);  // consumer warpgroup 0 issues first
  // dQ's way out, red.global.add.v2 from the accumulator fragment (query head hq_, tile m0_): element
  // 4 j + 2 hh + e is (row r0 + 8 hh, column c0 + 8 j + e) of the tile
  const int r0 = (D > 64 ? 0 : cw * 64) + warp * 16 + g, c0 = (D > 64 ? cw * 64 : 0) + 2 * q4;
  auto red_dq = [&](const float (&dq)[32], int hq_, int m0_) {
    float* base = p.dq_acc + ((long long)b * p.heads_q + hq_) * p.seq_q * D;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int row = m0_ + r0 + 8 * hh;
      if (row < sq.len_q) {
        float* r = base + (long long)row * D + c0;
#pragma unroll
        for (int j = 0; j < 8; ++j) red_add2(r + 8 * j, dq[4 * j + 2 * hh], dq[4 * j + 2 * hh + 1]);
      }
    }
  };

  // kDqBulkW(PP): this warpgroup's half of dQ tile t (query head hq_, rows from m0_) into its buffer of the
  // swizzled fp32 tile (slab c / 32, row r at 128 r, 16-byte chunk (c % 32) / 4 at chunk ^ (r & 7): a warp's
  // float2 stores cover all 32 banks), once the writer has read the buffer's previous tile; then the
  // coordinates (thread 128) and one arrival a warp on the buffer's dqfull
  auto put_dq = [&](const float (&dq)[32], int t, int hq_, int m0_) {
    const int i = t % NDQ;
    tma::mbar_wait(dqempty(i), ((t / NDQ) & 1) ^ 1);
    unsigned char* sdq = smem + C::OFF_DQ + i * C::DQ_BYTES;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int rr = r0 + 8 * hh, cc = c0 + 8 * j, w = cc & 31;
        *reinterpret_cast<float2*>(sdq + (cc >> 5) * (BM * 128) + rr * 128 + ((((w >> 2) ^ (rr & 7))) << 4) + (w & 3) * 4) =
            make_float2(dq[4 * j + 2 * hh], dq[4 * j + 2 * hh + 1]);
      }
    wgmma::fence_proxy_async();
    if (threadIdx.x == 128) {
      volatile int* xy = reinterpret_cast<volatile int*>(smem + C::OFF_XY + 8 * i);
      xy[0] = m0_;
      xy[1] = b * p.heads_q + hq_;
    }
    __syncwarp();
    if (l == 0) tma::mbar_arrive(dqfull(i));
  };

  for (int it = 0; it < iters; ++it) {
    const int s = it % STAGES, n = it / STAGES;
    const int h = hk * p.group + it / mtiles, m0 = (mt0 + it % mtiles) * BM;
    tma::mbar_wait(full(s), n & 1);
    const unsigned q_s = sQ + s * C::Q_BYTES, do_s = sdO + s * C::Q_BYTES;

    // S^T = K Q^T and dP^T = V dO^T (64 keys x BM queries each; k16 steps along d: slab kk / 4 of the
    // tiles, 32 bytes per step within the swizzled rows)
    float sc[BM / 2], dp[BM / 2];
    if (PP) tma::named_sync(kBarTurn + cw, 256);
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const unsigned ko = (kk >> 2) * (BN * 128) + cw * (64 * 128) + (kk & 3) * 32, qo = (kk >> 2) * (BM * 128) + (kk & 3) * 32;
      wgmma::Mma<T, BM, 0, 0>::run(sc, wgmma::desc_sw128(sK + ko, 16, 1024), wgmma::desc_sw128(q_s + qo, 16, 1024), kk > 0);
    }
    wgmma::commit();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const unsigned ko = (kk >> 2) * (BN * 128) + cw * (64 * 128) + (kk & 3) * 32, qo = (kk >> 2) * (BM * 128) + (kk & 3) * 32;
      wgmma::Mma<T, BM, 0, 0>::run(dp, wgmma::desc_sw128(sV + ko, 16, 1024), wgmma::desc_sw128(do_s + qo, 16, 1024), kk > 0);
    }
    wgmma::commit();
    if (PP) attn::bar_arrive(kBarTurn + (cw ^ 1), 256);
    wgmma::wait<1>();
    wgmma::fence_operands(sc);

    // P^T, dS^T. Accumulator element 4 j + 2 hh + e: key wkey + 16 warp + g + 8 hh, query m0 + 8 j + 2 q4 + e.
    const int key0 = wkey + warp * 16 + g;
    const bool need_mask = (sq.causal && wkey + 63 > m0 + sq.offset) || wkey + 63 >= sq.len_kv;
    const float* lt = sL + s * BM;
    const float* dt = sDs + s * BM;
    bwd_exp<VAR>(need_mask, sc, lt, p.scale_log2, q4, key0, m0, sq);
    wgmma::wait<0>();
    wgmma::fence_operands(dp);
    unsigned pa[BM / 16][4], da[BM / 16][4];
    attn::bwd_ds_pack<T, BM>(sc, dp, dt, q4, pa, da);  // dS^T, P^T and dS^T packed (common/attn_bwd_tile.cuh)

    // dV += P^T dO, dK += dS^T Q (B MN-major: k16 step = 16 query rows = 2048 bytes; LBO the slab stride).
    // ATOMIC: three groups, dV, dQ, dK: dV runs while dS^T is stored and the warpgroups meet, dK while dQ
    // goes out (wgmma groups retire in order: wait<1> after dK's commit means dV and dQ done).
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < BM / 16; ++ks)
      wgmma::MmaRS<T, D, 1>::run(dv, pa[ks], wgmma::desc_sw128(do_s + ks * 2048, BM * 128, 1024), 1);
    if constexpr (!ATOMIC) {
#pragma unroll
      for (int ks = 0; ks < BM / 16; ++ks)
        wgmma::MmaRS<T, D, 1>::run(dk, da[ks], wgmma::desc_sw128(q_s + ks * 2048, BM * 128, 1024), 1);
    }
    wgmma::commit();

    if constexpr (ATOMIC) {
      // dS^T into shared memory as [key][query] (while the dV wgmmas run)
      const int dbuf = it & 1;
      if (PP) tma::mbar_wait(dsempty(dbuf), ((it >> 1) & 1) ^ 1);  // both warpgroups' dQ of it - 2 done
      unsigned short* ds = reinterpret_cast<unsigned short*>(smem + C::OFF_DS + dbuf * C::DS_BYTES);
      const int kr = cw * 64 + warp * 16 + g;
#pragma unroll
      for (int ks = 0; ks < BM / 16; ++ks)
#pragma unroll
        for (int c = 0; c < 4; ++c)
          *reinterpret_cast<unsigned*>(ds + wgmma::sw128<BN>(kr + 8 * (c & 1), 2 * ks + (c >> 1)) + 2 * q4) = da[ks][c];
      wgmma::fence_proxy_async();
      // kDqRedPP: this dS^T published (dsfull), and the dQ taken is the previous iteration's (its dS^T
      // complete: the other warpgroup may run up to an iteration behind; at it = 0 a wgmma on a buffer no
      // one wrote, its result dropped: no wgmma under a branch); else both warpgroups meet here
      const int pit = PP ? it - 1 : it;
      if constexpr (PP) {
        __syncwarp();
        if (l == 0) tma::mbar_arrive(dsfull(dbuf));
        if (it > 0) tma::mbar_wait(dsfull(pit & 1), (pit >> 1) & 1);
      } else {
        if (DQ == kDqBulk && threadIdx.x == 128) bulk_wait_read();  // the last tile's reductions have read sDQ
        // (kDqBulkW: the writer's dqempty says so, waited for below)
        tma::named_sync(kBarDS, 256);  // both warpgroups' dS^T (kDqBulk: and sDQ free)
      }
      // dQ = dS K: A = dS (queries x keys, stored key-major: MN-major), B = K ([key][d]: MN-major);
      // k16 step = 16 keys = 2048 bytes. D = 128: warpgroup w takes d columns 64 w.. (slab w of K);
      // D = 64: query rows 64 w.. (slab w of dS^T).
      float dq[32];
      const unsigned ao = D > 64 ? 0u : cw * (BN * 128), bo = D > 64 ? cw * (BN * 128) : 0u;
      const unsigned dsb = sdS + (pit & 1) * C::DS_BYTES;
      wgmma::fence();
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk)
        wgmma::Mma<T, 64, 1, 1>::run(dq, wgmma::desc_sw128(dsb + ao + kk * 2048, BN * 128, 1024),
                                     wgmma::desc_sw128(sK + bo + kk * 2048, BN * 128, 1024), kk > 0);
      wgmma::commit();
#pragma unroll
      for (int ks = 0; ks < BM / 16; ++ks)
        wgmma::MmaRS<T, D, 1>::run(dk, da[ks], wgmma::desc_sw128(q_s + ks * 2048, BM * 128, 1024), 1);
      wgmma::commit();
      wgmma::wait<1>();  // dV and dQ done; dK may run on
      wgmma::fence_operands(dq);
      if constexpr (DQ == kDqRed) {
        red_dq(dq, h, m0);
      } else if constexpr (PP) {
        if (it > 0) {
          if constexpr (WRITER)
            put_dq(dq, pit, hk * p.group + pit / mtiles, (mt0 + pit % mtiles) * BM);
          else
            red_dq(dq, hk * p.group + pit / mtiles, (mt0 + pit % mtiles) * BM);
          __syncwarp();
          if (l == 0) tma::mbar_arrive(dsempty(pit & 1));
        }
      } else if constexpr (DQ == kDqBulkW) {
        put_dq(dq, it, h, m0);
      } else {
        // this warpgroup's half into the swizzled tile (slab c / 32, row r at 128 r, 16-byte chunk
        // (c % 32) / 4 at chunk ^ (r & 7): a warp's float2 stores cover all 32 banks, 2 wavefronts), then
        // thread 128 adds it to the accumulator with D / 32 bulk tensor reductions (TMA skips the rows past
        // seq_q; rows past len_q inside it hold zeros: P = 0 there)
        unsigned char* sdq = smem + C::OFF_DQ;
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const int rr = r0 + 8 * hh, cc = c0 + 8 * j, w = cc & 31;
            *reinterpret_cast<float2*>(sdq + (cc >> 5) * (BM * 128) + rr * 128 + ((((w >> 2) ^ (rr & 7))) << 4) + (w & 3) * 4) =
                make_float2(dq[4 * j + 2 * hh], dq[4 * j + 2 * hh + 1]);
          }
        wgmma::fence_proxy_async();
        tma::named_sync(kBarDQ, 256);
        if (threadIdx.x == 128 && !(VAR & kVarNoRed)) {
          const unsigned src = tma::smem_addr(sdq);
#pragma unroll
          for (int sl = 0; sl < D / 32; ++sl) bulk_reduce_add_3d(&tm.dqacc, src + sl * (BM * 128), sl * 32, m0, b * p.heads_q + h);
          bulk_commit();
        }
      }
      wgmma::wait<0>();  // dK done: Q and dO of this stage are free
      __syncwarp();
      if (l == 0) tma::mbar_arrive(empty(s));
    } else {
      wgmma::wait<0>();  // Q / dO of this stage are read until here
      __syncwarp();
      if (l == 0) tma::mbar_arrive(empty(s));
    }
  }
  if constexpr (PP) {  // the last iteration's dQ (iters = 0: a wgmma on a buffer no one wrote, dropped)
    const int pit = iters - 1;
    if (iters > 0) tma::mbar_wait(dsfull(pit & 1), (pit >> 1) & 1);
    float dq[32];
    const unsigned ao = D > 64 ? 0u : cw * (BN * 128), bo = D > 64 ? cw * (BN * 128) : 0u;
    const unsigned dsb = sdS + (pit & 1) * C::DS_BYTES;
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
      wgmma::Mma<T, 64, 1, 1>::run(dq, wgmma::desc_sw128(dsb + ao + kk * 2048, BN * 128, 1024),
                                   wgmma::desc_sw128(sK + bo + kk * 2048, BN * 128, 1024), kk > 0);
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operands(dq);
    if (iters > 0) {
      if constexpr (WRITER)
        put_dq(dq, pit, hk * p.group + pit / mtiles, (mt0 + pit % mtiles) * BM);
      else
        red_dq(dq, hk * p.group + pit / mtiles, (mt0 + pit % mtiles) * BM);
    }
  }
  wgmma::fence_operands(dk);
  wgmma::fence_operands(dv);

  // dK = scale * dK, dV: row key0 + 8 hh, columns 8 j + 2 q4; keys past the length written as zeros
  attn::bwd_store_dkdv<T, D>(p, sq, b, hk, wkey, warp, g, q4, dk, dv);
  // kDqBulk: the last tile read before the CTA's shared memory goes (after the stores above, not before them:
  // the additions' completion is not waited for, see the writer)
  if (DQ == kDqBulk && threadIdx.x == 128) bulk_wait_read();
}

template <class T, int D, int DQ, int STAGES>
__global__ void __launch_bounds__(kThreads, 1) bwd_ws(const AttnParams p, const __grid_constant__ Maps tm) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(sizeof(T) == 0, "bwd_ws needs the sm_90a target (KernelUnit archs)");
#endif
  bwd_ws_body<T, D, DQ, STAGES, 0>(p, tm);
}

template <class T, int D, int DQ, int STAGES, int VAR>
__global__ void __launch_bounds__(kThreads, 1) bwd_ws_var(const AttnParams p, const __grid_constant__ Maps tm) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(sizeof(T) == 0, "bwd_ws_var needs the sm_90a target (KernelUnit archs)");
#endif
  bwd_ws_body<T, D, DQ, STAGES, VAR>(p, tm);
}

// ---------------------------------------------------------------------------------------------- d 256
// bwd_ws256<T, DQ>: the head dim 256 backward (DQ kDqNone, kDqRed, kDqBulkW (the default: tuning.attention_bwd.
// WS_DQ_D256) or kDqBulkW2), 384 threads, one CTA per (64 keys, K/V head, batch), the producer warp as bwd_ws's
// (K / V once, then Q / dO by TMA with lse / dsum into a 2-stage ring; the same barrier protocol: kv, full[s]
// count 33, empty[s] count 8, or 1 (the writer) in the bulk modes, below).
// Why another tiling (registers a consumer thread, FA3's hdim-256 split): dK and dV of 128 keys x 256 are
// 65536 fp32, 256 a thread over two warpgroups (bwd_ws's split by keys cannot hold them); of 64 keys 128 a
// thread. So the CTA takes 64 keys and consumer warpgroup w keeps dK / dV's head-dim columns 128 w ..
// 128 w + 127 (64 + 64 registers) across the walk; the query tile (BM = 64 rows) is split the other way:
// warpgroup w computes S^T / dP^T for queries 32 w .. 32 w + 31 (m64n32k16, 16 + 16 registers), writes its
// half of P^T and dS^T (16-bit, [key][query], 128B-swizzled) to shared memory (double buffered), the two
// meet on kBarDS, then each runs dQ = dS K for its 128 head-dim columns (ATOMIC: 64 registers) and dV += P^T dO,
// dK += dS^T Q (both operands from shared memory); kDqRed: dQ issued first, red.global.add.v2 while dV / dK run;
// the bulk modes below.
// Peak live: dK 64 + dV 64 + dQ 64 = 192 of kConsRegs' 240.
// Shared memory (bytes): K, V 32768 each; Q, dO 2 stages x 32768 each; P^T, dS^T 2 buffers x 2 x 8192;
// lse / dsum [2][64] 1024; barriers (kv, full, empty, dqfull) 56; + 1024 alignment slack = 231480 of 232448.
// The dS^T buffers: iteration it writes buffer it & 1 after kBarDS of it - 1, which the other warpgroup
// reached after its wgmma reads of buffer it & 1 (iteration it - 2) were waited for.
// DQ = kDqBulkW (FA3's bulk reduction with the dedicated writer, no shared memory of its own): the fp32 dQ tile
// (64 x 256 = 64 KiB) is staged in the stage's own Q and dO buffers (32 KiB each), dead once both warpgroups'
// wgmmas of the iteration have read them (groups dV, dQ, dK in that order): warpgroup 0 stores its dQ columns
// 0..127 into the dO buffer after both dVs (kBarDQ: 0 waits, 1 arrives after its wait<1>), while dK runs;
// warpgroup 1 its 128..255 into the Q buffer after both dKs (kBarDQ2: 1 waits, 0 arrives after its wait<0>)
// (4 slabs of 32 fp32 columns x 64 rows, TMA's 128B swizzle); each fences, one arrival a warp on dqfull[s]
// (count 8); the writer (thread 32) waits dqfull[s] parity (it / 2) & 1, issues the 8 bulk tensor
// reductions, waits for their reads and only then arrives on empty[s] (count 1 in this mode): the producer
// refills the stage after the dQ tile has left it. The dQ atomics of "red" cost 8.6 of 17.3 ms at b4 s4096 h32
// (mid-session run 1: the kernel without dQ, deterministic, 8.76 ms).
struct Cfg256 {
  static constexpr int D = 256, BN = 64, BM = 64, STAGES = 2;
  static constexpr int KV_BYTES = BN * D * 2, Q_BYTES = BM * D * 2, T_BYTES = BN * BM * 2;  // T: P^T or dS^T
  static constexpr int OFF_K = 0, OFF_V = KV_BYTES, OFF_Q = 2 * KV_BYTES, OFF_DO = OFF_Q + STAGES * Q_BYTES,
                       OFF_PS = OFF_DO + STAGES * Q_BYTES,  // buffer i: P^T at OFF_PS + 2 i T_BYTES, dS^T after it
                       OFF_L = OFF_PS + 4 * T_BYTES,        // lse [STAGES][BM], then dsum [STAGES][BM]
                       OFF_BAR = OFF_L + STAGES * BM * 8,   // kv, full [STAGES], empty [STAGES], dqfull [STAGES]
                       SMEM = OFF_BAR + (1 + 3 * STAGES) * 8 + 1024;
};

// m64n32k16, both operands K-major from shared memory (the S^T / dP^T halves; wgmma.cuh has N >= 64)
template <class T> struct Mma32;
#define PYDNN_WSB_MMA32(CT, PT)                                                                                  \
  template <> struct Mma32<CT> {                                                                                 \
    static __device__ __forceinline__ void run(float (&d)[16], unsigned long long da, unsigned long long db,     \
                                               int scale_d) {                                                    \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                                  \
                   "wgmma.mma_async.sync.aligned.m64n32k16.f32." PT "." PT " "                                   \
                   "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, " \
                   "0, 0;\n}\n"                                                                                  \
                   : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),         \
                     "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),     \
                     "+f"(d[14]), "+f"(d[15])                                                                    \
                   : "l"(da), "l"(db), "r"(scale_d));                                                            \
    }                                                                                                            \
  };
PYDNN_WSB_MMA32(half_t, "f16")
PYDNN_WSB_MMA32(bf16_t, "bf16")
#undef PYDNN_WSB_MMA32

template <class T, int DQ>
__global__ void __launch_bounds__(kThreads, 1) bwd_ws256(const AttnParams p, const __grid_constant__ Maps tm) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(sizeof(T) == 0, "bwd_ws256 needs the sm_90a target (KernelUnit archs)");
#endif
  static_assert(DQ == kDqNone || DQ == kDqRed || DQ == kDqBulkW || DQ == kDqBulkW2, "bwd_ws256: dQ mode");
  static_assert(Cfg256::SMEM <= 227 * 1024, "past sm_90's 232448 bytes of shared memory a block");
  static_assert(Cfg256::OFF_PS % 1024 == 0 && Cfg256::T_BYTES % 1024 == 0, "swizzled tiles: 1024-byte atoms");
  using C = Cfg256;
  constexpr int D = C::D, BN = C::BN, BM = C::BM, STAGES = C::STAGES;
  constexpr bool ATOMIC = DQ != kDqNone, BULK = DQ == kDqBulkW || DQ == kDqBulkW2, SYM = DQ == kDqBulkW2;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const unsigned raw = tma::smem_addr(smem_raw);
  unsigned char* smem = smem_raw + (((raw + 1023u) & ~1023u) - raw);
  const unsigned sb = tma::smem_addr(smem);
  const unsigned sK = sb + C::OFF_K, sV = sb + C::OFF_V, sQ = sb + C::OFF_Q, sdO = sb + C::OFF_DO;
  float* sL = reinterpret_cast<float*>(smem + C::OFF_L);  // [STAGES][BM] lse in log2 units (+inf: P = 0)
  float* sDs = sL + STAGES * BM;                           // [STAGES][BM] dsum
  const unsigned kvbar = sb + C::OFF_BAR;
  auto full = [&](int s) { return kvbar + 8u * (1 + s); };
  auto empty = [&](int s) { return kvbar + 8u * (1 + STAGES + s); };
  auto dqfull = [&](int s) { return kvbar + 8u * (1 + 2 * STAGES + s); };  // (kDqBulkW)

  // (key block, K/V head, batch): the grid's, or (a 1-d grid) kOrderChunk's order (bwd_ws's, blocks of 64 keys)
  int xb = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  if (gridDim.y == 1 && gridDim.z == 1) {
    const int nx = (p.seq_kv + BN - 1) / BN, c = blockIdx.x / (nx * kOrderChunk);
    const int n = min(kOrderChunk, p.heads_kv * p.batch - c * kOrderChunk), r = blockIdx.x - c * nx * kOrderChunk;
    const int hb = c * kOrderChunk + r % n;
    xb = r / n;
    hk = hb % p.heads_kv;
    b = hb / p.heads_kv;
  }
  const Seq sq = seq_of(p, b);
  const int n0 = xb * BN;
  const int i_first = (sq.causal && n0 < sq.len_kv) ? max(0, n0 - sq.offset) : 0;
  const int mt0 = i_first / BM;
  const int mtiles = (n0 < sq.len_kv && i_first < sq.len_q) ? (sq.len_q + BM - 1) / BM - mt0 : 0;
  const int iters = mtiles * p.group;

  if (threadIdx.x == 0) {
    tma::mbar_init(kvbar, 1);
    for (int s = 0; s < STAGES; ++s) {
      tma::mbar_init(full(s), 33);
      tma::mbar_init(empty(s), BULK ? 1 : kConsumerWarps);  // (kDqBulkW: the writer, after the dQ tile's reads)
      tma::mbar_init(dqfull(s), kConsumerWarps);
    }
    tma::fence_barrier_init();
  }
  __syncthreads();
  const int wg = threadIdx.x >> 7;

  if (wg == 0) {  // ------------------------------------------------------------------ producer
    tma::regs_dealloc<kProdRegs>();
    if constexpr (BULK) {
      if (threadIdx.x == 32 && iters > 0) {  // the dQ writer: tile it from the dO (columns 0..127) and Q (128..)
        for (int it = 0; it < iters; ++it) {  // buffers of stage it % STAGES
          const int s = it % STAGES;
          const int h = hk * p.group + it / mtiles, m0 = (mt0 + it % mtiles) * BM, hb = b * p.heads_q + h;
          tma::mbar_wait(dqfull(s), (it / STAGES) & 1);
          const unsigned lo = sdO + s * C::Q_BYTES, hi = sQ + s * C::Q_BYTES;
#pragma unroll
          for (int sl = 0; sl < 4; ++sl) {  // (kDqBulkW2: fp32 slab sl of the dO buffer is columns 128 (sl / 2)
            // + 32 (sl % 2), of the Q buffer 64 more)
            const int c_lo = SYM ? 128 * (sl >> 1) + 32 * (sl & 1) : sl * 32, c_hi = SYM ? c_lo + 64 : 128 + sl * 32;
            bulk_reduce_add_3d(&tm.dqacc, lo + sl * (BM * 128), c_lo, m0, hb);
            bulk_reduce_add_3d(&tm.dqacc, hi + sl * (BM * 128), c_hi, m0, hb);
          }
          bulk_commit();
          bulk_wait_read();  // the tile read: the stage may be refilled
          tma::mbar_arrive(empty(s));
        }
        return;  // (the additions' completion not waited for: bwd_ws's writer says why)
      }
    }
    if (threadIdx.x >= 32 || iters == 0) return;
    const int lane = threadIdx.x;
    if (lane == 0) {
      tma::prefetch_map(&tm.q);
      tma::prefetch_map(&tm.dout);
      tma::mbar_arrive_expect_tx(kvbar, 2 * C::KV_BYTES);
#pragma unroll
      for (int sl = 0; sl < D / 64; ++sl) {
        tma::load_4d(sK + sl * BN * 128, &tm.k, kvbar, sl * 64, n0, hk, b);
        tma::load_4d(sV + sl * BN * 128, &tm.v, kvbar, sl * 64, n0, hk, b);
      }
    }
    const long long ls0 = p.stride[PYDNN_ATTN_T_LSE][0], ls1 = p.stride[PYDNN_ATTN_T_LSE][1],
                    ls2 = p.stride[PYDNN_ATTN_T_LSE][2];
    for (int it = 0; it < iters; ++it) {
      const int s = it % STAGES, n = it / STAGES;
      const int h = hk * p.group + it / mtiles, m0 = (mt0 + it % mtiles) * BM;
      tma::mbar_wait(empty(s), (n & 1) ^ 1);
      if (lane == 0) {
        tma::mbar_arrive_expect_tx(full(s), 2 * C::Q_BYTES);
#pragma unroll
        for (int sl = 0; sl < D / 64; ++sl) {
          tma::load_4d(sQ + s * C::Q_BYTES + sl * BM * 128, &tm.q, full(s), sl * 64, m0, h, b);
          tma::load_4d(sdO + s * C::Q_BYTES + sl * BM * 128, &tm.dout, full(s), sl * 64, m0, h, b);
        }
      }
      const float* gl = p.lse + (long long)b * ls0 + (long long)h * ls1;
      const float* gd = p.dsum + ((long long)b * p.heads_q + h) * p.seq_q;
#pragma unroll
      for (int k = 0; k < BM / 32; ++k) {
        const int r = lane + 32 * k, row = m0 + r;
        float lv = kInf, dv = 0.f;
        if (row < sq.len_q) {
          const float x = gl[(long long)row * ls2];
          lv = x > -kInf ? x * kLog2e : kInf;  // a row that saw nothing: P = 0
          dv = gd[row];
        }
        sL[s * BM + r] = lv;
        sDs[s * BM + r] = dv;
      }
      tma::mbar_arrive(full(s));
    }
    return;
  }

  // -------------------------------------------------------------------------------------- consumers
  tma::regs_alloc<kConsRegs>();
  const int cw = wg - 1, warp = (threadIdx.x >> 5) & 3, l = threadIdx.x & 31, g = l >> 2, q4 = l & 3;
  float dk[64], dv[64];  // keys n0 + 16 warp + g + 8 hh, head-dim columns 128 cw + 8 j + 2 q4 + e
#pragma unroll
  for (int i = 0; i < 64; ++i) dk[i] = dv[i] = 0.f;
  if (iters > 0) tma::mbar_wait(kvbar, 0);
  const int kr = warp * 16 + g;  // this thread's first key row of the tile

  for (int it = 0; it < iters; ++it) {
    const int s = it % STAGES, n = it / STAGES;
    const int h = hk * p.group + it / mtiles, m0 = (mt0 + it % mtiles) * BM;
    tma::mbar_wait(full(s), n & 1);
    const unsigned q_s = sQ + s * C::Q_BYTES, do_s = sdO + s * C::Q_BYTES;

    // S^T = K Q^T and dP^T = V dO^T for queries 32 cw .. (64 keys x 32 queries; k16 step kk: slab kk / 4,
    // 32 bytes within the rows; the query half starts 32 rows = 4096 bytes into each slab)
    float sc[16], dp[16];
    wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const unsigned ko = (kk >> 2) * (BN * 128) + (kk & 3) * 32, qo = (kk >> 2) * (BM * 128) + cw * 4096 + (kk & 3) * 32;
      Mma32<T>::run(sc, wgmma::desc_sw128(sK + ko, 16, 1024), wgmma::desc_sw128(q_s + qo, 16, 1024), kk > 0);
    }
    wgmma::commit();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const unsigned ko = (kk >> 2) * (BN * 128) + (kk & 3) * 32, qo = (kk >> 2) * (BM * 128) + cw * 4096 + (kk & 3) * 32;
      Mma32<T>::run(dp, wgmma::desc_sw128(sV + ko, 16, 1024), wgmma::desc_sw128(do_s + qo, 16, 1024), kk > 0);
    }
    wgmma::commit();
    wgmma::wait<1>();
    wgmma::fence_operands(sc);

    // P^T: element 4 j + 2 hh + e is key n0 + kr + 8 hh, query m0 + 32 cw + 8 j + 2 q4 + e
    const bool need_mask = (sq.causal && n0 + BN - 1 > m0 + 32 * cw + sq.offset) || n0 + BN - 1 >= sq.len_kv;
    const float* lt = sL + s * BM + 32 * cw;
    const float* dt = sDs + s * BM + 32 * cw;
    bwd_exp<0>(need_mask, sc, lt, p.scale_log2, q4, n0 + kr, m0 + 32 * cw, sq);  // (bwd_ws's, session 33)
    wgmma::wait<0>();
    wgmma::fence_operands(dp);
    // dS^T = P^T (dP^T - dsum); both halves to buffer it & 1 as [key][query] (chunk 4 cw + j of row kr + 8 hh)
    unsigned short* tp = reinterpret_cast<unsigned short*>(smem + C::OFF_PS + (it & 1) * 2 * C::T_BYTES);
    unsigned short* tds = tp + C::T_BYTES / 2;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 dd = *reinterpret_cast<const float2*>(dt + j * 8 + 2 * q4);
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int i0 = 4 * j + 2 * hh, o = wgmma::sw128<BN>(kr + 8 * hh, 4 * cw + j) + 2 * q4;
        *reinterpret_cast<unsigned*>(tp + o) = pack16x2<T>(sc[i0], sc[i0 + 1]);
        *reinterpret_cast<unsigned*>(tds + o) =
            pack16x2<T>(sc[i0] * (dp[i0] - dd.x), sc[i0 + 1] * (dp[i0 + 1] - dd.y));
      }
    }
    wgmma::fence_proxy_async();
    tma::named_sync(kBarDS, 256);  // both halves of P^T and dS^T written

    const unsigned sp = sb + C::OFF_PS + (it & 1) * 2 * C::T_BYTES, sds = sp + C::T_BYTES;
    float dq[64];
    // dQ = dS K, head-dim columns 128 cw ..: A = dS (queries x keys) stored key-major (MN-major), B = K
    // ([key][d]: MN-major, slabs 2 cw, 2 cw + 1); k16 step = 16 keys = 2048 bytes
    auto mma_dq = [&] {
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk)
        wgmma::Mma<T, 128, 1, 1>::run(dq, wgmma::desc_sw128(sds + kk * 2048, BN * 128, 1024),
                                      wgmma::desc_sw128(sK + 2 * cw * (BN * 128) + kk * 2048, BN * 128, 1024), kk > 0);
    };
    // dV += P^T dO, dK += dS^T Q (A K-major from the [key][query] tiles: k16 step = 32 bytes; B MN-major:
    // 16 query rows = 2048 bytes, head-dim slabs 2 cw, 2 cw + 1)
    auto mma_dv = [&] {
#pragma unroll
      for (int ks = 0; ks < BM / 16; ++ks)
        wgmma::Mma<T, 128, 0, 1>::run(dv, wgmma::desc_sw128(sp + ks * 32, 16, 1024),
                                      wgmma::desc_sw128(do_s + 2 * cw * (BM * 128) + ks * 2048, BM * 128, 1024), 1);
    };
    auto mma_dk = [&] {
#pragma unroll
      for (int ks = 0; ks < BM / 16; ++ks)
        wgmma::Mma<T, 128, 0, 1>::run(dk, wgmma::desc_sw128(sds + ks * 32, 16, 1024),
                                      wgmma::desc_sw128(q_s + 2 * cw * (BM * 128) + ks * 2048, BM * 128, 1024), 1);
    };
    // kDqBulkW: this warpgroup's dQ columns into a stage buffer (dq element 4 j + 2 hh + e: row kr + 8 hh,
    // column cc = 8 j + 2 q4 + e of its 128: slab cc / 32, row r at 128 r, 16-byte chunk (cc % 32) / 4 at
    // chunk ^ (r & 7), bwd_ws's put_dq layout), made visible to the writer's bulk reductions
    auto put_dq = [&](unsigned char* sdq) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const int rr = kr + 8 * hh, cc = 8 * j + 2 * q4, w = cc & 31;
          *reinterpret_cast<float2*>(sdq + (cc >> 5) * (BM * 128) + rr * 128 + (((w >> 2) ^ (rr & 7)) << 4) + (w & 3) * 4) =
              make_float2(dq[4 * j + 2 * hh], dq[4 * j + 2 * hh + 1]);
        }
      wgmma::fence_proxy_async();
    };
    // kDqBulkW2: columns 64 part .. 64 part + 63 of this warpgroup's 128 into slabs 2 cw, 2 cw + 1 of sdq
    auto put_dq_part = [&](unsigned char* sdq, int part) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int rr = kr + 8 * hh, cc = 8 * j + 2 * q4, w = cc & 31, jj = 8 * part + j;
          *reinterpret_cast<float2*>(sdq + (2 * cw + (cc >> 5)) * (BM * 128) + rr * 128 + (((w >> 2) ^ (rr & 7)) << 4) + (w & 3) * 4) =
              make_float2(dq[4 * jj + 2 * hh], dq[4 * jj + 2 * hh + 1]);
        }
      wgmma::fence_proxy_async();
    };
    wgmma::fence();
    if constexpr (BULK) {
      // three groups, dV, dQ, dK: warpgroup 0's dQ half goes into the dO buffer once both warpgroups' dV (the
      // last reads of dO) are done (kBarDQ: warpgroup 0 waits, 1 arrives), under dK's MMAs; warpgroup 1's into
      // the Q buffer once both dKs are done (kBarDQ2: 1 waits, 0 arrives after its wait<0>)
      mma_dv();
      wgmma::commit();
      mma_dq();
      wgmma::commit();
      mma_dk();
      wgmma::commit();
      wgmma::wait<1>();  // dV, dQ done
      wgmma::fence_operands(dq);
      wgmma::fence_operands(dv);
      if constexpr (SYM) {  // its own dV done: its dO bytes are free; then its own dK: its Q bytes
        put_dq_part(smem + C::OFF_DO + s * C::Q_BYTES, 0);
        wgmma::wait<0>();
        wgmma::fence_operands(dk);
        put_dq_part(smem + C::OFF_Q + s * C::Q_BYTES, 1);
      } else if (cw == 0) {
        tma::named_sync(kBarDQ, 256);
        put_dq(smem + C::OFF_DO + s * C::Q_BYTES);
        wgmma::wait<0>();
        wgmma::fence_operands(dk);
        attn::bar_arrive(kBarDQ2, 256);
      } else {
        attn::bar_arrive(kBarDQ, 256);
        wgmma::wait<0>();
        wgmma::fence_operands(dk);
        tma::named_sync(kBarDQ2, 256);
        put_dq(smem + C::OFF_Q + s * C::Q_BYTES);
      }
      __syncwarp();
      if (l == 0) tma::mbar_arrive(dqfull(s));  // (the writer releases the stage)
      continue;
    }
    if constexpr (ATOMIC) {
      mma_dq();
      wgmma::commit();
    }
    mma_dv();
    mma_dk();
    wgmma::commit();
    if constexpr (DQ == kDqRed) {
      wgmma::wait<1>();  // dQ done (groups retire in order); dV / dK run on
      wgmma::fence_operands(dq);
      // dq element 4 j + 2 hh + e: query row m0 + kr + 8 hh, column 128 cw + 8 j + 2 q4 + e
      float* base = p.dq_acc + ((long long)b * p.heads_q + h) * p.seq_q * D + 128 * cw + 2 * q4;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int row = m0 + kr + 8 * hh;
        if (row < sq.len_q) {
          float* r = base + (long long)row * D;
#pragma unroll
          for (int j = 0; j < 16; ++j) red_add2(r + 8 * j, dq[4 * j + 2 * hh], dq[4 * j + 2 * hh + 1]);
        }
      }
    }
    wgmma::wait<0>();  // Q / dO of this stage and the P^T / dS^T buffer read
    wgmma::fence_operands(dk);
    wgmma::fence_operands(dv);
    __syncwarp();
    if (l == 0) tma::mbar_arrive(empty(s));
  }

  // dK = scale * dK, dV: key n0 + kr + 8 hh, columns 128 cw + 8 j + 2 q4; keys past the length as zeros
  T* gdk = const_cast<T*>(at<T>(p.dk, p, PYDNN_ATTN_T_DK, b, hk)) + 128 * cw + 2 * q4;
  T* gdv = const_cast<T*>(at<T>(p.dv, p, PYDNN_ATTN_T_DV, b, hk)) + 128 * cw + 2 * q4;
  const long long ldk = p.stride[PYDNN_ATTN_T_DK][2], ldv = p.stride[PYDNN_ATTN_T_DV][2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int key = n0 + kr + 8 * hh;
    if (key >= p.seq_kv) continue;
    const bool live = key < sq.len_kv;
    T* rk = gdk + (long long)key * ldk;
    T* rv = gdv + (long long)key * ldv;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      *reinterpret_cast<unsigned*>(rk + 8 * j) = live ? pack16x2<T>(dk[4 * j + 2 * hh] * p.scale, dk[4 * j + 2 * hh + 1] * p.scale) : 0u;
      *reinterpret_cast<unsigned*>(rv + 8 * j) = live ? pack16x2<T>(dv[4 * j + 2 * hh], dv[4 * j + 2 * hh + 1]) : 0u;
    }
  }
}

}  // namespace attn_wsb
}  // namespace pydnn
