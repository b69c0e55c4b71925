/* Multi-head attention descriptors through the C API, without a GPU: attention descriptor set / get (NULL
 * dropouts come back NULL), sequence data descriptor set / get (12 lengths: more than PYDNN_DIM_MAX; the
 * paddingFill value in the data type, or NULL), their errors with the argument named, destroy (NULL too).
 * Prints "ok <what>" / "FAIL <what>" lines; exits non-zero on failure. */
#include <string.h>
#include <pydnn.h>
#include "check.h"

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  char msg[512];
  pydnnAttnDescriptor_t a;
  if (pydnnCreateAttnDescriptor(&a) != PYDNN_STATUS_SUCCESS) {
    pydnnGetLastErrorString(msg, sizeof msg);
    printf("FAIL create attention descriptor (%s)\n", msg);
    return 1;
  }
  pydnnStatus_t st = pydnnSetAttnDescriptor(a, PYDNN_ATTN_QUERYMAP_ONE_TO_ONE | PYDNN_ATTN_ENABLE_PROJ_BIASES, 4,
                                            0.25, PYDNN_DATA_HALF, PYDNN_DATA_FLOAT, PYDNN_DEFAULT_MATH, NULL, NULL,
                                            40, 24, 16, 64, 64, 64, 0, 9, 11, 3, 4);
  CHECK(st == PYDNN_STATUS_SUCCESS, "set attention descriptor");
  unsigned mode = 0;
  int nh = 0, s[11];
  double sm = 0;
  pydnnDataType_t dt, cp;
  pydnnMathType_t mt;
  pydnnDropoutDescriptor_t d1 = (pydnnDropoutDescriptor_t)1, d2 = (pydnnDropoutDescriptor_t)1;
  st = pydnnGetAttnDescriptor(a, &mode, &nh, &sm, &dt, &cp, &mt, &d1, &d2, &s[0], &s[1], &s[2], &s[3], &s[4], &s[5],
                              &s[6], &s[7], &s[8], &s[9], &s[10]);
  CHECK(st == PYDNN_STATUS_SUCCESS && mode == 3 && nh == 4 && sm == 0.25 && dt == PYDNN_DATA_HALF &&
            cp == PYDNN_DATA_FLOAT && mt == PYDNN_DEFAULT_MATH && d1 == NULL && d2 == NULL && s[0] == 40 &&
            s[2] == 16 && s[6] == 0 && s[9] == 3 && s[10] == 4,
        "get attention descriptor");
  st = pydnnSetAttnDescriptor(a, 0, 4, 0.25, PYDNN_DATA_HALF, PYDNN_DATA_FLOAT, PYDNN_DEFAULT_MATH, NULL, NULL, 40,
                              24, 16, 64, 32, 64, 0, 9, 11, 3, 4);
  pydnnGetLastErrorString(msg, sizeof msg);
  CHECK(st == PYDNN_STATUS_BAD_PARAM && strstr(msg, "kProjSize: 32 differs from qProjSize 64"), "kProjSize != qProjSize");

  pydnnSeqDataDescriptor_t q;
  CHECK(pydnnCreateSeqDataDescriptor(&q) == PYDNN_STATUS_SUCCESS, "create sequence data descriptor");
  int dims[4];
  dims[PYDNN_SEQDATA_TIME_DIM] = 9;
  dims[PYDNN_SEQDATA_BATCH_DIM] = 3;
  dims[PYDNN_SEQDATA_BEAM_DIM] = 4;
  dims[PYDNN_SEQDATA_VECT_DIM] = 40;
  pydnnSeqDataAxis_t axes[4] = {PYDNN_SEQDATA_TIME_DIM, PYDNN_SEQDATA_BATCH_DIM, PYDNN_SEQDATA_BEAM_DIM,
                                PYDNN_SEQDATA_VECT_DIM};
  int lens[12] = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 9, 9};
  unsigned short fill = 0xBC00; /* -1.0 in half */
  st = pydnnSetSeqDataDescriptor(q, PYDNN_DATA_HALF, 4, dims, axes, 12, lens, &fill);
  CHECK(st == PYDNN_STATUS_SUCCESS, "set sequence data descriptor (12 lengths, a fill)");
  pydnnDataType_t gdt;
  int nb = 0, gd[4] = {0}, gl[12], ga[4] = {0};
  size_t n = 0;
  unsigned short gf = 0;
  memset(gl, 0xff, sizeof gl);
  st = pydnnGetSeqDataDescriptor(q, &gdt, &nb, 4, gd, (pydnnSeqDataAxis_t *)ga, &n, 11, gl, &gf);
  CHECK(st == PYDNN_STATUS_SUCCESS && gdt == PYDNN_DATA_HALF && nb == 4 && n == 12 &&
            memcmp(gd, dims, sizeof dims) == 0 && ga[0] == PYDNN_SEQDATA_TIME_DIM && ga[3] == PYDNN_SEQDATA_VECT_DIM &&
            memcmp(gl, lens, 11 * sizeof(int)) == 0 && gl[11] == -1 && gf == 0xBC00,
        "get sequence data descriptor (11 of 12 lengths requested, the fill)");
  st = pydnnGetSeqDataDescriptor(q, &gdt, &nb, 4, gd, (pydnnSeqDataAxis_t *)ga, &n, 12, gl, NULL);
  CHECK(st == PYDNN_STATUS_SUCCESS && gl[11] == 9, "get sequence data descriptor, paddingFill NULL");
  lens[5] = 10;
  st = pydnnSetSeqDataDescriptor(q, PYDNN_DATA_HALF, 4, dims, axes, 12, lens, NULL);
  pydnnGetLastErrorString(msg, sizeof msg);
  CHECK(st == PYDNN_STATUS_BAD_PARAM && strstr(msg, "seqLengthArray[5]: 10 is outside [0, 9]"), "length past time");
  st = pydnnSetSeqDataDescriptor(q, PYDNN_DATA_HALF, 4, dims, axes, 11, lens, NULL);
  pydnnGetLastErrorString(msg, sizeof msg);
  CHECK(st == PYDNN_STATUS_BAD_PARAM && strstr(msg, "seqLengthArraySize: 11 must be batch * beam = 12"),
        "seqLengthArraySize != batch * beam");
  CHECK(pydnnDestroySeqDataDescriptor(q) == PYDNN_STATUS_SUCCESS, "destroy sequence data descriptor");
  CHECK(pydnnDestroySeqDataDescriptor(NULL) == PYDNN_STATUS_SUCCESS, "destroy NULL sequence data descriptor");
  CHECK(pydnnDestroyAttnDescriptor(a) == PYDNN_STATUS_SUCCESS, "destroy attention descriptor");
  st = pydnnGetAttnDescriptor(a, &mode, &nh, &sm, &dt, &cp, &mt, &d1, &d2, &s[0], &s[1], &s[2], &s[3], &s[4], &s[5],
                              &s[6], &s[7], &s[8], &s[9], &s[10]);
  CHECK(st == PYDNN_STATUS_BAD_PARAM, "get after destroy: BAD_PARAM");
  return failures ? 1 : 0;
}
