/* Shared by the C test programs that run on a GPU: the ok/FAIL line protocol the pytest wrappers read,
 * and the few CUDA driver calls they need for device memory. The driver is dlopen'ed, so a program links
 * only against libpydnn (with the flags `python -m pydnn config --cflags --libs` prints, plus -ldl -lm). */
#ifndef PYDNN_GPU_TEST_H
#define PYDNN_GPU_TEST_H
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pydnn.h>
#include "check.h"

typedef unsigned long long CUdeviceptr;
static int (*cuMemAlloc)(CUdeviceptr *, size_t);
static int (*cuMemFree)(CUdeviceptr);
static int (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
static int (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
static int (*cuCtxSynchronize)(void);


static void load_driver(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (!lib) { printf("FAIL no libcuda.so.1\n"); exit(2); }
  cuMemAlloc = (int (*)(CUdeviceptr *, size_t))dlsym(lib, "cuMemAlloc_v2");
  cuMemFree = (int (*)(CUdeviceptr))dlsym(lib, "cuMemFree_v2");
  cuMemcpyHtoD = (int (*)(CUdeviceptr, const void *, size_t))dlsym(lib, "cuMemcpyHtoD_v2");
  cuMemcpyDtoH = (int (*)(void *, CUdeviceptr, size_t))dlsym(lib, "cuMemcpyDtoH_v2");
  cuCtxSynchronize = (int (*)(void))dlsym(lib, "cuCtxSynchronize");
}
#endif
