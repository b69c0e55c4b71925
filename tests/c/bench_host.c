/* Host time of pydnn calls from C (tools/bench_host.py --c builds and runs it; tests/hard's CPU test runs
 * the descriptor part). Prints "c <call> <microseconds> us" lines. Without a GPU only the calls that need
 * none are timed (the C -> Python marshalling of a small call); with one, also pydnnActivationForward on a
 * 1-element tensor (driver dlopen'ed for the two buffers), and the floor under it: the driver's own
 * cuLaunchKernel of empty kernels (no parameter, and a 408-byte one like pydnn's MapParams) loaded from PTX.
 *
 * Two ways of timing each launch: "queued" is a loop of `calls` launches back to back (what a busy host loop
 * sees; once the GPU runs each tiny kernel slower than the host enqueues it, the queue fills and the loop
 * waits on the GPU, so this is max(host, GPU) per launch); "host" times bursts of 64 launches and synchronizes
 * between bursts outside the timed part, so the queue never fills: the host's own cost per launch. "gpu" is
 * the device's time per kernel over 2,000 back-to-back launches (events). Both on the legacy default stream
 * (stream 0, what a program that never sets one uses) and on a non-blocking stream.
 * Session 31: the floor's other forms (the parameter block through cuLaunchKernel's `extra`, the per-thread
 * default stream), and pydnnActivationForward with other calls that change nothing between two (a size query
 * and a Get: libpydnn's records stay in use - before session 31 every other C call made them stale), with
 * libpydnn's hit counter printed, so the fast path's use is measured, not assumed.
 * Usage: bench_host [calls] */
#define _GNU_SOURCE
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

/* bursts of 64 with a synchronize between them (not timed): the host's own cost per call */
#define TIME_HOST(label, calls, sync_stmt, stmt)                                  \
  do {                                                                            \
    for (int i_ = 0; i_ < 200; i_++) { stmt; }                                    \
    sync_stmt;                                                                    \
    double best_ = 1e30;                                                          \
    int bursts_ = (calls) / 64 > 0 ? (calls) / 64 : 1;                            \
    for (int r_ = 0; r_ < 5; r_++) {                                              \
      double tot_ = 0;                                                            \
      for (int b_ = 0; b_ < bursts_; b_++) {                                      \
        double t0_ = now_us();                                                    \
        for (int i_ = 0; i_ < 64; i_++) { stmt; }                                 \
        tot_ += now_us() - t0_;                                                   \
        sync_stmt;                                                                \
      }                                                                           \
      double us_ = tot_ / (bursts_ * 64);                                         \
      if (us_ < best_) best_ = us_;                                               \
    }                                                                             \
    printf("c %-48s %7.2f us\n", label, best_);                                   \
  } while (0)

/* one host-only reading (bursts of 64, synchronize between bursts, not timed) of a statement, for the
   alternating rounds below: the host's load moves during a run, so forms are compared round by round */
#define HOST_US(out, calls, sync_stmt, stmt)                                      \
  do {                                                                            \
    int bursts_ = (calls) / 64 > 0 ? (calls) / 64 : 1;                            \
    double tot_ = 0;                                                              \
    for (int i_ = 0; i_ < 64; i_++) { stmt; }                                     \
    sync_stmt;                                                                    \
    for (int b_ = 0; b_ < bursts_; b_++) {                                        \
      double t0_ = now_us();                                                      \
      for (int i_ = 0; i_ < 64; i_++) { stmt; }                                   \
      tot_ += now_us() - t0_;                                                     \
      sync_stmt;                                                                  \
    }                                                                             \
    (out) = tot_ / (bursts_ * 64);                                                \
  } while (0)

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef int (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                        void **, void **);
unsigned long long _pydnn_fast_hits(void); /* libpydnn's C fast path: calls answered without Python */

static const char *PTX =
    ".version 7.8\n.target sm_80\n.address_size 64\n"
    ".visible .entry pydnn_bench_k0()\n{\nret;\n}\n"
    ".visible .entry pydnn_bench_k408(.param .align 8 .b8 p[408])\n{\nret;\n}\n";

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
  unsigned long long hits0;
  TIME("pydnnActivationForward relu 1 elem", calls, pydnnActivationForward(h, a, &one, t, (void *)x, &zero, t, (void *)y));
  sync();
  TIME_HOST("pydnnActivationForward relu 1 elem [host]", calls, sync(),
            pydnnActivationForward(h, a, &one, t, (void *)x, &zero, t, (void *)y));
  hits0 = _pydnn_fast_hits();
  for (int i = 0; i < 1000; i++) pydnnActivationForward(h, a, &one, t, (void *)x, &zero, t, (void *)y);
  printf("c %-48s %7.3f\n", "fast-path hits per call (1000 calls)", (_pydnn_fast_hits() - hits0) / 1000.0);
  {
    void (*use_extra)(int) = (void (*)(int))dlsym(RTLD_DEFAULT, "_pydnn_fast_use_extra");
    if (use_extra) { /* libpydnn's fast path passing its parameter block through cuLaunchKernel's extra */
      use_extra(1);
      sync();
      TIME_HOST("pydnnActivationForward, params via extra [host]", calls, sync(),
                pydnnActivationForward(h, a, &one, t, (void *)x, &zero, t, (void *)y));
      hits0 = _pydnn_fast_hits();
      for (int i = 0; i < 1000; i++) pydnnActivationForward(h, a, &one, t, (void *)x, &zero, t, (void *)y);
      printf("c %-48s %7.3f\n", "fast-path hits per call, params via extra", (_pydnn_fast_hits() - hits0) / 1000.0);
      use_extra(0);
      sync();
    }
  }
  {
    int dims[8], strides[8], nb = 0;
    pydnnDataType_t dt;
    sync();
    hits0 = _pydnn_fast_hits();
    TIME("ActivationForward + GetTensorSizeInBytes + GetNd", calls / 4,
         (pydnnActivationForward(h, a, &one, t, (void *)x, &zero, t, (void *)y), pydnnGetTensorSizeInBytes(t, &size),
          pydnnGetTensorNdDescriptor(t, 8, &dt, &nb, dims, strides)));
    hits0 = _pydnn_fast_hits();
    for (int i = 0; i < 1000; i++) {
      pydnnActivationForward(h, a, &one, t, (void *)x, &zero, t, (void *)y);
      pydnnGetTensorSizeInBytes(t, &size);
      pydnnGetTensorNdDescriptor(t, 8, &dt, &nb, dims, strides);
    }
    printf("c %-48s %7.3f\n", "fast-path hits per ActivationForward (mixed)", (_pydnn_fast_hits() - hits0) / 1000.0);
    sync();
  }

  /* the floor: the driver's cuLaunchKernel of empty kernels, called through a pointer as libpydnn does */
  launch_t launch = (launch_t)dlsym(lib, "cuLaunchKernel");
  int (*load)(void **, const void *) = (int (*)(void **, const void *))dlsym(lib, "cuModuleLoadData");
  int (*getf)(void **, void *, const char *) = (int (*)(void **, void *, const char *))dlsym(lib, "cuModuleGetFunction");
  int (*screate)(void **, unsigned) = (int (*)(void **, unsigned))dlsym(lib, "cuStreamCreate");
  int (*ssync)(void *) = (int (*)(void *))dlsym(lib, "cuStreamSynchronize");
  int (*ecreate)(void **, unsigned) = (int (*)(void **, unsigned))dlsym(lib, "cuEventCreate");
  int (*erecord)(void *, void *) = (int (*)(void *, void *))dlsym(lib, "cuEventRecord");
  int (*esync)(void *) = (int (*)(void *))dlsym(lib, "cuEventSynchronize");
  void *el = dlsym(lib, "cuEventElapsedTime_v2");  /* CUDA 12.8+; the plain name before */
  int (*elapsed)(float *, void *, void *) = (int (*)(float *, void *, void *))(el ? el : dlsym(lib, "cuEventElapsedTime"));
  void *mod = NULL, *k0 = NULL, *k408 = NULL, *ns = NULL, *e0 = NULL, *e1 = NULL;
  if (!launch || !load || !getf || !screate || !ssync || load(&mod, PTX) || getf(&k0, mod, "pydnn_bench_k0") ||
      getf(&k408, mod, "pydnn_bench_k408") || screate(&ns, 1 /* CU_STREAM_NON_BLOCKING */)) {
    printf("c floor: the PTX kernels or the stream could not be made; floor not timed\n");
  } else {
    unsigned char pbuf[408] = {0};
    void *pargs[1] = {pbuf};
    void *s0 = NULL;
    TIME("cuLaunchKernel empty kernel, stream 0", calls, launch(k0, 1, 1, 1, 32, 1, 1, 0, s0, NULL, NULL));
    sync();
    TIME_HOST("cuLaunchKernel empty kernel, stream 0 [host]", calls, sync(),
              launch(k0, 1, 1, 1, 32, 1, 1, 0, s0, NULL, NULL));
    TIME("cuLaunchKernel 408-byte param, stream 0", calls, launch(k408, 1, 1, 1, 32, 1, 1, 0, s0, pargs, NULL));
    sync();
    TIME_HOST("cuLaunchKernel 408-byte param, stream 0 [host]", calls, sync(),
              launch(k408, 1, 1, 1, 32, 1, 1, 0, s0, pargs, NULL));
    {
      size_t psize = sizeof pbuf;
      void *extra[5] = {(void *)1 /* CU_LAUNCH_PARAM_BUFFER_POINTER */, pbuf, (void *)2 /* _SIZE */, &psize,
                        (void *)0 /* CU_LAUNCH_PARAM_END */};
      TIME("cuLaunchKernel 408-byte param via extra, stream 0", calls,
           launch(k408, 1, 1, 1, 32, 1, 1, 0, s0, NULL, extra));
      sync();
      TIME_HOST("cuLaunchKernel 408 via extra, stream 0 [host]", calls, sync(),
                launch(k408, 1, 1, 1, 32, 1, 1, 0, s0, NULL, extra));
      void *pts = (void *)2; /* CU_STREAM_PER_THREAD */
      TIME("cuLaunchKernel 408-byte param, per-thread stream", calls,
           launch(k408, 1, 1, 1, 32, 1, 1, 0, pts, pargs, NULL));
      sync();
      TIME_HOST("cuLaunchKernel 408, per-thread stream [host]", calls, sync(),
                launch(k408, 1, 1, 1, 32, 1, 1, 0, pts, pargs, NULL));
      TIME_HOST("cuLaunchKernel empty, non-blocking [host]", calls, ssync(ns),
                launch(k0, 1, 1, 1, 32, 1, 1, 0, ns, NULL, NULL));
    }
    TIME("cuLaunchKernel 408-byte param, non-blocking", calls, launch(k408, 1, 1, 1, 32, 1, 1, 0, ns, pargs, NULL));
    ssync(ns);
    TIME_HOST("cuLaunchKernel 408-byte param, non-blocking [host]", calls, ssync(ns),
              launch(k408, 1, 1, 1, 32, 1, 1, 0, ns, pargs, NULL));
    if (ecreate && erecord && esync && elapsed && !ecreate(&e0, 0) && !ecreate(&e1, 0)) {
      float ms = 0;
      for (int pass = 0; pass < 2; pass++) {
        void *s = pass ? ns : s0;
        erecord(e0, s);
        for (int i = 0; i < 2000; i++) launch(k408, 1, 1, 1, 32, 1, 1, 0, s, pargs, NULL);
        erecord(e1, s);
        esync(e1);
        elapsed(&ms, e0, e1);
        printf("c %-48s %7.2f us\n", pass ? "gpu time per empty kernel, non-blocking" : "gpu time per empty kernel, stream 0",
               ms * 1e3 / 2000);
      }
    }
    /* alternating rounds (argv[2], default 7), stream 0, host only: pydnn's fast path against the bare
       launches under it, each round timing every form once; medians and minima over rounds */
    {
      int rounds = argc > 2 ? atoi(argv[2]) : 7;
      if (rounds > 64) rounds = 64;
      const char *names[4] = {"pydnnActivationForward (fast path)", "cuLaunchKernel empty kernel",
                              "cuLaunchKernel 408-byte param", "cuLaunchKernel 408-byte via extra"};
      double v[4][64];
      size_t psize = sizeof pbuf;
      void *extra[5] = {(void *)1, pbuf, (void *)2, &psize, (void *)0};
      for (int r = 0; r < rounds; r++) {
        HOST_US(v[0][r], calls, sync(), pydnnActivationForward(h, a, &one, t, (void *)x, &zero, t, (void *)y));
        HOST_US(v[1][r], calls, sync(), launch(k0, 1, 1, 1, 32, 1, 1, 0, s0, NULL, NULL));
        HOST_US(v[2][r], calls, sync(), launch(k408, 1, 1, 1, 32, 1, 1, 0, s0, pargs, NULL));
        HOST_US(v[3][r], calls, sync(), launch(k408, 1, 1, 1, 32, 1, 1, 0, s0, NULL, extra));
        printf("c ab round %d: %.2f | %.2f | %.2f | %.2f us\n", r, v[0][r], v[1][r], v[2][r], v[3][r]);
      }
      for (int k = 0; k < 4 && rounds > 0; k++) {
        qsort(v[k], rounds, sizeof(double), cmp_double);
        char label[96];
        snprintf(label, sizeof label, "ab %s [host]", names[k]);
        printf("c %-48s %7.2f us (min %.2f)\n", label, v[k][rounds / 2], v[k][0]);
      }
    }
    /* pydnn's C fast path on the non-blocking stream (the first call after SetStream re-records) */
    if (pydnnSetStream(h, ns) == PYDNN_STATUS_SUCCESS &&
        pydnnActivationForward(h, a, &one, t, (void *)x, &zero, t, (void *)y) == PYDNN_STATUS_SUCCESS) {
      TIME("pydnnActivationForward, non-blocking stream", calls,
           pydnnActivationForward(h, a, &one, t, (void *)x, &zero, t, (void *)y));
      ssync(ns);
      TIME_HOST("pydnnActivationForward, non-blocking [host]", calls, ssync(ns),
                pydnnActivationForward(h, a, &one, t, (void *)x, &zero, t, (void *)y));
      if (e0 && e1) {
        float ms = 0;
        erecord(e0, ns);
        for (int i = 0; i < 2000; i++) pydnnActivationForward(h, a, &one, t, (void *)x, &zero, t, (void *)y);
        erecord(e1, ns);
        esync(e1);
        elapsed(&ms, e0, e1);
        printf("c %-48s %7.2f us\n", "gpu time per pydnn relu kernel, non-blocking", ms * 1e3 / 2000);
      }
    }
  }
  sync();
  pydnnDestroy(h);
  return 0;
}
