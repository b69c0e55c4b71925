"""Batch normalization's row kernels at a narrower vector (tuning.batchnorm.ROWS_MID) on the GPU against the
float64 reference: NHWC SPATIAL whose channel count is not a multiple of the 16-byte vector but of an 8- or
4-byte one (fp32 C = 50, 10: 2-element vectors; fp16 C = 12, bf16 C = 4: 4-element; bf16 C = 6: 2-element),
training forward (non-Ex: scratch in y and its head; Ex with the ReLU mask), inference, backward with saved
and recomputed statistics, blended dscale / dbias, many chunks; and the switch off (the scalar row kernels)
giving the same results (ROWS_FLAT off there, so the rows<w> apply runs); and ROWS_FLAT: the statistics on the
row kernels, the apply on nc_apply over the flat elements, for C not a multiple of the 16-byte vector. Each
case's plan is checked to hold the sequence. Outputs are poisoned first (DevTensor)."""
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops import batchnorm as B
from test_batchnorm_gpu import BF16, F16, F32, OPS_ACT, SPATIAL, _backward, _forget_bn_plans, _train
from test_batchnorm_gpu import test_inference as _inference

pytestmark = pytest.mark.gpu

MID_CASES = [  # dims (NHWC), dtype, the narrower width
    ((4, 50, 5, 7), F32, 2),
    ((2, 10, 6, 6), F32, 2),
    ((3, 12, 9, 11), F16, 4),
    ((5, 4, 6, 7), BF16, 4),
    ((3, 6, 5, 7), BF16, 2),
    ((64, 50, 14, 14), F32, 2),   # many chunks (and the head of the non-Ex scratch)
]


@pytest.fixture(autouse=True)
def _rows_paths(monkeypatch, handle):
    monkeypatch.setattr(tuning.batchnorm, "GEN_TINY", 0)  # (small shapes: the rows path, not gen)
    _forget_bn_plans(handle)
    yield
    _forget_bn_plans(handle)


def _plan_has(handle, dims, dtype, w, direction):
    from pydnn.tensor import packed_strides
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(d, dtype, 4, dims, packed_strides(dims, pydnn.PYDNN_TENSOR_NHWC))
    others = (d, d) if direction == "bwd" else (d,)
    layout, seqs, _ = B.plan_summary(handle, direction, SPATIAL, d, *others)
    return layout == "rows" and f"rows{w}" in seqs


@pytest.mark.parametrize("case", range(len(MID_CASES)))
def test_rows_mid(handle, rng, monkeypatch, case):
    monkeypatch.setattr(tuning.batchnorm, "ROWS_FLAT", False)  # (the rows<w> apply too; flat: below)
    monkeypatch.setattr(tuning.batchnorm, "ROWS_MID", True)
    dims, dtype, w = MID_CASES[case]
    for direction in ("fwd", "bwd", "infer"):
        assert _plan_has(handle, dims, dtype, w, direction), (dims, dtype, direction)
    t = _train(handle, SPATIAL, dims, "nhwc", dtype, rng)
    _backward(handle, t, dtype, SPATIAL, rng, saved=True)
    _backward(handle, t, dtype, SPATIAL, rng, saved=False, ap=0.5, bp=0.5)
    t = _train(handle, SPATIAL, dims, "nhwc", dtype, rng, alpha=0.5, beta=0.25, ex_ops=OPS_ACT)
    _backward(handle, t, dtype, SPATIAL, rng, saved=True, ex_ops=OPS_ACT)
    _inference(handle, dims, "nhwc", SPATIAL, dtype, rng)


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_rows_mid_off(handle, rng, monkeypatch, dtype):
    dims = (4, 50, 5, 7) if dtype == F32 else (5, 4, 6, 7)
    monkeypatch.setattr(tuning.batchnorm, "ROWS_MID", False)
    assert not _plan_has(handle, dims, dtype, 2 if dtype == F32 else 4, "bwd")
    t = _train(handle, SPATIAL, dims, "nhwc", dtype, rng)
    _backward(handle, t, dtype, SPATIAL, rng, saved=True)
    _inference(handle, dims, "nhwc", SPATIAL, dtype, rng)


FLAT_CASES = [((2, 477, 13, 13), F32), ((5, 93, 8, 8), BF16), ((4, 75, 9, 9), F16), ((3, 50, 7, 9), F32),
              ((9, 405, 6, 6), BF16)]


def _picks_flat(handle, dims, dtype, direction):
    from pydnn.tensor import packed_strides
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(d, dtype, 4, dims, packed_strides(dims, pydnn.PYDNN_TENSOR_NHWC))
    others = (d, d) if direction == "bwd" else (d,)
    return any(k.startswith("flat") for k in B.plan_summary(handle, direction, SPATIAL, d, *others)[1])


@pytest.mark.parametrize("case", range(len(FLAT_CASES)))
def test_rows_flat_apply(handle, rng, monkeypatch, case):
    """ROWS_FLAT: NHWC with C not a multiple of the 16-byte vector (odd C, and C = 50 with its 2-element
    statistics): the row kernels' statistics, nc_apply with nc_hw 1 over the flat elements, nc_head over the
    constants' bytes (non-Ex); training (blended too), Ex with the ReLU mask, backward with saved and
    recomputed statistics, blended dx / dscale / dbias."""
    monkeypatch.setattr(tuning.batchnorm, "ROWS_FLAT", True)
    monkeypatch.setattr(tuning.batchnorm, "ROWS_MID", True)
    dims, dtype = FLAT_CASES[case]
    for direction in ("fwd", "bwd"):
        assert _picks_flat(handle, dims, dtype, direction), (dims, dtype, direction)
    t = _train(handle, SPATIAL, dims, "nhwc", dtype, rng)
    _backward(handle, t, dtype, SPATIAL, rng, saved=True)
    _backward(handle, t, dtype, SPATIAL, rng, saved=False, ad=0.5, bd_=0.25, ap=2.0, bp=-1.0)
    t = _train(handle, SPATIAL, dims, "nhwc", dtype, rng, alpha=0.5, beta=0.25)
    t = _train(handle, SPATIAL, dims, "nhwc", dtype, rng, ex_ops=OPS_ACT)
    _backward(handle, t, dtype, SPATIAL, rng, saved=True, ex_ops=OPS_ACT)


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_rows_flat_off(handle, rng, monkeypatch, dtype):
    monkeypatch.setattr(tuning.batchnorm, "ROWS_FLAT", False)
    dims = (2, 477, 13, 13) if dtype == F32 else (5, 93, 8, 8)
    assert not _picks_flat(handle, dims, dtype, "bwd")
    t = _train(handle, SPATIAL, dims, "nhwc", dtype, rng)
    _backward(handle, t, dtype, SPATIAL, rng, saved=True)
