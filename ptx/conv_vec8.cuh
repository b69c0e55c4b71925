// 8 consecutive 16-bit elements (one 16-byte vector) as floats, and back: the convolution kernels' vector
// helpers (ptx/convolution.cu's staged epilogue, ptx/conv_narrow.cu's streams).
#pragma once

#include "common/types.cuh"

namespace pydnn {
namespace conv {

template <class T> __device__ __forceinline__ void unpack8(const uint4 q, float (&v)[8]) {
  const unsigned w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    T lo, hi;
    lo.bits = (unsigned short)(w[e] & 0xffffu);
    hi.bits = (unsigned short)(w[e] >> 16);
    v[2 * e] = load<float>(lo);
    v[2 * e + 1] = load<float>(hi);
  }
}
template <class T> __device__ __forceinline__ uint4 pack8(const float (&v)[8]) {
  unsigned w[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) w[e] = (unsigned)store<T>(v[2 * e]).bits | ((unsigned)store<T>(v[2 * e + 1]).bits << 16);
  return make_uint4(w[0], w[1], w[2], w[3]);
}
template <class T> __device__ __forceinline__ void load8(const T* src, float (&v)[8]) {
  unpack8<T>(*reinterpret_cast<const uint4*>(src), v);
}
template <class T> __device__ __forceinline__ void store8(T* dst, const float (&v)[8]) {
  *reinterpret_cast<uint4*>(dst) = pack8<T>(v);
}

}  // namespace conv
}  // namespace pydnn
