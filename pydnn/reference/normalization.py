"""Float64 references for layer / group / instance / RMS normalization (pydnn extensions).

Arrays are in the tensor's logical dims (x: N, C, spatial... for group / instance norm; any dims for layer
and RMS norm, the last `normalized_dims` normalized). scale / bias have the parameter descriptor's dims
(leading 1s); mean / invstd the statistics descriptor's dims. act is None or (mode, coef, swish_beta).
"""
import numpy as np

from .. import enums as E
from .activation import act as _act, act_grad as _act_grad


def _sets(kind, groups, nd, x):
    """x reshaped to (sets, len) in logical order, and a function mapping a (sets, len) array back."""
    x = np.asarray(x, np.float64)
    shape = x.shape
    if kind in (E.PYDNN_NORM_KIND_LAYER, E.PYDNN_NORM_KIND_RMS):
        lead = int(np.prod(shape[: len(shape) - nd], dtype=np.int64))
        return x.reshape(lead, -1), lambda a: a.reshape(shape)
    n, c = shape[0], shape[1]
    g = c if kind == E.PYDNN_NORM_KIND_INSTANCE else groups
    return x.reshape(n * g, -1), lambda a: a.reshape(shape)


def _params(kind, x_shape, p):
    """scale or bias broadcast to x's shape."""
    p = np.asarray(p, np.float64)
    if kind in (E.PYDNN_NORM_KIND_LAYER, E.PYDNN_NORM_KIND_RMS):
        return np.broadcast_to(p.reshape(p.shape), x_shape)
    shape = [1] * len(x_shape)
    shape[1] = x_shape[1]
    return np.broadcast_to(p.reshape(shape), x_shape)


def statistics(kind, groups, nd, eps, x):
    """(mean, invstd) per set, as (sets,) arrays (RMS: mean 0, invstd the inverse root mean square)."""
    xs, _ = _sets(kind, groups, nd, x)
    if kind == E.PYDNN_NORM_KIND_RMS:
        return np.zeros(xs.shape[0]), 1.0 / np.sqrt((xs * xs).mean(axis=1) + eps)
    mean = xs.mean(axis=1)
    var = ((xs - mean[:, None]) ** 2).mean(axis=1)
    return mean, 1.0 / np.sqrt(var + eps)


def _xhat(kind, groups, nd, x, mean, invstd):
    xs, back = _sets(kind, groups, nd, x)
    return back((xs - mean[:, None]) * invstd[:, None])


def pre_activation(kind, groups, nd, eps, x, scale, bias, mean=None, invstd=None):
    """z = xhat * scale + bias (bias None: 0), with the statistics computed from x unless given."""
    if invstd is None:
        mean, invstd = statistics(kind, groups, nd, eps, x)
    x = np.asarray(x, np.float64)
    z = _xhat(kind, groups, nd, x, np.ravel(mean), np.ravel(invstd)) * _params(kind, x.shape, scale)
    if bias is not None:
        z = z + _params(kind, x.shape, bias)
    return z


def _apply(act, z):
    return z if act is None else _act(act[0], z, act[1], act[2])


def forward(kind, groups, nd, eps, act, alpha, x, beta, y0, scale, bias):
    """(y, mean, invstd): y = alpha * act(z) + beta * y0; mean / invstd as (sets,) arrays."""
    mean, invstd = statistics(kind, groups, nd, eps, x)
    r = alpha * _apply(act, pre_activation(kind, groups, nd, eps, x, scale, bias, mean, invstd))
    if beta != 0:
        r = r + beta * np.asarray(y0, np.float64)
    return r, mean, invstd


def forward_terms(kind, groups, nd, eps, act, x, scale, bias):
    """Magnitude of the terms y is computed from ((|x| + |mean|) * invstd * |scale| + |bias|): rounding
    error scales with them, not with a result that cancels to near zero."""
    x = np.asarray(x, np.float64)
    mean, invstd = statistics(kind, groups, nd, eps, x)
    xs, back = _sets(kind, groups, nd, np.abs(x))
    t = back((xs + np.abs(mean)[:, None]) * invstd[:, None]) * np.abs(_params(kind, x.shape, scale))
    if bias is not None:
        t = t + np.abs(_params(kind, x.shape, bias))
    return t


def backward_terms(kind, groups, nd, eps, act, x, dy, scale, bias, mean, invstd):
    """Magnitudes for the backward tolerances: dx's terms invstd * (|dxhat| + |mean(dxhat)| +
    |xhat| * mean|dxhat * xhat|) (xhat's own terms counted as forward_terms does), and the sums of
    |dz * xhat| and |dz| that dscale and dbias add up."""
    x = np.asarray(x, np.float64)
    mean, invstd = np.ravel(mean), np.ravel(invstd)
    xs, back = _sets(kind, groups, nd, np.abs(x))
    xh = back((xs + np.abs(mean)[:, None]) * invstd[:, None])
    dz = np.abs(np.asarray(dy, np.float64))
    if act is not None:
        z = pre_activation(kind, groups, nd, eps, x, scale, bias, mean, invstd)
        dz = dz * np.abs(_act_grad(act[0], z, _act(act[0], z, act[1], act[2]), act[1], act[2]))
    dxh = dz * np.abs(_params(kind, x.shape, scale))
    a, _ = _sets(kind, groups, nd, dxh)
    h, _ = _sets(kind, groups, nd, xh)
    m = a.mean(axis=1) + (a * h).mean(axis=1)
    dx = back(invstd[:, None] * (a + h * m[:, None] + m[:, None]))
    scale = np.asarray(scale, np.float64)
    if kind in (E.PYDNN_NORM_KIND_LAYER, E.PYDNN_NORM_KIND_RMS):
        axes = tuple(range(x.ndim - nd))
    else:
        axes = (0,) + tuple(range(2, x.ndim))
    return dx, (dz * xh).sum(axis=axes).reshape(scale.shape), dz.sum(axis=axes).reshape(scale.shape)


def backward(kind, groups, nd, eps, act, x, dy, scale, bias, mean, invstd):
    """(dx, dscale, dbias) before blending, from the saved statistics (mean, invstd as (sets,) arrays);
    dscale / dbias in the shape of scale."""
    x = np.asarray(x, np.float64)
    dy = np.asarray(dy, np.float64)
    mean, invstd = np.ravel(mean), np.ravel(invstd)
    xh = _xhat(kind, groups, nd, x, mean, invstd)
    dz = dy
    if act is not None:
        z = pre_activation(kind, groups, nd, eps, x, scale, bias, mean, invstd)
        dz = dy * _act_grad(act[0], z, _act(act[0], z, act[1], act[2]), act[1], act[2])
    dxh = dz * _params(kind, x.shape, scale)
    a, back = _sets(kind, groups, nd, dxh)
    h, _ = _sets(kind, groups, nd, xh)
    m1 = np.zeros(a.shape[0]) if kind == E.PYDNN_NORM_KIND_RMS else a.mean(axis=1)
    m2 = (a * h).mean(axis=1)
    dx = back(invstd[:, None] * (a - m1[:, None] - h * m2[:, None]))
    scale = np.asarray(scale, np.float64)
    if kind in (E.PYDNN_NORM_KIND_LAYER, E.PYDNN_NORM_KIND_RMS):
        lead = tuple(range(x.ndim - nd))
        ds, db = (dz * xh).sum(axis=lead), dz.sum(axis=lead)
    else:
        axes = (0,) + tuple(range(2, x.ndim))
        ds, db = (dz * xh).sum(axis=axes), dz.sum(axis=axes)
    return dx, ds.reshape(scale.shape), db.reshape(scale.shape)
