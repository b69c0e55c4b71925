/* Multi-head attention with projections through the C API on a GPU: attention and sequence data
 * descriptors (set / get, paddingFill, NULL dropouts), buffer sizes (NULL reserve size: inference), the
 * weight tensors' places, a bf16 training forward checked against double-precision host math (the Python
 * tests hold the strict per-stage tolerances; this checks the C path end to end), the backward calls,
 * and bad calls with their statuses. Prints "ok <what>" / "FAIL <what>" lines; exits non-zero on failure. */
#include "gpu_test.h"

enum { H = 2, D = 64, B = 1, T = 20, TK = 24, QS = 32, KS = 32, VS = 32, PO = 32, HD = H * D };

static unsigned short to_bf16(double d) {
  float f = (float)d;
  unsigned u;
  memcpy(&u, &f, 4);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static double from_bf16(unsigned short b) {
  unsigned u = (unsigned)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static double rnd(double x) { return from_bf16(to_bf16(x)); }
static double urand(void) { return (rand() / (double)RAND_MAX) * 2.0 - 1.0; }

static double q[T][QS], k[TK][KS], v[TK][VS], out_ref[T][PO];
static double wq[H][D][QS], wk[H][D][KS], wv[H][D][VS], wo[PO][HD], bq[HD], bk[HD], bv[HD], bo[PO];

static void reference(double sm) {
  static double qp[T][HD], kp[TK][HD], vp[TK][HD], ao[T][HD];
  for (int t = 0; t < T; t++)
    for (int h = 0; h < H; h++)
      for (int p = 0; p < D; p++) {
        double s = bq[h * D + p];
        for (int i = 0; i < QS; i++) s += wq[h][p][i] * q[t][i];
        qp[t][h * D + p] = rnd(s);
      }
  for (int t = 0; t < TK; t++)
    for (int h = 0; h < H; h++)
      for (int p = 0; p < D; p++) {
        double s = bk[h * D + p], u = bv[h * D + p];
        for (int i = 0; i < KS; i++) s += wk[h][p][i] * k[t][i];
        for (int i = 0; i < VS; i++) u += wv[h][p][i] * v[t][i];
        kp[t][h * D + p] = rnd(s);
        vp[t][h * D + p] = rnd(u);
      }
  for (int h = 0; h < H; h++)
    for (int t = 0; t < T; t++) {
      double sc[TK], m = -INFINITY, sum = 0;
      for (int j = 0; j <= t + (TK - T); j++) { /* causal, bottom-right: hiWinIdx[t] = t + 1 + TK - T */
        double s = 0;
        for (int p = 0; p < D; p++) s += qp[t][h * D + p] * kp[j][h * D + p];
        sc[j] = sm * s;
        if (sc[j] > m) m = sc[j];
      }
      for (int j = 0; j <= t + (TK - T); j++) sum += (sc[j] = exp(sc[j] - m));
      for (int p = 0; p < D; p++) {
        double a = 0;
        for (int j = 0; j <= t + (TK - T); j++) a += sc[j] / sum * vp[j][h * D + p];
        ao[t][h * D + p] = rnd(a);
      }
    }
  for (int t = 0; t < T; t++)
    for (int o = 0; o < PO; o++) {
      double s = bo[o];
      for (int c = 0; c < HD; c++) s += wo[o][c] * ao[t][c];
      out_ref[t][o] = s;
    }
}

static CUdeviceptr upload_bf16(const double *x, int n) {
  unsigned short *tmp = malloc(n * 2);
  for (int i = 0; i < n; i++) tmp[i] = to_bf16(x[i]);
  CUdeviceptr d;
  cuMemAlloc(&d, n * 2);
  cuMemcpyHtoD(d, tmp, n * 2);
  free(tmp);
  return d;
}

static pydnnSeqDataDescriptor_t seq(int t, int vect, const int *lens, void *fill) {
  pydnnSeqDataDescriptor_t s;
  pydnnCreateSeqDataDescriptor(&s);
  int dims[4];
  dims[PYDNN_SEQDATA_TIME_DIM] = t;
  dims[PYDNN_SEQDATA_BATCH_DIM] = B;
  dims[PYDNN_SEQDATA_BEAM_DIM] = 1;
  dims[PYDNN_SEQDATA_VECT_DIM] = vect;
  pydnnSeqDataAxis_t axes[4] = {PYDNN_SEQDATA_BATCH_DIM, PYDNN_SEQDATA_BEAM_DIM, PYDNN_SEQDATA_TIME_DIM,
                                PYDNN_SEQDATA_VECT_DIM};
  pydnnStatus_t st = pydnnSetSeqDataDescriptor(s, PYDNN_DATA_BFLOAT16, 4, dims, axes, B, lens, fill);
  CHECK(st == PYDNN_STATUS_SUCCESS, "set sequence data descriptor");
  return s;
}

/* Fill one weight kind: host layout from pydnnGetMultiHeadAttnWeights' descriptor. */
static void put_weights(pydnnHandle_t h, pydnnAttnDescriptor_t a, int kind, size_t wsize, CUdeviceptr w,
                        unsigned short *host, double *dst, int n0, int n1, int n2, int o_layout) {
  pydnnTensorDescriptor_t wd;
  pydnnCreateTensorDescriptor(&wd);
  void *addr = NULL;
  pydnnStatus_t st = pydnnGetMultiHeadAttnWeights(h, a, kind, wsize, (void *)w, wd, &addr);
  int nb = 0, dims[3], str[3];
  pydnnDataType_t dt;
  pydnnGetTensorNdDescriptor(wd, 3, &dt, &nb, dims, str);
  CHECK(st == PYDNN_STATUS_SUCCESS && addr != NULL && nb == 3 && dims[0] == n0 && dims[1] == n1 && dims[2] == n2,
        "weight descriptor dims");
  if (st != PYDNN_STATUS_SUCCESS || addr == NULL) return; /* nothing to fill (a FAIL line says so) */
  size_t off = ((size_t)addr - (size_t)w) / 2;
  for (int i = 0; i < n0; i++)
    for (int j = 0; j < n1; j++)
      for (int l = 0; l < n2; l++) {
        double x = rnd(urand() / sqrt(o_layout ? HD : (n2 > 1 ? n2 : 4)));
        host[off + (size_t)i * str[0] + (size_t)j * str[1] + (size_t)l * str[2]] = to_bf16(x);
        /* the reference's layouts: Q/K/V (H, D, size); O as [PO][H*D]; biases flat */
        if (o_layout) dst[j * HD + i * D + l] = x;
        else dst[((size_t)i * n1 + j) * n2 + l] = x;
      }
  pydnnDestroyTensorDescriptor(wd);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* every line out before a crash, if any */
  load_driver();
  pydnnHandle_t h;
  if (pydnnCreate(&h) != PYDNN_STATUS_SUCCESS) { printf("FAIL create handle\n"); return 1; }
  char msg[512];
  double sm = 1.0 / sqrt((double)D);

  pydnnAttnDescriptor_t a;
  if (pydnnCreateAttnDescriptor(&a) != PYDNN_STATUS_SUCCESS) {
    pydnnGetLastErrorString(msg, sizeof msg);
    printf("FAIL create attention descriptor (%s)\n", msg);
    return 1;
  }
  pydnnStatus_t st = pydnnSetAttnDescriptor(a, PYDNN_ATTN_QUERYMAP_ALL_TO_ONE | PYDNN_ATTN_ENABLE_PROJ_BIASES, H,
                                            sm, PYDNN_DATA_BFLOAT16, PYDNN_DATA_FLOAT, PYDNN_TENSOR_OP_MATH, NULL,
                                            NULL, QS, KS, VS, D, D, D, PO, T, TK, B, 1);
  CHECK(st == PYDNN_STATUS_SUCCESS, "set attention descriptor");
  unsigned mode = 9;
  int nh = 0, sizes[11];
  double smg = 0;
  pydnnDataType_t dt, cp;
  pydnnMathType_t mt;
  pydnnDropoutDescriptor_t d1 = (pydnnDropoutDescriptor_t)1, d2 = (pydnnDropoutDescriptor_t)1;
  st = pydnnGetAttnDescriptor(a, &mode, &nh, &smg, &dt, &cp, &mt, &d1, &d2, &sizes[0], &sizes[1], &sizes[2],
                              &sizes[3], &sizes[4], &sizes[5], &sizes[6], &sizes[7], &sizes[8], &sizes[9], &sizes[10]);
  CHECK(st == PYDNN_STATUS_SUCCESS && mode == PYDNN_ATTN_ENABLE_PROJ_BIASES && nh == H && smg == sm && d1 == NULL &&
            d2 == NULL && sizes[0] == QS && sizes[6] == PO && sizes[8] == TK,
        "get attention descriptor (NULL dropouts)");
  st = pydnnSetAttnDescriptor(a, 4, H, sm, PYDNN_DATA_BFLOAT16, PYDNN_DATA_FLOAT, PYDNN_TENSOR_OP_MATH, NULL, NULL,
                              QS, KS, VS, D, D, D, PO, T, TK, B, 1);
  pydnnGetLastErrorString(msg, sizeof msg);
  CHECK(st == PYDNN_STATUS_BAD_PARAM && strstr(msg, "attnMode") != NULL, "bad attnMode: BAD_PARAM");

  int lq[B] = {T}, lk[B] = {TK};
  unsigned short fill = to_bf16(-4.0); /* paddingFill: a value of the data type (bfloat16 here) */
  pydnnSeqDataDescriptor_t sq = seq(T, QS, lq, NULL), sk = seq(TK, KS, lk, NULL), sv = seq(TK, VS, lk, NULL);
  pydnnSeqDataDescriptor_t so = seq(T, PO, lq, &fill);
  {
    pydnnDataType_t gdt;
    int nb = 0, dims[4], axes[4], lens[2] = {-1, -1};
    size_t nl = 0;
    unsigned short gfill = 0;
    st = pydnnGetSeqDataDescriptor(so, &gdt, &nb, 4, dims, (pydnnSeqDataAxis_t *)axes, &nl, 2, lens, &gfill);
    CHECK(st == PYDNN_STATUS_SUCCESS && gdt == PYDNN_DATA_BFLOAT16 && nb == 4 && dims[PYDNN_SEQDATA_TIME_DIM] == T &&
              axes[3] == PYDNN_SEQDATA_VECT_DIM && nl == B && lens[0] == T && lens[1] == -1 && from_bf16(gfill) == -4.0,
          "get sequence data descriptor (paddingFill back in bfloat16)");
    int bad_axes[4] = {PYDNN_SEQDATA_TIME_DIM, PYDNN_SEQDATA_BATCH_DIM, PYDNN_SEQDATA_VECT_DIM,
                       PYDNN_SEQDATA_BEAM_DIM};
    pydnnSeqDataDescriptor_t x;
    pydnnCreateSeqDataDescriptor(&x);
    st = pydnnSetSeqDataDescriptor(x, PYDNN_DATA_BFLOAT16, 4, dims, (pydnnSeqDataAxis_t *)bad_axes, B, lens, NULL);
    pydnnGetLastErrorString(msg, sizeof msg);
    CHECK(st == PYDNN_STATUS_BAD_PARAM && strstr(msg, "axes[3]") != NULL, "VECT not innermost: BAD_PARAM");
    CHECK(pydnnDestroySeqDataDescriptor(x) == PYDNN_STATUS_SUCCESS, "destroy sequence data descriptor");
  }

  size_t wsize = 0, wss = 0, rss = 0, wss_inf = 0;
  CHECK(pydnnGetMultiHeadAttnBuffers(h, a, &wsize, &wss, &rss) == PYDNN_STATUS_SUCCESS && wsize > 0 && rss > 0,
        "buffer sizes");
  CHECK(pydnnGetMultiHeadAttnBuffers(h, a, &wsize, &wss_inf, NULL) == PYDNN_STATUS_SUCCESS && wss_inf == wss,
        "buffer sizes, reserve NULL (inference)");

  CUdeviceptr w, dw, ws, rs, dq_, dk_, dv_, out, dlq, dlk;
  cuMemAlloc(&w, wsize);
  cuMemAlloc(&dw, wsize);
  cuMemAlloc(&ws, wss);
  cuMemAlloc(&rs, rss);
  unsigned short *host = calloc(wsize / 2, 2);
  srand(11);
  put_weights(h, a, PYDNN_MH_ATTN_Q_WEIGHTS, wsize, w, host, &wq[0][0][0], H, D, QS, 0);
  put_weights(h, a, PYDNN_MH_ATTN_K_WEIGHTS, wsize, w, host, &wk[0][0][0], H, D, KS, 0);
  put_weights(h, a, PYDNN_MH_ATTN_V_WEIGHTS, wsize, w, host, &wv[0][0][0], H, D, VS, 0);
  put_weights(h, a, PYDNN_MH_ATTN_O_WEIGHTS, wsize, w, host, &wo[0][0], H, PO, D, 1);
  put_weights(h, a, PYDNN_MH_ATTN_Q_BIASES, wsize, w, host, bq, H, D, 1, 0);
  put_weights(h, a, PYDNN_MH_ATTN_K_BIASES, wsize, w, host, bk, H, D, 1, 0);
  put_weights(h, a, PYDNN_MH_ATTN_V_BIASES, wsize, w, host, bv, H, D, 1, 0);
  put_weights(h, a, PYDNN_MH_ATTN_O_BIASES, wsize, w, host, bo, 1, PO, 1, 0);
  cuMemcpyHtoD(w, host, wsize);
  for (int t = 0; t < T; t++)
    for (int i = 0; i < QS; i++) q[t][i] = rnd(urand());
  for (int t = 0; t < TK; t++)
    for (int i = 0; i < KS; i++) k[t][i] = rnd(urand()), v[t][i] = rnd(urand());
  CUdeviceptr dq_in = upload_bf16(&q[0][0], T * QS), dk_in = upload_bf16(&k[0][0], TK * KS);
  CUdeviceptr dv_in = upload_bf16(&v[0][0], TK * VS);
  static double dout[T][PO];
  for (int t = 0; t < T; t++)
    for (int o = 0; o < PO; o++) dout[t][o] = rnd(urand());
  CUdeviceptr ddo = upload_bf16(&dout[0][0], T * PO);
  cuMemAlloc(&out, T * PO * 2);
  cuMemAlloc(&dq_, T * QS * 2);
  cuMemAlloc(&dk_, TK * KS * 2);
  cuMemAlloc(&dv_, TK * VS * 2);
  cuMemAlloc(&dlq, 4);
  cuMemAlloc(&dlk, 4);
  cuMemcpyHtoD(dlq, lq, 4);
  cuMemcpyHtoD(dlk, lk, 4);
  int lo[T], hi[T];
  for (int t = 0; t < T; t++) lo[t] = 0, hi[t] = t + 1 + (TK - T);
  reference(sm);

  st = pydnnMultiHeadAttnForward(h, a, -1, lo, hi, (void *)dlq, (void *)dlk, sq, (void *)dq_in, NULL, sk,
                                 (void *)dk_in, sv, (void *)dv_in, so, (void *)out, wsize, (void *)w, wss, (void *)ws,
                                 rss, (void *)rs);
  pydnnGetLastErrorString(msg, sizeof msg);
  CHECK(st == PYDNN_STATUS_SUCCESS, "training forward");
  if (st) printf("  (%s)\n", msg);
  cuCtxSynchronize();
  {
    static unsigned short got[T * PO];
    cuMemcpyDtoH(got, out, sizeof got);
    double worst = 0, big = 0;
    for (int i = 0; i < T * PO; i++) {
      double e = fabs(from_bf16(got[i]) - (&out_ref[0][0])[i]);
      if (!(e <= worst)) worst = e;
      if (fabs((&out_ref[0][0])[i]) > big) big = fabs((&out_ref[0][0])[i]);
    }
    printf("  forward: max error %.3g, max |out| %.3g\n", worst, big);
    CHECK(worst <= 2e-2 * (big > 1 ? big : 1), "forward out numbers");
  }
  st = pydnnMultiHeadAttnBackwardData(h, a, lo, hi, (void *)dlq, (void *)dlk, so, (void *)ddo, sq, (void *)dq_,
                                      (void *)dq_in, sk, (void *)dk_, (void *)dk_in, sv, (void *)dv_, (void *)dv_in,
                                      wsize, (void *)w, wss, (void *)ws, rss, (void *)rs);
  CHECK(st == PYDNN_STATUS_SUCCESS, "backward data");
  st = pydnnMultiHeadAttnBackwardWeights(h, a, PYDNN_WGRAD_MODE_SET, sq, (void *)dq_in, sk, (void *)dk_in, sv,
                                         (void *)dv_in, so, (void *)ddo, wsize, (void *)w, (void *)dw, wss,
                                         (void *)ws, rss, (void *)rs);
  CHECK(st == PYDNN_STATUS_SUCCESS, "backward weights");
  cuCtxSynchronize();
  {
    static unsigned short g[T * QS];
    cuMemcpyDtoH(g, dq_, sizeof g);
    int finite = 1, nonzero = 0;
    for (int i = 0; i < T * QS; i++) {
      double x = from_bf16(g[i]);
      finite &= isfinite(x);
      nonzero |= x != 0;
    }
    CHECK(finite && nonzero, "backward dqueries finite and not all zero");
  }

  /* bad calls */
  st = pydnnMultiHeadAttnBackwardData(h, a, lo, hi, (void *)dlq, (void *)dlk, so, (void *)ddo, sq, (void *)dq_,
                                      (void *)dq_in, sk, (void *)dk_, (void *)dk_in, sv, (void *)dv_, (void *)dv_in,
                                      wsize, (void *)w, wss, (void *)ws, rss, NULL);
  CHECK(st == PYDNN_STATUS_BAD_PARAM_NULL_POINTER, "backward without reserve space: NULL_POINTER");
  lo[3] = 2;
  st = pydnnMultiHeadAttnForward(h, a, -1, lo, hi, (void *)dlq, (void *)dlk, sq, (void *)dq_in, NULL, sk,
                                 (void *)dk_in, sv, (void *)dv_in, so, (void *)out, wsize, (void *)w, wss, (void *)ws,
                                 rss, (void *)rs);
  pydnnGetLastErrorString(msg, sizeof msg);
  CHECK(st == PYDNN_STATUS_NOT_SUPPORTED && strstr(msg, "loWinIdx[3]") != NULL, "sliding window: NOT_SUPPORTED");
  lo[3] = 0;
  st = pydnnMultiHeadAttnForward(h, a, -1, lo, hi, (void *)dlq, (void *)dlk, sq, (void *)(dq_in + 2), NULL, sk,
                                 (void *)dk_in, sv, (void *)dv_in, so, (void *)out, wsize, (void *)w, wss, (void *)ws,
                                 rss, (void *)rs);
  CHECK(st == PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, "misaligned queries: MISALIGNED_POINTER");
  st = pydnnMultiHeadAttnBackwardWeights(h, a, (pydnnWgradMode_t)5, sq, (void *)dq_in, sk, (void *)dk_in, sv,
                                         (void *)dv_in, so, (void *)ddo, wsize, (void *)w, (void *)dw, wss,
                                         (void *)ws, rss, (void *)rs);
  CHECK(st == PYDNN_STATUS_BAD_PARAM, "bad addGrad: BAD_PARAM");
  CHECK(pydnnDestroyAttnDescriptor(a) == PYDNN_STATUS_SUCCESS, "destroy attention descriptor");
  CHECK(pydnnDestroyAttnDescriptor(NULL) == PYDNN_STATUS_SUCCESS, "destroy NULL");
  pydnnDestroy(h);
  free(host);
  return failures ? 1 : 0;
}
