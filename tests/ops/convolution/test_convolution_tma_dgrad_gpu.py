"""Backward data on fwd_tma (conv_tma.plan_dgrad_tma; tuning.conv.DGRAD_TMA): the forward of dy on the warp-specialized
TMA + mbarrier kernel, B read MN-major from the KRSC filter by TMA boxes (direct) or K-major from filter_kc_swap's
copy in the workspace (swap), against the float64 reference on the GPU: dx poisoned (beta 0) or random (beta !=
0, alpha / beta blending), both modes (the flip), padding 0 / 1 / 2 and past R - 1 (a negative padding of the
forward of dy), dilation, 5x5 / 3x2 filters, channel tails of dy's K (the TMA zero fill) and dx's C (the
epilogue's column guard, partial B boxes), padded dx strides, several images a box; each tile width; the
persistent walk on 3 blocks; bitwise reproducible; FP16 and BF16."""
import numpy as np
import pytest

import pydnn
from devtensor import assert_close
from pydnn import tuning
from pydnn.ops.convolution import conv_tma as CTMA, plans as CP, problem as CPb, tensor_core as CT
from pydnn.reference import convolution as ref
from test_convolution_gpu import (BF16, BWD_D1, BWD_DATA_MODES, CONV, F16, NHWC, XCORR, _backward_data_tc_run,
                                  _tc_problem, check_backward_data)

pytestmark = pytest.mark.gpu

WGM_TILE = (128, 128, 4, 1, 1)   # the replaced plan forced onto fwd_wgmma (the model takes it only for K % 64 == 0)

CASES = [  # xdims (dx), k (dy's channels), filt, pad, stride, dil, groups, layout, filter format
    ((2, 8, 13, 11), 16, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),      # C 8: one partial 64-wide B box
    ((3, 24, 9, 7), 136, (3, 3), (0, 2), (1, 1), (1, 2), 1, "nhwc", NHWC),      # K 136: a dy channel tail, dilation
    ((2, 136, 7, 9), 72, (3, 3), (2, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),      # C 136: 3 B boxes, a tail
    ((2, 64, 11, 11), 64, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),     # the ResNet shape, small
    ((2, 16, 6, 7), 16, (3, 2), (2, 1), (1, 1), (1, 1), 1, "pad8", NHWC),       # padded dx strides, pad' 0
    ((2, 64, 9, 11), 256, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),     # 1x1, 4 K tiles
    ((3, 128, 7, 9), 64, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),      # 128 <- 64: 2 B boxes a K tile
    ((1, 192, 5, 7), 128, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),     # C 192: a half-empty 128-wide tile
    ((2, 32, 11, 9), 48, (5, 5), (2, 2), (1, 1), (1, 1), 1, "nhwc", NHWC),      # 5x5
    ((6, 64, 7, 7), 128, (3, 3), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),      # no padding (pad' 2), images a box
]


def _need_sm90(handle):
    if handle.arch != CTMA.ARCH:
        pytest.skip(f"fwd_tma is built for {CTMA.ARCH} only (this device: {handle.arch})")


def _on(monkeypatch, swap=False):
    monkeypatch.setattr(tuning.conv, "DGRAD_TMA", "always")
    monkeypatch.setattr(tuning.conv, "WGM_BWD_SWAP", swap)
    monkeypatch.setitem(tuning.conv.TC_FORCE, CPb.DIR_BWD_DATA, WGM_TILE)


def _encodes(pl, dy_ptr, w_ptr):
    """The plan's maps encode on this driver (else its call would run the fwd_wgmma fallback, and a test that
    passed would not have run fwd_tma): dy's, and the filter's at w_ptr (the swap's: any 16-byte aligned base)."""
    pl.maps[0].get(dy_ptr)
    pl.maps[1].get(w_ptr)


def _planned(handle, pb, swap, bn=None):
    pl = CP.new_plan(handle, CPb.DIR_BWD_DATA, BWD_D1, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
    assert isinstance(pl, CTMA.DgradTmaPlan), f"{type(pl).__name__} {getattr(pl, 'gemm_expr', '')}"
    assert (pl.swap_plan is not None) == swap and pl.expr.endswith(", 1>") != swap
    assert (pl.workspace > 0) == swap
    if bn is not None:
        assert pl.bn == bn
    _encodes(pl, pb.y.ptr, pb.w.ptr)
    return pl


@pytest.mark.parametrize("case", CASES, ids=[f"c{i}" for i in range(len(CASES))])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "half"])
@pytest.mark.parametrize("route", ["direct", "swap"])
def test_tma_backward_data(handle, rng, monkeypatch, case, dtype, route):
    _need_sm90(handle)
    swap = route == "swap"
    _on(monkeypatch, swap)
    planned = {}

    def make(mode):
        pb = _tc_problem(case, dtype, mode)
        planned["workspace"] = _planned(handle, pb, swap).workspace
        return pb

    def run(pb, alpha, beta):
        assert _backward_data_tc_run(handle, pb, alpha, beta) == planned["workspace"]

    check_backward_data(rng, make, dtype, run, f"fwd_tma backward data ({route})",
                        BWD_DATA_MODES + ((XCORR, 0.5, -1.0),), reproducible=True)


@pytest.mark.parametrize("bn", CTMA.BNS)
@pytest.mark.parametrize("case", [CASES[2], CASES[7], CASES[1]], ids=["c136", "c192", "k136"])
def test_tma_backward_data_tile_widths(handle, rng, monkeypatch, case, bn):
    """Each tile width (FWD_TMA_BN: 64, 128, 256: 1, 2, 4 B boxes a K tile) on dx channel tails."""
    _need_sm90(handle)
    _on(monkeypatch)
    monkeypatch.setattr(tuning.conv, "FWD_TMA_BN", bn)

    def make(mode):
        pb = _tc_problem(case, BF16, mode)
        _planned(handle, pb, False, bn)
        return pb

    check_backward_data(rng, make, BF16, lambda pb, a, b: _backward_data_tc_run(handle, pb, a, b),
                        f"fwd_tma backward data BN {bn}")


@pytest.mark.parametrize("case", [CASES[3], CASES[6], CASES[9]], ids=["r11", "c128", "img7"])
def test_tma_backward_data_persistent_walk(handle, rng, monkeypatch, case):
    """At most 3 blocks (fewer than the items) walk every item, the ring's phases running on across items."""
    _need_sm90(handle)
    _on(monkeypatch)
    pb = _tc_problem(case, BF16, CONV)
    pl = _planned(handle, pb, False)
    assert pl.items >= 2
    pl.grid = (min(3, pl.items - 1), 1, 1)
    w, dy = pb.w.random(rng), pb.y.random(rng)
    pb.x.poison()
    CP.run_plan(handle, pl, pb.y.ptr, pb.w.ptr, pb.x.ptr, 0, 1.0, 0.0)
    want = ref.backward_data(1.0, w, dy, 0.0, np.zeros(pb.x.dims), *pb.args())
    scale = ref.backward_data_raw(np.abs(w), np.abs(dy), pb.x.dims[2:], *pb.args())
    assert_close(pb.x.download(), want, BF16, "fwd_tma backward data, 3 blocks", scale=scale)
    pb.x.check_untouched()


def test_tma_backward_data_true_takes_the_model_plan(handle, rng, monkeypatch):
    """DGRAD_TMA True (the default; no forced tiling): the model's own fwd_wgmma plan of a C >= 64 layer is
    replaced (36 K tiles: not one slower_than_replaced keeps), and the call through the public API is right."""
    _need_sm90(handle)
    monkeypatch.setattr(tuning.conv, "DGRAD_TMA", True)
    case = ((2, 64, 9, 10), 256, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC)

    def make(mode):
        pb = _tc_problem(case, BF16, mode)
        _planned(handle, pb, False)
        return pb

    check_backward_data(rng, make, BF16, lambda pb, a, b: _backward_data_tc_run(handle, pb, a, b),
                        "fwd_tma backward data (DGRAD_TMA True)")
    assert CT is not None


def test_tma_backward_data_under_a_wave_at_bn64(handle, rng, monkeypatch):
    """DGRAD_TMA True where slower_than_replaced's under-a-wave mark used to keep fwd_wgmma (N8 1x1 512 <- 256 @28: 98
    items of 256 for 132 SMs): fwd_tma at the 64-wide tile (conv_tma.UNDER_WAVE), through the public API."""
    _need_sm90(handle)
    monkeypatch.setattr(tuning.conv, "DGRAD_TMA", True)
    case = ((8, 512, 28, 28), 256, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC)

    def make(mode):
        pb = _tc_problem(case, BF16, mode)
        pl = CP.new_plan(handle, CPb.DIR_BWD_DATA, BWD_D1, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
        assert isinstance(pl, CTMA.DgradTmaPlan) and pl.bn == 64, type(pl).__name__
        _encodes(pl, pb.y.ptr, pb.w.ptr)
        return pb

    check_backward_data(rng, make, BF16, lambda pb, a, b: _backward_data_tc_run(handle, pb, a, b),
                        "fwd_tma backward data BN 64 under a wave", reproducible=True)


PHASE_CASES = [  # strided: dgrad_phases.py's stride-1 phases, each on fwd_tma's direct read (DGRAD_TMA_PHASES)
    ((2, 64, 13, 11), 64, (3, 3), (1, 1), (2, 2), (1, 1), 1, "nhwc", NHWC),     # ResNet 3x3/2, odd sizes
    ((2, 32, 9, 10), 128, (1, 1), (0, 0), (2, 2), (1, 1), 1, "nhwc", NHWC),     # 1x1/2: one phase + the fill
    ((2, 24, 11, 7), 16, (3, 2), (2, 0), (3, 2), (1, 1), 1, "pad8", NHWC),      # stride 3 / 2, padded NHWC dx
    ((1, 16, 12, 9), 8, (3, 3), (2, 1), (2, 2), (2, 1), 1, "nhwc", NHWC),       # dilation 2 with stride 2
    ((3, 136, 11, 9), 256, (3, 3), (1, 1), (2, 2), (1, 1), 1, "nhwc", NHWC),    # C 136: 3 B boxes + a tail
    ((2, 72, 15, 13), 192, (5, 5), (2, 2), (2, 2), (1, 1), 1, "nhwc", NHWC),    # 5x5/2, K 192
]


@pytest.mark.parametrize("case", PHASE_CASES, ids=[f"p{i}" for i in range(len(PHASE_CASES))])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "half"])
def test_tma_phases(handle, rng, monkeypatch, case, dtype):
    """A strided backward data whose phases run fwd_tma (B through each phase's 4-d sub-filter map at its filter
    offset, dx through the phase's offset and strides): every phase with taps planned on it."""
    from pydnn.ops.convolution import dgrad_phases as DP
    _need_sm90(handle)
    monkeypatch.setattr(tuning.conv, "DGRAD_TMA_PHASES", "always")
    monkeypatch.setitem(tuning.conv.TC_FORCE, CPb.DIR_BWD_DATA, WGM_TILE)

    def make(mode):
        pb = _tc_problem(case, dtype, mode)
        pl = CP.new_plan(handle, CPb.DIR_BWD_DATA, BWD_D1, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
        assert isinstance(pl, DP.PhasePlan) and pl.subs and pl.workspace == 0
        assert all(isinstance(sp, CTMA.DgradTmaPlan) for sp, _, _, _ in pl.subs)
        for sp, _, w_off, _ in pl.subs:   # each phase's sub-filter view (strides past its extents) encodes
            _encodes(sp, pb.y.ptr, pb.w.ptr + w_off * pl.itemsize)
        return pb

    check_backward_data(rng, make, dtype, lambda pb, a, b: _backward_data_tc_run(handle, pb, a, b),
                        "fwd_tma phases", BWD_DATA_MODES + ((XCORR, 0.5, -1.0),), reproducible=True)
