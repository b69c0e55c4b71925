/* Matmul (GEMM) kernel parameters (plain C; mirrored in pydnn/ops/matmul.py, layout checked on the CPU).
 *
 * Row-major, strides and leading dimensions in elements. For each batch index z < batch:
 *   C_z[i, j] = alpha * sum_k opA_z[i, k] * opB_z[k, j] + beta * C_z[i, j] (+ bias[j])
 *   opA_z[i, k] = a[z*stride_a + i*lda + k]   (a[z*stride_a + k*lda + i] when A is transposed)
 *   opB_z[k, j] = b[z*stride_b + k*ldb + j]   (b[z*stride_b + j*ldb + k] when B is transposed)
 *   C_z[i, j]   = c[z*stride_c + i*ldc + j]
 * Whether A / B are transposed is a template argument of the kernel, not a field. */
#ifndef PYDNN_MATMUL_PARAMS_H
#define PYDNN_MATMUL_PARAMS_H

/* flags */
#define PYDNN_MATMUL_FLAG_BETA 1u  /* beta != 0: read C (never read otherwise) */
#define PYDNN_MATMUL_FLAG_BIAS 2u  /* add bias[j] */
#define PYDNN_MATMUL_FLAG_PAIR 4u  /* C (every batch) is 2-element aligned: store column pairs at once */
#define PYDNN_MATMUL_FLAG_C16 8u   /* C's rows (every batch) start 16-byte aligned (gemm_tma's WIDE stores) */

typedef struct {
  const void *a, *b;
  void *c;
  const void *bias;     /* length-n vector of the data type, or NULL */
  long long lda, ldb, ldc;
  long long stride_a, stride_b, stride_c;
  float alpha, beta;
  int m, n, k;
  int batch;
  int tiles_m, tiles_n; /* block tiles along m and n */
  int group_m;          /* tile raster: groups of group_m tile rows walked column by column (L2 reuse) */
  unsigned flags;       /* PYDNN_MATMUL_FLAG_* */
  int k_split;          /* split-K (gemm_wgmma_s): K elements per split, the splits along batch (z < batch:
                           K range [z*k_split, min((z+1)*k_split, k))); their fp32 partials go to c (float,
                           row pitch ldc, stride_c apart) and splitk_reduce sums them in order. 0: none */
} MatmulParams;

/* gemm_tma's parameters (sm_90a): the TMA tensor maps of A and B (CUtensorMap: 128 opaque bytes, 64-byte
 * aligned, encoded on the host by pydnn/_cuda/tensormap.py for the call's pointers) ahead of the plain
 * params. The kernel takes the struct as a `const __grid_constant__` parameter, so the copies read the maps
 * from parameter space. Every map is 3-D: (contiguous dim, the other dim, batch). */
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#define PYDNN_MATMUL_ALIGN64 __align__(64)
#else
#define PYDNN_MATMUL_ALIGN64 __attribute__((aligned(64)))
#endif
typedef struct PYDNN_MATMUL_ALIGN64 {
  unsigned long long opaque[16];
} MatmulTensorMap;

typedef struct {
  MatmulTensorMap map_a, map_b;
  MatmulParams p;
} MatmulTmaParams;

#endif
