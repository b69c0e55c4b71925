// Tensor-core building blocks of the convolution kernels (ptx/convolution.cu): shared-memory
// addresses, cp.async with zero fill, ldmatrix, and the warp-level MMA "engine". sm_80 and later.
//
// The tile loops of convolution.cu talk to the engine only through MmaSm80<T>: its fragment types,
// load_a / load_b (from shared memory) and mma(). A Hopper wgmma engine (warpgroup-wide, operands read
// from shared memory descriptors) would be a second engine with the same role; the kernels' producer
// side (implicit-GEMM addressing, cp.async stages) does not change.
//
// mma.m16n8k16 fragment layouts (g = lane / 4, q = lane % 4):
//   A 16 x 16, row major  a[0] (g, 2q..2q+1)  a[1] (g+8, 2q..)  a[2] (g, 2q+8..)  a[3] (g+8, 2q+8..)
//   B 16 x 8 (k x n)      b[0] (k 2q..2q+1, n g)  b[1] (k 2q+8.., n g)
//   C 16 x 8, fp32        c[0..1] (g, 2q..2q+1)   c[2..3] (g+8, 2q..2q+1)
#pragma once

#include "types.cuh"

namespace pydnn {
namespace mma {

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  unsigned r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}

// 16 bytes global -> shared (L2 only); `bytes` 0 writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void cp_async_16(unsigned dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
// 4 bytes global -> shared (through L1: the implicit-GEMM gathers reread neighbouring elements); `valid`
// false writes 4 zero bytes and reads nothing.
__device__ __forceinline__ void cp_async_4(unsigned dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int PENDING> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING));
}

// Four 8 x 8 matrices of 16-bit values; lane l gives the row address of matrix l / 8, row l % 8.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// The same, transposed: lane l receives column l / 4, rows 2 (l % 4) and 2 (l % 4) + 1 of each matrix.
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

template <class T> struct MmaOp;
template <> struct MmaOp<bf16_t> {
  __device__ static __forceinline__ void run(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <> struct MmaOp<half_t> {
  __device__ static __forceinline__ void run(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// The sm_80 engine: a warp computes WM x WN of C (multiples of 16 x 16) in k16 steps from shared tiles
// stored row major with `ld` elements per row: A as [m][k], B as [n][k] (each output column's k run
// contiguous, which is what ldmatrix without .trans turns into the B fragment).
template <class T, int WM, int WN> struct MmaSm80 {
  typedef T Elem;
  static constexpr int TM = WM / 16, TN = WN / 8;
  float acc[TM][TN][4];

  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
  }

  // One k16 step: a_tile / b_tile point at this warp's first row of A and of B, column k0 of the step.
  __device__ __forceinline__ void step(const T* a_tile, const T* b_tile, int ld) {
    const int lane = threadIdx.x & 31;
    unsigned a[TM][4], b[TN][2];
#pragma unroll
    for (int i = 0; i < TM; ++i) {
      const int row = i * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, col = ((lane >> 4) & 1) * 8;
      ldmatrix_x4(a[i], smem_u32(a_tile + row * ld + col));
    }
#pragma unroll
    for (int j = 0; j < TN; j += 2) {
      const int row = j * 8 + (lane & 7) + ((lane >> 4) & 1) * 8, col = ((lane >> 3) & 1) * 8;
      unsigned r[4];
      ldmatrix_x4(r, smem_u32(b_tile + row * ld + col));
      b[j][0] = r[0];
      b[j][1] = r[1];
      b[j + 1][0] = r[2];
      b[j + 1][1] = r[3];
    }
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) MmaOp<T>::run(acc[i][j], a[i], b[j][0], b[j][1]);
  }

  // The same step with B stored [k][n] (each k's run of n contiguous, as NHWC filters give for backward
  // data): ldmatrix .trans turns 8 x 8 blocks of it into the B fragment. b_tile points at row k0, this
  // warp's first column.
  __device__ __forceinline__ void step_kn(const T* a_tile, int lda, const T* b_tile, int ldb) {
    const int lane = threadIdx.x & 31;
    unsigned a[TM][4], b[TN][2];
#pragma unroll
    for (int i = 0; i < TM; ++i) {
      const int row = i * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, col = ((lane >> 4) & 1) * 8;
      ldmatrix_x4(a[i], smem_u32(a_tile + row * lda + col));
    }
#pragma unroll
    for (int j = 0; j < TN; j += 2) {
      const int krow = (lane & 7) + ((lane >> 3) & 1) * 8, col = j * 8 + ((lane >> 4) & 1) * 8;
      unsigned r[4];
      ldmatrix_x4_trans(r, smem_u32(b_tile + krow * ldb + col));
      b[j][0] = r[0];
      b[j][1] = r[1];
      b[j + 1][0] = r[2];
      b[j + 1][1] = r[3];
    }
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) MmaOp<T>::run(acc[i][j], a[i], b[j][0], b[j][1]);
  }

  // The same step with both operands stored k-major: A as [k][m] and B as [k][n] (each k's run of m, or
  // of n, contiguous), as the backward filter's GEMM gets them from NHWC dy and x; ldmatrix .trans makes
  // both fragments. a_tile points at row k0, this warp's first m column; b_tile likewise.
  __device__ __forceinline__ void step_tt(const T* a_tile, int lda, const T* b_tile, int ldb) {
    const int lane = threadIdx.x & 31;
    unsigned a[TM][4], b[TN][2];
#pragma unroll
    for (int i = 0; i < TM; ++i) {  // matrices: (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15)
      const int krow = (lane & 7) + ((lane >> 4) & 1) * 8, col = i * 16 + ((lane >> 3) & 1) * 8;
      ldmatrix_x4_trans(a[i], smem_u32(a_tile + krow * lda + col));
    }
#pragma unroll
    for (int j = 0; j < TN; j += 2) {
      const int krow = (lane & 7) + ((lane >> 3) & 1) * 8, col = j * 8 + ((lane >> 4) & 1) * 8;
      unsigned r[4];
      ldmatrix_x4_trans(r, smem_u32(b_tile + krow * ldb + col));
      b[j][0] = r[0];
      b[j][1] = r[1];
      b[j + 1][0] = r[2];
      b[j + 1][1] = r[3];
    }
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) MmaOp<T>::run(acc[i][j], a[i], b[j][0], b[j][1]);
  }

  // Where acc[i][j][e] sits in the warp's WM x WN tile.
  __device__ __forceinline__ static int row_of(int i, int e) { return i * 16 + (threadIdx.x & 31) / 4 + (e >> 1) * 8; }
  __device__ __forceinline__ static int col_of(int j, int e) { return j * 8 + (threadIdx.x & 3) * 2 + (e & 1); }
};

}  // namespace mma
}  // namespace pydnn
