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
    if strides is None:
        strides, acc = [], itemsize
        for d in reversed(shape):
            strides.append(acc)
            acc *= d
        strides = list(reversed(strides))
        return _span_bytes(shape, [s // itemsize for s in strides], itemsize)
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


def device_ptr(obj, name, need_bytes=0):
    """The device address in `obj`; refuses NULL, host arrays, and buffers smaller than `need_bytes`."""
    if type(obj) is int:  # fast path: the caller vouches for the extent (unless PYDNN_CHECKED=1)
        if obj == 0:
            raise PydnnError(enums.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, f"{name}: NULL pointer")
        if obj < 0:
            raise PydnnError(enums.PYDNN_STATUS_BAD_PARAM, f"{name}: negative address {obj}")
        if CHECKED:
            _check_allocation(obj, name, need_bytes)
        return obj
    if obj is None:
        raise PydnnError(enums.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, f"{name}: NULL pointer (None)")
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        ptr, extent = int(cai["data"][0]), _cai_extent(cai)
    elif hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        ptr, extent = _from_dlpack(obj, name)
    elif hasattr(obj, "__int__") and not isinstance(obj, (float, bool)):
        return device_ptr(int(obj), name, need_bytes)
    else:
        raise PydnnError(enums.PYDNN_STATUS_BAD_PARAM,
                         f"{name}: {type(obj).__name__} is not a device pointer, "
                         "__cuda_array_interface__ or DLPack object")
    if ptr == 0 and need_bytes:
        raise PydnnError(enums.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, f"{name}: NULL data pointer")
    if extent < need_bytes:
        raise PydnnError(enums.PYDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT,
                         f"{name}: buffer holds {extent} bytes but the descriptor spans {need_bytes}")
    return ptr
