// PERSIST_STATIC RNN kernels (pydnn/ops/rnn/persist.py): one persistent launch per layer runs all T steps of
// the recurrence; every block owns `units` hidden units (all G gates of them, so the cell update is local),
// keeps its slice of the recurrent weights in shared memory for all steps, and the blocks meet at a grid
// barrier between steps (a global counter: __syncthreads, then thread 0 red.release.gpu.add; waiters
// spin with ld.acquire.gpu). All blocks must be co-resident: the host launches at most one block per SM and
// checks the occupancy (NOT_SUPPORTED otherwise).
//
//   persist_fwd<T, CELL>   forward of one layer (one or two directions: blockIdx.y picks dir[]). Per step:
//                          the input projection's slice of time t is prefetched (cp.async) before the barrier,
//                          h_{t-1} [batch, hidden] comes from L2 (cp.async.cg) into shared memory, the block
//                          GEMM [batch, G*units] = h_{t-1} x W_slice^T (mma.sync m16n8k16 for 16-bit data, f32
//                          accumulate; FFMA for float), then the cell (fwd_cell of rnn.cu, same math and
//                          writes: h, the f32 state, y, the gate values), then the barrier.
//   persist_bwd<T, CELL>   backward data of one layer: per step (time reversed) the block GEMM
//                          [batch, units] = d_{prev} x W[:, units] (d_prev: the recurrent pre-activation
//                          gradients [batch, G*hidden] of the step processed before, from L2) and the cell
//                          backward (bwd_cell of rnn.cu); a last pass after the final step leaves the dhx
//                          share in gh (and 0 in ghrec) for bwd_state_out.
//   persist_reset<T>       zeroes the barrier words (counter and flags) and the tagged-exchange words of
//                          dir[0 .. gridDim.y).
//
// PersistParams.variant (tuning.rnn switches, off by default until measured): PV_FLAGS one flag per block
// instead of the counter (forward and backward), PV_CHAIN2 two mma accumulator chains in a warp with one tile
// (forward and backward), PV_XS_AHEAD the next step's input projection slice fetched a step ahead (forward),
// PV_FAST_MATH tanh.approx.f32 in the 16-bit forward cell. PersistParams.stamps: block 0's clock64 at the
// phases of every forward step (tools/bench_rnn.py --stamps).
//
// Measured (H200, mid-session, before the deferred stores and the fence removal): 4.58 us a step with the
// barrier, 5.18 with the tagged exchange (hence the barrier is the default), the backward ~5.4 us.
// Time per step, predicted for issue 16's small case (LSTM fp16, hidden 256, batch 32: 32 blocks of 8
// units). With the barrier: the last block's atomic reaching L2 and the waiters' poll (~1 us, after a
// __threadfence of its stores, ~0.5 us) + h_{t-1}, 16 KiB per block from L2 (~0.5-1 us, latency bound; 0.5
// MiB per step in all) + 16 k-steps of mma per warp (~0.3 us) + the cell and its stores (~0.3 us) = ~2.5-3
// us, 1.3-1.5 ms for 512 steps. With the tagged exchange (below): no fence, no counter; one round of loads of
// the tagged words (32 KiB per block, 8 x 16 bytes a thread in flight at once, ~0.7 us once the producers'
// stores have landed) + mma + cell = ~1.3-1.6 us, ~0.7-0.8 ms for 512 steps, plus the input GEMM (~30 us).
// cuDNN: 1.74 ms, 3.4 us per step with the input GEMM. Backward (barrier): the A operand [batch, 4 * hidden]
// is 64 KiB per block per step (2 MiB in all), ~3 us per step, ~1.5 ms. Hidden 1024 / batch 64 (128 blocks,
// the operand in chunks, the barrier): h is 128 KiB per block per step, 16 MiB of L2 reads a step (~3 us at
// ~5.5 TB/s) + the GEMM (2 MFLOP a block, ~0.5 us on tensor cores; float FFMA ~8-10 us) -> ~4 us per step
// (fp16; cuDNN's STANDARD-like forward ran 17 us per step and layer there).
#include "common/types.cuh"
#include "rnn_persist_params.h"

namespace pydnn {
namespace rnn {

constexpr int kPThreads = 256;
constexpr int kBarWords = 256;  // a direction's barrier words: the counter, then one flag per block (BAR_STRIDE)
constexpr int kFlagOff = 32;    // the flags' first word (their own 128-byte lines; at most kBarWords - 32 blocks)
constexpr int kPWarps = kPThreads / 32;

__device__ __forceinline__ float p_sigm(float v) { return 1.0f / (1.0f + __expf(-v)); }
// PV_FAST_MATH (16-bit data only; the host sets it): the hardware's tanh.approx.f32 (one MUFU op, ~2^-11
// relative error, about a half-ulp of fp16) for tanh and, as 0.5 + 0.5 tanh(v / 2), the sigmoid
__device__ __forceinline__ float tanh_fast(float v) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(v));
  return y;
}
__device__ __forceinline__ float g_sigm(float v, bool fast) {
  return fast ? fmaf(0.5f, tanh_fast(0.5f * v), 0.5f) : p_sigm(v);
}
__device__ __forceinline__ float g_tanh(float v, bool fast) { return fast ? tanh_fast(v) : tanhf(v); }

__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void cp16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
__device__ __forceinline__ void cp_wait_1() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

// rows [0, rows) of `cols` elements (a multiple of 16 bytes) at src (row pitch ld elements) into shared dst
// (row pitch `pitch` elements), 16-byte chunks spread over the block
template <class T>
__device__ __forceinline__ void load_rows(T* dst, int pitch, const T* src, long long ld, int rows, int cols) {
  constexpr int E = 16 / sizeof(T);
  const int cpr = cols / E;
  for (int i = threadIdx.x; i < rows * cpr; i += kPThreads) {
    const int r = i / cpr, c = (i % cpr) * E;
    cp16(dst + (long long)r * pitch + c, src + r * ld + c);
  }
}

// ---------------------------------------------------------------- the grid barrier (a counter per direction)
// arrive: the block's writes are ordered before thread 0's release add by the CTA barrier (cumulativity), so a
// waiter whose acquire load sees the count sees them too (no full fence needed)
__device__ __forceinline__ void grid_arrive(unsigned* bar) {
  __syncthreads();
  if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(bar) : "memory");
}
// A block that waits ~2^22 polls (seconds: some block is not resident or died) traps: a launch error
// instead of a hung device.
__device__ __forceinline__ void grid_wait(unsigned* bar, unsigned target) {
  if (threadIdx.x == 0) {
    unsigned v, polls = 0;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(bar) : "memory");
      if (++polls == (1u << 22)) __trap();
    } while (v < target);  // acquire: the arrived blocks' writes are visible to what follows the CTA barrier
  }
  __syncthreads();
}

// The flag barrier (PV_FLAGS, forward and backward): block x publishes the end of its step s as flags[x] = s + 1 (a release
// store after the CTA barrier: its h stores are ordered before it, as for the counter's red.release); a block
// starting step s polls every flag with warp 0 (lane l reads flags l, l + 32, ...: one coalesced acquire load
// of up to 128 bytes per round) until all are >= s, then the CTA barrier. No read-modify-write on one
// address (32 same-address atomics serialize in the L2 slice); the flags of a direction follow its counter
// (bar + kFlagOff ..), zeroed by persist_reset.
__device__ __forceinline__ void flag_arrive(unsigned* flags, unsigned value) {
  __syncthreads();
  if (threadIdx.x == 0)
    asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(flags + blockIdx.x), "r"(value) : "memory");
}
__device__ __forceinline__ void flag_wait(const unsigned* flags, unsigned nblk, unsigned target) {
  if (threadIdx.x < 32) {
    unsigned polls = 0;
    for (;;) {
      bool ok = true;
      for (unsigned i = threadIdx.x; i < nblk; i += 32) {
        unsigned v;
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(flags + i) : "memory");
        ok = ok && v >= target;
      }
      if (__all_sync(0xffffffffu, ok)) break;
      if (++polls == (1u << 22)) __trap();
    }
  }
  __syncthreads();
}

__device__ __forceinline__ long long stamp_clock() {
  long long c;
  asm volatile("mov.u64 %0, %%clock64;\n" : "=l"(c) :: "memory");
  return c;
}

// ---------------------------------------------------------------- the block GEMM
// part[ks][m][n] (+)= sum over k in slice ks of A[m][k] * B[n][k] (acc: add to part, the K chunks after the
// first); A [bp][kc] (row pitch pa), B [n][kc] (row pitch pb) in shared memory, zero past the real sizes.
// Each part element belongs to one warp (16-bit) / thread (float) in every chunk. 16-bit: warps over (m tile,
// n tile, k slice), mma.m16n8k16.
template <class T> struct Mma;
template <> struct Mma<half_t> {
  static __device__ __forceinline__ void run(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};
template <> struct Mma<bf16_t> {
  static __device__ __forceinline__ void run(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

// chain2: a warp with a single work item splits its k steps over two accumulators (even / odd), halving the
// dependent mma chain (the two are added before the store); the float version ignores it.
template <class T>
__device__ __forceinline__ void block_gemm(const T* A, int pa, const T* B, int pb, float* part, int bp, int n, int kc,
                                           int ksplit, bool acc, bool chain2 = false) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int mt = bp >> 4, tiles = mt * (n >> 3), per = (kc >> 4) / ksplit, total = tiles * ksplit;
  // work items w (tile, K slice) of this warp two at a time (w and w + kPWarps): two independent mma chains
  for (int w = warp; w < total; w += 2 * kPWarps) {
    const bool two = w + kPWarps < total;  // warp-uniform
    unsigned a_addr[2], b_addr[2];
    int m0[2], n0[2], ks[2];
#pragma unroll
    for (int z = 0; z < 2; ++z) {
      const int wz = two ? w + z * kPWarps : w;
      const int tile = wz % tiles;
      ks[z] = wz / tiles;
      m0[z] = (tile % mt) * 16;
      n0[z] = (tile / mt) * 8;
      // ldmatrix.x4 (A 16 x 16: lane l gives row l % 16, column block l / 16) and .x2 (B 8 x 16: lane l % 16
      // gives row l % 8, column block (l / 8) % 2)
      a_addr[z] = smem_u32(A + (m0[z] + (lane & 15)) * pa + ((lane >> 4) << 3)) + ks[z] * per * 32;
      b_addr[z] = smem_u32(B + (n0[z] + (lane & 7)) * pb + (((lane >> 3) & 1) << 3)) + ks[z] * per * 32;
    }
    float c[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    if (!two && chain2) {  // one item: k steps kk (even) into c[0], kk + 1 (odd) into c[1]
      int kk = 0;
      for (; kk + 1 < per; kk += 2) {
        unsigned a[4], b[2], a1[4], b1[2];
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(a_addr[0] + kk * 32));
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                     : "=r"(b[0]), "=r"(b[1]) : "r"(b_addr[0] + kk * 32));
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(a1[0]), "=r"(a1[1]), "=r"(a1[2]), "=r"(a1[3]) : "r"(a_addr[0] + kk * 32 + 32));
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                     : "=r"(b1[0]), "=r"(b1[1]) : "r"(b_addr[0] + kk * 32 + 32));
        Mma<T>::run(c[0], a, b);
        Mma<T>::run(c[1], a1, b1);
      }
      if (kk < per) {
        unsigned a[4], b[2];
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(a_addr[0] + kk * 32));
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                     : "=r"(b[0]), "=r"(b[1]) : "r"(b_addr[0] + kk * 32));
        Mma<T>::run(c[0], a, b);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) c[0][e] += c[1][e];
    } else {
#pragma unroll 2
      for (int kk = 0; kk < per; ++kk) {
#pragma unroll
        for (int z = 0; z < 2; ++z) {
          if (z == 1 && !two) break;
          unsigned a[4], b[2];
          asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                       : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(a_addr[z] + kk * 32));
          asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                       : "=r"(b[0]), "=r"(b[1]) : "r"(b_addr[z] + kk * 32));
          Mma<T>::run(c[z], a, b);
        }
      }
    }
    const int g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int z = 0; z < 2; ++z) {
      if (z == 1 && !two) break;
      float* o = part + (long long)ks[z] * bp * n;
      float* r0 = o + (m0[z] + g) * n + n0[z] + 2 * q;
      float* r1 = r0 + 8 * n;
      if (acc) {
        r0[0] += c[z][0];
        r0[1] += c[z][1];
        r1[0] += c[z][2];
        r1[1] += c[z][3];
      } else {
        r0[0] = c[z][0];
        r0[1] = c[z][1];
        r1[0] = c[z][2];
        r1[1] = c[z][3];
      }
    }
  }
}

// float: threads over (2 columns nn and nn + n / 2, 4 rows, k slice): 8 accumulators, FFMA over float4 shared
// loads (no TF32: cuDNN's fp32). A warp's columns are consecutive weight rows (no bank conflicts), its rows
// mostly one broadcast A row.
template <>
__device__ __forceinline__ void block_gemm<float>(const float* A, int pa, const float* B, int pb, float* part, int bp,
                                                  int n, int kc, int ksplit, bool acc, bool) {
  const int np = n >> 1, items = np * (bp >> 2), per = kc / ksplit;
  for (int q = threadIdx.x; q < items * ksplit; q += kPThreads) {
    const int item = q % items, ks = q / items;
    const int n0 = item % np, b0 = (item / np) * 4;
    const float* w0 = B + n0 * pb + ks * per;
    const float* w1 = w0 + np * pb;
    const float* a = A + b0 * pa + ks * per;
    float s0[4] = {0.f, 0.f, 0.f, 0.f}, s1[4] = {0.f, 0.f, 0.f, 0.f};
    for (int k = 0; k < per; k += 4) {
      const float4 u = *reinterpret_cast<const float4*>(w0 + k);
      const float4 v = *reinterpret_cast<const float4*>(w1 + k);
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float4 x = *reinterpret_cast<const float4*>(a + r * pa + k);
        s0[r] = fmaf(x.x, u.x, s0[r]);
        s1[r] = fmaf(x.x, v.x, s1[r]);
        s0[r] = fmaf(x.y, u.y, s0[r]);
        s1[r] = fmaf(x.y, v.y, s1[r]);
        s0[r] = fmaf(x.z, u.z, s0[r]);
        s1[r] = fmaf(x.z, v.z, s1[r]);
        s0[r] = fmaf(x.w, u.w, s0[r]);
        s1[r] = fmaf(x.w, v.w, s1[r]);
      }
    }
    float* o = part + (long long)ks * bp * n;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      float* row = o + (b0 + r) * n;
      row[n0] = acc ? row[n0] + s0[r] : s0[r];
      row[n0 + np] = acc ? row[n0 + np] + s1[r] : s1[r];
    }
  }
}

__device__ __forceinline__ float part_sum(const float* part, int ksplit, int bp, int n, int b, int col) {
  float s = part[b * n + col];
  for (int z = 1; z < ksplit; ++z) s += part[(long long)z * bp * n + b * n + col];
  return s;
}

template <class T> __device__ __forceinline__ float ldf(const void* p, long long i) {
  return load<float>(static_cast<const T*>(p)[i]);
}
template <class T> __device__ __forceinline__ void stf(void* p, long long i, float v) {
  static_cast<T*>(p)[i] = Store<T>::from(v);
}

__device__ __forceinline__ long long slot(const PersistParams& p, int i) { return p.pingpong ? (i & 1) : i; }

// ---------------------------------------------------------------- the tagged exchange (forward)
// With xchg, the forward needs no barrier: at step s every block publishes its units' h_t as words that
// carry the tag s + 1 next to the value (16-bit data: a u32, the value's bits low, the tag high; float: a
// u64, the tag in the high word) into slot s & 1 of [2][batch][hidden]; a block starting step s + 1 reads all
// of h_t from slot s & 1 with .relaxed.gpu loads (L2), re-reading a 16-byte chunk until every word in it
// carries the tag s + 1. Each word is single-copy atomic, so a matching tag means the value next to it is the
// step's: no fence and no counter, one L2 round trip per step instead of three (the barrier's atomic, its
// poll, the h load). Slot s & 1 is rewritten at step s + 2 only by a block that has read h_{s+1} of every
// block, so every block has finished step s + 1 and with it its reads of slot s & 1. persist_reset zeroes
// the words (tag 0 is never expected) so that no earlier launch's tags match.
template <class T> struct Xchg {  // 16-bit data
  static constexpr int PER = 4;   // values per 16-byte chunk
  static constexpr int WORD = 4;  // bytes per word
  static __device__ __forceinline__ void put(void* base, long long i, T v, unsigned tag) {
    const unsigned w = (unsigned)v.bits | (tag << 16);
    asm volatile("st.relaxed.gpu.global.u32 [%0], %1;\n" ::"l"((unsigned*)base + i), "r"(w) : "memory");
  }
  typedef uint4 R;  // the raw chunk of words i .. i + 3
  static __device__ __forceinline__ R load(const void* base, long long i) {
    R r;
    asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"((const unsigned*)base + i) : "memory");
    return r;
  }
  static __device__ __forceinline__ bool ok(const R& r, unsigned tag) {
    return (r.x >> 16) == tag && (r.y >> 16) == tag && (r.z >> 16) == tag && (r.w >> 16) == tag;
  }
  static __device__ __forceinline__ void store(const R& r, T* dst) {
    *reinterpret_cast<uint2*>(dst) = make_uint2((r.x & 0xFFFFu) | (r.y << 16), (r.z & 0xFFFFu) | (r.w << 16));
  }
};
template <> struct Xchg<float> {
  static constexpr int PER = 2;
  static constexpr int WORD = 8;
  static __device__ __forceinline__ void put(void* base, long long i, float v, unsigned tag) {
    const unsigned long long w = (unsigned long long)__float_as_uint(v) | ((unsigned long long)tag << 32);
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;\n" ::"l"((unsigned long long*)base + i), "l"(w) : "memory");
  }
  typedef ulonglong2 R;
  static __device__ __forceinline__ R load(const void* base, long long i) {
    R r;
    asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];\n"
                 : "=l"(r.x), "=l"(r.y) : "l"((const unsigned long long*)base + i) : "memory");
    return r;
  }
  static __device__ __forceinline__ bool ok(const R& r, unsigned tag) {
    return (unsigned)(r.x >> 32) == tag && (unsigned)(r.y >> 32) == tag;
  }
  static __device__ __forceinline__ void store(const R& r, float* dst) {
    *reinterpret_cast<float2*>(dst) = make_float2(__uint_as_float((unsigned)r.x), __uint_as_float((unsigned)r.y));
  }
};

// rows [0, rows) x columns [col0, col0 + cols) of the tagged words at src (row pitch ld words) into dst (row
// pitch `pitch`), once every word carries `tag`. A thread owns at most kXChunks 16-byte chunks (the host
// allows the tagged exchange only then): each round loads all its chunks still pending at once (one L2 round
// trip), keeps those whose tags match, and repeats for the rest.
constexpr int kXChunks = 8;
template <class T>
__device__ __forceinline__ void xchg_gather(T* dst, int pitch, const void* src, long long ld, int col0, int rows,
                                            int cols, unsigned tag) {
  typedef Xchg<T> X;
  const int cpr = cols / X::PER, total = rows * cpr;
  unsigned pending = 0;
#pragma unroll
  for (int m = 0; m < kXChunks; ++m)
    if (threadIdx.x + m * kPThreads < total) pending |= 1u << m;
  unsigned rounds = 0;
  while (pending) {
    typename X::R v[kXChunks];
#pragma unroll
    for (int m = 0; m < kXChunks; ++m) {
      if (pending >> m & 1) {
        const int q = threadIdx.x + m * kPThreads;
        v[m] = X::load(src, (long long)(q / cpr) * ld + col0 + (q % cpr) * X::PER);
      }
    }
#pragma unroll
    for (int m = 0; m < kXChunks; ++m) {
      if ((pending >> m & 1) && X::ok(v[m], tag)) {
        const int q = threadIdx.x + m * kPThreads;
        X::store(v[m], dst + (q / cpr) * pitch + (q % cpr) * X::PER);
        pending &= ~(1u << m);
      }
    }
    if (++rounds == (1u << 22)) __trap();
  }
}

// zeroes the barrier counter and the xchg words (xwords 32-bit words) of dir[blockIdx.y]
template <class T>
__global__ void persist_reset(const PersistParams p) {
  const PersistDir d = blockIdx.y ? p.dir[1] : p.dir[0];
  if (blockIdx.x == 0)  // the counter and the flags (PV_FLAGS) after it: kBarWords words
    for (int i = threadIdx.x; i < kBarWords; i += blockDim.x) d.bar[i] = 0u;
  if (d.xchg)
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < p.xwords;
         i += (long long)gridDim.x * blockDim.x)
      static_cast<unsigned*>(d.xchg)[i] = 0u;
}

// ---------------------------------------------------------------- forward
// shared memory: W slice [G*units][pitch] (row g*units + u = W row g*hidden + j0 + u) at off_w; h_{t-1}
// [bp][pitch] at off_a; part [ksplit][bp][G*units] f32 at off_part; the input projection slice [batch][G*units]
// (dtype) at off_x; the biases bw, br [G*units] f32 at off_b; the f32 state [batch][units] at off_s; lens at
// off_lens.
// LEAN = 1 (tuning.rnn.PERSIST_LEAN; the host picks it for one chunk and the barrier): the same kernel with the
// tagged exchange and the chunk loop compiled out (a smaller step body: see tools/PERF.md on the code size)
template <class T, int CELL, int LEAN = 0>
__global__ void __launch_bounds__(kPThreads, 1) persist_fwd(const PersistParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int G = CELL == 2 ? 4 : (CELL == 3 ? 3 : 1);
  constexpr int GA = CELL >= 2 ? 4 : 1;
  const PersistDir d = blockIdx.y ? p.dir[1] : p.dir[0];
  const int B = p.batch, H = p.hidden, U = p.units, N = G * U, j0 = blockIdx.x * U, TT = p.seq;
  T* ws = reinterpret_cast<T*>(smem + p.off_w);
  T* hsm = reinterpret_cast<T*>(smem + p.off_a);  // nchunk > 1: two buffers of [bp][pitch]
  float* part = reinterpret_cast<float*>(smem + p.off_part);
  T* xs = reinterpret_cast<T*>(smem + p.off_x);
  T* hown = reinterpret_cast<T*>(smem + p.off_h);  // h_{t-1} of this block's units [batch][units]
  float* gsm = reinterpret_cast<float*>(smem + p.off_g);  // the step's gate values [batch][units][GA]
  float* bs = reinterpret_cast<float*>(smem + p.off_b);
  float* st = reinterpret_cast<float*>(smem + p.off_s);
  int* lens = reinterpret_cast<int*>(smem + p.off_lens);
  const T* W = static_cast<const T*>(d.w);
  const T* hs = static_cast<const T*>(d.hs);
  const long long BH = (long long)B * H;

  // once: zero the h buffers (rows past batch, columns past hidden stay 0), the W slice; biases, state, own
  // h, lengths
  const int nch = LEAN ? 1 : p.nchunk;  // K chunks (LEAN: the host guarantees one)
  const int nbuf = nch > 1 ? 2 : 1, KC = p.kp;
  for (int i = threadIdx.x; i < nbuf * p.bp * p.pitch; i += kPThreads) hsm[i] = Store<T>::from(0.0f);
  for (int i = threadIdx.x; i < N * p.wpitch; i += kPThreads) ws[i] = Store<T>::from(0.0f);
  __syncthreads();
  for (int g = 0; g < G; ++g) load_rows<T>(ws + g * U * p.wpitch, p.wpitch, W + ((long long)g * H + j0) * H, H, U, H);
  cp_commit();
  for (int i = threadIdx.x; i < N; i += kPThreads) {
    const int g = i / U, u = i % U;
    bs[i] = d.bw ? ldf<T>(d.bw, (long long)g * H + j0 + u) : 0.f;
    bs[N + i] = d.br ? ldf<T>(d.br, (long long)g * H + j0 + u) : 0.f;
  }
  const int first = d.rev ? TT : 0;
  if (CELL >= 2)
    for (int i = threadIdx.x; i < B * U; i += kPThreads)
      st[i] = d.s32[slot(p, first) * BH + (long long)(i / U) * H + j0 + i % U];
  for (int i = threadIdx.x; i < B * U; i += kPThreads)
    hown[i] = hs[slot(p, first) * BH + (long long)(i / U) * H + j0 + i % U];
  for (int i = threadIdx.x; i < B; i += kPThreads) lens[i] = p.lens[i];
  const unsigned nblk = gridDim.x;
  const bool flags = (p.variant & PV_FLAGS) != 0, chain2 = (p.variant & PV_CHAIN2) != 0;
  const bool fast = sizeof(T) == 2 && (p.variant & PV_FAST_MATH) != 0;
  // PV_XS_AHEAD (one chunk, the barrier; the host doubles the x region): the input projection slice of step
  // s + 1 is fetched during step s, right after h_{t-1}'s copies are issued, into the other of two buffers, so
  // that no step waits for it (it may come from DRAM, the h loads from L2)
  const bool ahead = (p.variant & PV_XS_AHEAD) != 0 && nch == 1 && (LEAN || !d.xchg);
  if (ahead) {
    const int t0 = d.rev ? TT - 1 : 0;
    const T* xt = static_cast<const T*>(d.xp) + (long long)t0 * B * p.ld_xp + j0;
    for (int g = 0; g < G; ++g) load_rows<T>(xs + g * U, N, xt + g * p.gs_xp, p.ld_xp, B, U);
    cp_commit();
  }
  // phase stamps (p.stamps, block 0, thread 0): 0 step start, 1 barrier passed, 2 h in shared memory, 3 GEMM
  // done, 4 cell pass 1 done (before the arrival), 5 pass 2 done
  unsigned long long* stp = (p.stamps && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) ? p.stamps : nullptr;

  for (int s = 0; s < TT; ++s) {
    const int t = d.rev ? TT - 1 - s : s;
    const int ip = d.rev ? t + 1 : t, io = d.rev ? t : t + 1;
    if (stp) stp[s * 8 + 0] = stamp_clock();
    T* const xsb = ahead ? xs + (s & 1) * B * N : xs;  // this step's input projection slice
    if (!ahead) {  // independent of the other blocks, fetched before the barrier
      const T* xt = static_cast<const T*>(d.xp) + (long long)t * B * p.ld_xp + j0;
      for (int g = 0; g < G; ++g) load_rows<T>(xs + g * U, N, xt + g * p.gs_xp, p.ld_xp, B, U);
      cp_commit();
    }
    // h_{t-1} [batch, hidden] chunk by chunk (K = hidden in nchunk chunks of KC, two buffers), the block GEMM
    // accumulating over the chunks
    const bool tagged = !LEAN && s > 0 && d.xchg;
    const int kreal = nch > 1 ? KC : H;
    const T* hsrc = hs + slot(p, ip) * BH;
    if (!tagged) {
      if (s > 0) {
        if (flags) flag_wait(d.bar + kFlagOff, nblk, (unsigned)s);
        else grid_wait(d.bar, (unsigned)s * nblk);
      }
      if (stp) stp[s * 8 + 1] = stamp_clock();
      load_rows<T>(hsm, p.pitch, hsrc, H, B, kreal);
      cp_commit();
    }
    const bool next_x = ahead && s + 1 < TT;  // a group committed after h's: waited for one step later
    if (next_x) {  // buffer (s + 1) & 1 was last read by step s - 1's cell, which every thread has left
      const int tn = d.rev ? t - 1 : t + 1;
      const T* xt = static_cast<const T*>(d.xp) + (long long)tn * B * p.ld_xp + j0;
      for (int g = 0; g < G; ++g) load_rows<T>(xs + ((s + 1) & 1) * B * N + g * U, N, xt + g * p.gs_xp, p.ld_xp, B, U);
      cp_commit();
    }
    for (int c = 0; c < nch; ++c) {
      T* buf = hsm + (c & 1) * p.bp * p.pitch;
      if (tagged) {  // h_{t-1} from the tagged words of step s - 1
        xchg_gather<T>(buf, p.pitch, static_cast<const char*>(d.xchg) + ((s - 1) & 1) * BH * Xchg<T>::WORD, H,
                       c * KC, B, kreal, (unsigned)s);
        if (c == nch - 1) cp_wait_all();  // xs
      } else if (c + 1 < nch) {
        load_rows<T>(hsm + ((c + 1) & 1) * p.bp * p.pitch, p.pitch, hsrc + (c + 1) * KC, H, B, KC);
        cp_commit();
        cp_wait_1();
      } else if (next_x) {
        cp_wait_1();  // h_{t-1} and this step's x slice (committed a step ago), not the next step's
      } else {
        cp_wait_all();
      }
      __syncthreads();
      if (stp && c == 0) stp[s * 8 + 2] = stamp_clock();
      block_gemm<T>(buf, p.pitch, ws + c * KC, p.wpitch, part, p.bp, N, KC, p.ksplit, c > 0, chain2);
      __syncthreads();
    }
    if (stp) stp[s * 8 + 3] = stamp_clock();
    // the cell, in two passes: first what the other blocks wait for (h_t: the state slot, the tagged words)
    // and the block's own state in shared memory, then the barrier, then the rest (y, the f32 state slot, the
    // gate values) from shared memory: the barrier's release covers only the h stores (each thread's pass 2
    // reads only its own items' shared entries, so nothing else needs ordering)
    T* h_out = const_cast<T*>(hs) + slot(p, io) * BH;
    void* xo = !LEAN && d.xchg ? static_cast<char*>(d.xchg) + (s & 1) * BH * Xchg<T>::WORD : nullptr;
    for (int i = threadIdx.x; i < B * U; i += kPThreads) {
      const int b = i / U, u = i % U, j = j0 + u;
      const long long o = (long long)b * H + j;
      if (t < lens[b]) {
        float xa[G], ha[G];
#pragma unroll
        for (int g = 0; g < G; ++g) {
          ha[g] = part_sum(part, p.ksplit, p.bp, N, b, g * U + u) + bs[N + g * U + u];
          xa[g] = load<float>(xsb[b * N + g * U + u]) + bs[g * U + u];
        }
        float* gv = gsm + i * GA;
        if (CELL == 2) {
          const float ig = g_sigm(xa[0] + ha[0], fast), fg = g_sigm(xa[1] + ha[1], fast),
                      gg = g_tanh(xa[2] + ha[2], fast), og = g_sigm(xa[3] + ha[3], fast);
          float c = fg * st[i] + ig * gg;
          if (p.clip) c = c != c ? c : fminf(fmaxf(c, p.lclip), p.rclip);
          st[i] = c;
          hown[i] = Store<T>::from(og * g_tanh(c, fast));
          gv[0] = ig; gv[1] = fg; gv[2] = gg; gv[3] = og;
        } else if (CELL == 3) {
          const float r = g_sigm(xa[0] + ha[0], fast), z = g_sigm(xa[1] + ha[1], fast);
          const float n = g_tanh(xa[2] + r * ha[2], fast);
          const float h = (1.0f - z) * n + z * st[i];
          st[i] = h;
          hown[i] = Store<T>::from(h);
          gv[0] = r; gv[1] = z; gv[2] = n; gv[3] = ha[2];
        } else {
          const float a = xa[0] + ha[0];
          const float h = CELL == 0 ? fmaxf(a, 0.0f) : g_tanh(a, fast);
          hown[i] = Store<T>::from(h);
          gv[0] = h;
        }
      }  // a row past its length carries its state: hown, st unchanged
      h_out[o] = hown[i];
      if (xo) Xchg<T>::put(xo, o, hown[i], s + 1);
    }
    if (stp) stp[s * 8 + 4] = stamp_clock();
    if (xo) __syncthreads();  // the shared buffers are reused next step; no barrier with the tagged exchange
    else if (flags) flag_arrive(d.bar + kFlagOff, (unsigned)s + 1);
    else grid_arrive(d.bar);
    float* s_out = CELL >= 2 ? d.s32 + slot(p, io) * BH : nullptr;
    for (int i = threadIdx.x; i < B * U; i += kPThreads) {
      const int b = i / U, u = i % U, j = j0 + u;
      const bool active = t < lens[b];
      if (CELL >= 2) s_out[(long long)b * H + j] = st[i];
      static_cast<T*>(d.y)[t * p.ld_yt + b * p.ld_y + j] = active ? hown[i] : Store<T>::from(0.0f);
      if (d.act && active) {
        float* act = d.act + ((long long)t * B + b) * GA * H + j;
#pragma unroll
        for (int k = 0; k < GA; ++k) act[k * H] = gsm[i * GA + k];
      }
    }
    if (stp) stp[s * 8 + 5] = stamp_clock();
  }
}

// ---------------------------------------------------------------- forward, fragments in registers (PERSIST_REG)
// persist_fwd_r<T, CELL, KR> (16-bit data, 8 units a block, one K chunk, the barrier; tuning.rnn.PERSIST_REG, the
// host checks the shape: persist.reg_shape): the general kernel's phases cost 3-4x their instruction count
// (tools/PERF.md, "rnnp"), so this one keeps nothing of the step in shared memory but a 16 KiB reduction:
//  - warps over (m tile mt = warp / ksplit, K slice ks = warp % ksplit): a warp computes every gate (n tile g
//    = gate g: 8 units, one tile) of its 16 rows over ksw = hidden / 16 / ksplit k steps: G independent mma
//    chains of ksw (4 chains of 4 for LSTM hidden 256 batch 32);
//  - its weight fragments stay in registers for all steps (G x ksw x 2 words, loaded once);
//  - h_{t-1} goes from L2 straight into the A fragments: K is read in a permuted order inside every 32-column
//    block (the sum over k does not care, as long as A and B agree): thread (g = lane / 4, q = lane % 4) of a
//    warp needs, for k steps 2i and 2i + 1 of row r, a0 / a2 of both = columns {2q, 2q + 1, 2q + 8, 2q + 9} of
//    each logical 16-column step; logical column c of step parity p sits at physical column
//    8 * ((c & 7) >> 1) + 4 * p + 2 * (c >> 3) + (c & 1), so that the thread's four words are the 16 bytes at
//    physical column 32 * i + 8q: one 16-byte load a row and k-step pair; the weights' b0 / b1 of step
//    parity p are the 8 bytes at 32 * i + 8q + 4p (tests/ops/rnn/test_rnn_persist_cpu.py checks the map);
//  - the K slices' partial sums meet in shared memory: thread (lane) of the ksplit warps of an m tile holds
//    the 4 combos c = 2 * rh + e (row mt * 16 + g + 8 rh, unit 2q + e) of every gate; combo c belongs to warp
//    ks = c % ksplit, the others store theirs (a float4 of the gates), the owner adds them in ks order;
//  - the cell, the state, its own h, the biases, the lengths and the next step's input projection (loaded a
//    step ahead) live in the owner's registers; the index math is done once before the step loop.
// With PersistDir.xchg (tuning.rnn.PERSIST_REG_XCHG) the blocks exchange h as persist_fwd's tagged words (no
// barrier): the A loads become two 16-byte loads of tagged words a row and k-step pair, repeated until the tags
// match. Shared memory: red [2 step parities][8 warps][4 combos][32 lanes] float4 (32 KiB).
// Measured (H200, LSTM fp16 hidden 256 batch 32, tools/PERF.md "rnnp"): 2.66 us a step with ONE (2.87 without)
// against persist_fwd's 4.02-4.36; persist_bwd_r took forward + backward data from 4.08 to 3.01 ms.
// KR: k steps a warp at most (weight fragments: G x KR x 2 registers): 4 or 8 (the host takes 4 where it suffices)

__device__ __forceinline__ uint4 ld_relaxed_v4(const void* p) {
  uint4 r;
  asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p) : "memory");
  return r;
}
// PV_CG: a weak L2 load (L1 bypassed, as persist_fwd's cp.async.cg); after the barrier's acquire and CTA barrier
__device__ __forceinline__ uint4 ld_cg_v4(const void* p) {
  uint4 r;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p) : "memory");
  return r;
}
__device__ __forceinline__ unsigned u4_at(const uint4& v, int i) {  // i a compile-time constant after unrolling
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}
__device__ __forceinline__ float f4_at(const float4& v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}
template <class T> __device__ __forceinline__ float bits_f(unsigned short b) {
  T v;
  v.bits = b;
  return to_float(v);
}

template <class T, int CELL, int KR, int ONE = 0>
__global__ void __launch_bounds__(kPThreads, 1) persist_fwd_r(const PersistParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int G = CELL == 2 ? 4 : (CELL == 3 ? 3 : 1);
  constexpr int GA = CELL >= 2 ? 4 : 1;
  const PersistDir d = blockIdx.y ? p.dir[1] : p.dir[0];
  const int B = p.batch, H = p.hidden, TT = p.seq, j0 = blockIdx.x * 8;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, q = lane & 3;
  const int ksplit = p.ksplit, mt = warp / ksplit, ks = warp % ksplit;  // the only divisions
  const int ksw = (H >> 4) / ksplit;  // this warp's k steps (even, <= KR)
  const int kcol0 = ks * ksw * 16;
  float4* const red0 = reinterpret_cast<float4*>(smem);
  const T* W = static_cast<const T*>(d.w);
  const T* hs = static_cast<const T*>(d.hs);
  // tuning.rnn.PERSIST_REG_XCHG: the tagged words, no barrier (KR 4 only: KR 8 would spill, the host keeps the
  // barrier there)
  const bool tagged = KR <= 4 && d.xchg != nullptr;
  const unsigned short* xp = static_cast<const unsigned short*>(d.xp);
  const long long BH = (long long)B * H;
  // ONE (tuning.rnn.PERSIST_REG_ONE; the host: ksplit >= 4 and fast math): one combo a thread (c = ks), fast
  // math compiled in, the exact math and the other combos' code out (a smaller step body)
  constexpr int NC = ONE ? 1 : 4;  // combo slots a thread
  const bool fast = ONE || (p.variant & PV_FAST_MATH) != 0, sleep = (p.variant & PV_SLEEP) != 0;
  const bool cg = (p.variant & PV_CG) != 0;
  const unsigned nblk = gridDim.x;

  // the weight fragments, once: gate g's tile (W rows g * H + j0 + 0..7), k step kk
  unsigned bf[G][KR][2];
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int kk = 0; kk < KR; ++kk) {
      bf[g][kk][0] = bf[g][kk][1] = 0u;
      if (kk < ksw) {
        const uint2 v = *reinterpret_cast<const uint2*>(
            W + ((long long)g * H + j0 + gq) * H + kcol0 + (kk >> 1) * 32 + 8 * q + 4 * (kk & 1));
        bf[g][kk][0] = v.x;
        bf[g][kk][1] = v.y;
      }
    }
  // the A rows of this thread (h_{t-1} row r0, r0 + 8; past the batch: zero fragments, nothing loaded)
  const int r0 = mt * 16 + gq;
  const bool rv0 = r0 < B, rv1 = r0 + 8 < B;
  const long long aoff0 = (long long)r0 * H + kcol0 + 8 * q, aoff1 = aoff0 + 8LL * H;
  // the combos c = 2 * rh + e this thread computes: row r0 + 8 rh, unit 2q + e, owner warp ks = c % ksplit
  // slot ci holds combo c = ONE ? ks : ci (below: cm)
  bool mine[NC], other[4];
  int len[NC];
  long long off[NC];  // b * H + j of the combo
  float st[NC], xb[2][G], hb[2][G];
  unsigned short hown[NC], xc[NC][G], xn[NC][G];
  const int first = d.rev ? TT : 0;
#pragma unroll
  for (int c = 0; c < 4; ++c) other[c] = r0 + 8 * (c >> 1) < B && (c % ksplit) != ks;
#pragma unroll
  for (int ci = 0; ci < NC; ++ci) {
    const int c = ONE ? ks : ci;
    const int b = r0 + 8 * (c >> 1), u = 2 * q + (c & 1);
    const bool valid = b < B && c < 4;
    mine[ci] = valid && (c % ksplit) == ks;
    off[ci] = (long long)b * H + j0 + u;
    len[ci] = 0;
    st[ci] = 0.f;
    hown[ci] = 0;
    if (mine[ci]) {
      len[ci] = p.lens[b];
      if (CELL >= 2) st[ci] = d.s32[slot(p, first) * BH + off[ci]];
      hown[ci] = reinterpret_cast<const unsigned short*>(hs)[slot(p, first) * BH + off[ci]];
    }
  }
#pragma unroll
  for (int e = 0; e < (ONE ? 1 : 2); ++e)
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const long long k = (long long)g * H + j0 + 2 * q + (ONE ? (ks & 1) : e);
      xb[e][g] = d.bw ? ldf<T>(d.bw, k) : 0.f;
      hb[e][g] = d.br ? ldf<T>(d.br, k) : 0.f;
    }
  // the input projection of one step for the combos this thread computes (row b of time t at xp + (t * B + b)
  // * ld_xp, gate g at + g * gs_xp): xrow[c] = b * ld_xp + j; the first step's now, each next one a step ahead
  long long xrow[NC];
#pragma unroll
  for (int ci = 0; ci < NC; ++ci) {
    const int c = ONE ? ks : ci;
    xrow[ci] = (long long)(r0 + 8 * (c >> 1)) * p.ld_xp + j0 + 2 * q + (c & 1);
  }
  const long long xstep = (long long)B * p.ld_xp;
  {
    const unsigned short* xt = xp + (long long)(d.rev ? TT - 1 : 0) * xstep;
#pragma unroll
    for (int c = 0; c < NC; ++c)
#pragma unroll
      for (int g = 0; g < G; ++g) {
        xn[c][g] = 0;
        xc[c][g] = mine[c] ? __ldg(xt + xrow[c] + g * p.gs_xp) : (unsigned short)0;
      }
  }
  unsigned long long* stp = (p.stamps && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) ? p.stamps : nullptr;

  for (int s = 0; s < TT; ++s) {
    const int t = d.rev ? TT - 1 - s : s;
    const int ip = d.rev ? t + 1 : t, io = d.rev ? t : t + 1;
    if (stp) stp[s * 8 + 0] = stamp_clock();
    if (s > 0 && !tagged) grid_wait(d.bar, (unsigned)s * nblk);
    if (stp) stp[s * 8 + 1] = stamp_clock();
    uint4 a[2][KR / 2];
#pragma unroll
    for (int i = 0; i < KR / 2; ++i) a[0][i] = a[1][i] = make_uint4(0u, 0u, 0u, 0u);
    if (tagged && s > 0) {
      // h_{t-1} from the tagged words of step s - 1 (value bits low, tag s high): two 16-byte loads a row and
      // k-step pair, all pending ones issued before any is checked, until every word carries the tag s
      const unsigned* src = static_cast<const unsigned*>(d.xchg) + ((s - 1) & 1) * BH;
      unsigned pend = 0, rounds = 0;
#pragma unroll
      for (int i = 0; i < KR / 2; ++i)
        if (2 * i < ksw) pend |= (rv0 ? 1u << i : 0u) | (rv1 ? 1u << (i + 4) : 0u);
      while (pend) {
        const unsigned cur = pend;
        uint4 v[2][KR / 2][2];
#pragma unroll
        for (int rh = 0; rh < 2; ++rh)
#pragma unroll
          for (int i = 0; i < KR / 2; ++i)
            if (cur >> (rh * 4 + i) & 1) {
              const unsigned* w = src + (rh ? aoff1 : aoff0) + 32 * i;
              v[rh][i][0] = ld_relaxed_v4(w);
              v[rh][i][1] = ld_relaxed_v4(w + 4);
            }
        const unsigned tg = (unsigned)s;
#pragma unroll
        for (int rh = 0; rh < 2; ++rh)
#pragma unroll
          for (int i = 0; i < KR / 2; ++i)
            if (cur >> (rh * 4 + i) & 1) {
              const uint4 l = v[rh][i][0], h = v[rh][i][1];
              if ((l.x >> 16) == tg && (l.y >> 16) == tg && (l.z >> 16) == tg && (l.w >> 16) == tg &&
                  (h.x >> 16) == tg && (h.y >> 16) == tg && (h.z >> 16) == tg && (h.w >> 16) == tg) {
                a[rh][i] = make_uint4((l.x & 0xFFFFu) | (l.y << 16), (l.z & 0xFFFFu) | (l.w << 16),
                                      (h.x & 0xFFFFu) | (h.y << 16), (h.z & 0xFFFFu) | (h.w << 16));
                pend &= ~(1u << (rh * 4 + i));
              }
            }
        if (++rounds == (1u << 22)) __trap();
        if (pend && sleep) __nanosleep(64);  // PV_SLEEP: less L2 traffic from the spinning blocks
      }
    } else {
      // h_{t-1}: one 16-byte L2 load a row and k-step pair
      const T* hsrc = hs + slot(p, ip) * BH;
#pragma unroll
      for (int i = 0; i < KR / 2; ++i) {
        if (2 * i < ksw) {
          if (rv0) a[0][i] = cg ? ld_cg_v4(hsrc + aoff0 + 32 * i) : ld_relaxed_v4(hsrc + aoff0 + 32 * i);
          if (rv1) a[1][i] = cg ? ld_cg_v4(hsrc + aoff1 + 32 * i) : ld_relaxed_v4(hsrc + aoff1 + 32 * i);
        }
      }
    }
    // the next step's input projection (read-only in this kernel), a step ahead
    if (s + 1 < TT) {
      const unsigned short* xt = xp + (long long)(d.rev ? t - 1 : t + 1) * xstep;
#pragma unroll
      for (int c = 0; c < NC; ++c)
#pragma unroll
        for (int g = 0; g < G; ++g)
          if (mine[c]) xn[c][g] = __ldg(xt + xrow[c] + g * p.gs_xp);
    }
    if (stp) stp[s * 8 + 2] = stamp_clock();
    float acc[G][4];
#pragma unroll
    for (int g = 0; g < G; ++g) acc[g][0] = acc[g][1] = acc[g][2] = acc[g][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KR; ++kk) {
      if (kk < ksw) {
        const int i = kk >> 1, w = 2 * (kk & 1);
        const unsigned af[4] = {u4_at(a[0][i], w), u4_at(a[1][i], w), u4_at(a[0][i], w + 1), u4_at(a[1][i], w + 1)};
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const unsigned bb[2] = {bf[g][kk][0], bf[g][kk][1]};
          Mma<T>::run(acc[g], af, bb);
        }
      }
    }
    // acc[g][c]: gate g of combo c (c0 / c1: row g, units 2q, 2q + 1; c2 / c3: row g + 8)
    float ha[NC][G];
    // red: two buffers (step parity) so that one CTA barrier a step orders them, with or without the grid's
    float4* const red = red0 + (s & 1) * (kPWarps * 4 * 32);
    if (ksplit > 1) {
#pragma unroll
      for (int c = 0; c < 4; ++c)
        if (other[c])
          red[(warp * 4 + c) * 32 + lane] = make_float4(acc[0][c], G > 1 ? acc[G > 1 ? 1 : 0][c] : 0.f,
                                                        G > 2 ? acc[G > 2 ? 2 : 0][c] : 0.f,
                                                        G > 3 ? acc[G > 3 ? 3 : 0][c] : 0.f);
      __syncthreads();
    }
#pragma unroll
    for (int ci = 0; ci < NC; ++ci) {
      const int c = ONE ? ks : ci;
#pragma unroll
      for (int g = 0; g < G; ++g) ha[ci][g] = 0.f;
      if (mine[ci]) {
        for (int k2 = 0; k2 < ksplit; ++k2) {  // in K slice order
          if (k2 == ks) {
#pragma unroll
            for (int g = 0; g < G; ++g)
              ha[ci][g] += ONE ? (c == 0 ? acc[g][0] : c == 1 ? acc[g][1] : c == 2 ? acc[g][2] : acc[g][3])
                               : acc[g][ci];
          } else {
            const float4 v = red[((mt * ksplit + k2) * 4 + c) * 32 + lane];
#pragma unroll
            for (int g = 0; g < G; ++g) ha[ci][g] += f4_at(v, g);
          }
        }
      }
    }
    if (stp) stp[s * 8 + 3] = stamp_clock();
    // the cell, pass 1: h_t out (what the other blocks wait for)
    T* h_out = const_cast<T*>(hs) + slot(p, io) * BH;
    float gv[NC][GA];
#pragma unroll
    for (int c = 0; c < NC; ++c) {
#pragma unroll
      for (int k = 0; k < GA; ++k) gv[c][k] = 0.f;
      if (!mine[c]) continue;
      const int e = ONE ? 0 : (c & 1);  // the bias slot (ONE: its one unit's)
      if (t < len[c]) {
        float xa[G], hh[G];
#pragma unroll
        for (int g = 0; g < G; ++g) {
          xa[g] = bits_f<T>(xc[c][g]) + xb[e][g];
          hh[g] = ha[c][g] + hb[e][g];
        }
        if (CELL == 2) {
          const float ig = g_sigm(xa[0] + hh[0], fast), fg = g_sigm(xa[1] + hh[1], fast),
                      gg = g_tanh(xa[2] + hh[2], fast), og = g_sigm(xa[3] + hh[3], fast);
          float cc = fg * st[c] + ig * gg;
          if (p.clip) cc = cc != cc ? cc : fminf(fmaxf(cc, p.lclip), p.rclip);
          st[c] = cc;
          hown[c] = Store<T>::from(og * g_tanh(cc, fast)).bits;
          gv[c][0] = ig; gv[c][1] = fg; gv[c][2] = gg; gv[c][3] = og;
        } else if (CELL == 3) {
          const float r = g_sigm(xa[0] + hh[0], fast), z = g_sigm(xa[1] + hh[1], fast);
          const float n = g_tanh(xa[2] + r * hh[2], fast);
          const float h = (1.0f - z) * n + z * st[c];
          st[c] = h;
          hown[c] = Store<T>::from(h).bits;
          gv[c][0] = r; gv[c][1] = z; gv[c][2] = n; gv[c][GA - 1] = hh[2];
        } else {
          const float av = xa[0] + hh[0];
          const float h = CELL == 0 ? fmaxf(av, 0.0f) : g_tanh(av, fast);
          hown[c] = Store<T>::from(h).bits;
          gv[c][0] = h;
        }
      }  // a row past its length carries its state
      reinterpret_cast<unsigned short*>(h_out)[off[c]] = hown[c];
      if (tagged) {
        T hv;
        hv.bits = hown[c];
        Xchg<T>::put(static_cast<char*>(d.xchg) + (s & 1) * BH * 4, off[c], hv, (unsigned)s + 1);
      }
    }
    if (stp) stp[s * 8 + 4] = stamp_clock();
    if (!tagged) grid_arrive(d.bar);
    // pass 2: y, the f32 state slot, the gate values
    float* s_out = CELL >= 2 ? d.s32 + slot(p, io) * BH : nullptr;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      if (!mine[c]) continue;
      const bool active = t < len[c];
      const int cm = ONE ? ks : c;
      const int b = r0 + 8 * (cm >> 1), j = j0 + 2 * q + (cm & 1);
      if (CELL >= 2) s_out[off[c]] = st[c];
      reinterpret_cast<unsigned short*>(d.y)[t * p.ld_yt + b * p.ld_y + j] = active ? hown[c] : (unsigned short)0;
      if (d.act && active) {
        float* act = d.act + ((long long)t * B + b) * GA * H + j;
#pragma unroll
        for (int k = 0; k < GA; ++k) act[k * H] = gv[c][k];
      }
#pragma unroll
      for (int g = 0; g < G; ++g) xc[c][g] = xn[c][g];
    }
    if (stp) stp[s * 8 + 5] = stamp_clock();
  }
}

// ---------------------------------------------------------------- backward data, fragments in registers
// persist_bwd_r<T, CELL> (tuning.rnn.PERSIST_BWD_REG; 16-bit data, 8 units a block, persist.bwd_reg_shape):
// persist_fwd_r's scheme for the backward's block GEMM [batch, 8] = d_prev [batch, G * hidden] x W[:, units]:
// warps over (m tile, K slice), ksw <= kBwdK k steps a warp in 4 accumulator chains (kk % 4, added in order), the
// W^T fragments in registers (loaded once, 2-byte reads down W's columns), d_prev from L2 straight into the A
// fragments (the permuted K order of persist_fwd_r); combo c of a lane (row r0 + 8 (c >> 1), unit 2q + (c & 1))
// owned by warp ks = c % ksplit, which holds dh / dc carried in registers and fetches its step's gate values,
// states and dy before the barrier. Shared memory: red [2 step parities][8 warps][4 combos][32 lanes] f32.
constexpr int kBwdK = 16;

template <class T, int CELL>
__global__ void __launch_bounds__(kPThreads, 1) persist_bwd_r(const PersistParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int G = CELL == 2 ? 4 : (CELL == 3 ? 3 : 1);
  constexpr int GA = CELL >= 2 ? 4 : 1;
  const PersistDir d = blockIdx.y ? p.dir[1] : p.dir[0];
  const int B = p.batch, H = p.hidden, GH = G * H, TT = p.seq, j0 = blockIdx.x * 8;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, q = lane & 3;
  const int ksplit = p.ksplit, mt = warp / ksplit, ks = warp % ksplit;
  const int ksw = (GH >> 4) / ksplit;  // even, <= kBwdK
  const int kcol0 = ks * ksw * 16;
  float* const red0 = reinterpret_cast<float*>(smem);
  const unsigned short* W = static_cast<const unsigned short*>(d.w);
  const unsigned short* drec = static_cast<const unsigned short*>(d.dha ? d.dha : d.dxa);
  const long long BH = (long long)B * H;
  const unsigned nblk = gridDim.x;

  // W^T fragments: n = unit j0 + gq, k = the physical rows kcol0 + 32 (kk >> 1) + 8q + 4 (kk & 1) + 0..3
  unsigned bf[kBwdK][2];
#pragma unroll
  for (int kk = 0; kk < kBwdK; ++kk) {
    bf[kk][0] = bf[kk][1] = 0u;
    if (kk < ksw) {
      const long long k0 = kcol0 + (kk >> 1) * 32 + 8 * q + 4 * (kk & 1);
      const unsigned short* w = W + k0 * H + j0 + gq;
      bf[kk][0] = (unsigned)w[0] | ((unsigned)w[H] << 16);
      bf[kk][1] = (unsigned)w[2 * H] | ((unsigned)w[3 * H] << 16);
    }
  }
  const int r0 = mt * 16 + gq;
  const bool rv0 = r0 < B, rv1 = r0 + 8 < B;
  const long long aoff0 = (long long)r0 * GH + kcol0 + 8 * q, aoff1 = aoff0 + 8LL * GH;
  bool mine[4], other[4];
  int len[4], bb[4], jj[4];
  float gh[4], gc[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    bb[c] = r0 + 8 * (c >> 1);
    jj[c] = j0 + 2 * q + (c & 1);
    const bool valid = bb[c] < B;
    mine[c] = valid && (c % ksplit) == ks;
    other[c] = valid && (c % ksplit) != ks;
    len[c] = 0;
    gh[c] = gc[c] = 0.f;
    if (mine[c]) {
      const long long o = (long long)bb[c] * H + jj[c];
      len[c] = p.lens[bb[c]];
      gh[c] = d.gh[o];
      gc[c] = CELL == 2 ? d.gc[o] : 0.f;
    }
  }

  for (int s = 0; s <= TT; ++s) {
    const int t = d.rev ? s : TT - 1 - s;  // s == TT: the pass after the last step
    const int ip = d.rev ? t + 1 : t, io = d.rev ? t : t + 1;
    // this step's own inputs (written before the launch): gate values, states, dy
    float av[4][GA], sc[4], sp[4], dyv[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
#pragma unroll
      for (int k = 0; k < GA; ++k) av[c][k] = 0.f;
      sc[c] = sp[c] = dyv[c] = 0.f;
      if (s < TT && mine[c] && t < len[c]) {
        const float* act = d.act + ((long long)t * B + bb[c]) * GA * H + jj[c];
#pragma unroll
        for (int k = 0; k < GA; ++k) av[c][k] = act[k * H];
        const long long o = (long long)bb[c] * H + jj[c];
        if (CELL == 2) sc[c] = d.s32[slot(p, io) * BH + o];
        if (CELL >= 2) sp[c] = d.s32[slot(p, ip) * BH + o];
        if (d.dy) dyv[c] = bits_f<T>(static_cast<const unsigned short*>(d.dy)[t * p.ld_yt + bb[c] * p.ld_y + jj[c]]);
      }
    }
    float rec[4] = {0.f, 0.f, 0.f, 0.f};
    if (s > 0) {
      grid_wait(d.bar, (unsigned)s * nblk);
      const int tp = d.rev ? t - 1 : t + 1;  // the step processed before
      const unsigned short* dsrc = drec + (long long)tp * B * GH;
      uint4 a[2][kBwdK / 2];
#pragma unroll
      for (int i = 0; i < kBwdK / 2; ++i) {
        a[0][i] = a[1][i] = make_uint4(0u, 0u, 0u, 0u);
        if (2 * i < ksw) {
          if (rv0) a[0][i] = ld_relaxed_v4(dsrc + aoff0 + 32 * i);
          if (rv1) a[1][i] = ld_relaxed_v4(dsrc + aoff1 + 32 * i);
        }
      }
      float acc[4][4];
#pragma unroll
      for (int z = 0; z < 4; ++z) acc[z][0] = acc[z][1] = acc[z][2] = acc[z][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kBwdK; ++kk) {
        if (kk < ksw) {
          const int i = kk >> 1, w = 2 * (kk & 1);
          const unsigned af[4] = {u4_at(a[0][i], w), u4_at(a[1][i], w), u4_at(a[0][i], w + 1),
                                  u4_at(a[1][i], w + 1)};
          const unsigned bq[2] = {bf[kk][0], bf[kk][1]};
          Mma<T>::run(acc[kk & 3], af, bq);
        }
      }
      float part[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) part[c] = ((acc[0][c] + acc[1][c]) + acc[2][c]) + acc[3][c];
      float* const red = red0 + (s & 1) * (kPWarps * 4 * 32);
      if (ksplit > 1) {
#pragma unroll
        for (int c = 0; c < 4; ++c)
          if (other[c]) red[(warp * 4 + c) * 32 + lane] = part[c];
        __syncthreads();
      }
#pragma unroll
      for (int c = 0; c < 4; ++c)
        if (mine[c])
          for (int k2 = 0; k2 < ksplit; ++k2)
            rec[c] += k2 == ks ? part[c] : red[((mt * ksplit + k2) * 4 + c) * 32 + lane];
    }
    if (s == TT) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        if (!mine[c]) continue;
        const long long o = (long long)bb[c] * H + jj[c];
        d.gh[o] = gh[c] + rec[c];
        if (CELL == 2) d.gc[o] = gc[c];
        stf<T>(d.ghrec, o, 0.0f);
      }
      break;
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      if (!mine[c]) continue;
      const long long xo = ((long long)t * B + bb[c]) * GH + jj[c];
      if (t >= len[c]) {
        gh[c] += rec[c];
#pragma unroll
        for (int g = 0; g < G; ++g) {
          stf<T>(d.dxa, xo + (long long)g * H, 0.f);
          if (d.dha) stf<T>(d.dha, xo + (long long)g * H, 0.f);
        }
        continue;
      }
      const float dh = gh[c] + rec[c] + dyv[c];
      float dd[G], dr[G];
      if (CELL == 2) {
        const float ig = av[c][0], fg = av[c][1], gg = av[c][2], og = av[c][GA - 1];
        const float cc = sc[c], cp = sp[c];
        const float tc = tanhf(cc);
        float dc = gc[c] + dh * og * (1.0f - tc * tc);
        if (p.clip && !(p.lclip < cc && cc < p.rclip)) dc = 0.0f;
        dd[0] = dc * gg * ig * (1.0f - ig);
        dd[G > 1 ? 1 : 0] = dc * cp * fg * (1.0f - fg);
        dd[G > 2 ? 2 : 0] = dc * ig * (1.0f - gg * gg);
        dd[G - 1] = dh * tc * og * (1.0f - og);
        gc[c] = dc * fg;
        gh[c] = 0.0f;
#pragma unroll
        for (int k = 0; k < G; ++k) dr[k] = dd[k];
      } else if (CELL == 3) {
        const float r = av[c][0], z = av[c][1], n = av[c][2], han = av[c][GA - 1];
        const float hp = sp[c];
        const float dn = dh * (1.0f - z) * (1.0f - n * n);
        dd[G > 1 ? 1 : 0] = dh * (hp - n) * z * (1.0f - z);
        dd[0] = dn * han * r * (1.0f - r);
        dd[G > 2 ? 2 : 0] = dn;
        dr[0] = dd[0];
        dr[G > 1 ? 1 : 0] = dd[G > 1 ? 1 : 0];
        dr[G > 2 ? 2 : 0] = dn * r;
        gh[c] = dh * z;
      } else {
        const float h = av[c][0];
        dd[0] = dh * (CELL == 0 ? (h > 0.0f ? 1.0f : 0.0f) : 1.0f - h * h);
        dr[0] = dd[0];
        gh[c] = 0.0f;
      }
#pragma unroll
      for (int g = 0; g < G; ++g) {
        stf<T>(d.dxa, xo + (long long)g * H, dd[g]);
        if (d.dha) stf<T>(d.dha, xo + (long long)g * H, dr[g]);
      }
    }
    grid_arrive(d.bar);
  }
}

// ---------------------------------------------------------------- backward data
// shared memory: W^T slice [units][pitch] (row u, column k = W[k][j0 + u], k < G*hidden) at off_w; d_prev
// [bp][pitch] at off_a; part [ksplit][bp][units] at off_part; gh [batch][units] f32 at off_s, gc at off_s2;
// lens at off_lens; at off_x the step's own inputs, fetched before the barrier: the gate values
// [batch][GA][units] f32, the f32 states after / before the step [2][batch][units] (LSTM, GRU), dy
// [batch][units] (dtype).
template <class T, int CELL>
__global__ void __launch_bounds__(kPThreads, 1) persist_bwd(const PersistParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int G = CELL == 2 ? 4 : (CELL == 3 ? 3 : 1);
  constexpr int GA = CELL >= 2 ? 4 : 1;
  const PersistDir d = blockIdx.y ? p.dir[1] : p.dir[0];
  const int B = p.batch, H = p.hidden, U = p.units, GH = G * H, j0 = blockIdx.x * U, TT = p.seq;
  T* wt = reinterpret_cast<T*>(smem + p.off_w);
  T* dsm = reinterpret_cast<T*>(smem + p.off_a);
  float* part = reinterpret_cast<float*>(smem + p.off_part);
  float* gh = reinterpret_cast<float*>(smem + p.off_s);
  float* gc = reinterpret_cast<float*>(smem + p.off_s2);
  int* lens = reinterpret_cast<int*>(smem + p.off_lens);
  const T* W = static_cast<const T*>(d.w);
  const long long BH = (long long)B * H;
  // the recurrence reads the recurrent pre-activation gradients (GRU: dha; else dxa, the same values)
  const T* drec = static_cast<const T*>(d.dha ? d.dha : d.dxa);
  float* pf_act = reinterpret_cast<float*>(smem + p.off_x);
  float* pf_s = pf_act + B * GA * U;
  T* pf_dy = reinterpret_cast<T*>(pf_s + (CELL >= 2 ? 2 * B * U : 0));

  const int nbuf = p.nchunk > 1 ? 2 : 1, KC = p.kp, kreal = p.nchunk > 1 ? KC : GH;
  for (int i = threadIdx.x; i < nbuf * p.bp * p.pitch; i += kPThreads) dsm[i] = Store<T>::from(0.0f);
  for (int i = threadIdx.x; i < U * p.wpitch; i += kPThreads) {
    const int u = i / p.wpitch, k = i % p.wpitch;
    wt[i] = k < GH ? W[(long long)k * H + j0 + u] : Store<T>::from(0.0f);
  }
  for (int i = threadIdx.x; i < B * U; i += kPThreads) {
    const long long o = (long long)(i / U) * H + j0 + i % U;
    gh[i] = d.gh[o];
    gc[i] = CELL == 2 ? d.gc[o] : 0.f;
  }
  for (int i = threadIdx.x; i < B; i += kPThreads) lens[i] = p.lens[i];
  __syncthreads();
  const unsigned nblk = gridDim.x;
  // the forward's PV_FLAGS (the flag barrier) and PV_CHAIN2 (two mma chains) apply here too
  const bool flags = (p.variant & PV_FLAGS) != 0, chain2 = (p.variant & PV_CHAIN2) != 0;

  for (int s = 0; s <= TT; ++s) {
    const int t = d.rev ? s : TT - 1 - s;  // s == TT: the pass after the last step (t -1 or TT)
    const int ip = d.rev ? t + 1 : t, io = d.rev ? t : t + 1;
    if (s < TT) {  // this step's gate values, states and dy: this block's own, fetched before the barrier
      load_rows<float>(pf_act, U, d.act + (long long)t * B * GA * H + j0, H, B * GA, U);
      if (CELL >= 2) {
        load_rows<float>(pf_s, U, d.s32 + slot(p, io) * BH + j0, H, B, U);
        load_rows<float>(pf_s + B * U, U, d.s32 + slot(p, ip) * BH + j0, H, B, U);
      }
      if (d.dy) load_rows<T>(pf_dy, U, static_cast<const T*>(d.dy) + t * p.ld_yt + j0, p.ld_y, B, U);
      cp_commit();
    }
    if (s > 0) {
      if (flags) flag_wait(d.bar + kFlagOff, nblk, (unsigned)s);
      else grid_wait(d.bar, (unsigned)s * nblk);
      const int tp = d.rev ? t - 1 : t + 1;  // the step processed before
      const T* dsrc = drec + (long long)tp * B * GH;
      load_rows<T>(dsm, p.pitch, dsrc, GH, B, kreal);
      cp_commit();
      for (int c = 0; c < p.nchunk; ++c) {  // K = G * hidden in nchunk chunks through two buffers
        if (c + 1 < p.nchunk) {
          load_rows<T>(dsm + ((c + 1) & 1) * p.bp * p.pitch, p.pitch, dsrc + (c + 1) * KC, GH, B, KC);
          cp_commit();
          cp_wait_1();
        } else {
          cp_wait_all();
        }
        __syncthreads();
        block_gemm<T>(dsm + (c & 1) * p.bp * p.pitch, p.pitch, wt + c * KC, p.wpitch, part, p.bp, U, KC, p.ksplit,
                      c > 0, chain2);
        __syncthreads();
      }
    }
    if (s == TT) {
      for (int i = threadIdx.x; i < B * U; i += kPThreads) {
        const long long o = (long long)(i / U) * H + j0 + i % U;
        d.gh[o] = gh[i] + part_sum(part, p.ksplit, p.bp, U, i / U, i % U);
        if (CELL == 2) d.gc[o] = gc[i];
        stf<T>(d.ghrec, o, 0.0f);
      }
      break;
    }
    if (s == 0) {
      cp_wait_all();
      __syncthreads();
    }
    for (int i = threadIdx.x; i < B * U; i += kPThreads) {
      const int b = i / U, u = i % U, j = j0 + u;
      const float rec = s > 0 ? part_sum(part, p.ksplit, p.bp, U, b, u) : 0.f;
      const long long xo = ((long long)t * B + b) * GH + j;
      if (t >= lens[b]) {
        gh[i] += rec;
#pragma unroll
        for (int g = 0; g < G; ++g) {
          stf<T>(d.dxa, xo + (long long)g * H, 0.f);
          if (d.dha) stf<T>(d.dha, xo + (long long)g * H, 0.f);
        }
        continue;
      }
      float dh = gh[i] + rec;
      if (d.dy) dh += load<float>(pf_dy[i]);
      const float* act = pf_act + b * GA * U + u;  // gate k at act[k * U]
      float dd[G], dr[G];
      if (CELL == 2) {
        const float ig = act[0], fg = act[U], gg = act[2 * U], og = act[3 * U];
        const float c = pf_s[i], cp = pf_s[B * U + i];
        const float tc = tanhf(c);
        float dc = gc[i] + dh * og * (1.0f - tc * tc);
        if (p.clip && !(p.lclip < c && c < p.rclip)) dc = 0.0f;
        dd[0] = dc * gg * ig * (1.0f - ig);
        dd[1] = dc * cp * fg * (1.0f - fg);
        dd[2] = dc * ig * (1.0f - gg * gg);
        dd[3] = dh * tc * og * (1.0f - og);
        gc[i] = dc * fg;
        gh[i] = 0.0f;
#pragma unroll
        for (int k = 0; k < G; ++k) dr[k] = dd[k];
      } else if (CELL == 3) {
        const float r = act[0], z = act[U], n = act[2 * U], han = act[3 * U];
        const float hp = pf_s[B * U + i];
        const float dn = dh * (1.0f - z) * (1.0f - n * n);
        dd[1] = dh * (hp - n) * z * (1.0f - z);
        dd[0] = dn * han * r * (1.0f - r);
        dd[2] = dn;
        dr[0] = dd[0];
        dr[1] = dd[1];
        dr[2] = dn * r;
        gh[i] = dh * z;
      } else {
        const float h = act[0];
        dd[0] = dh * (CELL == 0 ? (h > 0.0f ? 1.0f : 0.0f) : 1.0f - h * h);
        dr[0] = dd[0];
        gh[i] = 0.0f;
      }
#pragma unroll
      for (int g = 0; g < G; ++g) {
        stf<T>(d.dxa, xo + (long long)g * H, dd[g]);
        if (d.dha) stf<T>(d.dha, xo + (long long)g * H, dr[g]);
      }
    }
    if (flags) flag_arrive(d.bar + kFlagOff, (unsigned)s + 1);
    else grid_arrive(d.bar);
  }
}

}  // namespace rnn
}  // namespace pydnn
