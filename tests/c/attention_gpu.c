/* Fused attention through the C API on a GPU: descriptor set / get and its errors, workspace sizes, a
 * GQA causal (bottom-right) forward and backward on bf16 BSHD tensors checked against double-precision
 * host math (the Python tests hold the strict tolerances; this checks the C path end to end), and a few
 * bad calls with their statuses. Prints "ok <what>" / "FAIL <what>" lines; exits non-zero on failure. */
#include "gpu_test.h"



enum { B = 2, HQ = 4, HKV = 2, SQ = 45, SKV = 70, D = 64, NQ = B * SQ * HQ * D, NK = B * SKV * HKV * D };

static unsigned short to_bf16(float f) {
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
/* BSHD element (b, h, s, d) */
static int at(int b, int h, int s, int d, int H, int S) { return ((b * S + s) * H + h) * D + d; }

static double q[NQ], k[NK], v[NK], dout[NQ];
static double o_ref[NQ], lse_ref[B * HQ * SQ], dq_ref[NQ], dk_ref[NK], dv_ref[NK];

static void reference(double scale) {
  static double p[SQ][SKV];
  memset(dk_ref, 0, sizeof dk_ref);
  memset(dv_ref, 0, sizeof dv_ref);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < HQ; h++) {
      int hk = h / (HQ / HKV);
      for (int i = 0; i < SQ; i++) {
        double m = -INFINITY, sum = 0;
        for (int j = 0; j < SKV; j++) {
          double s = -INFINITY;
          if (j <= i + (SKV - SQ)) { /* causal, bottom-right */
            s = 0;
            for (int d = 0; d < D; d++) s += q[at(b, h, i, d, HQ, SQ)] * k[at(b, hk, j, d, HKV, SKV)];
            s *= scale;
          }
          p[i][j] = s;
          if (s > m) m = s;
        }
        for (int j = 0; j < SKV; j++) sum += (p[i][j] = exp(p[i][j] - m));
        lse_ref[(b * HQ + h) * SQ + i] = m + log(sum);
        double ds_sum = 0;
        for (int d = 0; d < D; d++) {
          double acc = 0;
          for (int j = 0; j < SKV; j++) acc += (p[i][j] / sum) * v[at(b, hk, j, d, HKV, SKV)];
          o_ref[at(b, h, i, d, HQ, SQ)] = acc;
          ds_sum += acc * dout[at(b, h, i, d, HQ, SQ)];
        }
        for (int d = 0; d < D; d++) dq_ref[at(b, h, i, d, HQ, SQ)] = 0;
        for (int j = 0; j < SKV; j++) {
          double pij = p[i][j] / sum, dp = 0;
          for (int d = 0; d < D; d++) dp += dout[at(b, h, i, d, HQ, SQ)] * v[at(b, hk, j, d, HKV, SKV)];
          double ds = pij * (dp - ds_sum);
          for (int d = 0; d < D; d++) {
            dv_ref[at(b, hk, j, d, HKV, SKV)] += pij * dout[at(b, h, i, d, HQ, SQ)];
            dq_ref[at(b, h, i, d, HQ, SQ)] += scale * ds * k[at(b, hk, j, d, HKV, SKV)];
            dk_ref[at(b, hk, j, d, HKV, SKV)] += scale * ds * q[at(b, h, i, d, HQ, SQ)];
          }
        }
      }
    }
}

/* worst |got - want| / (|want| + 1) over n bf16 values */
static double err_bf16(CUdeviceptr dev, const double *want, int n) {
  static unsigned short host[NQ > NK ? NQ : NK];
  cuMemcpyDtoH(host, dev, (size_t)n * 2);
  double worst = 0;
  for (int i = 0; i < n; i++) {
    double e = fabs(from_bf16(host[i]) - want[i]) / (fabs(want[i]) + 1.0);
    if (!(e <= worst)) worst = e;
  }
  return worst;
}

static CUdeviceptr upload(double *vals, int n) {
  static unsigned short host[NQ > NK ? NQ : NK];
  for (int i = 0; i < n; i++) {
    host[i] = to_bf16((float)(4.0 * rand() / RAND_MAX - 2.0));
    vals[i] = from_bf16(host[i]);
  }
  CUdeviceptr p;
  cuMemAlloc(&p, (size_t)n * 2);
  cuMemcpyHtoD(p, host, (size_t)n * 2);
  return p;
}

static pydnnTensorDescriptor_t tensor(pydnnDataType_t dt, int h, int s, int d) {
  pydnnTensorDescriptor_t t;
  pydnnCreateTensorDescriptor(&t);
  int dims[4] = {B, h, s, d}, strides[4] = {s * h * d, d, h * d, 1}; /* BSHD */
  pydnnSetTensorNdDescriptor(t, dt, 4, dims, strides);
  return t;
}

int main(void) {
  load_driver();
  pydnnHandle_t h;
  if (pydnnCreate(&h) != PYDNN_STATUS_SUCCESS) { printf("FAIL create handle\n"); return 1; }

  /* the descriptor */
  pydnnAttentionDescriptor_t a;
  CHECK(pydnnCreateAttentionDescriptor(&a) == PYDNN_STATUS_SUCCESS, "create attention descriptor");
  CHECK(pydnnSetAttentionDescriptor(a, 6, 4, D, 0.125, PYDNN_ATTN_MASK_NONE, 0.0, 0) == PYDNN_STATUS_BAD_PARAM,
        "heads not a multiple: BAD_PARAM");
  char msg[256];
  pydnnGetLastErrorString(msg, sizeof msg);
  CHECK(strstr(msg, "numHeadsQ") != NULL, "message names numHeadsQ");
  double scale = 1.0 / sqrt((double)D);
  CHECK(pydnnSetAttentionDescriptor(a, HQ, HKV, D, scale, PYDNN_ATTN_MASK_CAUSAL_BOTTOM_RIGHT, 0.0, 42) ==
            PYDNN_STATUS_SUCCESS, "set attention descriptor");
  int hq = 0, hkv = 0, hd = 0;
  double sc = 0, dp = 1;
  pydnnAttentionMaskMode_t mm;
  unsigned long long seed = 0;
  CHECK(pydnnGetAttentionDescriptor(a, &hq, &hkv, &hd, &sc, &mm, &dp, &seed) == PYDNN_STATUS_SUCCESS && hq == HQ &&
            hkv == HKV && hd == D && sc == scale && mm == PYDNN_ATTN_MASK_CAUSAL_BOTTOM_RIGHT && dp == 0 && seed == 42,
        "get attention descriptor");

  pydnnTensorDescriptor_t tq = tensor(PYDNN_DATA_BFLOAT16, HQ, SQ, D), tk = tensor(PYDNN_DATA_BFLOAT16, HKV, SKV, D);
  pydnnTensorDescriptor_t ts;
  pydnnCreateTensorDescriptor(&ts);
  int sdims[4] = {B, HQ, SQ, 1}, sstr[4] = {HQ * SQ, SQ, 1, 1};
  pydnnSetTensorNdDescriptor(ts, PYDNN_DATA_FLOAT, 4, sdims, sstr);
  size_t wf = 1, wb = 0;
  CHECK(pydnnGetAttentionForwardWorkspaceSize(h, a, tq, tk, &wf) == PYDNN_STATUS_SUCCESS && wf == 0,
        "forward workspace 0");
  CHECK(pydnnGetAttentionBackwardWorkspaceSize(h, a, tq, tk, &wb) == PYDNN_STATUS_SUCCESS &&
            wb == ((size_t)B * HQ * SQ * 4 + 15) / 16 * 16 + (size_t)B * HQ * SQ * D * 4,
        "backward workspace size (row sums + fp32 dQ accumulator)");

  srand(7);
  CUdeviceptr dq_in = upload(q, NQ), dk_in = upload(k, NK), dv_in = upload(v, NK), ddo = upload(dout, NQ);
  CUdeviceptr dO, dL, dQ, dK, dV, ws;
  cuMemAlloc(&dO, NQ * 2);
  cuMemAlloc(&dL, B * HQ * SQ * 4);
  cuMemAlloc(&dQ, NQ * 2);
  cuMemAlloc(&dK, NK * 2);
  cuMemAlloc(&dV, NK * 2);
  cuMemAlloc(&ws, wb);
  reference(scale);

  pydnnStatus_t st = pydnnAttentionForward(h, a, tq, (void *)dq_in, tk, (void *)dk_in, tk, (void *)dv_in, tq,
                                           (void *)dO, ts, (void *)dL, NULL, NULL, NULL, 0);
  CHECK(st == PYDNN_STATUS_SUCCESS, "attention forward");
  cuCtxSynchronize();
  CHECK(err_bf16(dO, o_ref, NQ) < 2e-2, "forward O numbers");
  static float lse[B * HQ * SQ];
  cuMemcpyDtoH(lse, dL, sizeof lse);
  double worst = 0;
  for (int i = 0; i < B * HQ * SQ; i++) {
    double e = fabs(lse[i] - lse_ref[i]) / (fabs(lse_ref[i]) + 1.0);
    if (!(e <= worst)) worst = e;
  }
  CHECK(worst < 1e-4, "forward lse numbers");

  st = pydnnAttentionBackward(h, a, tq, (void *)dq_in, tk, (void *)dk_in, tk, (void *)dv_in, tq, (void *)dO, tq,
                              (void *)ddo, ts, (void *)dL, tq, (void *)dQ, tk, (void *)dK, tk, (void *)dV, NULL, NULL,
                              1, (void *)ws, wb);
  CHECK(st == PYDNN_STATUS_SUCCESS, "attention backward");
  cuCtxSynchronize();
  CHECK(err_bf16(dQ, dq_ref, NQ) < 3e-2, "backward dQ numbers");
  CHECK(err_bf16(dK, dk_ref, NK) < 3e-2, "backward dK numbers");
  CHECK(err_bf16(dV, dv_ref, NK) < 3e-2, "backward dV numbers");

  /* bad calls */
  st = pydnnAttentionBackward(h, a, tq, (void *)dq_in, tk, (void *)dk_in, tk, (void *)dv_in, tq, (void *)dO, tq,
                              (void *)ddo, NULL, (void *)dL, tq, (void *)dQ, tk, (void *)dK, tk, (void *)dV, NULL, NULL,
                              1, (void *)ws, wb);
  CHECK(st == PYDNN_STATUS_BAD_PARAM, "backward without statsDesc: BAD_PARAM");
  st = pydnnAttentionBackward(h, a, tq, (void *)dq_in, tk, (void *)dk_in, tk, (void *)dv_in, tq, (void *)dO, tq,
                              (void *)ddo, ts, (void *)dL, tq, (void *)dQ, tk, (void *)dK, tk, (void *)dV, NULL, NULL,
                              0, (void *)ws, wb - 4);
  CHECK(st == PYDNN_STATUS_BAD_PARAM, "atomic backward with a short workspace: BAD_PARAM");
  st = pydnnAttentionForward(h, a, tq, (void *)(dq_in + 2), tk, (void *)dk_in, tk, (void *)dv_in, tq, (void *)dO,
                             ts, (void *)dL, NULL, NULL, NULL, 0);
  CHECK(st == PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, "misaligned q: MISALIGNED_POINTER");
  pydnnSetAttentionDescriptor(a, HQ, HKV, 80, scale, PYDNN_ATTN_MASK_NONE, 0.0, 0);
  st = pydnnAttentionForward(h, a, tq, (void *)dq_in, tk, (void *)dk_in, tk, (void *)dv_in, tq, (void *)dO, ts,
                             (void *)dL, NULL, NULL, NULL, 0);
  pydnnGetLastErrorString(msg, sizeof msg);
  CHECK(st == PYDNN_STATUS_NOT_SUPPORTED && strstr(msg, "headDim 80") != NULL, "head dim 80: NOT_SUPPORTED");
  CHECK(pydnnDestroyAttentionDescriptor(a) == PYDNN_STATUS_SUCCESS, "destroy attention descriptor");
  CHECK(pydnnDestroyAttentionDescriptor(NULL) == PYDNN_STATUS_SUCCESS, "destroy NULL");
  pydnnDestroy(h);
  return failures ? 1 : 0;
}
