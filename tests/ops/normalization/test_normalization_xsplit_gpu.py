"""The split layer / RMS backward in the rowx frame (tuning.norm.XSPLIT: bwd_xsplit_dx, a block per row reading x
and dy twice; bwd_xsplit_params, dscale / dbias per alignment class and row chunk; finish_rowx) on the GPU against
the float64 reference, outputs poisoned (dx, dscale, dbias; the workspace filled with NaN bytes): rows of any
length that the one-pass kernels serve with a cluster per row or not at all, at least as many as the SMs (odd
lengths: every row offset from a 16-byte boundary; padded rows with strides off the vector, whose padding must
stay poisoned; rows beyond 64K elements); XSPLIT_ANY's shorter rows; blending of dx and of dscale / dbias, no
bias; the switch off keeps the previous kernels."""
import numpy as np
import pytest

import pydnn
from devtensor import DevTensor, assert_close
from pydnn import tuning
from pydnn.ops import normalization as N
from pydnn.reference import normalization as ref
from test_normalization_gpu import _backward_check, _nd, _param_tensors, _tensor

pytestmark = pytest.mark.gpu

F32, F16, BF16 = pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_BFLOAT16
LAYER, RMS = pydnn.PYDNN_NORM_KIND_LAYER, pydnn.PYDNN_NORM_KIND_RMS
DTYPES = [F32, F16, BF16]


def _cases(sm):
    return [  # kind, dims, layout
        (LAYER, (sm + 5, 34823), "nchw"),        # the sweep's shape class (a cluster per row before)
        (RMS, (sm + 1, 20001), "nchw"),
        (LAYER, (sm + 2, 17001), (17003, 1)),    # padded rows, stride 3 mod 4 / 8: every class
        (RMS, (sm + 3, 70001), "nchw"),          # beyond 64K elements: gen before
    ]


@pytest.fixture(autouse=True)
def _on(monkeypatch):
    monkeypatch.setattr(tuning.norm, "XSPLIT", True)
    monkeypatch.setattr(tuning.norm, "XSPLIT_ANY", False)
    monkeypatch.setattr(tuning.norm, "XSPLIT_SLOTS", False)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(4))
def test_xsplit_backward(handle, rng, case, dtype):
    kind, dims, layout = _cases(handle.sm_count)[case]
    x = _tensor(dims, layout, dtype)
    alts, _ = N.plan_summary(handle, _nd(kind, 0, 1), x.desc, backward=True)
    assert [a.split()[0] for a in alts[0]] == ["bwd_xsplit_params", "bwd_xsplit_dx", "finish"], alts
    _backward_check(handle, rng, kind, 0, 1, dims, layout, dtype)
    _backward_check(handle, rng, kind, 0, 1, dims, layout, dtype, alphas=(0.5, -1.5, 2.0, 0.25), bias=False,
                    dbias=False)


@pytest.mark.parametrize("dtype", DTYPES)
def test_xsplit_any(handle, rng, monkeypatch, dtype):
    """XSPLIT_ANY: the rows bwd_rowx holds in one block (LN bf16 417 x 2770, the sweep's point), short and
    padded rows, a 1-SM plan (many rows per chunk and class)."""
    monkeypatch.setattr(tuning.norm, "XSPLIT_ANY", True)
    for kind, dims, layout in ((LAYER, (max(417, handle.sm_count), 2770), "nchw"),
                               (RMS, (max(300, handle.sm_count), 37), "nchw"),
                               (LAYER, (handle.sm_count + 7, 1001), (1003, 1))):
        x = _tensor(dims, layout, dtype)
        alts, _ = N.plan_summary(handle, _nd(kind, 0, 1), x.desc, backward=True)
        assert alts[0][0].startswith("bwd_xsplit_params"), alts
        _backward_check(handle, rng, kind, 0, 1, dims, layout, dtype)
        _backward_check(handle, rng, kind, 0, 1, dims, layout, dtype, alphas=(1.0, 0.5, 1.0, -1.0))
    monkeypatch.setattr(handle, "sm_count", 1)
    for kind, dims in ((LAYER, (300, 37)), (RMS, (70, 1001))):
        x = _tensor(dims, "nchw", dtype)
        alts, _ = N.plan_summary(handle, _nd(kind, 0, 1), x.desc, backward=True)
        assert alts[0][0].startswith("bwd_xsplit_params"), alts
        _backward_check(handle, rng, kind, 0, 1, dims, "nchw", dtype, alphas=(0.5, -1.5, 2.0, 0.25))


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_xsplit_dx_block(handle, rng, monkeypatch, dtype):
    """XSPLIT_DX_BLOCK 1024 / 128: bwd_xsplit_dx's blocks of 1024 threads (a row's vectors fewer than 2 a thread)
    and of 128 (many a thread: the U-vector loop's tail)."""
    for blk in (1024, 128):
        monkeypatch.setattr(tuning.norm, "XSPLIT_DX_BLOCK", blk)
        kind, dims, layout = _cases(handle.sm_count)[0]
        x = _tensor(dims, layout, dtype)
        alts, _ = N.plan_summary(handle, _nd(kind, 0, 1), x.desc, backward=True)
        assert alts[0][1].startswith("bwd_xsplit_dx") and f"block={blk} " in alts[0][1], alts
        _backward_check(handle, rng, kind, 0, 1, dims, layout, dtype, alphas=(1.0, 0.5, 1.0, -1.0))


@pytest.mark.parametrize("dtype", DTYPES)
def test_xsplit_fill(handle, rng, monkeypatch, dtype):
    """XSPLIT_FILL: rows bwd_rowx's groups would fill under 60% (4231: 529 8-element vectors in 256 x 4, 1058 4-element
    ones in 512 x 4), here without the size floor (XSPLIT_FILL_BYTES 0) so that the shape stays small."""
    monkeypatch.setattr(tuning.norm, "XSPLIT_FILL_BYTES", 0)
    for kind, dims in ((RMS, (handle.sm_count + 3, 4231)), (LAYER, (handle.sm_count + 9, 4231))):
        x = _tensor(dims, "nchw", dtype)
        alts, _ = N.plan_summary(handle, _nd(kind, 0, 1), x.desc, backward=True)
        assert alts[0][0].startswith("bwd_xsplit_params"), alts
        _backward_check(handle, rng, kind, 0, 1, dims, "nchw", dtype)
        _backward_check(handle, rng, kind, 0, 1, dims, "nchw", dtype, alphas=(0.5, -1.5, 2.0, 0.25), bias=False,
                        dbias=False)
    monkeypatch.setattr(tuning.norm, "XSPLIT_FILL", 0)
    alts, _ = N.plan_summary(handle, _nd(RMS, 0, 1), _tensor((handle.sm_count + 3, 4231), "nchw", dtype).desc,
                             backward=True)
    assert alts[0][0].startswith("bwd_rowx "), alts


def test_xsplit_off(handle, rng, monkeypatch):
    monkeypatch.setattr(tuning.norm, "XSPLIT", False)
    kind, dims, layout = _cases(handle.sm_count)[0]
    x = _tensor(dims, layout, F16)
    alts, _ = N.plan_summary(handle, _nd(kind, 0, 1), x.desc, backward=True)
    assert not alts[0][0].startswith("bwd_xsplit"), alts


def _inplace_check(handle, rng, kind, dims, dtype):
    """dx written over dy (the same buffer, which the API allows): every kernel that reads dy must run before the
    one that overwrites it (bwd_*split_params before bwd_*split_dx)."""
    nd = _nd(kind, 0, 1)
    x, dy = _tensor(dims, "nchw", dtype), _tensor(dims, "nchw", dtype)
    xv = x.random(rng, -3, 3)
    dyv = dy.random(rng, -1, 1)
    sbd, std, scale, b, sv, bv, mean, inv = _param_tensors(x, nd, rng, True)
    mv, iv = ref.statistics(kind, 0, 1, 1e-5, xv)
    mean.upload(mv.reshape(mean.dims))
    inv.upload(iv.reshape(inv.dims))
    mv, iv = mean.values.ravel(), inv.values.ravel()
    ds, db = DevTensor(sbd.dims, F32), DevTensor(sbd.dims, F32)
    wsize = pydnn.get_norm_backward_workspace_size(handle, nd, x.desc, dy.desc, dy.desc, sbd, std)
    ws = pydnn.DeviceArray((max(1, wsize // 4),), np.float32)
    ws.fill_bytes(0xFF)
    pydnn.norm_backward(handle, nd, 1.0, 0.0, 1.0, 0.0, x.desc, x.ptr, dy.desc, dy.ptr, dy.desc, dy.ptr, sbd,
                        scale.ptr, b.ptr, ds.ptr, db.ptr, std, mean.ptr if kind != RMS else 0, inv.ptr,
                        ws.ptr if wsize else 0, wsize)
    wdx, wds, wdb = ref.backward(kind, 0, 1, 1e-5, None, xv, dyv, sv, bv, mv, iv)
    tdx, tds, tdb = ref.backward_terms(kind, 0, 1, 1e-5, None, xv, dyv, sv, bv, mv, iv)
    what = f"in place {kind} {dims} {dtype}"
    assert_close(dy.download(), wdx, dtype, "dx " + what, scale=tdx)
    assert_close(ds.download(), wds, F32, "dscale " + what, scale=tds)
    assert_close(db.download(), wdb, F32, "dbias " + what, scale=tdb)


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_split_in_place(handle, rng, monkeypatch, dtype):
    """dx over dy for the split kernels, whole-vector (BWD_SPLIT) and rowx-frame (XSPLIT) rows."""
    monkeypatch.setattr(tuning.norm, "BWD_SPLIT", True)
    monkeypatch.setattr(tuning.norm, "BWD_SPLIT_16", True)
    for kind, dims, first in ((LAYER, (handle.sm_count + 7, 8552), "bwd_split_params"),
                              (RMS, (handle.sm_count + 1, 20001), "bwd_xsplit_params")):
        x = _tensor(dims, "nchw", dtype)
        alts, _ = N.plan_summary(handle, _nd(kind, 0, 1), x.desc, backward=True)
        assert alts[0][0].startswith(first), alts
        _inplace_check(handle, rng, kind, dims, dtype)
