// The wgmma attention backwards' shared tile math (ptx/attention_wgmma_bwd.cu bwd_dkdv_wg and
// ptx/attention_ws_bwd.cu bwd_ws: the same accumulator layouts, the same arithmetic, so the same bits).
// A consumer warpgroup owns 64 keys; its S^T / dP^T accumulators (m64nBMk16, BM query columns) hold
// element 4 j + 2 hh + e at key 16 warp + g + 8 hh, query 8 j + 2 q4 + e (g = lane / 4, q4 = lane % 4).
#pragma once

#include "types.cuh"
#include "attn_problem.cuh"

namespace pydnn {
namespace attn {

// dS^T = P^T (dP^T - dsum) into dp (s holds P^T, dt the tile's dsum [BM]), then P^T and dS^T packed to
// 16 bits: pa / da[ks] are the register A fragments of k16 step ks (queries 16 ks ..) of dV += P^T dO,
// dK += dS^T Q.
template <class T, int BM>
__device__ __forceinline__ void bwd_ds_pack(const float (&s)[BM / 2], float (&dp)[BM / 2], const float* dt, int q4,
                                            unsigned (&pa)[BM / 16][4], unsigned (&da)[BM / 16][4]) {
#pragma unroll
  for (int j = 0; j < BM / 8; ++j) {
    const float2 dd = *reinterpret_cast<const float2*>(dt + j * 8 + 2 * q4);
#pragma unroll
    for (int i = 0; i < 4; ++i) dp[4 * j + i] = s[4 * j + i] * (dp[4 * j + i] - ((i & 1) ? dd.y : dd.x));
  }
#pragma unroll
  for (int ks = 0; ks < BM / 16; ++ks)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      pa[ks][c] = pack16x2<T>(s[8 * ks + 2 * c], s[8 * ks + 2 * c + 1]);
      da[ks][c] = pack16x2<T>(dp[8 * ks + 2 * c], dp[8 * ks + 2 * c + 1]);
    }
}

// dK (times p.scale) and dV of the warpgroup's keys wkey.. from their m64nNk16 accumulators (N / 2 floats
// a thread, the first D columns stored) to global memory: row wkey + 16 warp + g + 8 hh, columns 8 j + 2 q4;
// keys past the batch entry's length written as zeros, keys past the tensor skipped.
template <class T, int D, int N>
__device__ __forceinline__ void bwd_store_dkdv(const AttnParams& p, const Seq& sq, int b, int hk, int wkey, int warp,
                                               int g, int q4, const float (&dk)[N], const float (&dv)[N]) {
  T* gdk = const_cast<T*>(at<T>(p.dk, p, PYDNN_ATTN_T_DK, b, hk));
  T* gdv = const_cast<T*>(at<T>(p.dv, p, PYDNN_ATTN_T_DV, b, hk));
  const long long ldk = p.stride[PYDNN_ATTN_T_DK][2], ldv = p.stride[PYDNN_ATTN_T_DV][2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int key = wkey + warp * 16 + g + 8 * hh;
    if (key >= p.seq_kv) continue;
    const bool live = key < sq.len_kv;
    T* rk = gdk + (long long)key * ldk + 2 * q4;
    T* rv = gdv + (long long)key * ldv + 2 * q4;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      *reinterpret_cast<unsigned*>(rk + 8 * j) = live ? pack16x2<T>(dk[4 * j + 2 * hh] * p.scale, dk[4 * j + 2 * hh + 1] * p.scale) : 0u;
      *reinterpret_cast<unsigned*>(rv + 8 * j) = live ? pack16x2<T>(dv[4 * j + 2 * hh], dv[4 * j + 2 * hh + 1]) : 0u;
    }
  }
}

}  // namespace attn
}  // namespace pydnn
