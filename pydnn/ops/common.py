"""Argument checks shared by the op families (messages name the C argument)."""
from .. import enums as E
from ..buffers import device_ptr
from ..status import PydnnError
from ..tensor import DTYPES, FLOAT_TYPES, _int, check_tensor

# pydnn data type -> short type tag used in kernel unit names and template expressions
TAG = {E.PYDNN_DATA_FLOAT: "f32", E.PYDNN_DATA_DOUBLE: "f64", E.PYDNN_DATA_HALF: "f16",
       E.PYDNN_DATA_BFLOAT16: "bf16", E.PYDNN_DATA_INT8: "i8", E.PYDNN_DATA_UINT8: "u8",
       E.PYDNN_DATA_INT32: "i32", E.PYDNN_DATA_INT64: "i64"}
FLOAT_TAGS = ("f32", "f64", "f16", "bf16")


def next_pow2(n):
    """The smallest power of two >= n (thread-group sizes)."""
    p = 1
    while p < n:
        p *= 2
    return p


def cdiv(a, b):
    """ceil(a / b) for positive integers (grid sizes)."""
    return -(-a // b)


def prod(xs):
    n = 1
    for v in xs:
        n *= v
    return n


def element_aligned(ptr, name, itemsize):
    """A device address aligned to its elements (the kernels read whole elements), else MISALIGNED_POINTER."""
    if ptr % itemsize:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER,
                         f"{name}: {ptr:#x} is not aligned to its {itemsize}-byte elements")
    return ptr


def no_partial_alias(out_ptr, out_desc, out_name, in_ptr, in_desc, in_name, in_place=True):
    """An output may share memory with an input only element for element (the same address and strides,
    when the op allows in place at all): any other overlap lets a kernel read an element that another
    thread has already overwritten, a silent wrong answer. Pointers are checked on every call."""
    if in_place and out_ptr == in_ptr and out_desc.strides == in_desc.strides:
        return
    if out_ptr < in_ptr + in_desc.span_bytes() and in_ptr < out_ptr + out_desc.span_bytes():
        how = "the same address and strides" if in_place else "separate memory"
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                         f"{out_name}: its memory overlaps {in_name}'s (this call needs {how})")


def scalar(name, v):
    """alpha / beta: a real number (host value, like cuDNN's host pointer to float or double)."""
    if type(v) is float:
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)) and not hasattr(v, "__float__"):
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: expected a number, got {type(v).__name__}")
    try:
        return float(v)
    except (TypeError, ValueError, OverflowError) as e:  # a 4-element array, an int past float's range
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: {type(v).__name__} is not a number ({e})") from None


def enum_arg(name, v, allowed, type_name):
    """An enum argument: an integer among `allowed`, else BAD_PARAM naming the argument and the type."""
    try:
        i = None if isinstance(v, bool) or not hasattr(v, "__index__") else v.__index__()
    except Exception:  # noqa: BLE001 - an object whose __index__ refuses (a 4-element array)
        i = None
    if i is None or i not in allowed:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: {v!r} is not a {type_name} value")
    return i


def float_tensor(desc, name, allowed=FLOAT_TYPES):
    check_tensor(desc, name)
    if desc.dtype not in allowed:
        raise PydnnError(E.PYDNN_STATUS_NOT_SUPPORTED,
                         f"{name}: data type {desc.dtype} is not supported here (float, double, half, bfloat16)")
    return desc


def same_shape(a, an, b, bn):
    if a.dims != b.dims:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{bn}: dims {b.dims} differ from {an} dims {a.dims}")


def same_type(a, an, b, bn):
    if a.dtype != b.dtype:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM,
                         f"{bn}: data type {b.dtype} differs from {an} data type {a.dtype}")


def output_tensor(desc, name):
    """An output must not have two elements at one address (a race and a wrong answer otherwise)."""
    if not desc.non_overlapping():
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: strides {desc.strides} make elements overlap")
    return desc


def buffer(obj, desc, name):
    """Device address of a buffer described by `desc` (size-checked when the object knows its size)."""
    return device_ptr(obj, name, desc.span_bytes())


__all__ = ["TAG", "FLOAT_TAGS", "DTYPES", "next_pow2", "cdiv", "prod", "element_aligned", "no_partial_alias", "scalar", "enum_arg", "float_tensor", "same_shape", "same_type",
           "output_tensor", "buffer"]
