// Convolution backward filter on Hopper's warpgroup MMA (BWD_FILTER_ALGO_1 for half / bfloat16, sm_90a
// units only; host: pydnn/ops/convolution_wgrad_wgmma.py). The GEMM is wgrad_pipe_tc's (ptx/convolution.cu):
//   dw[k][(t, r, s, c)] = sum over output positions pos = (n, od, oh, ow) of
//                         dy[pos][k] * x[n][(od, oh, ow) * stride + (t, r, s) * dil - pad][c],
// M = K, N = taps * C (c innermost: 8 channels of one tap are one 16-byte chunk of NHWC x), the reduction
// over positions (optionally split into slices, see Grid). Both operands arrive with the reduction index
// outermost: a 64-position tile of dy is [pos][k] (k contiguous) and of x [pos][(tap, c)], so both are
// wgmma's MN-major operands (common/wgmma.cuh): slabs of 64 M / N columns x 64 positions, 128-byte rows,
// 128B-swizzled, filled by cp.async (16-byte chunks, zero-filled outside the tensor or past the slice).
//
// Block: BM x BN of dw, two warpgroups (256 threads): BM = 128 stacks them along M (each 64 x BN), BM = 64
// puts them side by side along N (each 64 x BN / 2), every warpgroup issuing m64nNWk16 (NW = its width)
// straight from shared memory. The ring is fwd_wgmma's: STAGES stages, tile kt + STAGES - 2 copied after
// tile kt's MMAs were issued and tile kt - 1's retired (one barrier per K tile).
//   - A (dy): the host runs this kernel only where dy's positions are evenly spaced (offset = pos * ys[4]:
//     packed NHWC), so a thread's rows are one 32-bit offset stepped by 64 positions;
//   - B (x gathered): each thread's chunk column (8 channels of one tap) is fixed for the block; V 2 reads
//     its rows' positions from a per-K-tile table (below), V 1 steps each row's position digits by 64 (no
//     division); the tap's input pixel is bounds-checked per dim; offsets are 32-bit (the host checks the
//     spans).
// Grid: (direct + tiles * splits) blocks: whole tiles first, then the split tiles' slices
// (conv_wgrad_wgmma_params.h), so that a plan can run the tiles that fill whole waves of SMs unsplit and
// split only the rest, in one launch (the slices start on the SMs as the whole tiles finish).
// Epilogue: a whole tile writes dw = alpha * acc + beta * dw through dw's strides (taps flipped in
// CONVOLUTION mode); a slice writes the tile's raw fp32 partials at [split][tile][BM][BN] that wgrad_fold adds in split
// order: deterministic, bitwise reproducible.
#include "common/mma.cuh"
#include "common/params.h"
#include "common/types.cuh"
#include "common/wgmma.cuh"
#include "conv_wgrad_wgmma_params.h"

namespace pydnn {
namespace conv_wgrad {

template <class T, int BM, int BN, int STAGES, int MINB, int V = 2>
__global__ void __launch_bounds__(256, MINB) wgrad_tc_wgmma(const WgradWgmmaParams P) {
  const ConvParams& p = P.c;
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(sizeof(T) == 0, "wgrad_tc_wgmma needs the sm_90a target (KernelUnit archs)");
#endif
  constexpr int BK = 64, THREADS = 256, D = STAGES - 2;
  constexpr int WG_M = BM / 64, WG_N = 2 / WG_M, NW = BN / WG_N;  // warpgroups along M / N; each one's N
  constexpr int ACH = BM / 8, BCH = BN / 8;                          // 16-byte chunks per tile row
  constexpr int A_RS = THREADS / ACH, B_RS = THREADS / BCH;          // rows between a thread's chunks
  constexpr int A_ROWS = BK / A_RS, B_ROWS = BK / B_RS;              // chunks per thread per K tile
  constexpr int SLAB = 64 * BK * 2;                                  // bytes of one 64-column slab
  constexpr int A_BYTES = BM * BK * 2, STAGE = (BM + BN) * BK * 2;
  static_assert((BM == 64 || BM == 128) && (NW == 64 || NW == 128 || NW == 256) && STAGES >= 3, "tile");
  static_assert(A_RS % 8 == 0 && B_RS % 8 == 0 && BK % A_RS == 0 && BK % B_RS == 0, "one swizzle a thread");
  extern __shared__ __align__(1024) unsigned char wg_smem[];
  const unsigned raw = mma::smem_u32(wg_smem);
  const unsigned sbase = raw + (((raw + 1023u) & ~1023u) - raw);  // swizzle atoms: 1 KiB aligned stages
  const int t = threadIdx.x, wg = t >> 7;
  const int blk = blockIdx.x;
  const bool direct = blk < P.direct;  // a whole tile (dw written here), else one slice of a split tile
  const int sx = direct ? 0 : (blk - P.direct) % P.tiles, sz = direct ? 0 : (blk - P.direct) / P.tiles;
  const int tile = direct ? blk : P.tile_first + sx;
  const int m0 = tile % P.m_tiles * BM, n0 = tile / P.m_tiles * BN;
  const int kbeg = direct ? 0 : sz * p.k_per_split;
  const int kend = direct ? p.gk : min(p.gk, kbeg + p.k_per_split);
  const T* dy = static_cast<const T*>(p.x);
  const T* x = static_cast<const T*>(p.w);

  // A: rows (positions) kbeg + t / ACH + A_RS i, output channels m0 + 8 (t % ACH) ..
  const int pst = (int)p.ys[4];
  const int arow = t / ACH, acol = (t % ACH) * 8;
  const bool a_ok = m0 + acol < p.gm;
  int apos = kbeg + arow;
  unsigned aoff = (unsigned)(apos * pst + m0 + acol);  // (unsigned: the step past the last tile may wrap)
  const unsigned asoff = (unsigned)wgmma::sw128<BK>(arow, t % ACH) * 2;

  // B: rows kbeg + t / BCH + B_RS i, filter columns n0 + 8 (t % BCH) .. = 8 channels of one tap
  const int brow = t / BCH, bcol = (t % BCH) * 8;
  const bool b_ok = n0 + bcol < p.gn;
  int bc, base[3];
  {
    int n = b_ok ? n0 + bcol : 0;
    bc = n % p.cg;
    n /= p.cg;
    const int s = n % p.filt[2];
    n /= p.filt[2];
    base[2] = s * p.dil[2] - p.pad[2];
    base[1] = (n % p.filt[1]) * p.dil[1] - p.pad[1];
    base[0] = (n / p.filt[1]) * p.dil[0] - p.pad[0];
  }
  const int xs0 = (int)p.xs[0], xs2 = (int)p.xs[2], xs3 = (int)p.xs[3], xs4 = (int)p.xs[4];
  int bd[B_ROWS][4];  // row i's position as digits (n, od, oh, ow): position bpos + B_RS i
  int bpos = kbeg + brow;
#pragma unroll
  for (int i = 0; i < B_ROWS; ++i) {
    int q = bpos + B_RS * i;
    bd[i][3] = q % p.red_size[3]; q /= p.red_size[3];
    bd[i][2] = q % p.red_size[2]; q /= p.red_size[2];
    bd[i][1] = q % p.red_size[1];
    bd[i][0] = q / p.red_size[1];
  }
  const unsigned bsoff = (unsigned)wgmma::sw128<BK>(brow, t % BCH) * 2;
  // V 2: the K tile's 64 positions decomposed once, by threads 0..63, into a double-buffered table after
  // the stages: {x offset of (n, od * st, oh * st, ow * st), od * st, oh * st, ow * st} (a position past the
  // split's range gets a base that fails every bounds check); each B row then adds its tap (tapoff, base)
  // to an entry instead of stepping its own digits (~10 instructions a row instead of ~40).
  int4* table = reinterpret_cast<int4*>(wg_smem + (sbase - raw) + STAGES * STAGE);
  const int tapoff = base[0] * xs2 + base[1] * xs3 + base[2] * xs4 + bc;
  int pd[4], ppos = kbeg + t;  // threads t < BK: the position of table row t
  {
    int q = ppos;
    pd[3] = q % p.red_size[3]; q /= p.red_size[3];
    pd[2] = q % p.red_size[2]; q /= p.red_size[2];
    pd[1] = q % p.red_size[1];
    pd[0] = q / p.red_size[1];
  }
  auto table_fill = [&](int buf) {  // the next tile's table (threads t < BK), then the step to the one after
    if (V != 2 || t >= BK) return;
    const int q0 = pd[1] * p.stride[0], q1 = pd[2] * p.stride[1], q2 = pd[3] * p.stride[2];
    int4 e;
    e.x = pd[0] * xs0 + q0 * xs2 + q1 * xs3 + q2 * xs4;
    e.y = ppos < kend ? q0 : -(1 << 30);
    e.z = q1;
    e.w = q2;
    table[buf * BK + t] = e;
    int c = 0;
#pragma unroll
    for (int j = 3; j >= 1; --j) {
      const int nv = pd[j] + p.red_step[j] + c;
      c = nv >= p.red_size[j];
      pd[j] = c ? nv - p.red_size[j] : nv;
    }
    pd[0] += p.red_step[0] + c;
    ppos += BK;
  };

  auto fill = [&](int stage, int buf) {  // buf: the table of this tile (V 2)
    const unsigned sa = sbase + stage * STAGE, sb = sa + A_BYTES;
#pragma unroll
    for (int i = 0; i < A_ROWS; ++i) {
      const bool v = a_ok && apos + A_RS * i < kend;
      if (V == 2)  // no branch per chunk: the offset selected, one address add
        mma::cp_async_16(sa + asoff + A_RS * 128 * i, dy + (v ? aoff + (unsigned)(A_RS * i * pst) : 0u), v);
      else
        mma::cp_async_16(sa + asoff + A_RS * 128 * i, v ? dy + (aoff + (unsigned)(A_RS * i * pst)) : dy, v);
    }
    apos += BK;
    aoff += (unsigned)(BK * pst);
    if (V == 2) {
#pragma unroll
      for (int i = 0; i < B_ROWS; ++i) {
        const int4 e = table[buf * BK + brow + B_RS * i];
        const int q0 = e.y + base[0], q1 = e.z + base[1], q2 = e.w + base[2];
        const bool v = b_ok && (unsigned)q0 < (unsigned)p.in_size[0] && (unsigned)q1 < (unsigned)p.in_size[1] &&
                       (unsigned)q2 < (unsigned)p.in_size[2];
        mma::cp_async_16(sb + bsoff + B_RS * 128 * i, x + (v ? e.x + tapoff : 0), v);
      }
      return;
    }
#pragma unroll
    for (int i = 0; i < B_ROWS; ++i) {
      int* d = bd[i];
      const int q0 = d[1] * p.stride[0] + base[0], q1 = d[2] * p.stride[1] + base[1];
      const int q2 = d[3] * p.stride[2] + base[2];
      const bool v = b_ok && bpos + B_RS * i < kend && (unsigned)q0 < (unsigned)p.in_size[0] &&
                     (unsigned)q1 < (unsigned)p.in_size[1] && (unsigned)q2 < (unsigned)p.in_size[2];
      const int off = d[0] * xs0 + q0 * xs2 + q1 * xs3 + q2 * xs4 + bc;
      mma::cp_async_16(sb + bsoff + B_RS * 128 * i, v ? x + off : x, v);
      int c = 0;  // the next tile's position: + 64, digit by digit (each digit stays below twice its radix)
#pragma unroll
      for (int j = 3; j >= 1; --j) {
        const int nv = d[j] + p.red_step[j] + c;
        c = nv >= p.red_size[j];
        d[j] = c ? nv - p.red_size[j] : nv;
      }
      d[0] += p.red_step[0] + c;
    }
    bpos += BK;
  };

  float acc[NW / 2];
#pragma unroll
  for (int i = 0; i < NW / 2; ++i) acc[i] = 0.f;
  const int wm = WG_M == 2 ? wg : 0, wn = WG_M == 2 ? 0 : wg;  // this warpgroup's M slab / N block
  const int ktiles = (kend - kbeg + BK - 1) / BK;
  table_fill(0);
#pragma unroll
  for (int s = 0; s < D; ++s) {
    if (V == 2) __syncthreads();  // table s written (and table s - 1's readers done before it is rewritten)
    if (s < ktiles) fill(s, s & 1);
    mma::cp_async_commit();
    table_fill((s + 1) & 1);
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    mma::cp_async_wait<D - 1>();  // tile kt has landed (for this thread) ...
    wgmma::fence_proxy_async();   // ... and is visible to the async proxy ...
    __syncthreads();              // ... for every thread's chunks
    const unsigned sa = sbase + (kt % STAGES) * STAGE + wm * SLAB, sb = sbase + (kt % STAGES) * STAGE + A_BYTES +
                                                                        wn * (NW / 64) * SLAB;
    wgmma::fence();
    // MN-major operands: a k16 step is 16 rows (2048 bytes) on; LBO = the slab stride (next 64 columns)
    const unsigned long long da = wgmma::desc_sw128(sa, SLAB, 1024), db = wgmma::desc_sw128(sb, SLAB, 1024);
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) wgmma::Mma<T, NW, 1, 1>::run(acc, da + 128 * kk, db + 128 * kk, 1);
    wgmma::commit();
    wgmma::wait<1>();  // this warpgroup's tile kt - 1 group is done
    if (kt + D < ktiles) fill((kt + D) % STAGES, (kt + D) & 1);  // the stage of tile kt - 2
    mma::cp_async_commit();
    table_fill((kt + D + 1) & 1);  // read after the next iteration's barrier
  }
  wgmma::wait<0>();
  wgmma::fence_operands(acc);
  mma::cp_async_wait<0>();

  // Epilogue. Thread (warp w of the warpgroup, lane l) holds acc[4 j + 2 h + e] = D[16 w + l / 4 + 8 h]
  // [8 j + 2 (l % 4) + e]: columns n, n + 1 are two channels of one tap (C % 8 == 0).
  const int warp = (t >> 5) & 3, lane = t & 31;
  const int mrow = m0 + wm * 64 + warp * 16 + (lane >> 2), ncol = n0 + wn * NW + (lane & 3) * 2;
  if (!direct) {  // the whole tile (rows / columns past the GEMM are zeros)
    float* part = static_cast<float*>(P.part) + ((long long)sz * P.tiles + sx) * (BM * BN) + (mrow - m0) * BN +
                  (ncol - n0);
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < NW / 8; ++j)
        *reinterpret_cast<float2*>(part + 8 * h * BN + 8 * j) = make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
    return;
  }
  T* out = static_cast<T*>(p.out);
  const float alpha = (float)p.alpha, beta = (float)p.beta;
  const bool flip = p.flags & PYDNN_CONV_FLAG_FLIP, has_beta = p.flags & PYDNN_FLAG_BETA;
  // column ncol + 8 j is channel c of tap (t0, t1, t2): decomposed once, then stepped by 8 channels (C % 8
  // == 0: at most one carry into the tap a step) instead of dividing per column
  int c = ncol % p.cg, t0, t1, t2;
  {
    int q = ncol / p.cg;
    t2 = q % p.filt[2]; q /= p.filt[2];
    t1 = q % p.filt[1];
    t0 = q / p.filt[1];
  }
  auto tap_off = [&]() {
    return (long long)(flip ? p.filt[0] - 1 - t0 : t0) * p.ws[2] + (long long)(flip ? p.filt[1] - 1 - t1 : t1) * p.ws[3] +
           (long long)(flip ? p.filt[2] - 1 - t2 : t2) * p.ws[4];
  };
  long long toff = tap_off();
#pragma unroll
  for (int j = 0; j < NW / 8; ++j) {
    const int n = ncol + 8 * j;
    const long long noff = (long long)c * p.ws[1] + toff;
    c += 8;
    if (c >= p.cg) {
      c -= p.cg;
      if (++t2 == p.filt[2]) {
        t2 = 0;
        if (++t1 == p.filt[1]) {
          t1 = 0;
          ++t0;
        }
      }
      toff = tap_off();
    }
    if (n >= p.gn) continue;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = mrow + 8 * h;
      if (m >= p.gm) continue;
      const long long off = (long long)m * p.ws[0] + noff;
      float r0 = alpha * acc[4 * j + 2 * h], r1 = alpha * acc[4 * j + 2 * h + 1];
      if (has_beta) {
        r0 += beta * load<float>(out[off]);
        r1 += beta * load<float>(out[off + p.ws[1]]);
      }
      out[off] = store<T>(r0);
      out[off + p.ws[1]] = store<T>(r1);
    }
  }
}

// wgrad_fold: dw = alpha * (the partials of a launch's tiles summed in split order) + beta * dw, one thread
// per element of those tiles (consecutive threads along a tile row: coalesced partial reads, and for a
// channel-innermost dw, coalesced writes); elements past the GEMM are skipped.
template <class T>
__global__ void __launch_bounds__(256) wgrad_fold(const WgradFoldParams p) {
  const long long per_tile = (long long)p.bm * p.bn;
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= per_tile * p.tiles) return;
  const int x = (int)(i / per_tile), e = (int)(i % per_tile);
  const int tile = p.tile_first + x;
  const int m = tile % p.m_tiles * p.bm + e / p.bn, n = tile / p.m_tiles * p.bn + e % p.bn;
  if (m >= p.gm || n >= p.gn) return;
  const float* part = static_cast<const float*>(p.in) + i;
  const long long slice = per_tile * p.tiles;
  float s = 0.f;
  for (int sl = 0; sl < p.splits; ++sl) s += part[sl * slice];
  int q = n;
  const int c = q % p.cg;
  q /= p.cg;
  int tap[3];
  tap[2] = q % p.filt[2]; q /= p.filt[2];
  tap[1] = q % p.filt[1];
  tap[0] = q / p.filt[1];
  const bool flip = p.flags & PYDNN_CONV_FLAG_FLIP;
  long long off = (long long)m * p.ws[0] + (long long)c * p.ws[1];
#pragma unroll
  for (int d = 0; d < 3; ++d) off += (long long)(flip ? p.filt[d] - 1 - tap[d] : tap[d]) * p.ws[2 + d];
  T* out = static_cast<T*>(p.out);
  float v = (float)p.alpha * s;
  if (p.flags & PYDNN_FLAG_BETA) v += (float)p.beta * load<float>(out[off]);
  out[off] = store<T>(v);
}

}  // namespace conv_wgrad
}  // namespace pydnn
