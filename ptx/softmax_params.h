/* Softmax kernel parameters (plain C; mirrored in pydnn/ops/softmax.py, layout checked on the CPU).
 *
 * A softmax problem is `rows` independent rows of `len` elements. Operands: [0] out (y or dx), [1] in0
 * (x or y), [2] in1 (dy). Strides are in elements, per operand.
 *   Row dims (outermost first, row_size / row_stride): where row r starts in each operand.
 *   Reduce dims (outermost first, red_size / red_stride): where element e of a row sits.
 * The kernels (ptx/softmax.cu) read these as follows:
 *   row, row_loop : the reduce dims are one dim of stride 1 in every operand (the row is contiguous).
 *   col           : one reduce dim of size len (the channel, stride red_stride[k][0]); the row dims are
 *                   the outer dims plus an innermost dim of `cols` contiguous elements (stride 1 in every
 *                   operand) that is NOT among row_size: rows counts the outer positions only; `tiles`
 *                   blocks cover one outer position.
 *   gen           : anything; red_step holds the group size in the reduce dims' mixed radix. */
#ifndef PYDNN_SOFTMAX_PARAMS_H
#define PYDNN_SOFTMAX_PARAMS_H

#ifndef PYDNN_MAX_DIMS
#define PYDNN_MAX_DIMS 8
#endif

/* flags beyond PYDNN_FLAG_BETA (1) */
#define PYDNN_SOFTMAX_FLAG_ROWS32 4u  /* rows < 2^32 and every row size < 2^32: 32-bit row index math */

/* kind: what the kernel computes (a template argument of row/col, a runtime value of row_loop/gen).
 * Forward: 0 softmax with the fast exp, 1 softmax with the accurate exp, 2 log-softmax.
 * Backward: 1 softmax (ACCURATE and FAST), 2 log-softmax. 16-bit data always uses the fast exp, double
 * always the accurate one. */
#define PYDNN_SOFTMAX_KIND_FAST 0
#define PYDNN_SOFTMAX_KIND_ACCURATE 1
#define PYDNN_SOFTMAX_KIND_LOG 2

typedef struct {
  void *out;            /* y (forward) or dx (backward) */
  const void *in0;      /* x (forward) or y (backward) */
  const void *in1;      /* dy (backward), else NULL */
  double alpha, beta;
  long long rows;       /* rows (col: outer positions) */
  long long len;        /* elements per row (col: channels) */
  long long cols;       /* col: elements of the contiguous inner dim; else 0 */
  long long tiles;      /* col: blocks per outer position; else 0 */
  int group;            /* row, row_loop, gen: threads per row, a power of two */
  int kind;             /* PYDNN_SOFTMAX_KIND_* */
  unsigned flags;       /* PYDNN_FLAG_BETA, PYDNN_SOFTMAX_FLAG_ROWS32 */
  int row_ndim, red_ndim;
  int pad_;
  long long row_size[PYDNN_MAX_DIMS];
  long long row_stride[3][PYDNN_MAX_DIMS];
  long long red_size[PYDNN_MAX_DIMS];
  long long red_stride[3][PYDNN_MAX_DIMS];
  long long red_step[PYDNN_MAX_DIMS];
} SoftmaxParams;

#endif
