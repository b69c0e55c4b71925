"""Float64 references for convolution (cudnnConvolutionForward / BackwardData / BackwardFilter /
BackwardBias / BiasActivationForward semantics).

Arrays are logical NC(D)HW-ordered numpy arrays (layout does not matter to a reference): x (N, C, *in),
w (K, C/groups, *filt), y (N, K, *out). `pad`, `stride`, `dil` have one entry per spatial dim.
`cross` is True for CROSS_CORRELATION; CONVOLUTION flips the filter in every spatial dim.
"""
import itertools

import numpy as np

from .activation import act as _act


def out_dims(in_dims, filt_dims, pad, stride, dil):
    """Output spatial dims: 1 + (in + 2 pad - ((f - 1) dil + 1)) // stride (may be <= 0: empty)."""
    return tuple(1 + (i + 2 * p - ((f - 1) * d + 1)) // s
                 for i, f, p, s, d in zip(in_dims, filt_dims, pad, stride, dil))


def _taps(filt):
    return itertools.product(*(range(f) for f in filt))


def _flip(w, cross):
    if cross:
        return w
    return w[(slice(None), slice(None)) + (slice(None, None, -1),) * (w.ndim - 2)]


def _window(xp, tap, out, stride, dil):
    """The slice of the padded input that filter tap `tap` meets for every output position."""
    sl = tuple(slice(t * d, t * d + (o - 1) * s + 1, s) for t, o, s, d in zip(tap, out, stride, dil))
    return (slice(None), slice(None)) + sl


def _pad(x, pad):
    return np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in pad])


def forward_raw(x, w, pad, stride, dil, groups=1, cross=True):
    """conv(x, w) in float64, shape (N, K, *out)."""
    x = np.asarray(x, np.float64)
    w = _flip(np.asarray(w, np.float64), cross)
    n, c = x.shape[:2]
    k, cg = w.shape[:2]
    kg = k // groups
    out = out_dims(x.shape[2:], w.shape[2:], pad, stride, dil)
    xp = _pad(x, pad)
    y = np.zeros((n, groups, kg) + out)
    for tap in _taps(w.shape[2:]):
        win = xp[_window(xp, tap, out, stride, dil)].reshape((n, groups, cg) + out)
        wt = w[(slice(None), slice(None)) + tap].reshape(groups, kg, cg)
        y += np.einsum("ngc...,gkc->ngk...", win, wt)
    return y.reshape((n, k) + out)


def backward_data_raw(w, dy, in_dims, pad, stride, dil, groups=1, cross=True):
    """The gradient with respect to x of sum(dy * conv(x, w)), shape (N, C, *in_dims)."""
    w = _flip(np.asarray(w, np.float64), cross)
    dy = np.asarray(dy, np.float64)
    n, k = dy.shape[:2]
    cg = w.shape[1]
    kg = k // groups
    out = dy.shape[2:]
    dxp = np.zeros((n, groups * cg) + tuple(i + 2 * p for i, p in zip(in_dims, pad)))
    dyg = dy.reshape((n, groups, kg) + out)
    for tap in _taps(w.shape[2:]):
        wt = w[(slice(None), slice(None)) + tap].reshape(groups, kg, cg)
        contrib = np.einsum("ngk...,gkc->ngc...", dyg, wt).reshape((n, groups * cg) + out)
        dxp[_window(dxp, tap, out, stride, dil)] += contrib
    inner = (slice(None), slice(None)) + tuple(slice(p, p + i) for p, i in zip(pad, in_dims))
    return dxp[inner]


def backward_filter_raw(x, dy, filt_dims, pad, stride, dil, groups=1, cross=True):
    """The gradient with respect to w of sum(dy * conv(x, w)), shape (K, C/groups, *filt_dims)."""
    x = np.asarray(x, np.float64)
    dy = np.asarray(dy, np.float64)
    n, c = x.shape[:2]
    k = dy.shape[1]
    cg, kg = c // groups, k // groups
    out = dy.shape[2:]
    xp = _pad(x, pad)
    dyg = dy.reshape((n, groups, kg) + out)
    dw = np.zeros((k, cg) + tuple(filt_dims))
    for tap in _taps(filt_dims):
        win = xp[_window(xp, tap, out, stride, dil)].reshape(n, groups, cg, -1)
        g = np.einsum("ngkp,ngcp->gkc", dyg.reshape(n, groups, kg, -1), win).reshape(k, cg)
        dw[(slice(None), slice(None)) + tap] = g
    return _flip(dw, cross)


def backward_bias_raw(dy):
    dy = np.asarray(dy, np.float64)
    axes = (0,) + tuple(range(2, dy.ndim))
    return dy.sum(axis=axes, keepdims=True)


def _blend(r, alpha, beta, old):
    r = alpha * r
    return r if beta == 0 else r + beta * np.asarray(old, np.float64)


def forward(alpha, x, w, beta, y0, pad, stride, dil, groups=1, cross=True):
    return _blend(forward_raw(x, w, pad, stride, dil, groups, cross), alpha, beta, y0)


def backward_data(alpha, w, dy, beta, dx0, pad, stride, dil, groups=1, cross=True):
    in_dims = np.shape(dx0)[2:]
    return _blend(backward_data_raw(w, dy, in_dims, pad, stride, dil, groups, cross), alpha, beta, dx0)


def backward_filter(alpha, x, dy, beta, dw0, pad, stride, dil, groups=1, cross=True):
    filt = np.shape(dw0)[2:]
    return _blend(backward_filter_raw(x, dy, filt, pad, stride, dil, groups, cross), alpha, beta, dw0)


def backward_bias(alpha, dy, beta, db0):
    return _blend(backward_bias_raw(dy), alpha, beta, db0)


def bias_activation_forward(alpha1, x, w, alpha2, z, bias, act_mode, coef, pad, stride, dil, groups=1,
                            cross=True, propagate_nan=False):
    """y = act(alpha1 * conv(x, w) + alpha2 * z + bias); bias has shape (1, K, 1, ...)."""
    r = alpha1 * forward_raw(x, w, pad, stride, dil, groups, cross)
    r = r + alpha2 * np.asarray(z, np.float64) + np.asarray(bias, np.float64)
    return _act(act_mode, r, coef=coef, propagate_nan=propagate_nan)


def forward_direct(x, w, pad, stride, dil, groups=1, cross=True):
    """A slow, literal 2-d/1-d/3-d loop (the reference's own check in the CPU tests)."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    n, c = x.shape[:2]
    k, cg = w.shape[:2]
    kg = k // groups
    filt = w.shape[2:]
    out = out_dims(x.shape[2:], filt, pad, stride, dil)
    y = np.zeros((n, k) + out)
    for b, kk in itertools.product(range(n), range(k)):
        g = kk // kg
        for o in itertools.product(*(range(v) for v in out)):
            s = 0.0
            for cc in range(cg):
                for tap in _taps(filt):
                    pos = [oi * st - p + t * d for oi, st, p, t, d in zip(o, stride, pad, tap, dil)]
                    if all(0 <= q < i for q, i in zip(pos, x.shape[2:])):
                        wt = tap if cross else tuple(f - 1 - t for f, t in zip(filt, tap))
                        s += x[(b, g * cg + cc) + tuple(pos)] * w[(kk, cc) + wt]
            y[(b, kk) + o] = s
    return y
