// Host run of ptx/conv_fft.cu's kernels (driven by tests/test_convolution_fft_cpu.py): the real kernel
// source compiled as C++ with the CUDA qualifiers defined away and a float / double shim of
// common/types.cuh. The
// test writes the plan's FftParams struct (the bytes of its ctypes mirror), the launch grids and the
// operands; this program points the struct at its buffers, runs the four kernels block by block (the FFT
// kernels with one thread per block: their loops stride by blockDim.x and the barriers become no-ops;
// the product kernel thread by thread) and writes the output back for the test to compare with the float64
// reference.
//   usage: host DIR filter_blocks input_blocks prod_x prod_y prod_z inverse_blocks f32|f64
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __syncthreads() ((void)0)
#define PYDNN_FFT_HOST 1
struct double2 { double x, y; };
static inline double2 make_double2(double x, double y) { return double2{x, y}; }
static inline void sincospi(double a, double* s, double* c) { *s = sin(M_PI * a); *c = cos(M_PI * a); }
struct D3 { unsigned x, y, z; };
static D3 blockIdx, threadIdx, blockDim, gridDim;
static std::vector<double2> g_smem;
static double2* fft_smem() { return g_smem.data(); }
#include "conv_fft.cu"
using namespace pydnn::conv_fft;

static std::vector<char> slurp(const std::string& path) {
  FILE* f = fopen(path.c_str(), "rb");
  if (!f) { fprintf(stderr, "cannot open %s\n", path.c_str()); exit(2); }
  std::vector<char> v;
  char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) v.insert(v.end(), buf, buf + n);
  fclose(f);
  return v;
}

// one block per transform, one thread per block
template <class F> void run_blocks(long long blocks, F f) {
  blockDim = {1, 1, 1};
  threadIdx = {0, 0, 0};
  for (long long b = 0; b < blocks; ++b) { blockIdx = {(unsigned)b, 0, 0}; f(); }
}

template <class T> int run(char** argv) {
  const std::string dir = argv[1];
  const long long fb = atoll(argv[2]), ib = atoll(argv[3]), px = atoll(argv[4]), py = atoll(argv[5]),
                  pz = atoll(argv[6]), ob = atoll(argv[7]);
  std::vector<char> raw = slurp(dir + "/params.bin");
  if (raw.size() != sizeof(FftParams)) { fprintf(stderr, "params: %zu bytes, struct %zu\n", raw.size(), sizeof(FftParams)); return 2; }
  FftParams p;
  memcpy(&p, raw.data(), sizeof p);
  std::vector<char> in = slurp(dir + "/in.bin"), w = slurp(dir + "/w.bin"), out = slurp(dir + "/out.bin");
  std::vector<char> z, bias;
  if (p.flags & PYDNN_FFT_FLAG_Z) z = slurp(dir + "/z.bin");
  if (p.flags & PYDNN_FFT_FLAG_BIAS) bias = slurp(dir + "/bias.bin");
  const long long bins = p.bins;
  std::vector<double2> xf(bins * p.batch * p.cin), wf(bins * p.cout * p.cin), yf(bins * p.batch * p.cout);
  for (auto* v : {&xf, &wf, &yf}) for (auto& e : *v) e = double2{NAN, NAN};  // unwritten parts show up
  p.in = in.data(); p.w = w.data(); p.out = out.data();
  p.xf = xf.data(); p.wf = wf.data(); p.yf = yf.data();
  p.z = z.empty() ? nullptr : z.data();
  p.bias = bias.empty() ? nullptr : bias.data();
  g_smem.assign((1 << p.log_h) * (1 << p.log_w) + (1 << (p.log_h - 1)) + (1 << (p.log_w - 1)), double2{NAN, NAN});
  run_blocks(fb, [&] { filter_fft<T>(p); });
  run_blocks(ib, [&] { input_fft<T>(p); });
  blockDim = {256, 1, 1};
  for (long long zz = 0; zz < pz; ++zz)
    for (long long yy = 0; yy < py; ++yy)
      for (long long xx = 0; xx < px; ++xx)
        for (unsigned t = 0; t < 256; ++t) {
          blockIdx = {(unsigned)xx, (unsigned)yy, (unsigned)zz};
          threadIdx = {t, 0, 0};
          product<4>(p);
        }
  run_blocks(ob, [&] { inverse_fft<T>(p); });
  FILE* f = fopen((dir + "/out.bin").c_str(), "wb");
  fwrite(out.data(), 1, out.size(), f);
  fclose(f);
  printf("ok\n");
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 9) { fprintf(stderr, "usage: host DIR filter_blocks input_blocks prod_x prod_y prod_z inverse_blocks f32|f64\n"); return 2; }
  return std::string(argv[8]) == "f64" ? run<double>(argv) : run<float>(argv);
}
