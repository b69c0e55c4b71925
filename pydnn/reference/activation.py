"""Float64 references for activations (cudnnActivationForward / Backward semantics)."""
import math

import numpy as np

from .. import enums as E

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # exact identity, no overflow


def act(mode, x, coef=0.0, swish_beta=1.0, propagate_nan=False):
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        if mode == E.PYDNN_ACTIVATION_SIGMOID:
            return _sigmoid(x)
        if mode == E.PYDNN_ACTIVATION_TANH:
            return np.tanh(x)
        if mode == E.PYDNN_ACTIVATION_RELU:
            r = np.where(x > 0, x, 0.0)
            return np.where(np.isnan(x), x if propagate_nan else 0.0, r)
        if mode == E.PYDNN_ACTIVATION_CLIPPED_RELU:
            r = np.where(x > 0, np.minimum(x, coef), 0.0)
            return np.where(np.isnan(x), x if propagate_nan else 0.0, r)
        if mode == E.PYDNN_ACTIVATION_ELU:
            return np.where(x > 0, x, coef * np.expm1(np.minimum(x, 0)))
        if mode == E.PYDNN_ACTIVATION_IDENTITY:
            return x.copy()
        if mode == E.PYDNN_ACTIVATION_SWISH:
            return x * _sigmoid(swish_beta * x)
        if mode == E.PYDNN_ACTIVATION_GELU_ERF:
            return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))
        if mode == E.PYDNN_ACTIVATION_GELU_TANH:
            return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    raise ValueError(f"unknown activation mode {mode}")


def act_grad(mode, x, y, coef=0.0, swish_beta=1.0):
    """f'(.) as pydnn defines it (sigmoid and tanh from y, the rest from x)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        if mode == E.PYDNN_ACTIVATION_SIGMOID:
            return y * (1.0 - y)
        if mode == E.PYDNN_ACTIVATION_TANH:
            return 1.0 - y * y
        if mode == E.PYDNN_ACTIVATION_RELU:
            return (x > 0).astype(np.float64)
        if mode == E.PYDNN_ACTIVATION_CLIPPED_RELU:
            return ((x > 0) & (x < coef)).astype(np.float64)
        if mode == E.PYDNN_ACTIVATION_ELU:
            return np.where(x > 0, 1.0, coef * np.exp(np.minimum(x, 0)))
        if mode == E.PYDNN_ACTIVATION_IDENTITY:
            return np.ones_like(x)
        if mode == E.PYDNN_ACTIVATION_SWISH:
            s = _sigmoid(swish_beta * x)
            return s + swish_beta * x * s * (1.0 - s)
        if mode == E.PYDNN_ACTIVATION_GELU_ERF:
            return 0.5 * (1.0 + _erf(x / math.sqrt(2.0))) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        if mode == E.PYDNN_ACTIVATION_GELU_TANH:
            k = math.sqrt(2.0 / math.pi)
            t = np.tanh(k * (x + 0.044715 * x ** 3))
            return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3 * 0.044715 * x * x)
    raise ValueError(f"unknown activation mode {mode}")


def act_grad_terms(mode, x, y, coef=0.0, swish_beta=1.0):
    """Sum of the absolute values of the terms f'(.) adds up (== |f'| where it is a single term): the
    scale its rounding error is measured against, since f' crosses zero by cancellation for GELU/swish."""
    x = np.asarray(x, dtype=np.float64)
    if mode == E.PYDNN_ACTIVATION_SWISH:
        s = _sigmoid(swish_beta * x)
        return np.abs(s) + np.abs(swish_beta * x * s * (1.0 - s))
    if mode == E.PYDNN_ACTIVATION_GELU_ERF:
        return np.abs(0.5 * (1.0 + _erf(x / math.sqrt(2.0)))) + np.abs(x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi))
    if mode == E.PYDNN_ACTIVATION_GELU_TANH:
        k = math.sqrt(2.0 / math.pi)
        t = np.tanh(k * (x + 0.044715 * x ** 3))
        return np.abs(0.5 * (1.0 + t)) + np.abs(0.5 * x * (1.0 - t * t) * k * (1.0 + 3 * 0.044715 * x * x))
    return np.abs(act_grad(mode, x, y, coef, swish_beta))


def forward(mode, alpha, x, beta, y0, **kw):
    r = alpha * act(mode, x, **kw)
    return r if beta == 0 else r + beta * np.asarray(y0, dtype=np.float64)


def backward(mode, alpha, y, dy, x, beta, dx0, **kw):
    r = alpha * act_grad(mode, x, y, **kw) * np.asarray(dy, dtype=np.float64)
    return r if beta == 0 else r + beta * np.asarray(dx0, dtype=np.float64)
