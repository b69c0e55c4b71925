/* Convolution from C: descriptors and shape queries, errors with their messages, algorithm counts, and a
 * 2-d forward / backward data / backward filter (ALGO_1, with its workspace) / backward bias on device
 * memory, checked against double-precision loops. Device memory comes from the CUDA driver (dlopen'ed).
 * Prints "ok <what>" / "FAIL <what>" lines; exits non-zero on any failure. */
#include "gpu_test.h"



/* the problem: x (N, C, H, W), w (K, C, R, S), pad 1, stride 2, dilation 1, cross-correlation, NCHW */
enum { N = 2, C = 5, H = 9, W = 8, K = 6, R = 3, S = 3, PAD = 1, STR = 2 };
enum { P = (H + 2 * PAD - R) / STR + 1, Q = (W + 2 * PAD - S) / STR + 1 };
static float x[N * C * H * W], w[K * C * R * S], y[N * K * P * Q], dy[N * K * P * Q];
static float dx[N * C * H * W], dw[K * C * R * S], db[K];
static double ry[N * K * P * Q], rdx[N * C * H * W], rdw[K * C * R * S], rdb[K];

static void reference(void) {
  memset(ry, 0, sizeof ry);
  memset(rdx, 0, sizeof rdx);
  memset(rdw, 0, sizeof rdw);
  memset(rdb, 0, sizeof rdb);
  for (int n = 0; n < N; n++)
    for (int k = 0; k < K; k++)
      for (int p = 0; p < P; p++)
        for (int q = 0; q < Q; q++) {
          int yi = ((n * K + k) * P + p) * Q + q;
          rdb[k] += dy[yi];
          for (int c = 0; c < C; c++)
            for (int r = 0; r < R; r++)
              for (int s = 0; s < S; s++) {
                int h = p * STR - PAD + r, ww = q * STR - PAD + s;
                if (h < 0 || h >= H || ww < 0 || ww >= W) continue;
                int xi = ((n * C + c) * H + h) * W + ww, wi = ((k * C + c) * R + r) * S + s;
                ry[yi] += (double)x[xi] * w[wi];
                rdx[xi] += (double)dy[yi] * w[wi];
                rdw[wi] += (double)dy[yi] * x[xi];
              }
        }
}

static double max_err(const float *got, const double *want, int n) {
  double worst = 0;
  for (int i = 0; i < n; i++) {
    double e = fabs(got[i] - want[i]) / (fabs(want[i]) + 1.0);
    if (!(e <= worst)) worst = e; /* NaN counts as worst */
  }
  return worst;
}

int main(void) {
  char msg[512];

  /* descriptors */
  pydnnConvolutionDescriptor_t cd;
  CHECK(pydnnCreateConvolutionDescriptor(&cd) == PYDNN_STATUS_SUCCESS, "create convolution descriptor");
  CHECK(pydnnSetConvolution2dDescriptor(cd, PAD, PAD, STR, STR, 1, 1, PYDNN_CROSS_CORRELATION, PYDNN_DATA_FLOAT) ==
            PYDNN_STATUS_SUCCESS, "set 2d descriptor");
  int ph, pw, u, v, dh, dwl;
  pydnnConvolutionMode_t mode;
  pydnnDataType_t ct;
  CHECK(pydnnGetConvolution2dDescriptor(cd, &ph, &pw, &u, &v, &dh, &dwl, &mode, &ct) == PYDNN_STATUS_SUCCESS &&
            ph == PAD && pw == PAD && u == STR && v == STR && dh == 1 && dwl == 1 &&
            mode == PYDNN_CROSS_CORRELATION && ct == PYDNN_DATA_FLOAT, "get 2d descriptor");
  int len, pads[3] = {-1, -1, -1}, strides[3], dils[3];
  CHECK(pydnnGetConvolutionNdDescriptor(cd, 3, &len, pads, strides, dils, &mode, &ct) == PYDNN_STATUS_SUCCESS &&
            len == 2 && pads[0] == PAD && strides[1] == STR && dils[1] == 1 && pads[2] == -1, "get nd descriptor");
  int bad_pad[2] = {0, -1}, one[2] = {1, 1};
  CHECK(pydnnSetConvolutionNdDescriptor(cd, 2, bad_pad, one, one, PYDNN_CONVOLUTION, PYDNN_DATA_FLOAT) ==
            PYDNN_STATUS_BAD_PARAM, "negative pad refused");
  pydnnGetLastErrorString(msg, sizeof msg);
  CHECK(strstr(msg, "padA[1]") != NULL, "message names padA[1]");
  int groups = 0;
  pydnnSetConvolutionGroupCount(cd, 1);
  CHECK(pydnnGetConvolutionGroupCount(cd, &groups) == PYDNN_STATUS_SUCCESS && groups == 1, "group count");
  pydnnMathType_t mt;
  pydnnSetConvolutionMathType(cd, PYDNN_FMA_MATH);
  CHECK(pydnnGetConvolutionMathType(cd, &mt) == PYDNN_STATUS_SUCCESS && mt == PYDNN_FMA_MATH, "math type");

  pydnnTensorDescriptor_t xd, yd, bd;
  pydnnFilterDescriptor_t wd;
  pydnnCreateTensorDescriptor(&xd);
  pydnnCreateTensorDescriptor(&yd);
  pydnnCreateTensorDescriptor(&bd);
  pydnnCreateFilterDescriptor(&wd);
  pydnnSetTensor4dDescriptor(xd, PYDNN_TENSOR_NCHW, PYDNN_DATA_FLOAT, N, C, H, W);
  pydnnSetFilter4dDescriptor(wd, PYDNN_DATA_FLOAT, PYDNN_TENSOR_NCHW, K, C, R, S);
  pydnnSetTensor4dDescriptor(bd, PYDNN_TENSOR_NCHW, PYDNN_DATA_FLOAT, 1, K, 1, 1);
  int on, oc, oh, ow, dims[4];
  CHECK(pydnnGetConvolution2dForwardOutputDim(cd, xd, wd, &on, &oc, &oh, &ow) == PYDNN_STATUS_SUCCESS && on == N &&
            oc == K && oh == P && ow == Q, "2d output dims");
  CHECK(pydnnGetConvolutionNdForwardOutputDim(cd, xd, wd, 4, dims) == PYDNN_STATUS_SUCCESS && dims[2] == P &&
            dims[3] == Q, "nd output dims");
  /* the rest needs a GPU (on a machine without one: the descriptor checks above only) */
  pydnnHandle_t h;
  if (pydnnCreate(&h) != PYDNN_STATUS_SUCCESS) {
    printf("no GPU: %s\n", failures ? "descriptor checks FAILED" : "descriptor checks passed");
    return failures ? 1 : 3;
  }
  load_driver();
  pydnnSetTensor4dDescriptor(yd, PYDNN_TENSOR_NCHW, PYDNN_DATA_FLOAT, N, K, P, Q + 1);
  size_t ws_size = 1;
  CHECK(pydnnGetConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd, PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
                                                &ws_size) == PYDNN_STATUS_BAD_PARAM, "wrong y dims refused");
  pydnnGetLastErrorString(msg, sizeof msg);
  CHECK(strstr(msg, "yDesc: dims") != NULL, "message names yDesc");
  pydnnSetTensor4dDescriptor(yd, PYDNN_TENSOR_NCHW, PYDNN_DATA_FLOAT, N, K, P, Q);
  CHECK(pydnnGetConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd, PYDNN_CONVOLUTION_FWD_ALGO_FFT, &ws_size) ==
            PYDNN_STATUS_NOT_SUPPORTED, "FFT not supported");
  int count = 0;
  CHECK(pydnnGetConvolutionForwardAlgorithmMaxCount(h, &count) == PYDNN_STATUS_SUCCESS && count == 8, "fwd max count");
  CHECK(pydnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &count) == PYDNN_STATUS_SUCCESS && count == 7,
        "bwd filter max count");

  /* numbers */
  srand(7);
  for (int i = 0; i < N * C * H * W; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
  for (int i = 0; i < K * C * R * S; i++) w[i] = (float)rand() / RAND_MAX - 0.5f;
  for (int i = 0; i < N * K * P * Q; i++) dy[i] = (float)rand() / RAND_MAX - 0.5f;
  reference();
  CUdeviceptr gx, gw, gy, gdy, gdx, gdw, gdb, gws;
  cuMemAlloc(&gx, sizeof x);
  cuMemAlloc(&gw, sizeof w);
  cuMemAlloc(&gy, sizeof y);
  cuMemAlloc(&gdy, sizeof dy);
  cuMemAlloc(&gdx, sizeof dx);
  cuMemAlloc(&gdw, sizeof dw);
  cuMemAlloc(&gdb, sizeof db);
  cuMemcpyHtoD(gx, x, sizeof x);
  cuMemcpyHtoD(gw, w, sizeof w);
  cuMemcpyHtoD(gdy, dy, sizeof dy);
  float one_f = 1.0f, zero_f = 0.0f;
  CHECK(pydnnConvolutionForward(h, &one_f, xd, (void *)gx, wd, (void *)gw, cd, PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
                                NULL, 0, &zero_f, yd, (void *)gy) == PYDNN_STATUS_SUCCESS, "forward runs");
  CHECK(pydnnConvolutionBackwardData(h, &one_f, wd, (void *)gw, yd, (void *)gdy, cd,
                                     PYDNN_CONVOLUTION_BWD_DATA_ALGO_0, NULL, 0, &zero_f, xd, (void *)gdx) ==
            PYDNN_STATUS_SUCCESS, "backward data runs");
  CHECK(pydnnGetConvolutionBackwardFilterWorkspaceSize(h, xd, yd, cd, wd, PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1,
                                                       &ws_size) == PYDNN_STATUS_SUCCESS, "bwd filter workspace size");
  cuMemAlloc(&gws, ws_size ? ws_size : 1);
  if (ws_size > 0) {
    CHECK(pydnnConvolutionBackwardFilter(h, &one_f, xd, (void *)gx, yd, (void *)gdy, cd,
                                         PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1, (void *)gws, ws_size - 1, &zero_f, wd,
                                         (void *)gdw) == PYDNN_STATUS_BAD_PARAM, "small workspace refused");
  }
  CHECK(pydnnConvolutionBackwardFilter(h, &one_f, xd, (void *)gx, yd, (void *)gdy, cd,
                                       PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1, (void *)gws, ws_size, &zero_f, wd,
                                       (void *)gdw) == PYDNN_STATUS_SUCCESS, "backward filter runs");
  CHECK(pydnnConvolutionBackwardBias(h, &one_f, yd, (void *)gdy, &zero_f, bd, (void *)gdb) == PYDNN_STATUS_SUCCESS,
        "backward bias runs");
  /* algorithm selection through the perf structs */
  pydnnConvolutionFwdAlgoPerf_t fperf[8];
  int returned = -1;
  CHECK(pydnnGetConvolutionForwardAlgorithm_v7(h, xd, wd, cd, yd, 8, &returned, fperf) == PYDNN_STATUS_SUCCESS &&
            returned == 8 && fperf[0].algo == PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM &&
            fperf[0].status == PYDNN_STATUS_SUCCESS && fperf[0].determinism == PYDNN_DETERMINISTIC &&
            fperf[7].status == PYDNN_STATUS_NOT_SUPPORTED, "forward v7 perf records");
  CHECK(pydnnGetConvolutionForwardAlgorithm_v7(h, xd, wd, cd, yd, 2, &returned, fperf) == PYDNN_STATUS_SUCCESS &&
            returned == 2, "v7 returns at most requestedAlgoCount");
  pydnnConvolutionBwdFilterAlgoPerf_t wperf[7];
  CHECK(pydnnFindConvolutionBackwardFilterAlgorithmEx(h, xd, (void *)gx, yd, (void *)gdy, cd, wd, (void *)gdw, 7,
                                                      &returned, wperf, (void *)gws, ws_size) ==
            PYDNN_STATUS_SUCCESS && returned == 7 && wperf[0].status == PYDNN_STATUS_SUCCESS && wperf[0].time > 0 &&
            wperf[1].status == PYDNN_STATUS_SUCCESS && wperf[2].status == PYDNN_STATUS_NOT_SUPPORTED,
        "backward filter FindEx perf records");
  pydnnConvolutionBwdDataAlgoPerf_t dperf[6];
  CHECK(pydnnFindConvolutionBackwardDataAlgorithmEx(h, wd, (void *)gw, yd, (void *)gdy, cd, xd, (void *)gdx, 6,
                                                    &returned, dperf, NULL, 0) == PYDNN_STATUS_SUCCESS &&
            returned == 6 && dperf[0].algo == PYDNN_CONVOLUTION_BWD_DATA_ALGO_0 && dperf[0].time > 0,
        "backward data FindEx perf records");
  /* FindEx overwrote dx and dw: run the ops again for the numbers */
  pydnnConvolutionBackwardData(h, &one_f, wd, (void *)gw, yd, (void *)gdy, cd, PYDNN_CONVOLUTION_BWD_DATA_ALGO_0, NULL,
                               0, &zero_f, xd, (void *)gdx);
  pydnnConvolutionBackwardFilter(h, &one_f, xd, (void *)gx, yd, (void *)gdy, cd, PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1,
                                 (void *)gws, ws_size, &zero_f, wd, (void *)gdw);
  cuCtxSynchronize();
  cuMemcpyDtoH(y, gy, sizeof y);
  cuMemcpyDtoH(dx, gdx, sizeof dx);
  cuMemcpyDtoH(dw, gdw, sizeof dw);
  cuMemcpyDtoH(db, gdb, sizeof db);
  CHECK(max_err(y, ry, N * K * P * Q) < 1e-5, "forward numbers");
  CHECK(max_err(dx, rdx, N * C * H * W) < 1e-5, "backward data numbers");
  CHECK(max_err(dw, rdw, K * C * R * S) < 1e-5, "backward filter numbers");
  CHECK(max_err(db, rdb, K) < 1e-5, "backward bias numbers");
  cuMemFree(gx);
  cuMemFree(gw);
  cuMemFree(gy);
  cuMemFree(gdy);
  cuMemFree(gdx);
  cuMemFree(gdw);
  cuMemFree(gdb);
  cuMemFree(gws);
  pydnnDestroyConvolutionDescriptor(cd);
  pydnnDestroyTensorDescriptor(xd);
  pydnnDestroyTensorDescriptor(yd);
  pydnnDestroyTensorDescriptor(bd);
  pydnnDestroyFilterDescriptor(wd);
  pydnnDestroy(h);
  return failures ? 1 : 0;
}
