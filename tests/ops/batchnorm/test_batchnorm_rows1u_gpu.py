"""Batch norm's 1-element row kernels with 8 rows in flight (tuning.batchnorm.ROWS1_U = 8: fwd_stats /
fwd_apply / bwd_stats / bwd_apply<T, 1, 8>) on the GPU against the float64 reference, outputs poisoned:
NHWC with C off every vector (odd C), training forward (plain: scratch in y and its head; Ex ReLU),
backward with saved and recomputed statistics and blending; that the plan holds the <T, 1, 8> kernels."""
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops import batchnorm as B
from pydnn.tensor import packed_strides
from test_batchnorm_gpu import BF16, F16, F32, OPS_ACT, SPATIAL, _backward, _forget_bn_plans, _train

pytestmark = pytest.mark.gpu

CASES = [((3, 93, 7, 9), BF16), ((2, 477, 5, 6), F32), ((9, 5, 11, 13), F16), ((40, 13, 9, 9), F32),
         ((5, 405, 4, 7), BF16)]


@pytest.fixture(autouse=True)
def _rows1_u(monkeypatch, handle):
    monkeypatch.setattr(tuning.batchnorm, "GEN_TINY", 0)  # (small shapes: the rows path, not gen)
    monkeypatch.setattr(tuning.batchnorm, "ROWS1_U", 8)
    monkeypatch.setattr(tuning.batchnorm, "SUPER_ROWS", False)  # (aligned odd-C calls take the super-row kernels)
    _forget_bn_plans(handle)
    yield
    _forget_bn_plans(handle)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_rows1_u8(handle, rng, case):
    dims, dtype = CASES[case]
    d = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(d, dtype, 4, dims, packed_strides(dims, pydnn.PYDNN_TENSOR_NHWC))
    for direction in ("fwd", "bwd"):
        others = (d, d) if direction == "bwd" else (d,)
        seq = B.plan_summary(handle, direction, SPATIAL, d, *others)[1]["rows1"]
        assert seq[0][:2] == (f"{direction}_stats", 1) and seq[2][:2] == (f"{direction}_apply", 1)
    t = _train(handle, SPATIAL, dims, "nhwc", dtype, rng)
    _backward(handle, t, dtype, SPATIAL, rng, saved=True)
    _backward(handle, t, dtype, SPATIAL, rng, saved=False, ap=0.5, bp=0.5, bd_=0.25)
    t = _train(handle, SPATIAL, dims, "nhwc", dtype, rng, alpha=0.5, beta=0.25, ex_ops=OPS_ACT)
    _backward(handle, t, dtype, SPATIAL, rng, saved=True, ex_ops=OPS_ACT)
