// Rows with a broadcast row (map_rows), a unit of its own (tensor_ops.rows.<t>, home tensor_ops.<t>: the
// planner names the family's unit); tensor_ops.cu is included for the ops (Scaled, OpAdd, OpMul) and the
// map helpers of common/elementwise.cuh, so that adding this kernel neither changes nor recompiles the
// family's units.
#include "tensor_ops.cu"

namespace pydnn {
namespace tensor {

// ---------------------------------------------------------------------------------------------------------
// Rows with a broadcast row (AddTensor / OpTensor where an input is one row over the output's rows: a bias
// 1 x H onto R x H, issue 20). The collapsed problem is 2-D: size (R, H), every operand contiguous along
// H (stride 1) with its own row stride (0: the broadcast row), H and every row stride a multiple of VEC,
// every pointer 16-byte aligned (the host's checks; else map_strided). The threads of a block are tr x tc
// (tc = the power of two covering H / VEC, at most THREADS: short rows put several rows per block); a
// thread takes one column vector c and ROWS rows tr apart: it loads a broadcast operand's vector once for
// its ROWS rows (map_strided computed every element's offsets from its coordinates and re-read the bias
// each time), the other operands' ROWS vectors with streaming loads, all issued before any is used.
// Grid: x = column tiles * row tiles (one block per (row tile, column tile), the column tile fastest).
template <class TI, class TO, class Op, int VEC, int THREADS, int ROWS>
__global__ void __launch_bounds__(THREADS) map_rows(const MapParams p) {
  typedef typename WiderAcc<typename AccOf<TI>::type, typename AccOf<TO>::type>::type A;
  typedef Vec<TI, VEC> VI;
  typedef Vec<TO, VEC> VO;
  const A alpha = (A)p.alpha, alpha2 = (A)p.alpha2, beta = (A)p.beta;
  const bool blend = p.flags & PYDNN_FLAG_BETA;
  const i64 R = p.size[0];
  const int hv = (int)(p.size[1] / VEC);
  int tc = 1;
  while (tc < hv && tc < THREADS) tc <<= 1;
  const int tr = THREADS / tc, ct = (hv + tc - 1) / tc;
  const int c = (int)(blockIdx.x % (unsigned)ct) * tc + (int)(threadIdx.x & (unsigned)(tc - 1));
  const i64 r0 = (i64)(blockIdx.x / (unsigned)ct) * (tr * ROWS) + (int)(threadIdx.x / (unsigned)tc);
  if (c >= hv) return;
  VI a[ROWS][3];
  VO o[ROWS];
#pragma unroll
  for (int k = 0; k < 3; ++k) {
    if (!(Op::reads & (1u << k))) continue;
    const VI* base = reinterpret_cast<const VI*>(p.in[k]) + c;
    const i64 rs = p.stride[k + 1][0];
    if (rs == 0) {  // the broadcast row: one load (cached: every row tile reads it)
      const VI b = *base;
#pragma unroll
      for (int u = 0; u < ROWS; ++u) a[u][k] = b;
    } else {
#pragma unroll
      for (int u = 0; u < ROWS; ++u) {
        const i64 r = r0 + (i64)u * tr;
        if (r < R) a[u][k] = ld_stream<1>(base + r * (rs / VEC));
      }
    }
  }
  const i64 os = p.stride[0][0] / VEC;
  VO* out = reinterpret_cast<VO*>(p.out) + c;
  if (blend)
#pragma unroll
    for (int u = 0; u < ROWS; ++u) {
      const i64 r = r0 + (i64)u * tr;
      if (r < R) o[u] = ld_stream<1>(out + r * os);
    }
#pragma unroll
  for (int u = 0; u < ROWS; ++u) {
    const i64 r = r0 + (i64)u * tr;
    if (r < R) st_stream<1>(out + r * os, map_vec<TI, TO, Op, VEC, A>(p, a[u], o[u], alpha, alpha2, beta, blend));
  }
}

}  // namespace tensor
}  // namespace pydnn
