"""Pooling's win2 kernels on the GPU (win2_fwd / win2_bwd: kh x 2 windows with stride kh x 2, no padding, tiling
x, w contiguous: the NCHW max / average pooling of CNNs such as examples/train_cnn.py) against the float64
reference with poisoned outputs: every mode x dtype, plain and blended, odd channel counts, kh 1 / 2 / 3, 1-d,
gapped NCHW strides, ReLU-like inputs (whole windows of tied zeros), NaN under both options; that they
store the bits of the scalar kernels (WIN2 off); that the planner took them; and the demo's shapes against
PyTorch."""
import numpy as np
import pytest

import pydnn
from pydnn import tuning
from devtensor import DevTensor, assert_close
from pydnn._cuda import driver
from pydnn.ops import pooling as P
from pydnn.reference import pooling as ref
from pydnn.tensor import packed_strides

pytestmark = pytest.mark.gpu

F32, F64, F16, BF16 = (pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_DOUBLE, pydnn.PYDNN_DATA_HALF,
                       pydnn.PYDNN_DATA_BFLOAT16)
MAX, INC, EXC, MAXD = (pydnn.PYDNN_POOLING_MAX, pydnn.PYDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING,
                       pydnn.PYDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING, pydnn.PYDNN_POOLING_MAX_DETERMINISTIC)
NOPROP, PROP = pydnn.PYDNN_NOT_PROPAGATE_NAN, pydnn.PYDNN_PROPAGATE_NAN

CASES = [  # xdims, layout, window (= stride), kernel expected
    ((2, 16, 32, 32), "nchw", (2, 2)),       # the demo's pool 1, small batch
    ((3, 5, 16, 16), "nchw", (2, 2)),        # odd channels
    ((2, 3, 9, 16), "nchw", (3, 2)),         # kh 3
    ((1, 4, 5, 24), "nchw", (1, 2)),         # kh 1, OW 12
    ((2, 6, 8, 16), "gapsw", (2, 2)),        # NCHW with gaps between rows, planes and samples
    ((3, 4, 32), "nchw", (2,)),              # 1-d
]


def _strides(dims, layout):
    if layout == "nchw":
        return packed_strides(dims, pydnn.PYDNN_TENSOR_NCHW)
    st, inner = [1], 1  # gapsw: rows padded by 8 elements, planes by 16, samples by 32
    for k, gap in zip(range(len(dims) - 1, 0, -1), (8, 16, 32)):
        inner = inner * dims[k] + gap
        st.append(inner)
    return tuple(st[::-1])


def _t(dims, layout, dtype):
    return DevTensor(dims, dtype, _strides(dims, layout))


def _pool_desc(mode, nan, win):
    d = pydnn.create_pooling_descriptor()
    pydnn.set_pooling_nd_descriptor(d, mode, nan, len(win), list(win), [0] * len(win), list(win))
    return d


def _kernels(handle, pd, x, y, mode):
    """(forward, backward) kernel names the planner picks for these descriptors (first launch)."""
    geo_f = P._validate_fwd("pool", pd, x.desc, y.desc)
    geo_b = P._validate_bwd("pool", pd, y.desc, y.desc, x.desc, x.desc)
    f = P.plan_summary(handle, y.desc, x.desc, geometry=geo_f)[0][0]
    b = P.plan_summary(handle, x.desc, x.desc, y.desc, kmode=P.KMODE[mode], geometry=geo_b)[0][0]
    return f.split("<")[0].split("::")[-1], b.split("<")[0].split("::")[-1]


def _inputs(x, rng, mode, relu):
    if mode in (MAX, MAXD):
        v = rng.integers(-3, 4, x.dims).astype(np.float64)
        if relu:  # most windows all zero: every element ties
            v = np.maximum(v, 0) * (rng.random(x.dims) < 0.3)
        return x.upload(v)
    return x.random(rng)


@pytest.mark.parametrize("dtype", [F32, F16, BF16, F64])
@pytest.mark.parametrize("mode", [MAX, MAXD, INC, EXC])
def test_win2_against_reference(handle, rng, mode, dtype):
    nan = PROP if mode == MAXD else NOPROP
    for xdims, layout, win in CASES:
        geo = ("pool", win, (0,) * len(win), win)
        pd = _pool_desc(mode, nan, win)
        x = _t(xdims, layout, dtype)
        ydims = tuple(pydnn.get_pooling_nd_forward_output_dim(pd, x.desc, len(xdims)))
        y, dy, dx = _t(ydims, layout, dtype), _t(ydims, layout, dtype), _t(xdims, layout, dtype)
        assert _kernels(handle, pd, x, y, mode) == ("win2_fwd", "win2_bwd"), (xdims, layout, dtype)
        for relu in (False, True):
            xv = _inputs(x, rng, mode, relu)
            what = f"{xdims} {layout} {win} relu={relu}"
            for alpha, beta in ((1.0, 0.0), (float(rng.uniform(-2, 2)), float(rng.uniform(-2, 2)))):
                y0 = y.random(rng) if beta else None
                if not beta:
                    y.poison()
                pydnn.pooling_forward(handle, pd, alpha, x.desc, x.ptr, beta, y.desc, y.ptr)
                want = ref.forward(mode, nan, alpha, xv, beta, y0, geo)
                scale = abs(alpha) * ref.forward_terms(mode, xv, geo) + (np.abs(beta * y0) if beta else 0)
                assert_close(y.download(), want, dtype, f"fwd {alpha} {beta} {what}", scale=scale)
                y.check_untouched()
            pydnn.pooling_forward(handle, pd, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
            dyv = dy.random(rng)
            for alpha, beta in ((1.0, 0.0), (float(rng.uniform(-2, 2)), float(rng.uniform(-2, 2)))):
                dx0 = dx.random(rng) if beta else None
                if not beta:
                    dx.poison()
                pydnn.pooling_backward(handle, pd, alpha, y.desc, y.ptr, dy.desc, dy.ptr, x.desc, x.ptr, beta,
                                       dx.desc, dx.ptr)
                want = ref.backward(mode, nan, alpha, dyv, xv, beta, dx0, geo)
                scale = abs(alpha) * ref.backward(mode, nan, 1.0, np.abs(dyv), xv, 0.0, None, geo) + (
                    np.abs(beta * dx0) if beta else 0)
                assert_close(dx.download(), want, dtype, f"bwd {alpha} {beta} {what}", scale=scale)
                dx.check_untouched()


@pytest.mark.parametrize("dtype", [BF16, F16, F32, F64])
@pytest.mark.parametrize("nan", [NOPROP, PROP])
@pytest.mark.parametrize("mode", [MAX, INC])
def test_win2_matches_scalar_kernels_bitwise(handle, rng, dtype, nan, mode, monkeypatch):
    """win2 stores the values of the scalar fwd / bwd bit for bit (same window order, same arithmetic; NaN
    positions compared, not payloads): ties, NaN, +-0."""
    xdims, win = (2, 8, 16, 32), (2, 2)
    x = _t(xdims, "nchw", dtype)
    v = rng.integers(-2, 3, xdims).astype(np.float64) * rng.choice([1.0, 0.5], xdims)
    v[v == 0] = rng.choice([0.0, -0.0], int((v == 0).sum()))
    if mode == MAX:
        v.flat[rng.choice(v.size, v.size // 20, replace=False)] = np.nan
        v[0, 0, :2, :2] = np.nan  # a window of nothing but NaN
    x.upload(v)
    pd = _pool_desc(mode, nan, win)
    ydims = tuple(pydnn.get_pooling_nd_forward_output_dim(pd, x.desc, 4))
    dy = _t(ydims, "nchw", dtype)
    dy.random(rng)
    outs = []
    monkeypatch.setattr(tuning.pooling, "P2", False)  # WIN2 off: the scalar fwd / bwd (P2: test_pooling_p2_gpu.py)
    for on in (True, False):
        monkeypatch.setattr(tuning.pooling, "WIN2", on)
        handle.prepared.clear()  # no cached plan of the other setting
        y, dx = _t(ydims, "nchw", dtype), _t(xdims, "nchw", dtype)
        assert _kernels(handle, pd, x, y, mode) == (("win2_fwd", "win2_bwd") if on else ("fwd", "bwd"))
        pydnn.pooling_forward(handle, pd, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
        pydnn.pooling_backward(handle, pd, 1.0, y.desc, y.ptr, dy.desc, dy.ptr, x.desc, x.ptr, 0.0, dx.desc, dx.ptr)
        driver.synchronize()
        outs.append((y.download(), dx.download()))
    for a, b in zip(*outs):  # NaN where the other has NaN (its payload may differ), else the same bits
        assert np.array_equal(np.isnan(a), np.isnan(b))
        ok = ~np.isnan(a)
        assert np.array_equal(a[ok], b[ok]) and np.array_equal(np.signbit(a[ok]), np.signbit(b[ok]))


def test_win2_demo_shapes_against_torch(handle, rng):
    """The CNN demo's two max pools (bf16 NCHW 256x64x32x32 and 256x128x16x16, 2x2 / 2) on ReLU outputs, and
    average pooling on the first: forward and backward against PyTorch (max: exact; ties go to the first
    element in both)."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"torch: {e}")
    F = torch.nn.functional
    pydnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)
    try:
        for shape, mode in (((256, 64, 32, 32), MAX), ((256, 128, 16, 16), MAX), ((256, 64, 32, 32), INC)):
            x = torch.relu(torch.randn(shape, device="cuda", dtype=torch.bfloat16)).requires_grad_()
            tfn = (lambda t: F.max_pool2d(t, 2, 2)) if mode == MAX else (lambda t: F.avg_pool2d(t, 2, 2))
            yt = tfn(x)
            g = torch.randn_like(yt)
            yt.backward(g)
            y = torch.full_like(yt, float("nan"))
            dx = torch.full_like(x, float("nan"))
            xd, yd = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
            pydnn.set_tensor_nd_descriptor(xd, BF16, 4, list(x.shape), list(x.stride()))
            pydnn.set_tensor_nd_descriptor(yd, BF16, 4, list(y.shape), list(y.stride()))
            pd = _pool_desc(mode, NOPROP, (2, 2))
            geo = P._validate_fwd("pool", pd, xd, yd)
            assert P.plan_summary(handle, yd, xd, geometry=geo)[0][0].startswith("pydnn::pooling::win2_fwd")
            pydnn.pooling_forward(handle, pd, 1.0, xd, x.data_ptr(), 0.0, yd, y.data_ptr())
            pydnn.pooling_backward(handle, pd, 1.0, yd, y.data_ptr(), yd, g.data_ptr(), xd, x.data_ptr(), 0.0, xd,
                                   dx.data_ptr())
            torch.cuda.synchronize()
            if mode == MAX:
                assert torch.equal(y, yt.detach()), shape
                assert torch.equal(dx, x.grad), shape
            else:
                assert (y.float() - yt.detach().float()).abs().max().item() <= 0.01 * yt.abs().max().item()
                assert (dx.float() - x.grad.float()).abs().max().item() <= 0.01 * x.grad.abs().max().item()
    finally:
        pydnn.set_stream(handle, 0)
