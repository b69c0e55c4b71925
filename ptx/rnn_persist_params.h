/* PERSIST_STATIC RNN kernel parameters (plain C; mirrored in pydnn/ops/rnn/persist.py, layout checked on the
 * CPU). One persistent cooperative launch per layer runs every time step of one or two directions
 * (blockIdx.y: the entry of dir[]); blockIdx.x owns hidden units [blockIdx.x * units, + units).
 * Element offsets are in elements of the data type unless named f32. */
#ifndef PYDNN_RNN_PERSIST_PARAMS_H
#define PYDNN_RNN_PERSIST_PARAMS_H

typedef struct {
  const void *xp;      /* forward: input projection of time 0, row b of time t at xp + (t * batch + b) * ld_xp,
                          gate g at + g * gs_xp (dtype) */
  const void *w;       /* the recurrent matrices [G * hidden, hidden] row-major (dtype) */
  const void *bw;      /* forward: input biases [G * hidden] or NULL */
  const void *br;      /* forward: recurrent biases [G * hidden] or NULL */
  void *hs;            /* state slots [*, batch, hidden] (dtype): slot i at hs + i * batch * hidden; i % 2 with
                          pingpong (inference) */
  float *s32;          /* f32 state slots [*, batch, hidden] (LSTM c, GRU h; NULL for RNN cells) */
  void *y;             /* forward: layer output of time 0 (direction offset included), row b of time t at
                          y + t * ld_yt + b * ld_y */
  float *act;          /* saved gate values [T, batch, GA * hidden] (f32) or NULL (inference) */
  const void *dy;      /* backward: layer output gradient of time 0 (direction offset included), like y */
  void *dxa;           /* backward: input pre-activation gradients [T, batch, G * hidden] (dtype) */
  void *dha;           /* backward: recurrent ones (GRU), else NULL (the recurrence reads dxa) */
  float *gh;           /* backward: f32 carried dh [batch, hidden]: in from bwd_state_init, out the dhx share */
  float *gc;           /* backward: f32 carried dc [batch, hidden] (LSTM) */
  void *ghrec;         /* backward: written 0 [batch, hidden] (bwd_state_out adds it with nsplit 1) */
  unsigned *bar;       /* the grid barrier's counter (zeroed by persist_reset before the launch) */
  void *xchg;          /* forward: h exchanged between the blocks as tagged words [2][batch][hidden] (instead of
                          the barrier and hs), or NULL; see rnn_persist.cu. Zeroed by persist_reset. */
  int rev;             /* 1: the reverse direction (time runs T-1 .. 0 forward, 0 .. T-1 backward) */
  int pad;
} PersistDir;

typedef struct {
  PersistDir dir[2];
  const int *lens;     /* sequence lengths [batch] (device) */
  long long ld_xp, gs_xp, ld_y, ld_yt;
  float lclip, rclip;
  int clip;            /* LSTM cell clipping */
  int seq;             /* T, the steps */
  int batch, hidden;
  int units;           /* hidden units per block (a multiple of 8) */
  int pingpong;        /* state slots i % 2 (inference) instead of i (training: the reserve space's T + 1) */
  int xwords;          /* persist_reset: 32-bit words of each direction's xchg to zero */
  /* the block GEMM's shape and the dynamic shared memory layout, all chosen on the host (persist.py) */
  int kp;              /* K of one chunk (one chunk: K padded, 16-bit to a multiple of 16, float of 32; zero
                          filled past K); nchunk chunks cover K exactly when nchunk > 1 */
  int nchunk;          /* K chunks: the [batch, K] operand passes through 2 shared buffers a chunk at a time */
  int pitch;           /* elements between the rows of an A buffer (kp + 8 16-bit, kp + 4 float) */
  int wpitch;          /* elements between the rows of the weight slice (all of K resident) */
  int bp;              /* batch rows padded (16-bit: a multiple of 16; float: of 4), zero rows past batch */
  int ksplit;          /* K slices of the block GEMM (partial sums in part[ksplit][bp][n], added in order) */
  int off_w, off_a, off_part, off_x, off_b, off_s, off_s2, off_lens, off_h, off_g;  /* shared memory offsets */
  int variant;         /* bits (the backward: PV_FLAGS and PV_CHAIN2 only) (tuning.rnn switches): PV_FLAGS the blocks meet through one flag per block
                          (a release store of the step; the waiters' warp 0 polls them all with acquire loads)
                          instead of the counter; PV_CHAIN2 the block GEMM of a warp with one tile runs two
                          accumulator chains (even / odd k steps); PV_XS_AHEAD the input projection slice of the
                          next step fetched during this one (two x buffers: one chunk, the barrier); PV_FAST_MATH
                          (16-bit data) tanh and sigmoid of the cell on tanh.approx.f32 */
  int pad2;
  unsigned long long *stamps;  /* forward, NULL or [seq][8] u64: block 0's clock64 at the phases of every step
                                  (tools/bench_rnn.py --stamps; see rnn_persist.cu) */
} PersistParams;

#define PV_FLAGS 1
#define PV_CHAIN2 2
#define PV_XS_AHEAD 4
#define PV_FAST_MATH 8
#define PV_SLEEP 16  /* persist_fwd_r's tagged gather: __nanosleep between rounds (PERSIST_REG_SLEEP) */
#define PV_CG 32     /* persist_fwd_r with the barrier: h_{t-1} through ld.global.cg instead of ld.relaxed.gpu (PERSIST_REG_CG) */

#endif
