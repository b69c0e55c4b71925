// Tensor-core and async-copy wrappers for the attention kernels (ptx/attention.cu): mma.sync m16n8k16
// with fp32 accumulators, ldmatrix (plain and transposed), cp.async with zero fill, 16-bit pair packing,
// the fast exp2. sm_80 and later. Owned by the attention family (convolution has its own mma.cuh).
//
// Fragment layouts of mma.m16n8k16 (g = lane / 4, q = lane % 4), which the kernels rely on:
//   A 16x16 (row major): a[0] = (g, 2q..2q+1), a[1] = (g+8, 2q..), a[2] = (g, 2q+8..), a[3] = (g+8, 2q+8..)
//   B 16x8 (k x n):      b[0] = (k 2q..2q+1, n g), b[1] = (k 2q+8.., n g)
//   C 16x8 (fp32):       c[0..1] = (g, 2q..2q+1), c[2..3] = (g+8, 2q..2q+1)
// so the C fragments of two neighbouring n8 tiles are, packed to 16 bits, the A fragment of one k16 step:
// that is how P = softmax(S) feeds P.V without leaving registers.
#pragma once

#include "types.cuh"

namespace pydnn {
namespace attn {

// 32-bit shared-state-space address of a generic pointer into shared memory.
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  unsigned r;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
  return r;
}

// 16 bytes global -> shared, bypassing L1; when !valid nothing is read and the 16 bytes are zeroed
// (rows past a sequence's length: their garbage, even NaN, must not reach P.V as 0 * NaN).
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
// 4 bytes global -> shared through L1 (scalars such as a row's lse); zero-filled when !valid.
__device__ __forceinline__ void cp_async4(unsigned dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// c += a * b on one m16n8k16 tile; T (bf16_t or half_t) names the 16-bit input type.
template <class T> __device__ __forceinline__ void mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                                            unsigned b1);
template <> __device__ __forceinline__ void mma16816<bf16_t>(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                                             unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
               "{%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void mma16816<half_t>(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                                             unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
               "{%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// p[0] += a, p[1] += b in global memory, no result (p 8-byte aligned): one vector reduction on sm_90.
// (Spelled without .noftz: the CUDA 13.0 assembler refuses that modifier on f32, 13.5 accepts it.)
__device__ __forceinline__ void red_add2(float* p, float a, float b) {
#if __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
#endif
}

// 2^x on the MUFU unit (ex2.approx: about 2 ulp; -inf -> 0).
__device__ __forceinline__ float exp2_fast(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

}  // namespace attn
}  // namespace pydnn
