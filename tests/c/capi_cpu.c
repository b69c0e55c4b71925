/* The C face without a GPU: versions, error strings, a bad parameter with its message, descriptor round
 * trips, and pydnnCreate's status. Prints one "ok <what>" or "FAIL <what>" line per check; the test reads
 * them. Built only with the flags `python -m pydnn config --cflags --libs` prints. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pydnn.h>

#include "check.h"

int main(void) {
  char msg[512];
  CHECK(pydnnGetVersion() == PYDNN_VERSION, "version matches the header");
  /* libpydnn lends PYTHONPATH to its embedded interpreter only while it starts; the caller's is back now */
  const char *pp = getenv("PYTHONPATH");
  printf("env PYTHONPATH=%s\n", pp ? pp : "(unset)");
  printf("cudart version %zu\n", pydnnGetCudartVersion());
  CHECK(strcmp(pydnnGetErrorString(PYDNN_STATUS_BAD_PARAM), "PYDNN_STATUS_BAD_PARAM") == 0, "error string");
  CHECK(strcmp(pydnnGetErrorString((pydnnStatus_t)424242), "PYDNN_STATUS_UNKNOWN") == 0, "unknown status string");
  int major = -1;
  CHECK(pydnnGetProperty(PYDNN_MAJOR_VERSION, &major) == PYDNN_STATUS_SUCCESS && major == PYDNN_MAJOR, "property");
  CHECK(pydnnGetProperty(PYDNN_MAJOR_VERSION, NULL) == PYDNN_STATUS_BAD_PARAM_NULL_POINTER, "NULL out-pointer");
  pydnnGetLastErrorString(msg, sizeof msg);
  CHECK(strstr(msg, "value: NULL") != NULL, "NULL out-pointer message names the argument");
  CHECK(PYDNN_STATUS_CATEGORY(PYDNN_STATUS_BAD_PARAM_NULL_POINTER) == PYDNN_STATUS_BAD_PARAM &&
        PYDNN_STATUS_SPECIFIC_ERROR(PYDNN_STATUS_BAD_PARAM_NULL_POINTER) == 2 &&
        PYDNN_STATUS_FULL_ERROR_CODE(PYDNN_STATUS_BAD_PARAM, 2) == PYDNN_STATUS_BAD_PARAM_NULL_POINTER, "status categories");
  CHECK(strcmp(pydnnGetErrorString(PYDNN_STATUS_NOT_INITIALIZED), "PYDNN_STATUS_NOT_INITIALIZED") == 0, "NOT_INITIALIZED string");

  pydnnTensorDescriptor_t t;
  CHECK(pydnnCreateTensorDescriptor(&t) == PYDNN_STATUS_SUCCESS, "create tensor descriptor");
  pydnnStatus_t st = pydnnSetTensor4dDescriptor(t, PYDNN_TENSOR_NCHW, PYDNN_DATA_FLOAT, 0, 3, 4, 5);
  pydnnGetLastErrorString(msg, sizeof msg);
  CHECK(st == PYDNN_STATUS_BAD_PARAM, "n = 0 is BAD_PARAM");
  CHECK(strstr(msg, "pydnnSetTensor4dDescriptor: n: 0") != NULL, "last error names the argument");
  printf("message: %s\n", msg);
  char tiny[8];
  pydnnGetLastErrorString(tiny, sizeof tiny);
  CHECK(strlen(tiny) == 7, "last error truncated to max_size");

  CHECK(pydnnSetTensor4dDescriptor(t, PYDNN_TENSOR_NHWC, PYDNN_DATA_HALF, 2, 3, 4, 5) == PYDNN_STATUS_SUCCESS, "set 4d");
  pydnnDataType_t dt;
  int n, c, h, w, ns, cs, hs, ws;
  CHECK(pydnnGetTensor4dDescriptor(t, &dt, &n, &c, &h, &w, &ns, &cs, &hs, &ws) == PYDNN_STATUS_SUCCESS &&
        dt == PYDNN_DATA_HALF && n == 2 && c == 3 && h == 4 && w == 5 && ns == 60 && cs == 1 && hs == 15 && ws == 3,
        "get 4d round trip (NHWC strides)");
  size_t bytes = 0;
  CHECK(pydnnGetTensorSizeInBytes(t, &bytes) == PYDNN_STATUS_SUCCESS && bytes == 120 * 2, "size in bytes");

  int dims[5] = {2, 3, 4, 5, 6}, strides[5] = {720, 240, 60, 12, 2};
  CHECK(pydnnSetTensorNdDescriptor(t, PYDNN_DATA_DOUBLE, 5, dims, strides) == PYDNN_STATUS_SUCCESS, "set Nd");
  int nb = 0, gd[8] = {0}, gs[8] = {0};
  CHECK(pydnnGetTensorNdDescriptor(t, 8, &dt, &nb, gd, gs) == PYDNN_STATUS_SUCCESS && dt == PYDNN_DATA_DOUBLE &&
        nb == 5 && gd[4] == 6 && gs[0] == 720 && gs[4] == 2, "get Nd round trip");
  CHECK(pydnnSetTensorNdDescriptor(t, PYDNN_DATA_DOUBLE, 9, dims, strides) == PYDNN_STATUS_BAD_PARAM, "nbDims 9 refused");
  int few[4] = {-7, -7, -7, -7}, fews[4] = {-7, -7, -7, -7};
  CHECK(pydnnGetTensorNdDescriptor(t, 2, &dt, &nb, few, fews) == PYDNN_STATUS_SUCCESS && nb == 5 && few[0] == 2 &&
        few[1] == 3 && few[2] == -7 && fews[1] == 240 && fews[2] == -7, "get Nd writes only nbDimsRequested entries");
  CHECK(pydnnGetTensorNdDescriptor(t, 8, &dt, &nb, NULL, gs) == PYDNN_STATUS_BAD_PARAM_NULL_POINTER, "NULL dimA refused");
  CHECK(pydnnSetTensor4dDescriptorEx(t, PYDNN_DATA_FLOAT, 2, 3, 4, 5, 100, 30, 6, 1) == PYDNN_STATUS_SUCCESS, "set 4d Ex");
  CHECK(pydnnGetTensor4dDescriptor(t, &dt, &n, &c, &h, &w, &ns, &cs, &hs, &ws) == PYDNN_STATUS_SUCCESS &&
        dt == PYDNN_DATA_FLOAT && n == 2 && c == 3 && h == 4 && w == 5 && ns == 100 && cs == 30 && hs == 6 && ws == 1,
        "get 4d round trip (explicit strides)");
  CHECK(pydnnSetTensorNdDescriptorEx(t, PYDNN_TENSOR_NHWC, PYDNN_DATA_INT8, 4, dims) == PYDNN_STATUS_SUCCESS, "set Nd Ex");
  CHECK(pydnnGetTensorNdDescriptor(t, 8, &dt, &nb, gd, gs) == PYDNN_STATUS_SUCCESS && dt == PYDNN_DATA_INT8 && nb == 4 &&
        gd[0] == 2 && gd[1] == 3 && gd[2] == 4 && gd[3] == 5 && gs[0] == 60 && gs[1] == 1 && gs[2] == 15 && gs[3] == 3,
        "get Nd round trip (NHWC strides from the format)");

  pydnnFilterDescriptor_t f;
  pydnnTensorFormat_t fmt;
  int k;
  CHECK(pydnnCreateFilterDescriptor(&f) == PYDNN_STATUS_SUCCESS, "create filter");
  CHECK(pydnnSetFilter4dDescriptor(f, PYDNN_DATA_BFLOAT16, PYDNN_TENSOR_NCHW, 64, 3, 7, 7) == PYDNN_STATUS_SUCCESS, "set filter");
  CHECK(pydnnGetFilter4dDescriptor(f, &dt, &fmt, &k, &c, &h, &w) == PYDNN_STATUS_SUCCESS && dt == PYDNN_DATA_BFLOAT16 &&
        fmt == PYDNN_TENSOR_NCHW && k == 64 && c == 3 && h == 7 && w == 7, "filter round trip");
  int fdims[5] = {8, 4, 3, 3, 3}, gf[8] = {0};
  CHECK(pydnnSetFilterNdDescriptor(f, PYDNN_DATA_HALF, PYDNN_TENSOR_NHWC, 5, fdims) == PYDNN_STATUS_SUCCESS, "set filter Nd");
  CHECK(pydnnGetFilterNdDescriptor(f, 8, &dt, &fmt, &nb, gf) == PYDNN_STATUS_SUCCESS && dt == PYDNN_DATA_HALF &&
        fmt == PYDNN_TENSOR_NHWC && nb == 5 && gf[0] == 8 && gf[1] == 4 && gf[4] == 3, "filter Nd round trip");
  CHECK(pydnnGetFilterSizeInBytes(f, &bytes) == PYDNN_STATUS_SUCCESS && bytes == 8 * 4 * 27 * 2, "filter size in bytes");
  /* a filter where a tensor descriptor is expected */
  CHECK(pydnnGetTensorSizeInBytes((pydnnTensorDescriptor_t)f, &bytes) == PYDNN_STATUS_BAD_PARAM, "wrong descriptor kind");
  CHECK(pydnnDestroyFilterDescriptor(f) == PYDNN_STATUS_SUCCESS, "destroy filter");
  CHECK(pydnnGetFilter4dDescriptor(f, &dt, &fmt, &k, &c, &h, &w) == PYDNN_STATUS_BAD_PARAM, "destroyed filter refused");

  pydnnActivationDescriptor_t a;
  pydnnActivationMode_t mode;
  pydnnNanPropagation_t nan;
  double coef = 0, beta = 0;
  CHECK(pydnnCreateActivationDescriptor(&a) == PYDNN_STATUS_SUCCESS, "create activation");
  CHECK(pydnnSetActivationDescriptor(a, PYDNN_ACTIVATION_GELU_TANH, PYDNN_PROPAGATE_NAN, 2.5) == PYDNN_STATUS_SUCCESS, "set activation");
  CHECK(pydnnSetActivationDescriptorSwishBeta(a, 1.5) == PYDNN_STATUS_SUCCESS, "swish beta");
  CHECK(pydnnGetActivationDescriptor(a, &mode, &nan, &coef) == PYDNN_STATUS_SUCCESS && mode == PYDNN_ACTIVATION_GELU_TANH &&
        nan == PYDNN_PROPAGATE_NAN && coef == 2.5, "activation round trip");
  CHECK(pydnnGetActivationDescriptorSwishBeta(a, &beta) == PYDNN_STATUS_SUCCESS && beta == 1.5, "swish beta round trip");
  CHECK(pydnnSetActivationDescriptor(a, (pydnnActivationMode_t)77, PYDNN_PROPAGATE_NAN, 0) == PYDNN_STATUS_BAD_PARAM, "bad mode");
  pydnnGetLastErrorString(msg, sizeof msg);
  CHECK(strstr(msg, "mode") != NULL, "bad mode message");

  pydnnOpTensorDescriptor_t o;
  pydnnOpTensorOp_t op;
  pydnnDataType_t comp;
  CHECK(pydnnCreateOpTensorDescriptor(&o) == PYDNN_STATUS_SUCCESS, "create op tensor");
  CHECK(pydnnSetOpTensorDescriptor(o, PYDNN_OP_TENSOR_MAX, PYDNN_DATA_DOUBLE, PYDNN_PROPAGATE_NAN) == PYDNN_STATUS_SUCCESS,
        "set op tensor");
  CHECK(pydnnGetOpTensorDescriptor(o, &op, &comp, &nan) == PYDNN_STATUS_SUCCESS && op == PYDNN_OP_TENSOR_MAX &&
        comp == PYDNN_DATA_DOUBLE && nan == PYDNN_PROPAGATE_NAN, "op tensor round trip");
  CHECK(pydnnSetOpTensorDescriptor(o, (pydnnOpTensorOp_t)9, PYDNN_DATA_FLOAT, PYDNN_PROPAGATE_NAN) == PYDNN_STATUS_BAD_PARAM,
        "bad op refused");
  CHECK(pydnnDestroyOpTensorDescriptor(o) == PYDNN_STATUS_SUCCESS, "destroy op tensor");

  pydnnReduceTensorDescriptor_t r;
  pydnnReduceTensorOp_t rop;
  pydnnReduceTensorIndices_t ind;
  pydnnIndicesType_t itype;
  CHECK(pydnnCreateReduceTensorDescriptor(&r) == PYDNN_STATUS_SUCCESS, "create reduce");
  CHECK(pydnnSetReduceTensorDescriptor(r, PYDNN_REDUCE_TENSOR_AMAX, PYDNN_DATA_FLOAT, PYDNN_NOT_PROPAGATE_NAN,
                                       PYDNN_REDUCE_TENSOR_FLATTENED_INDICES, PYDNN_32BIT_INDICES) == PYDNN_STATUS_SUCCESS,
        "set reduce");
  CHECK(pydnnGetReduceTensorDescriptor(r, &rop, &comp, &nan, &ind, &itype) == PYDNN_STATUS_SUCCESS &&
        rop == PYDNN_REDUCE_TENSOR_AMAX && comp == PYDNN_DATA_FLOAT && nan == PYDNN_NOT_PROPAGATE_NAN &&
        ind == PYDNN_REDUCE_TENSOR_FLATTENED_INDICES && itype == PYDNN_32BIT_INDICES, "reduce round trip");
  CHECK(pydnnDestroyReduceTensorDescriptor(r) == PYDNN_STATUS_SUCCESS, "destroy reduce");
  CHECK(pydnnDestroyTensorDescriptor(NULL) == PYDNN_STATUS_SUCCESS && pydnnDestroyReduceTensorDescriptor(NULL) == PYDNN_STATUS_SUCCESS,
        "destroying NULL descriptors does nothing");

  cudaStream_t stream;
  CHECK(pydnnGetStream(NULL, &stream) == PYDNN_STATUS_BAD_PARAM, "NULL handle to GetStream");
  pydnnGetLastErrorString(msg, sizeof msg);
  CHECK(strstr(msg, "handle") != NULL, "NULL handle message names the argument");

  pydnnHandle_t handle;
  st = pydnnCreate(&handle);
  printf("create status %d\n", (int)st);
  if (st == PYDNN_STATUS_SUCCESS) pydnnDestroy(handle);
  CHECK(pydnnActivationForward(NULL, a, NULL, t, NULL, NULL, t, NULL) == PYDNN_STATUS_BAD_PARAM, "NULL handle");
  CHECK(pydnnDestroyTensorDescriptor(t) == PYDNN_STATUS_SUCCESS, "destroy tensor");
  CHECK(pydnnDestroyActivationDescriptor(a) == PYDNN_STATUS_SUCCESS, "destroy activation");
  printf("%d failures\n", failures);
  return failures != 0;
}
