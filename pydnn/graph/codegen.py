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
    return f"in{i}" if kind == "op" else f"v{i}"


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


def source(prog, ndim):
    """(kernel name, CUDA C text) of the program over `ndim` collapsed dims."""
    ops = prog.operands
    if not 1 <= len(ops) <= MAX_OPERANDS:
        raise ValueError(f"{len(ops)} operands (1 to {MAX_OPERANDS})")
    loads = "\n".join(f"    const float in{k} = load<float>(static_cast<const {CTYPE[tag]}*>(p.ptr[{k}])[off[{k}]]);"
                      for k, (tag, role) in enumerate(ops) if role == "in")
    body = "\n".join(f"    const float {name} = {expr};" for name, expr in expressions(prog))
    stores = "\n".join(f"    static_cast<{CTYPE[ops[k][0]]}*>(p.ptr[{k}])[off[{k}]] = store<{CTYPE[ops[k][0]]}>(v{j});"
                       for j, k in prog.stores)
    fields = dict(nops=len(ops), ndim=max(ndim, 1), loads=loads, body=body, stores=stores)
    digest = hashlib.sha256(repr((fields, prog.key())).encode()).hexdigest()[:16]
    fields["name"] = f"pw_{digest}"
    template = (cache.ptx_dir() / "graph_pointwise.cu").read_text()
    return fields["name"], string.Template(template).substitute(fields)


def kernel_unit(prog, ndim):
    """(KernelUnit, name expression) of the program, registered with the loader and the cache (nothing is
    compiled here: loader.load_unit / handle.function compile on a cache miss)."""
    name, text = source(prog, ndim)
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
