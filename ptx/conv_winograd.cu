// Convolution WINOGRAD_NONFUSED, F(m x m, 3 x 3) with m = 2 or 4 (template M): forward and backward data
// (see conv_winograd_params.h). alpha = m + 2:
//
//   filter transform  V = G f G^T          (alpha x alpha per (o, i); G is alpha x 3)
//   input transform   U = B^T d B          (per (tile, channel); d the alpha x alpha input patch, stride m)
//   alpha^2 GEMMs     M_b = U_b V_b^T      (matmul's gemm_simt, or the implicit GEMM for double; launched
//                                           from Python)
//   output transform  Y = A^T M A          (m x m outputs per (tile, o)) + alpha / beta / fused epilogue
//
// Backward filter (BWD_FILTER_ALGO_WINOGRAD_NONFUSED): the gradient of Y = A^T (V . U) A with respect to
// f is G^T (sum over tiles of (A dY A^T) . U) G, so
//   input transform   U = B^T x B          (x's patches, as the forward)
//   grad transform    D = A dy A^T         (per (tile, channel of dy); dy's m x m tiles)
//   P x splits GEMMs  M_s,b = D_b^T U_b    (over the tiles of chunk s; launched from Python)
//   filter grad       dw = G^T (sum_s M_s) G, + alpha / beta (the splits summed in a fixed order)
//
// Every output element is written by one thread with a fixed summation order: deterministic. The
// transforms run in Acc (float, double for double data); 16-bit data is read and written at the ends.
// Thread index order follows the tensor layout (channels fastest for NHWC, tiles fastest otherwise),
// flag-selected on the host through u_c / m_c == 1.
#include "common/params.h"
#include "common/types.cuh"
#include "conv_winograd_params.h"

namespace pydnn {
namespace conv_wino {

// a / b (a, b >= 0) for the index math: 32-bit where both fit, as they do for every problem of fewer than 2^32
// (tile, channel) pairs; the 64-bit division is a subroutine call of ~70 instructions, and a transform
// thread ran 4 of them (SASS of input_transform<float, 4>: 5 calls).
__device__ __forceinline__ long long idiv(long long a, long long b) {
  return ((unsigned long long)(a | b) >> 32) == 0 ? (long long)((unsigned)a / (unsigned)b) : a / b;
}

// which (fast, slow) pair a flat index is, for (tile, channel) kernels: channel-fast when chan_fast
__device__ __forceinline__ void split_index(long long i, long long tiles, int chans, bool chan_fast, long long& m,
                                            int& c) {
  if (chan_fast) { m = idiv(i, chans); c = (int)(i - m * chans); }
  else { c = (int)idiv(i, tiles); m = i - (long long)c * tiles; }
}

__device__ __forceinline__ void tile_coords(const WinoParams& p, long long m, int& n, int& th, int& tw) {
  const long long r = idiv(m, p.tiles_w);
  tw = (int)(m - r * p.tiles_w);
  const long long q = idiv(r, p.tiles_h);
  th = (int)(r - q * p.tiles_h);
  n = (int)q;
}

// Where tile m's transform starts in U (or D): chunks of p.chunk tiles p.u_s apart (the backward
// filter's split of its tile reduction), else m * u_m.
__device__ __forceinline__ long long tile_offset(const WinoParams& p, long long m) {
  if (p.chunk >= p.tiles) return m * p.u_m;
  const long long s = idiv(m, p.chunk);
  return s * p.u_s + (m - s * p.chunk) * p.u_m;
}

// The transform matrices of F(m x m, 3 x 3) (Lavin & Gray; interpolation points 0, +-1 (, +-2), inf),
// alpha = m + 2: B^T (alpha x alpha), G (alpha x 3), A^T (m x alpha). Indices are compile-time constants
// after unrolling, so each coefficient folds into the code; zero coefficients are skipped (not multiplied:
// 0 * inf would make a NaN the convolution does not have) and +-1 ones are adds.
template <int M> struct Wino;
template <> struct Wino<2> {
  static constexpr int kA = 4;
  __device__ static __forceinline__ double bt(int i, int j) {
    const double t[4][4] = {{1, 0, -1, 0}, {0, 1, 1, 0}, {0, -1, 1, 0}, {0, 1, 0, -1}};
    return t[i][j];
  }
  __device__ static __forceinline__ double g(int i, int j) {
    const double t[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
    return t[i][j];
  }
  __device__ static __forceinline__ double at(int i, int j) {
    const double t[2][4] = {{1, 1, 1, 0}, {0, 1, -1, -1}};
    return t[i][j];
  }
};
template <> struct Wino<4> {
  static constexpr int kA = 6;
  __device__ static __forceinline__ double bt(int i, int j) {
    const double t[6][6] = {{4, 0, -5, 0, 1, 0},  {0, -4, -4, 1, 1, 0}, {0, 4, -4, -1, 1, 0},
                            {0, -2, -1, 2, 1, 0}, {0, 2, -1, -2, 1, 0}, {0, 4, 0, -5, 0, 1}};
    return t[i][j];
  }
  __device__ static __forceinline__ double g(int i, int j) {
    const double t[6][3] = {{1.0 / 4, 0, 0},           {-1.0 / 6, -1.0 / 6, -1.0 / 6}, {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                            {1.0 / 24, 1.0 / 12, 1.0 / 6}, {1.0 / 24, -1.0 / 12, 1.0 / 6}, {0, 0, 1}};
    return t[i][j];
  }
  __device__ static __forceinline__ double at(int i, int j) {
    const double t[4][6] = {{1, 1, 1, 1, 1, 0}, {0, 1, -1, 2, -2, 0}, {0, 1, 1, 4, 4, 0}, {0, 1, -1, 8, -8, 1}};
    return t[i][j];
  }
};

// s (+)= c * v for a compile-time c; `first`: s holds nothing yet.
template <class Acc>
__device__ __forceinline__ void madd(Acc& s, bool& first, double c, Acc v) {
  if (c == 0.0) return;
  const Acc term = c == 1.0 ? v : (c == -1.0 ? -v : Acc(c) * v);
  s = first ? term : s + term;
  first = false;
}

// V[b][o][i] = (G f G^T)[b], one thread per (o, i); b = the alpha x alpha positions.
template <class T, int M>
__global__ void __launch_bounds__(256) filter_transform(const WinoParams p) {
  typedef typename AccOf<T>::type Acc;
  typedef Wino<M> W;
  constexpr int A = W::kA;
  const int kout = p.groups * p.cout_g;
  const long long total = (long long)kout * p.cin_g;
  const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int o = (int)(idx / p.cin_g), i = (int)(idx - (long long)o * p.cin_g);
  const T* w = static_cast<const T*>(p.w);
  long long base;
  if (p.flags & PYDNN_WINO_FLAG_BWD) {  // o is a channel of x (dx), i a channel of y within the group
    const int g = o / p.cout_g, oc = o - g * p.cout_g;
    base = (long long)(g * p.cin_g + i) * p.ws[0] + (long long)oc * p.ws[1];
  } else {
    base = (long long)o * p.ws[0] + (long long)i * p.ws[1];
  }
  const bool flip = p.flags & PYDNN_WINO_FLAG_FLIP;
  Acc f[3][3];
#pragma unroll
  for (int r = 0; r < 3; ++r)
#pragma unroll
    for (int s = 0; s < 3; ++s)
      f[r][s] = load<Acc>(w[base + (long long)(flip ? 2 - r : r) * p.ws[2] + (long long)(flip ? 2 - s : s) * p.ws[3]]);
  Acc t[A][3];  // G f
#pragma unroll
  for (int a = 0; a < A; ++a)
#pragma unroll
    for (int s = 0; s < 3; ++s) {
      bool first = true;
      t[a][s] = Acc(0);
#pragma unroll
      for (int r = 0; r < 3; ++r) madd(t[a][s], first, W::g(a, r), f[r][s]);
    }
  Acc* v = static_cast<Acc*>(p.v);
#pragma unroll
  for (int a = 0; a < A; ++a)
#pragma unroll
    for (int b = 0; b < A; ++b) {
      bool first = true;
      Acc x = Acc(0);
#pragma unroll
      for (int s = 0; s < 3; ++s) madd(x, first, W::g(b, s), t[a][s]);
      v[(long long)(a * A + b) * total + idx] = x;  // V[b] is kout x cin_g
    }
}

// The two tile transforms share one body: out = C d C^T for one (tile, channel), C an alpha x P matrix
// and d the P x P patch of the channel's plane at (tile * m - pad), zero outside it; stored as U:
// p.u at tile_offset + c * u_c, position (a, b) at + (a * alpha + b) * u_b (u_c / u_b pick the layout).
//   input transform  U = B^T d B   C = B^T (alpha x alpha), P = alpha, the convolution's padding
//   grad transform   D = A dy A^T  C = A = (A^T)^T (alpha x m), P = m, no padding (backward filter: dy's
//                                  m x m tiles)
// Coef::c(a, k) is C's coefficient, a compile-time constant after unrolling.
template <int M> struct InputCoef {
  static constexpr int P = Wino<M>::kA;
  __device__ static __forceinline__ double c(int a, int k) { return Wino<M>::bt(a, k); }
};
template <int M> struct GradCoef {
  static constexpr int P = M;
  __device__ static __forceinline__ double c(int a, int k) { return Wino<M>::at(k, a); }
};

template <class T, int M, class Coef>
__device__ __forceinline__ void tile_transform(const WinoParams& p, int pad_h, int pad_w) {
  typedef typename AccOf<T>::type Acc;
  constexpr int A = Wino<M>::kA, P = Coef::P;
  const int chans = p.groups * p.cin_g;
  const long long total = p.tiles * chans;
  const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  long long m;
  int c;
  split_index(idx, p.tiles, chans, p.u_c == 1, m, c);
  int n, th, tw;
  tile_coords(p, m, n, th, tw);
  const T* in = static_cast<const T*>(p.in) + (long long)n * p.is[0] + (long long)c * p.is[1];
  const int h0 = th * M - pad_h, w0 = tw * M - pad_w;
  const bool live = n < p.batch;  // the backward filter's last chunk runs past the tiles: zeros
  Acc d[P][P];
#pragma unroll
  for (int i = 0; i < P; ++i)
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const int hh = h0 + i, ww = w0 + j;
      d[i][j] = (live && (unsigned)hh < (unsigned)p.in_h && (unsigned)ww < (unsigned)p.in_w)
                    ? load<Acc>(in[(long long)hh * p.is[2] + (long long)ww * p.is[3]]) : Acc(0);
    }
  Acc t[A][P];  // C d
#pragma unroll
  for (int a = 0; a < A; ++a)
#pragma unroll
    for (int j = 0; j < P; ++j) {
      bool first = true;
      t[a][j] = Acc(0);
#pragma unroll
      for (int k = 0; k < P; ++k) madd(t[a][j], first, Coef::c(a, k), d[k][j]);
    }
  Acc* u = static_cast<Acc*>(p.u);
  const long long base = tile_offset(p, m) + (long long)c * p.u_c;
#pragma unroll
  for (int a = 0; a < A; ++a)
#pragma unroll
    for (int b = 0; b < A; ++b) {
      bool first = true;
      Acc x = Acc(0);
#pragma unroll
      for (int k = 0; k < P; ++k) madd(x, first, Coef::c(b, k), t[a][k]);
      u[base + (a * A + b) * p.u_b] = x;
    }
}

// U = B^T d B for one (tile, input channel); d the alpha x alpha input patch at (tile * m - pad).
template <class T, int M>
__global__ void __launch_bounds__(256) input_transform(const WinoParams p) {
  tile_transform<T, M, InputCoef<M>>(p, p.pad_h, p.pad_w);
}

// D = A dy A^T for one (tile, channel of dy) (backward filter): dy's m x m tile at (tile * m), zero past
// its edges; stored as input_transform stores U (p.u, u_c, u_b, chunks).
template <class T, int M>
__global__ void __launch_bounds__(256) grad_transform(const WinoParams p) {
  tile_transform<T, M, GradCoef<M>>(p, 0, 0);
}

// dw = alpha * G^T (sum over s of M_s) G + beta * dw for one (o, i) (backward filter; o the filter's
// output channel, i its input channel within the group): M_s[b] at m[(s * P + b) * K * cin_g + o * cin_g
// + i], the splits added in order s = 0, 1, ... (the same bits every run). The taps rotated by 180
// degrees in CONVOLUTION mode (flag FLIP), as the forward's filter transform reads them.
template <class T, int M>
__global__ void __launch_bounds__(256) filter_grad(const WinoParams p) {
  typedef typename AccOf<T>::type Acc;
  typedef Wino<M> W;
  constexpr int A = W::kA;
  const long long total = (long long)p.groups * p.cout_g * p.cin_g;
  const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const Acc* mm = static_cast<const Acc*>(p.m) + idx;
  Acc x[A][A];
#pragma unroll
  for (int a = 0; a < A; ++a)
#pragma unroll
    for (int b = 0; b < A; ++b) x[a][b] = mm[(a * A + b) * total];
  for (int s = 1; s < p.splits; ++s) {
    const Acc* ms = mm + (long long)s * A * A * total;
#pragma unroll
    for (int a = 0; a < A; ++a)
#pragma unroll
      for (int b = 0; b < A; ++b) x[a][b] += ms[(a * A + b) * total];
  }
  Acc t[3][A];  // G^T M
#pragma unroll
  for (int r = 0; r < 3; ++r)
#pragma unroll
    for (int b = 0; b < A; ++b) {
      bool first = true;
      t[r][b] = Acc(0);
#pragma unroll
      for (int a = 0; a < A; ++a) madd(t[r][b], first, W::g(a, r), x[a][b]);
    }
  const int o = (int)(idx / p.cin_g), i = (int)(idx - (long long)o * p.cin_g);
  T* w = static_cast<T*>(p.out) + (long long)o * p.ws[0] + (long long)i * p.ws[1];
  const bool flip = p.flags & PYDNN_WINO_FLAG_FLIP;
  const Acc alpha = Acc(p.alpha), beta = Acc(p.beta);
#pragma unroll
  for (int r = 0; r < 3; ++r)
#pragma unroll
    for (int s = 0; s < 3; ++s) {
      bool first = true;
      Acc g = Acc(0);
#pragma unroll
      for (int b = 0; b < A; ++b) madd(g, first, W::g(b, s), t[r][b]);
      T* dst = w + (long long)(flip ? 2 - r : r) * p.ws[2] + (long long)(flip ? 2 - s : s) * p.ws[3];
      Acc v = alpha * g;
      if (p.flags & PYDNN_FLAG_BETA) v += beta * load<Acc>(*dst);
      *dst = store<T>(v);
    }
}

// M outputs of one row, stored at once (alignment = size: 16 bytes for 4 floats).
template <class T, int N> struct alignas(sizeof(T) * N) OutVec { T v[N]; };

template <class Acc> __device__ __forceinline__ Acc activate(const WinoParams& p, Acc v) {
  const bool nan = v != v;
  switch (p.act) {
    case 1:  // RELU
      if (nan) return (p.flags & PYDNN_FLAG_NAN_PROP) ? v : Acc(0);
      return v > Acc(0) ? v : Acc(0);
    case 2:  // CLIPPED_RELU
      if (nan) return (p.flags & PYDNN_FLAG_NAN_PROP) ? v : Acc(0);
      return v > Acc(0) ? (v < Acc(p.coef) ? v : Acc(p.coef)) : Acc(0);
    case 3: return sigmoid(v);
    case 4: return m_tanh(v);
    case 5: return v > Acc(0) ? v : Acc(p.coef) * m_expm1(v);
    default: return v;
  }
}

// Y = A^T M A for one (tile, output channel), then alpha / beta and the fused epilogue.
template <class T, int M>
__global__ void __launch_bounds__(256) output_transform(const WinoParams p) {
  typedef typename AccOf<T>::type Acc;
  typedef Wino<M> W;
  constexpr int A = W::kA;
  const int chans = p.groups * p.cout_g;
  const long long total = p.tiles * chans;
  const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  long long m;
  int o;
  split_index(idx, p.tiles, chans, p.m_c == 1, m, o);
  int n, th, tw;
  tile_coords(p, m, n, th, tw);
  const Acc* mm = static_cast<const Acc*>(p.m);
  const long long base = m * p.m_m + (long long)o * p.m_c, bstep = (long long)chans * p.m_c;
  Acc x[A][A];
#pragma unroll
  for (int a = 0; a < A; ++a)
#pragma unroll
    for (int b = 0; b < A; ++b) x[a][b] = mm[base + (a * A + b) * bstep];
  Acc t[M][A];  // A^T M
#pragma unroll
  for (int a = 0; a < M; ++a)
#pragma unroll
    for (int b = 0; b < A; ++b) {
      bool first = true;
      t[a][b] = Acc(0);
#pragma unroll
      for (int k = 0; k < A; ++k) madd(t[a][b], first, W::at(a, k), x[k][b]);
    }
  T* out = static_cast<T*>(p.out);
  const Acc alpha = Acc(p.alpha), beta = Acc(p.beta), alpha2 = Acc(p.alpha2);
  const bool wide = p.os[3] == 1 && tw * M + M <= p.out_w;  // the row's M outputs contiguous and in range
#pragma unroll
  for (int a = 0; a < M; ++a) {
    const int hh = th * M + a;
    if (hh >= p.out_h) continue;
    const long long row = (long long)n * p.os[0] + (long long)o * p.os[1] + (long long)hh * p.os[2];
    Acc r[M];
#pragma unroll
    for (int b = 0; b < M; ++b) {
      const int ww = tw * M + b;
      bool first = true;
      Acc y = Acc(0);
#pragma unroll
      for (int k = 0; k < A; ++k) madd(y, first, W::at(b, k), t[a][k]);
      r[b] = alpha * y;
      if (ww >= p.out_w) continue;
      const long long off = row + (long long)ww * p.os[3];
      if (p.flags & PYDNN_FLAG_BETA) r[b] += beta * load<Acc>(out[off]);
      if (p.flags & PYDNN_WINO_FLAG_Z) {
        const long long zoff = (long long)n * p.zs[0] + (long long)o * p.zs[1] + (long long)hh * p.zs[2] +
                               (long long)ww * p.zs[3];
        r[b] += alpha2 * load<Acc>(static_cast<const T*>(p.z)[zoff]);
      }
      if (p.flags & PYDNN_WINO_FLAG_BIAS) r[b] += load<Acc>(static_cast<const T*>(p.bias)[o * p.bias_stride]);
      r[b] = activate(p, r[b]);
    }
    // One M-element store per row where the row's outputs are contiguous and aligned (NCHW-like y with
    // its width a multiple of M: 4 scalar stores 16 bytes apart across a warp's threads cost the 56^2
    // layer's output transform ~1.6x its memory time on the H200, tools/bench_convolution_algos.py).
    T* dst = out + row + (long long)tw * M * p.os[3];
    if (wide && (reinterpret_cast<unsigned long long>(dst) % sizeof(OutVec<T, M>)) == 0) {
      OutVec<T, M> v;
#pragma unroll
      for (int b = 0; b < M; ++b) v.v[b] = store<T>(r[b]);
      *reinterpret_cast<OutVec<T, M>*>(dst) = v;
    } else {
#pragma unroll
      for (int b = 0; b < M; ++b)
        if (tw * M + b < p.out_w) dst[(long long)b * p.os[3]] = store<T>(r[b]);
    }
  }
}

}  // namespace conv_wino
}  // namespace pydnn
