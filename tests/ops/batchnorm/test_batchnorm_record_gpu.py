"""Batch norm's launch records on the GPU: forward training and backward (plain, Ex BN, Ex ReLU) called again
with the same descriptors go through the record (tuning.batchnorm.RECORDS) into fresh, poisoned outputs with
other buffers, and store what the first (full-path) call stored, bitwise, for the sweep's batch-norm
shapes (NHWC odd C, NCHW, tiny and large); the first call is checked against the float64 reference by
test_batchnorm_gpu's helpers."""
import numpy as np
import pytest

import pydnn
from pydnn._cuda import driver
from pydnn.ops import batchnorm as B
from devtensor import DevTensor
from test_batchnorm_gpu import BF16, F16, F32, OPS_ACT, OPS_BN, SPATIAL, _backward, _forget_bn_plans, _train

pytestmark = pytest.mark.gpu

CASES = [((162, 4, 9, 9), "nhwc", BF16), ((2, 477, 13, 13), "nhwc", F32), ((6, 14, 25, 25), "nhwc", F32),
         ((4, 664, 2, 2), "nchw", BF16), ((21, 413, 9, 9), "nchw", F16), ((9, 12, 60, 60), "nhwc", F16)]


def _same(a, b, what):
    assert np.array_equal(np.isnan(a), np.isnan(b)), what
    assert np.array_equal(a[~np.isnan(a)], b[~np.isnan(b)]), what


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("ex_ops", [None, OPS_BN, OPS_ACT], ids=["plain", "ex_bn", "ex_relu"])
def test_record_repeats_bitwise(handle, rng, case, ex_ops, monkeypatch):
    dims, layout, dtype = CASES[case]
    _forget_bn_plans(handle)
    took = []  # what each call's record path returned (True: launched through it)
    fast = B._fwd_fast, B._bwd_fast
    monkeypatch.setattr(B, "_fwd_fast", lambda *a: took.append(("fwd", fast[0](*a))) or took[-1][1])
    monkeypatch.setattr(B, "_bwd_fast", lambda *a: took.append(("bwd", fast[1](*a))) or took[-1][1])
    t = _train(handle, SPATIAL, dims, layout, dtype, rng, ex_ops=ex_ops)  # the full path, against the reference
    x, bd = t["x"], t["bd"]
    # the same descriptors again: the record; new y / saved statistics (poisoned), running stats reset
    y2, sm2, si2 = DevTensor(dims, dtype, x.strides), DevTensor(t["pdims"], t["pt"]), DevTensor(t["pdims"], t["pt"])
    for d in (y2, sm2, si2):
        d.poison()
    rm2, rv2 = DevTensor(t["pdims"], t["pt"]), DevTensor(t["pdims"], t["pt"])
    rm2.upload(t["rm"].values)
    rv2.upload(t["rv"].values)
    if ex_ops is None:
        pydnn.batch_normalization_forward_training(handle, SPATIAL, 1.0, 0.0, x.desc, x.ptr, t["y"].desc, y2.ptr, bd,
                                                   t["sc"].ptr, t["bi"].ptr, 0.1, rm2.ptr, rv2.ptr, 1e-5, sm2.ptr,
                                                   si2.ptr)
    else:
        act = t["act"]
        wn = pydnn.get_batch_normalization_forward_training_ex_workspace_size(handle, SPATIAL, ex_ops, x.desc, None,
                                                                              t["y"].desc, bd, act)
        ws = pydnn.DeviceArray((max(wn, 16),), np.uint8)
        ws.fill_bytes(0xFF)
        res2 = pydnn.DeviceArray((max(t["rn"], 16),), np.uint8)
        res2.fill_bytes(0x7F)
        pydnn.batch_normalization_forward_training_ex(
            handle, SPATIAL, ex_ops, 1.0, 0.0, x.desc, x.ptr, None, 0, t["y"].desc, y2.ptr, bd, t["sc"].ptr,
            t["bi"].ptr, 0.1, rm2.ptr, rv2.ptr, 1e-5, sm2.ptr, si2.ptr, act, ws.ptr, wn, res2.ptr, t["rn"])
    driver.synchronize()
    assert any(isinstance(k, tuple) and k and k[0] == "bn_fwd_rec" for k in handle.prepared)
    assert took[-1] == ("fwd", True), took
    _same(y2.download(), t["y"].download(), "y")
    _same(sm2.download(), t["sm"].download(), "saved mean")
    _same(si2.download(), t["si"].download(), "saved inverse std")
    _same(rm2.download(), t["rm"].download(), "running mean")
    _same(rv2.download(), t["rv"].download(), "running variance")
    if ex_ops == OPS_ACT:
        assert np.array_equal(res2.to_numpy()[:t["rn"]], t["res"].to_numpy()[:t["rn"]])
    # backward: once against the reference (test_batchnorm_gpu), then twice with the same descriptors into
    # poisoned outputs (the second through the record), bitwise equal, plain and blended
    _backward(handle, t, dtype, SPATIAL, rng, saved=True, ex_ops=ex_ops)
    dy = DevTensor(dims, dtype, x.strides)
    dy.random(rng)
    outs = []
    for blend in (0.0, 0.0, 0.5, 0.5):
        dx, ds, db = DevTensor(dims, dtype, x.strides), DevTensor(t["pdims"], t["pt"]), DevTensor(t["pdims"], t["pt"])
        if blend:
            for d, v in ((dx, 0.25), (ds, 0.5), (db, -0.5)):
                d.upload(np.full(d.dims, v))
        else:
            for d in (dx, ds, db):
                d.poison()
        if ex_ops is None:
            pydnn.batch_normalization_backward(handle, SPATIAL, 1.0, blend, 1.0, blend, x.desc, x.ptr, x.desc, dy.ptr,
                                               x.desc, dx.ptr, bd, t["sc"].ptr, ds.ptr, db.ptr, 1e-5, t["sm"].ptr,
                                               t["si"].ptr)
        else:
            act = t["act"]
            wn = pydnn.get_batch_normalization_backward_ex_workspace_size(handle, SPATIAL, ex_ops, x.desc, x.desc,
                                                                          x.desc, None, x.desc, bd, act)
            ws = pydnn.DeviceArray((max(wn, 16),), np.uint8)
            ws.fill_bytes(0xFF)
            pydnn.batch_normalization_backward_ex(
                handle, SPATIAL, ex_ops, 1.0, blend, 1.0, blend, x.desc, x.ptr, x.desc, t["y"].ptr, x.desc, dy.ptr,
                None, 0, x.desc, dx.ptr, bd, t["sc"].ptr, t["bi"].ptr, ds.ptr, db.ptr, 1e-5, t["sm"].ptr,
                t["si"].ptr, act, ws.ptr, wn, t["res"].ptr, t["rn"])
        driver.synchronize()
        outs.append((dx.download(), ds.download(), db.download()))
    assert any(isinstance(k, tuple) and k and k[0] == "bn_bwd_rec" for k in handle.prepared)
    # the 2nd, 3rd and 4th of these calls through the record (the 1st, and _backward's, each a new key)
    assert [v for d, v in took if d == "bwd"] == [True, True, True], took
    for i in (0, 2):
        for a, b, what in zip(outs[i], outs[i + 1], ("dx", "dscale", "dbias")):
            _same(b, a, f"{what} blend={i == 2}")
    _forget_bn_plans(handle)
