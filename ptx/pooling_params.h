/* Pooling kernel parameters (plain C; mirrored in pydnn/ops/pooling.py, layout checked on the CPU).
 *
 * Every problem is seen as 5 logical dims (n, c, d, h, w): a 2-d pooling has d = 1 (stride 0), a 1-d one
 * h = 1 too. A kernel thread owns one work item: VEC consecutive channels of one element of the tensor it
 * writes (forward: y; backward: dx). Item i has coordinate k = (i / div[k]) % size[k] (size[1] counts
 * channel groups of VEC), so the host picks which dim runs fastest across threads (the written tensor's
 * innermost) by choosing div.
 *
 * Windows, per spatial dim k (0 d, 1 h, 2 w), for pooled coordinate o:
 *   pooling   [o * stride - pad, o * stride - pad + win) clipped to [0, in)
 *   adaptive  [floor(o * in / out), ceil((o + 1) * in / out))   (PYDNN_POOL_FLAG_ADAPTIVE; win/pad/stride unused)
 * Strides are in elements: os the written tensor, xs x, ps dy and ys y (backward).
 * Spatial sizes, windows, paddings and strides fit 32-bit arithmetic (the host refuses others): the
 * kernels compute windows in int; adaptive windows need in * out < 2^31 too. */
#ifndef PYDNN_POOLING_PARAMS_H
#define PYDNN_POOLING_PARAMS_H

#define PYDNN_POOL_DIMS 5
#define PYDNN_POOL_SPATIAL 3

/* mode */
#define PYDNN_POOL_MODE_MAX 0          /* MAX and MAX_DETERMINISTIC: one (deterministic) path */
#define PYDNN_POOL_MODE_AVG_INCLUDE 1  /* divide by the full window (padding counts) */
#define PYDNN_POOL_MODE_AVG_EXCLUDE 2  /* divide by the in-bounds elements (adaptive average too) */

/* flags beyond PYDNN_FLAG_BETA (1) and PYDNN_FLAG_NAN_PROP (2) */
#define PYDNN_POOL_FLAG_ADAPTIVE 4u    /* adaptive windows (see above) */
#define PYDNN_POOL_FLAG_IDX32 8u       /* total < 2^32: item coordinates in 32-bit arithmetic */
#define PYDNN_POOL_FLAG_FAST3 16u      /* fwd_rows: full 3 x 3 windows take straight-line loads */
#define PYDNN_POOL_FLAG_COLS 32u       /* fwd_rows, averages: 3 x 3 / 2 strips share column sums */

typedef struct {
  void *out;            /* y (forward) or dx (backward) */
  const void *x;        /* x */
  const void *dy;       /* dy (backward), else NULL */
  const void *y;        /* y (max pooling backward: the forward's output, compared with x), else NULL */
  double alpha, beta;
  long long total;      /* work items */
  int mode;             /* PYDNN_POOL_MODE_* */
  unsigned flags;
  long long size[PYDNN_POOL_DIMS];  /* the written tensor's dims in items: n, c / VEC, d, h, w */
  long long div[PYDNN_POOL_DIMS];   /* item -> coordinate divisors */
  long long os[PYDNN_POOL_DIMS];    /* strides of the written tensor (y or dx) */
  long long xs[PYDNN_POOL_DIMS];    /* strides of x */
  long long ps[PYDNN_POOL_DIMS];    /* strides of dy (backward); unused forward */
  long long ys[PYDNN_POOL_DIMS];    /* strides of y (max pooling backward); else unused */
  long long in_dim[PYDNN_POOL_SPATIAL];   /* x's spatial dims */
  long long out_dim[PYDNN_POOL_SPATIAL];  /* y's (the pooled) spatial dims */
  long long win[PYDNN_POOL_SPATIAL];
  long long pad[PYDNN_POOL_SPATIAL];
  long long stride[PYDNN_POOL_SPATIAL];
} PoolParams;

#endif
