/* Parameters of the wgmma backward filter (ptx/conv_wgrad_wgmma.cu; mirrored in
 * pydnn/ops/convolution_wgrad_wgmma.py, layout checked on the CPU).
 *
 * A launch computes the GEMM's BM x BN tiles, numbered M tile fastest (tile t is M tile t % m_tiles, N tile
 * t / m_tiles), in two kinds of blocks (grid: direct + tiles * splits blocks along x):
 *   - block b < direct: tile b over the whole reduction, dw written (alpha / beta) by the block itself;
 *   - block b = direct + x + tiles * z: tile tile_first + x over slice z of the positions (c.k_per_split
 *     each), its raw fp32 partials at part[z][x][BM][BN], which wgrad_fold adds in split order
 *     (deterministic).
 * A plan runs whole waves of SMs as direct tiles and splits only the rest, in one launch. */
#ifndef PYDNN_CONV_WGRAD_WGMMA_PARAMS_H
#define PYDNN_CONV_WGRAD_WGMMA_PARAMS_H

#include "convolution_params.h"

typedef struct {
  ConvParams c;         /* the backward filter's GEMM (x = dy, w = x, out = dw; k_per_split, red_size /
                           red_step, flags FLIP / BETA) */
  void *part;           /* the split blocks' partials (the workspace) */
  int direct;           /* blocks (and tiles) computed whole */
  int tile_first;       /* the split blocks' first tile */
  int tiles;            /* tiles computed in slices */
  int m_tiles;          /* ceil(gm / BM) */
} WgradWgmmaParams;

typedef struct {
  void *out;            /* dw */
  const void *in;       /* the partials [split][tile][BM][BN] */
  double alpha, beta;
  int gm, gn, cg;       /* GEMM M (= K), N (= taps * C), C */
  int filt[3];          /* T, R, S */
  int splits, tile_first, tiles, m_tiles, bm, bn;
  unsigned flags;       /* PYDNN_FLAG_BETA, PYDNN_CONV_FLAG_FLIP */
  int pad_;
  long long ws[5];      /* dw strides (k, c, t, r, s) */
} WgradFoldParams;

#endif
