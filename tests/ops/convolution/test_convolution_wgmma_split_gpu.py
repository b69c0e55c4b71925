"""fwd_wgmma's split-K on the GPU (Hopper) against the float64 reference: forward and stride-1 backward data
with forced slice counts (tuning.conv.WGM_SPLIT) on both model tiles, slices that start inside a tap's
channel blocks, channel tails, 1-d / 3-d, stride and dilation; the fused bias + activation (+ z) through
fwd_split_fold; alpha / beta; outputs poisoned (beta 0) and their gaps untouched; bitwise reproducible;
and the model's own split on a few-block layer. The workspace is what the query reports (the partials)."""
import numpy as np
import pytest

import pydnn
from devtensor import DevTensor, assert_close
from pydnn import tuning
from pydnn.ops.convolution import plans as CP, problem as CPb, tensor_core as CT
from pydnn.reference import convolution as ref
from test_convolution_gpu import (ACTS, BF16, BWD_D1, F16, FWD_PRE, NHWC, XCORR, _backward_data_tc_run,
                                  _same_bits_again, _strides, _tc_problem, _workspace, check_backward_data,
                                  check_forward)

pytestmark = pytest.mark.gpu

SPLIT_FWD_CASES = [  # xdims, k, filt, pad, stride, dil, groups, layout, filter format
    ((2, 64, 20, 20), 64, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),      # 9 K tiles
    ((2, 128, 9, 7), 192, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),      # 2 channel blocks a tap, N tail
    ((3, 96, 11, 9), 72, (3, 3), (1, 1), (2, 2), (1, 1), 1, "nhwc", NHWC),       # channel tail, stride 2, N 72
    ((2, 256, 9, 11), 72, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),      # 1x1, 4 K tiles, M tail
    ((1, 8, 4, 5, 6), 12, (2, 3, 3), (1, 1, 0), (1, 2, 1), (2, 1, 1), 1, "nhwc", NHWC),  # 3-d: tt digits
    ((1, 40, 33), 24, (5,), (2,), (3,), (1,), 1, "nhwc", NHWC),                  # 1-d, C 40 (a tail)
    ((2, 16, 6, 7), 16, (3, 2), (2, 1), (1, 1), (1, 1), 1, "pad8", NHWC),        # padded NHWC
    ((2, 64, 13, 11), 136, (5, 5), (4, 4), (1, 1), (2, 2), 1, "nhwc", NHWC),     # 5x5 dilated, 3 N tiles of 64
]
SPLIT_BWD_CASES = [  # stride 1 (backward data as the forward of dy, B read from w as [k][c])
    ((2, 8, 13, 11), 16, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),
    ((3, 24, 9, 7), 136, (3, 3), (0, 2), (1, 1), (1, 2), 1, "nhwc", NHWC),       # K 136: a channel tail
    ((2, 136, 7, 9), 72, (3, 3), (2, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),       # C 136: 3 N tiles of 64
    ((2, 64, 9, 11), 256, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),      # 1x1, 4 K tiles
    ((1, 8, 4, 5, 6), 16, (2, 3, 3), (1, 1, 0), (1, 1, 1), (2, 1, 1), 1, "nhwc", NHWC),  # 3-d
    ((3, 64, 9, 7), 128, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),       # 2 K tiles a tap
]
SPLITS = (2, 3, 7)


def _need_wgmma(handle):
    if handle.arch != CT.WGM_ARCH:
        pytest.skip(f"fwd_wgmma is built for {CT.WGM_ARCH} only (this device: {handle.arch})")


def _force(monkeypatch, direction, tiling, splits):
    monkeypatch.setitem(tuning.conv.TC_FORCE, direction, tiling)
    monkeypatch.setattr(tuning.conv, "WGM_SPLIT", splits)


def _assert_split(pl, splits):
    assert pl.gemm_expr.startswith("pydnn::conv::fwd_wgmma<") and pl.gemm_expr.endswith(", 1>"), pl.gemm_expr
    assert pl.unit.startswith("convolution.wgmma.split."), pl.unit
    p = pl.gemm
    ktiles = p.filt[0] * p.filt[1] * p.filt[2] * -(-p.cg // 64)
    want = min(splits, ktiles)
    per = -(-ktiles // want)
    assert pl.splits == -(-ktiles // per) and pl.splits > 1 and type(pl.fold) is CPb.ConvParams
    assert pl.workspace >= pl.splits * p.gm * p.gn * 4


def _fwd_workspace(handle):
    def ws(pb):
        n = pydnn.get_convolution_forward_workspace_size(handle, pb.x.desc, pb.wdesc, pb.conv, pb.y.desc, FWD_PRE)
        assert n > 0
        return _workspace(n)
    return ws


@pytest.mark.parametrize("case", SPLIT_FWD_CASES)
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("tiling", list(CT.WGM_TILES))
@pytest.mark.parametrize("splits", SPLITS)
def test_split_forward(handle, rng, monkeypatch, case, dtype, tiling, splits):
    _need_wgmma(handle)
    _force(monkeypatch, CPb.DIR_FWD, tiling, splits)

    def planned(pb):
        _assert_split(CP.new_plan(handle, CPb.DIR_FWD, FWD_PRE, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc), splits)

    check_forward(handle, rng, lambda mode: _tc_problem(case, dtype, mode), dtype, FWD_PRE,
                  f"split forward {splits} tiling {tiling}", workspace=_fwd_workspace(handle), before=planned)


@pytest.mark.parametrize("case", SPLIT_BWD_CASES)
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("tiling", list(CT.WGM_TILES))
@pytest.mark.parametrize("splits", SPLITS)
def test_split_backward_data(handle, rng, monkeypatch, case, dtype, tiling, splits):
    _need_wgmma(handle)
    _force(monkeypatch, CPb.DIR_BWD_DATA, tiling, splits)

    def make(mode):
        pb = _tc_problem(case, dtype, mode)
        pl = CP.new_plan(handle, CPb.DIR_BWD_DATA, BWD_D1, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
        args = [a.strip() for a in pl.gemm_expr.rstrip(">").split("<", 1)[1].split(",")]
        assert len(args) == 8 and args[5] == "1" and args[7] == "1"   # <T, BN, STAGES, MINB, LEAN, BKN = 1, FB, SPLIT = 1>
        _assert_split(pl, splits)
        return pb

    check_backward_data(rng, make, dtype, lambda pb, alpha, beta: _backward_data_tc_run(handle, pb, alpha, beta),
                        f"split backward data {splits} tiling {tiling}", reproducible=True)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("case", [0, 1, 2])
@pytest.mark.parametrize("tiling", list(CT.WGM_TILES))
def test_split_bias_activation(handle, rng, monkeypatch, dtype, case, tiling):
    """ConvolutionBiasActivationForward on a split plan: fwd_split_fold applies alpha1, z (NHWC, NCHW, y
    itself), the bias and each activation (NaN propagation both ways)."""
    _need_wgmma(handle)
    _force(monkeypatch, CPb.DIR_FWD, tiling, 3)
    for i, (mode, coef) in enumerate(ACTS):
        for zkind in ("none", "nhwc", "nchw") + (("inplace", "none-propagate-nan") if i == 0 else ()):
            pb = _tc_problem(SPLIT_FWD_CASES[case], dtype, XCORR)
            _assert_split(CP.new_plan(handle, CPb.DIR_FWD, FWD_PRE, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc), 3)
            x, w = pb.x.random(rng), pb.w.random(rng)
            z = pb.y if zkind == "inplace" else DevTensor(pb.yd, dtype, _strides(pb.yd, "nchw" if zkind == "nchw"
                                                                                   else "nhwc"))
            zv = z.random(rng)
            if zkind != "inplace":
                pb.y.poison()
            bias = DevTensor((1, pb.yd[1]) + (1,) * (len(pb.yd) - 2), dtype)
            bv = bias.random(rng)
            act = pydnn.create_activation_descriptor()
            pydnn.set_activation_descriptor(act, mode, pydnn.PYDNN_PROPAGATE_NAN if zkind == "none-propagate-nan"
                                            else pydnn.PYDNN_NOT_PROPAGATE_NAN, coef)
            alpha2 = 0.0 if zkind.startswith("none") else -0.5
            n = pydnn.get_convolution_forward_workspace_size(handle, pb.x.desc, pb.wdesc, pb.conv, pb.y.desc, FWD_PRE)
            ws, n = _workspace(n)
            pydnn.convolution_bias_activation_forward(handle, 1.25, pb.x.desc, pb.x.ptr, pb.wdesc, pb.w.ptr, pb.conv,
                                                      FWD_PRE, ws.ptr, n, alpha2, z.desc, z.ptr, bias.desc, bias.ptr,
                                                      act, pb.y.desc, pb.y.ptr)
            want = ref.bias_activation_forward(1.25, x, w, alpha2, zv, bv, mode, coef, *pb.args())
            scale = 1.25 * ref.forward_raw(np.abs(x), np.abs(w), *pb.args()) + abs(alpha2) * np.abs(zv) + np.abs(bv)
            assert_close(pb.y.download(), want, dtype, f"split bias+act {mode} z {zkind} tiling {tiling}",
                         scale=scale)
            if zkind != "inplace":
                pb.y.check_untouched()


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
def test_model_split_forward_and_backward_data(handle, rng, dtype):
    """The model's own split (no switch): N2 3x3 256->256 @7, 4 blocks of 36 K tiles. Forward and backward
    data against the reference, bitwise reproducible, and a plain forward after a fused call on the same
    shape (the fused call's flags do not leak into the plain plan)."""
    _need_wgmma(handle)
    case = ((2, 256, 7, 7), 256, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC)

    def planned(pb):
        pl = CP.new_plan(handle, CPb.DIR_FWD, FWD_PRE, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
        assert pl.splits > 1, pl.gemm_expr

    check_forward(handle, rng, lambda mode: _tc_problem(case, dtype, mode), dtype, FWD_PRE, "model split forward",
                  workspace=_fwd_workspace(handle), before=planned)

    def make(mode):
        pb = _tc_problem(case, dtype, mode)
        pl = CP.new_plan(handle, CPb.DIR_BWD_DATA, BWD_D1, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
        assert pl.splits > 1, pl.gemm_expr
        return pb

    check_backward_data(rng, make, dtype, lambda pb, alpha, beta: _backward_data_tc_run(handle, pb, alpha, beta),
                        "model split backward data", reproducible=True)
    pb = _tc_problem(case, dtype, XCORR)
    x, w = pb.x.random(rng), pb.w.random(rng)
    ws, n = _fwd_workspace(handle)(pb)
    bias = DevTensor((1, pb.yd[1], 1, 1), dtype)
    bias.random(rng)
    act = pydnn.create_activation_descriptor()
    pydnn.set_activation_descriptor(act, pydnn.PYDNN_ACTIVATION_RELU, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    pydnn.convolution_bias_activation_forward(handle, 1.0, pb.x.desc, pb.x.ptr, pb.wdesc, pb.w.ptr, pb.conv, FWD_PRE,
                                              ws.ptr, n, 0.0, pb.y.desc, pb.y.ptr, bias.desc, bias.ptr, act,
                                              pb.y.desc, pb.y.ptr)

    def plain():
        pydnn.convolution_forward(handle, 1.0, pb.x.desc, pb.x.ptr, pb.wdesc, pb.w.ptr, pb.conv, FWD_PRE, ws.ptr, n,
                                  0.0, pb.y.desc, pb.y.ptr)

    pb.y.poison()
    plain()
    want = ref.forward(1.0, x, w, 0.0, None, *pb.args())
    assert_close(pb.y.download(), want, dtype, "plain after fused (model split)",
                 scale=ref.forward_raw(np.abs(x), np.abs(w), *pb.args()))
    _same_bits_again(pb.y, plain)


SPLIT_PHASE_CASES = [  # stride 2 backward data: the phases' stride-1 fwd_wgmma plans split (the phase plan's workspace)
    ((2, 64, 13, 11), 128, (3, 3), (1, 1), (2, 2), (1, 1), 1, "nhwc", NHWC),    # phases of 4 / 2 / 2 / 1 taps
    ((3, 48, 14, 14), 192, (7, 7), (3, 3), (2, 2), (1, 1), 1, "nhwc", NHWC),    # 7x7/2 (random N2 7x7/2's shape class)
]


@pytest.mark.parametrize("case", SPLIT_PHASE_CASES)
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
def test_split_phases(handle, rng, monkeypatch, case, dtype):
    """Strided backward data on dgrad_phases.py's phase plan whose fwd_wgmma phases run split (forced 3
    slices): the phases share the workspace one after the other; dx poisoned / random, both modes,
    reproducible. (Written after the last mid-session run: not yet run on a GPU.)"""
    _need_wgmma(handle)
    monkeypatch.setattr(tuning.conv, "WGM_SPLIT", 3)

    def make(mode):
        pb = _tc_problem(case, dtype, mode)
        pl = CP.new_plan(handle, CPb.DIR_BWD_DATA, BWD_D1, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
        assert type(pl).__name__ == "PhasePlan", type(pl).__name__
        split = [sp for sp, _, _, _ in pl.subs if sp.splits > 1]
        assert split and pl.workspace == max(sp.workspace for sp, _, _, _ in pl.subs)
        for sp in split:
            _assert_split(sp, 3)
        return pb

    check_backward_data(rng, make, dtype, lambda pb, alpha, beta: _backward_data_tc_run(handle, pb, alpha, beta),
                        "split phases", reproducible=True)
