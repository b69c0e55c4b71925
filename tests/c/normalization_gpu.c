/* Layer and group normalization through the C API on a GPU, checked against double-precision host math:
 * layer norm forward training (y, mean, invstd) and backward (dx, dscale, dbias, with the workspace size
 * query), group norm forward on NHWC data with a fused ReLU, and a bad-groups status with its message.
 * Device memory comes from the CUDA driver (dlopen'ed). Prints "ok <what>" / "FAIL <what>" lines. */
#include "gpu_test.h"



static CUdeviceptr upload(const void *p, size_t n) {
  CUdeviceptr d = 0;
  if (cuMemAlloc(&d, n) != 0 || (p && cuMemcpyHtoD(d, p, n) != 0)) { printf("FAIL device memory\n"); exit(2); }
  return d;
}

/* |got - want| / (|want| + 1) */
static double err_of(const float *got, const double *want, int n) {
  double worst = 0;
  for (int i = 0; i < n; i++) {
    double e = fabs(got[i] - want[i]) / (fabs(want[i]) + 1.0);
    if (!(e <= worst)) worst = e;
  }
  return worst;
}

enum { R = 5, L = 96 };

int main(void) {
  load_driver();
  pydnnHandle_t h;
  if (pydnnCreate(&h) != PYDNN_STATUS_SUCCESS) { printf("FAIL create\n"); return 1; }
  static float x[R * L], dy[R * L], y[R * L], dx[R * L], g[L], b[L], mean[R], inv[R], dg[L], db[L];
  static double want[R * L], wm[R], wi[R], wdg[L], wdb[L];
  srand(7);
  for (int i = 0; i < R * L; i++) {
    x[i] = (float)(6.0 * rand() / RAND_MAX - 3.0);
    dy[i] = (float)(2.0 * rand() / RAND_MAX - 1.0);
  }
  for (int i = 0; i < L; i++) {
    g[i] = (float)(0.5 + (double)rand() / RAND_MAX);
    b[i] = (float)(2.0 * rand() / RAND_MAX - 1.0);
  }
  CUdeviceptr X = upload(x, sizeof x), DY = upload(dy, sizeof dy), Y = upload(NULL, sizeof y), DX = upload(NULL, sizeof dx);
  CUdeviceptr G = upload(g, sizeof g), B = upload(b, sizeof b), M = upload(NULL, sizeof mean), V = upload(NULL, sizeof inv);
  CUdeviceptr DG = upload(NULL, sizeof dg), DB = upload(NULL, sizeof db);

  pydnnTensorDescriptor_t xd, sbd, std;
  pydnnCreateTensorDescriptor(&xd);
  pydnnCreateTensorDescriptor(&sbd);
  pydnnCreateTensorDescriptor(&std);
  int dims[2] = {R, L}, strides[2] = {L, 1};
  pydnnSetTensorNdDescriptor(xd, PYDNN_DATA_FLOAT, 2, dims, strides);
  pydnnNormDescriptor_t nd;
  CHECK(pydnnCreateNormDescriptor(&nd) == PYDNN_STATUS_SUCCESS, "create norm descriptor");
  CHECK(pydnnSetNormDescriptor(nd, PYDNN_NORM_KIND_LAYER, 1, 1, 1e-5, NULL) == PYDNN_STATUS_SUCCESS, "set norm descriptor");
  pydnnNormKind_t kind;
  int groups, ndims;
  double eps;
  CHECK(pydnnGetNormDescriptor(nd, &kind, &groups, &ndims, &eps) == PYDNN_STATUS_SUCCESS && kind == PYDNN_NORM_KIND_LAYER &&
            ndims == 1 && eps == 1e-5, "get norm descriptor");
  CHECK(pydnnDeriveNormParamDescriptors(sbd, std, xd, nd) == PYDNN_STATUS_SUCCESS, "derive param descriptors");

  float one = 1.0f, zero = 0.0f;
  pydnnStatus_t st = pydnnNormForwardTraining(h, nd, &one, &zero, xd, (void *)X, xd, (void *)Y, sbd, (void *)G, (void *)B,
                                              std, (void *)M, (void *)V);
  CHECK(st == PYDNN_STATUS_SUCCESS, "layer norm forward status");
  cuCtxSynchronize();
  cuMemcpyDtoH(y, Y, sizeof y);
  cuMemcpyDtoH(mean, M, sizeof mean);
  cuMemcpyDtoH(inv, V, sizeof inv);
  for (int r = 0; r < R; r++) {
    double s = 0, q = 0;
    for (int i = 0; i < L; i++) s += x[r * L + i];
    wm[r] = s / L;
    for (int i = 0; i < L; i++) q += (x[r * L + i] - wm[r]) * (x[r * L + i] - wm[r]);
    wi[r] = 1.0 / sqrt(q / L + 1e-5);
    for (int i = 0; i < L; i++) want[r * L + i] = (x[r * L + i] - wm[r]) * wi[r] * g[i] + b[i];
  }
  double e1 = err_of(y, want, R * L), e2 = err_of(mean, wm, R), e3 = err_of(inv, wi, R);
  printf("layer norm forward errors %.3g %.3g %.3g\n", e1, e2, e3);
  CHECK(e1 < 1e-5 && e2 < 1e-5 && e3 < 1e-5, "layer norm forward");

  size_t wsize = 0;
  st = pydnnGetNormBackwardWorkspaceSize(h, nd, xd, xd, xd, sbd, std, &wsize);
  CHECK(st == PYDNN_STATUS_SUCCESS && wsize > 0, "backward workspace size");
  CUdeviceptr WS = upload(NULL, wsize);
  st = pydnnNormBackward(h, nd, &one, &zero, &one, &zero, xd, (void *)X, xd, (void *)DY, xd, (void *)DX, sbd, (void *)G,
                         (void *)B, (void *)DG, (void *)DB, std, (void *)M, (void *)V, (void *)WS, wsize);
  CHECK(st == PYDNN_STATUS_SUCCESS, "layer norm backward status");
  cuCtxSynchronize();
  cuMemcpyDtoH(dx, DX, sizeof dx);
  cuMemcpyDtoH(dg, DG, sizeof dg);
  cuMemcpyDtoH(db, DB, sizeof db);
  memset(wdg, 0, sizeof wdg);
  memset(wdb, 0, sizeof wdb);
  for (int r = 0; r < R; r++) {
    double m1 = 0, m2 = 0;
    for (int i = 0; i < L; i++) {
      double xh = (x[r * L + i] - (double)mean[r]) * inv[r];
      m1 += dy[r * L + i] * g[i];
      m2 += dy[r * L + i] * g[i] * xh;
      wdg[i] += dy[r * L + i] * xh;
      wdb[i] += dy[r * L + i];
    }
    m1 /= L;
    m2 /= L;
    for (int i = 0; i < L; i++) {
      double xh = (x[r * L + i] - (double)mean[r]) * inv[r];
      want[r * L + i] = inv[r] * (dy[r * L + i] * g[i] - m1 - xh * m2);
    }
  }
  e1 = err_of(dx, want, R * L);
  e2 = err_of(dg, wdg, L);
  e3 = err_of(db, wdb, L);
  printf("layer norm backward errors %.3g %.3g %.3g\n", e1, e2, e3);
  CHECK(e1 < 1e-5 && e2 < 1e-5 && e3 < 1e-5, "layer norm backward");
  st = pydnnNormBackward(h, nd, &one, &zero, &one, &zero, xd, (void *)X, xd, (void *)DY, xd, (void *)DX, sbd, (void *)G,
                         (void *)B, (void *)DG, (void *)DB, std, (void *)M, (void *)V, (void *)WS, wsize - 4);
  CHECK(st == PYDNN_STATUS_BAD_PARAM, "small workspace refused");

  /* group norm, 2 groups over C = 6, NHWC (N=2, H=4, W=4), fused ReLU, no bias */
  enum { GN = 2, GC = 6, GH = 4, GW = 4, GG = 2, GCOUNT = GN * GC * GH * GW };
  static float gx[GCOUNT], gy[GCOUNT], gg[GC], gm[GN * GG], gv[GN * GG];
  static double gwant[GCOUNT];
  for (int i = 0; i < GCOUNT; i++) gx[i] = (float)(6.0 * rand() / RAND_MAX - 3.0);
  for (int c = 0; c < GC; c++) gg[c] = (float)(0.5 + (double)rand() / RAND_MAX);
  CUdeviceptr GX = upload(gx, sizeof gx), GY = upload(NULL, sizeof gy), GGp = upload(gg, sizeof gg);
  CUdeviceptr GM = upload(NULL, sizeof gm), GV = upload(NULL, sizeof gv);
  pydnnTensorDescriptor_t gxd, gsb, gst;
  pydnnCreateTensorDescriptor(&gxd);
  pydnnCreateTensorDescriptor(&gsb);
  pydnnCreateTensorDescriptor(&gst);
  pydnnSetTensor4dDescriptor(gxd, PYDNN_TENSOR_NHWC, PYDNN_DATA_FLOAT, GN, GC, GH, GW);
  pydnnActivationDescriptor_t relu;
  pydnnCreateActivationDescriptor(&relu);
  pydnnSetActivationDescriptor(relu, PYDNN_ACTIVATION_RELU, PYDNN_NOT_PROPAGATE_NAN, 0.0);
  pydnnNormDescriptor_t gnd;
  pydnnCreateNormDescriptor(&gnd);
  pydnnSetNormDescriptor(gnd, PYDNN_NORM_KIND_GROUP, GG, 0, 1e-5, relu);
  pydnnDeriveNormParamDescriptors(gsb, gst, gxd, gnd);
  st = pydnnNormForwardTraining(h, gnd, &one, &zero, gxd, (void *)GX, gxd, (void *)GY, gsb, (void *)GGp, NULL, gst,
                                (void *)GM, (void *)GV);
  CHECK(st == PYDNN_STATUS_SUCCESS, "group norm forward status");
  cuCtxSynchronize();
  cuMemcpyDtoH(gy, GY, sizeof gy);
  const int cg = GC / GG;
  for (int n = 0; n < GN; n++)
    for (int gi = 0; gi < GG; gi++) {
      double s = 0, q = 0;
      for (int p = 0; p < GH * GW; p++)
        for (int c = gi * cg; c < (gi + 1) * cg; c++) s += gx[(n * GH * GW + p) * GC + c];
      double m = s / (cg * GH * GW);
      for (int p = 0; p < GH * GW; p++)
        for (int c = gi * cg; c < (gi + 1) * cg; c++) q += pow(gx[(n * GH * GW + p) * GC + c] - m, 2);
      double iv = 1.0 / sqrt(q / (cg * GH * GW) + 1e-5);
      for (int p = 0; p < GH * GW; p++)
        for (int c = gi * cg; c < (gi + 1) * cg; c++) {
          double z = (gx[(n * GH * GW + p) * GC + c] - m) * iv * gg[c];
          gwant[(n * GH * GW + p) * GC + c] = z > 0 ? z : 0;
        }
    }
  e1 = err_of(gy, gwant, GCOUNT);
  printf("group norm forward error %.3g\n", e1);
  CHECK(e1 < 1e-5, "group norm forward");

  pydnnSetNormDescriptor(gnd, PYDNN_NORM_KIND_GROUP, 4, 0, 1e-5, NULL);
  st = pydnnNormForwardTraining(h, gnd, &one, &zero, gxd, (void *)GX, gxd, (void *)GY, gsb, (void *)GGp, NULL, gst,
                                (void *)GM, (void *)GV);
  char msg[256];
  pydnnGetLastErrorString(msg, sizeof msg);
  printf("%s\n", msg);
  CHECK(st == PYDNN_STATUS_BAD_PARAM && strstr(msg, "pydnnNormForwardTraining: normDesc: groups 4 does not divide") != NULL,
        "bad groups status");
  CHECK(pydnnSetNormDescriptor(gnd, PYDNN_NORM_KIND_GROUP, 2, 0, 0.0, NULL) == PYDNN_STATUS_BAD_PARAM, "epsilon 0 refused");
  pydnnDestroyNormDescriptor(gnd);
  pydnnDestroyNormDescriptor(nd);
  pydnnDestroy(h);
  return failures ? 1 : 0;
}
