// Layer / RMS norm rows of any length (`rowx`), a unit of its own (normalization.rowx.<t>, home
// normalization.<t>: the planner names the family's unit): normalization.cu is included for its helpers
// (Frag, load_once, store_out, rows_get, rows_sum; templates, nothing instantiated here but what the unit's
// name expressions ask for), so that adding these kernels neither changes nor recompiles the family's unit.
//
// fwd_rows and bwd_rows need rows whose length is a multiple of the 16-byte vector (every row then starts
// 16-byte aligned) and fwd_rows rows of at most 4 vectors per thread of a 1024-thread block. The rowx
// kernels read any contiguous row with 16-byte vectors in the row's ALIGNED FRAME: row r starts a = (r *
// row stride) mod VEC elements past a 16-byte boundary (x's base is 16-byte aligned: the host's vector
// alternative), so the row is covered by nsv = ceil((a + len) / VEC) aligned vectors, vector vi holding the
// positions j = vi * VEC + e - a (e < VEC); positions outside [0, len) belong to the neighbouring rows (or
// to the padding of the allocation's last 16-byte granule) and are masked: never counted, never written
// (the edge vectors are stored element by element, so that the blocks writing the neighbouring rows are
// never overwritten). The parameters are read at the shifted positions: j0 = vi * VEC - a is the
// vector's first position, and since VEC is a multiple of 4, s = j0 & 3 is the same for every vector of
// the row: per 4 positions two aligned float4 loads from base j0 - s and the 4 floats at offset s (a
// switch on s around compile-time copies; s == 0 loads one float4 per 4 positions, as fwd_rows does). x, y (and dy, dx) must
// share the row alignment (row strides equal mod VEC: host check).
#include "normalization.cu"

namespace pydnn {
namespace norm {
namespace rowx {

template <int S>
__device__ __forceinline__ void take4(const float (&f)[8], float* out) {
#pragma unroll
  for (int e = 0; e < 4; ++e) out[e] = f[e + S];
}

// out[e] = p[j0 + e] for e < 4, 0 <= j0 + e < len, else 0; j0 & 3 = s (pvec: p is 16-byte aligned: two
// aligned float4 loads, one when s == 0, and the 4 floats at offset s).
__device__ __forceinline__ void params4(const float* p, int j0, int len, bool pvec, float* out) {
  if (pvec) {
    const int s = j0 & 3, base = j0 - s;
    float f[8];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int q = base + 4 * i;
      float4 t = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      // (q < len: the float4 holding position len - 1 ends inside the allocation's 16-byte granule)
      if (q >= 0 && q < len && (i == 0 || s != 0)) t = __ldg(reinterpret_cast<const float4*>(p + q));
      f[4 * i] = t.x; f[4 * i + 1] = t.y; f[4 * i + 2] = t.z; f[4 * i + 3] = t.w;
    }
    switch (s) {
      case 0: take4<0>(f, out); break;
      case 1: take4<1>(f, out); break;
      case 2: take4<2>(f, out); break;
      default: take4<3>(f, out); break;
    }
    if (j0 < 0 || j0 + 4 > len)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (j0 + e < 0 || j0 + e >= len) out[e] = 0.0f;
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = j0 + e;
      out[e] = (j >= 0 && j < len) ? __ldg(p + j) : 0.0f;
    }
  }
}

// The elements e in [lo, hi) of f stored at p (the others belong to another row).
template <class T, int VEC>
__device__ __forceinline__ void store_part(const Frag<T, VEC>& f, T* p, int lo, int hi) {
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    if (e < lo || e >= hi) continue;
    if constexpr (sizeof(T) == 4) reinterpret_cast<unsigned*>(p)[e] = f.w[e];
    else reinterpret_cast<unsigned short*>(p)[e] = (unsigned short)(f.w[e / 2] >> (16 * (e & 1)));
  }
}

// CL > 1: v (the block's totals, the same in every thread) summed over the cluster's blocks in rank order
// (every block ends with the same bits). slot: R floats of this block's shared memory, not written again
// until every block has passed the next cluster barrier (callers alternate two slots, and end with a
// cluster barrier before exit: no block leaves while another reads its slot).
template <int CL, int R>
__device__ __forceinline__ void cl_sum(float (&v)[R], float* slot) {
  if (threadIdx.x == 0)
#pragma unroll
    for (int r = 0; r < R; ++r) slot[r] = v[r];
  cluster_sync();
  float t[R];
#pragma unroll
  for (int r = 0; r < R; ++r) t[r] = 0.0f;
#pragma unroll
  for (int q = 0; q < CL; ++q)
#pragma unroll
    for (int r = 0; r < R; ++r) t[r] += ld_dsmem(slot + r, q);
#pragma unroll
  for (int r = 0; r < R; ++r) v[r] = t[r];
}

// dx of one aligned vector vi of a row (frame position j0 = vi * VEC - a; o: the row's frame base): alpha * invstd *
// (g - sum g / n - xhat * sum (g xhat) / n) (m1 = sum g / n, 0 for RMS; m2 = sum (g xhat) / n; ai = alpha * invstd),
// g = dy * scale at the shifted positions, + beta * dx when blending; an edge vector stored element by element.
template <class T, int VEC>
__device__ __forceinline__ void dx_vec(const Frag<T, VEC>& fx, const Frag<T, VEC>& fd, T* o, int vi, int j0, int L,
                                       const float* scale, bool pvec, float ai, float m1, float mean, float inv,
                                       float m2, bool blend, float beta) {
  typedef Frag<T, VEC> F;
  constexpr int Q = VEC / 4;
  float xa[VEC], d[VEC];
  rows_get<T, VEC>(fx, xa);
  rows_get<T, VEC>(fd, d);
#pragma unroll
  for (int h = 0; h < Q; ++h) {
    float w[4];
    params4(scale, j0 + 4 * h, L, pvec, w);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = 4 * h + e;
      xa[i] = ai * (d[i] * w[e] - m1 - (xa[i] - mean) * inv * m2);
    }
  }
  if (blend) {
    F old;
    old.load(o + vi * VEC);
    old.get(d);
#pragma unroll
    for (int e = 0; e < VEC; ++e) xa[e] += beta * d[e];
  }
  F out;
  out.set(xa);
  if (j0 >= 0 && j0 + VEC <= L) out.store(o + vi * VEC);
  else store_part<T, VEC>(out, o + vi * VEC, -j0, L - j0);
}

}  // namespace rowx

// Forward (rowx): G threads per row (blockDim / G rows per block, one-shot blocks), ITEMS aligned vectors
// per thread in registers (G * ITEMS >= nsv for every row; host). Statistics as fwd_rows: 16-bit layer
// norm one-pass shifted by the row's first element (fwd_rows' ONE, its error bound), fp32 two passes from
// registers, RMS the mean of squares. y = alpha * ((x - mean) * invstd * scale + bias) + beta * y.
template <class T, int VEC, int ITEMS, int CL>
__device__ __forceinline__ void fwd_rowx_body(const NormParams& p) {
  typedef Frag<T, VEC> F;
  constexpr bool ONE = sizeof(T) == 2;
  __shared__ __align__(16) float sm[2][32][2];
  __shared__ float csl[2][2];  // (CL > 1: the cluster sums' slots)
  const int G = p.group, lane = threadIdx.x & (G - 1), sub = threadIdx.x / G;
  const int rank = CL > 1 ? (int)cluster_rank() : 0;  // CL > 1: G = blockDim, one row per cluster
  const i64 row = CL > 1 ? (i64)(blockIdx.x / CL) : (i64)blockIdx.x * (int)(blockDim.x / G) + sub;
  const bool live = row < p.sets;  // dead groups take the barriers too
  const int L = (int)p.len;
  const bool rms = p.flags & PYDNN_NORM_FLAG_RMS, blend = p.flags & PYDNN_FLAG_BETA;
  const bool stats = p.flags & PYDNN_NORM_FLAG_STATS, has_bias = p.bias != nullptr;
  const bool stream = p.flags & PYDNN_NORM_FLAG_STREAM;
  const float alpha = (float)p.alpha, beta = (float)p.beta, eps = (float)p.eps;
  const float inv_len = 1.0f / (float)L;
  const bool pvec = ((reinterpret_cast<unsigned long long>(p.scale) |
                      reinterpret_cast<unsigned long long>(p.bias)) & 15) == 0;
  const i64 xo = live ? row * p.set_stride[0][0] : 0, yo = live ? row * p.set_stride[1][0] : 0;
  const int a = (int)(xo % VEC);  // (y's the same: host)
  const int nsv = live ? (a + L + VEC - 1) / VEC : 0;
  const T* x = (const T*)p.x + (xo - a);
  T* y = (T*)p.out + (yo - a);

  F v[ITEMS];
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int vi = lane + (k * CL + rank) * G;
    v[k].zero();
    if (vi < nsv) load_once<T, VEC>(v[k], x + vi * VEC);
  }
  // statistics over the row's positions only (edge vectors masked)
  float mean = 0.0f, var = 0.0f;
  bool done = false;
  if constexpr (ONE) {
   if (!rms) {
    done = true;
    const float c = live ? to_float(x[a]) : 0.0f;
    float sq[2] = {0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int vi = lane + (k * CL + rank) * G, lo = a - vi * VEC, hi = L + a - vi * VEC;
      if (vi >= nsv) continue;
      float f[VEC];
      rows_get<T, VEC>(v[k], f);
      if (lo > 0 || hi < VEC)  // an edge vector: the other rows' elements count nothing
#pragma unroll
        for (int e = 0; e < VEC; ++e)
          if (e < lo || e >= hi) f[e] = c;
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const float d = f[e] - c;
        sq[0] += d;
        sq[1] = fmaf(d, d, sq[1]);
      }
    }
    rows_sum<2>(sq, G, sm[0]);
    if constexpr (CL > 1) rowx::cl_sum<CL, 2>(sq, csl[0]);
    const float ms = sq[0] * inv_len;
    mean = c + ms;
    var = fmaxf(fmaf(-ms, ms, sq[1] * inv_len), 0.0f);
   }
  }
  if (!done) {
    float s1[1] = {0.0f};
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int vi = lane + (k * CL + rank) * G, lo = a - vi * VEC, hi = L + a - vi * VEC;
      if (vi >= nsv) continue;
      float f[VEC];
      rows_get<T, VEC>(v[k], f);
      if (lo > 0 || hi < VEC)
#pragma unroll
        for (int e = 0; e < VEC; ++e)
          if (e < lo || e >= hi) f[e] = 0.0f;
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const float q = f[e];
        s1[0] = rms ? fmaf(q, q, s1[0]) : s1[0] + q;
      }
    }
    rows_sum<1>(s1, G, reinterpret_cast<float(*)[1]>(sm[0]));
    if constexpr (CL > 1) rowx::cl_sum<CL, 1>(s1, csl[0]);
    if (rms) {
      var = s1[0] * inv_len;
    } else {
      mean = s1[0] / (float)L;  // (one rounding, as fwd_rows: a constant row's variance is 0)
      float s2[1] = {0.0f};
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        const int vi = lane + (k * CL + rank) * G, lo = a - vi * VEC, hi = L + a - vi * VEC;
        if (vi >= nsv) continue;
        float f[VEC];
        rows_get<T, VEC>(v[k], f);
        if (lo > 0 || hi < VEC)
#pragma unroll
          for (int e = 0; e < VEC; ++e)
            if (e < lo || e >= hi) f[e] = mean;
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const float d = f[e] - mean;
          s2[0] = fmaf(d, d, s2[0]);
        }
      }
      rows_sum<1>(s2, G, reinterpret_cast<float(*)[1]>(sm[1]));
      if constexpr (CL > 1) rowx::cl_sum<CL, 1>(s2, csl[1]);
      var = s2[0] * inv_len;
    }
  }
  if constexpr (CL > 1) cluster_sync();  // (no block leaves while another reads its slots)
  const float inv = rsqrtf(var + eps);
  if (stats && live && lane == 0 && rank == 0) {
    const i64 so = row * p.set_stride[3][0];
    if (p.mean) p.mean[so] = mean;
    if (p.invstd) p.invstd[so] = inv;
  }
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int vi = lane + (k * CL + rank) * G;
    if (vi >= nsv) continue;
    const int j0 = vi * VEC - a;
    float f[VEC];
    rows_get<T, VEC>(v[k], f);
#pragma unroll
    for (int h = 0; h < VEC; h += 4) {  // 4 positions at a time (few shifted parameters live: no spills)
      float w[4];
      rowx::params4(p.scale, j0 + h, L, pvec, w);
#pragma unroll
      for (int e = 0; e < 4; ++e) f[h + e] = (f[h + e] - mean) * inv * w[e];
      if (has_bias) {
        rowx::params4(p.bias, j0 + h, L, pvec, w);
#pragma unroll
        for (int e = 0; e < 4; ++e) f[h + e] += w[e];
      }
    }
#pragma unroll
    for (int e = 0; e < VEC; ++e) f[e] *= alpha;
    if (blend) {
      F old;
      old.load(y + vi * VEC);
      float b[VEC];
      old.get(b);
#pragma unroll
      for (int e = 0; e < VEC; ++e) f[e] += beta * b[e];
    }
    F o;
    o.set(f);
    if (j0 >= 0 && j0 + VEC <= L) store_out<T, VEC>(o, y + vi * VEC, stream);
    else rowx::store_part<T, VEC>(o, y + vi * VEC, -j0, L - j0);
  }
}

template <class T, int VEC, int ITEMS>
__global__ void __launch_bounds__(1024) fwd_rowx(const NormParams p) { fwd_rowx_body<T, VEC, ITEMS, 1>(p); }

// fwd_rowx_cl: one row per cluster of CL blocks (sm_90; rows beyond one block's 1024 x ITEMS vectors): rank r
// holds the vectors lane + (k * CL + r) * blockDim, the statistics summed over the cluster (cl_sum).
#if __CUDA_ARCH__ >= 900
template <class T, int VEC, int ITEMS, int CL>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(1024) fwd_rowx_cl(const NormParams p) {
  fwd_rowx_body<T, VEC, ITEMS, CL>(p);
}
#else
template <class T, int VEC, int ITEMS, int CL>
__global__ void fwd_rowx_cl(const NormParams) { __trap(); }  // the host never picks it before sm_90
#endif

// Backward (rowx): dx of every row, and the dscale / dbias partials of each group over its rows in the
// group's workspace slot (finish sums the slots). The partials must stay with one thread per position
// over all the group's rows, so a block only takes rows of ONE alignment class: the row offset
// (r * stride) mod VEC repeats with period P = p.pf (VEC / gcd(stride mod VEC, VEC); 1 for whole-vector
// rows), block b takes class c = b mod P (a = (c * stride) mod VEC for all its rows), and its groups walk
// the class's rows c + P * t, t = (b / P) * spb + sub + i * (gridDim / P) * spb. The partials sit in
// shared memory, in each thread's own float4 slots ([k][VEC / 2 float4s][G] per group: consecutive lanes on
// consecutive 16 bytes, no bank conflicts, no barrier), x / dy of the row in registers, scale read at the
// shifted positions as the forward does. Per row: xhat = (x - mean) * invstd, g = dy * scale, one
// reduction of (sum g, sum g * xhat), dx = alpha * invstd * (g - sum g / n - xhat * sum (g xhat) / n)
// (RMS: no sum g term) + beta * dx. The block's loop is uniform (rows past the class's end are dead).
// __launch_bounds__(512): 128 registers (ITEMS 4 vectors of x and dy: 32).
template <class T, int VEC, int ITEMS, int CL>
__device__ __forceinline__ void bwd_rowx_body(const NormParams& p) {
  typedef Frag<T, VEC> F;
  constexpr int Q = VEC / 4;  // float4s per vector of partials (each of dscale, dbias)
  extern __shared__ __align__(16) float4 acc4[];
  __shared__ __align__(16) float sm[2][32][2];
  __shared__ float csl[2][2];  // (CL > 1: the cluster sums' slots)
  const int G = p.group, lane = threadIdx.x & (G - 1), sub = threadIdx.x / G;
  const int spb = (int)(blockDim.x / G);  // (CL > 1: G = blockDim, spb 1)
  const int rank = CL > 1 ? (int)cluster_rank() : 0;
  const unsigned unit = blockIdx.x / CL, units = gridDim.x / CL;  // blocks (CL 1) or clusters
  const int P = p.pf, cls = (int)(unit % (unsigned)P), bi = (int)(unit / (unsigned)P);
  const int m = (int)(units / (unsigned)P);
  const i64 R = p.sets;
  const int L = (int)p.len;
  const bool rms = p.flags & PYDNN_NORM_FLAG_RMS, blend = p.flags & PYDNN_FLAG_BETA;
  const float alpha = (float)p.alpha, beta = (float)p.beta;
  const float inv_len = 1.0f / (float)L;
  const bool pvec = (reinterpret_cast<unsigned long long>(p.scale) & 15) == 0;
  const i64 sx = p.set_stride[0][0], so = p.set_stride[1][0], sd = p.set_stride[2][0], ss = p.set_stride[3][0];
  const int a = (int)(((i64)cls * sx) % VEC);
  const int nsv = (a + L + VEC - 1) / VEC;
  const i64 nrows = cls < R ? (R - cls + P - 1) / P : 0;  // rows of the class
  const i64 step = (i64)m * spb;
  float4* acc = acc4 + (i64)sub * ITEMS * 2 * Q * G;
#pragma unroll
  for (int k = 0; k < ITEMS; ++k)
#pragma unroll
    for (int q = 0; q < 2 * Q; ++q) acc[(k * 2 * Q + q) * G + lane] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

  int it = 0;
  for (i64 base = (i64)bi * spb; base < nrows; base += step) {
    const i64 t = base + sub;
    const bool live = t < nrows;
    const i64 row = live ? cls + (i64)P * t : 0;
    const T* x = (const T*)p.x + (row * sx - a);
    const T* dy = (const T*)p.dy + (row * sd - a);
    T* o = (T*)p.out + (row * so - a);
    F bx[ITEMS], bd[ITEMS];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int vi = lane + (k * CL + rank) * G;
      bx[k].zero();
      bd[k].zero();
      if (live && vi < nsv) {
        load_once<T, VEC>(bx[k], x + vi * VEC);
        load_once<T, VEC>(bd[k], dy + vi * VEC);
      }
    }
    const float mean = (live && !rms) ? p.mean[row * ss] : 0.0f, inv = live ? p.invstd[row * ss] : 0.0f;
    float r[2] = {0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int vi = lane + (k * CL + rank) * G, j0 = vi * VEC - a;
      if (!live || vi >= nsv) continue;
      float xa[VEC], d[VEC];
      rows_get<T, VEC>(bx[k], xa);
      rows_get<T, VEC>(bd[k], d);
      if (j0 < 0 || j0 + VEC > L)  // an edge vector: the other rows' elements add nothing
#pragma unroll
        for (int e = 0; e < VEC; ++e)
          if (j0 + e < 0 || j0 + e >= L) xa[e] = mean, d[e] = 0.0f;
#pragma unroll
      for (int h = 0; h < Q; ++h) {
        float w[4];
        rowx::params4(p.scale, j0 + 4 * h, L, pvec, w);
        float4 as = acc[(k * 2 * Q + h) * G + lane], ab = acc[(k * 2 * Q + Q + h) * G + lane];
        float* ps = reinterpret_cast<float*>(&as);
        float* pb = reinterpret_cast<float*>(&ab);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float xh = (xa[4 * h + e] - mean) * inv, dd = d[4 * h + e], g = dd * w[e];
          r[0] += g;
          r[1] = fmaf(g, xh, r[1]);
          ps[e] = fmaf(dd, xh, ps[e]);
          pb[e] += dd;
        }
        acc[(k * 2 * Q + h) * G + lane] = as;
        acc[(k * 2 * Q + Q + h) * G + lane] = ab;
      }
    }
    rows_sum<2>(r, G, sm[it & 1]);
    if constexpr (CL > 1) rowx::cl_sum<CL, 2>(r, csl[it & 1]);
    ++it;
    const float m1 = rms ? 0.0f : r[0] * inv_len, m2 = r[1] * inv_len, ai = alpha * inv;
    if (!live) continue;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int vi = lane + (k * CL + rank) * G, j0 = vi * VEC - a;
      if (vi >= nsv) continue;
      rowx::dx_vec<T, VEC>(bx[k], bd[k], o, vi, j0, L, p.scale, pvec, ai, m1, mean, inv, m2, blend, beta);
    }
  }
  if constexpr (CL > 1) cluster_sync();  // (no block leaves while another reads its slots)
  // the group's partials -> its slot (every position of the row: the class's frame covers each once; CL > 1:
  // one slot per cluster, each block writing its own positions)
  const i64 np = p.nparams;
  float* ws_s = p.ws + ((i64)unit * spb + sub) * 2 * np;
  if constexpr (CL == 1) {
    if (p.flags & PYDNN_NORM_FLAG_WS16) {
      // WS16: the group's threads write the slot in order, 4 positions a thread a step (16-, 8- or 4-byte stores as the
      // slot's alignment allows), each position's partial read from its owner's shared-memory float4 (position j:
      // frame position j + a, vector vi = (j + a) / VEC, lane vi mod G, item vi / G, half h). The per-thread walk
      // below stores one float at a time, lanes 32 bytes apart: 8 partial-sector writes per sector.
      __syncthreads();
      const float* af = reinterpret_cast<const float*>(acc);
      const int nf = (L + 3) / 4;
      for (int f = lane; f < nf; f += G) {
        float vs[4], vb[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = 4 * f + e;
          vs[e] = vb[e] = 0.0f;
          if (j < L) {
            const int pos = j + a, vi = pos / VEC, ee = pos - vi * VEC, h = ee >> 2, k = vi / G, l = vi - k * G;
            vs[e] = af[((k * 2 * Q + h) * G + l) * 4 + (ee & 3)];
            vb[e] = af[((k * 2 * Q + Q + h) * G + l) * 4 + (ee & 3)];
          }
        }
        const int j = 4 * f;
        float* d2[2] = {ws_s + j, ws_s + np + j};
        const float* v2[2] = {vs, vb};
#pragma unroll
        for (int w = 0; w < 2; ++w) {
          const unsigned long long ad = reinterpret_cast<unsigned long long>(d2[w]);
          if (j + 4 <= L && (ad & 15) == 0) {
            *reinterpret_cast<float4*>(d2[w]) = make_float4(v2[w][0], v2[w][1], v2[w][2], v2[w][3]);
          } else if (j + 4 <= L && (ad & 7) == 0) {
            reinterpret_cast<float2*>(d2[w])[0] = make_float2(v2[w][0], v2[w][1]);
            reinterpret_cast<float2*>(d2[w])[1] = make_float2(v2[w][2], v2[w][3]);
          } else {
#pragma unroll
            for (int e = 0; e < 4; ++e)
              if (j + e < L) d2[w][e] = v2[w][e];
          }
        }
      }
      return;
    }
  }
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int vi = lane + (k * CL + rank) * G, j0 = vi * VEC - a;
    if (vi >= nsv) continue;
#pragma unroll
    for (int h = 0; h < Q; ++h) {
      const float4 as = acc[(k * 2 * Q + h) * G + lane], ab = acc[(k * 2 * Q + Q + h) * G + lane];
      const float* ps = reinterpret_cast<const float*>(&as);
      const float* pb = reinterpret_cast<const float*>(&ab);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = j0 + 4 * h + e;
        if (j >= 0 && j < L) {
          ws_s[j] = ps[e];
          ws_s[np + j] = pb[e];
        }
      }
    }
  }
}

template <class T, int VEC, int ITEMS>
__global__ void __launch_bounds__(512) bwd_rowx(const NormParams p) { bwd_rowx_body<T, VEC, ITEMS, 1>(p); }

// bwd_rowx_cl: the rows of a class walked by clusters of CL blocks (sm_90; rows beyond one block's 512 x
// ITEMS vectors): rank r holds the vectors lane + (k * CL + r) * blockDim (x, dy and their partials), the
// row sums over the cluster (cl_sum), one workspace slot per cluster.
#if __CUDA_ARCH__ >= 900
template <class T, int VEC, int ITEMS, int CL>
__global__ void __cluster_dims__(CL, 1, 1) __launch_bounds__(512) bwd_rowx_cl(const NormParams p) {
  bwd_rowx_body<T, VEC, ITEMS, CL>(p);
}
#else
template <class T, int VEC, int ITEMS, int CL>
__global__ void bwd_rowx_cl(const NormParams) { __trap(); }  // the host never picks it before sm_90
#endif

// ------------------------------------------------------------------ split backward (long rows, many of them)

// Layer / RMS rows (whole 16-byte vectors, fwd_rows' layouts) whose one-pass backward needs a cluster per row
// (rows longer than a block's registers hold) and that come in at least a wave: two kernels and finish_rowx,
// as PyTorch splits it. bwd_split_dx: a block per row (no persistent walk, no row in registers: many rows of
// an SM in flight), two passes over the row: (1) g = dy * scale, xhat = (x - mean) * invstd, one block sum of
// (g, g * xhat); (2) x and dy again (mostly from L2: the row was just read), dx = alpha * invstd * (g - sum g /
// n - xhat * sum (g xhat) / n) (RMS: no sum g term) + beta * dx. bwd_split_params: the dscale / dbias partials
// sum dy * xhat, sum dy of each (row chunk, parameter): threads over the row's vectors (blockDim.x) and the
// chunk's rows (blockDim.y, U rows in flight), the row threads summed in a fixed tree; slot = the chunk
// (p.group rows), summed in slot order by finish_rowx. Bytes: x and dy twice, dx once (5 n against 3 n of
// the one-pass kernels). Every order is fixed: results are bitwise reproducible.
// bwd_split_dx's passes: the U vectors v0, v0 + G, ... of x and dy (those below nvec) in flight, then one of
// them as floats with its parameters.
template <class T, int VEC, int U>
__device__ __forceinline__ void split_load(const T* x, const T* dy, int v0, int G, int nvec, Frag<T, VEC> (&fx)[U],
                                           Frag<T, VEC> (&fd)[U]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int vi = v0 + u * G;
    if (vi < nvec) {
      fx[u].load(x + vi * VEC);
      fd[u].load(dy + vi * VEC);
    }
  }
}
template <class T, int VEC>
__device__ __forceinline__ void split_get(const Frag<T, VEC>& fx, const Frag<T, VEC>& fd, const float* scale, int vi,
                                          bool pvec, float* a, float* d, float* sc) {
  rows_get<T, VEC>(fx, a);
  rows_get<T, VEC>(fd, d);
  rows_params<VEC>(scale, vi * VEC, pvec, sc);
}

template <class T, int VEC>
__global__ void __launch_bounds__(1024) bwd_split_dx(const NormParams p) {
  typedef Frag<T, VEC> F;
  constexpr int U = 4;  // vectors of x and of dy in flight per thread
  __shared__ __align__(16) float sm[32][2];
  const int G = (int)blockDim.x, t = (int)threadIdx.x;
  const i64 row = blockIdx.x;
  const int nvec = (int)(p.len / VEC);
  const bool rms = p.flags & PYDNN_NORM_FLAG_RMS, blend = p.flags & PYDNN_FLAG_BETA;
  const float alpha = (float)p.alpha, beta = (float)p.beta, inv_len = 1.0f / (float)p.len;
  const bool pvec = (reinterpret_cast<unsigned long long>(p.scale) & 15) == 0;
  const i64 ss = p.set_stride[3][0];
  const T* x = (const T*)p.x + row * p.set_stride[0][0];
  const T* dy = (const T*)p.dy + row * p.set_stride[2][0];
  T* o = (T*)p.out + row * p.set_stride[1][0];
  const float mean = rms ? 0.0f : p.mean[row * ss], inv = p.invstd[row * ss];
  float r[2] = {0.0f, 0.0f};
  for (int v0 = t; v0 < nvec; v0 += U * G) {
    F fx[U], fd[U];
    split_load<T, VEC, U>(x, dy, v0, G, nvec, fx, fd);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int vi = v0 + u * G;
      if (vi < nvec) {
        float a[VEC], d[VEC], sc[VEC];
        split_get<T, VEC>(fx[u], fd[u], p.scale, vi, pvec, a, d, sc);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float xh = (a[j] - mean) * inv, g = d[j] * sc[j];
          r[0] += g;
          r[1] = fmaf(g, xh, r[1]);
        }
      }
    }
  }
  rows_sum<2>(r, G, sm);
  const float m1 = rms ? 0.0f : r[0] * inv_len, m2 = r[1] * inv_len, ai = alpha * inv;
  for (int v0 = t; v0 < nvec; v0 += U * G) {
    F fx[U], fd[U];
    split_load<T, VEC, U>(x, dy, v0, G, nvec, fx, fd);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int vi = v0 + u * G;
      if (vi < nvec) {
        float a[VEC], d[VEC], sc[VEC];
        split_get<T, VEC>(fx[u], fd[u], p.scale, vi, pvec, a, d, sc);
        rows_dx<T, VEC>(o, vi, a, d, sc, ai, m1, mean, inv, m2, blend, beta);
      }
    }
  }
}

constexpr int kSplitParamsThreads = 256;

// The dscale / dbias partials of the split backward, sum dy * xhat and sum dy of each (row chunk, parameter):
// threads over a row's vectors (blockDim.x) and the chunk's rows (blockDim.y, U rows in flight), the row threads
// summed in a fixed tree; slot = blockIdx.y. FRAME false (bwd_split_params): whole-vector rows, chunk = blockIdx.y
// of p.group rows. FRAME true (bwd_xsplit_params, below): rows of any length in their aligned frame, blockIdx.y =
// chunk * P + class (P = p.pf), the chunk's p.group rows of that alignment class (every row of a class starts at
// the same offset a from a 16-byte boundary, so a thread keeps the same positions); the edge vectors' other
// elements are not counted, not written; every slot covers every position once (empty chunks write zeros).
template <class T, int VEC, bool FRAME>
__device__ __forceinline__ void split_params_body(const NormParams& p) {
  typedef Frag<T, VEC> F;
  constexpr int U = 4;  // rows in flight per thread
  __shared__ float red[2][kSplitParamsThreads * VEC];
  const int bx = (int)blockDim.x, by = (int)blockDim.y, tx = (int)threadIdx.x, ty = (int)threadIdx.y;
  const int idx = ty * bx + tx;
  const bool rms = p.flags & PYDNN_NORM_FLAG_RMS;
  const i64 sx = p.set_stride[0][0], sd = p.set_stride[2][0], ss = p.set_stride[3][0];
  int nvec, a = 0, lo = 0, hi = VEC, P = 1, cls = 0;
  i64 r0, r1;
  const int vi = (int)blockIdx.x * bx + tx;
  if constexpr (FRAME) {
    const int L = (int)p.len;
    P = p.pf;
    cls = (int)(blockIdx.y % (unsigned)P);
    a = (int)(((i64)cls * sx) % VEC);
    nvec = (a + L + VEC - 1) / VEC;
    const int j0 = vi * VEC - a;
    lo = j0 < 0 ? -j0 : 0;
    hi = L - j0 < VEC ? L - j0 : VEC;  // this vector's elements in the row
    const i64 R = p.sets, nrows = cls < R ? (R - cls + P - 1) / P : 0;  // rows of the class
    r0 = (i64)(blockIdx.y / (unsigned)P) * p.group;
    r1 = min(nrows, r0 + (i64)p.group);
  } else {
    nvec = (int)(p.len / VEC);
    r0 = (i64)blockIdx.y * p.group;
    r1 = min(p.sets, r0 + (i64)p.group);
  }
  float s[VEC], b[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) s[j] = b[j] = 0.0f;
  if (vi < nvec) {
    const i64 off = FRAME ? (i64)vi * VEC - a : vi * VEC;  // (whole-vector rows: int, as before the frame)
    const T* x = (const T*)p.x + off;
    const T* dy = (const T*)p.dy + off;
    for (i64 r = r0 + ty; r < r1; r += (i64)by * U) {
      F fx[U], fd[U];
      float mu[U], iv[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const i64 t = r + (i64)u * by;
        if (t < r1) {
          const i64 rr = FRAME ? cls + (i64)P * t : t;
          fx[u].load(x + rr * sx);
          fd[u].load(dy + rr * sd);
          mu[u] = rms ? 0.0f : p.mean[rr * ss];
          iv[u] = p.invstd[rr * ss];
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (r + (i64)u * by < r1) {
          float xa[VEC], d[VEC];
          rows_get<T, VEC>(fx[u], xa);
          rows_get<T, VEC>(fd[u], d);
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            if (FRAME && (j < lo || j >= hi)) continue;  // (an edge vector's other rows)
            s[j] = fmaf(d[j], (xa[j] - mu[u]) * iv[u], s[j]);
            b[j] += d[j];
          }
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    red[0][idx * VEC + j] = s[j];
    red[1][idx * VEC + j] = b[j];
  }
  __syncthreads();
  for (int h = by / 2; h > 0; h >>= 1) {  // fixed tree over the row threads
    if (ty < h) {
      const int q = (idx + h * bx) * VEC;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        s[j] += red[0][q + j];
        b[j] += red[1][q + j];
        red[0][idx * VEC + j] = s[j];
        red[1][idx * VEC + j] = b[j];
      }
    }
    __syncthreads();
  }
  if (ty == 0 && vi < nvec) {
    float* ws = p.ws + (i64)blockIdx.y * 2 * p.nparams + (FRAME ? (i64)vi * VEC - a : vi * VEC);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      if (FRAME && (j < lo || j >= hi)) continue;
      ws[j] = s[j];
      ws[p.nparams + j] = b[j];
    }
  }
}

template <class T, int VEC>
__global__ void __launch_bounds__(kSplitParamsThreads) bwd_split_params(const NormParams p) {
  split_params_body<T, VEC, false>(p);
}

// ------------------------------------------------------------------ split backward, rows of any length (xsplit)

// The split backward (bwd_split_dx / bwd_split_params above) in the rowx kernels' aligned frame: contiguous
// layer / RMS rows of any length (row r starts a = (r * stride) mod VEC elements past a 16-byte boundary; its
// nsv = ceil((a + len) / VEC) aligned vectors; the edge vectors' other elements masked: never counted, never
// written), for rows the one-row-in-registers kernels serve only with a cluster per row (bwd_rowx_cl) or not
// at all. bwd_xsplit_dx: a block per row, two passes over x and dy (the second mostly from L2), dx stored
// (the edge vectors element by element); bwd_xsplit_params: a block takes rows of ONE alignment class (c =
// blockIdx.y mod P, P = p.pf as bwd_rowx's) so that each thread keeps the same positions in every row: the
// (class, chunk of p.group class rows, vector tile) partials sum dy * xhat, sum dy; slot = blockIdx.y (every
// slot covers all positions: the class's frame covers each position once; chunks past a class's rows write
// zeros), summed in slot order by finish_rowx. Every order is fixed: bitwise reproducible.
template <class T, int VEC>
__global__ void __launch_bounds__(1024) bwd_xsplit_dx(const NormParams p) {
  typedef Frag<T, VEC> F;
  // U: vectors of x and of dy in flight per thread (16-bit: 2; 4 spilled 184 bytes at __launch_bounds__(1024)'s
  // 64 registers, sm_90: params4's shifted parameter reads hold 8 floats per 4 positions)
  constexpr int U = sizeof(T) == 4 ? 4 : 2, Q = VEC / 4;
  __shared__ __align__(16) float sm[32][2];
  const int G = (int)blockDim.x, t = (int)threadIdx.x;
  const i64 row = blockIdx.x;
  const int L = (int)p.len;
  const bool rms = p.flags & PYDNN_NORM_FLAG_RMS, blend = p.flags & PYDNN_FLAG_BETA;
  const float alpha = (float)p.alpha, beta = (float)p.beta, inv_len = 1.0f / (float)L;
  const bool pvec = (reinterpret_cast<unsigned long long>(p.scale) & 15) == 0;
  const i64 sx = p.set_stride[0][0], ss = p.set_stride[3][0];
  const int a = (int)((row * sx) % VEC);
  const int nsv = (a + L + VEC - 1) / VEC;
  const T* x = (const T*)p.x + (row * sx - a);
  const T* dy = (const T*)p.dy + (row * p.set_stride[2][0] - a);
  T* o = (T*)p.out + (row * p.set_stride[1][0] - a);
  const float mean = rms ? 0.0f : p.mean[row * ss], inv = p.invstd[row * ss];
  float r[2] = {0.0f, 0.0f};
  for (int v0 = t; v0 < nsv; v0 += U * G) {
    F fx[U], fd[U];
    split_load<T, VEC, U>(x, dy, v0, G, nsv, fx, fd);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int vi = v0 + u * G, j0 = vi * VEC - a;
      if (vi >= nsv) continue;
      float xa[VEC], d[VEC];
      rows_get<T, VEC>(fx[u], xa);
      rows_get<T, VEC>(fd[u], d);
      if (j0 < 0 || j0 + VEC > L)  // an edge vector: the other rows' elements add nothing
#pragma unroll
        for (int e = 0; e < VEC; ++e)
          if (j0 + e < 0 || j0 + e >= L) xa[e] = mean, d[e] = 0.0f;
#pragma unroll
      for (int h = 0; h < Q; ++h) {
        float w[4];
        rowx::params4(p.scale, j0 + 4 * h, L, pvec, w);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float xh = (xa[4 * h + e] - mean) * inv, g = d[4 * h + e] * w[e];
          r[0] += g;
          r[1] = fmaf(g, xh, r[1]);
        }
      }
    }
  }
  rows_sum<2>(r, G, sm);
  const float m1 = rms ? 0.0f : r[0] * inv_len, m2 = r[1] * inv_len, ai = alpha * inv;
  for (int v0 = t; v0 < nsv; v0 += U * G) {
    F fx[U], fd[U];
    split_load<T, VEC, U>(x, dy, v0, G, nsv, fx, fd);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int vi = v0 + u * G, j0 = vi * VEC - a;
      if (vi >= nsv) continue;
      rowx::dx_vec<T, VEC>(fx[u], fd[u], o, vi, j0, L, p.scale, pvec, ai, m1, mean, inv, m2, blend, beta);
    }
  }
}

template <class T, int VEC>
__global__ void __launch_bounds__(kSplitParamsThreads) bwd_xsplit_params(const NormParams p) {
  split_params_body<T, VEC, true>(p);
}

// finish for bwd_rowx's slots (a copy of normalization.cu's finish, so that the rowx backward loads from this
// unit alone): dscale[q] = alpha2 * sum over slots of ws[slot][0][q] + beta2 * dscale[q], dbias likewise.
template <int FX, int FY>
__global__ void __launch_bounds__(FX * FY) finish_rowx(const NormParams p) {
  __shared__ float part[2][FY][FX + 1];
  const i64 np = p.nparams;
  const bool blend = p.flags & PYDNN_NORM_FLAG_BETA2;
  const float alpha = (float)p.alpha2, beta = (float)p.beta2;
  for (i64 q0 = (i64)blockIdx.x * FX; q0 < np; q0 += (i64)gridDim.x * FX) {
    const i64 q = q0 + threadIdx.x;
    float s = 0.0f, b = 0.0f;
    if (q < np)
#pragma unroll 4
      for (i64 sl = threadIdx.y; sl < p.slots; sl += FY) {
        s += p.ws[sl * 2 * np + q];
        b += p.ws[sl * 2 * np + np + q];
      }
    part[0][threadIdx.y][threadIdx.x] = s;
    part[1][threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y < 2 && q < np) {
      float t = 0.0f;
      for (int y = 0; y < FY; ++y) t += part[threadIdx.y][y][threadIdx.x];
      float* dst = threadIdx.y == 0 ? p.dscale : p.dbias;
      if (dst) {
        float r = alpha * t;
        if (blend) r += beta * dst[q];
        dst[q] = r;
      }
    }
    __syncthreads();
  }
}

}  // namespace norm
}  // namespace pydnn
