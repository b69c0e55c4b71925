"""The explicit-GEMM backward filter (BWD_FILTER_ALGO_3) and the direct 1x1 backward data (BWD_DATA_ALGO_1
without col2im), pydnn/ops/convolution_gemm.py, on the GPU against the float64 reference: the stem with dy
packed channel-major (NCHW) or read in place (NHWC), 1x1 layers on x itself (one partial per image, or one
flat reduction), im2col under strides, dilation, padding and a padded x, 1-d / 3-d, C != K both ways, N = 1 / 3,
odd sizes, both filter formats, both modes, alpha / beta; outputs poisoned first and their gaps checked
untouched; bitwise reproducibility; chunks of images under small workspace budgets; Find's record. Float
problems run both forms of ALGO_3: the implicit variant (wgrad_implicit + the fold) and the explicit GEMMs."""
import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops.convolution import implicit as CI, plans as CP, problem as CPb, tensor_core as CT
from pydnn.ops.convolution import gemm as G
from test_convolution_gemm_gpu import _bwd_problem
from test_convolution_gpu import (BF16, CONV, F16, F32, NCHW, NHWC, XCORR, Problem, _workspace, check_backward_data,
                                  check_backward_filter)

pytestmark = pytest.mark.gpu

BWD_F3 = pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_3
BWD_D1 = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1

WG_CASES = [  # xdims, k, filt, pad, stride, dil, groups, layout ("gapx": x padded only), filter format
    ((2, 3, 23, 21), 16, (7, 7), (3, 3), (2, 2), (1, 1), 1, "nchw", NCHW),     # a stem: dy packed
    ((3, 3, 17, 19), 24, (7, 7), (3, 3), (2, 2), (1, 1), 1, "nhwc", NHWC),     # a stem, NHWC: dy in place
    ((1, 20, 7, 9), 33, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nchw", NCHW),      # 1x1 on x, N = 1
    ((3, 40, 7, 9), 70, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nchw", NHWC),      # 1x1, K > C: partials [C x K]
    ((2, 20, 7, 9), 33, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),      # 1x1 NHWC: one flat reduction
    ((2, 6, 7, 9), 10, (1, 1), (0, 0), (2, 2), (1, 1), 1, "nchw", NCHW),       # 1x1 stride 2: im2col
    ((2, 6, 12, 9), 10, (3, 2), (2, 0), (2, 3), (2, 1), 1, "nchw", NHWC),      # dilation, odd strides
    ((2, 4, 37), 9, (3,), (1,), (2,), (1,), 1, "nhwc", NHWC),                  # 1-d
    ((1, 3, 5, 6, 7), 4, (2, 3, 3), (1, 1, 0), (1, 2, 1), (2, 1, 1), 1, "nchw", NCHW),   # 3-d
    ((3, 70, 15, 13), 80, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nchw", NCHW),    # several tiles, long reduction
    ((2, 5, 13, 11), 7, (3, 3), (2, 2), (1, 1), (1, 1), 1, "gapx", NCHW),      # padded x, pad 2
]


def _wgrad(handle, pb, alpha, beta):
    need = pydnn.get_convolution_backward_filter_workspace_size(handle, pb.x.desc, pb.y.desc, pb.conv, pb.wdesc,
                                                                BWD_F3)
    ws, n = _workspace(need)
    pydnn.convolution_backward_filter(handle, alpha, pb.x.desc, pb.x.ptr, pb.y.desc, pb.y.ptr, pb.conv, BWD_F3,
                                      ws.ptr, n, beta, pb.wdesc, pb.w.ptr)


def check_wgrad(handle, rng, case, dtype, what, implicit=None):
    """ALGO_3 against the reference (check_backward_filter: poisoned or random dw, both modes, alpha / beta,
    the same bits twice: fixed-order fold, no atomics). implicit: whether the plan must be ALGO_3's
    implicit variant (None: either)."""
    def make(mode):
        pb = _bwd_problem(case, dtype, mode)
        pl = CP.new_plan(handle, CPb.DIR_BWD_FILTER, BWD_F3, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
        assert isinstance(pl, G.WgradGemmPlan) and pl.deterministic
        assert implicit is None or pl.implicit == implicit, (what, implicit)
        return pb

    check_backward_filter(rng, make, dtype, lambda pb, alpha, beta: _wgrad(handle, pb, alpha, beta), what,
                          ((XCORR, 1.0, 0.0), (CONV, -1.5, 0.25), (XCORR, 0.5, -1.0)), reproducible=True)


def _implicit_applies(case, dtype):
    """ALGO_3's implicit variant serves float problems of <= IMPLICIT_MAX_COLS columns that are not 1x1
    stride-1 ones on x itself (tests/test_convolution_gemm_wgrad_cpu.implicit_expected, groups column
    dropped)."""
    one = case[2] in ((1, 1), (1,)) and case[4] in ((1, 1), (1,)) and case[7] != "gapx"
    return dtype == F32 and not one and case[0][1] * int(np.prod(case[2])) <= G.IMPLICIT_MAX_COLS


@pytest.mark.parametrize("case", WG_CASES)
@pytest.mark.parametrize("dtype", [F32, F16, BF16])
@pytest.mark.parametrize("implicit", [True, False])
def test_gemm_backward_filter(handle, rng, monkeypatch, case, dtype, implicit):
    """Every case through the explicit GEMMs (IMPLICIT off) and, where it applies, the implicit variant
    (on: the default); where it does not apply the plan must be the explicit one."""
    monkeypatch.setattr(tuning.conv_gemm, "IMPLICIT", implicit)
    if implicit and dtype != F32:
        pytest.skip("16-bit data: the explicit GEMMs either way (covered with implicit=False)")
    check_wgrad(handle, rng, case, dtype, "GEMM backward filter", implicit and _implicit_applies(case, dtype))


IMPL_CASES = [  # the implicit variant's edges: xdims, k, filt, pad, stride, dil, groups, layout, filter format
    ((1, 3, 9, 7), 64, (7, 7), (3, 3), (2, 2), (1, 1), 1, "nchw", NCHW),     # the stem's shape, N = 1..5, odd images
    ((2, 3, 17, 11), 64, (7, 7), (3, 3), (2, 2), (1, 1), 1, "nchw", NHWC),
    ((5, 3, 15, 21), 64, (7, 7), (3, 3), (2, 2), (1, 1), 1, "nchw", NCHW),
    ((3, 3, 13, 9), 70, (7, 7), (3, 3), (2, 2), (1, 1), 1, "nhwc", NHWC),    # two K tiles, NHWC (dy loads k-fast)
    ((4, 3, 31, 29), 5, (7, 7), (3, 3), (2, 2), (1, 1), 1, "gapx", NCHW),    # K 5, padded x
    ((2, 5, 12, 10), 9, (7, 7), (3, 3), (2, 2), (1, 1), 1, "nchw", NCHW),    # 245 columns (two column tiles)
    ((3, 2, 9, 8), 7, (3, 2), (2, 0), (2, 3), (2, 1), 1, "nchw", NHWC),      # dilation, odd strides
    ((2, 3, 4, 5, 6), 7, (2, 3, 2), (1, 1, 0), (1, 2, 2), (2, 1, 1), 1, "nhwc", NCHW),   # 3-d
    ((3, 4, 19), 6, (5,), (2,), (3,), (1,), 1, "nchw", NHWC),                 # 1-d
]


@pytest.mark.parametrize("case", IMPL_CASES)
@pytest.mark.parametrize("slots", ["default", "many"])
def test_implicit_backward_filter(handle, rng, monkeypatch, case, slots):
    """The implicit variant against the float64 reference (poisoned dw, alpha / beta, both modes, the same
    bits twice): the default slots, and many one-stage slots (the last one short); two column tiles
    where IMPLICIT_MAX_COLS is raised to let it serve 245 columns."""
    monkeypatch.setattr(G, "IMPLICIT_MAX_COLS", 2 * G.WI_JT)
    if slots == "many":
        monkeypatch.setattr(G, "WI_MIN_SLOT", G.WI_BK)
        monkeypatch.setattr(G, "WI_WAVES", 64)
    check_wgrad(handle, rng, case, F32, f"implicit backward filter ({slots} slots)", True)


def test_implicit_stem_full_size(handle, rng):
    """The stem itself (N = 2 of 224 x 224 images, 64 filters): the implicit plan against the reference."""
    check_wgrad(handle, rng, ((2, 3, 224, 224), 64, (7, 7), (3, 3), (2, 2), (1, 1), 1, "nchw", NCHW), F32,
                "implicit backward filter, stem", True)


TAIL_CASE = ((1, 6, 61), 5, (1,), (0,), (1,), (1,), 1, "nhwc", NHWC)   # 61 rows: 8 splits of 7 + a tail of 5


@pytest.mark.parametrize("case, col_limit, part_limit", [
    (WG_CASES[0], 1, 64 << 20), (WG_CASES[1], 1, 64 << 20), (WG_CASES[3], 1, 12000), (TAIL_CASE, 1, 64 << 20)])
def test_gemm_backward_filter_chunks(handle, rng, monkeypatch, case, col_limit, part_limit):
    """Small workspace budgets: one image per im2col chunk (partials of its own each); a per-image plan
    adding its later chunks into the first chunk's partials (beta 1); short splits with a tail."""
    monkeypatch.setattr(tuning.conv_gemm, "COL_LIMIT", col_limit)
    monkeypatch.setattr(tuning.conv_gemm, "PART_LIMIT", part_limit)
    monkeypatch.setattr(tuning.conv_gemm, "MIN_SPLIT_ROWS", 7)
    monkeypatch.setattr(tuning.conv_gemm, "IMPLICIT", False)
    check_wgrad(handle, rng, case, F32, "GEMM backward filter, chunks", False)


DIRECT_CASES = [  # dx dims, k, layout, filter format
    ((2, 70, 5, 7), 9, "nchw", NCHW),
    ((3, 6, 5, 7), 80, "nhwc", NHWC),
    ((1, 64, 3, 3), 64, "nchw", NHWC),
    ((3, 5, 9, 7), 7, "nhwc", NCHW),
]


@pytest.mark.parametrize("case", DIRECT_CASES)
@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_direct_backward_data(handle, rng, case, dtype):
    xd, k, layout, wfmt = case
    full = (xd, k, (1, 1), (0, 0), (1, 1), (1, 1), 1, layout, wfmt)
    pb = Problem(full, dtype, XCORR)
    pl = CP.new_plan(handle, CPb.DIR_BWD_DATA, BWD_D1, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
    if not isinstance(pl, G.BwdGemmPlan):   # 16-bit NHWC with channels % 8: the tensor-core ALGO_1
        assert dtype != F32
        pytest.skip("16-bit NHWC with channels % 8 == 0: the tensor-core ALGO_1 (tested there)")
    assert pl.direct and pl.workspace == 0

    def run(pb, alpha, beta):
        pydnn.convolution_backward_data(handle, alpha, pb.wdesc, pb.w.ptr, pb.y.desc, pb.y.ptr, pb.conv, BWD_D1, 0, 0,
                                        beta, pb.x.desc, pb.x.ptr)

    check_backward_data(rng, lambda mode: Problem(full, dtype, mode), dtype, run, "direct backward data")


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_find_records_algo_3(handle, rng, monkeypatch, dtype):
    """Find times ALGO_3 with its true workspace and determinism; with one byte too few it is ALLOC_FAILED."""
    monkeypatch.setenv("PYDNN_CONV_TUNING_CACHE", "0")
    pb = Problem(WG_CASES[0] if dtype == F32 else WG_CASES[1], dtype)
    pb.x.random(rng)
    pb.y.random(rng)
    need = pydnn.get_convolution_backward_filter_workspace_size(handle, pb.x.desc, pb.y.desc, pb.conv, pb.wdesc,
                                                                BWD_F3)
    ws, n = _workspace(1 << 24)
    assert need <= n
    for limit, status in ((n, pydnn.PYDNN_STATUS_SUCCESS), (need - 1, pydnn.PYDNN_STATUS_ALLOC_FAILED)):
        r = pydnn.find_convolution_backward_filter_algorithm_ex(handle, pb.x.desc, pb.x.ptr, pb.y.desc, pb.y.ptr,
                                                                pb.conv, pb.wdesc, pb.w.ptr, 7, ws.ptr, limit)
        a3 = next(p for p in r if p.algo == BWD_F3)
        assert a3.status == status and a3.memory == need
        if status == pydnn.PYDNN_STATUS_SUCCESS:
            assert a3.time > 0 and a3.determinism == pydnn.PYDNN_DETERMINISTIC
