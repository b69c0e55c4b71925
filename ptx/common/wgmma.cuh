// Hopper warpgroup MMA (wgmma.mma_async, sm_90a only) building blocks: shared-memory matrix descriptors
// for 128-byte-swizzled tiles, the fences and group commits around the asynchronous MMA, and the
// m64nNk16 f16 / bf16 -> f32 instructions with both operands in shared memory. A unit whose kernels use
// this header must be compiled for sm_90a (KernelUnit.archs in pydnn/_build/manifest.py).
//
// Shared-memory layout (the one every descriptor here describes; PTX ISA "Shared Memory Matrix Layout",
// 128B swizzle). A tile is stored as "rows" of 64 16-bit elements (128 bytes) along its contiguous
// global dim; 8 consecutive rows form a 1024-byte swizzle atom in which 16-byte chunk c of row r sits
// at chunk position c ^ (r & 7). Tiles whose contiguous dim is wider than 64 are cut into slabs of 64
// columns, each slab holding all the tile's rows (slab s at s * ROWS * 128 bytes). Atoms must start at
// 1024-byte aligned shared addresses (the swizzle is computed from address bits).
//   K-major operand (K contiguous: A not transposed [M][K], B transposed [N][K]), K tile of 64: one slab;
//     a k16 step starts 32 bytes further along the row; SBO = 1024 (the next 8 M/N rows), LBO unused.
//   MN-major operand (M or N contiguous: A transposed [K][M], B not transposed [K][N]): slabs of 64 M/N
//     columns; a k16 step starts 16 rows (2048 bytes) further; SBO = 1024 (the next 8 K rows), LBO =
//     the slab stride (the next 64 M/N columns). The instruction's imm-trans flag says MN-major.
//
// Accumulator fragment of m64nNk16 (f32, N/2 registers a thread): thread t of the warpgroup (warp
// w = t / 32, lane l) holds d[4 * j + 2 * h + e] = D[16 * w + l / 4 + 8 * h][8 * j + 2 * (l % 4) + e]
// (j < N / 8; h, e in {0, 1}): per warp the layout of mma.sync m16n8's C fragment, warps stacked along M.
//
// Ordering rules: operands written to shared memory by ordinary stores or cp.async (the generic proxy)
// must be made visible to wgmma (the async proxy) with fence_proxy_async() by the writing threads before
// the barrier that publishes them; fence() before the first wgmma of a batch and after any register
// write to the accumulators; commit() closes a group; wait<N>() returns when at most N groups of this
// warpgroup are pending (a stage may be overwritten only after every warpgroup reading it waited).
#ifndef PYDNN_COMMON_WGMMA_CUH
#define PYDNN_COMMON_WGMMA_CUH

#include "types.cuh"

namespace pydnn {
namespace wgmma {

// Element offset of 16-byte chunk `ch` (of 8 elements, along the contiguous dim) of row `r` in a
// 128B-swizzled tile of ROWS rows (layout above; ch >= 8 goes to the next 64-column slab).
template <int ROWS> __device__ __forceinline__ int sw128(int r, int ch) {
  return (ch >> 3) * (ROWS * 64) + r * 64 + (((ch & 7) ^ (r & 7)) << 3);
}

// Descriptor of a 128B-swizzled operand starting at shared address `addr` (bytes; atoms 1024-aligned
// but for a K-major k16 step's 32-byte offsets within the atom), with the byte offsets lbo / sbo.
__device__ __forceinline__ unsigned long long desc_sw128(unsigned addr, unsigned lbo, unsigned sbo) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)((lbo >> 4) & 0x3FFF) << 16) |
         ((unsigned long long)((sbo >> 4) & 0x3FFF) << 32) | (1ull << 62);
}

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Generic-proxy writes to shared memory (st.shared, cp.async) made visible to the async proxy.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Keeps the compiler from moving accumulator reads or writes across a wait (the registers are written
// asynchronously by the MMA unit between the instruction and the wait).
template <int R> __device__ __forceinline__ void fence_operands(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The accumulator operands of m64nNk16 (N / 2 f32 registers a thread): the register list text (%0 ...)
// and the asm output operands ("+f"(d[i])), each size the previous one's plus the new registers, shared
// by the two forms below.
#define PYDNN_WGMMA_DREGS_32 \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define PYDNN_WGMMA_DREGS_64 \
  PYDNN_WGMMA_DREGS_32 ", " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define PYDNN_WGMMA_DREGS_128 \
  PYDNN_WGMMA_DREGS_64 ", " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define PYDNN_WGMMA_DOUTS_32 \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define PYDNN_WGMMA_DOUTS_64 \
  PYDNN_WGMMA_DOUTS_32, \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define PYDNN_WGMMA_DOUTS_128 \
  PYDNN_WGMMA_DOUTS_64, \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
  "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

// D (64 x N, f32, fragment above) = A (64 x 16) B (16 x N) + (scale_d ? D : 0), A and B from shared memory
// through descriptors; TA / TB: 1 = the operand is MN-major (transposed), 0 = K-major.
template <class T, int N, int TA, int TB> struct Mma;

// D (64 x N, f32) = A (64 x 16, in registers) B (16 x N, shared memory through a descriptor) + (scale_d ? D : 0):
// the register-A form (A is f16 / bf16 packed in pairs, four 32-bit registers a thread). Thread t of the
// warpgroup (warp w, lane l) holds a[2 * c + h] = (A[16 * w + l / 4 + 8 * h][8 * c + 2 * (l % 4) + e], e = 0, 1)
// (c, h in {0, 1}): per warp mma.sync m16n8k16's A fragment, warps stacked along M. An accumulator of an
// earlier wgmma is therefore an A operand as it stands: k16 step s of D's columns is
// a = {pack(d[8s], d[8s+1]), pack(d[8s+2], d[8s+3]), pack(d[8s+4], d[8s+5]), pack(d[8s+6], d[8s+7])}
// (how attention feeds P to P V). TB: 1 = B is MN-major (transposed), 0 = K-major.
template <class T, int N, int TB> struct MmaRS;

// Both forms of m64nNk16 for one element type (CT the C++ type, PT its PTX name) and one N (R = N / 2
// accumulator registers; A0 .. A3 the operand numbers after them, as text: the asm numbers its operands in
// order, outputs first).
#define PYDNN_WGMMA_STRUCTS(CT, PT, N, R, A0, A1, A2, A3, A4, A5, A6) \
template <int TA, int TB> struct Mma<CT, N, TA, TB> { \
  static __device__ __forceinline__ void run(float (&d)[R], unsigned long long da, unsigned long long db, int scale_d) { \
    asm volatile( \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %" A2 ", 0;\n" \
        "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PT "." PT " " \
        "{" PYDNN_WGMMA_DREGS_##R "}, %" A0 ", %" A1 ", p, 1, 1, %" A3 ", %" A4 ";\n}\n" \
        : PYDNN_WGMMA_DOUTS_##R \
        : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB)); \
  } \
}; \
template <int TB> struct MmaRS<CT, N, TB> { \
  static __device__ __forceinline__ void run(float (&d)[R], const unsigned (&a)[4], unsigned long long db, int scale_d) { \
    asm volatile( \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %" A5 ", 0;\n" \
        "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PT "." PT " " \
        "{" PYDNN_WGMMA_DREGS_##R "}, {%" A0 ", %" A1 ", %" A2 ", %" A3 "}, %" A4 ", p, 1, 1, %" A6 ";\n}\n" \
        : PYDNN_WGMMA_DOUTS_##R \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d), "n"(TB)); \
  } \
};
#define PYDNN_WGMMA_TYPE(CT, PT) \
  PYDNN_WGMMA_STRUCTS(CT, PT, 64, 32, "32", "33", "34", "35", "36", "37", "38") \
  PYDNN_WGMMA_STRUCTS(CT, PT, 128, 64, "64", "65", "66", "67", "68", "69", "70") \
  PYDNN_WGMMA_STRUCTS(CT, PT, 256, 128, "128", "129", "130", "131", "132", "133", "134")
PYDNN_WGMMA_TYPE(half_t, "f16")
PYDNN_WGMMA_TYPE(bf16_t, "bf16")
#undef PYDNN_WGMMA_TYPE
#undef PYDNN_WGMMA_STRUCTS
}  // namespace wgmma
}  // namespace pydnn

#endif
