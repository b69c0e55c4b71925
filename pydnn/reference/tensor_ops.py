"""Float64 references for the tensor ops (cuDNN semantics). Broadcasting follows numpy's rules, which
match cuDNN's 'equal or 1' rule for tensors of the same rank."""
import numpy as np

from .. import enums as E
from . import dtypes as rd

INT_TYPES = {E.PYDNN_DATA_INT8: np.int8, E.PYDNN_DATA_UINT8: np.uint8, E.PYDNN_DATA_INT32: np.int32,
             E.PYDNN_DATA_INT64: np.int64}


def op_tensor(op, alpha1, a, alpha2, b, beta, c0, propagate_nan=False):
    """C = op(alpha1 * A, alpha2 * B) + beta * C (SQRT, NOT: op(alpha1 * A); NOT is 1 - x). MIN / MAX
    return NaN for a NaN operand with propagate_nan, else the other operand."""
    x = alpha1 * np.asarray(a, np.float64)
    y = None if b is None else alpha2 * np.asarray(b, np.float64)
    with np.errstate(invalid="ignore"):
        if op == E.PYDNN_OP_TENSOR_ADD:
            r = x + y
        elif op == E.PYDNN_OP_TENSOR_MUL:
            r = x * y
        elif op in (E.PYDNN_OP_TENSOR_MIN, E.PYDNN_OP_TENSOR_MAX):
            f = (np.minimum if propagate_nan else np.fmin) if op == E.PYDNN_OP_TENSOR_MIN else \
                (np.maximum if propagate_nan else np.fmax)
            r = f(x, y)
        elif op == E.PYDNN_OP_TENSOR_SQRT:
            r = np.sqrt(x)
        elif op == E.PYDNN_OP_TENSOR_NOT:
            r = 1.0 - x
        else:
            raise ValueError(op)
    return r if beta == 0 else r + beta * np.asarray(c0, np.float64)


def scaled(alpha, a, beta, c0):
    """AddTensor / ScaleTensor / TransformTensor before rounding: alpha * a + beta * c (beta == 0 never
    reads c)."""
    r = alpha * np.asarray(a, np.float64)
    return r if beta == 0 else r + beta * np.asarray(c0, np.float64)


def convert(x, dtype):
    """float64 values as `dtype` holds them: floats rounded to nearest even; integers rounded to nearest
    even and saturated, NaN -> 0 (TransformTensor's and SetTensor's conversion)."""
    x = np.asarray(x, np.float64)
    if dtype in INT_TYPES:
        info = np.iinfo(INT_TYPES[dtype])
        with np.errstate(invalid="ignore"):
            r = np.where(np.isnan(x), 0.0, np.clip(np.rint(x), info.min, info.max))
        return r
    with np.errstate(over="ignore"):
        return rd.round_to(x, dtype)


def transform(alpha, x, beta, y0, dtype):
    """TransformTensor: alpha * x + beta * y rounded to y's data type (layouts are the caller's views)."""
    return convert(scaled(alpha, x, beta, y0), dtype)
