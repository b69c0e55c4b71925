// The attention backward's two memory passes around the dK / dV kernel, in 16-byte accesses (units
// attention.prep.<tag>, every arch; the host side is pydnn/ops/attention.py's attention_backward,
// tuning.attention_bwd.PREP_VEC). Same results as attention.cu's bwd_pre / bwd_dq_convert (dsum's fp32
// additions in another order):
//   bwd_pre_v<T, D>         dsum = rowsum(dO * O) per query row, and (atomic dQ) the fp32 accumulator zeroed
//   bwd_dq_convert_v<T, D>  dQ = scale * the fp32 accumulator, in dQ's type and strides; rows past len_q 0
// Why (counted, before a GPU run): attention.cu's forms give each warp one row and each lane one 4-byte
// load of O and of dO (d 64: 128 bytes a warp in flight, 16 KiB an SM at 2048 threads) or one 8-byte load
// of the accumulator: about half of what an H200 SM needs in flight to reach HBM's rate (~4.8 TB/s x ~0.8 us /
// 132 SMs = ~29 KiB). These passes move 14 d + 4 bytes a (query row, head) (O, dO 2 d each, the zeroed
// accumulator 4 d, its read 4 d, dQ 2 d): at b32 s512 h32/32 d64 causal 470 MB, ~100 us at 4.8 TB/s, against
// ~400 us of cuDNN's whole backward there. Here a row is D / 8 lanes (a power of two: 8, 16 (d 96: 12 of 16
// live), 32), each lane RPT rows apart, every load of a thread issued before the first use (RPT x 32 bytes of
// O / dO, RPT x 32 bytes of the accumulator in flight a thread), the zeros and dsum as whole-block runs.
// Measured (session 32 mid-session run, H200, b32 s512 h32/32 d64, torch.profiler): bwd_pre 0.124 -> bwd_pre_v
// 0.069 ms, bwd_dq_convert 0.099 -> bwd_dq_convert_v 0.049 ms (270 / 201 MB: ~3.9 / ~4.1 TB/s; cuDNN's own two
// passes there 0.069-0.071 / 0.058 ms); the whole backward 0.754 -> 0.853x cuDNN there (tools/PERF.md, session 32).
#include "common/types.cuh"
#include "common/attn_problem.cuh"
#include "attention_params.h"

namespace pydnn {
namespace attn_prep {

using attn::at;
using attn::Seq;
using attn::seq_of;

constexpr int kThreads = 256;
constexpr int kRpt = 4;  // rows a thread

template <int D> struct Prep {
  static constexpr int CH = D / 8;                                 // 16-byte chunks of a 16-bit row
  static constexpr int TPR = CH <= 8 ? 8 : (CH <= 16 ? 16 : 32);   // lanes a row
  static constexpr int RSTEP = kThreads / TPR;                     // rows of a block at one k
  static constexpr int ROWS = RSTEP * kRpt;                        // rows a block (pydnn/ops/attention.py PREP_ROWS)
  static_assert(D % 8 == 0 && CH <= 32, "prep: head dim");
};

__device__ __forceinline__ float dot8(uint4 a, uint4 b, bf16_t) {
  const unsigned x[4] = {a.x, a.y, a.z, a.w}, y[4] = {b.x, b.y, b.z, b.w};
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i)
    s += __uint_as_float(x[i] << 16) * __uint_as_float(y[i] << 16) +
         __uint_as_float(x[i] & 0xffff0000u) * __uint_as_float(y[i] & 0xffff0000u);
  return s;
}
__device__ __forceinline__ float dot8(uint4 a, uint4 b, half_t) {
  const unsigned x[4] = {a.x, a.y, a.z, a.w}, y[4] = {b.x, b.y, b.z, b.w};
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    half_t x0, x1, y0, y1;
    x0.bits = (unsigned short)(x[i] & 0xffff); x1.bits = (unsigned short)(x[i] >> 16);
    y0.bits = (unsigned short)(y[i] & 0xffff); y1.bits = (unsigned short)(y[i] >> 16);
    s += to_float(x0) * to_float(y0) + to_float(x1) * to_float(y1);
  }
  return s;
}

// rows are (b, h, i) in dsum's dense order; the block's ROWS rows [r0, r0 + ROWS)
template <class T, int D>
__global__ void __launch_bounds__(kThreads) bwd_pre_v(const AttnParams p) {
  using P = Prep<D>;
  const long long rows = (long long)p.batch * p.heads_q * p.seq_q;
  const long long r0 = (long long)blockIdx.x * P::ROWS;
  const int c = threadIdx.x % P::TPR, rs = threadIdx.x / P::TPR;
  uint4 vo[kRpt], vd[kRpt];
#pragma unroll
  for (int k = 0; k < kRpt; ++k) {
    const long long row = r0 + k * P::RSTEP + rs;
    vo[k] = vd[k] = make_uint4(0u, 0u, 0u, 0u);
    if (row < rows && c < P::CH) {
      const int i = (int)(row % p.seq_q), h = (int)((row / p.seq_q) % p.heads_q);
      const int b = (int)(row / ((long long)p.seq_q * p.heads_q));
      const T* go = at<T>(p.o, p, PYDNN_ATTN_T_O, b, h) + (long long)i * p.stride[PYDNN_ATTN_T_O][2];
      const T* gd = at<T>(p.dout, p, PYDNN_ATTN_T_DO, b, h) + (long long)i * p.stride[PYDNN_ATTN_T_DO][2];
      vo[k] = *reinterpret_cast<const uint4*>(go + 8 * c);
      vd[k] = *reinterpret_cast<const uint4*>(gd + 8 * c);
    }
  }
  if (p.dq_acc) {  // atomic dQ: the block's rows of the fp32 accumulator (dense [row][D]) start at zero
    float4* z = reinterpret_cast<float4*>(p.dq_acc + r0 * D);
    const long long n = (min(rows - r0, (long long)P::ROWS) * D) / 4;
#pragma unroll
    for (int k = 0; k < P::ROWS * D / 4 / kThreads; ++k) {
      const int e = k * kThreads + threadIdx.x;
      if (e < n) z[e] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
#pragma unroll
  for (int k = 0; k < kRpt; ++k) {
    float acc = dot8(vo[k], vd[k], T());
#pragma unroll
    for (int s = P::TPR / 2; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s);
    const long long row = r0 + k * P::RSTEP + rs;
    if (c == 0 && row < rows) {
      const int i = (int)(row % p.seq_q), b = (int)(row / ((long long)p.seq_q * p.heads_q));
      p.dsum[row] = i < seq_of(p, b).len_q ? acc : 0.f;
    }
  }
}

template <class T> __device__ __forceinline__ uint4 pack8(float4 a, float4 b, float m) {
  return make_uint4(pack16x2<T>(a.x * m, a.y * m), pack16x2<T>(a.z * m, a.w * m), pack16x2<T>(b.x * m, b.y * m),
                    pack16x2<T>(b.z * m, b.w * m));
}

// dQ = scale * dq_acc (fp32, dense [b][h][i][D]) -> T with dQ's strides; rows past the length -> 0.
template <class T, int D>
__global__ void __launch_bounds__(kThreads) bwd_dq_convert_v(const AttnParams p) {
  using P = Prep<D>;
  const long long rows = (long long)p.batch * p.heads_q * p.seq_q;
  const long long r0 = (long long)blockIdx.x * P::ROWS;
  const int c = threadIdx.x % P::TPR, rs = threadIdx.x / P::TPR;
  float4 va[kRpt], vb[kRpt];
#pragma unroll
  for (int k = 0; k < kRpt; ++k) {
    const long long row = r0 + k * P::RSTEP + rs;
    va[k] = vb[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (row < rows && c < P::CH) {
      const float4* a = reinterpret_cast<const float4*>(p.dq_acc + row * D + 8 * c);
      va[k] = a[0];
      vb[k] = a[1];
    }
  }
#pragma unroll
  for (int k = 0; k < kRpt; ++k) {
    const long long row = r0 + k * P::RSTEP + rs;
    if (row < rows && c < P::CH) {
      const int i = (int)(row % p.seq_q), h = (int)((row / p.seq_q) % p.heads_q);
      const int b = (int)(row / ((long long)p.seq_q * p.heads_q));
      T* g = (T*)at<T>(p.dq, p, PYDNN_ATTN_T_DQ, b, h) + (long long)i * p.stride[PYDNN_ATTN_T_DQ][2];
      *reinterpret_cast<uint4*>(g + 8 * c) = pack8<T>(va[k], vb[k], i < seq_of(p, b).len_q ? p.scale : 0.f);
    }
  }
}

}  // namespace attn_prep
}  // namespace pydnn
