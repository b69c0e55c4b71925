/* The C face on a GPU: pydnn calls on device memory, checked against double-precision host math.
 * Device memory comes from the CUDA driver (dlopen'ed, so the program links only against libpydnn).
 * Prints "ok <what>" / "FAIL <what>" lines; exits non-zero on any failure. */
#include "gpu_test.h"



/* |got - want| / (|want| + 1): relative for large values, absolute near zero */
static double max_mixed_err(const double *got, const double *want, int n) {
  double worst = 0;
  for (int i = 0; i < n; i++) {
    double e = fabs(got[i] - want[i]) / (fabs(want[i]) + 1.0);
    if (!(e <= worst)) worst = e; /* NaN counts as worst */
  }
  return worst;
}

static double max_rel_err(const float *got, const double *want, int n) {
  double worst = 0;
  for (int i = 0; i < n; i++) {
    double e = fabs(got[i] - want[i]) / (fabs(want[i]) + 1e-30);
    if (!(e <= worst)) worst = e; /* NaN counts as worst */
  }
  return worst;
}

int main(void) {
  enum { N = 3, C = 37, H = 5, W = 7, COUNT = N * C * H * W };
  load_driver();
  pydnnHandle_t h;
  pydnnStatus_t st = pydnnCreate(&h); /* makes device 0's primary context current on this thread */
  CHECK(st == PYDNN_STATUS_SUCCESS, "create handle");
  if (st != PYDNN_STATUS_SUCCESS) return 1;
  static float x[COUNT], y[COUNT];
  static double want[COUNT];
  srand(12345);
  for (int i = 0; i < COUNT; i++) x[i] = (float)(6.0 * rand() / RAND_MAX - 3.0);
  CUdeviceptr dx, dy, dxd, dyd;
  static double xd[COUNT], yd[COUNT], y0[COUNT];
  for (int i = 0; i < COUNT; i++) {
    xd[i] = x[i];
    y0[i] = (double)(i % 17) - 8.0;
  }
  int cu = cuMemAlloc(&dx, sizeof x) | cuMemAlloc(&dy, sizeof y) | cuMemAlloc(&dxd, sizeof xd) | cuMemAlloc(&dyd, sizeof yd);
  cu |= cuMemcpyHtoD(dx, x, sizeof x) | cuMemcpyHtoD(dxd, xd, sizeof xd) | cuMemcpyHtoD(dyd, y0, sizeof y0);
  CHECK(cu == 0, "device memory from the driver");
  if (cu != 0) return 1;

  pydnnTensorDescriptor_t t;
  pydnnCreateTensorDescriptor(&t);
  pydnnSetTensor4dDescriptor(t, PYDNN_TENSOR_NCHW, PYDNN_DATA_FLOAT, N, C, H, W);
  pydnnActivationDescriptor_t a;
  pydnnCreateActivationDescriptor(&a);
  pydnnSetActivationDescriptor(a, PYDNN_ACTIVATION_SIGMOID, PYDNN_NOT_PROPAGATE_NAN, 0.0);
  float alpha = 2.0f, beta = 0.0f;
  st = pydnnActivationForward(h, a, &alpha, t, (void *)dx, &beta, t, (void *)dy);
  CHECK(st == PYDNN_STATUS_SUCCESS, "activation forward");
  cuCtxSynchronize();
  cuMemcpyDtoH(y, dy, sizeof y);
  for (int i = 0; i < COUNT; i++) want[i] = 2.0 / (1.0 + exp(-(double)x[i]));
  double err = max_rel_err(y, want, COUNT);
  printf("sigmoid max relative error %.3g\n", err);
  CHECK(err < 1e-5, "sigmoid numbers");

  st = pydnnActivationForward(h, a, &alpha, t, (void *)dx, &beta, t, NULL);
  CHECK(st == PYDNN_STATUS_BAD_PARAM_NULL_POINTER, "NULL y refused");

  /* softmax over C for each (n, h, w): NCHW, so the channel stride is H*W */
  st = pydnnSoftmaxForward(h, PYDNN_SOFTMAX_ACCURATE, PYDNN_SOFTMAX_MODE_CHANNEL, &alpha, t, (void *)dx, &beta, t,
                           (void *)dy);
  CHECK(st == PYDNN_STATUS_SUCCESS, "softmax forward");
  cuCtxSynchronize();
  cuMemcpyDtoH(y, dy, sizeof y);
  for (int n = 0; n < N; n++)
    for (int s = 0; s < H * W; s++) {
      double mx = -1e300, sum = 0;
      for (int c = 0; c < C; c++) mx = fmax(mx, x[(n * C + c) * H * W + s]);
      for (int c = 0; c < C; c++) sum += exp(x[(n * C + c) * H * W + s] - mx);
      for (int c = 0; c < C; c++) want[(n * C + c) * H * W + s] = 2.0 * exp(x[(n * C + c) * H * W + s] - mx) / sum;
    }
  err = max_rel_err(y, want, COUNT);
  printf("softmax max relative error %.3g\n", err);
  CHECK(err < 1e-5, "softmax numbers");
  CHECK(pydnnSoftmaxForward(h, (pydnnSoftmaxAlgorithm_t)7, PYDNN_SOFTMAX_MODE_CHANNEL, &alpha, t, (void *)dx, &beta, t,
                            (void *)dy) == PYDNN_STATUS_BAD_PARAM, "bad softmax algo");

  /* DOUBLE tensors: alpha and beta are read as double (cuDNN's rule); beta != 0 blends the old y */
  pydnnTensorDescriptor_t td;
  pydnnCreateTensorDescriptor(&td);
  pydnnSetTensor4dDescriptor(td, PYDNN_TENSOR_NCHW, PYDNN_DATA_DOUBLE, N, C, H, W);
  double alphad = 2.0, betad = 0.5;
  st = pydnnActivationForward(h, a, &alphad, td, (void *)dxd, &betad, td, (void *)dyd);
  CHECK(st == PYDNN_STATUS_SUCCESS, "activation forward (double)");
  cuCtxSynchronize();
  cuMemcpyDtoH(yd, dyd, sizeof yd);
  for (int i = 0; i < COUNT; i++) want[i] = 2.0 / (1.0 + exp(-xd[i])) + 0.5 * y0[i];
  err = max_mixed_err(yd, want, COUNT);
  printf("double alpha/beta max error %.3g\n", err);
  CHECK(err < 1e-12, "double alpha/beta numbers");

  /* SetTensor reads *valuePtr in y's data type */
  float vf = 1.25f;
  double vd = -3.5;
  st = pydnnSetTensor(h, t, (void *)dy, &vf);
  CHECK(st == PYDNN_STATUS_SUCCESS, "set tensor (float)");
  st = pydnnSetTensor(h, td, (void *)dyd, &vd);
  CHECK(st == PYDNN_STATUS_SUCCESS, "set tensor (double)");
  cuCtxSynchronize();
  cuMemcpyDtoH(y, dy, sizeof y);
  cuMemcpyDtoH(yd, dyd, sizeof yd);
  int bad = 0;
  for (int i = 0; i < COUNT; i++) bad += (y[i] != 1.25f) + (yd[i] != -3.5);
  CHECK(bad == 0, "set tensor numbers");

  cuMemFree(dx);
  cuMemFree(dy);
  cuMemFree(dxd);
  cuMemFree(dyd);
  pydnnDestroyTensorDescriptor(td);
  pydnnDestroyActivationDescriptor(a);
  pydnnDestroyTensorDescriptor(t);
  pydnnDestroy(h);
  printf("%d failures\n", failures);
  return failures != 0;
}
