// Dropout (cudnnDropoutForward / cudnnDropoutBackward) with a counter-based generator.
//
//   forward   y  = keep(i) ? x * scale : 0,   scale = 1 / (1 - p); the keep bits go to the reserve space
//   backward  dx = keep(i) ? dy * scale : 0,  keep bits read back from the reserve space
//
// keep(i) for element i (the row-major index over the dims, whatever the strides) is bit (i & 7) of
// philox::dropout_keep_bits8(seed, offset, i >> 3, threshold) (see common/philox.cuh): one Philox call per
// group of 8 elements, 16 random bits per element, so the mask is a pure function of (seed, offset, i).
// Dropped elements are written as exact zeros (a select, not a multiply: x = inf or NaN gives 0, and
// p = 1 needs no division). The reserve space holds one bit per element: byte g = the keep bits of group
// g (elements 8g .. 8g+7), bits past n are 0.
//
// Kernels (DropoutParams in dropout_params.h):
//   fwd<T, VEC>, bwd<T, VEC>   x and y dense in row-major order (the memory order is the logical order).
//                              Each thread takes Groups<T> groups of 8 (64 bytes of input) in warp tiles
//                              (see dense_body), all loaded before any is used; VEC = 16 / sizeof(T)
//                              when every pointer is 16-byte aligned, else VEC = 1. The last partial
//                              group (n % 8 elements) is done by thread 0 of block 0.
//   fwd_packed<T>              the dense forward of 16-bit T with 16-byte vectors: fwd<T, 8>'s lanes and
//                              bits with fewer instructions per element (see the kernel).
//   fwd_tile<T>, bwd_tile<T>   channels-last layouts (the second-to-last dim has stride 1 in x and y, the
//                              last is a multiple of 8): a tile through shared memory, see tile_body.
//   fwd_strided<T>, bwd_strided<T>   any strides: a thread per group, offsets from the coordinates.
//   init_state                 SetDropoutDescriptor: writes the states buffer (one thread).
//   philox_probe               tests: the raw Philox-4x32-10 of (counter, key) records.
#include "common/params.h"
#include "common/philox.cuh"
#include "common/types.cuh"
#include "dropout_params.h"

namespace pydnn {
namespace dropout {

constexpr int kThreads = 256;

// Groups of 8 elements per thread (= tiles per warp) in the dense kernels: 64 bytes of input in flight
// per thread.
template <class T> struct Groups;
template <> struct Groups<double> { static constexpr int value = 1; };
template <> struct Groups<float> { static constexpr int value = 2; };
template <> struct Groups<half_t> { static constexpr int value = 4; };
template <> struct Groups<bf16_t> { static constexpr int value = 4; };

// Blocks per SM the dense kernels are compiled for (register caps of 51 and 64): as many as fit without
// spilling (checked with ptxas -v; without a cap ptxas spilled 4 bytes in the bf16 forward, with a cap of
// 42 the element-wise launches spill ~90 bytes). Measured on the H200 (tools/bench_dropout.py): the bf16
// forward ran at 81.8% of copy with the cap against 86.1% uncapped (with the spill) in an earlier run;
// the cap is kept until that is re-measured.
template <int VEC> struct MinBlocks { static constexpr int value = VEC == 1 ? 4 : 5; };

struct Stream {
  u64 seed, offset;
};

// The (seed, offset) of this launch: thread 0 reads them from the states buffer into shared memory. Called
// after the block has issued its data loads, so the round trip overlaps them.
__device__ __forceinline__ Stream read_stream(const DropoutParams& p) {
  __shared__ u64 sh[2];
  if (threadIdx.x == 0) {
    if (p.state != nullptr) {
      const volatile u64* st = p.state;
      sh[0] = st[0];
      sh[1] = st[1];
    } else {
      sh[0] = sh[1] = 0;
    }
  }
  __syncthreads();
  Stream s;
  s.seed = sh[0];
  s.offset = sh[1];
  return s;
}

// At the end of a forward block: count the block in word 2 of the states; the last block to be counted
// (every block has read the offset by then) advances the offset for the next forward and resets the count.
// No grid-wide barrier, no host round trip, nothing on any block's critical path.
__device__ __forceinline__ void count_block(const DropoutParams& p, Stream s) {
  if (threadIdx.x == 0 && p.state != nullptr) {
    __threadfence();  // this block's read of the offset is complete before the count says so
    unsigned* count = reinterpret_cast<unsigned*>(p.state + 2);
    if (atomicAdd(count, 1u) == gridDim.x - 1) {
      volatile u64* st = p.state;
      st[1] = s.offset + 1;
      atomicExch(count, 0u);
    }
  }
}

template <class T, class A>
__device__ __forceinline__ T keep_or_zero(unsigned bits, int j, T v, A scale) {
  return ((bits >> j) & 1u) ? store<T>(load<A>(v) * scale) : store<T>(A(0));
}

// The dense kernels' work. FWD: the keep bits come from Philox and are stored in the reserve space;
// backward: they are read from it.
//
// A warp works on tiles of 32 groups (256 elements, 32 * NV vectors of VEC elements). Lane l loads vectors
// l, 32 + l, ... of the tile, so every load and store instruction of the warp covers one contiguous run
// (a group spans NV lanes' vectors when NV > 1: fp32, double, the element-wise launch); lane l also owns
// group l of the tile: its Philox call (or reserve byte) and its mask byte (a warp writes 32 consecutive
// bytes). A vector takes its group's bits from the owning lane with one shuffle. Each warp does G tiles,
// all loads issued before any Philox call. (With each lane owning one whole group, its NV vectors are
// 16 bytes apart from the next lane's and fp32 stores fill half a sector per instruction: fp32 measured
// 79-82% of copy against bf16's 86-93%, H200; the warp tiles brought the fp32 forward to 92.2%.)
template <class T, int VEC, bool FWD>
__device__ __forceinline__ void dense_body(const DropoutParams& p) {
  typedef typename AccOf<T>::type A;
  constexpr int G = Groups<T>::value;  // tiles per warp
  constexpr int NV = 8 / VEC;          // vectors per group = vectors per lane per tile
  constexpr int kWarps = kThreads / 32;
  typedef Vec<T, VEC> V;
  const A scale = (A)p.scale;
  const i64 full = p.n >> 3;  // whole groups
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const V* x = reinterpret_cast<const V*>(p.in);
  V* y = reinterpret_cast<V*>(p.out);
  V v[G][NV];
  unsigned bits[G];
#pragma unroll
  for (int u = 0; u < G; ++u) {
    const i64 g0 = (((i64)blockIdx.x * G + u) * kWarps + warp) * 32;  // the tile's first group
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int w = k * 32 + lane;  // vector within the tile
      if (g0 + w / NV < full) v[u][k] = x[g0 * NV + w];
    }
    if (!FWD) bits[u] = g0 + lane < full ? (unsigned)p.mask[g0 + lane] : 0u;
  }
  Stream s;
  s.seed = s.offset = 0;
  if (FWD) s = read_stream(p);
#pragma unroll
  for (int u = 0; u < G; ++u) {
    const i64 g0 = (((i64)blockIdx.x * G + u) * kWarps + warp) * 32;
    const bool own = g0 + lane < full;
    if (FWD) bits[u] = own ? philox::dropout_keep_bits8(s.seed, s.offset, (u64)(g0 + lane), p.threshold) : 0u;
#pragma unroll
    for (int k = 0; k < NV; ++k) {
      const int w = k * 32 + lane;
      const unsigned b = NV == 1 ? bits[u] : __shfl_sync(0xFFFFFFFFu, bits[u], w / NV);  // every lane takes part
      if (g0 + w / NV < full) {
        const int first = (w % NV) * VEC;  // this vector's first element within its group
        V r;
#pragma unroll
        for (int e = 0; e < VEC; ++e) r.v[e] = keep_or_zero<T, A>(b, first + e, v[u][k].v[e], scale);
        y[g0 * NV + w] = r;
      }
    }
    if (FWD && own) p.mask[g0 + lane] = (unsigned char)bits[u];
  }
  const int rem = (int)(p.n & 7);
  if (rem && blockIdx.x == 0 && threadIdx.x == 0) {  // the partial last group
    const T* xs = reinterpret_cast<const T*>(p.in) + full * 8;
    T* ys = reinterpret_cast<T*>(p.out) + full * 8;
    unsigned b = FWD ? philox::dropout_keep_bits8(s.seed, s.offset, (u64)full, p.threshold) : p.mask[full];
    b &= (1u << rem) - 1u;
    for (int j = 0; j < rem; ++j) ys[j] = keep_or_zero<T, A>(b, j, xs[j], scale);
    if (FWD) p.mask[full] = (unsigned char)b;
  }
  if (FWD) count_block(p, s);
}

template <class T, int VEC>
__global__ void __launch_bounds__(kThreads, MinBlocks<VEC>::value) fwd(const DropoutParams p) {
  dense_body<T, VEC, true>(p);
}

template <class T, int VEC>
__global__ void __launch_bounds__(kThreads, MinBlocks<VEC>::value) bwd(const DropoutParams p) {
  dense_body<T, VEC, false>(p);
}

// fwd_packed<T> (16-bit T, 16-byte vectors): the dense forward with the same lane mapping as
// fwd<T, 8> (NV = 1: lane l owns group l of each tile and its 16-byte vector), and the same bits out, with
// fewer instructions per element, since at 2 bytes per element the per-element work shows:
//   - the Groups<T> Philox calls of a thread run round by round, so each round's key is bumped once for
//     all of them (the key is the same for every call), and their chains interleave;
//   - a pair of elements is a pair of 16-bit slices of one Philox word and of one x word: the keep tests
//     compare the word's halves with the threshold directly (no bit extraction), the values are unpacked
//     with one shift / and each, multiplied and selected as floats, and packed back with one paired
//     conversion (cvt.rn.*x2.f32 rounds each half as the single conversion does).
// Element j of a group is word j / 2, half j % 2 of both the Philox block and the vector: keep_bits8's
// layout, so the mask and y are bitwise fwd's. bf16 forward 88.0-89.6% of copy against fwd<T, 8>'s 82.9%
// (H200, two runs; tools/bench_dropout.py).
template <class T>
__global__ void __launch_bounds__(kThreads, MinBlocks<8>::value) fwd_packed(const DropoutParams p) {
  constexpr int G = Groups<T>::value;  // tiles per warp; a lane's vector of a tile is its group
  constexpr int kWarps = kThreads / 32;
  typedef Vec<unsigned, 4> W;  // 8 elements of 16 bits as 4 words
  const float scale = (float)p.scale;
  const i64 full = p.n >> 3;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const W* x = reinterpret_cast<const W*>(p.in);
  W* y = reinterpret_cast<W*>(p.out);
  W v[G];
#pragma unroll
  for (int u = 0; u < G; ++u) {
    const i64 g = (((i64)blockIdx.x * G + u) * kWarps + warp) * 32 + lane;
    if (g < full) v[u] = x[g];
  }
  const Stream s = read_stream(p);
  // keep(half) = slice >= threshold; threshold 0 (keep all) and >= 65536 (drop all) skip Philox: the words
  // stay 0, tlo = 65536 fails every low half, thi = 1 every high half of 0.
  const unsigned thr = p.threshold;
  const bool draw = thr - 1u < 65535u;
  const unsigned tlo = thr >= 65536u ? 65536u : thr, thi = thr >= 65536u ? 1u : thr << 16;
  philox::Ctr c[G];
#pragma unroll
  for (int u = 0; u < G; ++u) {
    const u64 g = (u64)((((i64)blockIdx.x * G + u) * kWarps + warp) * 32 + lane);
    c[u].x = (unsigned)g;
    c[u].y = (unsigned)(g >> 32);
    c[u].z = (unsigned)s.offset;
    c[u].w = (unsigned)(s.offset >> 32);
  }
  if (draw) {
    unsigned k0 = (unsigned)s.seed, k1 = (unsigned)(s.seed >> 32);
#pragma unroll
    for (int r = 0; r < 10; ++r) {
      if (r) {
        k0 += philox::kW0;
        k1 += philox::kW1;
      }
#pragma unroll
      for (int u = 0; u < G; ++u) c[u] = philox::round1(c[u], k0, k1);
    }
  } else {
#pragma unroll
    for (int u = 0; u < G; ++u) c[u].x = c[u].y = c[u].z = c[u].w = 0u;
  }
#pragma unroll
  for (int u = 0; u < G; ++u) {
    const i64 g = (((i64)blockIdx.x * G + u) * kWarps + warp) * 32 + lane;
    if (g < full) {
      const unsigned rw[4] = {c[u].x, c[u].y, c[u].z, c[u].w}, xw[4] = {v[u].v[0], v[u].v[1], v[u].v[2], v[u].v[3]};
      W o;
      unsigned bits = 0;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const bool klo = (rw[k] & 0xFFFFu) >= tlo, khi = rw[k] >= thi;
        float lo, hi;
        unpack16x2<T>(xw[k], lo, hi);
        o.v[k] = pack16x2<T>(klo ? lo * scale : 0.0f, khi ? hi * scale : 0.0f);
        bits |= (klo ? 1u : 0u) << (2 * k) | (khi ? 2u : 0u) << (2 * k);
      }
      y[g] = o;
      p.mask[g] = (unsigned char)bits;
    }
  }
  const int rem = (int)(p.n & 7);
  if (rem && blockIdx.x == 0 && threadIdx.x == 0) {  // the partial last group, as fwd does it
    typedef float A;
    const T* xs = reinterpret_cast<const T*>(p.in) + full * 8;
    T* ys = reinterpret_cast<T*>(p.out) + full * 8;
    unsigned b = philox::dropout_keep_bits8(s.seed, s.offset, (u64)full, p.threshold);
    b &= (1u << rem) - 1u;
    for (int j = 0; j < rem; ++j) ys[j] = keep_or_zero<T, A>(b, j, xs[j], scale);
    p.mask[full] = (unsigned char)b;
  }
  count_block(p, s);
}

// Offsets of logical element i (row-major over size[0 .. ndim-1]) in out and in.
__device__ __forceinline__ void offsets_of(const DropoutParams& p, i64 i, i64& inner, i64& o0, i64& o1) {
  o0 = o1 = 0;
  inner = 0;
#pragma unroll
  for (int d = PYDNN_MAX_DIMS - 1; d >= 0; --d) {
    if (d < p.ndim) {
      const i64 q = i / p.size[d], c = i - q * p.size[d];
      if (d == p.ndim - 1) inner = c;
      o0 += c * p.stride[0][d];
      o1 += c * p.stride[1][d];
      i = q;
    }
  }
}

template <class T, bool FWD>
__device__ __forceinline__ void strided_body(const DropoutParams& p) {
  Stream s;
  s.seed = s.offset = 0;
  if (FWD) s = read_stream(p);
  typedef typename AccOf<T>::type A;
  const A scale = (A)p.scale;
  const T* x = reinterpret_cast<const T*>(p.in);
  T* y = reinterpret_cast<T*>(p.out);
  const int last = p.ndim - 1;
  const i64 inner_size = p.size[last], s0 = p.stride[0][last], s1 = p.stride[1][last];
  for (i64 g = (i64)blockIdx.x * kThreads + threadIdx.x; g < p.groups; g += (i64)gridDim.x * kThreads) {
    const i64 first = g * 8;
    const int cnt = (int)min((i64)8, p.n - first);
    unsigned b = FWD ? philox::dropout_keep_bits8(s.seed, s.offset, (u64)g, p.threshold) : p.mask[g];
    b &= cnt == 8 ? 0xFFu : (1u << cnt) - 1u;
    i64 inner, o0, o1;
    offsets_of(p, first, inner, o0, o1);
    for (int j = 0; j < cnt; ++j) {
      y[o0] = keep_or_zero<T, A>(b, j, x[o1], scale);
      if (++inner < inner_size) {  // next element along the innermost dim
        o0 += s0;
        o1 += s1;
      } else if (j + 1 < cnt) {  // crossed into the next row: recompute
        offsets_of(p, first + j + 1, inner, o0, o1);
      }
    }
    if (FWD) p.mask[g] = (unsigned char)b;
  }
  if (FWD) count_block(p, s);
}

template <class T>
__global__ void __launch_bounds__(kThreads) fwd_strided(const DropoutParams p) {
  strided_body<T, true>(p);
}

template <class T>
__global__ void __launch_bounds__(kThreads) bwd_strided(const DropoutParams p) {
  strided_body<T, false>(p);
}

// ------------------------------------------------------------------ tile (channels-last layouts)
//
// When the second-to-last collapsed dim (A, e.g. C of NHWC) has stride 1 in x and y and the last one
// (B, e.g. H*W) is a multiple of 8, the strided kernel's walk along B touches one element per sector.
// Here a block moves a kTileA x kTileB tile through shared memory: read along A (contiguous), processed
// in logical order (8 consecutive b of one a = one group: one Philox call, one mask byte), written along
// A. Dims 0 .. ndim-3 are batch dims. grid.x = batch * tiles(A) * tiles(B), B tiles fastest.
constexpr int kTileA = 64, kTileB = 64;

template <class T, bool FWD>
__device__ __forceinline__ void tile_body(const DropoutParams& p) {
  typedef typename AccOf<T>::type A;
  __shared__ A tile[kTileA][kTileB + 1];
  const int nd = p.ndim, da = nd - 2, db = nd - 1;
  const i64 na = p.size[da], nb = p.size[db];
  const i64 ta_n = (na + kTileA - 1) / kTileA, tb_n = (nb + kTileB - 1) / kTileB;
  i64 bid = blockIdx.x;
  const i64 tb = bid % tb_n;
  bid /= tb_n;
  const i64 ta = bid % ta_n;
  bid /= ta_n;
  const i64 batch = bid;  // row-major index over the batch dims
  i64 o0 = 0, o1 = 0, rest = batch;
#pragma unroll
  for (int d = PYDNN_MAX_DIMS - 1; d >= 0; --d) {
    if (d < da) {
      const i64 q = rest / p.size[d], c = rest - q * p.size[d];
      o0 += c * p.stride[0][d];
      o1 += c * p.stride[1][d];
      rest = q;
    }
  }
  const i64 a0 = ta * kTileA, b0 = tb * kTileB;
  const int wa = (int)min((i64)kTileA, na - a0), wb = (int)min((i64)kTileB, nb - b0);
  const i64 sb0 = p.stride[0][db], sb1 = p.stride[1][db];
  const T* x = reinterpret_cast<const T*>(p.in) + o1 + a0 + b0 * sb1;
  T* y = reinterpret_cast<T*>(p.out) + o0 + a0 + b0 * sb0;
  const int tx = threadIdx.x & (kTileA - 1), ty = threadIdx.x / kTileA;  // 64 x 4
  constexpr int kRowsPerPass = kThreads / kTileA;
#pragma unroll
  for (int r = 0; r < kTileB; r += kRowsPerPass) {  // read: consecutive threads walk A (stride 1)
    const int b = r + ty;
    if (tx < wa && b < wb) tile[tx][b] = load<A>(x[tx + b * sb1]);
  }
  Stream s;
  s.seed = s.offset = 0;
  if (FWD) s = read_stream(p);  // its barrier also publishes the tile
  if (!FWD) __syncthreads();
  // process: thread (j, a) takes group j (b = 8j .. 8j+7) of rows a and a + 32
  const A scale = (A)p.scale;
  const int j = threadIdx.x & 7, arow = threadIdx.x >> 3;
  const i64 first_row = (batch * na + a0) * nb + b0;  // logical index of (a0, b0)
#pragma unroll
  for (int h = 0; h < kTileA; h += kThreads / 8) {
    const int a = arow + h;
    if (a < wa && 8 * j < wb) {
      const i64 g = (first_row + (i64)a * nb) / 8 + j;
      const unsigned bits = FWD ? philox::dropout_keep_bits8(s.seed, s.offset, (u64)g, p.threshold) : p.mask[g];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        A& v = tile[a][8 * j + e];
        v = ((bits >> e) & 1u) ? v * scale : A(0);
      }
      if (FWD) p.mask[g] = (unsigned char)bits;
    }
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kTileB; r += kRowsPerPass) {  // write: consecutive threads walk A again
    const int b = r + ty;
    if (tx < wa && b < wb) y[tx + b * sb0] = store<T>(tile[tx][b]);
  }
  if (FWD) count_block(p, s);
}

template <class T>
__global__ void __launch_bounds__(kThreads) fwd_tile(const DropoutParams p) {
  tile_body<T, true>(p);
}

template <class T>
__global__ void __launch_bounds__(kThreads) bwd_tile(const DropoutParams p) {
  tile_body<T, false>(p);
}

#ifdef PYDNN_DROPOUT_MISC  // only in the dropout.misc unit (plain kernels are compiled into every unit)
__global__ void init_state(const DropoutParams p) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    p.state[0] = p.seed;
    p.state[1] = 0;
    p.state[2] = 0;
    p.state[3] = PYDNN_DROPOUT_STATE_TAG;
  }
}

// Tests: record k of `in` is 6 words (counter x, y, z, w, key k0, k1); `out` gets the 4 output words.
__global__ void philox_probe(const DropoutParams p) {
  const i64 k = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= p.n) return;
  const unsigned* in = reinterpret_cast<const unsigned*>(p.in) + k * 6;
  philox::Ctr c;
  c.x = in[0];
  c.y = in[1];
  c.z = in[2];
  c.w = in[3];
  const philox::Ctr r = philox::philox4x32_10(c, in[4], in[5]);
  unsigned* out = reinterpret_cast<unsigned*>(p.out) + k * 4;
  out[0] = r.x;
  out[1] = r.y;
  out[2] = r.z;
  out[3] = r.w;
}
#endif

}  // namespace dropout
}  // namespace pydnn
