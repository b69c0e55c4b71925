// ptx/gemm_f64.cu compiled for the host (common/types.cuh here): each block runs as 256 std::threads that meet at
// a std::barrier for __syncthreads (the kernel's shared-memory tiles are function statics, one per block run).
// Built and loaded by tests/ops/rnn/test_gemm_f64_host_cpu.py.
#include <barrier>
#include <thread>
#include <vector>

#include "common/types.cuh"
static std::barrier<>* g_bar;
#define __syncthreads() g_bar->arrive_and_wait()
#include "gemm_f64.cu"

thread_local pydnn_dim3 blockIdx, threadIdx, blockDim, gridDim;

template <int TA, int TB> static void run(const GemmF64Params& p, unsigned gx, unsigned gy, unsigned gz) {
  for (unsigned z = 0; z < gz; ++z)
    for (unsigned y = 0; y < gy; ++y)
      for (unsigned x = 0; x < gx; ++x) {
        std::barrier<> bar(256);
        g_bar = &bar;
        std::vector<std::thread> th;
        for (unsigned t = 0; t < 256; ++t)
          th.emplace_back([=, &p] {
            blockIdx = {x, y, z};
            threadIdx = {t, 0, 0};
            blockDim = {256, 1, 1};
            gridDim = {gx, gy, gz};
            pydnn::gemm_f64::dgemm<TA, TB>(p);
          });
        for (auto& t : th) t.join();
      }
}

extern "C" int gemm_f64_host(int ta, int tb, const GemmF64Params* p, unsigned gx, unsigned gy, unsigned gz) {
  if (!ta && !tb) run<0, 0>(*p, gx, gy, gz);
  else if (!ta && tb) run<0, 1>(*p, gx, gy, gz);
  else if (ta && !tb) run<1, 0>(*p, gx, gy, gz);
  else run<1, 1>(*p, gx, gy, gz);
  return 0;
}
