/* Host time of pydnn calls from C (tools/bench_host.py --c builds and runs it; tests/hard's CPU test runs
 * the descriptor part). Prints "c <call> <microseconds> us" lines. Without a GPU only the calls that need
 * none are timed (the C -> Python marshalling of a small call); with one, also pydnnActivationForward on a
 * 1-element tensor (driver dlopen'ed for the two buffers). Usage: bench_host [calls] */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <pydnn.h>

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

#define TIME(label, calls, stmt)                                                  \
  do {                                                                            \
    for (int i_ = 0; i_ < 200; i_++) { stmt; }                                    \
    double best_ = 1e30;                                                          \
    for (int r_ = 0; r_ < 5; r_++) {                                              \
      double t0_ = now_us();                                                      \
      for (int i_ = 0; i_ < (calls); i_++) { stmt; }                              \
      double us_ = (now_us() - t0_) / (calls);                                    \
      if (us_ < best_) best_ = us_;                                               \
    }                                                                             \
    printf("c %-48s %7.2f us\n", label, best_);                                   \
  } while (0)

int main(int argc, char **argv) {
  int calls = argc > 1 ? atoi(argv[1]) : 20000;
  pydnnTensorDescriptor_t t;
  size_t size = 0;
  if (pydnnCreateTensorDescriptor(&t) != PYDNN_STATUS_SUCCESS) { printf("FAIL create\n"); return 1; }
  if (pydnnSetTensor4dDescriptor(t, PYDNN_TENSOR_NCHW, PYDNN_DATA_FLOAT, 1, 1, 1, 1) != PYDNN_STATUS_SUCCESS) {
    printf("FAIL set\n");
    return 1;
  }
  TIME("pydnnGetTensorSizeInBytes", calls, pydnnGetTensorSizeInBytes(t, &size));
  TIME("pydnnSetTensor4dDescriptor", calls,
       pydnnSetTensor4dDescriptor(t, PYDNN_TENSOR_NCHW, PYDNN_DATA_FLOAT, 1, 1, 1, 1));
  if (size != 4) { printf("FAIL size %zu\n", size); return 1; }

  pydnnHandle_t h;
  if (pydnnCreate(&h) != PYDNN_STATUS_SUCCESS) {
    printf("c no GPU: launch calls not timed\n");
    return 0;
  }
  void *lib = dlopen("libcuda.so.1", RTLD_NOW);
  int (*mem_alloc)(unsigned long long *, size_t) =
      lib ? (int (*)(unsigned long long *, size_t))dlsym(lib, "cuMemAlloc_v2") : NULL;
  int (*sync)(void) = lib ? (int (*)(void))dlsym(lib, "cuCtxSynchronize") : NULL;
  unsigned long long x = 0, y = 0;
  if (!mem_alloc || mem_alloc(&x, 256) || mem_alloc(&y, 256)) { printf("FAIL cuMemAlloc\n"); return 1; }
  pydnnActivationDescriptor_t a;
  pydnnCreateActivationDescriptor(&a);
  pydnnSetActivationDescriptor(a, PYDNN_ACTIVATION_RELU, PYDNN_NOT_PROPAGATE_NAN, 0.0);
  float one = 1.0f, zero = 0.0f;
  pydnnStatus_t st = pydnnActivationForward(h, a, &one, t, (void *)x, &zero, t, (void *)y);
  if (st != PYDNN_STATUS_SUCCESS) {
    char msg[256];
    pydnnGetLastErrorString(msg, sizeof msg);
    printf("FAIL activation: %s\n", msg);
    return 1;
  }
  TIME("pydnnActivationForward relu 1 elem", calls, pydnnActivationForward(h, a, &one, t, (void *)x, &zero, t, (void *)y));
  sync();
  pydnnDestroy(h);
  return 0;
}
