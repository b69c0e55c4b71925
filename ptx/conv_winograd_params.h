/* Convolution WINOGRAD_NONFUSED parameters (plain C; mirrored in pydnn/ops/convolution_winograd.py,
 * layout checked on the CPU).
 *
 * F(m x m, 3 x 3), m = 2 or 4 (the kernels' template argument; tiles_h / tiles_w count m x m tiles), over 2-d
 * problems in forward form: out[n][o][h][w] = sum over i, r, s of
 * in[n][g*cin_g + i][h + r - pad_h][w + s - pad_w] * f(o, i, r, s), o = g * cout_g + oc. Forward: in = x,
 * out = y, f = w (flipped in CONVOLUTION mode). Backward data: in = dy, out = dx, pad = 2 - pad, and f is
 * the filter with its channel roles swapped and rotated by 180 degrees (flag BWD).
 *
 * Workspace (Acc = float, or double for double data), P = (m + 2)^2 transform positions b (16 or 36):
 *   U[b][m][ci]  input transform,  ci in [0, groups * cin_g),  m = (n, tile_h, tile_w)
 *   V[b][o][i]   filter transform, o in [0, groups * cout_g), i in [0, cin_g)
 *   M[b][m][o]   the per-position products: for each b a grouped GEMM M = U V^T over i
 * addressed as u[m * u_m + ci * u_c + b * u_b] (C = groups * cin_g, u_b = C * u_c), m[m * m_m + (b * K + o)
 * m_c] (K = groups * cout_g): one of u_m / u_c is 1 (the layout follows the tensor's), likewise for m.
 *
 * Backward filter (dw = G^T (sum over tiles of (A dy A^T) . (B^T x B)) G): in = x, transformed by
 * input_transform into U; dy by grad_transform (A dy A^T, m x m tiles) into D with the same addressing
 * (its own WinoParams: in = dy, cin_g = K / groups); the tiles split into `splits` chunks of `chunk`
 * tiles (a tile m at (m / chunk) * u_s + (m % chunk) * u_m; tiles past N * tiles_h * tiles_w are zero),
 * P * splits * groups GEMMs M[s][b][o][i] = sum over the chunk's tiles of D[o] U[i] (convolution_winograd
 * .wgrad_view), and filter_grad: dw[o][i] = alpha * G^T (sum over s of M[s]) G + beta * dw.
 * The GEMMs are one batched launch of matmul's gemm_simt (float accumulation; batch b * groups + g, see
 * convolution_winograd.gemm_view), or the family's implicit GEMM as a 1x1 convolution with P * groups
 * groups (double). */
#ifndef PYDNN_CONV_WINOGRAD_PARAMS_H
#define PYDNN_CONV_WINOGRAD_PARAMS_H

#define PYDNN_WINO_FLAG_Z 4u        /* same values as PYDNN_CONV_FLAG_* (the fused epilogue) */
#define PYDNN_WINO_FLAG_BIAS 8u
#define PYDNN_WINO_FLAG_FLIP 16u    /* read the filter's taps rotated by 180 degrees */
#define PYDNN_WINO_FLAG_BWD 1024u   /* backward data: filter roles swapped (o = input channel of w) */

typedef struct {
  const void *in;       /* x or dy */
  const void *w;
  void *out;            /* y or dx */
  void *u, *v, *m;      /* workspace parts */
  const void *z, *bias; /* fused epilogue (forward only) */
  double alpha, beta, alpha2, coef;
  int batch, groups, cin_g, cout_g;
  int in_h, in_w, out_h, out_w;
  int pad_h, pad_w, tiles_h, tiles_w;
  int act;              /* PYDNN_CONV_ACT_* (0 but for ConvolutionBiasActivationForward) */
  unsigned flags;       /* PYDNN_FLAG_BETA, PYDNN_FLAG_NAN_PROP, PYDNN_WINO_FLAG_* */
  long long tiles;      /* M = batch * tiles_h * tiles_w */
  long long is[4];      /* in strides: n, c, h, w */
  long long os[4];      /* out strides */
  long long zs[4];      /* z strides */
  long long ws[4];      /* filter strides: k, c, r, s */
  long long bias_stride;
  long long u_m, u_c, m_m, m_c;
  long long u_b;        /* U's (and the backward filter's D's) stride between transform positions b */
  long long chunk, u_s; /* tiles m in chunks of `chunk` tiles, u_s apart (backward filter's split of the
                           tile reduction; chunk >= tiles: one chunk) */
  int splits;           /* backward filter: the partial M's summed by filter_grad */
  int spare;
} WinoParams;

#endif
