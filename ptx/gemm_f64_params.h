/* Double-precision GEMM parameters (plain C; mirrored in pydnn/ops/rnn/gemm_f64.py, layout checked on the CPU).
 *
 * The formula and conventions of ptx/matmul_params.h (row-major, leading dimensions and strides in elements),
 * in double throughout. For each batch index z < batch:
 *   C_z[i, j] = alpha * sum_k opA_z[i, k] * opB_z[k, j] + beta * C_z[i, j] (+ bias[j])
 *   opA_z[i, k] = a[z*stride_a + i*lda + k]   (a[z*stride_a + k*lda + i] when A is transposed)
 *   opB_z[k, j] = b[z*stride_b + k*ldb + j]   (b[z*stride_b + j*ldb + k] when B is transposed)
 *   C_z[i, j]   = c[z*stride_c + i*ldc + j]
 * Whether A / B are transposed is a template argument of the kernel, not a field. */
#ifndef PYDNN_GEMM_F64_PARAMS_H
#define PYDNN_GEMM_F64_PARAMS_H

#define PYDNN_GEMM_F64_FLAG_BETA 1u  /* beta != 0: read C (never read otherwise); PYDNN_MATMUL_FLAG_BETA's value */
#define PYDNN_GEMM_F64_FLAG_BIAS 2u  /* add bias[j]; PYDNN_MATMUL_FLAG_BIAS's value */

typedef struct {
  const double *a, *b;
  double *c;
  const double *bias;   /* length-n vector, or NULL */
  long long lda, ldb, ldc;
  long long stride_a, stride_b, stride_c;
  double alpha, beta;
  int m, n, k;
  int batch;
  unsigned flags;       /* PYDNN_GEMM_F64_FLAG_* */
  int pad;
} GemmF64Params;

#endif
