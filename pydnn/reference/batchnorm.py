"""Float64 references for batch normalization (cudnnBatchNormalization*), with x of shape (N, C, ...).

mode: pydnn.PYDNN_BATCHNORM_PER_ACTIVATION (statistics over N) or the spatial modes (over N and the
spatial dims). Parameters (scale, bias, statistics) come shaped as the derived descriptor, (1, C, 1, 1)
or (1, C, H, W), or anything that broadcasts against x.
"""
import numpy as np

from .. import enums as E


def axes(mode, ndim):
    return (0,) if mode == E.PYDNN_BATCHNORM_PER_ACTIVATION else (0,) + tuple(range(2, ndim))


def param_shape(mode, shape):
    """The dims DeriveBNTensorDescriptor gives."""
    if mode == E.PYDNN_BATCHNORM_PER_ACTIVATION:
        return (1,) + tuple(shape[1:])
    return (1, shape[1]) + (1,) * (len(shape) - 2)


def batch_stats(mode, x):
    """(mean, biased variance, unbiased variance, count) over the mode's axes, shaped like the params."""
    x = np.asarray(x, np.float64)
    ax = axes(mode, x.ndim)
    n = int(np.prod([x.shape[a] for a in ax]))
    mean = x.mean(axis=ax, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=ax, keepdims=True)
    unbiased = var * n / (n - 1) if n > 1 else var
    return mean, var, unbiased, n


def forward_training(mode, alpha, beta, x, y0, scale, bias, factor, run_mean, run_var, eps, z=None, relu=False):
    """-> (y, new running mean, new running var, saved mean, saved inverse std, relu mask).
    y = alpha * act(bn(x) [+ z]) + beta * y0."""
    x = np.asarray(x, np.float64)
    mean, var, unbiased, _ = batch_stats(mode, x)
    invstd = 1.0 / np.sqrt(var + eps)
    v = (x - mean) * invstd * scale + bias
    if z is not None:
        v = v + z
    mask = v > 0
    if relu:
        v = np.where(mask, v, 0.0)
    y = alpha * v if beta == 0 else alpha * v + beta * np.asarray(y0, np.float64)
    rm = rv = None
    if run_mean is not None:
        rm = mean if factor == 1 else (1 - factor) * run_mean + factor * mean
        rv = unbiased if factor == 1 else (1 - factor) * run_var + factor * unbiased
    return y, rm, rv, mean, invstd, mask


def forward_inference(alpha, beta, x, y0, scale, bias, mean, var, eps):
    v = (np.asarray(x, np.float64) - mean) / np.sqrt(var + eps) * scale + bias
    return alpha * v if beta == 0 else alpha * v + beta * np.asarray(y0, np.float64)


def backward(mode, alpha_d, beta_d, alpha_p, beta_p, x, dy, dx0, scale, dscale0, dbias0, eps,
             saved_mean=None, saved_invstd=None, mask=None, dz0=None):
    """-> (dx, dscale, dbias, dz). dy is masked first when `mask` (the forward's ReLU mask) is given;
    dz = alpha_d * dy' + beta_d * dz0. The saved statistics are used when given, else recomputed."""
    x = np.asarray(x, np.float64)
    dy = np.asarray(dy, np.float64)
    if mask is not None:
        dy = np.where(mask, dy, 0.0)
    ax = axes(mode, x.ndim)
    n = int(np.prod([x.shape[a] for a in ax]))
    if saved_mean is None:
        mean, var, _, _ = batch_stats(mode, x)
        invstd = 1.0 / np.sqrt(var + eps)
    else:
        mean, invstd = saved_mean, saved_invstd
    xhat = (x - mean) * invstd
    dgamma = (dy * xhat).sum(axis=ax, keepdims=True)
    dbeta = dy.sum(axis=ax, keepdims=True)
    dx = scale * invstd * (dy - dbeta / n - xhat * dgamma / n)
    dx = alpha_d * dx if beta_d == 0 else alpha_d * dx + beta_d * np.asarray(dx0, np.float64)
    ds = alpha_p * dgamma if beta_p == 0 else alpha_p * dgamma + beta_p * dscale0
    db = alpha_p * dbeta if beta_p == 0 else alpha_p * dbeta + beta_p * dbias0
    dz = None
    if dz0 is not None or mask is not None:
        dz = alpha_d * dy if beta_d == 0 or dz0 is None else alpha_d * dy + beta_d * np.asarray(dz0, np.float64)
    return dx, ds, db, dz
