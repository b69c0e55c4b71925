"""Device buffer arguments: an int pointer, or any object with __cuda_array_interface__ or DLPack.

When the object says how large it is, the descriptor's span is checked against it, so a too-small buffer
is refused instead of written past.
"""
import ctypes
import os

from . import enums
from .status import PydnnError

_KDL_CUDA, _KDL_CUDA_MANAGED = 2, 13


def _span_bytes(shape, strides, itemsize):
    if not shape:
        return itemsize
    if any(s == 0 for s in shape):
        return 0
    return (sum((d - 1) * abs(st) for d, st in zip(shape, strides)) + 1) * itemsize


def _cai_extent(cai):
    shape = tuple(cai.get("shape", ()))
    typestr = cai.get("typestr", "|u1")
    itemsize = int(typestr[2:]) if typestr[2:].isdigit() else 1
    strides = cai.get("strides")
    if strides is None:  # C-contiguous: the elements times their size (0 for an empty array)
        n = itemsize
        for d in shape:
            n *= d
        return n
    return _span_bytes(shape, [s // itemsize if itemsize else s for s in strides], itemsize)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_capsule_ptr = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_ptr.restype = ctypes.c_void_p
_capsule_ptr.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _from_dlpack(obj, name):
    dev_type, _ = obj.__dlpack_device__()
    if dev_type not in (_KDL_CUDA, _KDL_CUDA_MANAGED):
        raise PydnnError(enums.PYDNN_STATUS_BAD_PARAM,
                         f"{name}: DLPack device type {dev_type} is not CUDA memory")
    try:
        cap = obj.__dlpack__(stream=-1)  # -1: the producer must not synchronize on our behalf
    except TypeError:
        cap = obj.__dlpack__()
    t = _DLTensor.from_address(_capsule_ptr(cap, b"dltensor"))
    ptr = (t.data or 0) + t.byte_offset
    itemsize = max(1, (t.dtype.bits * t.dtype.lanes) // 8)
    shape = [t.shape[i] for i in range(t.ndim)]
    if t.strides:
        strides = [t.strides[i] for i in range(t.ndim)]
    else:
        strides, acc = [], 1
        for d in reversed(shape):
            strides.append(acc)
            acc *= d
        strides.reverse()
    return ptr, _span_bytes(shape, strides, itemsize)


# PYDNN_CHECKED=1: also check int pointers against the driver's record of the allocation holding them
# (costs two driver queries per buffer per call; for debugging, off by default).
CHECKED = os.environ.get("PYDNN_CHECKED", "0") == "1"


def _check_allocation(ptr, name, need_bytes):
    from ._cuda import driver

    rng = driver.allocation_range(ptr)
    if rng is None:
        raise PydnnError(enums.PYDNN_STATUS_BAD_PARAM, f"{name}: {ptr:#x} is not in a device allocation")
    start, size = rng
    if ptr + need_bytes > start + size:
        raise PydnnError(enums.PYDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT,
                         f"{name}: the allocation holds {start + size - ptr} bytes from {ptr:#x} but the "
                         f"descriptor spans {need_bytes}")


def _int_ptr(obj, name, need_bytes):
    if obj == 0:
        raise PydnnError(enums.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, f"{name}: NULL pointer")
    if obj < 0:
        raise PydnnError(enums.PYDNN_STATUS_BAD_PARAM, f"{name}: negative address {obj}")
    if CHECKED:
        _check_allocation(obj, name, need_bytes)
    return obj


def _checked(ptr, extent, name, need_bytes):
    if ptr == 0 and need_bytes:
        raise PydnnError(enums.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, f"{name}: NULL data pointer")
    if extent < need_bytes:
        raise PydnnError(enums.PYDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT,
                         f"{name}: buffer holds {extent} bytes but the descriptor spans {need_bytes}")
    return ptr


def _generic_extent(obj, name):
    """(address, extent in bytes) through __cuda_array_interface__ or DLPack; None if the object has
    neither. An object whose protocol method itself fails is the caller's bad argument (BAD_PARAM)."""
    try:
        cai = getattr(obj, "__cuda_array_interface__", None)
    except Exception as e:  # noqa: BLE001 - e.g. torch refuses it for a tensor that requires grad
        cai, cai_error = None, e
    else:
        cai_error = None
    try:
        if cai is not None:
            return int(cai["data"][0]), _cai_extent(cai)
        if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
            return _from_dlpack(obj, name)
    except PydnnError:
        raise
    except Exception as e:  # noqa: BLE001 - a malformed interface: the argument's fault, said so
        raise PydnnError(enums.PYDNN_STATUS_BAD_PARAM,
                         f"{name}: {type(obj).__name__}'s device-array interface failed: "
                         f"{type(e).__name__}: {e}") from None
    if cai_error is not None:
        raise PydnnError(enums.PYDNN_STATUS_BAD_PARAM,
                         f"{name}: {type(obj).__name__}.__cuda_array_interface__ failed: {cai_error}") from None
    return None


def _generic_ptr(obj, name, need_bytes):
    """Any object: __cuda_array_interface__, then DLPack, then __int__ (a pointer-like object)."""
    found = _generic_extent(obj, name)
    if found is not None:
        return _checked(found[0], found[1], name, need_bytes)
    if hasattr(obj, "__int__") and not isinstance(obj, (float, bool, complex)):
        try:
            v = int(obj)
        except Exception as e:  # noqa: BLE001 - the object's own __int__ failed
            raise PydnnError(enums.PYDNN_STATUS_BAD_PARAM,
                             f"{name}: {type(obj).__name__} is not a device pointer ({e})") from None
        return _int_ptr(v, name, need_bytes)
    raise PydnnError(enums.PYDNN_STATUS_BAD_PARAM,
                     f"{name}: {type(obj).__name__} is not a device pointer, "
                     "__cuda_array_interface__ or DLPack object")


def _integral_ptr(obj, name, need_bytes):
    """numpy integers and other numbers.Integral: a pointer value."""
    return _int_ptr(obj.__index__(), name, need_bytes)


def _torch_span(t):
    """Bytes spanned by a torch tensor's elements (its strides are in elements, never negative)."""
    return _span_bytes(tuple(t.shape), t.stride(), t.element_size())


def _torch_ptr(t, name, need_bytes):
    """torch.Tensor / nn.Parameter without building __cuda_array_interface__'s dict (which costs several
    microseconds a buffer): four C-level attribute reads, and the exact span only for a non-contiguous
    tensor or one smaller than the descriptor."""
    if not t.is_cuda:
        raise PydnnError(enums.PYDNN_STATUS_BAD_PARAM,
                         f"{name}: a torch tensor on device {t.device} is not CUDA memory")
    ptr = t.data_ptr()
    if need_bytes:
        if ptr == 0:
            raise PydnnError(enums.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, f"{name}: NULL data pointer")
        if t.nbytes < need_bytes or not t.is_contiguous():
            return _checked(ptr, _torch_span(t), name, need_bytes)
    return ptr


def _torch_extent(t, name):
    if not t.is_cuda:
        raise PydnnError(enums.PYDNN_STATUS_BAD_PARAM,
                         f"{name}: a torch tensor on device {t.device} is not CUDA memory")
    return t.data_ptr(), _torch_span(t)


def _cupy_extent(a, name):
    strides, itemsize = a.strides, a.itemsize
    return a.data.ptr, _span_bytes(a.shape, [st // itemsize for st in strides], itemsize)


def _cupy_ptr(a, name, need_bytes):
    """cupy.ndarray: its MemoryPointer's address; the exact span only when needed (as for torch)."""
    ptr = a.data.ptr
    if need_bytes:
        if ptr == 0:
            raise PydnnError(enums.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, f"{name}: NULL data pointer")
        if a.nbytes < need_bytes or not a.flags.c_contiguous:
            return _checked(ptr, _cupy_extent(a, name)[1], name, need_bytes)
    return ptr


# Exact types with a fast path, recognized by module and name so that torch and cupy are never imported:
# (module, qualified name) -> (resolver, extent function used once per type to verify the resolver against
# the generic protocol). Subclasses (tensor subclasses with __torch_function__, FakeTensor, ...) take the
# generic path: their data_ptr() may mean something else.
def _detached(t):
    """What torch's own protocols accept: a tensor that requires grad refuses both until detached (the
    same memory)."""
    return t.detach() if t.requires_grad else t


_FAST = {
    ("torch", "Tensor"): (_torch_ptr, _torch_extent, _detached),
    ("torch.nn.parameter", "Parameter"): (_torch_ptr, _torch_extent, _detached),
    ("cupy", "ndarray"): (_cupy_ptr, _cupy_extent, None),
    ("cupy._core.core", "ndarray"): (_cupy_ptr, _cupy_extent, None),
}

# type -> resolver(obj, name, need_bytes) -> address; filled on the first object of each type
_RESOLVERS = {}
# torch.Tensor itself once a CUDA tensor's data_ptr() agreed with its __cuda_array_interface__ (_resolver):
# device_ptr and the hot calls (activation_forward, Graph.execute) test `type(obj) is TORCH_TENSOR` and read
# is_cuda, data_ptr(), nbytes and is_contiguous() inline - the same checks as _torch_ptr, which they call for
# anything else (a NULL, short or strided tensor: the exact span and the same errors). None until then (no
# type is None, so the test is simply false).
TORCH_TENSOR = None
# cupy.ndarray likewise, once an array's data.ptr / nbytes agreed with its __cuda_array_interface__: activation_forward's
# compiled entry reads data.ptr, nbytes and flags.c_contiguous as _cupy_ptr does (None until then)
CUPY_ARRAY = None
_MAX_TYPES = 256
_undecided = {}


def _agrees(obj, extent_fn, name, probe=None):
    """Whether a fast path reads the same address and extent as the object's own protocol (checked on the
    first object of a type; a disagreement, or a fast path that fails, keeps that type on the generic path)."""
    try:
        if probe is not None:
            obj = probe(obj)
        fast = extent_fn(obj, name)
        slow = _generic_extent(obj, name)
    except PydnnError:
        return None  # e.g. a CPU tensor: no verdict from this object; decide on a later one
    except Exception:  # noqa: BLE001 - an unexpected layout: never use the fast path for it
        return False
    return slow is not None and tuple(fast) == tuple(slow)


def _resolver(obj, name):
    global TORCH_TENSOR, CUPY_ARRAY
    import numbers

    t = type(obj)
    fast = _FAST.get((getattr(t, "__module__", None), getattr(t, "__qualname__", None)))
    if fast is not None:
        ok = _agrees(obj, fast[1], name, fast[2])
        if ok is True and fast[0] is _torch_ptr and t.__qualname__ == "Tensor":
            TORCH_TENSOR = t  # verified against the array interface: hot paths may test type(obj) is it
        if ok is True and fast[0] is _cupy_ptr:
            CUPY_ARRAY = t
        if ok is None:  # no verdict from this object (a CPU tensor, one that requires grad, ...)
            n = _undecided[t] = _undecided.get(t, 0) + 1
            if n < 4:
                return fast[0]  # used, not remembered: a later object of the type decides
            ok = True  # its own protocol refused several objects: the fast path, checked by its own reads
        r = fast[0] if ok else _generic_ptr
    elif issubclass(t, numbers.Integral) and t is not bool:
        r = _integral_ptr
    else:
        r = _generic_ptr
    if len(_RESOLVERS) >= _MAX_TYPES:
        _RESOLVERS.clear()
    _RESOLVERS[t] = r
    return r


def device_ptr(obj, name, need_bytes=0):
    """The device address in `obj`; refuses NULL, host arrays, and buffers smaller than `need_bytes`.

    An int is taken as is (the caller vouches for the extent unless PYDNN_CHECKED=1). Other objects are
    read through a resolver chosen once per type: torch tensors and cupy arrays through their own C-level
    attributes (no __cuda_array_interface__ dict), anything else through __cuda_array_interface__, DLPack
    or __int__."""
    if type(obj) is int:  # fast path: the caller vouches for the extent (unless PYDNN_CHECKED=1)
        if obj > 0 and not CHECKED:
            return obj
        return _int_ptr(obj, name, need_bytes)
    if type(obj) is TORCH_TENSOR:  # _torch_ptr's checks inline (one Python frame a tensor, not two)
        if obj.is_cuda:
            ptr = obj.data_ptr()
            if ptr and obj.nbytes >= need_bytes and obj.is_contiguous():
                return ptr
        return _torch_ptr(obj, name, need_bytes)
    if obj is None:
        raise PydnnError(enums.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, f"{name}: NULL pointer (None)")
    r = _RESOLVERS.get(type(obj))
    if r is None:
        r = _resolver(obj, name)
    return r(obj, name, need_bytes)
