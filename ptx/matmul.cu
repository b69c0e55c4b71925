// Matmul (GEMM): C = alpha * op(A) op(B) + beta * C (+ bias), row major, batched with strides
// (pydnn/ops/matmul.py chooses the kernel and tile; the semantics are in matmul_params.h).
//
// gemm_tc (half, bfloat16): mma.sync m16n8k16 tensor cores, fp32 accumulators. A block computes a
// BM x BN tile of C with WARPS_M x WARPS_N warps (each a WM x WN sub-tile); K advances in steps of
// BK = 64 through a STAGES-deep ring of shared-memory tiles filled with cp.async (STAGES - 1 tiles in
// flight while one is consumed). Operand tiles are stored in shared memory as they lie in global memory
// (the contiguous dim stays contiguous), so all four transposition cases copy 16-byte chunks straight
// through; ldmatrix (plain or .trans, chosen by the case) turns them into mma fragments:
//   A not transposed  [BM][BK]  ldmatrix        A transposed  [BK][BM]  ldmatrix.trans
//   B not transposed  [BK][BN]  ldmatrix.trans  B transposed  [BN][BK]  ldmatrix
// Shared tiles have rows of at least 128 bytes and are XOR-swizzled by 16-byte chunk (swz): the 8 rows
// an ldmatrix reads and the chunks a warp writes all fall in different bank groups.
// Two main loops (PIPE): 1 waits, synchronizes and issues the next copy at the top of each K tile, then
// loads each k16 step's fragments and issues its mmas; 2 (the build's 128x256 and 128x128 tiles) keeps
// the next step's fragments loading while the current step's mmas issue, and copies through a Copier
// whose per-thread addressing is set up once (+19% on the H200: tools/bench_matmul.py).
// VEC = false is the general path for operands cp.async cannot take (a pointer, a leading dim or a
// batch stride that is not a multiple of 8 elements): the same tiles, filled element by element with
// plain loads. Partial tiles (m, n, k edges) are zero filled, so no garbage (or NaN) reaches an mma.
//
// gemm_wgmma (half, bfloat16; sm_90a units only): Hopper warpgroup MMA straight from shared memory
// (common/wgmma.cuh), 128 x BN tiles, two warpgroups; described at the kernel below. gemm_wgmma_p: the
// same, persistent (one wave of blocks walking the tiles). gemm_tma (sm_90a): the 128 x 256 tile fed by TMA
// copies from a producer warpgroup into an mbarrier ring, two consumer warpgroups, persistent (described at
// the kernel below; gemm_tma_c: its 2-CTA cluster candidate).
//
// gemm_simt (float): CUDA-core FMA, BM x BN block tiles of 32 x 64 warp tiles, 8 x 8 outputs per thread,
// both operands K-major in shared memory, fragments double-buffered in registers, the next K tile
// prefetched into registers (16-byte loads where aligned) during the current one's FMAs; any alignment
// and leading dim works; persistent blocks (one wave) walk the (batch, tile) items (described at the
// kernel below).
//
// gemm_tc / gemm_wgmma loop over the batch with stride gridDim.z (the grid's z is capped at 65535); every
// kernel writes the epilogue alpha * acc + beta * C + bias[j] straight from registers; beta == 0 never
// reads C.
#include "common/mma.cuh"
#include "common/quad.cuh"
#include "common/tma.cuh"
#include "common/types.cuh"
#include "common/wgmma.cuh"
#include "matmul_params.h"

namespace pydnn {
namespace matmul {

using mma::cp_async_commit;
using mma::cp_async_wait;
using mma::smem_u32;

// The C tile (tm, tn) of this block: tile rows in groups of group_m, a group walked column by column,
// so that blocks running together share A rows and B columns in L2.
__device__ __forceinline__ void tile_coords(const MatmulParams& p, int& tm, int& tn) {
  const int id = blockIdx.x;
  const int per_group = p.group_m * p.tiles_n;
  const int g = id / per_group;
  const int first = g * p.group_m;
  const int rows = min(p.tiles_m - first, p.group_m);
  const int r = id - g * per_group;
  tm = first + r % rows;
  tn = r / rows;
}

// The (tm, tn) tile of tile index `id` within a batch: tile_coords' raster for any id.
__device__ __forceinline__ void tile_coords_of(const MatmulParams& p, int id, int& tm, int& tn) {
  const int per_group = p.group_m * p.tiles_n;
  const int g = id / per_group;
  const int first = g * p.group_m;
  const int rows = min(p.tiles_m - first, p.group_m);
  const int r = id - g * per_group;
  tm = first + r % rows;
  tn = r / rows;
}

// 16 bytes global -> shared of which the first `bytes` (16 or 0) are read and the rest zero filled.
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}

// As cp_async16 for any `bytes` in [0, 16]. A chunk cut by the end of a row (0 < bytes < 16, the ragged K
// or n edge) is read element by element with plain loads: cp.async with a partial src-size counts as a
// 16-byte read to compute-sanitizer, which flags it when the row is the operand's last and ends its
// allocation. Whole and empty chunks stay asynchronous; the plain stores are seen by the same barrier
// that publishes the stage.
__device__ __forceinline__ void cp_async_zfill(unsigned dst, const void* src, int bytes) {
  if (bytes == 16 || bytes == 0) {
    cp_async16(dst, src, bytes);
    return;
  }
  const unsigned short* e = static_cast<const unsigned short*>(src);
  unsigned w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const unsigned lo = 4 * i < bytes ? e[2 * i] : 0u;
    const unsigned hi = 4 * i + 2 < bytes ? e[2 * i + 1] : 0u;
    w[i] = lo | (hi << 16);
  }
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
               : "memory");
}

// Element offset of 16-byte chunk `c` of row `r` in a shared tile of COLS 16-bit elements per row.
template <int COLS> __device__ __forceinline__ int swz(int r, int c) {
  static_assert(COLS % 64 == 0, "swizzled rows must be multiples of 128 bytes");
  return r * COLS + ((c ^ (r & 7)) << 3);
}

// Copy a ROWS x COLS tile of a row-major operand (row stride ld; rows r0.. of `rows`, columns c0.. of
// `cols` exist) into shared memory, zeros outside. VEC: cp.async 16-byte chunks (g 16-byte aligned, ld a
// multiple of 8); else element by element.
template <class T, int ROWS, int COLS, int THREADS, bool VEC>
__device__ __forceinline__ void load_tile(T* s, const T* g, long long ld, int r0, int rows, int c0, int cols) {
  constexpr int CPR = COLS / 8, CHUNKS = ROWS * CPR;
  static_assert(CHUNKS % THREADS == 0, "tile chunks must divide among the threads");
#pragma unroll
  for (int i = 0; i < CHUNKS / THREADS; ++i) {
    const int idx = threadIdx.x + i * THREADS;
    const int r = idx / CPR, ch = idx % CPR;
    const int gr = r0 + r, gc = c0 + ch * 8;
    T* dst = s + swz<COLS>(r, ch);
    const bool row_ok = gr < rows;
    if (VEC) {
      const int nvalid = row_ok ? min(max(cols - gc, 0), 8) : 0;
      const T* src = nvalid ? g + (long long)gr * ld + gc : g;
      cp_async_zfill(smem_u32(dst), src, nvalid * (int)sizeof(T));
    } else {
      const unsigned short* src = reinterpret_cast<const unsigned short*>(g) + (long long)gr * ld + gc;
      unsigned w[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const unsigned lo = (row_ok && gc + 2 * e < cols) ? src[2 * e] : 0u;
        const unsigned hi = (row_ok && gc + 2 * e + 1 < cols) ? src[2 * e + 1] : 0u;
        w[e] = lo | (hi << 16);
      }
      *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

// The epilogue hook of gemm_tc / gemm_wgmma. NoEpi (the build's kernels, kActive false) leaves the plain
// store (store_pair). The graph API's generated kernels (pydnn/graph/codegen.py) pass a functor with
// kActive true: Row row(z, row) sets up what a row of C needs (operand row pointers, column-broadcast
// values: once per row, the 64-bit index math out of the per-element path), and
// pair<FAST>(row, v0, v1, col, two) turns the values of columns col, col + 1 (two: col + 1 < n) into the
// epilogue's (bias, GELU, residual add ...), reading its operands as pairs where they are contiguous. An
// active epilogue takes C = alpha * A B (no beta, no bias: the graph adds its own), in two passes over the
// accumulator fragment: every value first (all the epilogue's loads), then every store; and a block whose
// tile lies inside C with every contiguous operand pair-aligned (pairs_ok) takes the FAST instantiation:
// no edge tests, no per-pair alignment branch, so its loads are straight-line code the compiler hoists.
// The numbers that decided it (gelu(x @ W + b), bf16 16384 x 4096 x 4096, wgmma 128x256 tile, H200): one
// pass with per-element edge and alignment branches ran 280 TFLOP/s against the plain kernel's 600 (2.14x
// its time) with no spills (ptxas: 242 registers fused, 200 plain); two passes with read-only paired
// loads, still branchy, 304 (2.07x): SASS showed each pair's loads issued just before their use, one
// L1 / L2 latency exposed per pair (128 pairs a thread, 8 warps an SM). The FAST path removes them
// (ptxas, sm_90a, that tile: gelu with the bias read once for both rows 255 registers, no spills; bias +
// residual 255 registers, 36 bytes of spill stores / 64 of loads, all in the epilogue; main loop SASS as
// the plain kernel's: the same 4 HGMMA a K tile, 24 LDGSTS).
// kRed: the epilogue also reduces each row of its result (codegen's reduction epilogue; red_publish below).
struct NoEpi {
  static constexpr bool kActive = false, kRed = false, kStoreC = true;
};
// The plain store of gemm_tma's WIDE tiles through stmatrix (gemm_tma_ps, a candidate: tools/bench_matmul.py's
// "plain_s"; its launch needs codegen.stsm_smem(0) more shared memory)
struct NoEpiStsm {
  static constexpr bool kActive = false, kRed = false, kStoreC = true, kStsm = true;
};
// Epi::kStage where it has one (codegen's epilogues: the bytes of a consumer warp's staged column operands,
// see gemm_tma_body), else 0.
template <class E, class = void> struct StageBytes {
  static constexpr int value = 0;
};
template <class E> struct StageBytes<E, decltype((void)E::kStage, void())> {
  static constexpr int value = E::kStage;
};

// Epi::kStsm where it has one (codegen's epilogues under tuning.matmul.EPI_STSM: gemm_tma's WIDE store through
// stmatrix and a 2 KiB shared buffer a consumer warp, stsm_store_tile), else false.
template <class E, class = void> struct StsmOf {
  static constexpr bool value = false;
};
template <class E> struct StsmOf<E, decltype((void)E::kStsm, void())> {
  static constexpr bool value = E::kStsm;
};

// Epi::kWiden where it has one (codegen's epilogues under tuning.matmul.EPI_WIDEN: staged 16-bit column operands
// widened to float in their buffer once a tile, Epi::widen, before the epilogue), else false.
// Epi::kChunk where it has one (codegen's epilogues under tuning.matmul.EPI_CHUNK: with kStsm, the FAST staged
// tile computes and stores 64 columns at a time, so a chunk's store latency overlaps the next chunk's math), else
// false.
template <class E, class = void> struct ChunkOf {
  static constexpr int value = 0;
};
template <class E> struct ChunkOf<E, decltype((void)E::kChunk, void())> {
  static constexpr int value = E::kChunk;  // the chunk's columns: 64 or 32
};
template <class E, class = void> struct WidenOf {
  static constexpr bool value = false;
};
template <class E> struct WidenOf<E, decltype((void)E::kWiden, void())> {
  static constexpr bool value = E::kWiden;
};

// Pass 2: the final values of columns col, col + 1 stored to C (a pair store where PAIR allows).
template <class T>
__device__ __forceinline__ void put_pair(const MatmulParams& p, T* crow, int col, float v0, float v1) {
  const bool two = col + 1 < p.n;
  if ((p.flags & PYDNN_MATMUL_FLAG_PAIR) && two) {
    Vec<T, 2> out;
    out.v[0] = store<T>(v0);
    out.v[1] = store<T>(v1);
    *reinterpret_cast<Vec<T, 2>*>(crow + col) = out;
    return;
  }
  crow[col] = store<T>(v0);
  if (two) crow[col + 1] = store<T>(v1);
}

// The reduction epilogue's cross-block step for the block's BM rows of tile (tm, tn) of batch z. Each
// thread holds R row partials (rows[r]; combined over the 4 lanes of a quad, which hold one row's columns
// of a warp: lanes with (lane & 3) == 0 publish them); SPLIT warps along n (wn: this warp's) each hold
// part of a row. Each block writes its partials to the workspace (ws: [batch][tiles_n * SPLIT][m]
// floats), then counts itself in cnt[z * tiles_m + tm] (red_publish); the block that counts last
// combines the tiles_n * SPLIT partials of each row in order (deterministic) and hands the result to
// red_done, then resets the counter to 0 (red_finish; the counters start at 0: zeroed when the plan was
// built, and every launch leaves them so).
// red_publish is not inlined and takes plain values: inlined, the fused kernel's register demand passed
// 255 and spilled (wgmma 128x256, bias + row MAX: 264 bytes of spill stores, 740 of loads); taking the
// params structs by reference, out of line, copied them to a 1.4 KB stack frame per thread.
// T0: the first thread of the epilogue's threads. 0: the whole block (__syncthreads); else the threads
// T0 .. T0 + NT - 1 only, through named barrier 1 (gemm_tma: its consumer warpgroups, threads 128 .. 383;
// the producer warpgroup runs its own loop and never reaches a block-wide barrier after the start).
template <int T0, int NT>
__device__ __forceinline__ void epi_sync() {
  if constexpr (T0 == 0) {
    __syncthreads();
  } else {
    static_assert(NT % 32 == 0, "a named barrier counts whole warps");
    asm volatile("bar.sync 1, %0;" ::"n"(NT) : "memory");
  }
}

template <int SPLIT, int R, int T0 = 0, int NT = 0>
__device__ __noinline__ bool red_publish(float* ws, unsigned* cnt, int m, int tiles_n, int tiles_m, long long z,
                                         int tm, int tn, int wn, Vec<float, R> part, Vec<int, R> rows) {
  __shared__ int s_last;
  const long long parts = (long long)tiles_n * SPLIT;
  if ((threadIdx.x & 3) == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (rows.v[r] < m) __stcg(ws + (z * parts + (long long)tn * SPLIT + wn) * m + rows.v[r], part.v[r]);
  }
  __threadfence();
  epi_sync<T0, NT>();
  if (threadIdx.x == T0) {
    const unsigned old = atomicAdd(cnt + z * tiles_m + tm, 1u);
    s_last = old == (unsigned)(tiles_n - 1);
  }
  epi_sync<T0, NT>();
  const bool last = s_last;
  epi_sync<T0, NT>();  // every thread read s_last before a later tile's red_publish writes it
  return last;
}

template <class Epi, int BM, int SPLIT, int THREADS, int T0 = 0>
__device__ __forceinline__ void red_finish(const MatmulParams& p, const Epi& epi, long long z, int tm) {
  __threadfence();
  float* ws = epi.red_ws();
  const long long parts = (long long)p.tiles_n * SPLIT;
  const int m0 = tm * BM;
  for (int r = (int)threadIdx.x - T0; r < BM; r += THREADS) {
    const int row = m0 + r;
    if (row >= p.m) break;
    float a = epi.red_init();
    for (long long t = 0; t < parts; ++t) a = epi.red_comb(a, __ldcg(ws + (z * parts + t) * p.m + row));
    epi.red_done(z, row, a);
  }
  if (threadIdx.x == T0) epi.red_cnt()[z * p.tiles_m + tm] = 0u;
}

// alpha * acc (+ beta * C) (+ bias) for columns col, col + 1 of one row, stored to C.
template <class T>
__device__ __forceinline__ void store_pair(const MatmulParams& p, T* crow, const T* bias, int col, float v0,
                                           float v1) {
  const bool two = col + 1 < p.n;
  v0 *= p.alpha;
  v1 *= p.alpha;
  if ((p.flags & PYDNN_MATMUL_FLAG_PAIR) && two) {
    Vec<T, 2>* dst = reinterpret_cast<Vec<T, 2>*>(crow + col);
    if (p.flags & PYDNN_MATMUL_FLAG_BETA) {
      const Vec<T, 2> old = *dst;
      v0 += p.beta * load<float>(old.v[0]);
      v1 += p.beta * load<float>(old.v[1]);
    }
    if (p.flags & PYDNN_MATMUL_FLAG_BIAS) {
      v0 += load<float>(bias[col]);
      v1 += load<float>(bias[col + 1]);
    }
    Vec<T, 2> out;
    out.v[0] = store<T>(v0);
    out.v[1] = store<T>(v1);
    *dst = out;
    return;
  }
  if (p.flags & PYDNN_MATMUL_FLAG_BETA) {
    v0 += p.beta * load<float>(crow[col]);
    if (two) v1 += p.beta * load<float>(crow[col + 1]);
  }
  if (p.flags & PYDNN_MATMUL_FLAG_BIAS) {
    v0 += load<float>(bias[col]);
    if (two) v1 += load<float>(bias[col + 1]);
  }
  crow[col] = store<T>(v0);
  if (two) crow[col + 1] = store<T>(v1);
}

// ------------------------------------------------------------------------------------------ tensor cores

constexpr int kBK = 64;  // gemm_tc's K step

// The mma fragments of one k16 step of a warp's WM x WN tile, read from a stage's shared tiles
// (sa: A's, sb: B's; layouts as in the header comment).
template <class T, int BM, int BN, int WM, int WN, bool TA, bool TB>
__device__ __forceinline__ void load_frags(const T* sa, const T* sb, int kk, int wm0, int wn0,
                                           unsigned (&a)[WM / 16][4], unsigned (&b)[WN / 8][2]) {
  const int lane = threadIdx.x & 31, mat = lane >> 3, r8 = lane & 7;
#pragma unroll
  for (int i = 0; i < WM / 16; ++i) {
    if (TA) {
      const int kr = kk * 16 + (mat >> 1) * 8 + r8, ch = (wm0 + i * 16 + (mat & 1) * 8) >> 3;
      mma::ldmatrix_x4_trans(a[i], smem_u32(sa + swz<BM>(kr, ch)));
    } else {
      const int row = wm0 + i * 16 + (lane & 15), ch = kk * 2 + (lane >> 4);
      mma::ldmatrix_x4(a[i], smem_u32(sa + swz<kBK>(row, ch)));
    }
  }
#pragma unroll
  for (int j = 0; j < WN / 8; j += 2) {
    unsigned r[4];
    if (TB) {
      const int nr = wn0 + j * 8 + (mat >> 1) * 8 + r8, ch = kk * 2 + (mat & 1);
      mma::ldmatrix_x4(r, smem_u32(sb + swz<kBK>(nr, ch)));
    } else {
      const int kr = kk * 16 + (mat & 1) * 8 + r8, ch = (wn0 + j * 8 + (mat >> 1) * 8) >> 3;
      mma::ldmatrix_x4_trans(r, smem_u32(sb + swz<BN>(kr, ch)));
    }
    b[j][0] = r[0];
    b[j][1] = r[1];
    b[j + 1][0] = r[2];
    b[j + 1][1] = r[3];
  }
}

template <class T, int TM, int TN>
__device__ __forceinline__ void mma_step(float (&acc)[TM][TN][4], const unsigned (&a)[TM][4],
                                         const unsigned (&b)[TN][2]) {
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) mma::MmaOp<T>::run(acc[i][j], a[i], b[j][0], b[j][1]);
}

// Pipeline 2's copier of one operand's K tiles. A thread's chunks share one chunk column and sit RS
// rows apart (RS a multiple of 8, so they share one swizzle), so a thread keeps one global pointer
// (advanced one K tile per copy), one shared offset, a mask of the chunks whose row exists (rows not
// along K: the m / n edge) and the bytes every chunk reads (columns not along K: the m / n edge).
// KROWS: the tile's rows run along K (A transposed, B not).
// WG: the tile is in wgmma's 128B-swizzled slab layout (common/wgmma.cuh: sw128) instead of swz<COLS>.
template <class T, int ROWS, int COLS, int THREADS, bool KROWS, bool WG = false> struct Copier {
  static constexpr int CPR = COLS / 8, RS = THREADS / CPR, N = ROWS / RS;
  static constexpr int ROWSTEP = WG ? 64 : COLS;  // elements from row r to row r + 1 (same slab)
  static_assert(THREADS % CPR == 0 && RS % 8 == 0 && ROWS % RS == 0, "copier layout");
  const T* g;
  int soff;
  unsigned mask;
  int bytes;

  // The operand's K tile 0 has rows r0.. of `rows` and columns c0.. of `cols` (row stride ld).
  __device__ __forceinline__ void init(const T* base, long long ld, int r0, int rows, int c0, int cols) {
    const int r = threadIdx.x / CPR, ch = threadIdx.x % CPR;
    soff = WG ? wgmma::sw128<ROWS>(r, ch) : swz<COLS>(r, ch);
    g = base + (long long)(r0 + r) * ld + c0 + ch * 8;
    mask = 0;
#pragma unroll
    for (int i = 0; i < N; ++i)
      if (KROWS || r0 + r + i * RS < rows) mask |= 1u << i;
    bytes = KROWS ? min(max(cols - (c0 + ch * 8), 0), 8) * (int)sizeof(T) : 16;
  }

  // Copy the current K tile into s (cp.async), then step to the next one. krem: the elements of K from
  // this tile's start to the operand's end (>= kBK but for a ragged last tile, whose rest is zero filled).
  __device__ __forceinline__ void copy(T* s, long long ld, int krem) {
    const int r = threadIdx.x / CPR, ch = threadIdx.x % CPR;
    const int kbytes = min(max(krem - ch * 8, 0), 8) * (int)sizeof(T);  // columns along K
    // The bytes a chunk reads are the same for all of this thread's chunks: whole (every tile but the
    // ragged last K tile / the n or m edge column) takes the plain asynchronous loop, with no per-chunk
    // test for a partial chunk (that test in the loop cost wgmma 38% and the mma.sync tiles ~15% on the
    // H200: tools/bench_matmul.py).
    const int nb = KROWS ? bytes : kbytes;
    if (nb == 16) {
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const bool ok = ((mask >> i) & 1) && (!KROWS || r + i * RS < krem);
        cp_async16(smem_u32(s + soff + i * RS * ROWSTEP), g + i * RS * ld, ok ? 16 : 0);
      }
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const bool ok = ((mask >> i) & 1) && (!KROWS || r + i * RS < krem);
        cp_async_zfill(smem_u32(s + soff + i * RS * ROWSTEP), g + i * RS * ld, ok ? nb : 0);
      }
    }
    g += KROWS ? kBK * ld : kBK;
  }

  // Step past `tiles` K tiles without copying them (a copier set up again for tiles already copied).
  __device__ __forceinline__ void skip(long long ld, int tiles) { g += (KROWS ? kBK * ld : kBK) * tiles; }
};

// The A and B Copiers of one K stage (the [rows][kBK] or [kBK][cols] tile each operand's transposition
// gives), set up for the block's tile and copying K tile kt into a stage (A at sa, B A_ELEMS further).
template <class T, int BM, int BN, int THREADS, bool TA, bool TB, bool WG = false> struct StageCopier {
  Copier<T, TA ? kBK : BM, TA ? BM : kBK, THREADS, TA, WG> ca;
  Copier<T, TB ? BN : kBK, TB ? kBK : BN, THREADS, !TB, WG> cb;
  int kdim;  // the K extent copied (p.k; a split-K item's own range)
  StageCopier() = default;
  __device__ __forceinline__ StageCopier(const MatmulParams& p, const T* A, const T* B, int m0, int n0) {
    init(p, A, B, m0, n0);
  }
  // A and B point at K index 0 of the range; k: its length (p.k but for split-K)
  __device__ __forceinline__ void init(const MatmulParams& p, const T* A, const T* B, int m0, int n0, int k = -1) {
    kdim = k < 0 ? p.k : k;
    if (TA) ca.init(A, p.lda, 0, kdim, m0, p.m); else ca.init(A, p.lda, m0, p.m, 0, kdim);
    if (TB) cb.init(B, p.ldb, n0, p.n, 0, kdim); else cb.init(B, p.ldb, 0, kdim, n0, p.n);
  }
  __device__ __forceinline__ void copy(const MatmulParams& p, T* sa, int a_elems, int kt) {
    ca.copy(sa, p.lda, kdim - kt * kBK);
    cb.copy(sa + a_elems, p.ldb, kdim - kt * kBK);
  }
  __device__ __forceinline__ void skip(const MatmulParams& p, int tiles) {
    ca.skip(p.lda, tiles);
    cb.skip(p.ldb, tiles);
  }
};

// Pipeline 1: per K tile, wait for it, one barrier, issue the copy of tile kt + STAGES - 1, then four
// k16 steps each loading its fragments and issuing its mmas. Every copy goes through load_tile.
template <class T, int BM, int BN, int WM, int WN, int STAGES, int THREADS, bool TA, bool TB, bool VEC>
__device__ __forceinline__ void mainloop_v1(const MatmulParams& p, const T* A, const T* B, T* smem, int m0, int n0,
                                            int wm0, int wn0, float (&acc)[WM / 16][WN / 8][4]) {
  constexpr int A_ELEMS = BM * kBK, STAGE_ELEMS = (BM + BN) * kBK;
  const int ktiles = (p.k + kBK - 1) / kBK;
  auto load_stage = [&](int stage, int kt) {
    T* sa = smem + stage * STAGE_ELEMS;
    T* sb = sa + A_ELEMS;
    const int k0 = kt * kBK;
    if (TA)
      load_tile<T, kBK, BM, THREADS, VEC>(sa, A, p.lda, k0, p.k, m0, p.m);
    else
      load_tile<T, BM, kBK, THREADS, VEC>(sa, A, p.lda, m0, p.m, k0, p.k);
    if (TB)
      load_tile<T, BN, kBK, THREADS, VEC>(sb, B, p.ldb, n0, p.n, k0, p.k);
    else
      load_tile<T, kBK, BN, THREADS, VEC>(sb, B, p.ldb, k0, p.k, n0, p.n);
  };
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ktiles) load_stage(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    cp_async_wait<STAGES - 2>();  // tile kt has landed (for this thread) ...
    __syncthreads();              // ... for every thread; and every warp is done with tile kt - 1
    const int next = kt + STAGES - 1;
    if (next < ktiles) load_stage(next % STAGES, next);  // into the stage tile kt - 1 used
    cp_async_commit();
    const T* sa = smem + (kt % STAGES) * STAGE_ELEMS;
    const T* sb = sa + A_ELEMS;
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      unsigned a[WM / 16][4], b[WN / 8][2];
      load_frags<T, BM, BN, WM, WN, TA, TB>(sa, sb, kk, wm0, wn0, a, b);
      mma_step<T>(acc, a, b);
    }
  }
}

// Pipeline 2 (cp.async operands only): fragments double-buffered in registers (step kk + 1's are loaded
// while step kk's mmas issue; across a K tile's end, step 0 of the next stage), one barrier per K tile
// placed before the first read of the next stage, the copy of tile kt + STAGES - 1 issued after the
// first k16 step's fragment loads, and tiles copied by Copier (little per-chunk arithmetic).
template <class T, int BM, int BN, int WM, int WN, int STAGES, int THREADS, bool TA, bool TB>
__device__ __forceinline__ void mainloop_v2(const MatmulParams& p, const T* A, const T* B, T* smem, int m0, int n0,
                                            int wm0, int wn0, float (&acc)[WM / 16][WN / 8][4]) {
  constexpr int A_ELEMS = BM * kBK, STAGE_ELEMS = (BM + BN) * kBK, KSTEPS = kBK / 16;
  const int ktiles = (p.k + kBK - 1) / kBK;
  StageCopier<T, BM, BN, THREADS, TA, TB> cp(p, A, B, m0, n0);
  auto load_stage = [&](int stage, int kt) { cp.copy(p, smem + stage * STAGE_ELEMS, A_ELEMS, kt); };
  if (ktiles == 0) return;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < ktiles) load_stage(s, s);
    cp_async_commit();
  }
  cp_async_wait<STAGES - 2>();  // tile 0 has landed
  __syncthreads();
  unsigned fa[2][WM / 16][4], fb[2][WN / 8][2];
  int rd = 0;  // the stage being read
  load_frags<T, BM, BN, WM, WN, TA, TB>(smem, smem + A_ELEMS, 0, wm0, wn0, fa[0], fb[0]);
  for (int kt = 0; kt < ktiles; ++kt) {
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
      if (kk == KSTEPS - 1) {
        // Tile kt + 1 has landed (groups committed: STAGES - 1 + kt + 1; at most STAGES - 2 pending), and
        // after this barrier no warp reads tile kt's stage again: iteration kt + 1 refills it.
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        rd = rd + 1 == STAGES ? 0 : rd + 1;
      }
      // Fragments of the next k16 step: kk + 1 here, or step 0 of the next stage (stale data after the
      // last tile: loaded, never used).
      const T* sa = smem + rd * STAGE_ELEMS;
      load_frags<T, BM, BN, WM, WN, TA, TB>(sa, sa + A_ELEMS, (kk + 1) % KSTEPS, wm0, wn0, fa[(kk + 1) & 1],
                                            fb[(kk + 1) & 1]);
      if (kk == 0) {
        // Refill the stage tile kt - 1 used (every warp passed the barrier of iteration kt - 1 since).
        const int next = kt + STAGES - 1;
        if (next < ktiles) load_stage(next % STAGES, next);
        cp_async_commit();
      }
      mma_step<T>(acc, fa[kk & 1], fb[kk & 1]);
    }
  }
}

// MINB: blocks per SM the register budget is capped for (65536 / (threads * MINB) registers a thread).
// PIPE: the main loop (1 or 2, above; 2 needs VEC).
template <class T, int BM, int BN, int WARPS_M, int WARPS_N, int STAGES, int PIPE, bool TA, bool TB, bool VEC,
          class Epi>
__device__ __forceinline__ void gemm_tc_body(const MatmulParams& p, const Epi& epi) {
  constexpr int THREADS = WARPS_M * WARPS_N * 32;
  constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N, TM = WM / 16, TN = WN / 8;
  static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tiles are multiples of 16 x 16");
  static_assert(PIPE == 1 || (PIPE == 2 && VEC), "pipeline 2 copies with cp.async only");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* smem = reinterpret_cast<T*>(smem_raw);

  int tm, tn;
  tile_coords(p, tm, tn);
  const int m0 = tm * BM, n0 = tn * BN;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wm0 = (warp / WARPS_N) * WM, wn0 = (warp % WARPS_N) * WN;

  for (long long z = blockIdx.z; z < p.batch; z += gridDim.z) {
    const T* A = reinterpret_cast<const T*>(p.a) + z * p.stride_a;
    const T* B = reinterpret_cast<const T*>(p.b) + z * p.stride_b;
    float acc[TM][TN][4];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

    if constexpr (PIPE == 2)
      mainloop_v2<T, BM, BN, WM, WN, STAGES, THREADS, TA, TB>(p, A, B, smem, m0, n0, wm0, wn0, acc);
    else
      mainloop_v1<T, BM, BN, WM, WN, STAGES, THREADS, TA, TB, VEC>(p, A, B, smem, m0, n0, wm0, wn0, acc);
    cp_async_wait<0>();  // the next batch's prologue reuses the ring: nothing may still be landing ...
    __syncthreads();     // ... or being read

    T* C = reinterpret_cast<T*>(p.c) + z * p.stride_c;
    const T* bias = reinterpret_cast<const T*>(p.bias);
    if constexpr (!Epi::kActive) {
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = m0 + wm0 + i * 16 + (lane >> 2) + h * 8;
          if (row >= p.m) continue;
          T* crow = C + (long long)row * p.ldc;
#pragma unroll
          for (int j = 0; j < TN; ++j) {
            const int col = n0 + wn0 + j * 8 + (lane & 3) * 2;
            if (col < p.n) store_pair<T>(p, crow, bias, col, acc[i][j][2 * h], acc[i][j][2 * h + 1]);
          }
        }
    } else {
      auto row_of = [&](int r) { return m0 + wm0 + (r >> 1) * 16 + (lane >> 2) + (r & 1) * 8; };
      // FAST is a plain bool, not a generic lambda's compile-time tag: NVRTC 13.0 (the H100 / H200 machines')
      // compiles a generic lambda's call operator as a host function and refuses it; both call sites pass a
      // literal, so the inlined copies fold it as a template argument would
      auto tile = [&](const bool FAST) {
        float part[2 * TM];
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h) {  // pass 1: every value (and every load of the epilogue)
            const int row = row_of(2 * i + h);
            part[2 * i + h] = epi.red_init();
            if (!FAST && row >= p.m) continue;
            const typename Epi::Row er = epi.row(z, row);
#pragma unroll
            for (int j = 0; j < TN; ++j) {
              const int col = n0 + wn0 + j * 8 + (lane & 3) * 2;
              if (FAST || col < p.n) {
                float& v0 = acc[i][j][2 * h];
                float& v1 = acc[i][j][2 * h + 1];
                const bool two = FAST || col + 1 < p.n;
                v0 *= p.alpha;
                v1 *= p.alpha;
                if (FAST)
                epi.template pair<true>(er, v0, v1, col, two);
              else
                epi.template pair<false>(er, v0, v1, col, two);
                if constexpr (Epi::kRed) {
                  part[2 * i + h] = epi.red_comb(part[2 * i + h], epi.red_map(v0));
                  if (two) part[2 * i + h] = epi.red_comb(part[2 * i + h], epi.red_map(v1));
                }
              }
            }
          }
        if constexpr (Epi::kStoreC) {
#pragma unroll
          for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {  // pass 2: the stores
              const int row = row_of(2 * i + h);
              if (!FAST && row >= p.m) continue;
              T* crow = C + (long long)row * p.ldc;
#pragma unroll
              for (int j = 0; j < TN; ++j) {
                const int col = n0 + wn0 + j * 8 + (lane & 3) * 2;
                if (FAST) {
                  Vec<T, 2> out;
                  out.v[0] = store<T>(acc[i][j][2 * h]);
                  out.v[1] = store<T>(acc[i][j][2 * h + 1]);
                  *reinterpret_cast<Vec<T, 2>*>(crow + col) = out;
                } else if (col < p.n) {
                  put_pair<T>(p, crow, col, acc[i][j][2 * h], acc[i][j][2 * h + 1]);
                }
              }
            }
        }
        if constexpr (Epi::kRed) {
          // the warp's columns of a row are in the 4 lanes of a quad; the other warps along n hold the
          // rest of the block's columns: combined in the workspace like other blocks' (WARPS_N partials)
          Vec<float, 2 * TM> pv;
          Vec<int, 2 * TM> rows;
#pragma unroll
          for (int r = 0; r < 2 * TM; ++r) {
            part[r] = epi.red_comb(part[r], __shfl_xor_sync(0xffffffffu, part[r], 1));
            part[r] = epi.red_comb(part[r], __shfl_xor_sync(0xffffffffu, part[r], 2));
            pv.v[r] = part[r];
            rows.v[r] = row_of(r);
          }
          if (red_publish<WARPS_N, 2 * TM>(epi.red_ws(), epi.red_cnt(), p.m, p.tiles_n, p.tiles_m, z, tm, tn,
                                           wn0 / WN, pv, rows))
            red_finish<Epi, BM, WARPS_N, THREADS>(p, epi, z, tm);
        }
      };
      if (m0 + BM <= p.m && n0 + BN <= p.n && (p.flags & PYDNN_MATMUL_FLAG_PAIR) && epi.pairs_ok())
        tile(true);
      else
        tile(false);
    }
  }
}

template <class T, int BM, int BN, int WARPS_M, int WARPS_N, int STAGES, int MINB, int PIPE, bool TA, bool TB,
          bool VEC>
__global__ void __launch_bounds__(WARPS_M* WARPS_N * 32, MINB) gemm_tc(MatmulParams p) {
  gemm_tc_body<T, BM, BN, WARPS_M, WARPS_N, STAGES, PIPE, TA, TB, VEC>(p, NoEpi());
}

// ------------------------------------------------------------------------------------------ wgmma (sm_90a)

// WIDE (gemm_tma's interior tiles whose C rows start 16-byte aligned, PYDNN_MATMUL_FLAG_C16; 16-bit types):
// store 16 bytes a lane. The 4 lanes of a quad hold a row's 8-column groups j as pairs (lane u: columns
// 8j + 2u, +1); for 4 groups at a time they transpose the packed pairs (quad::transpose, common/quad.cuh: 4
// shuffles, the lane-dependent indices as rotations) so that lane t holds group 4jj + t whole. A warp's store then
// fills whole 32-byte sectors (8 rows x 64 bytes) instead of half sectors (8 rows x 16 bytes, 4 stores).

// The WIDE store of row half h of a warp's 16 x BN block (crow: that row's column n0), values scale * acc.
template <class T, int BN>
__device__ __forceinline__ void wide_store_row(T* crow, const float (&acc)[BN / 2], int h, float scale) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int jj = 0; jj < BN / 32; ++jj) {
    unsigned x[4];
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int j = 4 * jj + s;
      x[s] = pack16x2<T>(scale * acc[4 * j + 2 * h], scale * acc[4 * j + 2 * h + 1]);
    }
    quad::transpose(x);  // x[u] = lane u's pair: columns 8 (4jj + t) + 2u, +1
    *reinterpret_cast<uint4*>(crow + 8 * (4 * jj + t)) = make_uint4(x[0], x[1], x[2], x[3]);
  }
}

// The WIDE store of a warp's 16 x BN block through shared memory (an active epilogue's values, kStsm;
// cwarp: C at the block's first row, column n0; sbuf: this warp's 2 KiB buffer, 16 rows x 64 columns of
// 16-bit values, 128 bytes a row, its 16-byte chunk c of row r at r * 128 + ((c ^ (r & 7)) << 4): no bank
// conflict for stmatrix's 8-row matrices nor for the 8 lanes of a read-back row). Per 64-column chunk: 4
// stmatrix.x4 (the fragment's packed pairs as they are: matrix i = rows 8 (i & 1) .., column group j + (i >> 1)),
// then 4 rounds of a 16-byte shared load and a 16-byte global store a lane (8 lanes a 128-byte row, 4 rows a
// round). wide_store_row's quad::transposes take 16 SEL + 4 SHFL a 4-group round (256 SEL and 64 SHFL a thread
// a tile, ~17% of the fused GELU epilogue's instructions); this takes 4 STSM, 4 LDS, 2 WARPSYNC a chunk.
// stsm_store_chunk: one 64-column chunk ch of it (Epi::kChunk: the epilogue computes and stores chunk by chunk).
template <class T, int BN>
__device__ __forceinline__ void stsm_store_chunk(T* cwarp, long long ldc, const float (&acc)[BN / 2], unsigned sbuf,
                                                 int ch, float scale = 1.0f) {
  static_assert(sizeof(T) == 2 && BN % 64 == 0, "stsm_store_tile: 16-bit values, 64-column chunks");
  const int lane = threadIdx.x & 31, mi = lane >> 3;
  const int srow = (lane & 7) + 8 * (mi & 1);  // the row this lane addresses for stmatrix
  {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int j = 8 * ch + 2 * q;  // column groups j, j + 1 (8 columns each)
      const unsigned r0 = pack16x2<T>(scale * acc[4 * j], scale * acc[4 * j + 1]);
      const unsigned r1 = pack16x2<T>(scale * acc[4 * j + 2], scale * acc[4 * j + 3]);
      const unsigned r2 = pack16x2<T>(scale * acc[4 * j + 4], scale * acc[4 * j + 5]);
      const unsigned r3 = pack16x2<T>(scale * acc[4 * j + 6], scale * acc[4 * j + 7]);
      const unsigned c = (unsigned)(2 * q + (mi >> 1));
      const unsigned a = sbuf + (unsigned)srow * 128u + ((c ^ (unsigned)(srow & 7)) << 4);
      asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(r0), "r"(r1),
                   "r"(r2), "r"(r3)
                   : "memory");
    }
    __syncwarp();
#pragma unroll
    for (int it = 0; it < 4; ++it) {
      const int r = mi + 4 * it, c = lane & 7;
      uint4 v;
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "r"(sbuf + (unsigned)r * 128u + ((unsigned)(c ^ (r & 7)) << 4))
                   : "memory");
      *reinterpret_cast<uint4*>(cwarp + (long long)r * ldc + 64 * ch + 8 * c) = v;
    }
    __syncwarp();  // every lane's reads done before the next chunk's stmatrix
  }
}
// stsm_store_chunk32: a 32-column chunk ch (Epi::kChunk 32): its 16 x 32 values through the first KiB of the
// buffer, 64 bytes a row, 16-byte chunk c of row r at r * 64 + ((c ^ ((r >> 1) & 3)) << 4) (stmatrix's 8 rows
// of one logical chunk fall in 8 distinct 16-byte bank groups; a read-back phase of 8 lanes is 2 whole rows):
// 2 stmatrix.x4, then 2 rounds of a 16-byte shared load and global store a lane (4 lanes a row, 8 rows a round).
template <class T, int BN>
__device__ __forceinline__ void stsm_store_chunk32(T* cwarp, long long ldc, const float (&acc)[BN / 2], unsigned sbuf,
                                                   int ch) {
  static_assert(sizeof(T) == 2 && BN % 32 == 0, "stsm_store_chunk32: 16-bit values, 32-column chunks");
  const int lane = threadIdx.x & 31, mi = lane >> 3;
  const int srow = (lane & 7) + 8 * (mi & 1);
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const int j = 4 * ch + 2 * q;
    const unsigned r0 = pack16x2<T>(acc[4 * j], acc[4 * j + 1]);
    const unsigned r1 = pack16x2<T>(acc[4 * j + 2], acc[4 * j + 3]);
    const unsigned r2 = pack16x2<T>(acc[4 * j + 4], acc[4 * j + 5]);
    const unsigned r3 = pack16x2<T>(acc[4 * j + 6], acc[4 * j + 7]);
    const unsigned c = (unsigned)(2 * q + (mi >> 1));
    const unsigned a = sbuf + (unsigned)srow * 64u + ((c ^ (unsigned)((srow >> 1) & 3)) << 4);
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(r0), "r"(r1),
                 "r"(r2), "r"(r3)
                 : "memory");
  }
  __syncwarp();
#pragma unroll
  for (int it = 0; it < 2; ++it) {
    const int r = (lane >> 2) + 8 * it, c = lane & 3;
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(sbuf + (unsigned)r * 64u + ((unsigned)(c ^ ((r >> 1) & 3)) << 4))
                 : "memory");
    *reinterpret_cast<uint4*>(cwarp + (long long)r * ldc + 32 * ch + 8 * c) = v;
  }
  __syncwarp();
}
template <class T, int BN>
__device__ __forceinline__ void stsm_store_tile(T* cwarp, long long ldc, const float (&acc)[BN / 2], unsigned sbuf,
                                                float scale = 1.0f) {
#pragma unroll
  for (int ch = 0; ch < BN / 64; ++ch) stsm_store_chunk<T, BN>(cwarp, ldc, acc, sbuf, ch, scale);
}

// The plain GEMM's store (no active epilogue) of one warpgroup's 64 x BN accumulator fragment of the 128 x BN
// tile at (m0, n0) of C (batch already applied), warpgroup wg: alpha * acc + beta * C + bias. Shared by
// gemm_wgmma_body and wg_epilogue (gemm_tma); only the plain kernels take it, so the fused epilogues' code (an
// active Epi's branch, which spilled when shared whole: see wg_epilogue) is not touched.
template <class T, int BN>
__device__ __forceinline__ void wg_plain_store(const MatmulParams& p, const float (&acc)[BN / 2], T* C, const T* bias,
                                               int m0, int n0, int wg) {
  constexpr int BM = 128;
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  // An interior tile with pair stores and neither beta nor bias (the common GEMM) stores straight-line:
  // alpha, one pack and one 4-byte store a pair (store_pair's edge and flag branches cost ~20
  // instructions a pair: ~1400 a thread a tile, ptxas sm_90a)
  if (m0 + BM <= p.m && n0 + BN <= p.n &&
      (p.flags & (PYDNN_MATMUL_FLAG_PAIR | PYDNN_MATMUL_FLAG_BETA | PYDNN_MATMUL_FLAG_BIAS)) == PYDNN_MATMUL_FLAG_PAIR) {
    const float alpha = p.alpha;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      T* crow = C + (long long)(m0 + wg * 64 + warp * 16 + (lane >> 2) + h * 8) * p.ldc + n0 + (lane & 3) * 2;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        Vec<T, 2> out;
        out.v[0] = store<T>(alpha * acc[4 * j + 2 * h]);
        out.v[1] = store<T>(alpha * acc[4 * j + 2 * h + 1]);
        *reinterpret_cast<Vec<T, 2>*>(crow + j * 8) = out;
      }
    }
    return;
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = m0 + wg * 64 + warp * 16 + (lane >> 2) + h * 8;
    if (row >= p.m) continue;
    T* crow = C + (long long)row * p.ldc;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const int col = n0 + j * 8 + (lane & 3) * 2;
      if (col < p.n) store_pair<T>(p, crow, bias, col, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
    }
  }
}

// The epilogue of gemm_tma for one 128 x BN tile (tm, tn) of batch z, from the accumulator fragment of
// consumer warpgroup wg (its 64 rows: wg * 64 ..): the plain store (alpha, beta, bias) or an active Epi (see
// NoEpi); the same code as gemm_wgmma_body's epilogue, which shares the plain store (wg_plain_store) but keeps
// its inline copy of the active branch: calling this function from there instead made the graph's fused bias +
// GELU kernel on the persistent tile spill 188 bytes (ptxas sm_90a, tests/graph/test_graph_codegen_cpu.py
// allows 64). THREADS: the threads that run the epilogue
// together, from thread T0 on (gemm_tma: 256 from 128, its consumer warpgroups; the reduction epilogue's
// barriers are then named ones over those threads only, epi_sync). WIDE: interior tiles with C16 store 16
// bytes a lane (wide_store_row), the plain GEMM's (no beta, no bias) and an active epilogue's values alike.
// sb: this warp's buffer of the tile's staged column operands (gemm_tma_body, Epi::kStage; its cp.asyncs
// issued before the K loop), 0 where the tile has none: the FAST path then reads them from there.
template <class T, int BN, int THREADS, bool WIDE = false, int T0 = 0, class Epi>
__device__ __forceinline__ void wg_epilogue(const MatmulParams& p, const Epi& epi, float (&acc)[BN / 2], long long z,
                                            int tm, int tn, int wg, unsigned sb = 0u, unsigned ss = 0u) {
  constexpr int BM = 128;
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int m0 = tm * BM, n0 = tn * BN;
  T* C = reinterpret_cast<T*>(p.c) + z * p.stride_c;
  const T* bias = reinterpret_cast<const T*>(p.bias);
  if constexpr (WIDE && !Epi::kActive && sizeof(T) == 2) {
    constexpr unsigned F = PYDNN_MATMUL_FLAG_PAIR | PYDNN_MATMUL_FLAG_BETA | PYDNN_MATMUL_FLAG_BIAS | PYDNN_MATMUL_FLAG_C16;
    if (m0 + BM <= p.m && n0 + BN <= p.n && (p.flags & F) == (PYDNN_MATMUL_FLAG_PAIR | PYDNN_MATMUL_FLAG_C16)) {
      if constexpr (StsmOf<Epi>::value) {  // NoEpiStsm (gemm_tma_ps, a candidate)
        if (ss) {
          stsm_store_tile<T, BN>(C + (long long)(m0 + wg * 64 + warp * 16) * p.ldc + n0, p.ldc, acc, ss, p.alpha);
          return;
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h)
        wide_store_row<T, BN>(C + (long long)(m0 + wg * 64 + warp * 16 + (lane >> 2) + h * 8) * p.ldc + n0, acc, h,
                              p.alpha);
      return;
    }
  }
  if constexpr (!Epi::kActive) {
    wg_plain_store<T, BN>(p, acc, C, bias, m0, n0, wg);
  } else {
    auto row_of = [&](int h) { return m0 + wg * 64 + warp * 16 + (lane >> 2) + h * 8; };
    // FAST is a plain bool, not a generic lambda's compile-time tag: NVRTC 13.0 (the H100 / H200 machines')
    // compiles a generic lambda's call operator as a host function and refuses it; both call sites pass a
    // literal, so the inlined copies fold it as a template argument would
    auto tile = [&](const bool FAST, const bool STG) {
      if constexpr (ChunkOf<Epi>::value && StsmOf<Epi>::value && WIDE && sizeof(T) == 2 && Epi::kStoreC &&
                    !Epi::kRed && StageBytes<Epi>::value > 0) {
        // kChunk: 64 columns' values, then their stmatrix store, chunk by chunk (the store's STSM -> LDS -> STG
        // chain of one chunk beside the next chunk's math instead of 4 chains after all of it)
        if (FAST && STG && ss && (p.flags & PYDNN_MATMUL_FLAG_C16)) {
          const typename Epi::Row r0 = epi.row(z, row_of(0)), r1 = epi.row(z, row_of(1));
          T* cw = C + (long long)(m0 + wg * 64 + warp * 16) * p.ldc + n0;
          constexpr int CW = ChunkOf<Epi>::value;
          static_assert(CW == 64 || CW == 32, "Epi::kChunk: 64 or 32 columns");
#pragma unroll
          for (int ch = 0; ch < BN / CW; ++ch) {
#pragma unroll
            for (int j = ch * (CW / 8); j < (ch + 1) * (CW / 8); ++j) {
              const int col = n0 + j * 8 + (lane & 3) * 2;
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                float& v0 = acc[4 * j + 2 * h];
                float& v1 = acc[4 * j + 2 * h + 1];
                v0 *= p.alpha;
                v1 *= p.alpha;
                epi.template pair<true, true>(h ? r1 : r0, v0, v1, col, true, sb);
              }
            }
            if constexpr (CW == 64) {
              stsm_store_chunk<T, BN>(cw, p.ldc, acc, ss, ch);
            } else {
              stsm_store_chunk32<T, BN>(cw, p.ldc, acc, ss, ch);
            }
          }
          return;
        }
      }
      // pass 1: every value (and every load of the epilogue), a column pair of both rows at a time: an
      // operand that does not move along rows (a bias) is read once for both (its two loads adjacent with
      // one address, which the compiler merges; the row-at-a-time order read it twice, ptxas sm_90a: 63 pair
      // loads of the bias a tile where 32 do)
      float part[2];
      typename Epi::Row er[2];
      bool live[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        part[h] = epi.red_init();
        live[h] = FAST || row_of(h) < p.m;
        if (live[h]) er[h] = epi.row(z, row_of(h));
      }
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        const int col = n0 + j * 8 + (lane & 3) * 2;
        if (!FAST && col >= p.n) continue;
        const bool two = FAST || col + 1 < p.n;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (!live[h]) continue;
          float& v0 = acc[4 * j + 2 * h];
          float& v1 = acc[4 * j + 2 * h + 1];
          v0 *= p.alpha;
          v1 *= p.alpha;
          if (FAST && STG) {
            if constexpr (StageBytes<Epi>::value > 0) epi.template pair<true, true>(er[h], v0, v1, col, two, sb);
          } else if (FAST) {
            epi.template pair<true>(er[h], v0, v1, col, two);
          } else {
            epi.template pair<false>(er[h], v0, v1, col, two);
          }
          if constexpr (Epi::kRed) {
            part[h] = epi.red_comb(part[h], epi.red_map(v0));
            if (two) part[h] = epi.red_comb(part[h], epi.red_map(v1));
          }
        }
      }
      if constexpr (Epi::kStoreC) {
        // an interior tile with 16-byte aligned C rows: the WIDE store of the epilogue's values (an active
        // epilogue has no beta or bias of the GEMM's own)
        bool wide = false;
        if constexpr (WIDE && sizeof(T) == 2) {
          wide = FAST && (p.flags & PYDNN_MATMUL_FLAG_C16);
          if (wide) {
            if constexpr (StsmOf<Epi>::value) {
              if (ss) {
                stsm_store_tile<T, BN>(C + (long long)(m0 + wg * 64 + warp * 16) * p.ldc + n0, p.ldc, acc, ss);
              } else {
#pragma unroll
                for (int h = 0; h < 2; ++h) wide_store_row<T, BN>(C + (long long)row_of(h) * p.ldc + n0, acc, h, 1.0f);
              }
            } else {
#pragma unroll
              for (int h = 0; h < 2; ++h) wide_store_row<T, BN>(C + (long long)row_of(h) * p.ldc + n0, acc, h, 1.0f);
            }
          }
        }
        if (!wide) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {  // pass 2: the stores (4-byte pairs)
            const int row = row_of(h);
            if (!FAST && row >= p.m) continue;
            T* crow = C + (long long)row * p.ldc;
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) {
              const int col = n0 + j * 8 + (lane & 3) * 2;
              if (FAST) {
                Vec<T, 2> out;
                out.v[0] = store<T>(acc[4 * j + 2 * h]);
                out.v[1] = store<T>(acc[4 * j + 2 * h + 1]);
                *reinterpret_cast<Vec<T, 2>*>(crow + col) = out;
              } else if (col < p.n) {
                put_pair<T>(p, crow, col, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
              }
            }
          }
        }
      }
      if constexpr (Epi::kRed) {
        // a row's BN columns are in the 4 lanes of a quad
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          part[h] = epi.red_comb(part[h], __shfl_xor_sync(0xffffffffu, part[h], 1));
          part[h] = epi.red_comb(part[h], __shfl_xor_sync(0xffffffffu, part[h], 2));
        }
        Vec<float, 2> pv;
        Vec<int, 2> rows;
        pv.v[0] = part[0];
        pv.v[1] = part[1];
        rows.v[0] = row_of(0);
        rows.v[1] = row_of(1);
        if (red_publish<1, 2, T0, THREADS>(epi.red_ws(), epi.red_cnt(), p.m, p.tiles_n, p.tiles_m, z, tm, tn, 0, pv,
                                           rows))
          red_finish<Epi, BM, 1, THREADS, T0>(p, epi, z, tm);
      }
    };
    if constexpr (StageBytes<Epi>::value > 0) {
      if (sb) {
        // this lane's staging copies are done; __syncwarp makes every lane's visible to the warp
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        __syncwarp();
      }
    }
    // (with staging, a FAST tile whose operands were not staged, as behind a bias 16-byte misaligned, takes
    // the general path: a third inlined copy of the epilogue spilled, ptxas sm_90a, bias + residual 160 bytes)
    if (m0 + BM <= p.m && n0 + BN <= p.n && (p.flags & PYDNN_MATMUL_FLAG_PAIR) && epi.pairs_ok() &&
        (StageBytes<Epi>::value == 0 || sb)) {
      tile(true, StageBytes<Epi>::value > 0);
    } else {
      tile(false, false);
    }
  }
}

// gemm_wgmma (half, bfloat16; Hopper only, its unit is compiled for sm_90a): a 128 x BN tile of C, two
// warpgroups each computing 64 x BN with wgmma.m64nBNk16 straight from shared memory (no fragments in
// registers but the f32 accumulators). All 256 threads also copy: K tiles of 64 through a STAGES-deep
// ring filled by cp.async (Copier, in the 128B-swizzled layout of common/wgmma.cuh: operands whose K is
// contiguous are K-major, the others MN-major through the instruction's transpose flags, so the four
// transposition cases copy 16-byte chunks straight through as gemm_tc does). Per K tile kt: wait for it,
// fence it to the async proxy, one barrier, issue its 4 wgmmas as one group, wait until only that group
// is pending (the previous tile's are done), then copy tile kt + STAGES - 2 into the stage tile kt - 2
// used (every warpgroup finished reading that stage before the barrier: it waited for that group in
// iteration kt - 1). So STAGES - 2 copies and one or two MMA groups are in flight. (Issuing that copy
// before the wait, since the stage is already free, measured no faster on the H200: tools/bench_matmul.py.)
// The epilogue is gemm_tc's, from the wgmma accumulator fragment (warps stacked along M, 16 rows each);
// an interior tile without beta or bias stores straight-line.
// MINB: blocks per SM the registers are capped for (2: 128 registers a thread, for 128 x 128 tiles
// whose ring fits twice in shared memory, so one block's barrier and copies overlap the other's MMAs).
// PERSIST (gemm_wgmma_p): one block a tile leaves the SM's tensor cores idle through each tile's
// epilogue and through the next block's first loads (1 block an SM: the 197 KB ring); a grid of at most one
// wave of blocks walking the (batch, tile) items in the same raster instead copies the next item's first
// LEAD K tiles into the free ring right after the main loop, so their latency hides behind the epilogue.
// LEAD = STAGES - 1 (a candidate): one more K tile in flight, freed by a second barrier a K tile.
// RUNON (a candidate): the ring runs on from item to item (the K loop's last LEAD copy slots fetch the
// next item's first K tiles, as gemm_simt does), so they land before the epilogue even starts.
template <class T, int BN, int STAGES, bool TA, bool TB, bool PERSIST = false, int LEAD = STAGES - 2,
          bool RUNON = false, bool SPLIT = false, class Epi>
__device__ __forceinline__ void gemm_wgmma_body(const MatmulParams& p, const Epi& epi) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(sizeof(T) == 0, "gemm_wgmma needs the sm_90a target (KernelUnit archs)");
#endif
  constexpr int BM = 128, THREADS = 256, A_ELEMS = BM * kBK, STAGE_ELEMS = (BM + BN) * kBK, D = LEAD;
  constexpr int SLAB = 64 * kBK * (int)sizeof(T);  // bytes of 64 rows of 128 bytes (one slab / 64 M rows)
  static_assert(STAGES >= 3 && (BN == 128 || BN == 256), "gemm_wgmma tile");
  static_assert(LEAD == STAGES - 2 || LEAD == STAGES - 1, "gemm_wgmma: LEAD K tiles in flight");
  static_assert(!SPLIT || (PERSIST && !RUNON && !Epi::kActive), "split-K: the plain persistent kernel");
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // wgmma's swizzle atoms need 1024-byte aligned addresses (the launch adds 1 KiB of slack).
  const unsigned raw = smem_u32(smem_raw);
  T* smem = reinterpret_cast<T*>(smem_raw + (((raw + 1023u) & ~1023u) - raw));
  const unsigned sbase = smem_u32(smem);

  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;

  // Work items: item = z * per_batch + tile id (tile_coords_of's raster). One block per tile (PERSIST
  // false): the grid's x is the tile, z loops with stride gridDim.z. PERSIST: a grid of at most a wave of
  // blocks, block b taking items b, b + gridDim.x, ...; the first D K tiles of the next item are copied
  // into the free ring before this item's epilogue, so their load latency hides behind it.
  const long long per_batch = (long long)p.tiles_m * p.tiles_n;
  const long long items = per_batch * p.batch;
  long long item = PERSIST ? (long long)blockIdx.x : (long long)blockIdx.z * per_batch + blockIdx.x;
  const long long step = PERSIST ? (long long)gridDim.x : (long long)gridDim.z * per_batch;
  StageCopier<T, BM, BN, THREADS, TA, TB, true> cp;
  auto load_stage = [&](int stage, int kt) { cp.copy(p, smem + stage * STAGE_ELEMS, A_ELEMS, kt); };
  // Point the copier at the operands of batch zz's tile (mm0, nn0); returns the K tiles of the item. SPLIT:
  // zz is the split, whose K range starts k_split * zz (batch 1: no batch strides).
  auto setup = [&](long long zz, int mm0, int nn0) {
    const T* A = reinterpret_cast<const T*>(p.a);
    const T* B = reinterpret_cast<const T*>(p.b);
    int klen = p.k;
    if constexpr (SPLIT) {
      const int k0 = (int)zz * p.k_split;
      klen = min(p.k_split, p.k - k0);
      A += TA ? (long long)k0 * p.lda : (long long)k0;
      B += TB ? (long long)k0 : (long long)k0 * p.ldb;
    } else {
      A += zz * p.stride_a;
      B += zz * p.stride_b;
    }
    cp.init(p, A, B, mm0, nn0, klen);
    return (klen + kBK - 1) / kBK;
  };
  // Point the copier at item `it`'s tile and copy its first D K tiles (one commit group each).
  auto prologue = [&](long long it) {
    const long long zz = it / per_batch;
    int tm, tn;
    tile_coords_of(p, (int)(it - zz * per_batch), tm, tn);
    const int ktiles = setup(zz, tm * BM, tn * BN);
#pragma unroll
    for (int s = 0; s < D; ++s) {
      if (s < ktiles) load_stage(s, s);
      cp_async_commit();
    }
  };
  if (PERSIST && item < items) prologue(item);
  int g0 = 0;  // the ring slot of this item's K tile 0 (RUNON: the ring runs on from item to item)

  for (; item < items; item += step) {
    // one block a tile: each (batch) item's first K tiles copied here (not during the previous epilogue:
    // the copier's registers live through a fused epilogue spilled it, bias + residual 172 bytes)
    if constexpr (!PERSIST) prologue(item);
    const long long nitem = item + step;
    const long long z = item / per_batch;
    int tm, tn;
    tile_coords_of(p, (int)(item - z * per_batch), tm, tn);
    const int m0 = tm * BM, n0 = tn * BN;
    // The copier set up again past the K tiles already copied (by the prologue or the previous item's
    // run-on slots), so that none of its registers is live through the previous item's epilogue (the
    // fused bias + residual epilogue spilled 264 bytes with them live, 36 without; ptxas sm_90a).
    const int ktiles = setup(z, m0, n0);
    cp.skip(p, min(D, ktiles));
    // RUNON: the last LEAD copy slots of this item's K loop fetch the next item's first K tiles
    const bool run_on = RUNON && PERSIST && nitem < items && ktiles >= D;
    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;

    for (int kt = 0; kt < ktiles; ++kt) {
      cp_async_wait<D - 1>();       // tile kt has landed (for this thread) ...
      wgmma::fence_proxy_async();   // ... and is visible to the async proxy ...
      __syncthreads();              // ... for every thread's chunks
      const unsigned sa = sbase + ((g0 + kt) % STAGES) * STAGE_ELEMS * (int)sizeof(T), sb = sa + A_ELEMS * (int)sizeof(T);
      wgmma::fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        // This warpgroup's 64 rows of A: slab wg either way (K-major: rows wg*64..; MN-major: columns).
        const unsigned long long da =
            TA ? wgmma::desc_sw128(sa + wg * SLAB + kk * 2048, SLAB, 1024) : wgmma::desc_sw128(sa + wg * SLAB + kk * 32, 16, 1024);
        const unsigned long long db =
            TB ? wgmma::desc_sw128(sb + kk * 32, 16, 1024) : wgmma::desc_sw128(sb + kk * 2048, SLAB, 1024);
        wgmma::Mma<T, BN, TA ? 1 : 0, TB ? 0 : 1>::run(acc, da, db, 1);
      }
      wgmma::commit();
      wgmma::wait<1>();  // this warpgroup's tile kt - 1 group is done
      // LEAD = STAGES - 1: a second barrier (every warpgroup is done with tile kt - 1) frees its stage
      if constexpr (LEAD == STAGES - 1) __syncthreads();
      const int next = kt + D;
      if (next < ktiles) {
        load_stage((g0 + next) % STAGES, next);  // the stage of tile kt - 2 (LEAD STAGES - 1: kt - 1)
      } else if (run_on) {
        if (next == ktiles) {
          const long long zz = nitem / per_batch;
          int ntm, ntn;
          tile_coords_of(p, (int)(nitem - zz * per_batch), ntm, ntn);
          setup(zz, ntm * BM, ntn * BN);  // (not SPLIT: every item has the same K tiles)
        }
        load_stage((g0 + next) % STAGES, next - ktiles);
      }
      cp_async_commit();
    }
    wgmma::wait<0>();
    wgmma::fence_operands(acc);
    if (!run_on) {
      cp_async_wait<0>();  // the next item's prologue reuses the ring: nothing may still be landing ...
      __syncthreads();     // ... or being read
      if (PERSIST && nitem < items) prologue(nitem);
    }
    g0 = run_on ? (g0 + ktiles) % STAGES : 0;

    if constexpr (SPLIT) {
      // the split's fp32 partial (no alpha), row pitch ldc (even: float2 stores), stride_c per split
      float* W = reinterpret_cast<float*>(p.c) + z * p.stride_c;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + wg * 64 + warp * 16 + (lane >> 2) + h * 8;
        if (row >= p.m) continue;
        float* wrow = W + (long long)row * p.ldc;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          const int col = n0 + j * 8 + (lane & 3) * 2;
          if (col + 1 < p.n)
            *reinterpret_cast<float2*>(wrow + col) = make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
          else if (col < p.n)
            wrow[col] = acc[4 * j + 2 * h];
        }
      }
      continue;
    }
    T* C = reinterpret_cast<T*>(p.c) + z * p.stride_c;
    const T* bias = reinterpret_cast<const T*>(p.bias);
    if constexpr (!Epi::kActive) {
      wg_plain_store<T, BN>(p, acc, C, bias, m0, n0, wg);
    } else {
      auto row_of = [&](int h) { return m0 + wg * 64 + warp * 16 + (lane >> 2) + h * 8; };
      // FAST is a plain bool, not a generic lambda's compile-time tag: NVRTC 13.0 (the H100 / H200 machines')
      // compiles a generic lambda's call operator as a host function and refuses it; both call sites pass a
      // literal, so the inlined copies fold it as a template argument would
      auto tile = [&](const bool FAST) {
        float part[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // pass 1: every value (and every load of the epilogue)
          const int row = row_of(h);
          part[h] = epi.red_init();
          if (!FAST && row >= p.m) continue;
          const typename Epi::Row er = epi.row(z, row);
#pragma unroll
          for (int j = 0; j < BN / 8; ++j) {
            const int col = n0 + j * 8 + (lane & 3) * 2;
            if (FAST || col < p.n) {
              float& v0 = acc[4 * j + 2 * h];
              float& v1 = acc[4 * j + 2 * h + 1];
              const bool two = FAST || col + 1 < p.n;
              v0 *= p.alpha;
              v1 *= p.alpha;
              if (FAST)
                epi.template pair<true>(er, v0, v1, col, two);
              else
                epi.template pair<false>(er, v0, v1, col, two);
              if constexpr (Epi::kRed) {
                part[h] = epi.red_comb(part[h], epi.red_map(v0));
                if (two) part[h] = epi.red_comb(part[h], epi.red_map(v1));
              }
            }
          }
        }
        if constexpr (Epi::kStoreC) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {  // pass 2: the stores
            const int row = row_of(h);
            if (!FAST && row >= p.m) continue;
            T* crow = C + (long long)row * p.ldc;
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) {
              const int col = n0 + j * 8 + (lane & 3) * 2;
              if (FAST) {
                Vec<T, 2> out;
                out.v[0] = store<T>(acc[4 * j + 2 * h]);
                out.v[1] = store<T>(acc[4 * j + 2 * h + 1]);
                *reinterpret_cast<Vec<T, 2>*>(crow + col) = out;
              } else if (col < p.n) {
                put_pair<T>(p, crow, col, acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
              }
            }
          }
        }
        if constexpr (Epi::kRed) {
          // a row's BN columns are in the 4 lanes of a quad
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            part[h] = epi.red_comb(part[h], __shfl_xor_sync(0xffffffffu, part[h], 1));
            part[h] = epi.red_comb(part[h], __shfl_xor_sync(0xffffffffu, part[h], 2));
          }
          Vec<float, 2> pv;
          Vec<int, 2> rows;
          pv.v[0] = part[0];
          pv.v[1] = part[1];
          rows.v[0] = row_of(0);
          rows.v[1] = row_of(1);
          if (red_publish<1, 2>(epi.red_ws(), epi.red_cnt(), p.m, p.tiles_n, p.tiles_m, z, tm, tn, 0, pv, rows))
            red_finish<Epi, BM, 1, THREADS>(p, epi, z, tm);
        }
      };
      if (m0 + BM <= p.m && n0 + BN <= p.n && (p.flags & PYDNN_MATMUL_FLAG_PAIR) && epi.pairs_ok())
        tile(true);
      else
        tile(false);
    }
  }
}

template <class T, int BN, int STAGES, int MINB, bool TA, bool TB>
__global__ void __launch_bounds__(256, MINB) gemm_wgmma(MatmulParams p) {
  gemm_wgmma_body<T, BN, STAGES, TA, TB>(p, NoEpi());
}

// Split-K (the persistent 128 x BN kernel): the K range cut into batch splits of k_split elements, each
// (split, tile) item's fp32 partial written to the workspace at c (no alpha, beta or bias); then
// splitk_reduce. For problems whose tiles fill too few SMs with a long K (a Linear layer's weight
// gradient: M x N = 384 x 1152, K = 16384 tokens makes 15 tiles of 128 x 256 for 132 SMs).
template <class T, int BN, int STAGES, int MINB, bool TA, bool TB>
__global__ void __launch_bounds__(256, MINB) gemm_wgmma_s(MatmulParams p) {
  gemm_wgmma_body<T, BN, STAGES, TA, TB, true, STAGES - 2, false, true>(p, NoEpi());
}

// C = alpha * (sum of the batch partials at a, in split order: deterministic) + beta * C + bias, a column
// pair a thread (grid-stride): a = the float partials (row pitch lda, even; stride_a apart), the rest as
// the GEMM's own params.
template <class T>
__global__ void __launch_bounds__(256) splitk_reduce(MatmulParams p) {
  const float* W = reinterpret_cast<const float*>(p.a);
  const int pairs = (p.n + 1) / 2;
  const long long total = (long long)p.m * pairs;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
    const int row = (int)(i / pairs), col = (int)(i - (long long)row * pairs) * 2;
    const float* w = W + (long long)row * p.lda + col;
    float v0 = 0.f, v1 = 0.f;
    if (col + 1 < p.n) {
      for (int s = 0; s < p.batch; ++s) {
        const float2 t = *reinterpret_cast<const float2*>(w + s * p.stride_a);
        v0 += t.x;
        v1 += t.y;
      }
    } else {
      for (int s = 0; s < p.batch; ++s) v0 += w[s * p.stride_a];
    }
    store_pair<T>(p, reinterpret_cast<T*>(p.c) + (long long)row * p.ldc, reinterpret_cast<const T*>(p.bias), col,
                  v0, v1);
  }
}

// The persistent form (a grid of at most one wave of blocks walking the tiles; see gemm_wgmma_body).
template <class T, int BN, int STAGES, int MINB, bool TA, bool TB, int LEAD = STAGES - 2, bool RUNON = false>
__global__ void __launch_bounds__(256, MINB) gemm_wgmma_p(MatmulParams p) {
  gemm_wgmma_body<T, BN, STAGES, TA, TB, true, LEAD, RUNON>(p, NoEpi());
}

// ------------------------------------------------------------------------------------------ TMA (sm_90a)

// gemm_tma (half, bfloat16; Hopper only, its unit is compiled for sm_90a): the sm_90 GEMM built as
// warp-specialised persistent kernels are. 384 threads: warpgroup 0 is the producer (one thread of it
// issues every copy; its registers given back with setmaxnreg), warpgroups 1 and 2 the consumers (64 rows
// each of one 128 x BN tile: wgmma.m64nBNk16 from shared memory, registers raised for the accumulators
// and the epilogue). K tiles of 64 flow through a STAGES-deep ring of shared stages (A's 128 x 64 and B's
// BN x 64, in the 128B-swizzled layout of common/wgmma.cuh) filled by TMA (common/tma.cuh): per stage a
// full barrier (the producer's expect-tx arrival plus the copies' bytes) and an empty barrier (one
// arrival per consumer warpgroup once its wgmmas reading the stage are done). The copy of a box lands in
// exactly the layout the descriptors describe: a K-major operand (A not transposed, B transposed) is one
// box of 64 K x 128 / BN rows (128-byte rows, the 128B swizzle); an MN-major operand is boxes of 64 M / N
// columns x 64 K rows, one per 64-column slab. Boxes reaching past the matrix are zero filled by the TMA
// unit (m, n and k edges need no code; the full barrier still counts the whole box's bytes).
// A grid of at most one block per SM walks the (batch, tile) items (tile_coords_of's grouped raster);
// producer and consumers walk the same items, and the ring's stage / phase run on across items, so the
// producer fetches the next tile's first K tiles while the consumers run this tile's epilogue (the
// cp.async kernels' all-threads-copy design could only overlap that by the run-on trick of gemm_wgmma_p).
// The epilogue is gemm_wgmma's (wg_epilogue): the plain store, or the graph API's generated epilogues
// (pydnn/graph/codegen.py: bias, activations, residual adds ...; the reduction epilogue's barriers are named
// ones over the 256 consumer threads, epi_sync: the producer warpgroup never reaches them).
// CM = 2 (gemm_tma_c, a candidate): clusters of 2 CTAs on the tile rows 2i, 2i + 1 of one tile column
// share B: each CTA's producer copies its own A and half of B's stage, multicast into both CTAs (the same
// shared offset, completing on both full barriers: each still expects the whole stage's bytes), so
// L2 -> SM traffic drops from 48 to 32 KiB a K tile a CTA. A stage is refilled only when the consumers
// of both CTAs released it (empty barriers count 2 x CM arrivals: each consumer warpgroup arrives on its
// own CTA's and on the peer's). The pair walks pair items together (tile rows in pairs; a pair past an
// odd tiles_m copies zeros and stores nothing); a CTA leaves only after the cluster barrier at the end (no
// copy or arrival of its peer may still be aimed at its shared memory).
// Debug timeline (tools/gemm_timeline.py; only where the unit is compiled with -DPYDNN_GEMM_TL, which no
// installed unit is: without it the stamps below are not in the preprocessed text, so every installed kernel's
// SASS is unchanged). The buffer's address rides in p.stride_a, which gemm_tma never reads (A's batch stride is
// in its tensor map). Per block 3 records (role 0 the producer's issuing thread, 1 and 2 the first thread of
// consumer warpgroup 0 / 1) of 8 + 8 * PYDNN_GEMM_TL 64-bit words: a header (globaltimer and clock64 at the
// role's start and end, the SM id, tiles stamped) and 8 words a tile (TL_* below; clock64 cycles of this SM):
// TURN before the ping-pong turn barrier (cooperative: the tile's start), KSTART after the first K tile's full
// wait, LAST after the last K tile's commit, HAND after the loop, DONE after wait<0>, EPI after the epilogue,
// FULLW the other full waits' cycles.
#ifdef PYDNN_GEMM_TL
enum { TL_ITEM = 0, TL_TURN = 1, TL_KSTART = 2, TL_LAST = 3, TL_HAND = 4, TL_DONE = 5, TL_EPI = 6, TL_FULLW = 7 };
__device__ __forceinline__ unsigned long long tl_clock() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
  return t;
}
__device__ __forceinline__ unsigned long long tl_gtime() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}
__device__ __forceinline__ unsigned long long* tl_record(const MatmulParams& p, int role) {
  return reinterpret_cast<unsigned long long*>(p.stride_a) + (blockIdx.x * 3ull + role) * (8ull + 8ull * PYDNN_GEMM_TL);
}
__device__ __forceinline__ void tl_begin(unsigned long long* r) {
  unsigned smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  r[0] = tl_gtime();
  r[1] = tl_clock();
  r[4] = smid;
}
__device__ __forceinline__ void tl_end(unsigned long long* r, int tiles) {
  r[3] = tl_clock();
  r[2] = tl_gtime();
  r[5] = (unsigned long long)tiles;
}
// tile t's word f (tiles past PYDNN_GEMM_TL are not stamped)
#define PYDNN_TL_PUT(r, t, f, v) \
  do {                           \
    if ((t) < PYDNN_GEMM_TL) (r)[8 + 8 * (t) + (f)] = (v); \
  } while (0)
#endif

// PP (a candidate, gemm_tma with pp): ping-pong consumers. Each consumer warpgroup computes whole 128 x BN
// tiles (two m64 halves, BN = 128: the same 128 accumulators a thread) and takes every other item of the
// block's; the producer fills the ring with the block's items in order, so warpgroup 1's first K tiles land
// only as warpgroup 0 nears the end of its item's K loop: the two K loops alternate by themselves, and each
// warpgroup's epilogue (a fused GELU's erff: ~3800 instructions a thread a tile, ptxas sm_90a) runs while
// the other's wgmmas keep the tensor cores busy, where the cooperative kernel leaves them idle through it.
// An empty barrier then counts CM arrivals (the one warpgroup that read the stage, in each CTA of the
// cluster). No row reduction (its block-wide counter protocol expects one tile at a time). With CM = 2
// (gemm_tma_c with pp, a candidate: TMA_PPC_TILE) the pair's CTAs walk the same items in lockstep, tile rows
// 2i and 2i + 1 of one tile column sharing B by multicast: 24 KiB of L2 -> SM copies a 128 x 128 x 64 K tile
// a CTA instead of 32, the cooperative 128 x 256 tile's bytes a FLOP.
template <class T, int BN, int STAGES, bool TA, bool TB, int CM = 1, bool WIDE = false, bool PP = false, class Epi>
__device__ __forceinline__ void gemm_tma_body(const MatmulTmaParams& q, const Epi& epi) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(sizeof(T) == 0, "gemm_tma needs the sm_90a target (KernelUnit archs)");
#endif
  static_assert(!Epi::kRed || (CM == 1 && !PP), "gemm_tma: the reduction epilogue runs on the 1-CTA kernel");
  static_assert(!PP || BN == 128, "gemm_tma ping-pong: 128 x 128 tiles a warpgroup");
  static_assert(BN == 128 || BN == 256, "gemm_tma tile");
  static_assert(CM == 1 || CM == 2, "gemm_tma: clusters of 1 or 2 CTAs along M");
  constexpr int BM = 128;
  constexpr unsigned A_BYTES = BM * kBK * sizeof(T), B_BYTES = BN * kBK * sizeof(T);
  constexpr unsigned STAGE_BYTES = A_BYTES + B_BYTES;
  constexpr unsigned SLAB = 64 * kBK * sizeof(T);  // bytes of a 64-column slab (or 64 rows of 128 bytes)
  // Register budgets (setmaxnreg): 128 x 40 + 256 x 232 = 64512 of the SM's 65536 (one block an SM).
  constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;
  const MatmulParams& p = q.p;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // the swizzle atoms (and the TMA destinations) need 1024-byte aligned addresses (the launch adds 1 KiB;
  // the same offset in every CTA of a cluster: the multicast copies land at the issuer's offsets)
  const unsigned raw = smem_u32(smem_raw);
  const unsigned sbase = (raw + 1023u) & ~1023u;
  const unsigned full0 = sbase + STAGES * STAGE_BYTES, empty0 = full0 + 8 * STAGES;  // 8-byte mbarriers
  const tma::TensorMap* map_a = reinterpret_cast<const tma::TensorMap*>(&q.map_a);
  const tma::TensorMap* map_b = reinterpret_cast<const tma::TensorMap*>(&q.map_b);
  const unsigned rank = CM > 1 ? tma::cluster_rank() : 0u;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      tma::mbar_init(full0 + 8 * s, 1);
      tma::mbar_init(empty0 + 8 * s, PP ? CM : 2 * CM);
    }
    tma::fence_barrier_init();
    tma::prefetch_map(map_a);
    tma::prefetch_map(map_b);
  }
  if constexpr (CM > 1)
    tma::cluster_sync();  // the peer's barriers exist before any copy or arrival reaches them
  else
    __syncthreads();

  // Items: (batch, unit) with units of CM tile rows x 1 tile column in tile_coords_of's raster (groups of
  // group_m tile rows); block b of cluster c = b / CM takes items c, c + clusters, ... and tile row
  // unit * CM + its rank.
  const int units_m = (p.tiles_m + CM - 1) / CM;
  const int group = CM > 1 ? max(p.group_m / CM, 1) : p.group_m;
  const long long per_batch = (long long)units_m * p.tiles_n;
  const long long items = per_batch * p.batch;
  const long long first = blockIdx.x / CM, step = gridDim.x / CM;
  const int ktiles = (p.k + kBK - 1) / kBK;
  auto coords = [&](long long item, long long& z, int& tm, int& tn) {
    z = item / per_batch;
    const int id = (int)(item - z * per_batch);
    const int per_group = group * p.tiles_n;
    const int g = id / per_group;
    const int gfirst = g * group;
    const int rows = min(units_m - gfirst, group);
    const int r = id - g * per_group;
    tm = (gfirst + r % rows) * CM + (int)rank;
    tn = r / rows;
  };
  if (threadIdx.x < 128) {
    tma::regs_dealloc<PRODUCER_REGS>();
    if (threadIdx.x == 0) {
      unsigned it = 0;  // K tiles issued so far (over every item): stage it % STAGES, phase (it / STAGES) & 1
#ifdef PYDNN_GEMM_TL
      unsigned long long* tlr = tl_record(p, 0);
      int tlt = 0;
      tl_begin(tlr);
#endif
      for (long long item = first; item < items; item += step) {
        long long zz;
        int tm, tn;
        coords(item, zz, tm, tn);
        const int z = (int)zz, m0 = tm * BM, n0 = tn * BN;
#ifdef PYDNN_GEMM_TL
        unsigned long long tlw = 0;
        PYDNN_TL_PUT(tlr, tlt, TL_ITEM, (unsigned long long)item);
        PYDNN_TL_PUT(tlr, tlt, TL_KSTART, tl_clock());
#endif
        for (int kt = 0; kt < ktiles; ++kt, ++it) {
          const unsigned s = it % STAGES, full = full0 + 8 * s;
#ifdef PYDNN_GEMM_TL
          const unsigned long long tw0 = tl_clock();
          tma::mbar_wait(empty0 + 8 * s, ((it / STAGES) & 1) ^ 1);
          tlw += tl_clock() - tw0;
#else
          tma::mbar_wait(empty0 + 8 * s, ((it / STAGES) & 1) ^ 1);
#endif
          tma::mbar_arrive_expect_tx(full, STAGE_BYTES);
          const unsigned sa = sbase + s * STAGE_BYTES, sb = sa + A_BYTES;
          const int k0 = kt * kBK;
          if (TA) {
#pragma unroll
            for (int i = 0; i < BM / 64; ++i) tma::load_3d(sa + i * SLAB, map_a, full, m0 + 64 * i, k0, z);
          } else {
            tma::load_3d(sa, map_a, full, k0, m0, z);
          }
          if constexpr (CM == 1) {
            if (TB) {
              tma::load_3d(sb, map_b, full, k0, n0, z);
            } else {
#pragma unroll
              for (int i = 0; i < BN / 64; ++i) tma::load_3d(sb + i * SLAB, map_b, full, n0 + 64 * i, k0, z);
            }
          } else {
            // this CTA's half of B (rows or slabs rank * BN / 2 ..), into both CTAs
            constexpr unsigned short ALL = (1u << CM) - 1;
            if (TB) {
              tma::load_3d_mc(sb + rank * (B_BYTES / CM), map_b, full, k0, n0 + (int)rank * (BN / CM), z, ALL);
            } else {
#pragma unroll
              for (int i = 0; i < BN / 64 / CM; ++i) {
                const int j = (int)rank * (BN / 64 / CM) + i;
                tma::load_3d_mc(sb + j * SLAB, map_b, full, n0 + 64 * j, k0, z, ALL);
              }
            }
          }
        }
#ifdef PYDNN_GEMM_TL
        PYDNN_TL_PUT(tlr, tlt, TL_LAST, tl_clock());
        PYDNN_TL_PUT(tlr, tlt, TL_FULLW, tlw);
        ++tlt;
#endif
      }
#ifdef PYDNN_GEMM_TL
      tl_end(tlr, tlt);
#endif
    }
  } else {
    tma::regs_alloc<CONSUMER_REGS>();
    const int wg = (threadIdx.x >> 7) - 1;           // consumer warpgroup: rows wg * 64 .. of the tile
    const bool signals = (threadIdx.x & 127) == 0;   // its thread that arrives on the empty barriers
#ifdef PYDNN_GEMM_TL
    unsigned long long* tlr = tl_record(p, 1 + wg);
    int tlt = 0;
    if (signals) tl_begin(tlr);
#define PYDNN_TL_AT(f) \
  if (signals) PYDNN_TL_PUT(tlr, tlt, f, tl_clock())
#endif
    auto release = [&](unsigned s) {
      if (CM == 1) {
        tma::mbar_arrive(empty0 + 8 * s);
      } else {
#pragma unroll
        for (int r = 0; r < CM; ++r) tma::mbar_arrive_cluster(empty0 + 8 * s, (unsigned)r);
      }
    };
    if constexpr (PP) {
      // local item i of the block (item first + i * step) is warpgroup i % 2's; its K tiles sit at ring
      // positions i * ktiles ..
      for (long long i = wg; first + i * step < items; i += 2) {
        long long z;
        int tm, tn;
        coords(first + i * step, z, tm, tn);
        unsigned it = (unsigned)(i * ktiles);
#ifdef PYDNN_GEMM_TL
        unsigned long long tlw = 0;
        if (signals) PYDNN_TL_PUT(tlr, tlt, TL_ITEM, (unsigned long long)(first + i * step));
        PYDNN_TL_AT(TL_TURN);
#endif
        // The K loops take turns: item i's starts once the other warpgroup's K loop of item i - 1 has passed
        // its last full barrier (named barrier 2 + wg: its 128 threads arrive, this warpgroup's sync). Besides
        // keeping the tensor cores to one warpgroup at a time, this makes the parity waits exact: a parity
        // wait cannot tell phase k from k - 2, and every fill before item i's first K tile has then landed.
        if (i > 0) asm volatile("bar.sync %0, 256;" ::"r"(2 + wg) : "memory");
        float acc0[BN / 2], acc1[BN / 2];  // rows 0 .. 63 and 64 .. 127 of the tile
#pragma unroll
        for (int j = 0; j < BN / 2; ++j) acc0[j] = acc1[j] = 0.f;
        for (int kt = 0; kt < ktiles; ++kt, ++it) {
          const unsigned s = it % STAGES;
#ifdef PYDNN_GEMM_TL
          // KSTART after the first K tile's full wait (a clock read right after bar.sync's DEFER_BLOCKING form
          // can issue before the barrier completes: seen in the cluster kernel's SASS and stamps, session 31),
          // so the turn interval holds that first wait and FULLW the rest
          const unsigned long long tw0 = tl_clock();
          tma::mbar_wait(full0 + 8 * s, (it / STAGES) & 1);
          if (kt == 0) {
            PYDNN_TL_AT(TL_KSTART);
          } else {
            tlw += tl_clock() - tw0;
          }
#else
          tma::mbar_wait(full0 + 8 * s, (it / STAGES) & 1);
#endif
          const unsigned sa = sbase + s * STAGE_BYTES, sb = sa + A_BYTES;
          wgmma::fence();
#pragma unroll
          for (int kk = 0; kk < kBK / 16; ++kk) {
            const unsigned long long db =
                TB ? wgmma::desc_sw128(sb + kk * 32, 16, 1024) : wgmma::desc_sw128(sb + kk * 2048, SLAB, 1024);
            const unsigned long long da0 =
                TA ? wgmma::desc_sw128(sa + kk * 2048, SLAB, 1024) : wgmma::desc_sw128(sa + kk * 32, 16, 1024);
            const unsigned long long da1 = TA ? wgmma::desc_sw128(sa + SLAB + kk * 2048, SLAB, 1024)
                                              : wgmma::desc_sw128(sa + SLAB + kk * 32, 16, 1024);
            wgmma::Mma<T, BN, TA ? 1 : 0, TB ? 0 : 1>::run(acc0, da0, db, 1);
            wgmma::Mma<T, BN, TA ? 1 : 0, TB ? 0 : 1>::run(acc1, da1, db, 1);
          }
          wgmma::commit();
#ifdef PYDNN_GEMM_TL
          if (kt == ktiles - 1) PYDNN_TL_AT(TL_LAST);
#endif
          wgmma::wait<1>();  // K tile it - 1's group is done: its stage may be refilled
          if (kt > 0 && signals) release((it - 1) % STAGES);
        }
        if (first + (i + 1) * step < items) asm volatile("bar.arrive %0, 256;" ::"r"(3 - wg) : "memory");
#ifdef PYDNN_GEMM_TL
        PYDNN_TL_AT(TL_HAND);
#endif
        wgmma::wait<0>();
        wgmma::fence_operands(acc0);
        wgmma::fence_operands(acc1);
#ifdef PYDNN_GEMM_TL
        PYDNN_TL_AT(TL_DONE);
#endif
        if (ktiles > 0 && signals) release((it - 1) % STAGES);
        if (CM == 1 || tm < p.tiles_m) {  // (a cluster's pair past an odd tiles_m stores nothing)
          wg_epilogue<T, BN, 128, WIDE>(p, epi, acc0, z, tm, tn, 0);
          wg_epilogue<T, BN, 128, WIDE>(p, epi, acc1, z, tm, tn, 1);
        }
#ifdef PYDNN_GEMM_TL
        PYDNN_TL_AT(TL_EPI);
        if (signals) PYDNN_TL_PUT(tlr, tlt, TL_FULLW, tlw);
        ++tlt;
#endif
      }
    } else {
      unsigned it = 0;
      // Staged column operands (Epi::kStage bytes, 1-CTA kernel): each consumer warp copies the tile's into
      // its own buffer before the K loop (cp.async, 16 bytes a lane), so the epilogue reads shared memory
      // instead of global loads that would wait, with the tensor cores idle, behind the next tile's TMA
      // copies. The __syncwarp before the copies: every lane's reads of the buffer in the last epilogue
      // are done before any lane's copy may land.
      constexpr int SB = CM == 1 ? StageBytes<Epi>::value : 0;
      const unsigned stg = ((full0 + 16 * STAGES + 127u) & ~127u) + (unsigned)(((threadIdx.x >> 5) - 4) * SB);
      // kStsm: a consumer warp's 2 KiB store buffer after the 8 staging buffers (codegen.stsm_smem)
      constexpr bool SS = CM == 1 && StsmOf<Epi>::value && WIDE && sizeof(T) == 2;
      const unsigned ssb = SS ? ((full0 + 16 * STAGES + 127u) & ~127u) + ((8u * SB + 127u) & ~127u) +
                                    (unsigned)(((threadIdx.x >> 5) - 4) * 2048)
                              : 0u;
      for (long long item = first; item < items; item += step) {
        long long z;
        int tm, tn;
        coords(item, z, tm, tn);
#ifdef PYDNN_GEMM_TL
        unsigned long long tlw = 0;
        if (signals) PYDNN_TL_PUT(tlr, tlt, TL_ITEM, (unsigned long long)item);
        PYDNN_TL_AT(TL_TURN);
#endif
        unsigned sb = 0;
        if constexpr (SB > 0) {
          if (epi.stage_ok(z, tn * BN)) {
            sb = stg;
            __syncwarp();
            epi.stage(z, tn * BN, sb, threadIdx.x & 31);
            asm volatile("cp.async.commit_group;\n" ::: "memory");
          }
        }
        float acc[BN / 2];
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
        for (int kt = 0; kt < ktiles; ++kt, ++it) {
          const unsigned s = it % STAGES;
#ifdef PYDNN_GEMM_TL
          // KSTART after the first K tile's full wait (a clock read right after bar.sync's DEFER_BLOCKING form
          // can issue before the barrier completes: seen in the cluster kernel's SASS and stamps, session 31),
          // so the turn interval holds that first wait and FULLW the rest
          const unsigned long long tw0 = tl_clock();
          tma::mbar_wait(full0 + 8 * s, (it / STAGES) & 1);
          if (kt == 0) {
            PYDNN_TL_AT(TL_KSTART);
          } else {
            tlw += tl_clock() - tw0;
          }
#else
          tma::mbar_wait(full0 + 8 * s, (it / STAGES) & 1);
#endif
          const unsigned sa = sbase + s * STAGE_BYTES, sb = sa + A_BYTES;
          wgmma::fence();
#pragma unroll
          for (int kk = 0; kk < kBK / 16; ++kk) {
            // this warpgroup's 64 rows of A: slab wg either way (K-major: rows wg * 64 ..; MN-major: columns)
            const unsigned long long da = TA ? wgmma::desc_sw128(sa + wg * SLAB + kk * 2048, SLAB, 1024)
                                             : wgmma::desc_sw128(sa + wg * SLAB + kk * 32, 16, 1024);
            const unsigned long long db =
                TB ? wgmma::desc_sw128(sb + kk * 32, 16, 1024) : wgmma::desc_sw128(sb + kk * 2048, SLAB, 1024);
            wgmma::Mma<T, BN, TA ? 1 : 0, TB ? 0 : 1>::run(acc, da, db, 1);
          }
          wgmma::commit();
#ifdef PYDNN_GEMM_TL
          if (kt == ktiles - 1) PYDNN_TL_AT(TL_LAST);
#endif
          wgmma::wait<1>();  // this warpgroup's group of K tile it - 1 is done: its stage may be refilled
          if (kt > 0 && signals) release((it - 1) % STAGES);
        }
#ifdef PYDNN_GEMM_TL
        PYDNN_TL_AT(TL_HAND);
#endif
        if constexpr (SB > 0 && WidenOf<Epi>::value) {
          // while the last K tile's wgmmas run (~0.8 kc a tile with the warp idle, H200 timeline): the staged
          // 16-bit column operands to float (cp.async complete and visible to the warp first), so the epilogue
          // reads them with no conversion
          if (sb) {
            asm volatile("cp.async.wait_all;\n" ::: "memory");
            __syncwarp();
            epi.widen(sb, threadIdx.x & 31);
            __syncwarp();
          }
        }
        wgmma::wait<0>();
        wgmma::fence_operands(acc);
#ifdef PYDNN_GEMM_TL
        PYDNN_TL_AT(TL_DONE);
#endif
        if (ktiles > 0 && signals) release((it - 1) % STAGES);
        if (tm < p.tiles_m) wg_epilogue<T, BN, 256, WIDE, 128>(p, epi, acc, z, tm, tn, wg, sb, ssb);
#ifdef PYDNN_GEMM_TL
        PYDNN_TL_AT(TL_EPI);
        if (signals) PYDNN_TL_PUT(tlr, tlt, TL_FULLW, tlw);
        ++tlt;
#endif
      }
    }
#ifdef PYDNN_GEMM_TL
    if (signals) tl_end(tlr, tlt);
#undef PYDNN_TL_AT
#endif
  }
  if constexpr (CM > 1) {
    __syncwarp();
    tma::cluster_sync();  // the peer's last copies into and arrivals on this CTA's shared memory are done
  }
}

template <class T, int BN, int STAGES, bool TA, bool TB, bool WIDE = false, bool PP = false>
__global__ void __launch_bounds__(384, 1) gemm_tma(const __grid_constant__ MatmulTmaParams q) {
  gemm_tma_body<T, BN, STAGES, TA, TB, 1, WIDE, PP>(q, NoEpi());
}

// gemm_tma with the WIDE store through stmatrix (NoEpiStsm; a candidate, no installed unit)
template <class T, int BN, int STAGES, bool TA, bool TB, bool WIDE = false, bool PP = false>
__global__ void __launch_bounds__(384, 1) gemm_tma_ps(const __grid_constant__ MatmulTmaParams q) {
  gemm_tma_body<T, BN, STAGES, TA, TB, 1, WIDE, PP>(q, NoEpiStsm());
}

// The 2-CTA cluster form (a candidate; see CM above). The grid is a multiple of 2 blocks. (__cluster_dims__
// is an error before sm_90 even in a template never instantiated: the units of other archs include this file.)
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
template <class T, int BN, int STAGES, bool TA, bool TB, bool WIDE = false, bool PP = false>
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(384, 1) gemm_tma_c(const __grid_constant__ MatmulTmaParams q) {
  gemm_tma_body<T, BN, STAGES, TA, TB, 2, WIDE, PP>(q, NoEpi());
}
#endif

// ------------------------------------------------------------------------------------------ CUDA cores

// gemm_simt: one thread computes an 8 x 8 block of C as 2 x 2 sub-blocks of 4 x 4 (rows 16 apart,
// columns 32 apart), a warp 32 x 64 (lanes 4 along m x 8 along n), WARPS_M x WARPS_N warps a BM x BN
// block tile. Shared memory holds both operands K-major ([BK][BM + 4] and [BK][BN + 4]), so each k step
// is two 16-byte loads of A and two of B per thread (4 and 8 distinct addresses per warp: broadcasts)
// for 64 FMAs; the fragments of step k + 1 load while step k's FMAs issue. Global -> shared goes
// through registers (16-byte loads where a chunk is whole and aligned, else element by element with
// zero fill), the next K tile's loads issued before the current tile's FMAs, one barrier per K tile
// (two shared buffers). An operand whose contiguous dim is K (A not transposed, B transposed) is
// written to shared memory transposed, 4 scalar stores per chunk (conflict-free: the +4 row padding
// puts the two K quads a warp writes 16 banks apart).

// One operand's K tiles: BK x TILE (TILE along m or n), fetched as float4 chunks into registers and
// stashed K-major into a [BK][TILE + 4] shared tile. KROWS: the operand's rows run along K (its
// contiguous dim is the tile's m / n); else its contiguous dim is K and a chunk is 4 K values of one row.
template <int TILE, int BK, int THREADS, bool KROWS> struct SimtSide {
  static constexpr int LD = TILE + 4;                   // shared row pitch (floats)
  static constexpr int CPR = KROWS ? TILE / 4 : BK / 4;  // chunks per global row of the tile
  static constexpr int RS = THREADS / CPR;              // rows between a thread's chunks
  static constexpr int N = TILE * BK / 4 / THREADS;     // chunks per thread
  static_assert(THREADS % CPR == 0 && N * THREADS * 4 == TILE * BK && N >= 1, "simt tile layout");
  float4 r[N];
  const float* g;  // chunk 0 of this thread in the current K tile
  int tr, tc;      // tile row / column (elements) of chunk 0
  int lim;         // KROWS: valid elements of every chunk (m / n edge); else: bit i = chunk i's row exists

  // Operand rows r0.. of `rows`, columns c0.. of `cols` (row stride ld) are K tile 0.
  __device__ __forceinline__ void init(const float* base, long long ld, int r0, int rows, int c0, int cols) {
    tr = threadIdx.x / CPR;
    tc = (threadIdx.x % CPR) * 4;
    g = base + (long long)(r0 + tr) * ld + c0 + tc;
    if (KROWS) {
      lim = min(max(cols - (c0 + tc), 0), 4);
    } else {
      lim = 0;
#pragma unroll
      for (int i = 0; i < N; ++i)
        if (r0 + tr + i * RS < rows) lim |= 1 << i;
    }
  }

  // Load K tile kt (this thread's chunks) into registers, then step to the next tile. kleft: the K
  // elements from this tile's start to the operand's end.
  __device__ __forceinline__ void fetch(long long ld, int kleft) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const float* src = g + (long long)i * RS * ld;
      int cnt;
      if (KROWS) cnt = tr + i * RS < kleft ? lim : 0;
      else cnt = ((lim >> i) & 1) ? min(max(kleft - tc, 0), 4) : 0;
      if (cnt == 4 && (reinterpret_cast<unsigned long long>(src) & 15) == 0) {
        r[i] = *reinterpret_cast<const float4*>(src);
      } else {
        r[i].x = cnt > 0 ? src[0] : 0.f;
        r[i].y = cnt > 1 ? src[1] : 0.f;
        r[i].z = cnt > 2 ? src[2] : 0.f;
        r[i].w = cnt > 3 ? src[3] : 0.f;
      }
    }
    g += KROWS ? BK * ld : BK;
  }

  __device__ __forceinline__ void stash(float* s) const {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int row = tr + i * RS;
      if (KROWS) {
        *reinterpret_cast<float4*>(s + row * LD + tc) = r[i];
      } else {
        s[(tc + 0) * LD + row] = r[i].x;
        s[(tc + 1) * LD + row] = r[i].y;
        s[(tc + 2) * LD + row] = r[i].z;
        s[(tc + 3) * LD + row] = r[i].w;
      }
    }
  }
};

// alpha * v (+ beta * C) (+ bias) for columns col..col + 3 of one row of C: one 16-byte access where the
// four are in C and aligned.
__device__ __forceinline__ void simt_store4(const MatmulParams& p, float* crow, const float* bias, int col,
                                            float4 v) {
  v.x *= p.alpha; v.y *= p.alpha; v.z *= p.alpha; v.w *= p.alpha;
  float* dst = crow + col;
  if (col + 3 < p.n && (reinterpret_cast<unsigned long long>(dst) & 15) == 0) {
    if (p.flags & PYDNN_MATMUL_FLAG_BETA) {
      const float4 o = *reinterpret_cast<const float4*>(dst);
      v.x += p.beta * o.x; v.y += p.beta * o.y; v.z += p.beta * o.z; v.w += p.beta * o.w;
    }
    if (p.flags & PYDNN_MATMUL_FLAG_BIAS) {
      v.x += bias[col]; v.y += bias[col + 1]; v.z += bias[col + 2]; v.w += bias[col + 3];
    }
    *reinterpret_cast<float4*>(dst) = v;
    return;
  }
  const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (col + i >= p.n) break;
    float x = e[i];
    if (p.flags & PYDNN_MATMUL_FLAG_BETA) x += p.beta * dst[i];
    if (p.flags & PYDNN_MATMUL_FLAG_BIAS) x += bias[col + i];
    dst[i] = x;
  }
}


// MINB: blocks per SM the registers are capped for. BK: K elements per shared tile (8 or 16).
// Persistent: work items are (batch z, tile) pairs, item = z * tiles + tile; the grid is one wave of blocks
// (MINB per SM, fewer when there are fewer items), block b taking items b, b + gridDim.x, ... The K loop
// runs on from one item into the next: the last K tile's slot for the next tile's loads fetches the next
// item's first K tile, so only a block's first item waits for its first global loads (+1-4% on the
// Winograd shapes over one block per tile, H200: tools/bench_matmul.py).
// SUBM x SUBN: a thread's 4 x 4 sub-blocks (rows 16 apart, columns 32 apart), so a warp tile is 16 SUBM x
// 32 SUBN and a thread holds 16 SUBM SUBN accumulators; the build's tiles are 2 x 2 (8 x 8 a thread, 4 fragment
// loads for 64 FMAs a k step), the candidates 2 x 4 / 4 x 2 (8 x 16: 6 loads for 128 FMAs, 128 accumulators).
template <int BM, int BN, int BK, int WARPS_M, int WARPS_N, int MINB, bool TA, bool TB, int SUBM = 2, int SUBN = 2>
__global__ void __launch_bounds__(WARPS_M* WARPS_N * 32, MINB) gemm_simt(MatmulParams p) {
  constexpr int THREADS = WARPS_M * WARPS_N * 32;
  constexpr int TM = 4 * SUBM, TN = 4 * SUBN;  // a thread's rows and columns of C
  static_assert(BM == WARPS_M * 16 * SUBM && BN == WARPS_N * 32 * SUBN, "gemm_simt: warp tiles are 16 SUBM x 32 SUBN");
  typedef SimtSide<BM, BK, THREADS, TA> SideA;   // A's rows run along K when A is transposed
  typedef SimtSide<BN, BK, THREADS, !TB> SideB;  // B's rows run along K when B is not
  constexpr int SA = BK * SideA::LD, SB = BK * SideB::LD;
  __shared__ __align__(16) float As[2 * SA];
  __shared__ __align__(16) float Bs[2 * SB];

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int am = (warp / WARPS_N) * 16 * SUBM + (lane >> 3) * 4;  // this thread's first row within the tile
  const int bn = (warp % WARPS_N) * 32 * SUBN + (lane & 7) * 4;   // and first column
  const int ktiles = (p.k + BK - 1) / BK;
  const long long per_batch = (long long)p.tiles_m * p.tiles_n;
  const long long items = per_batch * p.batch;
  const long long step = gridDim.x;
  long long item = blockIdx.x;
  if (item >= items) return;

  SideA sa;
  SideB sb;
  int m0, n0;
  long long z;
  // Point the operand copiers at `it`'s tile (K tile 0) and remember its coordinates in (z, m0, n0).
  auto start = [&](long long it, long long& zz, int& mm0, int& nn0) {
    zz = it / per_batch;
    int tm, tn;
    tile_coords_of(p, (int)(it - zz * per_batch), tm, tn);
    mm0 = tm * BM;
    nn0 = tn * BN;
    const float* A = reinterpret_cast<const float*>(p.a) + zz * p.stride_a;
    const float* B = reinterpret_cast<const float*>(p.b) + zz * p.stride_b;
    if (TA) sa.init(A, p.lda, 0, p.k, mm0, p.m); else sa.init(A, p.lda, mm0, p.m, 0, p.k);
    if (TB) sb.init(B, p.ldb, nn0, p.n, 0, p.k); else sb.init(B, p.ldb, 0, p.k, nn0, p.n);
  };
  start(item, z, m0, n0);
  if (ktiles > 0) {
    sa.fetch(p.lda, p.k);
    sb.fetch(p.ldb, p.k);
    sa.stash(As);
    sb.stash(Bs);
  }
  __syncthreads();
  float4 fa[2][SUBM], fb[2][SUBN];  // [step parity][sub-block]: rows am + 16 s; columns bn + 32 t
  auto frags = [&](int buf, int k, int slot) {
    const float* a = As + buf * SA + k * SideA::LD + am;
    const float* b = Bs + buf * SB + k * SideB::LD + bn;
#pragma unroll
    for (int s = 0; s < SUBM; ++s) fa[slot][s] = *reinterpret_cast<const float4*>(a + 16 * s);
#pragma unroll
    for (int t = 0; t < SUBN; ++t) fb[slot][t] = *reinterpret_cast<const float4*>(b + 32 * t);
  };
  frags(0, 0, 0);
  int buf = 0;

  while (true) {
    const long long next = item + step;
    const bool has_next = next < items;
    long long z_next = 0;
    int m0_next = 0, n0_next = 0;
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;

    for (int kt = 0; kt < ktiles; ++kt) {
      // The next K tile's global loads fly during this tile's FMAs: this item's, or the next item's first.
      const bool more = kt + 1 < ktiles;
      if (more) {
        sa.fetch(p.lda, p.k - (kt + 1) * BK);
        sb.fetch(p.ldb, p.k - (kt + 1) * BK);
      } else if (has_next) {
        start(next, z_next, m0_next, n0_next);
        sa.fetch(p.lda, p.k);
        sb.fetch(p.ldb, p.k);
      }
#pragma unroll
      for (int k = 0; k < BK; ++k) {
        if (k == BK - 1) {
          // The other buffer was last read before the previous tile's barrier: refill it, then publish.
          if (more || has_next) {
            sa.stash(As + (buf ^ 1) * SA);
            sb.stash(Bs + (buf ^ 1) * SB);
          }
          __syncthreads();
          buf ^= 1;
        }
        // step k + 1's fragments (after the last step: the next tile's first; stale and unused at the end)
        frags(buf, (k + 1) % BK, (k + 1) & 1);
        float av[TM], bv[TN];
#pragma unroll
        for (int s = 0; s < SUBM; ++s) {
          av[4 * s] = fa[k & 1][s].x; av[4 * s + 1] = fa[k & 1][s].y;
          av[4 * s + 2] = fa[k & 1][s].z; av[4 * s + 3] = fa[k & 1][s].w;
        }
#pragma unroll
        for (int t = 0; t < SUBN; ++t) {
          bv[4 * t] = fb[k & 1][t].x; bv[4 * t + 1] = fb[k & 1][t].y;
          bv[4 * t + 2] = fb[k & 1][t].z; bv[4 * t + 3] = fb[k & 1][t].w;
        }
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
          for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
      }
    }

    float* C = reinterpret_cast<float*>(p.c) + z * p.stride_c;
    const float* bias = reinterpret_cast<const float*>(p.bias);
#pragma unroll
    for (int i = 0; i < TM; ++i) {
      const int row = m0 + am + (i >> 2) * 16 + (i & 3);
      if (row >= p.m) continue;
      float* crow = C + (long long)row * p.ldc;
#pragma unroll
      for (int h = 0; h < SUBN; ++h) {
        const int col = n0 + bn + h * 32;
        if (col < p.n)
          simt_store4(p, crow, bias, col,
                      make_float4(acc[i][4 * h], acc[i][4 * h + 1], acc[i][4 * h + 2], acc[i][4 * h + 3]));
      }
    }
    if (!has_next) break;
    item = next;
    if (ktiles > 0) {
      z = z_next;
      m0 = m0_next;
      n0 = n0_next;
    } else {
      start(item, z, m0, n0);  // k = 0: no K loop set the next item up
    }
  }
}

}  // namespace matmul
}  // namespace pydnn
