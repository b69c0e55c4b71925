// Host (g++) stand-in for ptx/common/h16.cuh: h16_t, half or bfloat16 by a run-time flag, through this folder's
// types.cuh conversions (the device header's pack16x2 / unpack16x2 forms are inline PTX; rnn.cu uses neither).
#pragma once
#include "types.cuh"

namespace pydnn {
struct h16_t { unsigned short bits; };
enum { H16_HALF = 0, H16_BF16 = 1 };
inline float h16_to_float(h16_t v, int bf) { return bf ? to_float(bf16_t{v.bits}) : to_float(half_t{v.bits}); }
inline h16_t h16_from_float(float f, int bf) { return h16_t{bf ? to_bf16(f).bits : to_half(f).bits}; }
}  // namespace pydnn
