// h16_t: a 16-bit float whose format (IEEE half or bfloat16) the launch names at run time, so that one
// instantiation serves both 16-bit types of a kernel whose math is in float and whose 16-bit data are only
// loaded and stored (element-wise, reduction and RNN-cell kernels): half the 16-bit instantiations to compile
// at install (issue 21; tools/PERF.md, "Session 30: install"). The conversions are the same instructions as
// to_float / to_half / to_bf16 / pack16x2 / unpack16x2 (types.cuh), chosen by a launch-uniform flag (`bf`:
// 0 half, 1 bfloat16), so results are bit-identical to the typed instantiations. Not for tensor-core code:
// mma.sync / wgmma name the operand type in the instruction, and a run-time choice there would compile both.
#pragma once
#include "types.cuh"

namespace pydnn {

struct __align__(2) h16_t { unsigned short bits; };

enum { H16_HALF = 0, H16_BF16 = 1 };

__device__ __forceinline__ float h16_to_float(h16_t v, int bf) {
  return bf ? to_float(bf16_t{v.bits}) : to_float(half_t{v.bits});
}
__device__ __forceinline__ h16_t h16_from_float(float f, int bf) {
  return h16_t{bf ? to_bf16(f).bits : to_half(f).bits};
}
// from double (a transform from double data): Store<half_t> / Store<bf16_t>'s own rounding
__device__ __forceinline__ h16_t h16_from_double(double d, int bf) {
  return h16_t{bf ? Store<bf16_t>::from(d).bits : Store<half_t>::from(d).bits};
}
// two values in one 32-bit word (lo in the low half), as pack16x2 / unpack16x2 of the named type
__device__ __forceinline__ unsigned h16_pack2(float lo, float hi, int bf) {
  return bf ? pack16x2<bf16_t>(lo, hi) : pack16x2<half_t>(lo, hi);
}
__device__ __forceinline__ void h16_unpack2(unsigned w, float& lo, float& hi, int bf) {
  if (bf) unpack16x2<bf16_t>(w, lo, hi);
  else unpack16x2<half_t>(w, lo, hi);
}

}  // namespace pydnn
