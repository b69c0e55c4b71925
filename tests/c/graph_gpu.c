/* The graph API and pydnnMatmul through the C API on a GPU, checked against double-precision host math:
 * y = relu(x + b) built from backend descriptors (x [R, L], b [1, L] broadcast, a virtual tensor between
 * the two operations), engine configs from an ENGINEHEUR query written into descriptors the program
 * created, an execution plan, its JSON, a variant pack and pydnnBackendExecute; then C = A @ B with
 * pydnnMatmul (float, B stored transposed). Prints "ok <what>" / "FAIL <what>" lines. */
#include "gpu_test.h"

static CUdeviceptr upload(const void *p, size_t n) {
  CUdeviceptr d = 0;
  if (cuMemAlloc(&d, n) != 0 || (p && cuMemcpyHtoD(d, p, n) != 0)) { printf("FAIL device memory\n"); exit(2); }
  return d;
}

static pydnnBackendDescriptor_t tensor(long long uid, long long rows, long long cols, int is_virtual) {
  pydnnBackendDescriptor_t t;
  pydnnDataType_t dt = PYDNN_DATA_FLOAT;
  long long dims[2] = {rows, cols}, strides[2] = {cols, 1}, align = 16;
  char virt = (char)is_virtual;
  pydnnBackendCreateDescriptor(PYDNN_BACKEND_TENSOR_DESCRIPTOR, &t);
  pydnnBackendSetAttribute(t, PYDNN_ATTR_TENSOR_DATA_TYPE, PYDNN_TYPE_DATA_TYPE, 1, &dt);
  pydnnBackendSetAttribute(t, PYDNN_ATTR_TENSOR_DIMENSIONS, PYDNN_TYPE_INT64, 2, dims);
  pydnnBackendSetAttribute(t, PYDNN_ATTR_TENSOR_STRIDES, PYDNN_TYPE_INT64, 2, strides);
  pydnnBackendSetAttribute(t, PYDNN_ATTR_TENSOR_UNIQUE_ID, PYDNN_TYPE_INT64, 1, &uid);
  pydnnBackendSetAttribute(t, PYDNN_ATTR_TENSOR_BYTE_ALIGNMENT, PYDNN_TYPE_INT64, 1, &align);
  pydnnBackendSetAttribute(t, PYDNN_ATTR_TENSOR_IS_VIRTUAL, PYDNN_TYPE_BOOLEAN, 1, &virt);
  pydnnBackendFinalize(t);
  return t;
}

static pydnnBackendDescriptor_t pointwise_op(pydnnPointwiseMode_t mode, pydnnBackendDescriptor_t x,
                                             pydnnBackendDescriptor_t b, pydnnBackendDescriptor_t y) {
  pydnnBackendDescriptor_t pw, op;
  pydnnDataType_t prec = PYDNN_DATA_FLOAT;
  pydnnBackendCreateDescriptor(PYDNN_BACKEND_POINTWISE_DESCRIPTOR, &pw);
  pydnnBackendSetAttribute(pw, PYDNN_ATTR_POINTWISE_MODE, PYDNN_TYPE_POINTWISE_MODE, 1, &mode);
  pydnnBackendSetAttribute(pw, PYDNN_ATTR_POINTWISE_MATH_PREC, PYDNN_TYPE_DATA_TYPE, 1, &prec);
  pydnnBackendFinalize(pw);
  pydnnBackendCreateDescriptor(PYDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, &op);
  pydnnBackendSetAttribute(op, PYDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, PYDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
  pydnnBackendSetAttribute(op, PYDNN_ATTR_OPERATION_POINTWISE_XDESC, PYDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  if (b) pydnnBackendSetAttribute(op, PYDNN_ATTR_OPERATION_POINTWISE_BDESC, PYDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
  pydnnBackendSetAttribute(op, PYDNN_ATTR_OPERATION_POINTWISE_YDESC, PYDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  if (pydnnBackendFinalize(op) != PYDNN_STATUS_SUCCESS) printf("FAIL finalize operation\n");
  return op;
}

enum { R = 7, L = 130, M = 37, N = 29, K = 53 };

int main(void) {
  load_driver();
  pydnnHandle_t h;
  if (pydnnCreate(&h) != PYDNN_STATUS_SUCCESS) { printf("FAIL create\n"); return 1; }
  static float x[R * L], b[L], y[R * L];
  srand(11);
  for (int i = 0; i < R * L; i++) x[i] = (float)(4.0 * rand() / RAND_MAX - 2.0);
  for (int i = 0; i < L; i++) b[i] = (float)(2.0 * rand() / RAND_MAX - 1.0);

  pydnnBackendDescriptor_t tx = tensor(1, R, L, 0), tb = tensor(2, 1, L, 0), ty = tensor(3, R, L, 0);
  pydnnBackendDescriptor_t tv = tensor(4, R, L, 1);
  pydnnBackendDescriptor_t ops[2] = {pointwise_op(PYDNN_POINTWISE_ADD, tx, tb, tv),
                                     pointwise_op(PYDNN_POINTWISE_RELU_FWD, tv, NULL, ty)};
  pydnnBackendDescriptor_t graph;
  pydnnBackendCreateDescriptor(PYDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, &graph);
  pydnnBackendSetAttribute(graph, PYDNN_ATTR_OPERATIONGRAPH_HANDLE, PYDNN_TYPE_HANDLE, 1, &h);
  pydnnBackendSetAttribute(graph, PYDNN_ATTR_OPERATIONGRAPH_OPS, PYDNN_TYPE_BACKEND_DESCRIPTOR, 2, ops);
  CHECK(pydnnBackendFinalize(graph) == PYDNN_STATUS_SUCCESS, "finalize graph");

  pydnnBackendDescriptor_t heur;
  pydnnBackendHeurMode_t mode = PYDNN_HEUR_MODE_INSTANT;
  pydnnBackendCreateDescriptor(PYDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur);
  pydnnBackendSetAttribute(heur, PYDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, PYDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
  pydnnBackendSetAttribute(heur, PYDNN_ATTR_ENGINEHEUR_MODE, PYDNN_TYPE_HEUR_MODE, 1, &mode);
  CHECK(pydnnBackendFinalize(heur) == PYDNN_STATUS_SUCCESS, "finalize heuristics");
  long long count = 0;
  pydnnBackendGetAttribute(heur, PYDNN_ATTR_ENGINEHEUR_RESULTS, PYDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL);
  CHECK(count == 2, "two engine configs (fusion, nodes)");
  pydnnBackendDescriptor_t cfgs[2];
  for (int i = 0; i < 2; i++) pydnnBackendCreateDescriptor(PYDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[i]);
  CHECK(pydnnBackendGetAttribute(heur, PYDNN_ATTR_ENGINEHEUR_RESULTS, PYDNN_TYPE_BACKEND_DESCRIPTOR, 2, &count,
                                 cfgs) == PYDNN_STATUS_SUCCESS, "engine configs written");

  CUdeviceptr dx = upload(x, sizeof x), db = upload(b, sizeof b), dy = upload(NULL, sizeof y);
  for (int e = 0; e < 2; e++) {
    pydnnBackendDescriptor_t plan, pack;
    pydnnBackendCreateDescriptor(PYDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan);
    pydnnBackendSetAttribute(plan, PYDNN_ATTR_EXECUTION_PLAN_HANDLE, PYDNN_TYPE_HANDLE, 1, &h);
    pydnnBackendSetAttribute(plan, PYDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, PYDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[e]);
    CHECK(pydnnBackendFinalize(plan) == PYDNN_STATUS_SUCCESS, "finalize plan");
    long long ws = -1;
    pydnnBackendGetAttribute(plan, PYDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, PYDNN_TYPE_INT64, 1, &count, &ws);
    CHECK(e == 0 ? ws == 0 : ws > 0, "workspace size");
    char json[8192] = {0};
    pydnnBackendGetAttribute(plan, PYDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, PYDNN_TYPE_CHAR, sizeof json - 1,
                             &count, json);
    CHECK(count > 10 && json[0] == '{' && strstr(json, "pydnn.execution_plan"), "plan JSON");
    CUdeviceptr dws = ws > 0 ? upload(NULL, (size_t)ws) : 0;
    long long uids[3] = {1, 2, 3};
    void *ptrs[3] = {(void *)dx, (void *)db, (void *)dy};
    void *wsp = (void *)dws;
    pydnnBackendCreateDescriptor(PYDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    pydnnBackendSetAttribute(pack, PYDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, PYDNN_TYPE_INT64, 3, uids);
    pydnnBackendSetAttribute(pack, PYDNN_ATTR_VARIANT_PACK_DATA_POINTERS, PYDNN_TYPE_VOID_PTR, 3, ptrs);
    pydnnBackendSetAttribute(pack, PYDNN_ATTR_VARIANT_PACK_WORKSPACE, PYDNN_TYPE_VOID_PTR, 1, &wsp);
    CHECK(pydnnBackendFinalize(pack) == PYDNN_STATUS_SUCCESS, "finalize variant pack");
    memset(y, 0xff, sizeof y);
    cuMemcpyHtoD(dy, y, sizeof y);
    CHECK(pydnnBackendExecute(h, plan, pack) == PYDNN_STATUS_SUCCESS, "execute");
    cuCtxSynchronize();
    cuMemcpyDtoH(y, dy, sizeof y);
    double worst = 0;
    for (int r = 0; r < R; r++)
      for (int l = 0; l < L; l++) {
        double want = (double)x[r * L + l] + (double)b[l];
        want = want > 0 ? want : 0;
        double err = fabs(y[r * L + l] - want);
        if (!(err <= worst)) worst = err;
      }
    CHECK(worst < 1e-6, e == 0 ? "relu(x + b) numbers (fusion engine)" : "relu(x + b) numbers (node engine)");
    if (dws) cuMemFree(dws);
  }

  /* C = A @ B, B stored transposed (N x K row-major = K x N with strides (1, K)) */
  static float a[M * K], bt[N * K], c[M * N];
  for (int i = 0; i < M * K; i++) a[i] = (float)(2.0 * rand() / RAND_MAX - 1.0);
  for (int i = 0; i < N * K; i++) bt[i] = (float)(2.0 * rand() / RAND_MAX - 1.0);
  pydnnTensorDescriptor_t da, dbd, dc;
  pydnnCreateTensorDescriptor(&da);
  pydnnCreateTensorDescriptor(&dbd);
  pydnnCreateTensorDescriptor(&dc);
  int adim[2] = {M, K}, astr[2] = {K, 1}, bdim[2] = {K, N}, bstr[2] = {1, K}, cdim[2] = {M, N}, cstr[2] = {N, 1};
  pydnnSetTensorNdDescriptor(da, PYDNN_DATA_FLOAT, 2, adim, astr);
  pydnnSetTensorNdDescriptor(dbd, PYDNN_DATA_FLOAT, 2, bdim, bstr);
  pydnnSetTensorNdDescriptor(dc, PYDNN_DATA_FLOAT, 2, cdim, cstr);
  CUdeviceptr pa = upload(a, sizeof a), pb = upload(bt, sizeof bt), pc = upload(NULL, sizeof c);
  float one = 1.0f, zero = 0.0f;
  CHECK(pydnnMatmul(h, &one, da, (void *)pa, dbd, (void *)pb, &zero, dc, (void *)pc) == PYDNN_STATUS_SUCCESS,
        "matmul");
  cuCtxSynchronize();
  cuMemcpyDtoH(c, pc, sizeof c);
  double worst = 0;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double want = 0, mag = 0;
      for (int k = 0; k < K; k++) {
        want += (double)a[i * K + k] * bt[j * K + k];
        mag += fabs((double)a[i * K + k] * bt[j * K + k]);
      }
      double err = fabs(c[i * N + j] - want) / (mag + 1e-30);
      if (!(err <= worst)) worst = err;
    }
  CHECK(worst < 1e-5, "matmul numbers (B transposed through strides)");
  int bad[2] = {M + 1, K};
  pydnnSetTensorNdDescriptor(da, PYDNN_DATA_FLOAT, 2, bad, astr);
  CHECK(pydnnMatmul(h, &one, da, (void *)pa, dbd, (void *)pb, &zero, dc, (void *)pc) == PYDNN_STATUS_BAD_PARAM,
        "matmul shape mismatch");
  printf("%d failures\n", failures);
  return failures != 0;
}
