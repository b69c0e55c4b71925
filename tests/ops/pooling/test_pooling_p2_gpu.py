"""Pooling's p2 kernels on the GPU (p2_fwd / p2_bwd: 2-d / 1-d non-adaptive pooling of NCHW-like layouts on
the scalar path, a thread per element; along w for NCHW-like layouts, along c for channels-last ones whose
channels take no vectors) against the float64 reference with poisoned outputs: every mode x
dtype, plain and blended, max 3x3/2 pad 1, average 2x2/2 on odd sizes, 2x2/1 (two covering windows per
dim), 3x3/3, 1-d, gapped NCHW, ReLU-like inputs (windows of tied zeros), NaN under both options; that the
planner took them; and that they store the bits of the scalar fwd / bwd (P2 off)."""
import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn._cuda import driver
from pydnn.ops import pooling as P
from pydnn.reference import pooling as ref
from devtensor import assert_close
import test_pooling_gpu as G
import test_pooling_cnn_gpu as W

pytestmark = pytest.mark.gpu

F32, F64, F16, BF16 = G.F32, G.F64, G.F16, G.BF16
MAX, INC, EXC, MAXD = G.MAX, G.INC, G.EXC, G.MAXD
NOPROP, PROP = G.NOPROP, G.PROP

CASES = [  # xdims, layout, window, padding, stride
    ((2, 3, 7, 8), "nchw", (3, 3), (1, 1), (2, 2)),     # the sweep's max pool, odd H
    ((3, 5, 11, 11), "nchw", (2, 2), (0, 0), (2, 2)),   # the sweep's average pool, 11 not tiled
    ((2, 4, 9, 9), "nchw", (2, 2), (0, 0), (1, 1)),     # two covering windows per dim
    ((1, 3, 9, 10), "nchw", (3, 3), (0, 0), (3, 3)),
    ((2, 2, 6, 7), "nchw", (2, 3), (1, 1), (1, 2)),     # padded, non-square
    ((2, 3, 19), "nchw", (3,), (1,), (2,)),             # 1-d
    ((2, 6, 8, 16), "gapsw", (3, 3), (1, 1), (2, 2)),   # NCHW with gaps
    ((2, 19, 50, 50), "nchw", (3, 3), (1, 1), (2, 2)),  # a sweep plane size
    ((2, 5, 9, 9), "nhwc", (3, 3), (1, 1), (2, 2)),     # channels-last, C off the vector: threads along c
    ((3, 7, 11, 11), "nhwc", (2, 2), (0, 0), (2, 2)),
    ((2, 16, 7, 8), "gaps", (3, 3), (1, 1), (2, 2)),    # padded channels: no vectors
]


def _t(dims, layout, dtype):
    """nchw / gapsw (NCHW with gaps) as test_pooling_cnn_gpu, nhwc / gaps (padded channels) as test_pooling_gpu."""
    return (G._t if layout in ("nhwc", "gaps") else W._t)(dims, layout, dtype)


def _took_p2(handle, pd, x, y, mode):
    geo_f = P._validate_fwd("pool", pd, x.desc, y.desc)
    geo_b = P._validate_bwd("pool", pd, y.desc, y.desc, x.desc, x.desc)
    f = P.plan_summary(handle, y.desc, x.desc, geometry=geo_f)[-1][0]
    b = P.plan_summary(handle, x.desc, x.desc, y.desc, kmode=P.KMODE[mode], geometry=geo_b)[-1][0]
    return "::p2_fwd<" in f and ("::p2_bwd<" in b or "::p2t_bwd<" in b)  # p2t_bwd: p2's max backward on a tile


@pytest.mark.parametrize("dtype", [F32, F16, BF16, F64], ids=["fp32", "fp16", "bf16", "fp64"])
@pytest.mark.parametrize("mode", [MAX, MAXD, INC, EXC])
def test_p2_against_reference(handle, rng, mode, dtype):
    nan = PROP if mode == MAXD else NOPROP
    for xdims, layout, win, pad, stride in CASES:
        geo = ("pool", win, pad, stride)
        pd = G._pool_desc(mode, nan, list(win), list(pad), list(stride))
        x = _t(xdims, layout, dtype)
        ydims = tuple(pydnn.get_pooling_nd_forward_output_dim(pd, x.desc, len(xdims)))
        y, dy, dx = _t(ydims, layout, dtype), _t(ydims, layout, dtype), _t(xdims, layout, dtype)
        assert _took_p2(handle, pd, x, y, mode), (xdims, win, stride)
        for relu in (False, True):
            xv = W._inputs(x, rng, mode, relu)
            what = f"{xdims} {layout} {win} {pad} {stride} relu={relu}"
            y.poison()
            G._fwd(handle, pd, geo, mode, nan, x, y, xv, 1.0, 0.0, None, f"fwd {what}")
            y0 = y.random(rng)
            G._fwd(handle, pd, geo, mode, nan, x, y, xv, -0.75, 1.25, y0, f"fwd blend {what}")
            pydnn.pooling_forward(handle, pd, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
            dyv = dy.random(rng)
            for alpha, beta in ((1.0, 0.0), (1.5, -0.5)):
                dx0 = dx.random(rng) if beta else None
                if not beta:
                    dx.poison()
                pydnn.pooling_backward(handle, pd, alpha, y.desc, y.ptr, dy.desc, dy.ptr, x.desc, x.ptr, beta,
                                       dx.desc, dx.ptr)
                want = ref.backward(mode, nan, alpha, dyv, xv, beta, dx0, geo)
                assert_close(dx.download(), want, dtype, f"bwd {alpha} {beta} {what}",
                             scale=G._bwd_scale(mode, nan, alpha, dyv, xv, beta, dx0, geo))
                dx.check_untouched()


@pytest.mark.parametrize("nan", [NOPROP, PROP])
def test_p2_nan_rules(handle, rng, nan):
    xdims, win, pad, stride = (2, 8, 9, 8), (3, 3), (1, 1), (2, 2)
    geo = ("pool", win, pad, stride)
    pd = G._pool_desc(MAX, nan, list(win), list(pad), list(stride))
    x = _t(xdims, "nchw", F32)
    v = rng.integers(-2, 3, xdims).astype(np.float64)
    v.flat[rng.choice(v.size, v.size // 10, replace=False)] = np.nan
    v[0, 0, :3, :3] = np.nan  # a window of nothing but NaN
    xv = x.upload(v)
    ydims = (2, 8, 5, 4)
    y, dy, dx = _t(ydims, "nchw", F32), _t(ydims, "nchw", F32), _t(xdims, "nchw", F32)
    assert _took_p2(handle, pd, x, y, MAX)
    G._fwd(handle, pd, geo, MAX, nan, x, y, xv, 1.0, 0.0, None, "nan fwd")
    dyv = dy.random(rng)
    pydnn.pooling_backward(handle, pd, 1.0, y.desc, y.ptr, dy.desc, dy.ptr, x.desc, x.ptr, 0.0, dx.desc, dx.ptr)
    assert_close(dx.download(), ref.backward(MAX, nan, 1.0, dyv, xv, 0.0, None, geo), F32, "nan bwd")


@pytest.mark.parametrize("dtype", [BF16, F16, F32, F64], ids=["bf16", "fp16", "fp32", "fp64"])
@pytest.mark.parametrize("nan", [NOPROP, PROP])
@pytest.mark.parametrize("mode", [MAX, INC, EXC])
def test_p2_matches_scalar_kernels_bitwise(handle, rng, dtype, nan, mode, monkeypatch):
    """p2 stores the bits of the scalar fwd / bwd (same window order, same arithmetic; NaN positions
    compared, not payloads): ties, NaN, +-0, 3x3/2 pad 1 and 2x2/2 on odd sizes."""
    for xdims, layout, win, pad, stride in (((2, 8, 15, 17), "nchw", (3, 3), (1, 1), (2, 2)),
                                            ((2, 8, 11, 11), "nchw", (2, 2), (0, 0), (2, 2)),
                                            ((2, 5, 13, 11), "nhwc", (3, 3), (1, 1), (2, 2))):
        x = _t(xdims, layout, dtype)
        v = rng.integers(-2, 3, xdims).astype(np.float64) * rng.choice([1.0, 0.5], xdims)
        v[v == 0] = rng.choice([0.0, -0.0], int((v == 0).sum()))
        if mode == MAX:
            v.flat[rng.choice(v.size, v.size // 20, replace=False)] = np.nan
        x.upload(v)
        pd = G._pool_desc(mode, nan, list(win), list(pad), list(stride))
        ydims = tuple(pydnn.get_pooling_nd_forward_output_dim(pd, x.desc, 4))
        dy = _t(ydims, layout, dtype)
        dy.random(rng)
        outs = []
        for on in (True, False):
            monkeypatch.setattr(tuning.pooling, "P2", on)
            handle.prepared.clear()  # no cached plan of the other setting
            y, dx = _t(ydims, layout, dtype), _t(xdims, layout, dtype)
            assert _took_p2(handle, pd, x, y, mode) == on
            pydnn.pooling_forward(handle, pd, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
            pydnn.pooling_backward(handle, pd, 1.0, y.desc, y.ptr, dy.desc, dy.ptr, x.desc, x.ptr, 0.0, dx.desc,
                                   dx.ptr)
            driver.synchronize()
            outs.append((y.download(), dx.download()))
        handle.prepared.clear()
        for a, b in zip(*outs):
            assert np.array_equal(np.isnan(a), np.isnan(b))
            ok = ~np.isnan(a)
            assert np.array_equal(a[ok], b[ok]) and np.array_equal(np.signbit(a[ok]), np.signbit(b[ok]))
