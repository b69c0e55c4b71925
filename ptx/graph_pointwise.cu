// Template of the graph API's fused pointwise kernels: pydnn/graph/codegen.py fills the dollar-sign fields
// (operand count, dims, the loads, the expression statements and the stores) and compiles the result with
// NVRTC at build_plans; its cubin is cached by the hash of the generated text, like any unit's.
// Each thread takes runs of ${elems} consecutive innermost elements (${elems} divides the innermost dim), a
// grid-stride loop over the runs; the run's operand offsets come from one div / mod walk (offsets<>), not
// one per element. With R = ${runs} > 1 runs a thread per iteration (the generator makes sure 32 * E * R
// divides the innermost dim), run r of a lane is r * 32 * E elements after its first, so the warp's R loads
// of an operand are R coalesced spans of one row, all issued before the arithmetic (R vectors in flight a
// thread) and the offsets walk is shared by the R runs. An operand whose innermost stride is 1 is read /
// written as one vector of the run (16 bytes for 16-bit types) when p.flags bit 0 says every such operand's
// run starts are aligned (the launch checks the pointers; the strides were checked when the plan was
// built), element by element otherwise; an operand broadcast along the innermost dim is read once an
// iteration. Arithmetic in float, loads and stores in each tensor's type.
// VEC: 1 / 0 the vector / element-by-element form, compiled as separate loops (the kernel picks one by
// p.flags once); 2 tests p.flags inside the one loop (the generator's form before the split: the compiler
// predicates both forms' loads into the loop body, ~30 issue slots an 8-element run of the 8-op chain).
// The prefetch field (tuning.graph.PW_PREFETCH; empty otherwise): the vector form as a software pipeline, the next
// iteration's offsets and loads issued before this iteration's arithmetic (a warp has loads in flight
// while it computes), its runs held as loaded (Raw / Raw16) until used.
#include "graph_pointwise.cuh"

namespace pydnn {
namespace graph {

template <int VEC>
__device__ __forceinline__ void ${name}_loop(const GraphPwParams& p) {
  typedef ${idx} idx_t;  // int where every offset and index fits, else long long
  constexpr int E = ${elems};
  constexpr int R = ${runs};
  const idx_t total = (idx_t)p.total;
  const idx_t step = (idx_t)gridDim.x * blockDim.x * (E * R);
  const bool vec = VEC == 2 ? (p.flags & 1u) != 0 : VEC == 1;
  (void)vec;
  const idx_t lane = (idx_t)(threadIdx.x & 31u);
${prefetch}
  for (idx_t i = ((idx_t)blockIdx.x * blockDim.x + ((idx_t)threadIdx.x - lane)) * (E * R) + lane * E; i < total;
       i += step) {
    idx_t off[${nops}];
    offsets<${nops}, ${ndim}, idx_t>(p, i, off);
${loads}
#pragma unroll
    for (int e = 0; e < E * R; ++e) {
${body}
    }
${stores}
  }
}

__global__ void __launch_bounds__(256${min_blocks}) ${name}(const GraphPwParams p) {
${dispatch}
}

}  // namespace graph
}  // namespace pydnn
