// fwd_tma (half, bfloat16; Hopper only, sm_90a; issue 18): the forward convolution as a warp-specialized
// TMA + mbarrier kernel, built as gemm_tma (ptx/matmul.cu) is: 384 threads, warpgroup 0 the producer (one
// thread issues every copy; registers given back with setmaxnreg), warpgroups 1 and 2 the consumers (64
// rows each of a 128 x BN tile: wgmma.m64nBNk16 from shared memory, fp32 accumulators in registers;
// BN 64 / 128 / 256 by the output channels, conv_tma.py _bn).
// K tiles (64 channels of one tap) flow through a STAGES-deep ring: per stage a full barrier (the
// producer's expect-tx arrival + the copies' bytes) and an empty barrier (one arrival per consumer
// warpgroup once its wgmmas reading the stage are done): no block-wide barrier and no proxy fence a K tile
// (fwd_wgmma's cp.async ring needs both).
// The A tile is ONE 4-d TMA box of x (NHWC: dims C, W, H, N): 64 channels x tw x th x tn pixels (tn * th *
// tw = 128 rows, w fastest), at (c0, ow0 * stride + s * dil - pad, oh0 * stride + r * dil - pad, n0): the
// tap's window of a box of output pixels is a box of x, every stride-th pixel of it (the map's element
// strides along W and H: a strided forward, tuning.conv.FWD_TMA_STRIDED; the box then spans tw * stride
// pixels of which it loads tw); the padding is the TMA unit's out-of-bounds zero fill (negative
// coordinates included), as are channels past C. The B tile is one 3-d box of the packed
// KRSC filter (dims C, R * S, K): 64 channels of tap (r, s) (flipped for CONVOLUTION mode) x BN output
// channels (BN of them). Both land as 128-byte rows in the 128B swizzle: K-major operands of wgmma as gemm_tma's.
// Persistent: a grid of at most one block an SM walks the items (pixel box, 128-channel tile), producer
// and consumers in the same order; the ring runs on across items, so the next item's copies start
// during this one's epilogue. The epilogue (smallest version) from the accumulator registers: alpha alone
// for the plain call; alpha * acc + bias (+ alpha2 * z) (+ max(v, 0)) for the fused conv + bias (+ residual)
// (+ ReLU without NaN propagation); else the family's epilogue_value per element (beta, other activations);
// 16 bytes a lane (ConvTmaParams.wide: a quad's transpose of the packed pairs, whole sectors a warp store) for
// the plain call and the fused bias (+ ReLU) without z where y allows it, else channel pairs stored as one word
// (FLAG_PAIR); rows outside y (a box past the image's edge) skipped.
// Host: pydnn/ops/convolution/conv_tma.py (tuning.conv.FWD_TMA).
#include "convolution.cu"
#include "conv_tma_params.h"
#include "common/quad.cuh"
#include "common/tma.cuh"

namespace pydnn {
namespace conv {

// BKN (backward data, conv_tma.plan_dgrad_tma): 0 B K-major (the forward's packed KRSC filter, or backward data's
// swapped copy); else the forward of dy whose B is read straight from the filter w (the problem's output
// channels are w's C, its reduction channels w's K): B's tile for tap (r, s), reduction block cb and output
// channels n0.. is w[cb * 64 ..][r][s][n0 ..], BN / 64 boxes of 64 c (contiguous) x 64 k, each landing as 64
// rows (k) of 128 bytes (c): MN-major B, as gemm_tma's TB = false slabs (descriptor LBO = the 64-column slab,
// wgmma's transpose bit for B). BKN 1: w packed KRSC, a 3-d map (C, R * S, K) (a call's own stride-1 plan);
// BKN 2: a 4-d map (C, S, R, K) through w's strides (a strided call's phase: its sub-filter view).
template <class T, int BN, int STAGES, int BKN = 0>
__global__ void __launch_bounds__(384, 1) fwd_tma(const __grid_constant__ ConvTmaParams q) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(sizeof(T) == 0, "fwd_tma needs the sm_90a target (KernelUnit archs)");
#endif
  static_assert(BN == 64 || BN == 128 || BN == 256, "fwd_tma tile");
  static_assert(BKN >= 0 && BKN <= 2, "fwd_tma B layout");
  constexpr int BM = 128, BK = 64;
  constexpr unsigned A_BYTES = BM * BK * sizeof(T), B_BYTES = BN * BK * sizeof(T);
  constexpr unsigned STAGE_BYTES = A_BYTES + B_BYTES;
  constexpr unsigned SLAB = 64 * BK * sizeof(T);  // 64 rows of 128 bytes: one consumer warpgroup's rows
  constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;
  const ConvParams& p = q.p;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const unsigned raw = mma::smem_u32(smem_raw);
  const unsigned sbase = (raw + 1023u) & ~1023u;  // the launch adds 1 KiB of slack
  const unsigned full0 = sbase + STAGES * STAGE_BYTES, empty0 = full0 + 8 * STAGES;
  const tma::TensorMap* map_x = reinterpret_cast<const tma::TensorMap*>(&q.map_x);
  const tma::TensorMap* map_w = reinterpret_cast<const tma::TensorMap*>(&q.map_w);
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      tma::mbar_init(full0 + 8 * s, 1);
      tma::mbar_init(empty0 + 8 * s, 2);
    }
    tma::fence_barrier_init();
    tma::prefetch_map(map_x);
    tma::prefetch_map(map_w);
  }
  __syncthreads();

  const int R = p.filt[1], S = p.filt[2];
  const int ktiles = R * S * q.cblocks;
  const long long per_k = (long long)q.tiles_w * q.tiles_h * q.tiles_n;
  const long long items = per_k * q.tiles_k;
  // item -> (w box, h box, image box, channel tile): the pixel boxes innermost, so the blocks running at
  // once share their filter tile
  auto coords = [&](long long item, int& w0, int& h0, int& nb, int& n0) {
    const int tk = (int)(item / per_k);
    int r = (int)(item - (long long)tk * per_k);
    const int bw = r % q.tiles_w;
    r /= q.tiles_w;
    const int bh = r % q.tiles_h;
    const int bn = r / q.tiles_h;
    w0 = bw * q.tw;
    h0 = bh * q.th;
    nb = bn * q.tn;
    n0 = tk * BN;
  };
  if (threadIdx.x < 128) {
    tma::regs_dealloc<PRODUCER_REGS>();
    if (threadIdx.x == 0) {
      const bool flip = p.flags & PYDNN_CONV_FLAG_FLIP;
      unsigned it = 0;
      for (long long item = blockIdx.x; item < items; item += gridDim.x) {
        int w0, h0, nb, n0;
        coords(item, w0, h0, nb, n0);
        const int ih0 = h0 * p.stride[1] - p.pad[1], iw0 = w0 * p.stride[2] - p.pad[2];
        for (int r = 0; r < R; ++r) {
          const int ih = ih0 + r * p.dil[1];
          for (int s = 0; s < S; ++s) {
            const int iw = iw0 + s * p.dil[2];
            const int rr = flip ? R - 1 - r : r, ss = flip ? S - 1 - s : s;
            const int tap = rr * S + ss;
            for (int cb = 0; cb < q.cblocks; ++cb, ++it) {
              const unsigned st = it % STAGES, full = full0 + 8 * st;
              tma::mbar_wait(empty0 + 8 * st, ((it / STAGES) & 1) ^ 1);
              tma::mbar_arrive_expect_tx(full, STAGE_BYTES);
              const unsigned sa = sbase + st * STAGE_BYTES, sb = sa + A_BYTES;
              tma::load_4d(sa, map_x, full, cb * BK, iw, ih, nb);
              if constexpr (BKN == 1) {
#pragma unroll
                for (int i = 0; i < BN / 64; ++i) tma::load_3d(sb + i * SLAB, map_w, full, n0 + 64 * i, tap, cb * BK);
              } else if constexpr (BKN == 2) {
#pragma unroll
                for (int i = 0; i < BN / 64; ++i) tma::load_4d(sb + i * SLAB, map_w, full, n0 + 64 * i, ss, rr, cb * BK);
              } else {
                tma::load_3d(sb, map_w, full, cb * BK, tap, n0);
              }
            }
          }
        }
      }
    }
  } else {
    tma::regs_alloc<CONSUMER_REGS>();
    const int wg = (threadIdx.x >> 7) - 1;  // consumer warpgroup: rows wg * 64 .. of the tile
    const bool signals = (threadIdx.x & 127) == 0;
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) & 3;
    T* out = static_cast<T*>(p.out);
    const float alpha = (float)p.alpha, beta = (float)p.beta, alpha2 = (float)p.alpha2;
    const int P = p.out_size[1], Q = p.out_size[2];
    const bool pair = p.flags & PYDNN_CONV_FLAG_PAIR;
    // the fused conv + bias (+ z) (+ ReLU) of a network in registers (no beta; IDENTITY, or RELU without NaN
    // propagation); the other epilogues through epilogue_value
    const bool relu = p.act == PYDNN_CONV_ACT_RELU && !(p.flags & PYDNN_FLAG_NAN_PROP);
    const bool lean = !(p.flags & PYDNN_FLAG_BETA) && (p.act == PYDNN_CONV_ACT_IDENTITY || relu);
    const bool has_bias = p.flags & PYDNN_CONV_FLAG_BIAS, has_z = p.flags & PYDNN_CONV_FLAG_Z;
    unsigned it = 0;
    for (long long item = blockIdx.x; item < items; item += gridDim.x) {
      int w0, h0, nb, n0;
      coords(item, w0, h0, nb, n0);
      float acc[BN / 2];
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
      for (int kt = 0; kt < ktiles; ++kt, ++it) {
        const unsigned st = it % STAGES;
        tma::mbar_wait(full0 + 8 * st, (it / STAGES) & 1);
        const unsigned sa = sbase + st * STAGE_BYTES, sb = sa + A_BYTES;
        wgmma::fence();
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
          const unsigned long long da = wgmma::desc_sw128(sa + wg * SLAB + kk * 32, 16, 1024);
          const unsigned long long db =
              BKN ? wgmma::desc_sw128(sb + kk * 2048, SLAB, 1024) : wgmma::desc_sw128(sb + kk * 32, 16, 1024);
          wgmma::Mma<T, BN, 0, BKN ? 1 : 0>::run(acc, da, db, 1);
        }
        wgmma::commit();
        wgmma::wait<1>();  // this warpgroup's group of K tile it - 1 is done: its stage may be refilled
        if (kt > 0 && signals) tma::mbar_arrive(empty0 + 8 * ((it - 1) % STAGES));
      }
      wgmma::wait<0>();
      wgmma::fence_operands(acc);
      if (ktiles > 0 && signals) tma::mbar_arrive(empty0 + 8 * ((it - 1) % STAGES));
      // acc[4 j + 2 h + e]: tile row wg * 64 + warp * 16 + lane / 4 + 8 h, column 8 j + 2 (lane % 4) + e.
      if (lean && !has_z && q.wide) {  // 16 bytes a lane (the plain call, or the fused bias (+ ReLU) without z):
        // groups 4 jj .. 4 jj + 3 transposed over the quad (quad::transpose), lane t then holds group 4 jj + t's 8
        // channels (K % 8 == 0: a group lies in y or past K whole); the bias added to the pairs before it
        const int t = lane & 3;
        const T* bias = static_cast<const T*>(p.bias);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = wg * 64 + warp * 16 + (lane >> 2) + 8 * h;
          const int wi = row % q.tw, hi = (row / q.tw) % q.th, ni = row / (q.tw * q.th);
          const int n = nb + ni, oh = h0 + hi, ow = w0 + wi;
          const bool live = n < p.batch && oh < P && ow < Q;
          T* yrow = out + ((long long)n * p.ys[0] + (long long)oh * p.ys[3] + (long long)ow * p.ys[4]);
#pragma unroll
          for (int jj = 0; jj < BN / 32; ++jj) {
            unsigned x[4];
#pragma unroll
            for (int s = 0; s < 4; ++s) {
              const int j = 4 * jj + s;
              float v0 = acc[4 * j + 2 * h] * alpha, v1 = acc[4 * j + 2 * h + 1] * alpha;
              if (has_bias) {  // as the pairs' path: fmaf(acc, alpha, bias)
                const int cp = n0 + 8 * j + 2 * t;  // this lane's pair, before the transpose
                const float b0 = cp < p.gn ? load<float>(bias[cp * p.bias_stride]) : 0.f;
                const float b1 = cp + 1 < p.gn ? load<float>(bias[(cp + 1) * p.bias_stride]) : 0.f;
                v0 = fmaf(acc[4 * j + 2 * h], alpha, b0);
                v1 = fmaf(acc[4 * j + 2 * h + 1], alpha, b1);
              }
              if (relu) {
                v0 = fmaxf(v0, 0.f);
                v1 = fmaxf(v1, 0.f);
              }
              x[s] = pack16x2<T>(v0, v1);
            }
            quad::transpose(x);  // every lane of the warp: full-mask shuffles
            const int ch = n0 + 8 * (4 * jj + t);
            if (live && ch < p.gn) *reinterpret_cast<uint4*>(yrow + ch) = make_uint4(x[0], x[1], x[2], x[3]);
          }
        }
        continue;
      }
      // The plain call (alpha only) and the fused bias (+ z) (+ ReLU) in registers; anything else through
      // epilogue_value (beta, other activations). Channel pairs as one 32-bit word where y's channels are
      // contiguous and 4-byte aligned pairs (FLAG_PAIR, set per call).
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = wg * 64 + warp * 16 + (lane >> 2) + 8 * h;
        const int wi = row % q.tw, hi = (row / q.tw) % q.th, ni = row / (q.tw * q.th);
        const int n = nb + ni, oh = h0 + hi, ow = w0 + wi;
        if (n >= p.batch || oh >= P || ow >= Q) continue;
        const long long ybase = (long long)n * p.ys[0] + (long long)oh * p.ys[3] + (long long)ow * p.ys[4];
        const long long zbase = (long long)n * p.zs[0] + (long long)oh * p.zs[3] + (long long)ow * p.zs[4];
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          const int ch = n0 + 8 * j + 2 * (lane & 3);  // even; ch + 1 the pair's second channel
          if (ch >= p.gn) continue;
          const bool two = ch + 1 < p.gn;
          const long long off = ybase + (long long)ch * p.ys[1];
          float v0, v1;
          if (lean) {  // alpha * acc (+ bias) (+ alpha2 * z), then max(v, 0) for ReLU (NaN -> 0); the plain call too
            // (its 16-byte form above where q.wide: one path less to compile here)
            const T* bias = static_cast<const T*>(p.bias);
            const float b0 = has_bias ? load<float>(bias[ch * p.bias_stride]) : 0.f;
            const float b1 = has_bias && two ? load<float>(bias[(ch + 1) * p.bias_stride]) : 0.f;
            v0 = fmaf(acc[4 * j + 2 * h], alpha, b0);
            v1 = fmaf(acc[4 * j + 2 * h + 1], alpha, b1);
            if (has_z) {
              const T* z = static_cast<const T*>(p.z) + zbase + (long long)ch * p.zs[1];
              v0 = fmaf(alpha2, load<float>(z[0]), v0);
              if (two) v1 = fmaf(alpha2, load<float>(z[p.zs[1]]), v1);
            }
            if (relu) {
              v0 = fmaxf(v0, 0.f);
              v1 = fmaxf(v1, 0.f);
            }
          } else {
            const long long zoff = zbase + (long long)ch * p.zs[1];
            v0 = epilogue_value<true>(p, out, off, zoff, ch, acc[4 * j + 2 * h], alpha, beta, alpha2);
            v1 = two ? epilogue_value<true>(p, out, off + p.ys[1], zoff + p.zs[1], ch + 1, acc[4 * j + 2 * h + 1],
                                            alpha, beta, alpha2)
                     : 0.f;
          }
          if (pair && two) {
            const T lo = store<T>(v0), hi = store<T>(v1);
            *reinterpret_cast<unsigned*>(out + off) = (unsigned)lo.bits | ((unsigned)hi.bits << 16);
          } else {
            out[off] = store<T>(v0);
            if (two) out[off + p.ys[1]] = store<T>(v1);
          }
        }
      }
    }
  }
}

}  // namespace conv
}  // namespace pydnn
