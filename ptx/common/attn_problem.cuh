// The fused-attention problem as every attention kernel reads it (ptx/attention.cu, attention_wgmma.cu,
// attention_wgmma_bwd.cu): a batch entry's actual lengths and causal offset from AttnParams, the keys a
// block of query rows can see, and a tensor's (batch, head) base pointer through its strides.
#pragma once

#include "attention_params.h"

namespace pydnn {
namespace attn {

// One batch entry: lengths clamped to [0, S] (per-batch lengths or the full ones), causal mask and the
// bottom-right offset (key j visible to query i when j <= i + offset).
struct Seq {
  int len_q, len_kv, offset;
  bool causal;
};

__device__ __forceinline__ Seq seq_of(const AttnParams& p, int b) {
  Seq s;
  s.len_q = p.lens_q ? min(max(p.lens_q[b], 0), p.seq_q) : p.seq_q;
  s.len_kv = p.lens_kv ? min(max(p.lens_kv[b], 0), p.seq_kv) : p.seq_kv;
  s.causal = p.mask != PYDNN_ATTN_KMASK_NONE;
  s.offset = p.mask == PYDNN_ATTN_KMASK_BOTTOM_RIGHT ? s.len_kv - s.len_q : 0;
  return s;
}

// keys [0, n_end) can be visible to query rows [m0, m0 + rows)
__device__ __forceinline__ int key_end(const Seq& s, int m0, int rows) {
  int e = s.len_kv;
  if (s.causal) e = min(e, max(0, m0 + rows + s.offset));
  return e;
}

// Tensor t's (batch b, head h) base: base + b * stride[t][0] + h * stride[t][1] elements.
template <class T> __device__ __forceinline__ const T* at(const void* base, const AttnParams& p, int t, int b, int h) {
  return (const T*)base + (long long)b * p.stride[t][0] + (long long)h * p.stride[t][1];
}

}  // namespace attn
}  // namespace pydnn
