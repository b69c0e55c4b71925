"""Pooling: cudnnCreate/Set/Get/DestroyPoolingDescriptor (2d and Nd), cudnnGetPooling{2d,Nd}ForwardOutputDim,
cudnnPoolingForward, cudnnPoolingBackward; pydnn extensions pydnnAdaptivePoolingForward / Backward and
pydnnGlobalAveragePoolingForward / Backward (kernels in ptx/pooling.cu).

Modes: MAX, MAX_DETERMINISTIC, AVERAGE_COUNT_INCLUDE_PADDING, AVERAGE_COUNT_EXCLUDE_PADDING; 1, 2 or 3
spatial dims (tensors N, C, spatial...), any window / stride / padding (padding < window), any strides
(NCHW, NHWC, gaps), float / double / half / bfloat16 (float arithmetic for the 16-bit types).

    forward   y  = alpha * pool(x) + beta * y          pooled dim = 1 + (in + 2 * pad - window) // stride
    backward  dx = alpha * dpool(x, dy) + beta * dx    (max pooling: y must be the forward's output for
                                                        this x, with alpha 1 and beta 0, as with cuDNN)

Max pooling's element in a window (its value forward, where its gradient goes backward), per channel, in
window order (d, h, w; in-bounds elements only; padding never wins):
    PROPAGATE_NAN      the first NaN, else the FIRST element equal to the maximum
    NOT_PROPAGATE_NAN  NaN skipped: the first element equal to the maximum of the rest; all NaN: NaN,
                       the gradient to the window's first element.
Backward is a gather (each dx element sums, in a fixed order, over the windows that cover it; no atomics),
so MAX and MAX_DETERMINISTIC are one bitwise-reproducible path. Max: x[e] gets dy[o] when it is the first
element of window o that matches y[o] (equal, or both NaN): the rule above, found by comparing x with y
(earlier elements of the window are read only when x[e] matches: a possible tie). Averages: INCLUDE_PADDING divides by the
window's size, EXCLUDE_PADDING by its in-bounds elements.

Adaptive pooling (extension): y's spatial dims are given (any size >= 1); output o of a dim with input size
In and output size Out pools [floor(o * In / Out), ceil((o + 1) * In / Out)), as
torch.nn.functional.adaptive_{max,avg}_pool{1,2,3}d define it. Mode MAX / MAX_DETERMINISTIC (NaN option as
above) or either AVERAGE (the window has no padding: both divide by its size). Global average pooling
(extension) is adaptive average pooling to y = (N, C, 1, ...).

Spatial geometry must fit 32-bit window arithmetic (in + 2 * padding + stride < 2^31, in-bounds window
sizes < 2^31; adaptive: in * out < 2^31), else NOT_SUPPORTED.

Kernels (see ptx/pooling.cu): one thread per VEC channels of one written element. VEC = 16 bytes of
channels when the channels are contiguous (stride 1) in every operand, C % VEC == 0, every other stride a
multiple of VEC, and (checked per call) every pointer 16-byte aligned; else VEC = 1 with threads running
along the written tensor's innermost dim. The vector forward of 1-d / 2-d pooling with 32-bit offsets runs
fwd_rows (a thread per VEC channels of 4 outputs along w, coordinates from the launch shape; ROWS_FORWARD);
the vector max backward checks ties with one packed max of the earlier window elements (BWD_PACKED_TIES).
Windows kh x 2 with stride kh x 2, no padding, tiling x exactly, w contiguous in every operand (the NCHW
2x2 / 2 pools of CNNs, where channel vectors do not apply) take win2_fwd / win2_bwd (WIN2) when every pointer
is 16-byte aligned: a thread per 16 bytes of x along w of each window row, y / dy as 8-byte vectors, each dx
element written once from its one window (bitwise the scalar kernels' y and dx). Other 2-d / 1-d pools of
NCHW-like layouts on the scalar path take p2_fwd / p2_bwd (P2: a thread per element, the window unrolled;
forward windows <= 3 x 3, backward <= 2 covering windows per dim; bitwise the scalar kernels' values).
"""
import ctypes
import sys

from .. import enums as E
from .. import tuning
from .._build.manifest import KernelUnit
from .._build.params import FLAG_BETA, FLAG_NAN_PROP, kernel_params
from .._cuda import driver
from ..buffers import device_ptr
from .. import buffers as _buffers
from ..handle import Handle, check_handle
from ..status import PydnnError, api
from ..tensor import _int, check_tensor
from ._elementwise import CTYPE, _SIZES, vec_width
from . import _elementwise as ew
from .._build import fastcall
from .common import (
    FLOAT_TAGS, TAG, element_aligned, enum_arg, float_tensor, no_partial_alias, output_tensor, same_type, scalar,
)

__all__ = [
    "PoolingDescriptor", "create_pooling_descriptor", "set_pooling2d_descriptor", "get_pooling2d_descriptor",
    "set_pooling_nd_descriptor", "get_pooling_nd_descriptor", "destroy_pooling_descriptor",
    "get_pooling2d_forward_output_dim", "get_pooling_nd_forward_output_dim", "pooling_forward",
    "pooling_backward", "adaptive_pooling_forward", "adaptive_pooling_backward",
    "global_average_pooling_forward", "global_average_pooling_backward",
]

_T = "pydnnTensorDescriptor_t"
C_OPAQUE_TYPES = [("pydnnPoolingDescriptor_t", "pydnnPoolingStruct")]
C_NULLABLE = {}
C_API = [("Pooling (adaptive and global average pooling are pydnn extensions)", [
    ("pydnnStatus_t pydnnCreatePoolingDescriptor(pydnnPoolingDescriptor_t *poolingDesc);",
     "A new pooling descriptor, unset until a Set call."),
    ("pydnnStatus_t pydnnSetPooling2dDescriptor(pydnnPoolingDescriptor_t poolingDesc, pydnnPoolingMode_t mode, "
     "pydnnNanPropagation_t maxpoolingNanOpt, int windowHeight, int windowWidth, int verticalPadding, "
     "int horizontalPadding, int verticalStride, int horizontalStride);",
     "2-d pooling: window > 0, stride > 0, 0 <= padding < window; max pooling takes the first maximum."),
    ("pydnnStatus_t pydnnGetPooling2dDescriptor(const pydnnPoolingDescriptor_t poolingDesc, pydnnPoolingMode_t *mode, "
     "pydnnNanPropagation_t *maxpoolingNanOpt, int *windowHeight, int *windowWidth, int *verticalPadding, "
     "int *horizontalPadding, int *verticalStride, int *horizontalStride);",
     "Mode, NaN option, window, padding and stride of a 2-d pooling descriptor."),
    ("pydnnStatus_t pydnnSetPoolingNdDescriptor(pydnnPoolingDescriptor_t poolingDesc, const pydnnPoolingMode_t mode, "
     "const pydnnNanPropagation_t maxpoolingNanOpt, int nbDims, const int windowDimA[], const int paddingA[], "
     "const int strideA[]);",
     "1- to 3-d pooling (nbDims spatial dims), checked as the 2-d form."),
    ("pydnnStatus_t pydnnGetPoolingNdDescriptor(const pydnnPoolingDescriptor_t poolingDesc, int nbDimsRequested, "
     "pydnnPoolingMode_t *mode, pydnnNanPropagation_t *maxpoolingNanOpt, int *nbDims, int windowDimA[], "
     "int paddingA[], int strideA[]);",
     "Mode, NaN option, spatial dim count and the first nbDimsRequested window, padding and stride entries."),
    ("pydnnStatus_t pydnnDestroyPoolingDescriptor(pydnnPoolingDescriptor_t poolingDesc);",
     "Release a pooling descriptor (NULL: nothing to do)."),
    ("pydnnStatus_t pydnnGetPooling2dForwardOutputDim(const pydnnPoolingDescriptor_t poolingDesc, "
     "const pydnnTensorDescriptor_t inputTensorDesc, int *n, int *c, int *h, int *w);",
     "Pooled dims of a 4-d input: 1 + (in + 2 * padding - window) / stride (BAD_PARAM if the window is larger "
     "than the padded input)."),
    ("pydnnStatus_t pydnnGetPoolingNdForwardOutputDim(const pydnnPoolingDescriptor_t poolingDesc, "
     "const pydnnTensorDescriptor_t inputTensorDesc, int nbDims, int outputTensorDimA[]);",
     "Pooled dims of an input of nbDims dims (N, C, spatial...)."),
    ("pydnnStatus_t pydnnPoolingForward(pydnnHandle_t handle, const pydnnPoolingDescriptor_t poolingDesc, "
     "const void *alpha, const pydnnTensorDescriptor_t xDesc, const void *x, const void *beta, "
     "const pydnnTensorDescriptor_t yDesc, void *y);",
     "y = alpha * pool(x) + beta * y; y's dims must be the pooled dims."),
    ("pydnnStatus_t pydnnPoolingBackward(pydnnHandle_t handle, const pydnnPoolingDescriptor_t poolingDesc, "
     "const void *alpha, const pydnnTensorDescriptor_t yDesc, const void *y, const pydnnTensorDescriptor_t dyDesc, "
     "const void *dy, const pydnnTensorDescriptor_t xDesc, const void *x, const void *beta, "
     "const pydnnTensorDescriptor_t dxDesc, void *dx);",
     "dx = alpha * (gradient of pool at x applied to dy) + beta * dx; deterministic, max to the window's first maximum (y: the forward's output)."),
    ("pydnnStatus_t pydnnAdaptivePoolingForward(pydnnHandle_t handle, pydnnPoolingMode_t mode, "
     "pydnnNanPropagation_t maxpoolingNanOpt, const void *alpha, const pydnnTensorDescriptor_t xDesc, const void *x, "
     "const void *beta, const pydnnTensorDescriptor_t yDesc, void *y);",
     "Extension: max or average pooling to y's spatial dims; window o = [floor(o*in/out), ceil((o+1)*in/out))."),
    ("pydnnStatus_t pydnnAdaptivePoolingBackward(pydnnHandle_t handle, pydnnPoolingMode_t mode, "
     "pydnnNanPropagation_t maxpoolingNanOpt, const void *alpha, const pydnnTensorDescriptor_t yDesc, const void *y, "
     "const pydnnTensorDescriptor_t dyDesc, const void *dy, const pydnnTensorDescriptor_t xDesc, const void *x, "
     "const void *beta, const pydnnTensorDescriptor_t dxDesc, void *dx);",
     "Extension: backward of pydnnAdaptivePoolingForward (deterministic gather; max reads y as the forward's output)."),
    ("pydnnStatus_t pydnnGlobalAveragePoolingForward(pydnnHandle_t handle, const void *alpha, "
     "const pydnnTensorDescriptor_t xDesc, const void *x, const void *beta, const pydnnTensorDescriptor_t yDesc, "
     "void *y);",
     "Extension: y (N, C, 1, ...) = alpha * mean of x over its spatial dims + beta * y."),
    ("pydnnStatus_t pydnnGlobalAveragePoolingBackward(pydnnHandle_t handle, const void *alpha, "
     "const pydnnTensorDescriptor_t dyDesc, const void *dy, const void *beta, const pydnnTensorDescriptor_t dxDesc, "
     "void *dx);",
     "Extension: dx = alpha * dy / (spatial size of dx) + beta * dx, dy being (N, C, 1, ...)."),
])]

MODES = (E.PYDNN_POOLING_MAX, E.PYDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING,
         E.PYDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING, E.PYDNN_POOLING_MAX_DETERMINISTIC)
NAN_OPTS = (E.PYDNN_NOT_PROPAGATE_NAN, E.PYDNN_PROPAGATE_NAN)

# PYDNN_POOL_MODE_* and PYDNN_POOL_FLAG_* in ptx/pooling_params.h
KMODE = {E.PYDNN_POOLING_MAX: 0, E.PYDNN_POOLING_MAX_DETERMINISTIC: 0,
         E.PYDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING: 1, E.PYDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING: 2}
KMODE_MAX, KMODE_AVG_EXCLUDE = 0, 2
FLAG_ADAPTIVE, FLAG_IDX32 = 4, 8
# vector max backward: bwd<T, VEC, true, true>, checking ties with one packed max of the earlier window
# elements instead of matching each one; False: the per-element match for all
# BWD_PACKED_TIES: a switch, pydnn.tuning.pooling.BWD_PACKED_TIES (default True)
THREADS = 256                       # kThreads
MAX_GRID = 2**31 - 1                # the kernels loop over items past the grid
MAX_SPATIAL = 3


@kernel_params("pooling_params.h", "PoolParams")
class PoolParams(ctypes.Structure):
    _fields_ = [
        ("out", ctypes.c_void_p), ("x", ctypes.c_void_p), ("dy", ctypes.c_void_p), ("y", ctypes.c_void_p),
        ("alpha", ctypes.c_double), ("beta", ctypes.c_double),
        ("total", ctypes.c_longlong), ("mode", ctypes.c_int), ("flags", ctypes.c_uint),
        ("size", ctypes.c_longlong * 5), ("div", ctypes.c_longlong * 5),
        ("os", ctypes.c_longlong * 5), ("xs", ctypes.c_longlong * 5), ("ps", ctypes.c_longlong * 5),
        ("ys", ctypes.c_longlong * 5),
        ("in_dim", ctypes.c_longlong * 3), ("out_dim", ctypes.c_longlong * 3), ("win", ctypes.c_longlong * 3),
        ("pad", ctypes.c_longlong * 3), ("stride", ctypes.c_longlong * 3),
    ]


# ----------------------------------------------------------------------------- kernel variants

def _expr(kernel, tag, vec):
    """kernel: fwd_max, fwd_avg, bwd_max, bwd_avg, rows_max, rows_avg or bwdp_max (max: MAX modes; avg: the
    averages; rows: fwd_rows, the forward with coordinates from the launch shape; bwdp: max backward with the
    packed tie check; those two for vector launches only)."""
    d, m = kernel.split("_")
    tail = ", true" if d == "bwdp" else ""
    d = {"rows": "fwd_rows", "bwdp": "bwd"}.get(d, d)
    return f"pydnn::pooling::{d}<{CTYPE[tag]}, {vec}, {'true' if m == 'max' else 'false'}{tail}>"


KERNELS = ("fwd_max", "fwd_avg", "bwd_max", "bwd_avg")
VEC_ONLY_KERNELS = ("rows_max", "rows_avg", "bwdp_max")


def _win2_expr(kernel, tag):
    """win2_fwd / win2_bwd (ptx/pooling.cu) for kernel fwd_max, fwd_avg, bwd_max or bwd_avg."""
    d, m = kernel.split("_")
    return f"pydnn::pooling::win2_{d}<{CTYPE[tag]}, {'true' if m == 'max' else 'false'}>"


def _p2t_expr(tag):
    """p2t_bwd (ptx/pooling.cu): max backward over a shared-memory tile of covering windows."""
    return f"pydnn::pooling::p2t_bwd<{CTYPE[tag]}>"


def _p2_expr(kernel, tag, clast=False):
    """p2_fwd / p2_bwd (ptx/pooling.cu) for kernel fwd_max, fwd_avg, bwd_max or bwd_avg; clast: threads along c."""
    d, m = kernel.split("_")
    return f"pydnn::pooling::p2_{d}<{CTYPE[tag]}, {'true' if m == 'max' else 'false'}{', true' if clast else ''}>"


def kernel_units():
    return [KernelUnit(f"pooling.{t}", "pooling.cu",
                       tuple(_expr(k, t, v) for k in KERNELS for v in (vec_width(t, t), 1))
                       + tuple(_expr(k, t, vec_width(t, t)) for k in VEC_ONLY_KERNELS)
                       + tuple(_win2_expr(k, t) for k in KERNELS)
                       + tuple(_p2_expr(k, t, cl) for k in KERNELS for cl in (False, True))
                       + (_p2t_expr(t),))
            for t in FLOAT_TAGS]


# ----------------------------------------------------------------------------- descriptor

class PoolingDescriptor:
    """cudnnPoolingDescriptor_t: mode, NaN option, and per spatial dim window, padding and stride."""

    __slots__ = ("mode", "nan_opt", "window", "padding", "stride", "is_set", "alive", "version", "__weakref__")

    def __init__(self):
        self.mode, self.nan_opt = E.PYDNN_POOLING_MAX, E.PYDNN_NOT_PROPAGATE_NAN
        self.window, self.padding, self.stride = (), (), ()
        self.is_set, self.alive, self.version = False, True, 0

    def __repr__(self):
        return (f"PoolingDescriptor(mode={self.mode}, nan={self.nan_opt}, window={self.window}, "
                f"padding={self.padding}, stride={self.stride})")


def _live(desc, name="poolingDesc"):
    if type(desc) is not PoolingDescriptor or not desc.alive:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: not a live pooling descriptor")
    return desc


def _set_desc(desc, name="poolingDesc"):
    _live(desc, name)
    if not desc.is_set:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: descriptor was never set")
    return desc


def _checked_geometry(names, windows, paddings, strides):
    """(window, padding, stride) tuples, every entry checked; names[k] = (window, padding, stride) names."""
    out = ([], [], [])
    for (wn, pn, sn), w, p, s in zip(names, windows, paddings, strides):
        w, p, s = _int(wn, w), _int(pn, p), _int(sn, s)
        if not 0 < w < 1 << 31:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{wn}: {w} must be positive")
        if not 0 < s < 1 << 31:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{sn}: {s} must be positive")
        if p < 0:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{pn}: {p} must not be negative")
        if p >= w:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{pn}: {p} must be smaller than the window ({wn} = {w})")
        for lst, v in zip(out, (w, p, s)):
            lst.append(v)
    return tuple(map(tuple, out))


def _assign(desc, mode, nan_opt, geometry):
    desc.mode, desc.nan_opt = mode, nan_opt
    desc.window, desc.padding, desc.stride = geometry
    desc.is_set = True
    desc.version += 1


def _mode_nan(mode, nan_opt):
    return (enum_arg("mode", mode, MODES, "pydnnPoolingMode_t"),
            enum_arg("maxpoolingNanOpt", nan_opt, NAN_OPTS, "pydnnNanPropagation_t"))


@api
def create_pooling_descriptor():
    """cudnnCreatePoolingDescriptor."""
    return PoolingDescriptor()


@api
def set_pooling2d_descriptor(pooling_desc, mode, maxpooling_nan_opt, window_height, window_width, vertical_padding,
                             horizontal_padding, vertical_stride, horizontal_stride):
    """cudnnSetPooling2dDescriptor. BAD_PARAM: a window or stride not positive, a padding negative or not
    smaller than its window, a mode or NaN option that is not an enum value."""
    _live(pooling_desc)
    m, n = _mode_nan(mode, maxpooling_nan_opt)
    names = (("windowHeight", "verticalPadding", "verticalStride"),
             ("windowWidth", "horizontalPadding", "horizontalStride"))
    g = _checked_geometry(names, (window_height, window_width), (vertical_padding, horizontal_padding),
                          (vertical_stride, horizontal_stride))
    _assign(pooling_desc, m, n, g)


@api
def get_pooling2d_descriptor(pooling_desc):
    """cudnnGetPooling2dDescriptor -> (mode, maxpoolingNanOpt, windowHeight, windowWidth, verticalPadding,
    horizontalPadding, verticalStride, horizontalStride)."""
    d = _set_desc(pooling_desc)
    if len(d.window) != 2:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"poolingDesc: has {len(d.window)} spatial dims, not 2")
    return (d.mode, d.nan_opt, *d.window, *d.padding, *d.stride)


def _int_list(name, seq, nb):
    try:
        seq = list(seq)
    except TypeError:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: expected a sequence of {nb} integers") from None
    if len(seq) < nb:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: has {len(seq)} entries, nbDims is {nb}")
    return seq[:nb]


@api
def set_pooling_nd_descriptor(pooling_desc, mode, maxpooling_nan_opt, nb_dims, window_dim_a, padding_a, stride_a):
    """cudnnSetPoolingNdDescriptor: nbDims spatial dims in [1, 3]; each checked as the 2-d form."""
    _live(pooling_desc)
    m, n = _mode_nan(mode, maxpooling_nan_opt)
    nb = _int("nbDims", nb_dims)
    if not 1 <= nb <= MAX_SPATIAL:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"nbDims: {nb} spatial dims; pooling takes 1 to {MAX_SPATIAL}")
    w, p, s = (_int_list(nm, a, nb) for nm, a in (("windowDimA", window_dim_a), ("paddingA", padding_a),
                                                    ("strideA", stride_a)))
    names = [(f"windowDimA[{i}]", f"paddingA[{i}]", f"strideA[{i}]") for i in range(nb)]
    _assign(pooling_desc, m, n, _checked_geometry(names, w, p, s))


@api
def get_pooling_nd_descriptor(pooling_desc, nb_dims_requested):
    """cudnnGetPoolingNdDescriptor -> (mode, maxpoolingNanOpt, nbDims, windowDimA, paddingA, strideA), the
    lists cut to nbDimsRequested entries."""
    d = _set_desc(pooling_desc)
    req = _int("nbDimsRequested", nb_dims_requested)
    if req < 0:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"nbDimsRequested: {req} is negative")
    return d.mode, d.nan_opt, len(d.window), list(d.window[:req]), list(d.padding[:req]), list(d.stride[:req])


@api
def destroy_pooling_descriptor(pooling_desc):
    """cudnnDestroyPoolingDescriptor (None: nothing to do)."""
    if pooling_desc is None:
        return
    _live(pooling_desc).alive = False
    pooling_desc.version += 1


# ----------------------------------------------------------------------------- output dims

def pooled_dims(pd, x_desc, name):
    """The pooled dims of x (N, C, spatial...) under descriptor pd, or BAD_PARAM naming `name`."""
    check_tensor(x_desc, name)
    nsp, dims = len(pd.window), x_desc.dims
    if len(dims) != nsp + 2:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                         f"{name}: has {len(dims)} dims; a {nsp}-d pooling takes {nsp + 2} (N, C, spatial...)")
    out = list(dims[:2])
    for k, (n, w, p, s) in enumerate(zip(dims[2:], pd.window, pd.padding, pd.stride)):
        if w > n + 2 * p:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                             f"{name}: dim {k + 2} ({n}, padded by 2 * {p}) is smaller than the window ({w})")
        out.append(1 + (n + 2 * p - w) // s)
    return tuple(out)


@api
def get_pooling2d_forward_output_dim(pooling_desc, input_tensor_desc):
    """cudnnGetPooling2dForwardOutputDim -> (n, c, h, w)."""
    pd = _set_desc(pooling_desc)
    if len(pd.window) != 2:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"poolingDesc: has {len(pd.window)} spatial dims, not 2")
    return pooled_dims(pd, input_tensor_desc, "inputTensorDesc")


@api
def get_pooling_nd_forward_output_dim(pooling_desc, input_tensor_desc, nb_dims):
    """cudnnGetPoolingNdForwardOutputDim -> outputTensorDimA (nbDims entries: the input's dim count)."""
    pd = _set_desc(pooling_desc)
    dims = pooled_dims(pd, input_tensor_desc, "inputTensorDesc")
    nb = _int("nbDims", nb_dims)
    if nb != len(dims):
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"nbDims: {nb} differs from inputTensorDesc's {len(dims)} dims")
    return list(dims)


# ----------------------------------------------------------------------------- planning

def _five(desc):
    """(dims, strides) as the kernels' 5 logical dims n, c, d, h, w (missing spatial dims: size 1, stride 0)."""
    pad = 5 - len(desc.dims)
    return (desc.dims[:2] + (1,) * pad + desc.dims[2:]), (desc.strides[:2] + (0,) * pad + desc.strides[2:])


def _spatial3(values, fill):
    return (fill,) * (3 - len(values)) + tuple(values)


class _Launch:
    __slots__ = ("vec", "expr", "params", "argv", "grid", "block", "func")


# fwd_rows (ptx/pooling.cu): a thread reduces ROW_OUT consecutive outputs along w (kRowOut); used for the
# vector forward of 1-d / 2-d non-adaptive pooling when its offsets fit 32 bits. False: fwd for all.
# ROWS_FORWARD: a switch, pydnn.tuning.pooling.ROWS_FORWARD (default True)
ROW_OUT = 4
# ROWS_MIN_BLOCK: a switch, pydnn.tuning.pooling.ROWS_MIN_BLOCK (default 64); smaller blocks (few channels and a narrow output) keep the flat kernel
# fwd_rows: outputs whose in-bounds window is 3 x 3 load it with straight-line offsets (PYDNN_POOL_FLAG_FAST3);
# False: every output walks its window with scan. 3x3/2 NHWC bf16 forward: avg 81.4% of copy against 68.4%
# with scan, max 81.6% against 78.3% (H200, tools/bench_pooling.py).
# ROWS_FAST3: a switch, pydnn.tuning.pooling.ROWS_FAST3 (default True)
FLAG_FAST3 = 16       # PYDNN_POOL_FLAG_FAST3
# fwd_rows, averages: 3 x 3 / 2 strips of full windows sum each column once (PYDNN_POOL_FLAG_COLS). Off:
# measured slower than FAST3 alone (bf16 75.2% vs 81.4% of copy, fp32 86.0% vs 91.5%; tools/bench_pooling.py).
# ROWS_COLS: a switch, pydnn.tuning.pooling.ROWS_COLS (default False)
FLAG_COLS = 32        # PYDNN_POOL_FLAG_COLS


def _rows_shape(flags, x_desc, out_desc, geometry, vec):
    """(grid, block) of fwd_rows for this forward, or None when it does not apply."""
    ins, outs = geometry[0], geometry[1]
    if not tuning.pooling.ROWS_FORWARD or vec == 1 or flags & FLAG_ADAPTIVE or ins[0] != 1 or outs[0] != 1:
        return None
    for d in (x_desc, out_desc):  # every offset (and the products forming it) in 32-bit ints
        if d.span_bytes() // d.itemsize >= 2**31 or any(s < 0 for s in d.strides):
            return None
    odims, _ = _five(out_desc)
    groups, strips = odims[1] // vec, -(-odims[4] // ROW_OUT)
    bx = min(groups, 32)
    by = min(strips, THREADS // bx)
    grid = (odims[0] * odims[3], -(-strips // by), -(-groups // bx))
    if bx * by < tuning.pooling.ROWS_MIN_BLOCK or grid[0] > MAX_GRID or grid[1] > 65535 or grid[2] > 65535:
        return None
    return grid, (bx, by, 1)


# win2_fwd / win2_bwd (ptx/pooling.cu): windows kh x 2 with stride kh x 2, no padding, tiling x exactly, w
# contiguous everywhere (NCHW-like layouts, where the channel vectors do not apply): a thread per 16 bytes
# of x along w of each of the window's kh rows, x / dx as 16-byte vectors, y / dy as 8-byte ones; backward
# writes each dx element once from its one window (no tie scan over covering windows, no per-element
# 5-d coordinate division). False: NCHW takes the scalar fwd / bwd (VEC 1).
# WIN2: a switch, pydnn.tuning.pooling.WIN2 (default True)


def _win2_items(kernel, tag, out_desc, x_desc, p_desc, y_desc, geometry):
    """(size, total) of the win2 launch for this call (size over n, c, 1, oh, w groups), or None when it does
    not apply. Backward: out = dx, p = dy, y = y (max) and x (max; averages pass dy in its place)."""
    if not tuning.pooling.WIN2:
        return None
    ins, outs, win, pad, stride = geometry
    if ins[0] != 1 or outs[0] != 1 or win[0] != 1 or any(pad) or win[2] != 2 or stride[2] != 2:
        return None
    if stride[1] != win[1] or ins[1] != outs[1] * win[1] or ins[2] != outs[2] * 2:
        return None
    kin = 16 // _SIZES[tag]
    kout = kin // 2
    if outs[2] % kout:
        return None
    big = [out_desc] if p_desc is not None else [out_desc, x_desc]   # x / dx: rows of kIn
    small = [p_desc] if p_desc is not None else [out_desc]           # y / dy: rows of kOut
    if p_desc is None:
        big, small = [x_desc], [out_desc]
    elif kernel == "bwd_max":
        big, small = [out_desc, x_desc], [p_desc, y_desc]
    else:
        big, small = [out_desc], [p_desc]
    for descs, q in ((big, kin), (small, kout)):
        for d in descs:
            dims, strides = _five(d)
            if any(s < 0 for s in strides):
                return None
            if dims[4] > 1 and strides[4] != 1:
                return None
            if any(n > 1 and s % q for n, s in zip(dims[:4], strides[:4])):
                return None
    odims = _five(out_desc if p_desc is None else p_desc)[0]
    size = (odims[0], odims[1], 1, odims[3], odims[4] // kout)
    total = size[0] * size[1] * size[3] * size[4]
    if total >= 2**32:
        return None
    return size, total


def _win2_launch(kernel, tag, kmode, flags, out_desc, x_desc, p_desc, y_desc, geometry):
    """The win2 _Launch for this call (kernel not yet loaded), or None."""
    items = _win2_items(kernel, tag, out_desc, x_desc, p_desc, y_desc, geometry)
    if items is None:
        return None
    size, total = items
    lc = _Launch()
    lc.vec, lc.expr = 16 // _SIZES[tag], _win2_expr(kernel, tag)
    p = _params(kmode, flags, out_desc, x_desc, p_desc, y_desc, geometry, 1)
    acc = 1
    for k in (4, 3, 2, 1, 0):  # w groups fastest, then h, c, n
        p.size[k], p.div[k] = size[k], acc
        acc *= size[k]
    p.total = total
    p.flags |= FLAG_IDX32
    lc.params = p
    lc.grid = (max(1, min(-(-total // THREADS), MAX_GRID)), 1, 1)
    lc.block = (THREADS, 1, 1)
    lc.argv = driver.kernel_args(lc.params)
    lc.func = None
    return lc


# p2_fwd / p2_bwd (ptx/pooling.cu): 2-d (or 1-d) non-adaptive pooling on the scalar (VEC = 1) path whose
# written tensor is contiguous along w (NCHW-like), every span below 2^31 elements, forward windows of at
# most 3 x 3, backward at most 2 covering windows per dim (ceil(window / stride) <= 2: 3x3/2, 2x2/2, 2x2/1):
# a thread per element, coordinates by four 32-bit divisions, the window unrolled with its loads together.
# Why: the scalar fwd / bwd (5-d coordinates, a 3-d window walk) ran NCHW max backward 3x3/2 at 0.20x
# PyTorch (fp32 101x38x50x50) and NCHW average forward 2x2/2 at 0.65x (fp32 18x468x75x75; H200,
# tools/sweep_memory.py). Same values and order as fwd / bwd (max: the first matching element).
# P2: a switch, pydnn.tuning.pooling.P2 (default True)
# The same with threads along c (p2_*<T, MAX, true>) for channels-last layouts whose channels take no vectors
# (C not a multiple of the vector): NHWC average backward ran at 0.74-0.78x PyTorch on the scalar bwd (fp32
# 10x933x103x103, bf16 39x66x53x53; H200, tools/sweep_memory.py).
# P2_CLAST: a switch, pydnn.tuning.pooling.P2_CLAST (default True)
P2_WIN, P2_COV = 3, 2  # kP2Win, kP2Cov


def _p2_ok(kernel, flags, descs, geometry):
    """None (not p2), False (p2, threads along w) or True (p2 CLAST, threads along c)."""
    if not tuning.pooling.P2 or flags & FLAG_ADAPTIVE or (kernel.startswith("bwd") and not tuning.pooling.P2_BWD):
        return None
    ins, outs, win, pad, stride = geometry
    if ins[0] != 1 or outs[0] != 1 or win[0] != 1:
        return None
    if kernel.startswith("fwd"):
        if win[1] > P2_WIN or win[2] > P2_WIN:
            return None
    elif any(-(-win[k] // stride[k]) > P2_COV for k in (1, 2)):
        return None
    for d in descs:
        if d.span_bytes() // d.itemsize >= 2**31 or any(s < 0 for s in d.strides):
            return None
    dims, strides = _five(descs[0])
    if dims[4] > 1 and strides[4] == 1:
        return False
    if dims[1] > 1 and strides[1] == 1:
        return True if tuning.pooling.P2_CLAST else None
    return False if dims[4] == 1 else None


# p2t_bwd (ptx/pooling.cu): the max backward of p2_bwd's NCHW-like problems (threads along w) with windows of at
# most 3 x 3: a block per band of rows of one (n, c) plane finds each covering window's winner (the first
# element matching y) once into shared memory, then gathers per dx element. Why: p2_bwd re-derives up to 4
# covering windows per element and re-scans one on every match (max 3x3/2 NCHW fp32 101x38x50x50 0.474 ms
# against PyTorch's 0.122 from saved indices, fp16 2x168x55x55 0.056 / 0.030; H200, tools/sweep_memory.py).
# Same bits as p2_bwd. Bands: the whole plane while its covering windows fit P2T_WIN and its elements P2T_ELEMS,
# halved while there are fewer than P2T_MIN_BLOCKS blocks and a band keeps >= 1024 elements.
# P2T_BWD / P2T_MIN_PLANE: switches, pydnn.tuning.pooling
P2T_WIN = 2048        # kP2tWin
P2T_ELEMS = 8192      # dx elements a block writes at most (32 a thread)
P2T_MIN_BLOCKS = 528  # a wave at 4 blocks an SM (64 registers a thread) over an H100 / H200's 132 SMs


def _p2t_band(geometry, planes):
    """(rows per band, bands per plane) of p2t_bwd, or None when a band of one row has too many windows."""
    ins, outs, win, pad, stride = geometry
    H, W, OW = ins[1], ins[2], outs[2]
    if win[1] > P2_WIN or win[2] > P2_WIN or H * W < tuning.pooling.P2T_MIN_PLANE:
        return None

    def cov(e):  # covering() of ptx/pooling.cu along h
        a = e + pad[1]
        return (0 if a - win[1] < 0 else (a - win[1]) // stride[1] + 1), min(a // stride[1], outs[1] - 1)

    def rows(th):  # the most window rows a band holds
        return max(cov(min(H, h0 + th) - 1)[1] - cov(h0)[0] + 1 for h0 in range(0, H, th))

    th = H
    while th > 1 and (th * W > P2T_ELEMS or rows(th) * OW > P2T_WIN):
        th = (th + 1) // 2
    if rows(th) * OW > P2T_WIN or th * W > P2T_ELEMS:
        return None
    while th > 1 and planes * -(-H // th) < P2T_MIN_BLOCKS and ((th + 1) // 2) * W >= 1024:
        th = (th + 1) // 2
    return th, -(-H // th)


def _p2t_launch(lc, tag, out_desc, geometry):
    """Turn lc (p2_bwd's max launch) into p2t_bwd's where _p2t_band allows; True when it did."""
    dims = _five(out_desc)[0]
    planes = dims[0] * dims[1]
    band = _p2t_band(geometry, planes)
    if band is None or planes * band[1] > MAX_GRID:
        return False
    lc.expr = _p2t_expr(tag)
    lc.params.div[0], lc.params.div[1] = band[1], band[0]
    lc.grid = (planes * band[1], 1, 1)
    return True


class _Plan:
    """launches[0] when every pointer is 16-byte aligned (or there is only one), else launches[-1]."""

    __slots__ = ("launches", "need", "unit", "itemsize", "crec", "crec_obj")


def _vec_ok(vec, descs):
    """16-byte channel vectors work for these operands (pointer alignment is checked per call)."""
    c = descs[0].dims[1]
    if vec == 1 or c % vec:
        return False
    for d in descs:
        dims, strides = _five(d)
        if strides[1] != 1 or any(s % vec for k, (n, s) in enumerate(zip(dims, strides)) if k != 1 and n > 1):
            return False
    return True


def _params(kmode, flags, out_desc, x_desc, p_desc, y_desc, geometry, vec):
    """The kernel parameters, pointers and scalars left for the call. geometry = (in, out, win, pad, stride),
    each 3 long (spatial d, h, w)."""
    p = PoolParams()
    p.mode, p.flags = kmode, flags
    odims, ostr = _five(out_desc)
    size = list(odims)
    size[1] //= vec
    # threads run fastest along the written tensor's innermost dim (ties: the channel first)
    order = sorted(range(5), key=lambda k: (ostr[k] if odims[k] > 1 else 1 << 62, k != 1))
    acc = 1
    for k in order:
        p.div[k] = acc
        acc *= size[k]
    p.total = acc
    if acc < 2**32:
        p.flags |= FLAG_IDX32
    for k in range(5):
        p.size[k], p.os[k] = size[k], ostr[k]
        p.xs[k] = _five(x_desc)[1][k]
        p.ps[k] = _five(p_desc)[1][k] if p_desc is not None else 0
        p.ys[k] = _five(y_desc)[1][k] if y_desc is not None else 0
    for field, vals in zip(("in_dim", "out_dim", "win", "pad", "stride"), geometry):
        arr = getattr(p, field)
        for k in range(3):
            arr[k] = vals[k]
    return p


def _plan(handle, kmode, flags, out_desc, x_desc, p_desc, geometry, y_desc=None):
    """Validated descriptors -> _Plan (no kernel loaded). Backward: out = dx, p = dy, y = y; forward: out = y.
    pl.need: span bytes of out, x, then (backward) dy and y."""
    tag = TAG[out_desc.dtype]
    kernel = ("fwd_" if p_desc is None else "bwd_") + ("max" if kmode == KMODE_MAX else "avg")
    descs = [d for d in (out_desc, x_desc, p_desc, y_desc) if d is not None]
    vecs = ([vec_width(tag, tag)] if _vec_ok(vec_width(tag, tag), descs) else []) + [1]
    pl = _Plan()
    pl.launches = []
    for v in vecs:
        lc = _Launch()
        lc.vec, lc.expr = v, _expr(kernel, tag, v)
        lc.params = _params(kmode, flags, out_desc, x_desc, p_desc, y_desc, geometry, v)
        lc.grid = (max(1, min(-(-lc.params.total // THREADS), MAX_GRID)), 1, 1)
        lc.block = (THREADS, 1, 1)
        rows = _rows_shape(flags, x_desc, out_desc, geometry, v) if p_desc is None else None
        p2 = _p2_ok(kernel, flags, descs, geometry) if v == 1 and rows is None and lc.params.total < 2**31 else None
        if p2 is not None:
            lc.expr = _p2_expr(kernel, tag, p2)
            if p2 is False and kernel == "bwd_max" and tuning.pooling.P2T_BWD:
                _p2t_launch(lc, tag, out_desc, geometry)
        if kernel == "bwd_max" and v > 1 and tuning.pooling.BWD_PACKED_TIES:
            lc.expr = _expr("bwdp_max", tag, v)
        if rows is not None:
            lc.expr = _expr(kernel.replace("fwd", "rows"), tag, v)
            lc.grid, lc.block = rows
            if tuning.pooling.ROWS_FAST3:
                lc.params.flags |= FLAG_FAST3
            if tuning.pooling.ROWS_COLS:
                lc.params.flags |= FLAG_COLS
        lc.argv = driver.kernel_args(lc.params)
        lc.func = None
        pl.launches.append(lc)
    w2 = _win2_launch(kernel, tag, kmode, flags, out_desc, x_desc, p_desc, y_desc, geometry)
    if w2 is not None:  # ahead of the channel-vector launch too: both need 16-byte pointers
        pl.launches.insert(0, w2)
    pl.need = tuple(d.span_bytes() for d in descs)
    pl.unit = f"pooling.{tag}"
    pl.itemsize = _SIZES[tag]
    return pl


def _check32(geometry, adaptive, name):
    """The kernels compute windows in 32-bit ints (pooling_params.h): NOT_SUPPORTED beyond that."""
    ins, outs, win, pad, stride = geometry
    extent = 1
    for n, o, w, p, s in zip(ins, outs, win, pad, stride):
        big = n * o if adaptive else n + 2 * p + s
        extent *= n if adaptive else min(w, n)
        if big >= 2**31 or extent >= 2**31:
            raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED,
                             f"{name}: spatial dims {ins} with pooled dims {outs} exceed the kernels' 32-bit "
                             "window arithmetic")
    return geometry


def _pool_geometry(pd, x_desc, y_desc):
    return (_spatial3(x_desc.dims[2:], 1), _spatial3(y_desc.dims[2:], 1), _spatial3(pd.window, 1),
            _spatial3(pd.padding, 0), _spatial3(pd.stride, 1))


def _adaptive_geometry(x_desc, y_desc):
    return (_spatial3(x_desc.dims[2:], 1), _spatial3(y_desc.dims[2:], 1), (1, 1, 1), (0, 0, 0), (1, 1, 1))


def plan_summary(handle, out_desc, x_desc, p_desc=None, kmode=KMODE_MAX, flags=0, geometry=None):
    """For tests: [(expr, vec, total, grid, size, div) per launch, vector launch first]. Loads no kernel."""
    pl = _plan(handle, kmode, flags, out_desc, x_desc, p_desc, geometry or _adaptive_geometry(x_desc, out_desc),
               p_desc)
    return [(lc.expr, lc.vec, lc.params.total, lc.grid[0], tuple(lc.params.size), tuple(lc.params.div))
            for lc in pl.launches]


# ----------------------------------------------------------------------------- validation

def _float_same(named):
    first, fname = named[0]
    for d, n in named:
        float_tensor(d, n)
    for d, n in named[1:]:
        same_type(first, fname, d, n)


def _dims_equal(a, an, b, bn, what="dims"):
    if a.dims != b.dims:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{bn}: dims {b.dims} differ from {an} {what} {a.dims}")


def _pooled_pair(x_desc, xn, y_desc, yn):
    """x and y: N, C, 1 to 3 spatial dims, same N and C (the adaptive and global forms)."""
    if not 3 <= len(x_desc.dims) <= 5:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                         f"{xn}: has {len(x_desc.dims)} dims; pooling takes 3 to 5 (N, C, 1 to 3 spatial)")
    if len(y_desc.dims) != len(x_desc.dims) or y_desc.dims[:2] != x_desc.dims[:2]:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                         f"{yn}: dims {y_desc.dims} do not pool {xn} dims {x_desc.dims} (same N, C and dim count)")


def _validate_fwd(kind, pd, x_desc, y_desc):
    """kind: 'pool' (pd a descriptor), 'adaptive', 'global'. -> geometry."""
    _float_same([(x_desc, "xDesc"), (y_desc, "yDesc")])
    if kind == "pool":
        want = pooled_dims(pd, x_desc, "xDesc")
        if y_desc.dims != want:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                             f"yDesc: dims {y_desc.dims} differ from the pooled dims {want} of xDesc")
        geometry = _check32(_pool_geometry(pd, x_desc, y_desc), False, "xDesc")
    else:
        _pooled_pair(x_desc, "xDesc", y_desc, "yDesc")
        if kind == "global" and any(n != 1 for n in y_desc.dims[2:]):
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                             f"yDesc: dims {y_desc.dims}: global pooling gives spatial dims of 1")
        geometry = _check32(_adaptive_geometry(x_desc, y_desc), True, "xDesc")
    output_tensor(y_desc, "yDesc")
    return geometry


def _validate_bwd(kind, pd, y_desc, dy_desc, x_desc, dx_desc):
    named = [(d, n) for d, n in ((y_desc, "yDesc"), (dy_desc, "dyDesc"), (x_desc, "xDesc"), (dx_desc, "dxDesc"))
             if d is not None]
    _float_same(named)
    if y_desc is not None:
        _dims_equal(y_desc, "yDesc", dy_desc, "dyDesc")
    if x_desc is not None:
        _dims_equal(x_desc, "xDesc", dx_desc, "dxDesc")
    if kind == "pool":
        want = pooled_dims(pd, dx_desc, "dxDesc")
        if dy_desc.dims != want:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                             f"dyDesc: dims {dy_desc.dims} differ from the pooled dims {want} of dxDesc")
        geometry = _check32(_pool_geometry(pd, dx_desc, dy_desc), False, "dxDesc")
    else:
        _pooled_pair(dx_desc, "dxDesc", dy_desc, "dyDesc")
        if kind == "global" and any(n != 1 for n in dy_desc.dims[2:]):
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                             f"dyDesc: dims {dy_desc.dims}: global pooling gives spatial dims of 1")
        geometry = _check32(_adaptive_geometry(dx_desc, dy_desc), True, "dxDesc")
    output_tensor(dx_desc, "dxDesc")
    return geometry


# ----------------------------------------------------------------------------- launch

def _key(tag, *objs):
    """The handle's cache key for a call, or None when an argument is not what a key can hold."""
    if len(objs) == 3:  # the forward's (pooling, x, y): spelled out, this runs on every call
        p, x, y = objs
        key = ("pooling", tag, (p, getattr(p, "version", None)), (x, getattr(x, "version", None)),
               (y, getattr(y, "version", None)))
    else:
        key = ("pooling", tag) + tuple((o, getattr(o, "version", None)) for o in objs)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _prepare(handle, key, build, buffers):
    """The cached plan for `key`, or build() -> plan with its kernels looked up (after pointer checks)."""
    pl = handle.prepared.get(key) if key is not None else None
    if pl is None:
        pl = build()
        for (buf, name), need in zip(buffers, pl.need):  # pointer errors before any kernel is loaded
            element_aligned(device_ptr(buf, name, need), name, pl.itemsize)
        for lc in pl.launches:
            lc.func = handle.function(pl.unit, lc.expr)
        if not ew._entries_tried:  # the compiled entries, where no element-wise record set them up yet
            ew.plan_entries(pl.launches[0].func)
        if key is not None:
            handle.remember(key, pl)
    return pl


def _run(handle, pl, ptrs, names, alpha, beta):
    """ptrs: (out, x[, dy, y]) already resolved."""
    isz = pl.itemsize
    for q, n in zip(ptrs, names):
        if q % isz:
            element_aligned(q, n, isz)
    lcs = pl.launches
    if len(lcs) == 1:
        lc = lcs[0]
    else:  # every pointer 16-byte aligned: their bits together (no generator: a Python call per pointer)
        orb = 0
        for q in ptrs:
            orb |= q
        lc = lcs[0] if orb & 15 == 0 else lcs[-1]
    p = lc.params
    p.out, p.x = ptrs[0], ptrs[1]
    p.dy = ptrs[2] if len(ptrs) > 2 else None
    p.y = ptrs[3] if len(ptrs) > 3 else None
    p.alpha, p.beta = alpha, beta
    p.flags = (p.flags & ~FLAG_BETA) | (FLAG_BETA if beta != 0 else 0)
    driver.launch_args(lc.func, lc.grid, lc.block, 0, handle.cu_stream, lc.argv)


def _nan_flag(mode, nan_opt):
    return FLAG_NAN_PROP if KMODE[mode] == KMODE_MAX and nan_opt == E.PYDNN_PROPAGATE_NAN else 0


def _forward(handle, kind, key, mode, nan_opt, pd, alpha, x_desc, x, beta, y_desc, y):
    def build():
        geometry = _validate_fwd(kind, pd, x_desc, y_desc)
        kmode = KMODE[mode] if kind == "pool" else (KMODE_MAX if KMODE[mode] == KMODE_MAX else KMODE_AVG_EXCLUDE)
        flags = _nan_flag(mode, nan_opt) | (FLAG_ADAPTIVE if kind != "pool" else 0)
        return _plan(handle, kmode, flags, y_desc, x_desc, None, geometry)

    al, be = scalar("alpha", alpha), scalar("beta", beta)
    pl = _prepare(handle, key, build, ((y, "y"), (x, "x")))
    ptrs = (device_ptr(y, "y", pl.need[0]), device_ptr(x, "x", pl.need[1]))
    _run(handle, pl, ptrs, ("y", "x"), al, be)


def _backward(handle, kind, key, mode, nan_opt, pd, alpha, y_desc, y, dy_desc, dy, x_desc, x, beta, dx_desc, dx):
    """Max reads x and y (x[e] is matched against y); averages read dy only (x and y, when given, are
    checked but the kernel takes dy's pointer in their place)."""
    is_max = KMODE[mode] == KMODE_MAX

    def build():
        geometry = _validate_bwd(kind, pd, y_desc, dy_desc, x_desc, dx_desc)
        for d, b, n in ((y_desc, y, "y"), (x_desc, x, "x")):
            if d is not None:
                device_ptr(b, n, d.span_bytes())
        kmode = KMODE[mode] if kind == "pool" else (KMODE_MAX if is_max else KMODE_AVG_EXCLUDE)
        flags = _nan_flag(mode, nan_opt) | (FLAG_ADAPTIVE if kind != "pool" else 0)
        xd, yd = (x_desc, y_desc) if is_max else (dy_desc, dy_desc)
        return _plan(handle, kmode, flags, dx_desc, xd, dy_desc, geometry, yd)

    if is_max:
        bufs = ((dx, "dx"), (x, "x"), (dy, "dy"), (y, "y"))
    else:
        bufs = ((dx, "dx"), (dy, "dy"), (dy, "dy"), (dy, "dy"))
    al, be = scalar("alpha", alpha), scalar("beta", beta)
    pl = _prepare(handle, key, build, bufs)
    ptrs = tuple(device_ptr(b, n, need) for (b, n), need in zip(bufs, pl.need))
    # the gather reads x, y and dy elements other than the one it writes: dx shares memory with none of them
    for (_, n), q, d in zip(bufs[1:], ptrs[1:], (x_desc, dy_desc, y_desc) if is_max else (dy_desc,) * 3):
        no_partial_alias(ptrs[0], dx_desc, "dx", q, d, n, in_place=False)
    _run(handle, pl, ptrs, tuple(n for _, n in bufs), al, be)


@api
def pooling_forward(handle, pooling_desc, alpha, x_desc, x, beta, y_desc, y):
    """cudnnPoolingForward: y = alpha * pool(x) + beta * y. Statuses: BAD_PARAM (handle, descriptors, x's dim
    count not the pooling's + 2, a window larger than the padded input, y dims not the pooled dims, data
    types that differ, overlapping y, alpha / beta not numbers), BAD_PARAM_NULL_POINTER,
    BAD_PARAM_MISALIGNED_POINTER, NOT_SUPPORTED (data types other than float, double, half, bfloat16)."""
    if type(handle) is not Handle or not handle.alive:
        check_handle(handle)
    try:  # _key's, inline (the hot path): a cached call goes straight to _run
        key = ("pooling", "fwd", (pooling_desc, pooling_desc.version), (x_desc, x_desc.version),
               (y_desc, y_desc.version))
        pl = handle.prepared.get(key)
    except (AttributeError, TypeError):
        key, pl = _key("fwd", pooling_desc, x_desc, y_desc), None
    if pl is not None:
        al = alpha if type(alpha) is float else scalar("alpha", alpha)
        be = beta if type(beta) is float else scalar("beta", beta)
        checked = _buffers.CHECKED
        yp = y if type(y) is int and y > 0 and not checked else device_ptr(y, "y", pl.need[0])
        xp = x if type(x) is int and x > 0 and not checked else device_ptr(x, "x", pl.need[1])
        _run(handle, pl, (yp, xp), ("y", "x"), al, be)
        if ew.note is not None:  # the compiled entry keeps this call site (ew._setup_entries)
            _note_fwd(pl)
        return
    pd = pooling_desc if key is not None and key in handle.prepared else _set_desc(pooling_desc)
    _forward(handle, "pool", key, pd.mode, pd.nan_opt, pd, alpha, x_desc, x, beta, y_desc, y)
    if ew.note is not None and key is not None and (pl := handle.prepared.get(key)) is not None:
        _note_fwd(pl)


def _note_fwd(pl):
    """The plan's C record (made once: _run's pointer fields, scalars and flags) noted for the compiled entry."""
    try:
        pl.crec
    except AttributeError:
        fastcall.plan_record(pl, ("out", "x", "dy", "y"), PoolParams, ~FLAG_BETA, FLAG_BETA)
    ew.note(ew.K_POOL, pl, 1, False, False)


_py_pooling_forward = pooling_forward  # the Python function behind the compiled entry (ew._setup_entries)


@api
def pooling_backward(handle, pooling_desc, alpha, y_desc, y, dy_desc, dy, x_desc, x, beta, dx_desc, dx):
    """cudnnPoolingBackward: dx = alpha * dpool + beta * dx (deterministic gather; max: dy to each window's
    first element matching y, which must be the forward's output). Statuses as pooling_forward, plus dims
    that differ between y and dy or x and dx."""
    if type(handle) is not Handle or not handle.alive:
        check_handle(handle)
    try:  # _key's, inline (the hot path): a cached call with int pointers goes straight to _run
        key = ("pooling", "bwd", (pooling_desc, pooling_desc.version), (y_desc, y_desc.version),
               (dy_desc, dy_desc.version), (x_desc, x_desc.version), (dx_desc, dx_desc.version))
        pl = handle.prepared.get(key)
    except (AttributeError, TypeError):
        key, pl = _key("bwd", pooling_desc, y_desc, dy_desc, x_desc, dx_desc), None
    # The cached call (as pooling_forward's): 43-44 Python calls a call before (the CNN demo's two backward
    # pools, tools/PERF.md "cnn: where the demos' steps go"), 6 with it (tests/ops/pooling/test_pooling_fastbwd_cpu.py).
    if pl is not None and type(alpha) is float and type(beta) is float and not _buffers.CHECKED:
        # as _backward's cached call: max reads x and y, averages dy only; dx shares memory with none of them
        # (an overlap, or a pointer that is not a positive int, takes the full path, which names it)
        is_max = KMODE[pooling_desc.mode] == KMODE_MAX
        ptrs = (dx, x, dy, y) if is_max else (dx, dy, dy, dy)
        need = pl.need
        ok = True
        for q in ptrs:
            if type(q) is not int or q <= 0:
                ok = False
        if ok:
            n0 = need[0]
            for q, n in zip(ptrs[1:], need[1:]):
                if dx < q + n and q < dx + n0:
                    ok = False
        if ok:
            _run(handle, pl, ptrs, _BWD_NAMES[is_max], alpha, beta)
            return
    pd = pooling_desc if key is not None and key in handle.prepared else _set_desc(pooling_desc)
    _backward(handle, "pool", key, pd.mode, pd.nan_opt, pd, alpha, y_desc, y, dy_desc, dy, x_desc, x, beta,
              dx_desc, dx)


_BWD_NAMES = {True: ("dx", "x", "dy", "y"), False: ("dx", "dy", "dy", "dy")}


@api
def adaptive_pooling_forward(handle, mode, maxpooling_nan_opt, alpha, x_desc, x, beta, y_desc, y):
    """pydnnAdaptivePoolingForward (extension): y = alpha * pool(x) + beta * y with windows
    [floor(o * in / out), ceil((o + 1) * in / out)) per spatial dim. Statuses as pooling_forward (y must
    have x's N, C and dim count)."""
    check_handle(handle)
    m, n = _mode_nan(mode, maxpooling_nan_opt)
    _forward(handle, "adaptive", _key(("afwd", m, n), x_desc, y_desc), m, n, None, alpha, x_desc, x, beta, y_desc, y)


@api
def adaptive_pooling_backward(handle, mode, maxpooling_nan_opt, alpha, y_desc, y, dy_desc, dy, x_desc, x, beta,
                              dx_desc, dx):
    """pydnnAdaptivePoolingBackward (extension): the gradient of adaptive_pooling_forward (deterministic)."""
    check_handle(handle)
    m, n = _mode_nan(mode, maxpooling_nan_opt)
    _backward(handle, "adaptive", _key(("abwd", m, n), y_desc, dy_desc, x_desc, dx_desc), m, n, None, alpha,
              y_desc, y, dy_desc, dy, x_desc, x, beta, dx_desc, dx)


@api
def global_average_pooling_forward(handle, alpha, x_desc, x, beta, y_desc, y):
    """pydnnGlobalAveragePoolingForward (extension): y (N, C, 1, ...) = alpha * spatial mean of x + beta * y."""
    check_handle(handle)
    mode = E.PYDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING
    _forward(handle, "global", _key("gfwd", x_desc, y_desc), mode, E.PYDNN_NOT_PROPAGATE_NAN, None, alpha, x_desc,
             x, beta, y_desc, y)


@api
def global_average_pooling_backward(handle, alpha, dy_desc, dy, beta, dx_desc, dx):
    """pydnnGlobalAveragePoolingBackward (extension): dx = alpha * dy / (spatial size) + beta * dx."""
    check_handle(handle)
    mode = E.PYDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING
    _backward(handle, "global", _key("gbwd", dy_desc, dx_desc), mode, E.PYDNN_NOT_PROPAGATE_NAN, None, alpha,
              None, None, dy_desc, dy, None, None, beta, dx_desc, dx)

# the compiled entries over this module's Python functions (_elementwise._setup_entries)
ew.register_entries(sys.modules[__name__], "pooling_forward")
