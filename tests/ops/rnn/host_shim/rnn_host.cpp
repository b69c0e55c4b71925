// ptx/rnn.cu compiled for the host (see common/types.cuh here): one C entry point per kernel instantiation,
// run over the grid in order. Built and loaded by tests/ops/rnn/test_rnn_kernels_host_cpu.py.
#include "rnn.cu"

thread_local pydnn_dim3 blockIdx, threadIdx, blockDim, gridDim;

template <class F> static void grid(const RnnParams& p, unsigned gx, unsigned gy, F kernel) {
  blockDim = {256, 1, 1};
  gridDim = {gx, gy, 1};
  for (unsigned y = 0; y < gy; ++y)
    for (unsigned x = 0; x < gx; ++x) {
      blockIdx = {x, y, 0};
      for (unsigned t = 0; t < 256; ++t) {
        threadIdx = {t, 0, 0};
        kernel(p);
      }
    }
}

using namespace pydnn;
using namespace pydnn::rnn;

#define ENTRY(TAG, T)                                                                                   \
  extern "C" int rnn_host_##TAG(const char* name, int cell, const RnnParams* p, unsigned gx, unsigned gy) { \
    std::string n(name);                                                                                \
    if (n == "fwd_cell") {                                                                              \
      switch (cell) {                                                                                   \
        case 0: grid(*p, gx, gy, fwd_cell<T, 0>); return 0;                                            \
        case 1: grid(*p, gx, gy, fwd_cell<T, 1>); return 0;                                            \
        case 2: grid(*p, gx, gy, fwd_cell<T, 2>); return 0;                                            \
        case 3: grid(*p, gx, gy, fwd_cell<T, 3>); return 0;                                            \
      }                                                                                                 \
    }                                                                                                   \
    if (n == "bwd_cell") {                                                                              \
      switch (cell) {                                                                                   \
        case 0: grid(*p, gx, gy, bwd_cell<T, 0>); return 0;                                            \
        case 1: grid(*p, gx, gy, bwd_cell<T, 1>); return 0;                                            \
        case 2: grid(*p, gx, gy, bwd_cell<T, 2>); return 0;                                            \
        case 3: grid(*p, gx, gy, bwd_cell<T, 3>); return 0;                                            \
      }                                                                                                 \
    }                                                                                                   \
    if (n == "proj_commit") { grid(*p, gx, gy, proj_commit<T>); return 0; }                          \
    if (n == "state_init") { grid(*p, gx, gy, state_init<T>); return 0; }                            \
    if (n == "state_out") { grid(*p, gx, gy, state_out<T>); return 0; }                              \
    if (n == "pack") { grid(*p, gx, gy, pack<T>); return 0; }                                        \
    if (n == "bwd_proj_pre") { grid(*p, gx, gy, bwd_proj_pre<T>); return 0; }                        \
    if (n == "bwd_state_init") { grid(*p, gx, gy, bwd_state_init<T>); return 0; }                    \
    if (n == "bwd_state_out") { grid(*p, gx, gy, bwd_state_out<T>); return 0; }                      \
    if (n == "skip_dx") { grid(*p, gx, gy, skip_dx<T>); return 0; }                                  \
    if (n == "bias_partial") { grid(*p, gx, gy, bias_partial<T>); return 0; }                        \
    if (n == "bias_final") { grid(*p, gx, gy, bias_final<T>); return 0; }                            \
    return 1;                                                                                           \
  }

#include <string>
ENTRY(f32, float)
ENTRY(f16, h16_t)   // half and bfloat16: one instantiation, the format in RnnParams.fmt (ptx/common/h16.cuh)
ENTRY(bf16, h16_t)
ENTRY(f64, double)
