"""The 1x1 backward filter as one pydnn.ops.matmul GEMM (pydnn/ops/convolution/wgrad_mm.py; tuning.conv.WGRAD_MM)
planned on CPU-only handles (sm_90 / 132 SMs): what it takes and refuses, the GEMM it plans (dw[K x C] = dy^T x over
the N * P pixels: m, n, k, the transposes, the leading dims, matmul's split-K and its workspace), the ranking kept
(the replaced plan's estimate), the fallback of a misaligned call; and the GEMM's operands read as the float64
reference's 1x1 backward filter."""
import sys
from pathlib import Path

import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops.convolution import plans as CP, problem as CPb, wgrad_mm as WM
from pydnn.reference import convolution as ref

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))
from plan_digest import cpu_handle  # noqa: E402

BF16, F32 = pydnn.PYDNN_DATA_BFLOAT16, pydnn.PYDNN_DATA_FLOAT
NHWC, NCHW = pydnn.PYDNN_TENSOR_NHWC, pydnn.PYDNN_TENSOR_NCHW
BF1 = pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1


@pytest.fixture
def h():
    return cpu_handle("sm_90", 132)


def _descs(n, c, k, hw, r=1, pad=0, stride=1, dtype=BF16, fmt=NHWC):
    p = (hw + 2 * pad - r) // stride + 1
    xd, yd = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
    pydnn.set_tensor4d_descriptor(xd, fmt, dtype, n, c, hw, hw)
    pydnn.set_tensor4d_descriptor(yd, fmt, dtype, n, k, p, p)
    wd = pydnn.create_filter_descriptor()
    pydnn.set_filter4d_descriptor(wd, dtype, fmt, k, c, r, r)
    cv = pydnn.create_convolution_descriptor()
    pydnn.set_convolution2d_descriptor(cv, pad, pad, stride, stride, 1, 1, pydnn.PYDNN_CROSS_CORRELATION,
                                       pydnn.PYDNN_DATA_FLOAT)
    return cv, xd, wd, yd


def _plan(h, *a, algo=BF1, **kw):
    cv, xd, wd, yd = _descs(*a, **kw)
    return CP.new_plan(h, CPb.DIR_BWD_FILTER, algo, cv, xd, wd, yd)


def test_the_gemm_and_its_split(h, monkeypatch):
    monkeypatch.setattr(tuning.conv, "WGRAD_MM", False)
    assert not isinstance(_plan(h, 8, 1024, 512, 14), WM.WgradMMPlan)
    monkeypatch.setattr(tuning.conv, "WGRAD_MM", "always")
    pl = _plan(h, 8, 1024, 512, 14)
    assert isinstance(pl, WM.WgradMMPlan) and pl.fallback is not None and pl.deterministic
    mp = pl.mm
    assert (mp.m, mp.n, mp.k, mp.trans_a, mp.trans_b) == (512, 1024, 8 * 14 * 14, True, False)
    assert (mp.lda, mp.ldb, mp.ldc, mp.batch) == (512, 1024, 1024, 1)
    # 4 x 4 tiles of 128 x 256 for 132 SMs: matmul splits the 1568-pixel reduction, its partials in our workspace
    assert mp.split is not None and mp.ws_bytes > 0 and pl.workspace >= mp.ws_bytes
    assert "gemm_wgmma_s<" in pl.gemm_expr
    big = _plan(h, 128, 2048, 2048, 7)      # 16 x 8 tiles of 128 x 256: a wave, the whole-K tile
    assert isinstance(big, WM.WgradMMPlan) and big.mm.split is None


def test_refusals(h, monkeypatch):
    monkeypatch.setattr(tuning.conv, "WGRAD_MM", "always")
    for kw, why in ((dict(r=3, pad=1), "1x1"), (dict(stride=2), "1x1"), (dict(dtype=F32), "data type"),
                    (dict(fmt=NCHW), "packed (K, C)")):   # (an NCHW filter: KCRS)
        pl = _plan(h, 8, 64, 64, 14, **kw)
        assert not isinstance(pl, WM.WgradMMPlan)
        assert why in (WM.wgrad_mm_refusal(pl.problem) or ""), kw
    assert not isinstance(CP.new_plan(cpu_handle("sm_80", 108), CPb.DIR_BWD_FILTER, BF1, *_descs(8, 64, 64, 14)),
                          WM.WgradMMPlan)


def test_ranking_kept(h, monkeypatch):
    cv, xd, wd, yd = _descs(8, 1024, 512, 14)
    first = pydnn.get_convolution_backward_filter_algorithm_v7(h, xd, yd, cv, wd, 3)
    monkeypatch.setattr(tuning.conv, "WGRAD_MM", "always")
    again = pydnn.get_convolution_backward_filter_algorithm_v7(h, xd, yd, cv, wd, 3)
    assert [p.algo for p in first] == [p.algo for p in again]


def test_misaligned_call_runs_the_replaced_plan(h, monkeypatch):
    monkeypatch.setattr(tuning.conv, "WGRAD_MM", "always")
    pl = _plan(h, 8, 1024, 512, 14)
    seen = []
    monkeypatch.setattr(WM, "run_plan", lambda handle, plan, *a: seen.append((plan, a)))
    pl.launch(h, 0x1002, 0x2000, 0x3000, 0x4000, 1.0, 0.5)
    assert seen and seen[0][0] is pl.fallback and seen[0][1] == (0x1002, 0x2000, 0x3000, 0x4000, 1.0, 0.5)


def test_gemm_operands_are_the_reference(h, monkeypatch):
    """The plan's GEMM, done in numpy through its own m, n, k, transposes and leading dims on NHWC dy and x,
    equals the float64 reference's backward filter (N 3, C 24, K 40, 5 x 6 pixels)."""
    monkeypatch.setattr(tuning.conv, "WGRAD_MM", "always")
    n, c, k, hw = 3, 24, 40, 6
    pl = _plan(h, n, c, k, hw)
    assert isinstance(pl, WM.WgradMMPlan)
    mp = pl.mm
    rng = np.random.default_rng(3)
    x = rng.integers(-3, 4, (n, c, hw, hw)).astype(np.float64)
    dy = rng.integers(-3, 4, (n, k, hw, hw)).astype(np.float64)
    a_mem = dy.transpose(0, 2, 3, 1).reshape(-1)     # NHWC dy as laid out in memory
    b_mem = x.transpose(0, 2, 3, 1).reshape(-1)
    A = np.stack([a_mem[i * mp.lda:i * mp.lda + mp.m] for i in range(mp.k)])     # k x m (trans_a: A^T stored)
    B = np.stack([b_mem[i * mp.ldb:i * mp.ldb + mp.n] for i in range(mp.k)])     # k x n
    dw = (A.T @ B).reshape(k, c)
    want = ref.backward_filter(1.0, x, dy, 0.0, np.zeros((k, c, 1, 1)), (0, 0), (1, 1), (1, 1))
    np.testing.assert_array_equal(dw, want[:, :, 0, 0])


def test_true_takes_the_measured_winners(h, monkeypatch):
    """WGRAD_MM True (the default): dw of >= MIN_CK elements over >= MIN_ROWS pixels (the measured winners, 1.21x);
    few pixels or a small dw keep the v7 plan (0.32x on the matmul)."""
    monkeypatch.setattr(tuning.conv, "WGRAD_MM", True)
    assert isinstance(_plan(h, 128, 512, 2048, 7), WM.WgradMMPlan)        # 6272 pixels, 2^20 dw
    assert isinstance(_plan(h, 32, 1024, 512, 14), WM.WgradMMPlan)        # 6272 pixels
    assert not isinstance(_plan(h, 8, 1024, 512, 14), WM.WgradMMPlan)     # 1568 pixels
    assert not isinstance(_plan(h, 128, 64, 64, 56), WM.WgradMMPlan)      # a 64 x 64 dw
    assert not isinstance(_plan(h, 128, 512, 256, 28), WM.WgradMMPlan)    # 2^17 dw
