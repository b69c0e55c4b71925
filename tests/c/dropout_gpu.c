/* Dropout from C on a GPU: Set / Get / the size queries / forward / backward on device memory, the mask
 * checked bit for bit against a Philox-4x32-10 written here from the published algorithm (a third
 * implementation next to ptx/common/philox.cuh and pydnn/reference/dropout.py), the values against double
 * math, the states' offset advancing, and bad arguments refused with their names in the message.
 * Device memory comes from the CUDA driver (dlopen'ed). Prints "ok <what>" / "FAIL <what>" lines. */
#include "gpu_test.h"



static void philox(unsigned c[4], unsigned k0, unsigned k1) {
  for (int r = 0; r < 10; r++) {
    if (r) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
    unsigned long long p0 = 0xD2511F53ull * c[0], p1 = 0xCD9E8D57ull * c[2];
    unsigned n0 = (unsigned)(p1 >> 32) ^ c[1] ^ k0, n2 = (unsigned)(p0 >> 32) ^ c[3] ^ k1;
    c[0] = n0; c[1] = (unsigned)p1; c[2] = n2; c[3] = (unsigned)p0;
  }
}

/* keep bit of element i of stream (seed, offset) at threshold thr */
static int keep(unsigned long long seed, unsigned long long offset, long long i, unsigned thr) {
  unsigned long long g = (unsigned long long)i >> 3;
  unsigned c[4] = {(unsigned)g, (unsigned)(g >> 32), (unsigned)offset, (unsigned)(offset >> 32)};
  philox(c, (unsigned)seed, (unsigned)(seed >> 32));
  int j = (int)(i & 7);
  unsigned slice = (c[j / 2] >> (16 * (j % 2))) & 0xFFFFu;
  return slice >= thr;
}

static int msg_has(const char *needle) {
  char msg[512];
  pydnnGetLastErrorString(msg, sizeof msg);
  return strstr(msg, needle) != NULL;
}

int main(void) {
  enum { N = 3, C = 37, H = 5, W = 7, COUNT = N * C * H * W, NB = (COUNT + 7) / 8 };
  load_driver();
  pydnnHandle_t h;
  pydnnStatus_t st = pydnnCreate(&h);
  CHECK(st == PYDNN_STATUS_SUCCESS, "create handle");
  if (st != PYDNN_STATUS_SUCCESS) return 1;
  static float x[COUNT], y[COUNT], g[COUNT], gx[COUNT];
  static unsigned char mask[NB];
  unsigned long long state[4];
  srand(4321);
  for (int i = 0; i < COUNT; i++) {
    x[i] = (float)(0.25 + 2.0 * rand() / RAND_MAX) * (i % 2 ? -1.0f : 1.0f);
    g[i] = (float)(0.5 + rand() / (double)RAND_MAX);
  }
  size_t states_size = 0, reserve_size = 0;
  CHECK(pydnnDropoutGetStatesSize(h, &states_size) == PYDNN_STATUS_SUCCESS && states_size == 32, "states size");
  pydnnTensorDescriptor_t t;
  pydnnCreateTensorDescriptor(&t);
  pydnnSetTensor4dDescriptor(t, PYDNN_TENSOR_NCHW, PYDNN_DATA_FLOAT, N, C, H, W);
  CHECK(pydnnDropoutGetReserveSpaceSize(t, &reserve_size) == PYDNN_STATUS_SUCCESS && reserve_size == NB,
        "reserve space size");
  CUdeviceptr dx, dy, dg, dgx, dr, ds;
  int cu = cuMemAlloc(&dx, sizeof x) | cuMemAlloc(&dy, sizeof y) | cuMemAlloc(&dg, sizeof g) |
           cuMemAlloc(&dgx, sizeof gx) | cuMemAlloc(&dr, NB) | cuMemAlloc(&ds, states_size);
  cu |= cuMemcpyHtoD(dx, x, sizeof x) | cuMemcpyHtoD(dg, g, sizeof g);
  CHECK(cu == 0, "device memory from the driver");
  if (cu != 0) return 1;

  const float p = 0.25f;
  const unsigned long long seed = 0x0123456789ABCDEFull;
  pydnnDropoutDescriptor_t d;
  CHECK(pydnnCreateDropoutDescriptor(&d) == PYDNN_STATUS_SUCCESS, "create dropout descriptor");
  st = pydnnSetDropoutDescriptor(d, h, p, (void *)ds, states_size, seed);
  CHECK(st == PYDNN_STATUS_SUCCESS, "set dropout descriptor");
  float gp = -1;
  void *gs = NULL;
  unsigned long long gseed = 0;
  st = pydnnGetDropoutDescriptor(d, h, &gp, &gs, &gseed);
  CHECK(st == PYDNN_STATUS_SUCCESS && gp == p && gs == (void *)ds && gseed == seed, "get descriptor");

  st = pydnnDropoutForward(h, d, t, (void *)dx, t, (void *)dy, (void *)dr, reserve_size);
  CHECK(st == PYDNN_STATUS_SUCCESS, "dropout forward");
  cuCtxSynchronize();
  cuMemcpyDtoH(y, dy, sizeof y);
  cuMemcpyDtoH(mask, dr, NB);
  cuMemcpyDtoH(state, ds, sizeof state);
  const unsigned thr = (unsigned)floor(p * 65536.0 + 0.5);
  int bad_bits = 0, bad_vals = 0;
  for (int i = 0; i < COUNT; i++) {
    int k = keep(seed, 0, i, thr);
    bad_bits += ((mask[i / 8] >> (i % 8)) & 1) != k;
    double want = k ? (double)x[i] * (1.0 / (1.0 - (double)p)) : 0.0;
    bad_vals += !(fabs(y[i] - want) <= 1e-6 * fabs(want));
  }
  for (int i = COUNT; i < NB * 8; i++) bad_bits += (mask[i / 8] >> (i % 8)) & 1; /* bits past n are 0 */
  printf("mask bits off %d, values off %d\n", bad_bits, bad_vals);
  CHECK(bad_bits == 0, "forward mask");
  CHECK(bad_vals == 0, "forward values");
  CHECK(state[0] == seed && state[1] == 1, "offset advanced");

  st = pydnnDropoutBackward(h, d, t, (void *)dg, t, (void *)dgx, (void *)dr, reserve_size);
  CHECK(st == PYDNN_STATUS_SUCCESS, "dropout backward");
  cuCtxSynchronize();
  cuMemcpyDtoH(gx, dgx, sizeof gx);
  bad_vals = 0;
  for (int i = 0; i < COUNT; i++) {
    int k = (mask[i / 8] >> (i % 8)) & 1;
    double want = k ? (double)g[i] * (1.0 / (1.0 - (double)p)) : 0.0;
    bad_vals += !(fabs(gx[i] - want) <= 1e-6 * fabs(want));
  }
  CHECK(bad_vals == 0, "backward values");

  /* bad arguments: a status and the argument's name */
  CHECK(pydnnSetDropoutDescriptor(d, h, 1.5f, (void *)ds, states_size, seed) == PYDNN_STATUS_BAD_PARAM &&
        msg_has("dropout: 1.5"), "dropout outside [0, 1] refused");
  CHECK(pydnnSetDropoutDescriptor(d, h, p, (void *)ds, 8, seed) == PYDNN_STATUS_BAD_PARAM &&
        msg_has("stateSizeInBytes"), "small states refused");
  CHECK(pydnnDropoutForward(h, d, t, (void *)dx, t, (void *)dy, (void *)dr, NB - 1) == PYDNN_STATUS_BAD_PARAM &&
        msg_has("reserveSpaceSizeInBytes"), "small reserve space refused");
  pydnnTensorDescriptor_t t2;
  pydnnCreateTensorDescriptor(&t2);
  pydnnSetTensor4dDescriptor(t2, PYDNN_TENSOR_NCHW, PYDNN_DATA_FLOAT, N, C, W, H);
  CHECK(pydnnDropoutForward(h, d, t, (void *)dx, t2, (void *)dy, (void *)dr, NB) == PYDNN_STATUS_BAD_PARAM &&
        msg_has("ydesc"), "mismatched descriptors refused");
  CHECK(pydnnGetDropoutDescriptor(d, h, &gp, NULL, &gseed) == PYDNN_STATUS_BAD_PARAM_NULL_POINTER, "NULL out refused");

  CHECK(pydnnDestroyDropoutDescriptor(d) == PYDNN_STATUS_SUCCESS, "destroy dropout descriptor");
  CHECK(pydnnDestroyDropoutDescriptor(NULL) == PYDNN_STATUS_SUCCESS, "destroy NULL");
  pydnnDestroyTensorDescriptor(t);
  pydnnDestroyTensorDescriptor(t2);
  cuMemFree(dx); cuMemFree(dy); cuMemFree(dg); cuMemFree(dgx); cuMemFree(dr); cuMemFree(ds);
  pydnnDestroy(h);
  printf("%d failures\n", failures);
  return failures ? 1 : 0;
}
