"""16-bit 1x1 convolutions through pydnn.ops.matmul (issue 18), planned on CPU-only handles (sm_90 / 132 SMs):
which plan each route makes (FWD_ALGO_GEMM direct / gather + matmul, BWD_DATA_ALGO_0's GEMM form), what it
refuses and hands back to the older plans, the GEMM's shape (NHWC images as one GEMM of N * P rows), and
the model Get..._v7 ranks them by (gemm.mm16_ms against the implicit GEMMs' 1x1 model)."""
import sys
from pathlib import Path

import pytest

import pydnn
from pydnn import tuning
from pydnn.ops import matmul
from pydnn.ops.convolution import algorithms as A, gemm as G, implicit as CI, plans as CP, problem as CPb

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))
from plan_digest import cpu_handle  # noqa: E402

BF16, F16, F32 = pydnn.PYDNN_DATA_BFLOAT16, pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_FLOAT
NHWC, NCHW = pydnn.PYDNN_TENSOR_NHWC, pydnn.PYDNN_TENSOR_NCHW
FWD_GEMM, FWD_PRE = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_GEMM, pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
BWD_D0, BWD_D1 = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_0, pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1


@pytest.fixture
def h(monkeypatch):
    # the GEMM plan itself: tuning.conv.TMA_1X1 would move its short-reduction 1x1 plans to fwd_tma (conv_tma.py)
    monkeypatch.setattr(tuning.conv, "TMA_1X1", False)
    return cpu_handle("sm_90", 132)


def _descs(n, c, k, hw, r=1, s=1, pad=0, dtype=BF16, fmt=NHWC, math=None):
    p = (hw + 2 * pad - r) // s + 1
    xd, yd = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
    pydnn.set_tensor4d_descriptor(xd, fmt, dtype, n, c, hw, hw)
    pydnn.set_tensor4d_descriptor(yd, fmt, dtype, n, k, p, p)
    wd = pydnn.create_filter_descriptor()
    pydnn.set_filter4d_descriptor(wd, dtype, fmt, k, c, r, r)
    cv = pydnn.create_convolution_descriptor()
    pydnn.set_convolution2d_descriptor(cv, pad, pad, s, s, 1, 1, pydnn.PYDNN_CROSS_CORRELATION, pydnn.PYDNN_DATA_FLOAT)
    if math is not None:
        pydnn.set_convolution_math_type(cv, math)
    return xd, wd, yd, cv


def _plan(h, direction, algo, d):
    xd, wd, yd, cv = d
    return CP.new_plan(h, direction, algo, cv, xd, wd, yd)


def test_forward_direct_is_one_gemm_over_all_images(h):
    pl = _plan(h, CPb.DIR_FWD, FWD_GEMM, _descs(6, 64, 256, 56))
    assert isinstance(pl, G.GemmPlan) and pl.direct and pl.workspace == 0
    mp, filter_a = pl.mm
    assert not filter_a and mp.batch == 1 and (mp.m, mp.n, mp.k) == (6 * 56 * 56, 256, 64) and mp.trans_b
    assert "matmul::gemm_" in pl.gemm_expr          # the label is the kernel the plain call runs
    # the fused call's path: the tensor-core implicit GEMM of the problem itself
    assert "conv::" in pl.sub.plan.gemm_expr and pl.sub.plan.algo == FWD_GEMM


def test_forward_nchw_direct_per_image(h):
    pl = _plan(h, CPb.DIR_FWD, FWD_GEMM, _descs(3, 32, 48, 14, fmt=NCHW))
    mp, filter_a = pl.mm
    assert pl.direct and filter_a and mp.batch == 3 and (mp.m, mp.n, mp.k) == (48, 196, 32)


def test_forward_strided_keeps_the_implicit_view(h):
    """A strided 16-bit 1x1: the gather + the implicit 1x1 view (gather + matmul measured no faster than
    fwd_wgmma: 0.1986 / 0.0977 ms against 0.1961 / 0.0803, H200)."""
    pl = _plan(h, CPb.DIR_FWD, FWD_GEMM, _descs(4, 256, 512, 56, s=2))
    assert not pl.direct and pl.im2col is not None and pl.mm is None
    assert pl.workspace >= 4 * 28 * 28 * 256 * 2


def test_forward_3x3_and_fma_keep_the_implicit_view(h):
    pl = _plan(h, CPb.DIR_FWD, FWD_GEMM, _descs(2, 64, 64, 14, r=3, pad=1))
    assert pl.mm is None and not pl.direct
    pl = _plan(h, CPb.DIR_FWD, FWD_GEMM, _descs(2, 64, 64, 14, math=pydnn.PYDNN_FMA_MATH))
    assert pl.mm is None and not pl.direct


def test_backward_data_algo0_gemm_form(h):
    pl = _plan(h, CPb.DIR_BWD_DATA, BWD_D0, _descs(6, 64, 256, 56))
    assert isinstance(pl, G.BwdGemmPlan) and pl.direct and pl.workspace == 0 and pl.deterministic
    assert pl.mm.batch == 1 and (pl.mm.m, pl.mm.n, pl.mm.k) == (6 * 56 * 56, 64, 256) and not pl.filter_a
    # strided: the CUDA-core gather (col + col2im measured 1.338 ms against ALGO_1's 0.172, H200)
    pl = _plan(h, CPb.DIR_BWD_DATA, BWD_D0, _descs(4, 256, 512, 56, s=2))
    assert type(pl) is CP.Plan and "implicit_gemm<" in pl.gemm_expr


@pytest.mark.parametrize("desc_kw", [dict(dtype=F32), dict(r=3, pad=1), dict(math=pydnn.PYDNN_FMA_MATH)])
def test_backward_data_algo0_elsewhere_is_the_cuda_core_gather(h, desc_kw):
    pl = _plan(h, CPb.DIR_BWD_DATA, BWD_D0, _descs(2, 64, 64, 14, **desc_kw))
    assert type(pl) is CP.Plan and "implicit_gemm<" in pl.gemm_expr


def test_backward_data_algo0_unreadable_dy_falls_back(h):
    """dy whose spatial dims are not packed (a gap after each row): the GEMM form passes, the gather serves."""
    xd, wd, yd, cv = _descs(2, 64, 64, 14)
    gap = pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(gap, BF16, 4, [2, 64, 14, 14], [16 * 15 * 64, 1, 15 * 64, 64])
    pl = CP.new_plan(h, CPb.DIR_BWD_DATA, BWD_D0, cv, xd, wd, gap)
    assert type(pl) is CP.Plan and "implicit_gemm<" in pl.gemm_expr


def test_switch_off_restores_the_old_plans(h, monkeypatch):
    monkeypatch.setattr(tuning.conv_gemm, "MM_1X1", False)
    pl = _plan(h, CPb.DIR_FWD, FWD_GEMM, _descs(6, 64, 256, 56))
    assert pl.mm is None and not pl.direct and pl.im2col is not None
    pl = _plan(h, CPb.DIR_BWD_DATA, BWD_D0, _descs(6, 64, 256, 56))
    assert type(pl) is CP.Plan


def test_mm16_model(h):
    """The tile model: a long-K problem that fills the SMs runs at the wgmma tile's rate; a 1-K-tile one is
    bound by its bytes; a problem of a few tiles pays for its empty SMs."""
    big = matmul.gemm_plan(h, BF16, 8192, 4096, 4096, trans_b=True)
    t = G.mm16_ms(h, big)
    flops = 2 * 8192 * 4096 * 4096
    assert 350 < flops / t / 1e9 < 560
    short = matmul.gemm_plan(h, BF16, 200704, 256, 64, trans_b=True)
    nbytes = (200704 * 64 + 64 * 256 + 200704 * 256) * 2
    assert G.mm16_ms(h, short) >= nbytes / (G.MM16_GBPS * 1e6)
    small = matmul.gemm_plan(h, BF16, 256, 256, 4096, trans_b=True)
    assert 2 * 256 * 256 * 4096 / G.mm16_ms(h, small) / 1e9 < 50


def test_v7_reports_the_gemm_routes(h):
    """Get..._v7 lists FWD_ALGO_GEMM and BWD_DATA_ALGO_0 as SUCCESS with their workspace (0, direct) and
    orders every route by its modelled time; on the issue's 64->256 @56 (1 K tile: the implicit GEMM measured
    0.12 ms, cuDNN 0.040, H200) the model puts the matmul first."""
    xd, wd, yd, cv = _descs(64, 64, 256, 56)
    res = pydnn.get_convolution_forward_algorithm_v7(h, xd, wd, cv, yd, 8)
    g = next(p for p in res if p.algo == FWD_GEMM)
    assert g.status == pydnn.PYDNN_STATUS_SUCCESS and g.memory == 0
    assert res[0].algo == FWD_GEMM
    ests = [A._estimate_ms(h, _plan(h, CPb.DIR_FWD, p.algo, (xd, wd, yd, cv))) for p in res
            if p.status == pydnn.PYDNN_STATUS_SUCCESS]
    assert ests == sorted(ests)
    res = pydnn.get_convolution_backward_data_algorithm_v7(h, wd, yd, cv, xd, 6)
    d0 = next(p for p in res if p.algo == BWD_D0)
    assert d0.status == pydnn.PYDNN_STATUS_SUCCESS and d0.memory == 0
    assert d0.determinism == pydnn.PYDNN_DETERMINISTIC


def test_implicit_1x1_model_pays_its_short_k_loop(h):
    """The implicit GEMMs' 1x1 model: one K tile (C = 64) costs 3 K tiles' time (fill + epilogue), so the
    issue's 64->256 @56 forward models near its measured 0.12 ms (H200), not at flops / rate (0.044)."""
    pl = _plan(h, CPb.DIR_FWD, FWD_PRE, _descs(64, 64, 256, 56))
    assert 0.09 < A._estimate_ms(h, pl) < 0.16


# ----------------------------------------------------------------------------- the launches, emulated
# (the plans' matmul / im2col / col2im records run in numpy exactly as the kernels address memory, against
# the float64 reference; test_convolution_gemm_cpu's emulators)

EMU_CASES = [  # xdims, k, filt, pad, stride, dil, layout, filter format
    ((3, 8, 5, 7), 16, (1, 1), (0, 0), (1, 1), (1, 1), "nhwc", NHWC),      # one GEMM of 3 * 35 rows
    ((2, 12, 5, 6), 20, (1, 1), (0, 0), (1, 1), (1, 1), "nhwc", NHWC),     # C % 8 != 0
    ((2, 8, 4, 6), 16, (1, 1), (0, 0), (1, 1), (1, 1), "nchw", NCHW),      # per image, the filter as A
    ((2, 8, 9, 11), 16, (1, 1), (0, 0), (2, 2), (1, 1), "nhwc", NHWC),     # strided: gather / col2im
    ((2, 8, 8, 7), 8, (1, 1), (0, 0), (3, 2), (1, 1), "nhwc", NHWC),       # odd strides
    ((2, 8, 3, 4, 5), 8, (1, 1, 1), (0, 0, 0), (1, 1, 1), (1, 1, 1), "nhwc", NHWC),   # 3-d
    ((2, 16, 6, 5), 8, (1, 1), (1, 1), (1, 1), (1, 1), "nhwc", NHWC),      # padded: gather + matmul / col2im
    ((2, 16, 7, 6), 8, (1, 1), (1, 0), (2, 1), (1, 1), "nhwc", NHWC),      # padded and strided
]


@pytest.mark.parametrize("case", EMU_CASES)
@pytest.mark.parametrize("mode", [pydnn.PYDNN_CROSS_CORRELATION, pydnn.PYDNN_CONVOLUTION])
def test_forward_emulated(case, mode, monkeypatch):
    # (the GEMM plan's own matmul: a gathered strided / padded 1x1 sub-problem would run the streaming kernels,
    # which test_conv_stream_cpu emulates)
    monkeypatch.setattr(tuning.conv, "STREAM_1X1", False)
    import numpy as np
    from pydnn.reference import convolution as ref
    from test_convolution_gemm_cpu import ITEM, _gather_tensor, _problem, _scatter, run_forward
    rng = np.random.default_rng(11)
    hh = cpu_handle("sm_90", 132)
    c, (xd, wd, yd), (xs, ws, ys), (xsize, ysize), (xdsc, wdsc, ydsc) = _problem(case, mode, rng, BF16)
    x, w = rng.standard_normal(xd), rng.standard_normal(wd)
    xb, wb = _scatter(x, xs, xsize), _scatter(w, ws, int(np.prod(wd)))
    pl = CP.new_plan(hh, CPb.DIR_FWD, FWD_GEMM, c, xdsc, wdsc, ydsc)
    direct = case[4] == (1,) * len(case[4]) and case[3] == (0,) * len(case[3])
    assert (pl.mm is not None) == direct and pl.workspace == pydnn.get_convolution_forward_workspace_size(
        hh, xdsc, wdsc, c, ydsc, FWD_GEMM)
    got = _gather_tensor(run_forward(pl, xb, wb, ysize, ITEM[BF16]), yd, ys)
    want = ref.forward_raw(x, w, case[3], case[4], case[5], 1, mode == pydnn.PYDNN_CROSS_CORRELATION)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("case", [c for c in EMU_CASES if c[4] == (1,) * len(c[4]) and c[3] == (0,) * len(c[3])])
@pytest.mark.parametrize("mode", [pydnn.PYDNN_CROSS_CORRELATION, pydnn.PYDNN_CONVOLUTION])
def test_backward_data_algo0_emulated(case, mode):
    """ALGO_0's GEMM form: the direct matmul into dx with alpha / beta, or matmul into the column matrix +
    col2im (every dx element written: beta * dx where no output reaches it)."""
    import numpy as np
    from pydnn.reference import convolution as ref
    from test_convolution_gemm_cpu import (ITEM, _gather_tensor, _problem, _scatter, emulate_col2im, emulate_matmul,
                                           emulate_pack)
    rng = np.random.default_rng(12)
    hh = cpu_handle("sm_90", 132)
    c, (xd, wd, yd), (xs, ws, ys), (xsize, ysize), (xdsc, wdsc, ydsc) = _problem(case, mode, rng, BF16)
    w, dy, dx0 = rng.standard_normal(wd), rng.standard_normal(yd), rng.standard_normal(xd)
    wb, dyb = _scatter(w, ws, int(np.prod(wd))), _scatter(dy, ys, ysize)
    pl = CP.new_plan(hh, CPb.DIR_BWD_DATA, BWD_D0, c, xdsc, wdsc, ydsc)
    assert isinstance(pl, G.BwdGemmPlan) and pl.deterministic
    assert pl.workspace == pydnn.get_convolution_backward_data_workspace_size(hh, wdsc, ydsc, c, xdsc, BWD_D0)
    item = ITEM[BF16]
    for alpha, beta in ((1.0, 0.0), (-0.5, 0.75)):
        dxb = _scatter(dx0, xs, xsize)
        if pl.direct:
            emulate_matmul(pl.mm, wb if pl.filter_a else dyb, dyb if pl.filter_a else wb, dxb, alpha, beta)
        else:
            wsb = np.zeros(pl.workspace // item)
            wmat = wb
            if pl.pack is not None:
                f = pl.filter_off // item
                packed = emulate_pack(pl.steps[pl.pack][4], wb)
                wsb[f:f + packed.size] = packed
                wmat = wsb[f:]
            emulate_matmul(pl.mm, dyb, wmat, wsb)
            p = pl.steps[pl.col2im][4]
            p.flags = (p.flags & ~G.FLAG_C2I_BETA) | (G.FLAG_C2I_BETA if beta else 0)
            emulate_col2im(p, wsb, dxb, alpha, beta)
        got = _gather_tensor(dxb, xd, xs)
        want = (alpha * ref.backward_data_raw(w, dy, xd[2:], case[3], case[4], case[5], 1,
                                              mode == pydnn.PYDNN_CROSS_CORRELATION) + beta * dx0)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
