"""Batch normalization on the GPU against the float64 reference: training forward (y, saved and running
statistics), inference, backward with saved and with recomputed statistics, the Ex forms (residual add,
ReLU mask in the reserve space, dz), for every dtype over layouts that reach every kernel path (rows with
16-byte and scalar accesses, the non-Ex scratch in y / dx and its head block, gen), alpha / beta blending,
in place, a large N*H*W with a large mean, bitwise reproducibility, and the C API."""
import numpy as np
import pytest

import pydnn
from pydnn import tuning
from cprog import build_and_run
from devtensor import DevTensor, assert_close
from pydnn.reference import batchnorm as ref
from pydnn.tensor import packed_strides

pytestmark = pytest.mark.gpu

F32, F64, F16, BF16 = (pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_DOUBLE, pydnn.PYDNN_DATA_HALF,
                       pydnn.PYDNN_DATA_BFLOAT16)
PER_ACT, SPATIAL, PERSIST = (pydnn.PYDNN_BATCHNORM_PER_ACTIVATION, pydnn.PYDNN_BATCHNORM_SPATIAL,
                             pydnn.PYDNN_BATCHNORM_SPATIAL_PERSISTENT)
OPS_BN, OPS_ACT, OPS_ADD = (pydnn.PYDNN_BATCHNORM_OPS_BN, pydnn.PYDNN_BATCHNORM_OPS_BN_ACTIVATION,
                            pydnn.PYDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION)
DTYPES = [F32, F16, BF16, F64]


@pytest.fixture(autouse=True)
def _no_gen_tiny(monkeypatch):
    """These small shapes test the rows / nc / planes paths: tiny calls would take gen (GEN_TINY; its own
    test is test_batchnorm_nc_gpu.py::test_gen_tiny)."""
    monkeypatch.setattr(tuning.batchnorm, "GEN_TINY", 0)
    monkeypatch.setattr(tuning.batchnorm, "NC_RES", False)  # (packed NCHW up to NC_RES_MAX: nc_res, its own tests)
PTOL = {F64: F64, F32: F32, F16: F32, BF16: F32}  # tolerance of the parameter-typed outputs

CASES = [  # dims, layout, mode
    ((4, 16, 5, 7), "nhwc", SPATIAL),          # rows, 16-byte vectors, scratch in y
    ((3, 37, 5, 7), "nhwc", SPATIAL),          # rows, scalar (C not a multiple of the vector)
    ((4, 16, 5, 7), "nchw", SPATIAL),          # gen (a block per channel)
    ((2, 8, 6, 6), (432, 1, 72, 12), SPATIAL),  # padded channels: non-Ex gen, Ex rows
    ((2, 6, 3, 4, 5), "nhwc", PERSIST),        # 5-d
    ((64, 32, 14, 14), "nhwc", SPATIAL),       # many chunks
    ((6, 5, 4, 3), "nchw", PER_ACT),           # rows of C*H*W (scalar: 60 features)
    ((9, 8, 2, 4), "nchw", PER_ACT),           # rows of 64 features, vectors
    ((3, 4, 2, 5), "nhwc", PER_ACT),           # gen
    ((5, 12, 1, 1), "nchw", SPATIAL),          # H = W = 1: rows
    ((1, 3, 1, 1), "nchw", SPATIAL),           # one element per channel (variance 0)
]


def _strides(dims, layout):
    if layout == "nchw":
        return packed_strides(dims, pydnn.PYDNN_TENSOR_NCHW)
    if layout == "nhwc":
        return packed_strides(dims, pydnn.PYDNN_TENSOR_NHWC)
    return layout


def _t(dims, layout, dtype):
    return DevTensor(dims, dtype, _strides(dims, layout))


def _params(x, mode):
    d = pydnn.create_tensor_descriptor()
    pydnn.derive_bn_tensor_descriptor(d, x.desc, mode)
    _, nb, dims, _ = pydnn.get_tensor_nd_descriptor(d, 8)
    pt = F64 if x.dtype == F64 else F32
    return d, dims, pt


def _ptensor(dims, pt, rng, lo=-2.0, hi=2.0):
    t = DevTensor(dims, pt)
    t.random(rng, lo, hi)
    return t


def _y_scale(xv, mean, invstd, scale, bias, z=None):
    """Magnitude of the terms of y (rounding error scales with them)."""
    s = np.abs(scale * invstd) * (np.abs(xv) + np.abs(mean)) + np.abs(bias)
    return s if z is None else s + np.abs(z)


def _stat_scale(mode, xv):
    return np.abs(xv).mean(axis=ref.axes(mode, xv.ndim), keepdims=True)


def _train(handle, mode, dims, layout, dtype, rng, alpha=1.0, beta=0.0, factor=0.1, ex_ops=None, running=True):
    x = _t(dims, layout, dtype)
    xv = x.random(rng)
    y = _t(dims, layout, dtype)
    y0 = y.random(rng) if beta != 0 else None
    bd, pdims, pt = _params(x, mode)
    sc, bi = _ptensor(pdims, pt, rng), _ptensor(pdims, pt, rng)
    rm, rv = _ptensor(pdims, pt, rng), _ptensor(pdims, pt, rng, 0.5, 2.0)
    sm, si = DevTensor(pdims, pt), DevTensor(pdims, pt)
    out = dict(x=x, xv=xv, y=y, y0=y0, bd=bd, sc=sc, bi=bi, rm=rm, rv=rv, sm=sm, si=si, pt=pt, pdims=pdims)
    run_m, run_v = (rm.values, rv.values) if running else (None, None)
    rmp, rvp = (rm.ptr, rv.ptr) if running else (0, 0)
    if ex_ops is None:
        pydnn.batch_normalization_forward_training(handle, mode, alpha, beta, x.desc, x.ptr, y.desc, y.ptr, bd, sc.ptr,
                                                   bi.ptr, factor, rmp, rvp, 1e-5, sm.ptr, si.ptr)
        z = zv = None
    else:
        z = _t(dims, layout, dtype) if ex_ops == OPS_ADD else None
        zv = z.random(rng) if z is not None else None
        act = pydnn.create_activation_descriptor()
        pydnn.set_activation_descriptor(act, pydnn.PYDNN_ACTIVATION_RELU, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
        zd = z.desc if z is not None else None
        wn = pydnn.get_batch_normalization_forward_training_ex_workspace_size(handle, mode, ex_ops, x.desc, zd,
                                                                              y.desc, bd, act)
        rn = pydnn.get_batch_normalization_training_ex_reserve_space_size(handle, mode, ex_ops, act, x.desc)
        ws = pydnn.DeviceArray((max(wn, 16),), np.uint8)
        ws.fill_bytes(0xFF)
        res = pydnn.DeviceArray((max(rn, 16),), np.uint8)
        res.fill_bytes(0x7F)
        pydnn.batch_normalization_forward_training_ex(
            handle, mode, ex_ops, alpha, beta, x.desc, x.ptr, zd, z.ptr if z is not None else 0, y.desc, y.ptr, bd,
            sc.ptr, bi.ptr, factor, rmp, rvp, 1e-5, sm.ptr, si.ptr, act, ws.ptr, wn, res.ptr, rn)
        out.update(z=z, act=act, res=res, rn=rn)
    want_y, nrm, nrv, mean, invstd, mask = ref.forward_training(
        mode, alpha, beta, xv, y0, sc.values, bi.values, factor, run_m, run_v, 1e-5, z=zv,
        relu=ex_ops is not None and ex_ops != OPS_BN)
    out.update(zv=zv, want_y=want_y, mean=mean, invstd=invstd, mask=mask, nrm=nrm, nrv=nrv)
    yscale = abs(alpha) * _y_scale(xv, mean, invstd, sc.values, bi.values, zv)
    if beta != 0:
        yscale = yscale + np.abs(beta * y0)
    assert_close(y.download(), want_y, dtype, "y", scale=yscale)
    y.check_untouched()
    ptol = PTOL[dtype]
    assert_close(sm.download(), mean, ptol, "saved mean", scale=_stat_scale(mode, xv))
    assert_close(si.download(), invstd, ptol, "saved inverse std")
    if running:
        assert_close(rm.download(), nrm, ptol, "running mean", scale=np.abs(rm.values) + _stat_scale(mode, xv))
        assert_close(rv.download(), nrv, ptol, "running variance", scale=np.abs(rv.values) + _stat_scale(mode, xv) ** 2)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dims,layout,mode", CASES)
def test_forward_training(handle, dims, layout, mode, dtype, rng):
    _train(handle, mode, dims, layout, dtype, rng)


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_forward_training_blend_and_options(handle, dtype, rng):
    _train(handle, SPATIAL, (4, 16, 5, 7), "nhwc", dtype, rng, alpha=0.5, beta=-0.75)  # beta: gen path
    _train(handle, SPATIAL, (4, 16, 5, 7), "nhwc", dtype, rng, factor=1.0)  # running = batch statistics
    _train(handle, SPATIAL, (4, 16, 5, 7), "nchw", dtype, rng, running=False)


def _backward(handle, t, dtype, mode, rng, saved=True, ad=1.0, bd_=0.0, ap=1.0, bp=0.0, ex_ops=None):
    x, xv, pdims, pt = t["x"], t["xv"], t["pdims"], t["pt"]
    dims = x.dims
    dy = DevTensor(dims, dtype, x.strides)
    dyv = dy.random(rng)
    dx = DevTensor(dims, dtype, x.strides)
    dx0 = dx.random(rng) if bd_ != 0 else None
    ds, db = DevTensor(pdims, pt), DevTensor(pdims, pt)
    ds0 = ds.random(rng) if bp != 0 else None
    db0 = db.random(rng) if bp != 0 else None
    smp, sip = (t["sm"].ptr, t["si"].ptr) if saved else (0, 0)
    s_mean, s_inv = (t["sm"].download(), t["si"].download()) if saved else (None, None)
    mask = dz = dz0 = None
    if ex_ops is None:
        pydnn.batch_normalization_backward(handle, mode, ad, bd_, ap, bp, x.desc, x.ptr, dy.desc, dy.ptr, dx.desc,
                                           dx.ptr, t["bd"], t["sc"].ptr, ds.ptr, db.ptr, 1e-5, smp, sip)
    else:
        act = t["act"]
        if ex_ops == OPS_ADD:
            dz = DevTensor(dims, dtype, x.strides)
            dz0 = dz.random(rng) if bd_ != 0 else None
        dzd = dz.desc if dz is not None else None
        wn = pydnn.get_batch_normalization_backward_ex_workspace_size(handle, mode, ex_ops, x.desc, t["y"].desc,
                                                                      dy.desc, dzd, dx.desc, t["bd"], act)
        ws = pydnn.DeviceArray((max(wn, 16),), np.uint8)
        ws.fill_bytes(0xFF)
        pydnn.batch_normalization_backward_ex(
            handle, mode, ex_ops, ad, bd_, ap, bp, x.desc, x.ptr, t["y"].desc, t["y"].ptr, dy.desc, dy.ptr, dzd,
            dz.ptr if dz is not None else 0, dx.desc, dx.ptr, t["bd"], t["sc"].ptr, t["bi"].ptr, ds.ptr, db.ptr,
            1e-5, smp, sip, act, ws.ptr, wn, t["res"].ptr, t["rn"])
        if ex_ops != OPS_BN:  # the GPU's own mask, at x's element offsets
            flat = t["res"].to_numpy()[:t["rn"]]
            mask = np.lib.stride_tricks.as_strided(flat, dims, x.strides).astype(bool)
    want_dx, want_ds, want_db, want_dz = ref.backward(mode, ad, bd_, ap, bp, xv, dyv, dx0, t["sc"].values, ds0, db0,
                                                      1e-5, s_mean, s_inv, mask=mask, dz0=dz0)
    ax = ref.axes(mode, len(dims))
    mean, invstd = (s_mean, s_inv) if saved else ref.batch_stats(mode, xv)[:2]
    if not saved:
        invstd = 1.0 / np.sqrt(invstd + 1e-5)
    dym = dyv if mask is None else np.where(mask, dyv, 0.0)
    xhat = (xv - mean) * invstd
    n = xv.size // np.prod(pdims)
    g = np.abs(t["sc"].values * invstd)
    dx_scale = abs(ad) * g * (np.abs(dym) + np.abs(dym).mean(axis=ax, keepdims=True)
                              + np.abs(xhat) * np.abs(dym * xhat).sum(axis=ax, keepdims=True) / n)
    if bd_ != 0:
        dx_scale = dx_scale + np.abs(bd_ * dx0)
    assert_close(dx.download(), want_dx, dtype, "dx", scale=dx_scale)
    dx.check_untouched()
    ptol = PTOL[dtype]
    s_ds = abs(ap) * np.abs(dym * xhat).sum(axis=ax, keepdims=True) + (np.abs(bp * ds0) if bp != 0 else 0)
    s_db = abs(ap) * np.abs(dym).sum(axis=ax, keepdims=True) + (np.abs(bp * db0) if bp != 0 else 0)
    assert_close(ds.download(), want_ds, ptol, "dscale", scale=s_ds)
    assert_close(db.download(), want_db, ptol, "dbias", scale=s_db)
    if dz is not None:
        assert_close(dz.download(), want_dz, dtype, "dz", scale=np.abs(ad * dym) + (np.abs(bd_ * dz0) if bd_ else 0))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dims,layout,mode", CASES)
def test_backward(handle, dims, layout, mode, dtype, rng):
    t = _train(handle, mode, dims, layout, dtype, rng)
    _backward(handle, t, dtype, mode, rng, saved=True)
    _backward(handle, t, dtype, mode, rng, saved=False)


@pytest.mark.parametrize("dtype", [F32, BF16, F64])
def test_backward_blend(handle, dtype, rng):
    t = _train(handle, SPATIAL, (4, 16, 5, 7), "nhwc", dtype, rng)
    _backward(handle, t, dtype, SPATIAL, rng, ad=0.5, bd_=0.25, ap=2.0, bp=-1.0)  # gen (beta on dx)
    _backward(handle, t, dtype, SPATIAL, rng, ad=1.5, ap=0.5, bp=0.5)  # rows, dscale / dbias blended


@pytest.mark.parametrize("ops", [OPS_BN, OPS_ACT, OPS_ADD])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dims,layout,mode", [((4, 16, 5, 7), "nhwc", SPATIAL), ((3, 37, 5, 7), "nhwc", SPATIAL),
                                              ((2, 8, 6, 6), (432, 1, 72, 12), SPATIAL),
                                              ((3, 5, 4, 6), "nchw", SPATIAL), ((6, 5, 4, 3), "nchw", PER_ACT)])
def test_ex(handle, dims, layout, mode, dtype, ops, rng):
    t = _train(handle, mode, dims, layout, dtype, rng, ex_ops=ops)
    if ops != OPS_BN:  # the mask: 1 where relu's input was > 0 (elements far from 0 must agree)
        flat = t["res"].to_numpy()[:t["rn"]]
        got = np.lib.stride_tricks.as_strided(flat, dims, t["x"].strides)
        assert set(np.unique(got)) <= {0, 1}
        want = t["mask"]
        v = ref.forward_training(mode, 1.0, 0.0, t["xv"], None, t["sc"].values, t["bi"].values, 0.1, None, None,
                                 1e-5, z=t["zv"])[0]
        clear = np.abs(v) > 1e-2
        assert (got.astype(bool)[clear] == want[clear]).all()
    _backward(handle, t, dtype, mode, rng, saved=True, ex_ops=ops)
    _backward(handle, t, dtype, mode, rng, saved=False, ad=0.5, bd_=0.5, ex_ops=ops)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dims,layout,mode", CASES)
def test_inference(handle, dims, layout, mode, dtype, rng):
    x = _t(dims, layout, dtype)
    xv = x.random(rng)
    bd, pdims, pt = _params(x, mode)
    sc, bi, m = _ptensor(pdims, pt, rng), _ptensor(pdims, pt, rng), _ptensor(pdims, pt, rng)
    v = _ptensor(pdims, pt, rng, 0.1, 3.0)
    for alpha, beta in ((1.0, 0.0), (0.5, -2.0)):
        y = _t(dims, layout, dtype)
        y0 = y.random(rng)
        pydnn.batch_normalization_forward_inference(handle, mode, alpha, beta, x.desc, x.ptr, y.desc, y.ptr, bd,
                                                    sc.ptr, bi.ptr, m.ptr, v.ptr, 1e-3)
        want = ref.forward_inference(alpha, beta, xv, y0, sc.values, bi.values, m.values, v.values, 1e-3)
        inv = 1 / np.sqrt(v.values + 1e-3)
        s = abs(alpha) * _y_scale(xv, m.values, inv, sc.values, bi.values) + np.abs(beta * y0)
        assert_close(y.download(), want, dtype, "y", scale=s)
        y.check_untouched()
    # in place
    pydnn.batch_normalization_forward_inference(handle, mode, 1.0, 0.0, x.desc, x.ptr, x.desc, x.ptr, bd, sc.ptr,
                                                bi.ptr, m.ptr, v.ptr, 1e-3)
    want = ref.forward_inference(1.0, 0.0, xv, None, sc.values, bi.values, m.values, v.values, 1e-3)
    s = _y_scale(xv, m.values, 1 / np.sqrt(v.values + 1e-3), sc.values, bi.values)
    assert_close(x.download(), want, dtype, "y in place", scale=s)


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_large_reduction_with_large_mean(handle, layout, rng):
    """256 x 224 x 224 values per channel (the per-channel count of 256x64x224x224) around a mean of
    100: Welford / Chan merges keep the variance (~1) exact to float32; E[x^2] - E[x]^2 would lose ~4
    digits. NHWC takes the rows kernels (12.8M rows, the grid's y limit), NCHW the nc kernels."""
    dims = (256, 2, 224, 224)
    x = _t(dims, layout, F32)
    xv = x.upload(100.0 + rng.standard_normal(dims).astype(np.float32))
    y = _t(dims, layout, F32)
    bd, pdims, pt = _params(x, SPATIAL)
    sc, bi = _ptensor(pdims, pt, rng), _ptensor(pdims, pt, rng)
    sm, si = DevTensor(pdims, pt), DevTensor(pdims, pt)
    pydnn.batch_normalization_forward_training(handle, SPATIAL, 1.0, 0.0, x.desc, x.ptr, y.desc, y.ptr, bd, sc.ptr,
                                               bi.ptr, 0.1, 0, 0, 0.0, sm.ptr, si.ptr)
    mean = xv.mean(axis=(0, 2, 3), keepdims=True)
    var = ((xv - mean) ** 2).mean(axis=(0, 2, 3), keepdims=True)
    assert_close(sm.download(), mean, F32, "mean", scale=np.abs(mean))
    assert_close(si.download(), 1 / np.sqrt(var), F32, "inverse std")


_BN_KEYS = ("bn_fwd", "bn_infer", "bn_bwd", "bn_fwd_rec", "bn_bwd_rec")  # plans and launch records


def _forget_bn_plans(handle):
    for k in [k for k in handle.prepared if isinstance(k, tuple) and k and k[0] in _BN_KEYS]:
        del handle.prepared[k]


@pytest.mark.parametrize("apply_saved", [True, False])
@pytest.mark.parametrize("fast16", [True, False])
@pytest.mark.parametrize("dtype", [F16, BF16])
def test_forward_fast16(handle, dtype, fast16, apply_saved, rng, monkeypatch):
    """16-bit NHWC with 16-byte vectors: the FAST16 kernels (bf16: the long one-wave stats; the plain apply
    with alpha folded into its constants, the batched head) and, FAST16 off, the v2 ones.
    Rows not a multiple of the rows in flight, several apply blocks, non-Ex (scratch in y), Ex BN
    (workspace), Ex ReLU (v2 apply after the FAST16 stats), alpha != 1. apply_saved: the plain calls (they
    keep saved statistics) on fwd_apply_saved (no head), or, off, on fwd_apply_plain + the head."""
    from pydnn.ops import batchnorm as B

    monkeypatch.setattr(tuning.batchnorm, "FAST16", fast16)
    monkeypatch.setattr(tuning.batchnorm, "APPLY_SAVED", apply_saved)  # off: the saved statistics' calls take the head path
    _forget_bn_plans(handle)
    try:
        dims = (33, 16, 17, 19)
        for alpha in (1.0, 0.5):
            _train(handle, SPATIAL, dims, "nhwc", dtype, rng, alpha=alpha)
            _train(handle, SPATIAL, dims, "nhwc", dtype, rng, alpha=alpha, ex_ops=OPS_BN)
        _train(handle, PERSIST, dims, "nhwc", dtype, rng, ex_ops=OPS_ACT)
        test_inference(handle, dims, "nhwc", SPATIAL, dtype, rng)
    finally:
        _forget_bn_plans(handle)


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_forward_head_path(handle, dtype, rng, monkeypatch):
    """APPLY_SAVED off: the plain forward with saved statistics on the apply + head sequence (the path of
    calls without saved statistics), fp32 (fwd_apply + the head) and bf16 (fwd_apply_plain + the head), non-Ex and Ex BN."""
    from pydnn.ops import batchnorm as B

    monkeypatch.setattr(tuning.batchnorm, "APPLY_SAVED", False)
    _forget_bn_plans(handle)
    try:
        for alpha in (1.0, 0.5):
            _train(handle, SPATIAL, (33, 16, 17, 19), "nhwc", dtype, rng, alpha=alpha)
        _train(handle, SPATIAL, (33, 16, 17, 19), "nhwc", dtype, rng, ex_ops=OPS_BN)
    finally:
        _forget_bn_plans(handle)


def test_reproducible(handle, rng):
    dims = (32, 64, 9, 9)
    out = []
    for _ in range(2):
        x = _t(dims, "nhwc", BF16)
        x.upload(np.arange(np.prod(dims)).reshape(dims) % 97 / 7.0)
        y = _t(dims, "nhwc", BF16)
        bd, pdims, pt = _params(x, SPATIAL)
        one = DevTensor(pdims, pt)
        one.upload(np.ones(pdims))
        sm, si = DevTensor(pdims, pt), DevTensor(pdims, pt)
        pydnn.batch_normalization_forward_training(handle, SPATIAL, 1.0, 0.0, x.desc, x.ptr, y.desc, y.ptr, bd,
                                                   one.ptr, one.ptr, 0.1, 0, 0, 1e-5, sm.ptr, si.ptr)
        out.append((y.buf.to_numpy(), sm.buf.to_numpy(), si.buf.to_numpy()))
    for a, b in zip(out[0], out[1]):
        assert a.tobytes() == b.tobytes()


def test_c_program(tmp_path):
    r = build_and_run("batchnorm_gpu", tmp_path, extra=["-ldl", "-lm"])
    print(r.stdout, r.stderr)
    assert "FAIL" not in r.stdout and r.returncode == 0, r.stdout + r.stderr
    for what in ("derive", "training forward", "inference", "backward", "training forward ex", "backward ex",
                 "epsilon below the minimum"):
        assert f"ok {what}" in r.stdout, r.stdout + r.stderr
