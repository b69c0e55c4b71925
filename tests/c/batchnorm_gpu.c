/* Batch normalization from C on a GPU: derive, training forward (running and saved statistics),
 * inference, backward, the Ex forms with residual add + ReLU, and a bad epsilon; checked against
 * double-precision host math. Device memory from the CUDA driver (dlopen'ed). Prints "ok <what>" /
 * "FAIL <what>" lines; exits non-zero on any failure. */
#include "gpu_test.h"



enum { N = 4, C = 8, H = 5, W = 7, HW = H * W, M = N * HW, COUNT = N * C * HW };

static CUdeviceptr dev(const void *host, size_t bytes) {
  CUdeviceptr p = 0;
  if (cuMemAlloc(&p, bytes) != 0) { printf("FAIL cuMemAlloc\n"); exit(2); }
  if (host) cuMemcpyHtoD(p, host, bytes);
  return p;
}

/* NHWC: element (n, c, hw) at (n * HW + hw) * C + c */
static int at(int n, int c, int hw) { return (n * HW + hw) * C + c; }

/* |got - want| <= tol * (|want| + 1) for all */
static int close_all(const float *got, const double *want, int n, double tol) {
  for (int i = 0; i < n; i++)
    if (!(fabs(got[i] - want[i]) <= tol * (fabs(want[i]) + 1.0))) {
      printf("  [%d] got %g want %g\n", i, got[i], want[i]);
      return 0;
    }
  return 1;
}

int main(void) {
  load_driver();
  pydnnHandle_t h;
  if (pydnnCreate(&h) != PYDNN_STATUS_SUCCESS) { printf("FAIL create\n"); return 1; }
  static float x[COUNT], z[COUNT], dy[COUNT], y[COUNT], dx[COUNT], dz[COUNT];
  float scale[C], bias[C], rmean[C], rvar[C], smean[C], sinv[C], dscale[C], dbias[C];
  static double want[COUNT], wantz[COUNT];
  double mean[C], var[C], invstd[C], wds[C], wdb[C];
  srand(7);
  for (int i = 0; i < COUNT; i++) {
    x[i] = (float)(4.0 * rand() / RAND_MAX - 2.0 + 0.5);
    z[i] = (float)(2.0 * rand() / RAND_MAX - 1.0);
    dy[i] = (float)(2.0 * rand() / RAND_MAX - 1.0);
  }
  for (int c = 0; c < C; c++) {
    scale[c] = 0.5f + 0.125f * c;
    bias[c] = 0.25f * c - 1.0f;
    rmean[c] = 0.0f;
    rvar[c] = 1.0f;
  }
  for (int c = 0; c < C; c++) {
    double s = 0, q = 0;
    for (int n = 0; n < N; n++)
      for (int k = 0; k < HW; k++) s += x[at(n, c, k)];
    mean[c] = s / M;
    for (int n = 0; n < N; n++)
      for (int k = 0; k < HW; k++) q += (x[at(n, c, k)] - mean[c]) * (x[at(n, c, k)] - mean[c]);
    var[c] = q / M;
    invstd[c] = 1.0 / sqrt(var[c] + 1e-5);
  }
  CUdeviceptr dX = dev(x, sizeof x), dZ = dev(z, sizeof z), dDY = dev(dy, sizeof dy), dY = dev(NULL, sizeof y);
  CUdeviceptr dDX = dev(NULL, sizeof dx), dDZ = dev(NULL, sizeof dz);
  CUdeviceptr dS = dev(scale, sizeof scale), dB = dev(bias, sizeof bias), dRM = dev(rmean, sizeof rmean);
  CUdeviceptr dRV = dev(rvar, sizeof rvar), dSM = dev(NULL, sizeof smean), dSI = dev(NULL, sizeof sinv);
  CUdeviceptr dDS = dev(NULL, sizeof dscale), dDB = dev(NULL, sizeof dbias);

  pydnnTensorDescriptor_t xd, bnd;
  pydnnCreateTensorDescriptor(&xd);
  pydnnCreateTensorDescriptor(&bnd);
  pydnnSetTensor4dDescriptor(xd, PYDNN_TENSOR_NHWC, PYDNN_DATA_FLOAT, N, C, H, W);
  pydnnStatus_t st = pydnnDeriveBNTensorDescriptor(bnd, xd, PYDNN_BATCHNORM_SPATIAL);
  pydnnDataType_t dt;
  int n_, c_, h_, w_, s0, s1, s2, s3;
  pydnnGetTensor4dDescriptor(bnd, &dt, &n_, &c_, &h_, &w_, &s0, &s1, &s2, &s3);
  CHECK(st == PYDNN_STATUS_SUCCESS && dt == PYDNN_DATA_FLOAT && n_ == 1 && c_ == C && h_ == 1 && w_ == 1, "derive");

  float one = 1.0f, zero = 0.0f;
  /* training forward */
  st = pydnnBatchNormalizationForwardTraining(h, PYDNN_BATCHNORM_SPATIAL, &one, &zero, xd, (void *)dX, xd, (void *)dY,
                                              bnd, (void *)dS, (void *)dB, 0.25, (void *)dRM, (void *)dRV, 1e-5,
                                              (void *)dSM, (void *)dSI);
  cuCtxSynchronize();
  cuMemcpyDtoH(y, dY, sizeof y);
  cuMemcpyDtoH(smean, dSM, sizeof smean);
  cuMemcpyDtoH(sinv, dSI, sizeof sinv);
  cuMemcpyDtoH(rmean, dRM, sizeof rmean);
  cuMemcpyDtoH(rvar, dRV, sizeof rvar);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++)
      for (int k = 0; k < HW; k++) {
        int i = at(n, c, k);
        want[i] = (x[i] - mean[c]) * invstd[c] * scale[c] + bias[c];
      }
  int ok = st == PYDNN_STATUS_SUCCESS && close_all(y, want, COUNT, 1e-5);
  double wm[C], wi[C], wrm[C], wrv[C];
  for (int c = 0; c < C; c++) {
    wm[c] = mean[c];
    wi[c] = invstd[c];
    wrm[c] = 0.25 * mean[c];
    wrv[c] = 0.75 + 0.25 * var[c] * M / (M - 1);
  }
  ok = ok && close_all(smean, wm, C, 1e-5) && close_all(sinv, wi, C, 1e-5) && close_all(rmean, wrm, C, 1e-5) &&
       close_all(rvar, wrv, C, 1e-5);
  CHECK(ok, "training forward");

  /* inference with the saved statistics as estimates (variance = 1 / invstd^2 - eps) */
  float evar[C];
  for (int c = 0; c < C; c++) evar[c] = (float)var[c];
  CUdeviceptr dEV = dev(evar, sizeof evar);
  st = pydnnBatchNormalizationForwardInference(h, PYDNN_BATCHNORM_SPATIAL, &one, &zero, xd, (void *)dX, xd,
                                               (void *)dY, bnd, (void *)dS, (void *)dB, (void *)dSM, (void *)dEV, 1e-5);
  cuCtxSynchronize();
  cuMemcpyDtoH(y, dY, sizeof y);
  CHECK(st == PYDNN_STATUS_SUCCESS && close_all(y, want, COUNT, 1e-5), "inference");

  /* backward with the saved statistics */
  for (int c = 0; c < C; c++) {
    double sg = 0, sb = 0;
    for (int n = 0; n < N; n++)
      for (int k = 0; k < HW; k++) {
        int i = at(n, c, k);
        sg += dy[i] * (x[i] - mean[c]) * invstd[c];
        sb += dy[i];
      }
    wds[c] = sg;
    wdb[c] = sb;
    for (int n = 0; n < N; n++)
      for (int k = 0; k < HW; k++) {
        int i = at(n, c, k);
        double xh = (x[i] - mean[c]) * invstd[c];
        want[i] = scale[c] * invstd[c] * (dy[i] - sb / M - xh * sg / M);
      }
  }
  st = pydnnBatchNormalizationBackward(h, PYDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero, xd, (void *)dX, xd,
                                       (void *)dDY, xd, (void *)dDX, bnd, (void *)dS, (void *)dDS, (void *)dDB, 1e-5,
                                       (void *)dSM, (void *)dSI);
  cuCtxSynchronize();
  cuMemcpyDtoH(dx, dDX, sizeof dx);
  cuMemcpyDtoH(dscale, dDS, sizeof dscale);
  cuMemcpyDtoH(dbias, dDB, sizeof dbias);
  CHECK(st == PYDNN_STATUS_SUCCESS && close_all(dx, want, COUNT, 1e-4) && close_all(dscale, wds, C, 1e-4) &&
            close_all(dbias, wdb, C, 1e-4),
        "backward");

  /* Ex: y = relu(bn(x) + z), mask in the reserve space; backward: dz and dx through the mask */
  pydnnActivationDescriptor_t act;
  pydnnCreateActivationDescriptor(&act);
  pydnnSetActivationDescriptor(act, PYDNN_ACTIVATION_RELU, PYDNN_NOT_PROPAGATE_NAN, 0.0);
  size_t wsf = 0, wsb = 0, rs = 0;
  st = pydnnGetBatchNormalizationForwardTrainingExWorkspaceSize(h, PYDNN_BATCHNORM_SPATIAL_PERSISTENT,
                                                                PYDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION, xd, xd, xd, bnd,
                                                                act, &wsf);
  st |= pydnnGetBatchNormalizationBackwardExWorkspaceSize(h, PYDNN_BATCHNORM_SPATIAL_PERSISTENT,
                                                          PYDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION, xd, xd, xd, xd, xd,
                                                          bnd, act, &wsb);
  st |= pydnnGetBatchNormalizationTrainingExReserveSpaceSize(h, PYDNN_BATCHNORM_SPATIAL_PERSISTENT,
                                                             PYDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION, act, xd, &rs);
  CHECK(st == PYDNN_STATUS_SUCCESS && wsf > 0 && wsb > 0 && rs == COUNT, "ex sizes");
  CUdeviceptr dW = dev(NULL, wsb > wsf ? wsb : wsf), dR = dev(NULL, rs);
  st = pydnnBatchNormalizationForwardTrainingEx(
      h, PYDNN_BATCHNORM_SPATIAL_PERSISTENT, PYDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION, &one, &zero, xd, (void *)dX, xd,
      (void *)dZ, xd, (void *)dY, bnd, (void *)dS, (void *)dB, 1.0, NULL, NULL, 1e-5, (void *)dSM, (void *)dSI, act,
      (void *)dW, wsf, (void *)dR, rs);
  cuCtxSynchronize();
  cuMemcpyDtoH(y, dY, sizeof y);
  static unsigned char mask[COUNT];
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++)
      for (int k = 0; k < HW; k++) {
        int i = at(n, c, k);
        double v = (x[i] - mean[c]) * invstd[c] * scale[c] + bias[c] + z[i];
        want[i] = v > 0 ? v : 0;
      }
  CHECK(st == PYDNN_STATUS_SUCCESS && close_all(y, want, COUNT, 1e-5), "training forward ex");
  /* backward Ex with the GPU's mask (an element on the edge of 0 may go either way) */
  unsigned char gmask[COUNT];
  cuMemcpyDtoH(gmask, dR, COUNT);
  for (int i = 0; i < COUNT; i++) mask[i] = gmask[i];
  for (int c = 0; c < C; c++) {
    double sg = 0, sb = 0;
    for (int n = 0; n < N; n++)
      for (int k = 0; k < HW; k++) {
        int i = at(n, c, k);
        double d = mask[i] ? dy[i] : 0.0;
        sg += d * (x[i] - mean[c]) * invstd[c];
        sb += d;
        wantz[i] = d;
      }
    wds[c] = sg;
    wdb[c] = sb;
    for (int n = 0; n < N; n++)
      for (int k = 0; k < HW; k++) {
        int i = at(n, c, k);
        double xh = (x[i] - mean[c]) * invstd[c];
        want[i] = scale[c] * invstd[c] * (wantz[i] - sb / M - xh * sg / M);
      }
  }
  st = pydnnBatchNormalizationBackwardEx(
      h, PYDNN_BATCHNORM_SPATIAL_PERSISTENT, PYDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION, &one, &zero, &one, &zero, xd,
      (void *)dX, xd, (void *)dY, xd, (void *)dDY, xd, (void *)dDZ, xd, (void *)dDX, bnd, (void *)dS, (void *)dB,
      (void *)dDS, (void *)dDB, 1e-5, NULL, NULL, act, (void *)dW, wsb, (void *)dR, rs);
  cuCtxSynchronize();
  cuMemcpyDtoH(dx, dDX, sizeof dx);
  cuMemcpyDtoH(dz, dDZ, sizeof dz);
  cuMemcpyDtoH(dscale, dDS, sizeof dscale);
  cuMemcpyDtoH(dbias, dDB, sizeof dbias);
  CHECK(st == PYDNN_STATUS_SUCCESS && close_all(dx, want, COUNT, 1e-4) && close_all(dz, wantz, COUNT, 1e-6) &&
            close_all(dscale, wds, C, 1e-4) && close_all(dbias, wdb, C, 1e-4),
        "backward ex");

  /* bad input: epsilon below PYDNN_BN_MIN_EPSILON, a workspace too small */
  char msg[256];
  st = pydnnBatchNormalizationForwardInference(h, PYDNN_BATCHNORM_SPATIAL, &one, &zero, xd, (void *)dX, xd,
                                               (void *)dY, bnd, (void *)dS, (void *)dB, (void *)dSM, (void *)dEV, -1.0);
  pydnnGetLastErrorString(msg, sizeof msg);
  CHECK(st == PYDNN_STATUS_BAD_PARAM && strstr(msg, "epsilon") != NULL, "epsilon below the minimum");
  st = pydnnBatchNormalizationForwardTrainingEx(
      h, PYDNN_BATCHNORM_SPATIAL, PYDNN_BATCHNORM_OPS_BN, &one, &zero, xd, (void *)dX, NULL, NULL, xd, (void *)dY, bnd,
      (void *)dS, (void *)dB, 1.0, NULL, NULL, 1e-5, NULL, NULL, NULL, (void *)dW, 1, NULL, 0);
  pydnnGetLastErrorString(msg, sizeof msg);
  CHECK(st == PYDNN_STATUS_BAD_PARAM && strstr(msg, "workSpaceSizeInBytes") != NULL, "workspace too small");
  pydnnDestroyActivationDescriptor(act);
  pydnnDestroyTensorDescriptor(xd);
  pydnnDestroyTensorDescriptor(bnd);
  pydnnDestroy(h);
  return failures ? 1 : 0;
}
