// Convolution forward, GEMM algorithm: the explicit im2col of x into the workspace (see
// conv_gemm_params.h for the column layout). The GEMM that follows is not here: it is the family's
// implicit-GEMM kernel (CUDA cores, or the tensor-core fwd_tc for 16-bit data) run as a 1x1, stride-1
// convolution over the column matrix, so pydnn has one GEMM engine, not two.
//
// grid.x = rows (one output position per block; its coordinates decomposed once), block = a multiple
// of 32 up to 256 threads walking the row's columns: consecutive threads write consecutive columns.
#include "common/types.cuh"
#include "conv_gemm_params.h"

namespace pydnn {
namespace conv_gemm {

template <class T>
__global__ void __launch_bounds__(256) im2col(const Im2colParams p) {
  long long row = blockIdx.x;
  int o[3];
  long long r = row;
  o[2] = (int)(r % p.out_size[2]); r /= p.out_size[2];
  o[1] = (int)(r % p.out_size[1]); r /= p.out_size[1];
  o[0] = (int)(r % p.out_size[0]);
  const int n = (int)(r / p.out_size[0]);
  const T* x = static_cast<const T*>(p.x) + (long long)n * p.xs[0];
  T* col = static_cast<T*>(p.col) + row * p.cols;
  const int per_group = p.cg * p.taps;
  const bool flip = p.flags & PYDNN_IM2COL_FLAG_FLIP;
  for (int j = threadIdx.x; j < p.cols; j += blockDim.x) {
    const int g = j / per_group, jj = j - g * per_group;
    int c, tap;
    if (p.cin_inner) { tap = jj / p.cg; c = jj - tap * p.cg; }
    else { c = jj / p.taps; tap = jj - c * p.taps; }
    int t[3];
    t[2] = tap % p.filt[2]; tap /= p.filt[2];
    t[1] = tap % p.filt[1];
    t[0] = tap / p.filt[1];
    long long off = (long long)(g * p.cg + c) * p.xs[1];
    bool ok = true;
#pragma unroll
    for (int i = 0; i < 3; ++i) {
      const int tt = flip ? p.filt[i] - 1 - t[i] : t[i];
      const int q = o[i] * p.stride[i] - p.pad[i] + tt * p.dil[i];
      ok = ok && (unsigned)q < (unsigned)p.in_size[i];
      off += (long long)q * p.xs[2 + i];
    }
    col[j] = ok ? x[off] : store<T>(0.0f);
  }
}

}  // namespace conv_gemm
}  // namespace pydnn
