"""Float64 reference for cudnnReduceTensor (values and flattened indices)."""
import numpy as np

from .. import enums as E


def reduced_axes(a_dims, c_dims):
    return tuple(i for i, (a, c) in enumerate(zip(a_dims, c_dims)) if c == 1 and a != 1)


def reduce(op, alpha, a, beta, c0, c_dims, propagate_nan=False):
    """(C values, flat indices or None, scale of the terms for error bounds)."""
    a = np.asarray(a, np.float64)
    ax = reduced_axes(a.shape, c_dims)
    kept_shape = tuple(c_dims)
    # move reduced axes last (in A's order) and flatten them: the flat index cuDNN reports
    keep = [i for i in range(a.ndim) if i not in ax]
    flat = np.transpose(a, keep + list(ax)).reshape([a.shape[i] for i in keep] + [-1])
    idx = None
    with np.errstate(invalid="ignore", over="ignore"):
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
            pick = np.argmin if op == E.PYDNN_REDUCE_TENSOR_MIN else np.argmax
            if not propagate_nan:
                pick = np.nanargmin if op == E.PYDNN_REDUCE_TENSOR_MIN else np.nanargmax
            idx = pick(v, axis=-1)
            r = np.take_along_axis(v, idx[..., None], -1)[..., 0]
            scale = np.abs(r)
    r = alpha * r.reshape(kept_shape)
    scale = np.abs(alpha) * scale.reshape(kept_shape)
    if beta != 0:
        r = r + beta * np.asarray(c0, np.float64)
        scale = scale + np.abs(beta * np.asarray(c0, np.float64))
    return r, None if idx is None else idx.reshape(kept_shape), scale
