// Host check of ptx/conv_winograd.cu's transform kernels (run by tests/test_convolution_algos_cpu.py):
// the real kernel source compiled as C++ with the CUDA qualifiers defined away and a float / double shim
// of common/types.cuh, the kernels run block by block and thread by thread, the GEMMs between them done
// here, the output compared with a direct convolution in double. Prints one line per configuration and
// "ok" (exit 0) when every error is within float's test tolerance (|err| <= 1e-6 + 1e-5 * max(|ref|,
// sum |x w|)), "FAIL" otherwise. Both tiles (F(2x2), F(4x4)), both modes, forward and backward-data
// filters, NCHW and NHWC, groups, odd sizes and pads.
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
struct D3 { unsigned x, y, z; };
static D3 blockIdx, threadIdx, blockDim;
#include "conv_winograd.cu"
using namespace pydnn::conv_wino;

template <class F> void launch(long long n, F f) {
  blockDim = {256, 1, 1};
  for (long long b = 0; b < (n + 255) / 256; ++b)
    for (unsigned t = 0; t < 256; ++t) { blockIdx = {(unsigned)b, 0, 0}; threadIdx = {t, 0, 0}; f(); }
}

// forward-form problem on NCHW (chan_fast=0) or NHWC (chan_fast=1) tensors; returns max |err| / scale
template <int M>
double check(int N, int G, int cin_g, int cout_g, int H, int W, int ph, int pw, bool flip, bool bwd, bool nhwc) {
  const int C = G * cin_g, K = G * cout_g, OH = H + 2 * ph - 2, OW = W + 2 * pw - 2;
  const int A = M + 2, P = A * A;
  std::vector<float> x((size_t)N * C * H * W), y((size_t)N * K * OH * OW, NAN);
  // filter storage: forward (K, cin_g, 3, 3); backward (C_of_dx = K here ... ) -> w (Kw, Cw, 3, 3)
  const int Kw = bwd ? G * cin_g : K, Cw = bwd ? cout_g : cin_g;
  std::vector<float> w((size_t)Kw * Cw * 9);
  for (auto& v : x) v = (float)(rand() % 2001 - 1000) / 333.f;
  for (auto& v : w) v = (float)(rand() % 2001 - 1000) / 333.f;
  WinoParams p{};
  p.in = x.data(); p.w = w.data(); p.out = y.data();
  p.alpha = 1.0; p.beta = 0.0;
  p.batch = N; p.groups = G; p.cin_g = cin_g; p.cout_g = cout_g;
  p.in_h = H; p.in_w = W; p.out_h = OH; p.out_w = OW; p.pad_h = ph; p.pad_w = pw;
  p.tiles_h = (OH + M - 1) / M; p.tiles_w = (OW + M - 1) / M;
  p.tiles = (long long)N * p.tiles_h * p.tiles_w;
  p.flags = (flip ? PYDNN_WINO_FLAG_FLIP : 0) | (bwd ? PYDNN_WINO_FLAG_BWD : 0);
  if (nhwc) {
    long long is[4] = {(long long)H * W * C, 1, (long long)W * C, C}, os[4] = {(long long)OH * OW * K, 1, (long long)OW * K, K};
    for (int i = 0; i < 4; ++i) { p.is[i] = is[i]; p.os[i] = os[i]; }
  } else {
    long long is[4] = {(long long)C * H * W, (long long)H * W, W, 1}, os[4] = {(long long)K * OH * OW, (long long)OH * OW, OW, 1};
    for (int i = 0; i < 4; ++i) { p.is[i] = is[i]; p.os[i] = os[i]; }
  }
  long long ws[4] = {(long long)Cw * 9, 9, 3, 1};
  for (int i = 0; i < 4; ++i) p.ws[i] = ws[i];
  const long long T = p.tiles;
  std::vector<float> u((size_t)P * T * C), v((size_t)P * K * cin_g), mm((size_t)P * T * K);
  p.u = u.data(); p.v = v.data(); p.m = mm.data();
  if (nhwc) { p.u_m = (long long)P * C; p.u_c = 1; p.m_m = (long long)P * K; p.m_c = 1; }
  else { p.u_m = 1; p.u_c = T; p.m_m = 1; p.m_c = T; }
  p.u_b = (long long)C * p.u_c; p.chunk = T;
  launch((long long)K * cin_g, [&] { filter_transform<float, M>(p); });
  launch(T * C, [&] { input_transform<float, M>(p); });
  // the GEMMs: M[b][t][o] = sum_i U[b][t][g*cin_g+i] V[b][o][i]
  for (int b = 0; b < P; ++b)
    for (long long t = 0; t < T; ++t)
      for (int o = 0; o < K; ++o) {
        const int g = o / cout_g;
        float s = 0;
        for (int i = 0; i < cin_g; ++i)
          s += u[t * p.u_m + ((long long)b * C + g * cin_g + i) * p.u_c] * v[((long long)b * K + o) * cin_g + i];
        mm[t * p.m_m + ((long long)b * K + o) * p.m_c] = s;
      }
  launch(T * K, [&] { output_transform<float, M>(p); });
  // direct reference in double
  double worst = 0;
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < K; ++o)
      for (int h = 0; h < OH; ++h)
        for (int q = 0; q < OW; ++q) {
          const int g = o / cout_g, oc = o % cout_g;
          double s = 0, sc = 0;
          for (int i = 0; i < cin_g; ++i)
            for (int r = 0; r < 3; ++r)
              for (int c = 0; c < 3; ++c) {
                const int hh = h + r - ph, ww = q + c - pw;
                if (hh < 0 || hh >= H || ww < 0 || ww >= W) continue;
                const int rr = flip ? 2 - r : r, cc = flip ? 2 - c : c;
                const long long wi = bwd ? ((long long)(g * cin_g + i) * Cw + oc) * 9 + rr * 3 + cc
                                         : ((long long)o * Cw + i) * 9 + rr * 3 + cc;
                const double xv = x[n * p.is[0] + (g * cin_g + i) * p.is[1] + hh * p.is[2] + ww * p.is[3]];
                s += xv * w[wi];
                sc += fabs(xv * w[wi]);
              }
          const double got = y[n * p.os[0] + o * p.os[1] + h * p.os[2] + q * p.os[3]];
          const double e = fabs(got - s) / (1e-6 + 1e-5 * fmax(fabs(s), sc));
          if (!(e <= worst)) worst = e;  // NaN (unwritten) makes worst NaN
        }
  return worst;
}

// Backward filter: dw = alpha * grad + beta * dw0 through input_transform (x -> U), grad_transform (dy -> D),
// the chunked GEMMs here (M[s][b][o][i] over each chunk's tiles, the layout of convolution_winograd
// .plan_winograd_wgrad: chan_fast [s][b][t][c], else [s][b][c][t]) and filter_grad; returns max |err| / tol.
template <int M>
double check_wgrad(int N, int G, int cin_g, int cout_g, int H, int W, int ph, int pw, bool flip, bool nhwc,
                   bool chan_fast, int splits) {
  const int C = G * cin_g, K = G * cout_g, OH = H + 2 * ph - 2, OW = W + 2 * pw - 2;
  const int A = M + 2, P = A * A;
  std::vector<float> x((size_t)N * C * H * W), dy((size_t)N * K * OH * OW), dw((size_t)K * cin_g * 9), dw0;
  for (auto& v : x) v = (float)(rand() % 2001 - 1000) / 333.f;
  for (auto& v : dy) v = (float)(rand() % 2001 - 1000) / 333.f;
  for (auto& v : dw) v = (float)(rand() % 2001 - 1000) / 333.f;
  dw0 = dw;
  const double alpha = 0.75, beta = splits > 1 ? -0.5 : 0.0;
  const int th = (OH + M - 1) / M, tw = (OW + M - 1) / M;
  const long long T = (long long)N * th * tw, chunk = (T + splits - 1) / splits, Tp = chunk * splits;
  std::vector<float> u((size_t)P * Tp * C, NAN), d((size_t)P * Tp * K, NAN), mm((size_t)splits * P * K * cin_g, NAN);
  WinoParams px{}, pd{}, pf{};
  for (WinoParams* q : {&px, &pd}) {
    const bool isx = q == &px;
    const int ch = isx ? C : K, hh = isx ? H : OH, ww = isx ? W : OW;
    q->in = isx ? (const void*)x.data() : (const void*)dy.data();
    q->u = isx ? (void*)u.data() : (void*)d.data();
    q->batch = N; q->groups = G; q->cin_g = isx ? cin_g : cout_g;
    q->in_h = hh; q->in_w = ww; q->pad_h = isx ? ph : 0; q->pad_w = isx ? pw : 0;
    q->tiles_h = th; q->tiles_w = tw; q->tiles = Tp; q->chunk = chunk;
    long long st[4] = {(long long)ch * hh * ww, (long long)hh * ww, ww, 1};
    if (nhwc) { st[1] = 1; st[2] = (long long)ww * ch; st[3] = ch; }
    for (int i = 0; i < 4; ++i) q->is[i] = st[i];
    if (chan_fast) { q->u_m = ch; q->u_c = 1; q->u_b = chunk * ch; }
    else { q->u_m = 1; q->u_c = chunk; q->u_b = (long long)ch * chunk; }
    q->u_s = (long long)P * ch * chunk;
  }
  launch(Tp * C, [&] { input_transform<float, M>(px); });
  launch(Tp * K, [&] { grad_transform<float, M>(pd); });
  // the GEMMs: M[s][b][g*cout_g+o][i] = sum over the chunk's tiles of D[o] U[i]
  for (int s = 0; s < splits; ++s)
    for (int b = 0; b < P; ++b)
      for (int o = 0; o < K; ++o)
        for (int i = 0; i < cin_g; ++i) {
          const int g = o / cout_g, c = g * cin_g + i;
          float acc = 0;
          for (long long t = 0; t < chunk; ++t) {
            const long long zd = (long long)s * P + b;
            const float dv = chan_fast ? d[(zd * chunk + t) * K + o] : d[(zd * K + o) * chunk + t];
            const float uv = chan_fast ? u[(zd * chunk + t) * C + c] : u[(zd * C + c) * chunk + t];
            acc += dv * uv;
          }
          mm[(((long long)s * P + b) * K + o) * cin_g + i] = acc;
        }
  pf.m = mm.data(); pf.out = dw.data(); pf.groups = G; pf.cin_g = cin_g; pf.cout_g = cout_g; pf.splits = splits;
  pf.alpha = alpha; pf.beta = beta;
  pf.flags = (flip ? PYDNN_WINO_FLAG_FLIP : 0) | (beta != 0 ? PYDNN_FLAG_BETA : 0);
  long long ws[4] = {(long long)cin_g * 9, 9, 3, 1};
  for (int i = 0; i < 4; ++i) pf.ws[i] = ws[i];
  launch((long long)K * cin_g, [&] { filter_grad<float, M>(pf); });
  double worst = 0;
  for (int o = 0; o < K; ++o)
    for (int i = 0; i < cin_g; ++i)
      for (int r = 0; r < 3; ++r)
        for (int c = 0; c < 3; ++c) {
          const int g = o / cout_g, rr = flip ? 2 - r : r, cc = flip ? 2 - c : c;  // tap (r, c) of the stored filter
          double s = 0, sc = 0;
          for (int n = 0; n < N; ++n)
            for (int h = 0; h < OH; ++h)
              for (int q = 0; q < OW; ++q) {
                const int hh = h + rr - ph, ww = q + cc - pw;
                if (hh < 0 || hh >= H || ww < 0 || ww >= W) continue;
                const double xv = x[n * px.is[0] + (g * cin_g + i) * px.is[1] + hh * px.is[2] + ww * px.is[3]];
                const double gv = dy[n * pd.is[0] + o * pd.is[1] + h * pd.is[2] + q * pd.is[3]];
                s += xv * gv;
                sc += fabs(xv * gv);
              }
          const size_t wi = ((size_t)o * cin_g + i) * 9 + r * 3 + c;
          const double want = alpha * s + beta * dw0[wi];
          const double e = fabs(dw[wi] - want) / (1e-6 + 1e-5 * fmax(fabs(want), fabs(alpha) * sc + fabs(beta * dw0[wi])));
          if (!(e <= worst)) worst = e;
        }
  return worst;
}

int main() {
  int bad = 0;
  for (int M : {2, 4})
    for (int flip = 0; flip < 2; ++flip)
      for (int bwd = 0; bwd < 2; ++bwd)
        for (int nhwc = 0; nhwc < 2; ++nhwc) {
          double e1 = M == 2 ? check<2>(2, 1, 5, 3, 9, 7, 1, 1, flip, bwd, nhwc) : check<4>(2, 1, 5, 3, 9, 7, 1, 1, flip, bwd, nhwc);
          double e2 = M == 2 ? check<2>(1, 2, 6, 4, 11, 6, 0, 2, flip, bwd, nhwc) : check<4>(1, 2, 6, 4, 11, 6, 0, 2, flip, bwd, nhwc);
          double e3 = M == 2 ? check<2>(2, 1, 64, 8, 14, 14, 1, 1, flip, bwd, nhwc) : check<4>(2, 1, 64, 8, 14, 14, 1, 1, flip, bwd, nhwc);
          printf("M=%d flip=%d bwd=%d nhwc=%d  err/tol %.3g %.3g %.3g\n", M, flip, bwd, nhwc, e1, e2, e3);
          if (!(e1 < 1 && e2 < 1 && e3 < 1)) bad++;
        }
  // backward filter: N, G, cin_g, cout_g, H, W, pads, flip, x / dy NHWC, chan_fast layout, splits
  for (int M : {2, 4})
    for (int flip = 0; flip < 2; ++flip)
      for (int nhwc = 0; nhwc < 2; ++nhwc)
        for (int cf = 0; cf < 2; ++cf) {
          double e1 = M == 2 ? check_wgrad<2>(2, 1, 5, 3, 9, 7, 1, 1, flip, nhwc, cf, 1)
                             : check_wgrad<4>(2, 1, 5, 3, 9, 7, 1, 1, flip, nhwc, cf, 1);
          double e2 = M == 2 ? check_wgrad<2>(3, cf ? 1 : 2, 3, 4, 11, 6, 0, 2, flip, nhwc, cf, 4)
                             : check_wgrad<4>(3, cf ? 1 : 2, 3, 4, 11, 6, 0, 2, flip, nhwc, cf, 4);
          double e3 = M == 2 ? check_wgrad<2>(4, 1, 16, 8, 14, 14, 1, 1, flip, nhwc, cf, 3)
                             : check_wgrad<4>(4, 1, 16, 8, 14, 14, 1, 1, flip, nhwc, cf, 3);
          printf("wgrad M=%d flip=%d nhwc=%d chan_fast=%d  err/tol %.3g %.3g %.3g\n", M, flip, nhwc, cf, e1, e2, e3);
          if (!(e1 < 1 && e2 < 1 && e3 < 1)) bad++;
        }
  printf(bad ? "FAIL\n" : "ok\n");
  return bad;
}
