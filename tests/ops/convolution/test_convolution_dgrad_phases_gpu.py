"""Strided backward data on its stride-1 phases (BWD_DATA_ALGO_1, pydnn/ops/convolution/dgrad_phases.py)
on the GPU against the float64 reference: stride 2 and 3, odd sizes, padding (also past the filter),
dilation with the stride (common and coprime factors), 1x1 / 2 (the fill of the phases no tap reaches,
with beta 0 and beta != 0), a filter smaller than the stride, 1-d / 3-d, NHWC and padded-NHWC dx, K and C
with channel tails, grouped (each phase on grouped.py's packed supergroups), both modes, fp16 and bf16; dx poisoned for beta 0 (every element written) and checked
untouched around it; bitwise reproducible. Also Find...Ex on a strided problem."""
import numpy as np
import pytest

import pydnn
from devtensor import DevTensor
from pydnn import tuning
from pydnn.tensor import packed_strides
from pydnn.ops.convolution import dgrad_phases as D, plans as CP, problem as CPb
from test_convolution_gpu import (BWD_D1, BWD_DATA_MODES, BF16, F16, NCHW, NHWC, XCORR, _backward_data_tc_run, _tc_problem,
                                  _workspace, check_backward_data)

pytestmark = pytest.mark.gpu

PHASE_CASES = [  # xdims, k, filt, pad, stride, dil, groups, layout, filter format
    ((2, 64, 13, 11), 64, (3, 3), (1, 1), (2, 2), (1, 1), 1, "nhwc", NHWC),     # ResNet 3x3/2, odd sizes
    ((2, 32, 9, 10), 128, (1, 1), (0, 0), (2, 2), (1, 1), 1, "nhwc", NHWC),     # 1x1/2: one phase + the fill
    ((2, 24, 11, 7), 16, (3, 2), (2, 0), (3, 2), (1, 1), 1, "pad8", NHWC),      # stride 3 / 2, padded NHWC dx
    ((1, 16, 12, 9), 8, (3, 3), (2, 1), (2, 2), (2, 1), 1, "nhwc", NHWC),       # dilation 2 with stride 2
    ((1, 8, 10, 11), 24, (5, 3), (3, 2), (2, 3), (3, 2), 1, "nhwc", NHWC),      # dilation coprime to the stride
    ((1, 8, 5, 6, 7), 16, (2, 3, 3), (1, 1, 0), (2, 2, 3), (1, 1, 1), 1, "nhwc", NHWC),  # 3-d
    ((2, 8, 17), 8, (7,), (3,), (2,), (1,), 1, "nhwc", NHWC),                   # 1-d 7/2
    ((1, 8, 6, 7), 8, (1, 2), (1, 0), (3, 3), (1, 1), 1, "nhwc", NHWC),         # filter smaller than the stride
    ((3, 136, 11, 9), 256, (3, 3), (1, 1), (2, 2), (1, 1), 1, "nhwc", NHWC),    # C 136: 2 N tiles + a tail
    ((2, 72, 15, 13), 192, (5, 5), (2, 2), (2, 2), (1, 1), 1, "nhwc", NHWC),    # 5x5/2, K 192
    ((2, 40, 9, 9), 112, (3, 3), (0, 0), (2, 2), (1, 1), 1, "nhwc", NHWC),      # no padding, K 112 (not % 64)
    ((2, 64, 9, 10), 64, (3, 3), (1, 1), (2, 2), (1, 1), 4, "nhwc", NHWC),      # grouped: packed supergroups
    ((2, 32, 8, 9), 32, (1, 1), (0, 0), (2, 2), (1, 1), 2, "nhwc", NHWC),       # grouped 1x1/2 + the fill
]
MODES = BWD_DATA_MODES + ((XCORR, 0.5, -1.0),)


def _make(handle, case, dtype):
    planned = {}

    def make(mode):
        pb = _tc_problem(case, dtype, mode)
        pl = CP.new_plan(handle, CPb.DIR_BWD_DATA, BWD_D1, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
        assert isinstance(pl, D.PhasePlan) and pl.deterministic
        planned["workspace"] = pl.workspace
        return pb

    return make, planned


@pytest.mark.parametrize("case", PHASE_CASES)
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
def test_phase_backward_data(handle, rng, monkeypatch, case, dtype):
    # grouped cases with C/g == K/g in 4..32 plan on grouped_direct.py's kernels by default (tested in
    # test_convolution_grouped_direct_gpu.py); switched off here so that the phases' grouped path stays tested
    monkeypatch.setattr(tuning.conv, "GROUPED_DIRECT", False)
    make, planned = _make(handle, case, dtype)

    def run(pb, alpha, beta):
        assert _backward_data_tc_run(handle, pb, alpha, beta) == planned["workspace"]

    check_backward_data(rng, make, dtype, run, "phase backward data", MODES, reproducible=True)


@pytest.mark.parametrize("case", [PHASE_CASES[0], PHASE_CASES[2]])
def test_phase_backward_data_forced_tilings(handle, rng, monkeypatch, case):
    """A forced backward-data tiling reaches the phases' stride-1 plans (bwd_data_tc 64x64, the pipelined
    128x128) and they still give the reference."""
    for tiling in ((64, 64), (128, 128, 4, 2, 2, 0)):
        monkeypatch.setitem(tuning.conv.TC_FORCE, CPb.DIR_BWD_DATA, tiling)
        make, planned = _make(handle, case, BF16)

        def run(pb, alpha, beta):
            _backward_data_tc_run(handle, pb, alpha, beta)

        check_backward_data(rng, make, BF16, run, f"phase backward data tiling {tiling}", BWD_DATA_MODES)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
def test_phase_backward_data_nchw_dx(handle, rng, dtype):
    """dx in NCHW (dy NHWC, as the tensor-core kernels read it): the phases write dx through its strides
    one channel at a time and the fill takes its one-channel variant (no 16-byte chunks along c)."""
    case = ((2, 16, 7, 9), 8, (1, 1), (0, 0), (2, 2), (1, 1), 1, "nhwc", NHWC)
    planned = {}

    def make(mode):
        pb = _tc_problem(case, dtype, mode)
        pb.x = DevTensor(case[0], dtype, packed_strides(case[0], NCHW))
        pl = CP.new_plan(handle, CPb.DIR_BWD_DATA, BWD_D1, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
        assert isinstance(pl, D.PhasePlan) and pl.fill is not None and not pl.fill_vec
        planned["workspace"] = pl.workspace
        return pb

    def run(pb, alpha, beta):
        assert _backward_data_tc_run(handle, pb, alpha, beta) == planned["workspace"]

    check_backward_data(rng, make, dtype, run, "phase backward data, NCHW dx", MODES, reproducible=True)


def test_phase_backward_data_swapped_filter(handle, rng, monkeypatch):
    """With WGM_BWD_SWAP (sm_90) the phases' fwd_wgmma plans copy their sub-filters into the workspace
    (filter_kc_swap, one phase after the other in the same bytes): the plan reports the largest, the
    query too, and dx is the reference."""
    if handle.arch != "sm_90":
        pytest.skip("fwd_wgmma is built for sm_90 only")
    monkeypatch.setattr(tuning.conv, "WGM_BWD_SWAP", True)
    make, planned = _make(handle, PHASE_CASES[0], BF16)

    def run(pb, alpha, beta):
        assert _backward_data_tc_run(handle, pb, alpha, beta) == planned["workspace"] > 0

    check_backward_data(rng, make, BF16, run, "phase backward data, swapped filter", MODES, reproducible=True)


def test_phase_backward_data_find(handle, rng):
    """Find...Ex times ALGO_1's phase plan on a strided problem (SUCCESS, a time, no workspace), and the
    dx it leaves (ALGO_1 last or not) is then recomputed exactly by the plain call."""
    pb = _tc_problem(PHASE_CASES[0], BF16, XCORR)
    pb.w.random(rng), pb.y.random(rng)
    ws, n = _workspace(64 << 20)
    res = pydnn.find_convolution_backward_data_algorithm_ex(handle, pb.wdesc, pb.w.ptr, pb.y.desc, pb.y.ptr, pb.conv,
                                                            pb.x.desc, pb.x.ptr, 6, ws.ptr, n)
    a1 = [p for p in res if p.algo == BWD_D1]
    assert a1 and a1[0].status == pydnn.PYDNN_STATUS_SUCCESS and a1[0].time > 0 and a1[0].memory == 0
    pb.x.poison()
    _backward_data_tc_run(handle, pb, 1.0, 0.0)
    assert not np.isnan(pb.x.download()).any()
