"""ReduceTensor: cudnnCreate/Set/Get/DestroyReduceTensorDescriptor, cudnnGetReductionIndicesSize,
cudnnGetReductionWorkspaceSize, cudnnReduceTensor (ptx/reduce.cu).

C = alpha * reduce(A) + beta * C over the dims where C has 1. Types: A and C float, double, half or
bfloat16, the same type, or A half/bfloat16 with C float; arithmetic in float (double for double).
Indices (FLATTENED, 32-bit) for MIN, MAX and AMAX: the flat index of the chosen element within the
reduced sub-tensor, in A's dim order; ties take the lowest index. MUL_NO_ZEROS multiplies the non-zero
elements (1 when there are none). Deterministic: bitwise the same result every run.
"""
import ctypes

from .. import enums as E
from .._build.manifest import KernelUnit
from .._build.params import FLAG_BETA, FLAG_NAN_PROP, MAX_DIMS, kernel_params
from .._cuda import driver
from ..buffers import device_ptr
from ..handle import check_handle
from ..status import PydnnError, api
from .common import TAG, enum_arg, next_pow2, float_tensor, output_tensor, scalar
from ._elementwise import CTYPE, desc_key

BLOCK = 256
OPS = tuple(E.ENUMS["pydnnReduceTensorOp_t"].values())
INDEXED = (E.PYDNN_REDUCE_TENSOR_MIN, E.PYDNN_REDUCE_TENSOR_MAX, E.PYDNN_REDUCE_TENSOR_AMAX)
PAIRS = [("f32", "f32"), ("f64", "f64"), ("f16", "f16"), ("bf16", "bf16"), ("f16", "f32"), ("bf16", "f32")]


@kernel_params("reduce_params.h", "ReduceParams")
class ReduceParams(ctypes.Structure):
    _fields_ = [
        ("out", ctypes.c_void_p), ("in_", ctypes.c_void_p), ("indices", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p), ("alpha", ctypes.c_double), ("beta", ctypes.c_double),
        ("rows", ctypes.c_longlong), ("len", ctypes.c_longlong), ("chunk", ctypes.c_longlong),
        ("op", ctypes.c_int), ("group", ctypes.c_int), ("segments", ctypes.c_int), ("flags", ctypes.c_uint),
        ("row_ndim", ctypes.c_int), ("red_ndim", ctypes.c_int),
        ("row_size", ctypes.c_longlong * MAX_DIMS), ("red_size", ctypes.c_longlong * MAX_DIMS),
        ("row_stride", (ctypes.c_longlong * MAX_DIMS) * 3), ("red_stride", ctypes.c_longlong * MAX_DIMS),
    ]
    C_NAMES = {"in_": "in"}


def kernel_units():
    exprs = []
    for ti, to in PAIRS:
        exprs += [f"pydnn::reduce::reduce_rows<{CTYPE[ti]}, {CTYPE[to]}>",
                  f"pydnn::reduce::reduce_combine<{CTYPE[ti]}, {CTYPE[to]}>"]
    return [KernelUnit("reduce", "reduce.cu", tuple(exprs))]


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
    """cudnnSetReduceTensorDescriptor."""
    d = _live(reduce_tensor_desc)
    op = enum_arg("reduceTensorOp", reduce_tensor_op, OPS, "pydnnReduceTensorOp_t")
    comp = enum_arg("reduceTensorCompType", reduce_tensor_comp_type, (E.PYDNN_DATA_FLOAT, E.PYDNN_DATA_DOUBLE),
                    "compute type (FLOAT or DOUBLE)")
    nan = enum_arg("reduceTensorNanOpt", reduce_tensor_nan_opt, (0, 1), "pydnnNanPropagation_t")
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
    """cudnnDestroyReduceTensorDescriptor."""
    if reduce_tensor_desc is None:
        return
    d = _live(reduce_tensor_desc)
    d.alive = False
    d.version += 1


def _wants_indices(d):
    return d.indices == E.PYDNN_REDUCE_TENSOR_FLATTENED_INDICES


def _validate(r, a_desc, c_desc):
    d = _live(r)
    if not d.is_set:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, "reduceTensorDesc: descriptor was never set")
    float_tensor(a_desc, "aDesc")
    float_tensor(c_desc, "cDesc")
    output_tensor(c_desc, "cDesc")
    if (TAG[a_desc.dtype], TAG[c_desc.dtype]) not in PAIRS:
        raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED,
                         f"cDesc: data type {c_desc.dtype} with aDesc data type {a_desc.dtype} is not supported "
                         "(same type, or half/bfloat16 A with float C)")
    if len(a_desc.dims) != len(c_desc.dims):
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"cDesc: has {len(c_desc.dims)} dims, aDesc has {len(a_desc.dims)}")
    for i, (a, c) in enumerate(zip(a_desc.dims, c_desc.dims)):
        if c != a and c != 1:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"cDesc: dim {i} is {c}; it must equal aDesc's ({a}) or be 1")
    if _wants_indices(d):
        if d.op not in INDEXED:
            raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED,
                             "reduceTensorIndices: indices exist only for MIN, MAX and AMAX")
        if d.indices_type != E.PYDNN_32BIT_INDICES:
            raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED, "reduceTensorIndicesType: only 32-bit indices")
    return d


class _Plan:
    __slots__ = ("params", "argv", "rows_func", "combine_func", "grid", "combine_grid", "workspace", "need",
                 "indices_bytes", "wants_indices")


def _plan(handle, r, a_desc, c_desc):
    d = _validate(r, a_desc, c_desc)
    nd = len(a_desc.dims)
    red = [i for i in range(nd) if c_desc.dims[i] == 1 and a_desc.dims[i] != 1]
    kept = [i for i in range(nd) if i not in red and a_desc.dims[i] != 1]
    # reduce dims keep A's order (the flat index cuDNN reports); adjacent dense ones merge
    esz, est = [], []
    for i in red:
        if esz and est[-1] == a_desc.strides[i] * a_desc.dims[i]:
            esz[-1] *= a_desc.dims[i]
            est[-1] = a_desc.strides[i]
        else:
            esz.append(a_desc.dims[i])
            est.append(a_desc.strides[i])
    # kept dims: outermost first by A's stride, so neighbouring threads read neighbouring memory
    kept.sort(key=lambda i: -a_desc.strides[i])
    rsz = [a_desc.dims[i] for i in kept] or [1]
    packed = [1] * nd  # the indices tensor: C's dims, packed row-major
    for i in range(nd - 2, -1, -1):
        packed[i] = packed[i + 1] * c_desc.dims[i + 1]
    rst = [[c_desc.strides[i] for i in kept] or [0], [a_desc.strides[i] for i in kept] or [0],
           [packed[i] for i in kept] or [0]]
    esz, est = esz or [1], est or [1]
    rows = 1
    for s in rsz:
        rows *= s
    length = 1
    for s in esz:
        length *= s
    group = min(BLOCK, next_pow2(length)) if est[-1] == 1 else 1
    # long rows and few outputs: cut each row into segments so that every SM has blocks to run
    slots_wanted = 4 * handle.sm_count * (BLOCK // group)
    segments = 1
    if rows < slots_wanted and length >= 8 * group * 64:
        segments = int(min(-(-slots_wanted // rows), -(-length // (group * 64)), 65535))
    chunk = -(-length // segments)
    p = ReduceParams()
    p.rows, p.len, p.chunk, p.op, p.group, p.segments = rows, length, chunk, d.op, group, segments
    p.row_ndim, p.red_ndim = len(rsz), len(esz)
    for k, s in enumerate(rsz):
        p.row_size[k] = s
        for j in range(3):
            p.row_stride[j][k] = rst[j][k]
    for k, s in enumerate(esz):
        p.red_size[k], p.red_stride[k] = s, est[k]
    pl = _Plan()
    pl.params, pl.argv = p, driver.kernel_args(p)
    pl.workspace = rows * segments * 12 if segments > 1 else 0
    pl.wants_indices = _wants_indices(d)
    pl.indices_bytes = rows * 4 if pl.wants_indices else 0
    pl.need = (c_desc.span_bytes(), a_desc.span_bytes())
    return pl, TAG[a_desc.dtype], TAG[c_desc.dtype]


def _get_plan(handle, r, a_desc, c_desc, with_functions=True):
    key = desc_key("reduce", r, a_desc, c_desc)
    pl = handle.prepared.get(key) if key is not None else None
    if pl is None:
        pl, ti, to = _plan(handle, r, a_desc, c_desc)
        pl.rows_func = pl.combine_func = None
        if with_functions:
            pl.rows_func = handle.function("reduce", f"pydnn::reduce::reduce_rows<{CTYPE[ti]}, {CTYPE[to]}>")
            pl.combine_func = handle.function("reduce", f"pydnn::reduce::reduce_combine<{CTYPE[ti]}, {CTYPE[to]}>")
            p = pl.params
            pl.grid = (max(1, -(-(p.rows * p.segments) // (BLOCK // p.group))), 1, 1)
            pl.combine_grid = (max(1, -(-p.rows // BLOCK)), 1, 1)
            if key is not None:
                handle.remember(key, pl)
    return pl


@api
def get_reduction_indices_size(handle, reduce_tensor_desc, a_desc, c_desc):
    """cudnnGetReductionIndicesSize: bytes of the int32 indices (0 when the descriptor asks for none)."""
    check_handle(handle)
    return _get_plan(handle, reduce_tensor_desc, a_desc, c_desc, with_functions=False).indices_bytes


@api
def get_reduction_workspace_size(handle, reduce_tensor_desc, a_desc, c_desc):
    """cudnnGetReductionWorkspaceSize: bytes of workspace reduce_tensor needs for this problem."""
    check_handle(handle)
    return _get_plan(handle, reduce_tensor_desc, a_desc, c_desc, with_functions=False).workspace


@api
def reduce_tensor(handle, reduce_tensor_desc, indices, indices_size_in_bytes, workspace, workspace_size_in_bytes,
                  alpha, a_desc, A, beta, c_desc, C):  # noqa: N803 - cuDNN's names
    """cudnnReduceTensor: C = alpha * reduce(A) + beta * C (indices for MIN/MAX/AMAX when asked for)."""
    check_handle(handle)
    key = desc_key("reduce", reduce_tensor_desc, a_desc, c_desc)
    pl = handle.prepared.get(key) if key is not None else None
    al, be = scalar("alpha", alpha), scalar("beta", beta)
    isz = _size("indicesSizeInBytes", indices_size_in_bytes)
    wsz = _size("workspaceSizeInBytes", workspace_size_in_bytes)
    if pl is None:  # validate sizes and buffers before any kernel is loaded
        _buffers(_get_plan(handle, reduce_tensor_desc, a_desc, c_desc, with_functions=False), indices, isz,
                 workspace, wsz, A, C)
        pl = _get_plan(handle, reduce_tensor_desc, a_desc, c_desc)
    p = pl.params
    p.indices, p.workspace, p.out, p.in_ = _buffers(pl, indices, isz, workspace, wsz, A, C)
    p.alpha, p.beta = al, be
    p.flags = (FLAG_BETA if be != 0 else 0) | (FLAG_NAN_PROP if reduce_tensor_desc.nan_opt else 0)
    driver.launch_args(pl.rows_func, pl.grid, (BLOCK, 1, 1), 0, handle.cu_stream, pl.argv)
    if p.segments > 1:
        driver.launch_args(pl.combine_func, pl.combine_grid, (BLOCK, 1, 1), 0, handle.cu_stream, pl.argv)


def _buffers(pl, indices, isz, workspace, wsz, A, C):  # noqa: N803
    """(indices, workspace, C, A) device addresses, each checked against what the plan needs."""
    ind = ws = 0
    if pl.wants_indices:
        if isz < pl.indices_bytes:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                             f"indicesSizeInBytes: {isz} is less than the {pl.indices_bytes} bytes needed")
        ind = device_ptr(indices, "indices", pl.indices_bytes)
    if pl.workspace:
        if wsz < pl.workspace:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                             f"workspaceSizeInBytes: {wsz} is less than the {pl.workspace} bytes needed")
        ws = device_ptr(workspace, "workspace", pl.workspace)
    return ind, ws, device_ptr(C, "C", pl.need[0]), device_ptr(A, "A", pl.need[1])


def _size(name, v):
    if isinstance(v, bool) or not hasattr(v, "__index__") or v.__index__() < 0:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: {v!r} is not a size in bytes")
    return v.__index__()
