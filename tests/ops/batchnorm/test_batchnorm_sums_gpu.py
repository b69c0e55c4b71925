"""Batch norm's backward with the saved mean on bwd_sums / nc_stats<.., true, true> and bwd_sums_final
(tuning.batchnorm.BWD_SUMS) on the GPU against the float64 reference, outputs poisoned (dx, dscale, dbias, dz):
NHWC rows at the full vector width and at 1 element, super-rows with one and several position tiles (tails past
the super-rows), NCHW (nc); plain (scratch in dx, its head) and Ex (workspace; ReLU mask, residual add with dz);
dscale / dbias blending; that the calls launched the sums kernels (and without saved statistics the four-moment
ones); repeats bitwise equal."""
import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops import batchnorm as B
from devtensor import DevTensor
from test_batchnorm_gpu import BF16, F16, F32, F64, OPS_ACT, OPS_ADD, OPS_BN, SPATIAL, _backward, _forget_bn_plans, _train

pytestmark = pytest.mark.gpu

CASES = [  # dims, layout, dtype
    ((4, 16, 5, 7), "nhwc", F32), ((64, 32, 14, 14), "nhwc", BF16), ((3, 37, 5, 7), "nhwc", F64),
    ((2, 1305, 9, 9), "nhwc", BF16), ((3, 93, 7, 9), "nhwc", BF16), ((40, 50, 9, 9), "nhwc", F32),
    ((4, 1315, 3, 3), "nhwc", F32), ((5, 405, 4, 7), "nhwc", BF16), ((9, 5, 11, 13), "nhwc", F16),
    ((5, 148, 23, 23), "nchw", F32), ((2, 30, 77, 77), "nchw", BF16), ((3, 5, 7, 9), "nchw", F64),
]
NAMES = {F32: "f32", F16: "f16", BF16: "bf16", F64: "f64"}


@pytest.fixture(autouse=True)
def _setup(monkeypatch, handle):
    monkeypatch.setattr(tuning.batchnorm, "GEN_TINY", 0)  # (small shapes: the rows / nc paths, not gen)
    monkeypatch.setattr(tuning.batchnorm, "SR_TILED_BYTES", 0)  # (position tiles on small shapes too)
    monkeypatch.setattr(tuning.batchnorm, "BWD_SUMS", True)
    monkeypatch.setattr(tuning.batchnorm, "NC_RES", False)  # (packed NCHW up to NC_RES_MAX: nc_res, its own tests)
    _forget_bn_plans(handle)
    yield
    _forget_bn_plans(handle)


@pytest.fixture
def launched(monkeypatch):
    seqs = []
    run = B._run

    def rec(handle, pl, seq):
        seqs.append([(lc.kernel, lc.u) for lc in seq])
        return run(handle, pl, seq)

    monkeypatch.setattr(B, "_run", rec)
    return seqs


def _sums(seq):
    return seq[1][0] == "bwd_sums_final" and (seq[0][0] == "bwd_sums" or seq[0] == ("nc_stats", "true, true"))


@pytest.mark.parametrize("dims,layout,dtype", CASES,
                         ids=[f"{'x'.join(map(str, d))}-{lay}-{NAMES[t]}" for d, lay, t in CASES])
def test_sums_backward(handle, rng, dims, layout, dtype, launched):
    t = _train(handle, SPATIAL, dims, layout, dtype, rng)
    del launched[:]
    _backward(handle, t, dtype, SPATIAL, rng, saved=True)
    _backward(handle, t, dtype, SPATIAL, rng, saved=True, ap=0.5, bp=0.5)
    _backward(handle, t, dtype, SPATIAL, rng, saved=False)
    assert len(launched) == 3 and _sums(launched[0]) and _sums(launched[1]) and not _sums(launched[2]), launched
    if launched[0][0][0] == "bwd_sums":  # (rows / super-rows, non-Ex: betaParamDiff 0 -> the SC apply, no head)
        assert len(launched[0]) == 3 and launched[0][2][1].endswith(B.SC_SUFFIX), launched[0]
        assert launched[1][-1][0] == "bwd_head_batched", launched[1]
    for ops in (OPS_BN, OPS_ACT, OPS_ADD):
        t = _train(handle, SPATIAL, dims, layout, dtype, rng, ex_ops=ops)
        del launched[:]
        _backward(handle, t, dtype, SPATIAL, rng, saved=True, ex_ops=ops)
        _backward(handle, t, dtype, SPATIAL, rng, saved=True, ad=0.5, bd_=0.5, ap=2.0, bp=-1.0, ex_ops=ops)
        assert len(launched) == 2 and all(_sums(s) for s in launched), (ops, launched)


@pytest.mark.parametrize("dims,layout,dtype", [((33, 93, 19, 17), "nhwc", BF16), ((21, 99, 13, 11), "nhwc", F32),
                                               ((16, 64, 28, 28), "nhwc", F16), ((9, 70, 21, 21), "nchw", F32)],
                         ids=["sr-bf16", "sr-f32", "rows-f16", "nc-f32"])
def test_sums_repeat_bitwise(handle, rng, dims, layout, dtype, launched):
    """Two calls on the same data (many chunks): the same bits in dx, dscale and dbias."""
    t = _train(handle, SPATIAL, dims, layout, dtype, rng)
    x = t["x"]
    dy = DevTensor(dims, dtype, x.strides)
    dy.random(rng)
    out = []
    del launched[:]
    for _ in range(2):
        dx = DevTensor(dims, dtype, x.strides)
        ds, db = DevTensor(t["pdims"], t["pt"]), DevTensor(t["pdims"], t["pt"])
        pydnn.batch_normalization_backward(handle, SPATIAL, 1.0, 0.0, 1.0, 0.0, x.desc, x.ptr, dy.desc, dy.ptr,
                                           dx.desc, dx.ptr, t["bd"], t["sc"].ptr, ds.ptr, db.ptr, 1e-5, t["sm"].ptr,
                                           t["si"].ptr)
        out.append((dx.buf.to_numpy(), ds.buf.to_numpy(), db.buf.to_numpy()))
    assert len(launched) == 2 and all(_sums(s) for s in launched), launched
    for a, b in zip(*out):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


@pytest.mark.parametrize("dims,dtype", [((2, 1305, 9, 9), BF16), ((3, 1315, 5, 5), F32), ((2, 1029, 7, 7), F16)],
                         ids=["bf16", "f32", "f16"])
def test_srh_forward_backward(handle, rng, dims, dtype, launched, monkeypatch):
    """srh (SR_HYBRID, position tiles under SR_TILED_BYTES): the training forward (non-Ex, Ex with the ReLU mask)
    and the backward (saved statistics on the sums, recomputed on bwd_stats; Ex with dz) on rows1's statistics
    and the super-rows' apply."""
    monkeypatch.setattr(tuning.batchnorm, "SR_TILED_BYTES", 64 << 20)
    _forget_bn_plans(handle)

    def srh(s):
        return s[0][0] in ("fwd_stats", "bwd_stats", "bwd_sums") and s[2][1].startswith(B.SR_U) and s[0][1] != B.SR_U

    t = _train(handle, SPATIAL, dims, "nhwc", dtype, rng)
    _backward(handle, t, dtype, SPATIAL, rng, saved=True)
    _backward(handle, t, dtype, SPATIAL, rng, saved=False, ap=0.5, bp=0.5)
    for ops in (OPS_ACT, OPS_ADD):
        t = _train(handle, SPATIAL, dims, "nhwc", dtype, rng, alpha=0.5, ex_ops=ops)
        _backward(handle, t, dtype, SPATIAL, rng, saved=True, ad=0.5, bd_=0.5, ap=2.0, bp=-1.0, ex_ops=ops)
    assert len(launched) == 7 and all(srh(s) for s in launched), launched
    assert [_sums(s) for s in launched] == [False, True, False, False, True, False, True], launched
