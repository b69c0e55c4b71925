"""Code generation of the graph API's fused pointwise kernels: a DAG of pointwise nodes over up to
PYDNN_GRAPH_MAX_OPERANDS tensors (inputs and outputs, broadcast to one output shape) becomes ONE CUDA C
kernel, ptx/graph_pointwise.cu with its fields filled, compiled by NVRTC and cached by the hash of the
generated text in the same cubin cache as the install-time units (pydnn/_build/cache.py).

    prog = PwProgram(operands=[("f16", "in"), ("f16", "in"), ("f16", "out")],
                     nodes=[PwNode(mode, params, alpha1, alpha2, x=("op", 0), b=("op", 1), t=None)],
                     stores=[(0, 2)])           # value of node 0 -> operand 2
    unit, expr = kernel_unit(prog, ndim)        # KernelUnit registered with the loader and the cache
"""
import ctypes
import hashlib
import string

from .._build import cache, loader
from .._build.manifest import KernelUnit
from .._build.params import kernel_params
from . import pointwise_ops as pw

MAX_OPERANDS, MAX_DIMS = 16, 8  # PYDNN_GRAPH_MAX_OPERANDS / _DIMS in ptx/graph_params.h
CTYPE = {"f32": "float", "f16": "half_t", "bf16": "bf16_t"}
THREADS = 256


@kernel_params("graph_params.h", "GraphPwParams")
class GraphPwParams(ctypes.Structure):
    _fields_ = [
        ("ptr", ctypes.c_void_p * MAX_OPERANDS),
        ("stride", (ctypes.c_longlong * MAX_DIMS) * MAX_OPERANDS),
        ("dims", ctypes.c_longlong * MAX_DIMS),
        ("total", ctypes.c_longlong),
        ("ndim", ctypes.c_int),
        ("pad_", ctypes.c_int),
    ]


class PwNode:
    """One pointwise node: mode (PYDNN_POINTWISE_*), its parameters (pointwise_ops.DEFAULT_PARAMS keys),
    alpha1 / alpha2 (scales of x and b), and operand references ("op", k) or ("v", j) (node j's value)."""

    __slots__ = ("mode", "params", "alpha1", "alpha2", "x", "b", "t")

    def __init__(self, mode, params=None, alpha1=1.0, alpha2=1.0, x=None, b=None, t=None):
        self.mode, self.params = mode, dict(params or {})
        self.alpha1, self.alpha2, self.x, self.b, self.t = float(alpha1), float(alpha2), x, b, t

    def key(self):
        return (self.mode, tuple(sorted(self.params.items())), self.alpha1, self.alpha2, self.x, self.b, self.t)


class PwProgram:
    __slots__ = ("operands", "nodes", "stores")

    def __init__(self, operands, nodes, stores):
        self.operands, self.nodes, self.stores = list(operands), list(nodes), list(stores)

    def key(self):
        return (tuple(self.operands), tuple(n.key() for n in self.nodes), tuple(self.stores))


def _ref(r):
    kind, i = r
    return {"op": f"in{i}", "v": f"v{i}", "acc": "acc_in"}[kind]


def expressions(prog):
    """The statements of the kernel body: [(value name, expression)], one per node."""
    out = []
    for j, n in enumerate(prog.nodes):
        x = _ref(n.x)
        if n.alpha1 != 1.0:
            x = f"{pw.literal(n.alpha1)} * {x}"
        b = t = None
        if n.b is not None:
            b = _ref(n.b)
            if n.alpha2 != 1.0:
                b = f"{pw.literal(n.alpha2)} * {b}"
        if n.t is not None:
            t = _ref(n.t)
        out.append((f"v{j}", pw.expression(n.mode, n.params, x, b, t)))
    return out


def source(prog, ndim, elems=1, wide=True):
    """(kernel name, CUDA C text) of the program over `ndim` collapsed dims, `elems` consecutive innermost
    elements a thread (elems divides the innermost dim), 64-bit (wide) or 32-bit index math."""
    ops = prog.operands
    if not 1 <= len(ops) <= MAX_OPERANDS:
        raise ValueError(f"{len(ops)} operands (1 to {MAX_OPERANDS})")
    last = max(ndim, 1) - 1

    def at(k):
        return f"off[{k}]" if elems == 1 else f"off[{k}] + e * (idx_t)p.stride[{k}][{last}]"

    loads = "\n".join(f"      const float in{k} = load<float>(static_cast<const {CTYPE[tag]}*>(p.ptr[{k}])[{at(k)}]);"
                      for k, (tag, role) in enumerate(ops) if role == "in")
    body = "\n".join(f"      const float {name} = {expr};" for name, expr in expressions(prog))
    stores = "\n".join(f"      static_cast<{CTYPE[ops[k][0]]}*>(p.ptr[{k}])[{at(k)}] = store<{CTYPE[ops[k][0]]}>(v{j});"
                       for j, k in prog.stores)
    fields = dict(nops=len(ops), ndim=max(ndim, 1), loads=loads, body=body, stores=stores, elems=elems,
                  idx="long long" if wide else "int")
    digest = hashlib.sha256(repr((fields, prog.key())).encode()).hexdigest()[:16]
    fields["name"] = f"pw_{digest}"
    template = (cache.ptx_dir() / "graph_pointwise.cu").read_text()
    return fields["name"], string.Template(template).substitute(fields)


def kernel_unit(prog, ndim, elems=1, wide=True):
    """(KernelUnit, name expression) of the program, registered with the loader and the cache (nothing is
    compiled here: loader.load_unit / handle.function compile on a cache miss)."""
    name, text = source(prog, ndim, elems, wide)
    src = f"graph/{name}.cu"
    cache.register_generated(src, text)
    expr = f"pydnn::graph::{name}"
    unit = KernelUnit(f"graph.{name}", src, (expr,))
    loader.register_units([unit])
    return unit, expr


def collapse(dims, strides_list):
    """Merge dims that every operand walks contiguously (and drop size-1 dims): (dims, [strides...])."""
    keep = [d for d in range(len(dims)) if dims[d] != 1]
    nd = [dims[d] for d in keep] or [1]
    ns = [[s[d] for d in keep] or [0] for s in strides_list]
    i = len(nd) - 1
    while i > 0:
        if all(s[i - 1] == s[i] * nd[i] for s in ns):
            nd[i - 1] *= nd[i]
            del nd[i]
            for s in ns:
                s[i - 1] = s[i]
                del s[i]
        i -= 1
    return nd, ns


def params(dims, strides_list, ptrs):
    p = GraphPwParams()
    for k, (s, ptr) in enumerate(zip(strides_list, ptrs)):
        p.ptr[k] = ptr
        for d, v in enumerate(s):
            p.stride[k][d] = v
    total = 1
    for d, v in enumerate(dims):
        p.dims[d] = v
        total *= v
    p.total, p.ndim = total, len(dims)
    return p


def launch_shape(dims, strides_list, sm_count):
    """(elems a thread, wide index math?, grid) for a pointwise kernel over collapsed dims: 4 (or 2)
    consecutive innermost elements a thread where they divide the innermost dim; 32-bit index math where
    every index the loop reaches and every operand offset fits in an int."""
    inner = dims[-1]
    elems = 4 if inner % 4 == 0 else 2 if inner % 2 == 0 else 1
    total = 1
    for d in dims:
        total *= d
    blocks = max(1, min((total // elems + THREADS - 1) // THREADS, max(sm_count, 1) * 16))
    reach = total + blocks * THREADS * elems
    span = max(sum((d - 1) * s for d, s in zip(dims, st)) for st in strides_list) + elems
    wide = reach >= 2**31 or span >= 2**31
    return elems, wide, (blocks, 1, 1)


def thread_offsets(dims, strides_list, elems):
    """numpy emulation of the kernel's loop: offsets of the first element of each thread's run (computed by
    offsets<>) plus e times the innermost stride, for every linear index, in order."""
    import numpy as np

    base = offsets(dims, strides_list)[:, ::elems]
    inner = np.array([s[-1] for s in strides_list], np.int64)[:, None, None]
    e = np.arange(elems, dtype=np.int64)[None, None, :]
    return (base[:, :, None] + e * inner).reshape(len(strides_list), -1)


def offsets(dims, strides_list):
    """numpy emulation of the kernel's offsets<NOPS, NDIM>: the element offset of every operand for every
    linear output index (tests check it against numpy's broadcasting)."""
    import numpy as np

    total = int(np.prod(dims))
    i = np.arange(total, dtype=np.int64)
    off = np.zeros((len(strides_list), total), np.int64)
    for d in range(len(dims) - 1, -1, -1):
        c = i
        if d > 0:
            c = i % dims[d]
            i = i // dims[d]
        for k, s in enumerate(strides_list):
            off[k] += c * s[d]
    return off


# ----------------------------------------------------------------------------- matmul + epilogue

def _tile_body(tile, tag, ta, tb, vec):
    """(body call, threads, min blocks) of a matmul tile (pydnn.ops.matmul's TcTile / WgTile)."""
    b = lambda v: "true" if v else "false"  # noqa: E731
    t = f"pydnn::{CTYPE[tag]}"
    if hasattr(tile, "wm"):  # TcTile
        pipe = tile.pipe if vec else 1
        return (f"pydnn::matmul::gemm_tc_body<{t}, {tile.bm}, {tile.bn}, {tile.wm}, {tile.wn}, {tile.stages}, "
                f"{pipe}, {b(ta)}, {b(tb)}, {b(vec)}>", tile.threads, tile.per_sm)
    return (f"pydnn::matmul::gemm_wgmma_body<{t}, {tile.bn}, {tile.stages}, {b(ta)}, {b(tb)}>", 256, tile.per_sm)


def matmul_source(prog, final, tag, fast, general, ta, tb):
    """(name, CUDA C) of a GEMM whose epilogue is the pointwise program `prog`: operand refs ("acc", 0) are
    the GEMM's value at (z, row, col), ("op", k) the epilogue operand k of GraphPwParams e (read at
    z * stride[k][0] + row * stride[k][1] + col * stride[k][2]); prog.stores write further outputs there;
    the value `final` (a ref: ("v", j) or ("acc", 0)) goes to C through the GEMM's own store; a store
    (j, k) with j == -1 writes the accumulator itself.
    Two kernels: <name>_f (the fast tile) and <name>_g (the general, unaligned path)."""
    ops = prog.operands
    lines = ["    const float acc_in = acc;"]
    for k, (otag, role) in enumerate(ops):
        if role == "in":
            lines.append(f"    const float in{k} = load<float>(static_cast<const {CTYPE[otag]}*>(e.ptr[{k}])"
                         f"[z * e.stride[{k}][0] + row * e.stride[{k}][1] + col * e.stride[{k}][2]]);")
    for name, expr in expressions(prog):
        lines.append(f"    const float {name} = {expr};")
    for j, k in prog.stores:
        val = "acc_in" if j == -1 else f"v{j}"
        ct = CTYPE[ops[k][0]]
        lines.append(f"    static_cast<{ct}*>(e.ptr[{k}])[z * e.stride[{k}][0] + row * e.stride[{k}][1] + "
                     f"col * e.stride[{k}][2]] = store<{ct}>({val});")
    lines.append(f"    acc = {_ref(final)};")
    body = "\n".join(lines)
    fb, ft, fm = _tile_body(fast, tag, ta, tb, True)
    gb, gt, gm = _tile_body(general, tag, ta, tb, False)
    digest = hashlib.sha256(repr((body, fb, gb, prog.key(), final)).encode()).hexdigest()[:16]
    name = f"mm_{digest}"
    text = f"""// Generated by pydnn/graph/codegen.py: a GEMM (ptx/matmul.cu) with a fused pointwise epilogue.
#include "matmul.cu"
#include "graph_pointwise.cuh"

namespace pydnn {{
namespace graph {{

struct Epi_{name} {{
  const GraphPwParams& e;
  __device__ __forceinline__ void operator()(float& acc, long long z, int row, int col) const {{
{body}
  }}
}};

__global__ void __launch_bounds__({ft}, {fm}) {name}_f(const MatmulParams p, const GraphPwParams e) {{
  {fb}(p, Epi_{name}{{e}});
}}

__global__ void __launch_bounds__({gt}, {gm}) {name}_g(const MatmulParams p, const GraphPwParams e) {{
  {gb}(p, Epi_{name}{{e}});
}}

}}  // namespace graph
}}  // namespace pydnn
"""
    return name, text


def matmul_unit(prog, final, tag, fast, general, ta, tb):
    """(KernelUnit, fast expr, general expr), registered like kernel_unit's; a wgmma fast tile makes the
    unit sm_90a only (as pydnn.ops.matmul's wgmma units)."""
    name, text = matmul_source(prog, final, tag, fast, general, ta, tb)
    src = f"graph/{name}.cu"
    cache.register_generated(src, text)
    fe, ge = f"pydnn::graph::{name}_f", f"pydnn::graph::{name}_g"
    archs = () if hasattr(fast, "wm") else ("sm_90a",)
    unit = KernelUnit(f"graph.{name}", src, (fe, ge), archs=archs)
    loader.register_units([unit])
    return unit, fe, ge
