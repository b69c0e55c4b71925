"""Pooling's p2t_bwd on the GPU (max backward of NCHW-like layouts over a shared-memory tile of covering
windows): against the float64 reference with poisoned dx, plain and blended, whole planes and planes split
into bands (few planes), NaN under both options, and bitwise against p2_bwd (P2T_BWD off) with ties, +-0 and
NaN."""
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
MAX, MAXD = G.MAX, G.MAXD
NOPROP, PROP = G.NOPROP, G.PROP

CASES = [  # xdims, layout, window, padding, stride
    ((3, 7, 50, 50), "nchw", (3, 3), (1, 1), (2, 2)),    # the sweep's plane, whole planes
    ((2, 3, 55, 55), "nchw", (3, 3), (1, 1), (2, 2)),    # odd H: bands (6 planes < P2T_MIN_BLOCKS)
    ((1, 2, 97, 64), "gapsw", (3, 3), (1, 1), (2, 2)),   # gaps, bands
    ((2, 2, 40, 41), "nchw", (2, 2), (0, 0), (1, 1)),    # two covering windows per dim, stride 1
    ((2, 3, 37, 45), "nchw", (2, 3), (1, 1), (1, 2)),    # padded, non-square
    ((1, 2, 33, 40), "nchw", (3, 3), (0, 0), (3, 3)),    # one covering window
]


def _took(handle, pd, x, y):
    geo_b = P._validate_bwd("pool", pd, y.desc, y.desc, x.desc, x.desc)
    return "::p2t_bwd<" in P.plan_summary(handle, x.desc, x.desc, y.desc, kmode=0, geometry=geo_b)[-1][0]


def _setup(xdims, layout, win, pad, stride, mode, nan, dtype):
    pd = G._pool_desc(mode, nan, list(win), list(pad), list(stride))
    x = W._t(xdims, layout, dtype)
    ydims = tuple(pydnn.get_pooling_nd_forward_output_dim(pd, x.desc, len(xdims)))
    return pd, x, W._t(ydims, layout, dtype), W._t(ydims, layout, dtype), W._t(xdims, layout, dtype)


@pytest.mark.parametrize("dtype", [F32, F16, BF16, F64], ids=["fp32", "fp16", "bf16", "fp64"])
@pytest.mark.parametrize("mode", [MAX, MAXD])
def test_p2t_against_reference(handle, rng, mode, dtype):
    nan = PROP if mode == MAXD else NOPROP
    for xdims, layout, win, pad, stride in CASES:
        geo = ("pool", win, pad, stride)
        pd, x, y, dy, dx = _setup(xdims, layout, win, pad, stride, mode, nan, dtype)
        assert _took(handle, pd, x, y), (xdims, win, stride)
        for relu in (False, True):
            xv = W._inputs(x, rng, mode, relu)
            what = f"{xdims} {layout} {win} {pad} {stride} relu={relu}"
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
def test_p2t_nan_rules(handle, rng, nan):
    xdims, win, pad, stride = (2, 3, 45, 38), (3, 3), (1, 1), (2, 2)
    geo = ("pool", win, pad, stride)
    pd, x, y, dy, dx = _setup(xdims, "nchw", win, pad, stride, MAX, nan, F32)
    assert _took(handle, pd, x, y)
    v = rng.integers(-2, 3, xdims).astype(np.float64)
    v.flat[rng.choice(v.size, v.size // 10, replace=False)] = np.nan
    v[0, 0, :3, :3] = np.nan  # a window of nothing but NaN
    xv = x.upload(v)
    pydnn.pooling_forward(handle, pd, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
    dyv = dy.random(rng)
    dx.poison()
    pydnn.pooling_backward(handle, pd, 1.0, y.desc, y.ptr, dy.desc, dy.ptr, x.desc, x.ptr, 0.0, dx.desc, dx.ptr)
    assert_close(dx.download(), ref.backward(MAX, nan, 1.0, dyv, xv, 0.0, None, geo), F32, "nan bwd")


@pytest.mark.parametrize("dtype", [BF16, F16, F32, F64], ids=["bf16", "fp16", "fp32", "fp64"])
@pytest.mark.parametrize("nan", [NOPROP, PROP])
def test_p2t_matches_p2_bwd_bitwise(handle, rng, dtype, nan, monkeypatch):
    """p2t_bwd stores p2_bwd's bits (same winners, same summation order): ties, NaN, +-0."""
    for xdims, win, pad, stride in (((2, 8, 45, 47), (3, 3), (1, 1), (2, 2)), ((1, 3, 64, 33), (2, 2), (0, 0), (1, 1)),
                                    ((3, 5, 50, 50), (3, 3), (1, 1), (2, 2))):
        pd, x, y, dy, _ = _setup(xdims, "nchw", win, pad, stride, MAX, nan, dtype)
        v = rng.integers(-2, 3, xdims).astype(np.float64) * rng.choice([1.0, 0.5], xdims)
        v[v == 0] = rng.choice([0.0, -0.0], int((v == 0).sum()))
        v.flat[rng.choice(v.size, v.size // 20, replace=False)] = np.nan
        x.upload(v)
        pydnn.pooling_forward(handle, pd, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
        dy.random(rng)
        outs = []
        for on in (True, False):
            monkeypatch.setattr(tuning.pooling, "P2T_BWD", on)
            handle.prepared.clear()
            dx = W._t(xdims, "nchw", dtype)
            dx.poison()
            assert _took(handle, pd, x, y) == on
            pydnn.pooling_backward(handle, pd, 1.0, y.desc, y.ptr, dy.desc, dy.ptr, x.desc, x.ptr, 0.0, dx.desc,
                                   dx.ptr)
            driver.synchronize()
            outs.append(dx.download())
        handle.prepared.clear()
        a, b = outs
        assert np.array_equal(np.isnan(a), np.isnan(b)), xdims
        ok = ~np.isnan(a)
        assert np.array_equal(a[ok], b[ok]) and np.array_equal(np.signbit(a[ok]), np.signbit(b[ok])), xdims
