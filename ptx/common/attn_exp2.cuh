// exp2 on the FMA pipe (FlashAttention-4's trick), shared by the warp-specialized forward (ptx/attention_ws.cu
// softmax_emu) and backward (ptx/attention_ws_bwd.cu, VAR's EMU eighths).
#pragma once

namespace pydnn {
namespace attn {

// 2^x for x from an unmasked tile (finite; clamped at -126, where 2^x is a denormal's worth, not 0: never on a
// masked tile, whose -inf must give 0). Round-to-nearest by the 1.5 x 2^23 magic add, 2^f on [-0.5, 0.5] by a
// degree-3 polynomial (relative error 7.5e-5, fitted in float32: below half an ulp of f16's 11 bits and bf16's 8,
// the 16-bit operand it feeds), the integer part added into the exponent field. 3 FADD + 3 FFMA + FMNMX + one
// integer op against one MUFU.EX2 (16 a clock an SM, 8 clocks a warp instruction on a sub-partition).
// (emulated in float32 by tests/ops/attention/test_attention_ws_q2_cpu.py)
__device__ __forceinline__ float exp2_poly(float x) {
  x = fmaxf(x, -126.f);
  const float t = x + 12582912.f;  // 1.5 x 2^23: t's low mantissa bits hold round(x) in two's complement
  const float f = x - (t - 12582912.f);
  float p = fmaf(0.0551716685295105f, f, 0.24261115491390228f);
  p = fmaf(p, f, 0.6932609677314758f);
  p = fmaf(p, f, 0.9999280571937561f);
  return __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
}

}  // namespace attn
}  // namespace pydnn
