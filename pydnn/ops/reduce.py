"""ReduceTensor: cudnnCreate/Set/Get/DestroyReduceTensorDescriptor, cudnnGetReductionIndicesSize,
cudnnGetReductionWorkspaceSize, cudnnReduceTensor (kernels in ptx/reduce.cu).

C = alpha * reduce(A) + beta * C, where each dim of C equals A's (kept) or is 1 (reduced).

Ops: ADD, MUL, MIN, MAX, AMAX (max |a|), AVG, NORM1 (sum |a|), NORM2 (sqrt of sum a^2), MUL_NO_ZEROS (the
product of the non-zero elements; 1 when every element is zero). NaN: ADD, MUL, AVG and the norms give
NaN as arithmetic does; MIN, MAX and AMAX give NaN with PROPAGATE_NAN and skip NaNs with NOT_PROPAGATE_NAN
(a slice of nothing but NaN gives NaN, index 0).

Indices (FLATTENED_INDICES, 32-bit; MIN, MAX and AMAX only, as cuDNN documents: asking for them with
another op is NOT_SUPPORTED): for each element of C, the flat index of the chosen element within its
reduced sub-tensor, row-major over the reduced dims in A's dim order; ties take the lowest index, and with
PROPAGATE_NAN the first NaN wins. The indices buffer holds one int32 per element of C, packed row-major in
C's dims (like a fully packed NCHW tensor of C's dims), whatever C's own strides.

Types (A, C): the same type (float, double, half, bfloat16), or half / bfloat16 with float, either way
round (cuDNN: "HALF ... may be mixed with FLOAT"). Arithmetic in float (double when A is double); the
compute type FLOAT serves every pair and DOUBLE the double pair (for double tensors cuDNN assumes double
whatever the descriptor says). Anything else is NOT_SUPPORTED.

Results are deterministic: every run of one call on one device gives the same bits (fixed combination
orders, no atomics). Kernel choice, launch shapes and workspace: see _configs.
"""
import ctypes
import sys

from .. import enums as E
from .. import tuning
from .._build.manifest import KernelUnit
from .._build.params import FLAG_BETA, FLAG_NAN_PROP, MAX_DIMS, kernel_params
from .._cuda import driver
from ..buffers import device_ptr
from ..handle import Handle, check_handle
from ..status import PydnnError, api
from ..tensor import index_of
from .common import FLOAT_TAGS, TAG, enum_arg, float_tensor, next_pow2, output_tensor, prod, scalar
from . import _elementwise as _ew
from .._build import fastcall
from ._elementwise import CTYPE, desc_key, vec_width

BLOCK = 256          # kThreads in reduce.cu
UNROLL = 4           # kUnroll in reduce.cu
# rows_vec's group for many rows (ROW_ROUNDS_WIDE rounds of UNROLL loads a thread, groups of at least
# WIDE_MIN_GROUP threads, at least a wave of resident threads (sm_count * 2048) over all rows): AVG 53513 x 2824
# fp32 ran at 0.217 ms with ROW_ROUNDS' 2 (G = 128, 67% of copy, 0.69x PyTorch) and 0.159 ms with 8 (G = 32,
# 92% of copy, 0.95x; H200 mid-session run, 2026-11-28); second run, same-run A / B: 0.2187 -> 0.1605 ms,
# SUM 30000 x 8192 fp32 0.2728 -> 0.2321 ms (G 256 -> 64), AVG 40000 x 14688 fp16 0.4069 -> 0.3027 ms (0.91x ->
# 1.23x PyTorch); 2563 x 128 and 1048576 x 120 (rule not applied) unchanged. Few rows keep ROW_ROUNDS: their
# time is the rounds' latency, not bandwidth (2563 x 128 fp32 would go from G = 4 to 1).
# ROW_ROUNDS_WIDE: a switch, pydnn.tuning.reduce.ROW_ROUNDS_WIDE (default 8; 0: off)
# SEG_ROUNDS (session 33): a row split into segments (few rows: a second pass sums the segments' partials) keeps at
# least SEG_ROUNDS rounds of UNROLL loads a thread in each segment. 4 (the value before the switch) leaves few rows
# on a fraction of the GPU: 18 x 65536 fp32 SUM takes 4 segments a row, 72 blocks of 256 threads for 132 SMs (0.90x
# PyTorch, H200, session 32's sweep); 1 gives 16 segments, 288 blocks, one round each. Measured (mid-session run,
# session 33, H200, tools/bench_memory_points.py, eager ms at 4 / 1 / 2, PyTorch in the same run): SUM fp32
# 18x65536 0.0099 / 0.0097 / 0.0100 (PyTorch 0.0088), MAX bf16 9x65536 0.0096 / 0.0102 / 0.0097 (0.0101), AVG
# fp32 40x100000 0.0102 / 0.0111 / 0.0097 (0.0121): no setting wins; these ~10 us calls are host-bound (4.7 MB
# reads in ~1.5 us at copy speed), so 4 stays.
# SEG_ROUNDS: a switch, pydnn.tuning.reduce.SEG_ROUNDS (default 4)
WIDE_MIN_GROUP = 32
FLAG_SMALL_ROWS = 4  # PYDNN_REDUCE_FLAG_SMALL_ROWS
FLAG_IN_BF16 = 8     # PYDNN_REDUCE_FLAG_IN_BF16: half and bfloat16 inputs share the pydnn::h16_t kernels (reduce.h16),
                     # this bit names the format (issue 21: one 16-bit unit to compile instead of two)
KEEP_FLAGS = FLAG_SMALL_ROWS | FLAG_IN_BF16   # what a call keeps of the planned flags
OUT_TYPE = {"f32": 0, "f64": 1, "f16": 2, "bf16": 3}
OPS = tuple(E.ENUMS["pydnnReduceTensorOp_t"].values())
INDEXED = (E.PYDNN_REDUCE_TENSOR_MIN, E.PYDNN_REDUCE_TENSOR_MAX, E.PYDNN_REDUCE_TENSOR_AMAX)
PAIRS = (("f32", "f32"), ("f64", "f64"), ("f16", "f16"), ("bf16", "bf16"),
         ("f16", "f32"), ("bf16", "f32"), ("f32", "f16"), ("f32", "bf16"))
# the template op of each reduce op (AVG is ADD with a division at the end)
KERNEL_OP = {op: (E.PYDNN_REDUCE_TENSOR_ADD if op == E.PYDNN_REDUCE_TENSOR_AVG else op) for op in OPS}
KERNEL_OPS = tuple(sorted(set(KERNEL_OP.values())))
WS_ALIGN = 8


@kernel_params("reduce_params.h", "ReduceParams")
class ReduceParams(ctypes.Structure):
    _fields_ = [
        ("out", ctypes.c_void_p), ("in_", ctypes.c_void_p), ("indices", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p), ("alpha", ctypes.c_double), ("beta", ctypes.c_double),
        ("rows", ctypes.c_longlong), ("len", ctypes.c_longlong), ("units", ctypes.c_longlong),
        ("chunk", ctypes.c_longlong), ("cols", ctypes.c_longlong), ("tiles", ctypes.c_longlong),
        ("step_off", ctypes.c_longlong), ("wrap_off", ctypes.c_longlong),
        ("col_stride", ctypes.c_longlong * 3),
        ("op", ctypes.c_int), ("segments", ctypes.c_int), ("group", ctypes.c_int), ("fgroup", ctypes.c_int),
        ("pack", ctypes.c_int), ("out_type", ctypes.c_int), ("flags", ctypes.c_uint),
        ("row_ndim", ctypes.c_int), ("red_ndim", ctypes.c_int), ("pad_", ctypes.c_int),
        ("row_size", ctypes.c_longlong * MAX_DIMS), ("row_stride", (ctypes.c_longlong * MAX_DIMS) * 3),
        ("red_size", ctypes.c_longlong * MAX_DIMS), ("red_stride", ctypes.c_longlong * MAX_DIMS),
        ("red_step", ctypes.c_longlong * MAX_DIMS),
    ]
    C_NAMES = {"in_": "in"}


def _variants():
    """(template op, with indices) of every templated kernel."""
    return [(op, False) for op in KERNEL_OPS] + [(op, True) for op in INDEXED]


def _expr(kind, tag, op=None, idx=False, vec=1):
    t = _ew.MAP_CTYPE[tag]   # (half and bfloat16: pydnn::h16_t, while _elementwise's fold is on)
    b = "true" if idx else "false"
    if kind == "rows_vec":
        return f"pydnn::reduce::rows_vec<{t}, {op}, {b}>"
    if kind == "cols":
        return f"pydnn::reduce::cols<{t}, {vec}, {op}, {b}>"
    return f"pydnn::reduce::{kind}<{t}>"  # rows_gen, reduce_finish


def kernel_units():
    units = []
    for tag in _ew.unit_tags(FLOAT_TAGS):   # reduce.f32, reduce.h16 (half and bfloat16), reduce.f64
        exprs = [_expr("rows_gen", tag), _expr("reduce_finish", tag)]
        for op, idx in _variants():
            exprs += [_expr("rows_vec", tag, op, idx), _expr("cols", tag, op, idx, vec_width(tag, tag)),
                      _expr("cols", tag, op, idx, 1)]
        units.append(KernelUnit(f"reduce.{_ew.ktag(tag)}", "reduce.cu", tuple(exprs)))
    return units


# ----------------------------------------------------------------------------- descriptor

class ReduceTensorDescriptor:
    """cudnnReduceTensorDescriptor_t."""

    __slots__ = ("op", "comp_type", "nan_opt", "indices", "indices_type", "is_set", "alive", "version")

    def __init__(self):
        self.op, self.comp_type, self.nan_opt, self.indices, self.indices_type = 0, 0, 0, 0, 0
        self.is_set, self.alive, self.version = False, True, 0


def _live(desc):
    if type(desc) is not ReduceTensorDescriptor or not desc.alive:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, "reduceTensorDesc: not a live reduce-tensor descriptor")
    return desc


@api
def create_reduce_tensor_descriptor():
    """cudnnCreateReduceTensorDescriptor."""
    return ReduceTensorDescriptor()


@api
def set_reduce_tensor_descriptor(reduce_tensor_desc, reduce_tensor_op, reduce_tensor_comp_type,
                                 reduce_tensor_nan_opt, reduce_tensor_indices, reduce_tensor_indices_type):
    """cudnnSetReduceTensorDescriptor. Every argument must be a value of its enum (else BAD_PARAM);
    whether the combination can run is decided by the calls that use the descriptor."""
    d = _live(reduce_tensor_desc)
    op = enum_arg("reduceTensorOp", reduce_tensor_op, OPS, "pydnnReduceTensorOp_t")
    comp = enum_arg("reduceTensorCompType", reduce_tensor_comp_type,
                    tuple(E.ENUMS["pydnnDataType_t"].values()), "pydnnDataType_t")
    nan = enum_arg("reduceTensorNanOpt", reduce_tensor_nan_opt,
                   tuple(E.ENUMS["pydnnNanPropagation_t"].values()), "pydnnNanPropagation_t")
    ind = enum_arg("reduceTensorIndices", reduce_tensor_indices,
                   tuple(E.ENUMS["pydnnReduceTensorIndices_t"].values()), "pydnnReduceTensorIndices_t")
    itype = enum_arg("reduceTensorIndicesType", reduce_tensor_indices_type,
                     tuple(E.ENUMS["pydnnIndicesType_t"].values()), "pydnnIndicesType_t")
    d.op, d.comp_type, d.nan_opt, d.indices, d.indices_type, d.is_set = op, comp, nan, ind, itype, True
    d.version += 1


@api
def get_reduce_tensor_descriptor(reduce_tensor_desc):
    """cudnnGetReduceTensorDescriptor -> (op, compType, nanOpt, indices, indicesType)."""
    d = _live(reduce_tensor_desc)
    return d.op, d.comp_type, d.nan_opt, d.indices, d.indices_type


@api
def destroy_reduce_tensor_descriptor(reduce_tensor_desc):
    """cudnnDestroyReduceTensorDescriptor (None: nothing to do)."""
    if reduce_tensor_desc is None:
        return
    d = _live(reduce_tensor_desc)
    d.alive = False
    d.version += 1


# ----------------------------------------------------------------------------- validation

def _validate(r, a_desc, c_desc):
    """The descriptor, after every check that needs no buffer. Statuses: BAD_PARAM (descriptors, dims),
    NOT_SUPPORTED (types, compute type, indices for this op or of this width)."""
    d = _live(r)
    if not d.is_set:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, "reduceTensorDesc: descriptor was never set")
    float_tensor(a_desc, "aDesc")
    float_tensor(c_desc, "cDesc")
    output_tensor(c_desc, "cDesc")
    ta, tc = TAG[a_desc.dtype], TAG[c_desc.dtype]
    if (ta, tc) not in PAIRS:
        raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED,
                         f"cDesc: data type {tc} with aDesc data type {ta} is not supported (the same type, "
                         "or half/bfloat16 with float)")
    if d.comp_type != E.PYDNN_DATA_FLOAT and not (d.comp_type == E.PYDNN_DATA_DOUBLE and ta == "f64"):
        raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED,
                         f"reduceTensorDesc: compute type {d.comp_type} is not supported with {ta} tensors "
                         "(FLOAT, or DOUBLE for double tensors)")
    if len(a_desc.dims) != len(c_desc.dims):
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"cDesc: has {len(c_desc.dims)} dims, aDesc has {len(a_desc.dims)}")
    for i, (a, c) in enumerate(zip(a_desc.dims, c_desc.dims)):
        if c != a and c != 1:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"cDesc: dim {i} is {c}; it must equal aDesc's ({a}) or be 1")
    if d.indices == E.PYDNN_REDUCE_TENSOR_FLATTENED_INDICES:
        if d.op not in INDEXED:
            raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED,
                             "reduceTensorDesc: indices exist only for the MIN, MAX and AMAX reductions")
        if d.indices_type != E.PYDNN_32BIT_INDICES:
            raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED,
                             f"reduceTensorDesc: indices type {d.indices_type} is not supported (32-bit only)")
        n = a_desc.count // c_desc.count
        if n >= 0x7FFFFFFF:
            raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED,
                             f"reduceTensorDesc: 32-bit indices cannot number a reduced slice of {n} elements")
    return d


# ----------------------------------------------------------------------------- planning

def _merge(order, dims, strides):
    """Collapse dims `order` (outermost first): drop size 1, join a dim into the previous one when every
    operand (strides: one tuple per operand) is dense across the two. -> (sizes, [strides per operand])."""
    sizes, out = [], [[] for _ in strides]
    for i in order:
        n = dims[i]
        if n == 1:
            continue
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
    """`step` written in the mixed radix of `sizes` (outermost first); the outermost digit is unbounded."""
    out = [0] * len(sizes)
    for d in range(len(sizes) - 1, 0, -1):
        out[d] = step % sizes[d]
        step //= sizes[d]
    out[0] = step
    return out


def _segments(threads, units, min_units, target):
    """How many segments to cut each output's units into so that about `target` threads run, each segment
    keeping at least `min_units` units (1: no second pass)."""
    if threads >= target or units < 2 * min_units:
        return 1
    return max(1, min(-(-target // threads), units // min_units, 65535))


class _Launch:
    """One way to run a planned problem: kernel, shapes, the filled parameter struct, workspace bytes."""

    __slots__ = ("kind", "expr", "vec", "params", "argv", "grid", "block", "workspace", "func", "finish",
                 "fgrid")


class _Plan:
    __slots__ = ("launches", "align_mask", "workspace", "indices_bytes", "wants_indices", "need", "unit", "crec",
                 "crec_obj")


def _base_params(d, rows, length, tc, row_sizes, row_strides):
    p = ReduceParams()
    p.rows, p.len, p.op = rows, length, d.op
    p.out_type = OUT_TYPE[tc]
    rs = row_sizes or [1]
    p.row_ndim = len(rs)
    for k, s in enumerate(rs):
        p.row_size[k] = s
        for j in range(3):
            p.row_stride[j][k] = row_strides[j][k] if row_sizes else 0
    p.flags = FLAG_SMALL_ROWS if prod(rs) < 2**32 else 0
    return p


def _finish(lc, rows, segments, want_idx):
    """Segment count, the second pass's group and grid, and the workspace of launch `lc`."""
    p = lc.params
    p.segments = segments
    p.fgroup = min(32, next_pow2(segments))
    lc.workspace = rows * segments * (12 if want_idx else 8) if segments > 1 else 0
    lc.fgrid = (max(1, -(-rows // (BLOCK // p.fgroup))), 1, 1)


def _configs(handle, d, a_desc, c_desc):
    """The launches for this problem: [aligned, unaligned] when the fast one needs a 16-byte aligned A,
    else one launch. Layouts:
      rows_vec  the reduced elements are contiguous in A (one run), or two dims whose inner one is
                contiguous and whose runs are whole aligned vectors;
      cols      A's innermost kept dim has a smaller stride than every reduced dim (e.g. reducing N, H,
                W of NHWC, or N of NCHW): threads run along the kept dim; at most two reduce dims;
      rows_gen  the rest.
    Indices need the reduce dims in A's dim order (flat index = walk order); without them they are taken
    in memory order, which lets more layouts collapse."""
    want_idx = d.indices == E.PYDNN_REDUCE_TENSOR_FLATTENED_INDICES
    ta, tc = TAG[a_desc.dtype], TAG[c_desc.dtype]
    vec = vec_width(ta, ta)
    nd = len(a_desc.dims)
    dims, astr, cst = a_desc.dims, a_desc.strides, c_desc.strides
    ist = [1] * nd  # indices: packed row-major in C's dims
    for i in range(nd - 2, -1, -1):
        ist[i] = ist[i + 1] * c_desc.dims[i + 1]
    kept = sorted((i for i in range(nd) if c_desc.dims[i] != 1), key=lambda i: -astr[i])
    red = [i for i in range(nd) if c_desc.dims[i] == 1]
    if not want_idx:
        red.sort(key=lambda i: -astr[i])
    ksz, (kst, kcs, kis) = _merge(kept, dims, (astr, cst, ist))
    rsz, (rst,) = _merge(red, dims, (astr,))
    rows, length = prod(ksz), prod(rsz)
    if not rsz:  # nothing reduced: each output reads one element
        rsz, rst = [1], [1]
    target = handle.sm_count * 2048
    op = KERNEL_OP[d.op]
    launches = []

    def rows_launch(kind, v, units, red_sizes, red_strides, G):
        lc = _Launch()
        lc.kind, lc.vec = kind, v
        p = lc.params = _base_params(d, rows, length, tc, ksz, (kcs, kst, kis))
        segments = _segments(rows * G, units, G * UNROLL * tuning.reduce.SEG_ROUNDS, target)
        p.group, p.units = G, units
        p.chunk = -(-units // segments) if units else 0
        segments = -(-units // p.chunk) if units else 1
        p.red_ndim = len(red_sizes)
        for k, (s, st) in enumerate(zip(red_sizes, red_strides)):
            p.red_size[k], p.red_stride[k] = s, st
        dg = _digits(G, red_sizes)
        for k, s in enumerate(dg):
            p.red_step[k] = s
        p.step_off = sum(s * st for s, st in zip(dg, red_strides))
        if len(red_sizes) == 2:
            p.wrap_off = red_strides[0] - red_sizes[1] * red_strides[1]
        _finish(lc, rows, segments, want_idx)
        lc.grid = (max(1, -(-(rows * segments) // (BLOCK // G))), 1, 1)
        lc.block = (BLOCK, 1, 1)
        lc.expr = (_expr("rows_vec", ta, op, want_idx) if kind == "rows_vec" else _expr("rows_gen", ta))
        return lc

    def row_group(units):  # (ROW_ROUNDS rounds of UNROLL loads per thread; see tuning.reduce.ROW_ROUNDS)
        if units <= 0:
            return 1
        wide = tuning.reduce.ROW_ROUNDS_WIDE
        if wide:  # many rows: fewer threads a row, more loads each (see ROW_ROUNDS_WIDE above)
            g = min(BLOCK, next_pow2(-(-units // (wide * UNROLL))))
            if g >= WIDE_MIN_GROUP and rows * g >= target:
                return g
        return min(BLOCK, next_pow2(-(-units // (tuning.reduce.ROW_ROUNDS * UNROLL))))

    def cols_launch(v):
        lc = _Launch()
        lc.kind, lc.vec = "cols", v
        K = ksz[-1]
        kv = K // v
        outer_sz = ksz[:-1]
        p = lc.params = _base_params(d, rows, length, tc, outer_sz, (kcs[:-1], kst[:-1], kis[:-1]))
        p.flags = FLAG_SMALL_ROWS if prod(outer_sz) < 2**32 else 0
        p.cols = K
        p.col_stride[0], p.col_stride[1], p.col_stride[2] = kcs[-1], kst[-1], kis[-1]
        R = length
        if kv < 32:
            P = 1
            while P * 2 * kv <= 32:
                P *= 2
        else:
            P = 1
        by = max(1, min(8, next_pow2(-(-R // (P * UNROLL * 2)))))
        bx = 32 if P > 1 else min(BLOCK // by, max(32, next_pow2(kv)))
        tiles = 1 if P > 1 else -(-kv // bx)
        blocks = (rows // K) * tiles
        S = P * by
        segments = _segments(blocks * bx * by, R, S * UNROLL * tuning.reduce.SEG_ROUNDS, target)
        p.pack, p.tiles, p.units = P, tiles, R
        p.chunk = -(-R // segments)
        segments = -(-R // p.chunk)
        p.red_ndim = len(rsz)
        for k, (s, st) in enumerate(zip(rsz, rst)):
            p.red_size[k], p.red_stride[k] = s, st
        dg = _digits(S, rsz)
        for k, s in enumerate(dg):
            p.red_step[k] = s
        p.step_off = sum(s * st for s, st in zip(dg, rst))
        if len(rsz) == 2:
            p.wrap_off = rst[0] - rsz[1] * rst[1]
        _finish(lc, rows, segments, want_idx)
        lc.grid = (blocks * segments, 1, 1)
        lc.block = (bx, by, 1)
        lc.expr = _expr("cols", ta, op, want_idx, v)
        return lc

    def gen_launch():
        G = 1 if (ksz and kst[-1] < rst[-1]) else row_group(length)  # G = 1: neighbouring outputs coalesce
        return rows_launch("rows_gen", 1, length, rsz, rst, G)

    sr = rst[-1]
    if sr == 1 and len(rsz) == 1:
        units = length // vec
        launches.append(rows_launch("rows_vec", vec, units, [units], [vec], row_group(units)))
    elif (sr == 1 and len(rsz) == 2 and rsz[1] % vec == 0 and rst[0] % vec == 0
          and all(s % vec == 0 for s in kst)):
        units = length // vec
        launches += [rows_launch("rows_vec", vec, units, [rsz[0], rsz[1] // vec], [rst[0], vec],
                                 row_group(units)), gen_launch()]
    elif ksz and kst[-1] < sr and len(rsz) <= 2:
        if (kst[-1] == 1 and ksz[-1] % vec == 0 and all(s % vec == 0 for s in kst[:-1])
                and all(s % vec == 0 for s in rst)):
            launches += [cols_launch(vec), cols_launch(1)]
        else:
            launches.append(cols_launch(1))
    else:
        launches.append(gen_launch())
    return launches, want_idx, rows


def _plan(handle, r, a_desc, c_desc):
    d = _validate(r, a_desc, c_desc)
    launches, want_idx, rows = _configs(handle, d, a_desc, c_desc)
    pl = _Plan()
    pl.launches = launches
    pl.align_mask = 15 if len(launches) > 1 else 0
    pl.workspace = max(lc.workspace for lc in launches)
    if pl.workspace % WS_ALIGN:
        pl.workspace += WS_ALIGN - pl.workspace % WS_ALIGN
    pl.wants_indices = want_idx
    pl.indices_bytes = rows * 4 if want_idx else 0
    pl.need = (c_desc.span_bytes(), a_desc.span_bytes())
    ta = TAG[a_desc.dtype]
    pl.unit = f"reduce.{_ew.ktag(ta)}"
    for lc in launches:
        if ta == "bf16":
            lc.params.flags |= FLAG_IN_BF16
        lc.argv = driver.kernel_args(lc.params)
        lc.func = lc.finish = None
    return pl


def _get_plan(handle, r, a_desc, c_desc, with_functions=True):
    key = desc_key("reduce", r, a_desc, c_desc)
    pl = handle.prepared.get(key) if key is not None else None
    if pl is None:
        pl = _plan(handle, r, a_desc, c_desc)
        if not with_functions:
            return pl
        tag = TAG[a_desc.dtype]
        for lc in pl.launches:
            lc.func = handle.function(pl.unit, lc.expr)
            lc.finish = handle.function(pl.unit, _expr("reduce_finish", tag))
        if not _ew._entries_tried:  # the compiled entries, where no element-wise record set them up yet
            _ew.plan_entries(pl.launches[0].func)
        if key is not None:
            handle.remember(key, pl)
    return pl


def plan_summary(handle, reduce_tensor_desc, a_desc, c_desc):
    """For tests and tuning: [(kernel, vec, group or (bx, by, pack), segments, grid)] of each launch of
    this problem, aligned launch first. Loads no kernel."""
    check_handle(handle)
    pl = _plan(handle, reduce_tensor_desc, a_desc, c_desc)
    out = []
    for lc in pl.launches:
        p = lc.params
        shape = (lc.block[0], lc.block[1], p.pack) if lc.kind == "cols" else p.group
        out.append((lc.kind, lc.vec, shape, p.segments, lc.grid[0]))
    return out


# ----------------------------------------------------------------------------- API

@api
def get_reduction_indices_size(handle, reduce_tensor_desc, a_desc, c_desc):
    """cudnnGetReductionIndicesSize: 4 bytes per element of C with FLATTENED_INDICES, else 0."""
    check_handle(handle)
    return _get_plan(handle, reduce_tensor_desc, a_desc, c_desc, with_functions=False).indices_bytes


@api
def get_reduction_workspace_size(handle, reduce_tensor_desc, a_desc, c_desc):
    """cudnnGetReductionWorkspaceSize: device bytes reduce_tensor needs (0 when one pass suffices: long
    reductions into few outputs take two passes through per-segment partials)."""
    check_handle(handle)
    return _get_plan(handle, reduce_tensor_desc, a_desc, c_desc, with_functions=False).workspace


@api
def reduce_tensor(handle, reduce_tensor_desc, indices, indices_size_in_bytes, workspace, workspace_size_in_bytes,
                  alpha, a_desc, A, beta, c_desc, C):  # noqa: N803 - cuDNN's names
    """cudnnReduceTensor: C = alpha * reduce(A) + beta * C; indices for MIN/MAX/AMAX when the descriptor
    asks for them. Statuses: BAD_PARAM (descriptors, dims, sizes: indicesSizeInBytes or
    workspaceSizeInBytes too small; BAD_PARAM_NULL_POINTER / BAD_PARAM_MISALIGNED_POINTER for buffers),
    NOT_SUPPORTED (type pairs, compute type, indices for other ops or wider than 32 bits)."""
    if type(handle) is not Handle or not handle.alive:
        check_handle(handle)
    try:  # desc_key's, inline (the hot path)
        key = ("reduce", (reduce_tensor_desc, reduce_tensor_desc.version), (a_desc, a_desc.version),
               (c_desc, c_desc.version))
    except AttributeError:
        key = desc_key("reduce", reduce_tensor_desc, a_desc, c_desc)
    pl = handle.prepared.get(key) if key is not None else None
    al = alpha if type(alpha) is float else scalar("alpha", alpha)
    be = beta if type(beta) is float else scalar("beta", beta)
    isz = indices_size_in_bytes
    if type(isz) is not int or isz < 0:
        isz = _size("indicesSizeInBytes", isz)
    wsz = workspace_size_in_bytes
    if type(wsz) is not int or wsz < 0:
        wsz = _size("workspaceSizeInBytes", wsz)
    if pl is None:  # validate sizes and buffers before any kernel is loaded
        _buffers(_get_plan(handle, reduce_tensor_desc, a_desc, c_desc, with_functions=False), indices, isz,
                 workspace, wsz, A, C)
        pl = _get_plan(handle, reduce_tensor_desc, a_desc, c_desc)
    ind, ws, out, inp = _buffers(pl, indices, isz, workspace, wsz, A, C)
    lc = pl.launches[0] if (inp & pl.align_mask) == 0 else pl.launches[-1]
    p = lc.params
    p.indices, p.workspace, p.out, p.in_ = ind, ws, out, inp
    p.alpha, p.beta = al, be
    p.flags = (p.flags & KEEP_FLAGS) | (FLAG_BETA if be != 0 else 0) | \
        (FLAG_NAN_PROP if reduce_tensor_desc.nan_opt else 0)
    driver.launch_args(lc.func, lc.grid, lc.block, 0, handle.cu_stream, lc.argv)
    if p.segments > 1:
        driver.launch_args(lc.finish, lc.fgrid, (BLOCK, 1, 1), 0, handle.cu_stream, lc.argv)
    if _ew.note is not None and key is not None:  # the compiled entry keeps this call site (ew._setup_entries)
        _note(pl, reduce_tensor_desc)


_py_reduce_tensor = reduce_tensor  # the Python function behind the compiled entry (ew._setup_entries)


def _note(pl, d):
    """The plan's C record (made once: the launch above's fields, its second pass where it has one, the workspace's
    need and alignment; never in C with indices) noted for the compiled entry."""
    try:
        pl.crec
    except AttributeError:
        fastcall.plan_record(pl, ("out", "in_", "indices", "workspace"), ReduceParams, KEEP_FLAGS, FLAG_BETA,
                             isz=0, align=2,
                             finish=lambda lc: ((lc.finish, lc.fgrid, (BLOCK, 1, 1)) if lc.params.segments > 1
                                                else None),
                             flags_or=FLAG_NAN_PROP if d.nan_opt else 0, ws_need=pl.workspace, ws_align=WS_ALIGN,
                             decline=pl.wants_indices)
    _ew.note(_ew.K_REDUCE, pl, 1, False, False)


def _buffers(pl, indices, isz, workspace, wsz, A, C):  # noqa: N803
    """(indices, workspace, C, A) device addresses, each checked against what the plan needs."""
    ind = ws = 0
    if pl.wants_indices:
        if isz < pl.indices_bytes:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                             f"indicesSizeInBytes: {isz} is less than the {pl.indices_bytes} bytes needed")
        ind = device_ptr(indices, "indices", pl.indices_bytes)
        if ind % 4:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER,
                             f"indices: {ind:#x} is not 4-byte aligned")
    if pl.workspace:
        if wsz < pl.workspace:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                             f"workspaceSizeInBytes: {wsz} is less than the {pl.workspace} bytes needed")
        ws = device_ptr(workspace, "workspace", pl.workspace)
        if ws % WS_ALIGN:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER,
                             f"workspace: {ws:#x} is not {WS_ALIGN}-byte aligned")
    return ind, ws, device_ptr(C, "C", pl.need[0]), device_ptr(A, "A", pl.need[1])


def _size(name, v):
    i = v if type(v) is int else index_of(v)  # a plain int without a call: this runs on every call
    if i is None or i < 0:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: {v!r} is not a size in bytes")
    return i

# the compiled entries over this module's Python functions (_elementwise._setup_entries)
_ew.register_entries(sys.modules[__name__], "reduce_tensor")
