"""Batch norm's nc kernels on the GPU (packed NCHW / NCDHW SPATIAL: nc_stats, fwd_final / bwd_final<A,
true>, the flat nc_apply, nc_head) against the float64 reference: H * W odd, below the vector, one plane
split over several items, many planes per item, 5-d, N = 1; every dtype; training with and without saved
statistics (the head path), backward with saved and recomputed statistics, the Ex forms (workspace, ReLU
mask, residual add, blending), inference (alpha / beta, in place), pointers off the 16-byte vector (the
VEC = 1 kernels), bitwise reproducibility. Outputs start poisoned (NaN bytes)."""
import numpy as np
import pytest

import pydnn
from pydnn import tuning
from devtensor import DevTensor, POISON, assert_close
from pydnn.ops import batchnorm as B
from pydnn.reference import batchnorm as ref
from pydnn.reference import dtypes as rd
from pydnn.tensor import DTYPES, packed_strides
import test_batchnorm_gpu as G

pytestmark = pytest.mark.gpu

F32, F64, F16, BF16 = G.F32, G.F64, G.F16, G.BF16
SPATIAL = G.SPATIAL
OPS_BN, OPS_ACT, OPS_ADD = G.OPS_BN, G.OPS_ACT, G.OPS_ADD
NAMES = {F32: "fp32", F64: "fp64", F16: "fp16", BF16: "bf16"}


def _dt(*dtypes):
    """parametrize("dtype", ...) with readable ids (-k "not fp64")."""
    return pytest.mark.parametrize("dtype", dtypes, ids=[NAMES[d] for d in dtypes])


@pytest.fixture(autouse=True)
def _no_gen_tiny(monkeypatch):
    """Small shapes here test the nc kernels: tiny calls would take gen (GEN_TINY, tested in test_gen_tiny),
    small forwards gen / planes (NC_GEN_ROWS)."""
    monkeypatch.setattr(tuning.batchnorm, "GEN_TINY", 0)
    monkeypatch.setattr(tuning.batchnorm, "NC_GEN_ROWS", 0)
    monkeypatch.setattr(tuning.batchnorm, "NC_RES", False)  # (packed NCHW up to NC_RES_MAX: nc_res, its own tests)


SHAPES = [
    (4, 16, 5, 7),      # H * W = 35: planes straddle the vectors
    (3, 5, 9, 11),
    (2, 3, 181, 181),   # a plane of 32761: several items per plane
    (300, 2, 3, 3),     # many planes per item
    (7, 130, 2, 2),     # H * W below the vector; the head spans every channel
    (2, 3, 4, 5, 6),    # 5-d
    (1, 6, 33, 31),     # N = 1
]


def _nc_plan_taken(handle, direction, dims, dtype, ex=False):
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(d, dtype, len(dims), dims, packed_strides(dims, pydnn.PYDNN_TENSOR_NCHW))
    others = (d,) if direction != "bwd" else (d, d)
    return any(k.startswith("nc") for k in B.plan_summary(handle, direction, SPATIAL, d, *others, ex=ex)[1])


@_dt(*G.DTYPES)
@pytest.mark.parametrize("dims", SHAPES)
def test_nc_training_and_backward(handle, dims, dtype, rng, launched):
    assert _nc_plan_taken(handle, "fwd", dims, dtype) and _nc_plan_taken(handle, "bwd", dims, dtype)
    t = G._train(handle, SPATIAL, dims, "nchw", dtype, rng)
    G._backward(handle, t, dtype, SPATIAL, rng, saved=True)
    G._backward(handle, t, dtype, SPATIAL, rng, saved=False)
    G._backward(handle, t, dtype, SPATIAL, rng, ad=1.5, ap=0.5, bp=0.5)  # dscale / dbias blended
    vec = {F32: 4, F64: 2, F16: 8, BF16: 8}[dtype]
    assert launched[0] == [("nc_stats", vec), ("fwd_final", None), ("nc_apply", vec)]  # saved: no head
    # (saved statistics, betaParamDiff 0: nc_stats<.., true, true>, bwd_sums_final and nc_apply kNcBwdSaved over
    # every element, no head; tuning.batchnorm.BWD_SUMS / BWD_APPLY_SAVED)
    if tuning.batchnorm.BWD_SUMS and tuning.batchnorm.BWD_APPLY_SAVED:
        assert launched[1] == [("nc_stats", vec), ("bwd_sums_final", None), ("nc_apply", vec)], launched[1]
    assert launched[2] == [("nc_stats", vec), ("bwd_final", None), ("nc_apply", vec), ("nc_head", vec)], launched[2]
    fin = "bwd_sums_final" if tuning.batchnorm.BWD_SUMS else "bwd_final"  # (saved, blended: the sums, the head)
    assert launched[3] == [("nc_stats", vec), (fin, None), ("nc_apply", vec), ("nc_head", vec)], launched[3]


@_dt(F32, BF16)
def test_nc_training_alpha_and_big_plane(handle, dtype, rng):
    G._train(handle, SPATIAL, (8, 3, 224, 224), "nchw", dtype, rng, alpha=0.5, factor=1.0)


@_dt(*G.DTYPES)
@pytest.mark.parametrize("dims", [(3, 300, 2, 3), (5, 64, 7, 9), (2, 3, 181, 181)])
def test_nc_forward_without_saved(handle, dims, dtype, rng, launched):
    """No saved statistics: stats, final, apply past the head, then nc_head over the elements whose bytes
    held the constants (non-Ex); running statistics updated."""
    x = G._t(dims, "nchw", dtype)
    xv = x.random(rng)
    y = G._t(dims, "nchw", dtype)
    bd, pdims, pt = G._params(x, SPATIAL)
    sc, bi = G._ptensor(pdims, pt, rng), G._ptensor(pdims, pt, rng)
    rm, rv = G._ptensor(pdims, pt, rng), G._ptensor(pdims, pt, rng, 0.5, 2.0)
    for alpha in (1.0, -0.75):
        pydnn.batch_normalization_forward_training(handle, SPATIAL, alpha, 0.0, x.desc, x.ptr, y.desc, y.ptr, bd,
                                                   sc.ptr, bi.ptr, 0.25, rm.ptr, rv.ptr, 1e-4, 0, 0)
        assert [k for k, _ in launched[-1]] == ["nc_stats", "fwd_final", "nc_apply", "nc_head"]
        want_y, nrm, nrv, mean, invstd, _ = ref.forward_training(SPATIAL, alpha, 0.0, xv, None, sc.values, bi.values,
                                                                 0.25, rm.values, rv.values, 1e-4)
        assert_close(y.download(), want_y, dtype, "y", scale=abs(alpha) * G._y_scale(xv, mean, invstd, sc.values,
                                                                                       bi.values))
        ptol = G.PTOL[dtype]
        st = G._stat_scale(SPATIAL, xv)
        assert_close(rm.download(), nrm, ptol, "running mean", scale=np.abs(rm.values) + st)
        assert_close(rv.download(), nrv, ptol, "running variance", scale=np.abs(rv.values) + st ** 2)
        rm.upload(nrm)
        rv.upload(nrv)
        y.poison()


@pytest.mark.parametrize("ops", [OPS_BN, OPS_ACT, OPS_ADD])
@_dt(*G.DTYPES)
@pytest.mark.parametrize("dims", [(3, 5, 9, 11), (7, 130, 2, 2), (2, 3, 181, 181)])
def test_nc_ex(handle, dims, dtype, ops, rng):
    """The Ex forms on the nc kernels: constants and partials in the workspace, the ReLU mask written and
    read flat, dz, blending (betaDataDiff)."""
    assert _nc_plan_taken(handle, "fwd", dims, dtype, ex=True)
    G.test_ex(handle, dims, "nchw", SPATIAL, dtype, ops, rng)


@_dt(F32, BF16)
def test_nc_ex_forward_blend(handle, dtype, rng):
    G._train(handle, SPATIAL, (3, 5, 9, 11), "nchw", dtype, rng, alpha=0.5, beta=-1.5, ex_ops=OPS_BN)
    G._train(handle, SPATIAL, (3, 5, 9, 11), "nchw", dtype, rng, alpha=2.0, beta=0.5, ex_ops=OPS_ADD)


@_dt(*G.DTYPES)
@pytest.mark.parametrize("dims", SHAPES + [(5, 33, 147, 147)])
def test_nc_inference(handle, dims, dtype, rng):
    assert _nc_plan_taken(handle, "infer", dims, dtype)
    G.test_inference(handle, dims, "nchw", SPATIAL, dtype, rng)


@pytest.mark.parametrize("dims", [(256, 64, 32, 32), (256, 128, 16, 16)])
def test_nc_demo_shapes(handle, dims, rng):
    """examples/train_cnn.py's two batch norms (bf16 NCHW, BN + ReLU through the Ex form) and backward."""
    assert _nc_plan_taken(handle, "fwd", dims, BF16, ex=True) and _nc_plan_taken(handle, "bwd", dims, BF16, ex=True)
    t = G._train(handle, SPATIAL, dims, "nchw", BF16, rng, ex_ops=OPS_ACT)
    G._backward(handle, t, BF16, SPATIAL, rng, saved=True, ex_ops=OPS_ACT)


class _Shifted:
    """A packed NCHW tensor one element past a 16-byte boundary (the VEC = 1 kernels)."""

    def __init__(self, dims, dtype, values=None):
        self.dims, self.dtype = tuple(dims), dtype
        self.isz, self.np_dtype = DTYPES[dtype][0], DTYPES[dtype][1]
        self.n = int(np.prod(dims))
        self.buf = pydnn.DeviceArray((self.n + 1,), self.np_dtype)
        self.buf.fill_bytes(POISON)
        self.ptr = self.buf.ptr + self.isz
        self.desc = pydnn.create_tensor_descriptor()
        pydnn.set_tensor_nd_descriptor(self.desc, dtype, len(dims), self.dims,
                                       packed_strides(self.dims, pydnn.PYDNN_TENSOR_NCHW))
        self.values = None
        if values is not None:
            flat = self.buf.to_numpy()
            stored = rd.to_storage(values, dtype)
            flat[1:] = stored.ravel()
            self.buf.copy_from_numpy(flat)
            self.values = rd.from_storage(stored, dtype)

    def download(self):
        flat = self.buf.to_numpy()
        assert flat[:1].view(np.uint8).tolist() == [POISON] * self.isz, "wrote before the tensor"
        return rd.from_storage(np.array(flat[1:]).reshape(self.dims), self.dtype)


@pytest.fixture
def launched(monkeypatch):
    """The (kernel, vec) sequences batch norm launches, call by call."""
    seqs = []
    run = B._run

    def record(handle, pl, seq):
        seqs.append([(lc.kernel, lc.vec) for lc in seq])
        return run(handle, pl, seq)

    monkeypatch.setattr(B, "_run", record)
    return seqs


@_dt(F32, F16, BF16)
@pytest.mark.parametrize("dims", [(4, 16, 5, 7), (2, 3, 181, 181)])
def test_nc_misaligned(handle, dims, dtype, rng, launched):
    """x (and dy) one element off the 16-byte vector: the VEC = 1 nc kernels (y / dx, the scratch, aligned;
    inference with y off too)."""
    x = _Shifted(dims, dtype, rng.uniform(-3, 3, dims).astype(np.float32))
    xv = x.values
    bd, pdims, pt = G._params(x, SPATIAL)
    sc, bi = G._ptensor(pdims, pt, rng), G._ptensor(pdims, pt, rng)
    m, v = G._ptensor(pdims, pt, rng), G._ptensor(pdims, pt, rng, 0.1, 3.0)
    y = _Shifted(dims, dtype)
    pydnn.batch_normalization_forward_inference(handle, SPATIAL, 1.0, 0.0, x.desc, x.ptr, y.desc, y.ptr, bd, sc.ptr,
                                                bi.ptr, m.ptr, v.ptr, 1e-3)
    want = ref.forward_inference(1.0, 0.0, xv, None, sc.values, bi.values, m.values, v.values, 1e-3)
    assert_close(y.download(), want, dtype, "y (inference)",
                 scale=G._y_scale(xv, m.values, 1 / np.sqrt(v.values + 1e-3), sc.values, bi.values))
    assert launched[-1] == [("nc_apply", 1)]
    sm, si = DevTensor(pdims, pt), DevTensor(pdims, pt)
    y = G._t(dims, "nchw", dtype)
    pydnn.batch_normalization_forward_training(handle, SPATIAL, 1.0, 0.0, x.desc, x.ptr, y.desc, y.ptr, bd, sc.ptr,
                                               bi.ptr, 0.1, 0, 0, 1e-5, sm.ptr, si.ptr)
    assert [k for k, _ in launched[-1]] == ["nc_stats", "fwd_final", "nc_apply"] and launched[-1][0][1] == 1
    want_y, _, _, mean, invstd, _ = ref.forward_training(SPATIAL, 1.0, 0.0, xv, None, sc.values, bi.values, 0.1, None,
                                                         None, 1e-5)
    assert_close(y.download(), want_y, dtype, "y", scale=G._y_scale(xv, mean, invstd, sc.values, bi.values))
    assert_close(sm.download(), mean, G.PTOL[dtype], "saved mean", scale=G._stat_scale(SPATIAL, xv))
    assert_close(si.download(), invstd, G.PTOL[dtype], "saved inverse std")
    dy = _Shifted(dims, dtype, rng.uniform(-3, 3, dims).astype(np.float32))
    dx = G._t(dims, "nchw", dtype)
    ds, db = DevTensor(pdims, pt), DevTensor(pdims, pt)
    pydnn.batch_normalization_backward(handle, SPATIAL, 1.0, 0.0, 1.0, 0.0, x.desc, x.ptr, dy.desc, dy.ptr, dx.desc,
                                       dx.ptr, bd, sc.ptr, ds.ptr, db.ptr, 1e-5, 0, 0)
    assert [k for k, _ in launched[-1]] == ["nc_stats", "bwd_final", "nc_apply", "nc_head"]
    assert launched[-1][0][1] == 1
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
    # y off the vector too: the scratch (float constants and partials in y) would be off it as well: gen
    y2 = _Shifted(dims, dtype)
    pydnn.batch_normalization_forward_training(handle, SPATIAL, 1.0, 0.0, x.desc, x.ptr, y2.desc, y2.ptr, bd, sc.ptr,
                                               bi.ptr, 0.1, 0, 0, 1e-5, sm.ptr, si.ptr)
    assert launched[-1][0][0] == "fwd_fused_gen"
    assert_close(y2.download(), want_y, dtype, "y (gen)", scale=G._y_scale(xv, mean, invstd, sc.values, bi.values))


def test_nc_reproducible(handle, rng):
    dims = (6, 5, 67, 67)
    x = G._t(dims, "nchw", BF16)
    x.random(rng)
    dy = G._t(dims, "nchw", BF16)
    dy.random(rng)
    bd, pdims, pt = G._params(x, SPATIAL)
    sc, bi = G._ptensor(pdims, pt, rng), G._ptensor(pdims, pt, rng)
    out = []
    for _ in range(2):
        y, dx = G._t(dims, "nchw", BF16), G._t(dims, "nchw", BF16)
        sm, si, ds, db = (DevTensor(pdims, pt) for _ in range(4))
        pydnn.batch_normalization_forward_training(handle, SPATIAL, 1.0, 0.0, x.desc, x.ptr, y.desc, y.ptr, bd,
                                                   sc.ptr, bi.ptr, 0.1, 0, 0, 1e-5, sm.ptr, si.ptr)
        pydnn.batch_normalization_backward(handle, SPATIAL, 1.0, 0.0, 1.0, 0.0, x.desc, x.ptr, dy.desc, dy.ptr,
                                           dx.desc, dx.ptr, bd, sc.ptr, ds.ptr, db.ptr, 1e-5, 0, 0)
        out.append([t.buf.to_numpy() for t in (y, sm, si, dx, ds, db)])
    for a, b in zip(*out):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("dims,layout", [((7, 35, 5, 5), "nhwc"), ((18, 5, 9, 9), "nhwc"), ((2, 127, 11, 11), "nchw"),
                                         ((36, 33, 2, 2), "nhwc"), ((3, 50, 7, 7), "nhwc")])
@_dt(F32, BF16)
@pytest.mark.parametrize("wave,sms", [(False, None), (True, None), (True, 2)])
def test_gen_tiny(handle, dims, layout, dtype, wave, sms, rng, launched, monkeypatch, request):
    """GEN_TINY: tiny training / backward calls (Ex too) take the single gen launch; GEN_WAVE's blocks (on 2 SMs,
    the handle's count lowered: fewer threads than rows, up to kUnroll rows a thread in flight)."""
    monkeypatch.setattr(tuning.batchnorm, "GEN_TINY", 32768)
    monkeypatch.setattr(tuning.batchnorm, "GEN_WAVE", wave)
    if sms is not None:
        monkeypatch.setattr(handle, "sm_count", sms)
        G._forget_bn_plans(handle)
        request.addfinalizer(lambda: G._forget_bn_plans(handle))   # (no 2-SM plan left on the shared handle)
    t = G._train(handle, SPATIAL, dims, layout, dtype, rng)
    assert launched[-1] == [("fwd_fused_gen", None)]
    G._backward(handle, t, dtype, SPATIAL, rng, saved=True)
    assert launched[-1] == [("bwd_fused_gen", None)]
    t = G._train(handle, SPATIAL, dims, layout, dtype, rng, ex_ops=OPS_ACT)
    assert launched[-1] == [("fwd_fused_gen", None)]
    G._backward(handle, t, dtype, SPATIAL, rng, saved=False, ex_ops=OPS_ACT)
    assert launched[-1] == [("bwd_fused_gen", None)]
