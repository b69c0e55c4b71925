// Convolution through explicit GEMMs (see conv_gemm_params.h for the column layout): im2col (forward),
// pack_filter (the filter as a padded K x ld matrix), col2im (backward data), pack_rows and wgrad_fold
// (backward filter), and wgrad_implicit (the backward filter without a column matrix: its own
// CUDA-core GEMM, see below). The other GEMMs are
// not here: the family's 1x1 convolution kernels (tensor-core fwd_tc / wgmma, or the CUDA-core implicit
// GEMM) or pydnn.ops.matmul, so pydnn keeps one GEMM engine per data path.
#include "common/mma.cuh"
#include "common/types.cuh"
#include "conv_gemm_params.h"

namespace pydnn {
namespace conv_gemm {

// grid (rows / IM2COL_ROWS, ld / IM2COL_COLS): a block writes IM2COL_ROWS rows x up to IM2COL_COLS
// columns. Every column's x offset (channel and taps) and tap displacements are decomposed once per
// block into shared memory, every row's base offset and position too, so that an element costs two
// shared loads, the bounds test and the copy (decomposing each element instead, integer divisions made
// it instruction-bound: ~1.4 ms for the stem's 122M elements; pydnn/ops/convolution_gemm.py's notes).
// Consecutive threads write consecutive columns, continuing into the next row when a row ends (rows of ld
// are contiguous).
constexpr int IM2COL_ROWS = 32, IM2COL_COLS = 512;
constexpr int IM2COL_PADCOL = -(1 << 29);   // a padding column's displacement: every position out of bounds

// Column jj of the column matrix within its group (im2col's, wgrad_implicit's and wgrad_fold's): its input
// channel c and filter position t[3]. Columns run tap-major within a channel, or channel-major within a
// tap with cin_inner (NHWC x / dw).
template <class P>
__device__ __forceinline__ void column_of(const P& p, int jj, int& c, int (&t)[3]) {
  int tap;
  if (p.cin_inner) { tap = jj / p.cg; c = jj - tap * p.cg; }
  else { c = jj / p.taps; tap = jj - c * p.taps; }
  t[2] = tap % p.filt[2]; tap /= p.filt[2];
  t[1] = tap % p.filt[1];
  t[0] = tap / p.filt[1];
}

// ... and the tap's displacement d[i] along each spatial dim: the filter position, rotated by 180
// degrees in CONVOLUTION mode (flip), times the dilation.
template <class P>
__device__ __forceinline__ void column_tap(const P& p, int jj, bool flip, int& c, int (&d)[3]) {
  column_of(p, jj, c, d);
#pragma unroll
  for (int i = 0; i < 3; ++i) d[i] = (flip ? p.filt[i] - 1 - d[i] : d[i]) * p.dil[i];
}

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
    int c, d[3];
    column_tap(p, jj, flip, c, d);
    long long off = (long long)(g * p.cg + c) * p.xs[1];
#pragma unroll
    for (int i = 0; i < 3; ++i) {
      cdt[i][jl] = d[i];
      off += (long long)d[i] * p.xs[2 + i];
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
  int c, tp[3];
  column_of(p, j, c, tp);
  T* dw = static_cast<T*>(p.dw) + k * p.ws[0] + c * p.ws[1] + tp[0] * p.ws[2] + tp[1] * p.ws[3] + tp[2] * p.ws[4];
  A v = (A)p.alpha * sum;
  if (p.flags & PYDNN_WFOLD_FLAG_BETA) v += (A)p.beta * load<A>(*dw);
  *dw = store<T>(v);
}

// Backward filter without a column matrix (BWD_FILTER_ALGO_3's implicit variant, float; conv_gemm_params.h
// WgradImplicitParams). Block (slot, column tile, K tile) owns a 64 (k) x 160 (column) tile of dw for the
// pixels of its slot and walks them in stages of WI_BK: per stage, every thread gathers its own column
// of the stage's WI_BK pixels straight from x into cs[stage][pixel][column] (cp.async, zero-filled where
// the tap falls in the padding, so no bounds work reaches the FMA loop; the column's channel / tap
// decomposition lives in registers, each pixel's origin in shared memory, written by WI_BK threads one
// stage ahead), and the stage's dy rows into ds[stage][pixel][k] (pixels innermost in the thread order
// for NCHW-like dy: coalesced reads of its rows). WI_STAGES buffers: the gathers of the next two stages
// fly while a stage's FMAs run, one barrier per stage. The product is gemm_simt's register tile: a warp
// owns 64 k x 32 columns, a thread 8 x 8 (k am..am+3 and am+32.., columns bn..bn+3 and bn+16..), i.e.
// four 16-byte shared loads (broadcasts) per 64 FMAs per pixel. fp32 FMA throughout (no TF32); each
// block adds its pixels in order and writes its partial once (no atomics): with wgrad_fold's fixed
// order, bitwise reproducible.
constexpr int WI_KT = 64, WI_JT = 160, WI_THREADS = 160, WI_BK = 16, WI_STAGES = 3;
constexpr int WI_DYLD = WI_KT + 4;  // ds row pitch (floats): 16-byte rows, 2-way conflicts on the transposing writes
constexpr int WI_NOPIX = -(1 << 29);  // a missing pixel's / padding column's displacement: out of every bound

template <class T, int MINB>
__global__ void __launch_bounds__(WI_THREADS, MINB) wgrad_implicit(const WgradImplicitParams p) {
  static_assert(sizeof(T) == 4, "wgrad_implicit copies 4-byte (float) elements");
  __shared__ __align__(16) float cs[WI_STAGES][WI_BK][WI_JT];
  __shared__ __align__(16) float ds[WI_STAGES][WI_BK][WI_DYLD];
  __shared__ int4 pinfo[2][WI_BK];  // per pixel of a stage: x offset of its origin, origin d, h, w
  __shared__ int pdy[2][WI_BK];     // dy offset of the pixel (channel 0), -1: no pixel
  const int t = threadIdx.x, warp = t >> 5, lane = t & 31;
  const int pix0 = blockIdx.x * p.per_slot;
  const int npx = min(p.per_slot, p.npix - pix0);
  const int nst = (npx + WI_BK - 1) / WI_BK;
  const int k0 = blockIdx.z * WI_KT;
  const float* __restrict__ x = static_cast<const float*>(p.x);
  const float* __restrict__ dy = static_cast<const float*>(p.dy);

  // this thread's gather column: its x offset and tap displacements
  const int j = blockIdx.y * WI_JT + t;
  int coff = 0, cd0 = WI_NOPIX, cd1 = 0, cd2 = 0;
  if (j < p.cols) {
    int c, d[3];
    column_tap(p, j, p.flags & PYDNN_IM2COL_FLAG_FLIP, c, d);
    cd0 = d[0], cd1 = d[1], cd2 = d[2];
    coff = c * p.xs[1] + cd0 * p.xs[2] + cd1 * p.xs[3] + cd2 * p.xs[4];
  }
  const bool kfast = p.flags & PYDNN_WI_FLAG_DY_KFAST;

  auto pixel_info = [&](int st) {  // threads 0..WI_BK-1: stage st's pixel origins into pinfo[st & 1]
    if (t < WI_BK) {
      const int i = st * WI_BK + t;
      int4 v = make_int4(0, WI_NOPIX, 0, 0);
      int dyo = -1;
      if (i < npx) {
        int r = pix0 + i;
        const int o2 = r % p.out_size[2]; r /= p.out_size[2];
        const int o1 = r % p.out_size[1]; r /= p.out_size[1];
        const int o0 = r % p.out_size[0];
        const int n = r / p.out_size[0];
        v.y = o0 * p.stride[0] - p.pad[0];
        v.z = o1 * p.stride[1] - p.pad[1];
        v.w = o2 * p.stride[2] - p.pad[2];
        v.x = n * p.xs[0] + v.y * p.xs[2] + v.z * p.xs[3] + v.w * p.xs[4];
        dyo = n * p.ys[0] + o0 * p.ys[2] + o1 * p.ys[3] + o2 * p.ys[4];
      }
      pinfo[st & 1][t] = v;
      pdy[st & 1][t] = dyo;
    }
  };
  auto gather = [&](int st) {  // stage st's columns and dy rows into buffer st % WI_STAGES (cp.async)
    if (st >= nst) return;
    const int b = st % WI_STAGES;
    const unsigned cdst = mma::smem_u32(&cs[b][0][t]);
#pragma unroll 4
    for (int i = 0; i < WI_BK; ++i) {
      const int4 v = pinfo[st & 1][i];
      const bool ok = (unsigned)(v.y + cd0) < (unsigned)p.in_size[0] &&
                      (unsigned)(v.z + cd1) < (unsigned)p.in_size[1] &&
                      (unsigned)(v.w + cd2) < (unsigned)p.in_size[2];
      mma::cp_async_4(cdst + i * WI_JT * 4, ok ? x + (v.x + coff) : x, ok);
    }
    for (int e = t; e < WI_BK * WI_KT; e += WI_THREADS) {
      int i, kk;
      if (kfast) { kk = e % WI_KT; i = e / WI_KT; }
      else { i = e % WI_BK; kk = e / WI_BK; }
      const int dyo = pdy[st & 1][i];
      const bool ok = dyo >= 0 && k0 + kk < p.k;
      mma::cp_async_4(mma::smem_u32(&ds[b][i][kk]), ok ? dy + (dyo + (k0 + kk) * p.ys[1]) : dy, ok);
    }
  };

  float acc[8][8];
#pragma unroll
  for (int a = 0; a < 8; ++a)
#pragma unroll
    for (int c = 0; c < 8; ++c) acc[a][c] = 0.f;
  const int am = (lane >> 2) * 4, bn = warp * 32 + (lane & 3) * 4;

  pixel_info(0);
  pixel_info(1);
  __syncthreads();
  gather(0);
  mma::cp_async_commit();
  gather(1);
  mma::cp_async_commit();
  __syncthreads();   // pinfo[0] read by every thread before stage 2's origins replace it
  pixel_info(2);
  for (int st = 0; st < nst; ++st) {
    mma::cp_async_wait<1>();  // stage st landed (this thread's copies) ...
    __syncthreads();          // ... everyone's; stage st - 1's buffer is free, stage st + 2's origins are in
    gather(st + 2);
    mma::cp_async_commit();   // (an empty group past the end keeps the count uniform)
    pixel_info(st + 3);       // into the slot stage st + 1's gather read before this barrier
    const float* cb = &cs[st % WI_STAGES][0][0];
    const float* db = &ds[st % WI_STAGES][0][0];
#pragma unroll
    for (int i = 0; i < WI_BK; ++i) {
      const float4 a0 = *reinterpret_cast<const float4*>(db + i * WI_DYLD + am);
      const float4 a1 = *reinterpret_cast<const float4*>(db + i * WI_DYLD + am + 32);
      const float4 b0 = *reinterpret_cast<const float4*>(cb + i * WI_JT + bn);
      const float4 b1 = *reinterpret_cast<const float4*>(cb + i * WI_JT + bn + 16);
      const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
      const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
      for (int a = 0; a < 8; ++a)
#pragma unroll
        for (int c = 0; c < 8; ++c) acc[a][c] = fmaf(av[a], bv[c], acc[a][c]);
    }
  }
  float* out = static_cast<float*>(p.part) + (long long)blockIdx.x * p.part_stride;
#pragma unroll
  for (int a = 0; a < 8; ++a) {
    const int k = k0 + am + (a >> 2) * 32 + (a & 3);
    if (k >= p.k) continue;
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      const int jj = blockIdx.y * WI_JT + bn + (c >> 2) * 16 + (c & 3);
      if (jj < p.cols) out[(long long)k * p.cols + jj] = acc[a][c];
    }
  }
}

}  // namespace conv_gemm
}  // namespace pydnn
