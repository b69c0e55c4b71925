"""Float64 reference for cudnnReduceTensor (values and flattened indices), with pydnn's NaN rules:
ADD, MUL, AVG and the norms give NaN as arithmetic does; MIN, MAX and AMAX give NaN when propagating
(index of the first NaN) and otherwise skip NaNs (a slice of nothing but NaN gives NaN, index 0).
Ties take the lowest flat index; flat indices are row-major over the reduced dims in A's dim order."""
import numpy as np

from .. import enums as E


def reduced_axes(a_dims, c_dims):
    return tuple(i for i, (a, c) in enumerate(zip(a_dims, c_dims)) if c == 1 and a != 1)


def _flatten(a, c_dims):
    """A with the kept axes first (C's shape) and the reduced ones flattened last, in A's dim order."""
    ax = reduced_axes(a.shape, c_dims)
    keep = [i for i in range(a.ndim) if i not in ax]
    return np.transpose(a, keep + list(ax)).reshape([a.shape[i] for i in keep] + [-1])


def _pick(v, is_min, propagate_nan):
    """(index, value) of the chosen element along the last axis."""
    nan = np.isnan(v)
    any_nan = nan.any(-1)
    first_nan = np.argmax(nan, -1)
    rank = np.where(nan, np.inf if is_min else -np.inf, v)
    best = rank.min(-1) if is_min else rank.max(-1)
    hit = (rank == best[..., None]) & ~nan
    idx = np.argmax(hit, -1)  # the first of the equal best numbers
    all_nan = nan.all(-1)
    idx = np.where(all_nan, 0, idx)
    if propagate_nan:
        idx = np.where(any_nan, first_nan, idx)
    val = np.take_along_axis(v, idx[..., None], -1)[..., 0]
    return idx, val


def reduce(op, alpha, a, beta, c0, c_dims, propagate_nan=False):
    """(C values, flat indices (MIN/MAX/AMAX) or None, magnitude of the terms for error bounds)."""
    a = np.asarray(a, np.float64)
    flat = _flatten(a, c_dims)
    kept_shape = tuple(c_dims)
    idx = None
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if op == E.PYDNN_REDUCE_TENSOR_ADD:
            r, scale = flat.sum(-1), np.abs(flat).sum(-1)
        elif op == E.PYDNN_REDUCE_TENSOR_AVG:
            r, scale = flat.mean(-1), np.abs(flat).mean(-1)
        elif op == E.PYDNN_REDUCE_TENSOR_MUL:
            r = flat.prod(-1)
            scale = np.abs(r)
        elif op == E.PYDNN_REDUCE_TENSOR_MUL_NO_ZEROS:
            r = np.where(flat == 0, 1.0, flat).prod(-1)
            scale = np.abs(r)
        elif op == E.PYDNN_REDUCE_TENSOR_NORM1:
            r = np.abs(flat).sum(-1)
            scale = r
        elif op == E.PYDNN_REDUCE_TENSOR_NORM2:
            r = np.sqrt((flat * flat).sum(-1))
            scale = r
        else:
            v = np.abs(flat) if op == E.PYDNN_REDUCE_TENSOR_AMAX else flat
            idx, r = _pick(v, op == E.PYDNN_REDUCE_TENSOR_MIN, propagate_nan)
            scale = np.abs(r)
        r = alpha * r.reshape(kept_shape)
        scale = np.abs(alpha) * scale.reshape(kept_shape)
        if beta != 0:
            r = r + beta * np.asarray(c0, np.float64)
            scale = scale + np.abs(beta * np.asarray(c0, np.float64))
    return r, None if idx is None else idx.reshape(kept_shape), scale
