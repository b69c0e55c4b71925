// Hopper TMA (the tensor memory accelerator) and shared-memory mbarrier building blocks (sm_90; the bulk
// tensor copies and setmaxnreg need a unit compiled for sm_90a, KernelUnit.archs). Owned by the matmul
// family (gemm_tma in ptx/matmul.cu); the attention family's fwd_ws_tma (ptx/attention_ws.cu) includes it too.
//
// A tensor map (CUtensorMap, 128 opaque bytes, 64-byte aligned) describes a global tensor (base address,
// dims, byte strides), the box one copy moves and the shared-memory swizzle; pydnn/_cuda/tensormap.py
// encodes it on the host (cuTensorMapEncodeTiled) and the kernel receives it by value inside its
// `const __grid_constant__` parameter struct (TensorMap below: the same 128 bytes), so the copy
// instruction reads it from parameter space through its generic address.
//
// Pipeline protocol (one producer thread, consumer warpgroups; a ring of STAGES shared stages, each with a
// "full" barrier, arrival count 1, and an "empty" barrier, arrival count = consumer arrivals a stage):
//   producer, stage s, its n-th use (phase bit ph = n & 1): wait(empty[s], ph ^ 1) (a fresh barrier is
//     taken as having completed the phase before its first, so the first use does not wait), then
//     arrive_expect_tx(full[s], bytes) and the copies of that stage, each completing its bytes on full[s];
//   consumer: wait(full[s], ph), read the stage (wgmma), and once its reads are done (wgmma wait)
//     arrive(empty[s]).
// The full barrier's phase completes when the producer arrived and every expected byte landed (the bytes
// of a box partly outside the tensor count too: TMA writes zeros there).
#ifndef PYDNN_COMMON_TMA_CUH
#define PYDNN_COMMON_TMA_CUH

namespace pydnn {
namespace tma {

// The kernel-side view of a CUtensorMap (layout only: the driver's encoding is opaque).
struct __align__(64) TensorMap {
  unsigned long long opaque[16];
};

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// ----------------------------------------------------------------------------- mbarrier (shared::cta)

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// Makes barrier initialisations visible to the async proxy (the TMA unit completing transactions on them)
// and to the other threads (with the barrier that follows).
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}

// One arrival that also raises the phase's expected transaction bytes by `bytes`.
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar),
               "r"(bytes)
               : "memory");
}

// Whether the phase of parity `parity` has completed (try_wait suspends the thread a while before it
// answers no, so a loop of it does not spin hot).
__device__ __forceinline__ bool mbar_try_wait(unsigned bar, unsigned parity) {
  unsigned ok;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(bar), "r"(parity)
      : "memory");
  return ok != 0;
}

__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

// ----------------------------------------------------------------------------- bulk tensor copies

// Brings the tensor map into the constant cache ahead of its first use (one thread).
__device__ __forceinline__ void prefetch_map(const TensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(map)) : "memory");
}

// The box at element coordinates (c0, c1) (c0 along the contiguous dim) of a 2-D map copied to shared
// address `dst` (1024-byte aligned for the 128B swizzle), its bytes completing on barrier `bar`.
__device__ __forceinline__ void load_2d(unsigned dst, const TensorMap* map, unsigned bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}

// As load_2d for a 3-D map (c2: the batch coordinate).
__device__ __forceinline__ void load_3d(unsigned dst, const TensorMap* map, unsigned bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}

// As load_2d for a 4-D map (the attention family's (head dim, sequence, head, batch) tiles).
__device__ __forceinline__ void load_4d(unsigned dst, const TensorMap* map, unsigned bar, int c0, int c1, int c2,
                                        int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// As load_3d, multicast: the box lands at the same shared offset in every CTA of the cluster named in
// `mask` (bit i: CTA rank i), completing its bytes on the barrier at `bar`'s offset in each of them.
__device__ __forceinline__ void load_3d_mc(unsigned dst, const TensorMap* map, unsigned bar, int c0, int c1, int c2,
                                           unsigned short mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%3, %4, %5}], [%2], %6;\n" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "h"(mask)
      : "memory");
}

// ----------------------------------------------------------------------------- clusters

__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// Every thread of every CTA of the cluster (barrier.cluster is .aligned: whole warps, converged).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
}

// One arrival on the barrier at shared offset `bar` of the cluster's CTA `rank` (this CTA's own included).
__device__ __forceinline__ void mbar_arrive_cluster(unsigned bar, unsigned rank) {
  asm volatile(
      "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\nmbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(bar),
      "r"(rank)
      : "memory");
}

// ----------------------------------------------------------------------------- warp specialisation

// Per-thread register budget of the executing warpgroup (every warp of it executes the same one): a
// producer gives registers back, consumers take them (the kernel's launch bound sets the starting count;
// the sum over warpgroups must fit the SM's register file).
template <int N> __device__ __forceinline__ void regs_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void regs_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// Named barrier `id` (1..15; 0 is __syncthreads') over `threads` threads (a multiple of 32).
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace tma
}  // namespace pydnn

#endif
