/* Softmax kernel parameters (plain C; mirrored in pydnn/ops/softmax.py, layout checked on the CPU).
 * A softmax problem is `rows` independent rows of `len` elements. A row's first element sits at the
 * offset its row coordinates give (row dims, outermost first); element e of a row at the offset its
 * reduce coordinates give (reduce dims). Strides are in elements, per operand: [0] out, [1] in0, [2] in1. */
#ifndef PYDNN_SOFTMAX_PARAMS_H
#define PYDNN_SOFTMAX_PARAMS_H

#ifndef PYDNN_MAX_DIMS
#define PYDNN_MAX_DIMS 8
#endif

typedef struct {
  void *out;            /* y (forward) or dx (backward) */
  const void *in0;      /* x (forward) or y (backward) */
  const void *in1;      /* dy (backward) */
  double alpha, beta;
  long long rows, len;
  int algo;             /* 0 fast, 1 accurate, 2 log */
  int group;            /* threads cooperating on one row (power of two) */
  unsigned flags;       /* PYDNN_FLAG_BETA */
  int row_ndim, red_ndim;
  int pad_;
  long long row_size[PYDNN_MAX_DIMS];
  long long red_size[PYDNN_MAX_DIMS];
  long long row_stride[3][PYDNN_MAX_DIMS];
  long long red_stride[3][PYDNN_MAX_DIMS];
} SoftmaxParams;

#endif
