"""Batch norm's super-row training forward and backward (tuning.batchnorm.SUPER_ROWS: {fwd,bwd}_stats / _final /
_apply<T, VEC, 4, true> over super-rows of lcm(C, VEC) elements) on the GPU against the float64 reference, outputs
poisoned (y, saved / running statistics, dx, dscale, dbias, dz, the forward's ReLU mask):
packed NHWC with C off the 16-byte vector (odd C, C = 2 mod 4 in fp32, C = 4 mod 8 in 16-bit), tails of 0 ..
k - 1 rows past the super-rows, one and several position tiles; plain forward (scratch in y, its head) and
backward (scratch in dx) with saved and recomputed statistics and dscale / dbias blending; Ex BN / ReLU mask /
residual add (z, dz) with alpha and dx / dz blending; that the calls launched the sr sequences; repeats bitwise
equal."""
import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops import batchnorm as B
from devtensor import DevTensor
from test_batchnorm_gpu import BF16, F16, F32, OPS_ACT, OPS_ADD, OPS_BN, SPATIAL, _backward, _forget_bn_plans, _train

pytestmark = pytest.mark.gpu

CASES = [((3, 93, 7, 9), BF16), ((2, 477, 5, 6), F32), ((9, 5, 11, 13), F16), ((40, 50, 9, 9), F32),
         ((5, 405, 4, 7), BF16), ((7, 3, 13, 11), BF16), ((4, 1315, 3, 3), F32), ((6, 12, 25, 25), F16),
         ((2, 17, 9, 5), F32), ((13, 35, 6, 7), F16), ((162, 4, 9, 9), BF16)]  # (the last: SR_ROUNDS_WAVE's 7 chunks)


@pytest.fixture(autouse=True)
def _sr(monkeypatch, handle):
    monkeypatch.setattr(tuning.batchnorm, "GEN_TINY", 0)  # (small shapes: the rows path, not gen)
    monkeypatch.setattr(tuning.batchnorm, "SUPER_ROWS", True)
    monkeypatch.setattr(tuning.batchnorm, "SR_TILED_BYTES", 0)  # (position tiles on small shapes too)
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


def _sr_seq(d, dims, dtype):
    """The sr sequence's (kernel, u): final<A, false, 2> where one tile holds a super-row (L / VEC <= 256)."""
    v = B.vec_width(B.TAG[dtype], B.TAG[dtype])
    c = dims[1]
    one = c // np.gcd(c, v) <= B.THREADS
    return [(f"{d}_stats", B.SR_U), (f"{d}_final", B.SR_FINAL1 if one else B.SR_FINAL), (f"{d}_apply", B.SR_U)]


NAMES = {F32: "f32", F16: "f16", BF16: "bf16"}


@pytest.mark.parametrize("dims,dtype", CASES, ids=[f"{'x'.join(map(str, d))}-{NAMES[t]}" for d, t in CASES])
def test_sr_backward(handle, rng, dims, dtype, launched):
    SR, SRF = _sr_seq("bwd", dims, dtype), _sr_seq("fwd", dims, dtype)
    t = _train(handle, SPATIAL, dims, "nhwc", dtype, rng)
    # (the plain forward keeping its saved statistics: the SC apply over every row, no head; FWD_APPLY_SAVED)
    assert launched == [SRF[:2] + [("fwd_apply", B.SR_U + B.SC_SUFFIX)]], launched
    del launched[:]
    _backward(handle, t, dtype, SPATIAL, rng, saved=True)
    _backward(handle, t, dtype, SPATIAL, rng, saved=False, ap=0.5, bp=0.5)
    # (saved statistics: the sums kernels, and with betaParamDiff 0 the SC apply over every row, no head:
    # tuning.batchnorm.BWD_SUMS / BWD_APPLY_SAVED)
    SUMS = [("bwd_sums", B.SR_U), ("bwd_sums_final", None), SR[2]]
    SUMS0 = SUMS[:2] + [("bwd_apply", B.SR_U + B.SC_SUFFIX)]
    assert launched == [SUMS0, SR + [("bwd_head_batched", B.HEAD_U)]], launched
    for ops in (OPS_BN, OPS_ACT, OPS_ADD):
        del launched[:]
        t = _train(handle, SPATIAL, dims, "nhwc", dtype, rng, alpha=0.5, ex_ops=ops)
        assert launched == [SRF], (ops, launched)
        del launched[:]
        _backward(handle, t, dtype, SPATIAL, rng, saved=True, ex_ops=ops)
        _backward(handle, t, dtype, SPATIAL, rng, saved=False, ad=0.5, bd_=0.5, ap=2.0, bp=-1.0, ex_ops=ops)
        assert launched == [SUMS, SR], (ops, launched)


@pytest.mark.parametrize("dims,dtype", [((33, 93, 19, 17), BF16), ((21, 99, 13, 11), F32)], ids=["bf16", "f32"])
def test_sr_repeat_bitwise(handle, rng, dims, dtype, launched):
    """Two calls on the same data (many chunks, a tail): the same bits in dx, dscale and dbias."""
    t = _train(handle, SPATIAL, dims, "nhwc", dtype, rng)
    x = t["x"]
    dy = DevTensor(dims, dtype, x.strides)
    dy.random(rng)
    out = []
    for _ in range(2):
        dx = DevTensor(dims, dtype, x.strides)
        ds, db = DevTensor(t["pdims"], t["pt"]), DevTensor(t["pdims"], t["pt"])
        pydnn.batch_normalization_backward(handle, SPATIAL, 1.0, 0.0, 1.0, 0.0, x.desc, x.ptr, dy.desc, dy.ptr,
                                           dx.desc, dx.ptr, t["bd"], t["sc"].ptr, ds.ptr, db.ptr, 1e-5, 0, 0)
        out.append((dx.buf.to_numpy(), ds.buf.to_numpy(), db.buf.to_numpy()))
    assert launched[-1] == _sr_seq("bwd", dims, dtype) + [("bwd_head_batched", B.HEAD_U)]
    for a, b in zip(*out):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
