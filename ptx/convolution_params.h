/* Convolution kernel parameters (plain C; mirrored in pydnn/ops/convolution.py, layout checked on the CPU).
 *
 * Every problem is seen as 3 spatial dims (D, H, W): a 1-d or 2-d problem has size-1 leading dims with
 * pad 0, stride 1, dilation 1. Tensors are addressed with 5 strides in elements: x / dx / z / y / dy as
 * (n, c, d, h, w), the filter as (k, c, t, r, s). Per group g the problem is an implicit GEMM
 * C[m][n] = sum_k A[m][k] B[k][n] (see ptx/convolution.cu for each direction's M, N, K).
 *
 * The GEMM's reduction index k is a 4-digit mixed-radix number (red_size, outermost first); the host
 * also writes the digits of the tile depth (red_step) so that the kernels advance k without dividing. */
#ifndef PYDNN_CONVOLUTION_PARAMS_H
#define PYDNN_CONVOLUTION_PARAMS_H

/* flags beyond PYDNN_FLAG_BETA (1) and PYDNN_FLAG_NAN_PROP (2) */
#define PYDNN_CONV_FLAG_Z 4u        /* add alpha2 * z (ConvolutionBiasActivationForward) */
#define PYDNN_CONV_FLAG_BIAS 8u     /* add bias[k] */
#define PYDNN_CONV_FLAG_FLIP 16u    /* CONVOLUTION mode: the filter is flipped in every spatial dim */
#define PYDNN_CONV_FLAG_A_KFAST 32u /* A tile loads: consecutive threads along the reduction index */
#define PYDNN_CONV_FLAG_B_KFAST 64u /* B tile loads: consecutive threads along the reduction index */
#define PYDNN_CONV_FLAG_PARTIAL 128u /* write raw Acc sums to the workspace (split-K), no epilogue */
#define PYDNN_CONV_FLAG_PAIR 512u   /* tensor-core epilogue: y's channels contiguous and every pair 4-byte
                                       aligned: store two channels as one 32-bit word */
#define PYDNN_CONV_FLAG_STAGED 1024u /* tensor-core forward: the plain epilogue through shared memory too
                                       (fwd_staged_epilogue; beta / z / bias / act always go there) */
#define PYDNN_CONV_FLAG_CIN 256u    /* forward / backward data: the reduction index is (t, r, s, channel),
                                       channel innermost (NHWC), instead of (channel, t, r, s) */

/* act: the epilogue activation (ConvolutionBiasActivationForward); 0 for the plain ops */
#define PYDNN_CONV_ACT_IDENTITY 0
#define PYDNN_CONV_ACT_RELU 1
#define PYDNN_CONV_ACT_CLIPPED_RELU 2
#define PYDNN_CONV_ACT_SIGMOID 3
#define PYDNN_CONV_ACT_TANH 4
#define PYDNN_CONV_ACT_ELU 5

typedef struct {
  const void *x;        /* forward: x; backward data: dy; backward filter: dy (the A operand's tensor) */
  const void *w;        /* forward / backward data: the filter; backward filter: x (the B operand) */
  void *out;            /* y, dx, dw, or the Acc workspace of split-K partials */
  const void *z;        /* residual (FLAG_Z) */
  const void *bias;     /* bias (FLAG_BIAS) */
  double alpha, beta, alpha2, coef;
  int batch, groups;    /* N, group count */
  int cg, kg;           /* input / output channels per group */
  int in_size[3];       /* D, H, W of x */
  int out_size[3];      /* D, H, W of y */
  int filt[3];          /* T, R, S */
  int pad[3], stride[3], dil[3];
  int gm, gn, gk;       /* GEMM M, N, K per group */
  int splits;           /* split-K slices (grid z = groups * splits) */
  int k_per_split;      /* reduction length of one slice (a multiple of the tile depth; fwd_wgmma: K tiles) */
  int act;              /* PYDNN_CONV_ACT_* */
  unsigned flags;
  int red_size[4];      /* the reduction index's digits, outermost first */
  int red_step[4];      /* the digits of the tile depth in that radix */
  int pad_;
  long long xs[5];      /* x (forward, backward filter) or dx (backward data) strides: n, c, d, h, w */
  long long ys[5];      /* y (forward) or dy (backward) strides */
  long long ws[5];      /* filter strides: k, c, t, r, s */
  long long zs[5];      /* z strides */
  long long bias_stride;/* bias stride along its channel dim */
} ConvParams;

/* The deterministic split-K fold, the bias gradient and filter_kc_swap (the filter with K and C swapped,
 * for backward data on the wgmma forward: in = w, out = the workspace, kg, cg, taps, filt, in_stride = w's
 * strides) share this simpler struct. */
typedef struct {
  void *out;            /* dw (fold) or db (bias) */
  const void *in;       /* the Acc partials (fold) or dy (bias) */
  double alpha, beta;
  int groups, kg, cg, taps;  /* fold: dw is (groups * kg, cg, taps) */
  int filt[3];               /* fold: T, R, S (to flip); bias: unused */
  int splits;                /* fold: partial slices to add, in order */
  unsigned flags;            /* PYDNN_FLAG_BETA, PYDNN_CONV_FLAG_FLIP */
  int channels;              /* bias: K */
  long long count;           /* bias: N * D * H * W (elements per channel) */
  int inner[4];              /* bias: sizes of (n, d, h, w) */
  long long in_stride[5];    /* bias: dy strides (n, c, d, h, w) */
  long long out_stride[5];   /* fold: dw strides (k, c, t, r, s); bias: db stride along c in [1] */
} ConvAuxParams;

#endif
