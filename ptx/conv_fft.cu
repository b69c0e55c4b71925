// Convolution FFT (forward and backward data; see conv_fft_params.h). Four launches:
//
//   filter_fft   one block per (o, i): taps placed at ((r - pad_h) mod Fh, (s - pad_w) mod Fw), 2-d FFT,
//                the conjugate of the half spectrum stored (correlation = product with the conjugate)
//   input_fft    one block per (n, i): the Fh x Fw zero-extended input plane, 2-d FFT, half spectrum
//   product      one thread per (bin, 4 images, 4 output channels): sum over i of X * conj(W)
//   inverse_fft  one block per (n, o): the Hermitian-completed spectrum, inverse 2-d FFT, the real part
//                scaled by 1 / (Fh Fw) cropped to the output, alpha / beta and the fused epilogue
// Backward filter runs the same four kernels with other roles (conv_fft_params.h): dy as the "filter",
// x as the "input", the sum over the images, and the output read at an offset (crop).
//
// The 2-d transforms are radix-2 decimation-in-time in shared memory (Fh x Fw complex doubles + the two
// twiddle tables): input stored bit-reversed in both indices, log_w row stages then log_h column stages,
// one barrier per stage. Every loop over a block's work strides by blockDim.x, so the kernels are correct
// for any block size (the host test runs them with one thread per block).
// Every output element is written by one thread in a fixed order, no atomics: deterministic. Math and
// spectra in double for every data type (data converted at the two ends): an FFT's rounding error is
// relative to the whole plane, not to each output's own terms, and in float it exceeds float's per-element
// tolerance at outputs that sum few products (corners of a fully padded single-channel convolution:
// measured 1.04x on the host). In double the transforms' own error is negligible; what remains is the
// rounding of the result to the data type (host runs: <= 0.005x float's tolerance, <= 0.04x double's).
#include "common/params.h"
#include "common/types.cuh"
#include "conv_fft_params.h"

namespace pydnn {
namespace conv_fft {

typedef double2 cplx;

#ifndef PYDNN_FFT_HOST
__device__ __forceinline__ cplx* fft_smem() {
  extern __shared__ cplx fft_shared[];
  return fft_shared;
}
#endif

__device__ __forceinline__ int bit_reverse(int v, int bits) {
  int r = 0;
  for (int b = 0; b < bits; ++b) r |= ((v >> b) & 1) << (bits - 1 - b);
  return r;
}

__device__ __forceinline__ cplx cmul(cplx a, cplx b) {
  return make_double2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x);
}

// s's twiddle tables (after the Fh x Fw data): tw_h[t] = exp(-2 pi i t / Fh), t < Fh / 2; tw_w likewise.
// From sincospi (exact arguments).
__device__ void make_twiddles(cplx* s, int lh, int lw) {
  const int fh = 1 << lh, fw = 1 << lw;
  cplx* tw = s + (fh << lw);
  for (int t = threadIdx.x; t < (fh >> 1) + (fw >> 1); t += blockDim.x) {
    const bool h = t < (fh >> 1);
    const int j = h ? t : t - (fh >> 1), n = h ? fh : fw;
    double sn, cs;
    sincospi(-2.0 * j / n, &sn, &cs);
    tw[t] = make_double2(cs, sn);
  }
}

// In-place 2-d DFT of s (bit-reversed in both indices on entry, natural order on exit); INV: the inverse
// (unscaled). The caller synchronizes before (data and twiddles written); this returns synchronized.
template <bool INV>
__device__ void fft2d(cplx* s, int lh, int lw) {
  const int fh = 1 << lh, fw = 1 << lw, half_total = (fh << lw) >> 1;
  const cplx* tw_h = s + (fh << lw);
  const cplx* tw_w = tw_h + (fh >> 1);
  for (int len = 2; len <= fw; len <<= 1) {  // rows (along w)
    const int half = len >> 1, step = fw / len;
    for (int q = threadIdx.x; q < half_total; q += blockDim.x) {
      const int row = q >> (lw - 1), p = q & ((fw >> 1) - 1);
      const int j = p & (half - 1), i0 = row * fw + (p - j) * 2 + j;
      cplx w = tw_w[j * step];
      if (INV) w.y = -w.y;
      const cplx a = s[i0], b = cmul(s[i0 + half], w);
      s[i0] = make_double2(a.x + b.x, a.y + b.y);
      s[i0 + half] = make_double2(a.x - b.x, a.y - b.y);
    }
    __syncthreads();
  }
  for (int len = 2; len <= fh; len <<= 1) {  // columns (along h); consecutive threads: consecutive columns
    const int half = len >> 1, step = fh / len;
    for (int q = threadIdx.x; q < half_total; q += blockDim.x) {
      const int col = q & (fw - 1), p = q >> lw;
      const int j = p & (half - 1), r0 = (p - j) * 2 + j;
      cplx w = tw_h[j * step];
      if (INV) w.y = -w.y;
      const int i0 = (r0 << lw) + col, i1 = i0 + (half << lw);
      const cplx a = s[i0], b = cmul(s[i1], w);
      s[i0] = make_double2(a.x + b.x, a.y + b.y);
      s[i1] = make_double2(a.x - b.x, a.y - b.y);
    }
    __syncthreads();
  }
}

// The half spectrum (w frequencies 0 .. Fw / 2) of s to dst[b], b = k1 * (Fw / 2 + 1) + k2; CONJ: conjugated.
template <bool CONJ>
__device__ void store_half(const cplx* s, cplx* dst, int lh, int lw) {
  const int wh = (1 << (lw - 1)) + 1, bins = (1 << lh) * wh;
  for (int b = threadIdx.x; b < bins; b += blockDim.x) {
    const int k1 = b / wh, k2 = b - k1 * wh;
    cplx v = s[(k1 << lw) + k2];
    if (CONJ) v.y = -v.y;
    dst[b] = v;
  }
}

// wf[(o * cin + i)] = conj(FFT(f(o, i) placed at ((r - pad_h) mod Fh, (s - pad_w) mod Fw))).
template <class T>
__global__ void __launch_bounds__(256) filter_fft(const FftParams p) {
  cplx* s = fft_smem();
  const int t = blockIdx.x, o = t / p.cin, i = t - o * p.cin;
  const int lh = p.log_h, lw = p.log_w, fh = 1 << lh, fw = 1 << lw;
  for (int q = threadIdx.x; q < (fh << lw); q += blockDim.x) s[q] = make_double2(0.0, 0.0);
  make_twiddles(s, lh, lw);
  __syncthreads();
  const T* w = static_cast<const T*>(p.w);
  long long base;
  if (p.flags & PYDNN_FFT_FLAG_BWD) {  // o is a channel of dx (w's input channel), i one of dy (w's output)
    base = (long long)i * p.ws[0] + (long long)o * p.ws[1];
  } else {
    base = (long long)o * p.ws[0] + (long long)i * p.ws[1];
  }
  const bool flip = p.flags & PYDNN_FFT_FLAG_FLIP;
  for (int q = threadIdx.x; q < p.filt_h * p.filt_w; q += blockDim.x) {
    const int r = q / p.filt_w, c = q - r * p.filt_w;
    const int rr = flip ? p.filt_h - 1 - r : r, cc = flip ? p.filt_w - 1 - c : c;
    const double v = load<double>(w[base + (long long)rr * p.ws[2] + (long long)cc * p.ws[3]]);
    const int ph = (r - p.pad_h) & (fh - 1), pw = (c - p.pad_w) & (fw - 1);  // (r - pad) mod F, F a power of 2
    s[(bit_reverse(ph, lh) << lw) + bit_reverse(pw, lw)] = make_double2(v, 0.0);
  }
  __syncthreads();
  fft2d<false>(s, lh, lw);
  store_half<true>(s, static_cast<cplx*>(p.wf) + (long long)t * p.bins, lh, lw);
}

// xf[(n * cin + i)] = FFT(in[n][i] zero-extended to Fh x Fw).
template <class T>
__global__ void __launch_bounds__(256) input_fft(const FftParams p) {
  cplx* s = fft_smem();
  const int t = blockIdx.x, n = t / p.cin, i = t - n * p.cin;
  const int lh = p.log_h, lw = p.log_w, fw = 1 << lw;
  make_twiddles(s, lh, lw);
  const T* in = static_cast<const T*>(p.in) + (long long)n * p.is[0] + (long long)i * p.is[1];
  for (int q = threadIdx.x; q < (fw << lh); q += blockDim.x) {
    const int hh = q >> lw, ww = q & (fw - 1);
    const double v = (hh < p.in_h && ww < p.in_w) ? load<double>(in[(long long)hh * p.is[2] + (long long)ww * p.is[3]])
                                                  : 0.0;
    s[(bit_reverse(hh, lh) << lw) + bit_reverse(ww, lw)] = make_double2(v, 0.0);
  }
  __syncthreads();
  fft2d<false>(s, lh, lw);
  store_half<false>(s, static_cast<cplx*>(p.xf) + (long long)t * p.bins, lh, lw);
}

// yf[n][o][b] = sum over i of xf[n][i][b] * wf[o][i][b], TN images x TN output channels per thread, one bin
// (consecutive threads: consecutive bins, so every load and store is coalesced). Type-independent.
template <int TN>
__global__ void __launch_bounds__(256) product(const FftParams p) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= p.bins) return;
  const int o0 = blockIdx.y * TN, n0 = blockIdx.z * TN;
  const cplx* xf = static_cast<const cplx*>(p.xf);
  const cplx* wf = static_cast<const cplx*>(p.wf);
  const long long bins = p.bins;
  cplx acc[TN][TN];
#pragma unroll
  for (int a = 0; a < TN; ++a)
#pragma unroll
    for (int c = 0; c < TN; ++c) acc[a][c] = make_double2(0.0, 0.0);
  const int nv = p.batch - n0 < TN ? p.batch - n0 : TN, ov = p.cout - o0 < TN ? p.cout - o0 : TN;
  for (int i = 0; i < p.cin; ++i) {
    cplx xv[TN], wv[TN];
#pragma unroll
    for (int a = 0; a < TN; ++a) {
      xv[a] = a < nv ? xf[((long long)(n0 + a) * p.cin + i) * bins + b] : make_double2(0.0, 0.0);
      wv[a] = a < ov ? wf[((long long)(o0 + a) * p.cin + i) * bins + b] : make_double2(0.0, 0.0);
    }
#pragma unroll
    for (int a = 0; a < TN; ++a)
#pragma unroll
      for (int c = 0; c < TN; ++c) {
        acc[a][c].x = fma(xv[a].x, wv[c].x, fma(-xv[a].y, wv[c].y, acc[a][c].x));
        acc[a][c].y = fma(xv[a].x, wv[c].y, fma(xv[a].y, wv[c].x, acc[a][c].y));
      }
  }
  cplx* yf = static_cast<cplx*>(p.yf);
#pragma unroll
  for (int a = 0; a < TN; ++a)
#pragma unroll
    for (int c = 0; c < TN; ++c)
      if (a < nv && c < ov) yf[((long long)(n0 + a) * p.cout + o0 + c) * bins + b] = acc[a][c];
}

__device__ __forceinline__ double activate(const FftParams& p, double v) {
  const bool nan = v != v;
  switch (p.act) {
    case 1:  // RELU
      if (nan) return (p.flags & PYDNN_FLAG_NAN_PROP) ? v : 0.0;
      return v > 0.0 ? v : 0.0;
    case 2:  // CLIPPED_RELU
      if (nan) return (p.flags & PYDNN_FLAG_NAN_PROP) ? v : 0.0;
      return v > 0.0 ? (v < p.coef ? v : p.coef) : 0.0;
    case 3: return sigmoid(v);
    case 4: return m_tanh(v);
    case 5: return v > 0.0 ? v : p.coef * m_expm1(v);
    default: return v;
  }
}

// out[n][o] = crop(IFFT(yf[n][o])) / (Fh Fw), then alpha / beta and the fused epilogue.
template <class T>
__global__ void __launch_bounds__(256) inverse_fft(const FftParams p) {
  cplx* s = fft_smem();
  const int t = blockIdx.x, n = t / p.cout, o = t - n * p.cout;
  const int lh = p.log_h, lw = p.log_w, fh = 1 << lh, fw = 1 << lw, wh = (fw >> 1) + 1;
  make_twiddles(s, lh, lw);
  const cplx* yf = static_cast<const cplx*>(p.yf) + (long long)t * p.bins;
  for (int q = threadIdx.x; q < (fh << lw); q += blockDim.x) {
    const int k1 = q >> lw, k2 = q & (fw - 1);
    cplx v;
    if (k2 < wh) {
      v = yf[k1 * wh + k2];
    } else {  // Y[k1][k2] = conj(Y[-k1][-k2]) for a real output
      v = yf[((fh - k1) & (fh - 1)) * wh + (fw - k2)];
      v.y = -v.y;
    }
    s[(bit_reverse(k1, lh) << lw) + bit_reverse(k2, lw)] = v;
  }
  __syncthreads();
  fft2d<true>(s, lh, lw);
  const double scale = 1.0 / (double)(fh << lw);  // a power of two: exact
  const double alpha = p.alpha, beta = p.beta, alpha2 = p.alpha2;
  T* out = static_cast<T*>(p.out) + (long long)n * p.os[0] + (long long)o * p.os[1];
  for (int q = threadIdx.x; q < p.out_h * p.out_w; q += blockDim.x) {
    const int hh = q / p.out_w, ww = q - hh * p.out_w;
    const bool fo = p.flags & PYDNN_FFT_FLAG_FLIP_OUT;
    const long long off = (long long)(fo ? p.out_h - 1 - hh : hh) * p.os[2] + (long long)(fo ? p.out_w - 1 - ww : ww) * p.os[3];
    const int sh = (hh + p.crop_h) & (fh - 1), sw = (ww + p.crop_w) & (fw - 1);
    double v = alpha * (s[(sh << lw) + sw].x * scale);
    if (p.flags & PYDNN_FLAG_BETA) v += beta * load<double>(out[off]);
    if (p.flags & PYDNN_FFT_FLAG_Z) {
      const long long zoff = (long long)n * p.zs[0] + (long long)o * p.zs[1] + (long long)hh * p.zs[2] +
                             (long long)ww * p.zs[3];
      v += alpha2 * load<double>(static_cast<const T*>(p.z)[zoff]);
    }
    if (p.flags & PYDNN_FFT_FLAG_BIAS) v += load<double>(static_cast<const T*>(p.bias)[o * p.bias_stride]);
    out[off] = store<T>(activate(p, v));
  }
}

}  // namespace conv_fft
}  // namespace pydnn
