/* fwd_tma's parameters (ptx/conv_tma.cu; mirrored in pydnn/ops/convolution/conv_tma.py, layout checked on the
 * CPU): the two 128-byte TMA tensor maps (64-byte aligned) of x (4-d: C, W, H, N) and of the filter (3-d: C,
 * R * S taps, K), then the family's ConvParams and the output tile's shape: a block tile's 128 GEMM rows are
 * a box of tn images x th rows x tw columns of y (tn * th * tw = 128), the grid of such boxes tiles_w x
 * tiles_h x tiles_n, times tiles_k tiles of 128 output channels. */
#ifndef PYDNN_CONV_TMA_PARAMS_H
#define PYDNN_CONV_TMA_PARAMS_H

#include "convolution_params.h"

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#define PYDNN_CONV_ALIGN64 __align__(64)
#else
#define PYDNN_CONV_ALIGN64 __attribute__((aligned(64)))
#endif
typedef struct PYDNN_CONV_ALIGN64 {
  unsigned long long opaque[16];
} ConvTensorMap;

typedef struct {
  ConvTensorMap map_x, map_w;
  ConvParams p;
  int tw, th, tn;                   /* the box of output pixels a tile's rows are (w fastest) */
  int tiles_w, tiles_h, tiles_n;    /* boxes along W, H, N */
  int tiles_k;                      /* tiles of BN output channels */
  int cblocks;                      /* channel blocks of 64 a tap */
  int wide;                         /* the plain epilogue stores 16 bytes a lane (y's channels contiguous, rows
                                       16-byte aligned, K % 8 == 0; set per call) */
  int pad_tail[5];                  /* the size a multiple of 64 bytes, as the C compiler lays it out */
} ConvTmaParams;

#endif
