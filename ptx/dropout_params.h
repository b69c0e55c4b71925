/* Dropout kernel parameters (plain C; mirrored in pydnn/ops/dropout.py, layout checked on the CPU).
 *
 * Elements are numbered i = 0 .. n-1 in row-major order of the tensor's dims (the logical index, not the
 * memory order): element i's keep decision is bit (i & 7) of
 * pydnn::philox::dropout_keep_bits8(seed, offset, i >> 3, threshold) (ptx/common/philox.cuh), and it is
 * stored as bit (i & 7) of byte (i >> 3) of the reserve space (1 bit per element, bits past n are 0).
 *
 * The states buffer (PYDNN_DROPOUT_STATE_BYTES, 8-byte aligned) holds 4 little-endian u64 words:
 *   [0] seed  [1] offset of the next forward  [2] blocks of the running forward that have read [1]
 *   [3] PYDNN_DROPOUT_STATE_TAG (written by the init kernel; for debugging dumps).
 * A forward reads seed and offset, and its last block to do so sets offset += 1 and the count back to 0,
 * so successive forwards (and CUDA-graph replays) draw new masks without a host round trip. */
#ifndef PYDNN_DROPOUT_PARAMS_H
#define PYDNN_DROPOUT_PARAMS_H

#ifndef PYDNN_MAX_DIMS
#define PYDNN_MAX_DIMS 8
#endif

#define PYDNN_DROPOUT_STATE_BYTES 32
#define PYDNN_DROPOUT_STATE_TAG 0x31706F7244444E50ull /* "PNDDrop1" */

typedef struct {
  void *out;                   /* y (forward) or dx (backward) */
  const void *in;              /* x (forward) or dy (backward) */
  unsigned char *mask;         /* reserve space: 1 bit per element */
  unsigned long long *state;   /* states buffer; NULL: no random bits needed (threshold 0 or 65536) */
  unsigned long long seed;     /* init kernel only */
  double scale;                /* 1 / (1 - p); 0 when p == 1 */
  long long n;                 /* elements */
  long long groups;            /* ceil(n / 8): mask bytes, Philox blocks */
  unsigned threshold;          /* keep iff the element's 16-bit slice >= threshold (0 .. 65536) */
  int ndim;                    /* strided kernels: collapsed dims, outermost first */
  long long size[PYDNN_MAX_DIMS];
  long long stride[2][PYDNN_MAX_DIMS]; /* [0] out, [1] in: element strides */
} DropoutParams;

#endif
