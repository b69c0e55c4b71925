// Tensor ops (pydnn/ops/tensor_ops.py): SetTensor, ScaleTensor, AddTensor, OpTensor, TransformTensor.
//
// Element-wise functors for the generic map kernels of common/elementwise.cuh:
//   Set       y = value                                  (SetTensor; p.coef holds the value)
//   Scaled    out = alpha * in0 (+ beta * out)           (ScaleTensor, AddTensor, TransformTensor)
//   Copy      out = in0, bit for bit                     (TransformTensor between one type, alpha 1, beta 0)
//   Op*       C = op(alpha1 * A, alpha2 * B) + beta * C  (OpTensor; SQRT and NOT read A only)
// and a tiled batched-transpose kernel for TransformTensor between layouts whose dense dims differ
// (NCHW <-> NHWC and the like), below.
#include "common/elementwise.cuh"

namespace pydnn {
namespace tensor {

struct Set {
  static constexpr unsigned reads = 0;
  template <class A> __device__ static A apply(A, A, A, const MapParams& p, A, A) { return (A)p.coef; }
};
struct Scaled {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A a, A, A, const MapParams&, A alpha, A) { return alpha * a; }
};
// Copy: the map kernels use the exact specialisations of map_one below (no arithmetic type on the way).
struct Copy {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A a, A, A, const MapParams&, A, A) { return a; }
};
struct OpAdd {
  static constexpr unsigned reads = 3;
  template <class A> __device__ static A apply(A a, A b, A, const MapParams&, A al, A al2) { return al * a + al2 * b; }
};
struct OpMul {
  static constexpr unsigned reads = 3;
  template <class A> __device__ static A apply(A a, A b, A, const MapParams&, A al, A al2) {
    return (al * a) * (al2 * b);
  }
};
// MIN / MAX: with NaN propagation a NaN operand wins; without it the other operand does.
struct OpMin {
  static constexpr unsigned reads = 3;
  template <class A> __device__ static A apply(A a, A b, A, const MapParams& p, A al, A al2) {
    A x = al * a, y = al2 * b;
    if (m_isnan(x) || m_isnan(y)) return (p.flags & PYDNN_FLAG_NAN_PROP) ? (m_isnan(x) ? x : y) : (m_isnan(x) ? y : x);
    return x < y ? x : y;
  }
};
struct OpMax {
  static constexpr unsigned reads = 3;
  template <class A> __device__ static A apply(A a, A b, A, const MapParams& p, A al, A al2) {
    A x = al * a, y = al2 * b;
    if (m_isnan(x) || m_isnan(y)) return (p.flags & PYDNN_FLAG_NAN_PROP) ? (m_isnan(x) ? x : y) : (m_isnan(x) ? y : x);
    return x > y ? x : y;
  }
};
struct OpSqrt {
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A a, A, A, const MapParams&, A al, A) { return m_sqrt(al * a); }
};
struct OpNot {  // cuDNN's logical NOT on real numbers: 1 - x
  static constexpr unsigned reads = 1;
  template <class A> __device__ static A apply(A a, A, A, const MapParams&, A al, A) { return A(1) - al * a; }
};

}  // namespace tensor

// IEEE sqrtf's slow path spills at map_contig's full-SM register cap (bf16 with blending).
template <> struct MapRegisterHungry<tensor::OpSqrt> { static constexpr bool value = true; };
// Copy moves bits (map_one's exact specialisations below), never through float and back.
template <> struct MapExact<tensor::Copy> { static constexpr bool value = true; };

// Exact element moves for the map kernels. Copy returns its input untouched (an int64 above 2^53 or a NaN
// payload would not survive a trip through the arithmetic type); Set on int64 takes the value's own 64
// bits from p.coef (the host stores them there), since a double cannot hold every int64.
#define PYDNN_EXACT_COPY(T, A)                                                                           \
  template <>                                                                                            \
  __device__ __forceinline__ T map_one<T, T, tensor::Copy, A>(const MapParams&, T a0, T, T, T, A, A, A, bool) { \
    return a0;                                                                                           \
  }
PYDNN_EXACT_COPY(float, float)
PYDNN_EXACT_COPY(double, double)
PYDNN_EXACT_COPY(half_t, float)
PYDNN_EXACT_COPY(bf16_t, float)
PYDNN_EXACT_COPY(h16_t, float)
PYDNN_EXACT_COPY(signed char, float)
PYDNN_EXACT_COPY(unsigned char, float)
PYDNN_EXACT_COPY(int, double)
PYDNN_EXACT_COPY(i64, double)
#undef PYDNN_EXACT_COPY

template <>
__device__ __forceinline__ i64 map_one<i64, i64, tensor::Set, double>(const MapParams& p, i64, i64, i64, i64, double,
                                                                     double, double, bool) {
  return (i64)__double_as_longlong(p.coef);
}

namespace tensor {

// ---------------------------------------------------------------------------------------------------------
// Tiled batched transpose (TransformTensor where the input's and the output's dense dims differ).
//
// The host orders the collapsed problem so that dim ndim-2 is the input's dense dim (stride 1) and dim
// ndim-1 the output's (stride 1); the dims before them are batch dims. One block moves a kTile x kTile
// tile of one batch entry through shared memory: it reads along the input's dense dim and writes along
// the output's, both coalesced. VEC: every global access is one 16-byte vector (the host checks that the
// dense extents and every other stride are multiples of the vector and that both pointers are 16-byte
// aligned); otherwise one element per access. All loads of a phase are issued before any is used.
//
// A tile cell is one 4-byte shared-memory word (8 bytes for double arithmetic and 8-byte copies): the
// arithmetic value for converting ops, the raw bits for Copy. Rows are padded by one cell, and the lane
// layouts below make both phases conflict-free for 4-byte cells: while reading, lane (r, c) of a warp
// takes row r and vector c of a VI-row x 32-column block, so word r*(kTile+1) + c*VI + e hits bank
// r + c*VI + e; while writing, lane (r, g) gathers VO cells down column r from row g*VO, hitting bank
// g*VO + r + e. Block 32 x 8; grid x = tiles along the input's dense dim, y = tiles along the output's,
// z = batch entries (grid-stride over z beyond 65535).
constexpr int kTile = 64;

// Raw bits of an element, widened to a 32-bit word (64 for 8-byte types).
__device__ __forceinline__ unsigned raw(float x) { return __float_as_uint(x); }
__device__ __forceinline__ u64 raw(double x) { return (u64)__double_as_longlong(x); }
__device__ __forceinline__ unsigned raw(half_t x) { return x.bits; }
__device__ __forceinline__ unsigned raw(bf16_t x) { return x.bits; }
__device__ __forceinline__ unsigned raw(h16_t x) { return x.bits; }
__device__ __forceinline__ unsigned raw(signed char x) { return (unsigned char)x; }
__device__ __forceinline__ unsigned raw(unsigned char x) { return x; }
__device__ __forceinline__ unsigned raw(int x) { return (unsigned)x; }
__device__ __forceinline__ u64 raw(i64 x) { return (u64)x; }
template <class T> struct FromRaw;  // FromRaw<T>::get: the element whose bits raw() returned
template <> struct FromRaw<float> {
  __device__ static float get(unsigned s) { return __uint_as_float(s); }
};
template <> struct FromRaw<double> {
  __device__ static double get(u64 s) { return __longlong_as_double((i64)s); }
};
template <> struct FromRaw<half_t> {
  __device__ static half_t get(unsigned s) { half_t h; h.bits = (unsigned short)s; return h; }
};
template <> struct FromRaw<bf16_t> {
  __device__ static bf16_t get(unsigned s) { bf16_t h; h.bits = (unsigned short)s; return h; }
};
template <> struct FromRaw<h16_t> {
  __device__ static h16_t get(unsigned s) { h16_t h; h.bits = (unsigned short)s; return h; }
};
template <> struct FromRaw<signed char> {
  __device__ static signed char get(unsigned s) { return (signed char)(unsigned char)s; }
};
template <> struct FromRaw<unsigned char> {
  __device__ static unsigned char get(unsigned s) { return (unsigned char)s; }
};
template <> struct FromRaw<int> {
  __device__ static int get(unsigned s) { return (int)s; }
};
template <> struct FromRaw<i64> {
  __device__ static i64 get(u64 s) { return (i64)s; }
};

// What a tile cell holds and how an element goes in and comes out.
template <class TI, class TO, class Op>
struct Cell {
  typedef typename WiderAcc<typename AccOf<TI>::type, typename AccOf<TO>::type>::type A;
  typedef A S;
  // blocks per SM the vector and the scalar kernel are built for (256 threads: 4 blocks leave a thread
  // 64 registers, 3 blocks 80, 2 blocks 128); the most that compiles without spilling
  static constexpr bool narrow = sizeof(A) == 4 && sizeof(TI) < 8 && sizeof(TO) < 8;
  static constexpr int min_blocks = narrow ? 4 : 2, min_blocks_scalar = narrow ? 3 : 2;
  __device__ static S put(TI x, const MapParams& p) { return El<TI>::template get<A>(p, x, kIn16); }
  __device__ static TO get(S s, const MapParams& p, A alpha, A alpha2, A beta, TO old, bool blend) {
    A v = Op::template apply<A>(s, A(0), A(0), p, alpha, alpha2);
    if (blend) v += beta * El<TO>::template get<A>(p, old, kOut16);
    return El<TO>::put(p, v, kOut16);
  }
};
template <class T>
struct Cell<T, T, Copy> {
  typedef typename WiderAcc<typename AccOf<T>::type, typename AccOf<T>::type>::type A;
  typedef decltype(raw(T())) S;
  static constexpr int min_blocks = sizeof(T) <= 2 ? 8 : sizeof(T) == 4 ? 6 : 2;  // 32 / 40 / 128 registers
  static constexpr int min_blocks_scalar = sizeof(T) < 8 ? 4 : 2;
  __device__ static S put(T x, const MapParams&) { return raw(x); }
  __device__ static T get(S s, const MapParams&, A, A, A, T, bool) { return FromRaw<T>::get(s); }
};

// Store a vector: 16 bytes as one st.global.v4 built from the elements' bits (left to the compiler, a
// vector of 16-bit fields or of bit-cast cells goes out as several narrow stores); shorter ones as is.
template <class T, int N>
__device__ __forceinline__ void store_vec(T* dst, const Vec<T, N>& r) {
  if (sizeof(T) * N != 16) {
    *reinterpret_cast<Vec<T, N>*>(dst) = r;
    return;
  }
  unsigned w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int e = 0; e < N; ++e) {
    if (sizeof(T) == 8) {
      const u64 b = (u64)raw(r.v[e]);
      w[2 * e] = (unsigned)b;
      w[2 * e + 1] = (unsigned)(b >> 32);
    } else {
      const unsigned b = (unsigned)raw(r.v[e]);
      w[e * sizeof(T) / 4] |= b << (8 * ((e * sizeof(T)) % 4));
    }
  }
  asm volatile("{\n\t.reg .u64 g;\n\tcvta.to.global.u64 g, %0;\n\tst.global.v4.u32 [g], {%1, %2, %3, %4};\n\t}"
               :: "l"(dst), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]));
}

template <class TI, class TO, class Op, bool VEC>
__global__ void __launch_bounds__(256, VEC ? Cell<TI, TO, Op>::min_blocks : Cell<TI, TO, Op>::min_blocks_scalar)
    transpose(const MapParams p) {
  typedef Cell<TI, TO, Op> C;
  typedef typename C::S S;
  typedef typename C::A A;
  constexpr int VI = VEC ? 16 / (int)sizeof(TI) : 1;  // elements per input access
  constexpr int VO = VEC ? 16 / (int)sizeof(TO) : 1;  // elements per output access
  constexpr int CW = 32 / VI;                          // read: lanes along one input row
  constexpr int GW = 32 / VO;                          // write: lanes along one output row
  constexpr int HALVES = kTile / 32;                   // 32-wide column blocks per tile row
  constexpr int RSTEPS = (kTile / VI) * HALVES / 8;    // input accesses per thread
  constexpr int WSTEPS = (kTile / VO) * HALVES / 8;    // output accesses per thread
  typedef Vec<TI, VI> VIn;
  typedef Vec<TO, VO> VOut;
  __shared__ S tile[kTile][kTile + 1];

  const int d1 = p.ndim - 2, d0 = p.ndim - 1;  // d1: the input's dense dim; d0: the output's
  const i64 n1 = p.size[d1], n0 = p.size[d0];
  const i64 si0 = p.stride[1][d0], so1 = p.stride[0][d1];
  const i64 b1 = (i64)blockIdx.x * kTile, b0 = (i64)blockIdx.y * kTile;
  const int w1 = (int)min((i64)kTile, n1 - b1), w0 = (int)min((i64)kTile, n0 - b0);
  unsigned nbatch = 1;  // the host keeps the batch count below 2^32 (32-bit coordinate arithmetic)
  for (int d = 0; d < d1; ++d) nbatch *= (unsigned)p.size[d];
  const int lane = threadIdx.x, warp = threadIdx.y;
  const int rr = lane / CW, rc = lane % CW;  // read: row within the warp's block, vector along the row
  const int wr = lane / GW, wg = lane % GW;  // write: column within the warp's block, vector down it
  const A alpha = (A)p.alpha, alpha2 = (A)p.alpha2, beta = (A)p.beta;
  const bool blend = p.flags & PYDNN_FLAG_BETA;

  for (unsigned b = blockIdx.z; b < nbatch; b += gridDim.z) {
    i64 in_off = 0, out_off = 0;
    unsigned rem = b;
    for (int d = d1 - 1; d >= 0; --d) {  // batch coordinates (the outermost takes the rest)
      const unsigned c = d == 0 ? rem : rem % (unsigned)p.size[d];
      if (d > 0) rem /= (unsigned)p.size[d];
      in_off += (i64)c * p.stride[1][d];
      out_off += (i64)c * p.stride[0][d];
    }
    // Per thread, the column (read) or row (write) stays fixed and each step moves a constant distance:
    // read step s takes input row r0 + s*RROWS, write step s output row c0 + s*WROWS.
    constexpr int RROWS = 8 / HALVES * VI, WROWS = 8 / HALVES * VO;
    const int r0 = warp / HALVES * VI + rr, ci1 = warp % HALVES * 32 + rc * VI;
    const int c0 = warp / HALVES * VO + wr, ci0 = warp % HALVES * 32 + wg * VO;
    const TI* src = (const TI*)p.in[0] + in_off + b1 + (b0 + r0) * si0 + ci1;
    TO* dst = (TO*)p.out + out_off + (b1 + c0) * so1 + b0 + ci0;
    const i64 src_step = RROWS * si0, dst_step = WROWS * so1;

    VIn v[RSTEPS];
    if (ci1 < w1) {
#pragma unroll
      for (int s = 0; s < RSTEPS; ++s)
        if (r0 + s * RROWS < w0) v[s] = *reinterpret_cast<const VIn*>(src + s * src_step);
#pragma unroll
      for (int s = 0; s < RSTEPS; ++s)
        if (r0 + s * RROWS < w0) {
#pragma unroll
          for (int e = 0; e < VI; ++e) tile[r0 + s * RROWS][ci1 + e] = C::put(v[s].v[e], p);
        }
    }
    __syncthreads();

    if (ci0 < w0) {
      VOut old[WSTEPS] = {};
      if (blend) {
#pragma unroll
        for (int s = 0; s < WSTEPS; ++s)
          if (c0 + s * WROWS < w1) old[s] = *reinterpret_cast<const VOut*>(dst + s * dst_step);
      }
#pragma unroll
      for (int s = 0; s < WSTEPS; ++s)
        if (c0 + s * WROWS < w1) {
          VOut r;
#pragma unroll
          for (int e = 0; e < VO; ++e)
            r.v[e] = C::get(tile[ci0 + e][c0 + s * WROWS], p, alpha, alpha2, beta, old[s].v[e], blend);
          store_vec(dst + s * dst_step, r);
        }
    }
    __syncthreads();  // the next batch entry reuses the tile
  }
}

}  // namespace tensor
}  // namespace pydnn
