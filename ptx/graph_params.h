/* Parameters of the graph API's generated pointwise kernels (plain C; mirrored in pydnn/graph/codegen.py,
 * layout checked on the CPU).
 *
 * The kernel walks the `total` elements of the output shape `dims` (ndim dims, outermost first, already
 * collapsed where every operand allows); operand k (an input or an output of the fused graph) is at
 * ptr[k] + sum_d coord[d] * stride[k][d] elements (stride 0: broadcast along d). A fused matmul epilogue uses
 * dims 0..2 as (batch, row, column) and two further ptr slots for a reduction's workspace and counters. */
#ifndef PYDNN_GRAPH_PARAMS_H
#define PYDNN_GRAPH_PARAMS_H

#define PYDNN_GRAPH_MAX_OPERANDS 16
#define PYDNN_GRAPH_MAX_DIMS 8

typedef struct {
  void *ptr[PYDNN_GRAPH_MAX_OPERANDS];
  long long stride[PYDNN_GRAPH_MAX_OPERANDS][PYDNN_GRAPH_MAX_DIMS];
  long long dims[PYDNN_GRAPH_MAX_DIMS];
  long long total;
  int ndim;
  unsigned flags; /* pointwise: bit 0 = vector runs; fused matmul epilogue: bit k = operand k in aligned pairs */
  unsigned magic[PYDNN_GRAPH_MAX_DIMS]; /* 32-bit index math: i / dims[d] = (t + ((i - t) >> 1)) >> shift[d], */
  int shift[PYDNN_GRAPH_MAX_DIMS];      /* t = umulhi(i, magic[d]) (shift 0: dims[d] is 1, the quotient is i) */
} GraphPwParams;

#endif
