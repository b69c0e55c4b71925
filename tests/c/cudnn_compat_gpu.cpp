// A C++ program written against cuDNN, as its users write it: the CUDA runtime allocates (cudaMalloc) and
// makes its context current before cudnnCreate, cudnnFindConvolutionForwardAlgorithm picks the algorithm,
// the workspace is queried and allocated, and the result is checked on the CPU. Built unchanged against
// pydnn with  c++ prog.cpp -I<cuda runtime include> $(python -m pydnn config --cudnn-compat --cflags --libs)
// -lcudart. Prints ok / FAIL lines and "done".
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

static int failures = 0;
#define CHECK_CUDA(call)                                                                   \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("FAIL %s: %s\n", #call, cudaGetErrorString(e_));                         \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)
#define CHECK_CUDNN(call)                                                                  \
  do {                                                                                     \
    cudnnStatus_t s_ = (call);                                                             \
    if (s_ != CUDNN_STATUS_SUCCESS) {                                                      \
      char msg_[512];                                                                      \
      cudnnGetLastErrorString(msg_, sizeof msg_);                                          \
      std::printf("FAIL %s: %s (%s)\n", #call, cudnnGetErrorString(s_), msg_);            \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

int main() {
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaFree(0));  // the runtime creates and makes current its (primary) context
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  cudnnHandle_t handle;
  CHECK_CUDNN(cudnnCreate(&handle));
  CHECK_CUDNN(cudnnSetStream(handle, stream));

  const int N = 2, C = 3, H = 9, W = 7, K = 4, R = 3, S = 3;
  cudnnTensorDescriptor_t xDesc, yDesc;
  cudnnFilterDescriptor_t wDesc;
  cudnnConvolutionDescriptor_t convDesc;
  cudnnActivationDescriptor_t act;
  CHECK_CUDNN(cudnnCreateTensorDescriptor(&xDesc));
  CHECK_CUDNN(cudnnCreateTensorDescriptor(&yDesc));
  CHECK_CUDNN(cudnnCreateFilterDescriptor(&wDesc));
  CHECK_CUDNN(cudnnCreateConvolutionDescriptor(&convDesc));
  CHECK_CUDNN(cudnnCreateActivationDescriptor(&act));
  CHECK_CUDNN(cudnnSetTensor4dDescriptor(xDesc, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, N, C, H, W));
  CHECK_CUDNN(cudnnSetFilter4dDescriptor(wDesc, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, K, C, R, S));
  CHECK_CUDNN(cudnnSetConvolution2dDescriptor(convDesc, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  int n, k, oh, ow;
  CHECK_CUDNN(cudnnGetConvolution2dForwardOutputDim(convDesc, xDesc, wDesc, &n, &k, &oh, &ow));
  CHECK_CUDNN(cudnnSetTensor4dDescriptor(yDesc, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, k, oh, ow));
  CHECK_CUDNN(cudnnSetActivationDescriptor(act, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));

  std::vector<float> hx(N * C * H * W), hw(K * C * R * S), hy(n * k * oh * ow, -1.0f);
  for (size_t i = 0; i < hx.size(); i++) hx[i] = float(int(i * 7 % 13) - 6) / 8.0f;
  for (size_t i = 0; i < hw.size(); i++) hw[i] = float(int(i * 5 % 11) - 5) / 16.0f;
  float *dx, *dw, *dy;
  CHECK_CUDA(cudaMalloc(&dx, hx.size() * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&dw, hw.size() * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&dy, hy.size() * sizeof(float)));
  CHECK_CUDA(cudaMemcpy(dx, hx.data(), hx.size() * sizeof(float), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dw, hw.data(), hw.size() * sizeof(float), cudaMemcpyHostToDevice));

  int maxAlgos = 0, returned = 0;
  CHECK_CUDNN(cudnnGetConvolutionForwardAlgorithmMaxCount(handle, &maxAlgos));
  std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(maxAlgos);
  CHECK_CUDNN(cudnnFindConvolutionForwardAlgorithm(handle, xDesc, wDesc, convDesc, yDesc, maxAlgos, &returned,
                                                   perf.data()));
  int pick = -1;
  for (int i = 0; i < returned && pick < 0; i++)
    if (perf[i].status == CUDNN_STATUS_SUCCESS) pick = i;
  if (pick < 0) { std::printf("FAIL no algorithm found\n"); return 1; }
  cudnnConvolutionFwdAlgo_t algo = perf[pick].algo;
  std::printf("ok find: %d algorithms, fastest algo %d (%.3f ms)\n", returned, int(algo), perf[pick].time);
  size_t wsSize = 0;
  CHECK_CUDNN(cudnnGetConvolutionForwardWorkspaceSize(handle, xDesc, wDesc, convDesc, yDesc, algo, &wsSize));
  void *ws = nullptr;
  if (wsSize) CHECK_CUDA(cudaMalloc(&ws, wsSize));
  const float alpha = 1.0f, beta = 0.0f;
  CHECK_CUDNN(cudnnConvolutionForward(handle, &alpha, xDesc, dx, wDesc, dw, convDesc, algo, ws, wsSize, &beta, yDesc, dy));
  CHECK_CUDNN(cudnnActivationForward(handle, act, &alpha, yDesc, dy, &beta, yDesc, dy));  // in place
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaMemcpy(hy.data(), dy, hy.size() * sizeof(float), cudaMemcpyDeviceToHost));

  double worst = 0;
  for (int b = 0; b < N; b++)
    for (int o = 0; o < K; o++)
      for (int i = 0; i < oh; i++)
        for (int j = 0; j < ow; j++) {
          double acc = 0;
          for (int c = 0; c < C; c++)
            for (int r = 0; r < R; r++)
              for (int s = 0; s < S; s++) {
                int y = i + r - 1, x = j + s - 1;
                if (y < 0 || y >= H || x < 0 || x >= W) continue;
                acc += double(hx[((b * C + c) * H + y) * W + x]) * hw[((o * C + c) * R + r) * S + s];
              }
          double ref = acc > 0 ? acc : 0;
          double err = std::fabs(ref - hy[((b * K + o) * oh + i) * ow + j]) / (1.0 + std::fabs(ref));
          if (err > worst) worst = err;
        }
  if (worst < 1e-4) std::printf("ok convolution + relu match the CPU (worst relative error %.2e)\n", worst);
  else { std::printf("FAIL worst relative error %.2e\n", worst); failures++; }

  if (ws) CHECK_CUDA(cudaFree(ws));
  CHECK_CUDA(cudaFree(dx));
  CHECK_CUDA(cudaFree(dw));
  CHECK_CUDA(cudaFree(dy));
  CHECK_CUDNN(cudnnDestroyActivationDescriptor(act));
  CHECK_CUDNN(cudnnDestroyConvolutionDescriptor(convDesc));
  CHECK_CUDNN(cudnnDestroyFilterDescriptor(wDesc));
  CHECK_CUDNN(cudnnDestroyTensorDescriptor(yDesc));
  CHECK_CUDNN(cudnnDestroyTensorDescriptor(xDesc));
  CHECK_CUDNN(cudnnDestroy(handle));
  CHECK_CUDA(cudaStreamDestroy(stream));
  std::printf("%s\n", failures ? "FAILED" : "done");
  return failures ? 1 : 0;
}
