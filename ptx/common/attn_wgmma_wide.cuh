// The m64n176k16 and m64n192k16 wgmmas (shared-memory A and B) for the warp-specialized attention
// forward's wide S tiles (ptx/attention_ws.cu): BN = 176 at d 128 (FlashAttention-3's non-causal d 128
// tile, 128 x 176; tuning.attention.WS_BN176) and BN = 192 at d 64 (tuning.attention.WS_BN192).
// wgmma.cuh instantiates N = 64 / 128 / 256 only; this adds these two beside it (their accumulator lists
// extend wgmma.cuh's 64-register ones), nothing else.
#pragma once

#include "wgmma.cuh"

namespace pydnn {
namespace wgmma {

#define PYDNN_ATTN_WGMMA_DREGS_88 PYDNN_WGMMA_DREGS_64 ", " "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87"
#define PYDNN_ATTN_WGMMA_DOUTS_88 PYDNN_WGMMA_DOUTS_64, "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87])
#define PYDNN_ATTN_WGMMA_DREGS_96 PYDNN_ATTN_WGMMA_DREGS_88 ", " "%88, %89, %90, %91, %92, %93, %94, %95"
#define PYDNN_ATTN_WGMMA_DOUTS_96 PYDNN_ATTN_WGMMA_DOUTS_88, "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
// (N, R = N / 2 registers, then the operand numbers after them as text: da, db, scale_d, TA, TB)
#define PYDNN_ATTN_WGMMA_WIDE(CT, PT, N, R, A0, A1, A2, A3, A4) \
template <int TA, int TB> struct Mma<CT, N, TA, TB> { \
  static __device__ __forceinline__ void run(float (&d)[R], unsigned long long da, unsigned long long db, int scale_d) { \
    asm volatile( \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %" A2 ", 0;\n" \
        "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PT "." PT " " \
        "{" PYDNN_ATTN_WGMMA_DREGS_##R "}, %" A0 ", %" A1 ", p, 1, 1, %" A3 ", %" A4 ";\n}\n" \
        : PYDNN_ATTN_WGMMA_DOUTS_##R \
        : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB)); \
  } \
};
PYDNN_ATTN_WGMMA_WIDE(half_t, "f16", 176, 88, "88", "89", "90", "91", "92")
PYDNN_ATTN_WGMMA_WIDE(bf16_t, "bf16", 176, 88, "88", "89", "90", "91", "92")
PYDNN_ATTN_WGMMA_WIDE(half_t, "f16", 192, 96, "96", "97", "98", "99", "100")
PYDNN_ATTN_WGMMA_WIDE(bf16_t, "bf16", 192, 96, "96", "97", "98", "99", "100")
#undef PYDNN_ATTN_WGMMA_WIDE

}  // namespace wgmma
}  // namespace pydnn
