/* Batch normalization kernel parameters (ptx/batchnorm.cu, pydnn/ops/batchnorm.py mirrors this struct).
 *
 * A problem is `rows` reduction elements (N for PER_ACTIVATION; N x spatial for SPATIAL) times `feats`
 * features (C x spatial for PER_ACTIVATION; C for SPATIAL). Operands are numbered (PYDNN_BN_OP_*): x, y,
 * z (forward), dy, dx, dz (backward). Two geometries:
 *   row kernels: every operand is a matrix, feature f of row r at r * ld[op] + f (features contiguous:
 *                NHWC SPATIAL, NCHW PER_ACTIVATION);
 *   gen kernels: feature f (row-major over fsize, natural dim order) at sum(coord * fstride[op]); the
 *                reduction element i (mixed radix over rsize, outermost first) at sum(coord * rstride[op]).
 * Parameter tensors (scale, bias, mean, var, saved and result statistics) are packed: feature f at f, in
 * float for float / half / bfloat16 data and double for double data. */
#ifndef PYDNN_BATCHNORM_PARAMS_H
#define PYDNN_BATCHNORM_PARAMS_H

#define PYDNN_BN_OPS 6
#define PYDNN_BN_OP_X 0
#define PYDNN_BN_OP_Y 1
#define PYDNN_BN_OP_Z 2
#define PYDNN_BN_OP_DY 3
#define PYDNN_BN_OP_DX 4
#define PYDNN_BN_OP_DZ 5
#define PYDNN_BN_MAX_FDIMS 4
#define PYDNN_BN_MAX_RDIMS 8

/* flags */
#define PYDNN_BN_FLAG_BETA 1u      /* beta (or betaDataDiff) != 0: read y / dx (and dz) and blend */
#define PYDNN_BN_FLAG_RELU 4u      /* forward: ReLU after the (residual) add; backward: mask dy */
#define PYDNN_BN_FLAG_Z 8u         /* forward: add z before the activation */
#define PYDNN_BN_FLAG_MASK 16u     /* forward: write the ReLU mask; backward: read it */
#define PYDNN_BN_FLAG_SAVED 32u    /* backward: saved mean / inverse std given (else recomputed) */
#define PYDNN_BN_FLAG_RUNNING 64u  /* forward: update running mean / variance */
#define PYDNN_BN_FLAG_SAVE 128u    /* forward: write saved mean / inverse std */
#define PYDNN_BN_FLAG_PBETA 256u   /* backward: betaParamDiff != 0, read dscale / dbias and blend */
#define PYDNN_BN_FLAG_DZ 512u      /* backward: write dz (BN_ADD_ACTIVATION) */
#define PYDNN_BN_FLAG_IDX32 1024u  /* gen kernels: rows * feats < 2^32 (32-bit index arithmetic) */

typedef struct {
  const void *x;
  void *y;
  const void *z;
  const void *dy;
  void *dx;
  void *dz;
  unsigned char *mask;       /* reserve space: one byte per element of x's span, at x's element offsets */
  const void *scale, *bias;
  void *mean, *var;          /* inference: estimated statistics; training: running ones (updated) */
  void *save_mean, *save_invvar;
  void *dscale, *dbias;
  void *partial;             /* row kernels: statistics of each (row chunk, feature) */
  void *consts;              /* row kernels: 4 accumulator values per feature for the apply pass */
  double alpha, beta, alpha_p, beta_p, eps, factor;
  long long rows, feats;
  long long chunk_rows;      /* rows per block (stats: per partial; apply: per block) */
  long long chunks;          /* partials per feature (stats / final) */
  long long row_begin, row_end;  /* apply: the rows this launch writes */
  unsigned flags;
  int nfd, nrd;
  int sr_k;                  /* super-row kernels (<..., true>): rows per super-row (see ptx/batchnorm.cu) */
  long long ld[PYDNN_BN_OPS];
  long long fsize[PYDNN_BN_MAX_FDIMS];
  long long fstride[PYDNN_BN_OPS][PYDNN_BN_MAX_FDIMS];
  long long rsize[PYDNN_BN_MAX_RDIMS];
  long long rstride[PYDNN_BN_OPS][PYDNN_BN_MAX_RDIMS];
  /* nc kernels (packed NCHW SPATIAL, feats = C): nc_n samples of nc_hw elements per channel plane; a stats
   * item (partial) covers nc_g planes x nc_l elements of one channel (nc_k items per plane row); chunks =
   * items per channel; row_begin / row_end: the apply's element range, chunk_rows its vectors per block */
  long long nc_n, nc_hw, nc_g, nc_k, nc_l;
} BnParams;

#endif
