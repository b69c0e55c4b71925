/* A program written against cuDNN's legacy API, as its users write it (cudnn.h, CHECK_CUDNN, cuDNN's
 * names only), built unchanged against pydnn with
 *     cc cudnn_compat_cpu.c $(python -m pydnn config --cudnn-compat --cflags --libs)
 * It runs without a GPU: descriptors, output dims, error strings and the last error; where cudnnCreate
 * succeeds (a GPU) it also asks for algorithms and a workspace size. Prints ok / FAIL lines. Also compiled
 * as C++ by the test. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cudnn.h>

#if CUDNN_MAJOR < 8
#error "needs cuDNN 8 or later"
#endif

static int failures = 0;
#define CHECK_CUDNN(call)                                                                 \
  do {                                                                                    \
    cudnnStatus_t status_ = (call);                                                       \
    if (status_ != CUDNN_STATUS_SUCCESS) {                                                \
      char msg_[256];                                                                     \
      cudnnGetLastErrorString(msg_, sizeof msg_);                                         \
      printf("FAIL %s: %s (%s)\n", #call, cudnnGetErrorString(status_), msg_);           \
      failures++;                                                                         \
    }                                                                                     \
  } while (0)
#define EXPECT(cond, what)                        \
  do {                                            \
    if (cond) {                                   \
      printf("ok %s\n", what);                    \
    } else {                                      \
      printf("FAIL %s\n", what);                  \
      failures++;                                 \
    }                                             \
  } while (0)

int main(void) {
  printf("cudnn version %zu (API level %d)\n", (size_t)cudnnGetVersion(), CUDNN_VERSION);
  cudnnTensorDescriptor_t xDesc, yDesc;
  cudnnFilterDescriptor_t wDesc;
  cudnnConvolutionDescriptor_t convDesc;
  cudnnPoolingDescriptor_t poolDesc;
  cudnnActivationDescriptor_t actDesc;
  CHECK_CUDNN(cudnnCreateTensorDescriptor(&xDesc));
  CHECK_CUDNN(cudnnCreateTensorDescriptor(&yDesc));
  CHECK_CUDNN(cudnnCreateFilterDescriptor(&wDesc));
  CHECK_CUDNN(cudnnCreateConvolutionDescriptor(&convDesc));
  CHECK_CUDNN(cudnnCreatePoolingDescriptor(&poolDesc));
  CHECK_CUDNN(cudnnCreateActivationDescriptor(&actDesc));

  CHECK_CUDNN(cudnnSetTensor4dDescriptor(xDesc, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 8, 3, 32, 32));
  CHECK_CUDNN(cudnnSetFilter4dDescriptor(wDesc, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 16, 3, 3, 3));
  CHECK_CUDNN(cudnnSetConvolution2dDescriptor(convDesc, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                              CUDNN_DATA_FLOAT));
  CHECK_CUDNN(cudnnSetConvolutionMathType(convDesc, CUDNN_DEFAULT_MATH));
  int n, c, h, w;
  CHECK_CUDNN(cudnnGetConvolution2dForwardOutputDim(convDesc, xDesc, wDesc, &n, &c, &h, &w));
  EXPECT(n == 8 && c == 16 && h == 32 && w == 32, "convolution output dims 8x16x32x32");
  CHECK_CUDNN(cudnnSetTensor4dDescriptor(yDesc, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, h, w));
  size_t bytes = 0;
  CHECK_CUDNN(cudnnGetTensorSizeInBytes(yDesc, &bytes));
  EXPECT(bytes == (size_t)8 * 16 * 32 * 32 * sizeof(float), "output size in bytes");

  cudnnDataType_t dt;
  int ns, cs, hs, ws;
  CHECK_CUDNN(cudnnGetTensor4dDescriptor(xDesc, &dt, &n, &c, &h, &w, &ns, &cs, &hs, &ws));
  EXPECT(dt == CUDNN_DATA_FLOAT && n == 8 && ns == 3 * 32 * 32 && ws == 1, "tensor descriptor round trip");

  CHECK_CUDNN(cudnnSetPooling2dDescriptor(poolDesc, CUDNN_POOLING_MAX, CUDNN_NOT_PROPAGATE_NAN, 2, 2, 0, 0, 2, 2));
  CHECK_CUDNN(cudnnGetPooling2dForwardOutputDim(poolDesc, xDesc, &n, &c, &h, &w));
  EXPECT(n == 8 && c == 3 && h == 16 && w == 16, "pooling output dims 8x3x16x16");

  CHECK_CUDNN(cudnnSetActivationDescriptor(actDesc, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
  cudnnActivationMode_t mode;
  cudnnNanPropagation_t nan;
  double coef = -1;
  CHECK_CUDNN(cudnnGetActivationDescriptor(actDesc, &mode, &nan, &coef));
  EXPECT(mode == CUDNN_ACTIVATION_RELU && nan == CUDNN_NOT_PROPAGATE_NAN && coef == 0.0, "activation round trip");

  /* errors: a status, cuDNN's status arithmetic, and the message naming the argument */
  cudnnStatus_t st = cudnnSetTensor4dDescriptor(xDesc, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 0, 3, 32, 32);
  char msg[256];
  cudnnGetLastErrorString(msg, sizeof msg);
  EXPECT(st == CUDNN_STATUS_BAD_PARAM, "n = 0 is CUDNN_STATUS_BAD_PARAM");
  EXPECT(strstr(msg, "n: 0") != NULL, "the last error names the argument");
  printf("message: %s\n", msg);
  EXPECT(CUDNN_STATUS_CATEGORY(CUDNN_STATUS_BAD_PARAM_NULL_POINTER) == CUDNN_STATUS_BAD_PARAM, "status category");
  EXPECT(strstr(cudnnGetErrorString(CUDNN_STATUS_NOT_SUPPORTED), "NOT_SUPPORTED") != NULL, "error string");

  cudnnHandle_t handle;
  st = cudnnCreate(&handle);
  if (st == CUDNN_STATUS_SUCCESS) {
    cudnnConvolutionFwdAlgoPerf_t perf[8];
    int returned = 0;
    CHECK_CUDNN(cudnnGetConvolutionForwardAlgorithm_v7(handle, xDesc, wDesc, convDesc, yDesc, 8, &returned, perf));
    EXPECT(returned > 0 && perf[0].status == CUDNN_STATUS_SUCCESS, "GetConvolutionForwardAlgorithm_v7");
    size_t wsSize = 1;
    CHECK_CUDNN(cudnnGetConvolutionForwardWorkspaceSize(handle, xDesc, wDesc, convDesc, yDesc, perf[0].algo, &wsSize));
    printf("ok workspace %zu bytes for algo %d\n", wsSize, (int)perf[0].algo);
    CHECK_CUDNN(cudnnDestroy(handle));
  } else {
    EXPECT(st == CUDNN_STATUS_NOT_INITIALIZED, "cudnnCreate without a GPU is NOT_INITIALIZED");
  }

  CHECK_CUDNN(cudnnDestroyActivationDescriptor(actDesc));
  CHECK_CUDNN(cudnnDestroyPoolingDescriptor(poolDesc));
  CHECK_CUDNN(cudnnDestroyConvolutionDescriptor(convDesc));
  CHECK_CUDNN(cudnnDestroyFilterDescriptor(wDesc));
  CHECK_CUDNN(cudnnDestroyTensorDescriptor(yDesc));
  CHECK_CUDNN(cudnnDestroyTensorDescriptor(xDesc));
  printf("%s\n", failures ? "FAILED" : "done");
  return failures ? 1 : 0;
}
