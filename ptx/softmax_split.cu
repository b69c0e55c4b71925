// Softmax forward of few long contiguous rows over a thread-block cluster (sm_90): row_split_fwd, a unit
// of its own (softmax.split.<t>); softmax.cu is included for its fragments, splits and reductions, so that
// adding this kernel neither changes nor recompiles the family's units.
//
// Why: one row is one block in row_fwd / row_loop_fwd, one SM of the GPU; the issue-20 sweep (H200) had
// softmax 1 x 65536 fp32 at 0.75x PyTorch and 1 x 16384 bf16 at 0.78x. Here a row's whole vectors are cut
// into CL consecutive chunks, block `rank` of the row's cluster holding chunk `rank` in registers (ITEMS
// vectors a thread, -inf past the chunk, as row_fwd); the head / tail elements (fewer than VEC each, the
// row's misalignment) belong to rank 0's threads. The row max and the sum of exps are reduced in each
// block, then every block reads the CL block results from the others' shared memory (distributed shared
// memory, in rank order: every block gets the same bits) between cluster barriers. No workspace.
#include "softmax.cu"

namespace pydnn {
namespace softmax {

__device__ __forceinline__ void split_cluster_sync() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

__device__ __forceinline__ unsigned split_cluster_rank() {
  unsigned r = 0;
#if __CUDA_ARCH__ >= 900
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#endif
  return r;
}

// The float at the address `p` has in our shared memory, in the shared memory of cluster block `rank`.
__device__ __forceinline__ float split_ld_dsmem(const float* p, unsigned rank) {
  float v = 0.0f;
#if __CUDA_ARCH__ >= 900
  unsigned a, r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(r) : "memory");
#endif
  return v;
}

// Grid: rows * CL blocks (the row's cluster: blocks row * CL .. row * CL + CL - 1), blockDim.x a power of two
// from 128 to 1024 with CL * ITEMS * blockDim.x >= the row's whole vectors (the host's checks).
template <class T, int VEC, int ITEMS, int K, int CL>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(1024) row_split_fwd(const SoftmaxParams p) {
  typedef typename AccOf<T>::type A;
  static_assert(sizeof(A) == 4, "float arithmetic (f32, f16, bf16 data) only");
  typedef Frag<T, VEC> F;
  __shared__ A sm_max[32], sm_sum[32];
  __shared__ A part[2];
  const unsigned rank = split_cluster_rank();
  const int B = blockDim.x, t = threadIdx.x;
  const i64 row = blockIdx.x / CL;
  const bool blend = p.flags & PYDNN_FLAG_BETA;
  const A alpha = (A)p.alpha, beta = (A)p.beta;
  i64 off[2];
  row_offsets<2>(p, row, off);
  const T* x = (const T*)p.in0 + off[1];
  T* y = (T*)p.out + off[0];
  const Split<int> sp = split<T, VEC>(x, (int)p.len);
  const int chunk = (sp.nvec + CL - 1) / CL;
  const int lo = (int)rank * chunk, hi = min(sp.nvec, lo + chunk);
  F v[ITEMS];
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int i = lo + t + k * B;
    v[k].fill(Bits<T>::neg_inf);
    if (i < hi) v[k].load(x + sp.head + i * VEC);
  }
  int xi = -1;
  A xe = neg_inf<A>();
  if constexpr (VEC > 1) {
    xi = extra_index<VEC>(sp, t, rank == 0);
    if (xi >= 0) xe = pydnn::load<A>(x[xi]);
  }
  A f[ITEMS][VEC];
  A m = xe;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    v[k].get(f[k]);
#pragma unroll
    for (int e = 0; e < VEC; ++e) m = amax(m, f[k][e]);
  }
  m = group_reduce<true>(m, B, sm_max);
  if (t == 0) part[0] = m;
  split_cluster_sync();
  m = split_ld_dsmem(&part[0], 0);
#pragma unroll
  for (int r = 1; r < CL; ++r) m = amax(m, split_ld_dsmem(&part[0], r));
  A s = 0;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k)
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const A z = f[k][e] - m, ex = exp_of<T>(z, K == kFast);
      s += ex;
      f[k][e] = K == kLog ? z : ex;
    }
  if constexpr (VEC > 1) {
    const A z = xe - m, ex = exp_of<T>(z, K == kFast);
    s += ex;
    xe = K == kLog ? z : ex;
  }
  s = group_reduce<false>(s, B, sm_sum);
  if (t == 0) part[1] = s;
  split_cluster_sync();
  s = split_ld_dsmem(&part[1], 0);
#pragma unroll
  for (int r = 1; r < CL; ++r) s += split_ld_dsmem(&part[1], r);
  const A c = K == kLog ? m_log(s) : alpha / s;
  T* yv = y + sp.head;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int i = lo + t + k * B;
    if (i < hi) {
      A o[VEC];
#pragma unroll
      for (int e = 0; e < VEC; ++e) o[e] = fwd_out<K == kLog>(f[k][e], c, alpha);
      if (blend) {
        F old;
        old.load(yv + i * VEC);
        A b[VEC];
        old.get(b);
#pragma unroll
        for (int e = 0; e < VEC; ++e) o[e] += beta * b[e];
      }
      F r;
      r.set(o);
      r.store(yv + i * VEC);
    }
  }
  if (xi >= 0) {
    A o = fwd_out<K == kLog>(xe, c, alpha);
    if (blend) o += beta * pydnn::load<A>(y[xi]);
    y[xi] = pydnn::store<T>(o);
  }
  split_cluster_sync();  // no block leaves while another may still read its part[]
}

}  // namespace softmax
}  // namespace pydnn
