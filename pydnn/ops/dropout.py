"""Dropout: cudnnCreate/Destroy/Set/Restore/GetDropoutDescriptor, cudnnDropoutGetStatesSize,
cudnnDropoutGetReserveSpaceSize, cudnnDropoutForward, cudnnDropoutBackward (kernels in ptx/dropout.cu).

    forward   y  = x / (1 - p) where kept, exact 0 where dropped (the keep bits go to the reserve space)
    backward  dx = dy / (1 - p) where the reserve space says kept, exact 0 elsewhere

The generator is Philox-4x32-10, counter-based (ptx/common/philox.cuh): element i (its row-major index
over the dims, whatever the strides) is kept iff 16 bits drawn for it from Philox block i // 8 of the
stream (seed, offset) are >= round(p * 65536). So the mask depends only on (seed, offset, i): not on the
launch shape, the layout or the data type. Resolution of p: 2^-16 (the drop probability is
round(p * 65536) / 65536, within 2^-17 of p); p = 0 keeps everything, p = 1 drops everything (y = 0, no
division), and the scale is 1 / (1 - p) exactly as given.

States buffer (pydnnDropoutGetStatesSize: 32 bytes, 8-byte aligned): 4 u64 words on the device, [0] seed,
[1] offset of the next forward, [2] a block counter used by the running forward, [3] a format tag.
SetDropoutDescriptor writes it with a one-thread kernel on the handle's stream (no synchronization, no
host copy) and the offset starts at 0. Each DropoutForward reads (seed, offset) from it and advances the
offset by 1 on the device (its last block to read does so), so successive forwards draw different masks,
also in CUDA-graph replays. One offset names a whole stream of 2^64 blocks, so a forward of any size
consumes exactly one offset. RestoreDropoutDescriptor adopts a states buffer as it is (the seed argument is
recorded for GetDropoutDescriptor; the buffer's own seed is used, as in cuDNN): restoring a copy of a
states buffer reproduces the masks drawn from the original. SetDropoutDescriptor with states NULL sets only
the dropout value (the descriptor keeps its states buffer and seed); a forward with 0 < p < 1 then needs a
states buffer from an earlier Set/Restore.

Reserve space (pydnnDropoutGetReserveSpaceSize: ceil(n / 8) bytes): one bit per element, bit i % 8 of byte
i // 8 (i the row-major index), bits past n zero. DropoutBackward uses it, not the generator: it needs no
states and gives the forward's mask whatever the stream has done since.

Kernels: a dense path when x and y are both packed in row-major order of their dims (memory order =
logical order; 16-byte vectors when every pointer is 16-byte aligned, else element accesses); a tile path
for channels-last layouts (after merging dims, the second-to-last has stride 1 in x and y and the last is a
multiple of 8: NHWC with H*W % 8 == 0), which moves 64 x 64 tiles through shared memory so that memory is
read and written along C while the mask follows the logical order; and a strided path for anything else
(gaps, x and y in different layouts, H*W not a multiple of 8). Data types float, double, half,
bfloat16 (float arithmetic for the 16-bit ones). x and y may be the same buffer when their descriptors
are the same.
"""
import ctypes

from .. import enums as E
from .. import tuning
from .._build.manifest import KernelUnit
from .._build.params import MAX_DIMS, kernel_params
from .._cuda import driver
from ..buffers import device_ptr
from ..handle import check_handle
from ..status import PydnnError, api
from ..tensor import index_of
from ._elementwise import CTYPE, _SIZES, vec_width
from .common import (
    FLOAT_TAGS, TAG, element_aligned, float_tensor, no_partial_alias, output_tensor, same_shape, same_type, scalar,
)

__all__ = [
    "create_dropout_descriptor", "destroy_dropout_descriptor", "dropout_get_states_size",
    "dropout_get_reserve_space_size", "set_dropout_descriptor", "restore_dropout_descriptor",
    "get_dropout_descriptor", "dropout_forward", "dropout_backward",
]

C_OPAQUE_TYPES = [("pydnnDropoutDescriptor_t", "pydnnDropoutStruct")]
C_NULLABLE = {}
C_API = [("Dropout (Philox-4x32-10, counter-based: the mask is a function of seed, offset and element index)", [
    ("pydnnStatus_t pydnnCreateDropoutDescriptor(pydnnDropoutDescriptor_t *dropoutDesc);",
     "A new dropout descriptor, unset until pydnnSetDropoutDescriptor or pydnnRestoreDropoutDescriptor."),
    ("pydnnStatus_t pydnnDestroyDropoutDescriptor(pydnnDropoutDescriptor_t dropoutDesc);",
     "Release a dropout descriptor (NULL: nothing to do); its states buffer stays the caller's."),
    ("pydnnStatus_t pydnnDropoutGetStatesSize(pydnnHandle_t handle, size_t *sizeInBytes);",
     "Bytes of the states buffer (32: seed, offset of the next forward, a block counter, a tag)."),
    ("pydnnStatus_t pydnnDropoutGetReserveSpaceSize(pydnnTensorDescriptor_t xdesc, size_t *sizeInBytes);",
     "Bytes of the reserve space for x: one bit per element, ceil(n / 8)."),
    ("pydnnStatus_t pydnnSetDropoutDescriptor(pydnnDropoutDescriptor_t dropoutDesc, pydnnHandle_t handle, float dropout, void *states, size_t stateSizeInBytes, unsigned long long seed);",
     "dropout in [0, 1]; writes seed and offset 0 into states on the handle's stream (states NULL: sets dropout only)."),
    ("pydnnStatus_t pydnnRestoreDropoutDescriptor(pydnnDropoutDescriptor_t dropoutDesc, pydnnHandle_t handle, float dropout, void *states, size_t stateSizeInBytes, unsigned long long seed);",
     "Adopt a states buffer as it is (its own seed and offset); seed is only recorded for the getter."),
    ("pydnnStatus_t pydnnGetDropoutDescriptor(pydnnDropoutDescriptor_t dropoutDesc, pydnnHandle_t handle, float *dropout, void **states, unsigned long long *seed);",
     "The dropout value, states buffer and seed last set."),
    ("pydnnStatus_t pydnnDropoutForward(pydnnHandle_t handle, const pydnnDropoutDescriptor_t dropoutDesc, const pydnnTensorDescriptor_t xdesc, const void *x, const pydnnTensorDescriptor_t ydesc, void *y, void *reserveSpace, size_t reserveSpaceSizeInBytes);",
     "y = x / (1 - p) where kept, 0 where dropped; the mask goes to reserveSpace; the states' offset advances by 1."),
    ("pydnnStatus_t pydnnDropoutBackward(pydnnHandle_t handle, const pydnnDropoutDescriptor_t dropoutDesc, const pydnnTensorDescriptor_t dydesc, const void *dy, const pydnnTensorDescriptor_t dxdesc, void *dx, void *reserveSpace, size_t reserveSpaceSizeInBytes);",
     "dx = dy / (1 - p) where the forward kept the element (mask from reserveSpace), 0 elsewhere."),
])]

STATE_BYTES = 32                    # PYDNN_DROPOUT_STATE_BYTES
STATE_TAG = 0x31706F7244444E50      # PYDNN_DROPOUT_STATE_TAG
THREADS = 256                       # kThreads
GROUPS = {"f16": 4, "bf16": 4, "f32": 2, "f64": 1}  # Groups<T>: groups of 8 elements per thread (dense)
STRIDED_BLOCKS_PER_SM = 16          # strided kernels: grid-stride loop over groups
TILE_A, TILE_B = 64, 64             # kTileA, kTileB: the tile kernels' tile
# USE_TILE: a switch, pydnn.tuning.dropout.USE_TILE (default True); False: channels-last layouts take the strided kernel
# 16-bit dense forward with 16-byte vectors: fwd_packed (Philox calls round by round, pairs of elements per
# word: fewer instructions per element, bitwise fwd's output and mask). False: fwd<T, 8>.
# FWD_PACKED: a switch, pydnn.tuning.dropout.FWD_PACKED (default True)
PACKED_TAGS = ("f16", "bf16")
MAX_GRID = 2**31 - 1


@kernel_params("dropout_params.h", "DropoutParams")
class DropoutParams(ctypes.Structure):
    _fields_ = [
        ("out", ctypes.c_void_p), ("in_", ctypes.c_void_p), ("mask", ctypes.c_void_p), ("state", ctypes.c_void_p),
        ("seed", ctypes.c_ulonglong), ("scale", ctypes.c_double), ("n", ctypes.c_longlong),
        ("groups", ctypes.c_longlong), ("threshold", ctypes.c_uint), ("ndim", ctypes.c_int),
        ("size", ctypes.c_longlong * MAX_DIMS), ("stride", (ctypes.c_longlong * MAX_DIMS) * 2),
    ]
    C_NAMES = {"in_": "in"}


# ----------------------------------------------------------------------------- kernel variants

def _expr(kernel, tag, vec=None):
    t = CTYPE[tag]
    if vec is None:
        return f"pydnn::dropout::{kernel}<{t}>"
    return f"pydnn::dropout::{kernel}<{t}, {vec}>"


INIT_EXPR, PROBE_EXPR = "pydnn::dropout::init_state", "pydnn::dropout::philox_probe"
MISC_UNIT = "dropout.misc"


def kernel_units():
    units = []
    for t in FLOAT_TAGS:
        exprs = []
        for k in ("fwd", "bwd"):
            exprs += [_expr(k, t, vec_width(t, t)), _expr(k, t, 1), _expr(f"{k}_tile", t), _expr(f"{k}_strided", t)]
        if t in PACKED_TAGS:
            exprs.append(_expr("fwd_packed", t))
        units.append(KernelUnit(f"dropout.{t}", "dropout.cu", tuple(exprs)))
    units.append(KernelUnit(MISC_UNIT, "dropout.cu", (INIT_EXPR, PROBE_EXPR), ("-DPYDNN_DROPOUT_MISC",)))
    return units


# ----------------------------------------------------------------------------- the descriptor

def threshold(p):
    """The kernels' 16-bit keep threshold for drop probability p (pydnn.reference.dropout.threshold)."""
    return int(p * 65536.0 + 0.5)


class DropoutDescriptor:
    """cudnnDropoutDescriptor_t: the drop probability and the states buffer (device address) it draws from."""

    __slots__ = ("dropout", "states", "state_size", "seed", "is_set", "alive", "version")

    def __init__(self):
        self.dropout, self.states, self.state_size, self.seed = 0.0, 0, 0, 0
        self.is_set, self.alive, self.version = False, True, 0


def _live(desc, name="dropoutDesc"):
    if type(desc) is not DropoutDescriptor or not desc.alive:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: not a live dropout descriptor")
    return desc


def _set_desc(desc):
    _live(desc)
    if not desc.is_set:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, "dropoutDesc: descriptor was never set")
    return desc


def _probability(v):
    p = scalar("dropout", v)
    if not 0.0 <= p <= 1.0:  # NaN fails too
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"dropout: {p!r} is outside [0, 1]")
    return p


def _size(name, v):
    i = v if type(v) is int else index_of(v)  # a plain int without a call: this runs on every call
    if i is None or i < 0:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: {v!r} is not a size in bytes")
    return i


def _seed(v):
    i = index_of(v)
    if i is None or not 0 <= i < 2**64:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"seed: {v!r} is not an unsigned 64-bit integer")
    return i


def _is_null(states):
    return states is None or (type(states) is int and states == 0)


def _states(states, size):
    """The states buffer's address, checked: large enough (stateSizeInBytes and the object's own extent)
    and 8-byte aligned (the kernels use 64-bit words and atomics)."""
    if size < STATE_BYTES:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                         f"stateSizeInBytes: {size} is less than the {STATE_BYTES} bytes of the states "
                         "(pydnnDropoutGetStatesSize)")
    ptr = device_ptr(states, "states", STATE_BYTES)
    if ptr % 8:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, f"states: {ptr:#x} is not 8-byte aligned")
    return ptr


@api
def create_dropout_descriptor():
    """cudnnCreateDropoutDescriptor."""
    return DropoutDescriptor()


@api
def destroy_dropout_descriptor(dropout_desc):
    """cudnnDestroyDropoutDescriptor (the states buffer belongs to the caller and is left alone)."""
    if dropout_desc is None:
        return
    _live(dropout_desc).alive = False
    dropout_desc.version += 1


@api
def dropout_get_states_size(handle):
    """cudnnDropoutGetStatesSize: bytes of the states buffer (32)."""
    check_handle(handle)
    return STATE_BYTES


@api
def dropout_get_reserve_space_size(xdesc):
    """cudnnDropoutGetReserveSpaceSize: ceil(n / 8) bytes (one bit per element). NOT_SUPPORTED for data
    types other than float, double, half, bfloat16."""
    return (float_tensor(xdesc, "xdesc").count + 7) // 8


@api
def set_dropout_descriptor(dropout_desc, handle, dropout, states, state_size_in_bytes, seed):
    """cudnnSetDropoutDescriptor: dropout in [0, 1]; writes (seed, offset 0) into the states buffer with a
    kernel on the handle's stream (no synchronization). states NULL (0 or None): only the dropout value
    changes. Statuses: BAD_PARAM (descriptor, handle, dropout outside [0, 1] or NaN, seed not an unsigned
    64-bit value, stateSizeInBytes < pydnnDropoutGetStatesSize), BAD_PARAM_NULL_POINTER,
    BAD_PARAM_MISALIGNED_POINTER (states not 8-byte aligned)."""
    d = _live(dropout_desc)
    check_handle(handle)
    p = _probability(dropout)
    s = _seed(seed)
    size = _size("stateSizeInBytes", state_size_in_bytes)
    if _is_null(states):
        d.dropout, d.is_set = p, True
        d.version += 1
        return
    ptr = _states(states, size)
    prm = DropoutParams()
    prm.state, prm.seed = ptr, s
    handle.launch(MISC_UNIT, INIT_EXPR, (1, 1, 1), (32, 1, 1), prm)
    d.dropout, d.states, d.state_size, d.seed, d.is_set = p, ptr, size, s, True
    d.version += 1


@api
def restore_dropout_descriptor(dropout_desc, handle, dropout, states, state_size_in_bytes, seed):
    """cudnnRestoreDropoutDescriptor: use a states buffer as it is (initialised by an earlier Set, or a copy
    of one); nothing is written or launched. `seed` is recorded for get_dropout_descriptor only (the
    buffer's own seed is used). Statuses as set_dropout_descriptor; states may not be NULL."""
    d = _live(dropout_desc)
    check_handle(handle)
    p = _probability(dropout)
    s = _seed(seed)
    size = _size("stateSizeInBytes", state_size_in_bytes)
    ptr = _states(states, size)
    d.dropout, d.states, d.state_size, d.seed, d.is_set = p, ptr, size, s, True
    d.version += 1


@api
def get_dropout_descriptor(dropout_desc, handle):
    """cudnnGetDropoutDescriptor -> (dropout, states address (0: none), seed)."""
    d = _live(dropout_desc)
    check_handle(handle)
    return d.dropout, d.states, d.seed


# ----------------------------------------------------------------------------- planning and launch

class _Plan:
    """Everything about a forward or backward that depends only on descriptors; pointers patched per call."""

    __slots__ = ("params", "argv", "dense", "vec_func", "vec_grid", "func", "grid", "need", "reserve",
                 "itemsize", "tag")


def _row_major(desc):
    """Packed in row-major order of the dims (size-1 dims ignored): memory index = logical index."""
    expect = 1
    for n, s in zip(reversed(desc.dims), reversed(desc.strides)):
        if n != 1:
            if s != expect:
                return False
            expect *= n
    return True


def _collapse(dims, out_strides, in_strides):
    """Dims in row-major (descriptor) order without size-1 dims, neighbours merged where both operands
    are contiguous across them. -> (sizes, out strides, in strides)."""
    sizes, so, si = [], [], []
    for n, a, b in zip(dims, out_strides, in_strides):
        if n == 1:
            continue
        if sizes and so[-1] == a * n and si[-1] == b * n:
            sizes[-1] *= n
            so[-1], si[-1] = a, b
        else:
            sizes.append(n)
            so.append(a)
            si.append(b)
    if not sizes:
        return [1], [1], [1]
    return sizes, so, si


def _tile_grid(sizes, so, si):
    """Blocks of the tile kernel when it applies (the second-to-last collapsed dim has stride 1 in both
    operands, the last is a multiple of 8: channels-last layouts), else 0."""
    if not tuning.dropout.USE_TILE or len(sizes) < 2 or so[-2] != 1 or si[-2] != 1 or sizes[-1] % 8:
        return 0
    batch = 1
    for n in sizes[:-2]:
        batch *= n
    grid = batch * -(-sizes[-2] // TILE_A) * -(-sizes[-1] // TILE_B)
    return grid if grid <= MAX_GRID else 0


def _plan(handle, backward, d, out_desc, in_desc):
    tag = TAG[out_desc.dtype]
    n = out_desc.count
    pl = _Plan()
    p = pl.params = DropoutParams()
    p.n, p.groups = n, (n + 7) // 8
    p.threshold = threshold(d.dropout)
    p.scale = 0.0 if d.dropout >= 1.0 else 1.0 / (1.0 - d.dropout)
    p.state = None if backward else (d.states or None)
    pl.need = (out_desc.span_bytes(), in_desc.span_bytes())
    pl.reserve = p.groups
    pl.itemsize, pl.tag = _SIZES[tag], tag
    k = "bwd" if backward else "fwd"
    pl.dense = _row_major(out_desc) and _row_major(in_desc)
    if pl.dense:
        per_block = THREADS * GROUPS[tag]
        grid = max(1, -(-(n // 8) // per_block))
        if grid > MAX_GRID:
            raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED, f"{n} elements need more than 2^31 - 1 blocks")
        packed = tuning.dropout.FWD_PACKED and not backward and tag in PACKED_TAGS  # same groups per thread as fwd<T, 8>
        pl.vec_func = handle.function(f"dropout.{tag}", _expr("fwd_packed", tag) if packed
                                      else _expr(k, tag, vec_width(tag, tag)))
        pl.func = handle.function(f"dropout.{tag}", _expr(k, tag, 1))
        pl.vec_grid = pl.grid = (grid, 1, 1)
    else:
        sizes, so, si = _collapse(out_desc.dims, out_desc.strides, in_desc.strides)
        p.ndim = len(sizes)
        for i, (a, b, c) in enumerate(zip(sizes, so, si)):
            p.size[i], p.stride[0][i], p.stride[1][i] = a, b, c
        tiles = _tile_grid(sizes, so, si)
        if tiles:
            grid, kernel = tiles, f"{k}_tile"
        else:
            grid, kernel = max(1, min(-(-p.groups // THREADS), handle.sm_count * STRIDED_BLOCKS_PER_SM)), f"{k}_strided"
        pl.vec_func = pl.func = handle.function(f"dropout.{tag}", _expr(kernel, tag))
        pl.vec_grid = pl.grid = (grid, 1, 1)
    pl.argv = driver.kernel_args(p)
    return pl


def _validate(d, backward, in_desc, in_name, out_desc, out_name):
    """BAD_PARAM: dims or data types that differ, an output whose elements overlap, a forward with
    0 < p < 1 and no states buffer. NOT_SUPPORTED: data types other than float, double, half, bfloat16."""
    float_tensor(in_desc, in_name)
    float_tensor(out_desc, out_name)
    same_shape(in_desc, in_name, out_desc, out_name)
    same_type(in_desc, in_name, out_desc, out_name)
    output_tensor(out_desc, out_name)
    if not backward and not d.states and 0 < threshold(d.dropout) < 65536:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                         f"dropoutDesc: dropout {d.dropout} needs a states buffer (pydnnSetDropoutDescriptor "
                         "was given NULL states)")


def _key(backward, d, in_desc, out_desc):
    try:
        return ("dropout", backward, d, d.version, in_desc, in_desc.version, out_desc, out_desc.version)
    except AttributeError:
        return None


def _reserve_ok(rsz, need):
    if rsz < need:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                         f"reserveSpaceSizeInBytes: {rsz} is less than the {need} bytes needed "
                         "(pydnnDropoutGetReserveSpaceSize)")


def _get_plan(handle, backward, d, in_desc, in_name, out_desc, out_name, in_buf, out_buf, reserve, rsz):
    """The cached plan for these descriptors, or a new one: every argument check comes before the kernel
    lookup (so a CPU-only handle reports them all)."""
    key = _key(backward, d, in_desc, out_desc)
    pl = handle.prepared.get(key) if key is not None else None
    if pl is None:
        _validate(d, backward, in_desc, in_name, out_desc, out_name)
        ib, ob = in_name[:-4], out_name[:-4]  # "xdesc" -> "x"
        element_aligned(device_ptr(in_buf, ib, in_desc.span_bytes()), ib, in_desc.itemsize)
        element_aligned(device_ptr(out_buf, ob, out_desc.span_bytes()), ob, out_desc.itemsize)
        need = (out_desc.count + 7) // 8
        _reserve_ok(rsz, need)
        device_ptr(reserve, "reserveSpace", need)
        pl = _plan(handle, backward, d, out_desc, in_desc)
        if key is not None:
            handle.remember(key, pl)
    return pl


def _run(handle, backward, dropout_desc, in_desc, in_buf, out_desc, out_buf, reserve, reserve_size):
    names = ("dydesc", "dxdesc") if backward else ("xdesc", "ydesc")
    check_handle(handle)
    d = _set_desc(dropout_desc)
    rsz = _size("reserveSpaceSizeInBytes", reserve_size)
    pl = _get_plan(handle, backward, d, in_desc, names[0], out_desc, names[1], in_buf, out_buf, reserve, rsz)
    _reserve_ok(rsz, pl.reserve)
    ib, ob = names[0][:-4], names[1][:-4]
    ip = element_aligned(device_ptr(in_buf, ib, pl.need[1]), ib, pl.itemsize)
    op = element_aligned(device_ptr(out_buf, ob, pl.need[0]), ob, pl.itemsize)
    no_partial_alias(op, out_desc, ob, ip, in_desc, ib)
    rp = device_ptr(reserve, "reserveSpace", pl.reserve)
    p = pl.params
    p.in_, p.out, p.mask = ip, op, rp
    if pl.dense and ((ip | op) & 15) == 0:
        driver.launch_args(pl.vec_func, pl.vec_grid, (THREADS, 1, 1), 0, handle.cu_stream, pl.argv)
    else:
        driver.launch_args(pl.func, pl.grid, (THREADS, 1, 1), 0, handle.cu_stream, pl.argv)


@api
def dropout_forward(handle, dropout_desc, xdesc, x, ydesc, y, reserve_space, reserve_space_size_in_bytes):
    """cudnnDropoutForward: y = x / (1 - p) where kept, 0 where dropped; the keep bits go to reserve_space
    and the states' offset advances by 1 (on the device). Statuses: BAD_PARAM (handle, descriptors, dims
    or types that differ, overlapping y, no states buffer for 0 < p < 1, reserveSpaceSizeInBytes too
    small), BAD_PARAM_NULL_POINTER, BAD_PARAM_MISALIGNED_POINTER (a pointer not aligned to its
    elements), NOT_SUPPORTED (data types other than float, double, half, bfloat16)."""
    _run(handle, False, dropout_desc, xdesc, x, ydesc, y, reserve_space, reserve_space_size_in_bytes)


@api
def dropout_backward(handle, dropout_desc, dydesc, dy, dxdesc, dx, reserve_space, reserve_space_size_in_bytes):
    """cudnnDropoutBackward: dx = dy / (1 - p) where the forward's reserve_space says kept, 0 elsewhere.
    Needs no states. Statuses as dropout_forward."""
    _run(handle, True, dropout_desc, dydesc, dy, dxdesc, dx, reserve_space, reserve_space_size_in_bytes)
