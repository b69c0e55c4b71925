// The Hopper attention forward's warpgroup pieces, shared by ptx/attention_wgmma.cu (fwd: 256 threads, no
// warp specialization) and ptx/attention_ws.cu (fwd_ws: a producer warpgroup and two consumer warpgroups):
// the swizzled tile copy, S = Q K^T and O += P V on wgmma, the masks and the online softmax on the
// accumulator fragment, P packed as the register-A operand.
#pragma once

#include "types.cuh"
#include "attn_mma.cuh"
#include "attn_problem.cuh"
#include "wgmma.cuh"
#include "attention_params.h"

namespace pydnn {
namespace attn_wg {

using attn::cp_async16;
using attn::cp_async_commit;
using attn::cp_async_wait;
using attn::exp2_fast;
using attn::smem_addr;

constexpr int kWG = 2;              // warpgroups per CTA, 64 query rows each
constexpr int kThreads = 128 * kWG;
constexpr int kBM = 64 * kWG;       // query rows per CTA
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kInf = 1.0f / 0.0f;
// D = 96 runs as D = 128 with the last 32 columns of Q, K, V zero in shared memory (a 96-column
// MN-major operand is not a whole number of the 128B swizzle's 64-column slabs): S = Q K^T takes only
// the 6 real k16 steps, O = P V computes 128 columns (the last 32 zero, never stored). Pad<D>: the
// shared-memory / accumulator width.
template <int D> struct Pad {
  static constexpr int v = D == 96 ? 128 : D;
};

// Copy ROWS rows of D elements (global row stride ld) into the 128B-swizzled tile at shared address s
// (wgmma::sw128<ROWS>: slabs of 64 columns); rows >= valid are zero filled (past a length their
// garbage, even NaN, must not meet P = 0 in P V). NT threads take part (tid: 0 .. NT - 1); the caller commits.
// Thread t copies chunk t % CH of rows t / CH + RS i: one global pointer and one shared address, each
// advanced by a constant per pass (RS rows, a multiple of 8: the same swizzle phase); the row test only
// on a tile that crosses `valid` (CTA-uniform).
// D = 96: rows of Pad<D> = 128 in shared memory, chunks past the 12 real ones zero filled (no read).
template <class T, int D, int ROWS, int NT = kThreads>
__device__ __forceinline__ void load_tile(unsigned s, const T* g, long long ld, int valid, int tid) {
  constexpr int CH = Pad<D>::v / 8, RS = NT / CH, N = ROWS / RS;
  static_assert(RS % 8 == 0 && ROWS % RS == 0, "tile chunks must divide among the threads");
  const int r0 = tid / CH, c = tid % CH;
  constexpr bool PADDED = Pad<D>::v != D;
  const bool cok = !PADDED || c < D / 8;  // (a constant true but at D = 96: the other kernels' code as it was)
  const T* src = cok ? g + (long long)r0 * ld + c * 8 : g;
  const long long step = (long long)RS * ld;
  const unsigned dst = s + 2u * (unsigned)wgmma::sw128<ROWS>(r0, c);
  if (valid >= ROWS) {
#pragma unroll
    for (int i = 0; i < N; ++i) cp_async16(dst + i * RS * 128, src + i * step, cok);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const bool ok = r0 + i * RS < valid && cok;
      cp_async16(dst + i * RS * 128, ok ? src + i * step : g, ok);
    }
  }
}

// S (64 x BN, accumulator fragment) = Q_wg K^T. sq: this warpgroup's first Q row in slab 0 (Q's slabs
// are kBM rows of 128 bytes apart), sk: the K tile (slabs of BN rows). A k16 step is 32 bytes along a
// row of a slab, the next slab every 4 steps.
template <class T, int D, int BN>
__device__ __forceinline__ void tile_qk(float (&s)[BN / 2], unsigned sq, unsigned sk) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const unsigned off = (kk & 3) * 32;
    const unsigned long long da = wgmma::desc_sw128(sq + (kk >> 2) * (kBM * 128) + off, 16, 1024);
    const unsigned long long db = wgmma::desc_sw128(sk + (kk >> 2) * (BN * 128) + off, 16, 1024);
    wgmma::Mma<T, BN, 0, 0>::run(s, da, db, kk > 0);
  }
}

// O (64 x D) += P (64 x BN, registers: pa[kt] the A fragment of keys 16 kt..) V, V at sv stored [key][d]
// (MN-major B: a k16 step is 16 rows = 2048 bytes on, the next 64 columns of d one slab = BN rows on).
// D = 96: the 128 padded columns (Pad).
template <class T, int D, int BN>
__device__ __forceinline__ void tile_pv(float (&o)[Pad<D>::v / 2], const unsigned (&pa)[BN / 16][4], unsigned sv) {
#pragma unroll
  for (int kt = 0; kt < BN / 16; ++kt)
    wgmma::MmaRS<T, Pad<D>::v, 1>::run(o, pa[kt], wgmma::desc_sw128(sv + kt * 2048, BN * 128, 1024), 1);
}

// -inf where key col is not visible to query row: s[4j + 2h + e] is (row0 + 8h, col0 + 8j + 2(l%4) + e).
template <int BN>
__device__ __forceinline__ void mask_tile(float (&s)[BN / 2], int row0, int col0, int len_kv, bool causal, int offset) {
  const int q = threadIdx.x & 3;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = row0 + (i >> 1) * 8, col = col0 + j * 8 + q * 2 + (i & 1);
      if (col >= len_kv || (causal && col > row + offset)) s[4 * j + i] = -kInf;
    }
}

// Online softmax over one tile (FlashAttention-2's, on the fragment's two rows per thread): new maxima m
// (log2 units), s <- exp2(s * scale_log2 - m), running partial sums l (per thread; the quad's are summed
// at the end), and corr = exp2(m_old - m_new), the factor O must be rescaled by (the caller does it when
// the P V in flight is done).
template <int BN>
__device__ __forceinline__ void softmax_tile(float (&s)[BN / 2], float (&m)[2], float (&l)[2], float (&corr)[2],
                                             float scale_log2) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = -kInf;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[h], mx * scale_log2);
    const float m_use = m_new == -kInf ? 0.f : m_new;  // nothing visible yet: exp2(-inf) = 0
    corr[h] = exp2_fast(m[h] - m_use);
    m[h] = m_new;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float pv = exp2_fast(fmaf(s[4 * j + 2 * h + e], scale_log2, -m_use));
        s[4 * j + 2 * h + e] = pv;
        sum += pv;
      }
    l[h] = l[h] * corr[h] + sum;
  }
}

template <int D> __device__ __forceinline__ void rescale(float (&o)[D / 2], const float (&corr)[2]) {
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    o[4 * j] *= corr[0];
    o[4 * j + 1] *= corr[0];
    o[4 * j + 2] *= corr[1];
    o[4 * j + 3] *= corr[1];
  }
}

// P to 16 bits: k16 step kt of the accumulator's columns is the register-A fragment (wgmma.cuh, MmaRS).
template <class T, int BN>
__device__ __forceinline__ void pack_p(unsigned (&pa)[BN / 16][4], const float (&s)[BN / 2]) {
#pragma unroll
  for (int kt = 0; kt < BN / 16; ++kt)
#pragma unroll
    for (int i = 0; i < 4; ++i) pa[kt][i] = pack16x2<T>(s[8 * kt + 2 * i], s[8 * kt + 2 * i + 1]);
}

using attn::at;
using attn::Seq;
using attn::seq_of;

}  // namespace attn_wg
}  // namespace pydnn
