// 1x1 convolutions with a short reduction (forward: C <= 128 input channels; backward data: K <= 128 output
// channels), stride 1, no padding, one group, half / bfloat16, x and y packed NHWC: GEMMs of one or a few k16
// steps, memory-bound (the sweep's worst rows, H200: N32 1x1 64->64 @56 forward and backward data at 0.27x cuDNN,
// 32->400, 40->280, 64->256 at 0.33-0.54x; tools/PERF.md: one tile a block cannot overlap its C store with the
// next tile's loads, ~1.1 TB/s either route). ops/convolution/stream.py plans them (tuning.conv.STREAM_1X1).
//
//   forward         y[p][n]  = sum_k x[p][k]  w[n][k]   (B = the filter as [n][k]: STEP_NK)
//   backward data   dx[p][n] = sum_k dy[p][k] w[k][n]   (B = the filter as [k][n]: ldmatrix .trans)
//
// A block keeps the whole filter in shared memory (KP x NT values, loaded once) and walks 64-row tiles of the
// pixel matrix grid-stride (a persistent grid of at most a few waves) through a STAGES-deep cp.async ring, so the
// next tiles' loads are in flight while this one's MMAs and stores run. 8 warps: 4 along the tile's 64 rows x 2
// along its NT columns (MmaSm80<16, NT / 2>). Epilogue from registers: alpha only (no beta, z, bias or
// activation) stores 16-byte runs (quad::transpose over each 4 n8 tiles); otherwise pairs after
// conv_epilogue.cuh's arithmetic (beta; the fused forward's z, bias and activation_n).
// Output sides past NT (256; up to 512): `splits` column chunks of NT; block b takes chunk b % splits (its part
// of the filter) and every splits-th tile from b / splits (A is read once a chunk: 32 -> 400 reads its 64 bytes a
// pixel twice against 800 written).
// ConvParams: x (A: x or dy), w (the filter), out (y or dx), gm = pixels, gn = N (output channels of the GEMM),
// gk = K (its reduction), splits (column chunks; the grid a multiple of it), out_size / zs (the fused forward's z
// offsets), alpha / beta / alpha2 / flags / act.
#include "common/mma.cuh"
#include "common/params.h"
#include "common/quad.cuh"
#include "common/types.cuh"
#include "convolution_params.h"
#include "conv_epilogue.cuh"

namespace pydnn {
namespace conv {

constexpr int kStreamThreads = 256;
constexpr int kStreamBM = 64;      // pixel rows a tile
constexpr int kStreamStages = 4;   // A tiles in flight (the ring)

// shared-memory row pitch in elements: 16 bytes of padding so that ldmatrix's 8 rows fall in 8 bank groups
template <int W> struct Pitch { static constexpr int value = W + 8; };

template <int KP, int NT, bool KN> struct StreamSmem {
  static constexpr int a_pitch = Pitch<KP>::value;
  static constexpr int b_rows = KN ? KP : NT, b_pitch = KN ? Pitch<NT>::value : Pitch<KP>::value;
  static constexpr int a_elems = kStreamBM * a_pitch, b_elems = b_rows * b_pitch;
  static constexpr int bytes = (kStreamStages * a_elems + b_elems) * 2;
};

// One tile's A rows into the ring slot (16-byte chunks; columns past K and rows past M zero). The trip count is a
// constant and each thread's (row, chunk) pairs do not depend on the tile, so the loop unrolls into a few
// predicated copies a tile: the generic strided loop it replaces was ~270 of the ~420 instructions a warp spent on
// a tile of the 64 -> 64 forward (SASS, NVRTC 13.5, sm_90; ~285 now). It bought less than the count suggests
// (H200, N128 64 -> 64 forward 35.3 -> 33.2 us, N32 10.8 -> 10.6 us): issue is not what bounds the kernel.
template <class T, int KP>
__device__ __forceinline__ void stream_load_a(T* slot, const T* a, long long row0, long long M, int K) {
  constexpr int chunks = KP / 8;  // 16-byte chunks a row
  constexpr int total = kStreamBM * chunks, iters = (total + kStreamThreads - 1) / kStreamThreads;
  const T* tile = a + row0 * K;
  const long long rows_left = M - row0;
#pragma unroll
  for (int j = 0; j < iters; ++j) {
    const int i = threadIdx.x + j * kStreamThreads;
    if (total % kStreamThreads != 0 && i >= total) break;
    const int r = i / chunks, c = (i % chunks) * 8;
    const bool ok = r < rows_left && c < K;
    mma::cp_async_16(mma::smem_u32(slot + r * Pitch<KP>::value + c), ok ? tile + r * K + c : a, ok);
  }
}

// The filter's columns n0 .. n0 + NT into shared memory once: [n][k] (forward) or [k][n] (backward data), zero
// past N / K
template <class T, int KP, int NT, bool KN>
__device__ __forceinline__ void stream_load_b(T* sb, const T* w, int N, int K, int n0) {
  typedef StreamSmem<KP, NT, KN> S;
  constexpr int cols = KN ? NT : KP, chunks = cols / 8;
  for (int i = threadIdx.x; i < S::b_rows * chunks; i += kStreamThreads) {
    const int r = i / chunks, c = (i % chunks) * 8;
    const int n = n0 + (KN ? c : r), k = KN ? r : c;  // (n + 8 <= N when n < N: N % 8 == 0)
    const bool ok = n < N && k < K;
    const long long off = KN ? (long long)k * N + n : (long long)n * K + k;
    mma::cp_async_16(mma::smem_u32(sb + r * S::b_pitch + c), ok ? w + off : w, ok);
  }
}

// 2 blocks a SM (then at most 128 registers a thread) where shared memory holds two and the tile fits 128
// registers without spilling (ptxas, NVRTC 13.5: KP 96 x NT 256 spilled 12 bytes), else 1 (stream.py's per_sm)
template <int KP, int NT, bool KN> struct StreamMinBlocks {
  static constexpr int value = 2 * StreamSmem<KP, NT, KN>::bytes <= 227 * 1024 && (KP <= 64 || NT <= 128) ? 2 : 1;
};

template <class T, int KP, int NT, bool KN>
__global__ void __launch_bounds__(kStreamThreads, (StreamMinBlocks<KP, NT, KN>::value)) stream_1x1(const ConvParams p) {
  static_assert(KP % 16 == 0 && KP <= 128 && NT % 64 == 0 && NT <= 256, "tile");
  typedef StreamSmem<KP, NT, KN> S;
  typedef mma::MmaSm80<T, 16, NT / 2> Engine;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sa = reinterpret_cast<T*>(smem_raw);
  T* sb = sa + kStreamStages * S::a_elems;
  const T* a = static_cast<const T*>(p.x);
  T* out = static_cast<T*>(p.out);
  const long long M = p.gm;
  const int N = p.gn, K = p.gk;
  const long long tiles = (M + kStreamBM - 1) / kStreamBM;
  const int splits = p.splits, n0 = (int)(blockIdx.x % splits) * NT;
  const long long step = gridDim.x / splits;  // this chunk's blocks
  const int warp = threadIdx.x >> 5, wm = warp & 3, wn = warp >> 2;
  const float alpha = (float)p.alpha, beta = (float)p.beta, alpha2 = (float)p.alpha2;
  const bool plain = !(p.flags & (PYDNN_FLAG_BETA | PYDNN_CONV_FLAG_Z | PYDNN_CONV_FLAG_BIAS)) &&
                     p.act == PYDNN_CONV_ACT_IDENTITY;

  // the filter and the first STAGES - 1 tiles: one commit group each (the filter rides with tile 0's)
  stream_load_b<T, KP, NT, KN>(sb, static_cast<const T*>(p.w), N, K, n0);
  long long t = blockIdx.x / splits;
#pragma unroll
  for (int s = 0; s < kStreamStages - 1; ++s) {
    const long long ts = t + (long long)s * step;
    if (ts < tiles) stream_load_a<T, KP>(sa + s * S::a_elems, a, ts * kStreamBM, M, K);
    mma::cp_async_commit();
  }
  for (int it = 0; t < tiles; ++it, t += step) {
    mma::cp_async_wait<kStreamStages - 2>();
    __syncthreads();  // tile `it` landed for every thread; every warp is done with tile it - 1's slot
    {
      const long long tn = t + (long long)(kStreamStages - 1) * step;
      if (tn < tiles)
        stream_load_a<T, KP>(sa + ((it + kStreamStages - 1) % kStreamStages) * S::a_elems, a, tn * kStreamBM, M, K);
      mma::cp_async_commit();
    }
    const T* slot = sa + (it % kStreamStages) * S::a_elems + wm * 16 * S::a_pitch;
    Engine e;
    e.zero();
#pragma unroll
    for (int k0 = 0; k0 < KP; k0 += 16) {
      if (KN)
        e.step_kn(slot + k0, S::a_pitch, sb + k0 * S::b_pitch + wn * (NT / 2), S::b_pitch);
      else
        e.step(slot + k0, sb + wn * (NT / 2) * S::b_pitch + k0, S::a_pitch);
    }
    const long long row_base = t * kStreamBM + wm * 16;
    const int col_base = n0 + wn * (NT / 2);
    if (plain) {
      // 16-byte stores: over each 4 n8 tiles the quad's lanes exchange their pairs so lane q holds 8 columns of
      // one row (rows g and g + 8 of the warp's 16)
      const int q = threadIdx.x & 3, g = (threadIdx.x & 31) >> 2;
#pragma unroll
      for (int jj = 0; jj < Engine::TN / 4; ++jj) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          unsigned x[4];
#pragma unroll
          for (int s = 0; s < 4; ++s)
            x[s] = pack16x2<T>(alpha * e.acc[0][4 * jj + s][2 * h], alpha * e.acc[0][4 * jj + s][2 * h + 1]);
          quad::transpose(x);  // x[u] = columns 8 (4 jj + q) + 2 u, +1 of this lane's row
          const long long row = row_base + g + 8 * h;
          const int col = col_base + 32 * jj + 8 * q;
          if (row < M && col < N)
            *reinterpret_cast<uint4*>(out + row * N + col) = make_uint4(x[0], x[1], x[2], x[3]);
        }
      }
    } else {
      // alpha, beta, z, bias per value, then the activation over an n8 tile's 4 values with one switch
      // (activate_n: a switch per value unrolled over the warp's tile is what bloats a fused epilogue)
      long long zb[2] = {0, 0};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const long long row = row_base + Engine::row_of(0, 2 * h);
        if (!KN && (p.flags & PYDNN_CONV_FLAG_Z) && row < M) zb[h] = z_pixel_offset(p, row);
      }
#pragma unroll
      for (int j = 0; j < Engine::TN; ++j) {
        float v[4], bj[2] = {0.f, 0.f};  // the bias of this lane's two columns of the tile
        const int c0 = col_base + Engine::col_of(j, 0);
        if (!KN && (p.flags & PYDNN_CONV_FLAG_BIAS) && c0 < N) {
          bj[0] = load<float>(static_cast<const T*>(p.bias)[c0 * p.bias_stride]);
          bj[1] = load<float>(static_cast<const T*>(p.bias)[(c0 + 1) * p.bias_stride]);
        }
#pragma unroll
        for (int el = 0; el < 4; ++el) {
          const long long row = row_base + Engine::row_of(0, el);
          const int col = col_base + Engine::col_of(j, el);
          float x = alpha * e.acc[0][j][el];
          if (row < M && col < N) {
            if (p.flags & PYDNN_FLAG_BETA) x += beta * load<float>(out[row * N + col]);
            if (!KN && (p.flags & PYDNN_CONV_FLAG_Z))
              x += alpha2 * load<float>(static_cast<const T*>(p.z)[zb[el >> 1] + col * p.zs[1]]);
            x += bj[el & 1];
          }
          v[el] = x;
        }
        if (!KN) activate_n(p, v);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const long long row = row_base + Engine::row_of(0, 2 * h);
          const int col = col_base + Engine::col_of(j, 0);
          if (row < M && col < N)  // (N % 8 == 0: a pair is whole)
            *reinterpret_cast<unsigned*>(out + row * N + col) = pack16x2<T>(v[2 * h], v[2 * h + 1]);
        }
      }
    }
  }
  mma::cp_async_wait<0>();  // (no copy outstanding at exit)
}

}  // namespace conv
}  // namespace pydnn
