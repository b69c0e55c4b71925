"""Batch norm's nc_res on the GPU (packed NCHW / NCDHW SPATIAL training forward and backward, a channel in one
block's registers; tuning.batchnorm.NC_RES) against the float64 reference: every PER (4 / 8 / 16) and block size
from one warp to 1024 threads, planes shorter and longer than a block, N = 1, 5-d, one element a plane row; the
training forward with and without running / saved statistics, factor 1, alpha / beta blending; the backward with
saved and recomputed statistics, dx and dscale / dbias blended; the Ex forms (ReLU mask, residual add, dz);
pointers off every vector; bitwise reproducibility. Outputs start poisoned (NaN bytes)."""
import numpy as np
import pytest

import pydnn
from pydnn import tuning
from devtensor import DevTensor, assert_close
from pydnn.ops import batchnorm as B
from pydnn.reference import batchnorm as ref
import test_batchnorm_gpu as G
from test_batchnorm_nc_gpu import _Shifted

pytestmark = pytest.mark.gpu

F32, F16, BF16 = G.F32, G.F16, G.BF16
SPATIAL = G.SPATIAL
NAMES = {F32: "fp32", F16: "fp16", BF16: "bf16"}
RES = [("nc_res", None)]


def _dt(*dtypes):
    return pytest.mark.parametrize("dtype", dtypes, ids=[NAMES[d] for d in dtypes])


@pytest.fixture(autouse=True)
def _ncres(monkeypatch, handle):
    monkeypatch.setattr(tuning.batchnorm, "NC_RES", True)
    monkeypatch.setattr(tuning.batchnorm, "NC_RES_MAX", 16384)
    monkeypatch.setattr(tuning.batchnorm, "NCHW_SPLIT", True)
    G._forget_bn_plans(handle)
    yield
    G._forget_bn_plans(handle)


@pytest.fixture
def launched(monkeypatch):
    seqs = []
    run = B._run

    def record(handle, pl, seq):
        seqs.append([(lc.kernel, lc.vec) for lc in seq])
        return run(handle, pl, seq)

    monkeypatch.setattr(B, "_run", record)
    return seqs


SHAPES = [
    (5, 37, 23, 23),    # 2645 a channel: PER 8, 352 threads; planes of 529 straddle the block
    (1, 6, 99, 99),     # 9801: PER 16, 640 threads, N = 1
    (2, 3, 77, 77),     # 11858: PER 16, 768 threads, 3 blocks
    (1, 4, 128, 128),   # 16384: PER 16, 1024 threads (the limit)
    (21, 13, 9, 9),     # 1701: PER 8, planes of 81 (many a block)
    (3, 5, 7, 9),       # 189: PER 4, 64 threads
    (1, 2, 1, 2),       # 2: one warp, one element a thread
    (2, 4, 3, 5, 7),    # 5-d
    (300, 3, 1, 3),     # planes of 3, 900 a channel
]


@_dt(F32, F16, BF16)
@pytest.mark.parametrize("dims", SHAPES)
def test_ncres_training_and_backward(handle, dims, dtype, rng, launched):
    t = G._train(handle, SPATIAL, dims, "nchw", dtype, rng)
    assert launched[-1] == RES
    G._backward(handle, t, dtype, SPATIAL, rng, saved=True)
    assert launched[-1] == RES
    G._backward(handle, t, dtype, SPATIAL, rng, saved=False)
    assert launched[-1] == RES
    G._backward(handle, t, dtype, SPATIAL, rng, ad=1.5, ap=0.5, bp=0.5)  # dscale / dbias blended
    G._backward(handle, t, dtype, SPATIAL, rng, ad=0.5, bd_=0.25, ap=2.0, bp=-1.0, saved=False)  # dx blended
    assert launched[-1] == RES and len(launched) == 5


@_dt(F32, BF16)
@pytest.mark.parametrize("dims", [(5, 37, 23, 23), (2, 3, 77, 77), (3, 5, 7, 9)])
def test_ncres_forward_options(handle, dims, dtype, rng, launched):
    G._train(handle, SPATIAL, dims, "nchw", dtype, rng, alpha=0.5, beta=-0.75)
    G._train(handle, SPATIAL, dims, "nchw", dtype, rng, factor=1.0)  # running = the batch's
    G._train(handle, SPATIAL, dims, "nchw", dtype, rng, running=False)
    assert launched == [RES] * 3


@pytest.mark.parametrize("ops", [G.OPS_BN, G.OPS_ACT, G.OPS_ADD])
@_dt(F32, F16, BF16)
@pytest.mark.parametrize("dims", [(5, 37, 23, 23), (1, 6, 99, 99), (3, 5, 7, 9)])
def test_ncres_ex(handle, dims, dtype, ops, rng, launched):
    t = G._train(handle, SPATIAL, dims, "nchw", dtype, rng, ex_ops=ops)
    assert launched[-1] == RES
    if ops != G.OPS_BN:  # the mask: 1 where relu's input was > 0 (elements far from 0 must agree)
        flat = t["res"].to_numpy()[:t["rn"]]
        got = np.lib.stride_tricks.as_strided(flat, dims, t["x"].strides)
        assert set(np.unique(got)) <= {0, 1}
        v = ref.forward_training(SPATIAL, 1.0, 0.0, t["xv"], None, t["sc"].values, t["bi"].values, 0.1, None, None,
                                 1e-5, z=t["zv"])[0]
        clear = np.abs(v) > 1e-2
        assert (got.astype(bool)[clear] == t["mask"][clear]).all()
    G._backward(handle, t, dtype, SPATIAL, rng, saved=True, ex_ops=ops)
    assert launched[-1] == RES
    G._backward(handle, t, dtype, SPATIAL, rng, saved=False, ad=0.5, bd_=0.25, ap=2.0, bp=-1.0, ex_ops=ops)
    assert launched[-1] == RES


@_dt(F32, F16, BF16)
@pytest.mark.parametrize("dims", [(5, 7, 23, 23), (1, 3, 99, 99)])
def test_ncres_misaligned(handle, dims, dtype, rng, launched):
    """x, y, dy, dx each one element off the 16-byte vector (nc_res loads elements one by one)."""
    x = _Shifted(dims, dtype, rng.uniform(-3, 3, dims).astype(np.float32))
    xv = x.values
    bd, pdims, pt = G._params(x, SPATIAL)
    sc, bi = G._ptensor(pdims, pt, rng), G._ptensor(pdims, pt, rng)
    sm, si = DevTensor(pdims, pt), DevTensor(pdims, pt)
    y = _Shifted(dims, dtype)
    pydnn.batch_normalization_forward_training(handle, SPATIAL, 1.0, 0.0, x.desc, x.ptr, y.desc, y.ptr, bd, sc.ptr,
                                               bi.ptr, 0.1, 0, 0, 1e-5, sm.ptr, si.ptr)
    assert launched[-1] == RES
    want_y, _, _, mean, invstd, _ = ref.forward_training(SPATIAL, 1.0, 0.0, xv, None, sc.values, bi.values, 0.1, None,
                                                         None, 1e-5)
    assert_close(y.download(), want_y, dtype, "y", scale=G._y_scale(xv, mean, invstd, sc.values, bi.values))
    assert_close(sm.download(), mean, G.PTOL[dtype], "saved mean", scale=G._stat_scale(SPATIAL, xv))
    assert_close(si.download(), invstd, G.PTOL[dtype], "saved inverse std")
    dy = _Shifted(dims, dtype, rng.uniform(-3, 3, dims).astype(np.float32))
    dx = _Shifted(dims, dtype)
    ds, db = DevTensor(pdims, pt), DevTensor(pdims, pt)
    pydnn.batch_normalization_backward(handle, SPATIAL, 1.0, 0.0, 1.0, 0.0, x.desc, x.ptr, dy.desc, dy.ptr, dx.desc,
                                       dx.ptr, bd, sc.ptr, ds.ptr, db.ptr, 1e-5, 0, 0)
    assert launched[-1] == RES
    want_dx, want_ds, want_db, _ = ref.backward(SPATIAL, 1.0, 0.0, 1.0, 0.0, xv, dy.values, None, sc.values, None,
                                                None, 1e-5, None, None)
    ax = (0, 2, 3)
    xhat = (xv - mean) * invstd
    n = xv.size // np.prod(pdims)
    dyv = dy.values
    g = np.abs(sc.values * invstd)
    dx_scale = g * (np.abs(dyv) + np.abs(dyv).mean(axis=ax, keepdims=True)
                    + np.abs(xhat) * np.abs(dyv * xhat).sum(axis=ax, keepdims=True) / n)
    assert_close(dx.download(), want_dx, dtype, "dx", scale=dx_scale)
    assert_close(ds.download(), want_ds, G.PTOL[dtype], "dscale", scale=np.abs(dyv * xhat).sum(axis=ax, keepdims=True))
    assert_close(db.download(), want_db, G.PTOL[dtype], "dbias", scale=np.abs(dyv).sum(axis=ax, keepdims=True))


@_dt(F32, BF16)
def test_ncres_reproducible(handle, dtype, rng, launched):
    dims = (3, 6, 67, 67)
    x = G._t(dims, "nchw", dtype)
    x.random(rng)
    dy = G._t(dims, "nchw", dtype)
    dy.random(rng)
    bd, pdims, pt = G._params(x, SPATIAL)
    sc, bi = G._ptensor(pdims, pt, rng), G._ptensor(pdims, pt, rng)
    out = []
    for _ in range(2):
        y, dx = G._t(dims, "nchw", dtype), G._t(dims, "nchw", dtype)
        sm, si, ds, db = (DevTensor(pdims, pt) for _ in range(4))
        pydnn.batch_normalization_forward_training(handle, SPATIAL, 1.0, 0.0, x.desc, x.ptr, y.desc, y.ptr, bd,
                                                   sc.ptr, bi.ptr, 0.1, 0, 0, 1e-5, sm.ptr, si.ptr)
        pydnn.batch_normalization_backward(handle, SPATIAL, 1.0, 0.0, 1.0, 0.0, x.desc, x.ptr, dy.desc, dy.ptr,
                                           dx.desc, dx.ptr, bd, sc.ptr, ds.ptr, db.ptr, 1e-5, sm.ptr, si.ptr)
        out.append([t.buf.to_numpy() for t in (y, sm, si, dx, ds, db)])
    assert launched == [RES] * 4
    for a, b in zip(*out):
        assert a.tobytes() == b.tobytes()


@pytest.fixture
def launched_u(monkeypatch):
    seqs = []
    run = B._run

    def record(handle, pl, seq):
        seqs.append([(lc.kernel, lc.u, lc.block[0]) for lc in seq])
        return run(handle, pl, seq)

    monkeypatch.setattr(B, "_run", record)
    return seqs


@pytest.mark.parametrize("sms", [None, 2])
@_dt(F32, F16, BF16)
@pytest.mark.parametrize("dims", [(5, 400, 23, 23), (1, 140, 99, 99), (5, 37, 23, 23), (1, 12, 99, 99), (3, 9, 7, 9),
                                  (2, 4, 3, 5, 7)])
def test_ncres_stream(handle, dims, dtype, sms, rng, launched_u, monkeypatch):
    """NC_RES_WAVE's streaming form (4 elements a thread in registers, the rest read in each pass): where the
    resident blocks need more than one wave on this GPU, and (sms 2: the handle's SM count lowered) on every shape
    with more channels than 2 SMs hold, 64-256 threads."""
    if sms is not None:
        monkeypatch.setattr(handle, "sm_count", sms)
        G._forget_bn_plans(handle)
    t = G._train(handle, SPATIAL, dims, "nchw", dtype, rng)
    G._backward(handle, t, dtype, SPATIAL, rng, saved=True)
    G._backward(handle, t, dtype, SPATIAL, rng, saved=False, ad=0.5, bd_=0.25, ap=2.0, bp=-1.0)
    G._train(handle, SPATIAL, dims, "nchw", dtype, rng, alpha=0.5, beta=-0.75, ex_ops=G.OPS_ADD)
    assert all(len(s) == 1 and s[0][0] == "nc_res" for s in launched_u), launched_u
    streamed = [s[0] for s in launched_u if s[0][1].endswith(", true, 1")]  # (NC_RES_SU 1, the default)
    if sms is not None and dims[1] > 64:
        assert len(streamed) == 4, launched_u
    if sms is None and dims[1] >= 140 and dims[2] == 99:
        assert len(streamed) == 4, launched_u
    G._forget_bn_plans(handle)


@_dt(F32, F16, BF16)
@pytest.mark.parametrize("dims", [(5, 400, 23, 23), (1, 140, 99, 99), (2, 100, 3, 5, 7)])
def test_ncres_stream_four_a_step(handle, dims, dtype, rng, launched_u, monkeypatch):
    """NC_RES_SU 4 (not the default): the streaming passes loading 4 elements a step together (nc_res<T, 4, .., true>,
    first use), on 2 SMs (every shape with more channels than 2 SMs hold streams)."""
    monkeypatch.setattr(tuning.batchnorm, "NC_RES_SU", 4)
    monkeypatch.setattr(handle, "sm_count", 2)
    G._forget_bn_plans(handle)
    t = G._train(handle, SPATIAL, dims, "nchw", dtype, rng)
    G._backward(handle, t, dtype, SPATIAL, rng, saved=True)
    G._backward(handle, t, dtype, SPATIAL, rng, saved=False, ad=0.5, bd_=0.25, ap=2.0, bp=-1.0)
    assert all(len(s) == 1 and s[0][0] == "nc_res" and s[0][1].endswith(", true") for s in launched_u), launched_u
    assert len(launched_u) == 3, launched_u
    G._forget_bn_plans(handle)


@_dt(F32, F16, BF16)
@pytest.mark.parametrize("dims", [(4, 139, 64, 64), (1, 140, 99, 99)])
def test_ncres_stream_wide(handle, dims, dtype, rng, launched_u, monkeypatch):
    """NC_RES_STREAM_WIDE (the default): the streaming form on 512-thread blocks where they keep every channel in
    one wave (139 / 140 channels of 16384 / 9801 elements: the resident blocks need 2 waves on an H100 / H200's
    132 SMs): training, backward with saved and recomputed statistics, blending."""
    monkeypatch.setattr(tuning.batchnorm, "NC_RES_STREAM_WIDE", True)
    G._forget_bn_plans(handle)
    t = G._train(handle, SPATIAL, dims, "nchw", dtype, rng)
    G._backward(handle, t, dtype, SPATIAL, rng, saved=True)
    G._backward(handle, t, dtype, SPATIAL, rng, saved=False, ad=0.5, bd_=0.25, ap=2.0, bp=-1.0)
    assert all(len(s) == 1 and s[0][0] == "nc_res" and s[0][1].endswith(", true, 1") for s in launched_u), launched_u
    if handle.sm_count in (132, 114):  # (H200 / H100 SXM, PCIe: 512 threads hold the channels in one wave)
        assert all(s[0][2] == 512 for s in launched_u), launched_u
    G._forget_bn_plans(handle)
