// 1x1 convolutions with few output channels (K < 8: a segmentation head's 64 -> 2, say), stride 1, no
// padding, one group, half / bfloat16, x and y packed NHWC (pixel p's channels at p * C, p * K): the
// tensor-core paths refuse K % 8 != 0 and the CUDA-core implicit GEMM ran them at 0.05-0.08x cuDNN
// (issue 18's sweep, H200). They are streams over x (or dx), memory-bound (ops/convolution/narrow.py).
//
// G lanes (a power of two, >= C / 8, <= 32) share a pixel: lane `sub` of the group holds channels
// 8 sub .. 8 sub + 7 (one 16-byte vector), so a warp reads 32 / G consecutive pixels as one contiguous
// run; each lane keeps the filter's K x 8 values of its channels in registers. Pixels are walked
// grid-stride, UNROLL at a time (independent 16-byte loads in flight).
//   narrow_fwd    y[p][k] = sum_c x[p][c] w[k][c]: 8 K FMAs a lane, the K sums reduced over the group
//                 by xor shuffles, written by the group's lane 0 through epilogue_value (alpha, beta, the
//                 fused z / bias / activation)
//   narrow_dgrad  dx[p][c] = sum_k dy[p][k] w[k][c] (the group's lanes read the same K values of dy)
//   narrow_wgrad  per warp the K x C sums over its pixels (xor shuffles over the warp's pixel groups),
//                 per block the warps added in warp order through shared memory, one fp32 partial
//                 [block][K][C] a block; narrow_wfold adds the blocks' partials (a warp an element, lanes
//                 strided, a fixed shuffle tree: deterministic) into dw with alpha / beta.
// ConvParams: x (forward: x; backward data: dy; backward filter: dy), w (the filter; backward filter: x),
// out (y, dx, or the partials), cg = C, kg = K, gm = pixels, gn = G, ws (the filter's k, c strides),
// out_size / zs (the fused forward's z offsets), alpha / beta / flags.
#include "common/params.h"
#include "common/types.cuh"
#include "convolution_params.h"
#include "conv_epilogue.cuh"
#include "conv_vec8.cuh"

namespace pydnn {
namespace conv {

// KT: the kernels' register arrays hold KT >= K output channels (1, 2, 4 or 8: the K x 8 filter values,
// K sums; 8 for every K made the forward 128 registers with a spill, 1 block of 256 threads a SM)
constexpr int kNarrowThreads = 256;
constexpr int kNarrowUnroll = 4;

__device__ __forceinline__ uint4 narrow_ldg(const void* src) {
  uint4 r;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(src));
  return r;
}

// the filter's K x 8 values of this lane's channels (zero past K or C)
template <class T, int KT>
__device__ __forceinline__ void narrow_filter(const ConvParams& p, int sub, float (&wr)[KT][8]) {
  const T* w = static_cast<const T*>(p.w);
  const bool lane_ok = sub * 8 < p.cg;
#pragma unroll
  for (int k = 0; k < KT; ++k)
#pragma unroll
    for (int e = 0; e < 8; ++e)
      wr[k][e] = (lane_ok && k < p.kg) ? load<float>(w[(long long)k * p.ws[0] + (long long)(sub * 8 + e) * p.ws[1]]) : 0.f;
}

struct NarrowWalk {  // the grid-stride walk: pixel of step i of a round = base + i * stride + slot
  int sub, slot, per_warp;
  long long base0, stride;
  __device__ __forceinline__ NarrowWalk(int G) {
    const int lane = threadIdx.x & 31;
    sub = lane & (G - 1);
    slot = lane / G;
    per_warp = 32 / G;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    base0 = warp * per_warp;
    stride = warps * per_warp;
  }
};

template <class T, int KT>
__global__ void __launch_bounds__(kNarrowThreads) narrow_fwd(const ConvParams p) {
  const int C = p.cg, K = p.kg, G = p.gn;
  const long long P = p.gm;
  const NarrowWalk wk(G);
  float wr[KT][8];
  narrow_filter<T, KT>(p, wk.sub, wr);
  const T* x = static_cast<const T*>(p.x);
  T* out = static_cast<T*>(p.out);
  const float alpha = (float)p.alpha, beta = (float)p.beta, alpha2 = (float)p.alpha2;
  const bool lane_ok = wk.sub * 8 < C;
  for (long long base = wk.base0; base < P; base += wk.stride * kNarrowUnroll) {
    uint4 q[kNarrowUnroll];
#pragma unroll
    for (int i = 0; i < kNarrowUnroll; ++i) {
      const long long pix = base + i * wk.stride + wk.slot;
      q[i] = (lane_ok && pix < P) ? narrow_ldg(x + pix * C + wk.sub * 8) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < kNarrowUnroll; ++i) {
      const long long pix = base + i * wk.stride + wk.slot;
      float v[8], s[KT];
      unpack8<T>(q[i], v);
#pragma unroll
      for (int k = 0; k < KT; ++k) {
        s[k] = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) s[k] = fmaf(v[e], wr[k][e], s[k]);
      }
      for (int off = G >> 1; off > 0; off >>= 1)
#pragma unroll
        for (int k = 0; k < KT; ++k) s[k] += __shfl_xor_sync(0xffffffffu, s[k], off);
      if (wk.sub == 0 && pix < P) {
        const long long zb = (p.flags & PYDNN_CONV_FLAG_Z) ? z_pixel_offset(p, pix) : 0;
#pragma unroll
        for (int k = 0; k < KT; ++k)
          if (k < K) {
            const long long off = pix * K + k;
            out[off] = store<T>(epilogue_value<true>(p, out, off, zb + k * p.zs[1], k, s[k], alpha, beta, alpha2));
          }
      }
    }
  }
}

template <class T, int KT>
__global__ void __launch_bounds__(kNarrowThreads) narrow_dgrad(const ConvParams p) {
  const int C = p.cg, K = p.kg, G = p.gn;
  const long long P = p.gm;
  const NarrowWalk wk(G);
  float wr[KT][8];
  narrow_filter<T, KT>(p, wk.sub, wr);
  const T* dy = static_cast<const T*>(p.x);
  T* out = static_cast<T*>(p.out);
  const float alpha = (float)p.alpha, beta = (float)p.beta;
  const bool use_beta = p.flags & PYDNN_FLAG_BETA;
  if (wk.sub * 8 >= C) return;  // (no shuffles below)
  for (long long base = wk.base0; base < P; base += wk.stride * kNarrowUnroll) {
    float d[kNarrowUnroll][KT];
#pragma unroll
    for (int i = 0; i < kNarrowUnroll; ++i) {
      const long long pix = base + i * wk.stride + wk.slot;
#pragma unroll
      for (int k = 0; k < KT; ++k) d[i][k] = (k < K && pix < P) ? load<float>(dy[pix * K + k]) : 0.f;
    }
#pragma unroll
    for (int i = 0; i < kNarrowUnroll; ++i) {
      const long long pix = base + i * wk.stride + wk.slot;
      if (pix >= P) continue;
      float v[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float s = 0.f;
#pragma unroll
        for (int k = 0; k < KT; ++k) s = fmaf(d[i][k], wr[k][e], s);
        v[e] = alpha * s;
      }
      uint4* dst = reinterpret_cast<uint4*>(out + pix * C + wk.sub * 8);
      if (use_beta) {
        float o[8];
        unpack8<T>(*dst, o);
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] += beta * o[e];
      }
      *dst = pack8<T>(v);
    }
  }
}

// ConvParams as narrow_fwd but x = dy, w = x (the B operand), out = partials [gridDim.x][K][C] (fp32).
// Dynamic shared memory: K * C floats.
template <class T, int KT>
__global__ void __launch_bounds__(kNarrowThreads) narrow_wgrad(const ConvParams p) {
  extern __shared__ float nw_red[];
  const int C = p.cg, K = p.kg, G = p.gn;
  const long long P = p.gm;
  const NarrowWalk wk(G);
  const T* dy = static_cast<const T*>(p.x);
  const T* x = static_cast<const T*>(p.w);
  const bool lane_ok = wk.sub * 8 < C;
  float acc[KT][8];
#pragma unroll
  for (int k = 0; k < KT; ++k)
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[k][e] = 0.f;
  for (long long base = wk.base0; base < P; base += wk.stride * kNarrowUnroll) {
    uint4 q[kNarrowUnroll];
    float d[kNarrowUnroll][KT];
#pragma unroll
    for (int i = 0; i < kNarrowUnroll; ++i) {
      const long long pix = base + i * wk.stride + wk.slot;
      const bool ok = lane_ok && pix < P;
      q[i] = ok ? narrow_ldg(x + pix * C + wk.sub * 8) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int k = 0; k < KT; ++k) d[i][k] = (ok && k < K) ? load<float>(dy[pix * K + k]) : 0.f;
    }
#pragma unroll
    for (int i = 0; i < kNarrowUnroll; ++i) {
      float v[8];
      unpack8<T>(q[i], v);
#pragma unroll
      for (int k = 0; k < KT; ++k)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[k][e] = fmaf(d[i][k], v[e], acc[k][e]);
    }
  }
  // the warp's pixel groups added (lanes of one sub), then the block's warps in order
  for (int off = G; off < 32; off <<= 1)
#pragma unroll
    for (int k = 0; k < KT; ++k)
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[k][e] += __shfl_xor_sync(0xffffffffu, acc[k][e], off);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int i = threadIdx.x; i < K * C; i += blockDim.x) nw_red[i] = 0.f;
  for (int wv = 0; wv < kNarrowThreads / 32; ++wv) {
    __syncthreads();
    if (warp == wv && lane < G && lane_ok)
#pragma unroll
      for (int k = 0; k < KT; ++k)
        if (k < K)
#pragma unroll
          for (int e = 0; e < 8; ++e) nw_red[k * C + wk.sub * 8 + e] += acc[k][e];
  }
  __syncthreads();
  float* part = static_cast<float*>(p.out) + (long long)blockIdx.x * K * C;
  for (int i = threadIdx.x; i < K * C; i += blockDim.x) part[i] = nw_red[i];
}

// dw[k][c] = alpha * (the partials of every block, added lane-strided then by a fixed shuffle tree) + beta
// * dw[k][c]. ConvAuxParams: in = partials [splits][K][C], out = dw (out_stride: k, c), kg = K, cg = C,
// splits, alpha, beta, flags (PYDNN_FLAG_BETA). One warp an element.
template <class T>
__global__ void __launch_bounds__(256) narrow_wfold(const ConvAuxParams p) {
  const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const int per = p.kg * p.cg;
  if (warp >= per) return;
  const float* part = static_cast<const float*>(p.in) + warp;
  float s = 0.f;
  for (int b = lane; b < p.splits; b += 32) s += part[(long long)b * per];
  for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (lane == 0) {
    const int k = (int)(warp / p.cg), c = (int)(warp % p.cg);
    T* out = static_cast<T*>(p.out);
    const long long off = (long long)k * p.out_stride[0] + (long long)c * p.out_stride[1];
    float v = (float)p.alpha * s;
    if (p.flags & PYDNN_FLAG_BETA) v += (float)p.beta * load<float>(out[off]);
    out[off] = store<T>(v);
  }
}

}  // namespace conv
}  // namespace pydnn
