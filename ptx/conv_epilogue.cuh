// The convolution kernels' shared epilogue arithmetic (ptx/convolution.cu, ptx/conv_grouped.cu): the
// activations of ConvolutionBiasActivationForward and the per-value epilogue (alpha, beta, z, bias, act).
#pragma once

#include "common/params.h"
#include "common/types.cuh"
#include "convolution_params.h"

namespace pydnn {
namespace conv {

// The activation ACT (PYDNN_CONV_ACT_*) of one value; activate() picks it from p.act.
template <int ACT, class Acc> __device__ __forceinline__ Acc activate_as(const ConvParams& p, Acc v) {
  const bool nan = v != v;
  switch (ACT) {
    case PYDNN_CONV_ACT_RELU:
      if (nan) return (p.flags & PYDNN_FLAG_NAN_PROP) ? v : Acc(0);
      return v > Acc(0) ? v : Acc(0);
    case PYDNN_CONV_ACT_CLIPPED_RELU:
      if (nan) return (p.flags & PYDNN_FLAG_NAN_PROP) ? v : Acc(0);
      return v > Acc(0) ? (v < Acc(p.coef) ? v : Acc(p.coef)) : Acc(0);
    case PYDNN_CONV_ACT_SIGMOID: return sigmoid(v);
    case PYDNN_CONV_ACT_TANH: return m_tanh(v);
    case PYDNN_CONV_ACT_ELU: return v > Acc(0) ? v : Acc(p.coef) * m_expm1(v);
    default: return v;
  }
}

template <class Acc> __device__ __forceinline__ Acc activate(const ConvParams& p, Acc v) {
  switch (p.act) {
    case PYDNN_CONV_ACT_RELU: return activate_as<PYDNN_CONV_ACT_RELU>(p, v);
    case PYDNN_CONV_ACT_CLIPPED_RELU: return activate_as<PYDNN_CONV_ACT_CLIPPED_RELU>(p, v);
    case PYDNN_CONV_ACT_SIGMOID: return activate_as<PYDNN_CONV_ACT_SIGMOID>(p, v);
    case PYDNN_CONV_ACT_TANH: return activate_as<PYDNN_CONV_ACT_TANH>(p, v);
    case PYDNN_CONV_ACT_ELU: return activate_as<PYDNN_CONV_ACT_ELU>(p, v);
    default: return v;
  }
}

// The activation of N values with one switch (not one per value: a switch per element, unrolled over a
// warp tile's accumulators, is what made the fused epilogue's code ~10x its main loop's).
template <int N> __device__ __forceinline__ void activate_n(const ConvParams& p, float (&v)[N]) {
#define PYDNN_CONV_ACT_CASE(A)                                           \
  case A:                                                                \
    _Pragma("unroll") for (int e = 0; e < N; ++e) v[e] = activate_as<A>(p, v[e]); \
    break;
  switch (p.act) {
    PYDNN_CONV_ACT_CASE(PYDNN_CONV_ACT_RELU)
    PYDNN_CONV_ACT_CASE(PYDNN_CONV_ACT_CLIPPED_RELU)
    PYDNN_CONV_ACT_CASE(PYDNN_CONV_ACT_SIGMOID)
    PYDNN_CONV_ACT_CASE(PYDNN_CONV_ACT_TANH)
    PYDNN_CONV_ACT_CASE(PYDNN_CONV_ACT_ELU)
    default: break;
  }
#undef PYDNN_CONV_ACT_CASE
}

// z's offset of output pixel `pix` (the pixels of y's dims in order: n, d, h, w), channel 0: the fused forward's z in
// any strides of y's dims (p.out_size, p.zs)
__device__ __forceinline__ long long z_pixel_offset(const ConvParams& p, long long pix) {
  long long r = pix;
  const int ow = (int)(r % p.out_size[2]);
  r /= p.out_size[2];
  const int oh = (int)(r % p.out_size[1]);
  r /= p.out_size[1];
  const int od = (int)(r % p.out_size[0]);
  return (r / p.out_size[0]) * p.zs[0] + od * p.zs[2] + oh * p.zs[3] + ow * p.zs[4];
}

// out[off] = alpha * v (+ beta * out[off]); forward also (+ alpha2 * z[zoff]) (+ bias[ch]), then act.
template <bool FWD, class T, class Acc>
__device__ __forceinline__ Acc epilogue_value(const ConvParams& p, const T* out, long long off, long long zoff, int ch,
                                              Acc v, Acc alpha, Acc beta, Acc alpha2) {
  v *= alpha;
  if (p.flags & PYDNN_FLAG_BETA) v += beta * load<Acc>(out[off]);
  if (FWD) {
    if (p.flags & PYDNN_CONV_FLAG_Z) v += alpha2 * load<Acc>(static_cast<const T*>(p.z)[zoff]);
    if (p.flags & PYDNN_CONV_FLAG_BIAS) v += load<Acc>(static_cast<const T*>(p.bias)[ch * p.bias_stride]);
    v = activate(p, v);
  }
  return v;
}

}  // namespace conv
}  // namespace pydnn
