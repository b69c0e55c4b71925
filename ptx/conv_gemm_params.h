/* Convolution GEMM algorithm (CUDNN_CONVOLUTION_FWD_ALGO_GEMM) parameters: the explicit im2col of x into
 * the workspace (plain C; mirrored in pydnn/ops/convolution_gemm.py, layout checked on the CPU).
 *
 * The column matrix is col[row][j], row-major, rows = N * OD * OH * OW (one per output position, n
 * outermost), cols = groups * cg * taps. Column j of group g holds x[n][g * cg + c] at the tap's input
 * position (zero in the padding). Within a group the column order follows the filter's memory order so
 * that the filter itself is the GEMM's B operand: cin_inner 0: c * taps + tap (NCHW filter, (K, C, T, R, S)),
 * cin_inner 1: tap * cg + c (NHWC filter, (K, T, R, S, C)). The GEMM is then a 1x1, stride-1 convolution
 * of col (NHWC, groups * cg * taps channels) with the filter viewed as (K, cg * taps, 1, 1, 1). */
#ifndef PYDNN_CONV_GEMM_PARAMS_H
#define PYDNN_CONV_GEMM_PARAMS_H

#define PYDNN_IM2COL_FLAG_FLIP 16u  /* CONVOLUTION mode: tap t reads the filter's tap (T-1-t, ...) */

typedef struct {
  const void *x;
  void *col;
  int batch, groups, cg, taps;
  int in_size[3];       /* D, H, W of x */
  int out_size[3];      /* D, H, W of y */
  int filt[3];          /* T, R, S */
  int pad[3], stride[3], dil[3];
  int cin_inner;        /* column order inside a group, see above */
  unsigned flags;       /* PYDNN_IM2COL_FLAG_FLIP */
  long long xs[5];      /* x strides: n, c, d, h, w (elements) */
  long long cols;       /* groups * cg * taps (the row length of col) */
} Im2colParams;

#endif
