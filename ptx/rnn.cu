// RNN cells of cuDNN's RNN API (pydnn/ops/rnn/): the element-wise work of one time step, around the GEMMs
// that pydnn's matmul does (the input projection of every step at once, the recurrent projection per step).
//
//   fwd_cell<T, CELL>      (gridDim.y = n: both directions of a bidirectional layer, or the layers of one wave of
//                          the layer wavefront, see RnnDir2)
//                          gates of one step from xp (+ bw) and hp (+ br): state out, h out (and y);
//                          rows past their length carry the state and write 0 to y; saves the gate values
//                          (act) for the backward.   CELL: 0 RNN_RELU, 1 RNN_TANH, 2 LSTM, 3 GRU (cuDNN's)
//   proj_commit<T>         LSTM projection: h = aux_in (the projected m) on active rows, else h_prev; y
//                          (gridDim.y = n: the layers of one wave, as bwd_proj_pre)
//   state_init<T>          h_out <- h_prev (hx, NULL: 0); s_out <- aux_in (cx for LSTM) or hx (GRU)
//   state_out<T>           aux (hy) <- h_prev; ... (cy) <- s_prev, either NULL
//   pack<T>                mode 0: internal [seq, batch, vec] (aux) <- user layout (aux_in), padding rows 0;
//                          mode 1: user layout (aux) <- internal (aux_in), padding rows = fill; mode 2: the
//                          same, padding rows untouched
//   bwd_state_init<T>      gh <- dy slot (dhy, NULL: 0) as S; ghrec (aux, every split) <- 0; gc <- dm slot
//                          (dcy, NULL: 0)
//   bwd_cell<T, CELL>      pre-activation gradients of one step (dxa, dha), dc and carried dh (S)
//   bwd_proj_pre<T>        projection: the total dh of a step into aux (time t's row block of dh_all)
//   bwd_state_out<T>       aux (dhx) <- gh + ghrec; dy slot unused; dm slot unused; (dcx) <- gc
//   skip_dx<T>             SKIP_INPUT: aux[row, j] (+)= sum_g aux_in[row, g * hidden + j]
//   bias_partial<T>        bias gradients, first pass: the column sums of aux_in [rows, ld_aux] over gridDim.y
//                          chunks of `vec` rows, in S, into s_out[chunk * cols + col]
//   bias_final<T>          aux[col] (+)= the `seq` partial sums of column col, in chunk order (deterministic)
// All state and gate math is in float (double for T = double), and the state buffers (RnnParams' "state" ones: c / h,
// the saved gates, the carried gradients, the bias partial sums) hold that type S = Acc<T>::type.
// T: float, double, or pydnn::h16_t for half and bfloat16 alike (RnnParams.fmt names the format of the launch:
// one instantiation for both 16-bit types, bit-identical to a typed one; common/h16.cuh).
#include "common/types.cuh"
#include "common/h16.cuh"
#include "rnn_params.h"

namespace pydnn {
namespace rnn {

template <class T> struct Acc { typedef float type; };
template <> struct Acc<double> { typedef double type; };
// a state buffer of RnnParams (void * in the params) as S = Acc<T>::type
template <class T> __device__ __forceinline__ typename Acc<T>::type* sv(void* q) {
  return static_cast<typename Acc<T>::type*>(q);
}
template <class T> __device__ __forceinline__ const typename Acc<T>::type* sv(const void* q) {
  return static_cast<const typename Acc<T>::type*>(q);
}

// Element <-> S: T = h16_t is half or bfloat16 data by p.fmt (one instantiation for both 16-bit types,
// common/h16.cuh: the same conversions as half_t's and bf16_t's, chosen by the launch).
template <class T> __device__ __forceinline__ typename Acc<T>::type to_acc(const RnnParams&, T v) {
  return load<typename Acc<T>::type>(v);
}
__device__ __forceinline__ float to_acc(const RnnParams& p, h16_t v) { return h16_to_float(v, p.fmt); }
template <class T> struct Io {
  template <class A> static __device__ __forceinline__ T put(const RnnParams&, A v) { return Store<T>::from(v); }
};
template <> struct Io<h16_t> {
  static __device__ __forceinline__ h16_t put(const RnnParams& p, float v) { return h16_from_float(v, p.fmt); }
};

template <class T> __device__ __forceinline__ typename Acc<T>::type ld(const RnnParams& p, const void* q, i64 i) {
  return to_acc(p, static_cast<const T*>(q)[i]);
}
template <class T, class A> __device__ __forceinline__ void st(const RnnParams& p, void* q, i64 i, A v) {
  static_cast<T*>(q)[i] = Io<T>::put(p, v);
}
__device__ __forceinline__ float sigm(float v) { return 1.0f / (1.0f + __expf(-v)); }
__device__ __forceinline__ double sigm(double v) { return 1.0 / (1.0 + exp(-v)); }
__device__ __forceinline__ float tnh(float v) { return tanhf(v); }
__device__ __forceinline__ double tnh(double v) { return tanh(v); }

constexpr int kThreads = 256;

// The recurrent GEMMs may split K into nsplit batches whose partial sums lie split_stride elements apart
// (more blocks for the small M = batch GEMMs): every reader adds them up in float.
template <class T> __device__ __forceinline__ typename Acc<T>::type ld_split(const RnnParams& p, const void* q, i64 i) {
  typename Acc<T>::type s = ld<T>(p, q, i);
  for (int z = 1; z < p.nsplit; ++z) s += ld<T>(p, q, (i64)z * p.split_stride + i);
  return s;
}

__device__ __forceinline__ i64 gid() { return (i64)blockIdx.x * blockDim.x + threadIdx.x; }

// The parameters of this block's direction: the launch's own (blockIdx.y = 0), or the reverse direction's / the
// wave's other layers' (blockIdx.y = y >= 1: pointers moved by dir2[y - 1]'s byte offsets, its time t), see RnnDir2.
template <class P> __device__ __forceinline__ void shift(P*& ptr, long long by) {
  if (ptr) ptr = (P*)((const char*)ptr + by);
}
__device__ __forceinline__ RnnParams direction(const RnnParams& p0) {
  RnnParams p = p0;
  if (blockIdx.y == 0) return p;
  const RnnDir2& d = p0.dir2[blockIdx.y - 1];
  shift(p.xp, d.xp); shift(p.hp, d.hp); shift(p.bw, d.bw); shift(p.br, d.br);
  shift(p.h_prev, d.h_prev); shift(p.h_out, d.h_out); shift(p.s_prev, d.s_prev); shift(p.s_out, d.s_out);
  shift(p.y, d.y); shift(p.act, d.act); shift(p.dy, d.dy); shift(p.dxa, d.dxa); shift(p.dha, d.dha);
  shift(p.gh, d.gh); shift(p.ghrec, d.ghrec); shift(p.gc, d.gc);
  shift(p.dm, d.dm); shift(p.aux, d.aux); shift(p.aux_in, d.aux_in);
  p.t = d.t;
  return p;
}

template <class T, int CELL>
__global__ void __launch_bounds__(kThreads) fwd_cell(const RnnParams p0) {
  typedef typename Acc<T>::type A;
  const RnnParams p = direction(p0);
  const i64 idx = gid();
  const int H = p.hidden;
  if (idx >= (i64)p.batch * H) return;
  const int b = (int)(idx / H), j = (int)(idx % H);
  const bool active = p.t < p.lens[b];
  constexpr int G = CELL == 2 ? 4 : (CELL == 3 ? 3 : 1);
  const bool proj = CELL == 2 && p.out != H;
  A xa[G], ha[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    xa[g] = ld<T>(p, p.xp, (i64)b * p.ld_xp + (i64)g * p.gs_xp + j);
    ha[g] = ld_split<T>(p, p.hp, (i64)b * G * H + (i64)g * H + j);
    if (p.bw) xa[g] += ld<T>(p, p.bw, (i64)g * H + j);
    if (p.br) ha[g] += ld<T>(p, p.br, (i64)g * H + j);
  }
  A* act = p.act ? sv<T>(p.act) + (i64)b * (CELL >= 2 ? 4 : 1) * H + j : nullptr;
  A* s_out = sv<T>(p.s_out);
  const A* s_prev = sv<T>(p.s_prev);
  if (CELL == 2) {
    const A cp = s_prev[(i64)b * H + j];
    const A i = sigm(xa[0] + ha[0]), f = sigm(xa[1] + ha[1]), g = tnh(xa[2] + ha[2]), o = sigm(xa[3] + ha[3]);
    A c = f * cp + i * g;
    if (p.clip) c = c != c ? c : fmin(fmax(c, (A)p.lclip), (A)p.rclip);
    const A m = o * tnh(c);
    if (!active) {
      s_out[(i64)b * H + j] = cp;
      if (proj) st<T>(p, p.h_out, (i64)b * H + j, (A)0);
      else st<T>(p, p.h_out, (i64)b * H + j, ld<T>(p, p.h_prev, (i64)b * H + j));
      if (p.y && !proj) st<T>(p, p.y, (i64)b * p.ld_y + j, (A)0);
      return;
    }
    s_out[(i64)b * H + j] = c;
    st<T>(p, p.h_out, (i64)b * H + j, m);
    if (p.y && !proj) st<T>(p, p.y, (i64)b * p.ld_y + j, m);
    if (act) { act[0] = i; act[H] = f; act[2 * H] = g; act[3 * H] = o; }
  } else if (CELL == 3) {
    const A hprev = s_prev[(i64)b * H + j];
    if (!active) {
      s_out[(i64)b * H + j] = hprev;
      st<T>(p, p.h_out, (i64)b * H + j, ld<T>(p, p.h_prev, (i64)b * H + j));
      if (p.y) st<T>(p, p.y, (i64)b * p.ld_y + j, (A)0);
      return;
    }
    const A r = sigm(xa[0] + ha[0]), z = sigm(xa[1] + ha[1]);
    const A n = tnh(xa[2] + r * ha[2]);
    const A h = ((A)1 - z) * n + z * hprev;
    s_out[(i64)b * H + j] = h;
    st<T>(p, p.h_out, (i64)b * H + j, h);
    if (p.y) st<T>(p, p.y, (i64)b * p.ld_y + j, h);
    if (act) { act[0] = r; act[H] = z; act[2 * H] = n; act[3 * H] = ha[2]; }
  } else {
    if (!active) {
      st<T>(p, p.h_out, (i64)b * H + j, ld<T>(p, p.h_prev, (i64)b * H + j));
      if (p.y) st<T>(p, p.y, (i64)b * p.ld_y + j, (A)0);
      return;
    }
    const A a = xa[0] + ha[0];
    const A h = CELL == 0 ? fmax(a, (A)0) : tnh(a);
    st<T>(p, p.h_out, (i64)b * H + j, h);
    if (p.y) st<T>(p, p.y, (i64)b * p.ld_y + j, h);
    if (act) act[0] = h;
  }
}

// h_out[b, k] = active ? aux_in[b, k] : h_prev[b, k]; y[b, k] = active ? aux_in : 0 (k < out)
// (gridDim.y = n: the layers of one wave of the wavefront, see RnnDir2; nsplit > 1: aux_in holds the projection
// GEMM's split-K partial sums, split_stride apart, added in S and rounded once)
template <class T>
__global__ void __launch_bounds__(kThreads) proj_commit(const RnnParams p0) {
  const RnnParams p = direction(p0);
  const i64 idx = gid();
  if (idx >= (i64)p.batch * p.out) return;
  const int b = (int)(idx / p.out), k = (int)(idx % p.out);
  const bool active = p.t < p.lens[b];
  const T v = !active ? static_cast<const T*>(p.h_prev)[idx]
              : p.nsplit > 1 ? Io<T>::put(p, ld_split<T>(p, p.aux_in, idx)) : static_cast<const T*>(p.aux_in)[idx];
  static_cast<T*>(p.h_out)[idx] = v;
  if (p.y) st<T>(p, p.y, (i64)b * p.ld_y + k, active ? to_acc(p, v) : (typename Acc<T>::type)0);
}

// h_out [batch, out] <- h_prev (hx; NULL: 0); s_out [batch, hidden] <- aux_in (cx, dtype) when mode == 2
// (LSTM), <- h_prev when mode == 3 (GRU, out == hidden); NULL sources give 0. Threads: batch * max(out, hidden).
template <class T>
__global__ void __launch_bounds__(kThreads) state_init(const RnnParams p) {
  typedef typename Acc<T>::type A;
  const i64 idx = gid();
  const int w = p.out > p.hidden ? p.out : p.hidden;
  if (idx >= (i64)p.batch * w) return;
  const int b = (int)(idx / w), k = (int)(idx % w);
  if (k < p.out) st<T>(p, p.h_out, (i64)b * p.out + k, p.h_prev ? ld<T>(p, p.h_prev, (i64)b * p.out + k) : (A)0);
  if (k < p.hidden && p.s_out) {
    const void* src = p.mode == 2 ? p.aux_in : p.h_prev;
    sv<T>(p.s_out)[(i64)b * p.hidden + k] = src ? ld<T>(p, src, (i64)b * p.hidden + k) : (A)0;
  }
}

// aux (hy) [batch, out] <- h_prev; dxa slot reused as cy [batch, hidden] <- s_prev. Either output NULL.
template <class T>
__global__ void __launch_bounds__(kThreads) state_out(const RnnParams p) {
  const i64 idx = gid();
  const int w = p.out > p.hidden ? p.out : p.hidden;
  if (idx >= (i64)p.batch * w) return;
  const int b = (int)(idx / w), k = (int)(idx % w);
  if (k < p.out && p.aux) static_cast<T*>(p.aux)[(i64)b * p.out + k] = static_cast<const T*>(p.h_prev)[(i64)b * p.out + k];
  if (k < p.hidden && p.dxa) st<T>(p, p.dxa, (i64)b * p.hidden + k, sv<T>(p.s_prev)[(i64)b * p.hidden + k]);
}

// One block per internal row (t, b) = blockIdx.x; threads over the vec elements.
template <class T>
__global__ void __launch_bounds__(kThreads) pack(const RnnParams p) {
  typedef typename Acc<T>::type A;
  const int t = blockIdx.x / p.batch, b = blockIdx.x % p.batch;
  const bool valid = t < p.lens[b];
  i64 urow;
  if (p.layout == 0) {
    urow = (i64)t * p.batch + b;
  } else if (p.layout == 2) {
    urow = (i64)b * p.seq + t;
  } else {  // packed: rows of earlier steps, then the rank of b among the sequences longer than t
    __shared__ long long off;
    if (threadIdx.x == 0) {
      long long s = 0;
      for (int k = 0; k < p.batch; ++k) s += min(p.lens[k], t) + (k < b && p.lens[k] > t ? 1 : 0);
      off = s;
    }
    __syncthreads();
    urow = off;
  }
  const i64 irow = (i64)blockIdx.x;
  for (int k = threadIdx.x; k < p.vec; k += blockDim.x) {
    if (p.mode == 0) {
      st<T>(p, p.aux, irow * p.vec + k, valid ? ld<T>(p, p.aux_in, urow * p.vec + k) : (A)0);
    } else if (valid) {
      static_cast<T*>(p.aux)[urow * p.vec + k] = static_cast<const T*>(p.aux_in)[irow * p.vec + k];
    } else if (p.layout != 1 && p.mode == 1) {
      st<T>(p, p.aux, urow * p.vec + k, (A)p.fill);
    }
  }
}

template <class T, int CELL>
__global__ void __launch_bounds__(kThreads) bwd_cell(const RnnParams p0) {
  typedef typename Acc<T>::type A;
  const RnnParams p = direction(p0);
  const i64 idx = gid();
  const int H = p.hidden;
  if (idx >= (i64)p.batch * H) return;
  const int b = (int)(idx / H), j = (int)(idx % H);
  const bool active = p.t < p.lens[b];
  constexpr int G = CELL == 2 ? 4 : (CELL == 3 ? 3 : 1);
  const bool proj = CELL == 2 && p.out != H;
  const i64 ho = (i64)b * p.out + j;  // (b, j) in [batch, out] (out == hidden without a projection)
  A* gh = sv<T>(p.gh);
  A* gc = sv<T>(p.gc);
  const A* s_prev = sv<T>(p.s_prev);
  if (!active) {
    if (!proj) gh[ho] += ld_split<T>(p, p.ghrec, ho);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      st<T>(p, p.dxa, (i64)b * G * H + (i64)g * H + j, (A)0);
      if (p.dha) st<T>(p, p.dha, (i64)b * G * H + (i64)g * H + j, (A)0);
    }
    return;
  }
  A dh;
  if (proj) {
    dh = ld<T>(p, p.dm, (i64)b * H + j);
  } else {
    dh = gh[ho] + ld_split<T>(p, p.ghrec, ho);
    if (p.dy) dh += ld<T>(p, p.dy, (i64)b * p.ld_y + j);
  }
  const A* act = sv<T>(p.act) + (i64)b * (CELL >= 2 ? 4 : 1) * H + j;
  A d[G], dr[G];
  if (CELL == 2) {
    const A i = act[0], f = act[H], g = act[2 * H], o = act[3 * H];
    const A c = sv<T>(p.s_out)[(i64)b * H + j], cp = s_prev[(i64)b * H + j];
    const A tc = tnh(c);
    A dc = gc[(i64)b * H + j] + dh * o * ((A)1 - tc * tc);
    if (p.clip && !((A)p.lclip < c && c < (A)p.rclip)) dc = (A)0;
    d[0] = dc * g * i * ((A)1 - i);
    d[1] = dc * cp * f * ((A)1 - f);
    d[2] = dc * i * ((A)1 - g * g);
    d[3] = dh * tc * o * ((A)1 - o);
    gc[(i64)b * H + j] = dc * f;
    if (!proj) gh[ho] = (A)0;
#pragma unroll
    for (int k = 0; k < G; ++k) dr[k] = d[k];
  } else if (CELL == 3) {
    const A r = act[0], z = act[H], n = act[2 * H], han = act[3 * H];
    const A hp = s_prev[(i64)b * H + j];
    const A dn = dh * ((A)1 - z) * ((A)1 - n * n);
    d[1] = dh * (hp - n) * z * ((A)1 - z);
    d[0] = dn * han * r * ((A)1 - r);
    d[2] = dn;
    dr[0] = d[0];
    dr[1] = d[1];
    dr[2] = dn * r;
    gh[ho] = dh * z;
  } else {
    const A h = act[0];
    d[0] = dh * (CELL == 0 ? (h > (A)0 ? (A)1 : (A)0) : (A)1 - h * h);
    dr[0] = d[0];
    gh[ho] = (A)0;
  }
#pragma unroll
  for (int g = 0; g < G; ++g) {
    st<T>(p, p.dxa, (i64)b * G * H + (i64)g * H + j, d[g]);
    if (p.dha) st<T>(p, p.dha, (i64)b * G * H + (i64)g * H + j, dr[g]);
  }
}

// aux (time t's dh_all rows [batch, out]) <- gh + ghrec + dy on active rows (gh <- 0), 0 elsewhere (gh += ghrec)
// (gridDim.y = n: the layers of one wave of the wavefront, see RnnDir2)
template <class T>
__global__ void __launch_bounds__(kThreads) bwd_proj_pre(const RnnParams p0) {
  typedef typename Acc<T>::type A;
  const RnnParams p = direction(p0);
  const i64 idx = gid();
  if (idx >= (i64)p.batch * p.out) return;
  const int b = (int)(idx / p.out), k = (int)(idx % p.out);
  A* gh = sv<T>(p.gh);
  const A g = gh[idx] + ld_split<T>(p, p.ghrec, idx);
  if (p.t < p.lens[b]) {
    const A d = g + (p.dy ? ld<T>(p, p.dy, (i64)b * p.ld_y + k) : (A)0);
    st<T>(p, p.aux, idx, d);
    gh[idx] = (A)0;
  } else {
    st<T>(p, p.aux, idx, (A)0);
    gh[idx] = g;
  }
}

// gh [batch, out] <- dy (dhy; NULL: 0), ghrec <- 0, gc [batch, hidden] <- dm (dcy; NULL: 0) when gc
template <class T>
__global__ void __launch_bounds__(kThreads) bwd_state_init(const RnnParams p) {
  typedef typename Acc<T>::type A;
  const i64 idx = gid();
  const int w = p.out > p.hidden ? p.out : p.hidden;
  if (idx >= (i64)p.batch * w) return;
  const int b = (int)(idx / w), k = (int)(idx % w);
  const i64 o = (i64)b * p.out + k;
  if (k < p.out) {
    sv<T>(p.gh)[o] = p.dy ? ld<T>(p, p.dy, o) : (A)0;
    for (int z = 0; z < (p.nsplit > 1 ? p.nsplit : 1); ++z) st<T>(p, p.aux, (i64)z * p.split_stride + o, (A)0);
  }
  if (k < p.hidden && p.gc) sv<T>(p.gc)[(i64)b * p.hidden + k] = p.dm ? ld<T>(p, p.dm, (i64)b * p.hidden + k) : (A)0;
}

// aux (dhx) [batch, out] <- gh + ghrec; dxa slot reused as dcx [batch, hidden] <- gc. Either output NULL.
template <class T>
__global__ void __launch_bounds__(kThreads) bwd_state_out(const RnnParams p) {
  typedef typename Acc<T>::type A;
  const i64 idx = gid();
  const int w = p.out > p.hidden ? p.out : p.hidden;
  if (idx >= (i64)p.batch * w) return;
  const int b = (int)(idx / w), k = (int)(idx % w);
  const i64 o = (i64)b * p.out + k;
  if (k < p.out && p.aux) st<T>(p, p.aux, o, sv<T>(p.gh)[o] + ld_split<T>(p, p.ghrec, o));
  if (k < p.hidden && p.dxa) st<T>(p, p.dxa, (i64)b * p.hidden + k, sv<T>(p.gc)[(i64)b * p.hidden + k]);
}

// aux [rows, ld_aux] (+)= sum over cols gates of aux_in [rows, cols * hidden]; threads rows * hidden
template <class T>
__global__ void __launch_bounds__(kThreads) skip_dx(const RnnParams p) {
  typedef typename Acc<T>::type A;
  const i64 idx = gid();
  if (idx >= p.rows * p.hidden) return;
  const i64 r = idx / p.hidden;
  const int j = (int)(idx % p.hidden);
  A s = p.mode & PYDNN_RNN_MODE_ADD ? ld<T>(p, p.aux, r * p.ld_aux + j) : (A)0;
  for (int g = 0; g < p.cols; ++g) s += ld<T>(p, p.aux_in, r * p.cols * p.hidden + (i64)g * p.hidden + j);
  st<T>(p, p.aux, r * p.ld_aux + j, s);
}

template <class T>
__global__ void __launch_bounds__(kThreads) bias_partial(const RnnParams p) {
  typedef typename Acc<T>::type A;
  const i64 col = gid();
  if (col >= p.cols) return;
  const i64 r0 = (i64)blockIdx.y * p.vec, r1 = min(p.rows, r0 + p.vec);
  A s = (A)0;
  for (i64 r = r0; r < r1; ++r) s += ld<T>(p, p.aux_in, r * p.ld_aux + col);
  sv<T>(p.s_out)[(i64)blockIdx.y * p.cols + col] = s;
}

template <class T>
__global__ void __launch_bounds__(kThreads) bias_final(const RnnParams p) {
  typedef typename Acc<T>::type A;
  const i64 col = gid();
  if (col >= p.cols) return;
  A s = (A)0;
  for (int c = 0; c < p.seq; ++c) s += sv<T>(p.s_prev)[(i64)c * p.cols + col];
  if (p.mode & PYDNN_RNN_MODE_ADD) s += ld<T>(p, p.aux, col);
  st<T>(p, p.aux, col, s);
}

}  // namespace rnn
}  // namespace pydnn
