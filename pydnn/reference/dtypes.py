"""Host-side storage conversions: float64 <-> each pydnn data type's bits, rounding as the GPU does."""
import numpy as np

from .. import enums as E


def bf16_bits_from_f32(a):
    """Round float32 to bfloat16 (nearest even; NaN stays NaN) and return the uint16 bits."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(a, dtype=np.float32))
    return np.where(nan, np.uint16(0x7FC0), rounded)


def f32_from_bf16_bits(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def to_storage(x, dtype):
    """float64 values -> the numpy array that holds them on the device for `dtype` (rounded)."""
    x = np.asarray(x, dtype=np.float64)
    if dtype == E.PYDNN_DATA_FLOAT:
        return x.astype(np.float32)
    if dtype == E.PYDNN_DATA_DOUBLE:
        return x.copy()
    if dtype == E.PYDNN_DATA_HALF:
        return x.astype(np.float16)
    if dtype == E.PYDNN_DATA_BFLOAT16:
        return bf16_bits_from_f32(x.astype(np.float32))  # f64->f32->bf16 can double-round; tests draw f32-exact values
    ints = {E.PYDNN_DATA_INT8: np.int8, E.PYDNN_DATA_UINT8: np.uint8, E.PYDNN_DATA_INT32: np.int32,
            E.PYDNN_DATA_INT64: np.int64}
    if dtype in ints:
        t = ints[dtype]
        info = np.iinfo(t)
        return np.clip(np.rint(np.nan_to_num(x)), info.min, info.max).astype(t)
    raise ValueError(f"no storage for data type {dtype}")


def from_storage(a, dtype):
    """Device-stored values -> float64."""
    if dtype == E.PYDNN_DATA_BFLOAT16:
        return f32_from_bf16_bits(a).astype(np.float64)
    return np.asarray(a).astype(np.float64)


def round_to(x, dtype):
    """The float64 value nearest `x` that `dtype` can hold (what the GPU will read)."""
    return from_storage(to_storage(x, dtype), dtype)


# Per-dtype tolerances for |out - ref| <= atol + rtol * |ref|: the output's own rounding (half an ulp)
# plus float32 arithmetic for half types; float32 allows a few ulps of its math functions.
TOLERANCE = {
    E.PYDNN_DATA_DOUBLE: (1e-12, 1e-14),
    E.PYDNN_DATA_FLOAT: (1e-5, 1e-7),
    E.PYDNN_DATA_HALF: (1e-3, 1e-5),
    E.PYDNN_DATA_BFLOAT16: (8e-3, 1e-4),
}
