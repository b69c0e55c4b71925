// Strided backward data (pydnn/ops/convolution/dgrad_phases.py): dx positions split by their residue
// modulo the stride into phases; each phase that some filter tap reaches is a stride-1 backward data
// over a sub-filter, run by the family's tensor-core kernels (ptx/convolution.cu) writing dx through
// strides. The positions of the phases that no tap reaches (a 1x1 stride-2 layer's three phases of four)
// only get dx = beta * dx, or zeros: dgrad_phase_fill, one launch for all of them.
#include "common/params.h"
#include "common/types.cuh"
#include "conv_dgrad_params.h"

namespace pydnn {
namespace conv {

// One thread per (position, chunk) of a dx row (n, d, h): chunks of 8 channels moved as 16 bytes (VEC;
// the host checks channels innermost, C and the other strides multiples of 8, dx 16-byte aligned) or
// single channels; a thread whose position lies in a phase with taps returns at once.
template <class T, int VEC>
__global__ void __launch_bounds__(256) dgrad_phase_fill(const DgradFillParams p) {
  const int e = blockIdx.x * 256 + threadIdx.x;
  const int w = e / p.chunks, ch = e - w * p.chunks, h = blockIdx.y;
  if (w >= p.size[2]) return;
  const bool row_empty = ((p.empty[1] >> (h % p.stride[1])) & 1ull) != 0;
  const bool w_empty = ((p.empty[2] >> (w % p.stride[2])) & 1ull) != 0;
  const bool has_beta = p.flags & PYDNN_FLAG_BETA;
  const float beta = (float)p.beta;
  T* out = static_cast<T*>(p.out);
  const long long nd_count = (long long)p.batch * p.size[0];
  for (long long nd = blockIdx.z; nd < nd_count; nd += gridDim.z) {
    const int d = (int)(nd % p.size[0]);
    const long long n = nd / p.size[0];
    if (!(row_empty || w_empty || ((p.empty[0] >> (d % p.stride[0])) & 1ull))) continue;
    const long long off = n * p.xs[0] + (long long)d * p.xs[2] + (long long)h * p.xs[3] + (long long)w * p.xs[4] +
                          (long long)ch * (VEC ? 8 : p.xs[1]);
    if (VEC) {
      uint4* q = reinterpret_cast<uint4*>(out + off);
      if (!has_beta) {
        *q = make_uint4(0u, 0u, 0u, 0u);
      } else {
        uint4 v = *q;
        T* t = reinterpret_cast<T*>(&v);
#pragma unroll
        for (int i = 0; i < 8; ++i) t[i] = store<T>(beta * load<float>(t[i]));
        *q = v;
      }
    } else {
      out[off] = store<T>(has_beta ? beta * load<float>(out[off]) : 0.f);
    }
  }
}

}  // namespace conv
}  // namespace pydnn
