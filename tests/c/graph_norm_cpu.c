/* The graph API's normalization and attention operations from C without a GPU: OPERATION_NORM_FORWARD /
 * BACKWARD and OPERATION_SDPA_FWD built from typed host arrays with cuDNN 9's attribute names and enum
 * values, finalized and read back; a wrong scale shape, a missing statistic and an unknown norm mode each
 * BAD_PARAM with a message naming the attribute; GROUP_NORM NOT_SUPPORTED. Prints "ok <what>" / "FAIL <what>". */
#include <stdio.h>
#include <string.h>
#include <pydnn.h>

#include "check.h"

static int last_error_has(const char *needle) {
  char msg[512];
  pydnnGetLastErrorString(msg, sizeof msg);
  if (!strstr(msg, needle)) printf("  last error: %s\n", msg);
  return strstr(msg, needle) != NULL;
}

static long long next_uid = 1;

static pydnnBackendDescriptor_t tensor(pydnnDataType_t dt, int nd, const long long *dims, int by_value) {
  pydnnBackendDescriptor_t t;
  long long strides[8], acc = 1, uid = next_uid++, align = 16;
  for (int i = nd - 1; i >= 0; --i) {
    strides[i] = acc;
    acc *= dims[i];
  }
  char virt = 0, byv = (char)by_value;
  pydnnBackendCreateDescriptor(PYDNN_BACKEND_TENSOR_DESCRIPTOR, &t);
  pydnnBackendSetAttribute(t, PYDNN_ATTR_TENSOR_DATA_TYPE, PYDNN_TYPE_DATA_TYPE, 1, &dt);
  pydnnBackendSetAttribute(t, PYDNN_ATTR_TENSOR_DIMENSIONS, PYDNN_TYPE_INT64, nd, dims);
  pydnnBackendSetAttribute(t, PYDNN_ATTR_TENSOR_STRIDES, PYDNN_TYPE_INT64, nd, strides);
  pydnnBackendSetAttribute(t, PYDNN_ATTR_TENSOR_UNIQUE_ID, PYDNN_TYPE_INT64, 1, &uid);
  pydnnBackendSetAttribute(t, PYDNN_ATTR_TENSOR_BYTE_ALIGNMENT, PYDNN_TYPE_INT64, 1, &align);
  pydnnBackendSetAttribute(t, PYDNN_ATTR_TENSOR_IS_VIRTUAL, PYDNN_TYPE_BOOLEAN, 1, &virt);
  pydnnBackendSetAttribute(t, PYDNN_ATTR_TENSOR_IS_BY_VALUE, PYDNN_TYPE_BOOLEAN, 1, &byv);
  pydnnBackendFinalize(t);
  return t;
}

static void set_desc(pydnnBackendDescriptor_t op, pydnnBackendAttributeName_t a, pydnnBackendDescriptor_t t) {
  pydnnBackendSetAttribute(op, a, PYDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
}

static pydnnBackendDescriptor_t norm_fwd(pydnnBackendNormMode_t mode, const long long *sdims, int with_mean) {
  const long long xd[2] = {4, 32}, st[2] = {4, 1}, one[2] = {1, 1};
  pydnnBackendDescriptor_t op;
  pydnnBackendNormFwdPhase_t phase = PYDNN_NORM_FWD_TRAINING;
  pydnnBackendCreateDescriptor(PYDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR, &op);
  pydnnBackendSetAttribute(op, PYDNN_ATTR_OPERATION_NORM_FWD_MODE, PYDNN_TYPE_NORM_MODE, 1, &mode);
  pydnnBackendSetAttribute(op, PYDNN_ATTR_OPERATION_NORM_FWD_PHASE, PYDNN_TYPE_NORM_FWD_PHASE, 1, &phase);
  set_desc(op, PYDNN_ATTR_OPERATION_NORM_FWD_XDESC, tensor(PYDNN_DATA_BFLOAT16, 2, xd, 0));
  set_desc(op, PYDNN_ATTR_OPERATION_NORM_FWD_YDESC, tensor(PYDNN_DATA_BFLOAT16, 2, xd, 0));
  set_desc(op, PYDNN_ATTR_OPERATION_NORM_FWD_SCALE_DESC, tensor(PYDNN_DATA_FLOAT, 2, sdims, 0));
  set_desc(op, PYDNN_ATTR_OPERATION_NORM_FWD_BIAS_DESC, tensor(PYDNN_DATA_FLOAT, 2, sdims, 0));
  set_desc(op, PYDNN_ATTR_OPERATION_NORM_FWD_EPSILON_DESC, tensor(PYDNN_DATA_FLOAT, 2, one, 1));
  if (with_mean) set_desc(op, PYDNN_ATTR_OPERATION_NORM_FWD_MEAN_DESC, tensor(PYDNN_DATA_FLOAT, 2, st, 0));
  set_desc(op, PYDNN_ATTR_OPERATION_NORM_FWD_INV_VARIANCE_DESC, tensor(PYDNN_DATA_FLOAT, 2, st, 0));
  return op;
}

int main(void) {
  const long long sd[2] = {1, 32}, bad_sd[2] = {1, 16};
  CHECK(PYDNN_ATTR_OPERATION_NORM_FWD_MODE == 2000 && PYDNN_ATTR_OPERATION_NORM_BWD_DXDESC == 2109 &&
            PYDNN_LAYER_NORM == 0 && PYDNN_RMS_NORM == 4 && PYDNN_NORM_FWD_TRAINING == 1 &&
            PYDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR == 29 && PYDNN_ATTR_OPERATION_SDPA_FWD_QDESC == 2800,
        "cuDNN 9 values");
  pydnnBackendDescriptor_t op = norm_fwd(PYDNN_LAYER_NORM, sd, 1);
  CHECK(pydnnBackendFinalize(op) == PYDNN_STATUS_SUCCESS, "finalize layer norm forward");
  long long count = -1;
  pydnnBackendNormMode_t got = PYDNN_BATCH_NORM;
  CHECK(pydnnBackendGetAttribute(op, PYDNN_ATTR_OPERATION_NORM_FWD_MODE, PYDNN_TYPE_NORM_MODE, 1, &count, &got) ==
            PYDNN_STATUS_SUCCESS && count == 1 && got == PYDNN_LAYER_NORM, "get norm mode");
  CHECK(pydnnBackendFinalize(norm_fwd(PYDNN_LAYER_NORM, bad_sd, 1)) == PYDNN_STATUS_BAD_PARAM &&
            last_error_has("PYDNN_ATTR_OPERATION_NORM_FWD_SCALE_DESC"), "scale shape named");
  CHECK(pydnnBackendFinalize(norm_fwd(PYDNN_LAYER_NORM, sd, 0)) == PYDNN_STATUS_BAD_PARAM &&
            last_error_has("PYDNN_ATTR_OPERATION_NORM_FWD_MEAN_DESC"), "missing mean named");
  CHECK(pydnnBackendFinalize(norm_fwd(PYDNN_RMS_NORM, sd, 0)) == PYDNN_STATUS_SUCCESS, "RMS norm without mean");
  CHECK(pydnnBackendFinalize(norm_fwd(PYDNN_GROUP_NORM, sd, 1)) == PYDNN_STATUS_NOT_SUPPORTED &&
            last_error_has("GROUP_NORM"), "group norm not supported");
  pydnnBackendNormMode_t bogus = (pydnnBackendNormMode_t)42;
  pydnnBackendDescriptor_t b;
  pydnnBackendCreateDescriptor(PYDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR, &b);
  CHECK(pydnnBackendSetAttribute(b, PYDNN_ATTR_OPERATION_NORM_BWD_MODE, PYDNN_TYPE_NORM_MODE, 1, &bogus) ==
            PYDNN_STATUS_BAD_PARAM && last_error_has("pydnnBackendNormMode_t"), "unknown norm mode");
  CHECK(pydnnBackendFinalize(b) == PYDNN_STATUS_BAD_PARAM && last_error_has("needs PYDNN_ATTR_OPERATION_NORM_BWD_MODE"),
        "backward needs its mode");

  const long long qd[4] = {2, 4, 16, 64}, kd[4] = {2, 2, 16, 64};
  pydnnBackendDescriptor_t s;
  pydnnBackendCreateDescriptor(PYDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR, &s);
  set_desc(s, PYDNN_ATTR_OPERATION_SDPA_FWD_QDESC, tensor(PYDNN_DATA_HALF, 4, qd, 0));
  set_desc(s, PYDNN_ATTR_OPERATION_SDPA_FWD_KDESC, tensor(PYDNN_DATA_HALF, 4, kd, 0));
  set_desc(s, PYDNN_ATTR_OPERATION_SDPA_FWD_VDESC, tensor(PYDNN_DATA_HALF, 4, kd, 0));
  set_desc(s, PYDNN_ATTR_OPERATION_SDPA_FWD_ODESC, tensor(PYDNN_DATA_HALF, 4, qd, 0));
  long long causal = PYDNN_ATTN_MASK_CAUSAL_TOP_LEFT;
  pydnnBackendSetAttribute(s, PYDNN_ATTR_OPERATION_SDPA_FWD_MASK_MODE, PYDNN_TYPE_INT64, 1, &causal);
  CHECK(pydnnBackendFinalize(s) == PYDNN_STATUS_SUCCESS, "finalize sdpa forward (GQA, causal)");
  printf("%d failures\n", failures);
  return failures != 0;
}
