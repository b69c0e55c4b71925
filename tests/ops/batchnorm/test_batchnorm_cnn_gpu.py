"""Batch norm's planes kernels (fwd_planes / bwd_planes: NCHW SPATIAL with H * W a multiple of the 16-byte
vector, as in examples/train_cnn.py) on the GPU against the float64 reference, with poisoned outputs: training
forward (plain, blended, running statistics), the Ex forms (ReLU mask, residual add, dz) and backward with saved
and recomputed statistics, every dtype, packed and gapped NCHW, partial thread batches and several batches per
thread, the demo's shapes; that the planner took planes; and the same calls with PLANES off (the scalar gen
kernels) agree with the reference too."""
import numpy as np
import pytest

from pydnn import tuning
from pydnn.ops import batchnorm as B
from test_batchnorm_gpu import (BF16, F16, F32, F64, OPS_ACT, OPS_ADD, OPS_BN, SPATIAL, _backward, _train)

pytestmark = pytest.mark.gpu

DTYPES = [F32, F16, BF16, F64]


@pytest.fixture(autouse=True)
def _planes_not_nc(monkeypatch):
    """Packed NCHW takes the nc kernels by default (test_batchnorm_nc_gpu.py): these tests are the planes'."""
    monkeypatch.setattr(tuning.batchnorm, "NCHW_SPLIT", False)
    monkeypatch.setattr(tuning.batchnorm, "GEN_TINY", 0)


def _gapped(dims):
    """NCHW with rows padded by 8 elements, planes by 16, samples by 32 (every stride a multiple of 8)."""
    st, inner = [1], 1
    for k, gap in zip(range(len(dims) - 1, 0, -1), (8, 16, 32)):
        inner = inner * dims[k] + gap
        st.append(inner)
    return tuple(st[::-1])


CASES = [  # dims, layout
    ((4, 16, 8, 8), "nchw"),
    ((5, 3, 6, 8), "nchw"),        # 30 vectors of 8: a partial warp, one batch
    ((64, 4, 16, 16), "nchw"),     # 16384 elements per channel: several kUnroll batches per thread
    ((2, 6, 4, 16), None),         # gapped NCHW
    ((3, 5, 1, 24), "nchw"),       # H = 1
]


def _layout(dims, layout):
    return layout if layout is not None else _gapped(dims)


def _planes_taken(handle, t, direction):
    x = t["x"]
    others = (t["y"].desc,) if direction == "fwd" else (x.desc, x.desc)
    seqs = B.plan_summary(handle, direction, SPATIAL, x.desc, *others)[1]
    return "planes" in seqs


@pytest.mark.parametrize("planes", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dims,layout", CASES)
def test_planes_training_and_backward(handle, dims, layout, dtype, planes, rng, monkeypatch):
    monkeypatch.setattr(tuning.batchnorm, "PLANES", planes)
    handle.prepared.clear()
    lay = _layout(dims, layout)
    t = _train(handle, SPATIAL, dims, lay, dtype, rng)
    assert _planes_taken(handle, t, "fwd") == planes and _planes_taken(handle, t, "bwd") == planes
    _backward(handle, t, dtype, SPATIAL, rng, saved=True)
    _backward(handle, t, dtype, SPATIAL, rng, saved=False)
    _backward(handle, t, dtype, SPATIAL, rng, ad=0.5, bd_=0.25, ap=2.0, bp=-1.0)
    _train(handle, SPATIAL, dims, lay, dtype, rng, alpha=0.5, beta=-0.75)
    _train(handle, SPATIAL, dims, lay, dtype, rng, running=False)


@pytest.mark.parametrize("ops", [OPS_BN, OPS_ACT, OPS_ADD])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dims,layout", CASES[:2] + CASES[3:4])
def test_planes_ex(handle, dims, layout, dtype, ops, rng):
    handle.prepared.clear()
    lay = _layout(dims, layout)
    t = _train(handle, SPATIAL, dims, lay, dtype, rng, ex_ops=ops)
    assert _planes_taken(handle, t, "fwd")
    _backward(handle, t, dtype, SPATIAL, rng, saved=True, ex_ops=ops)
    _backward(handle, t, dtype, SPATIAL, rng, saved=False, ad=0.5, bd_=0.5, ex_ops=ops)


@pytest.mark.parametrize("dims", [(256, 64, 32, 32), (256, 128, 16, 16)])
def test_planes_demo_shapes(handle, dims, rng):
    """examples/train_cnn.py's two batch norms (bf16 NCHW, BN + ReLU through the Ex form) and backward."""
    handle.prepared.clear()
    t = _train(handle, SPATIAL, dims, "nchw", BF16, rng, ex_ops=OPS_ACT)
    assert _planes_taken(handle, t, "fwd") and _planes_taken(handle, t, "bwd")
    _backward(handle, t, BF16, SPATIAL, rng, saved=True, ex_ops=OPS_ACT)


def test_planes_reproducible(handle, rng):
    """Two identical calls store the same bits (fixed reduction order)."""
    handle.prepared.clear()
    outs = []
    for _ in range(2):
        r = np.random.default_rng(7)
        t = _train(handle, SPATIAL, (16, 8, 16, 16), "nchw", BF16, r)
        outs.append((t["y"].buf.to_numpy().copy(), t["sm"].buf.to_numpy().copy(), t["si"].buf.to_numpy().copy()))
    for a, b in zip(*outs):
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8))
