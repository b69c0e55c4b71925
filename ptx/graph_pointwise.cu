// Template of the graph API's fused pointwise kernels: pydnn/graph/codegen.py fills the dollar-sign fields
// (operand count, dims, the loads, the expression statements and the stores) and compiles the result with
// NVRTC at build_plans; its cubin is cached by the hash of the generated text, like any unit's.
// Each thread takes runs of ${elems} consecutive innermost elements (${elems} divides the innermost dim), a
// grid-stride loop over the runs; the run's operand offsets come from one div / mod walk (offsets<>), not
// one per element. An operand whose innermost stride is 1 is read / written as one vector of the run
// (16 bytes for 16-bit types) when p.flags bit 0 says every such operand's run starts are aligned (the
// launch checks the pointers; the strides were checked when the plan was built), element by element
// otherwise; an operand broadcast along the innermost dim is read once a run. Arithmetic in float, loads
// and stores in each tensor's type.
#include "graph_pointwise.cuh"

namespace pydnn {
namespace graph {

__global__ void __launch_bounds__(256) ${name}(const GraphPwParams p) {
  typedef ${idx} idx_t;  // int where every offset and index fits, else long long
  constexpr int E = ${elems};
  const idx_t total = (idx_t)p.total;
  const idx_t step = (idx_t)gridDim.x * blockDim.x * E;
  const bool vec = (p.flags & 1u) != 0;
  (void)vec;
  for (idx_t i = ((idx_t)blockIdx.x * blockDim.x + threadIdx.x) * E; i < total; i += step) {
    idx_t off[${nops}];
    offsets<${nops}, ${ndim}, idx_t>(p, i, off);
${loads}
#pragma unroll
    for (int e = 0; e < E; ++e) {
${body}
    }
${stores}
  }
}

}  // namespace graph
}  // namespace pydnn
