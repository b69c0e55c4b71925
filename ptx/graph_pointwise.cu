// Template of the graph API's fused pointwise kernels: pydnn/graph/codegen.py fills the dollar-sign fields
// (operand count, dims, the loads, the expression statements and the stores) and compiles the result with
// NVRTC at build_plans; its cubin is cached by the hash of the generated text, like any unit's.
// One thread an element, a grid-stride loop; arithmetic in float, loads and stores in each tensor's type.
#include "graph_pointwise.cuh"

namespace pydnn {
namespace graph {

__global__ void __launch_bounds__(256) ${name}(const GraphPwParams p) {
  const long long step = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < p.total; i += step) {
    long long off[${nops}];
    offsets<${nops}, ${ndim}>(p, i, off);
${loads}
${body}
${stores}
  }
}

}  // namespace graph
}  // namespace pydnn
