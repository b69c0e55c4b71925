// Double-precision GEMM on the CUDA cores (pydnn/ops/rnn/gemm_f64.py): the RNN family's double path (pydnn's
// matmul has no double kernel), written to matmul's formula and conventions (ptx/gemm_f64_params.h) so that
// pydnn.matmul could take it for its double case.
//
//   dgemm<TA, TB>   one 64 x 64 tile of C_z per block (grid: m tiles, n tiles, batch), 256 threads of 4 x 4
//                   outputs each (rows ty + 16 r, columns tx + 16 c: the stores of a warp's half are 16
//                   consecutive doubles); K in steps of 16 through shared memory, each operand tile loaded with
//                   the thread index running along its contiguous dimension (coalesced for either transpose).
// Products are summed in k order per 16-step (fma), each output once: the result does not depend on the grid.
#include "common/types.cuh"
#include "gemm_f64_params.h"

namespace pydnn {
namespace gemm_f64 {

constexpr int kBM = 64, kBN = 64, kBK = 16, kThreads = 256;

template <int TA, int TB>
__global__ void __launch_bounds__(kThreads) dgemm(const GemmF64Params p) {
  __shared__ double As[kBK][kBM + 1];
  __shared__ double Bs[kBK][kBN + 1];
  const i64 z = blockIdx.z;
  const double* a = p.a + z * p.stride_a;
  const double* b = p.b + z * p.stride_b;
  double* c = p.c + z * p.stride_c;
  const int i0 = blockIdx.x * kBM, j0 = blockIdx.y * kBN;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  double acc[4][4];
#pragma unroll
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[r][q] = 0.0;
  for (int k0 = 0; k0 < p.k; k0 += kBK) {
#pragma unroll
    for (int e0 = 0; e0 < kBM * kBK; e0 += kThreads) {
      const int e = e0 + tid;
      const int i = TA ? e % kBM : e / kBK, kk = TA ? e / kBM : e % kBK;
      const int gi = i0 + i, gk = k0 + kk;
      double v = 0.0;
      if (gi < p.m && gk < p.k) v = TA ? a[(i64)gk * p.lda + gi] : a[(i64)gi * p.lda + gk];
      As[kk][i] = v;
    }
#pragma unroll
    for (int e0 = 0; e0 < kBN * kBK; e0 += kThreads) {
      const int e = e0 + tid;
      const int j = TB ? e / kBK : e % kBN, kk = TB ? e % kBK : e / kBN;
      const int gj = j0 + j, gk = k0 + kk;
      double v = 0.0;
      if (gj < p.n && gk < p.k) v = TB ? b[(i64)gj * p.ldb + gk] : b[(i64)gk * p.ldb + gj];
      Bs[kk][j] = v;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      double av[4], bv[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) av[r] = As[kk][ty + 16 * r];
#pragma unroll
      for (int q = 0; q < 4; ++q) bv[q] = Bs[kk][tx + 16 * q];
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[r][q] = fma(av[r], bv[q], acc[r][q]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int gi = i0 + ty + 16 * r;
    if (gi >= p.m) continue;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int gj = j0 + tx + 16 * q;
      if (gj >= p.n) continue;
      double* o = c + (i64)gi * p.ldc + gj;
      double v = p.alpha * acc[r][q];
      if (p.flags & PYDNN_GEMM_F64_FLAG_BETA) v += p.beta * *o;
      if (p.flags & PYDNN_GEMM_F64_FLAG_BIAS) v += p.bias[gj];
      *o = v;
    }
  }
}

}  // namespace gemm_f64
}  // namespace pydnn
