/* Layer / group / instance / RMS normalization kernel parameters (plain C; mirrored in
 * pydnn/ops/normalization.py, layout checked on the CPU).
 *
 * A problem is `sets` independent normalization sets of `len` elements each (layer / RMS norm: a row
 * of the trailing dims; group norm: (n, group); instance norm: (n, channel)).
 *   Set dims (outermost first, set_size / set_stride): where set s starts in each operand (x, out, dy)
 *   and where its statistics sit (stats: the mean / invstd tensors); set_pstride: the first parameter
 *   index of the set (group norm: g * C/G), in scale / bias / dscale / dbias (packed, fp32).
 *   Element dims (outermost first, el_size / el_stride per operand / el_pstride): where element e of a
 *   set sits and which parameter scales it. The element order inside a set is the memory order of x
 *   (statistics do not depend on it).
 * The fast kernels (fwd, bwd) read el_ndim <= 2 with the innermost dim of stride 1 in every operand:
 *   offset(e) = (e / I) * el_stride[k][0] + e % I, parameter = base + (e / I) * el_pstride[0] + (e % I) *
 *   el_pstride[1] (I = el_size[el_ndim - 1]; with el_ndim == 1, I = len and el_pstride[0] is the inner one).
 * The gen kernels read any el_ndim (up to 8 dims, any strides). */
#ifndef PYDNN_NORMALIZATION_PARAMS_H
#define PYDNN_NORMALIZATION_PARAMS_H

#ifndef PYDNN_MAX_DIMS
#define PYDNN_MAX_DIMS 8
#endif

/* flags beyond PYDNN_FLAG_BETA (1) */
#define PYDNN_NORM_FLAG_STATS 4u       /* forward: write mean (unless NULL) and invstd */
#define PYDNN_NORM_FLAG_RMS 8u         /* no mean: x * inverse rms */
#define PYDNN_NORM_FLAG_BETA2 16u      /* finish: beta2 != 0, read dscale / dbias and blend */
#define PYDNN_NORM_FLAG_PREG 32u       /* backward: parameter partials per thread (set-independent, one-to-one) */
#define PYDNN_NORM_FLAG_PLANE 64u      /* backward: a thread's items share parameters (sum them, then lanes) */
#define PYDNN_NORM_FLAG_STREAM 128u    /* fwd_rows / fwd_persist / bwd_ring / gn_fwd: y / dx stored evict-first */
#define PYDNN_NORM_FLAG_WARPSTAT 256u  /* bwd_ring: a row's mean / invstd copied once per warp */
#define PYDNN_NORM_FLAG_WS16 512u      /* bwd_rowx (no cluster): the dscale / dbias slot written in 16-byte stores */

/* act: the fused activation on the normalized, scaled and shifted value z (0: none) */
#define PYDNN_NORM_ACT_NONE 0
#define PYDNN_NORM_ACT_RELU 1
#define PYDNN_NORM_ACT_SIGMOID 2
#define PYDNN_NORM_ACT_TANH 3
#define PYDNN_NORM_ACT_CLIPPED_RELU 4
#define PYDNN_NORM_ACT_ELU 5
#define PYDNN_NORM_ACT_SWISH 6
#define PYDNN_NORM_ACT_GELU_ERF 7
#define PYDNN_NORM_ACT_GELU_TANH 8

typedef struct {
  void *out;              /* y (forward) or dx (backward) */
  const void *x;
  const void *dy;         /* backward, else NULL */
  const float *scale;
  const float *bias;      /* NULL: no bias */
  float *mean;            /* forward: output (NULL: not written); backward: input (NULL with RMS) */
  float *invstd;          /* forward: output (NULL: not written); backward: input */
  float *ws;              /* backward: parameter partials [slots][2][nparams]; gen: [1][2][nparams] */
  float *dscale;          /* finish: outputs */
  float *dbias;           /* finish: NULL when there is no bias gradient */
  double alpha, beta;     /* y or dx blending */
  double alpha2, beta2;   /* dscale / dbias blending (finish) */
  double eps;
  double coef, coef2;     /* activation: clipped-ReLU ceiling or ELU alpha; swish beta */
  long long sets;         /* normalization sets */
  long long len;          /* elements per set */
  long long nparams;      /* elements of scale / bias */
  long long slots;        /* finish: partial slots in ws */
  int act;                /* PYDNN_NORM_ACT_* */
  unsigned flags;         /* PYDNN_FLAG_BETA, PYDNN_NORM_FLAG_* */
  int group;              /* fwd / bwd: threads per set (cluster kernels: the whole cluster) */
  int set_ndim, el_ndim;
  int pf;                 /* fwd_rows / gn_reg: L2 prefetch distance in blocks (block b pulls into L2 the x
                             that block b + pf will read; 0: none) */
  long long set_size[PYDNN_MAX_DIMS];
  long long set_stride[4][PYDNN_MAX_DIMS];  /* x, out, dy, stats */
  long long set_pstride[PYDNN_MAX_DIMS];
  long long el_size[PYDNN_MAX_DIMS];
  long long el_stride[3][PYDNN_MAX_DIMS];   /* x, out, dy */
  long long el_pstride[PYDNN_MAX_DIMS];
} NormParams;

#endif
