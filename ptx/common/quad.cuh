// A 4 x 4 transpose of packed 16-bit pairs over the 4 lanes of a quad (an mma / wgmma accumulator fragment's row):
// lane t's word for 8-column group s -> lane u's word for group t, so that a lane holds one group's 8 columns
// whole and stores them as one 16-byte word (whole 32-byte sectors a warp store instead of half ones).
// The same functions as ptx/matmul.cu's gemm_tma WIDE store (rot4, quad_transpose: measured there on the
// H200), shared here for the convolution's fwd_tma (ptx/conv_tma.cu, ConvTmaParams.wide).
#ifndef PYDNN_COMMON_QUAD_CUH
#define PYDNN_COMMON_QUAD_CUH

namespace pydnn {
namespace quad {

// x[i] <- x[(i + k) & 3] (k lane dependent: two select stages, no indexed registers).
__device__ __forceinline__ void rot4(unsigned (&x)[4], int k) {
  unsigned a[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) a[i] = (k & 1) ? x[(i + 1) & 3] : x[i];
#pragma unroll
  for (int i = 0; i < 4; ++i) x[i] = (k & 2) ? a[(i + 2) & 3] : a[i];
}

// x[s] (this lane t's word for group s of 4) -> x[u] = lane u's word for group t (its own inverse). Every lane
// of the warp must call it (full-mask shuffles).
__device__ __forceinline__ void transpose(unsigned (&x)[4]) {
  const int lane = threadIdx.x & 31, t = lane & 3, qbase = lane & ~3;
  unsigned zr[4] = {x[0], x[3], x[2], x[1]};  // sent as z[d] = x[(t - d) & 3] in round d
  rot4(zr, (4 - t) & 3);
  unsigned y[4];  // round d: from lane (t + d) & 3 its word for group t
#pragma unroll
  for (int d = 0; d < 4; ++d) y[d] = __shfl_sync(0xffffffffu, zr[d], qbase | ((t + d) & 3));
  rot4(y, (4 - t) & 3);
#pragma unroll
  for (int u = 0; u < 4; ++u) x[u] = y[u];
}

}  // namespace quad
}  // namespace pydnn

#endif
