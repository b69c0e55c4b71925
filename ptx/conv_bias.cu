// ConvolutionBackwardBias: db[c] = alpha * sum of dy[n, c, d, h, w] over n, d, h, w (+ beta * db[c]).
//
// One block per channel (a grid-stride loop over channels), each a fixed-order sum: every thread adds the
// vectors it visits in an order set by the shape alone (kUnroll independent accumulators, combined in a fixed
// order), then the block's tree sum; no atomics, so the result is bitwise reproducible run to run.
//
// The host (ops/convolution/bias.py) merges the four reduced dims (n, d, h, w) where their strides allow and
// passes them as 4 sizes, innermost last: p.inner[0..3], strides p.in_stride[0], [2], [3], [4] (p.in_stride[1]
// is the channel's). An NCHW tensor becomes (1, 1, N, D*H*W) with the last stride 1: rows of D*H*W contiguous
// elements, read V at a time (16 bytes) when V > 1 (the host checks the row length, every stride and the
// pointer let a vector never cross a row and stay 16-byte aligned). The flat index e over the channel's
// p.count elements is decomposed per vector (32-bit division when the count fits).
#include "common/params.h"
#include "common/types.cuh"
#include "convolution_params.h"

namespace pydnn {
namespace conv {

constexpr int kBiasThreads = 512;
constexpr int kBiasUnroll = 4;

template <class T, int V>
struct alignas(sizeof(T) * V) BiasVec {
  T v[V];
};

template <class T, int V, class Acc, class I>
__device__ __forceinline__ Acc bias_vec_sum(const T* base, I e, const ConvAuxParams& p) {
  const I L = (I)p.inner[3];
  I row = e / L;
  const I j = e - row * L;
  const I i2 = row % (I)p.inner[2];
  row /= (I)p.inner[2];
  const I i1 = row % (I)p.inner[1];
  const I i0 = row / (I)p.inner[1];
  const long long off = (long long)i0 * p.in_stride[0] + (long long)i1 * p.in_stride[2] +
                        (long long)i2 * p.in_stride[3] + (long long)j * p.in_stride[4];
  if (V == 1) return load<Acc>(base[off]);
  const BiasVec<T, V> q = *reinterpret_cast<const BiasVec<T, V>*>(base + off);
  Acc s = Acc(0);
#pragma unroll
  for (int i = 0; i < V; ++i) s += load<Acc>(q.v[i]);
  return s;
}

template <class T, int V, class Acc, class I>
__device__ __forceinline__ Acc bias_thread_sum(const T* base, const ConvAuxParams& p) {
  const I nvec = (I)(p.count / V);
  Acc s[kBiasUnroll];
#pragma unroll
  for (int u = 0; u < kBiasUnroll; ++u) s[u] = Acc(0);
  I v = (I)threadIdx.x;
  for (; v + (I)(kBiasUnroll - 1) * kBiasThreads < nvec; v += (I)kBiasUnroll * kBiasThreads) {
#pragma unroll
    for (int u = 0; u < kBiasUnroll; ++u) s[u] += bias_vec_sum<T, V, Acc, I>(base, (v + (I)u * kBiasThreads) * V, p);
  }
  // at most kBiasUnroll - 1 vectors left (in the same order for a given shape)
#pragma unroll
  for (int u = 0; u < kBiasUnroll - 1; ++u) {
    const I w = v + (I)u * kBiasThreads;
    if (w < nvec) s[u] += bias_vec_sum<T, V, Acc, I>(base, w * V, p);
  }
  Acc t = Acc(0);
#pragma unroll
  for (int k = 0; k < kBiasUnroll; ++k) t += s[k];
  return t;
}

// V: elements per load (16 / sizeof(T), or 1 for the general path).
template <class T, int V>
__global__ void __launch_bounds__(kBiasThreads) bias_grad_rows(const ConvAuxParams p) {
  typedef typename AccOf<T>::type Acc;
  __shared__ Acc part[kBiasThreads];
  const T* dy = static_cast<const T*>(p.in);
  const bool narrow = p.count <= 0x7fffffffLL;
  for (long long c = blockIdx.x; c < p.channels; c += gridDim.x) {
    const T* base = dy + c * p.in_stride[1];
    part[threadIdx.x] = narrow ? bias_thread_sum<T, V, Acc, unsigned>(base, p)
                               : bias_thread_sum<T, V, Acc, unsigned long long>(base, p);
    __syncthreads();
    for (int w = kBiasThreads / 2; w > 0; w >>= 1) {
      if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      T* out = static_cast<T*>(p.out);
      const long long off = c * p.out_stride[1];
      Acc v = (Acc)p.alpha * part[0];
      if (p.flags & PYDNN_FLAG_BETA) v += (Acc)p.beta * load<Acc>(out[off]);
      out[off] = store<T>(v);
    }
    __syncthreads();
  }
}

}  // namespace conv
}  // namespace pydnn
