/* Strided backward data as stride-1 phase sub-problems (pydnn/ops/convolution/dgrad_phases.py): the
 * parameters of dgrad_phase_fill, the one kernel of its own (the phases themselves run the family's
 * stride-1 backward-data kernels of ptx/convolution.cu). Plain C; mirrored in dgrad_phases.py, layout
 * checked on the CPU (tests/kernels/test_params_layout.py). */
#ifndef PYDNN_CONV_DGRAD_PARAMS_H
#define PYDNN_CONV_DGRAD_PARAMS_H

/* dgrad_phase_fill: dx = beta * dx (PYDNN_FLAG_BETA) or 0 at the positions no filter tap reaches: a
 * position (d, h, w) is such a position when bit (d % stride[0]) of empty[0], or (h % stride[1]) of
 * empty[1], or (w % stride[2]) of empty[2] is set (strides <= 64, host-checked). Grid (ceil(W * chunks /
 * 256), H, min(N * D, 65535)), 256 threads: a thread takes one chunk of one position (VEC: 8 channels,
 * 16 bytes; else one channel). */
typedef struct {
  void *out;                    /* dx */
  double beta;
  unsigned flags;               /* PYDNN_FLAG_BETA: scale by beta (else write zeros, dx not read) */
  int channels;                 /* C */
  int chunks;                   /* per position: C / 8 (VEC) or C */
  int batch;                    /* N */
  int size[3];                  /* D, H, W of dx */
  int stride[3];                /* the convolution's stride per spatial dim */
  unsigned long long empty[3];  /* per dim: the residues (mod stride) that no tap reaches */
  long long xs[5];              /* dx strides: n, c, d, h, w */
} DgradFillParams;

#endif
