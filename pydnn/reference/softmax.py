"""Float64 references for cudnnSoftmaxForward / Backward."""
import numpy as np

from .. import enums as E


def _axes(x, mode):
    return (1,) if mode == E.PYDNN_SOFTMAX_MODE_CHANNEL else tuple(range(1, np.ndim(x)))


def forward(algo, mode, alpha, x, beta, y0):
    x = np.asarray(x, np.float64)
    ax = _axes(x, mode)
    with np.errstate(invalid="ignore", over="ignore"):
        z = x - x.max(axis=ax, keepdims=True)
        s = np.exp(z).sum(axis=ax, keepdims=True)
        r = z - np.log(s) if algo == E.PYDNN_SOFTMAX_LOG else np.exp(z) / s
    r = alpha * r
    return r if beta == 0 else r + beta * np.asarray(y0, np.float64)


def backward(algo, mode, alpha, y, dy, beta, dx0):
    y = np.asarray(y, np.float64)
    dy = np.asarray(dy, np.float64)
    ax = _axes(y, mode)
    if algo == E.PYDNN_SOFTMAX_LOG:
        r = dy - np.exp(y) * dy.sum(axis=ax, keepdims=True)
    else:
        r = y * (dy - (dy * y).sum(axis=ax, keepdims=True))
    r = alpha * r
    return r if beta == 0 else r + beta * np.asarray(dx0, np.float64)


def forward_terms(algo, mode, x):
    """Magnitude of what the forward result is computed from: LOG is a difference, z - log(sum)."""
    x = np.asarray(x, np.float64)
    ax = _axes(x, mode)
    z = x - x.max(axis=ax, keepdims=True)
    s = np.exp(z).sum(axis=ax, keepdims=True)
    if algo == E.PYDNN_SOFTMAX_LOG:
        return np.abs(z) + np.abs(np.log(s))
    return np.exp(z) / s


def backward_terms(algo, mode, y, dy):
    """Magnitude of the terms the backward result is a difference of (its rounding scale)."""
    y = np.asarray(y, np.float64)
    ady = np.abs(np.asarray(dy, np.float64))
    ax = _axes(y, mode)
    if algo == E.PYDNN_SOFTMAX_LOG:
        return ady + np.exp(y) * ady.sum(axis=ax, keepdims=True)
    return np.abs(y) * (ady + (ady * np.abs(y)).sum(axis=ax, keepdims=True))
