/* The RNN descriptors from C without a GPU: Set/Get of the RNN descriptor (_v8, every field), the clip
 * (v9), the RNN data descriptor (lengths, padding fill in the data type), and bad arguments refused with
 * their names in the message. Prints "ok <what>" / "FAIL <what>" lines. */
#include <stdio.h>
#include <string.h>
#include <pydnn.h>
#include "check.h"

static int msg_has(const char *needle) {
  char msg[512];
  pydnnGetLastErrorString(msg, sizeof msg);
  return strstr(msg, needle) != NULL;
}

int main(void) {
  pydnnRNNDescriptor_t r;
  CHECK(pydnnCreateRNNDescriptor(&r) == PYDNN_STATUS_SUCCESS, "create rnn descriptor");
  CHECK(pydnnSetRNNDescriptor_v8(r, PYDNN_RNN_ALGO_STANDARD, PYDNN_LSTM, PYDNN_RNN_DOUBLE_BIAS, PYDNN_BIDIRECTIONAL,
                                 PYDNN_LINEAR_INPUT, PYDNN_DATA_HALF, PYDNN_DATA_FLOAT, PYDNN_TENSOR_OP_MATH, 7, 16,
                                 12, 3, NULL, PYDNN_RNN_PADDED_IO_ENABLED) == PYDNN_STATUS_SUCCESS,
        "set rnn descriptor");
  pydnnRNNAlgo_t algo; pydnnRNNMode_t cell; pydnnRNNBiasMode_t bias; pydnnDirectionMode_t dir;
  pydnnRNNInputMode_t inp; pydnnDataType_t dt, prec; pydnnMathType_t math; int isz, hsz, psz, layers;
  pydnnDropoutDescriptor_t drop = (pydnnDropoutDescriptor_t)1; unsigned aux = 99;
  CHECK(pydnnGetRNNDescriptor_v8(r, &algo, &cell, &bias, &dir, &inp, &dt, &prec, &math, &isz, &hsz, &psz, &layers,
                                 &drop, &aux) == PYDNN_STATUS_SUCCESS, "get rnn descriptor");
  CHECK(algo == PYDNN_RNN_ALGO_STANDARD && cell == PYDNN_LSTM && bias == PYDNN_RNN_DOUBLE_BIAS &&
        dir == PYDNN_BIDIRECTIONAL && inp == PYDNN_LINEAR_INPUT && dt == PYDNN_DATA_HALF &&
        prec == PYDNN_DATA_FLOAT && math == PYDNN_TENSOR_OP_MATH && isz == 7 && hsz == 16 && psz == 12 &&
        layers == 3 && drop == NULL && aux == PYDNN_RNN_PADDED_IO_ENABLED, "rnn descriptor round trip");
  pydnnRNNClipMode_t cm; pydnnNanPropagation_t nan; double lo, hi;
  CHECK(pydnnRNNSetClip_v9(r, PYDNN_RNN_CLIP_MINMAX, PYDNN_PROPAGATE_NAN, -1.5, 2.25) == PYDNN_STATUS_SUCCESS,
        "set clip");
  CHECK(pydnnRNNGetClip_v9(r, &cm, &nan, &lo, &hi) == PYDNN_STATUS_SUCCESS && cm == PYDNN_RNN_CLIP_MINMAX &&
        nan == PYDNN_PROPAGATE_NAN && lo == -1.5 && hi == 2.25, "clip round trip");
  CHECK(pydnnRNNSetClip_v9(r, PYDNN_RNN_CLIP_MINMAX, PYDNN_PROPAGATE_NAN, 3.0, 2.0) == PYDNN_STATUS_BAD_PARAM &&
        msg_has("lclip"), "lclip > rclip refused");
  CHECK(pydnnSetRNNDescriptor_v8(r, PYDNN_RNN_ALGO_STANDARD, PYDNN_GRU, PYDNN_RNN_DOUBLE_BIAS, PYDNN_UNIDIRECTIONAL,
                                 PYDNN_LINEAR_INPUT, PYDNN_DATA_FLOAT, PYDNN_DATA_FLOAT, PYDNN_DEFAULT_MATH, 7, 16, 8,
                                 1, NULL, 0) == PYDNN_STATUS_BAD_PARAM && msg_has("projSize") &&
        msg_has("pydnnSetRNNDescriptor_v8"), "projSize with GRU refused");
  CHECK(pydnnSetRNNDescriptor_v8(r, PYDNN_RNN_ALGO_STANDARD, PYDNN_LSTM, PYDNN_RNN_DOUBLE_BIAS, PYDNN_UNIDIRECTIONAL,
                                 PYDNN_LINEAR_INPUT, PYDNN_DATA_INT8, PYDNN_DATA_FLOAT, PYDNN_DEFAULT_MATH, 7, 16, 16,
                                 1, NULL, 0) == PYDNN_STATUS_NOT_SUPPORTED && msg_has("dataType"),
        "int8 data not supported");
  CHECK(pydnnGetRNNDescriptor_v8(r, &algo, &cell, &bias, &dir, &inp, &dt, &prec, &math, &isz, &hsz, &psz, &layers,
                                 &drop, &aux) == PYDNN_STATUS_SUCCESS && cell == PYDNN_LSTM && psz == 12,
        "a refused Set changes nothing");

  pydnnRNNDataDescriptor_t x;
  CHECK(pydnnCreateRNNDataDescriptor(&x) == PYDNN_STATUS_SUCCESS, "create rnn data descriptor");
  int lens[12] = {9, 9, 8, 8, 7, 6, 5, 5, 4, 3, 2, 1};
  float fill = -0.5f;
  CHECK(pydnnSetRNNDataDescriptor(x, PYDNN_DATA_FLOAT, PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, 9, 12, 5, lens, &fill)
        == PYDNN_STATUS_SUCCESS, "set rnn data descriptor (12 lengths)");
  pydnnRNNDataLayout_t lay; int tmax, b, v, got[12] = {0}; float gfill = 0;
  CHECK(pydnnGetRNNDataDescriptor(x, &dt, &lay, &tmax, &b, &v, 12, got, &gfill) == PYDNN_STATUS_SUCCESS &&
        dt == PYDNN_DATA_FLOAT && lay == PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED && tmax == 9 && b == 12 && v == 5 &&
        memcmp(got, lens, sizeof lens) == 0 && gfill == -0.5f, "rnn data descriptor round trip");
  CHECK(pydnnGetRNNDataDescriptor(x, &dt, &lay, &tmax, &b, &v, 0, got, NULL) == PYDNN_STATUS_SUCCESS,
        "get without lengths or fill");
  double dfill = 3.5, gd = 0;
  CHECK(pydnnSetRNNDataDescriptor(x, PYDNN_DATA_DOUBLE, PYDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED, 9, 2, 5, lens,
                                  &dfill) == PYDNN_STATUS_SUCCESS &&
        pydnnGetRNNDataDescriptor(x, &dt, &lay, &tmax, &b, &v, 2, got, &gd) == PYDNN_STATUS_SUCCESS && gd == 3.5,
        "double fill round trip");
  lens[1] = 10;
  CHECK(pydnnSetRNNDataDescriptor(x, PYDNN_DATA_FLOAT, PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, 9, 12, 5, lens, NULL)
        == PYDNN_STATUS_BAD_PARAM && msg_has("seqLengthArray[1]"), "length past maxSeqLength refused");
  lens[1] = 9; lens[3] = 9;
  CHECK(pydnnSetRNNDataDescriptor(x, PYDNN_DATA_FLOAT, PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, 9, 12, 5, lens, NULL)
        == PYDNN_STATUS_BAD_PARAM && msg_has("seqLengthArray[3]"), "packed lengths must not increase");
  CHECK(pydnnSetRNNDataDescriptor(x, PYDNN_DATA_FLOAT, PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED, 9, 12, 5, NULL, NULL)
        == PYDNN_STATUS_BAD_PARAM_NULL_POINTER && msg_has("seqLengthArray"), "NULL lengths refused");
  CHECK(pydnnDestroyRNNDataDescriptor(x) == PYDNN_STATUS_SUCCESS, "destroy rnn data descriptor");
  CHECK(pydnnDestroyRNNDescriptor(r) == PYDNN_STATUS_SUCCESS, "destroy rnn descriptor");
  CHECK(pydnnDestroyRNNDescriptor(NULL) == PYDNN_STATUS_SUCCESS, "destroy NULL");
  printf("%d failures\n", failures);
  return failures != 0;
}
