"""Tensor ops: cudnnSetTensor, cudnnScaleTensor, cudnnAddTensor, cudnnOpTensor (+ its descriptor),
cudnnTransformTensor. Element-wise maps (common/elementwise.cuh with the functors of ptx/tensor_ops.cu),
plus a tiled transpose kernel for transforms between layouts whose dense dims differ (NCHW <-> NHWC).

Data types
- SetTensor, TransformTensor: all eight (float, double, half, bfloat16, int8, uint8, int32, int64).
  Conversions to integers round to nearest even and saturate; NaN becomes 0. A transform between one type
  with alpha 1 and beta 0 copies bits (exact for every int64 and NaN payload); otherwise arithmetic is in
  float, or double where either side is double, int32 or int64.
- ScaleTensor, AddTensor, OpTensor: float, double, half and bfloat16, every tensor of one type (float
  arithmetic for half and bfloat16). OpTensor's compute type is FLOAT for float, half and bfloat16 data
  and DOUBLE for double data (cuDNN's table); other pairings and mixed data types are NOT_SUPPORTED.

Broadcasting (cuDNN's rule): a broadcast input has as many dims as C and each dim equals C's or is 1.
AddTensor's A and OpTensor's A and B may broadcast.

Statuses: BAD_PARAM (a descriptor not live or never set, dims that differ or do not broadcast, different
data types where one is required, an output whose strides make elements overlap, a bad enum or scalar),
BAD_PARAM_NULL_POINTER (a NULL data pointer), NOT_SUPPORTED (a data type or type combination pydnn does
not implement), EXECUTION_FAILED_CUDA_DRIVER (the launch failed).
"""
import ctypes
import math
import sys

import numpy as np

from .. import enums as E
from .. import tuning
from .._build.manifest import KernelUnit
from .._build.params import FLAG_NAN_PROP, MapParams
from .._cuda import driver
from ..buffers import device_ptr
from .. import buffers as _buffers
from ..handle import Handle, check_handle
from ..status import PydnnError, api
from ..tensor import DTYPE_NAMES, DTYPES, check_tensor, index_of
from . import _elementwise as ew
from .common import FLOAT_TAGS, TAG, enum_arg, float_tensor, output_tensor, scalar

ALL_TAGS = ("f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64")
INT_RANGE = {"i8": (-128, 127), "u8": (0, 255), "i32": (-(1 << 31), (1 << 31) - 1),
             "i64": (-(1 << 63), (1 << 63) - 1)}
SIZE = {"f32": 4, "f64": 8, "f16": 2, "bf16": 2, "i8": 1, "u8": 1, "i32": 4, "i64": 8}
OPS = {E.PYDNN_OP_TENSOR_ADD: "pydnn::tensor::OpAdd", E.PYDNN_OP_TENSOR_MUL: "pydnn::tensor::OpMul",
       E.PYDNN_OP_TENSOR_MIN: "pydnn::tensor::OpMin", E.PYDNN_OP_TENSOR_MAX: "pydnn::tensor::OpMax",
       E.PYDNN_OP_TENSOR_SQRT: "pydnn::tensor::OpSqrt", E.PYDNN_OP_TENSOR_NOT: "pydnn::tensor::OpNot"}
UNARY = (E.PYDNN_OP_TENSOR_SQRT, E.PYDNN_OP_TENSOR_NOT)
SET, SCALED, COPY = "pydnn::tensor::Set", "pydnn::tensor::Scaled", "pydnn::tensor::Copy"

TILE = 64            # transpose tile edge (kTile in ptx/tensor_ops.cu)
MAX_GRID_YZ = 65535  # grid.y / grid.z limit
# The tiled transpose serves dense dims of at least this many elements on both sides; with fewer (NHWC
# with 3 channels, say) most of a tile would idle and the generic strided map does better.
MIN_TRANSPOSE_EXTENT = 16
# Rows with a broadcast row (map_rows in ptx/tensor_ops.cu; AddTensor's bias 1 x H onto R x H, OpTensor with
# such an input): blocks of ROWS_THREADS threads as tr x tc (tc covering the row's vectors), ROWS rows per
# thread, the broadcast row's vector loaded once for them, 16-byte vectors, streaming loads / stores of the
# other operands. Why: map_strided (offsets from coordinates per element, the bias re-read per element)
# ran at 0.42-0.46x PyTorch on bf16 / fp16 bias adds in the issue-20 sweep (H200).
# BROADCAST_ROWS: a switch, pydnn.tuning.tensor_ops.BROADCAST_ROWS (default True)
ROWS_THREADS, ROWS_ROWS = 128, 4
# Rows whose length (or a row stride) is not a multiple of the vector: map_rows with 1-element accesses
# (still coalesced along the row, the broadcast element loaded once per thread for its rows, no per-element
# index division) in blocks of ROWS1_THREADS, ROWS1_ROWS rows per thread (more loads in flight for the
# narrow accesses). Why: map_strided ran AddTensor bias 8659 x 50083 fp32 at 0.49x PyTorch (33% of copy;
# H200, tools/sweep_memory.py).
# BROADCAST_ROWS_SCALAR: a switch, pydnn.tuning.tensor_ops.BROADCAST_ROWS_SCALAR (default True)
ROWS1_THREADS, ROWS1_ROWS = 256, 8
ROWS_OPS = ("pydnn::tensor::Scaled", "pydnn::tensor::OpAdd", "pydnn::tensor::OpMul")
ROWS_TAGS = ("f32", "f16", "bf16")  # (double keeps map_strided: its instantiations are first-use ones)
# Dense (same-shape) ScaleTensor / AddTensor / OpTensor whose operands together fit in
# tuning.tensor_ops.PLAIN_BYTES take map_contig with the plain cache policy (HINT 0, unit
# tensor_ops.plain.<t>) instead of the evict-first streaming one. Why: the issue-20 sweep (H200, warm
# cache as every benchmark and the next kernel of a model see it) had OpTensor ADD 82918 x 64 bf16 (3 x
# 10.6 MB) at 0.74x PyTorch and 13423 x 160 fp32 (3 x 8.6 MB) at 0.85x: PyTorch's 6.2-6.5 us is above
# DRAM bandwidth (its operands stay in the 50 MB L2), while evict-first lines are the first to go. For
# operands larger than L2 streaming measured +0.3-0.8% (tools/PERF.md, Element-wise, 256 MiB operands), so it
# stayed there until session 32: the plain policy beyond L2 too (PLAIN_BYTES 1 TiB: every dense map). Measured
# (session 32 mid-session run, H200, tools/bench_memory_points.py, same process, eager ms streaming / plain,
# PyTorch in the same run): OpTensor ADD fp32 5070 x 32768 (3 x 665 MB) 0.4850 / 0.4602 (0.951x -> 1.001x), bf16
# 107126 x 2493 0.3857 / 0.3698 (0.959x -> 0.999x), fp16 7167 x 8272 0.0902 / 0.0842 (0.935x -> 1.001x).
PLAIN_TAGS = ROWS_TAGS
PLAIN_OPS = (SCALED, *OPS.values())


def transpose_exprs(op, ti, to):
    """The tiled-transpose instantiations of `op` from ti to to: 16-byte accesses, one element per access."""
    ci, co = ew.MAP_CTYPE[ti], ew.MAP_CTYPE[to]
    return (f"pydnn::tensor::transpose<{ci}, {co}, {op}, true>",
            f"pydnn::tensor::transpose<{ci}, {co}, {op}, false>")


def rows_expr(op, t, vec=None):
    """map_rows for op on type t: 16-byte vectors, or (vec 1) the scalar variant."""
    if vec == 1:
        return f"pydnn::tensor::map_rows<{ew.MAP_CTYPE[t]}, {ew.MAP_CTYPE[t]}, {op}, 1, {ROWS1_THREADS}, {ROWS1_ROWS}>"
    return (f"pydnn::tensor::map_rows<{ew.MAP_CTYPE[t]}, {ew.MAP_CTYPE[t]}, {op}, {ew.vec_width(t, t)}, {ROWS_THREADS}, "
            f"{ROWS_ROWS}>")


def rows_shape(vec):
    """(threads, rows per thread) of map_rows at this vector width."""
    return (ROWS1_THREADS, ROWS1_ROWS) if vec == 1 else (ROWS_THREADS, ROWS_ROWS)


def plain_unit(t, c_desc, in_descs):
    """The unit of the plain-cache map_contig for a dense map of type t whose operands fit in
    tuning.tensor_ops.PLAIN_BYTES, else None (prepare_map's plain_unit)."""
    if t not in PLAIN_TAGS or not ew.plain_fits(c_desc, in_descs, tuning.tensor_ops.PLAIN_BYTES):
        return None
    return f"tensor_ops.plain.{ew.ktag(t)}"


def _broadcast_rows(handle, unit, op, t, pr, c_desc, in_descs):
    """Route a prepared map whose problem is rows with a broadcast row to map_rows (16-byte aligned
    pointers; map_strided stays the launch for the others). Returns pr."""
    if not tuning.tensor_ops.BROADCAST_ROWS or op not in ROWS_OPS or t not in ROWS_TAGS:
        return pr
    ndim, sizes, strides, dense = ew.plan(c_desc.dims, c_desc.strides, tuple((d.dims, d.strides) for d in in_descs))
    vec = ew.vec_width(t, t)
    if dense or ndim != 2:
        return pr
    if any(st[1] != 1 or st[0] < 0 for st in strides) or strides[0][0] == 0:
        return pr
    if not any(st[0] == 0 for st in strides[1:]):
        return pr
    if sizes[1] % vec or any(st[0] % vec for st in strides):
        if not tuning.tensor_ops.BROADCAST_ROWS_SCALAR:
            return pr
        vec = 1  # (the scalar variant: any row length and strides; its pointers need no alignment)
    threads, rows = rows_shape(vec)
    hv = sizes[1] // vec
    tc = 1
    while tc < hv and tc < threads:
        tc *= 2
    grid = -(-hv // tc) * -(-sizes[0] // (threads // tc * rows))
    if grid > 2**31 - 1 or hv >= 2**31:
        return pr
    pr.vec_func = handle.function(f"tensor_ops.rows.{ew.ktag(t)}", rows_expr(op, t, vec))
    pr.vec_grid, pr.vec_block = (grid, 1, 1), (threads, 1, 1)
    pr.in_masks = pr.out_mask = 15 if vec > 1 else 0
    pr.crec = None
    return pr


def kernel_units():
    """tensor_ops.<t>: SetTensor for every type; ScaleTensor / AddTensor / OpTensor for float types.
    tensor_ops.transform.<ti>: TransformTensor from ti to each type (map and transpose kernels), and the
    bit copy of ti. One unit per type keeps the units of similar size for the parallel build. Half and bfloat16
    share the h16 units (pydnn::h16_t, the formats launch flags: _elementwise.fmt_flags)."""
    units = []
    tags = ew.unit_tags(ALL_TAGS)  # (f16 stands for both 16-bit types: ew.ktag)
    for t in tags:
        k = ew.ktag(t)
        exprs = list(ew.map_exprs(SET, t))
        if t in FLOAT_TAGS:
            for op in (SCALED, *OPS.values()):
                exprs += ew.map_exprs(op, t)
        units.append(KernelUnit(f"tensor_ops.{k}", "tensor_ops.cu", tuple(exprs)))
        if t in ROWS_TAGS:  # map_rows: a unit of its own (ptx/tensor_ops_rows.cu)
            units.append(KernelUnit(f"tensor_ops.rows.{k}", "tensor_ops_rows.cu",
                                    tuple(rows_expr(op, t, v) for op in ROWS_OPS for v in (None, 1))))
        if t in PLAIN_TAGS:  # map_contig with the plain cache policy (see PLAIN_TAGS): a unit of its own
            units.append(KernelUnit(f"tensor_ops.plain.{k}", "tensor_ops.cu",
                                    tuple(ew.contig_expr(op, t, hint=0) for op in PLAIN_OPS)))
    for ti in tags:
        exprs = []
        for to in tags:
            exprs += ew.map_exprs(SCALED, ti, to) + transpose_exprs(SCALED, ti, to)
        exprs += ew.map_exprs(COPY, ti) + transpose_exprs(COPY, ti, ti)
        units.append(KernelUnit(f"tensor_ops.transform.{ew.ktag(ti)}", "tensor_ops.cu", tuple(exprs)))
    return units


# ------------------------------------------------------------------------------------------ checks
def _any_tensor(desc, name):
    check_tensor(desc, name)
    if desc.dtype not in DTYPES:
        raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED, f"{name}: data type {desc.dtype} is not supported")
    return desc


def _broadcast(src, sname, dst, dname):
    """Each dim of src equals dst's or is 1 (cuDNN's broadcast rule), with as many dims."""
    if len(src.dims) != len(dst.dims):
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                         f"{sname}: has {len(src.dims)} dims, {dname} has {len(dst.dims)}")
    for i, (a, c) in enumerate(zip(src.dims, dst.dims)):
        if a != c and a != 1:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                             f"{sname}: dim {i} is {a}; it must equal {dname}'s ({c}) or be 1")


def _type_name(dtype):
    return DTYPE_NAMES.get(dtype, str(dtype))


# ------------------------------------------------------------------------------------------ SetTensor
def _round_float(t, f):
    """f rounded to float type t (so the kernel's own conversion of it is exact)."""
    with np.errstate(all="ignore"):
        if t == "f32":
            return float(np.float32(f))
        if t == "f16":
            return float(np.float16(f))
        if t == "bf16":
            x = np.array([f], np.float32)
            u = x.view(np.uint32).astype(np.uint64)
            if np.isnan(x[0]):
                return float("nan")
            bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
            return float(bits.astype(np.uint32).view(np.float32)[0])
    return f


def _fill_value(t, value):
    """SetTensor's value in y's type: an int for integer types (rounded to nearest even, saturated, NaN
    -> 0, like every conversion to an integer), else a float already rounded to the type."""
    if t in INT_RANGE:
        v = index_of(value)
        if v is None:
            f = scalar("valuePtr", value)
            if math.isnan(f):
                v = 0
            elif math.isinf(f):
                v = INT_RANGE[t][0] if f < 0 else INT_RANGE[t][1]
            else:
                v = round(f)  # half to even
        lo, hi = INT_RANGE[t]
        return min(max(v, lo), hi)
    i = index_of(value)
    if i is not None:
        try:
            f = float(i)
        except OverflowError:  # beyond every float type: rounds to infinity
            f = math.inf if i > 0 else -math.inf
        return _round_float(t, f)
    return _round_float(t, scalar("valuePtr", value))


_COEF_OFFSET = MapParams.coef.offset


@api
def set_tensor(handle, y_desc, y, value):
    """cudnnSetTensor: every element of y = value (a number; the C face reads it in y's data type).
    Any of the eight data types, any strides. BAD_PARAM, BAD_PARAM_NULL_POINTER."""
    check_handle(handle)

    def build():
        _any_tensor(y_desc, "yDesc")
        output_tensor(y_desc, "yDesc")
        device_ptr(y, "y", y_desc.span_bytes())
        t = TAG[y_desc.dtype]
        return ew.prepare_map(handle, f"tensor_ops.{ew.ktag(t)}", SET, t, t, y_desc, ())

    t = TAG.get(getattr(y_desc, "dtype", None))
    v = _fill_value(t, value) if t is not None else scalar("valuePtr", value)
    rec = ew.cached(handle, ew.desc_key("set", y_desc), build)
    if t == "i64":  # the kernel takes the value's 64 bits from coef (a double cannot hold every int64)
        ctypes.c_int64.from_address(ctypes.addressof(rec.params) + _COEF_OFFSET).value = v
    else:
        rec.params.coef = float(v)
    ew.run_map(handle, rec, device_ptr(y, "y", rec.need[0]), (), 1.0, 0.0)


# ------------------------------------------------------------------------------ Scale / Add
@api
def scale_tensor(handle, y_desc, y, alpha):
    """cudnnScaleTensor: y = alpha * y. Float types. BAD_PARAM, BAD_PARAM_NULL_POINTER, NOT_SUPPORTED."""
    if type(handle) is not Handle or not handle.alive:
        check_handle(handle)

    def build():
        float_tensor(y_desc, "yDesc")
        output_tensor(y_desc, "yDesc")
        device_ptr(y, "y", y_desc.span_bytes())
        t = TAG[y_desc.dtype]
        return ew.prepare_map(handle, f"tensor_ops.{ew.ktag(t)}", SCALED, t, t, y_desc, (y_desc,),
                              plain_unit=plain_unit(t, y_desc, (y_desc,)))

    al = alpha if type(alpha) is float else scalar("alpha", alpha)
    try:
        key = ("scale", (y_desc, y_desc.version))
    except AttributeError:
        key = ew.desc_key("scale", y_desc)
    rec = handle.prepared.get(key) if key is not None else None
    if rec is None:
        rec = ew.cached(handle, key, build)
    yp = y if type(y) is int and y > 0 and not _buffers.CHECKED else device_ptr(y, "y", rec.need[0])
    ew.run_map(handle, rec, yp, (yp,), al, 0.0)
    if ew.note is not None and key is not None:  # the compiled entry keeps this call site (ew._setup_entries)
        ew.note(ew.K_SCALE, rec, 1, False, False)


_py_scale_tensor = scale_tensor  # the Python function behind the compiled entry (ew._setup_entries)


@api
def add_tensor(handle, alpha, a_desc, A, beta, c_desc, C):  # noqa: N803 - cuDNN's names
    """cudnnAddTensor: C = alpha * A + beta * C; A has C's data type and broadcasts where its dims are 1
    (a bias 1xCx1x1 onto NxCxHxW). Float types. BAD_PARAM, BAD_PARAM_NULL_POINTER, NOT_SUPPORTED."""
    if type(handle) is not Handle or not handle.alive:
        check_handle(handle)

    def build():
        float_tensor(a_desc, "aDesc")
        float_tensor(c_desc, "cDesc")
        if a_desc.dtype != c_desc.dtype:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                             f"aDesc: data type {_type_name(a_desc.dtype)} differs from cDesc's "
                             f"({_type_name(c_desc.dtype)})")
        _broadcast(a_desc, "aDesc", c_desc, "cDesc")
        output_tensor(c_desc, "cDesc")
        device_ptr(A, "A", a_desc.span_bytes())
        device_ptr(C, "C", c_desc.span_bytes())
        t = TAG[c_desc.dtype]
        pr = ew.prepare_map(handle, f"tensor_ops.{ew.ktag(t)}", SCALED, t, t, c_desc, (a_desc,),
                            plain_unit=plain_unit(t, c_desc, (a_desc,)))
        return _broadcast_rows(handle, f"tensor_ops.{ew.ktag(t)}", SCALED, t, pr, c_desc, (a_desc,))

    al = alpha if type(alpha) is float else scalar("alpha", alpha)
    be = beta if type(beta) is float else scalar("beta", beta)
    try:
        key = ("add", (a_desc, a_desc.version), (c_desc, c_desc.version))
    except AttributeError:
        key = ew.desc_key("add", a_desc, c_desc)
    rec = handle.prepared.get(key) if key is not None else None
    if rec is None:
        rec = ew.cached(handle, key, build)
    checked = _buffers.CHECKED
    cp = C if type(C) is int and C > 0 and not checked else device_ptr(C, "C", rec.need[0])
    ap = A if type(A) is int and A > 0 and not checked else device_ptr(A, "A", rec.need[1])
    ew.run_map(handle, rec, cp, (ap,), al, be)
    if ew.note is not None and key is not None:  # the compiled entry keeps this call site (ew._setup_entries)
        ew.note(ew.K_ADD, rec, 1, False, False)


_py_add_tensor = add_tensor  # the Python function behind the compiled entry (ew._setup_entries)


# ------------------------------------------------------------------------------ OpTensor
class OpTensorDescriptor:
    """cudnnOpTensorDescriptor_t."""

    __slots__ = ("op", "comp_type", "nan_opt", "is_set", "alive", "version")

    def __init__(self):
        self.op, self.comp_type, self.nan_opt = E.PYDNN_OP_TENSOR_ADD, E.PYDNN_DATA_FLOAT, E.PYDNN_NOT_PROPAGATE_NAN
        self.is_set, self.alive, self.version = False, True, 0


def _live_op(desc):
    if type(desc) is not OpTensorDescriptor or not desc.alive:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, "opTensorDesc: not a live op-tensor descriptor")
    return desc


@api
def create_op_tensor_descriptor():
    """cudnnCreateOpTensorDescriptor."""
    return OpTensorDescriptor()


@api
def set_op_tensor_descriptor(op_tensor_desc, op_tensor_op, op_tensor_comp_type, op_tensor_nan_opt):
    """cudnnSetOpTensorDescriptor. opTensorOp: ADD, MUL, MIN, MAX, SQRT, NOT; opTensorCompType: FLOAT or
    DOUBLE (the only compute types of cuDNN's OpTensor); opTensorNanOpt: MIN / MAX with a NaN operand
    return NaN (PROPAGATE_NAN) or the other operand (NOT_PROPAGATE_NAN). BAD_PARAM otherwise."""
    d = _live_op(op_tensor_desc)
    op = enum_arg("opTensorOp", op_tensor_op, OPS, "pydnnOpTensorOp_t")
    comp = enum_arg("opTensorCompType", op_tensor_comp_type, (E.PYDNN_DATA_FLOAT, E.PYDNN_DATA_DOUBLE),
                    "compute type (FLOAT or DOUBLE)")
    nan = enum_arg("opTensorNanOpt", op_tensor_nan_opt, (E.PYDNN_NOT_PROPAGATE_NAN, E.PYDNN_PROPAGATE_NAN),
                   "pydnnNanPropagation_t")
    d.op, d.comp_type, d.nan_opt, d.is_set = op, comp, nan, True
    d.version += 1


@api
def get_op_tensor_descriptor(op_tensor_desc):
    """cudnnGetOpTensorDescriptor -> (opTensorOp, opTensorCompType, opTensorNanOpt)."""
    d = _live_op(op_tensor_desc)
    return d.op, d.comp_type, d.nan_opt


@api
def destroy_op_tensor_descriptor(op_tensor_desc):
    """cudnnDestroyOpTensorDescriptor (None: nothing to do)."""
    if op_tensor_desc is None:
        return
    d = _live_op(op_tensor_desc)
    d.alive = False
    d.version += 1


@api
def op_tensor(handle, op_tensor_desc, alpha1, a_desc, A, alpha2, b_desc, B, beta, c_desc, C):  # noqa: N803
    """cudnnOpTensor: C = op(alpha1 * A, alpha2 * B) + beta * C for ADD, MUL, MIN, MAX; C = op(alpha1 * A)
    + beta * C for SQRT and NOT (1 - x), which ignore B and bDesc (None allowed). A and B have C's dims or 1
    where they broadcast. A, B and C of one float type; C may be the same buffer as A or B (same layout).
    BAD_PARAM, BAD_PARAM_NULL_POINTER, NOT_SUPPORTED (other type combinations, compute type mismatch)."""
    if type(handle) is not Handle or not handle.alive:
        check_handle(handle)
    unary = getattr(op_tensor_desc, "op", None) in UNARY

    def build():
        d = _live_op(op_tensor_desc)
        if not d.is_set:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, "opTensorDesc: descriptor was never set")
        check_tensor(a_desc, "aDesc")
        if not unary:
            check_tensor(b_desc, "bDesc")
        check_tensor(c_desc, "cDesc")
        float_tensor(c_desc, "cDesc")
        ins = ((a_desc, "aDesc"),) if unary else ((a_desc, "aDesc"), (b_desc, "bDesc"))
        for desc, name in ins:
            if desc.dtype != c_desc.dtype:
                raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED,
                                 f"{name}: data type {_type_name(desc.dtype)} with cDesc's "
                                 f"{_type_name(c_desc.dtype)}: pydnn's OpTensor takes A, B and C of one type")
        want = E.PYDNN_DATA_DOUBLE if c_desc.dtype == E.PYDNN_DATA_DOUBLE else E.PYDNN_DATA_FLOAT
        if d.comp_type != want:
            raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED,
                             f"opTensorDesc: compute type {_type_name(d.comp_type)} does not serve "
                             f"{_type_name(c_desc.dtype)} data (FLOAT for float, half and bfloat16; DOUBLE "
                             "for double)")
        for desc, name in ins:
            _broadcast(desc, name, c_desc, "cDesc")
        output_tensor(c_desc, "cDesc")
        for (desc, name), ptr, pname in zip(ins, (A, B), ("A", "B")):
            device_ptr(ptr, pname, desc.span_bytes())
        device_ptr(C, "C", c_desc.span_bytes())
        t = TAG[c_desc.dtype]
        flags = FLAG_NAN_PROP if d.nan_opt == E.PYDNN_PROPAGATE_NAN else 0
        pr = ew.prepare_map(handle, f"tensor_ops.{ew.ktag(t)}", OPS[d.op], t, t, c_desc, tuple(x for x, _ in ins),
                            flags=flags, plain_unit=plain_unit(t, c_desc, tuple(x for x, _ in ins)))
        return _broadcast_rows(handle, f"tensor_ops.{ew.ktag(t)}", OPS[d.op], t, pr, c_desc, tuple(x for x, _ in ins))

    a1 = alpha1 if type(alpha1) is float else scalar("alpha1", alpha1)
    a2 = alpha2 if type(alpha2) is float else scalar("alpha2", alpha2)
    be = beta if type(beta) is float else scalar("beta", beta)
    try:
        key = ("op", (op_tensor_desc, op_tensor_desc.version), (a_desc, a_desc.version), (c_desc, c_desc.version),
               None if unary else (b_desc, b_desc.version))
    except AttributeError:
        key = ew.desc_key("op", op_tensor_desc, a_desc, c_desc, None if unary else b_desc)
    rec = handle.prepared.get(key) if key is not None else None
    if rec is None:
        rec = ew.cached(handle, key, build)
    checked = _buffers.CHECKED
    ap = A if type(A) is int and A > 0 and not checked else device_ptr(A, "A", rec.need[1])
    if unary:
        ptrs = (ap,)
    else:
        ptrs = (ap, B if type(B) is int and B > 0 and not checked else device_ptr(B, "B", rec.need[2]))
    cp = C if type(C) is int and C > 0 and not checked else device_ptr(C, "C", rec.need[0])
    ew.run_map(handle, rec, cp, ptrs, a1, be, alpha2=a2)
    if ew.note is not None and key is not None:  # the compiled entry keeps this call site (ew._setup_entries)
        ew.note(ew.K_OP, rec, len(ptrs), False, False)


_py_op_tensor = op_tensor  # the Python function behind the compiled entry (ew._setup_entries)


# ------------------------------------------------------------------------------ TransformTensor
def _prepare_transform(handle, op, ti, to, x_desc, y_desc):
    """The launch record of a transform: the tiled transpose when the collapsed problem is a (batched)
    2-D transpose, else the generic map (vectorised when both sides are dense in one order)."""
    unit = f"tensor_ops.transform.{ew.ktag(ti)}"
    ndim, sizes, strides, dense = ew.plan(y_desc.dims, y_desc.strides, ((x_desc.dims, x_desc.strides),))
    order = None if dense else ew.transpose_order(ndim, strides)
    if order is not None:
        sizes = tuple(sizes[d] for d in order)
        out_s, in_s = (tuple(st[d] for d in order) for st in strides)
        n1, n0 = sizes[-2], sizes[-1]  # the input's dense dim, the output's dense dim
        batch = 1
        for s in sizes[:-2]:
            batch *= s
        if min(n0, n1) < MIN_TRANSPOSE_EXTENT or -(-n0 // TILE) > MAX_GRID_YZ or batch >= 1 << 32:
            order = None
    if order is None:
        return ew.prepare_map(handle, unit, op, ti, to, y_desc, (x_desc,))
    pr = ew.Prepared()
    p = pr.params = MapParams()
    p.n, p.ndim = n1 * n0 * batch, ndim
    for d in range(ndim):
        p.size[d] = sizes[d]
        p.stride[0][d] = out_s[d]
        p.stride[1][d] = in_s[d]
    pr.argv = driver.kernel_args(p)
    pr.block = pr.vec_block = (32, 8, 1)
    pr.base_flags = ew.fmt_flags(ti, to)
    pr.ninputs = 1
    pr.need = (y_desc.span_bytes(), x_desc.span_bytes())
    vec_e, scalar_e = transpose_exprs(op, ti, to)
    vi, vo = 16 // SIZE[ti], 16 // SIZE[to]
    vec = (n1 % vi == 0 and n0 % vo == 0 and all(s % vi == 0 for i, s in enumerate(in_s) if i != ndim - 2)
           and all(s % vo == 0 for s in out_s[:-1]))
    pr.scalar_func = handle.function(unit, scalar_e)
    pr.vec_func = handle.function(unit, vec_e) if vec else pr.scalar_func
    pr.in_masks = pr.out_mask = 15 if vec else 0  # 16-byte aligned pointers for the vector kernel
    pr.vec_grid = pr.scalar_grid = (-(-n1 // TILE), -(-n0 // TILE), min(batch, MAX_GRID_YZ))
    return pr


@api
def transform_tensor(handle, alpha, x_desc, x, beta, y_desc, y):
    """cudnnTransformTensor: y = alpha * x + beta * y, x and y of the same dims with any strides (NCHW <->
    NHWC and arbitrary) and any two of the eight data types. BAD_PARAM, BAD_PARAM_NULL_POINTER."""
    if type(handle) is not Handle or not handle.alive:
        check_handle(handle)
    al = alpha if type(alpha) is float else scalar("alpha", alpha)
    be = beta if type(beta) is float else scalar("beta", beta)
    copy = al == 1.0 and be == 0.0 and getattr(x_desc, "dtype", None) == getattr(y_desc, "dtype", 0)

    def build():
        _any_tensor(x_desc, "xDesc")
        _any_tensor(y_desc, "yDesc")
        if x_desc.dims != y_desc.dims:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                             f"yDesc: dims {y_desc.dims} differ from xDesc dims {x_desc.dims}")
        output_tensor(y_desc, "yDesc")
        device_ptr(x, "x", x_desc.span_bytes())
        device_ptr(y, "y", y_desc.span_bytes())
        ti, to = TAG[x_desc.dtype], TAG[y_desc.dtype]
        return _prepare_transform(handle, COPY if copy else SCALED, ti, to, x_desc, y_desc)

    try:
        key = ("transform", copy, (x_desc, x_desc.version), (y_desc, y_desc.version))
    except AttributeError:
        key = ew.desc_key("transform", copy, x_desc, y_desc)
    rec = handle.prepared.get(key) if key is not None else None
    if rec is None:
        rec = ew.cached(handle, key, build)
    checked = _buffers.CHECKED
    yp = y if type(y) is int and y > 0 and not checked else device_ptr(y, "y", rec.need[0])
    xp = x if type(x) is int and x > 0 and not checked else device_ptr(x, "x", rec.need[1])
    ew.run_map(handle, rec, yp, (xp,), al, be)
    if ew.note is not None and key is not None:  # the compiled entry keeps this call site (ew._setup_entries), with
        ew.note(ew.K_TRANSFORM, rec, 1, copy, x_desc.dtype == y_desc.dtype)  # the key's copy flag: C recomputes it


_py_transform_tensor = transform_tensor  # the Python function behind the compiled entry (ew._setup_entries)

# the compiled entries over this module's Python functions (_elementwise._setup_entries)
ew.register_entries(sys.modules[__name__], "add_tensor", "scale_tensor", "op_tensor", "transform_tensor")
