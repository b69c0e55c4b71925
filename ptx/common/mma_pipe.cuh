// The pipelined tensor-core main loop of the convolution kernels (ptx/convolution.cu:
// implicit_gemm_pipe_tc forward / backward data, wgrad_pipe_tc backward filter), built like pydnn's
// matmul pipeline 2 (ptx/matmul.cu: mainloop_v2), which runs mma.sync at about twice the per-SM rate of
// the first convolution loop:
//   - K tiles of kPipeBK = 64 (4 k16 steps and 16 KB+ of copies per barrier, not 2 steps per barrier);
//   - shared tiles with 128-byte rows XOR-swizzled by 16-byte chunk (swz), read with ldmatrix;
//   - fragments double-buffered in registers (step kk + 1's ldmatrix in flight during step kk's mmas),
//     one barrier per K tile placed before the first read of the next stage, and the copy of tile
//     kt + STAGES - 1 issued after step 0's fragment loads;
//   - the producer (what a "fill" does) is the caller's: the loop only says when to copy the next tile.
// The producer / consumer split is the slot a Hopper wgmma + TMA engine would take over.
#pragma once

#include "mma.cuh"

namespace pydnn {
namespace mma {

constexpr int kPipeBK = 64;  // the K tile of the pipelined loop (elements; 128 bytes of 16-bit data)

// Element offset of 16-byte chunk `c` of row `r` in a shared tile of COLS 16-bit elements per row: the
// chunk index XOR the row's low 3 bits, so the 8 rows one ldmatrix reads (and 8 consecutive rows a
// warp's copies write) fall in 8 different bank groups.
template <int COLS> __device__ __forceinline__ int swz(int r, int c) {
  static_assert(COLS % 64 == 0, "swizzled rows must be multiples of 128 bytes");
  return r * COLS + ((c ^ (r & 7)) << 3);
}

// Fragments of k16 step kk of a warp tile (rows wm0.., columns wn0..) from an A tile [BM][64] (k
// contiguous) and a B tile stored [n][64] (k contiguous): ldmatrix for both.
template <class T, int TM, int TN>
__device__ __forceinline__ void frags_mk_nk(const T* sa, const T* sb, int kk, int wm0, int wn0,
                                            unsigned (&a)[TM][4], unsigned (&b)[TN][2]) {
  const int lane = threadIdx.x & 31, mat = lane >> 3, r8 = lane & 7;
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int row = wm0 + i * 16 + (lane & 15), ch = kk * 2 + (lane >> 4);
    ldmatrix_x4(a[i], smem_u32(sa + swz<kPipeBK>(row, ch)));
  }
#pragma unroll
  for (int j = 0; j < TN; j += 2) {
    unsigned r[4];
    const int nr = wn0 + j * 8 + (mat >> 1) * 8 + r8, ch = kk * 2 + (mat & 1);
    ldmatrix_x4(r, smem_u32(sb + swz<kPipeBK>(nr, ch)));
    b[j][0] = r[0];
    b[j][1] = r[1];
    b[j + 1][0] = r[2];
    b[j + 1][1] = r[3];
  }
}

// The same with B stored [64][BN] (each k's run of n contiguous): ldmatrix .trans for B.
template <class T, int BN, int TM, int TN>
__device__ __forceinline__ void frags_mk_kn(const T* sa, const T* sb, int kk, int wm0, int wn0,
                                            unsigned (&a)[TM][4], unsigned (&b)[TN][2]) {
  const int lane = threadIdx.x & 31, mat = lane >> 3, r8 = lane & 7;
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int row = wm0 + i * 16 + (lane & 15), ch = kk * 2 + (lane >> 4);
    ldmatrix_x4(a[i], smem_u32(sa + swz<kPipeBK>(row, ch)));
  }
#pragma unroll
  for (int j = 0; j < TN; j += 2) {
    unsigned r[4];
    const int kr = kk * 16 + (mat & 1) * 8 + r8, ch = (wn0 + j * 8 + (mat >> 1) * 8) >> 3;
    ldmatrix_x4_trans(r, smem_u32(sb + swz<BN>(kr, ch)));
    b[j][0] = r[0];
    b[j][1] = r[1];
    b[j + 1][0] = r[2];
    b[j + 1][1] = r[3];
  }
}

// The same with both operands k-major: A stored [64][BM] (each k's run of m contiguous) and B [64][BN],
// as the backward filter gets them from NHWC dy and x: ldmatrix .trans for both.
template <class T, int BM, int BN, int TM, int TN>
__device__ __forceinline__ void frags_km_kn(const T* sa, const T* sb, int kk, int wm0, int wn0,
                                            unsigned (&a)[TM][4], unsigned (&b)[TN][2]) {
  const int lane = threadIdx.x & 31, mat = lane >> 3, r8 = lane & 7;
#pragma unroll
  for (int i = 0; i < TM; ++i) {  // matrices: (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15)
    const int kr = kk * 16 + (mat >> 1) * 8 + r8, ch = (wm0 + i * 16 + (mat & 1) * 8) >> 3;
    ldmatrix_x4_trans(a[i], smem_u32(sa + swz<BM>(kr, ch)));
  }
#pragma unroll
  for (int j = 0; j < TN; j += 2) {
    unsigned r[4];
    const int kr = kk * 16 + (mat & 1) * 8 + r8, ch = (wn0 + j * 8 + (mat >> 1) * 8) >> 3;
    ldmatrix_x4_trans(r, smem_u32(sb + swz<BN>(kr, ch)));
    b[j][0] = r[0];
    b[j][1] = r[1];
    b[j + 1][0] = r[2];
    b[j + 1][1] = r[3];
  }
}

template <class T, int TM, int TN>
__device__ __forceinline__ void mma_all(float (&acc)[TM][TN][4], const unsigned (&a)[TM][4], const unsigned (&b)[TN][2]) {
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) MmaOp<T>::run(acc[i][j], a[i], b[j][0], b[j][1]);
}

// acc += the K tiles 0 .. ktiles - 1. smem: STAGES stages of STAGE elements. fill(stage_ptr) copies
// the producer's next K tile (tiles are asked for in order 0, 1, 2, ...) with cp.async and does not
// commit; frags(stage_ptr, kk, a, b) loads step kk's fragments from a stage. The caller waits
// (cp_async_wait<0>) before reusing shared memory. DB: fragments double-buffered (below); without, each
// k16 step loads its fragments and issues its mmas after one wait + barrier + refill per K tile (as
// matmul's pipeline 1), which needs (TM * 4 + TN * 2) fewer registers.
template <class T, int STAGES, int STAGE, bool DB, int TM, int TN, class Fill, class Frags>
__device__ __forceinline__ void pipelined_mainloop(T* smem, int ktiles, Fill& fill, Frags& frags,
                                                   float (&acc)[TM][TN][4]) {
  constexpr int KSTEPS = kPipeBK / 16;
  if (ktiles <= 0) return;
  if (!DB) {
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < ktiles) fill(smem + s * STAGE);
      cp_async_commit();
    }
    for (int kt = 0; kt < ktiles; ++kt) {
      cp_async_wait<STAGES - 2>();  // tile kt has landed (for this thread) ...
      __syncthreads();              // ... for every thread; and every warp is done with tile kt - 1
      if (kt + STAGES - 1 < ktiles) fill(smem + ((kt + STAGES - 1) % STAGES) * STAGE);
      cp_async_commit();
      const T* st = smem + (kt % STAGES) * STAGE;
#pragma unroll
      for (int kk = 0; kk < KSTEPS; ++kk) {
        unsigned a[TM][4], b[TN][2];
        frags(st, kk, a, b);
        mma_all<T>(acc, a, b);
      }
    }
    return;
  }
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ktiles) fill(smem + s * STAGE);
    cp_async_commit();  // (possibly empty: the group count stays uniform)
  }
  cp_async_wait<STAGES - 2>();  // tile 0 has landed (for this thread) ...
  __syncthreads();              // ... for every thread
  unsigned fa[2][TM][4], fb[2][TN][2];
  int rd = 0;  // the stage being read
  frags(smem, 0, fa[0], fb[0]);
  for (int kt = 0; kt < ktiles; ++kt) {
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
      if (kk == KSTEPS - 1) {
        // Tile kt + 1 has landed, and after this barrier no warp reads tile kt's stage again (its last
        // fragments are in registers): iteration kt + 1 refills it.
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        rd = rd + 1 == STAGES ? 0 : rd + 1;
      }
      // the next step's fragments: kk + 1 here, or step 0 of the next stage (after the last tile: stale
      // shared data, loaded and never used)
      frags(smem + rd * STAGE, (kk + 1) % KSTEPS, fa[(kk + 1) & 1], fb[(kk + 1) & 1]);
      if (kk == 0) {
        // refill the stage tile kt - 1 used (every warp passed iteration kt - 1's barrier since)
        if (kt + STAGES - 1 < ktiles) fill(smem + ((kt + STAGES - 1) % STAGES) * STAGE);
        cp_async_commit();
      }
      mma_all<T>(acc, fa[kk & 1], fb[kk & 1]);
    }
  }
}

}  // namespace mma
}  // namespace pydnn
