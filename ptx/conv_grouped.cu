// Narrow grouped convolutions (C/g == K/g = 4, 8, 16 or 32: ResNeXt's grouped 3x3) as one direct
// tensor-core launch over all groups (ops/convolution/grouped_direct.py). 2-d, half / bfloat16, x and y
// with channels contiguous (NHWC-like), every other stride a multiple of 8.
//
// A block computes a TH x TW tile of output pixels of one image for one 64-channel block (64 / (C/g)
// whole groups; grid.y = the channel block, so every group runs in the same launch). It copies the tile's
// input halo, ((TH - 1) * stride + (R - 1) * dil + 1) x (...) pixels x 64 channels (128 bytes a pixel,
// cp.async with zero fill for the padding), and the channel block's filter, pre-arranged by
// grouped_frag_pack as mma.m16n8k16 B fragments, into shared memory once; then each of the 4 warps walks
// the taps: A fragments (16 output pixels x 16 input channels of the tap) come straight from the halo by
// ldmatrix, each lane pointing at its own pixel shifted by the tap (implicit im2col, no gather), the
// 16-byte chunks of a pixel XOR-swizzled by the pixel index so that the 8 rows of an ldmatrix phase (8
// pixels, one chunk each) fall in 8 bank groups.
//
// Only the MMAs that touch the block diagonal run. An n8 chunk of output channels (8j .. 8j + 7) reads
// input channels of its own groups only: for C/g <= 16 they lie in the k16 chunk j / 2 (NK = 1: 8 MMAs a
// tap and 16 pixels instead of the dense 64 x 64's 32), for C/g = 32 in the two k16 chunks of its group
// (NK = 2: 16 MMAs). C/g = 4 still multiplies 3/4 zeros in its k16 chunk, 8 half; 16 and 32 none.
//
// Backward data at stride 1 is the same kernel (MODE 0): dx = the forward convolution of dy with the
// filter transposed inside each group and flipped, padding (R - 1) * dil - pad (the host sets up that
// virtual forward problem; grouped_frag_pack's transpose flag arranges the filter).
//
// Backward data at stride 2 (MODE 1), one launch: a block owns an 8 x 16 tile of dx (origin even) and
// the dy halo it gathers from; warp w takes the tile's pixels of one phase (row parity w / 2, column
// parity w % 2: 4 rows x 8 columns, 32 pixels), for which a tap either reaches dy for every pixel or for
// none (ih + pad - r * dil even), so the warp skips the taps of other phases as a whole and multiplies
// no zero that the stride puts there. ConvParams as the real problem: x = dy (in_size, xs), out = dx
// (out_size, ys), pad, stride 2, dil; the fragments as for stride 1 (fragment tap (r', s') holds tap
// (R - 1 - r', S - 1 - s')).
#include "common/mma.cuh"
#include "common/params.h"
#include "common/types.cuh"
#include "convolution_params.h"
#include "conv_epilogue.cuh"

namespace pydnn {
namespace conv {

constexpr int kGdThreads = 128;              // 4 warps
constexpr int kGdChannels = 64;              // channels of a block (input and output)
constexpr unsigned kGdPackTranspose = 4096u; // grouped_frag_pack: the backward-data filter (transposed, flipped)

// The B fragments of one (channel block, tap, n8 chunk j, k16 part nk): 32 lanes x 2 registers.
// grouped_frag_pack: out[((cb * taps + tap) * 8 + j) * NK + nk][lane][reg] (32-bit words, two 16-bit
// values each: k = 2 (lane % 4) + 8 reg + half, n = lane / 4 of the fragment). ConvAuxParams: in = w
// (strides in_stride: k, c, t, r, s), out, groups, kg = cg = C/g, taps, filt, channels = C (all groups),
// flags: PYDNN_CONV_FLAG_FLIP (CONVOLUTION mode), kGdPackTranspose (backward data).
template <class T>
__global__ void __launch_bounds__(256) grouped_frag_pack(const ConvAuxParams p) {
  const int c = p.cg;
  const int NK = c >= 32 ? 2 : 1;
  const long long total = (long long)(p.channels / kGdChannels) * p.taps * 8 * NK * 64;
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int reg = (int)(i & 1), lane = (int)((i >> 1) & 31);
  long long r = i >> 6;
  const int nk = (int)(r % NK);
  r /= NK;
  const int j = (int)(r % 8);
  r /= 8;
  const int tap = (int)(r % p.taps);
  const int cb = (int)(r / p.taps);
  const int kc = NK == 2 ? 2 * (j / 4) + nk : j / 2;  // the k16 chunk (of the block's 64 input channels)
  const int o = cb * kGdChannels + 8 * j + lane / 4;  // the output channel (global)
  int q = tap;
  const int s = q % p.filt[2];
  q /= p.filt[2];
  const int rr = q % p.filt[1];
  // CONVOLUTION mode flips the filter; backward data flips it (again)
  const bool flip = ((p.flags & PYDNN_CONV_FLAG_FLIP) != 0) != ((p.flags & kGdPackTranspose) != 0);
  const int ts = flip ? p.filt[2] - 1 - s : s, tr = flip ? p.filt[1] - 1 - rr : rr;
  const T* w = static_cast<const T*>(p.in);
  unsigned word = 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int ci = cb * kGdChannels + kc * 16 + 2 * (lane % 4) + 8 * reg + h;  // the input channel (global)
    unsigned short bits = 0;
    if (ci / c == o / c) {
      // forward: w[o][ci % c]; backward data (virtual forward on dy): w[k = ci][c = o % c]
      const long long off = (p.flags & kGdPackTranspose)
                                ? (long long)ci * p.in_stride[0] + (long long)(o % c) * p.in_stride[1]
                                : (long long)o * p.in_stride[0] + (long long)(ci % c) * p.in_stride[1];
      bits = w[off + (long long)tr * p.in_stride[3] + (long long)ts * p.in_stride[4]].bits;
    }
    word |= (unsigned)bits << (16 * h);
  }
  static_cast<unsigned*>(p.out)[i] = word;
}

constexpr int kGdMaxStages = 6;  // ring buffers (halos, the backward filter's stages)
__device__ __forceinline__ void cp_async_wait_pending(int n) {  // n = 1 .. kGdMaxStages - 1 groups may stay
  switch (n) {
    case 1: mma::cp_async_wait<1>(); break;
    case 2: mma::cp_async_wait<2>(); break;
    case 3: mma::cp_async_wait<3>(); break;
    case 4: mma::cp_async_wait<4>(); break;
    default: mma::cp_async_wait<5>(); break;
  }
}

__device__ __forceinline__ int floor_half(int v) { return v >> 1; }  // floor(v / 2), v of either sign

// The direct kernel. ConvParams of the (virtual) forward problem: x (strides xs, in_size), w = the packed
// fragments, out (strides ys, out_size), batch, groups, cg = kg = C/g, filt, pad, stride, dil (dims 1, 2;
// dim 0 is 1), alpha / beta (FLAG_BETA), and for the fused forward z (zs) / bias / act (epilogue_value).
// FLAG_PAIR: out 4-byte aligned, store channel pairs as one word. Dynamic shared memory: the fragments
// (taps * NK * 2 KiB) then the halo (its pixels * 128 bytes).
// The tile t of the grid-stride walk: image n, output (dx) tile origin oh0 / ow0, halo origin ih0 / iw0.
template <int TH, int TW, int MODE>
struct GdTile {
  long long n;
  int oh0, ow0, ih0, iw0;
  __device__ __forceinline__ GdTile(const ConvParams& p, long long t, int tiles_h, int tiles_w) {
    const int tw_i = (int)(t % tiles_w);
    t /= tiles_w;
    oh0 = (int)(t % tiles_h) * TH;
    ow0 = tw_i * TW;
    n = t / tiles_h;
    const int R = p.filt[1], S = p.filt[2];
    // MODE 1: the first dy row / column of the halo, floor((origin + pad - (R - 1) * dil) / 2)
    ih0 = MODE == 0 ? oh0 * p.stride[1] - p.pad[1] : floor_half(oh0 + p.pad[1] - (R - 1) * p.dil[1]);
    iw0 = MODE == 0 ? ow0 * p.stride[2] - p.pad[2] : floor_half(ow0 + p.pad[2] - (S - 1) * p.dil[2]);
  }
};

// Persistent, with a ring of p.gn halo buffers (2 .. kGdMaxStages): block (blockIdx.x, channel block
// blockIdx.y) walks the tiles blockIdx.x, + gridDim.x, ...; the fragments are copied once, and the next
// p.gn - 1 tiles' halos are in flight while this tile's MMAs run (the first version copied, waited and
// computed one tile a block: 0.29-0.55x cuDNN on the ResNeXt layers, H200, a block's copy latency
// exposed; two buffers, 2 blocks a SM, left the stride-2 forward's 4.5x larger halos at 0.40-0.56x at
// N 128: deeper rings, one block a SM, for those).
template <class T, int NK, int TH, int TW, int MODE>
__global__ void __launch_bounds__(kGdThreads, 3) grouped_direct_tc(const ConvParams p) {
  constexpr int MB = (TH * TW + 63) / 64;  // m16 blocks a warp (the tile's pixels padded to 64)
  static_assert(MODE == 0 || (TH == 8 && TW == 16), "stride-2 backward data: 8 x 16 dx tiles (4 phases x 32)");
  extern __shared__ __align__(128) unsigned char gd_smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int R = p.filt[1], S = p.filt[2], taps = R * S;
  const int sh = p.stride[1], sw = p.stride[2], dh = p.dil[1], dw = p.dil[2];
  const int OH = p.out_size[1], OW = p.out_size[2], IH = p.in_size[1], IW = p.in_size[2];
  // the halo: MODE 0 the input pixels the tile's taps read; MODE 1 the dy pixels, a bound on their count
  const int HH = MODE == 0 ? (TH - 1) * sh + (R - 1) * dh + 1 : (TH - 1 + (R - 1) * dh) / 2 + 2;
  const int HW = MODE == 0 ? (TW - 1) * sw + (S - 1) * dw + 1 : (TW - 1 + (S - 1) * dw) / 2 + 2;
  const int tiles_w = (OW + TW - 1) / TW, tiles_h = (OH + TH - 1) / TH;
  const long long tiles = (long long)p.batch * tiles_h * tiles_w;
  const int cb = blockIdx.y;
  const int wbytes = taps * NK * 2048, hbytes = HH * HW * 128;
  const unsigned w_s = mma::smem_u32(gd_smem), halo0 = w_s + wbytes;
  const T* xc = static_cast<const T*>(p.x) + cb * kGdChannels;

  // copy tile t's halo (zero outside the image) into buffer `buf`
  auto load_halo = [&](long long t, int buf) {
    const GdTile<TH, TW, MODE> g(p, t, tiles_h, tiles_w);
    const T* x = xc + g.n * p.xs[0];
    const unsigned dst = halo0 + buf * hbytes;
    for (int i = tid; i < HH * HW * 8; i += kGdThreads) {
      const int pix = i >> 3, ch = i & 7;
      const int hy = pix / HW, hx = pix - hy * HW;
      const int ih = g.ih0 + hy, iw = g.iw0 + hx;
      const bool ok = ih >= 0 && ih < IH && iw >= 0 && iw < IW;
      const T* src = ok ? x + (long long)ih * p.xs[3] + (long long)iw * p.xs[4] + ch * 8 : x;
      mma::cp_async_16(dst + pix * 128 + ((ch ^ (pix & 7)) << 4), src, ok);
    }
  };
  {  // the fragments, once
    const unsigned char* wsrc = static_cast<const unsigned char*>(p.w) + (long long)cb * wbytes;
    for (int i = tid; i < wbytes / 16; i += kGdThreads) mma::cp_async_16(w_s + i * 16, wsrc + i * 16, true);
  }
  const int NS = p.gn;
  for (int i = 0; i < NS - 1; ++i) {  // the ring's first NS - 1 tiles (the fragments join the first group)
    const long long t = blockIdx.x + (long long)i * gridDim.x;
    if (t < tiles) load_halo(t, i);
    mma::cp_async_commit();
  }

  // MODE 0: hbase = the lane's ldmatrix row (tile pixel warp * 16 MB + 16 mb + (lane & 15)) in the halo
  // at tap (0, 0); chunk half lane >> 4
  int hbase[MB];
  const int py = warp >> 1, px = warp & 1;  // MODE 1: the warp's phase
#pragma unroll
  for (int mb = 0; mb < MB; ++mb) {
    int pm = warp * MB * 16 + mb * 16 + (lane & 15);
    if (pm >= TH * TW) pm = 0;  // padding rows: any pixel (never stored)
    hbase[mb] = (pm / TW) * sh * HW + (pm % TW) * sw;
  }
  const int khalf = lane >> 4;
  T* out = static_cast<T*>(p.out);
  const float alpha = (float)p.alpha, beta = (float)p.beta, alpha2 = (float)p.alpha2;
  const bool pair = p.flags & PYDNN_CONV_FLAG_PAIR;
  const bool plain = pair && !(p.flags & (PYDNN_FLAG_BETA | PYDNN_CONV_FLAG_Z | PYDNN_CONV_FLAG_BIAS)) &&
                     p.act == PYDNN_CONV_ACT_IDENTITY;

  int buf = 0;
  for (long long t = blockIdx.x; t < tiles; t += gridDim.x, buf = buf + 1 == NS ? 0 : buf + 1) {
    {  // NS - 1 tiles ahead, into the buffer the previous iteration computed from
      const long long ahead = t + (long long)(NS - 1) * gridDim.x;
      if (ahead < tiles) load_halo(ahead, buf == 0 ? NS - 1 : buf - 1);
      mma::cp_async_commit();
    }
    cp_async_wait_pending(NS - 1);  // this tile's halo (and the fragments) landed
    __syncthreads();
    const GdTile<TH, TW, MODE> g(p, t, tiles_h, tiles_w);
    const unsigned halo_s = halo0 + buf * hbytes;
    // MODE 1: hy2 / hx2 = 2 x the dy halo row / column at tap r = 0 (then (hy2 - r * dil) / 2 for tap r of
    // the warp's phase); rows 2 (pm >> 3) + py, columns 2 (pm & 7) + px of the dx tile
    int hy2[MB], hx2[MB];
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) {
      const int pm = mb * 16 + (lane & 15);
      hy2[mb] = g.oh0 + 2 * (pm >> 3) + py + p.pad[1] - 2 * g.ih0;
      hx2[mb] = g.ow0 + 2 * (pm & 7) + px + p.pad[2] - 2 * g.iw0;
    }
    float acc[MB][8][4];
#pragma unroll
    for (int mb = 0; mb < MB; ++mb)
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mb][j][e] = 0.f;

    for (int r = 0; r < R; ++r) {
      // MODE 1: fragment tap (r, s) is the filter's (R - 1 - r, S - 1 - s); the warp's phase meets it or not
      const int rr = R - 1 - r;
      if (MODE == 1 && ((py + g.oh0 + p.pad[1] - rr * dh) & 1)) continue;
      for (int s = 0; s < S; ++s) {
        const int ss = S - 1 - s;
        if (MODE == 1 && ((px + g.ow0 + p.pad[2] - ss * dw) & 1)) continue;
        const int tap = r * S + s;
        const int toff = r * dh * HW + s * dw;
        unsigned bf[8][NK][2];
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int nk = 0; nk < NK; ++nk) {
            const unsigned a = w_s + ((((tap * 8 + j) * NK + nk) * 32 + lane) << 3);
            asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(bf[j][nk][0]), "=r"(bf[j][nk][1]) : "r"(a));
          }
#pragma unroll
        for (int mb = 0; mb < MB; ++mb) {
          const int hp = MODE == 0 ? hbase[mb] + toff : ((hy2[mb] - rr * dh) >> 1) * HW + ((hx2[mb] - ss * dw) >> 1);
          const unsigned row = halo_s + hp * 128;
          const int swz = hp & 7;
          // the 4 A fragments first, then the MMAs (the asm statements keep their order: an ldmatrix
          // right before its MMA would stall each MMA for the load's latency)
          unsigned a[4][4];
#pragma unroll
          for (int kc = 0; kc < 4; ++kc) mma::ldmatrix_x4(a[kc], row + (((kc * 2 + khalf) ^ swz) << 4));
#pragma unroll
          for (int kc = 0; kc < 4; ++kc) {
            if (NK == 1) {
              mma::MmaOp<T>::run(acc[mb][2 * kc], a[kc], bf[2 * kc][0][0], bf[2 * kc][0][1]);
              mma::MmaOp<T>::run(acc[mb][2 * kc + 1], a[kc], bf[2 * kc + 1][0][0], bf[2 * kc + 1][0][1]);
            } else {
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                const int j = 4 * (kc / 2) + i;
                mma::MmaOp<T>::run(acc[mb][j], a[kc], bf[j][(kc & 1) % NK][0], bf[j][(kc & 1) % NK][1]);
              }
            }
          }
        }
      }
    }

    // epilogue: lane holds rows lane / 4 (+ 8) and channels 2 (lane % 4) (+ 1) of each n8 chunk
#pragma unroll
    for (int mb = 0; mb < MB; ++mb) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int pm = MODE == 0 ? warp * MB * 16 + mb * 16 + (lane >> 2) + 8 * hf : mb * 16 + (lane >> 2) + 8 * hf;
        const int oh = MODE == 0 ? g.oh0 + pm / TW : g.oh0 + 2 * (pm >> 3) + py;
        const int ow = MODE == 0 ? g.ow0 + pm % TW : g.ow0 + 2 * (pm & 7) + px;
        if (pm >= TH * TW || oh >= OH || ow >= OW) continue;
        const long long base = g.n * p.ys[0] + (long long)oh * p.ys[3] + (long long)ow * p.ys[4];
        if (plain) {  // alpha only: channel pairs as words
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const long long off = base + cb * kGdChannels + 8 * j + 2 * (lane & 3);
            const T t0 = store<T>(alpha * acc[mb][j][2 * hf]), t1 = store<T>(alpha * acc[mb][j][2 * hf + 1]);
            *reinterpret_cast<unsigned*>(out + off) = (unsigned)t0.bits | ((unsigned)t1.bits << 16);
          }
          continue;
        }
        const long long zbase = g.n * p.zs[0] + (long long)oh * p.zs[3] + (long long)ow * p.zs[4];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int ch = cb * kGdChannels + 8 * j + 2 * (lane & 3);
          const long long off = base + ch;
          const float v0 = epilogue_value<true>(p, out, off, zbase + (long long)ch * p.zs[1], ch, acc[mb][j][2 * hf],
                                                alpha, beta, alpha2);
          const float v1 = epilogue_value<true>(p, out, off + 1, zbase + (long long)(ch + 1) * p.zs[1], ch + 1,
                                                acc[mb][j][2 * hf + 1], alpha, beta, alpha2);
          const T t0 = store<T>(v0), t1 = store<T>(v1);
          if (pair) {
            *reinterpret_cast<unsigned*>(out + off) = (unsigned)t0.bits | ((unsigned)t1.bits << 16);
          } else {
            out[off] = t0;
            out[off + 1] = t1;
          }
        }
      }
    }
    __syncthreads();  // every warp is done with this buffer before the next iteration copies into it
  }
}

}  // namespace conv
}  // namespace pydnn

namespace pydnn {
namespace conv {

// ---------------------------------------------------------------- backward filter
//
// grouped_wgrad_tc: dw of the same narrow groups, split over the output pixels. A block (grid.x = split
// * row blocks + row block, grid.y = the 64-channel block; 8 warps, one block a SM) walks the TH x TW
// output tiles split, split + splits, ...: per tile it copies dy's tile (TH * TW pixels x 64 channels,
// zero outside the image) and the x halo its filter rows r0 .. r0 + RB - 1 read into a ring of
// p.gn stages (the next p.gn - 1 tiles in flight while this one's MMAs run). Warp w = 4 h + q owns the
// 16 output channels 16q .. 16q + 15 and 16 input channels of their groups (n8 chunks nb, nb + 1):
// C/g <= 16 those same channels (nb = 2q), and warps h = 0 / 1 take the even / odd k16 steps of 16 tile
// pixels (the halves added through shared memory at the end); C/g = 32 the half h of the group's 32
// (nb = 4 (q / 2) + 2h), every k16 step. Per k16 step a warp loads its A fragment (16 output channels x
// 16 pixels: dy transposed by ldmatrix.trans) once and, tap by tap, B (16 pixels shifted by the tap x its
// 16 input channels: one ldmatrix.x4.trans from the halo), 2 MMAs a tap. The sums (MAXT = 9 taps x 2 n8
// chunks x 4) stay in registers over all the block's tiles and go out once as fp32 partials
// [split][K][taps][C/g] (the diagonal entries only); grouped_wgrad_fold adds the splits in order
// (deterministic). ConvParams: x = dy (ys), w = x (xs), out = the partials, in_size = x's, out_size =
// dy's, filt, pad, stride, dil; splits; gk = RB (filter rows a block), gm = row blocks, gn = ring stages
// (2 .. kGdMaxStages).
//
// Why this layout (mid-session run 2, H200, ms pydnn / cuDNN): the first version (4 warps, a warp the 16
// output channels x all input channels of its groups, C/g = 32 one filter row a block so dy and x were
// copied 3 times, two stages, 2 blocks a SM) ran 0.14-0.41x cuDNN for C/g 8-32 (N128 256 @28 0.177 /
// 0.071), ~11 us a tile a block where its compute was ~1.5 us: copy-bound with one tile in flight.
constexpr int kGwThreads = 256;  // 8 warps


// NT: the taps a block as a compile-time count (9: 3x3 all rows, 3: one row of 3; 0: RB * S at run time, up
// to 9): with NT the tap loop has no run-time guards (sm_90 SASS of the NT = 0 form: a branch around every
// ldmatrix / MMA pair, ~200 instructions a k16 step for 18 MMAs).
template <class T, int NK, int TH, int TW, int NT>
__global__ void __launch_bounds__(kGwThreads, 1) grouped_wgrad_tc(const ConvParams p) {
  constexpr int MAXT = NT ? NT : 9;  // taps a block (registers: MAXT x 2 n8 chunks x 4 sums)
  constexpr int PIX = TH * TW, KSTEPS = PIX / 16;
  static_assert(PIX % 32 == 0, "whole pairs of k16 steps of pixels");
  extern __shared__ __align__(128) unsigned char gd_smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int q = warp & 3, hw8 = warp >> 2;
  const int S = p.filt[2], RB = p.gk, row_blocks = p.gm, NS = p.gn;
  const int sh = p.stride[1], sw = p.stride[2], dh = p.dil[1], dw = p.dil[2];
  const int OH = p.out_size[1], OW = p.out_size[2], IH = p.in_size[1], IW = p.in_size[2];
  const int HH = (TH - 1) * sh + (RB - 1) * dh + 1, HW = (TW - 1) * sw + (S - 1) * dw + 1;
  const int tiles_w = (OW + TW - 1) / TW, tiles_h = (OH + TH - 1) / TH;
  const long long tiles = (long long)p.batch * tiles_h * tiles_w;
  const int split = blockIdx.x / row_blocks, rb = blockIdx.x % row_blocks, cb = blockIdx.y;
  const int r0 = rb * RB, ntaps = NT ? NT : RB * S;
  const int stage = PIX * 128 + HH * HW * 128;
  const unsigned smem0 = mma::smem_u32(gd_smem);
  const T* dy = static_cast<const T*>(p.x) + cb * kGdChannels;
  const T* x = static_cast<const T*>(p.w) + cb * kGdChannels;
  const int ch0 = tid & 7, pix0 = tid >> 3, hy0 = pix0 / HW, hx0 = pix0 - hy0 * HW;  // the halo copies' start

  auto load_tile = [&](long long tile, int buf) {
    unsigned t = (unsigned)tile;  // tiles < 2^31 (GroupedWgradPlan checks): 32-bit divisions
    const int tw_i = (int)(t % (unsigned)tiles_w);
    t /= (unsigned)tiles_w;
    const int th_i = (int)(t % (unsigned)tiles_h);
    const long long n = t / (unsigned)tiles_h;
    const int oh0 = th_i * TH, ow0 = tw_i * TW;
    const int ih0 = oh0 * sh - p.pad[1] + r0 * dh, iw0 = ow0 * sw - p.pad[2];
    const unsigned dy_s = smem0 + buf * stage, halo_s = dy_s + PIX * 128;
    const T* dyn = dy + n * p.ys[0];
    const T* xn = x + n * p.xs[0];
    for (int i = tid; i < PIX * 8; i += kGwThreads) {
      const int pix = i >> 3, ch = i & 7;
      const int oh = oh0 + pix / TW, ow = ow0 + pix % TW;
      const bool ok = oh < OH && ow < OW;
      const T* src = ok ? dyn + (long long)oh * p.ys[3] + (long long)ow * p.ys[4] + ch * 8 : dy;
      mma::cp_async_16(dy_s + pix * 128 + ((ch ^ (pix & 7)) << 4), src, ok);
    }
    // the halo: this thread's chunk ch0 of pixels pix0, pix0 + 32, ... (row / column kept by steps, no
    // division a copy: the SASS of the division form spent ~60 instructions a 16-byte copy)
    for (int pix = pix0, hy = hy0, hx = hx0; pix < HH * HW; pix += kGwThreads / 8) {
      const int ih = ih0 + hy, iw = iw0 + hx;
      const bool ok = ih >= 0 && ih < IH && iw >= 0 && iw < IW;
      const T* src = ok ? xn + (long long)ih * p.xs[3] + (long long)iw * p.xs[4] + ch0 * 8 : x;
      mma::cp_async_16(halo_s + pix * 128 + ((ch0 ^ (pix & 7)) << 4), src, ok);
      hx += kGwThreads / 8;
      while (hx >= HW) {
        hx -= HW;
        ++hy;
      }
    }
  };

  // B row addresses: tile pixel k = 16 kstep + rb_ (rb_ = (lane & 7) + 8 ((lane >> 3) & 1)) at tap (0, 0) is
  // halo pixel hb0 + kstep * rowstep (TW divides 16); A rows: pixel 16 kstep + ra, ra = (lane & 7) + 8 (lane >> 4)
  const int rb_ = (lane & 7) + 8 * ((lane >> 3) & 1), ra = (lane & 7) + 8 * (lane >> 4);
  const int hb0 = (rb_ / TW) * sh * HW + (rb_ % TW) * sw, rowstep = (16 / TW) * sh * HW;
  int toff[MAXT];
#pragma unroll
  for (int t = 0; t < MAXT; ++t) toff[t] = (t / S) * dh * HW + (t % S) * dw;
  const int nb = NK == 1 ? 2 * q : 4 * (q >> 1) + 2 * hw8;  // the warp's first n8 chunk (input channels)
  const int bch = nb + (lane >> 4);                         // its ldmatrix chunk
  const int ach = 2 * q + ((lane >> 3) & 1);
  const unsigned a_off = ra * 128 + ((ach ^ (ra & 7)) << 4);  // + kstep * 2048 (16 pixels of 128 bytes)
  float acc[MAXT][2][4];
#pragma unroll
  for (int t = 0; t < MAXT; ++t)
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[t][j][e] = 0.f;

  // the ring: tiles split + i * splits into stage i % NS; NS - 1 in flight ahead of the one computed
  for (int i = 0; i < NS - 1; ++i) {
    const long long tile = split + (long long)i * p.splits;
    if (tile < tiles) load_tile(tile, i);
    mma::cp_async_commit();
  }
  int buf = 0;
  for (long long tile = split; tile < tiles; tile += p.splits) {
    {
      const long long ahead = tile + (long long)(NS - 1) * p.splits;
      if (ahead < tiles) load_tile(ahead, buf == 0 ? NS - 1 : buf - 1);
      mma::cp_async_commit();
    }
    cp_async_wait_pending(NS - 1);
    __syncthreads();
    const unsigned dy_s = smem0 + buf * stage, halo_s = dy_s + PIX * 128;
    // C/g <= 16: the warp pair splits the k16 steps (warp h the steps of parity h)
    constexpr int KW = NK == 1 ? KSTEPS / 2 : KSTEPS;
#pragma unroll
    for (int kk = 0; kk < KW; ++kk) {
      const int ks = NK == 1 ? 2 * kk + hw8 : kk;
      const int hbk = hb0 + ks * rowstep;
      unsigned a[4];
      mma::ldmatrix_x4_trans(a, dy_s + ks * 2048 + a_off);
      // taps in groups of 3: their B fragments loaded first, then the MMAs (in-order asm: see the forward)
#pragma unroll
      for (int t0 = 0; t0 < MAXT; t0 += 3) {
        unsigned b[3][4];
#pragma unroll
        for (int u = 0; u < 3; ++u) {
          if (t0 + u < ntaps) {
            const int hp = hbk + toff[t0 + u];
            mma::ldmatrix_x4_trans(b[u], halo_s + hp * 128 + ((bch ^ (hp & 7)) << 4));
          }
        }
#pragma unroll
        for (int u = 0; u < 3; ++u) {
          if (t0 + u < ntaps) {
            mma::MmaOp<T>::run(acc[t0 + u][0], a, b[u][0], b[u][1]);
            mma::MmaOp<T>::run(acc[t0 + u][1], a, b[u][2], b[u][3]);
          }
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before a later iteration copies into it
    buf = buf + 1 == NS ? 0 : buf + 1;
  }
  mma::cp_async_wait<0>();  // (empty groups only: no copy is left pending into the smem reused below)

  // C/g <= 16: warps h = 1 hand their sums to warps h = 0 through shared memory (the ring is free now)
  float* red = reinterpret_cast<float*>(gd_smem);
  if (NK == 1) {
    __syncthreads();
    if (hw8 == 1) {
#pragma unroll
      for (int t = 0; t < MAXT; ++t)
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) red[((q * MAXT + t) * 8 + j * 4 + e) * 32 + lane] = acc[t][j][e];
    }
    __syncthreads();
    if (hw8 == 1) return;
#pragma unroll
    for (int t = 0; t < MAXT; ++t)
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[t][j][e] += red[((q * MAXT + t) * 8 + j * 4 + e) * 32 + lane];
  }

  // the partials: rows (output channels) 16q + lane / 4 (+ 8), columns (input channels) of n8 chunk
  // nb + j, 2 (lane % 4) (+ 1); only those of the row's group
  const int c = p.cg, taps = p.filt[1] * S, K = p.groups * c;
  float* part = static_cast<float*>(p.out) + (long long)split * K * taps * c;
#pragma unroll
  for (int t = 0; t < MAXT; ++t) {
    if (t >= ntaps) continue;
    const int tap = (r0 + t / S) * S + t % S;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int o = cb * kGdChannels + 16 * q + (lane >> 2) + 8 * (e >> 1);
        const int ci = cb * kGdChannels + 8 * (nb + j) + 2 * (lane & 3) + (e & 1);
        if (o / c == ci / c) part[((long long)o * taps + tap) * c + ci % c] = acc[t][j][e];
      }
  }
}

// grouped_wgrad_fold: dw = alpha * (the splits' partials added) + beta * dw. ConvAuxParams: in = the
// partials [split][K][taps][C/g], out = dw (strides out_stride: k, c, t, r, s), groups, kg = cg = C/g, taps,
// filt, splits, channels = G (lanes an element, a power of two <= 32), flags (PYDNN_FLAG_BETA,
// PYDNN_CONV_FLAG_FLIP: CONVOLUTION mode), alpha, beta. Lane `sub` of an element's G adds the splits sub,
// sub + G, ... and a fixed xor tree adds the lanes: deterministic (one thread adding 100+ splits in a
// dependent chain of L2 loads took tens of microseconds).
template <class T>
__global__ void __launch_bounds__(256) grouped_wgrad_fold(const ConvAuxParams p) {
  const long long per_split = (long long)p.groups * p.kg * p.taps * p.cg;
  const int G = p.channels;
  const long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long i = gid / G;
  const int sub = (int)(gid % G);
  const bool ok = i < per_split;
  float s = 0.f;
  if (ok) {
    const float* part = static_cast<const float*>(p.in) + i;
    for (int sl = sub; sl < p.splits; sl += G) s += part[(long long)sl * per_split];
  }
  for (int off = G >> 1; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (!ok || sub != 0) return;
  const int c = (int)(i % p.cg);
  const int tap = (int)(i / p.cg % p.taps);
  const long long o = i / ((long long)p.cg * p.taps);
  const int sf = tap % p.filt[2], rf = tap / p.filt[2];
  const bool flip = p.flags & PYDNN_CONV_FLAG_FLIP;
  const long long off = o * p.out_stride[0] + (long long)c * p.out_stride[1] +
                        (long long)(flip ? p.filt[1] - 1 - rf : rf) * p.out_stride[3] +
                        (long long)(flip ? p.filt[2] - 1 - sf : sf) * p.out_stride[4];
  T* out = static_cast<T*>(p.out);
  float v = (float)p.alpha * s;
  if (p.flags & PYDNN_FLAG_BETA) v += (float)p.beta * load<float>(out[off]);
  out[off] = store<T>(v);
}

}  // namespace conv
}  // namespace pydnn
