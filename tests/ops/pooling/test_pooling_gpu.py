"""Pooling on the GPU against the float64 reference: every mode x dtype over NCHW, NHWC and gapped layouts
(vector and scalar kernels), 1-d / 2-d / 3-d windows with padding and strides larger and smaller than the
window, ties (small-integer inputs) and NaN under both NaN options, alpha / beta blending, bitwise
determinism of the backward, unaligned pointers, adaptive and global average pooling (also against PyTorch),
the benchmark's shape against PyTorch, and the C face (tests/c/pooling_gpu.c)."""
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
DTYPES = [F32, F16, BF16, F64]

CASES = [  # xdims, layout, window, padding, stride
    ((2, 16, 9, 10), "nhwc", (3, 3), (1, 1), (2, 2)),        # the benchmark's pooling, vector kernel
    ((2, 16, 9, 10), "nchw", (3, 3), (1, 1), (2, 2)),        # scalar kernel along w
    ((3, 5, 11, 7), "nhwc", (2, 3), (1, 0), (3, 1)),         # C = 5: scalar; stride > window along h
    ((2, 24, 6, 7), "gaps", (3, 2), (2, 1), (1, 2)),         # padded channels and rows, vector kernel
    ((1, 8, 5, 6, 7), "nhwc", (2, 3, 3), (1, 1, 0), (2, 1, 2)),  # 3-d
    ((1, 3, 5, 6, 7), "nchw", (3, 2, 2), (0, 1, 1), (1, 2, 3)),  # 3-d, NCHW
    ((2, 8, 19), "nchw", (4,), (2,), (3,)),                  # 1-d
    ((1, 32, 17, 13), "nhwc", (5, 4), (2, 3), (2, 3)),       # large window and padding
    ((2, 40, 4, 4), "nhwc", (4, 4), (0, 0), (1, 1)),         # one window covers everything
]


def _strides(dims, layout):
    if layout == "nchw":
        return packed_strides(dims, pydnn.PYDNN_TENSOR_NCHW)
    if layout == "nhwc":
        return packed_strides(dims, pydnn.PYDNN_TENSOR_NHWC)
    return packed_strides(tuple(d + (3 if i == 1 else 1 if i >= 2 else 0) for i, d in enumerate(dims)),
                          pydnn.PYDNN_TENSOR_NHWC)


def _t(dims, layout, dtype):
    return DevTensor(dims, dtype, _strides(dims, layout))


def _pool_desc(mode, nan, win, pad, stride):
    d = pydnn.create_pooling_descriptor()
    pydnn.set_pooling_nd_descriptor(d, mode, nan, len(win), win, pad, stride)
    return d


def _inputs(x, rng, mode):
    """Max pooling gets small integers (many ties, exact in every dtype); averages get uniform values."""
    if mode in (MAX, MAXD):
        return x.upload(rng.integers(-3, 4, x.dims).astype(np.float64))
    return x.random(rng)


def _fwd(handle, pd, geo, mode, nan, x, y, xv, alpha, beta, y0, what):
    pydnn.pooling_forward(handle, pd, alpha, x.desc, x.ptr, beta, y.desc, y.ptr)
    want = ref.forward(mode, nan, alpha, xv, beta, y0, geo)
    scale = abs(alpha) * ref.forward_terms(mode, xv, geo) + (np.abs(beta * y0) if beta != 0 else 0)
    assert_close(y.download(), want, x.dtype, what, scale=scale)
    y.check_untouched()


def _bwd_scale(mode, nan, alpha, dyv, xv, beta, dx0, geo):
    return abs(alpha) * ref.backward(mode, nan, 1.0, np.abs(dyv), xv, 0.0, None, geo) + (
        np.abs(beta * dx0) if beta != 0 else 0)


@pytest.fixture
def rows_everywhere(monkeypatch):
    """fwd_rows for every eligible forward, however small its blocks (the flat vector forward keeps the
    3-d, adaptive and global cases)."""
    monkeypatch.setattr(tuning.pooling, "ROWS_MIN_BLOCK", 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", [MAX, MAXD, INC, EXC])
def test_pooling(handle, rng, mode, dtype, rows_everywhere):
    for xdims, layout, win, pad, stride in CASES:
        geo = ("pool", win, pad, stride)
        nan = PROP if mode == MAXD else NOPROP
        pd = _pool_desc(mode, nan, win, pad, stride)
        x = _t(xdims, layout, dtype)
        ydims = tuple(pydnn.get_pooling_nd_forward_output_dim(pd, x.desc, len(xdims)))
        y = _t(ydims, layout, dtype)
        xv = _inputs(x, rng, mode)
        what = f"{xdims} {layout} {win} {pad} {stride}"
        _fwd(handle, pd, geo, mode, nan, x, y, xv, 1.0, 0.0, None, f"fwd {what}")
        y0 = y.random(rng)
        alpha, beta = float(rng.uniform(-2, 2)), float(rng.uniform(-2, 2))
        _fwd(handle, pd, geo, mode, nan, x, y, xv, alpha, beta, y0, f"fwd blend {what}")
        # backward: y from a plain forward, dy random, dx poisoned, then blended
        pydnn.pooling_forward(handle, pd, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
        dy, dx = _t(ydims, layout, dtype), _t(xdims, layout, dtype)
        dyv = dy.random(rng)
        for alpha, beta in ((1.0, 0.0), (float(rng.uniform(-2, 2)), float(rng.uniform(-2, 2)))):
            dx0 = dx.random(rng) if beta else None
            if not beta:
                dx.poison()
            pydnn.pooling_backward(handle, pd, alpha, y.desc, y.ptr, dy.desc, dy.ptr, x.desc, x.ptr, beta, dx.desc,
                                   dx.ptr)
            want = ref.backward(mode, nan, alpha, dyv, xv, beta, dx0, geo)
            assert_close(dx.download(), want, dtype, f"bwd {alpha} {beta} {what}",
                         scale=_bwd_scale(mode, nan, alpha, dyv, xv, beta, dx0, geo))
            dx.check_untouched()


@pytest.mark.parametrize("rows_min", [1, 1 << 30])
@pytest.mark.parametrize("nan", [NOPROP, PROP])
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_nan_rules(handle, rng, nan, layout, rows_min, monkeypatch):
    monkeypatch.setattr(tuning.pooling, "ROWS_MIN_BLOCK", rows_min)  # fwd_rows, then the flat forward
    xdims, win, pad, stride = (2, 8, 9, 8), (3, 3), (1, 1), (2, 2)
    geo = ("pool", win, pad, stride)
    pd = _pool_desc(MAX, nan, win, pad, stride)
    x = _t(xdims, layout, F32)
    v = rng.integers(-2, 3, xdims).astype(np.float64)
    v.flat[rng.choice(v.size, v.size // 10, replace=False)] = np.nan
    v[0, 0, :3, :3] = np.nan  # a window of nothing but NaN
    xv = x.upload(v)
    ydims = (2, 8, 5, 4)
    y, dy, dx = _t(ydims, layout, F32), _t(ydims, layout, F32), _t(xdims, layout, F32)
    _fwd(handle, pd, geo, MAX, nan, x, y, xv, 1.0, 0.0, None, "nan fwd")
    dyv = dy.random(rng)
    pydnn.pooling_backward(handle, pd, 1.0, y.desc, y.ptr, dy.desc, dy.ptr, x.desc, x.ptr, 0.0, dx.desc, dx.ptr)
    # an element several windows chose sums their dy in float (in the kernel's order): the error model is the
    # magnitude of those terms, as in test_pooling (a cancelling sum missed rtol by itself on the H200 run of
    # 2026-11-28 once the p2 kernel summed in another order)
    assert_close(dx.download(), ref.backward(MAX, nan, 1.0, dyv, xv, 0.0, None, geo), F32, "nan bwd",
                 scale=_bwd_scale(MAX, nan, 1.0, dyv, xv, 0.0, None, geo))


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_backward_is_bitwise_reproducible(handle, rng, dtype):
    """Overlapping windows (3x3 / 1) and many ties: two runs give the same bits."""
    xdims, win, pad, stride = (4, 64, 33, 31), (3, 3), (1, 1), (1, 1)
    for mode in (MAXD, MAX, INC):
        pd = _pool_desc(mode, NOPROP, win, pad, stride)
        x, y, dy = _t(xdims, "nhwc", dtype), _t(xdims, "nhwc", dtype), _t(xdims, "nhwc", dtype)
        x.upload(rng.integers(-2, 3, xdims).astype(np.float64))
        dy.random(rng)
        pydnn.pooling_forward(handle, pd, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
        outs = []
        for _ in range(2):
            dx = _t(xdims, "nhwc", dtype)
            pydnn.pooling_backward(handle, pd, 1.0, y.desc, y.ptr, dy.desc, dy.ptr, x.desc, x.ptr, 0.0, dx.desc,
                                   dx.ptr)
            outs.append(dx.buf.to_numpy())
        assert (outs[0].view(np.uint8) == outs[1].view(np.uint8)).all()


@pytest.mark.parametrize("dtype", [F32, BF16, F16])
@pytest.mark.parametrize("mode", [MAX, INC])
def test_adaptive(handle, rng, mode, dtype):
    for xdims, ydims, layout in (((2, 16, 9, 7), (4, 3), "nhwc"), ((2, 5, 9, 7), (4, 3), "nchw"),
                                 ((1, 8, 3, 5), (7, 6), "nhwc"), ((1, 16, 6, 5, 7), (2, 3, 4), "nhwc"),
                                 ((2, 8, 13), (5,), "nchw"), ((2, 24, 12, 12), (12, 12), "gaps")):
        ydims = xdims[:2] + ydims
        x, y, dy, dx = _t(xdims, layout, dtype), _t(ydims, layout, dtype), _t(ydims, layout, dtype), _t(xdims, layout, dtype)
        xv = _inputs(x, rng, mode)
        for alpha, beta in ((1.0, 0.0), (-0.5, 1.5)):
            y0 = y.random(rng) if beta else None
            pydnn.adaptive_pooling_forward(handle, mode, NOPROP, alpha, x.desc, x.ptr, beta, y.desc, y.ptr)
            want = ref.forward(mode, NOPROP, alpha, xv, beta, y0, ("adaptive",), ydims[2:])
            scale = abs(alpha) * ref.forward_terms(mode, xv, ("adaptive",), ydims[2:]) + (np.abs(beta * y0) if beta else 0)
            assert_close(y.download(), want, dtype, f"adaptive fwd {xdims} {ydims}", scale=scale)
            # backward takes y from a plain forward (max pooling matches x against it)
            pydnn.adaptive_pooling_forward(handle, mode, NOPROP, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
            dyv = dy.random(rng)
            dx0 = dx.random(rng) if beta else None
            pydnn.adaptive_pooling_backward(handle, mode, NOPROP, alpha, y.desc, y.ptr, dy.desc, dy.ptr, x.desc, x.ptr,
                                            beta, dx.desc, dx.ptr)
            want = ref.backward(mode, NOPROP, alpha, dyv, xv, beta, dx0, ("adaptive",))
            assert_close(dx.download(), want, dtype, f"adaptive bwd {xdims} {ydims}",
                         scale=_bwd_scale(mode, NOPROP, alpha, dyv, xv, beta, dx0, ("adaptive",)))
            dx.check_untouched()


@pytest.mark.parametrize("dtype", [F32, BF16, F64])
def test_global_average(handle, rng, dtype):
    for xdims, layout in (((3, 40, 7, 7), "nhwc"), ((2, 5, 13, 11), "nchw"), ((2, 16, 3, 4, 5), "gaps"), ((2, 7, 30), "nchw")):
        ydims = xdims[:2] + (1,) * (len(xdims) - 2)
        x, y, dy, dx = _t(xdims, layout, dtype), _t(ydims, layout, dtype), _t(ydims, layout, dtype), _t(xdims, layout, dtype)
        xv = x.random(rng)
        pydnn.global_average_pooling_forward(handle, 1.0, x.desc, x.ptr, 0.0, y.desc, y.ptr)
        want = xv.mean(axis=tuple(range(2, len(xdims))), keepdims=True)
        assert_close(y.download(), want, dtype, f"global fwd {xdims}", scale=np.abs(xv).max())
        dyv = dy.random(rng)
        pydnn.global_average_pooling_backward(handle, 2.0, dy.desc, dy.ptr, 0.0, dx.desc, dx.ptr)
        want = np.broadcast_to(2.0 * dyv / np.prod(xdims[2:]), xdims)
        assert_close(dx.download(), want, dtype, f"global bwd {xdims}")
        dx.check_untouched()


@pytest.mark.parametrize("dtype", [BF16, F16, F32])
@pytest.mark.parametrize("nan", [NOPROP, PROP])
def test_rows_forward_matches_flat_forward_bitwise(handle, rng, dtype, nan, monkeypatch):
    """Max pooling: fwd_rows stores the same bits as the flat kernel (ties, NaN, +-0 in the data)."""
    xdims, win, pad, stride = (3, 64, 23, 45), (3, 3), (1, 1), (2, 2)
    x = _t(xdims, "nhwc", dtype)
    v = rng.integers(-2, 3, xdims).astype(np.float64) * rng.choice([1.0, 0.5], xdims)
    v[v == 0] = rng.choice([0.0, -0.0], int((v == 0).sum()))
    v.flat[rng.choice(v.size, v.size // 20, replace=False)] = np.nan
    x.upload(v)
    pd = _pool_desc(MAX, nan, win, pad, stride)
    ydims = tuple(pydnn.get_pooling_nd_forward_output_dim(pd, x.desc, 4))
    outs = []
    monkeypatch.setattr(tuning.pooling, "ROWS_MIN_BLOCK", 1)
    for rows in (True, False):
        monkeypatch.setattr(tuning.pooling, "ROWS_FORWARD", rows)
        y = _t(ydims, "nhwc", dtype)
        yd = pydnn.create_tensor_descriptor()  # a fresh descriptor: no cached plan of the other kernel
        pydnn.set_tensor_nd_descriptor(yd, dtype, 4, list(ydims), list(y.desc.strides))
        pd = _pool_desc(MAX, nan, win, pad, stride)
        assert P.plan_summary(handle, yd, x.desc, geometry=P._pool_geometry(pd, x.desc, yd))[0][0].startswith(
            "pydnn::pooling::fwd_rows" if rows else "pydnn::pooling::fwd<")
        pydnn.pooling_forward(handle, pd, 1.0, x.desc, x.ptr, 0.0, yd, y.ptr)
        driver.synchronize()
        outs.append(y.download())
    a, b = outs
    assert np.array_equal(np.isnan(a), np.isnan(b))
    ok = ~np.isnan(a)
    assert np.array_equal(a[ok], b[ok]) and np.array_equal(np.signbit(a[ok]), np.signbit(b[ok]))


@pytest.mark.parametrize("dtype", [BF16, F16, F32])
@pytest.mark.parametrize("mode", [MAX, INC, EXC])
@pytest.mark.parametrize("blend", [False, True])
@pytest.mark.parametrize("cols", [False, True])
def test_rows_fast3_matches_scan_bitwise(handle, rng, dtype, mode, blend, cols, monkeypatch):
    """fwd_rows' straight-line 3 x 3 path (FAST3) stores the bits of its scan path (same order, same
    arithmetic), for max and both averages, plain (alpha 1, beta 0) and blended; the reference agrees, also
    with the averages' shared column sums (COLS) taking the strips of full windows."""
    if cols and mode == MAX:
        pytest.skip("COLS is for averages")
    monkeypatch.setattr(tuning.pooling, "ROWS_COLS", cols)
    xdims, win, pad, stride = (2, 48, 13, 21), (3, 3), (1, 1), (2, 2)
    x = _t(xdims, "nhwc", dtype)
    xv = _inputs(x, rng, mode)
    pd = _pool_desc(mode, NOPROP, win, pad, stride)
    ydims = tuple(pydnn.get_pooling_nd_forward_output_dim(pd, x.desc, 4))
    alpha, beta = (0.75, -0.5) if blend else (1.0, 0.0)
    y0v = rng.uniform(-1, 1, ydims)
    outs = []
    monkeypatch.setattr(tuning.pooling, "ROWS_MIN_BLOCK", 1)
    for fast in (True, False):
        monkeypatch.setattr(tuning.pooling, "ROWS_FAST3", fast)
        handle.prepared.clear()  # no cached plan of the other setting
        y = _t(ydims, "nhwc", dtype)
        y0 = y.upload(y0v) if blend else None
        assert P.plan_summary(handle, y.desc, x.desc, geometry=P._pool_geometry(pd, x.desc, y.desc))[0][0].startswith(
            "pydnn::pooling::fwd_rows")
        _fwd(handle, pd, ("pool", win, pad, stride), mode, NOPROP, x, y, xv, alpha, beta, y0,
             f"fast3={fast} mode {mode} blend={blend}")
        driver.synchronize()
        outs.append(y.download())
    a, b = outs
    assert np.array_equal(np.isnan(a), np.isnan(b))
    ok = ~np.isnan(a)
    assert np.array_equal(a[ok], b[ok]) and np.array_equal(np.signbit(a[ok]), np.signbit(b[ok]))


def test_unaligned_pointers(handle, rng):
    """NHWC bf16 whose buffers start off 16-byte alignment: the scalar kernel takes the call."""
    xdims, ydims, win, pad, stride = (2, 16, 9, 10), (2, 16, 5, 5), (3, 3), (1, 1), (2, 2)
    st_x, st_y = _strides(xdims, "nhwc"), _strides(ydims, "nhwc")
    n_x, n_y = int(np.prod(xdims)), int(np.prod(ydims))
    from pydnn.reference import dtypes as rd
    xv = rng.uniform(-3, 3, xdims).astype(np.float32).astype(np.float64)
    flat = np.zeros(n_x, np.uint16)
    np.lib.stride_tricks.as_strided(flat, xdims, [s * 2 for s in st_x])[...] = rd.to_storage(xv, BF16)
    xd, yd = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(xd, BF16, 4, xdims, st_x)
    pydnn.set_tensor_nd_descriptor(yd, BF16, 4, ydims, st_y)
    xv = rd.from_storage(np.lib.stride_tricks.as_strided(flat, xdims, [s * 2 for s in st_x]), BF16)
    for mode in (MAX, EXC):
        pd = _pool_desc(mode, NOPROP, win, pad, stride)
        for xoff, yoff in ((1, 0), (0, 3), (8, 8)):
            xbuf, ybuf = pydnn.DeviceArray((n_x + 8,), np.uint16), pydnn.DeviceArray((n_y + 8,), np.uint16)
            xbuf.copy_from_numpy(np.concatenate([np.zeros(xoff, np.uint16), flat, np.zeros(8 - xoff, np.uint16)]))
            ybuf.fill_bytes(0xFF)
            pydnn.pooling_forward(handle, pd, 1.0, xd, xbuf.ptr + 2 * xoff, 0.0, yd, ybuf.ptr + 2 * yoff)
            driver.synchronize()
            out = ybuf.to_numpy()
            got = rd.from_storage(np.lib.stride_tricks.as_strided(out[yoff:], ydims, [s * 2 for s in st_y]).copy(), BF16)
            assert_close(got, ref.forward(mode, NOPROP, 1.0, xv, 0.0, None, ("pool", win, pad, stride)), BF16,
                         f"unaligned {xoff} {yoff}")
            assert (out[:yoff].view(np.uint8) == 0xFF).all() and (out[yoff + n_y:].view(np.uint8) == 0xFF).all()


def test_against_torch(handle, rng):
    """The benchmark's problem (bf16 NHWC 64x64x112x112, 3x3 / 2 / 1) and adaptive pooling, on torch tensors."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - torch fails to import under some pytest setups
        pytest.skip(f"torch: {e}")
    F = torch.nn.functional
    pydnn.set_stream(handle, torch.cuda.current_stream().cuda_stream)
    try:
        x = torch.randn(64, 64, 112, 112, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
        xd = pydnn.create_tensor_descriptor()
        pydnn.set_tensor_nd_descriptor(xd, BF16, 4, list(x.shape), list(x.stride()))
        y = torch.full((64, 64, 56, 56), float("nan"), device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
        yd = pydnn.create_tensor_descriptor()
        pydnn.set_tensor_nd_descriptor(yd, BF16, 4, list(y.shape), list(y.stride()))
        for mode, tfn in ((MAX, lambda t: F.max_pool2d(t, 3, 2, 1)), (INC, lambda t: F.avg_pool2d(t, 3, 2, 1)),
                          (EXC, lambda t: F.avg_pool2d(t, 3, 2, 1, count_include_pad=False))):
            pd = _pool_desc(mode, NOPROP, (3, 3), (1, 1), (2, 2))
            pydnn.pooling_forward(handle, pd, 1.0, xd, x.data_ptr(), 0.0, yd, y.data_ptr())  # bf16: no CAI in torch
            want = tfn(x.float())
            err = (y.float() - want).abs().max().item()
            assert err <= (0 if mode == MAX else 0.02 * want.abs().max().item()), (mode, err)
            # backward against autograd in float32 (ties are rare in float32 data)
            xs = x[:4].float().contiguous(memory_format=torch.channels_last).requires_grad_()
            g = torch.randn(4, 64, 56, 56, device="cuda").contiguous(memory_format=torch.channels_last)
            tfn(xs).backward(g)
            dx, ys = torch.empty_like(xs), torch.empty_like(g)
            d4 = [pydnn.create_tensor_descriptor() for _ in range(3)]
            for d, t in zip(d4, (xs, g, dx)):
                pydnn.set_tensor_nd_descriptor(d, F32, 4, list(t.shape), list(t.stride()))
            pydnn.pooling_forward(handle, pd, 1.0, d4[0], xs.detach(), 0.0, d4[1], ys)
            pydnn.pooling_backward(handle, pd, 1.0, d4[1], ys, d4[1], g, d4[0], xs.detach(), 0.0, d4[2], dx)
            torch.cuda.synchronize()
            # the float64 reference is the oracle; torch's gradient is printed beside it (on the H200, torch
            # 2.11's CUDA avg_pool2d backward on this channels-last problem disagreed with pydnn by up to 0.96
            # while torch 2.13 on the CPU matched the reference on a small problem): which side is off shows here
            want = ref.backward(mode, NOPROP, 1.0, g.double().cpu().numpy(), xs.detach().double().cpu().numpy(), 0.0,
                                None, ("pool", (3, 3), (1, 1), (2, 2)))
            ours = np.abs(dx.double().cpu().numpy() - want).max()
            theirs = np.abs(xs.grad.double().cpu().numpy() - want).max()
            print(f"mode {mode}: |pydnn - ref| {ours:.3g}, |torch - ref| {theirs:.3g}")
            assert ours <= 1e-5, (mode, ours, theirs)
        # adaptive forward + backward against torch
        xa = torch.randn(3, 8, 23, 17, device="cuda", requires_grad=True)
        for mode, tfn in ((MAX, F.adaptive_max_pool2d), (INC, F.adaptive_avg_pool2d)):
            xa.grad = None
            ya = tfn(xa, (5, 7))
            ga = torch.randn_like(ya)
            ya.backward(ga)
            da = [pydnn.create_tensor_descriptor() for _ in range(2)]
            pydnn.set_tensor_nd_descriptor(da[0], F32, 4, list(xa.shape), list(xa.stride()))
            pydnn.set_tensor_nd_descriptor(da[1], F32, 4, list(ya.shape), list(ya.stride()))
            yp = torch.empty_like(ya)
            dxp = torch.empty_like(xa)
            pydnn.adaptive_pooling_forward(handle, mode, NOPROP, 1.0, da[0], xa.detach(), 0.0, da[1], yp)
            pydnn.adaptive_pooling_backward(handle, mode, NOPROP, 1.0, da[1], yp, da[1], ga, da[0], xa.detach(), 0.0,
                                            da[0], dxp)
            torch.cuda.synchronize()
            assert torch.allclose(yp, ya.detach(), rtol=1e-6, atol=1e-6)
            assert torch.allclose(dxp, xa.grad, rtol=1e-5, atol=1e-6)
    finally:
        pydnn.set_stream(handle, 0)


def test_c_program_on_gpu(tmp_path):
    from cprog import build_and_run

    r = build_and_run("pooling_gpu", tmp_path, extra=["-ldl", "-lm"])
    print(r.stdout, r.stderr)
    assert "FAIL" not in r.stdout and r.returncode == 0, r.stdout + r.stderr
    for what in ("max forward numbers", "average backward numbers", "adaptive forward numbers", "max backward numbers"):
        assert f"ok {what}" in r.stdout, r.stdout + r.stderr
