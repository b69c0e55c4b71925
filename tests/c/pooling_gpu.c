/* Pooling's C face on a GPU: max and average pooling forward / backward and adaptive average pooling on
 * float NCHW device memory, checked against double-precision host loops. Device memory comes from the CUDA
 * driver (dlopen'ed). Prints "ok <what>" / "FAIL <what>" lines; exits non-zero on any failure. */
#include "gpu_test.h"



enum { N = 2, C = 3, H = 7, W = 8, KH = 3, KW = 3, P = 1, S = 2, OH = 4, OW = 4 };
enum { XC = N * C * H * W, YC = N * C * OH * OW, AH = 3, AW = 5, AC = N * C * AH * AW };

static double max_err(const float *got, const double *want, int n) {
  double worst = 0;
  for (int i = 0; i < n; i++) {
    double e = fabs(got[i] - want[i]) / (fabs(want[i]) + 1.0);
    if (!(e <= worst)) worst = e; /* NaN counts as worst */
  }
  return worst;
}

int main(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) { printf("FAIL no libcuda.so.1\n"); return 2; }
  cuMemAlloc = (int (*)(CUdeviceptr *, size_t))dlsym(lib, "cuMemAlloc_v2");
  cuMemcpyHtoD = (int (*)(CUdeviceptr, const void *, size_t))dlsym(lib, "cuMemcpyHtoD_v2");
  cuMemcpyDtoH = (int (*)(void *, CUdeviceptr, size_t))dlsym(lib, "cuMemcpyDtoH_v2");
  cuCtxSynchronize = (int (*)(void))dlsym(lib, "cuCtxSynchronize");
  pydnnHandle_t h;
  CHECK(pydnnCreate(&h) == PYDNN_STATUS_SUCCESS, "create handle");

  static float x[XC], y[YC], dy[YC], dx[XC], ya[AC];
  static double want_y[YC], want_dx[XC], want_a[AC];
  srand(7);
  /* integers 0..4: many ties, so the max backward checks the first-maximum rule */
  for (int i = 0; i < XC; i++) x[i] = (float)(rand() % 5);
  for (int i = 0; i < YC; i++) dy[i] = (float)(rand() % 1000) / 250.0f - 2.0f;
  CUdeviceptr gx, gy, gdy, gdx, gya;
  int cu = cuMemAlloc(&gx, sizeof x) | cuMemAlloc(&gy, sizeof y) | cuMemAlloc(&gdy, sizeof dy) |
           cuMemAlloc(&gdx, sizeof dx) | cuMemAlloc(&gya, sizeof ya);
  cu |= cuMemcpyHtoD(gx, x, sizeof x) | cuMemcpyHtoD(gdy, dy, sizeof dy);
  CHECK(cu == 0, "device memory from the driver");
  if (cu) return 1;

  pydnnTensorDescriptor_t xd, yd, ad;
  pydnnCreateTensorDescriptor(&xd);
  pydnnCreateTensorDescriptor(&yd);
  pydnnCreateTensorDescriptor(&ad);
  pydnnSetTensor4dDescriptor(xd, PYDNN_TENSOR_NCHW, PYDNN_DATA_FLOAT, N, C, H, W);
  pydnnPoolingDescriptor_t pd;
  pydnnCreatePoolingDescriptor(&pd);
  pydnnSetPooling2dDescriptor(pd, PYDNN_POOLING_MAX_DETERMINISTIC, PYDNN_NOT_PROPAGATE_NAN, KH, KW, P, P, S, S);
  int n, c, oh, ow;
  pydnnGetPooling2dForwardOutputDim(pd, xd, &n, &c, &oh, &ow);
  CHECK(n == N && c == C && oh == OH && ow == OW, "output dims");
  pydnnSetTensor4dDescriptor(yd, PYDNN_TENSOR_NCHW, PYDNN_DATA_FLOAT, N, C, OH, OW);

  /* host reference: window bounds, first maximum, counts without padding */
  int arg[YC];
  for (int p = 0; p < N * C; p++)
    for (int i = 0; i < OH; i++)
      for (int j = 0; j < OW; j++) {
        int h0 = i * S - P, w0 = j * S - P, best = -1;
        for (int r = h0; r < h0 + KH; r++)
          for (int s = w0; s < w0 + KW; s++)
            if (r >= 0 && r < H && s >= 0 && s < W && (best < 0 || x[p * H * W + r * W + s] > x[best]))
              best = p * H * W + r * W + s;
        arg[(p * OH + i) * OW + j] = best;
        want_y[(p * OH + i) * OW + j] = x[best];
      }
  float one = 1.0f, zero = 0.0f;
  CHECK(pydnnPoolingForward(h, pd, &one, xd, (void *)gx, &zero, yd, (void *)gy) == PYDNN_STATUS_SUCCESS, "max forward");
  cuCtxSynchronize();
  cuMemcpyDtoH(y, gy, sizeof y);
  CHECK(max_err(y, want_y, YC) == 0, "max forward numbers");

  memset(want_dx, 0, sizeof want_dx);
  for (int o = 0; o < YC; o++) want_dx[arg[o]] += dy[o];
  CHECK(pydnnPoolingBackward(h, pd, &one, yd, (void *)gy, yd, (void *)gdy, xd, (void *)gx, &zero, xd, (void *)gdx) ==
            PYDNN_STATUS_SUCCESS, "max backward");
  cuCtxSynchronize();
  cuMemcpyDtoH(dx, gdx, sizeof dx);
  CHECK(max_err(dx, want_dx, XC) < 1e-6, "max backward numbers");

  /* average (padding excluded), backward with alpha 2 */
  pydnnSetPooling2dDescriptor(pd, PYDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING, PYDNN_NOT_PROPAGATE_NAN, KH, KW, P, P, S, S);
  memset(want_dx, 0, sizeof want_dx);
  for (int p = 0; p < N * C; p++)
    for (int i = 0; i < OH; i++)
      for (int j = 0; j < OW; j++) {
        int h0 = i * S - P, w0 = j * S - P, cnt = 0;
        for (int r = h0; r < h0 + KH; r++)
          for (int s = w0; s < w0 + KW; s++) cnt += r >= 0 && r < H && s >= 0 && s < W;
        for (int r = h0; r < h0 + KH; r++)
          for (int s = w0; s < w0 + KW; s++)
            if (r >= 0 && r < H && s >= 0 && s < W) want_dx[p * H * W + r * W + s] += 2.0 * dy[(p * OH + i) * OW + j] / cnt;
      }
  float two = 2.0f;
  CHECK(pydnnPoolingBackward(h, pd, &two, yd, (void *)gy, yd, (void *)gdy, xd, (void *)gx, &zero, xd, (void *)gdx) ==
            PYDNN_STATUS_SUCCESS, "average backward");
  cuCtxSynchronize();
  cuMemcpyDtoH(dx, gdx, sizeof dx);
  CHECK(max_err(dx, want_dx, XC) < 1e-6, "average backward numbers");

  /* adaptive average to 3 x 5: windows [floor(o*in/out), ceil((o+1)*in/out)) */
  pydnnSetTensor4dDescriptor(ad, PYDNN_TENSOR_NCHW, PYDNN_DATA_FLOAT, N, C, AH, AW);
  for (int p = 0; p < N * C; p++)
    for (int i = 0; i < AH; i++)
      for (int j = 0; j < AW; j++) {
        int r0 = i * H / AH, r1 = ((i + 1) * H + AH - 1) / AH, s0 = j * W / AW, s1 = ((j + 1) * W + AW - 1) / AW;
        double sum = 0;
        for (int r = r0; r < r1; r++)
          for (int s = s0; s < s1; s++) sum += x[p * H * W + r * W + s];
        want_a[(p * AH + i) * AW + j] = sum / ((r1 - r0) * (s1 - s0));
      }
  CHECK(pydnnAdaptivePoolingForward(h, PYDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING, PYDNN_NOT_PROPAGATE_NAN, &one, xd,
                                    (void *)gx, &zero, ad, (void *)gya) == PYDNN_STATUS_SUCCESS, "adaptive forward");
  cuCtxSynchronize();
  cuMemcpyDtoH(ya, gya, sizeof ya);
  CHECK(max_err(ya, want_a, AC) < 1e-6, "adaptive forward numbers");

  /* y dims that are not the pooled dims: BAD_PARAM naming yDesc */
  char msg[512];
  pydnnStatus_t st = pydnnPoolingForward(h, pd, &one, xd, (void *)gx, &zero, ad, (void *)gya);
  pydnnGetLastErrorString(msg, sizeof msg);
  CHECK(st == PYDNN_STATUS_BAD_PARAM && strstr(msg, "yDesc: dims") != NULL, "wrong y dims refused");
  pydnnDestroyPoolingDescriptor(pd);
  pydnnDestroy(h);
  return failures ? 1 : 0;
}
