// Philox-4x32-10: a counter-based random number generator (Salmon, Moraes, Dror, Shaw: "Parallel random
// numbers: as easy as 1, 2, 3", SC'11; the same bijection as Random123's philox4x32_10 and curand's
// Philox4_32_10). Written from the published algorithm; checked against Random123's known-answer vectors
// (tests/test_dropout_cpu.py checks the numpy twin in pydnn/reference/dropout.py, the GPU tests check this
// file against that twin bit for bit).
//
// Interface (namespace pydnn::philox), all __device__ and header-only:
//
//   Ctr philox4x32_10(Ctr c, unsigned k0, unsigned k1)
//       The raw bijection: 128-bit counter c = (x, y, z, w), 64-bit key (k0, k1) -> 4 x 32 random bits.
//
//   Ctr stream_block(u64 seed, u64 offset, u64 block)
//       pydnn's stream convention: key = (seed lo, seed hi), counter = (block lo, block hi, offset lo,
//       offset hi). A (seed, offset) pair names a stream of 2^64 blocks of 128 bits; block b is a pure
//       function of (seed, offset, b): no state, no dependence on which thread or launch computes it.
//
//   unsigned keep_bits8(Ctr r, unsigned threshold)
//       Dropout's use of one block: 8 elements per block, 16 bits each. Element j (0..7) of block b is
//       element 8*b + j of the stream; its 16-bit slice is word j/2 of r (low half for even j, high half
//       for odd j); bit j of the result is set (keep) iff slice >= threshold. With threshold =
//       round(p * 65536) (0..65536), an element is dropped with probability threshold / 65536: p to a
//       resolution of 2^-16 (|error| <= 2^-17); threshold 0 keeps all, 65536 drops all.
//
//   unsigned dropout_keep_bits8(u64 seed, u64 offset, u64 block, unsigned threshold)
//       keep_bits8(stream_block(seed, offset, block), threshold), with the Philox call skipped when the
//       threshold makes the answer certain (0: all kept, >= 65536: all dropped).
//
// For a fused user (e.g. dropout on attention probabilities): give each use a distinct offset (pydnn's
// dropout states advance the offset by 1 per forward call), number the elements in a fixed logical order
// (i = row-major index), and take bit (i & 7) of dropout_keep_bits8(seed, offset, i >> 3, threshold). The
// mask then depends only on (seed, offset, i), never on the launch shape, and
// pydnn/reference/dropout.py reproduces it on the host.
//
// Cost: 10 rounds of two 32x32->64 multiplies and two 3-input XORs, plus the key schedule (~70 integer
// instructions per block of 8 elements).
#pragma once

namespace pydnn {
namespace philox {

typedef unsigned long long u64;

struct Ctr {
  unsigned x, y, z, w;
};

constexpr unsigned kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // round multipliers
constexpr unsigned kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // key schedule (Weyl) increments

__device__ __forceinline__ Ctr round1(Ctr c, unsigned k0, unsigned k1) {
  const unsigned hi0 = __umulhi(kM0, c.x), lo0 = kM0 * c.x;
  const unsigned hi1 = __umulhi(kM1, c.z), lo1 = kM1 * c.z;
  Ctr r;
  r.x = hi1 ^ c.y ^ k0;
  r.y = lo1;
  r.z = hi0 ^ c.w ^ k1;
  r.w = lo0;
  return r;
}

__device__ __forceinline__ Ctr philox4x32_10(Ctr c, unsigned k0, unsigned k1) {
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    if (r) {  // the key is bumped before rounds 2..10
      k0 += kW0;
      k1 += kW1;
    }
    c = round1(c, k0, k1);
  }
  return c;
}

__device__ __forceinline__ Ctr stream_block(u64 seed, u64 offset, u64 block) {
  Ctr c;
  c.x = (unsigned)block;
  c.y = (unsigned)(block >> 32);
  c.z = (unsigned)offset;
  c.w = (unsigned)(offset >> 32);
  return philox4x32_10(c, (unsigned)seed, (unsigned)(seed >> 32));
}

__device__ __forceinline__ unsigned keep_bits8(Ctr r, unsigned threshold) {
  const unsigned w[4] = {r.x, r.y, r.z, r.w};
  unsigned bits = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    bits |= (unsigned)((w[k] & 0xFFFFu) >= threshold) << (2 * k);
    bits |= (unsigned)((w[k] >> 16) >= threshold) << (2 * k + 1);
  }
  return bits;
}

__device__ __forceinline__ unsigned dropout_keep_bits8(u64 seed, u64 offset, u64 block, unsigned threshold) {
  if (threshold == 0u) return 0xFFu;
  if (threshold >= 65536u) return 0u;
  return keep_bits8(stream_block(seed, offset, block), threshold);
}

}  // namespace philox
}  // namespace pydnn
