/* The graph API's C face without a GPU: backend descriptors created, set, finalized and read back through
 * typed host arrays; wrong attribute types, counts and values, and a finalized descriptor set again, each
 * BAD_PARAM with a message; descriptors as elements (an OPERATION_POINTWISE over three tensors); and
 * pydnnMatmul's argument checks. Prints "ok <what>" / "FAIL <what>" lines. */
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

static pydnnBackendDescriptor_t tensor_nc(long long uid, long long n, long long c, int is_virtual) {
  pydnnBackendDescriptor_t t;
  pydnnDataType_t dt = PYDNN_DATA_HALF;
  long long dims[2] = {n, c}, strides[2] = {c, 1}, align = 16;
  char virt = (char)is_virtual;
  pydnnBackendCreateDescriptor(PYDNN_BACKEND_TENSOR_DESCRIPTOR, &t);
  pydnnBackendSetAttribute(t, PYDNN_ATTR_TENSOR_DATA_TYPE, PYDNN_TYPE_DATA_TYPE, 1, &dt);
  pydnnBackendSetAttribute(t, PYDNN_ATTR_TENSOR_DIMENSIONS, PYDNN_TYPE_INT64, 2, dims);
  pydnnBackendSetAttribute(t, PYDNN_ATTR_TENSOR_STRIDES, PYDNN_TYPE_INT64, 2, strides);
  pydnnBackendSetAttribute(t, PYDNN_ATTR_TENSOR_UNIQUE_ID, PYDNN_TYPE_INT64, 1, &uid);
  pydnnBackendSetAttribute(t, PYDNN_ATTR_TENSOR_BYTE_ALIGNMENT, PYDNN_TYPE_INT64, 1, &align);
  pydnnBackendSetAttribute(t, PYDNN_ATTR_TENSOR_IS_VIRTUAL, PYDNN_TYPE_BOOLEAN, 1, &virt);
  return t;
}

static pydnnBackendDescriptor_t tensor(long long uid, long long n, int is_virtual) {
  return tensor_nc(uid, n, 8, is_virtual);
}

int main(void) {
  pydnnBackendDescriptor_t x = tensor(1, 4, 0);
  CHECK(pydnnBackendFinalize(x) == PYDNN_STATUS_SUCCESS, "finalize tensor");
  long long count = -1, got[8] = {0};
  CHECK(pydnnBackendGetAttribute(x, PYDNN_ATTR_TENSOR_DIMENSIONS, PYDNN_TYPE_INT64, 8, &count, got) ==
            PYDNN_STATUS_SUCCESS && count == 2 && got[0] == 4 && got[1] == 8, "get dims");
  CHECK(pydnnBackendGetAttribute(x, PYDNN_ATTR_TENSOR_UNIQUE_ID, PYDNN_TYPE_INT64, 0, &count, NULL) ==
            PYDNN_STATUS_SUCCESS && count == 1, "count only");
  pydnnDataType_t dt = PYDNN_DATA_FLOAT;
  CHECK(pydnnBackendGetAttribute(x, PYDNN_ATTR_TENSOR_DATA_TYPE, PYDNN_TYPE_DATA_TYPE, 1, &count, &dt) ==
            PYDNN_STATUS_SUCCESS && dt == PYDNN_DATA_HALF, "get data type");
  long long uid = 5;
  CHECK(pydnnBackendSetAttribute(x, PYDNN_ATTR_TENSOR_UNIQUE_ID, PYDNN_TYPE_INT64, 1, &uid) == PYDNN_STATUS_BAD_PARAM &&
            last_error_has("finalized (immutable)"), "finalized is immutable");

  pydnnBackendDescriptor_t t = tensor(2, 4, 0);
  double d = 1.0;
  CHECK(pydnnBackendSetAttribute(t, PYDNN_ATTR_TENSOR_UNIQUE_ID, PYDNN_TYPE_DOUBLE, 1, &d) == PYDNN_STATUS_BAD_PARAM &&
            last_error_has("takes PYDNN_TYPE_INT64"), "wrong attribute type");
  long long two[2] = {1, 2};
  CHECK(pydnnBackendSetAttribute(t, PYDNN_ATTR_TENSOR_UNIQUE_ID, PYDNN_TYPE_INT64, 2, two) == PYDNN_STATUS_BAD_PARAM &&
            last_error_has("elementCount"), "wrong count");
  CHECK(pydnnBackendSetAttribute(t, PYDNN_ATTR_TENSOR_UNIQUE_ID, PYDNN_TYPE_INT64, 1, NULL) ==
            PYDNN_STATUS_BAD_PARAM_NULL_POINTER, "NULL elements");
  CHECK(pydnnBackendSetAttribute(t, PYDNN_ATTR_MATMUL_COMP_TYPE, PYDNN_TYPE_DATA_TYPE, 1, &dt) ==
            PYDNN_STATUS_BAD_PARAM && last_error_has("not an attribute of a TENSOR"), "foreign attribute");
  CHECK(pydnnBackendFinalize(t) == PYDNN_STATUS_SUCCESS, "finalize second tensor");

  pydnnBackendDescriptor_t pw, op, y = tensor(3, 4, 0);
  pydnnBackendFinalize(y);
  pydnnPointwiseMode_t mode = PYDNN_POINTWISE_ADD;
  pydnnBackendCreateDescriptor(PYDNN_BACKEND_POINTWISE_DESCRIPTOR, &pw);
  pydnnBackendSetAttribute(pw, PYDNN_ATTR_POINTWISE_MODE, PYDNN_TYPE_POINTWISE_MODE, 1, &mode);
  pydnnBackendSetAttribute(pw, PYDNN_ATTR_POINTWISE_MATH_PREC, PYDNN_TYPE_DATA_TYPE, 1, &dt);
  CHECK(pydnnBackendFinalize(pw) == PYDNN_STATUS_SUCCESS, "finalize pointwise");
  pydnnBackendCreateDescriptor(PYDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, &op);
  CHECK(pydnnBackendSetAttribute(op, PYDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, PYDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                 &pw) == PYDNN_STATUS_SUCCESS, "descriptor element");
  pydnnBackendSetAttribute(op, PYDNN_ATTR_OPERATION_POINTWISE_XDESC, PYDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
  pydnnBackendSetAttribute(op, PYDNN_ATTR_OPERATION_POINTWISE_YDESC, PYDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
  CHECK(pydnnBackendFinalize(op) == PYDNN_STATUS_BAD_PARAM && last_error_has("needs PYDNN_ATTR_OPERATION_POINTWISE_BDESC"),
        "missing operand");
  pydnnBackendSetAttribute(op, PYDNN_ATTR_OPERATION_POINTWISE_BDESC, PYDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
  CHECK(pydnnBackendFinalize(op) == PYDNN_STATUS_SUCCESS, "finalize operation");
  pydnnBackendDescriptor_t back = NULL;
  CHECK(pydnnBackendGetAttribute(op, PYDNN_ATTR_OPERATION_POINTWISE_XDESC, PYDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count,
                                 &back) == PYDNN_STATUS_BAD_PARAM, "descriptor get needs a new descriptor");
  CHECK(pydnnBackendCreateDescriptor(9999, &back) == PYDNN_STATUS_BAD_PARAM && last_error_has("descriptorType"),
        "bad descriptor type");

  /* REDUCTION and OPERATION_REDUCTION (cuDNN 9's attributes and reduce-op values) */
  pydnnBackendDescriptor_t red, rop;
  pydnnReduceTensorOp_t rmode = (pydnnReduceTensorOp_t)99;
  pydnnDataType_t fdt = PYDNN_DATA_FLOAT;
  CHECK(pydnnBackendCreateDescriptor(PYDNN_BACKEND_REDUCTION_DESCRIPTOR, &red) == PYDNN_STATUS_SUCCESS, "create reduction");
  CHECK(pydnnBackendSetAttribute(red, PYDNN_ATTR_REDUCTION_OPERATOR, PYDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &rmode) ==
            PYDNN_STATUS_BAD_PARAM && last_error_has("is not a pydnnReduceTensorOp_t value"), "bad reduce op refused");
  CHECK(pydnnBackendFinalize(red) == PYDNN_STATUS_BAD_PARAM && last_error_has("needs PYDNN_ATTR_REDUCTION_OPERATOR"),
        "reduction needs its operator");
  rmode = PYDNN_REDUCE_TENSOR_MAX;
  CHECK(pydnnBackendSetAttribute(red, PYDNN_ATTR_REDUCTION_OPERATOR, PYDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &rmode) ==
            PYDNN_STATUS_SUCCESS && pydnnBackendSetAttribute(red, PYDNN_ATTR_REDUCTION_COMP_TYPE, PYDNN_TYPE_DATA_TYPE,
                                                             1, &fdt) == PYDNN_STATUS_SUCCESS &&
            pydnnBackendFinalize(red) == PYDNN_STATUS_SUCCESS, "finalize reduction MAX");
  pydnnReduceTensorOp_t rgot = PYDNN_REDUCE_TENSOR_ADD;
  CHECK(pydnnBackendGetAttribute(red, PYDNN_ATTR_REDUCTION_OPERATOR, PYDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &count,
                                 &rgot) == PYDNN_STATUS_SUCCESS && count == 1 && rgot == PYDNN_REDUCE_TENSOR_MAX &&
            PYDNN_REDUCE_TENSOR_MAX == 3 && PYDNN_REDUCE_TENSOR_NORM2 == 7, "reduction operator read back");
  pydnnBackendDescriptor_t rx = tensor_nc(40, 4, 8, 0), ry = tensor_nc(41, 4, 1, 0), rbad = tensor_nc(42, 3, 1, 0);
  pydnnBackendFinalize(rx);
  pydnnBackendFinalize(ry);
  pydnnBackendFinalize(rbad);
  pydnnBackendCreateDescriptor(PYDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, &rop);
  pydnnBackendSetAttribute(rop, PYDNN_ATTR_OPERATION_REDUCTION_XDESC, PYDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rx);
  pydnnBackendSetAttribute(rop, PYDNN_ATTR_OPERATION_REDUCTION_YDESC, PYDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rbad);
  pydnnBackendSetAttribute(rop, PYDNN_ATTR_OPERATION_REDUCTION_DESC, PYDNN_TYPE_BACKEND_DESCRIPTOR, 1, &red);
  CHECK(pydnnBackendFinalize(rop) == PYDNN_STATUS_BAD_PARAM && last_error_has("be 1 where reduced"),
        "reduction Y dims checked");
  pydnnBackendSetAttribute(rop, PYDNN_ATTR_OPERATION_REDUCTION_YDESC, PYDNN_TYPE_BACKEND_DESCRIPTOR, 1, &ry);
  CHECK(pydnnBackendFinalize(rop) == PYDNN_STATUS_SUCCESS, "finalize operation reduction (row max)");

  CHECK(pydnnMatmul(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL) != PYDNN_STATUS_SUCCESS, "matmul NULL handle");
  CHECK(pydnnBackendDestroyDescriptor(op) == PYDNN_STATUS_SUCCESS && pydnnBackendDestroyDescriptor(NULL) ==
            PYDNN_STATUS_SUCCESS, "destroy");
  CHECK(pydnnBackendFinalize(op) == PYDNN_STATUS_BAD_PARAM, "destroyed descriptor refused");
  printf("%d failures\n", failures);
  return failures != 0;
}
