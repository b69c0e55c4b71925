/* Pooling's C face without a GPU: descriptor set / get round trips (2-d and N-d), the output-dim queries,
 * and bad parameters with the message naming the argument. Prints "ok <what>" / "FAIL <what>" lines. */
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

int main(void) {
  pydnnPoolingDescriptor_t p;
  CHECK(pydnnCreatePoolingDescriptor(&p) == PYDNN_STATUS_SUCCESS, "create pooling descriptor");
  CHECK(pydnnSetPooling2dDescriptor(p, PYDNN_POOLING_MAX_DETERMINISTIC, PYDNN_PROPAGATE_NAN, 3, 2, 1, 0, 2, 1) ==
            PYDNN_STATUS_SUCCESS, "set 2d");
  pydnnPoolingMode_t mode;
  pydnnNanPropagation_t nan;
  int wh, ww, vp, hp, vs, hs;
  CHECK(pydnnGetPooling2dDescriptor(p, &mode, &nan, &wh, &ww, &vp, &hp, &vs, &hs) == PYDNN_STATUS_SUCCESS &&
            mode == PYDNN_POOLING_MAX_DETERMINISTIC && nan == PYDNN_PROPAGATE_NAN && wh == 3 && ww == 2 && vp == 1 &&
            hp == 0 && vs == 2 && hs == 1, "get 2d");

  pydnnTensorDescriptor_t x;
  pydnnCreateTensorDescriptor(&x);
  pydnnSetTensor4dDescriptor(x, PYDNN_TENSOR_NHWC, PYDNN_DATA_BFLOAT16, 2, 5, 7, 8);
  int n, c, h, w;
  CHECK(pydnnGetPooling2dForwardOutputDim(p, x, &n, &c, &h, &w) == PYDNN_STATUS_SUCCESS && n == 2 && c == 5 &&
            h == 4 && w == 7, "2d output dims");
  int dims[4] = {0, 0, 0, 0};
  CHECK(pydnnGetPoolingNdForwardOutputDim(p, x, 4, dims) == PYDNN_STATUS_SUCCESS && dims[0] == 2 && dims[1] == 5 &&
            dims[2] == 4 && dims[3] == 7, "Nd output dims of a 4-d input");

  const int win[3] = {2, 3, 3}, pad[3] = {0, 1, 2}, str[3] = {1, 2, 3};
  CHECK(pydnnSetPoolingNdDescriptor(p, PYDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING, PYDNN_NOT_PROPAGATE_NAN, 3, win,
                                    pad, str) == PYDNN_STATUS_SUCCESS, "set 3d");
  int nb = 0, gw[3] = {0}, gp[3] = {0}, gs[3] = {0};
  CHECK(pydnnGetPoolingNdDescriptor(p, 3, &mode, &nan, &nb, gw, gp, gs) == PYDNN_STATUS_SUCCESS && nb == 3 &&
            mode == PYDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING && gw[2] == 3 && gp[2] == 2 && gs[1] == 2, "get 3d");
  pydnnTensorDescriptor_t x5;
  pydnnCreateTensorDescriptor(&x5);
  const int xd[5] = {1, 4, 5, 6, 7};
  pydnnSetTensorNdDescriptorEx(x5, PYDNN_TENSOR_NCHW, PYDNN_DATA_FLOAT, 5, xd);
  int od[5] = {0};
  CHECK(pydnnGetPoolingNdForwardOutputDim(p, x5, 5, od) == PYDNN_STATUS_SUCCESS && od[2] == 4 && od[3] == 3 &&
            od[4] == 3, "3d output dims");

  /* bad parameters: status and the argument's name */
  CHECK(pydnnSetPooling2dDescriptor(p, PYDNN_POOLING_MAX, PYDNN_NOT_PROPAGATE_NAN, 3, 3, 3, 0, 2, 2) ==
            PYDNN_STATUS_BAD_PARAM && last_error_has("pydnnSetPooling2dDescriptor: verticalPadding: 3 must be smaller"),
        "padding >= window");
  CHECK(pydnnSetPooling2dDescriptor(p, PYDNN_POOLING_MAX, PYDNN_NOT_PROPAGATE_NAN, 3, 3, 0, 0, 2, 0) ==
            PYDNN_STATUS_BAD_PARAM && last_error_has("horizontalStride: 0 must be positive"), "zero stride");
  const int bad_win[2] = {2, -1}, zero[2] = {0, 0}, one[2] = {1, 1};
  CHECK(pydnnSetPoolingNdDescriptor(p, PYDNN_POOLING_MAX, PYDNN_NOT_PROPAGATE_NAN, 2, bad_win, zero, one) ==
            PYDNN_STATUS_BAD_PARAM && last_error_has("windowDimA[1]: -1 must be positive"), "negative window");
  pydnnSetPooling2dDescriptor(p, PYDNN_POOLING_MAX, PYDNN_NOT_PROPAGATE_NAN, 9, 3, 0, 0, 1, 1);
  CHECK(pydnnGetPooling2dForwardOutputDim(p, x, &n, &c, &h, &w) == PYDNN_STATUS_BAD_PARAM &&
            last_error_has("inputTensorDesc: dim 2 (7, padded by 2 * 0) is smaller than the window (9)"),
        "window larger than the padded input");
  CHECK(pydnnGetPooling2dForwardOutputDim(p, x, NULL, &c, &h, &w) == PYDNN_STATUS_BAD_PARAM_NULL_POINTER,
        "NULL out-pointer");
  CHECK(pydnnDestroyPoolingDescriptor(p) == PYDNN_STATUS_SUCCESS, "destroy");
  CHECK(pydnnDestroyPoolingDescriptor(NULL) == PYDNN_STATUS_SUCCESS, "destroy NULL");
  pydnnDestroyTensorDescriptor(x);
  pydnnDestroyTensorDescriptor(x5);
  return failures ? 1 : 0;
}
