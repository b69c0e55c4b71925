// Convolution through explicit GEMMs (see conv_gemm_params.h for the column layout): im2col (forward),
// pack_filter (the filter as a padded K x ld matrix), col2im (backward data), pack_rows and wgrad_fold
// (backward filter). The GEMMs themselves are
// not here: the family's 1x1 convolution kernels (tensor-core fwd_tc / wgmma, or the CUDA-core implicit
// GEMM) or pydnn.ops.matmul, so pydnn keeps one GEMM engine per data path.
#include "common/types.cuh"
#include "conv_gemm_params.h"

namespace pydnn {
namespace conv_gemm {

// grid (rows / IM2COL_ROWS, ld / IM2COL_COLS): a block writes IM2COL_ROWS rows x up to IM2COL_COLS
// columns. Every column's x offset (channel and taps) and tap displacements are decomposed once per
// block into shared memory, every row's base offset and position too, so that an element costs two
// shared loads, the bounds test and the copy (v1 decomposed each element: integer divisions made it
// instruction-bound, ~1.4 ms for the stem's 122M elements). Consecutive threads write consecutive
// columns, continuing into the next row when a row ends (rows of ld are contiguous).
constexpr int IM2COL_ROWS = 32, IM2COL_COLS = 512;
constexpr int IM2COL_PADCOL = -(1 << 29);   // a padding column's displacement: every position out of bounds

template <class T>
__global__ void __launch_bounds__(256) im2col(const Im2colParams p) {
  __shared__ long long coff[IM2COL_COLS];
  __shared__ int cdt[3][IM2COL_COLS];
  __shared__ long long roff[IM2COL_ROWS];
  __shared__ int rb[3][IM2COL_ROWS];
  const long long row0 = (long long)blockIdx.x * IM2COL_ROWS;
  const long long rows = (long long)p.batch * p.out_size[0] * p.out_size[1] * p.out_size[2];
  const int nrows = (int)min((long long)IM2COL_ROWS, rows - row0);
  const long long j0 = (long long)blockIdx.y * IM2COL_COLS;
  const int cw = (int)min((long long)IM2COL_COLS, p.ld - j0);
  const int per_group = p.cg * p.taps;
  const bool flip = p.flags & PYDNN_IM2COL_FLAG_FLIP;
  for (int jl = threadIdx.x; jl < cw; jl += blockDim.x) {
    const long long j = j0 + jl;
    if (j >= p.cols) {  // the zero padding of the row (the GEMM reads it; 0 * w = 0)
      coff[jl] = 0;
      cdt[0][jl] = IM2COL_PADCOL; cdt[1][jl] = 0; cdt[2][jl] = 0;
      continue;
    }
    const int g = (int)(j / per_group), jj = (int)(j - (long long)g * per_group);
    int c, tap;
    if (p.cin_inner) { tap = jj / p.cg; c = jj - tap * p.cg; }
    else { c = jj / p.taps; tap = jj - c * p.taps; }
    int t[3];
    t[2] = tap % p.filt[2]; tap /= p.filt[2];
    t[1] = tap % p.filt[1];
    t[0] = tap / p.filt[1];
    long long off = (long long)(g * p.cg + c) * p.xs[1];
#pragma unroll
    for (int i = 0; i < 3; ++i) {
      const int d = (flip ? p.filt[i] - 1 - t[i] : t[i]) * p.dil[i];
      cdt[i][jl] = d;
      off += (long long)d * p.xs[2 + i];
    }
    coff[jl] = off;
  }
  for (int rl = threadIdx.x; rl < nrows; rl += blockDim.x) {
    long long r = row0 + rl;
    int o[3];
    o[2] = (int)(r % p.out_size[2]); r /= p.out_size[2];
    o[1] = (int)(r % p.out_size[1]); r /= p.out_size[1];
    o[0] = (int)(r % p.out_size[0]);
    const long long n = r / p.out_size[0];
    long long off = n * p.xs[0];
#pragma unroll
    for (int i = 0; i < 3; ++i) {
      const int b = o[i] * p.stride[i] - p.pad[i];
      rb[i][rl] = b;
      off += (long long)b * p.xs[2 + i];
    }
    roff[rl] = off;
  }
  __syncthreads();
  const T* __restrict__ x = static_cast<const T*>(p.x);
  T* __restrict__ col = static_cast<T*>(p.col);
  const int total = nrows * cw;
  int rl = threadIdx.x / cw, jl = threadIdx.x - rl * cw;
  for (int e = threadIdx.x; e < total; e += blockDim.x) {
    const bool ok = (unsigned)(rb[0][rl] + cdt[0][jl]) < (unsigned)p.in_size[0] &&
                    (unsigned)(rb[1][rl] + cdt[1][jl]) < (unsigned)p.in_size[1] &&
                    (unsigned)(rb[2][rl] + cdt[2][jl]) < (unsigned)p.in_size[2];
    col[(row0 + rl) * p.ld + j0 + jl] = ok ? x[roff[rl] + coff[jl]] : store<T>(0.0f);
    jl += blockDim.x;
    while (jl >= cw) { jl -= cw; ++rl; }
  }
}

// One thread per element of the K x ld packed filter.
template <class T>
__global__ void __launch_bounds__(256) pack_filter(const PackFilterParams p) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (long long)p.k * p.ld) return;
  const int k = (int)(i / p.ld), j = (int)(i - (long long)k * p.ld);
  T v = store<T>(0.0f);
  if (j < p.cols) {
    int c, tap;
    if (p.cin_inner) { tap = j / p.cg; c = j - tap * p.cg; }
    else { c = j / p.taps; tap = j - c * p.taps; }
    const int t2 = tap % p.filt[2], t1 = (tap / p.filt[2]) % p.filt[1], t0 = tap / (p.filt[2] * p.filt[1]);
    v = static_cast<const T*>(p.w)[k * p.ws[0] + c * p.ws[1] + t0 * p.ws[2] + t1 * p.ws[3] + t2 * p.ws[4]];
  }
  static_cast<T*>(p.out)[i] = v;
}

// The first tap tt in [0, step) with a - tt * dil a multiple of s (a >= 0), and its output a' / s; tt =
// F (no tap) when there is none. (a, o, rem) follow tt without a division per step.
__device__ __forceinline__ void first_tap(int a, int s, int dil, int step, int F, int& tt, int& o) {
  o = a / s;
  int rem = a - o * s;
  tt = 0;
  while (rem != 0) {
    if (++tt >= step || tt >= F) { tt = F; return; }
    rem -= dil;
    while (rem < 0) { rem += s; --o; }
  }
}

// One thread per dx element, grid (elements of one image / 256, N) (channels innermost in the thread order
// when CLAST, so that NHWC dx is written coalesced); the element's taps are summed in a fixed order
// (ascending applied tap): deterministic.
template <class T>
__global__ void __launch_bounds__(256) col2im(const Col2imParams p) {
  typedef typename AccOf<T>::type A;
  unsigned r = blockIdx.x * blockDim.x + threadIdx.x;   // the element within image n = blockIdx.y (32-bit
  if (r >= (unsigned)p.total) return;                     // arithmetic: 64-bit divisions are calls)
  const int n = blockIdx.y;
  int c, q0, q1, q2;
  const unsigned C = p.c, D = p.in_size[0], H = p.in_size[1], W = p.in_size[2];
  if (p.flags & PYDNN_COL2IM_FLAG_CLAST) {
    c = (int)(r % C); r /= C;
    q2 = (int)(r % W); r /= W;
    q1 = (int)(r % H); r /= H;
    q0 = (int)(r % D);
  } else {
    q2 = (int)(r % W); r /= W;
    q1 = (int)(r % H); r /= H;
    q0 = (int)(r % D); r /= D;
    c = (int)r;
  }
  const bool flip = p.flags & PYDNN_IM2COL_FLAG_FLIP;
  const T* col = static_cast<const T*>(p.col);
  const long long row0 = (long long)n * p.out_size[0] * p.out_size[1] * p.out_size[2];
  A sum = 0;
  // Per dim, the input position q meets output o through the applied tap tt when q + pad - tt * dil = o *
  // stride; those tt form a progression of step stride / gcd(stride, dil) (tap_step), o falling by dil /
  // gcd (out_step) at each: the walk finds the first and then visits only those.
  int tt0, o0, tt1s, o1s, tt2s, o2s;
  first_tap(q0 + p.pad[0], p.stride[0], p.dil[0], p.tap_step[0], p.filt[0], tt0, o0);
  first_tap(q1 + p.pad[1], p.stride[1], p.dil[1], p.tap_step[1], p.filt[1], tt1s, o1s);
  first_tap(q2 + p.pad[2], p.stride[2], p.dil[2], p.tap_step[2], p.filt[2], tt2s, o2s);
  for (; tt0 < p.filt[0] && o0 >= 0; tt0 += p.tap_step[0], o0 -= p.out_step[0]) {
    if (o0 >= p.out_size[0]) continue;
    const int t0 = flip ? p.filt[0] - 1 - tt0 : tt0;
    for (int tt1 = tt1s, o1 = o1s; tt1 < p.filt[1] && o1 >= 0; tt1 += p.tap_step[1], o1 -= p.out_step[1]) {
      if (o1 >= p.out_size[1]) continue;
      const int t1 = flip ? p.filt[1] - 1 - tt1 : tt1;
      const long long rowb = row0 + ((long long)o0 * p.out_size[1] + o1) * p.out_size[2];
      for (int tt2 = tt2s, o2 = o2s; tt2 < p.filt[2] && o2 >= 0; tt2 += p.tap_step[2], o2 -= p.out_step[2]) {
        if (o2 >= p.out_size[2]) continue;
        const int t2 = flip ? p.filt[2] - 1 - tt2 : tt2;
        const int tap = (t0 * p.filt[1] + t1) * p.filt[2] + t2;
        const int j = p.cin_inner ? tap * p.c + c : c * p.taps + tap;
        sum += load<A>(col[(rowb + o2) * p.ld + j]);
      }
    }
  }
  T* dx = static_cast<T*>(p.dx) + (long long)n * p.xs[0] + (long long)c * p.xs[1] + (long long)q0 * p.xs[2] +
          (long long)q1 * p.xs[3] + (long long)q2 * p.xs[4];
  A v = (A)p.alpha * sum;
  if (p.flags & PYDNN_COL2IM_FLAG_BETA) v += (A)p.beta * load<A>(*dx);
  *dx = store<T>(v);
}

// Backward filter (BWD_FILTER_ALGO_3): a tensor chunk made channel-major, [ch][img * rows + pos]; one
// thread per element, positions innermost (coalesced writes; reads too where positions are contiguous).
template <class T>
__global__ void __launch_bounds__(256) pack_rows(const PackRowsParams p) {
  const int pos = blockIdx.x * blockDim.x + threadIdx.x;
  if (pos >= p.rows) return;
  const int c = blockIdx.y, n = blockIdx.z;
  const T* in = static_cast<const T*>(p.in);
  static_cast<T*>(p.out)[c * p.out_ld + (long long)n * p.rows + pos] =
      in[n * p.s_img + c * p.s_ch + pos * p.s_pos];
}

// Backward filter: the partial dw's of the split GEMMs summed in a fixed order (t ascending: bitwise
// reproducible), alpha / beta applied, written through dw's strides. One thread per dw element, the
// partials' contiguous index innermost.
template <class T>
__global__ void __launch_bounds__(256) wgrad_fold(const GemmFoldParams p) {
  typedef typename AccOf<T>::type A;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= p.k * p.cols) return;
  int k, j;
  if (p.flags & PYDNN_WFOLD_FLAG_KFAST) { j = i / p.k; k = i - j * p.k; }
  else { k = i / p.cols; j = i - k * p.cols; }
  const T* part = static_cast<const T*>(p.part) + k * p.ks + j * p.js;
  A sum = 0;
  int t = 0;
  for (; t + 4 <= p.parts; t += 4) {  // four loads in flight, added in order
    const A v0 = load<A>(part[t * p.part_stride]), v1 = load<A>(part[(t + 1) * p.part_stride]);
    const A v2 = load<A>(part[(t + 2) * p.part_stride]), v3 = load<A>(part[(t + 3) * p.part_stride]);
    sum += v0; sum += v1; sum += v2; sum += v3;
  }
  for (; t < p.parts; ++t) sum += load<A>(part[t * p.part_stride]);
  int c, tap;
  if (p.cin_inner) { tap = j / p.cg; c = j - tap * p.cg; }
  else { c = j / p.taps; tap = j - c * p.taps; }
  const int t2 = tap % p.filt[2], t1 = (tap / p.filt[2]) % p.filt[1], t0 = tap / (p.filt[2] * p.filt[1]);
  T* dw = static_cast<T*>(p.dw) + k * p.ws[0] + c * p.ws[1] + t0 * p.ws[2] + t1 * p.ws[3] + t2 * p.ws[4];
  A v = (A)p.alpha * sum;
  if (p.flags & PYDNN_WFOLD_FLAG_BETA) v += (A)p.beta * load<A>(*dw);
  *dw = store<T>(v);
}

}  // namespace conv_gemm
}  // namespace pydnn
