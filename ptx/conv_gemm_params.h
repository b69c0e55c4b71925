/* Convolution through explicit GEMMs (forward: CUDNN_CONVOLUTION_FWD_ALGO_GEMM; backward data: the
 * explicit-GEMM form of BWD_DATA_ALGO_1; backward filter: BWD_FILTER_ALGO_3) parameters (plain C; mirrored in pydnn/ops/convolution_gemm.py,
 * layout checked on the CPU).
 *
 * The column matrix is col[row][j], row-major with row length ld >= cols, rows = N * OD * OH * OW (one
 * per output position, n outermost), cols = groups * cg * taps; columns cols..ld-1 are zero (padding to a
 * multiple of 8 so that the tensor-core GEMMs can read rows in 16-byte vectors). Column j of group g holds
 * x[n][g * cg + c] at the tap's input position (zero in the padding). Within a group the column order is
 * cin_inner 0: c * taps + tap (an NCHW filter's memory order, (K, C, T, R, S)), cin_inner 1: tap * cg + c
 * (an NHWC filter's, (K, T, R, S, C)); the filter matrix (K rows of the same columns) is either the
 * caller's filter itself (packed, in that order, ld == cols) or packed by pack_filter into the workspace.
 *
 * Forward: y = col . filter^T (a GEMM: the family's 1x1 convolution kernels or pydnn.ops.matmul).
 * Backward data: col = dy . filter (a GEMM, pydnn.ops.matmul), then col2im gathers each dx element's
 * taps from col in a fixed order (no atomics: deterministic). */
#ifndef PYDNN_CONV_GEMM_PARAMS_H
#define PYDNN_CONV_GEMM_PARAMS_H

#define PYDNN_IM2COL_FLAG_FLIP 16u  /* CONVOLUTION mode: tap t reads the filter's tap (T-1-t, ...) */
#define PYDNN_COL2IM_FLAG_BETA 1u   /* col2im: dx = alpha * sum + beta * dx (else beta is not read) */
#define PYDNN_COL2IM_FLAG_CLAST 2u  /* col2im: threads walk dx with channels innermost (NHWC-like dx) */

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
  long long cols;       /* groups * cg * taps */
  long long ld;         /* the row length of col (>= cols; the columns past cols are written as zero) */
} Im2colParams;

/* pack_filter: out[k][j] (row length ld) = the filter's element of column j (order cin_inner), 0 past
 * cols. One thread per element of out. */
typedef struct {
  const void *w;
  void *out;
  int k, cg, taps, cin_inner;
  int filt[3];
  int pad_;
  long long ws[5];      /* filter strides: k, c, t, r, s (elements) */
  long long cols, ld;
} PackFilterParams;

/* col2im (backward data, one group): dx[n][c][pos] = alpha * sum over the taps whose output position
 * exists (stride and padding) of col[row(n, out pos)][column(c, tap)], taps in ascending order, + beta *
 * dx. One thread per dx element: grid (total / 256, N). */
typedef struct {
  const void *col;
  void *dx;
  int batch, c, taps, cin_inner;
  int in_size[3], out_size[3], filt[3];
  int pad[3], stride[3], dil[3];
  int tap_step[3];      /* stride / gcd(stride, dil): the taps between two that meet an output */
  int out_step[3];      /* dil / gcd(stride, dil): the outputs between them */
  unsigned flags;       /* PYDNN_IM2COL_FLAG_FLIP | PYDNN_COL2IM_FLAG_BETA | PYDNN_COL2IM_FLAG_CLAST */
  float alpha, beta;
  int pad_;
  long long xs[5];      /* dx strides: n, c, d, h, w (elements) */
  long long ld;         /* col's row length */
  long long total;      /* C * D * H * W (the elements of one image; < 2^31) */
} Col2imParams;

/* pack_rows (backward filter, BWD_FILTER_ALGO_3): one image chunk of a tensor read as [img][ch][pos]
 * through its strides, written channel-major: out[ch * out_ld + img * rows + pos], so that the GEMM reads
 * the chunk's positions of every image as one reduction axis. Grid (rows / 256, ch, imgs). */
typedef struct {
  const void *in;
  void *out;
  int rows, ch, imgs, pad_;  /* positions per image, channels, images */
  long long s_img, s_ch, s_pos;  /* in strides (elements) */
  long long out_ld;          /* imgs * rows */
} PackRowsParams;

#define PYDNN_WFOLD_FLAG_BETA 1u   /* wgrad_fold: dw = alpha * sum + beta * dw (else beta is not read) */
#define PYDNN_WFOLD_FLAG_KFAST 2u  /* wgrad_fold: the partials' k stride is 1 (threads walk k innermost) */

/* wgrad_fold (BWD_FILTER_ALGO_3): dw[k][column j] = alpha * sum over t = 0 .. parts-1 (in that order:
 * deterministic) of part[t * part_stride + k * ks + j * js] + beta * dw, for j < cols; column j is the
 * filter element (c, tap) of the column order cin_inner (conv_gemm_params.h's column layout). One thread
 * per dw element. */
typedef struct {
  const void *part;
  void *dw;
  int k, cols, cg, taps, cin_inner, parts;
  int filt[3];
  unsigned flags;       /* PYDNN_WFOLD_FLAG_BETA | PYDNN_WFOLD_FLAG_KFAST */
  float alpha, beta;
  long long part_stride, ks, js;
  long long ws[5];      /* dw strides: k, c, t, r, s (elements) */
} GemmFoldParams;

#define PYDNN_WI_FLAG_DY_KFAST 1u  /* wgrad_implicit: dy's channel stride is 1 (NHWC-like: loads walk k innermost) */

/* wgrad_implicit (BWD_FILTER_ALGO_3's implicit variant, float, one group): no column matrix. Block
 * (slot, column tile, K tile) sums, over the pixels [slot * per_slot, min((slot + 1) * per_slot, npix))
 * of the flattened (n, od, oh, ow) order, dy[n][k][pixel] * x at column j's tap of that pixel (zero in
 * the padding), for 64 k's x 160 columns, and writes part[slot * part_stride + k * cols + j] (k < K, j <
 * cols). Columns follow conv_gemm's column order (cin_inner) and im2col's taps (FLIP: CONVOLUTION mode).
 * Offsets are 32-bit (the plan checks that every element of x and dy it can address fits). */
typedef struct {
  const void *x;
  const void *dy;
  void *part;
  int k, cols, cg, taps, cin_inner;
  int npix;             /* N * OD * OH * OW */
  int per_slot;         /* pixels per slot (a multiple of the kernel's stage) */
  int in_size[3], out_size[3], filt[3];
  int pad[3], stride[3], dil[3];
  unsigned flags;       /* PYDNN_IM2COL_FLAG_FLIP | PYDNN_WI_FLAG_DY_KFAST */
  int xs[5];            /* x strides: n, c, d, h, w (elements) */
  int ys[5];            /* dy strides: n, k, d, h, w (elements) */
  long long part_stride;  /* elements between two slots' partials (K * cols) */
} WgradImplicitParams;

#endif
