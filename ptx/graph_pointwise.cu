// Template of the graph API's fused pointwise kernels: pydnn/graph/codegen.py fills the dollar-sign fields
// (operand count, dims, the loads, the expression statements and the stores) and compiles the result with
// NVRTC at build_plans; its cubin is cached by the hash of the generated text, like any unit's.
// One thread an element, a grid-stride loop; arithmetic in float, loads and stores in each tensor's type.
#include "graph_pointwise.cuh"

namespace pydnn {
namespace graph {

__global__ void __launch_bounds__(256) ${name}(const GraphPwParams p) {
  typedef ${idx} idx_t;  // int where every offset and index fits, else long long
  const idx_t total = (idx_t)p.total;
  const idx_t step = (idx_t)gridDim.x * blockDim.x * ${elems};
  // each thread takes ${elems} consecutive elements of the innermost dim (which ${elems} divides)
  for (idx_t i = ((idx_t)blockIdx.x * blockDim.x + threadIdx.x) * ${elems}; i < total; i += step) {
    idx_t off[${nops}];
    offsets<${nops}, ${ndim}, idx_t>(p, i, off);
#pragma unroll
    for (int e = 0; e < ${elems}; ++e) {
${loads}
${body}
${stores}
    }
  }
}

}  // namespace graph
}  // namespace pydnn
