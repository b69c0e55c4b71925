/* The few CUDA runtime declarations tests/c/cudnn_compat_gpu.cpp uses, for machines whose CUDA runtime
 * comes from the nvidia-cuda-runtime wheel: its include/ lacks crt/host_config.h (shipped with nvcc), so
 * the real cuda_runtime.h cannot be compiled there. The program is unchanged and links against the real
 * libcudart; the test uses this folder only when no complete runtime header set is found. */
#ifndef PYDNN_TEST_CUDART_SHIM_H
#define PYDNN_TEST_CUDART_SHIM_H
#include <stddef.h>
#define __DRIVER_TYPES_H__ /* cudaStream_t below, as driver_types.h declares it */
#ifdef __cplusplus
extern "C" {
#endif
typedef int cudaError_t;
enum { cudaSuccess = 0 };
typedef enum { cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2,
               cudaMemcpyDeviceToDevice = 3, cudaMemcpyDefault = 4 } cudaMemcpyKind;
typedef struct CUstream_st *cudaStream_t;
cudaError_t cudaSetDevice(int device);
cudaError_t cudaFree(void *devPtr);
cudaError_t cudaMalloc(void **devPtr, size_t size);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, cudaMemcpyKind kind);
cudaError_t cudaStreamCreate(cudaStream_t *pStream);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
const char *cudaGetErrorString(cudaError_t error);
#ifdef __cplusplus
}
template <class T> static inline cudaError_t cudaMalloc(T **devPtr, size_t size) {
  return cudaMalloc((void **)devPtr, size);
}
#endif
#endif
