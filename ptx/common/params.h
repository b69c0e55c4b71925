/* Kernel parameter structs. Every pydnn kernel takes one of these by value as its only argument.
 * Plain C so that a host compiler can check the layout against the Python mirror (pydnn/_build/params.py,
 * test_params_layout.py). Scalars (alpha, beta, op coefficients) travel as double and are narrowed once
 * in the kernel. Strides and offsets are in elements. */
#ifndef PYDNN_PARAMS_H
#define PYDNN_PARAMS_H

#define PYDNN_MAX_DIMS 8
#define PYDNN_MAP_INPUTS 3

/* flags bits */
#define PYDNN_FLAG_BETA 1u        /* beta != 0: read the output and blend */
#define PYDNN_FLAG_NAN_PROP 2u    /* propagate NaN (ReLU family, min/max) */

/* An element-wise map over a collapsed N-d iteration space: out = op(in0, in1, in2) (+ beta * out). */
typedef struct {
  void *out;
  const void *in[PYDNN_MAP_INPUTS];
  double alpha, alpha2, beta;   /* alpha2: the second input's scale (OpTensor) */
  double coef, coef2;           /* op parameters: clipped-ReLU ceiling, ELU alpha, swish beta, set value */
  long long n;                  /* elements in the iteration space */
  int ndim;                     /* dims after collapsing, 1..PYDNN_MAX_DIMS */
  unsigned flags;
  long long size[PYDNN_MAX_DIMS];                         /* outermost first */
  long long stride[PYDNN_MAP_INPUTS + 1][PYDNN_MAX_DIMS]; /* [0] = out, [1 + k] = in[k] */
} MapParams;

#endif
