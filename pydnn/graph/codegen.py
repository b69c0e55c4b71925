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
from .. import tuning
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
        ("flags", ctypes.c_uint),
        ("magic", ctypes.c_uint * MAX_DIMS),
        ("shift", ctypes.c_int * MAX_DIMS),
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


TANH_NONNEG_MAX = 9.0  # tanh_nonneg (ptx/graph_pointwise.cuh) is tanhf's result on [-0, 9]


def _nonneg_bounded(prog, ref, limit):
    """Whether value `ref` is proven to lie in [0, limit] or be NaN: a RELU_FWD node with slope 0, lower clip
    >= 0 and upper clip <= limit (x < lower gives lower + 0 * (x - lower): NaN only for x = -inf)."""
    import math

    if ref is None or ref[0] != "v":
        return False
    n = prog.nodes[ref[1]]
    if pw.BY_VALUE.get(n.mode) != "RELU_FWD":
        return False
    p = dict(pw.DEFAULT_PARAMS)
    p.update({k: v for k, v in n.params.items() if v is not None})
    return p["slope"] == 0.0 and p["lower"] >= 0.0 and math.isfinite(p["upper"]) and p["upper"] <= limit


def out_tags(prog, final_tag=None):
    """The data types the kernel writes: its output operands' and (final_tag) the type of the value a fused
    matmul / normalization kernel stores through its own store, outside prog.operands."""
    return [tag for tag, role in prog.operands if role != "in"] + ([final_tag] if final_tag else [])


def expressions(prog, final_tag=None, gemm=False):
    """The statements of the kernel body: [(value name, expression)], one per node. TANH_FWD of a value
    _nonneg_bounded proves in [0, 9] is written with tanh_nonneg (tanhf's bits there, 3 instructions less).
    Where every output of the kernel is 16-bit (out_tags; final_tag: the type of a fused kernel's own store),
    the 16-bit forms of pydnn.tuning.graph: GELU_FWD as gelu_fast (PW_GELU_FAST, the activation family's
    16-bit GELU; gelu_fast5, its degree-5 polynomial, with PW_GELU_DEG5 where every output is bfloat16),
    and, every output bfloat16, TANH_FWD as tanh_fast (PW_TANH_FAST, tanh.approx.f32). gemm: a fused matmul's
    epilogue, where GELU_FWD with bfloat16 outputs is gelu_ex2 (one MUFU) under tuning.graph.EPI_GELU_EX2."""
    tags = out_tags(prog, final_tag)
    out16 = bool(tags) and all(tag in ("f16", "bf16") for tag in tags)
    bf16 = bool(tags) and all(tag == "bf16" for tag in tags)
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
        e = pw.expression(n.mode, n.params, x, b, t)
        if pw.BY_VALUE.get(n.mode) == "TANH_FWD" and tuning.graph.PW_TANH_FAST and bf16:
            e = e.replace("tanhf(", "tanh_fast(", 1)
        elif (pw.BY_VALUE.get(n.mode) == "TANH_FWD" and n.alpha1 == 1.0 and tuning.graph.PW_RANGE
                and _nonneg_bounded(prog, n.x, TANH_NONNEG_MAX)):
            e = e.replace("tanhf(", "tanh_nonneg(", 1)
        if pw.BY_VALUE.get(n.mode) == "GELU_FWD" and tuning.graph.PW_GELU_FAST and out16:
            e = f"gelu_fast5({x})" if tuning.graph.PW_GELU_DEG5 and bf16 else f"gelu_fast({x})"
            if gemm and bf16 and tuning.graph.EPI_GELU_EX2:
                e = f"gelu_ex2({x})"
        out.append((f"v{j}", e))
    return out


def _run(tag, elems):
    """The vector helper (ptx/graph_pointwise.cuh) of a run of `elems` elements of type `tag`."""
    return f"Run16<{CTYPE[tag]}, E>" if tag != "f32" and elems % 2 == 0 else f"Run<{CTYPE[tag]}, E>"


def _prefetch_block(prog, access, elems, span, last, decls, body, stores, ndim):
    """The vector form as a software pipeline (source's prefetch): offsets and loads of iteration i + step
    issued before iteration i's arithmetic, contiguous runs held as loaded (Raw / Raw16) until widened
    for the body; the body and stores are the plain loop's (VEC == 1: its vector branches)."""
    ops = prog.operands
    nops = len(ops)

    def loads(sfx, off):
        out = []
        for k, (tag, role) in enumerate(ops):
            if role != "in":
                continue
            ptr = f"static_cast<const {CTYPE[tag]}*>(p.ptr[{k}])"
            if access[k] == "b":
                out.append(f"        b{k}{sfx} = load<float>({ptr}[{off}[{k}]]);")
            elif access[k] == "c":
                out.append(f"#pragma unroll\n        for (int r = 0; r < R; ++r) w{k}{sfx}[r].load({ptr} + {off}[{k}] + r * {span});")
            else:
                out.append(f"#pragma unroll\n        for (int r = 0; r < R; ++r)\n#pragma unroll\n          for (int j = 0; j < E; ++j) "
                           f"g{k}{sfx}[r * E + j] = load<float>({ptr}[{off}[{k}] + (idx_t)(r * {span} + j) * "
                           f"(idx_t)p.stride[{k}][{last}]]);")
        return "\n".join(out)

    def declare(sfx, ind):
        out = [f"{ind}idx_t off{sfx}[{nops}];"]
        for k, (tag, role) in enumerate(ops):
            if role != "in":
                continue
            if access[k] == "b":
                out.append(f"{ind}float b{k}{sfx};")
            elif access[k] == "c":
                raw = "Raw16" if tag != "f32" and elems % 2 == 0 else "Raw"
                out.append(f"{ind}{raw}<{CTYPE[tag]}, E> w{k}{sfx}[R];")
            else:
                out.append(f"{ind}float g{k}{sfx}[E * R];")
        return "\n".join(out)

    widen, copy = [], [f"#pragma unroll\n      for (int k = 0; k < {nops}; ++k) off[k] = offn[k];"]
    for k, (tag, role) in enumerate(ops):
        if role != "in":
            continue
        if access[k] == "b":
            copy.append(f"      b{k} = b{k}n;")
        elif access[k] == "c":
            widen.append(f"      float a{k}[E * R];\n#pragma unroll\n      for (int r = 0; r < R; ++r) w{k}[r].get(a{k} + r * E);")
            copy.append(f"#pragma unroll\n      for (int r = 0; r < R; ++r) w{k}[r] = w{k}n[r];")
        else:
            widen.append(f"      const float* a{k} = g{k};")
            copy.append(f"#pragma unroll\n      for (int e = 0; e < E * R; ++e) g{k}[e] = g{k}n[e];")
    body_ind = "\n".join("  " + ln if ln else ln for ln in body.split("\n"))
    stores_ind = "\n".join("  " + ln if ln else ln for ln in stores.split("\n"))
    first = "((idx_t)blockIdx.x * blockDim.x + ((idx_t)threadIdx.x - lane)) * (E * R) + lane * E"
    return f"""  if constexpr (VEC == 1) {{  // the prefetch form (tuning.graph.PW_PREFETCH)
{declare("", "    ")}
    idx_t i = {first};
    if (i < total) {{
      offsets<{nops}, {ndim}, idx_t>(p, i, off);
{loads("", "off")}
    }}
    for (; i < total; i += step) {{
{declare("n", "      ")}
      if (i + step < total) {{
        offsets<{nops}, {ndim}, idx_t>(p, i + step, offn);
{loads("n", "offn")}
      }}
{chr(10).join(widen)}
{chr(10).join("  " + d for d in decls)}
#pragma unroll
      for (int e = 0; e < E * R; ++e) {{
{body_ind}
      }}
{stores_ind}
{chr(10).join(copy)}
    }}
    return;
  }}"""


def source(prog, ndim, elems=1, wide=True, access=None, runs=1, split=True, min_blocks=0, prefetch=False):
    """(kernel name, CUDA C text) of the program over `ndim` collapsed dims, `elems` consecutive innermost
    elements a run (elems divides the innermost dim), `runs` runs a thread per iteration, 32 * elems apart
    (32 * elems * runs must divide the innermost dim: run_count picks it), 64-bit (wide) or 32-bit index
    math. access[k]: how operand k walks the innermost dim: "c" contiguous (stride 1: a vector of the run
    where p.flags bit 0 allows), "b" broadcast (stride 0: read once an iteration), "g" any stride (the
    default). split: the vector and element-by-element forms as two loops (the kernel picks one by p.flags)
    instead of one loop testing p.flags; min_blocks > 0: __launch_bounds__(256, min_blocks); prefetch (with
    split and a vector form): the vector loop as a software pipeline (_prefetch_block)."""
    ops = prog.operands
    if not 1 <= len(ops) <= MAX_OPERANDS:
        raise ValueError(f"{len(ops)} operands (1 to {MAX_OPERANDS})")
    access = list(access) if access is not None else ["g"] * len(ops)
    if len(access) != len(ops) or any(x not in "bcg" for x in access):
        raise ValueError(f"access {access!r} for {len(ops)} operands")
    if runs < 1 or (runs > 1 and elems < 1):
        raise ValueError(f"runs {runs}")
    last = max(ndim, 1) - 1
    span = 32 * elems  # elements between a lane's runs

    def at(k, e):  # element offset of operand k's element e of the iteration (e = r * E + j, as C text)
        if access[k] == "c":
            return f"off[{k}] + r * {span} + j" if e is None else f"off[{k}] + {e}"
        return f"off[{k}] + (idx_t)(r * {span} + j) * (idx_t)p.stride[{k}][{last}]"

    loops = "#pragma unroll\n      for (int r = 0; r < R; ++r)\n#pragma unroll\n        for (int j = 0; j < E; ++j)"
    loads, stores = [], []
    for k, (tag, role) in enumerate(ops):
        ct, kind = CTYPE[tag], access[k]
        ptr = f"static_cast<{'const ' if role == 'in' else ''}{ct}*>(p.ptr[{k}])"
        if role != "in":
            continue
        if kind == "b":
            loads.append(f"    const float b{k} = load<float>({ptr}[off[{k}]]);")
            continue
        loads.append(f"    float a{k}[E * R];")
        scalar = f"{loops} a{k}[r * E + j] = load<float>({ptr}[{at(k, None)}]);"
        if kind == "c" and elems > 1:
            loads.append(f"    if (vec) {{\n#pragma unroll\n      for (int r = 0; r < R; ++r) "
                         f"{_run(tag, elems)}::load({ptr} + off[{k}] + r * {span}, a{k} + r * E);\n"
                         f"    }} else {{\n      {scalar}\n    }}")
        else:
            loads.append("    {\n      " + scalar + "\n    }")
    body = [f"      const float in{k} = " + (f"b{k};" if access[k] == "b" else f"a{k}[e];")
            for k, (_, role) in enumerate(ops) if role == "in"]
    body += [f"      const float {name} = {expr};" for name, expr in expressions(prog)]
    decls = []
    for j, k in prog.stores:
        ct = CTYPE[ops[k][0]]
        body.append(f"      r{k}[e] = v{j};")
        decls.append(f"    float r{k}[E * R];")
        ptr = f"static_cast<{ct}*>(p.ptr[{k}])"
        scalar = f"{loops} {ptr}[{at(k, None)}] = store<{ct}>(r{k}[r * E + j]);"
        if access[k] == "c" and elems > 1:
            stores.append(f"    if (vec) {{\n#pragma unroll\n      for (int r = 0; r < R; ++r) "
                          f"{_run(ops[k][0], elems)}::store({ptr} + off[{k}] + r * {span}, r{k} + r * E);\n"
                          f"    }} else {{\n      {scalar}\n    }}")
        else:
            stores.append("    {\n      " + scalar + "\n    }")
    has_vec = elems > 1 and "c" in access
    pf = ""
    if prefetch and has_vec and split:
        pf = _prefetch_block(prog, access, elems, span, last, decls, "\n".join(body), "\n".join(stores), max(ndim, 1))
    if not has_vec:
        dispatch = "  NAME_loop<0>(p);"
    elif split:
        dispatch = "  if (p.flags & 1u)\n    NAME_loop<1>(p);\n  else\n    NAME_loop<0>(p);"
    else:
        dispatch = "  NAME_loop<2>(p);"
    fields = dict(nops=len(ops), ndim=max(ndim, 1), loads="\n".join(loads + decls), body="\n".join(body),
                  stores="\n".join(stores), elems=elems, runs=runs, idx="long long" if wide else "int",
                  min_blocks=f", {min_blocks}" if min_blocks else "", dispatch=dispatch, prefetch=pf)
    digest = hashlib.sha256(repr((fields, prog.key())).encode()).hexdigest()[:16]
    fields["name"] = f"pw_{digest}"
    fields["dispatch"] = dispatch.replace("NAME", fields["name"])
    template = (cache.ptx_dir() / "graph_pointwise.cu").read_text()
    return fields["name"], string.Template(template).substitute(fields)


def kernel_unit(prog, ndim, elems=1, wide=True, access=None, runs=1, split=True, min_blocks=0, prefetch=False):
    """(KernelUnit, name expression) of the program, registered with the loader and the cache (nothing is
    compiled here: loader.load_unit / handle.function compile on a cache miss); arguments as source's."""
    name, text = source(prog, ndim, elems, wide, access, runs, split, min_blocks, prefetch)
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
        p.magic[d], p.shift[d] = magic_u32(v) if v < 2**31 else (0, 0)
        total *= v
    p.total, p.ndim = total, len(dims)
    return p


def magic_u32(d):
    """(magic, shift) with n // d == (t + ((n - t) >> 1)) >> (shift - 1), t = (n * magic) >> 32, for every
    32-bit n (division by an invariant integer, Granlund & Montgomery; 'round-up' form); d == 1: (0, 0)."""
    if d < 1:
        raise ValueError(d)
    if d == 1:
        return 0, 0
    l = (d - 1).bit_length()  # noqa: E741 - ceil(log2 d)
    return ((1 << 32) * ((1 << l) - d)) // d + 1, l


def udiv_emulated(n, magic, shift):
    """numpy emulation of the kernel's udiv (n: uint64 array of 32-bit values)."""
    import numpy as np

    n = np.asarray(n, np.uint64)
    if shift == 0:
        return n
    t = (n * np.uint64(magic)) >> np.uint64(32)
    return (t + ((n - t) >> np.uint64(1))) >> np.uint64(shift - 1)


def launch_shape(dims, strides_list, sm_count, esizes=None, runs=1, per_sm=16, reach_per_sm=16):
    """(elems a thread's run, wide index math?, grid) for a pointwise kernel over collapsed dims: a run of
    consecutive innermost elements, 16 bytes of the narrowest operand read contiguously (8 for 16-bit
    types; 4-byte elements where esizes is not given), halved until it divides the innermost dim; `runs`
    runs a thread per iteration (run_count's); 32-bit index math where every index the loop reaches and
    every operand offset fits in an int; at most per_sm blocks of 256 threads an SM (a grid-stride loop
    does the rest; the index bound holds for grids up to max(16, per_sm, reach_per_sm) blocks an SM)."""
    inner = dims[-1]
    es = esizes or [4] * len(strides_list)
    contig = [e for st, e in zip(strides_list, es) if st[-1] == 1]
    elems = min(8, 16 // min(contig)) if contig else 4
    while elems > 1 and inner % elems:
        elems //= 2
    total = 1
    for d in dims:
        total *= d
    per = elems * runs
    blocks = max(1, min((total // per + THREADS - 1) // THREADS, max(sm_count, 1) * per_sm))
    most = max(1, min((total // per + THREADS - 1) // THREADS, max(sm_count, 1) * max(16, per_sm, reach_per_sm)))
    reach = total + most * THREADS * per
    span = max(sum((d - 1) * s for d, s in zip(dims, st)) for st in strides_list) + per * 32
    wide = reach >= 2**31 or span >= 2**31
    return elems, wide, (blocks, 1, 1)


def prod(dims):
    n = 1
    for d in dims:
        n *= d
    return n


def run_count(dims, elems, want):
    """Runs a thread per iteration (source's runs): the largest power of two up to `want` with 32 * elems *
    runs dividing the innermost dim (a lane's runs stay in one row and a warp's iteration never straddles
    the end), 1 where none does."""
    r = 1
    while r * 2 <= want and dims[-1] % (32 * elems * r * 2) == 0:
        r *= 2
    return r


def access_kinds(strides_list):
    """How each operand walks the innermost collapsed dim (source's access): "c", "b" or "g"."""
    return ["c" if st[-1] == 1 else "b" if st[-1] == 0 else "g" for st in strides_list]


def vector_ok(dims, strides_list, elems):
    """Whether every contiguous operand's runs start `elems`-aligned (in elements) for every index: each of
    its outer strides (of dims longer than one) a multiple of elems. The pointers are checked per launch."""
    return all(st[d] % elems == 0 for st in strides_list if st[-1] == 1 for d in range(len(dims) - 1) if dims[d] > 1)


def thread_offsets(dims, strides_list, elems):
    """numpy emulation of the kernel's loop: offsets of the first element of each thread's run (computed by
    offsets<>) plus e times the innermost stride, for every linear index, in order."""
    import numpy as np

    base = offsets(dims, strides_list)[:, ::elems]
    inner = np.array([s[-1] for s in strides_list], np.int64)[:, None, None]
    e = np.arange(elems, dtype=np.int64)[None, None, :]
    return (base[:, :, None] + e * inner).reshape(len(strides_list), -1)


def kernel_visits(dims, strides_list, elems, runs, threads):
    """numpy emulation of the kernel's loop with `threads` threads (grid x 256): (linear index, [operand
    offset...]) of every element each thread reaches, in the order the threads take them: lane l of the warp
    at thread t - l starts at (t - l) * E * R + l * E, run r of an iteration r * 32 * E after it, the
    operands' offsets of a run from offsets<> at its first run plus (r * 32 * E + j) * the innermost
    stride. Tests check every index comes exactly once with numpy's broadcast offsets."""
    import numpy as np

    total = int(np.prod(dims))
    per = elems * runs
    base = offsets(dims, strides_list)
    inner = np.array([s[-1] for s in strides_list], np.int64)[:, None]
    t = np.arange(threads, dtype=np.int64)
    lane = t % 32
    starts = []
    i = (t - lane) * per + lane * elems
    while True:
        live = i < total
        if not live.any():
            break
        starts.append(i[live])
        i = i + threads * per
    first = np.concatenate(starts) if starts else np.zeros(0, np.int64)
    step = (np.arange(runs, dtype=np.int64)[:, None] * 32 * elems + np.arange(elems, dtype=np.int64)[None, :]).ravel()
    idx = (first[:, None] + step[None, :]).ravel()
    off = (base[:, first][:, :, None] + step[None, None, :] * inner[:, :, None]).reshape(len(strides_list), -1)
    return idx, off


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
    if hasattr(tile, "cm"):  # TmaTile (gemm_tma: producer + 2 consumer warpgroups, one block an SM)
        wide = f", {b(tile.wide)}, true" if getattr(tile, "pp", False) else ", true" if tile.wide else ""
        cm = getattr(tile, "cm", 1)  # (the ping-pong cluster candidate: 2; the head then gets __cluster_dims__)
        return (f"pydnn::matmul::gemm_tma_body<{t}, {tile.bn}, {tile.stages}, {b(ta)}, {b(tb)}, {cm}{wide}>",
                tile.threads, 1)
    persist = ", true" if getattr(tile, "persist", False) else ""
    if getattr(tile, "persist", False) and (tile.lead != tile.stages - 2 or tile.runon):
        persist += f", {tile.lead}" + (", true" if tile.runon else "")
    return (f"pydnn::matmul::gemm_wgmma_body<{t}, {tile.bn}, {tile.stages}, {b(ta)}, {b(tb)}{persist}>", 256,
            tile.per_sm)


# reduction epilogue (cuDNN's reduce ops, PYDNN_REDUCE_TENSOR_*): (init, map of v, combine of a and b,
# the result of a over n values)
RED = {
    "ADD": ("0.0f", "v", "a + b", "a"),
    "MUL": ("1.0f", "v", "a * b", "a"),
    "MIN": ("INFINITY", "v", "fminf(a, b)", "a"),
    "MAX": ("-INFINITY", "v", "fmaxf(a, b)", "a"),
    "AMAX": ("0.0f", "fabsf(v)", "fmaxf(a, b)", "a"),
    "AVG": ("0.0f", "v", "a + b", "a / (float)n"),
    "NORM1": ("0.0f", "fabsf(v)", "a + b", "a"),
    "NORM2": ("0.0f", "v * v", "a + b", "sqrtf(a)"),
    "MUL_NO_ZEROS": ("1.0f", "(v == 0.0f ? 1.0f : v)", "a * b", "a"),
}


# A fused GEMM's column operands staged in shared memory once per tile (gemm_tma; tuning.matmul.FUSED_STAGE):
# at most this many bytes a warp (the kernel keeps a buffer a consumer warp: 8 x this beside the ring).
STAGE_MAX_BYTES = 1024


def stage_plan(prog, access, bn, widen=False):
    """[(operand k, byte offset, element size)] of the epilogue's staged column operands for a tile of bn
    columns, and the bytes a warp's buffer takes (widen, tuning.matmul.EPI_WIDEN: a 16-bit operand takes 4
    bytes an element there, widened to float once a tile before the epilogue: _epi_struct's widen): every
    input whose access is "C" (contiguous along the columns, not moving along rows: a bias), 2- or 4-byte elements; ([], 0) where none, where they would
    pass STAGE_MAX_BYTES, or where another input moves along the rows (its loads stay in the epilogue; beside
    them the staged bias + residual kernel spilled, ptxas sm_90a: 4 bytes)."""
    out, off = [], 0
    for k, ((otag, role), a) in enumerate(zip(prog.operands, access)):
        if role == "in" and a != "C":
            return [], 0
        if role == "in":
            sz = {"f32": 4, "f16": 2, "bf16": 2}.get(otag)
            if sz is None:
                return [], 0
            if widen:
                sz = 4
            out.append((k, off, sz))
            off += bn * sz
    if off > STAGE_MAX_BYTES:
        return [], 0
    return out, off


def _epi_struct(prog, final, access, red, store_c, sname, tag=None, stage_bn=0, stsm=False, widen=False,
                chunk=False):
    """The C++ functor of a fused matmul epilogue (ptx/matmul.cu's Epi protocol): per row, operand row
    pointers (and column-broadcast values) once; per column pair, the operands' loads (aligned pairs for
    contiguous inputs when flags bit k says so; always in the FAST instantiation, which the kernel takes
    for an interior tile when pairs_ok), then the program on each of the two values.
    stage_bn > 0 (gemm_tma's tile width): the column operands of stage_plan are also copied into a consumer
    warp's shared buffer at the start of each tile (stage: one 16-byte cp.async a lane and chunk, issued
    before the K loop, so their latency hides behind it) and read from there (the STAGED pair) in the
    epilogue of an interior tile, instead of global loads issued in the epilogue, where the tensor cores idle
    and the loads queue behind the next tile's TMA copies."""
    ops = prog.operands
    fields, rows, loads, pair_mask = [], [], [], 0
    staged, stage_bytes = stage_plan(prog, access, stage_bn, widen) if stage_bn else ([], 0)
    soff = {k: (off, sz) for k, off, sz in staged}
    # widened operands: 16-bit in global memory, float in the staged buffer (copied raw into the upper half of
    # their float region, widened in place by widen(): one lane a 16-byte chunk, stage_bn / 8 chunks)
    wide_k = [k for k, off, sz in staged if sz == 4 and ops[k][0] != "f32"]
    if wide_k and stage_bn != 256:
        raise ValueError("widened staging: a 256-column tile (one 16-byte chunk a lane)")
    for k, (otag, role) in enumerate(ops):
        ct = CTYPE[otag]
        kind = access[k]
        # an upper-case kind: the operand does not move along rows (stride[k][1] == 0), so its address leaves
        # the row out and the two rows a thread holds share its loads (the compiler merges them)
        base = f"static_cast<{'const ' if role == 'in' else ''}{ct}*>(e.ptr[{k}]) + z * e.stride[{k}][0]"
        if kind.islower():
            base += f" + (long long)row * e.stride[{k}][1]"
        kind = kind.lower()
        if role == "in" and kind == "b":
            fields.append(f"float b{k};")
            rows.append(f"    r.b{k} = ldf({base});")
            loads.append(f"    const float in{k}_0 = r.b{k}, in{k}_1 = r.b{k};")
            continue
        fields.append(f"{'const ' if role == 'in' else ''}{ct}* p{k};")
        rows.append(f"    r.p{k} = {base};")
        if role != "in":
            continue
        if kind == "c":
            pair_mask |= 1 << k
            st = (f"    if (STAGED) lds2<{'float' if k in wide_k else ct}>(sb + {soff[k][0]}u + (unsigned)(col & {stage_bn - 1}) * {soff[k][1]}u, "
                  f"in{k}_0, in{k}_1);\n    else ") if k in soff else "    "
            loads.append(f"    float in{k}_0, in{k}_1 = 0.0f;\n"
                         f"{st}if (FAST) ldf2(r.p{k} + col, in{k}_0, in{k}_1);\n"
                         f"    else if (two && ((e.flags >> {k}) & 1u)) ldf2(r.p{k} + col, in{k}_0, in{k}_1);\n"
                         f"    else {{ in{k}_0 = ldf(r.p{k} + col); if (two) in{k}_1 = ldf(r.p{k} + col + 1); }}")
        else:
            loads.append(f"    const long long s{k} = e.stride[{k}][2];\n"
                         f"    const float in{k}_0 = ldf(r.p{k} + col * s{k}), "
                         f"in{k}_1 = (FAST || two) ? ldf(r.p{k} + (col + 1) * s{k}) : 0.0f;")

    def element(e):
        out = [f"    {{  // column col + {e}", f"      const float acc_in = acc{e};"]
        out += [f"      const float in{k} = in{k}_{e};" for k, (_, role) in enumerate(ops) if role == "in"]
        out += [f"      const float {name} = {expr};" for name, expr in expressions(prog, tag if store_c else None, gemm=True)]
        for j, k in prog.stores:
            val = "acc_in" if j == -1 else f"v{j}"
            at = f"col + {e}" if access[k].lower() == "c" else f"(col + {e}) * e.stride[{k}][2]"
            st = f"r.p{k}[{at}] = store<{CTYPE[ops[k][0]]}>({val});"
            out.append(f"      {st}" if e == 0 else f"      if (FAST || two) {st}")
        out += [f"      acc{e} = {_ref(final)};", "    }"]
        return out

    if red is not None:
        init, mp, comb, done = RED[red["mode"]]
        ky, kw = red["y"], len(ops)
        yt = CTYPE[ops[ky][0]]
        red_fns = f"""
  __device__ __forceinline__ float red_init() const {{ return {init}; }}
  __device__ __forceinline__ float red_map(float v) const {{ return {mp}; }}
  __device__ __forceinline__ float red_comb(float a, float b) const {{ return {comb}; }}
  __device__ __forceinline__ void red_done(long long z, int row, float a) const {{
    const int n = p.n;
    (void)n;
    static_cast<{yt}*>(e.ptr[{ky}])[z * e.stride[{ky}][0] + (long long)row * e.stride[{ky}][1]] = store<{yt}>({done});
  }}
  __device__ __forceinline__ float* red_ws() const {{ return static_cast<float*>(e.ptr[{kw}]); }}
  __device__ __forceinline__ unsigned* red_cnt() const {{ return static_cast<unsigned*>(e.ptr[{kw + 1}]); }}"""
    else:
        red_fns = """
  __device__ __forceinline__ float red_init() const { return 0.0f; }
  __device__ __forceinline__ float red_map(float v) const { return v; }
  __device__ __forceinline__ float red_comb(float a, float) const { return a; }
  __device__ __forceinline__ void red_done(long long, int, float) const {}
  __device__ __forceinline__ float* red_ws() const { return nullptr; }
  __device__ __forceinline__ unsigned* red_cnt() const { return nullptr; }"""
    b = lambda v: "true" if v else "false"  # noqa: E731
    nl = "\n"
    # gemm_tma's WIDE store through stmatrix (tuning.matmul.EPI_STSM; ptx/matmul.cu stsm_store_tile); absent: false
    stsm_line = "  static constexpr bool kStsm = true;  // the WIDE store through stmatrix (stsm_store_tile)\n" if stsm else ""
    if stsm and chunk:  # tuning.matmul.EPI_CHUNK: compute and store 64 (or 32) columns at a time (matmul.cu ChunkOf)
        if int(chunk) not in (1, 32, 64):
            raise ValueError(f"chunk {chunk!r}: 64 or 32 columns")
        cw = 32 if int(chunk) == 32 else 64
        stsm_line += f"  static constexpr int kChunk = {cw};  // values and stores chunk by chunk\n"
    if staged:
        def base(k):
            return f"static_cast<const {CTYPE[ops[k][0]]}*>(e.ptr[{k}]) + z * e.stride[{k}][0] + n0"
        oks = " && ".join(f"(reinterpret_cast<unsigned long long>({base(k)}) & 15ull) == 0ull" for k, _, _ in staged)
        def raw(k, off, sz):  # where the copy lands: a widened operand's raw 16-bit values in its region's upper half
            return off + stage_bn * 2 if k in wide_k else off
        copies = nl.join(
            f"    for (int c = lane; c < {stage_bn * (2 if k in wide_k else sz) // 16}; c += 32)\n"
            f"      pydnn::matmul::cp_async16(s + {raw(k, off, sz)}u + 16u * c, reinterpret_cast<const char*>({base(k)}) + 16 * c, 16);"
            for k, off, sz in staged)
        wreads = nl.join(f"    uint4 w{k};\n    asm volatile(\"ld.shared.v4.b32 {{%0, %1, %2, %3}}, [%4];\" : \"=r\"(w{k}.x), "
                         f"\"=r\"(w{k}.y), \"=r\"(w{k}.z), \"=r\"(w{k}.w) : \"r\"(s + {raw(k, off, 4)}u + 16u * lane) : \"memory\");"
                         for k, off, sz in staged if k in wide_k)
        wwrites = nl.join(f"    sts_widen<{CTYPE[ops[k][0]]}>(s + {off}u + 32u * lane, w{k});"
                          for k, off, sz in staged if k in wide_k)
        widen_fn = f"""
  // the widened operands' raw 16-bit values to float in place (this lane's chunk: 8 values; every lane's read
  // before any write, which lands on other lanes' raw chunks). Called once a tile after the staging copies are
  // complete and visible to the warp (gemm_tma_body: cp.async.wait_all + __syncwarp), before the epilogue.
  static constexpr bool kWiden = true;
  __device__ __forceinline__ void widen(unsigned s, int lane) const {{
{wreads}
    __syncwarp();
{wwrites}
  }}""" if wide_k else ""
        stage_fns = f"""
  // the tile's column operands into a warp's buffer s (stage_ok: the tile ends inside n, 16-byte aligned starts)
  __device__ __forceinline__ bool stage_ok(long long z, int n0) const {{
    return n0 + {stage_bn} <= p.n && {oks};
  }}
  __device__ __forceinline__ void stage(long long z, int n0, unsigned s, int lane) const {{
{copies}
  }}{widen_fn}"""
    else:
        stage_fns = ""
    return f"""struct {sname} {{
  static constexpr bool kActive = true, kRed = {b(red is not None)}, kStoreC = {b(store_c)};
  static constexpr int kStage = {stage_bytes};  // bytes of a warp's staged column operands (0: none)
{stsm_line}  const GraphPwParams& e;
  const MatmulParams& p;
  struct Row {{
    {(nl + '    ').join(fields) if fields else 'int unused_;'}
  }};
  __device__ __forceinline__ Row row(long long z, int row) const {{
    Row r;
{nl.join(rows)}
    (void)z;
    (void)row;
    return r;
  }}
  // every contiguous input may be read in aligned pairs (the FAST tile path)
  __device__ __forceinline__ bool pairs_ok() const {{ return (e.flags & {pair_mask}u) == {pair_mask}u; }}
  template <bool FAST, bool STAGED = false>
  __device__ __forceinline__ void pair(const Row& r, float& acc0, float& acc1, int col, bool two,
                                       unsigned sb = 0u) const {{
{nl.join(loads)}
{nl.join(element(0))}
{nl.join(element(1))}
    (void)r;
    (void)two;
    (void)sb;
  }}{stage_fns}{red_fns}
}};"""


def matmul_source(prog, final, tag, fast, general, ta, tb, access=None, red=None, store_c=True, stage_bn=0,
                  stsm=False, widen=False, chunk=False):
    """(name, CUDA C) of a GEMM whose epilogue is the pointwise program `prog`: operand refs ("acc", 0) are
    the GEMM's value at (z, row, col), ("op", k) the epilogue operand k of GraphPwParams e (read at
    z * stride[k][0] + row * stride[k][1] + col * stride[k][2]); prog.stores write further outputs there;
    the value `final` (a ref: ("v", j) or ("acc", 0)) goes to C through the GEMM's own store (store_c; a
    virtual result is not stored); a store (j, k) with j == -1 writes the accumulator itself.
    access[k]: how operand k walks the columns: "b" broadcast (stride[k][2] == 0: read once per row), "c"
    contiguous (stride 1: read in pairs where aligned), "g" any stride (the default); upper case: an input
    that does not move along rows either (stride[k][1] == 0, e.g. a bias).
    red: None, or dict(mode=RED key, y=operand index of the reduction's output [batch, m, 1]): `final`
    is also reduced along each row (its workspace and counters are ptr[len(operands)] and the next).
    Two kernels: <name>_f (the fast tile; gemm_tma's takes MatmulTmaParams q, maps first) and <name>_g (the
    general, unaligned path). stage_bn: gemm_tma's tile width where the column operands are staged per tile
    (_epi_struct; the launch then needs stage_smem(...) more shared memory), else 0. stsm: gemm_tma's cooperative
    tile stores through stmatrix (the launch needs stsm_smem(...) more). widen: staged 16-bit column operands
    held as float in the buffer (stage_plan's widen; tuning.matmul.EPI_WIDEN)."""
    ops = prog.operands
    if stage_bn and (not hasattr(fast, "cm") or fast.bn != stage_bn or fast.pp or red is not None):
        raise ValueError("staged column operands: gemm_tma's cooperative tile, no row reduction")
    if stsm and (not hasattr(fast, "cm") or fast.pp or fast.cm != 1 or tag == "f32"):
        raise ValueError("stmatrix stores: gemm_tma's cooperative 1-CTA tile, 16-bit outputs")
    access = list(access) if access is not None else ["g"] * len(ops)
    if len(access) != len(ops) or any(a not in "bcgBCG" for a in access):
        raise ValueError(f"access {access!r} for {len(ops)} operands")
    if any(a.isupper() and role != "in" for a, (_, role) in zip(access, ops)):
        raise ValueError(f"access {access!r}: an output moves along rows")
    if red is not None and (red["mode"] not in RED or not 0 <= red["y"] < len(ops)):
        raise ValueError(f"reduction {red!r}")
    if len(ops) + (2 if red is not None else 0) > MAX_OPERANDS:
        raise ValueError(f"{len(ops)} epilogue operands")
    fb, ft, fm = _tile_body(fast, tag, ta, tb, True)
    gb, gt, gm = _tile_body(general, tag, ta, tb, False)
    body = _epi_struct(prog, final, access, red, store_c, "EPI", tag, stage_bn, stsm, widen, chunk)
    digest = hashlib.sha256(repr((body, fb, gb, prog.key(), final)).encode()).hexdigest()[:16]
    name = f"mm_{digest}"
    body = body.replace("struct EPI {", f"struct Epi_{name} {{")
    cluster = "__cluster_dims__(2, 1, 1) " if getattr(fast, "cm", 1) == 2 else ""
    head = f"__global__ void {cluster}__launch_bounds__({ft}, {fm}) {name}_f"
    if hasattr(fast, "cm"):  # gemm_tma takes its tensor maps by value: a __grid_constant__ MatmulTmaParams
        fast_kernel = (f"{head}(const __grid_constant__ MatmulTmaParams q,\n"
                       f"    const __grid_constant__ GraphPwParams e) {{\n  {fb}(q, Epi_{name}{{e, q.p}});\n}}")
    else:
        fast_kernel = f"{head}(const MatmulParams p, const GraphPwParams e) {{\n  {fb}(p, Epi_{name}{{e, p}});\n}}"
    text = f"""// Generated by pydnn/graph/codegen.py: a GEMM (ptx/matmul.cu) with a fused pointwise epilogue.
#include "matmul.cu"
#include "graph_pointwise.cuh"

namespace pydnn {{
namespace graph {{

{body}

{fast_kernel}

__global__ void __launch_bounds__({gt}, {gm}) {name}_g(const MatmulParams p, const GraphPwParams e) {{
  {gb}(p, Epi_{name}{{e, p}});
}}

}}  // namespace graph
}}  // namespace pydnn
"""
    return name, text


def stage_smem(stage_bytes):
    """Shared memory gemm_tma_body's staging takes beyond the ring and barriers: a buffer a consumer warp (8
    warps) and 128 bytes to align them (ptx/matmul.cu: stg)."""
    return 8 * stage_bytes + 128 if stage_bytes else 0


def stsm_smem(stage_bytes):
    """Shared memory of gemm_tma_body's stmatrix store buffers (kStsm): 2 KiB a consumer warp (8) after the
    staging buffers (stage_smem's 128 bytes of alignment, counted here where there is no staging)."""
    return 8 * 2048 + (0 if stage_bytes else 128)


def matmul_unit(prog, final, tag, fast, general, ta, tb, access=None, red=None, store_c=True, stage_bn=0,
                stsm=False, widen=False, chunk=False):
    """(KernelUnit, fast expr, general expr), registered like kernel_unit's; a wgmma fast tile makes the
    unit sm_90a only (as pydnn.ops.matmul's wgmma units)."""
    name, text = matmul_source(prog, final, tag, fast, general, ta, tb, access, red, store_c, stage_bn, stsm, widen,
                               chunk)
    src = f"graph/{name}.cu"
    cache.register_generated(src, text)
    fe, ge = f"pydnn::graph::{name}_f", f"pydnn::graph::{name}_g"
    archs = () if hasattr(fast, "wm") else ("sm_90a",)
    unit = KernelUnit(f"graph.{name}", src, (fe, ge), archs=archs)
    loader.register_units([unit])
    return unit, fe, ge
