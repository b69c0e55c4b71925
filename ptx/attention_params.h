/* Fused attention kernel parameters (plain C; mirrored in pydnn/ops/attention.py, layout checked on the
 * CPU). One struct serves every attention kernel (forward, backward preprocess, dK/dV, dQ).
 *
 * Tensors are 4-d (batch, heads, sequence, head dim) with the head dim contiguous; stride[t] holds the
 * batch, head and sequence strides of tensor t (in elements; PYDNN_ATTN_T_* below). BHSD and BSHD are
 * both just strides. K and V have heads_kv heads; query head h reads K/V head h / group
 * (group = heads_q / heads_kv: MHA 1, GQA > 1, MQA heads_q).
 *
 * lens_q / lens_kv: per-batch actual lengths (int32 device arrays of `batch` entries) or NULL (the
 * tensor's seq_q / seq_kv). The kernels clamp each to [0, seq]. Query rows at or past their length get
 * O = 0, lse = -inf and dQ = 0; keys past theirs get dK = dV = 0.
 *
 * mask: PYDNN_ATTN_MASK_* (pydnnAttentionMaskMode_t): key j is visible to query row i when
 * j < len_kv and (mask == NONE, or j <= i + offset, offset = 0 (TOP_LEFT) or len_kv - len_q
 * (BOTTOM_RIGHT)). A row that sees no key gets O = 0 and lse = -inf. */
#ifndef PYDNN_ATTENTION_PARAMS_H
#define PYDNN_ATTENTION_PARAMS_H

#define PYDNN_ATTN_T_Q 0
#define PYDNN_ATTN_T_K 1
#define PYDNN_ATTN_T_V 2
#define PYDNN_ATTN_T_O 3
#define PYDNN_ATTN_T_DO 4
#define PYDNN_ATTN_T_DQ 5
#define PYDNN_ATTN_T_DK 6
#define PYDNN_ATTN_T_DV 7
#define PYDNN_ATTN_T_LSE 8
#define PYDNN_ATTN_TENSORS 9

#define PYDNN_ATTN_KMASK_NONE 0
#define PYDNN_ATTN_KMASK_TOP_LEFT 1
#define PYDNN_ATTN_KMASK_BOTTOM_RIGHT 2

typedef struct {
  const void *q, *k, *v;
  void *o;                /* forward output; backward: the forward's output (read) */
  float *lse;             /* log-sum-exp per query row (natural log), fp32; forward may leave it NULL */
  const void *dout;       /* backward: dO */
  void *dq, *dk, *dv;     /* backward outputs */
  float *dsum;            /* backward workspace: rowsum(dO * O), batch * heads_q * seq_q floats, dense */
  float *dq_acc;          /* backward workspace, atomic dQ mode: fp32 dQ / scale, dense [b][h][i][D]; else NULL */
  const int *lens_q, *lens_kv;
  long long stride[PYDNN_ATTN_TENSORS][3];  /* batch, head, sequence strides in elements */
  int batch, heads_q, heads_kv, group;
  int seq_q, seq_kv;
  int mask;               /* PYDNN_ATTN_KMASK_* */
  unsigned flags;         /* reserved (0) */
  float scale;            /* softmax scale (natural units) */
  float scale_log2;       /* scale * log2(e): scores go straight to exp2 */
  unsigned long long seed;   /* dropout (the DROP kernels): Philox stream (seed, offset 0) */
  unsigned drop_threshold;   /* round(p * 65536): an element is dropped iff its 16-bit slice < this */
  float drop_scale;          /* 1 / (1 - p) */
  /* split-KV decode (dec / dec_combine in attention.cu): split s of `splits` takes keys
   * [s * split_len, (s + 1) * split_len); with splits > 1 each writes its rows' partial results, O_s
   * normalized by its own sum (part_o, fp32 [row][split][D]) and lse_s (part_lse, [row][split], natural
   * log, -inf when it saw nothing), rows (b, h, i) dense, and dec_combine merges them. */
  float *part_o, *part_lse;
  int splits, split_len;
  /* the warp-specialized forward (fwd_ws in attention_ws.cu): work units go round in sections of
   * sched_heads (batch, head) pairs whose K / V fit in L2 together (host: pydnn/ops/attention_ws.py);
   * other kernels ignore it */
  int sched_heads, sched_pad;
  /* paged K / V (pydnnAttentionForwardPaged; NULL tables otherwise, and every kernel but dec and fwd_ws /
   * fwd_ws_tma's paged instantiations ignores these): K and V are page pools (pages, heads_kv, page_size,
   * D) whose stride[T_K] / stride[T_V] are (page, head, row) strides; key j of batch b is row j % page_size
   * of page ptab_k[b * ptab_stride[0][0] + (j / page_size) * ptab_stride[0][1]] (V: ptab_v, ptab_stride[1]).
   * seq_kv is maxSeqLenKV; page ids of keys below a batch's length are the caller's contract (not checked). */
  const int *ptab_k, *ptab_v;
  long long ptab_stride[2][2];
  int page_size, paged_pad;
} AttnParams;

#endif
