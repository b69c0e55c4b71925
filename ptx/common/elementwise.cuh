// Element-wise map kernels shared by activations and tensor ops. An Op is a struct with
//   static constexpr unsigned reads;  // bit k set: the op reads in[k]
//   template <class A> static __device__ A apply(A a0, A a1, A a2, const MapParams& p, A alpha, A alpha2)
// returning the value before beta blending (the op applies alpha itself, so OpTensor can scale each input).
#pragma once
#include "common/params.h"
#include "common/types.cuh"
#include "common/h16.cuh"

// MapParams.flags bits beside common/params.h's: the 16-bit formats of a pydnn::h16_t instantiation (half and
// bfloat16 share one, common/h16.cuh; issue 21's install time). Set: the inputs / the output are bfloat16;
// clear: IEEE half. Ignored for other element types. (Here, not in params.h: that header is in the digest of
// every unit whose PTX sharing was verified, pydnn/_build/ptx_verified.py.)
#define PYDNN_FLAG_IN_BF16 4u
#define PYDNN_FLAG_OUT_BF16 8u

namespace pydnn {

constexpr int kMapThreads = 256;  // block of the scalar and strided kernels
constexpr int kMapUnroll = 4;     // vectors per thread of the scalar contiguous kernel

// Element <-> arithmetic value. El<T>::get / put / unpack2 / pack2 are load / store / unpack16x2 / pack16x2 of T;
// for pydnn::h16_t (one instantiation for half and bfloat16, common/h16.cuh: issue 21's install time) the same
// instructions of the format that the launch's flag bit `fmt` names (PYDNN_FLAG_IN_BF16 for the inputs,
// PYDNN_FLAG_OUT_BF16 for the output: both set by the host from the data types; a transform may convert
// between the two formats), so results are bit-identical to the typed instantiations.
template <class T> struct El {
  template <class A> static __device__ __forceinline__ A get(const MapParams&, T v, unsigned) { return load<A>(v); }
  template <class A> static __device__ __forceinline__ T put(const MapParams&, A v, unsigned) { return store<T>(v); }
  static __device__ __forceinline__ void unpack2(const MapParams&, unsigned w, float& lo, float& hi, unsigned) {
    unpack16x2<T>(w, lo, hi);
  }
  static __device__ __forceinline__ unsigned pack2(const MapParams&, float lo, float hi, unsigned) {
    return pack16x2<T>(lo, hi);
  }
};
template <> struct El<h16_t> {
  template <class A> static __device__ __forceinline__ A get(const MapParams& p, h16_t v, unsigned fmt) {
    return (A)h16_to_float(v, (p.flags & fmt) != 0u);
  }
  static __device__ __forceinline__ h16_t put(const MapParams& p, float v, unsigned fmt) {
    return h16_from_float(v, (p.flags & fmt) != 0u);
  }
  static __device__ __forceinline__ h16_t put(const MapParams& p, double v, unsigned fmt) {
    return h16_from_double(v, (p.flags & fmt) != 0u);
  }
  static __device__ __forceinline__ void unpack2(const MapParams& p, unsigned w, float& lo, float& hi, unsigned fmt) {
    h16_unpack2(w, lo, hi, (p.flags & fmt) != 0u);
  }
  static __device__ __forceinline__ unsigned pack2(const MapParams& p, float lo, float hi, unsigned fmt) {
    return h16_pack2(lo, hi, (p.flags & fmt) != 0u);
  }
};
constexpr unsigned kIn16 = PYDNN_FLAG_IN_BF16, kOut16 = PYDNN_FLAG_OUT_BF16;

// One element. `blend` (beta != 0, PYDNN_FLAG_BETA) is a parameter rather than a read of p.flags so that
// callers that know it at compile time (map_contig's whole tiles) drop the unused old-value arithmetic.
template <class TI, class TO, class Op, class A>
__device__ __forceinline__ TO map_one(const MapParams& p, TI a0, TI a1, TI a2, TO old, A alpha, A alpha2, A beta,
                                      bool blend) {
  A r = Op::template apply<A>(El<TI>::template get<A>(p, a0, kIn16), El<TI>::template get<A>(p, a1, kIn16),
                              El<TI>::template get<A>(p, a2, kIn16), p, alpha, alpha2);
  if (blend) r += beta * El<TO>::template get<A>(p, old, kOut16);
  return El<TO>::put(p, r, kOut16);
}

// Element types by what map_contig does with them: 16-bit floats (paired conversions), float.
template <class T> struct Is16 { static constexpr bool value = false; };
template <> struct Is16<half_t> { static constexpr bool value = true; };
template <> struct Is16<bf16_t> { static constexpr bool value = true; };
template <> struct Is16<h16_t> { static constexpr bool value = true; };
template <class T> struct Is32Float { static constexpr bool value = false; };
template <> struct Is32Float<float> { static constexpr bool value = true; };

// Streaming accesses of one vector (HINT is map_contig's cache policy):
//   0: the compiler's own ld.global / st.global;
//   1: evict-first streaming (ld.global.cs / st.global.cs): every byte is touched once, so neither L1 nor
//      L2 should keep it. (A third policy, inputs through ld.global.nc.L1::no_allocate, measured the same
//      as 1 on the H200 and would need inputs that never alias the output: not kept.)
// 16-, 8- and 4-byte vectors go out as one instruction; other sizes (narrow mixed-type vectors) plainly.
// Pointers are generic addresses of global memory (identical to global addresses on every CUDA GPU).
// The loads need not be volatile: an element is read and written by one thread only, and each store
// depends on the loads of its own vector, so no reordering can move a load past a store to its address.
template <int HINT, class V>
__device__ __forceinline__ V ld_stream(const V* ptr) {
  constexpr int S = sizeof(V);
  if constexpr (HINT == 0 || (S != 16 && S != 8 && S != 4)) {
    return *ptr;
  } else {
    union { V v; unsigned w[S / 4]; } u;
    if constexpr (S == 16)
      asm("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];"
          : "=r"(u.w[0]), "=r"(u.w[1]), "=r"(u.w[2]), "=r"(u.w[3]) : "l"(ptr));
    else if constexpr (S == 8)
      asm("ld.global.cs.v2.u32 {%0, %1}, [%2];" : "=r"(u.w[0]), "=r"(u.w[1]) : "l"(ptr));
    else
      asm("ld.global.cs.u32 %0, [%1];" : "=r"(u.w[0]) : "l"(ptr));
    return u.v;
  }
}

template <int HINT, class V>
__device__ __forceinline__ void st_stream(V* ptr, const V& v) {
  constexpr int S = sizeof(V);
  if constexpr (HINT == 0 || (S != 16 && S != 8 && S != 4)) {
    *ptr = v;
  } else {
    union { V v; unsigned w[S / 4]; } u;
    u.v = v;
    if constexpr (S == 16)
      asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};"
                   :: "l"(ptr), "r"(u.w[0]), "r"(u.w[1]), "r"(u.w[2]), "r"(u.w[3]) : "memory");
    else if constexpr (S == 8)
      asm volatile("st.global.cs.v2.u32 [%0], {%1, %2};" :: "l"(ptr), "r"(u.w[0]), "r"(u.w[1]) : "memory");
    else
      asm volatile("st.global.cs.u32 [%0], %1;" :: "l"(ptr), "r"(u.w[0]) : "memory");
  }
}

// MapPaired: 16-bit in and out with float arithmetic go through map_vec's paired path. An op whose result
// must be the input's own bits (TransformTensor's Copy: NaN payloads) opts out by specialising MapExact.
template <class Op> struct MapExact { static constexpr bool value = false; };
template <class TI, class TO, class Op, int VEC, class A>
struct MapPaired {
  static constexpr bool value = Is16<TI>::value && Is16<TO>::value && sizeof(A) == 4 && VEC % 2 == 0 &&
                                !MapExact<Op>::value;
};

// One vector of results. Paired path: each 32-bit word of a 16-bit operand splits into two floats with one
// instruction each (unpack16x2), and two results round into one word with one cvt.rn.{bf16,f16}x2.f32
// (pack16x2), where element by element the compiler spends ~1.5 more instructions per element extracting
// and merging 16-bit fields (bf16 GELU is compute-bound on the H200). Rounding is the same as to_bf16's.
template <class TI, class TO, class Op, int VEC, class A>
__device__ __forceinline__ Vec<TO, VEC> map_vec(const MapParams& p, const Vec<TI, VEC> (&a)[3], const Vec<TO, VEC>& o,
                                               A alpha, A alpha2, A beta, bool blend) {
  Vec<TO, VEC> r;
  if constexpr (MapPaired<TI, TO, Op, VEC, A>::value) {
    const unsigned* w[3] = {reinterpret_cast<const unsigned*>(&a[0]), reinterpret_cast<const unsigned*>(&a[1]),
                            reinterpret_cast<const unsigned*>(&a[2])};
    const unsigned* wo = reinterpret_cast<const unsigned*>(&o);
    unsigned* wr = reinterpret_cast<unsigned*>(&r);
#pragma unroll
    for (int j = 0; j < VEC / 2; ++j) {
      float x[3][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}};
#pragma unroll
      for (int k = 0; k < 3; ++k)
        if (Op::reads & (1u << k)) El<TI>::unpack2(p, w[k][j], x[k][0], x[k][1], kIn16);
      float y[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) y[h] = Op::template apply<A>(x[0][h], x[1][h], x[2][h], p, alpha, alpha2);
      if (blend) {
        float lo, hi;
        El<TO>::unpack2(p, wo[j], lo, hi, kOut16);
        y[0] += beta * lo;
        y[1] += beta * hi;
      }
      wr[j] = El<TO>::pack2(p, y[0], y[1], kOut16);
    }
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e)
      r.v[e] = map_one<TI, TO, Op, A>(p, a[0].v[e], a[1].v[e], a[2].v[e], o.v[e], alpha, alpha2, beta, blend);
  }
  return r;
}

// One tile of map_contig: UNROLL vectors per thread, THREADS apart (each warp access is contiguous), all
// loads issued before any is used. CHECK: the tile may run past the last whole vector. Whole tiles get
// `blend` as a constant (see map_contig).
template <class TI, class TO, class Op, int VEC, int THREADS, int UNROLL, int HINT, bool CHECK, class A>
__device__ __forceinline__ void map_tile(const MapParams& p, i64 base, i64 nvec, A alpha, A alpha2, A beta,
                                         bool blend) {
  typedef Vec<TI, VEC> VI;
  typedef Vec<TO, VEC> VO;
  VI a[UNROLL][3];
  VO o[UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const i64 i = base + (i64)u * THREADS;
    if (!CHECK || i < nvec) {
#pragma unroll
      for (int k = 0; k < 3; ++k)
        if (Op::reads & (1u << k)) a[u][k] = ld_stream<HINT>(reinterpret_cast<const VI*>(p.in[k]) + i);
      if (blend) o[u] = ld_stream<HINT>(reinterpret_cast<const VO*>(p.out) + i);
    }
  }
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const i64 i = base + (i64)u * THREADS;
    if (!CHECK || i < nvec)
      st_stream<HINT>(reinterpret_cast<VO*>(p.out) + i,
                      map_vec<TI, TO, Op, VEC, A>(p, a[u], o[u], alpha, alpha2, beta, blend));
  }
}

// Dense operands in one memory order: flat index. VEC elements per access; the host guarantees every
// pointer is VEC-element aligned. The vectors form tiles of THREADS * UNROLL; block b takes tile b: the
// grid must cover every tile (the planner's does; a persistent grid looping over tiles measured 5-12%
// slower on the H200, and the loop alone cost fp32 GELU (tanh) 8 registers: 48 -> 40). Whole tiles are
// compiled three times: with blending, without, and without with alpha (and alpha2) 1 for float
// arithmetic, so that a beta == 0 call spends no instructions on the old value and a plain y = f(x) none
// on scaling (16-bit GELU is compute-bound on the H200).
// Elements past the last whole vector are done by the first block.
// MINB: blocks per SM the registers must allow; 0 (the default) asks for a full SM (2048 threads: at most
// 32 registers for 128 threads) when one 16-bit input maps to a 16-bit output, 1536 threads (40 registers)
// when one float input maps to a float output, else leaves registers to the compiler. With one or two
// 16-byte vectors per thread, occupancy is what keeps bytes in flight: bf16 GELU (tanh) took 63 registers,
// 1024 threads per SM, 16 KiB of loads in flight per SM where ~32 KiB cover the memory latency at 4.2 TB/s;
// fp32 GELU (erf) took 59 (95.8% of copy; capped at 40: 99.6%). Wider types, 8-bit types (16 elements a
// vector) and two inputs spill at 32, fp32 GELU (tanh), sigmoid and swish at 32 but not at 40.
// An op whose code would spill under that cap opts out by specialising MapRegisterHungry.
template <class Op> struct MapRegisterHungry { static constexpr bool value = false; };
template <class TI, class TO, class Op, int THREADS, int MINB>
struct MapMinBlocks {
  static constexpr bool one_input = (Op::reads & (Op::reads - 1)) == 0 && !MapRegisterHungry<Op>::value;
  static constexpr bool narrow = sizeof(TI) == 2 && sizeof(TO) == 2 && one_input;
  static constexpr bool single = Is32Float<TI>::value && Is32Float<TO>::value && one_input;
  static constexpr int value = MINB > 0 ? MINB : narrow ? 2048 / THREADS : single ? 1536 / THREADS : 1;
};

template <class TI, class TO, class Op, int VEC, int THREADS = kMapThreads, int UNROLL = kMapUnroll, int HINT = 0,
          int MINB = 0>
__global__ void __launch_bounds__(THREADS, (MapMinBlocks<TI, TO, Op, THREADS, MINB>::value))
    map_contig(const MapParams p) {
  typedef typename WiderAcc<typename AccOf<TI>::type, typename AccOf<TO>::type>::type A;
  const A alpha = (A)p.alpha, alpha2 = (A)p.alpha2, beta = (A)p.beta;
  const bool blend = p.flags & PYDNN_FLAG_BETA;
  constexpr int TILE = THREADS * UNROLL;
  const i64 nvec = p.n / VEC;
  const i64 ntiles = (nvec + TILE - 1) / TILE;
  if (const i64 t = blockIdx.x; t < ntiles) {
    const i64 base = t * TILE + threadIdx.x;
    if ((t + 1) * TILE <= nvec) {
      if (blend)
        map_tile<TI, TO, Op, VEC, THREADS, UNROLL, HINT, false>(p, base, nvec, alpha, alpha2, beta, true);
      else if (sizeof(A) == 4 && alpha == A(1) && alpha2 == A(1))  // the ops' products by 1 fold away
        map_tile<TI, TO, Op, VEC, THREADS, UNROLL, HINT, false>(p, base, nvec, A(1), A(1), beta, false);
      else
        map_tile<TI, TO, Op, VEC, THREADS, UNROLL, HINT, false>(p, base, nvec, alpha, alpha2, beta, false);
    } else
      map_tile<TI, TO, Op, VEC, THREADS, UNROLL, HINT, true>(p, base, nvec, alpha, alpha2, beta, blend);
  }
  if (VEC > 1 && blockIdx.x == 0) {
    for (i64 i = nvec * VEC + threadIdx.x; i < p.n; i += THREADS) {
      TI x0 = TI(), x1 = TI(), x2 = TI();
      TO old = TO();
      if (Op::reads & 1u) x0 = ((const TI*)p.in[0])[i];
      if (Op::reads & 2u) x1 = ((const TI*)p.in[1])[i];
      if (Op::reads & 4u) x2 = ((const TI*)p.in[2])[i];
      if (blend) old = ((const TO*)p.out)[i];
      ((TO*)p.out)[i] = map_one<TI, TO, Op, A>(p, x0, x1, x2, old, alpha, alpha2, beta, blend);
    }
  }
}

// Any strides (broadcast inputs have stride 0): each element's offsets from its coordinates.
template <class TI, class TO, class Op>
__global__ void __launch_bounds__(kMapThreads) map_strided(const MapParams p) {
  typedef typename WiderAcc<typename AccOf<TI>::type, typename AccOf<TO>::type>::type A;
  const A alpha = (A)p.alpha, alpha2 = (A)p.alpha2, beta = (A)p.beta;
  const i64 step = (i64)gridDim.x * kMapThreads;
  for (i64 i = (i64)blockIdx.x * kMapThreads + threadIdx.x; i < p.n; i += step) {
    i64 rem = i, off[4] = {0, 0, 0, 0};
    for (int d = p.ndim - 1; d >= 0; --d) {
      i64 c = rem % p.size[d];
      rem /= p.size[d];
#pragma unroll
      for (int k = 0; k < 4; ++k) off[k] += c * p.stride[k][d];
    }
    TI x0 = TI(), x1 = TI(), x2 = TI();
    TO old = TO();
    if (Op::reads & 1u) x0 = ((const TI*)p.in[0])[off[1]];
    if (Op::reads & 2u) x1 = ((const TI*)p.in[1])[off[2]];
    if (Op::reads & 4u) x2 = ((const TI*)p.in[2])[off[3]];
    if (p.flags & PYDNN_FLAG_BETA) old = ((const TO*)p.out)[off[0]];
    ((TO*)p.out)[off[0]] = map_one<TI, TO, Op, A>(p, x0, x1, x2, old, alpha, alpha2, beta,
                                                  p.flags & PYDNN_FLAG_BETA);
  }
}

}  // namespace pydnn

namespace pydnn {

// A batched 2-D transpose through shared memory, for single-input ops (reads == 1) whose collapsed
// problem has the input dense along dim ndim-2 and the output dense along dim ndim-1 (NCHW <-> NHWC):
// a 64 x 64 tile is read along the input's dense dim and written along the output's, both coalesced.
// The tile is large on purpose: each thread keeps 16 loads in flight, since bytes in flight per SM, not
// coalescing, bound a transpose (a 32 x 32 tile reached 70% of copy bandwidth in fp32 and 35% in bf16).
// Tiles are 64 (d0) x T1 (d1), T1 = 128 for inputs narrower than 4 bytes (float arithmetic) so that
// 16-bit data keeps as many bytes in flight as float. Dims 0 .. ndim-3 are batch dims. Block 32 x 8;
// grid.x = batch * tiles(ndim-2) * tiles(ndim-1).
constexpr int kTile = 64;
template <class TI, class A> struct TransposeTile { static constexpr int d1 = (sizeof(TI) < 4 && sizeof(A) == 4) ? 128 : 64; };

template <class TI, class TO, class Op>
__global__ void __launch_bounds__(256) map_transpose(const MapParams p) {
  typedef typename WiderAcc<typename AccOf<TI>::type, typename AccOf<TO>::type>::type A;
  constexpr int T1 = TransposeTile<TI, A>::d1;
  __shared__ A tile[kTile][T1 + 1];
  const int d1 = p.ndim - 2, d0 = p.ndim - 1;  // d1: input dense, d0: output dense
  const i64 n1 = p.size[d1], n0 = p.size[d0];
  const i64 t1n = (n1 + T1 - 1) / T1, t0n = (n0 + kTile - 1) / kTile;
  i64 bid = blockIdx.x;
  const i64 t0 = bid % t0n;
  bid /= t0n;
  const i64 t1 = bid % t1n;
  bid /= t1n;
  i64 in_off = 0, out_off = 0;
  for (int d = d1 - 1; d >= 0; --d) {  // batch coordinates
    i64 c = bid % p.size[d];
    bid /= p.size[d];
    in_off += c * p.stride[1][d];
    out_off += c * p.stride[0][d];
  }
  const i64 si1 = p.stride[1][d1], si0 = p.stride[1][d0], so1 = p.stride[0][d1], so0 = p.stride[0][d0];
  const TI* in = (const TI*)p.in[0] + in_off + t1 * T1 * si1 + t0 * kTile * si0;
  TO* out = (TO*)p.out + out_off + t1 * T1 * so1 + t0 * kTile * so0;
  const int w1 = (int)min((i64)T1, n1 - t1 * T1), w0 = (int)min((i64)kTile, n0 - t0 * kTile);
  const int tx = threadIdx.x, ty = threadIdx.y;
  const A alpha = (A)p.alpha, alpha2 = (A)p.alpha2, beta = (A)p.beta;
#pragma unroll
  for (int r = 0; r < kTile; r += 8) {  // read: consecutive tx walk the input's dense dim (d1)
#pragma unroll
    for (int c = 0; c < T1; c += 32) {
      const int i1 = c + tx, i0 = r + ty;
      if (i1 < w1 && i0 < w0) tile[i0][i1] = El<TI>::template get<A>(p, in[i1 * si1 + i0 * si0], kIn16);
    }
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < T1; r += 8) {  // write: consecutive tx walk the output's dense dim (d0)
#pragma unroll
    for (int c = 0; c < kTile; c += 32) {
      const int i0 = c + tx, i1 = r + ty;
      if (i1 < w1 && i0 < w0) {
        TO* dst = out + i1 * so1 + i0 * so0;
        A v = Op::template apply<A>(tile[i0][i1], A(0), A(0), p, alpha, alpha2);
        if (p.flags & PYDNN_FLAG_BETA) v += beta * El<TO>::template get<A>(p, *dst, kOut16);
        *dst = El<TO>::put(p, v, kOut16);
      }
    }
  }
}

}  // namespace pydnn
