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
#include "common/mma_pipe.cuh"
#include "common/params.h"
#include "common/types.cuh"
#include "common/wgmma.cuh"
#include "convolution_params.h"
#include "conv_epilogue.cuh"
#include "conv_vec8.cuh"

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
// activate_as / activate / activate_n / epilogue_value: conv_epilogue.cuh

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

// dw = alpha * sum over slices (in slice order) + beta * dw; one thread per filter element. The partials'
// columns are (c, t, r, s) from implicit_gemm, or (t, r, s, c) from wgrad_tc (FLAG_CIN).
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
  int c = 0;
  if (p.flags & PYDNN_CONV_FLAG_CIN) {  // the tensor-core GEMM's columns: (t, r, s, c), c innermost
    c = n % p.cg;
    n /= p.cg;
  }
  int tap[3];
  tap[2] = n % p.filt[2]; n /= p.filt[2];
  tap[1] = n % p.filt[1]; n /= p.filt[1];
  tap[0] = n % p.filt[0];
  if (!(p.flags & PYDNN_CONV_FLAG_CIN)) c = n / p.filt[0];  // the CUDA-core GEMM's: (c, t, r, s)
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


// ---------------------------------------------------------------- grouped tensor-core convolutions
//
// A grouped convolution on the tensor-core kernels (ops/convolution/grouped.py): P consecutive groups are
// packed into one "supergroup" of P * C/g input and P * K/g output channels whose filter is block-diagonal
// (filter_group_pack writes it dense, zeros off the diagonal, into the workspace), so narrow groups (K/g =
// 4..32) still fill the kernels' 64-wide channel tiles. The *_grouped kernels run one supergroup per grid.z
// (backward filter: grid.z = split * supergroups + supergroup): group_view moves the operands' bases to the
// supergroup's channels; cg / kg / gm / gn / gk are the supergroup's. Backward filter writes the dense
// supergroup dw as fp32 partials; fold_group_diag keeps the diagonal blocks (the real groups' filters).
template <int DIR, class T>
__device__ __forceinline__ ConvParams group_view(const ConvParams& p) {
  ConvParams q = p;
  const long long g = blockIdx.z % p.groups;
  const T* a = static_cast<const T*>(p.x);
  const T* b = static_cast<const T*>(p.w);
  if (DIR == kFwd) {  // x channels g * cg, filter rows g * kg, y (bias, z) channels g * kg
    q.x = a + g * p.cg * p.xs[1];
    q.w = b + g * p.kg * p.ws[0];
    q.out = static_cast<T*>(p.out) + g * p.kg * p.ys[1];
    if (p.bias != nullptr) q.bias = static_cast<const T*>(p.bias) + g * p.kg * p.bias_stride;
    if (p.z != nullptr) q.z = static_cast<const T*>(p.z) + g * p.kg * p.zs[1];
  } else if (DIR == kBwdData) {  // dy channels g * kg, filter rows g * kg, dx channels g * cg
    q.x = a + g * p.kg * p.ys[1];
    q.w = b + g * p.kg * p.ws[0];
    q.out = static_cast<T*>(p.out) + g * p.cg * p.xs[1];
  } else {  // dy channels g * kg (A), x channels g * cg (B); the partials by grid.z in the epilogue
    q.x = a + g * p.kg * p.ys[1];
    q.w = b + g * p.cg * p.xs[1];
  }
  return q;
}

// filter_group_pack: the block-diagonal supergroup filter, dense [K][taps][P * cg] (c innermost) from w
// (any strides: in_stride = (k, c, t, r, s)). kg, cg: the real groups' channels; channels = P; taps, filt.
// One thread per packed element; zero where the column's group is not the row's.
template <class T>
__global__ void __launch_bounds__(256) filter_group_pack(const ConvAuxParams p) {
  const int P = p.channels;
  const long long cg2 = (long long)P * p.cg;
  const long long total = (long long)p.groups * p.kg * p.taps * cg2;
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int c2 = (int)(i % cg2);
  const int tap = (int)(i / cg2 % p.taps);
  const int k = (int)(i / (cg2 * p.taps));
  const int j = (k / p.kg) % P;  // the row's slot in its supergroup
  T v;
  v.bits = 0;
  if (c2 / p.cg == j) {
    int q = tap;
    const int s = q % p.filt[2];
    q /= p.filt[2];
    const int r = q % p.filt[1];
    const int t = q / p.filt[1];
    const T* w = static_cast<const T*>(p.in);
    v = w[(long long)k * p.in_stride[0] + (long long)(c2 % p.cg) * p.in_stride[1] + (long long)t * p.in_stride[2] +
          (long long)r * p.in_stride[3] + (long long)s * p.in_stride[4]];
  }
  static_cast<T*>(p.out)[i] = v;
}

// fold_group_diag: dw = alpha * (sum over splits, in order, of the supergroup partials' diagonal blocks) +
// beta * dw. Partials [split][supergroup][P * kg][taps][P * cg] (wgrad_*_grouped, columns (t, r, s, c));
// groups, kg, cg: the real ones; channels = P; out_stride: dw's strides (k, c, t, r, s); FLAG_FLIP.
template <class T>
__global__ void __launch_bounds__(256) fold_group_diag(const ConvAuxParams p) {
  const int P = p.channels;
  const long long per_group = (long long)p.kg * p.cg * p.taps;  // dw elements of one group: (m, tap, c)
  const long long total = per_group * p.groups;
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const int g = (int)(i / per_group);
  long long r = i % per_group;
  const int c = (int)(r % p.cg);
  r /= p.cg;
  const int tap = (int)(r % p.taps);
  const int m = (int)(r / p.taps);
  const int sg = g / P, j = g % P, sgroups = p.groups / P;
  const long long cg2 = (long long)P * p.cg, gn = cg2 * p.taps, per_sg = (long long)P * p.kg * gn;
  const long long col = (long long)tap * cg2 + (long long)j * p.cg + c;
  const float* part = static_cast<const float*>(p.in) + (long long)sg * per_sg + ((long long)j * p.kg + m) * gn + col;
  float s = 0.f;
  for (int sl = 0; sl < p.splits; ++sl) s += part[(long long)sl * sgroups * per_sg];
  int q = tap, td[3];
  td[2] = q % p.filt[2];
  q /= p.filt[2];
  td[1] = q % p.filt[1];
  td[0] = q / p.filt[1];
  long long off = (long long)(g * p.kg + m) * p.out_stride[0] + (long long)c * p.out_stride[1];
#pragma unroll
  for (int d = 0; d < 3; ++d) {
    const int t = (p.flags & PYDNN_CONV_FLAG_FLIP) ? p.filt[d] - 1 - td[d] : td[d];
    off += (long long)t * p.out_stride[2 + d];
  }
  T* out = static_cast<T*>(p.out);
  float v = (float)p.alpha * s;
  if (p.flags & PYDNN_FLAG_BETA) v += (float)p.beta * load<float>(out[off]);
  out[off] = store<T>(v);
}

// ---------------------------------------------------------------- tensor cores (IMPLICIT_PRECOMP_GEMM)

// Forward on tensor cores for half / bfloat16, NHWC-like x (channel stride 1, other strides multiples
// of 8), NHWC filters (K, T, R, S, C), C a multiple of 8, one group. The reduction index is (t, r, s, c)
// with c innermost, so every 16-byte chunk of 8 channels is one cp.async from one filter tap.
//
// Block: BM x BN of C (output positions x output channels; BM and BN 128 or 64, chosen on the host
// for the wave count and narrow layers), 256 threads = 8 warps (TcShape: 64 x 32 warp tiles for
// 128 x 128, 32 x 32 for one side 64, 32 x 16 for 64 x 64), k steps of 32 through a
// TcShape::STAGES-deep cp.async pipeline in dynamic shared memory (copies for the next stages fly while this
// stage's MMAs run). Shared tiles are row major with 40 elements (80 bytes) per row, so the 8 row
// addresses of each ldmatrix fall in 8 different bank groups. Out-of-range rows, taps in the padding and
// k past the end are zero-filled by cp.async. "Precomputed": each thread decomposes its A rows
// (n, d, h, w) and B rows once; the k walk is the CUDA-core kernel's digit stepping (no division).
// The epilogue stores channel pairs as one 32-bit word when y's channels are contiguous (FLAG_PAIR).
constexpr int kTcBK = 32, kTcLd = 40, kTcThreads = 256;

template <int BM, int BN> struct TcShape {
  static constexpr int WM = (BM == 128 && BN == 128) ? 64 : 32;  // warp tile WM x WN
  static constexpr int WN = (BM == 64 && BN == 64) ? 16 : 32;
  static constexpr int WARPS_M = BM / WM;                  // x WARPS_N = BN / WN = 8 warps
  static constexpr int A_SLOTS = BM / 64;                  // A chunks (rows t/4 + 64 s) per thread per stage
  static constexpr int B_SLOTS = BN / 64;                  // B chunks per thread per stage (forward)
  static constexpr int STAGE = (BM + BN) * kTcLd;          // elements per stage (forward)
  static constexpr int STAGES = 4;                         // cp.async pipeline depth
  static_assert(WARPS_M * (BN / WN) * 32 == kTcThreads, "8 warps");
};

// The forward epilogue in registers (fwd_tc_epilogue) serves the plain convolution_forward (alpha only)
// and the fused bias + IDENTITY / RELU / CLIPPED_RELU without z or beta (the conv + bias + ReLU of a
// network); anything else (beta, z, SIGMOID / TANH / ELU) goes through fwd_staged_epilogue, and
// FLAG_STAGED sends every case there.
__device__ __forceinline__ bool fwd_in_registers(const ConvParams& p) {
  return !(p.flags & (PYDNN_FLAG_BETA | PYDNN_CONV_FLAG_Z | PYDNN_CONV_FLAG_STAGED)) &&
         (p.act == PYDNN_CONV_ACT_IDENTITY || p.act == PYDNN_CONV_ACT_RELU || p.act == PYDNN_CONV_ACT_CLIPPED_RELU);
}

constexpr int kActReluNoNan = 16;  // fwd_tc_epilogue's ACT for RELU with NOT_PROPAGATE_NAN (fmaxf)

// fwd_tc's and implicit_gemm_pipe_tc's forward epilogue in registers: act(alpha * acc (+ bias)) for the
// warp's accumulators (rows from m_base, columns from n_base), channel pairs stored as one word
// (FLAG_PAIR). FUSED false: the plain op (alpha only). FUSED true: the bias (FLAG_BIAS; zeros without
// it) read once per column pair, then the activation ACT, compiled in (no switch per element). Where the
// biases come from: breg, this thread's biases already in registers as floats, breg[2 * j + e] for column
// col_of(j, e) (fwd_wgmma<FB = 1>, which loads them before its K walk); else sbias, the bias in shared
// memory as floats from column n_base on (fwd_wgmma<FB = 0>); else (both nullptr) read here.
template <class T, bool FUSED, int ACT, class Eng>
__device__ __forceinline__ void fwd_tc_epilogue(const ConvParams& p, const Eng& eng, int m_base, int n_base,
                                                const float* sbias = nullptr, const float* breg = nullptr) {
  T* out = static_cast<T*>(p.out);
  const float alpha = (float)p.alpha;
  const bool pair = p.flags & PYDNN_CONV_FLAG_PAIR;
  float bv[Eng::TN][2];
  if (FUSED) {
    const T* bias = static_cast<const T*>(p.bias);
    const bool has_bias = p.flags & PYDNN_CONV_FLAG_BIAS;
#pragma unroll
    for (int j = 0; j < Eng::TN; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int n = n_base + eng.col_of(j, e);
        bv[j][e] = breg != nullptr ? breg[2 * j + e]
                   : has_bias && n < p.gn ? (sbias != nullptr ? sbias[eng.col_of(j, e)]
                                                              : load<float>(bias[(long long)n * p.bias_stride]))
                                          : 0.f;
      }
  }
  // each thread's rows (TM m16 tiles x 2 halves) decomposed once
#pragma unroll
  for (int i = 0; i < Eng::TM; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = m_base + eng.row_of(i, 2 * h);
      if (m >= p.gm) continue;
      int b, o[3];
      decompose3(m, p.out_size, b, o);
      const long long yrow = (long long)b * p.ys[0] + (long long)o[0] * p.ys[2] + (long long)o[1] * p.ys[3] +
                             (long long)o[2] * p.ys[4];
#pragma unroll
      for (int j = 0; j < Eng::TN; ++j) {
        const int n = n_base + eng.col_of(j, 0);  // even; n + 1 is the pair's second channel
        if (n >= p.gn) continue;
        const bool two = n + 1 < p.gn;
        float v0, v1;
        if (!FUSED) {
          v0 = eng.acc[i][j][2 * h] * alpha;
          v1 = eng.acc[i][j][2 * h + 1] * alpha;
        } else if (ACT == kActReluNoNan) {  // one FFMA and one FMNMX per element (max(NaN, 0) = 0)
          v0 = fmaxf(fmaf(eng.acc[i][j][2 * h], alpha, bv[j][0]), 0.f);
          v1 = fmaxf(fmaf(eng.acc[i][j][2 * h + 1], alpha, bv[j][1]), 0.f);
        } else {
          v0 = activate_as<ACT>(p, fmaf(eng.acc[i][j][2 * h], alpha, bv[j][0]));
          v1 = activate_as<ACT>(p, fmaf(eng.acc[i][j][2 * h + 1], alpha, bv[j][1]));
        }
        const long long off = yrow + (long long)n * p.ys[1];
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

template <class T, int BM, int BN, int THREADS, class Eng>
__device__ __forceinline__ void fwd_staged_epilogue(const ConvParams& p, const Eng& eng, unsigned char* smem_raw,
                                                    int m0, int n0, int wm, int wn);

// The forward epilogue of a tensor-core kernel: in registers where it can (plain, or bias + a clamp-type
// activation), else staged through shared memory. sbias: the block's bias in shared memory (floats from
// column n0 on) when the kernel parked it there; breg: the thread's biases in registers (fwd_tc_epilogue)
// when the kernel loaded them ahead; else nullptr.
template <class T, int BM, int BN, int THREADS, class Eng>
__device__ __forceinline__ void fwd_epilogue(const ConvParams& p, const Eng& eng, unsigned char* smem_raw, int m0,
                                             int n0, int wm, int wn, const float* sbias = nullptr,
                                             const float* breg = nullptr) {
  // the epilogues' row decompositions must not be hoisted above the main loop (ptxas then spilled 20-28
  // bytes in the 128 x 64 pipelined tile): the block's tile origin comes through an opaque asm
  asm volatile("" : "+r"(m0), "+r"(n0));
  const int em = m0 + wm, en = n0 + wn;
  const bool plain = !(p.flags & PYDNN_CONV_FLAG_BIAS) && p.act == PYDNN_CONV_ACT_IDENTITY;
  const float* sb = sbias != nullptr ? sbias + wn : nullptr;
  if (!fwd_in_registers(p))
    fwd_staged_epilogue<T, BM, BN, THREADS>(p, eng, smem_raw, m0, n0, wm, wn);
  else if (plain)
    fwd_tc_epilogue<T, false, PYDNN_CONV_ACT_IDENTITY>(p, eng, em, en);
  else if (p.act == PYDNN_CONV_ACT_RELU && !(p.flags & PYDNN_FLAG_NAN_PROP))
    fwd_tc_epilogue<T, true, kActReluNoNan>(p, eng, em, en, sb, breg);
  else if (p.act == PYDNN_CONV_ACT_RELU)
    fwd_tc_epilogue<T, true, PYDNN_CONV_ACT_RELU>(p, eng, em, en, sb, breg);
  else if (p.act == PYDNN_CONV_ACT_CLIPPED_RELU)
    fwd_tc_epilogue<T, true, PYDNN_CONV_ACT_CLIPPED_RELU>(p, eng, em, en, sb, breg);
  else
    fwd_tc_epilogue<T, true, PYDNN_CONV_ACT_IDENTITY>(p, eng, em, en, sb, breg);
}

// unpack8 / load8 / store8: conv_vec8.cuh

// Can a tensor with these (n, c, d, h, w) strides be read / written 8 channels at a time (16 bytes)?
__device__ __forceinline__ bool vec8_ok(const void* ptr, const long long* st) {
  return ptr != nullptr && st[1] == 1 && ((st[0] | st[2] | st[3] | st[4]) & 7) == 0 &&
         (reinterpret_cast<unsigned long long>(ptr) & 15) == 0;
}

// The general forward epilogue (beta, z, bias, activation: ConvolutionBiasActivationForward and
// convolution_forward with beta != 0): the block's BM x BN accumulators are staged in shared memory
// (fp32, rows of BN + 8 floats: a half-warp's float2 writes hit 32 distinct banks), then each thread
// finishes groups of 8 channels of one output row (an unrolled pass for the common case, else a rolled
// loop): 16-byte loads of y (beta) and z,
// one load of the 8 biases, one activation switch per group, a 16-byte store (scalar fallbacks where a
// tensor's layout does not allow vectors). The code stays small: the per-element version, unrolled over
// the warp tile with the activation switch inlined 64 times, was ~200 KB of SASS and ran the fused
// convolution at 1.9x the plain one. smem: at least BM * (BN + 8) * 4 bytes, free for reuse.
template <class T, int BM, int BN, int THREADS, class Eng>
__device__ __forceinline__ void fwd_staged_epilogue(const ConvParams& p, const Eng& eng, unsigned char* smem_raw,
                                                    int m0, int n0, int wm, int wn) {
  constexpr int LD = BN + 8;  // floats per staged row
  float* st = reinterpret_cast<float*>(smem_raw);
  __syncthreads();  // every warp is done with the pipeline's shared stages
#pragma unroll
  for (int i = 0; i < Eng::TM; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < Eng::TN; ++j)
        *reinterpret_cast<float2*>(st + (wm + eng.row_of(i, 2 * h)) * LD + wn + eng.col_of(j, 0)) =
            make_float2(eng.acc[i][j][2 * h], eng.acc[i][j][2 * h + 1]);
  __syncthreads();
  constexpr int GPR = BN / 8;  // 8-channel groups per row
  T* out = static_cast<T*>(p.out);
  const T* z = static_cast<const T*>(p.z);
  const T* bias = static_cast<const T*>(p.bias);
  const float alpha = (float)p.alpha, beta = (float)p.beta, alpha2 = (float)p.alpha2;
  const bool use_beta = p.flags & PYDNN_FLAG_BETA, use_z = p.flags & PYDNN_CONV_FLAG_Z;
  const bool use_bias = p.flags & PYDNN_CONV_FLAG_BIAS;
  const bool vec = (p.gn & 7) == 0 && vec8_ok(out, p.ys) && (!use_z || vec8_ok(z, p.zs));
  const bool bvec = use_bias && p.bias_stride == 1 && (reinterpret_cast<unsigned long long>(bias) & 15) == 0;
  // The common case in one unrolled pass: 16-byte layouts and an IDENTITY / RELU / CLIPPED_RELU
  // activation. A thread's channel group is the same in all its G rows (THREADS is a multiple of GPR),
  // so its 8 biases are read once, and every z / y load of its rows is issued before the first is used
  // (one memory latency per thread, not G: the rolled loop below ran conv + z + bias + ReLU at 1.25x
  // the plain forward).
  constexpr int G = BM * GPR / THREADS, RSTEP = THREADS / GPR;
  if (THREADS % GPR == 0 && vec && p.act <= PYDNN_CONV_ACT_CLIPPED_RELU) {
    const int c = (threadIdx.x % GPR) * 8, n = n0 + c, r0 = threadIdx.x / GPR;
    if (n >= p.gn) return;
    float bs[8];
    if (use_bias && bvec) {
      load8(bias + n, bs);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) bs[e] = use_bias ? load<float>(bias[(long long)(n + e) * p.bias_stride]) : 0.f;
    }
    long long yoff[G];
    bool ok[G];
    uint4 zq[G], yq[G];
#pragma unroll
    for (int k = 0; k < G; ++k) {
      const int m = m0 + r0 + RSTEP * k;
      ok[k] = m < p.gm;
      yoff[k] = 0;
      zq[k] = yq[k] = make_uint4(0, 0, 0, 0);
      if (ok[k]) {
        int b, o[3];
        decompose3(m, p.out_size, b, o);
        yoff[k] = (long long)b * p.ys[0] + (long long)o[0] * p.ys[2] + (long long)o[1] * p.ys[3] +
                  (long long)o[2] * p.ys[4] + n;
        const long long zoff = (long long)b * p.zs[0] + (long long)o[0] * p.zs[2] + (long long)o[1] * p.zs[3] +
                               (long long)o[2] * p.zs[4] + n;
        if (use_z) zq[k] = *reinterpret_cast<const uint4*>(z + zoff);
        if (use_beta) yq[k] = *reinterpret_cast<const uint4*>(out + yoff[k]);
      }
    }
    const int sw = (c >> 5) & 1;  // as below: a quarter-warp's float4 reads in distinct banks
#pragma unroll
    for (int k = 0; k < G; ++k) {
      if (!ok[k]) continue;
      const float* row = st + (r0 + RSTEP * k) * LD + c;
      const float4 qa = *reinterpret_cast<const float4*>(row + 4 * sw);
      const float4 qb = *reinterpret_cast<const float4*>(row + 4 - 4 * sw);
      const float4 lo = sw ? qb : qa, hi = sw ? qa : qb;
      float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w}, u[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] *= alpha;
      if (use_beta) {
        unpack8<T>(yq[k], u);
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] += beta * u[e];
      }
      if (use_z) {
        unpack8<T>(zq[k], u);
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] += alpha2 * u[e];
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] += bs[e];
      if (p.act == PYDNN_CONV_ACT_RELU) {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = activate_as<PYDNN_CONV_ACT_RELU>(p, v[e]);
      } else if (p.act == PYDNN_CONV_ACT_CLIPPED_RELU) {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = activate_as<PYDNN_CONV_ACT_CLIPPED_RELU>(p, v[e]);
      }
      store8(out + yoff[k], v);
    }
    return;
  }
#pragma unroll 1
  for (int g = threadIdx.x; g < BM * GPR; g += THREADS) {
    const int r = g / GPR, c = (g % GPR) * 8;
    const int m = m0 + r, n = n0 + c;
    if (m >= p.gm || n >= p.gn) continue;
    float v[8];
    // the two float4 halves in an order that puts a quarter-warp's reads in distinct banks
    const int sw = (c >> 5) & 1;
    const float4 qa = *reinterpret_cast<const float4*>(st + r * LD + c + 4 * sw);
    const float4 qb = *reinterpret_cast<const float4*>(st + r * LD + c + 4 - 4 * sw);
    const float4 lo = sw ? qb : qa, hi = sw ? qa : qb;
    v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
    int b, o[3];
    decompose3(m, p.out_size, b, o);
    const long long yoff = (long long)b * p.ys[0] + (long long)o[0] * p.ys[2] + (long long)o[1] * p.ys[3] +
                           (long long)o[2] * p.ys[4] + (long long)n * p.ys[1];
    const long long zoff = (long long)b * p.zs[0] + (long long)o[0] * p.zs[2] + (long long)o[1] * p.zs[3] +
                           (long long)o[2] * p.zs[4] + (long long)n * p.zs[1];
    const int cnt = p.gn - n < 8 ? p.gn - n : 8;
    float u[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] *= alpha;
    if (use_beta) {
      if (vec) {
        load8(out + yoff, u);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) u[e] = e < cnt ? load<float>(out[yoff + e * p.ys[1]]) : 0.f;
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] += beta * u[e];
    }
    if (use_z) {
      if (vec) {
        load8(z + zoff, u);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) u[e] = e < cnt ? load<float>(z[zoff + e * p.zs[1]]) : 0.f;
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] += alpha2 * u[e];
    }
    if (use_bias) {
      if (bvec && cnt == 8) {
        load8(bias + n, u);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) u[e] = e < cnt ? load<float>(bias[(long long)(n + e) * p.bias_stride]) : 0.f;
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] += u[e];
    }
    activate_n(p, v);
    if (vec) {
      store8(out + yoff, v);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (e < cnt) out[yoff + e * p.ys[1]] = store<T>(v[e]);
    }
  }
}

template <class T, int BM, int BN>
__device__ __forceinline__ void fwd_tc_body(const ConvParams& p) {
  typedef TcShape<BM, BN> Sh;
  extern __shared__ __align__(128) unsigned char tc_smem[];
  T* smem = reinterpret_cast<T*>(tc_smem);  // stage s: A at s * STAGE, B right after A's BM rows
  const int t = threadIdx.x, warp = t >> 5;
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
  const T* x = static_cast<const T*>(p.x);
  const T* w = static_cast<const T*>(p.w);

  // producer state: A rows t/4 (+ 64), B rows t/4 (+ 64), 16-byte chunk t%4 of the 32 k
  const int chunk = t & 3;
  Fixed af[Sh::A_SLOTS];
  long long boff[Sh::B_SLOTS];
  bool bok[Sh::B_SLOTS];
#pragma unroll
  for (int s = 0; s < Sh::A_SLOTS; ++s) af[s] = a_fixed<kFwd>(p, m0 + (t >> 2) + 64 * s);
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
    T* sb = sa + BM * kTcLd;
    const bool kok = kr.k < p.gk;
    const int c = kr.d[3];
    long long woff = c;
#pragma unroll
    for (int i = 0; i < 3; ++i) woff += (long long)flip_tap(p, i, kr.d[i]) * p.ws[2 + i];
#pragma unroll
    for (int s = 0; s < Sh::A_SLOTS; ++s) {
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
  for (int s = 0; s < Sh::STAGES - 1; ++s) {
    if (s < tiles) load_tile(s);
    mma::cp_async_commit();  // (possibly empty: the group count stays uniform)
  }
  for (int kt = 0; kt < tiles; ++kt) {
    mma::cp_async_wait<Sh::STAGES - 2>();  // tile kt has landed (for this thread) ...
    __syncthreads();                      // ... for every thread; and stage (kt - 1) % S is free
    if (kt + Sh::STAGES - 1 < tiles) load_tile((kt + Sh::STAGES - 1) % Sh::STAGES);
    mma::cp_async_commit();
    const T* sa = smem + (kt % Sh::STAGES) * Sh::STAGE;
    const T* sb = sa + BM * kTcLd;
#pragma unroll
    for (int ks = 0; ks < kTcBK; ks += 16) eng.step(sa + wm * kTcLd + ks, sb + wn * kTcLd + ks, kTcLd);
  }
  mma::cp_async_wait<0>();

  static_assert(BM * (BN + 8) * 4 <= Sh::STAGES * Sh::STAGE * 2, "the staged epilogue fits the stages");
  fwd_epilogue<T, BM, BN, kTcThreads>(p, eng, tc_smem, m0, n0, wm, wn);
}

template <class T, int BM, int BN>
__global__ void __launch_bounds__(kTcThreads, 2) fwd_tc(const ConvParams p) {
  fwd_tc_body<T, BM, BN>(p);
}

// grouped: grid.z = the (super)group, its operands' bases moved by group_view
template <class T, int BM, int BN>
__global__ void __launch_bounds__(kTcThreads, 2) fwd_tc_grouped(const ConvParams p) {
  const ConvParams q = group_view<kFwd, T>(p);
  fwd_tc_body<T, BM, BN>(q);
}

// Backward data on tensor cores (BWD_DATA_ALGO_1): dx = sum over taps and output channels of dy * w, as
// an implicit GEMM with M = N * D * H * W (dx positions), N = C, K = (t, r, s, k) with the output
// channel k innermost. Needs NHWC-like dy (channel stride 1, other strides multiples of 8), an NHWC
// filter (K, T, R, S, C), K and C multiples of 8, one group. A gathers dy where (i + pad - t * dil) is a
// multiple of the stride (zero-filled elsewhere: with stride s, (s^d - 1) / s^d of the MMAs meet zeros).
// B is the filter as stored, [k][c] with c contiguous: its tile is kept [k][n] in shared memory and
// ldmatrix .trans makes the fragments. Otherwise as fwd_tc (stages, warp tiles, epilogue pairs).
template <int BM, int BN> struct TcKnShape {
  static constexpr int LDB = BN + 8;                       // B rows: BN channels + 16 bytes
  static constexpr int CHUNKS = BN / 8;                    // 16-byte chunks per B row
  static constexpr int B_SLOTS = kTcBK * CHUNKS / kTcThreads;  // 2 (BN 128) or 1 (BN 64)
  static constexpr int STAGE = BM * kTcLd + kTcBK * LDB;
};

// bwd_data_tc's and implicit_gemm_pipe_tc's (backward data) epilogue: dx = alpha * acc (+ beta * dx) for the warp's accumulators.
template <class T, class Eng>
__device__ __forceinline__ void bwd_data_tc_epilogue(const ConvParams& p, const Eng& eng, int m_base, int n_base) {
  T* out = static_cast<T*>(p.out);
  const float alpha = (float)p.alpha, beta = (float)p.beta;
  const bool has_beta = p.flags & PYDNN_FLAG_BETA, pair = p.flags & PYDNN_CONV_FLAG_PAIR;
#pragma unroll
  for (int i = 0; i < Eng::TM; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = m_base + eng.row_of(i, 2 * h);
      if (m >= p.gm) continue;
      int b, c3[3];
      decompose3(m, p.in_size, b, c3);
      const long long row = (long long)b * p.xs[0] + (long long)c3[0] * p.xs[2] + (long long)c3[1] * p.xs[3] +
                            (long long)c3[2] * p.xs[4];
#pragma unroll
      for (int j = 0; j < Eng::TN; ++j) {
        const int n = n_base + eng.col_of(j, 0);
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

template <class T, int BM, int BN>
__device__ __forceinline__ void bwd_data_tc_body(const ConvParams& p) {
  typedef TcShape<BM, BN> Sh;
  typedef TcKnShape<BM, BN> Kn;
  extern __shared__ __align__(128) unsigned char tc_smem[];
  T* smem = reinterpret_cast<T*>(tc_smem);
  const int t = threadIdx.x, warp = t >> 5;
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
  const T* dy = static_cast<const T*>(p.x);
  const T* w = static_cast<const T*>(p.w);

  const int chunk = t & 3;
  Fixed af[Sh::A_SLOTS];
#pragma unroll
  for (int s = 0; s < Sh::A_SLOTS; ++s) af[s] = a_fixed<kBwdData>(p, m0 + (t >> 2) + 64 * s);
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
    T* sb = sa + BM * kTcLd;
    const bool kok = ar.k < p.gk;
    const int k = ar.d[3];
#pragma unroll
    for (int s = 0; s < Sh::A_SLOTS; ++s) {
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
  for (int s = 0; s < Sh::STAGES - 1; ++s) {
    if (s < tiles) load_tile(s);
    mma::cp_async_commit();
  }
  for (int kt = 0; kt < tiles; ++kt) {
    mma::cp_async_wait<Sh::STAGES - 2>();
    __syncthreads();
    if (kt + Sh::STAGES - 1 < tiles) load_tile((kt + Sh::STAGES - 1) % Sh::STAGES);
    mma::cp_async_commit();
    const T* sa = smem + (kt % Sh::STAGES) * Kn::STAGE;
    const T* sb = sa + BM * kTcLd;
#pragma unroll
    for (int ks = 0; ks < kTcBK; ks += 16) eng.step_kn(sa + wm * kTcLd + ks, kTcLd, sb + ks * Kn::LDB + wn, Kn::LDB);
  }
  mma::cp_async_wait<0>();

  bwd_data_tc_epilogue<T>(p, eng, m0 + wm, n0 + wn);
}

template <class T, int BM, int BN>
__global__ void __launch_bounds__(kTcThreads, 2) bwd_data_tc(const ConvParams p) {
  bwd_data_tc_body<T, BM, BN>(p);
}

template <class T, int BM, int BN>
__global__ void __launch_bounds__(kTcThreads, 2) bwd_data_tc_grouped(const ConvParams p) {
  const ConvParams q = group_view<kBwdData, T>(p);
  bwd_data_tc_body<T, BM, BN>(q);
}

// ---------------------------------------------------------------- pipelined tensor-core kernels

// Forward (IMPLICIT_PRECOMP_GEMM) and stride-1 backward data (BWD_DATA_ALGO_1) on the pipelined main
// loop of common/mma_pipe.cuh (matmul's structure: 64-deep K tiles, swizzled 128-byte rows, fragments
// double-buffered in registers, one barrier per K tile), with the implicit-GEMM gather precomputed per
// thread (as CUTLASS's "optimized" iterators do, against the "analytic" ones that re-derive every
// address). The reduction runs over (tap, channel block of 64), channels innermost, so one K tile is 64
// channels of ONE filter tap (a channel count that is not a multiple of 64 zero-fills the block's rest):
//   - each thread copies A_ROWS rows (RS rows apart) x one 16-byte chunk of A; per row it keeps, from
//     one decomposition at the start, the element offset of its (n, base position) and a validity mask
//     over the taps (bit t * R + r: dims d and h in range; bit 16 + s: w in range; 0 past M);
//   - the tap's offset (t, r, s) and its channel block are the same for every row, so a tile costs per
//     row a mask test, a 64-bit add and a cp.async, and per thread a few counter steps (no division);
//   - B (the filter) rows are contiguous runs: a base offset per thread plus the tap's offset.
// Forward: A = x gathered [m][k], B = w as [n = k_out][k] (ldmatrix for both). Backward data (stride 1:
// dy position = dx position + pad - tap * dil): A = dy gathered, B = w as [k = k_out][n = c] kept [k][n]
// in shared memory and read with ldmatrix .trans. Epilogues: fwd_tc_epilogue / bwd_data_tc_epilogue.
// Needs (host-checked) NHWC-like activations (channel stride 1, other strides multiples of 8), an NHWC
// filter, C and K multiples of 8, one group, T * R <= 16 and S <= 16; backward data stride 1.
constexpr int kPipeStages = 3;

template <int BM, int BN, int WARPS_M, int WARPS_N> struct PipeShape {
  static constexpr int THREADS = WARPS_M * WARPS_N * 32;
  static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;  // warp tile
  static constexpr int BK = mma::kPipeBK;
  static constexpr int RS = THREADS / 8;      // rows between a thread's chunks in a [rows][64] tile
  static constexpr int A_ROWS = BM / RS;      // A chunks per thread per tile
  static constexpr int B_ROWS = BN / RS;      // forward: B ([BN][64]) chunks per thread
  static constexpr int CPRB = BN / 8;         // backward data: chunks per row of B ([64][BN])
  static constexpr int RSB = THREADS / CPRB;  // ... rows between a thread's B chunks
  static constexpr int B_ROWS_KN = BK / RSB;  // ... B chunks per thread
  static constexpr int STAGE = (BM + BN) * BK;  // elements per stage: A then B
  static_assert(WM % 16 == 0 && WN % 16 == 0 && BM % RS == 0 && BN % RS == 0, "pipe tile shape");
  static_assert(RS % 8 == 0 && RSB % 8 == 0 && BK % RSB == 0, "a thread's chunks share one swizzle");
};

// Row m's offset and tap mask (see above). DIR kFwd: m is a y position, the x pixel of tap (t, r, s) is
// o * stride - pad + tap * dil; kBwdData: m is a dx position, the dy pixel is i + pad - tap * dil.
// Offsets are 32-bit: the host lets this kernel read only tensors that span less than 2^31 elements.
template <int DIR>
__device__ __forceinline__ void tap_row(const ConvParams& p, int m, int chunk, int& off, unsigned& mask) {
  mask = 0;
  off = 0;
  if (m >= p.gm) return;
  int n, c[3], base[3];
  const long long* st = DIR == kFwd ? p.xs : p.ys;
  decompose3(m, DIR == kFwd ? p.out_size : p.in_size, n, c);
  off = n * (int)st[0] + chunk * 8;
#pragma unroll
  for (int i = 0; i < 3; ++i) {
    base[i] = DIR == kFwd ? c[i] * p.stride[i] - p.pad[i] : c[i] + p.pad[i];
    off += base[i] * (int)st[2 + i];  // (negative for rows whose base position is in the padding)
  }
  const int* lim = DIR == kFwd ? p.in_size : p.out_size;
  const int sgn = DIR == kFwd ? 1 : -1;
  for (int t = 0; t < p.filt[0]; ++t) {
    if ((unsigned)(base[0] + sgn * t * p.dil[0]) >= (unsigned)lim[0]) continue;
    for (int r = 0; r < p.filt[1]; ++r)
      if ((unsigned)(base[1] + sgn * r * p.dil[1]) < (unsigned)lim[1]) mask |= 1u << (t * p.filt[1] + r);
  }
  for (int s = 0; s < p.filt[2]; ++s)
    if ((unsigned)(base[2] + sgn * s * p.dil[2]) < (unsigned)lim[2]) mask |= 1u << (16 + s);
}

// grid (ceil(M / BM), ceil(N / BN)), WARPS_M * WARPS_N warps; dynamic shared memory kPipeStages * STAGE.
// MINB: blocks per SM the register cap is set for; DB: fragments double-buffered (mma_pipe.cuh).
template <int DIR, class T, int BM, int BN, int WARPS_M, int WARPS_N, bool DB>
__device__ __forceinline__ void implicit_gemm_pipe_tc_body(const ConvParams& p) {
  typedef PipeShape<BM, BN, WARPS_M, WARPS_N> Sh;
  static_assert(DIR == kFwd || DIR == kBwdData, "forward or backward data");
  extern __shared__ __align__(128) unsigned char tc_smem[];
  T* smem = reinterpret_cast<T*>(tc_smem);
  const int t = threadIdx.x, warp = t >> 5;
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
  const T* A = static_cast<const T*>(p.x);  // x (forward) or dy
  const T* W = static_cast<const T*>(p.w);
  const int CH = DIR == kFwd ? p.cg : p.kg;  // the reduction's channels (per tap)
  const long long* ast = DIR == kFwd ? p.xs : p.ys;

  // A: rows t / 8 + RS i, chunk t % 8
  const int chunk = t & 7;
  int aoff[Sh::A_ROWS];
  unsigned amask[Sh::A_ROWS];
#pragma unroll
  for (int i = 0; i < Sh::A_ROWS; ++i) tap_row<DIR>(p, m0 + (t >> 3) + Sh::RS * i, chunk, aoff[i], amask[i]);
  const int asoff = mma::swz<Sh::BK>(t >> 3, chunk);
  // per-tap steps of A's offset (the sign of the tap in the pixel index folded in)
  int astep[3];
#pragma unroll
  for (int i = 0; i < 3; ++i) astep[i] = (DIR == kFwd ? 1 : -1) * p.dil[i] * (int)ast[2 + i];
  const int ws0 = (int)p.ws[0];

  // B. Forward: filter rows n0 + t / 8 + RS i (output channels), chunk t % 8 of the tap's channels.
  // Backward data: filter rows k = c0 + t / CPRB + RSB i of the tap, columns n0 + 8 (t % CPRB) (input
  // channels).
  int bbase;
  unsigned bmask = 0;
  int bsoff;
  if (DIR == kFwd) {
    const int n = n0 + (t >> 3);
    bbase = n * ws0 + chunk * 8;
#pragma unroll
    for (int i = 0; i < Sh::B_ROWS; ++i)
      if (n + Sh::RS * i < p.gn) bmask |= 1u << i;
    bsoff = mma::swz<Sh::BK>(t >> 3, chunk);
  } else {
    const int col = n0 + (t % Sh::CPRB) * 8;
    bbase = (t / Sh::CPRB) * ws0 + col;
    bmask = col < p.gn;
    bsoff = mma::swz<BN>(t / Sh::CPRB, t % Sh::CPRB);
  }

  // the walk over K tiles: channel block c0 of tap (tt, tr, ts), the same for every thread
  int c0 = 0, tt = 0, tr = 0, ts = 0;
  auto fill = [&](T* stage) {
    const unsigned sa = mma::smem_u32(stage), sb = sa + BM * Sh::BK * 2;
    const unsigned need = (1u << (tt * p.filt[1] + tr)) | (1u << (16 + ts));
    const int atap = tt * astep[0] + tr * astep[1] + ts * astep[2] + c0;
    int btap = DIR == kFwd ? c0 * (int)p.ws[1] : c0 * ws0;  // backward data: c0 picks B's rows
    btap += flip_tap(p, 0, tt) * (int)p.ws[2] + flip_tap(p, 1, tr) * (int)p.ws[3] + flip_tap(p, 2, ts) * (int)p.ws[4];
    const bool cok = c0 + chunk * 8 < CH;
#pragma unroll
    for (int i = 0; i < Sh::A_ROWS; ++i) {
      const bool v = cok && (amask[i] & need) == need;
      mma::cp_async_16(sa + (asoff + Sh::RS * Sh::BK * i) * 2, v ? A + (aoff[i] + atap) : A, v);
    }
    if (DIR == kFwd) {
#pragma unroll
      for (int i = 0; i < Sh::B_ROWS; ++i) {
        const bool v = cok && ((bmask >> i) & 1);
        mma::cp_async_16(sb + (bsoff + Sh::RS * Sh::BK * i) * 2, v ? W + (bbase + Sh::RS * i * ws0 + btap) : W, v);
      }
    } else {
      const int k = c0 + t / Sh::CPRB;
#pragma unroll
      for (int i = 0; i < Sh::B_ROWS_KN; ++i) {
        const bool v = bmask && k + Sh::RSB * i < CH;
        mma::cp_async_16(sb + (bsoff + Sh::RSB * BN * i) * 2, v ? W + (bbase + Sh::RSB * i * ws0 + btap) : W, v);
      }
    }
    c0 += Sh::BK;  // the next tile: the next channel block, or the next tap
    if (c0 >= CH) {
      c0 = 0;
      if (++ts == p.filt[2]) {
        ts = 0;
        if (++tr == p.filt[1]) {
          tr = 0;
          ++tt;
        }
      }
    }
  };

  mma::MmaSm80<T, Sh::WM, Sh::WN> eng;  // the accumulators and their placement (row_of / col_of)
  eng.zero();
  const int wm = (warp % WARPS_M) * Sh::WM, wn = (warp / WARPS_M) * Sh::WN;
  auto frags = [&](const T* stage, int kk, unsigned(&a)[Sh::WM / 16][4], unsigned(&b)[Sh::WN / 8][2]) {
    if (DIR == kFwd)
      mma::frags_mk_nk<T>(stage, stage + BM * Sh::BK, kk, wm, wn, a, b);
    else
      mma::frags_mk_kn<T, BN>(stage, stage + BM * Sh::BK, kk, wm, wn, a, b);
  };
  const int ktiles = p.filt[0] * p.filt[1] * p.filt[2] * ((CH + Sh::BK - 1) / Sh::BK);
  mma::pipelined_mainloop<T, kPipeStages, Sh::STAGE, DB>(smem, ktiles, fill, frags, eng.acc);
  mma::cp_async_wait<0>();

  static_assert(BM * (BN + 8) * 4 <= kPipeStages * Sh::STAGE * 2, "the staged epilogue fits the stages");
  if (DIR == kFwd)
    fwd_epilogue<T, BM, BN, Sh::THREADS>(p, eng, tc_smem, m0, n0, wm, wn);
  else
    bwd_data_tc_epilogue<T>(p, eng, m0 + wm, n0 + wn);
}

template <int DIR, class T, int BM, int BN, int WARPS_M, int WARPS_N, int MINB, bool DB>
__global__ void __launch_bounds__(WARPS_M* WARPS_N * 32, MINB) implicit_gemm_pipe_tc(const ConvParams p) {
  implicit_gemm_pipe_tc_body<DIR, T, BM, BN, WARPS_M, WARPS_N, DB>(p);
}

template <int DIR, class T, int BM, int BN, int WARPS_M, int WARPS_N, int MINB, bool DB>
__global__ void __launch_bounds__(WARPS_M* WARPS_N * 32, MINB) implicit_gemm_pipe_tc_grouped(const ConvParams p) {
  const ConvParams q = group_view<DIR, T>(p);
  implicit_gemm_pipe_tc_body<DIR, T, BM, BN, WARPS_M, WARPS_N, DB>(q);
}

// ---------------------------------------------------------------- wgmma forward (sm_90a)

// fwd_wgmma (half, bfloat16; Hopper only: its units are compiled for sm_90a, KernelUnit archs): the
// pipelined forward's gather with the MMAs on wgmma (common/wgmma.cuh). Block: 128 x BN of C (output
// positions x output channels), two warpgroups each computing 64 x BN with wgmma.m64nBNk16 straight from
// shared memory (only the f32 accumulators in registers). The K walk, the per-row 32-bit offsets + tap
// masks and the cp.async zero-fill are implicit_gemm_pipe_tc's forward (one K tile = 64 channels of one
// tap); the swizzled [rows][64] tiles they fill (mma::swz: 16-byte chunk c of row r at c ^ (r & 7)) are
// exactly wgmma's K-major 128B-swizzled slabs once every stage starts on a 1024-byte boundary (the
// launch adds 1 KiB of slack), so A (x gathered, [m][k]) and B (w as [n = k_out][k]) are both K-major.
// The ring is gemm_wgmma's (ptx/matmul.cu): per K tile wait for it, fence it to the async proxy, one
// barrier, its 4 wgmmas as one group, wait until only that group is pending, then copy tile kt +
// STAGES - 2 into the stage tile kt - 2 used. The epilogue is the pipelined kernel's (fwd_epilogue:
// registers for plain / bias + clamp activations, else staged), fed through WgAccEng, which presents
// the wgmma fragment as mma.sync's (per warp an m16 x BN slice: TM = 1, TN = BN / 8). MINB: blocks per
// SM the registers are capped for. Same host-checked limits as implicit_gemm_pipe_tc's forward.
// LEAN (the model's loop, WGM_TILES; tools/bench_convolution.py): the same copies with the per-K-tile
// work done once. The plain fill writes each chunk's source as `v ? A + (aoff + tap offset) : A`, and
// NVRTC sinks the tap offset's multiply-adds into a branch per chunk (PTX: ~245 instructions per thread
// and K tile, ~25 per cp.async, the mad chain and flip_tap repeated per row); LEAN computes the A and B
// tap offsets once per K tile (pinned by an empty asm so that they cannot be sunk), selects the 32-bit
// offset (0: the tensor's base, a zero-filled chunk) without a branch, and adds one 64-bit address;
// the k16 steps' wgmma descriptors are the K tile's plus 2 each (instead of 8 built per K tile).
// LEAN: 0 the plain copies (forced variants only, WGM_VARIANTS), 1 the lean ones: the loop's SASS 255 ->
// 178 instructions at BN 128, 209 -> 164 at BN 64, and +7-42% TFLOP/s on the ResNet-50 3x3 layers, forward
// and backward data (H200). A leaner loop still (25-28% fewer SASS instructions a K tile) measured 3-23%
// slower on every layer (H200) and is not in the code (tools/notes/convolution_ptx.md).
// BKN: B read as [k][n] (MN-major) instead of [n][k]: backward data straight from a KRSC filter,
// without filter_kc_swap. Backward data (stride 1) is the forward of dy whose filter w'[c][tap][k] is
// w[k][tap][c]; in w itself 8 consecutive n = c of one (k, tap) are 16 contiguous bytes, so each thread
// copies chunk t % 8 of 64 c (one 128-byte row) of K rows t / 8 + 32 j, slab i / 2 of BN / 64, into
// the same swizzled 128-byte rows as the K-major tile (row = k, chunk = 8 c): the shared offsets are the
// forward's, which is wgmma's MN-major 128B-swizzled layout (wgmma.cuh: slabs of 64 N columns, LBO =
// the slab stride 8 KiB, SBO = 1024, a k16 step 16 rows = 2048 bytes on; the instruction's trans-b =
// 1). The host passes ws = (1, k stride, tap strides): p.ws[0] (c's stride) must be 1, the others
// multiples of 8 (16-byte chunks), the flip as the forward's (FLAG_FLIP, the opposite mode).
// SPLIT (tensor_core.py split_wgmma; units convolution.wgmma.split.<tag>): split-K over grid.z, block z
// walking K tiles [z * k_per_split, + k_per_split) of the (tap, channel block) walk and writing its raw fp32
// sums (wgmma_partials); fwd_split_fold adds the slices and runs the epilogue. A template parameter so that
// the whole kernels' code is what it was: with a run-time flag the 128x128 tile took 140 registers instead
// of 132 and ran 5-7% slower on the UNet N128 256 @32 layer (H200, 0.3705 / 0.3698 ms forward / backward
// data against 0.344-0.352 / 0.342-0.348 in three earlier runs).
template <class T, int BN> struct WgAccEng {
  typedef T Elem;
  static constexpr int TM = 1, TN = BN / 8;
  float acc[1][TN][4];  // = wgmma's d[4 * j + 2 * h + e] (wgmma.cuh), viewed as m16n8 fragments
  __device__ __forceinline__ static int row_of(int, int e) { return (threadIdx.x & 31) / 4 + (e >> 1) * 8; }
  __device__ __forceinline__ static int col_of(int j, int e) { return j * 8 + (threadIdx.x & 3) * 2 + (e & 1); }
  __device__ __forceinline__ float (&flat())[BN / 2] { return *reinterpret_cast<float(*)[BN / 2]>(&acc[0][0][0]); }
};

// fwd_wgmma's split-K epilogue: a warp's accumulators (rows from m_base, columns from n_base) as raw
// fp32 sums to split blockIdx.z's slice of the workspace (p.out, [split][gm][gn]); column pairs as one
// 8-byte store where gn is even and the workspace 8-byte aligned.
template <class Eng>
__device__ __forceinline__ void wgmma_partials(const ConvParams& p, const Eng& eng, int m_base, int n_base) {
  float* part = static_cast<float*>(p.out) + (long long)blockIdx.z * p.gm * p.gn;
  const bool v2 = !(p.gn & 1) && !(reinterpret_cast<unsigned long long>(p.out) & 7);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int m = m_base + eng.row_of(0, 2 * h);
    if (m >= p.gm) continue;
    float* row = part + (long long)m * p.gn;
#pragma unroll
    for (int j = 0; j < Eng::TN; ++j) {
      const int n = n_base + eng.col_of(j, 0);  // even
      if (n >= p.gn) continue;
      const float a0 = eng.acc[0][j][2 * h], a1 = eng.acc[0][j][2 * h + 1];
      if (v2) {  // gn even: n + 1 < gn too
        *reinterpret_cast<float2*>(row + n) = make_float2(a0, a1);
      } else {
        row[n] = a0;
        if (n + 1 < p.gn) row[n + 1] = a1;
      }
    }
  }
}

// fwd_split_fold: the end of a split fwd_wgmma (forward, or backward data as the forward of dy): y[m][n] =
// the forward epilogue (alpha, beta, z, bias, activation: epilogue_value) of the sum over splits, in split
// order, of the fp32 partials (p.w: [splits][gm][gn]; p.out: y, through the forward's out_offset).
// Deterministic: a fixed order per element. One thread an element, 256 a block.
template <class T>
__global__ void __launch_bounds__(256) fwd_split_fold(const ConvParams p) {
  const long long total = (long long)p.gm * p.gn;
  const long long i = (long long)blockIdx.x * 256 + threadIdx.x;
  if (i >= total) return;
  const float* part = static_cast<const float*>(p.w);
  float s = 0.f;
  for (int sl = 0; sl < p.splits; ++sl) s += part[sl * total + i];
  const int m = (int)(i / p.gn), n = (int)(i - (long long)m * p.gn);
  long long zoff = 0;
  int ch = 0;
  const long long off = out_offset<kFwd>(p, m, n, 0, zoff, ch);
  finish<true, T, float>(p, static_cast<T*>(p.out), off, zoff, ch, s, (float)p.alpha, (float)p.beta,
                         (float)p.alpha2);
}

template <class T, int BN, int STAGES, int MINB, int LEAN = 0, int BKN = 0, int FB = 0, int SPLIT = 0>
__global__ void __launch_bounds__(256, MINB) fwd_wgmma(const ConvParams p) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(sizeof(T) == 0, "fwd_wgmma needs the sm_90a target (KernelUnit archs)");
#endif
  constexpr int BM = 128, THREADS = 256, BK = mma::kPipeBK, RS = THREADS / 8;
  constexpr int A_ROWS = BM / RS, B_ROWS = BN / RS, STAGE = (BM + BN) * BK, D = STAGES - 2;
  constexpr int SLAB = 64 * BK * 2;  // bytes of 64 rows of A: one warpgroup's M slice (and of a BKN B slab)
  constexpr int KR = BK / RS;        // BKN: a thread's K rows of B per 64-column slab
  static_assert(STAGES >= 3 && (BN == 64 || BN == 128 || BN == 256), "fwd_wgmma tile");
  static_assert(BM * (BN + 8) * 4 <= STAGES * STAGE * 2, "the staged epilogue fits the stages");
  extern __shared__ __align__(1024) unsigned char tc_smem[];
  const unsigned raw = mma::smem_u32(tc_smem), pad = ((raw + 1023u) & ~1023u) - raw;
  unsigned char* smem = tc_smem + pad;  // the swizzle atoms need 1024-byte aligned stages
  const unsigned sbase = raw + pad;
  const int t = threadIdx.x, wg = t >> 7, warp = (t >> 5) & 3;
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
  const T* A = static_cast<const T*>(p.x);
  const T* W = static_cast<const T*>(p.w);
  const int CH = p.cg;

  // A: rows t / 8 + RS i, chunk t % 8 (implicit_gemm_pipe_tc's forward gather)
  const int chunk = t & 7;
  int aoff[A_ROWS];
  unsigned amask[A_ROWS];
#pragma unroll
  for (int i = 0; i < A_ROWS; ++i) tap_row<kFwd>(p, m0 + (t >> 3) + RS * i, chunk, aoff[i], amask[i]);
  const int soff = mma::swz<BK>(t >> 3, chunk);  // RS is a multiple of 8: one swizzle for all a thread's rows
  int astep[3];
#pragma unroll
  for (int i = 0; i < 3; ++i) astep[i] = p.dil[i] * (int)p.xs[2 + i];
  const int ws0 = (int)p.ws[0];
  // B: filter rows n0 + t / 8 + RS i (output channels), chunk t % 8 of the tap's channels; BKN: K rows
  // t / 8 + RS (i % KR) of the K tile, chunk t % 8 of slab i / KR of the block's n (p.ws[0] == 1)
  const int nrow = n0 + (t >> 3);
  const int bbase = BKN ? (t >> 3) * (int)p.ws[1] + n0 + chunk * 8 : nrow * ws0 + chunk * 8;
  unsigned bmask = 0;
#pragma unroll
  for (int i = 0; i < B_ROWS; ++i)
    if (BKN ? n0 + (i / KR) * 64 + chunk * 8 < p.gn : nrow + RS * i < p.gn) bmask |= 1u << i;
  // the offset of B's copy i from the K tile's (BKN: the next K rows, or the next slab of 64 n)
  auto boff = [&](int i) { return BKN ? (i % KR) * RS * (int)p.ws[1] + (i / KR) * 64 : RS * i * ws0; };

  int c0 = 0, tt = 0, tr = 0, ts = 0;  // the next K tile: channel block c0 of tap (tt, tr, ts)
  if constexpr (SPLIT) {  // split blockIdx.z starts at K tile blockIdx.z * k_per_split: its digits, once
    int tap = (int)blockIdx.z * p.k_per_split;
    const int cblocks = (CH + BK - 1) / BK;
    c0 = tap % cblocks * BK;
    tap /= cblocks;
    ts = tap % p.filt[2];
    tap /= p.filt[2];
    tr = tap % p.filt[1];
    tt = tap / p.filt[1];
  }
  auto fill = [&](int stage) {
    const unsigned sa = sbase + stage * STAGE * 2, sb = sa + BM * BK * 2;
    const unsigned need = (1u << (tt * p.filt[1] + tr)) | (1u << (16 + ts));
    const int atap = tt * astep[0] + tr * astep[1] + ts * astep[2] + c0;
    const int btap = c0 * (int)p.ws[1] + flip_tap(p, 0, tt) * (int)p.ws[2] + flip_tap(p, 1, tr) * (int)p.ws[3] +
                     flip_tap(p, 2, ts) * (int)p.ws[4];
    const bool cok = c0 + chunk * 8 < CH;
    // B's validity: its row's channels (K-major), or its K row and column block (BKN)
    auto bok = [&](int i) {
      return ((bmask >> i) & 1) && (BKN ? c0 + (t >> 3) + RS * (i % KR) < CH : cok);
    };
    if constexpr (LEAN) {
      int at = atap, bt = btap;
      asm volatile("" : "+r"(at), "+r"(bt));  // computed here once, not per chunk
#pragma unroll
      for (int i = 0; i < A_ROWS; ++i) {
        const bool v = cok && (amask[i] & need) == need;
        mma::cp_async_16(sa + (soff + RS * BK * i) * 2, A + (v ? aoff[i] + at : 0), v);
      }
#pragma unroll
      for (int i = 0; i < B_ROWS; ++i) {
        const bool v = bok(i);
        mma::cp_async_16(sb + (soff + RS * BK * i) * 2, W + (v ? bbase + boff(i) + bt : 0), v);
      }
    } else {
#pragma unroll
      for (int i = 0; i < A_ROWS; ++i) {
        const bool v = cok && (amask[i] & need) == need;
        mma::cp_async_16(sa + (soff + RS * BK * i) * 2, v ? A + (aoff[i] + atap) : A, v);
      }
#pragma unroll
      for (int i = 0; i < B_ROWS; ++i) {
        const bool v = bok(i);
        mma::cp_async_16(sb + (soff + RS * BK * i) * 2, v ? W + (bbase + boff(i) + btap) : W, v);
      }
    }
    c0 += BK;
    if (c0 >= CH) {
      c0 = 0;
      if (++ts == p.filt[2]) {
        ts = 0;
        if (++tr == p.filt[1]) {
          tr = 0;
          ++tt;
        }
      }
    }
  };

  // The fused bias, BREG: this thread's epilogue columns (WgAccEng::col_of, BN / 4 of them) loaded
  // now as raw 16 bits into registers and converted after the K walk, so their L2 latency hides under the
  // main loop and the epilogue needs neither shared memory nor a barrier for them (fused / plain 1.056x ->
  // 1.015x at 56², H100). Else: one element a thread, parked in shared memory after the walk behind a
  // barrier. The registers live through the K loop change the loop's code (ptxas moves its tap arithmetic
  // to the uniform datapath), and the plain kernels' speed with it (H100, alternated builds): the 128x128
  // tile +3-8% (28², 7², forward and backward data), the 128x64 tile +2% at 56² but -6% at 14². So BREG
  // is the 128x128 tile's code, and the 128x64 tile has it in the FB = 1 instantiation that the fused
  // call's plans run (convolution.py _fused_bias_in_registers); its plain forward and backward data keep the
  // shared-memory bias.
  constexpr bool BREG = FB || BN == 128;
  const bool has_bias = p.flags & PYDNN_CONV_FLAG_BIAS;
  T braw[BREG ? BN / 4 : 1];
#pragma unroll
  for (int i = 0; i < (BREG ? BN / 4 : 1); ++i) braw[i].bits = 0;
  if constexpr (BREG) {
    if (has_bias) {  // uniform over the block
      const int nb = n0 + (t & 3) * 2, lim = p.gn - nb;  // col_of(j, e) = nb - n0 + 8 j + e
      const int bs = (int)p.bias_stride;                 // (host-checked: a (1, K, 1, ...) tensor's stride)
      const T* bp = static_cast<const T*>(p.bias) + (long long)nb * bs;
#pragma unroll
      for (int i = 0; i < BN / 4; ++i) {
        const int c = 8 * (i / 2) + (i & 1);
        if (c < lim) braw[i] = bp[c * bs];
      }
    }
  } else {
    if (has_bias && t < BN && n0 + t < p.gn) braw[0] = static_cast<const T*>(p.bias)[(long long)(n0 + t) * p.bias_stride];
  }

  WgAccEng<T, BN> eng;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) eng.acc[0][j][e] = 0.f;
  int ktiles = p.filt[0] * p.filt[1] * p.filt[2] * ((CH + BK - 1) / BK);
  if constexpr (SPLIT) ktiles = min(ktiles - (int)blockIdx.z * p.k_per_split, p.k_per_split);  // this slice's
#pragma unroll
  for (int s = 0; s < D; ++s) {
    if (s < ktiles) fill(s);
    mma::cp_async_commit();
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    mma::cp_async_wait<D - 1>();  // tile kt has landed (for this thread) ...
    wgmma::fence_proxy_async();   // ... and is visible to the async proxy ...
    __syncthreads();              // ... for every thread's chunks
    const unsigned sa = sbase + (kt % STAGES) * STAGE * 2, sb = sa + BM * BK * 2;
    wgmma::fence();
    // B's k16 step: 32 bytes along its rows (K-major), or 16 rows = 2048 bytes on (BKN, MN-major)
    constexpr int BSTEP = BKN ? 2048 : 32;
    if constexpr (LEAN) {  // k16 step kk: 32 bytes on = 2 more in the start-address field (shared < 256 KB)
      const unsigned long long da = wgmma::desc_sw128(sa + wg * SLAB, 16, 1024),
                               db = wgmma::desc_sw128(sb, BKN ? SLAB : 16, 1024);
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk)
        wgmma::Mma<T, BN, 0, BKN>::run(eng.flat(), da + 2 * kk, db + (BSTEP >> 4) * kk, 1);
    } else {
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk)
        wgmma::Mma<T, BN, 0, BKN>::run(eng.flat(), wgmma::desc_sw128(sa + wg * SLAB + kk * 32, 16, 1024),
                                       wgmma::desc_sw128(sb + kk * BSTEP, BKN ? SLAB : 16, 1024), 1);
    }
    wgmma::commit();
    wgmma::wait<1>();  // this warpgroup's tile kt - 1 group is done
    if (kt + D < ktiles) fill((kt + D) % STAGES);  // the stage of tile kt - 2
    mma::cp_async_commit();
  }
  wgmma::wait<0>();
  wgmma::fence_operands(eng.flat());
  mma::cp_async_wait<0>();
  if constexpr (SPLIT) {  // this slice's raw fp32 sums, [split][m][n]; fwd_split_fold ends the call
    wgmma_partials(p, eng, m0 + wg * 64 + warp * 16, n0);
    return;
  }
  if constexpr (BREG) {
    float breg[BN / 4];
#pragma unroll
    for (int i = 0; i < BN / 4; ++i) breg[i] = load<float>(braw[i]);
    fwd_epilogue<T, BM, BN, THREADS>(p, eng, smem, m0, n0, wg * 64 + warp * 16, 0, nullptr, breg);  // zeros without a bias
  } else {
    float* sbias = reinterpret_cast<float*>(smem + STAGES * STAGE * 2);  // past the stages (launch: + BN floats)
    if (has_bias) {  // uniform over the block
      if (t < BN) sbias[t] = load<float>(braw[0]);
      __syncthreads();
    }
    fwd_epilogue<T, BM, BN, THREADS>(p, eng, smem, m0, n0, wg * 64 + warp * 16, 0, has_bias ? sbias : nullptr);
  }
}

// filter_kc_swap (16-bit types): backward data on fwd_wgmma (stride 1) is the forward convolution of dy
// with the filter's K and C swapped: out[c][tap][k] = in[k][c][tap] (in read through its strides
// in_stride (k, c, t, r, s), out packed, K innermost; the spatial flip is the forward's FLAG_FLIP, set
// on the host for the opposite mode). ConvAuxParams: in / out, kg = K, cg = C, taps, filt. Grid
// (ceil(K / 64), ceil(C / 64), taps), 256 threads: a 64 x 64 (k, c) tile of one tap through shared
// memory (swizzled), read 8 channels (16 bytes) at a time along c where w's layout allows (NHWC, 16-byte aligned;
// else 8 scalar loads) and written 8 at a time along k (K % 8 == 0 and the workspace 16-byte aligned:
// host-checked). One 2-byte element per thread and load ran at ~1 TB/s on 7²'s 9.4 MB (H200), adding
// 2.2-9.7 us to a backward data call.
template <class T>
__global__ void __launch_bounds__(256) filter_kc_swap(const ConvAuxParams p) {
  static_assert(sizeof(T) == 2, "16-bit types");
  // tile[k][c], 16-byte groups of c XOR-swizzled by k / 8: the transposed reads below (8 k rows of one
  // c column per thread, 8 threads on 8 k groups) fall in distinct banks
  __shared__ __align__(16) unsigned short tile[64 * 64];
  const unsigned short* in = static_cast<const unsigned short*>(p.in);
  unsigned short* out = static_cast<unsigned short*>(p.out);
  const int k0 = blockIdx.x * 64, c0 = blockIdx.y * 64, tap = blockIdx.z;
  const int s = tap % p.filt[2], r = tap / p.filt[2] % p.filt[1], t = tap / (p.filt[2] * p.filt[1]);
  const long long* st = p.in_stride;
  const long long toff = t * st[2] + r * st[3] + s * st[4];
  const bool vec = st[1] == 1 && ((st[0] | st[2] | st[3] | st[4]) & 7) == 0 &&
                   (reinterpret_cast<unsigned long long>(in) & 15) == 0;
  const int row = threadIdx.x >> 3, chunk = (threadIdx.x & 7) * 8;
#pragma unroll
  for (int j = 0; j < 2; ++j) {  // rows k0 + row + 32 j, channels c0 + chunk .. + 8
    const int kr = row + 32 * j, k = k0 + kr, c = c0 + chunk;
    uint4 q = make_uint4(0, 0, 0, 0);
    if (k < p.kg && c < p.cg) {
      const unsigned short* src = in + (k * st[0] + c * st[1] + toff);
      if (vec && c + 8 <= p.cg) {
        q = *reinterpret_cast<const uint4*>(src);
      } else {
        unsigned short e8[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) e8[e] = c + e < p.cg ? src[e * st[1]] : 0;
        q = make_uint4(e8[0] | (unsigned)e8[1] << 16, e8[2] | (unsigned)e8[3] << 16, e8[4] | (unsigned)e8[5] << 16,
                       e8[6] | (unsigned)e8[7] << 16);
      }
    }
    *reinterpret_cast<uint4*>(tile + kr * 64 + (chunk ^ (((kr >> 3) & 7) << 3))) = q;
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < 2; ++j) {  // rows c0 + row + 32 j of out, k0 + chunk .. + 8
    const int cr = row + 32 * j, c = c0 + cr, k = k0 + chunk;
    if (c >= p.cg || k >= p.kg) continue;
    unsigned short e8[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int kk = chunk + e;
      e8[e] = tile[kk * 64 + (((cr & ~7) ^ (((kk >> 3) & 7) << 3)) | (cr & 7))];
    }
    *reinterpret_cast<uint4*>(out + ((long long)c * p.taps + tap) * p.kg + k) =
        make_uint4(e8[0] | (unsigned)e8[1] << 16, e8[2] | (unsigned)e8[3] << 16, e8[4] | (unsigned)e8[5] << 16,
                   e8[6] | (unsigned)e8[7] << 16);
  }
}

// wgrad_tc's epilogue: the warp's accumulators (rows from m_base, columns from n_base) to the split's
// partials, or (one split) to dw itself.
template <class Eng>
__device__ __forceinline__ void wgrad_epilogue(const ConvParams& p, const Eng& eng, int m_base, int n_base) {
  const bool partial = p.flags & PYDNN_CONV_FLAG_PARTIAL;
  float* part = static_cast<float*>(p.out) + (long long)blockIdx.z * p.gm * p.gn;
  const float alpha = (float)p.alpha, beta = (float)p.beta;
#pragma unroll
  for (int j = 0; j < Eng::TN; ++j) {
    const int n = n_base + eng.col_of(j, 0);  // even, and gn is a multiple of 8: n + 1 < gn with n
    if (n >= p.gn) continue;
    long long noff = 0;  // dw offset of columns n and n + 1 (same tap, channels c and c + 1)
    if (!partial) {
      int q = n;
      const int c = q % p.cg;
      q /= p.cg;
      int tap[3];
      tap[2] = q % p.filt[2]; q /= p.filt[2];
      tap[1] = q % p.filt[1];
      tap[0] = q / p.filt[1];
      noff = (long long)c * p.ws[1];
#pragma unroll
      for (int i = 0; i < 3; ++i) noff += (long long)flip_tap(p, i, tap[i]) * p.ws[2 + i];
    }
#pragma unroll
    for (int i = 0; i < Eng::TM; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = m_base + eng.row_of(i, 2 * h);
        if (m >= p.gm) continue;
        const float v0 = eng.acc[i][j][2 * h], v1 = eng.acc[i][j][2 * h + 1];
        if (partial) {
          float* d = part + (long long)m * p.gn + n;
          d[0] = v0;
          d[1] = v1;
        } else {
          typedef typename Eng::Elem T;
          T* out = static_cast<T*>(p.out);
          const long long off = (long long)m * p.ws[0] + noff;
          float r0 = alpha * v0, r1 = alpha * v1;
          if (p.flags & PYDNN_FLAG_BETA) {
            r0 += beta * load<float>(out[off]);
            r1 += beta * load<float>(out[off + p.ws[1]]);
          }
          out[off] = store<T>(r0);
          out[off + p.ws[1]] = store<T>(r1);
        }
      }
  }
}

// Backward filter on tensor cores (BWD_FILTER_ALGO_1 for half / bfloat16):
//   dw[k][(t, r, s, c)] = sum over output positions pos = (n, od, oh, ow) of
//                         dy[pos][k] * x[n][(od, oh, ow) * stride + (t, r, s) * dil - pad][c],
// an implicit GEMM with M = K, N = T * R * S * C (c innermost, so 8 channels of one tap are one 16-byte
// chunk of NHWC x) and the reduction over the N * OD * OH * OW positions: long (ResNet: 3136 to 200704)
// against a small M x N, so it is split over grid.z. Needs NHWC-like dy and x (channel stride 1, other
// strides multiples of 8), C and K multiples of 8, one group; the filter may have any layout (written
// through its strides). Deterministic: every split has a fixed range of positions, each block sums its
// range in a fixed order, and with splits > 1 conv::fold adds the fp32 partials in split order.
//
// Both operands arrive k-major: a 32-position tile of dy is [pos][k] (k contiguous) and of x [pos][c],
// so they sit in shared memory as [k][m] and [k][n] rows padded by 16 bytes (row strides of 144 or 272
// bytes put the 8 rows of each ldmatrix in 8 different 16-byte bank groups) and MmaSm80::step_tt reads
// both with ldmatrix .trans. Block: BM x 128 (BM = 128, or 64 for narrow K), 8 warps as 2 x 4 warp
// tiles of BM/2 x 32, WgShape::STAGES-deep cp.async pipeline. Each thread's chunk columns are fixed for the
// block (the tap and channel of B decomposed once); its rows' positions advance by digit stepping.
// Epilogue: with one split, dw = alpha * acc + beta * dw directly (flip in CONVOLUTION mode); with more,
// raw fp32 partials to the workspace at [split][m][n].
constexpr int kWgBN = 128;

template <int BM> struct WgShape {
  static constexpr int LDA = BM + 8, LDB = kWgBN + 8;        // shared row strides (elements)
  static constexpr int WM = BM / 2, WN = 32;                  // warp tile: 2 (m) x 4 (n) warps
  static constexpr int A_CHUNKS = BM / 8, B_CHUNKS = kWgBN / 8;  // 16-byte chunks per tile row
  static constexpr int A_SLOTS = kTcBK * A_CHUNKS / kTcThreads;  // chunks per thread per stage: 2 or 1
  static constexpr int B_SLOTS = kTcBK * B_CHUNKS / kTcThreads;  // 2
  static constexpr int STAGE = kTcBK * (LDA + LDB);           // elements per stage
  static constexpr int STAGES = 4;                            // cp.async pipeline depth
};

template <class T, int BM>
__global__ void __launch_bounds__(kTcThreads, 2) wgrad_tc(const ConvParams p) {
  typedef WgShape<BM> Sh;
  extern __shared__ __align__(128) unsigned char tc_smem[];
  T* smem = reinterpret_cast<T*>(tc_smem);  // stage s: A [32][LDA] at s * STAGE, then B [32][LDB]
  const int t = threadIdx.x, warp = t >> 5;
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * kWgBN;
  const int kbeg = blockIdx.z * p.k_per_split;
  const int kend = min(p.gk, kbeg + p.k_per_split);
  const T* dy = static_cast<const T*>(p.x);
  const T* x = static_cast<const T*>(p.w);

  // A: output channels m0 + acol .. + 7 of positions (rows) t / A_CHUNKS + s * (256 / A_CHUNKS)
  const int acol = (t % Sh::A_CHUNKS) * 8;
  const bool a_ok = m0 + acol < p.gm;
  Red ar[Sh::A_SLOTS];
#pragma unroll
  for (int s = 0; s < Sh::A_SLOTS; ++s) red_init(p, kbeg + t / Sh::A_CHUNKS + s * (kTcThreads / Sh::A_CHUNKS), ar[s]);
  // B: filter columns n0 + bcol .. + 7 = 8 channels of one tap, of the same rows as above with B_CHUNKS
  const int bcol = (t % Sh::B_CHUNKS) * 8;
  const bool b_ok = n0 + bcol < p.gn;
  int bc = 0, base[3];
  {
    int n = b_ok ? n0 + bcol : 0;
    bc = n % p.cg;
    n /= p.cg;
    int tap[3];
    tap[2] = n % p.filt[2]; n /= p.filt[2];
    tap[1] = n % p.filt[1];
    tap[0] = n / p.filt[1];
#pragma unroll
    for (int i = 0; i < 3; ++i) base[i] = tap[i] * p.dil[i] - p.pad[i];
  }
  Red br[Sh::B_SLOTS];
#pragma unroll
  for (int s = 0; s < Sh::B_SLOTS; ++s) red_init(p, kbeg + t / Sh::B_CHUNKS + s * (kTcThreads / Sh::B_CHUNKS), br[s]);

  // copies of the next 32 positions into `stage`; the row states then step to the tile after
  auto load_tile = [&](int stage) {
    T* sa = smem + stage * Sh::STAGE;
    T* sb = sa + kTcBK * Sh::LDA;
#pragma unroll
    for (int s = 0; s < Sh::A_SLOTS; ++s) {
      const Red& r = ar[s];
      const bool v = a_ok && r.k < kend;
      const long long off = (long long)r.d[0] * p.ys[0] + (long long)r.d[1] * p.ys[2] + (long long)r.d[2] * p.ys[3] +
                            (long long)r.d[3] * p.ys[4] + m0 + acol;
      const int row = t / Sh::A_CHUNKS + s * (kTcThreads / Sh::A_CHUNKS);
      mma::cp_async_16(mma::smem_u32(sa + row * Sh::LDA + acol), v ? dy + off : dy, v);
      red_step<kTcBK>(p, ar[s]);
    }
#pragma unroll
    for (int s = 0; s < Sh::B_SLOTS; ++s) {
      const Red& r = br[s];
      bool v = b_ok && r.k < kend;
      long long off = (long long)r.d[0] * p.xs[0] + bc;
#pragma unroll
      for (int i = 0; i < 3; ++i) {
        const int q = r.d[1 + i] * p.stride[i] + base[i];
        v = v && (unsigned)q < (unsigned)p.in_size[i];
        off += (long long)q * p.xs[2 + i];
      }
      const int row = t / Sh::B_CHUNKS + s * (kTcThreads / Sh::B_CHUNKS);
      mma::cp_async_16(mma::smem_u32(sb + row * Sh::LDB + bcol), v ? x + off : x, v);
      red_step<kTcBK>(p, br[s]);
    }
  };

  mma::MmaSm80<T, Sh::WM, Sh::WN> eng;
  eng.zero();
  const int wm = (warp & 1) * Sh::WM, wn = (warp >> 1) * Sh::WN;
  const int tiles = (kend - kbeg + kTcBK - 1) / kTcBK;
#pragma unroll
  for (int s = 0; s < Sh::STAGES - 1; ++s) {
    if (s < tiles) load_tile(s);
    mma::cp_async_commit();
  }
  for (int kt = 0; kt < tiles; ++kt) {
    mma::cp_async_wait<Sh::STAGES - 2>();
    __syncthreads();
    if (kt + Sh::STAGES - 1 < tiles) load_tile((kt + Sh::STAGES - 1) % Sh::STAGES);
    mma::cp_async_commit();
    const T* sa = smem + (kt % Sh::STAGES) * Sh::STAGE;
    const T* sb = sa + kTcBK * Sh::LDA;
#pragma unroll
    for (int ks = 0; ks < kTcBK; ks += 16) eng.step_tt(sa + ks * Sh::LDA + wm, Sh::LDA, sb + ks * Sh::LDB + wn, Sh::LDB);
  }
  mma::cp_async_wait<0>();
  wgrad_epilogue(p, eng, m0 + wm, n0 + wn);
}

// Backward filter on the pipelined main loop (BWD_FILTER_ALGO_1, wgrad_pipe_tc): wgrad_tc's GEMM (M = K,
// N = (t, r, s, c) with c innermost, the reduction over output positions split over grid.z, the same
// epilogue and fold) on mma_pipe.cuh's loop: 64-position K tiles, both operands k-major in swizzled
// [64][BM] / [64][BN] shared tiles read with ldmatrix .trans (frags_km_kn), one barrier per K tile,
// kPipeStages stages, WARPS_M x WARPS_N warps.
//   - A (dy): the host lets this kernel run only where dy's positions are evenly spaced (offset =
//     position * ys[4]: packed NHWC), so a thread's rows are one 32-bit offset stepped by 64 positions;
//   - B (x gathered): each thread's 16-byte chunk column (8 channels of one tap) is fixed for the block,
//     its rows' positions (n, od, oh, ow) advance by the digits of 64 (red_step, no division), and the
//     tap's input pixel is position * stride + tap * dil - pad, bounds-checked per dim;
//   - offsets are 32-bit (the host checks that x and dy span less than 2^31 elements).
template <int BM, int BN, int WARPS_M, int WARPS_N> struct WgPipeShape {
  static constexpr int THREADS = WARPS_M * WARPS_N * 32;
  static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;  // warp tile
  static constexpr int BK = mma::kPipeBK;                     // positions per K tile
  static constexpr int ACH = BM / 8, BCH = BN / 8;            // 16-byte chunks per tile row
  static constexpr int A_RS = THREADS / ACH, B_RS = THREADS / BCH;  // rows between a thread's chunks
  static constexpr int A_ROWS = BK / A_RS, B_ROWS = BK / B_RS;      // chunks per thread per K tile
  static constexpr int STAGE = BK * (BM + BN);                // elements per stage: A then B
  static_assert(WM % 16 == 0 && WN % 16 == 0 && THREADS % ACH == 0 && THREADS % BCH == 0, "wgrad pipe shape");
  static_assert(BK % A_RS == 0 && BK % B_RS == 0 && A_RS % 8 == 0 && B_RS % 8 == 0, "one swizzle per thread");
};

template <class T, int BM, int BN, int WARPS_M, int WARPS_N>
__device__ __forceinline__ void wgrad_pipe_tc_body(const ConvParams& p, int split) {
  typedef WgPipeShape<BM, BN, WARPS_M, WARPS_N> Sh;
  extern __shared__ __align__(128) unsigned char tc_smem[];
  T* smem = reinterpret_cast<T*>(tc_smem);
  const int t = threadIdx.x, warp = t >> 5;
  const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
  const int kbeg = split * p.k_per_split;
  const int kend = min(p.gk, kbeg + p.k_per_split);
  const T* dy = static_cast<const T*>(p.x);
  const T* x = static_cast<const T*>(p.w);

  // A: rows (positions) kbeg + t / ACH + A_RS i, output channels m0 + 8 (t % ACH) ..
  const int pst = (int)p.ys[4];
  const int arow = t / Sh::ACH, acol = (t % Sh::ACH) * 8;
  const bool a_ok = m0 + acol < p.gm;
  int apos = kbeg + arow;
  unsigned aoff = (unsigned)(apos * pst + m0 + acol);  // (unsigned: the step past the last tile may wrap)
  const int asoff = mma::swz<BM>(arow, t % Sh::ACH);

  // B: rows kbeg + t / BCH + B_RS i, filter columns n0 + 8 (t % BCH) .. = 8 channels of one tap
  const int brow = t / Sh::BCH, bcol = (t % Sh::BCH) * 8;
  const bool b_ok = n0 + bcol < p.gn;
  int bc, base[3];
  {
    int n = b_ok ? n0 + bcol : 0;
    bc = n % p.cg;
    n /= p.cg;
    int tap[3];
    tap[2] = n % p.filt[2]; n /= p.filt[2];
    tap[1] = n % p.filt[1];
    tap[0] = n / p.filt[1];
#pragma unroll
    for (int i = 0; i < 3; ++i) base[i] = tap[i] * p.dil[i] - p.pad[i];
  }
  const int xs0 = (int)p.xs[0], xs2 = (int)p.xs[2], xs3 = (int)p.xs[3], xs4 = (int)p.xs[4];
  int bd[Sh::B_ROWS][4];  // the rows' positions as digits (n, od, oh, ow); row i is position bpos + B_RS i
  int bpos = kbeg + brow;
#pragma unroll
  for (int i = 0; i < Sh::B_ROWS; ++i) {
    Red r;
    red_init(p, bpos + Sh::B_RS * i, r);
#pragma unroll
    for (int d = 0; d < 4; ++d) bd[i][d] = r.d[d];
  }
  const int bsoff = mma::swz<BN>(brow, t % Sh::BCH);

  auto fill = [&](T* stage) {
    const unsigned sa = mma::smem_u32(stage), sb = sa + Sh::BK * BM * 2;
#pragma unroll
    for (int i = 0; i < Sh::A_ROWS; ++i) {
      const bool v = a_ok && apos + Sh::A_RS * i < kend;
      mma::cp_async_16(sa + (asoff + Sh::A_RS * BM * i) * 2, v ? dy + (aoff + (unsigned)(Sh::A_RS * i * pst)) : dy, v);
    }
    apos += Sh::BK;
    aoff += (unsigned)(Sh::BK * pst);
#pragma unroll
    for (int i = 0; i < Sh::B_ROWS; ++i) {
      int* d = bd[i];
      const int q0 = d[1] * p.stride[0] + base[0], q1 = d[2] * p.stride[1] + base[1];
      const int q2 = d[3] * p.stride[2] + base[2];
      const bool v = b_ok && bpos + Sh::B_RS * i < kend && (unsigned)q0 < (unsigned)p.in_size[0] &&
                     (unsigned)q1 < (unsigned)p.in_size[1] && (unsigned)q2 < (unsigned)p.in_size[2];
      const int off = d[0] * xs0 + q0 * xs2 + q1 * xs3 + q2 * xs4 + bc;
      mma::cp_async_16(sb + (bsoff + Sh::B_RS * BN * i) * 2, v ? x + off : x, v);
      // the next tile's position: + 64, digit by digit (red_step without the running k)
      int c = 0;
#pragma unroll
      for (int j = 3; j >= 1; --j) {
        const int nv = d[j] + p.red_step[j] + c;
        c = nv >= p.red_size[j];
        d[j] = c ? nv - p.red_size[j] : nv;
      }
      d[0] += p.red_step[0] + c;
    }
    bpos += Sh::BK;
  };

  mma::MmaSm80<T, Sh::WM, Sh::WN> eng;  // the accumulators and their placement (row_of / col_of)
  eng.zero();
  const int wm = (warp % WARPS_M) * Sh::WM, wn = (warp / WARPS_M) * Sh::WN;
  auto frags = [&](const T* stage, int kk, unsigned(&a)[Sh::WM / 16][4], unsigned(&b)[Sh::WN / 8][2]) {
    mma::frags_km_kn<T, BM, BN>(stage, stage + Sh::BK * BM, kk, wm, wn, a, b);
  };
  const int ktiles = (kend - kbeg + Sh::BK - 1) / Sh::BK;
  mma::pipelined_mainloop<T, kPipeStages, Sh::STAGE, false>(smem, ktiles, fill, frags, eng.acc);
  mma::cp_async_wait<0>();
  wgrad_epilogue(p, eng, m0 + wm, n0 + wn);
}

template <class T, int BM, int BN, int WARPS_M, int WARPS_N, int MINB>
__global__ void __launch_bounds__(WARPS_M* WARPS_N * 32, MINB) wgrad_pipe_tc(const ConvParams p) {
  wgrad_pipe_tc_body<T, BM, BN, WARPS_M, WARPS_N>(p, blockIdx.z);
}

template <class T, int BM, int BN, int WARPS_M, int WARPS_N, int MINB>
__global__ void __launch_bounds__(WARPS_M* WARPS_N * 32, MINB) wgrad_pipe_tc_grouped(const ConvParams p) {
  const ConvParams q = group_view<kBwdFilter, T>(p);
  wgrad_pipe_tc_body<T, BM, BN, WARPS_M, WARPS_N>(q, blockIdx.z / p.groups);
}

}  // namespace conv
}  // namespace pydnn
