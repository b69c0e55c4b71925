/* An LSTM from C on a GPU: weights written through pydnnGetRNNWeightParams, pydnnRNNForward (training)
 * against a double-precision LSTM written here from cuDNN's equations (variable lengths, hx / cx, padding
 * fill), pydnnRNNBackwardData_v8 (finite, padding 0), pydnnRNNBackwardWeights_v8 (ADD: a second call
 * doubles the gradient), and bad arguments refused with their names. Prints "ok <what>" / "FAIL <what>". */
#include "gpu_test.h"

enum { T = 4, B = 3, I = 3, H = 4, G = 4 };

static int msg_has(const char *needle) {
  char msg[512];
  pydnnGetLastErrorString(msg, sizeof msg);
  return strstr(msg, needle) != NULL;
}

static double sig(double v) { return 1.0 / (1.0 + exp(-v)); }

int main(void) {
  load_driver();
  pydnnHandle_t h;
  pydnnStatus_t st = pydnnCreate(&h);
  CHECK(st == PYDNN_STATUS_SUCCESS, "create handle");
  if (st != PYDNN_STATUS_SUCCESS) return 1;
  const int lens[B] = {4, 2, 3};
  pydnnRNNDescriptor_t r;
  pydnnCreateRNNDescriptor(&r);
  CHECK(pydnnSetRNNDescriptor_v8(r, PYDNN_RNN_ALGO_STANDARD, PYDNN_LSTM, PYDNN_RNN_DOUBLE_BIAS, PYDNN_UNIDIRECTIONAL,
                                 PYDNN_LINEAR_INPUT, PYDNN_DATA_FLOAT, PYDNN_DATA_FLOAT, PYDNN_DEFAULT_MATH, I, H, H, 1,
                                 NULL, PYDNN_RNN_PADDED_IO_ENABLED) == PYDNN_STATUS_SUCCESS, "set rnn descriptor");
  pydnnRNNDataDescriptor_t xd, yd;
  float fill = -7.0f;
  pydnnCreateRNNDataDescriptor(&xd);
  pydnnCreateRNNDataDescriptor(&yd);
  pydnnSetRNNDataDescriptor(xd, PYDNN_DATA_FLOAT, PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, T, B, I, lens, NULL);
  pydnnSetRNNDataDescriptor(yd, PYDNN_DATA_FLOAT, PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, T, B, H, lens, &fill);
  pydnnTensorDescriptor_t hd, md, bd;
  pydnnCreateTensorDescriptor(&hd);
  pydnnCreateTensorDescriptor(&md);
  pydnnCreateTensorDescriptor(&bd);
  int hdim[3] = {1, B, H}, hstr[3] = {B * H, H, 1};
  pydnnSetTensorNdDescriptor(hd, PYDNN_DATA_FLOAT, 3, hdim, hstr);
  size_t wsize = 0, ws = 0, rs = 0;
  CHECK(pydnnGetRNNWeightSpaceSize(h, r, &wsize) == PYDNN_STATUS_SUCCESS &&
        wsize == sizeof(float) * (G * H * I + G * H * H + 2 * G * H), "weight space size");
  CHECK(pydnnGetRNNTempSpaceSizes(h, r, PYDNN_FWD_MODE_TRAINING, xd, &ws, &rs) == PYDNN_STATUS_SUCCESS && ws > 0 &&
        rs > 0, "temp space sizes");
  static float W[G][H][I], R[G][H][H], bW[G][H], bR[G][H], x[T][B][I], hx[B][H], cx[B][H];
  srand(99);
#define RND() ((float)(rand() / (double)RAND_MAX - 0.5))
  for (int g = 0; g < G; g++)
    for (int j = 0; j < H; j++) {
      for (int k = 0; k < I; k++) W[g][j][k] = RND();
      for (int k = 0; k < H; k++) R[g][j][k] = RND();
      bW[g][j] = RND(); bR[g][j] = RND();
    }
  for (int t = 0; t < T; t++) for (int b = 0; b < B; b++) for (int k = 0; k < I; k++) x[t][b][k] = 2 * RND();
  for (int b = 0; b < B; b++) for (int j = 0; j < H; j++) { hx[b][j] = RND(); cx[b][j] = RND(); }
  CUdeviceptr dw, ddw, dwsp, drsp, dx, dy, dhx, dhy, dcx, dcy, dlens, ddx, ddy, ddhx, ddcx;
  int cu = cuMemAlloc(&dw, wsize) | cuMemAlloc(&ddw, wsize) | cuMemAlloc(&dwsp, ws) | cuMemAlloc(&drsp, rs) |
           cuMemAlloc(&dx, sizeof x) | cuMemAlloc(&dy, T * B * H * 4) | cuMemAlloc(&dhx, sizeof hx) |
           cuMemAlloc(&dhy, sizeof hx) | cuMemAlloc(&dcx, sizeof cx) | cuMemAlloc(&dcy, sizeof cx) |
           cuMemAlloc(&dlens, sizeof lens) | cuMemAlloc(&ddx, sizeof x) | cuMemAlloc(&ddy, T * B * H * 4) |
           cuMemAlloc(&ddhx, sizeof hx) | cuMemAlloc(&ddcx, sizeof cx);
  cu |= cuMemcpyHtoD(dx, x, sizeof x) | cuMemcpyHtoD(dhx, hx, sizeof hx) | cuMemcpyHtoD(dcx, cx, sizeof cx) |
        cuMemcpyHtoD(dlens, lens, sizeof lens);
  CHECK(cu == 0, "device memory");
  /* weights through GetRNNWeightParams: linLayerID 0-3 input (i, f, g, o), 4-7 recurrent */
  int wp_ok = 1;
  for (int lin = 0; lin < 2 * G; lin++) {
    void *ma = NULL, *ba = NULL;
    wp_ok &= pydnnGetRNNWeightParams(h, r, 0, wsize, (void *)dw, lin, md, &ma, bd, &ba) == PYDNN_STATUS_SUCCESS;
    int nb = 0, dims[3] = {0}, strides[3] = {0};
    pydnnDataType_t t;
    pydnnGetTensorNdDescriptor(md, 3, &t, &nb, dims, strides);
    int g = lin % G, cols = lin < G ? I : H;
    wp_ok &= nb == 3 && dims[0] == 1 && dims[1] == H && dims[2] == cols && ma != NULL && ba != NULL;
    wp_ok &= cuMemcpyHtoD((CUdeviceptr)ma, lin < G ? (void *)W[g] : (void *)R[g], sizeof(float) * H * cols) == 0;
    wp_ok &= cuMemcpyHtoD((CUdeviceptr)ba, lin < G ? bW[g] : bR[g], sizeof(float) * H) == 0;
  }
  CHECK(wp_ok, "weights written through pydnnGetRNNWeightParams");
  void *ma = NULL;
  CHECK(pydnnGetRNNWeightParams(h, r, 0, wsize, (void *)dw, 8, NULL, &ma, NULL, NULL) == PYDNN_STATUS_SUCCESS &&
        ma == NULL, "no projection: linLayerID 8 is NULL");
  CHECK(pydnnGetRNNWeightParams(h, r, 0, wsize, (void *)dw, 9, md, &ma, bd, &ma) == PYDNN_STATUS_BAD_PARAM &&
        msg_has("linLayerID"), "linLayerID 9 refused");
  CHECK(pydnnGetRNNWeightParams(h, r, 1, wsize, (void *)dw, 0, md, &ma, bd, &ma) == PYDNN_STATUS_BAD_PARAM &&
        msg_has("pseudoLayer"), "pseudoLayer 1 refused");

  CHECK(pydnnRNNForward(h, r, PYDNN_FWD_MODE_TRAINING, (void *)dlens, xd, (void *)dx, yd, (void *)dy, hd,
                        (void *)dhx, (void *)dhy, hd, (void *)dcx, (void *)dcy, wsize, (void *)dw, ws - 1,
                        (void *)dwsp, rs, (void *)drsp) == PYDNN_STATUS_BAD_PARAM && msg_has("workSpaceSize"),
        "small workspace refused");
  CHECK(pydnnRNNForward(h, r, PYDNN_FWD_MODE_TRAINING, (void *)dlens, xd, (void *)dx, yd, (void *)dy, hd,
                        (void *)dhx, (void *)dhy, hd, (void *)dcx, (void *)dcy, wsize, (void *)dw, ws, (void *)dwsp,
                        rs, (void *)drsp) == PYDNN_STATUS_SUCCESS, "forward");
  static float y[T][B][H], hy[B][H], cy[B][H];
  cuCtxSynchronize();
  cuMemcpyDtoH(y, dy, sizeof y);
  cuMemcpyDtoH(hy, dhy, sizeof hy);
  cuMemcpyDtoH(cy, dcy, sizeof cy);
  /* the reference */
  double err_y = 0, err_h = 0, err_c = 0;
  int fill_ok = 1;
  for (int b = 0; b < B; b++) {
    double hh[H], cc[H];
    for (int j = 0; j < H; j++) { hh[j] = hx[b][j]; cc[j] = cx[b][j]; }
    for (int t = 0; t < T; t++) {
      if (t >= lens[b]) {
        for (int j = 0; j < H; j++) fill_ok &= y[t][b][j] == fill;
        continue;
      }
      double a[G][H], hn[H];
      for (int g = 0; g < G; g++)
        for (int j = 0; j < H; j++) {
          double s = bW[g][j] + bR[g][j];
          for (int k = 0; k < I; k++) s += W[g][j][k] * x[t][b][k];
          for (int k = 0; k < H; k++) s += R[g][j][k] * hh[k];
          a[g][j] = s;
        }
      for (int j = 0; j < H; j++) {
        double i = sig(a[0][j]), f = sig(a[1][j]), g = tanh(a[2][j]), o = sig(a[3][j]);
        cc[j] = f * cc[j] + i * g;
        hn[j] = o * tanh(cc[j]);
      }
      for (int j = 0; j < H; j++) {
        hh[j] = hn[j];
        err_y = fmax(err_y, fabs(y[t][b][j] - hn[j]));
      }
    }
    for (int j = 0; j < H; j++) {
      err_h = fmax(err_h, fabs(hy[b][j] - hh[j]));
      err_c = fmax(err_c, fabs(cy[b][j] - cc[j]));
    }
  }
  printf("max errors y %.3g hy %.3g cy %.3g\n", err_y, err_h, err_c);
  CHECK(err_y < 1e-5, "forward y");
  CHECK(err_h < 1e-5, "forward hy");
  CHECK(err_c < 1e-5, "forward cy");
  CHECK(fill_ok, "forward padding fill");

  static float gy[T][B][H], gx[T][B][I], ghx[B][H], gcx[B][H];
  for (int t = 0; t < T; t++) for (int b = 0; b < B; b++) for (int j = 0; j < H; j++) gy[t][b][j] = RND();
  cuMemcpyHtoD(ddy, gy, sizeof gy);
  CHECK(pydnnRNNBackwardData_v8(h, r, (void *)dlens, yd, (void *)dy, (void *)ddy, xd, (void *)ddx, hd, (void *)dhx,
                                NULL, (void *)ddhx, hd, (void *)dcx, NULL, (void *)ddcx, wsize, (void *)dw, ws,
                                (void *)dwsp, rs, (void *)drsp) == PYDNN_STATUS_SUCCESS, "backward data");
  cuCtxSynchronize();
  cuMemcpyDtoH(gx, ddx, sizeof gx);
  cuMemcpyDtoH(ghx, ddhx, sizeof ghx);
  cuMemcpyDtoH(gcx, ddcx, sizeof gcx);
  int finite = 1, pad0 = 1;
  double mag = 0;
  for (int t = 0; t < T; t++)
    for (int b = 0; b < B; b++)
      for (int k = 0; k < I; k++) {
        finite &= isfinite(gx[t][b][k]);
        if (t >= lens[b]) pad0 &= gx[t][b][k] == 0.0f;
        else mag += fabs(gx[t][b][k]);
      }
  for (int b = 0; b < B; b++) for (int j = 0; j < H; j++) finite &= isfinite(ghx[b][j]) && isfinite(gcx[b][j]);
  CHECK(finite && mag > 0, "backward data finite");
  CHECK(pad0, "backward data padding 0");
  static float zero[G * H * (I + H + 2)], g1[G * H * (I + H + 2)], g2[G * H * (I + H + 2)];
  cuMemcpyHtoD(ddw, zero, wsize);
  CHECK(pydnnRNNBackwardWeights_v8(h, r, PYDNN_WGRAD_MODE_ADD, (void *)dlens, xd, (void *)dx, hd, (void *)dhx, yd,
                                   (void *)dy, wsize, (void *)ddw, ws, (void *)dwsp, rs, (void *)drsp) ==
        PYDNN_STATUS_SUCCESS, "backward weights");
  cuCtxSynchronize();
  cuMemcpyDtoH(g1, ddw, wsize);
  pydnnRNNBackwardWeights_v8(h, r, PYDNN_WGRAD_MODE_ADD, (void *)dlens, xd, (void *)dx, hd, (void *)dhx, yd,
                             (void *)dy, wsize, (void *)ddw, ws, (void *)dwsp, rs, (void *)drsp);
  cuCtxSynchronize();
  cuMemcpyDtoH(g2, ddw, wsize);
  int doubled = 1;
  double gmag = 0;
  for (size_t i = 0; i < wsize / 4; i++) {
    doubled &= fabs(g2[i] - 2 * g1[i]) <= 1e-5 * (1 + fabs(g1[i]));
    gmag += fabs(g1[i]);
  }
  CHECK(doubled && gmag > 0, "weights ADD doubles");
  CHECK(pydnnRNNBackwardWeights_v8(h, r, 7, (void *)dlens, xd, (void *)dx, hd, (void *)dhx, yd, (void *)dy, wsize,
                                   (void *)ddw, ws, (void *)dwsp, rs, (void *)drsp) == PYDNN_STATUS_BAD_PARAM &&
        msg_has("addGrad"), "bad addGrad refused");
  pydnnDestroyRNNDataDescriptor(xd);
  pydnnDestroyRNNDataDescriptor(yd);
  pydnnDestroyRNNDescriptor(r);
  pydnnDestroy(h);
  printf("%d failures\n", failures);
  return failures != 0;
}
