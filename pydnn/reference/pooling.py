"""Float64 references for pooling: cudnnPoolingForward / Backward and the pydnn adaptive and global-average
extensions. Arrays are (N, C, spatial...) with 1 to 3 spatial dims.

Max pooling picks, per window (in-bounds elements only, in window order d, h, w):
  propagate NaN      the first NaN if any, else the first element equal to the maximum
  not propagate NaN  the first element equal to the maximum of the non-NaN ones; all NaN: the first (NaN)
Backward sends dy to that element; averages spread dy / count over the window's in-bounds elements."""
import itertools

import numpy as np

from .. import enums as E

MAX_MODES = (E.PYDNN_POOLING_MAX, E.PYDNN_POOLING_MAX_DETERMINISTIC)


def pooled_size(n, win, pad, stride):
    return 1 + (n + 2 * pad - win) // stride


def pool_windows(n, win, pad, stride):
    """[(lo, hi)] in-bounds window of each pooled coordinate along one dim."""
    return [(max(o * stride - pad, 0), min(o * stride - pad + win, n)) for o in range(pooled_size(n, win, pad, stride))]


def adaptive_windows(n, out):
    """torch's adaptive windows: [floor(o * n / out), ceil((o + 1) * n / out))."""
    return [((o * n) // out, -(-((o + 1) * n) // out)) for o in range(out)]


def _choose(vals, nan_prop):
    """vals (N, C, K) -> index (N, C) of the chosen element of each window."""
    nan = np.isnan(vals)
    if nan_prop:
        key = np.where(nan, -np.inf, vals)
        best = key.max(axis=-1, keepdims=True)
        idx = np.argmax(key == best, axis=-1)
        return np.where(nan.any(axis=-1), np.argmax(nan, axis=-1), idx)
    key = np.where(nan, -np.inf, vals)
    best = key.max(axis=-1, keepdims=True)
    cand = ~nan & (key == best)
    return np.where(cand.any(axis=-1), np.argmax(cand, axis=-1), 0)


def _windows(x_shape, y_spatial, geometry):
    """Per spatial dim, the list of (lo, hi); geometry: ('pool', win, pad, stride) or ('adaptive',)."""
    sp = x_shape[2:]
    if geometry[0] == "pool":
        _, win, pad, stride = geometry
        return [pool_windows(n, w, p, s) for n, w, p, s in zip(sp, win, pad, stride)]
    return [adaptive_windows(n, o) for n, o in zip(sp, y_spatial)]


def _count(mode, geometry, lohi):
    if mode == E.PYDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING and geometry[0] == "pool":
        return float(np.prod(geometry[1]))
    return float(np.prod([hi - lo for lo, hi in lohi]))


def _each_window(x, y_spatial, geometry):
    wins = _windows(x.shape, y_spatial, geometry)
    for o in itertools.product(*[range(len(w)) for w in wins]):
        lohi = [wins[k][o[k]] for k in range(len(o))]
        sl = (slice(None), slice(None)) + tuple(slice(lo, hi) for lo, hi in lohi)
        yield o, lohi, sl


def forward(mode, nan_opt, alpha, x, beta, y0, geometry, y_spatial=None):
    """y = alpha * pool(x) + beta * y0. geometry: ('pool', window, padding, stride) or ('adaptive',) with
    y_spatial the pooled spatial dims."""
    x = np.asarray(x, np.float64)
    wins = _windows(x.shape, y_spatial, geometry)
    y = np.zeros(x.shape[:2] + tuple(len(w) for w in wins))
    for o, lohi, sl in _each_window(x, y_spatial, geometry):
        vals = x[sl].reshape(x.shape[0], x.shape[1], -1)
        if mode in MAX_MODES:
            idx = _choose(vals, nan_opt == E.PYDNN_PROPAGATE_NAN)
            r = np.take_along_axis(vals, idx[..., None], axis=-1)[..., 0]
        else:
            r = vals.sum(axis=-1) / _count(mode, geometry, lohi)
        y[(slice(None), slice(None)) + o] = r
    r = alpha * y
    return r if beta == 0 else r + beta * np.asarray(y0, np.float64)


def backward(mode, nan_opt, alpha, dy, x, beta, dx0, geometry):
    """dx = alpha * (gradient of pool at x applied to dy) + beta * dx0."""
    x = np.asarray(x, np.float64)
    dy = np.asarray(dy, np.float64)
    dx = np.zeros_like(x)
    n, c = x.shape[:2]
    for o, lohi, sl in _each_window(x, dy.shape[2:], geometry):
        g = dy[(slice(None), slice(None)) + o]
        shape = tuple(hi - lo for lo, hi in lohi)
        view = dx[sl]  # a view: updates land in dx
        if mode in MAX_MODES:
            vals = x[sl].reshape(n, c, -1)
            idx = _choose(vals, nan_opt == E.PYDNN_PROPAGATE_NAN)
            flat = np.zeros((n, c, vals.shape[-1]))
            np.put_along_axis(flat, idx[..., None], g[..., None], axis=-1)
            view += flat.reshape((n, c) + shape)
        else:
            view += (g / _count(mode, geometry, lohi)).reshape((n, c) + (1,) * len(shape))
    r = alpha * dx
    return r if beta == 0 else r + beta * np.asarray(dx0, np.float64)


def forward_terms(mode, x, geometry, y_spatial=None):
    """Magnitude of what each output is computed from (max |x| over the window), for tolerances."""
    return forward(E.PYDNN_POOLING_MAX, E.PYDNN_NOT_PROPAGATE_NAN, 1.0, np.abs(np.asarray(x, np.float64)), 0.0,
                   None, geometry, y_spatial)
