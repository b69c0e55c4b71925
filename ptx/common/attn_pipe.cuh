// Warp-specialization plumbing for the attention kernels (ptx/attention_ws.cu): shared-memory mbarriers
// (init, arrive, parity wait), the cp.async arrive-on that completes a barrier phase when a thread's
// copies land, named barriers (bar.sync / bar.arrive with a thread count) and setmaxnreg. sm_90 (the
// setmaxnreg form needs sm_90a). The attention family's own, minimal set; the gemm family's
// ptx/common/tma.cuh (TMA + mbarrier) covers the same ground with TMA and may replace it on a merge.
//
// Phase convention (as CUTLASS's pipelines): a barrier of a ring stage starts in phase 0; a consumer of
// the k-th use of the stage (k = 0, 1, ...) waits for parity k & 1 of its "full" barrier, the producer
// waits for parity (k & 1) ^ 1 of its "empty" barrier (on a fresh barrier, waiting for parity 1 - the
// phase before the first - returns at once).
#pragma once

namespace pydnn {
namespace attn {

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// One arrival (release: this thread's earlier shared-memory accesses happen before the phase completes).
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// One arrival when every cp.async this thread issued so far has landed (counted in the barrier's init
// count: .noinc).
__device__ __forceinline__ void mbar_arrive_cp_async(unsigned bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Returns when the phase of parity `parity` has completed (acquire).
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred P1;\nLAB_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@P1 bra DONE;\nbra LAB_WAIT;\nDONE:\n}\n" ::"r"(bar), "r"(parity) : "memory");
}

// Named barrier `id` (1..15; 0 is __syncthreads) over `count` threads (a multiple of 32): sync waits,
// arrive does not.
__device__ __forceinline__ void bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// The warpgroup's per-thread register budget (every thread of the warpgroup executes it).
template <int N> __device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

}  // namespace attn
}  // namespace pydnn
