// Fused scaled dot-product attention, FlashAttention-2 style on mma.sync (sm_80+; runs on sm_90 too).
// See attention_params.h for the problem description and pydnn/ops/attention.py for the host side.
//
//   fwd<T, D, BN, BNL, DROP>
//                   one CTA per (128 query rows, query head, batch); 4 warps, each owns 32 rows (two
//                   m16 tiles). Q stays in shared memory (D = 64: in registers), K/V tiles of BNL keys
//                   (computed BN keys at a time: S of BN keys in registers) are
//                   double-buffered in shared memory with cp.async. Per key tile: S = Q K^T (tile_qk),
//                   masking (mask_tile), the online softmax in registers (softmax_update: exp2 with the
//                   scale pre-multiplied by log2 e), P packed to 16 bits in registers and used as the
//                   A operand of O += P V (tile_pv). The epilogue normalises O by the row sums, writes
//                   lse and stores O (store_rows: staged through shared memory for 16-byte stores).
//                   (tile_qk / tile_pv / load_tile, softmax_update and store_rows are the pieces a
//                   wgmma / TMA port replaces or keeps.)
//   bwd_pre<T, D>   dsum = rowsum(dO * O) per query row (fp32 workspace).
//   bwd_dkdv<T, D, ATOMIC, DROP>
//                   one CTA per (64 keys, K/V head, batch); 4 warps, each owns 16 keys. Loops over the Q
//                   heads of the K/V head's group and their query tiles (64 rows; D = 128: 32; Q, dO,
//                   lse, dsum double-buffered with cp.async):
//                   S^T = K Q^T, P^T = exp2(S^T * scale log2 e - lse log2 e), dV += P^T dO,
//                   dP^T = V dO^T, dS^T = P^T (dP^T - dsum), dK += dS^T Q. dK and dV stay in registers,
//                   so the sum over the group needs no atomics.
//   bwd_dq<T, D, DROP>
//                   one CTA per (64 query rows, query head, batch); 4 warps x 16 rows, K/V tiles
//                   double-buffered: recomputes P and dP and accumulates dQ = dS K in registers.
//   bwd_dq_convert<T, D>  ATOMIC mode: dQ = scale * the fp32 accumulator, in dQ's type and strides.
//   dec<T, D>, dec_combine<T, D>
//                   decode-shaped forward (a few query rows, long K/V): split-KV (FlashDecoding), the
//                   rows of a K/V head's query-head group in one CTA; see the section at the end.
// Head dims 64, 96, 128, 256 (Tiles<D>, Pitch<D> below).
// DROP (fwd, bwd_dkdv, bwd_dq): dropout on the probabilities, see keep_tile. The deterministic
// backward (dK/dV kernel without ATOMIC, then bwd_dq) sums each output element in one thread in a fixed
// order; ATOMIC adds dQ with fp32 atomics instead of the bwd_dq pass.
//
// Shared-memory tiles are rows of D 16-bit elements, 16-byte chunks XOR-swizzled by (row & 7), so the
// eight rows an ldmatrix reads, and the chunks a warp's cp.async writes, fall in distinct banks.
#include "common/types.cuh"
#include "common/attn_mma.cuh"
#include "common/attn_problem.cuh"
#include "common/philox.cuh"
#include "attention_params.h"

namespace pydnn {
namespace attn {

constexpr int kThreads = 128;   // 4 warps in every kernel
// (forward query rows per CTA, Tiles<D>::kFwdM: 128, 32 per warp; 64 at D = 256; the dQ pass's keys
// per tile, Tiles<D>::kDqN: 64; 16 at D = 256)
constexpr int kBwdM = 64;       // dQ: query rows per CTA
constexpr int kBwdN = 64;       // dK/dV: keys per CTA (16 per warp)
// Head-dim dependent tiles, chosen so that nothing spills (255 registers): dK/dV query rows per tile
// (at D = 128 the dK + dV accumulators take 128 registers). The forward's keys per compute step (BN)
// and per shared-memory tile (BNL) are template arguments (the host's FWD_TILES instantiates): 64 / 64
// at D = 64, 32 / 32 at D = 128 (a 64-key step spills there; 32 / 64 and 64 / 64 measured no faster).
//
// Head dims 96 and 256. D = 96 rows are 12 chunks of 16 bytes, which the XOR swizzle (c ^ (r & 7)) would
// send past the row: its tiles use a row pitch of 128 elements (Pitch<D>), the D = 128 layout with a
// quarter of each row unused. D = 256 (counted in 32-bit registers per thread, the budget being 255;
// ptxas -v, sm_80):
//   forward   O of 32 rows x 256 per warp is 256 registers: 16 rows per warp (MT = 1, kFwdM 64 rows a
//             CTA), O 128 + S 16 (32-key steps) + Q from shared memory: 251 registers, no spill; smem
//             (64 + 4 x 32) x 256 x 2 = 96 KiB, two CTAs per SM (64-key tiles: 160 KiB, one CTA).
//   dK / dV   dK + dV of 16 keys x 256 per warp are 256 registers: each CTA owns half the head dim of its
//             keys' dK / dV (kDSplit = 2: 128 registers), S^T and dP^T recomputed by both halves (full
//             D); query tiles of 16 rows (32 spilled 16-52 bytes): 250-255 registers, no spill; smem
//             (2 x 64 + 4 x 16) x 256 x 2 + lse / dsum + dS^T = 104 KiB.
//   dQ        dQ 16 rows x 256 = 128 registers: K / V tiles of 16 keys (32 spilled 28-96 bytes): 248-253
//             registers; smem (2 x 64 + 4 x 16) x 256 x 2 = 96 KiB.
// D = 96: forward 32-key steps in 64-key tiles (a 64-key step spilled 40 bytes; 32 / 64: 229 registers),
// the rest as D = 128.
template <int D> struct Tiles {
  static constexpr int kKvM = D > 128 ? 16 : D > 64 ? 32 : 64;  // dK/dV: query rows per tile
  static constexpr int kFwdM = D > 128 ? 64 : 128;   // forward query rows per CTA (MT = kFwdM / 64)
  static constexpr int kDqN = D > 128 ? 16 : 64;     // dQ pass: keys per K/V tile
  static constexpr int kDSplit = D > 128 ? 2 : 1;    // dK/dV: CTAs sharing one key block's head dim
};
template <int D> struct Pitch {
  static constexpr int v = D == 96 ? 128 : D;  // elements per shared-memory row
};
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kInf = 1.0f / 0.0f;  // +inf (a constant expression)

// ------------------------------------------------------------------ shared-memory tiles

// element offset of (row, 16-byte chunk) in a swizzled tile of rows of D elements
template <int D> __device__ __forceinline__ int swz(int r, int c) { return r * Pitch<D>::v + ((c ^ (r & 7)) << 3); }

// Copy `rows` rows of D elements (global row stride `ld`) into a swizzled tile; rows >= `valid` are
// zero-filled. All 128 threads take part; the caller commits the group.
template <class T, int D, int ROWS>
__device__ __forceinline__ void load_tile(T* s, const T* g, long long ld, int valid) {
  constexpr int CH = D / 8;
  static_assert(ROWS * CH % kThreads == 0, "load_tile: whole passes");
  const int tid = threadIdx.x;
#pragma unroll
  for (int i = 0; i < ROWS * CH / kThreads; ++i) {
    const int idx = tid + i * kThreads;
    const int r = idx / CH, c = idx % CH;
    const bool ok = r < valid;
    const T* src = ok ? g + (long long)r * ld + c * 8 : g;
    cp_async16(smem_addr(s + swz<D>(r, c)), src, ok);
  }
}

// load_tile from a page pool (paged K / V, attention_params.h): row r of the tile starts at pool +
// off[r] (elements; the row offsets staged in shared memory a tile ahead, dec_row_offsets); rows >= valid
// are zero-filled.
template <class T, int D, int ROWS>
__device__ __forceinline__ void load_tile_paged(T* s, const T* pool, const long long* off, int valid) {
  constexpr int CH = D / 8;
  static_assert(ROWS * CH % kThreads == 0, "load_tile_paged: whole passes");
  const int tid = threadIdx.x;
#pragma unroll
  for (int i = 0; i < ROWS * CH / kThreads; ++i) {
    const int idx = tid + i * kThreads;
    const int r = idx / CH, c = idx % CH;
    const bool ok = r < valid;
    cp_async16(smem_addr(s + swz<D>(r, c)), ok ? pool + off[r] + c * 8 : pool, ok);
  }
}

// The paged decode kernel's row offsets of tile rows [n0, n0 + 64) of K (threads 0-63) and V (64-127):
// thread t writes off[t] = page(key) * page stride + (key % page size) * row stride for key n0 + (t & 63)
// below k_end (0 past it): one page id (an independent load) and a division a thread a tile, a tile
// ahead of its copy, so no copy waits on a page-id load (one dependent table load a row before the copy
// measured 0.25x the contiguous decode: 0.98 ms against 0.246, b8 h32/8 kv32768 ps16, H200).
__device__ __forceinline__ void dec_row_offsets(long long* off, const AttnParams& p, int b, int n0, int k_end) {
  static_assert(kThreads == 2 * 64, "dec_row_offsets: a thread a row of K or V (kDecN = 64)");
  const int t = threadIdx.x, kv = t >> 6, key = n0 + (t & 63);
  long long o = 0;
  if (key < k_end) {
    const int tt = kv ? PYDNN_ATTN_T_V : PYDNN_ATTN_T_K;
    const int* tab = (kv ? p.ptab_v : p.ptab_k) + (long long)b * p.ptab_stride[kv][0];
    const int pg = __ldg(tab + (long long)(key / p.page_size) * p.ptab_stride[kv][1]);
    o = (long long)pg * p.stride[tt][0] + (long long)(key % p.page_size) * p.stride[tt][2];
  }
  off[t] = o;
}

// dec_row_offsets in two halves (dec's PIPE variant): the page id load of this thread's row of tile n0,
// issued an iteration before dec_row_store writes the row's offset from it.
__device__ __forceinline__ int dec_page_load(const AttnParams& p, int b, int n0, int k_end) {
  const int t = threadIdx.x, kv = t >> 6, key = n0 + (t & 63);
  if (key >= k_end) return 0;
  const int* tab = (kv ? p.ptab_v : p.ptab_k) + (long long)b * p.ptab_stride[kv][0];
  return __ldg(tab + (long long)(key / p.page_size) * p.ptab_stride[kv][1]);
}
__device__ __forceinline__ void dec_row_store(long long* off, const AttnParams& p, int pg, int n0, int k_end) {
  const int t = threadIdx.x, kv = t >> 6, key = n0 + (t & 63);
  const int tt = kv ? PYDNN_ATTN_T_V : PYDNN_ATTN_T_K;
  off[t] = key < k_end ? (long long)pg * p.stride[tt][0] + (long long)(key % p.page_size) * p.stride[tt][2] : 0;
}

// A fragments (16 rows x 16 cols at (r0, k-chunk pair kk)) of a swizzled tile
template <int D> __device__ __forceinline__ void ld_a(unsigned (&a)[4], const void* s, int r0, int kk) {
  const int l = threadIdx.x & 31;
  const int r = r0 + (l & 7) + ((l >> 3) & 1) * 8, c = kk * 2 + (l >> 4);
  ldsm_x4(a, smem_addr((const unsigned short*)s + swz<D>(r, c)));
}
// B fragments of two n8 tiles from a tile stored [n][k] (K for Q K^T): b[0..1] n-tile 0, b[2..3] n-tile 1
template <int D> __device__ __forceinline__ void ld_b_nk(unsigned (&b)[4], const void* s, int n0, int kk) {
  const int l = threadIdx.x & 31;
  const int r = n0 + (l & 7) + (l >> 4) * 8, c = kk * 2 + ((l >> 3) & 1);
  ldsm_x4(b, smem_addr((const unsigned short*)s + swz<D>(r, c)));
}
// B fragments of two n8 tiles from a tile stored [k][n] (V for P V): rows k0..k0+15, n-chunks 2nn, 2nn+1
template <int D> __device__ __forceinline__ void ld_b_kn(unsigned (&b)[4], const void* s, int k0, int nn) {
  const int l = threadIdx.x & 31;
  const int r = k0 + (l & 7) + ((l >> 3) & 1) * 8, c = nn * 2 + (l >> 4);
  ldsm_x4_t(b, smem_addr((const unsigned short*)s + swz<D>(r, c)));
}

// ------------------------------------------------------------------ tile loop pieces

// acc[mi][nt] (MT m16 tiles at rows a_row0 + 16 mi, N/8 n8 tiles) = A (smem, rows x D) * B^T where B is
// stored [n][k] (N rows of D). A comes from shared memory, or from registers when qreg != nullptr.
template <class T, int D, int MT, int N>
__device__ __forceinline__ void tile_qk(float (&acc)[MT][N / 8][4], const T* sa, int a_row0, const T* sb,
                                        const unsigned (*qreg)[D / 16][4]) {
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int nt = 0; nt < N / 8; ++nt) acc[mi][nt][0] = acc[mi][nt][1] = acc[mi][nt][2] = acc[mi][nt][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    unsigned a[MT][4];
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) {
      if (qreg) {
#pragma unroll
        for (int i = 0; i < 4; ++i) a[mi][i] = qreg[mi][kk][i];
      } else {
        ld_a<D>(a[mi], sa, a_row0 + mi * 16, kk);
      }
    }
#pragma unroll
    for (int nn = 0; nn < N / 16; ++nn) {
      unsigned b[4];
      ld_b_nk<D>(b, sb, nn * 16, kk);
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) {
        mma16816<T>(acc[mi][2 * nn], a[mi], b[0], b[1]);
        mma16816<T>(acc[mi][2 * nn + 1], a[mi], b[2], b[3]);
      }
    }
  }
}

// The A fragment (k16 step kt) made of two neighbouring n8 C tiles, packed to 16 bits.
template <class T> __device__ __forceinline__ void c_to_a(unsigned (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack16x2<T>(c0[0], c0[1]);
  a[1] = pack16x2<T>(c0[2], c0[3]);
  a[2] = pack16x2<T>(c1[0], c1[1]);
  a[3] = pack16x2<T>(c1[2], c1[3]);
}

// c_to_a of the tiles with dropout applied: element e of c0 (c1) kept iff bit e of k0 (k1), then scaled.
template <class T>
__device__ __forceinline__ void c_to_a_keep(unsigned (&a)[4], const float (&c0)[4], const float (&c1)[4], unsigned k0,
                                            unsigned k1, float sc) {
  float v0[4], v1[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    v0[e] = ((k0 >> e) & 1u) ? c0[e] * sc : 0.f;
    v1[e] = ((k1 >> e) & 1u) ? c1[e] * sc : 0.f;
  }
  c_to_a<T>(a, v0, v1);
}

// acc[mi][dt] (MT m16 tiles, DC/8 n8 tiles) += P[mi] (16 x N, C layout in registers) * B where B is
// stored [k][n] (N rows of D elements: V, or K for dQ = dS K); DC columns from column 16 * c16 (the whole
// head dim by default). KEEP: P with dropout applied on the way (keep: the tile's keep bits, see
// keep_tile; kscale: 1 / (1 - p)), P itself left as it is.
template <class T, int D, int MT, int N, bool KEEP = false, int DC = D>
__device__ __forceinline__ void tile_pv(float (&acc)[MT][DC / 8][4], const float (&p)[MT][N / 8][4], const T* sb,
                                        const unsigned* keep = nullptr, float kscale = 1.f, int c16 = 0) {
#pragma unroll
  for (int kt = 0; kt < N / 16; ++kt) {
    unsigned a[MT][4];
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) {
      if constexpr (KEEP)
        c_to_a_keep<T>(a[mi], p[mi][2 * kt], p[mi][2 * kt + 1], keep[mi] >> (8 * kt), keep[mi] >> (8 * kt + 4), kscale);
      else
        c_to_a<T>(a[mi], p[mi][2 * kt], p[mi][2 * kt + 1]);
    }
#pragma unroll
    for (int dd = 0; dd < DC / 16; ++dd) {
      unsigned b[4];
      ld_b_kn<D>(b, sb, kt * 16, c16 + dd);
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) {
        mma16816<T>(acc[mi][2 * dd], a[mi], b[0], b[1]);
        mma16816<T>(acc[mi][2 * dd + 1], a[mi], b[2], b[3]);
      }
    }
  }
}

// Score masking for one tile: element (row, col) of acc becomes -inf where the key is not visible, or
// the row is at or past len_rows. row0: the first row of this warp's first m16 tile (in sequence
// coordinates), col0 the tile's first key; rows_are_keys swaps the roles (the dK/dV kernel computes S^T).
template <int MT, int N>
__device__ __forceinline__ void mask_tile(float (&acc)[MT][N / 8][4], int row0, int col0, int len_cols,
                                          bool causal, int offset, bool rows_are_keys, int len_rows = 1 << 30) {
  const int l = threadIdx.x & 31, g = l >> 2, q = l & 3;
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int nt = 0; nt < N / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = row0 + mi * 16 + g + (e >> 1) * 8, col = col0 + nt * 8 + q * 2 + (e & 1);
        const int qi = rows_are_keys ? col : row, kj = rows_are_keys ? row : col;
        const bool hide = col >= len_cols || row >= len_rows || (causal && kj > qi + offset);
        if (hide) acc[mi][nt][e] = -kInf;
      }
}

// Dropout on the probabilities (counter-based: ptx/common/philox.cuh). Element (query i, key j) of
// (batch b, query head h) is number ((b * heads_q + h) * seq_q + i) * seq_kv + j of the stream
// (seed, offset 0) and is kept iff its 16-bit slice >= drop_threshold; kept probabilities are scaled by
// drop_scale = 1 / (1 - p). A pure function of the element's coordinates: the forward and both
// backward kernels see the same mask whatever their tiles (pydnn/reference/attention.py replays it).
// keep_tile: the keep bits of a C-layout tile, bit nt * 4 + e of word mi (N <= 64); rows_are_keys as in
// mask_tile. One Philox block per element (no sharing across the quad): simple, not fast.
template <int MT, int N>
__device__ __forceinline__ void keep_tile(unsigned (&bits)[MT], const AttnParams& p, int b, int h, int row0, int col0,
                                          bool rows_are_keys) {
  static_assert(N <= 64, "keep bits: one 32-bit word per m16 tile");
  const int l = threadIdx.x & 31, g = l >> 2, q = l & 3;
  const unsigned long long base = ((unsigned long long)b * p.heads_q + h) * (unsigned long long)p.seq_q;
#pragma unroll
  for (int mi = 0; mi < MT; ++mi) {
    bits[mi] = 0u;
#pragma unroll
    for (int nt = 0; nt < N / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = row0 + mi * 16 + g + (e >> 1) * 8, col = col0 + nt * 8 + q * 2 + (e & 1);
        const int qi = rows_are_keys ? col : row, kj = rows_are_keys ? row : col;
        if (qi < p.seq_q && kj < p.seq_kv) {
          const unsigned long long idx = (base + (unsigned long long)qi) * (unsigned long long)p.seq_kv + kj;
          const unsigned kb = philox::dropout_keep_bits8(p.seed, 0ull, idx >> 3, p.drop_threshold);
          bits[mi] |= ((kb >> (unsigned)(idx & 7)) & 1u) << (nt * 4 + e);
        }
      }
  }
}
template <int MT, int N>
__device__ __forceinline__ void apply_keep(float (&s)[MT][N / 8][4], const unsigned (&bits)[MT], float sc) {
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int nt = 0; nt < N / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mi][nt][e] = ((bits[mi] >> (nt * 4 + e)) & 1u) ? s[mi][nt][e] * sc : 0.f;
}

// Online softmax over one tile of scores (FlashAttention-2): new row maxima m (log2 units, scale applied),
// s <- exp2(s * scale_log2 - m), the running partial sums l (per thread; summed over the quad at the
// end) and the output accumulators rescaled by exp2(m_old - m_new). (Skipping the rescale when no row
// of the warp moved its maximum, behind a warp vote, measured 1-5% slower on the H200: not kept.)
template <int MT, int N, int D>
__device__ __forceinline__ void softmax_update(float (&s)[MT][N / 8][4], float (&m)[MT][2], float (&lsum)[MT][2],
                                               float (&o)[MT][D / 8][4], float scale_log2) {
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -kInf;
#pragma unroll
      for (int nt = 0; nt < N / 8; ++nt) mx = fmaxf(mx, fmaxf(s[mi][nt][2 * h], s[mi][nt][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[mi][h], mx * scale_log2);
      const float m_use = m_new == -kInf ? 0.f : m_new;  // a row with nothing visible yet: exp2(-inf) = 0
      const float corr = exp2_fast(m[mi][h] - m_use);
      m[mi][h] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < N / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pv = exp2_fast(fmaf(s[mi][nt][2 * h + e], scale_log2, -m_use));
          s[mi][nt][2 * h + e] = pv;
          sum += pv;
        }
      lsum[mi][h] = lsum[mi][h] * corr + sum;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        o[mi][dt][2 * h] *= corr;
        o[mi][dt][2 * h + 1] *= corr;
      }
    }
}

// Write `rows` x DC accumulator rows (this warp's, C layout, already scaled; columns from 8 * c8) as T
// through a staging tile in shared memory (this warp's rows only) with 16-byte stores; rows at or past
// `valid` are written as 0.
template <class T, int D, int MT, int DC = D>
__device__ __forceinline__ void store_rows(T* stage, int srow0, const float (&acc)[MT][DC / 8][4], const float (&mul)[MT][2],
                                           T* g, long long ld, int grow0, int valid, int limit, int c8 = 0) {
  const int l = threadIdx.x & 31, gq = l >> 2, q = l & 3;
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int dt = 0; dt < DC / 8; ++dt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = srow0 + mi * 16 + gq + h * 8;
        const unsigned w = pack16x2<T>(acc[mi][dt][2 * h] * mul[mi][h], acc[mi][dt][2 * h + 1] * mul[mi][h]);
        *reinterpret_cast<unsigned*>(stage + swz<D>(r, c8 + dt) + q * 2) = w;
      }
  __syncwarp();
  constexpr int CH = DC / 8, ROWS = MT * 16;
  static_assert(ROWS * CH % 32 == 0, "store_rows: whole warp passes");
#pragma unroll
  for (int i = 0; i < ROWS * CH / 32; ++i) {
    const int idx = l + i * 32, r = idx / CH, c = c8 + idx % CH;
    const int grow = grow0 + r;
    if (grow < limit) {
      uint4 v = *reinterpret_cast<const uint4*>(stage + swz<D>(srow0 + r, c));
      if (grow >= valid) v = make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(g + (long long)grow * ld + c * 8) = v;
    }
  }
}

// ------------------------------------------------------------------ forward

// BN: keys per compute step (S tile in registers); the K/V tiles in shared memory hold BNL keys
// (BNL / BN steps per barrier pair).
template <class T, int D, int BN, int BNL, bool DROP>
__global__ void __launch_bounds__(kThreads) fwd(const AttnParams p) {
  constexpr int BM = Tiles<D>::kFwdM, MT = BM / 64, SUB = BNL / BN, P = Pitch<D>::v;
  constexpr bool QREG = D <= 64;  // D = 128 would need 64 more registers per thread: Q stays in smem
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + BM * P;  // [2][BNL * P]
  T* sV = sK + 2 * BNL * P;

  const int mb = gridDim.x - 1 - blockIdx.x;  // longest (causal) blocks first
  const int h = blockIdx.y, b = blockIdx.z, hk = h / p.group;
  const int warp = threadIdx.x >> 5, l = threadIdx.x & 31;
  const Seq sq = seq_of(p, b);
  const int m0 = mb * BM;
  const int n_end = m0 < sq.len_q ? key_end(sq, m0, BM) : 0;
  const int ntiles = (n_end + BNL - 1) / BNL;

  const T* gq = at<T>(p.q, p, PYDNN_ATTN_T_Q, b, h) + (long long)m0 * p.stride[PYDNN_ATTN_T_Q][2];
  const T* gk = at<T>(p.k, p, PYDNN_ATTN_T_K, b, hk);
  const T* gv = at<T>(p.v, p, PYDNN_ATTN_T_V, b, hk);
  const int ldk = (int)p.stride[PYDNN_ATTN_T_K][2], ldv = (int)p.stride[PYDNN_ATTN_T_V][2];  // < 2^31 (host)

  load_tile<T, D, BM>(sQ, gq, p.stride[PYDNN_ATTN_T_Q][2], sq.len_q - m0);
  if (ntiles > 0) {
    load_tile<T, D, BNL>(sK, gk, ldk, sq.len_kv);
    load_tile<T, D, BNL>(sV, gv, ldv, sq.len_kv);
  }
  cp_async_commit();

  float o[MT][D / 8][4];
  float m[MT][2], lsum[MT][2];
#pragma unroll
  for (int mi = 0; mi < MT; ++mi) {
    m[mi][0] = m[mi][1] = -kInf;
    lsum[mi][0] = lsum[mi][1] = 0.f;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) o[mi][dt][0] = o[mi][dt][1] = o[mi][dt][2] = o[mi][dt][3] = 0.f;
  }
  unsigned qf[MT][D / 16][4];
  const int wrow = warp * MT * 16;  // this warp's first row in the tile

  for (int j = 0; j < ntiles; ++j) {
    const int nl0 = j * BNL;
    if (j + 1 < ntiles) {  // prefetch the next K/V tile into the other buffer
      const int nb = (j + 1) & 1;
      load_tile<T, D, BNL>(sK + nb * BNL * P, gk + (long long)(nl0 + BNL) * ldk, ldk, sq.len_kv - nl0 - BNL);
      load_tile<T, D, BNL>(sV + nb * BNL * P, gv + (long long)(nl0 + BNL) * ldv, ldv, sq.len_kv - nl0 - BNL);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (QREG && j == 0) {
#pragma unroll
      for (int mi = 0; mi < MT; ++mi)
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) ld_a<D>(qf[mi][kk], sQ, wrow + mi * 16, kk);
    }
#pragma unroll 1  // unrolled, the steps' registers overlap and spill
    for (int sub = 0; sub < SUB; ++sub) {
      const int n0 = nl0 + sub * BN;
      if (sub > 0 && n0 >= n_end) break;  // (CTA-uniform) keys no row of this CTA sees
      const T* k_t = sK + (j & 1) * BNL * P + sub * BN * P;  // sub * BN rows: a multiple of 8, same swizzle
      const T* v_t = sV + (j & 1) * BNL * P + sub * BN * P;
      float s[MT][BN / 8][4];
      tile_qk<T, D, MT, BN>(s, sQ, wrow, k_t, QREG ? qf : nullptr);
      if (n0 + BN > sq.len_kv || (sq.causal && n0 + BN - 1 > m0 + wrow + sq.offset))
        mask_tile<MT, BN>(s, m0 + wrow, n0, sq.len_kv, sq.causal, sq.offset, false);
      softmax_update<MT, BN, D>(s, m, lsum, o, p.scale_log2);  // (the sums l are over undropped P)
      if constexpr (DROP) {
        unsigned kb[MT];
        keep_tile<MT, BN>(kb, p, b, h, m0 + wrow, n0, false);
        apply_keep<MT, BN>(s, kb, p.drop_scale);
      }
      tile_pv<T, D, MT, BN>(o, s, v_t);
    }
    __syncthreads();  // the buffer read here is the next iteration's prefetch target
  }
  if (ntiles == 0) {  // Q's copies were issued by every thread: wait for all before staging in sQ
    cp_async_wait<0>();
    __syncthreads();
  }

  // epilogue: full row sums, 1 / l, lse; rows past the length or with nothing visible -> O = 0, lse = -inf
  float inv[MT][2];
  const int g = l >> 2;
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float t = lsum[mi][hh];
      t += __shfl_xor_sync(0xffffffffu, t, 1);
      t += __shfl_xor_sync(0xffffffffu, t, 2);
      const int row = m0 + wrow + mi * 16 + g + hh * 8;
      const bool live = row < sq.len_q && t > 0.f;
      inv[mi][hh] = live ? 1.f / t : 0.f;
      if (p.lse && (l & 3) == 0 && row < p.seq_q) {
        const float lse = live ? m[mi][hh] * kLn2 + __logf(t) : -kInf;
        p.lse[(long long)b * p.stride[PYDNN_ATTN_T_LSE][0] + (long long)h * p.stride[PYDNN_ATTN_T_LSE][1] +
              (long long)row * p.stride[PYDNN_ATTN_T_LSE][2]] = lse;
      }
    }
  T* go = (T*)at<T>(p.o, p, PYDNN_ATTN_T_O, b, h);
  // each warp stages only its own rows of sQ, which only it has read
  store_rows<T, D, MT>(sQ, wrow, o, inv, go, p.stride[PYDNN_ATTN_T_O][2], m0 + wrow, sq.len_q, p.seq_q);
}

// ------------------------------------------------------------------ backward: dsum = rowsum(dO * O)

template <class T, int D>
__global__ void __launch_bounds__(kThreads) bwd_pre(const AttnParams p) {
  // one warp per row; rows are (b, h, i) in dsum's dense order
  const long long row = (long long)blockIdx.x * 4 + (threadIdx.x >> 5);
  const long long rows = (long long)p.batch * p.heads_q * p.seq_q;
  if (row >= rows) return;
  const int i = (int)(row % p.seq_q), h = (int)((row / p.seq_q) % p.heads_q), b = (int)(row / ((long long)p.seq_q * p.heads_q));
  const int l = threadIdx.x & 31;
  const T* go = at<T>(p.o, p, PYDNN_ATTN_T_O, b, h) + (long long)i * p.stride[PYDNN_ATTN_T_O][2];
  const T* gd = at<T>(p.dout, p, PYDNN_ATTN_T_DO, b, h) + (long long)i * p.stride[PYDNN_ATTN_T_DO][2];
  float acc = 0.f;
#pragma unroll
  for (int d = l * 2; d < D; d += 64) {
    const unsigned wo = *reinterpret_cast<const unsigned*>(go + d), wd = *reinterpret_cast<const unsigned*>(gd + d);
    T o0, o1, d0, d1;
    o0.bits = (unsigned short)(wo & 0xffff); o1.bits = (unsigned short)(wo >> 16);
    d0.bits = (unsigned short)(wd & 0xffff); d1.bits = (unsigned short)(wd >> 16);
    acc += to_float(o0) * to_float(d0) + to_float(o1) * to_float(d1);
  }
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s);
  const Seq sq = seq_of(p, b);
  if (l == 0) p.dsum[row] = i < sq.len_q ? acc : 0.f;
  if (p.dq_acc) {  // atomic dQ: the fp32 accumulator starts at zero
#pragma unroll
    for (int d = l * 4; d < D; d += 128) *reinterpret_cast<float4*>(p.dq_acc + row * D + d) = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// dQ = scale * dq_acc (fp32, dense [b][h][i][D]) -> T with dQ's strides; rows past the length -> 0.
template <class T, int D>
__global__ void __launch_bounds__(kThreads) bwd_dq_convert(const AttnParams p) {
  const long long row = (long long)blockIdx.x * 4 + (threadIdx.x >> 5);
  const long long rows = (long long)p.batch * p.heads_q * p.seq_q;
  if (row >= rows) return;
  const int i = (int)(row % p.seq_q), h = (int)((row / p.seq_q) % p.heads_q), b = (int)(row / ((long long)p.seq_q * p.heads_q));
  const int l = threadIdx.x & 31;
  const Seq sq = seq_of(p, b);
  T* g = (T*)at<T>(p.dq, p, PYDNN_ATTN_T_DQ, b, h) + (long long)i * p.stride[PYDNN_ATTN_T_DQ][2];
  const float mul = i < sq.len_q ? p.scale : 0.f;
#pragma unroll
  for (int d = l * 2; d < D; d += 64) {
    const float2 v = *reinterpret_cast<const float2*>(p.dq_acc + row * D + d);
    *reinterpret_cast<unsigned*>(g + d) = pack16x2<T>(v.x * mul, v.y * mul);
  }
}

// A stored lse (natural log) in log2 units for exp2(s * scale log2 e - lse2); rows past their length
// (valid false) or that see nothing (-inf) get +inf, so that P = 0 whatever s is.
__device__ __forceinline__ float lse2_of(float v, bool valid) { return (valid && v > -kInf) ? v * kLog2e : kInf; }

// lse (log2 units) and dsum of one query row for the backward; rows that see nothing get +inf, so that
// exp2(s - lse) = 0 whatever s is.
__device__ __forceinline__ void row_stats(const AttnParams& p, const Seq& sq, int b, int h, int row, float& lse2,
                                          float& ds) {
  lse2 = kInf;
  ds = 0.f;
  if (row < sq.len_q) {
    const float v = p.lse[(long long)b * p.stride[PYDNN_ATTN_T_LSE][0] + (long long)h * p.stride[PYDNN_ATTN_T_LSE][1] +
                          (long long)row * p.stride[PYDNN_ATTN_T_LSE][2]];
    if (v > -kInf) lse2 = v * kLog2e;
    ds = p.dsum[((long long)b * p.heads_q + h) * p.seq_q + row];
  }
}

// ------------------------------------------------------------------ backward: dQ

template <class T, int D, bool DROP>
__global__ void __launch_bounds__(kThreads) bwd_dq(const AttnParams p) {
  constexpr int BM = kBwdM, BN = Tiles<D>::kDqN, MT = 1, P = Pitch<D>::v;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sdO = sQ + BM * P;
  T* sK = sdO + BM * P;  // [2][BN * P]
  T* sV = sK + 2 * BN * P;

  const int mb = gridDim.x - 1 - blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z, hk = h / p.group;
  const int warp = threadIdx.x >> 5, l = threadIdx.x & 31, g = l >> 2;
  const Seq sq = seq_of(p, b);
  const int m0 = mb * BM;
  const int n_end = m0 < sq.len_q ? key_end(sq, m0, BM) : 0;
  const int ntiles = (n_end + BN - 1) / BN;
  const int wrow = warp * 16;

  const T* gk = at<T>(p.k, p, PYDNN_ATTN_T_K, b, hk);
  const T* gv = at<T>(p.v, p, PYDNN_ATTN_T_V, b, hk);
  const long long ldk = p.stride[PYDNN_ATTN_T_K][2], ldv = p.stride[PYDNN_ATTN_T_V][2];
  load_tile<T, D, BM>(sQ, at<T>(p.q, p, PYDNN_ATTN_T_Q, b, h) + (long long)m0 * p.stride[PYDNN_ATTN_T_Q][2],
                      p.stride[PYDNN_ATTN_T_Q][2], sq.len_q - m0);
  load_tile<T, D, BM>(sdO, at<T>(p.dout, p, PYDNN_ATTN_T_DO, b, h) + (long long)m0 * p.stride[PYDNN_ATTN_T_DO][2],
                      p.stride[PYDNN_ATTN_T_DO][2], sq.len_q - m0);
  if (ntiles > 0) {
    load_tile<T, D, BN>(sK, gk, ldk, sq.len_kv);
    load_tile<T, D, BN>(sV, gv, ldv, sq.len_kv);
  }
  cp_async_commit();

  float lse2[MT][2], dsr[MT][2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) row_stats(p, sq, b, h, m0 + wrow + g + hh * 8, lse2[0][hh], dsr[0][hh]);
  float dq[MT][D / 8][4];
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) dq[0][dt][0] = dq[0][dt][1] = dq[0][dt][2] = dq[0][dt][3] = 0.f;

  for (int j = 0; j < ntiles; ++j) {
    const int n0 = j * BN;
    if (j + 1 < ntiles) {
      const int nb = (j + 1) & 1;
      load_tile<T, D, BN>(sK + nb * BN * P, gk + (long long)(n0 + BN) * ldk, ldk, sq.len_kv - n0 - BN);
      load_tile<T, D, BN>(sV + nb * BN * P, gv + (long long)(n0 + BN) * ldv, ldv, sq.len_kv - n0 - BN);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* k_t = sK + (j & 1) * BN * P;
    const T* v_t = sV + (j & 1) * BN * P;
    float s[MT][BN / 8][4], dp[MT][BN / 8][4];
    tile_qk<T, D, MT, BN>(s, sQ, wrow, k_t, nullptr);
    if (n0 + BN > sq.len_kv || (sq.causal && n0 + BN - 1 > m0 + wrow + sq.offset))
      mask_tile<MT, BN>(s, m0 + wrow, n0, sq.len_kv, sq.causal, sq.offset, false);
    tile_qk<T, D, MT, BN>(dp, sdO, wrow, v_t, nullptr);
    if constexpr (DROP) {  // the gradient reaching P passes the same mask: dP = Z * scale * (dO V^T)
      unsigned kb[MT];
      keep_tile<MT, BN>(kb, p, b, h, m0 + wrow, n0, false);
      apply_keep<MT, BN>(dp, kb, p.drop_scale);
    }
    // dS = P (dP - dsum), in place in s
#pragma unroll
    for (int nt = 0; nt < BN / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pv = exp2_fast(fmaf(s[0][nt][e], p.scale_log2, -lse2[0][e >> 1]));
        s[0][nt][e] = pv * (dp[0][nt][e] - dsr[0][e >> 1]);
      }
    tile_pv<T, D, MT, BN>(dq, s, k_t);
    __syncthreads();
  }
  if (ntiles == 0) cp_async_wait<0>();
  __syncthreads();  // sQ is reused as the staging tile (this warp's rows only, but be safe after cp.async)
  float mul[MT][2] = {{p.scale, p.scale}};
  store_rows<T, D, MT>(sQ, wrow, dq, mul, (T*)at<T>(p.dq, p, PYDNN_ATTN_T_DQ, b, h), p.stride[PYDNN_ATTN_T_DQ][2],
                       m0 + wrow, sq.len_q, p.seq_q);
}

// ------------------------------------------------------------------ backward: dK, dV

// dQ contribution of one (query tile, key block) in the atomic mode: dS (in sdS as [key][query], 64 keys)
// times K, added to the fp32 accumulator; DC columns of the head dim from 16 * c16 (this CTA's share)
// in pairs of n8 tiles (16 columns): each warp a quarter of them, consecutive (D = 64, 128, 256), or dealt
// in turn where they do not divide by 4 (D = 96: warp w takes pairs w, w + 4, ...).
template <class T, int D, int BM, int DC = D>
__device__ __forceinline__ void dq_atomic(const AttnParams& p, const T* sdS, const T* sK, int b, int h, int m0,
                                          int c16 = 0) {
  constexpr int MT = BM / 16, BN = kBwdN, PAIRS = DC / 16, NP = (PAIRS + 3) / 4;
  constexpr bool EVEN = PAIRS % 4 == 0;
  const int warp = threadIdx.x >> 5, l = threadIdx.x & 31, g = l >> 2, q = l & 3;
  auto pair = [&](int t2) { return EVEN ? warp * NP + t2 : warp + 4 * t2; };
  float acc[MT][2 * NP][4];
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int t = 0; t < 2 * NP; ++t) acc[mi][t][0] = acc[mi][t][1] = acc[mi][t][2] = acc[mi][t][3] = 0.f;
#pragma unroll
  for (int kt = 0; kt < BN / 16; ++kt) {
    unsigned a[MT][4];
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) {
      const int key = kt * 16 + (l & 7) + (l >> 4) * 8, c = mi * 2 + ((l >> 3) & 1);
      ldsm_x4_t(a[mi], smem_addr(sdS + swz<64>(key, c)));
    }
#pragma unroll
    for (int t2 = 0; t2 < NP; ++t2) {
      if (EVEN || pair(t2) < PAIRS) {  // (warp-uniform)
        unsigned bb[4];
        ld_b_kn<D>(bb, sK, kt * 16, c16 + pair(t2));
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
          mma16816<T>(acc[mi][2 * t2], a[mi], bb[0], bb[1]);
          mma16816<T>(acc[mi][2 * t2 + 1], a[mi], bb[2], bb[3]);
        }
      }
    }
  }
  float* base = p.dq_acc + ((long long)b * p.heads_q + h) * p.seq_q * D;
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int e2 = 0; e2 < 2; ++e2) {
      const int row = m0 + mi * 16 + g + e2 * 8;
      if (row < p.seq_q) {
#pragma unroll
        for (int t2 = 0; t2 < NP; ++t2) {
          if (EVEN || pair(t2) < PAIRS) {
            float* r = base + (long long)row * D + (c16 + pair(t2)) * 16 + q * 2;
            red_add2(r, acc[mi][2 * t2][2 * e2], acc[mi][2 * t2][2 * e2 + 1]);
            red_add2(r + 8, acc[mi][2 * t2 + 1][2 * e2], acc[mi][2 * t2 + 1][2 * e2 + 1]);
          }
        }
      }
    }
}

// ATOMIC: also accumulate dQ (fp32 atomics into p.dq_acc; bwd_dq_convert finishes it), instead of the
// separate bwd_dq pass. Faster, but the float sums' order varies from run to run.
template <class T, int D, bool ATOMIC, bool DROP>
__global__ void __launch_bounds__(kThreads) bwd_dkdv(const AttnParams p) {
  constexpr int BM = Tiles<D>::kKvM, BN = kBwdN, MT = 1, P = Pitch<D>::v;
  constexpr int DS = Tiles<D>::kDSplit, DC = D / DS;  // this CTA's dK / dV columns: [half * DC, +DC)
  extern __shared__ __align__(16) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + BN * P;
  T* sQ = sV + BN * P;     // [2][BM * P]
  T* sdO = sQ + 2 * BM * P;  // [2][BM * P]
  float* sL = reinterpret_cast<float*>(sdO + 2 * BM * P);  // [2][BM] lse as stored (natural log)
  float* sD = sL + 2 * BM;                                  // [2][BM] dsum
  T* sdS = reinterpret_cast<T*>(sD + 2 * BM);               // ATOMIC: [BN][64] dS^T (swizzled rows of 64)

  const int nb_ = blockIdx.x / DS, half = blockIdx.x % DS, hk = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x >> 5, l = threadIdx.x & 31, q = l & 3;
  const Seq sq = seq_of(p, b);
  const int n0 = nb_ * BN;
  const int wkey = warp * 16;

  // query rows that can see a key of this block: i >= n0 - offset (causal); all rows otherwise
  const int i_first = (sq.causal && n0 < sq.len_kv) ? max(0, n0 - sq.offset) : 0;
  const int mt0 = i_first / BM;
  const int mtiles = (n0 < sq.len_kv && i_first < sq.len_q) ? (sq.len_q + BM - 1) / BM - mt0 : 0;
  const int iters = mtiles * p.group;

  load_tile<T, D, BN>(sK, at<T>(p.k, p, PYDNN_ATTN_T_K, b, hk) + (long long)n0 * p.stride[PYDNN_ATTN_T_K][2],
                      p.stride[PYDNN_ATTN_T_K][2], sq.len_kv - n0);
  load_tile<T, D, BN>(sV, at<T>(p.v, p, PYDNN_ATTN_T_V, b, hk) + (long long)n0 * p.stride[PYDNN_ATTN_T_V][2],
                      p.stride[PYDNN_ATTN_T_V][2], sq.len_kv - n0);

  // stage (Q, dO, lse, dsum) of iteration `it` (query head hk * group + it / mtiles, tile mt0 + it % mtiles)
  auto stage = [&](int it, int buf) {
    const int h = hk * p.group + it / mtiles, m0 = (mt0 + it % mtiles) * BM;
    load_tile<T, D, BM>(sQ + buf * BM * P, at<T>(p.q, p, PYDNN_ATTN_T_Q, b, h) + (long long)m0 * p.stride[PYDNN_ATTN_T_Q][2],
                        p.stride[PYDNN_ATTN_T_Q][2], sq.len_q - m0);
    load_tile<T, D, BM>(sdO + buf * BM * P,
                        at<T>(p.dout, p, PYDNN_ATTN_T_DO, b, h) + (long long)m0 * p.stride[PYDNN_ATTN_T_DO][2],
                        p.stride[PYDNN_ATTN_T_DO][2], sq.len_q - m0);
    if (threadIdx.x < BM) {  // lse and dsum of the tile's rows, asynchronously too (raw: see lse2_of)
      const int row = m0 + threadIdx.x;
      const bool ok = row < sq.len_q;
      const long long lo = ok ? (long long)b * p.stride[PYDNN_ATTN_T_LSE][0] + (long long)h * p.stride[PYDNN_ATTN_T_LSE][1] +
                                    (long long)row * p.stride[PYDNN_ATTN_T_LSE][2] : 0;
      const long long dso = ok ? ((long long)b * p.heads_q + h) * p.seq_q + row : 0;
      cp_async4(smem_addr(sL + buf * BM + threadIdx.x), p.lse + lo, ok);
      cp_async4(smem_addr(sD + buf * BM + threadIdx.x), p.dsum + dso, ok);  // zero past the length
    }
  };
  if (iters > 0) stage(0, 0);
  cp_async_commit();

  float dk[MT][DC / 8][4], dv[MT][DC / 8][4];
#pragma unroll
  for (int dt = 0; dt < DC / 8; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[0][dt][e] = dv[0][dt][e] = 0.f;

  for (int it = 0; it < iters; ++it) {
    const int buf = it & 1, m0 = (mt0 + it % mtiles) * BM;
    if (it + 1 < iters) {
      stage(it + 1, buf ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* q_t = sQ + buf * BM * P;
    const T* do_t = sdO + buf * BM * P;
    const float* l_t = sL + buf * BM;
    const float* d_t = sD + buf * BM;
    float s[MT][BM / 8][4], dp[MT][BM / 8][4];
    tile_qk<T, D, MT, BM>(s, sK, wkey, q_t, nullptr);  // S^T: rows = this warp's keys, cols = queries
    // (queries past their length need no mask: their lse is +inf, so P = 0. Keys past theirs have zero K
    // and V rows, but P = exp2(-lse) of an extreme lse could overflow and meet those zeros as inf * 0
    // in the atomic dQ: they are masked too.)
    if ((sq.causal && n0 + wkey + 15 > m0 + sq.offset) || n0 + wkey + 15 >= sq.len_kv)
      mask_tile<MT, BM>(s, n0 + wkey, m0, sq.len_q, sq.causal, sq.offset, true, sq.len_kv);
    // P^T = exp2(S^T * scale log2 e - lse2[query]); queries past their length or seeing nothing: P^T = 0.
    // (Keys past their length have zero-filled K / V rows; their dK / dV rows are written as zeros.)
#pragma unroll
    for (int nt = 0; nt < BM / 8; ++nt) {
      const float2 lv = *reinterpret_cast<const float2*>(l_t + nt * 8 + q * 2);
      const int qi = m0 + nt * 8 + q * 2;
      const float l0 = lse2_of(lv.x, qi < sq.len_q), l1 = lse2_of(lv.y, qi + 1 < sq.len_q);
#pragma unroll
      for (int e = 0; e < 4; ++e) s[0][nt][e] = exp2_fast(fmaf(s[0][nt][e], p.scale_log2, -((e & 1) ? l1 : l0)));
    }
    unsigned kb[MT] = {0u};
    if constexpr (DROP) {  // dV += (Z * scale * P)^T dO; dP^T passes the same mask
      keep_tile<MT, BM>(kb, p, b, hk * p.group + it / mtiles, n0 + wkey, m0, true);
      tile_pv<T, D, MT, BM, true, DC>(dv, s, do_t, kb, p.drop_scale, half * DC / 16);
    } else {
      tile_pv<T, D, MT, BM, false, DC>(dv, s, do_t, nullptr, 1.f, half * DC / 16);  // dV += P^T dO
    }
    tile_qk<T, D, MT, BM>(dp, sV, wkey, do_t, nullptr);  // dP^T = V dO^T
    if constexpr (DROP) apply_keep<MT, BM>(dp, kb, p.drop_scale);
#pragma unroll
    for (int nt = 0; nt < BM / 8; ++nt) {
      const float2 dd = *reinterpret_cast<const float2*>(d_t + nt * 8 + q * 2);
#pragma unroll
      for (int e = 0; e < 4; ++e) s[0][nt][e] *= dp[0][nt][e] - ((e & 1) ? dd.y : dd.x);
    }
    tile_pv<T, D, MT, BM, false, DC>(dk, s, q_t, nullptr, 1.f, half * DC / 16);  // dK += dS^T Q
    if constexpr (ATOMIC) {
      const int g = l >> 2;
#pragma unroll
      for (int nt = 0; nt < BM / 8; ++nt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
          *reinterpret_cast<unsigned*>(sdS + swz<64>(wkey + g + hh * 8, nt) + q * 2) =
              pack16x2<T>(s[0][nt][2 * hh], s[0][nt][2 * hh + 1]);
      __syncthreads();
      dq_atomic<T, D, BM, DC>(p, sdS, sK, b, hk * p.group + it / mtiles, m0, half * DC / 16);
    }
    __syncthreads();
  }
  if (iters == 0) cp_async_wait<0>();
  __syncthreads();
  // keys past the length (and blocks wholly past it) are written as zeros
  float mk[MT][2] = {{p.scale, p.scale}}, mv[MT][2] = {{1.f, 1.f}};
  store_rows<T, D, MT, DC>(sK, wkey, dk, mk, (T*)at<T>(p.dk, p, PYDNN_ATTN_T_DK, b, hk), p.stride[PYDNN_ATTN_T_DK][2],
                           n0 + wkey, sq.len_kv, p.seq_kv, half * DC / 8);
  store_rows<T, D, MT, DC>(sV, wkey, dv, mv, (T*)at<T>(p.dv, p, PYDNN_ATTN_T_DV, b, hk), p.stride[PYDNN_ATTN_T_DV][2],
                           n0 + wkey, sq.len_kv, p.seq_kv, half * DC / 8);
}

// ------------------------------------------------------------------ decode: split-KV forward

// Decode-shaped forward (one to a few query rows against a long K/V; FlashDecoding): one CTA per (split
// of the keys, K/V head x block of 16 rows, batch). A CTA's rows are (query head, query) pairs of one
// K/V head's group, r = hh * seq_q + i (hh < group): GQA's heads share each K/V tile instead of
// reading it once per head. 16 rows per CTA (one m16 tile; O of 16 x 256 is the 128 registers that
// D = 256 allows). K/V tiles of kDecN = 64 keys in an STAGES-deep cp.async ring; warp w takes keys
// [16 w, 16 w + 16) of every tile with its own online softmax state (m, l, O of the 16 rows), and the
// four are merged at the end through shared memory (the ring, no longer needed). splits == 1: O and lse
// are written directly; else the split's O (normalized by its own sum) and lse go to part_o / part_lse
// and dec_combine merges them. The split's key range is [split * split_len, + split_len) clipped to the
// keys any row of the batch entry can see. No dropout (the host sends dropout to fwd).
// PAGED (units attention.dec.paged.<tag>; attention_params.h): the tiles' rows come from the page pools
// through the batch's page tables (load_tile_paged), any page size; the paged forward also sends its prefill here
// where the warp-specialized kernel does not run (any arch; correct, not fast: 16 rows a CTA).
constexpr int kDecN = 64;
template <int D> struct Dec {
  // ring depth: 3 x 64-key K + V tiles (96 KiB at D = 128, two CTAs per SM); 2 at D = 256 (128 KiB)
  static constexpr int STAGES = D > 128 ? 2 : 3;
};

template <class T, int D, bool PAGED = false, bool PIPE = false>
__global__ void __launch_bounds__(kThreads) dec(const AttnParams p) {
  constexpr int P = Pitch<D>::v, BN = kDecN, ST = Dec<D>::STAGES, CH = D / 8;
  constexpr bool QREG = D <= 128;  // Q's fragments in registers (D / 4 of them); D = 256 reads smem
  extern __shared__ __align__(16) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + 16 * P;        // [ST][BN * P]
  T* sV = sK + ST * BN * P;   // [ST][BN * P]
  long long* sOff = reinterpret_cast<long long*>(sV + ST * BN * P);  // PAGED: [ST][K 64, V 64] row offsets

  const int sp = blockIdx.x, b = blockIdx.z;
  const int rows = p.group * p.seq_q, rblocks = (rows + 15) / 16;
  const int hk = blockIdx.y / rblocks, rb = blockIdx.y % rblocks;
  const int warp = threadIdx.x >> 5, l = threadIdx.x & 31, g = l >> 2, q = l & 3;
  const Seq sq = seq_of(p, b);
  const int k_begin = sp * p.split_len;
  const int k_end = min(k_begin + p.split_len, key_end(sq, 0, sq.len_q));
  const int ntiles = k_end > k_begin ? (k_end - k_begin + BN - 1) / BN : 0;

  // Q: 16 gathered rows (zero past the group's rows or a query's length)
  for (int idx = threadIdx.x; idx < 16 * CH; idx += kThreads) {
    const int r = idx / CH, c = idx % CH, rr = rb * 16 + r;
    const int hh = rr / p.seq_q, i = rr - hh * p.seq_q;
    const bool ok = rr < rows && i < sq.len_q;
    const T* src = ok ? at<T>(p.q, p, PYDNN_ATTN_T_Q, b, hk * p.group + hh) + (long long)i * p.stride[PYDNN_ATTN_T_Q][2] + c * 8
                      : (const T*)p.q;
    cp_async16(smem_addr(sQ + swz<D>(r, c)), src, ok);
  }
  // paged K / V: the pools' K/V head bases (stride[t][0] is then the page stride) and batch b's table rows
  // (a template argument: a runtime test of p.ptab_k cost the plain kernel 9-61 registers a thread and
  // took d 256 from 8 to 136 bytes of spills, ptxas sm_90)
  constexpr bool paged = PAGED;
  static_assert(PAGED || !PIPE, "dec: PIPE is a paged variant");
  int pend = 0;  // PIPE: this thread's page id of the next tile to store (dec_page_load)
  const T* gk = paged ? (const T*)p.k + (long long)hk * p.stride[PYDNN_ATTN_T_K][1] : at<T>(p.k, p, PYDNN_ATTN_T_K, b, hk);
  const T* gv = paged ? (const T*)p.v + (long long)hk * p.stride[PYDNN_ATTN_T_V][1] : at<T>(p.v, p, PYDNN_ATTN_T_V, b, hk);
  const long long ldk = p.stride[PYDNN_ATTN_T_K][2], ldv = p.stride[PYDNN_ATTN_T_V][2];
  auto stage = [&](int j) {  // tile j into ring slot j % ST; keys at or past k_end zero-filled
    if (j < ntiles) {
      const int n0 = k_begin + j * BN, slot = j % ST;
      if (paged) {
        load_tile_paged<T, D, BN>(sK + slot * BN * P, gk, sOff + slot * 2 * BN, k_end - n0);
        load_tile_paged<T, D, BN>(sV + slot * BN * P, gv, sOff + slot * 2 * BN + BN, k_end - n0);
      } else {
        load_tile<T, D, BN>(sK + slot * BN * P, gk + (long long)n0 * ldk, ldk, k_end - n0);
        load_tile<T, D, BN>(sV + slot * BN * P, gv + (long long)n0 * ldv, ldv, k_end - n0);
      }
    }
  };
  if (paged) {  // the row offsets of tiles 0 .. ST - 1 (slot t % ST), then visible to every thread
#pragma unroll
    for (int t = 0; t < ST; ++t) dec_row_offsets(sOff + t * 2 * BN, p, b, k_begin + t * BN, k_end);
    if (PIPE) pend = dec_page_load(p, b, k_begin + ST * BN, k_end);  // tile ST's, stored at iteration 0
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < ST - 1; ++j) {  // group j: tile j (group 0 also Q)
    stage(j);
    cp_async_commit();
  }

  // the causal limit of this thread's two rows (g, g + 8): key j visible iff j <= lim
  int lim[2];
#pragma unroll
  for (int hh2 = 0; hh2 < 2; ++hh2) {
    const int rr = rb * 16 + g + hh2 * 8;
    lim[hh2] = sq.causal ? rr % p.seq_q + sq.offset : 0x7fffffff;
  }
  float o[1][D / 8][4], m[1][2], lsum[1][2];
  m[0][0] = m[0][1] = -kInf;
  lsum[0][0] = lsum[0][1] = 0.f;
#pragma unroll
  for (int dt = 0; dt < D / 8; ++dt) o[0][dt][0] = o[0][dt][1] = o[0][dt][2] = o[0][dt][3] = 0.f;
  unsigned qf[1][D / 16][4];

  for (int j = 0; j < ntiles; ++j) {
    cp_async_wait<ST - 2>();  // ST - 1 + j groups committed: tile j's (group j) has landed
    __syncthreads();          // ... for every thread; and every warp is done with slot (j - 1) % ST
    stage(j + ST - 1);
    cp_async_commit();
    // PAGED: tile j + ST's row offsets into slot j % ST (tile j's, read when it was staged, before the
    // barrier above); visible at the next iteration's barrier, where stage(j + ST) reads them
    if (paged && !PIPE && j + ST < ntiles)
      dec_row_offsets(sOff + (j % ST) * 2 * BN, p, b, k_begin + (j + ST) * BN, k_end);
    // PIPE: the page id loaded an iteration ago stored now, the next one's load issued (its latency under
    // this tile's work, not stalling the store: the store of a just-loaded id waits for the load)
    if (PIPE) {
      if (j + ST < ntiles) dec_row_store(sOff + (j % ST) * 2 * BN, p, pend, k_begin + (j + ST) * BN, k_end);
      if (j + ST + 1 < ntiles) pend = dec_page_load(p, b, k_begin + (j + ST + 1) * BN, k_end);
    }
    if (QREG && j == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) ld_a<D>(qf[0][kk], sQ, 0, kk);
    }
    const int slot = j % ST, n0 = k_begin + j * BN + warp * 16;
    const T* k_t = sK + slot * BN * P + warp * 16 * P;  // 16 rows: a multiple of 8, same swizzle
    const T* v_t = sV + slot * BN * P + warp * 16 * P;
    float s[1][2][4];
    tile_qk<T, D, 1, 16>(s, sQ, 0, k_t, QREG ? qf : nullptr);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = n0 + nt * 8 + q * 2 + (e & 1);
        if (col >= k_end || col > lim[e >> 1]) s[0][nt][e] = -kInf;
      }
    softmax_update<1, 16, D>(s, m, lsum, o, p.scale_log2);
    tile_pv<T, D, 1, 16>(o, s, v_t);
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring is free: the warps' states meet there

  float* sM = reinterpret_cast<float*>(sK);  // [4][16] each warp's row maxima (log2 units)
  float* sL = sM + 64;                       // [4][16] each warp's row sums
  float* sO = sL + 64;                       // [4][16][D] each warp's O, rescaled to the merged maximum
#pragma unroll
  for (int hh2 = 0; hh2 < 2; ++hh2) {
    float t = lsum[0][hh2];
    t += __shfl_xor_sync(0xffffffffu, t, 1);
    t += __shfl_xor_sync(0xffffffffu, t, 2);
    if (q == 0) {
      sM[warp * 16 + g + hh2 * 8] = m[0][hh2];
      sL[warp * 16 + g + hh2 * 8] = t;
    }
  }
  __syncthreads();
#pragma unroll
  for (int hh2 = 0; hh2 < 2; ++hh2) {
    const int r = g + hh2 * 8;
    const float mx = fmaxf(fmaxf(sM[r], sM[16 + r]), fmaxf(sM[32 + r], sM[48 + r]));
    const float f = m[0][hh2] == -kInf ? 0.f : exp2_fast(m[0][hh2] - mx);  // (m finite: mx finite too)
    float* dst = sO + (warp * 16 + r) * D + q * 2;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(o[0][dt][2 * hh2] * f, o[0][dt][2 * hh2 + 1] * f);
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < 16 * D / 2; idx += kThreads) {
    const int r = idx / (D / 2), c = (idx % (D / 2)) * 2, rr = rb * 16 + r;
    if (rr >= rows) continue;
    const int hh = rr / p.seq_q, i = rr - hh * p.seq_q, h = hk * p.group + hh;
    float mx = -kInf, lt = 0.f;
#pragma unroll
    for (int w = 0; w < 4; ++w) mx = fmaxf(mx, sM[w * 16 + r]);
#pragma unroll
    for (int w = 0; w < 4; ++w) lt += sM[w * 16 + r] == -kInf ? 0.f : sL[w * 16 + r] * exp2_fast(sM[w * 16 + r] - mx);
    const bool live = i < sq.len_q && lt > 0.f;
    const float inv = live ? 1.f / lt : 0.f;
    float2 acc = make_float2(0.f, 0.f);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float2 v = *reinterpret_cast<const float2*>(sO + (w * 16 + r) * D + c);
      acc.x += v.x;
      acc.y += v.y;
    }
    const float lse = live ? mx * kLn2 + __logf(lt) : -kInf;
    if (p.splits == 1) {
      T* go = (T*)at<T>(p.o, p, PYDNN_ATTN_T_O, b, h) + (long long)i * p.stride[PYDNN_ATTN_T_O][2];
      *reinterpret_cast<unsigned*>(go + c) = pack16x2<T>(acc.x * inv, acc.y * inv);
      if (c == 0 && p.lse)
        p.lse[(long long)b * p.stride[PYDNN_ATTN_T_LSE][0] + (long long)h * p.stride[PYDNN_ATTN_T_LSE][1] +
              (long long)i * p.stride[PYDNN_ATTN_T_LSE][2]] = lse;
    } else if (i < sq.len_q) {
      const long long slot = (((long long)b * p.heads_q + h) * p.seq_q + i) * p.splits + sp;
      *reinterpret_cast<float2*>(p.part_o + slot * D + c) = make_float2(acc.x * inv, acc.y * inv);
      if (c == 0) p.part_lse[slot] = lse;
    }
  }
}

// Merge the splits of dec: one CTA per query row (blockIdx.y * gridDim.x + blockIdx.x), lse = log sum_s exp(lse_s)
// and O = sum_s exp(lse_s - lse) O_s. The row's split lse values go to shared memory first (one pass, all
// threads); every warp then finds max and sum over them (the same order in every warp: identical lse),
// warp w sums the splits w, w + 4, ... of its lane's float4 columns, four loads in flight per lane, and the
// four warps' sums meet in shared memory, added in warp order (deterministic). O in its type and strides,
// lse (if wanted) as the forward's. Rows past their length, or seeing no key: O = 0, lse = -inf.
// (One warp per row with the splits summed one after another left a load's latency per split exposed:
// ~33 round trips at batch 1.)
constexpr int kDecMaxSplits = 256;  // DEC_MAX_SPLITS in pydnn/ops/attention.py
template <class T, int D>
__global__ void __launch_bounds__(kThreads) dec_combine(const AttnParams p) {
  constexpr int C4 = D / 4;  // float4 columns of a row
  __shared__ float sW[kDecMaxSplits];
  __shared__ __align__(16) float4 sAcc[4][C4];
  const long long rows = (long long)p.batch * p.heads_q * p.seq_q;
  const long long row = (long long)blockIdx.y * gridDim.x + blockIdx.x;
  const int warp = threadIdx.x >> 5, l = threadIdx.x & 31, ns = p.splits;
  if (row >= rows) return;
  {
    const int i = (int)(row % p.seq_q), h = (int)((row / p.seq_q) % p.heads_q);
    const int b = (int)(row / ((long long)p.seq_q * p.heads_q));
    const Seq sq = seq_of(p, b);
    const bool valid = i < sq.len_q;  // partials of rows past their length were never written
    const float* pl = p.part_lse + row * ns;
    for (int s = threadIdx.x; s < ns; s += kThreads) sW[s] = valid ? pl[s] : -kInf;
    __syncthreads();
    float mx = -kInf;
    for (int s = l; s < ns; s += 32) mx = fmaxf(mx, sW[s]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.f;
    if (mx > -kInf)
      for (int s = l; s < ns; s += 32) sum += __expf(sW[s] - mx);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float lse = mx > -kInf ? mx + __logf(sum) : -kInf;
    const float* po = p.part_o + row * ns * D;
#pragma unroll
    for (int cc = 0; cc < (C4 + 31) / 32; ++cc) {
      const int c = l + 32 * cc;
      if (c >= C4) break;
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
      if (mx > -kInf) {
        int s = warp;
        for (; s + 12 < ns; s += 16) {  // four splits at a time: their loads in flight together
          float4 v[4];
#pragma unroll
          for (int u = 0; u < 4; ++u) v[u] = *reinterpret_cast<const float4*>(po + (long long)(s + 4 * u) * D + c * 4);
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const float w = __expf(sW[s + 4 * u] - lse);
            acc.x = fmaf(w, v[u].x, acc.x);
            acc.y = fmaf(w, v[u].y, acc.y);
            acc.z = fmaf(w, v[u].z, acc.z);
            acc.w = fmaf(w, v[u].w, acc.w);
          }
        }
        for (; s < ns; s += 4) {
          const float4 v = *reinterpret_cast<const float4*>(po + (long long)s * D + c * 4);
          const float w = __expf(sW[s] - lse);
          acc.x = fmaf(w, v.x, acc.x);
          acc.y = fmaf(w, v.y, acc.y);
          acc.z = fmaf(w, v.z, acc.z);
          acc.w = fmaf(w, v.w, acc.w);
        }
      }
      sAcc[warp][c] = acc;
    }
    __syncthreads();
    T* go = (T*)at<T>(p.o, p, PYDNN_ATTN_T_O, b, h) + (long long)i * p.stride[PYDNN_ATTN_T_O][2];
    for (int c = threadIdx.x; c < C4; c += kThreads) {
      float4 a = sAcc[0][c];
#pragma unroll
      for (int w = 1; w < 4; ++w) {
        const float4 v = sAcc[w][c];
        a.x += v.x;
        a.y += v.y;
        a.z += v.z;
        a.w += v.w;
      }
      uint2 u;
      u.x = pack16x2<T>(a.x, a.y);
      u.y = pack16x2<T>(a.z, a.w);
      *reinterpret_cast<uint2*>(go + c * 4) = u;
    }
    if (threadIdx.x == 0 && p.lse)
      p.lse[(long long)b * p.stride[PYDNN_ATTN_T_LSE][0] + (long long)h * p.stride[PYDNN_ATTN_T_LSE][1] +
            (long long)i * p.stride[PYDNN_ATTN_T_LSE][2]] = lse;
  }
}

}  // namespace attn
}  // namespace pydnn
