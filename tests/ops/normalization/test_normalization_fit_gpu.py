"""tuning.norm.ROWS_FIT on the GPU: layer / RMS rows whose 16-byte vectors fill a power-of-two group of 4 items
poorly take 5 items (fp32: fwd_rows<float, 4, 5>; 16-bit: fwd_rowx<T, 8, 5> on whole-vector rows, at least as many
rows as SMs), checked against the float64 reference: training and inference, with and without bias, blended, in
place, rows of a large mean. Outputs start poisoned."""
import pytest

from pydnn import tuning
from pydnn.ops import normalization as N
import test_normalization_gpu as T

pytestmark = pytest.mark.gpu

CASES = [  # kind, dims, dtype, the plan's kernel and items
    (T.RMS, (140, 4336), T.F16, "fwd_rowx", 5),
    (T.LAYER, (140, 2296), T.BF16, "fwd_rowx", 5),
    (T.LAYER, (133, 9576), T.F16, "fwd_rowx", 5),
    (T.RMS, (135, 4336), T.F32, "fwd_rows", 5),
    (T.LAYER, (100, 160), T.F32, "fwd_rows", 5),
    (T.LAYER, (300, 4096), T.BF16, "fwd_rows", 4),  # (a full group: unchanged)
]


@pytest.fixture(autouse=True)
def _fit(monkeypatch):
    monkeypatch.setattr(tuning.norm, "ROWS_FIT", True)
    monkeypatch.setattr(tuning.norm, "ROWS_FWD", True)
    monkeypatch.setattr(tuning.norm, "ROWX", True)
    monkeypatch.setattr(tuning.norm, "FWD_PERSIST", False)
    monkeypatch.setattr(tuning.norm, "GN_REG", False)


@pytest.mark.parametrize("kind,dims,dtype,kernel,items", CASES)
def test_rows_fit(handle, rng, kind, dims, dtype, kernel, items):
    if dims[0] < handle.sm_count and kernel == "fwd_rowx":
        pytest.skip("fewer rows than this GPU's SMs: fwd_rows keeps them")
    x = T._tensor(dims, "nchw", dtype)
    alts, _ = N.plan_summary(handle, T._nd(kind, 0, 1), x.desc)
    assert alts[0][0].startswith(kernel + " ") and f"items={items}" in alts[0][0], alts
    T._forward_check(handle, rng, kind, 0, 1, dims, "nchw", dtype)
    T._forward_check(handle, rng, kind, 0, 1, dims, "nchw", dtype, bias=False, alpha=0.75, beta=-0.5)
    T._forward_check(handle, rng, kind, 0, 1, dims, "nchw", dtype, inplace=True)
    T._forward_check(handle, rng, kind, 0, 1, dims, "nchw", dtype, center=(1000.0, 1.0))
