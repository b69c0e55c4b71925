/* RNN kernel parameters (plain C; mirrored in pydnn/ops/rnn/kernels.py, layout checked on the CPU).
 *
 * One struct for every kernel of ptx/rnn.cu; each kernel reads the fields its comment in rnn.cu names.
 * Rows are batch entries b < batch; "dtype" buffers hold the RNN's data type, "state" ones its state type S:
 * float for float / half / bfloat16, double for double (ptx/rnn.cu's Acc<T>). Leading dims are in elements.
 * Sequence b is active at time t iff t < lens[b] (device copy of the lengths). */
#ifndef PYDNN_RNN_PARAMS_H
#define PYDNN_RNN_PARAMS_H

#define PYDNN_RNN_MODE_ADD 1   /* skip_dx / bias_final: add to the output instead of writing it */
#define PYDNN_RNN_MAXY 8       /* the most rows of blocks (gridDim.y) of the RnnDir2 kernels: RnnParams.dir2 */

/* Other problems of the same kind in the same launch (fwd_cell, bwd_cell, proj_commit, bwd_proj_pre with
 * gridDim.y = n <= PYDNN_RNN_MAXY): the reverse direction of a bidirectional layer (gridDim.y = 2), or the layers
 * of one wave of the layer wavefront (pydnn/ops/rnn/engine.py's _fwd_wavefront / _bwd_wavefront). Blocks with
 * blockIdx.y = y >= 1 add dir2[y - 1]'s byte offsets to the pointers (NULL ones stay NULL) and use its time t
 * (dm, aux, aux_in: the projection's kernels and bwd_cell's dm, for the wavefront of LSTM projection stacks). */
typedef struct {
  long long xp, hp, bw, br, h_prev, h_out, s_prev, s_out, y, act, dy, dxa, dha, gh, ghrec, gc, dm, aux, aux_in;
  int t, pad;
} RnnDir2;

typedef struct {
  const void *xp;      /* input projection of time t: row b at xp + b * ld_xp, gate g at + g * gs_xp (dtype) */
  const void *hp;      /* recurrent projection [batch, G * hidden] (dtype) */
  const void *bw;      /* input biases [G * hidden] or NULL (dtype) */
  const void *br;      /* recurrent biases [G * hidden] or NULL (dtype) */
  const void *h_prev;  /* h before the step [batch, out] (dtype) */
  void *h_out;         /* h after the step [batch, out], or m [batch, hidden] with a projection (dtype) */
  const void *s_prev;  /* state (S) before the step [batch, hidden]: c (LSTM), h (GRU) */
  void *s_out;         /* state (S) after the step */
  void *y;             /* layer output of time t, row b at y + b * ld_y (dtype); NULL: not written */
  void *act;           /* saved gate values (S) [batch, GA * hidden] of time t (training), or NULL */
  const int *lens;     /* sequence lengths [batch] */
  const void *dy;      /* backward: gradient of the layer output of time t (row pitch ld_y), or NULL */
  void *dxa;           /* backward: input pre-activation gradients of time t [batch, G * hidden] */
  void *dha;           /* backward: recurrent pre-activation gradients (GRU; else NULL) */
  void *gh;            /* backward: gradient of h (S) carried between steps [batch, out] */
  const void *ghrec;   /* backward: the recurrent GEMM's share of it [batch, out] (dtype) */
  void *gc;            /* backward: gradient of c (S) [batch, hidden] */
  const void *dm;      /* backward with a projection: gradient of m [batch, hidden] (dtype) */
  void *aux;           /* per kernel (see rnn.cu) */
  const void *aux_in;  /* per kernel (see rnn.cu) */
  long long ld_xp, gs_xp, ld_y, rows, ld_aux;
  long long split_stride; /* elements between the split-K partial sums of hp (forward) / ghrec (backward) */
  double lclip, rclip, fill;  /* double: exact for double data, rounded by the float path as before */
  int clip;            /* LSTM cell clipping on */
  int t, batch, hidden, out, seq, vec, layout, cols, mode;
  int nsplit;          /* split-K partial sums in hp / ghrec to add (0 or 1: one) */
  int fmt;             /* 16-bit data (T = pydnn::h16_t): 0 half, 1 bfloat16 (common/h16.cuh); unused otherwise */
  RnnDir2 dir2[PYDNN_RNN_MAXY - 1];
} RnnParams;

#endif
