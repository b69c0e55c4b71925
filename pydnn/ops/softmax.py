"""Softmax: cudnnSoftmaxForward / cudnnSoftmaxBackward (kernels in ptx/softmax.cu).

Algorithms: FAST, ACCURATE, LOG. Modes: INSTANCE (each n: over C, H, W, ...), CHANNEL (each n, h, w, ...:
over C). Tensors of 2 to 8 dims (dims after C are spatial, as cuDNN treats 5-D), any strides, float,
double, half and bfloat16 (float arithmetic for the 16-bit types).

    forward   y  = alpha * softmax(x) + beta * y           LOG: alpha * (x - max - log(sum exp(x - max)))
    backward  dx = alpha * y * (dy - sum(dy * y)) + beta * dx     LOG: alpha * (dy - exp(y) * sum(dy))

Every algorithm subtracts the row maximum (FAST differs from ACCURATE only by the fast exp on float32
data; 16-bit data always takes the fast exp, whose error is far below its rounding; double is exact).
beta == 0 never reads the output. x and y may be the same buffer.

The problem becomes `rows` independent rows (the kept dims) of `len` elements (the reduced dims). Dims of
size 1 are dropped and neighbouring dims that are dense in every operand are merged, in the order of the
input's strides. Then one layout is chosen (see _configs):

    row   the reduced dims merge into one contiguous run (INSTANCE on NCHW, CHANNEL on NHWC or with
          H = W = 1): row_fwd/row_bwd hold the row in registers (G threads per row, G a power of two:
          a sub-warp or warp for short rows, up to a block of 1024 for long ones), reading it once with
          16-byte vectors; rows longer than the registers take row_loop (a block per row, two passes).
    col   one reduced dim (the channel) with a stride, and the innermost kept dim contiguous (CHANNEL on
          NCHW): threads run along that dim (coalesced), channels split over blockDim.y, held in
          registers when they fit (4 per thread), else streamed twice with an online max / sum
          (col_loop).
    gen   anything else (gaps inside the reduced dims, different layouts of x and y): G threads per row,
          a coordinate walker, an online max / sum, then the write pass.

row and col have a vector launch (16-byte accesses, when the layout allows) and a scalar one; the
pointers of each call pick between them (row: every pointer at the same offset modulo 16 bytes, since a
row's unaligned head and tail are done element by element; col: every pointer 16-byte aligned).
"""
import ctypes
import sys

from .. import enums as E
from .. import tuning
from .._build.manifest import KernelUnit
from .._build.params import FLAG_BETA, MAX_DIMS, kernel_params
from .._cuda import driver
from ..buffers import device_ptr
from .. import buffers as _buffers
from ..handle import Handle, check_handle
from ..status import PydnnError, api
from .common import (
    FLOAT_TAGS, TAG, cdiv, element_aligned, enum_arg, float_tensor, next_pow2, output_tensor, prod, same_shape,
    same_type, scalar,
)
from ._elementwise import CTYPE, _SIZES, vec_width
from . import _elementwise as ew
from .._build import fastcall

ALGOS = (E.PYDNN_SOFTMAX_FAST, E.PYDNN_SOFTMAX_ACCURATE, E.PYDNN_SOFTMAX_LOG)
MODES = (E.PYDNN_SOFTMAX_MODE_INSTANCE, E.PYDNN_SOFTMAX_MODE_CHANNEL)

# PYDNN_SOFTMAX_KIND_* in ptx/softmax_params.h
KIND_FAST, KIND_ACCURATE, KIND_LOG = 0, 1, 2
FLAG_ROWS32 = 4                     # PYDNN_SOFTMAX_FLAG_ROWS32

# Fragments per thread in the row kernels, by (vector?, backward?): as many as fit in 64 registers
# without spilling (checked with ptxas): the vector kernels hold 4 x 16 bytes (double: 2 x 16, its exp is
# long), the scalar ones 16 elements forward and 8 of each input backward (double: half as many).
ROW_ITEMS = {(True, False): 4, (True, True): 4, (False, False): 16, (False, True): 8}
# float forward, vector launch, ACCURATE and LOG, rows up to F32_WIDE_MAX_LEN: 8 fragments per thread
# instead of 4 (64 registers, no spill; FAST spills 16 bytes at 8 and keeps 4). Rows of 4096 then take
# G = 128 threads, 8 rows resident per SM instead of 4: 96.0% of copy against 92.4% on the H200 (see
# tools/bench_softmax_notes.md). Longer rows keep 4, so where row_loop takes over is unchanged.
F32_WIDE_ITEMS = 8
F32_WIDE_MAX_LEN = 8192
ROW_MAX_GROUP = 1024                # threads per row at most (a block)
ROW_MIN_BLOCK = 128                 # row kernels: threads per block at least (rows share a block)
ROW_VEC_MIN_VECTORS = 8             # shorter rows take the scalar row kernel
LOOP_GROUP = 512                    # row_loop: threads per row (one row per block)
# COL_FILL (session 33): a channel softmax whose channels do not fit the col kernel's registers at a full 32-byte
# sector per channel line took col_loop at that width, one block per (outer, tile): NCHW bf16 40 x 601 x 3 x 3 ran
# 40 blocks of 16 x 16 threads, each streaming 601 channels twice (9.2 us a call in a CUDA graph; 0.78-0.85x
# PyTorch, H200). COL_FILL 1: while the blocks are fewer than the SMs the tile narrows below the sector (down to one
# position), and where the channels then fit BY x kColItems the col kernel holds them in registers (one read of x
# instead of two); the narrower lines cost L2 sectors, which tensors this small read from L2. 2: narrower still,
# to the width whose channels fit the registers, while the blocks stay under 4 waves' worth of SMs. Measured
# (mid-session run, H200, tools/bench_memory_points.py, eager ms 0 / 1 / 2, PyTorch in the same run): bf16
# 40x601x3x3 0.0099 / 0.0060 / 0.0058 (0.78x -> 1.28x / 1.31x), fp16 8x1000x7x7 0.0138 / 0.0087 / 0.0101 (3.1x ->
# 4.9x / 4.3x), fp32 2x2048x5x5 0.0213 / 0.0080 / - (2.4x -> 6.3x), fp32 16x300x9x9 (176 blocks: 1 leaves it)
# 0.0075 / - / 0.0084: 1 is the default.
# COL_FILL: a switch, pydnn.tuning.softmax.COL_FILL (default 1)
COL_ITEMS = 4                       # kColItems: channels per thread
COL_THREADS = 256                   # kColThreads
GEN_THREADS = 256                   # kGenThreads
UNROLL = 4                          # kUnroll
MAX_GRID = 2**31 - 1                # the kernels loop over row groups past the grid
# Few long contiguous rows, forward (sm_90): row_split_fwd (ptx/softmax_split.cu, units softmax.split.<t>),
# one row over a cluster of SPLIT_CL blocks of up to 1024 threads holding SPLIT_ITEMS vectors each, the max
# and sum exchanged through distributed shared memory. Why: row_fwd / row_loop_fwd put a row in one block
# (one SM): the issue-20 sweep (H200) had 1 x 65536 fp32 at 0.75x PyTorch, 1 x 16384 bf16 at 0.78x. Taken
# (tuning.softmax.SPLIT) for the vector launch of float / half / bfloat16 rows of at least SPLIT_MIN_LEN
# elements when rows * SPLIT_CL blocks fit on the SMs and the row's vectors fit the cluster.
SPLIT_CL = 8
SPLIT_ITEMS = 4
SPLIT_MIN_BLOCK = 128
SPLIT_TAGS = ("f32", "f16", "bf16")


@kernel_params("softmax_params.h", "SoftmaxParams")
class SoftmaxParams(ctypes.Structure):
    _fields_ = [
        ("out", ctypes.c_void_p), ("in0", ctypes.c_void_p), ("in1", ctypes.c_void_p),
        ("alpha", ctypes.c_double), ("beta", ctypes.c_double),
        ("rows", ctypes.c_longlong), ("len", ctypes.c_longlong),
        ("cols", ctypes.c_longlong), ("tiles", ctypes.c_longlong),
        ("group", ctypes.c_int), ("kind", ctypes.c_int), ("flags", ctypes.c_uint),
        ("row_ndim", ctypes.c_int), ("red_ndim", ctypes.c_int), ("pad_", ctypes.c_int),
        ("row_size", ctypes.c_longlong * MAX_DIMS), ("row_stride", (ctypes.c_longlong * MAX_DIMS) * 3),
        ("red_size", ctypes.c_longlong * MAX_DIMS), ("red_stride", (ctypes.c_longlong * MAX_DIMS) * 3),
        ("red_step", ctypes.c_longlong * MAX_DIMS),
    ]


# ----------------------------------------------------------------------------- kernel variants

def fwd_kind(algo, tag):
    """The forward template kind: FAST and ACCURATE are one kernel where the exp is fixed by the type."""
    if algo == E.PYDNN_SOFTMAX_LOG:
        return KIND_LOG
    if tag == "f64":
        return KIND_ACCURATE
    if tag in ("f16", "bf16") or algo == E.PYDNN_SOFTMAX_FAST:
        return KIND_FAST
    return KIND_ACCURATE


def bwd_kind(algo):
    return KIND_LOG if algo == E.PYDNN_SOFTMAX_LOG else KIND_ACCURATE


def _fwd_kinds(tag):
    return tuple(sorted({fwd_kind(a, tag) for a in ALGOS}))


BWD_KINDS = (KIND_ACCURATE, KIND_LOG)


def _expr(kernel, tag, vec=1, items=0, kind=0):
    t = CTYPE[tag]
    if kernel in ("row_fwd", "row_bwd"):
        return f"pydnn::softmax::{kernel}<{t}, {vec}, {items}, {kind}>"
    if kernel in ("col_fwd", "col_bwd"):
        return f"pydnn::softmax::{kernel}<{t}, {vec}, {kind}>"
    if kernel in ("row_loop_fwd", "row_loop_bwd", "col_loop_fwd", "col_loop_bwd"):
        return f"pydnn::softmax::{kernel}<{t}, {vec}>"
    if kernel == "row_split_fwd":
        return f"pydnn::softmax::row_split_fwd<{t}, {vec}, {SPLIT_ITEMS}, {kind}, {SPLIT_CL}>"
    return f"pydnn::softmax::{kernel}<{t}>"  # gen_fwd, gen_bwd


def row_items(tag, vec, backward):
    n = ROW_ITEMS[(vec > 1, bool(backward))]
    return n // 2 if tag == "f64" else n


def _wide(tag, vec, backward, kind):
    """Whether a float forward vector launch of this kind can take F32_WIDE_ITEMS (length aside)."""
    return tag == "f32" and vec > 1 and not backward and kind != KIND_FAST


def _unit_exprs(tag):
    v = vec_width(tag, tag)
    exprs = []
    for d, kinds in (("fwd", _fwd_kinds(tag)), ("bwd", BWD_KINDS)):
        for k in kinds:
            exprs += [_expr(f"row_{d}", tag, v, row_items(tag, v, d == "bwd"), k),
                      _expr(f"row_{d}", tag, 1, row_items(tag, 1, d == "bwd"), k),
                      *([_expr("row_fwd", tag, v, F32_WIDE_ITEMS, k)] if _wide(tag, v, d == "bwd", k) else []),
                      _expr(f"col_{d}", tag, v, kind=k), _expr(f"col_{d}", tag, 1, kind=k)]
        exprs += [_expr(f"row_loop_{d}", tag, v), _expr(f"col_loop_{d}", tag, v), _expr(f"col_loop_{d}", tag, 1),
                  _expr(f"gen_{d}", tag)]
    return tuple(exprs)


def kernel_units():
    units = [KernelUnit(f"softmax.{t}", "softmax.cu", _unit_exprs(t)) for t in FLOAT_TAGS]
    for t in SPLIT_TAGS:  # row_split_fwd: thread-block clusters, sm_90 only (see SPLIT_CL)
        units.append(KernelUnit(f"softmax.split.{t}", "softmax_split.cu",
                                tuple(_expr("row_split_fwd", t, vec_width(t, t), kind=k) for k in _fwd_kinds(t)),
                                archs=("sm_90",)))
    return units


def split_group(handle, backward, tag, rows, length, vec):
    """row_split_fwd's threads per block for these rows, or None when it does not apply (see SPLIT_CL)."""
    if (backward or not tuning.softmax.SPLIT or handle.arch != "sm_90" or tag not in SPLIT_TAGS or vec == 1
            or length < tuning.softmax.SPLIT_MIN_LEN or rows * SPLIT_CL > handle.sm_count):
        return None
    nvec = length // vec
    b = max(SPLIT_MIN_BLOCK, next_pow2(cdiv(cdiv(nvec, SPLIT_CL), SPLIT_ITEMS)))
    return b if b <= ROW_MAX_GROUP else None


# ----------------------------------------------------------------------------- planning


def _collapse(which, dims, strides, key):
    """Dims `which`, size 1 dropped, ordered by the strides `key` (outermost first; ties keep the
    descriptor's order), neighbours merged when dense in every operand (strides: one tuple per operand).
    -> (sizes, [strides per operand])."""
    keep = sorted((i for i in which if dims[i] != 1), key=lambda i: -key[i])
    sizes, out = [], [[] for _ in strides]
    for i in keep:
        n = dims[i]
        if sizes and all(o[-1] == s[i] * n for o, s in zip(out, strides)):
            sizes[-1] *= n
            for o, s in zip(out, strides):
                o[-1] = s[i]
        else:
            sizes.append(n)
            for o, s in zip(out, strides):
                o.append(s[i])
    return sizes, out


def _digits(step, sizes):
    """`step` in the mixed radix of `sizes` (outermost first; the outermost digit is unbounded)."""
    out = [0] * len(sizes)
    for d in range(len(sizes) - 1, 0, -1):
        out[d] = step % sizes[d]
        step //= sizes[d]
    out[0] = step
    return out


class _Launch:
    """One kernel launch of a planned problem: pointers and scalars are patched into `params` per call."""

    __slots__ = ("kernel", "expr", "vec", "params", "argv", "grid", "block", "func", "unit")

    def describe(self):
        p = self.params
        shape = (self.block[0], self.block[1]) if self.kernel.startswith("col") else p.group
        return self.kernel, self.vec, shape, self.grid[0]


class _Plan:
    """The launches of one problem: launches[0] when the call's pointers pass `align` (see _aligned),
    launches[-1] otherwise."""

    __slots__ = ("layout", "launches", "align", "need", "unit", "itemsize", "names", "crec", "crec_obj")


def _aligned(align, ptrs):
    if align == "congruent":  # the same offset modulo 16 bytes (row kernels split off heads and tails)
        return all(((q - ptrs[1]) & 15) == 0 for q in ptrs)
    return all((q & 15) == 0 for q in ptrs)  # "aligned"


def _params(kind, rows, length, row_sizes, row_strides, red_sizes, red_strides, nops):
    p = SoftmaxParams()
    p.rows, p.len, p.kind = rows, length, kind
    rs = row_sizes or [1]
    p.row_ndim = len(rs)
    for d, s in enumerate(rs):
        p.row_size[d] = s
        for k in range(nops):
            p.row_stride[k][d] = row_strides[k][d] if row_sizes else 0
    p.red_ndim = len(red_sizes)
    for d, s in enumerate(red_sizes):
        p.red_size[d] = s
        for k in range(nops):
            p.red_stride[k][d] = red_strides[k][d]
    p.flags = FLAG_ROWS32 if rows < 2**32 else 0
    return p


def _configs(handle, backward, kind, mode, descs):
    """(layout, [launch, ...], align) for descs = [out, in0(, in1)] (forward: y, x; backward: dx, y, dy).
    The choice and launch shapes, per layout:
      row   vector launch (16 // itemsize elements per access) when the row has at least 8 vectors and
            every operand's row strides agree modulo the vector width; G = threads per row =
            next_pow2(len / elements per thread) (at least 2 * vec - 2 so that a head and a tail element
            have a thread each); block = max(G, 128) threads, block / G rows per block. G > 1024: the
            vector launch becomes row_loop (G = 512), the scalar one gen.
      col   block (BX, BY), BX * BY = 256, BX threads along the inner dim, BY over the channels. When
            BY >= len / 4 leaves BX at least 32 bytes of each channel line (or the whole inner dim), the
            channels stay in registers (col, BX as wide as that allows); otherwise col_loop streams
            them twice, BX the narrowest full 32-byte sector, for the most blocks. grid = outer * tiles.
      gen   G = threads per row; rows that are closer in memory than elements get fewer threads each
            (neighbouring threads then read neighbouring rows)."""
    out = descs[0]
    dims, nd = out.dims, len(out.dims)
    nops = len(descs)
    tag = TAG[out.dtype]
    size, vec = _SIZES[tag], vec_width(tag, tag)
    d = "bwd" if backward else "fwd"
    red = [1] if mode == E.PYDNN_SOFTMAX_MODE_CHANNEL else list(range(1, nd))
    rowd = [i for i in range(nd) if i not in red]
    strides = [x.strides for x in descs]
    key = descs[1].strides
    esz, est = _collapse(red, dims, strides, key)
    rsz, rst = _collapse(rowd, dims, strides, key)
    if not esz:  # every reduced dim has size 1: rows of one element
        esz, est = [1], [[1] for _ in range(nops)]
    rows, length = prod(rsz), prod(esz)

    def launch(kernel, v, p, grid, block, expr):
        lc = _Launch()
        lc.kernel, lc.vec, lc.params, lc.grid, lc.block, lc.expr = kernel, v, p, (max(1, min(grid, MAX_GRID)), 1, 1), \
            block, expr
        lc.func = lc.unit = None
        return lc

    def gen_launch():
        g_elem = min(GEN_THREADS, next_pow2(cdiv(length, UNROLL)))
        rows_closer = rsz and min(rst[1]) < min(est[1])
        g = min(g_elem, next_pow2(cdiv(handle.sm_count * 2048, rows))) if rows_closer else g_elem
        p = _params(kind, rows, length, rsz, rst, esz, est, nops)
        p.group = g
        for k, s in enumerate(_digits(g, esz)):
            p.red_step[k] = s
        return launch(f"gen_{d}", 1, p, cdiv(rows, GEN_THREADS // g), (GEN_THREADS, 1, 1), _expr(f"gen_{d}", tag))

    def row_launch(v, items):
        g = next_pow2(cdiv(length, v * items))
        if v > 1:
            g = max(g, next_pow2(2 * v - 2))
        if g > ROW_MAX_GROUP:
            return None
        block = max(g, ROW_MIN_BLOCK)
        p = _params(kind, rows, length, rsz, rst, esz, est, nops)
        p.group = g
        return launch(f"row_{d}", v, p, cdiv(rows, block // g), (block, 1, 1), _expr(f"row_{d}", tag, v, items, kind))

    def split_launch(v, b):
        p = _params(kind, rows, length, rsz, rst, esz, est, nops)
        p.group = b
        lc = launch("row_split_fwd", v, p, rows * SPLIT_CL, (b, 1, 1), _expr("row_split_fwd", tag, v, kind=kind))
        lc.unit = f"softmax.split.{tag}"
        return lc

    def loop_launch(v):
        p = _params(kind, rows, length, rsz, rst, esz, est, nops)
        p.group = LOOP_GROUP
        return launch(f"row_loop_{d}", v, p, rows, (LOOP_GROUP, 1, 1), _expr(f"row_loop_{d}", tag, v))

    def col_launch(v):
        C, S = length, rsz[-1]
        sv = S // v
        need_by = next_pow2(cdiv(C, COL_ITEMS))
        bx_full = next_pow2(sv)
        bx_min = min(bx_full, max(1, 32 // (v * size)))  # a 32-byte sector per channel line
        outer = rows // S
        if tuning.softmax.COL_FILL and need_by * bx_min > COL_THREADS:  # (see COL_FILL above)
            while bx_min > 1 and outer * cdiv(sv, bx_min) < handle.sm_count:
                bx_min //= 2
            if tuning.softmax.COL_FILL == 2 and outer * cdiv(sv, bx_min) < 4 * handle.sm_count:
                bx_min = max(1, min(bx_min, COL_THREADS // need_by))  # (the registers' width where C allows)
        if need_by * bx_min <= COL_THREADS:  # channels in registers
            bx = min(bx_full, COL_THREADS // need_by)
            kernel, expr = f"col_{d}", _expr(f"col_{d}", tag, v, kind=kind)
        else:  # streamed twice: the narrowest full-sector tile, for the most blocks
            bx = bx_min
            kernel, expr = f"col_loop_{d}", _expr(f"col_loop_{d}", tag, v)
        by = COL_THREADS // bx
        tiles = cdiv(sv, bx)
        p = _params(kind, outer, C, rsz[:-1], [s[:-1] for s in rst], esz, est, nops)
        p.cols, p.tiles = S, tiles
        return launch(kernel, v, p, outer * tiles, (bx, by, 1), expr)

    if len(esz) == 1 and all(s[0] == 1 for s in est):
        launches = []
        congruent = all((s[i] - rst[1][i]) % vec == 0 for s in rst for i in range(len(rsz)))
        if vec > 1 and length >= ROW_VEC_MIN_VECTORS * vec and congruent:
            items = row_items(tag, vec, backward)
            if _wide(tag, vec, backward, kind) and length <= F32_WIDE_MAX_LEN:
                items = F32_WIDE_ITEMS
            sb = split_group(handle, backward, tag, rows, length, vec)
            launches.append(split_launch(vec, sb) if sb else (row_launch(vec, items) or loop_launch(vec)))
        launches.append(row_launch(1, row_items(tag, 1, backward)) or gen_launch())
        return "row", launches, "congruent"
    if len(esz) == 1 and rsz and all(s[-1] == 1 for s in rst) and length < 2**31:
        launches = []
        outer_strides = [x for s in rst for x in s[:-1]]
        if (vec > 1 and rsz[-1] % vec == 0 and all(x % vec == 0 for x in outer_strides)
                and all(s[0] % vec == 0 for s in est)):
            launches.append(col_launch(vec))
        launches.append(col_launch(1))
        return "col", launches, "aligned"
    return "gen", [gen_launch()], "aligned"


def _plan(handle, backward, algo, mode, descs):
    """Validated descriptors -> _Plan (no kernel loaded)."""
    tag = TAG[descs[0].dtype]
    kind = bwd_kind(algo) if backward else fwd_kind(algo, tag)
    layout, launches, align = _configs(handle, backward, kind, mode, descs)
    pl = _Plan()
    pl.layout, pl.launches, pl.align = layout, launches, align
    pl.need = tuple(x.span_bytes() for x in descs)
    pl.unit = f"softmax.{tag}"
    pl.itemsize = _SIZES[tag]
    for lc in launches:
        lc.argv = driver.kernel_args(lc.params)
    return pl


def plan_summary(handle, algo, mode, *descs, backward=False):
    """For tests and tuning: (layout, [(kernel, vec, group or (bx, by), grid) per launch, vector launch
    first]). descs in the API's order: forward (x_desc, y_desc); backward (y_desc, dy_desc, dx_desc).
    Loads no kernel."""
    check_handle(handle)
    if backward:
        y_desc, dy_desc, dx_desc = descs
        algo, mode = _validate(algo, mode, [(y_desc, "yDesc"), (dy_desc, "dyDesc"), (dx_desc, "dxDesc")], "dxDesc")
        pl = _plan(handle, True, algo, mode, [dx_desc, y_desc, dy_desc])
    else:
        x_desc, y_desc = descs
        algo, mode = _validate(algo, mode, [(x_desc, "xDesc"), (y_desc, "yDesc")], "yDesc")
        pl = _plan(handle, False, algo, mode, [y_desc, x_desc])
    return pl.layout, [lc.describe() for lc in pl.launches]


# ----------------------------------------------------------------------------- validation and launch

def _validate(algo, mode, named, out_name):
    """BAD_PARAM: algo / mode not an enum value, dims or data types that differ, fewer than 2 dims, an
    output whose elements overlap. NOT_SUPPORTED: a data type other than float, double, half, bfloat16."""
    algo = enum_arg("algo", algo, ALGOS, "pydnnSoftmaxAlgorithm_t")
    mode = enum_arg("mode", mode, MODES, "pydnnSoftmaxMode_t")
    first, first_name = named[0]
    for desc, name in named:
        float_tensor(desc, name)
    for desc, name in named[1:]:
        same_shape(first, first_name, desc, name)
        same_type(first, first_name, desc, name)
    if len(first.dims) < 2:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                         f"{out_name}: softmax needs at least 2 dims (N, C, ...), got {len(first.dims)}")
    out = next(d for d, n in named if n == out_name)
    output_tensor(out, out_name)
    return algo, mode


def _key(direction, algo, mode, descs):
    """The handle's cache key for a call, or None when an argument is not what a key can hold."""
    if type(algo) is not int or type(mode) is not int:
        return None
    try:
        if len(descs) == 2:  # the forward's: spelled out, this runs on every call
            a, b = descs
            return ("softmax", direction, algo, mode, a, a.version, b, b.version)
        return ("softmax", direction, algo, mode) + tuple((d, d.version) for d in descs)
    except (AttributeError, TypeError):
        return None


def _get_plan(handle, backward, algo, mode, named, out_name, order, buffers):
    """The cached plan for these arguments, or a new one (validation, pointer checks, kernel lookup)."""
    descs = [named[i][0] for i in order]
    key = _key(int(backward), algo, mode, descs)
    pl = handle.prepared.get(key) if key is not None else None
    if pl is None:
        algo, mode = _validate(algo, mode, named, out_name)
        for (desc, _), (buf, bname) in zip(named, buffers):  # pointer errors before any kernel is loaded
            element_aligned(device_ptr(buf, bname, desc.span_bytes()), bname, desc.itemsize)
        pl = _plan(handle, backward, algo, mode, descs)
        for lc in pl.launches:
            lc.func = handle.function(lc.unit or pl.unit, lc.expr)
        if not ew._entries_tried:  # the compiled entries, where no element-wise record set them up yet
            ew.plan_entries(pl.launches[0].func)
        if key is not None:
            handle.remember(key, pl)
    return pl


def _run(handle, pl, ptrs, names, alpha, beta):
    isz = pl.itemsize
    for q, n in zip(ptrs, names):
        if q % isz:
            element_aligned(q, n, isz)
    lc = pl.launches[0] if len(pl.launches) == 1 or _aligned(pl.align, ptrs) else pl.launches[-1]
    p = lc.params
    p.out, p.in0 = ptrs[0], ptrs[1]
    p.in1 = ptrs[2] if len(ptrs) > 2 else None
    p.alpha, p.beta = alpha, beta
    p.flags = (p.flags & FLAG_ROWS32) | (FLAG_BETA if beta != 0 else 0)
    driver.launch_args(lc.func, lc.grid, lc.block, 0, handle.cu_stream, lc.argv)


@api
def softmax_forward(handle, algo, mode, alpha, x_desc, x, beta, y_desc, y):
    """cudnnSoftmaxForward: y = alpha * softmax(x) + beta * y (log-softmax for LOG). Statuses:
    BAD_PARAM (handle, descriptors, algo, mode, dims or types that differ, fewer than 2 dims, overlapping
    y, alpha / beta not numbers), BAD_PARAM_NULL_POINTER, BAD_PARAM_MISALIGNED_POINTER (a pointer not
    aligned to its elements), NOT_SUPPORTED (data types other than float, double, half, bfloat16)."""
    if type(handle) is not Handle or not handle.alive:
        check_handle(handle)
    pl = key = None
    if type(algo) is int and type(mode) is int:  # _key's forward key, inline (the hot path)
        try:
            key = ("softmax", 0, algo, mode, y_desc, y_desc.version, x_desc, x_desc.version)
        except AttributeError:
            key = None
        if key is not None:
            pl = handle.prepared.get(key)
    if pl is None:
        named = [(x_desc, "xDesc"), (y_desc, "yDesc")]
        pl = _get_plan(handle, False, algo, mode, named, "yDesc", (1, 0), ((x, "x"), (y, "y")))
    al = alpha if type(alpha) is float else scalar("alpha", alpha)
    be = beta if type(beta) is float else scalar("beta", beta)
    checked = _buffers.CHECKED
    yp = y if type(y) is int and y > 0 and not checked else device_ptr(y, "y", pl.need[0])
    xp = x if type(x) is int and x > 0 and not checked else device_ptr(x, "x", pl.need[1])
    _run(handle, pl, (yp, xp), ("y", "x"), al, be)
    if ew.note is not None and key is not None:  # the compiled entry keeps this call site (ew._setup_entries)
        _note(pl)


_py_softmax_forward = softmax_forward  # the Python function behind the compiled entry (ew._setup_entries)


def _note(pl):
    """The plan's C record (made once: out, in0, in1 at the start of SoftmaxParams, _run's flags) noted for the
    compiled entry."""
    try:
        pl.crec
    except AttributeError:
        fastcall.plan_record(pl, ("out", "in0", "in1"), SoftmaxParams, FLAG_ROWS32, FLAG_BETA, pl.align == "congruent")
    ew.note(ew.K_SOFTMAX, pl, 1, False, False)


@api
def softmax_backward(handle, algo, mode, alpha, y_desc, y, dy_desc, dy, beta, dx_desc, dx):
    """cudnnSoftmaxBackward: dx = alpha * y * (dy - sum(dy * y)) + beta * dx (FAST, ACCURATE);
    LOG: dx = alpha * (dy - exp(y) * sum(dy)) + beta * dx, y being the log-softmax. Statuses as
    softmax_forward."""
    check_handle(handle)
    named = [(y_desc, "yDesc"), (dy_desc, "dyDesc"), (dx_desc, "dxDesc")]
    pl = _get_plan(handle, True, algo, mode, named, "dxDesc", (2, 0, 1), ((y, "y"), (dy, "dy"), (dx, "dx")))
    al, be = scalar("alpha", alpha), scalar("beta", beta)
    ptrs = (device_ptr(dx, "dx", pl.need[0]), device_ptr(y, "y", pl.need[1]), device_ptr(dy, "dy", pl.need[2]))
    _run(handle, pl, ptrs, ("dx", "y", "dy"), al, be)

# the compiled entries over this module's Python functions (_elementwise._setup_entries)
ew.register_entries(sys.modules[__name__], "softmax_forward")
