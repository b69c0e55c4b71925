"""Tensor and filter descriptors (cudnnCreate/Set/Get/DestroyTensorDescriptor, ...FilterDescriptor).

Descriptors are plain records: each setter validates all its arguments before changing anything, and the
error names the C argument (`dimA[2]`, `nbDims`, ...) so Python and C callers read the same message.
"""
import numpy as np

from . import enums as E
from .status import PydnnError, api
from .tuning import RECORDS_GEN, _records_count

# data type -> (bytes per element, numpy dtype used for host copies; bf16 travels as uint16)
DTYPES = {
    E.PYDNN_DATA_FLOAT: (4, np.float32),
    E.PYDNN_DATA_DOUBLE: (8, np.float64),
    E.PYDNN_DATA_HALF: (2, np.float16),
    E.PYDNN_DATA_BFLOAT16: (2, np.uint16),
    E.PYDNN_DATA_INT8: (1, np.int8),
    E.PYDNN_DATA_UINT8: (1, np.uint8),
    E.PYDNN_DATA_INT32: (4, np.int32),
    E.PYDNN_DATA_INT64: (8, np.int64),
}
FLOAT_TYPES = (E.PYDNN_DATA_FLOAT, E.PYDNN_DATA_DOUBLE, E.PYDNN_DATA_HALF, E.PYDNN_DATA_BFLOAT16)
DTYPE_NAMES = {v: k for k, v in E.ENUMS["pydnnDataType_t"].items() if v in DTYPES}
FORMATS = (E.PYDNN_TENSOR_NCHW, E.PYDNN_TENSOR_NHWC)
MAX_DIMS = E.PYDNN_DIM_MAX


def index_of(v):
    """v as a Python int when it is an integer (an int, a numpy integer, anything whose __index__ answers;
    never a bool or a float), else None. Never raises: a 4-element array has __index__ too, and refuses."""
    if isinstance(v, (bool, float)) or not hasattr(v, "__index__"):
        return None
    try:
        return v.__index__()
    except Exception:  # noqa: BLE001
        return None


def _int(name, v):
    if isinstance(v, (bool, float)) or not hasattr(v, "__index__"):
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: expected an integer, got {type(v).__name__}")
    try:
        return v.__index__()
    except Exception as e:  # noqa: BLE001 - a 4-element array has __index__ too, and refuses
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                         f"{name}: expected an integer, got {type(v).__name__} ({e})") from None


def _dtype(name, v):
    v = _int(name, v)
    if v not in DTYPES:
        if v in E.ENUMS["pydnnDataType_t"].values():
            raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED, f"{name}: data type {v} is not supported by pydnn")
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: {v} is not a pydnnDataType_t value")
    return v


def _format(name, v):
    v = _int(name, v)
    if v not in FORMATS:
        if v in E.ENUMS["pydnnTensorFormat_t"].values():
            raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED, f"{name}: tensor format {v} is not supported")
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: {v} is not a pydnnTensorFormat_t value")
    return v


def _dims(name, nb_dims, dims, lo=1):
    nb = _int("nbDims", nb_dims)
    if not lo <= nb <= MAX_DIMS:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"nbDims: {nb} is outside [{lo}, {MAX_DIMS}]")
    try:
        seq = list(dims)
    except TypeError:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: expected a sequence of {nb} integers") from None
    if len(seq) < nb:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: has {len(seq)} entries, nbDims is {nb}")
    out = []
    for i in range(nb):
        d = _int(f"{name}[{i}]", seq[i])
        if d <= 0:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}[{i}]: {d} must be positive")
        if d >= 1 << 62:
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}[{i}]: {d} is too large")
        out.append(d)
    return tuple(out)


def _pos(name, v):
    """One positive integer argument (a dim or a stride)."""
    d = _int(name, v)
    if d <= 0:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: {d} must be positive")
    if d >= 1 << 62:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: {d} is too large")
    return d


def packed_strides(dims, fmt):
    """Fully packed strides: row-major for NCHW, channels innermost for NHWC (N, spatial..., C)."""
    n = len(dims)
    order = list(range(n)) if fmt == E.PYDNN_TENSOR_NCHW or n < 3 else [0] + list(range(2, n)) + [1]
    strides, acc = [0] * n, 1
    for d in reversed(order):
        strides[d] = acc
        acc *= dims[d]
    return tuple(strides)


SPAN_LIMIT = 1 << 62  # bytes a tensor may span, and the largest stride (elements)


class TensorDescriptor:
    """cudnnTensorDescriptor_t: data type, dims and strides (in elements)."""

    __slots__ = ("dtype", "dims", "strides", "is_set", "alive", "version", "_span", "__weakref__")

    def __init__(self):
        self.dtype, self.dims, self.strides = E.PYDNN_DATA_FLOAT, (), ()
        self.is_set, self.alive, self.version, self._span = False, True, 0, 0

    def _assign(self, dtype, dims, strides):
        # `version` changes with every set (and destroy): launch records cached per handle are keyed by
        # it, so a changed descriptor can never reuse a stale record.
        span = (sum((d - 1) * s for d, s in zip(dims, strides)) + 1) * DTYPES[dtype][0]
        if span >= SPAN_LIMIT or max(strides, default=0) >= SPAN_LIMIT:
            # no memory holds it, and kernels take 64-bit offsets: refused here rather than overflowing later
            raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                             f"tensorDesc: dims {list(dims)} with strides {list(strides)} span {span} bytes, "
                             f"more than 2^62")
        self.dtype, self.dims, self.strides, self.is_set = dtype, dims, strides, True
        self._span = span
        self.version += 1
        RECORDS_GEN[0] = next(_records_count)  # tuning.bump_records inline: also where a Get* writes a
        # caller's descriptor (the MHA weights, RNN params), which api() does not see as a Set

    @property
    def itemsize(self):
        return DTYPES[self.dtype][0]

    @property
    def count(self):
        c = 1
        for d in self.dims:
            c *= d
        return c

    def span_bytes(self):
        """Bytes from the first to one past the last element (what cudnnGetTensorSizeInBytes reports)."""
        return self._span

    def non_overlapping(self):
        """No two elements share an address (required of every output)."""
        pairs = sorted((s, d) for d, s in zip(self.dims, self.strides) if d > 1)
        reach = 1
        for s, d in pairs:
            if s < reach:
                return False
            reach = s * d
        return True

    def __repr__(self):
        return (f"TensorDescriptor({DTYPE_NAMES.get(self.dtype, self.dtype)}, dims={self.dims}, "
                f"strides={self.strides})")


def check_tensor(desc, name):
    """A set, live tensor descriptor, or BAD_PARAM naming the argument."""
    if type(desc) is not TensorDescriptor or not desc.alive:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: not a live tensor descriptor")
    if not desc.is_set:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: descriptor was never set")
    return desc


@api
def create_tensor_descriptor():
    """cudnnCreateTensorDescriptor."""
    return TensorDescriptor()


@api
def destroy_tensor_descriptor(tensor_desc):
    """cudnnDestroyTensorDescriptor (destroying None is a no-op, like cuDNN with NULL)."""
    if tensor_desc is None:
        return
    if type(tensor_desc) is not TensorDescriptor or not tensor_desc.alive:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, "tensorDesc: not a live tensor descriptor")
    tensor_desc.alive = False
    tensor_desc.version += 1


def _live(desc, name="tensorDesc"):
    if type(desc) is not TensorDescriptor or not desc.alive:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: not a live tensor descriptor")
    return desc


@api
def set_tensor4d_descriptor(tensor_desc, format, data_type, n, c, h, w):  # noqa: A002 - cuDNN's name
    """cudnnSetTensor4dDescriptor: packed NCHW or NHWC."""
    _live(tensor_desc)
    fmt = _format("format", format)
    dt = _dtype("dataType", data_type)
    dims = tuple(_pos(nm, v) for nm, v in zip("nchw", (n, c, h, w)))
    tensor_desc._assign(dt, dims, packed_strides(dims, fmt))


@api
def set_tensor4d_descriptor_ex(tensor_desc, data_type, n, c, h, w, n_stride, c_stride, h_stride, w_stride):
    """cudnnSetTensor4dDescriptorEx: explicit strides."""
    _live(tensor_desc)
    dt = _dtype("dataType", data_type)
    dims = tuple(_pos(nm, v) for nm, v in zip("nchw", (n, c, h, w)))
    strides = tuple(_pos(nm, v) for nm, v in
                    zip(("nStride", "cStride", "hStride", "wStride"), (n_stride, c_stride, h_stride, w_stride)))
    tensor_desc._assign(dt, dims, strides)


@api
def set_tensor_nd_descriptor(tensor_desc, data_type, nb_dims, dim_a, stride_a):
    """cudnnSetTensorNdDescriptor: nbDims in [1, 8] (cuDNN asks for >= 3; pydnn takes fewer too)."""
    _live(tensor_desc)
    dt = _dtype("dataType", data_type)
    dims = _dims("dimA", nb_dims, dim_a)
    strides = _dims("strideA", nb_dims, stride_a)
    tensor_desc._assign(dt, dims, strides)


@api
def set_tensor_nd_descriptor_ex(tensor_desc, format, data_type, nb_dims, dim_a):  # noqa: A002
    """cudnnSetTensorNdDescriptorEx: packed strides from a format."""
    _live(tensor_desc)
    fmt = _format("format", format)
    dt = _dtype("dataType", data_type)
    dims = _dims("dimA", nb_dims, dim_a)
    tensor_desc._assign(dt, dims, packed_strides(dims, fmt))


@api
def get_tensor4d_descriptor(tensor_desc):
    """cudnnGetTensor4dDescriptor -> (dataType, n, c, h, w, nStride, cStride, hStride, wStride)."""
    d = check_tensor(tensor_desc, "tensorDesc")
    if len(d.dims) != 4:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"tensorDesc: has {len(d.dims)} dims, not 4")
    return (d.dtype, *d.dims, *d.strides)


@api
def get_tensor_nd_descriptor(tensor_desc, nb_dims_requested):
    """cudnnGetTensorNdDescriptor -> (dataType, nbDims, dimA[:requested], strideA[:requested])."""
    d = check_tensor(tensor_desc, "tensorDesc")
    req = _int("nbDimsRequested", nb_dims_requested)
    if req < 0:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"nbDimsRequested: {req} is negative")
    return d.dtype, len(d.dims), list(d.dims[:req]), list(d.strides[:req])


@api
def get_tensor_size_in_bytes(tensor_desc):
    """cudnnGetTensorSizeInBytes: bytes spanned by the descriptor's elements."""
    return check_tensor(tensor_desc, "tensorDesc").span_bytes()


# ---------------------------------------------------------------- filters
class FilterDescriptor:
    """cudnnFilterDescriptor_t: data type, format and dims (K, C, spatial...)."""

    __slots__ = ("dtype", "format", "dims", "is_set", "alive", "__weakref__")

    def __init__(self):
        self.dtype, self.format, self.dims, self.is_set, self.alive = E.PYDNN_DATA_FLOAT, E.PYDNN_TENSOR_NCHW, (), False, True

    @property
    def strides(self):
        return packed_strides(self.dims, self.format)


def check_filter(desc, name):
    if type(desc) is not FilterDescriptor or not desc.alive:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: not a live filter descriptor")
    if not desc.is_set:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: descriptor was never set")
    return desc


def _live_filter(desc):
    if type(desc) is not FilterDescriptor or not desc.alive:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, "filterDesc: not a live filter descriptor")
    return desc


@api
def create_filter_descriptor():
    """cudnnCreateFilterDescriptor."""
    return FilterDescriptor()


@api
def destroy_filter_descriptor(filter_desc):
    """cudnnDestroyFilterDescriptor."""
    if filter_desc is None:
        return
    _live_filter(filter_desc).alive = False


@api
def set_filter4d_descriptor(filter_desc, data_type, format, k, c, h, w):  # noqa: A002
    """cudnnSetFilter4dDescriptor (note: dataType before format, as in cuDNN)."""
    _live_filter(filter_desc)
    dt = _dtype("dataType", data_type)
    fmt = _format("format", format)
    dims = tuple(_pos(nm, v) for nm, v in zip("kchw", (k, c, h, w)))
    filter_desc.dtype, filter_desc.format, filter_desc.dims, filter_desc.is_set = dt, fmt, dims, True


@api
def set_filter_nd_descriptor(filter_desc, data_type, format, nb_dims, filter_dim_a):  # noqa: A002
    """cudnnSetFilterNdDescriptor: nbDims in [3, 8]."""
    _live_filter(filter_desc)
    dt = _dtype("dataType", data_type)
    fmt = _format("format", format)
    dims = _dims("filterDimA", nb_dims, filter_dim_a, lo=3)
    filter_desc.dtype, filter_desc.format, filter_desc.dims, filter_desc.is_set = dt, fmt, dims, True


@api
def get_filter4d_descriptor(filter_desc):
    """cudnnGetFilter4dDescriptor -> (dataType, format, k, c, h, w)."""
    d = check_filter(filter_desc, "filterDesc")
    if len(d.dims) != 4:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"filterDesc: has {len(d.dims)} dims, not 4")
    return (d.dtype, d.format, *d.dims)


@api
def get_filter_nd_descriptor(filter_desc, nb_dims_requested):
    """cudnnGetFilterNdDescriptor -> (dataType, format, nbDims, filterDimA[:requested])."""
    d = check_filter(filter_desc, "filterDesc")
    req = _int("nbDimsRequested", nb_dims_requested)
    if req < 0:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"nbDimsRequested: {req} is negative")
    return d.dtype, d.format, len(d.dims), list(d.dims[:req])


@api
def get_filter_size_in_bytes(filter_desc):
    """cudnnGetFilterSizeInBytes."""
    d = check_filter(filter_desc, "filterDesc")
    c = 1
    for x in d.dims:
        c *= x
    return c * DTYPES[d.dtype][0]
