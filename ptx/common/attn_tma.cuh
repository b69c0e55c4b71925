// The attention family's minimal TMA helpers (ptx/attention_ws.cu's TMA variant): a 4-d tiled tensor map
// passed by value as a __grid_constant__ kernel parameter (encoded on the host by cuTensorMapEncodeTiled,
// pydnn/ops/attention_ws.py), the tiled 4-d load completing on an mbarrier's transaction count, and the
// arrive that sets that count. sm_90. The gemm family's ptx/common/tma.cuh (with its host encoder
// pydnn/_cuda/tensormap.py) covers the same ground; a merge may fold these into it.
#pragma once

namespace pydnn {
namespace attn {

// An encoded CUtensorMap (128 bytes, 64-byte aligned), opaque here.
struct alignas(64) TmaMap {
  unsigned long long v[16];
};

// Arrive on the barrier and add `bytes` to the transaction count its current phase waits for.
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// The box at coordinates (c0 innermost .. c3) of the tensor map into shared memory at dst (the map's
// swizzle applied; out-of-bounds elements zero), completing `bar`'s transaction count by its bytes.
__device__ __forceinline__ void tma_load_4d(unsigned dst, const TmaMap* map, int c0, int c1, int c2, int c3,
                                            unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

}  // namespace attn
}  // namespace pydnn
