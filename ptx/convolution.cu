// Convolution on CUDA cores: one shared-memory-tiled implicit GEMM serving forward (IMPLICIT_GEMM),
// backward data (ALGO_0) and backward filter (ALGO_1), for every shape the descriptors allow (1-3
// spatial dims, any strides of every tensor, groups, padding, stride, dilation, both modes), plus the
// backward bias reduction and the deterministic split-K fold. See convolution_params.h for the params.
//
// Per group g the three directions are these GEMMs (C[m][n] = sum_k A[m][k] B[k][n]):
//
//   dir  M                 N            K                 A          B          C
//   FWD  N * OD * OH * OW  K/groups     C/g * T * R * S   x (im2col) filter     y
//   BWD  N * ID * IH * IW  C/groups     K/g * T * R * S   dy (gather) filter    dx
//   WGR  K/groups          C/g*T*R*S    N * OD * OH * OW  dy         x (im2col) dw (or split-K partials)
//
// Backward data gathers: dx[i] sums dy[o] over the taps with o * stride = i + pad - t * dil, so no
// atomics are needed and every output is written once (deterministic). Backward filter splits its long
// reduction over grid.z: each slice writes Acc partials to the workspace and conv_fold adds them in a
// fixed order (deterministic, bitwise reproducible).
//
// Tiling: a block of 256 threads computes a 64 x 64 tile of C in steps of 16 along K. Each thread loads
// 4 elements of A and 4 of B per step into registers (the next step's loads are issued before the
// current step's math), converts them to Acc, and stores them to shared memory; each thread then
// accumulates a 4 x 4 micro-tile (rows tx + 16 i, columns ty + 16 j). Which index consecutive threads
// load along (m or k for A, n or k for B) is chosen on the host from the strides, for coalescing.
// Loads decompose their fixed index (m or n) once per block; the reduction index is kept as mixed-radix
// digits advanced by the tile depth's digits (no division in the main loop).
#include "common/mma.cuh"
#include "common/params.h"
#include "common/types.cuh"
#include "convolution_params.h"

namespace pydnn {
namespace conv {

enum { kFwd = 0, kBwdData = 1, kBwdFilter = 2 };
constexpr int kBM = 64, kBN = 64, kBK = 16, kThreads = 256;
constexpr int kSlots = 4;  // elements of A (and of B) each thread loads per step

// The fixed index of one load slot, decomposed once: a base offset, 3 spatial base coordinates, valid.
struct Fixed {
  long long off;
  int base[3];
  bool ok;
};
// The reduction index of one load slot as digits (outermost first).
struct Red {
  int d[4];
  int k;
};

__device__ __forceinline__ void decompose3(int m, const int* size, int& n, int* c) {
  c[2] = m % size[2]; m /= size[2];
  c[1] = m % size[1]; m /= size[1];
  c[0] = m % size[0];
  n = m / size[0];
}

__device__ __forceinline__ void red_init(const ConvParams& p, int k, Red& r) {
  r.k = k;
  r.d[3] = k % p.red_size[3]; k /= p.red_size[3];
  r.d[2] = k % p.red_size[2]; k /= p.red_size[2];
  r.d[1] = k % p.red_size[1];
  r.d[0] = k / p.red_size[1];
}

// k += tile depth (BK; p.red_step holds its digits), digit by digit (each digit stays below twice its
// radix, so one subtraction carries).
template <int BK = kBK>
__device__ __forceinline__ void red_step(const ConvParams& p, Red& r) {
  r.k += BK;
  int c = 0;
#pragma unroll
  for (int i = 3; i >= 1; --i) {
    int v = r.d[i] + p.red_step[i] + c;
    c = v >= p.red_size[i];
    r.d[i] = c ? v - p.red_size[i] : v;
  }
  r.d[0] += p.red_step[0] + c;
}

// (t0 ? d[1 + i] : d[i]) below: a select between two registers; r.d[t0 + i] would put d in local memory.
__device__ __forceinline__ int flip_tap(const ConvParams& p, int i, int t) {
  return (p.flags & PYDNN_CONV_FLAG_FLIP) ? p.filt[i] - 1 - t : t;
}

// ---------------------------------------------------------------- operand A

template <int DIR>
__device__ __forceinline__ Fixed a_fixed(const ConvParams& p, int m) {
  Fixed f;
  f.ok = m < p.gm;
  if (!f.ok) m = 0;
  if (DIR == kFwd) {
    int n, o[3];
    decompose3(m, p.out_size, n, o);
    f.off = (long long)n * p.xs[0];
#pragma unroll
    for (int i = 0; i < 3; ++i) f.base[i] = o[i] * p.stride[i] - p.pad[i];
  } else if (DIR == kBwdData) {
    int n, c[3];
    decompose3(m, p.in_size, n, c);
    f.off = (long long)n * p.ys[0];
#pragma unroll
    for (int i = 0; i < 3; ++i) f.base[i] = c[i] + p.pad[i];
  } else {
    f.off = (long long)(blockIdx.z % p.groups * p.kg + m) * p.ys[1];
  }
  return f;
}

// A[m][k] as Acc (zero outside the tensor or the problem)
template <int DIR, class T, class Acc>
__device__ __forceinline__ Acc a_load(const ConvParams& p, const T* a, const Fixed& f, const Red& r, int kend, int g) {
  if (!f.ok || r.k >= kend) return Acc(0);
  long long off = f.off;
  const bool cin = p.flags & PYDNN_CONV_FLAG_CIN;
  const int ch = cin ? r.d[3] : r.d[0], t0 = cin ? 0 : 1;  // channel digit, first tap digit
  if (DIR == kFwd) {
    off += (long long)(g * p.cg + ch) * p.xs[1];
#pragma unroll
    for (int i = 0; i < 3; ++i) {
      const int q = f.base[i] + (t0 ? r.d[1 + i] : r.d[i]) * p.dil[i];
      if ((unsigned)q >= (unsigned)p.in_size[i]) return Acc(0);
      off += (long long)q * p.xs[2 + i];
    }
  } else if (DIR == kBwdData) {
    off += (long long)(g * p.kg + ch) * p.ys[1];
#pragma unroll
    for (int i = 0; i < 3; ++i) {
      int q = f.base[i] - (t0 ? r.d[1 + i] : r.d[i]) * p.dil[i];
      if (q < 0) return Acc(0);
      if (p.stride[i] != 1) {
        if (q % p.stride[i]) return Acc(0);
        q /= p.stride[i];
      }
      if (q >= p.out_size[i]) return Acc(0);
      off += (long long)q * p.ys[2 + i];
    }
  } else {
    off += (long long)r.d[0] * p.ys[0];
#pragma unroll
    for (int i = 0; i < 3; ++i) off += (long long)r.d[1 + i] * p.ys[2 + i];
  }
  return load<Acc>(a[off]);
}

// ---------------------------------------------------------------- operand B

template <int DIR>
__device__ __forceinline__ Fixed b_fixed(const ConvParams& p, int n) {
  Fixed f;
  f.ok = n < p.gn;
  if (!f.ok) n = 0;
  const int g = blockIdx.z % p.groups;
  if (DIR == kFwd) {
    f.off = (long long)(g * p.kg + n) * p.ws[0];
  } else if (DIR == kBwdData) {
    f.off = (long long)n * p.ws[1];
  } else {
    int c, t[3];
    decompose3(n, p.filt, c, t);
    f.off = (long long)(g * p.cg + c) * p.xs[1];
#pragma unroll
    for (int i = 0; i < 3; ++i) f.base[i] = t[i] * p.dil[i] - p.pad[i];
  }
  return f;
}

template <int DIR, class T, class Acc>
__device__ __forceinline__ Acc b_load(const ConvParams& p, const T* b, const Fixed& f, const Red& r, int kend, int g) {
  if (!f.ok || r.k >= kend) return Acc(0);
  long long off = f.off;
  const bool cin = p.flags & PYDNN_CONV_FLAG_CIN;
  const int ch = cin ? r.d[3] : r.d[0], t0 = cin ? 0 : 1;  // channel digit, first tap digit
  if (DIR == kFwd) {
    off += (long long)ch * p.ws[1];
#pragma unroll
    for (int i = 0; i < 3; ++i) off += (long long)flip_tap(p, i, (t0 ? r.d[1 + i] : r.d[i])) * p.ws[2 + i];
  } else if (DIR == kBwdData) {
    off += (long long)(g * p.kg + ch) * p.ws[0];
#pragma unroll
    for (int i = 0; i < 3; ++i) off += (long long)flip_tap(p, i, (t0 ? r.d[1 + i] : r.d[i])) * p.ws[2 + i];
  } else {
    off += (long long)r.d[0] * p.xs[0];
#pragma unroll
    for (int i = 0; i < 3; ++i) {
      const int q = r.d[1 + i] * p.stride[i] + f.base[i];
      if ((unsigned)q >= (unsigned)p.in_size[i]) return Acc(0);
      off += (long long)q * p.xs[2 + i];
    }
  }
  return load<Acc>(b[off]);
}

// ---------------------------------------------------------------- epilogue

template <class Acc> __device__ __forceinline__ Acc activate(const ConvParams& p, Acc v) {
  const bool nan = v != v;
  switch (p.act) {
    case PYDNN_CONV_ACT_RELU:
      if (nan) return (p.flags & PYDNN_FLAG_NAN_PROP) ? v : Acc(0);
      return v > Acc(0) ? v : Acc(0);
    case PYDNN_CONV_ACT_CLIPPED_RELU:
      if (nan) return (p.flags & PYDNN_FLAG_NAN_PROP) ? v : Acc(0);
      return v > Acc(0) ? (v < Acc(p.coef) ? v : Acc(p.coef)) : Acc(0);
    case PYDNN_CONV_ACT_SIGMOID: return sigmoid(v);
    case PYDNN_CONV_ACT_TANH: return m_tanh(v);
    case PYDNN_CONV_ACT_ELU: return v > Acc(0) ? v : Acc(p.coef) * m_expm1(v);
    default: return v;
  }
}

// out[off] = alpha * v (+ beta * out[off]); forward also (+ alpha2 * z[zoff]) (+ bias[ch]), then act.
template <bool FWD, class T, class Acc>
__device__ __forceinline__ Acc epilogue_value(const ConvParams& p, const T* out, long long off, long long zoff, int ch,
                                              Acc v, Acc alpha, Acc beta, Acc alpha2) {
  v *= alpha;
  if (p.flags & PYDNN_FLAG_BETA) v += beta * load<Acc>(out[off]);
  if (FWD) {
    if (p.flags & PYDNN_CONV_FLAG_Z) v += alpha2 * load<Acc>(static_cast<const T*>(p.z)[zoff]);
    if (p.flags & PYDNN_CONV_FLAG_BIAS) v += load<Acc>(static_cast<const T*>(p.bias)[ch * p.bias_stride]);
    v = activate(p, v);
  }
  return v;
}

template <bool FWD, class T, class Acc>
__device__ __forceinline__ void finish(const ConvParams& p, T* out, long long off, long long zoff, int ch, Acc v,
                                       Acc alpha, Acc beta, Acc alpha2) {
  out[off] = store<T>(epilogue_value<FWD>(p, out, off, zoff, ch, v, alpha, beta, alpha2));
}

// Where C[m][n] of group g lands in the output tensor (element offset), and the bias channel.
template <int DIR>
__device__ __forceinline__ long long out_offset(const ConvParams& p, int m, int n, int g, long long& zoff, int& ch) {
  if (DIR == kFwd) {
    int b, o[3];
    decompose3(m, p.out_size, b, o);
    ch = g * p.kg + n;
    zoff = (long long)b * p.zs[0] + (long long)ch * p.zs[1] + (long long)o[0] * p.zs[2] +
           (long long)o[1] * p.zs[3] + (long long)o[2] * p.zs[4];
    return (long long)b * p.ys[0] + (long long)ch * p.ys[1] + (long long)o[0] * p.ys[2] +
           (long long)o[1] * p.ys[3] + (long long)o[2] * p.ys[4];
  } else if (DIR == kBwdData) {
    int b, c[3];
    decompose3(m, p.in_size, b, c);
    ch = g * p.cg + n;
    return (long long)b * p.xs[0] + (long long)ch * p.xs[1] + (long long)c[0] * p.xs[2] +
           (long long)c[1] * p.xs[3] + (long long)c[2] * p.xs[4];
  } else {
    int c, t[3];
    decompose3(n, p.filt, c, t);
    ch = g * p.kg + m;
    return (long long)ch * p.ws[0] + (long long)c * p.ws[1] + (long long)flip_tap(p, 0, t[0]) * p.ws[2] +
           (long long)flip_tap(p, 1, t[1]) * p.ws[3] + (long long)flip_tap(p, 2, t[2]) * p.ws[4];
  }
}

// ---------------------------------------------------------------- the kernel

// grid: (ceil(M / 64), ceil(N / 64), groups * splits), 256 threads.
template <int DIR, class T>
__global__ void __launch_bounds__(kThreads) implicit_gemm(const ConvParams p) {
  typedef typename AccOf<T>::type Acc;
  __shared__ Acc As[kBK][kBM + 1];
  __shared__ Acc Bs[kBK][kBN + 1];

  const int t = threadIdx.x;
  const int g = blockIdx.z % p.groups;
  const int split = blockIdx.z / p.groups;
  const int m0 = blockIdx.x * kBM, n0 = blockIdx.y * kBN;
  const int kbeg = split * p.k_per_split;
  const int kend = min(p.gk, kbeg + p.k_per_split);
  const T* A = static_cast<const T*>(p.x);
  const T* B = static_cast<const T*>(p.w);

  // load slots: (row, k) within the tile for each of the 4 elements this thread moves per step
  const bool akf = p.flags & PYDNN_CONV_FLAG_A_KFAST, bkf = p.flags & PYDNN_CONV_FLAG_B_KFAST;
  int a_row[kSlots], a_k[kSlots], b_col[kSlots], b_k[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    a_row[s] = akf ? t / kBK + 16 * s : t % kBM;
    a_k[s] = akf ? t % kBK : t / kBM + 4 * s;
    b_col[s] = bkf ? t / kBK + 16 * s : t % kBN;
    b_k[s] = bkf ? t % kBK : t / kBN + 4 * s;
  }
  Fixed af[kSlots], bf[kSlots];
  Red ar[kSlots], br[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    af[s] = a_fixed<DIR>(p, m0 + a_row[s]);
    bf[s] = b_fixed<DIR>(p, n0 + b_col[s]);
    red_init(p, kbeg + a_k[s], ar[s]);
    red_init(p, kbeg + b_k[s], br[s]);
  }

  Acc acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = Acc(0);

  Acc ra[kSlots], rb[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    ra[s] = a_load<DIR, T, Acc>(p, A, af[s], ar[s], kend, g);
    rb[s] = b_load<DIR, T, Acc>(p, B, bf[s], br[s], kend, g);
  }
  const int tx = t % 16, ty = t / 16;
  for (int k0 = kbeg; k0 < kend; k0 += kBK) {
#pragma unroll
    for (int s = 0; s < kSlots; ++s) {
      As[a_k[s]][a_row[s]] = ra[s];
      Bs[b_k[s]][b_col[s]] = rb[s];
    }
    __syncthreads();
    if (k0 + kBK < kend) {  // the next step's loads, in flight during this step's math
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        red_step(p, ar[s]);
        red_step(p, br[s]);
        ra[s] = a_load<DIR, T, Acc>(p, A, af[s], ar[s], kend, g);
        rb[s] = b_load<DIR, T, Acc>(p, B, bf[s], br[s], kend, g);
      }
    }
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      Acc av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = As[kk][tx + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = Bs[kk][ty + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
    }
    __syncthreads();
  }

  T* out = static_cast<T*>(p.out);
  const Acc alpha = (Acc)p.alpha, beta = (Acc)p.beta, alpha2 = (Acc)p.alpha2;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int m = m0 + tx + 16 * i;
    if (m >= p.gm) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int n = n0 + ty + 16 * j;
      if (n >= p.gn) continue;
      if (p.flags & PYDNN_CONV_FLAG_PARTIAL) {
        Acc* part = static_cast<Acc*>(p.out);
        part[((long long)blockIdx.z * p.gm + m) * p.gn + n] = acc[i][j];
        continue;
      }
      long long zoff = 0;
      int ch = 0;
      const long long off = out_offset<DIR>(p, m, n, g, zoff, ch);
      finish<DIR == kFwd>(p, out, off, zoff, ch, acc[i][j], alpha, beta, alpha2);
    }
  }
}

// ---------------------------------------------------------------- split-K fold (backward filter)

// dw = alpha * sum over slices (in slice order) + beta * dw; one thread per filter element.
template <class T>
__global__ void __launch_bounds__(256) fold(const ConvAuxParams p) {
  typedef typename AccOf<T>::type Acc;
  const long long per_group = (long long)p.kg * p.cg * p.taps;
  const long long total = per_group * p.groups;
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int g = (int)(i / per_group);
  const long long r = i % per_group;  // = m * (cg * taps) + n, the GEMM's layout
  const Acc* part = static_cast<const Acc*>(p.in);
  Acc s = Acc(0);
  for (int sl = 0; sl < p.splits; ++sl) s += part[((long long)sl * p.groups + g) * per_group + r];
  const int m = (int)(r / ((long long)p.cg * p.taps));
  int n = (int)(r % ((long long)p.cg * p.taps));
  int tap[3];
  tap[2] = n % p.filt[2]; n /= p.filt[2];
  tap[1] = n % p.filt[1]; n /= p.filt[1];
  tap[0] = n % p.filt[0];
  const int c = n / p.filt[0];
  long long off = (long long)(g * p.kg + m) * p.out_stride[0] + (long long)c * p.out_stride[1];
#pragma unroll
  for (int d = 0; d < 3; ++d) {
    const int td = (p.flags & PYDNN_CONV_FLAG_FLIP) ? p.filt[d] - 1 - tap[d] : tap[d];
    off += (long long)td * p.out_stride[2 + d];
  }
  T* out = static_cast<T*>(p.out);
  Acc v = (Acc)p.alpha * s;
  if (p.flags & PYDNN_FLAG_BETA) v += (Acc)p.beta * load<Acc>(out[off]);
  out[off] = store<T>(v);
}

// ---------------------------------------------------------------- backward bias

// db[c] = alpha * sum over (n, d, h, w) of dy + beta * db[c]: one block of 256 threads per channel, a
// fixed-order tree sum (deterministic).
template <class T>
__global__ void __launch_bounds__(256) bias_grad(const ConvAuxParams p) {
  typedef typename AccOf<T>::type Acc;
  __shared__ Acc part[256];
  const T* dy = static_cast<const T*>(p.in);
  for (long long c = blockIdx.x; c < p.channels; c += gridDim.x) {
    Acc s = Acc(0);
    for (long long e = threadIdx.x; e < p.count; e += blockDim.x) {
      long long q = e;
      const long long w = q % p.inner[3]; q /= p.inner[3];
      const long long h = q % p.inner[2]; q /= p.inner[2];
      const long long d = q % p.inner[1];
      const long long n = q / p.inner[1];
      s += load<Acc>(dy[n * p.in_stride[0] + c * p.in_stride[1] + d * p.in_stride[2] + h * p.in_stride[3] +
                        w * p.in_stride[4]]);
    }
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = 128; w > 0; w >>= 1) {
      if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      T* out = static_cast<T*>(p.out);
      const long long off = c * p.out_stride[1];
      Acc v = (Acc)p.alpha * part[0];
      if (p.flags & PYDNN_FLAG_BETA) v += (Acc)p.beta * load<Acc>(out[off]);
      out[off] = store<T>(v);
    }
    __syncthreads();
  }
}


// ---------------------------------------------------------------- tensor cores (IMPLICIT_PRECOMP_GEMM)

// Forward on tensor cores for half / bfloat16, NHWC-like x (channel stride 1, other strides multiples
// of 8), NHWC filters (K, T, R, S, C), C a multiple of 8, one group. The reduction index is (t, r, s, c)
// with c innermost, so every 16-byte chunk of 8 channels is one cp.async from one filter tap.
//
// Block: 128 x BN of C (output positions x output channels; BN = 128, or 64 for narrow layers), 256
// threads = 8 warps (64 x 32 warp tiles for BN 128, 32 x 32 for BN 64), k steps of 32 through a
// kTcStages-deep cp.async pipeline in dynamic shared memory (copies for the next stages fly while this
// stage's MMAs run). Shared tiles are row major with 40 elements (80 bytes) per row, so the 8 row
// addresses of each ldmatrix fall in 8 different bank groups. Out-of-range rows, taps in the padding and
// k past the end are zero-filled by cp.async. "Precomputed": each thread decomposes its A rows
// (n, d, h, w) and B rows once; the k walk is the CUDA-core kernel's digit stepping (no division).
// The epilogue stores channel pairs as one 32-bit word when y's channels are contiguous (FLAG_PAIR).
constexpr int kTcBM = 128, kTcBK = 32, kTcLd = 40, kTcThreads = 256, kTcStages = 3;

template <int BN> struct TcShape {
  static constexpr int WM = BN == 128 ? 64 : 32, WN = 32;  // warp tile
  static constexpr int WARPS_M = kTcBM / WM;               // 2 or 4 (x WARPS_N = BN / WN = 4 or 2)
  static constexpr int B_SLOTS = BN / 64;                  // B chunks per thread per stage
  static constexpr int STAGE = (kTcBM + BN) * kTcLd;       // elements per stage
};

template <class T, int BN>
__global__ void __launch_bounds__(kTcThreads) fwd_tc(const ConvParams p) {
  typedef TcShape<BN> Sh;
  extern __shared__ __align__(128) unsigned char tc_smem[];
  T* smem = reinterpret_cast<T*>(tc_smem);  // stage s: A at s * STAGE, B right after A's 128 rows
  const int t = threadIdx.x, warp = t >> 5;
  const int m0 = blockIdx.x * kTcBM, n0 = blockIdx.y * BN;
  const T* x = static_cast<const T*>(p.x);
  const T* w = static_cast<const T*>(p.w);

  // producer state: A rows t/4 and t/4 + 64, B rows t/4 (+ 64), 16-byte chunk t%4 of the 32 k
  const int chunk = t & 3;
  Fixed af[2];
  long long boff[Sh::B_SLOTS];
  bool bok[Sh::B_SLOTS];
#pragma unroll
  for (int s = 0; s < 2; ++s) af[s] = a_fixed<kFwd>(p, m0 + (t >> 2) + 64 * s);
#pragma unroll
  for (int s = 0; s < Sh::B_SLOTS; ++s) {
    const int n = n0 + (t >> 2) + 64 * s;
    bok[s] = n < p.gn;
    boff[s] = (long long)(bok[s] ? n : 0) * p.ws[0];
  }
  Red kr;
  red_init(p, chunk * 8, kr);

  // copies of the next k tile (the one kr points at) into `stage`; kr then steps to the tile after
  auto load_tile = [&](int stage) {
    T* sa = smem + stage * Sh::STAGE;
    T* sb = sa + kTcBM * kTcLd;
    const bool kok = kr.k < p.gk;
    const int c = kr.d[3];
    long long woff = c;
#pragma unroll
    for (int i = 0; i < 3; ++i) woff += (long long)flip_tap(p, i, kr.d[i]) * p.ws[2 + i];
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      long long off = af[s].off + c;
      bool in = kok && af[s].ok;
#pragma unroll
      for (int i = 0; i < 3; ++i) {
        const int q = af[s].base[i] + kr.d[i] * p.dil[i];
        in = in && (unsigned)q < (unsigned)p.in_size[i];
        off += (long long)q * p.xs[2 + i];
      }
      const int row = (t >> 2) + 64 * s;
      mma::cp_async_16(mma::smem_u32(sa + row * kTcLd + chunk * 8), in ? x + off : x, in);
    }
#pragma unroll
    for (int s = 0; s < Sh::B_SLOTS; ++s) {
      const int row = (t >> 2) + 64 * s;
      const bool bv = kok && bok[s];
      mma::cp_async_16(mma::smem_u32(sb + row * kTcLd + chunk * 8), bv ? w + boff[s] + woff : w, bv);
    }
    red_step<kTcBK>(p, kr);
  };

  mma::MmaSm80<T, Sh::WM, Sh::WN> eng;
  eng.zero();
  const int wm = (warp % Sh::WARPS_M) * Sh::WM, wn = (warp / Sh::WARPS_M) * Sh::WN;
  const int tiles = (p.gk + kTcBK - 1) / kTcBK;
#pragma unroll
  for (int s = 0; s < kTcStages - 1; ++s) {
    if (s < tiles) load_tile(s);
    mma::cp_async_commit();  // (possibly empty: the group count stays uniform)
  }
  for (int kt = 0; kt < tiles; ++kt) {
    mma::cp_async_wait<kTcStages - 2>();  // tile kt has landed (for this thread) ...
    __syncthreads();                      // ... for every thread; and stage (kt - 1) % S is free
    if (kt + kTcStages - 1 < tiles) load_tile((kt + kTcStages - 1) % kTcStages);
    mma::cp_async_commit();
    const T* sa = smem + (kt % kTcStages) * Sh::STAGE;
    const T* sb = sa + kTcBM * kTcLd;
#pragma unroll
    for (int ks = 0; ks < kTcBK; ks += 16) eng.step(sa + wm * kTcLd + ks, sb + wn * kTcLd + ks, kTcLd);
  }
  mma::cp_async_wait<0>();

  // epilogue: each thread's rows (TM m16 tiles x 2 halves) decomposed once
  T* out = static_cast<T*>(p.out);
  const float alpha = (float)p.alpha, beta = (float)p.beta, alpha2 = (float)p.alpha2;
  const bool plain = !(p.flags & (PYDNN_FLAG_BETA | PYDNN_CONV_FLAG_Z | PYDNN_CONV_FLAG_BIAS)) &&
                     p.act == PYDNN_CONV_ACT_IDENTITY;
  const bool pair = p.flags & PYDNN_CONV_FLAG_PAIR;
#pragma unroll
  for (int i = 0; i < eng.TM; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = m0 + wm + eng.row_of(i, 2 * h);
      if (m >= p.gm) continue;
      int b, o[3];
      decompose3(m, p.out_size, b, o);
      const long long yrow = (long long)b * p.ys[0] + (long long)o[0] * p.ys[2] + (long long)o[1] * p.ys[3] +
                             (long long)o[2] * p.ys[4];
      const long long zrow = (long long)b * p.zs[0] + (long long)o[0] * p.zs[2] + (long long)o[1] * p.zs[3] +
                             (long long)o[2] * p.zs[4];
#pragma unroll
      for (int j = 0; j < eng.TN; ++j) {
        const int n = n0 + wn + eng.col_of(j, 0);  // even; n + 1 is the pair's second channel
        if (n >= p.gn) continue;
        const bool two = n + 1 < p.gn;
        float v0 = eng.acc[i][j][2 * h], v1 = eng.acc[i][j][2 * h + 1];
        const long long off = yrow + (long long)n * p.ys[1];
        if (plain) {
          v0 *= alpha;
          v1 *= alpha;
        } else {
          v0 = epilogue_value<true>(p, out, off, zrow + (long long)n * p.zs[1], n, v0, alpha, beta, alpha2);
          if (two)
            v1 = epilogue_value<true>(p, out, off + p.ys[1], zrow + (long long)(n + 1) * p.zs[1], n + 1, v1, alpha,
                                      beta, alpha2);
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

// Backward data on tensor cores (BWD_DATA_ALGO_1): dx = sum over taps and output channels of dy * w, as
// an implicit GEMM with M = N * D * H * W (dx positions), N = C, K = (t, r, s, k) with the output
// channel k innermost. Needs NHWC-like dy (channel stride 1, other strides multiples of 8), an NHWC
// filter (K, T, R, S, C), K and C multiples of 8, one group. A gathers dy where (i + pad - t * dil) is a
// multiple of the stride (zero-filled elsewhere: with stride s, (s^d - 1) / s^d of the MMAs meet zeros).
// B is the filter as stored, [k][c] with c contiguous: its tile is kept [k][n] in shared memory and
// ldmatrix .trans makes the fragments. Otherwise as fwd_tc (stages, warp tiles, epilogue pairs).
template <int BN> struct TcKnShape {
  static constexpr int LDB = BN + 8;                       // B rows: BN channels + 16 bytes
  static constexpr int CHUNKS = BN / 8;                    // 16-byte chunks per B row
  static constexpr int B_SLOTS = kTcBK * CHUNKS / kTcThreads;  // 2 (BN 128) or 1 (BN 64)
  static constexpr int STAGE = kTcBM * kTcLd + kTcBK * LDB;
};

template <class T, int BN>
__global__ void __launch_bounds__(kTcThreads) bwd_data_tc(const ConvParams p) {
  typedef TcShape<BN> Sh;
  typedef TcKnShape<BN> Kn;
  extern __shared__ __align__(128) unsigned char tc_smem[];
  T* smem = reinterpret_cast<T*>(tc_smem);
  const int t = threadIdx.x, warp = t >> 5;
  const int m0 = blockIdx.x * kTcBM, n0 = blockIdx.y * BN;
  const T* dy = static_cast<const T*>(p.x);
  const T* w = static_cast<const T*>(p.w);

  const int chunk = t & 3;
  Fixed af[2];
#pragma unroll
  for (int s = 0; s < 2; ++s) af[s] = a_fixed<kBwdData>(p, m0 + (t >> 2) + 64 * s);
  Red ar;
  red_init(p, chunk * 8, ar);
  // B slots: row (k) t / CHUNKS + s * (256 / CHUNKS), chunk (8 channels) t % CHUNKS
  const int bc = n0 + (t % Kn::CHUNKS) * 8;
  const bool bcol_ok = bc < p.gn;
  Red br[Kn::B_SLOTS];
#pragma unroll
  for (int s = 0; s < Kn::B_SLOTS; ++s) red_init(p, t / Kn::CHUNKS + s * (kTcThreads / Kn::CHUNKS), br[s]);

  auto load_tile = [&](int stage) {
    T* sa = smem + stage * Kn::STAGE;
    T* sb = sa + kTcBM * kTcLd;
    const bool kok = ar.k < p.gk;
    const int k = ar.d[3];
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      long long off = af[s].off + k;
      bool in = kok && af[s].ok;
#pragma unroll
      for (int i = 0; i < 3; ++i) {
        int q = af[s].base[i] - ar.d[i] * p.dil[i];
        in = in && q >= 0;
        if (p.stride[i] != 1) {
          in = in && q % p.stride[i] == 0;
          q /= p.stride[i];
        }
        in = in && q < p.out_size[i];
        off += (long long)q * p.ys[2 + i];
      }
      const int row = (t >> 2) + 64 * s;
      mma::cp_async_16(mma::smem_u32(sa + row * kTcLd + chunk * 8), in ? dy + off : dy, in);
    }
#pragma unroll
    for (int s = 0; s < Kn::B_SLOTS; ++s) {
      const bool bv = bcol_ok && br[s].k < p.gk;
      long long off = (long long)br[s].d[3] * p.ws[0] + bc;
#pragma unroll
      for (int i = 0; i < 3; ++i) off += (long long)flip_tap(p, i, br[s].d[i]) * p.ws[2 + i];
      const int row = t / Kn::CHUNKS + s * (kTcThreads / Kn::CHUNKS);
      mma::cp_async_16(mma::smem_u32(sb + row * Kn::LDB + (t % Kn::CHUNKS) * 8), bv ? w + off : w, bv);
      red_step<kTcBK>(p, br[s]);
    }
    red_step<kTcBK>(p, ar);
  };

  mma::MmaSm80<T, Sh::WM, Sh::WN> eng;
  eng.zero();
  const int wm = (warp % Sh::WARPS_M) * Sh::WM, wn = (warp / Sh::WARPS_M) * Sh::WN;
  const int tiles = (p.gk + kTcBK - 1) / kTcBK;
#pragma unroll
  for (int s = 0; s < kTcStages - 1; ++s) {
    if (s < tiles) load_tile(s);
    mma::cp_async_commit();
  }
  for (int kt = 0; kt < tiles; ++kt) {
    mma::cp_async_wait<kTcStages - 2>();
    __syncthreads();
    if (kt + kTcStages - 1 < tiles) load_tile((kt + kTcStages - 1) % kTcStages);
    mma::cp_async_commit();
    const T* sa = smem + (kt % kTcStages) * Kn::STAGE;
    const T* sb = sa + kTcBM * kTcLd;
#pragma unroll
    for (int ks = 0; ks < kTcBK; ks += 16) eng.step_kn(sa + wm * kTcLd + ks, kTcLd, sb + ks * Kn::LDB + wn, Kn::LDB);
  }
  mma::cp_async_wait<0>();

  T* out = static_cast<T*>(p.out);
  const float alpha = (float)p.alpha, beta = (float)p.beta;
  const bool has_beta = p.flags & PYDNN_FLAG_BETA, pair = p.flags & PYDNN_CONV_FLAG_PAIR;
#pragma unroll
  for (int i = 0; i < eng.TM; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = m0 + wm + eng.row_of(i, 2 * h);
      if (m >= p.gm) continue;
      int b, c3[3];
      decompose3(m, p.in_size, b, c3);
      const long long row = (long long)b * p.xs[0] + (long long)c3[0] * p.xs[2] + (long long)c3[1] * p.xs[3] +
                            (long long)c3[2] * p.xs[4];
#pragma unroll
      for (int j = 0; j < eng.TN; ++j) {
        const int n = n0 + wn + eng.col_of(j, 0);
        if (n >= p.gn) continue;
        const bool two = n + 1 < p.gn;
        const long long off = row + (long long)n * p.xs[1];
        float v0 = alpha * eng.acc[i][j][2 * h], v1 = alpha * eng.acc[i][j][2 * h + 1];
        if (has_beta) {
          v0 += beta * load<float>(out[off]);
          if (two) v1 += beta * load<float>(out[off + p.xs[1]]);
        }
        if (pair && two) {
          const T lo = store<T>(v0), hi = store<T>(v1);
          *reinterpret_cast<unsigned*>(out + off) = (unsigned)lo.bits | ((unsigned)hi.bits << 16);
        } else {
          out[off] = store<T>(v0);
          if (two) out[off + p.xs[1]] = store<T>(v1);
        }
      }
    }
}

}  // namespace conv
}  // namespace pydnn
