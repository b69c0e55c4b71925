/* ReduceTensor kernel parameters (plain C; mirrored in pydnn/ops/reduce.py, layout checked on the CPU).
 * `rows` outputs (C's kept positions), each reducing `len` elements of A. Reduce dims stay in A's dim
 * order, so an element's loop index is its flattened index within the reduced sub-tensor (the index
 * cuDNN returns). A row is cut into `segments` chunks of `chunk` elements; with more than one segment the
 * first kernel writes per-segment partials to the workspace and a second combines them in order. */
#ifndef PYDNN_REDUCE_PARAMS_H
#define PYDNN_REDUCE_PARAMS_H

#ifndef PYDNN_MAX_DIMS
#define PYDNN_MAX_DIMS 8
#endif

typedef struct {
  void *out;               /* C */
  const void *in;          /* A */
  void *indices;           /* int32 per output, or NULL */
  void *workspace;         /* segments * rows partials: double values, then int32 indices */
  double alpha, beta;
  long long rows, len, chunk;
  int op, group, segments;
  unsigned flags;          /* PYDNN_FLAG_BETA, PYDNN_FLAG_NAN_PROP */
  int row_ndim, red_ndim;
  long long row_size[PYDNN_MAX_DIMS];
  long long red_size[PYDNN_MAX_DIMS];
  long long row_stride[3][PYDNN_MAX_DIMS]; /* [0] C, [1] A, [2] indices (packed row-major in C's dims) */
  long long red_stride[PYDNN_MAX_DIMS];    /* A */
} ReduceParams;

#endif
