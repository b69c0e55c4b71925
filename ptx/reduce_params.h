/* ReduceTensor kernel parameters (plain C; mirrored in pydnn/ops/reduce.py, layout checked on the CPU).
 *
 * The problem: `rows` outputs (C's elements), each the reduction of `len` elements of A.
 *   Row (kept) dims, outermost first: output r sits at row_offset(r) in C ([0]), A ([1]) and the indices
 *   ([2], packed in C's dims). The cols kernel splits a row index into (outer, k): `cols` = K is the
 *   innermost kept dim (its strides in col_stride[C, A, I]) and the row dims describe `outer` alone.
 *   Reduce dims, outermost first (A's dim order when indices are wanted, so that a unit's linear number
 *   is its flat index; memory order otherwise). A kernel walks "units" of them: elements, or for the
 *   vector kernels 16-byte vectors (then red_size/red_stride describe the vector grid).
 * Each row's units are cut into `segments` chunks of `chunk` units; with several segments the main
 * kernel writes one partial per (row, segment) to the workspace (double values, then int32 indices) and
 * reduce_finish folds them in segment order. Nothing uses atomics: every run gives the same bits. */
#ifndef PYDNN_REDUCE_PARAMS_H
#define PYDNN_REDUCE_PARAMS_H

#ifndef PYDNN_MAX_DIMS
#define PYDNN_MAX_DIMS 8
#endif

/* flags beyond PYDNN_FLAG_BETA (1) and PYDNN_FLAG_NAN_PROP (2) */
#define PYDNN_REDUCE_FLAG_SMALL_ROWS 4u  /* the row dims' product fits in 32 bits: 32-bit index math */
#define PYDNN_REDUCE_FLAG_IN_BF16 8u     /* a pydnn::h16_t kernel's input is bfloat16 (else half): common/h16.cuh */

/* out_type: the element type of C */
#define PYDNN_REDUCE_OUT_F32 0
#define PYDNN_REDUCE_OUT_F64 1
#define PYDNN_REDUCE_OUT_F16 2
#define PYDNN_REDUCE_OUT_BF16 3

typedef struct {
  void *out;               /* C */
  const void *in;          /* A */
  void *indices;           /* int32 per output, or NULL */
  void *workspace;         /* rows * segments partials (segments > 1) */
  double alpha, beta;
  long long rows;          /* outputs */
  long long len;           /* elements reduced into each output (AVG divides by it) */
  long long units;         /* units the main kernel walks per output */
  long long chunk;         /* units per segment */
  long long cols;          /* cols kernel: K; 0 for the row kernels */
  long long tiles;         /* cols kernel: column tiles per outer row */
  long long step_off;      /* offset (elements of A) of one walker step */
  long long wrap_off;      /* two reduce dims: extra offset when the inner coordinate wraps */
  long long col_stride[3]; /* cols kernel: strides of the K dim in C, A, indices */
  int op;                  /* pydnnReduceTensorOp_t */
  int segments;
  int group;               /* row kernels: threads per (row, segment), a power of two */
  int fgroup;              /* reduce_finish: threads per row, a power of two */
  int pack;                /* cols kernel: reduce positions packed side by side in a warp (K small) */
  int out_type;            /* PYDNN_REDUCE_OUT_* */
  unsigned flags;          /* PYDNN_FLAG_BETA, PYDNN_FLAG_NAN_PROP, PYDNN_REDUCE_FLAG_SMALL_ROWS */
  int row_ndim, red_ndim;
  int pad_;
  long long row_size[PYDNN_MAX_DIMS];
  long long row_stride[3][PYDNN_MAX_DIMS]; /* [0] C, [1] A, [2] indices */
  long long red_size[PYDNN_MAX_DIMS];
  long long red_stride[PYDNN_MAX_DIMS];    /* A, in elements */
  long long red_step[PYDNN_MAX_DIMS];      /* one walker step written in the reduce dims' radix */
} ReduceParams;

#endif
