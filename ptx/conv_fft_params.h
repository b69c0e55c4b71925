/* Convolution FFT parameters (plain C; mirrored in pydnn/ops/convolution_fft.py, layout checked on the
 * CPU).
 *
 * A 2-d, stride-1, dilation-1, one-group problem in forward form: out[n][o][h][w] = sum over i, r, s of
 * in[n][i][h + r - pad_h][w + s - pad_w] * f(o, i, r, s). Forward: in = x, out = y, f = w (rotated by 180
 * degrees in CONVOLUTION mode). Backward data: in = dy, out = dx, pad = filter - 1 - pad, and f is the
 * filter with its channel roles swapped (flag BWD) and rotated (flag FLIP toggled).
 *
 * FFT size Fh x Fw = 2^log_h x 2^log_w, chosen on the host so that the circular correlation equals the
 * linear one on every output. Spectra are kept for the non-negative half of the w frequencies
 * (bins = Fh * (Fw / 2 + 1) complex doubles per transform; real inputs make the rest their conjugates):
 *   xf[(n * cin + i) * bins + b]    input spectra
 *   wf[(o * cin + i) * bins + b]    conjugated filter spectra (taps placed at (r - pad) mod F)
 *   yf[(n * cout + o) * bins + b]   their per-bin products summed over i
 * The inverse transform of yf is the output at index ((h + crop_h) mod Fh, (w + crop_w) mod Fw) (h < out_h,
 * w < out_w; crop 0 in the forward and backward data).
 *
 * Backward filter in the same form, the reduction running over the images instead of the input
 * channels: dw[k][c][r][s] = sum over n, p, q of dy[n][k][p][q] * x[n][c][p + r - pad_h][q + s - pad_w] is
 * the circular correlation g = IFFT(X conj(DY)) read at (r - pad) mod F. The kernels' roles: "filter" = dy
 * (taps = its P x Q plane, placed at pad 0), "input" = x, batch = C, cin = N, cout = K (so xf holds
 * [c][n], wf [k][n], yf [c][k]), out = dw with crop = -pad; the strides are set accordingly on the host. */
#ifndef PYDNN_CONV_FFT_PARAMS_H
#define PYDNN_CONV_FFT_PARAMS_H

#define PYDNN_FFT_FLAG_Z 4u        /* same values as PYDNN_CONV_FLAG_* (the fused epilogue) */
#define PYDNN_FFT_FLAG_BIAS 8u
#define PYDNN_FFT_FLAG_FLIP 16u    /* read the filter's taps rotated by 180 degrees */
#define PYDNN_FFT_FLAG_BWD 1024u   /* backward data: filter roles swapped (o = input channel of w) */
#define PYDNN_FFT_FLAG_FLIP_OUT 2048u /* backward filter, CONVOLUTION mode: write tap (h, w) at (out_h-1-h, out_w-1-w) */
#define PYDNN_FFT_MAX_POINTS 8192 /* Fh * Fw: double spectra of one transform in 128 KiB of shared memory */

typedef struct {
  const void *in;        /* x or dy */
  const void *w;
  void *out;             /* y or dx */
  void *xf, *wf, *yf;    /* workspace parts (double2) */
  const void *z, *bias;  /* fused epilogue (forward only) */
  double alpha, beta, alpha2, coef;
  int batch, cin, cout;
  int in_h, in_w, out_h, out_w;
  int pad_h, pad_w, filt_h, filt_w;
  int log_h, log_w, bins;
  int crop_h, crop_w;     /* the inverse reads the output at (h + crop_h, w + crop_w) mod F */
  int act;               /* PYDNN_CONV_ACT_* (0 but for ConvolutionBiasActivationForward) */
  unsigned flags;        /* PYDNN_FLAG_BETA, PYDNN_FLAG_NAN_PROP, PYDNN_FFT_FLAG_* */
  long long is[4];       /* in strides: n, c, h, w */
  long long os[4];       /* out strides */
  long long zs[4];       /* z strides */
  long long ws[4];       /* filter strides: k, c, r, s */
  long long bias_stride;
} FftParams;

#endif
