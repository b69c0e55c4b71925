"""fwd_tma (ptx/conv_tma.cu, pydnn/ops/convolution/conv_tma.py; tuning.conv.FWD_TMA): the warp-specialized TMA
+ mbarrier forward on the GPU against the float64 reference, y poisoned first and checked untouched around
it: channel tails (C % 64, zero-filled by the TMA unit), K tails, padding past the image's edges (negative box
coordinates), dilation, 1x1, 3x2 / 5x5 filters, x with padded pixel strides, several images a box (7x7),
both modes (CONVOLUTION flips the filter's taps), alpha / beta; strided forwards (FWD_TMA_STRIDED: strides 2 and 3,
1x1 / 2, dilation, strides apart, the maps encoding); the persistent walk (a grid of 3 blocks over
many items: the ring's stages and phases running on across items); the fused bias + activation (+ z in NHWC
and NCHW) through ConvolutionBiasActivationForward."""
import numpy as np
import pytest

import pydnn
from devtensor import assert_close
from pydnn import tuning
from pydnn.ops.convolution import conv_tma as CTMA, plans as CP, problem as CPb, tensor_core as CT
from pydnn.reference import convolution as ref
from test_convolution_algos_gpu import check_bias_activation
from test_convolution_gpu import BF16, F16, NHWC, XCORR, _tc_problem, check_forward

pytestmark = pytest.mark.gpu

FWD_PRE = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
WGM_TILE = (128, 128, 4, 1, 1)   # the call's plan forced onto fwd_wgmma, which FWD_TMA replaces

CASES = [  # xdims, k, filt, pad, stride, dil, groups, layout, filter format
    ((2, 8, 13, 11), 10, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),       # C 8, K 10: one partial tile
    ((4, 72, 15, 15), 64, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),      # 1x1, channel tail 72 % 64
    ((2, 16, 6, 7), 16, (3, 2), (2, 1), (1, 1), (1, 1), 1, "pad8", NHWC),        # padded pixel strides, pad 2
    ((2, 64, 20, 20), 64, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),      # the ResNet shape, small N
    ((2, 128, 9, 7), 192, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),      # 2 channel blocks, K tail
    ((3, 24, 12, 10), 136, (3, 3), (2, 2), (1, 1), (2, 2), 1, "nhwc", NHWC),     # dilation 2
    ((2, 16, 11, 9), 32, (5, 5), (2, 2), (1, 1), (1, 1), 1, "nhwc", NHWC),       # 5x5
    ((5, 64, 7, 7), 128, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),       # several images a box
    ((1, 32, 9, 40), 24, (3, 3), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),       # no padding, wide image
]


def _need_sm90(handle):
    if handle.arch != CTMA.ARCH:
        pytest.skip(f"fwd_tma is built for {CTMA.ARCH} only (this device: {handle.arch})")


def _on(monkeypatch):
    monkeypatch.setattr(tuning.conv, "FWD_TMA", "always")
    monkeypatch.setattr(tuning.conv, "STREAM_1X1", False)   # (a 1x1 case on fwd_tma, not the streaming kernels)
    monkeypatch.setitem(tuning.conv.TC_FORCE, CPb.DIR_FWD, WGM_TILE)


def _planned_on_tma(handle, pb):
    pl = CP.new_plan(handle, CPb.DIR_FWD, FWD_PRE, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
    assert isinstance(pl, CTMA.TmaPlan), f"{type(pl).__name__} {getattr(pl, 'gemm_expr', '')}"
    assert "fwd_wgmma<" in pl.fallback.gemm_expr
    q = pl.q
    assert q.tw * q.th * q.tn == 128
    return pl


@pytest.mark.parametrize("case", CASES, ids=[f"c{i}" for i in range(len(CASES))])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "half"])
def test_tma_forward(handle, rng, monkeypatch, case, dtype):
    _need_sm90(handle)
    _on(monkeypatch)
    check_forward(handle, rng, lambda mode: _tc_problem(case, dtype, mode), dtype, FWD_PRE, "fwd_tma",
                  before=lambda pb: _planned_on_tma(handle, pb))


@pytest.mark.parametrize("bn", CTMA.BNS)
@pytest.mark.parametrize("case", [CASES[4], CASES[5], CASES[1]], ids=["k192", "dil", "c72"])
def test_tma_tile_widths(handle, rng, monkeypatch, case, bn):
    """Each tile width (tuning.conv.FWD_TMA_BN: 64, 128, 256) on K tails (192, 136, 64)."""
    _need_sm90(handle)
    _on(monkeypatch)
    monkeypatch.setattr(tuning.conv, "FWD_TMA_BN", bn)

    def planned(pb):
        assert _planned_on_tma(handle, pb).bn == bn

    check_forward(handle, rng, lambda mode: _tc_problem(case, BF16, mode), BF16, FWD_PRE, f"fwd_tma BN {bn}",
                  before=planned)


@pytest.mark.parametrize("case", [CASES[3], CASES[4], CASES[7]], ids=["r20", "k192", "img7"])
def test_tma_persistent_walk(handle, rng, monkeypatch, case):
    """At most 3 blocks (fewer than the items) walk every item (each many K tiles through the 4-stage ring,
    phases wrapping across items)."""
    _need_sm90(handle)
    _on(monkeypatch)
    pb = _tc_problem(case, BF16, XCORR)
    pl = _planned_on_tma(handle, pb)
    assert pl.items >= 2
    pl.grid = (min(3, pl.items - 1), 1, 1)
    x, w = pb.x.random(rng), pb.w.random(rng)
    pb.y.poison()
    CP.run_plan(handle, pl, pb.x.ptr, pb.w.ptr, pb.y.ptr, 0, 1.0, 0.0)
    want = ref.forward(1.0, x, w, 0.0, None, *pb.args())
    assert_close(pb.y.download(), want, BF16, "fwd_tma 3 blocks", scale=ref.forward_raw(np.abs(x), np.abs(w), *pb.args()))
    pb.y.check_untouched()


STRIDED = [  # tuning.conv.FWD_TMA_STRIDED: x's box walks every stride-th pixel (the map's element strides)
    ((2, 72, 13, 15), 64, (3, 3), (1, 1), (2, 2), (1, 1), 1, "nhwc", NHWC),     # 3x3 / 2, odd sizes, channel tail
    ((3, 64, 14, 14), 136, (1, 1), (0, 0), (2, 2), (1, 1), 1, "nhwc", NHWC),    # 1x1 / 2 (ResNet's downsample), K tail
    ((2, 16, 17, 23), 24, (5, 5), (2, 2), (3, 3), (2, 2), 1, "pad8", NHWC),     # stride 3, dilation, padded strides
    ((9, 128, 7, 7), 192, (3, 3), (1, 1), (2, 2), (1, 1), 1, "nhwc", NHWC),     # 4 x 4 outputs: many images a box
    ((1, 8, 6, 300), 16, (3, 3), (1, 1), (2, 1), (1, 1), 1, "nhwc", NHWC),      # strides 2 / 1 apart, a wide row
]


@pytest.mark.parametrize("case", STRIDED, ids=[f"s{i}" for i in range(len(STRIDED))])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "half"])
def test_tma_strided_forward(handle, rng, monkeypatch, case, dtype):
    _need_sm90(handle)
    _on(monkeypatch)
    monkeypatch.setattr(tuning.conv, "FWD_TMA_STRIDED", "always")
    check_forward(handle, rng, lambda mode: _tc_problem(case, dtype, mode), dtype, FWD_PRE, "fwd_tma strided",
                  before=lambda pb: _planned_on_tma(handle, pb))


@pytest.mark.parametrize("bn", CTMA.BNS)
@pytest.mark.parametrize("case", [STRIDED[0], STRIDED[2]], ids=["s0", "s2"])
def test_tma_strided_maps_encode_and_walk(handle, rng, monkeypatch, case, bn):
    """The strided map encodes (no silent fallback to fwd_wgmma: the maps' caches hold this call's addresses) and
    3 blocks walk every item at each tile width."""
    _need_sm90(handle)
    _on(monkeypatch)
    monkeypatch.setattr(tuning.conv, "FWD_TMA_STRIDED", "always")
    monkeypatch.setattr(tuning.conv, "FWD_TMA_BN", bn)
    pb = _tc_problem(case, BF16, XCORR)
    pl = _planned_on_tma(handle, pb)
    assert pl.maps[0].map.estrides is not None
    pl.grid = (min(3, pl.items), 1, 1)
    x, w = pb.x.random(rng), pb.w.random(rng)
    pb.y.poison()
    CP.run_plan(handle, pl, pb.x.ptr, pb.w.ptr, pb.y.ptr, 0, 1.0, 0.0)
    assert pb.x.ptr in pl.maps[0].known and pb.w.ptr in pl.maps[1].known, "the maps did not encode"
    want = ref.forward(1.0, x, w, 0.0, None, *pb.args())
    assert_close(pb.y.download(), want, BF16, f"fwd_tma strided BN {bn}",
                 scale=ref.forward_raw(np.abs(x), np.abs(w), *pb.args()))
    pb.y.check_untouched()


ONE_BY_ONE = [  # TMA_1X1: direct 1x1 GEMM plans on gemm_tc (short reductions) moved to fwd_tma; (x dims, K)
    ((3, 64, 9, 11), 256),      # reduction 64, 2 output tiles of 128 (forward) / dx 64 <- dy 256 (backward data)
    ((2, 72, 7, 13), 136),      # channel tails both ways (C 72, K 136)
    ((5, 128, 6, 6), 64),       # reduction 128 -> 64 outputs; several images a box
]


def _one_by_one(case, dtype, mode):
    xd, k = case
    return _tc_problem((xd, k, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC), dtype, mode)


@pytest.mark.parametrize("case", ONE_BY_ONE, ids=["c64", "tails", "c128"])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "half"])
def test_tma_1x1_gemm_forward(handle, rng, monkeypatch, case, dtype):
    """FWD_ALGO_GEMM's direct 1x1 plan on fwd_tma (TMA_1X1), both modes, alpha / beta, the maps encoding."""
    _need_sm90(handle)
    monkeypatch.setattr(tuning.conv, "TMA_1X1", True)
    gemm = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_GEMM

    def planned(pb):
        pl = CP.new_plan(handle, CPb.DIR_FWD, gemm, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
        if not isinstance(pl, CTMA.TmaPlan):
            pytest.skip(f"the GEMM plan runs {getattr(pl.mm[0].fast, 'expr', '?')} here (not gemm_tc)")
        pl.maps[0].get(pb.x.ptr)
        pl.maps[1].get(pb.w.ptr)

    check_forward(handle, rng, lambda mode: _one_by_one(case, dtype, mode), dtype, gemm, "fwd_tma 1x1 (GEMM)",
                  before=planned)


@pytest.mark.parametrize("case", ONE_BY_ONE, ids=["c64", "tails", "c128"])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "half"])
def test_tma_1x1_gemm_backward_data(handle, rng, monkeypatch, case, dtype):
    """BWD_DATA_ALGO_0's direct 1x1 plan on fwd_tma (TMA_1X1: DgradTmaPlan reading w directly): dx poisoned or
    blended (alpha / beta), both modes."""
    from test_convolution_gpu import BWD_DATA_MODES, check_backward_data
    _need_sm90(handle)
    monkeypatch.setattr(tuning.conv, "TMA_1X1", True)
    bd0 = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_0
    (n, c, hh, ww), k = case
    case = ((n, k, hh, ww), c)   # dx has the forward's K channels here: dy's c -> dx's k, a reduction over c

    def make(mode):
        pb = _one_by_one(case, dtype, mode)
        pl = CP.new_plan(handle, CPb.DIR_BWD_DATA, bd0, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
        if not isinstance(pl, CTMA.DgradTmaPlan):
            pytest.skip(f"{type(pl).__name__}: not moved here")
        pl.maps[0].get(pb.y.ptr)
        pl.maps[1].get(pb.w.ptr)
        return pb

    def run(pb, alpha, beta):
        pydnn.convolution_backward_data(handle, alpha, pb.wdesc, pb.w.ptr, pb.y.desc, pb.y.ptr, pb.conv, bd0, 0, 0,
                                        beta, pb.x.desc, pb.x.ptr)

    check_backward_data(rng, make, dtype, run, "fwd_tma 1x1 backward data (ALGO_0)",
                        BWD_DATA_MODES + ((XCORR, 0.5, -1.0),), reproducible=True)


@pytest.mark.parametrize("bn", CTMA.BNS)
@pytest.mark.parametrize("case", [CASES[4], CASES[5], CASES[7], STRIDED[1]], ids=["k192", "k136", "img7", "s1x1"])
def test_tma_wide_store(handle, rng, monkeypatch, case, bn):
    """FWD_TMA_WIDE: the plain epilogue's 16-byte stores (a quad's transpose) on K tails (192, 136: a group of 8
    channels in y or past K whole), rows past the image's edges, each tile width; the blended call (beta) keeps the
    per-pair epilogue. K 10 (not a multiple of 8) does not take it."""
    _need_sm90(handle)
    _on(monkeypatch)
    monkeypatch.setattr(tuning.conv, "FWD_TMA_STRIDED", "always")
    monkeypatch.setattr(tuning.conv, "FWD_TMA_WIDE", True)
    monkeypatch.setattr(tuning.conv, "FWD_TMA_BN", bn)

    def planned(pb):
        assert _planned_on_tma(handle, pb).wide_ok

    check_forward(handle, rng, lambda mode: _tc_problem(case, BF16, mode), BF16, FWD_PRE, f"fwd_tma wide BN {bn}",
                  before=planned)
    assert not _planned_on_tma(handle, _tc_problem(CASES[0], BF16, XCORR)).wide_ok


@pytest.mark.parametrize("bn", CTMA.BNS)
@pytest.mark.parametrize("case", [CASES[4], CASES[5]], ids=["k192", "k136"])
def test_tma_wide_fused_bias_relu(handle, rng, monkeypatch, case, bn):
    """The fused bias (+ ReLU) without z on the 16-byte store (the bias added to the pairs before the quad's
    transpose, its reads guarded at the K tail), IDENTITY and RELU at alpha2 0; with z (alpha2 != 0) the pair path."""
    _need_sm90(handle)
    _on(monkeypatch)
    monkeypatch.setattr(tuning.conv, "FWD_TMA_WIDE", True)
    monkeypatch.setattr(tuning.conv, "FWD_TMA_BN", bn)
    pb = _tc_problem(case, BF16, XCORR)
    assert _planned_on_tma(handle, pb).wide_ok
    check_bias_activation(handle, rng, case, BF16, FWD_PRE,
                          ((pydnn.PYDNN_ACTIVATION_RELU, 0.0, 0.0), (pydnn.PYDNN_ACTIVATION_IDENTITY, 0.0, 0.0),
                           (pydnn.PYDNN_ACTIVATION_RELU, 0.0, -0.75)),
                          "nhwc", lambda pb: (pydnn.DeviceArray((1,), np.uint8), 0), f"fwd_tma wide fused BN {bn}")


@pytest.mark.parametrize("case", ONE_BY_ONE, ids=["c64", "tails", "c128"])
def test_tma_wide_1x1_backward_data(handle, rng, monkeypatch, case):
    """The 16-byte store into dx (TMA_1X1's DgradTmaPlan), the persistent walk on 3 blocks."""
    _need_sm90(handle)
    monkeypatch.setattr(tuning.conv, "TMA_1X1", True)
    monkeypatch.setattr(tuning.conv, "FWD_TMA_WIDE", True)
    (n, c, hh, ww), k = case
    pb = _one_by_one(((n, k, hh, ww), c), BF16, XCORR)
    pl = CP.new_plan(handle, CPb.DIR_BWD_DATA, pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_0, pb.conv, pb.x.desc, pb.wdesc,
                     pb.y.desc)
    assert isinstance(pl, CTMA.DgradTmaPlan) and pl.wide_ok
    pl.grid = (min(3, pl.items), 1, 1)
    dy, w = pb.y.random(rng), pb.w.random(rng)
    pb.x.poison()
    CP.run_plan(handle, pl, pb.y.ptr, pb.w.ptr, pb.x.ptr, 0, 1.0, 0.0)
    assert pb.y.ptr in pl.maps[0].known and pb.w.ptr in pl.maps[1].known, "the maps did not encode"
    want = ref.backward_data_raw(w, dy, pb.x.dims[2:], *pb.args())
    assert_close(pb.x.download(), want, BF16, "fwd_tma wide dx",
                 scale=ref.backward_data_raw(np.abs(w), np.abs(dy), pb.x.dims[2:], *pb.args()))
    pb.x.check_untouched()


@pytest.mark.parametrize("z_layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("case", [CASES[0], CASES[4]], ids=["c0", "k192"])
def test_tma_bias_activation(handle, rng, monkeypatch, case, z_layout):
    _need_sm90(handle)
    _on(monkeypatch)
    pb = _tc_problem(case, BF16, XCORR)
    _planned_on_tma(handle, pb)
    check_bias_activation(handle, rng, case, BF16, FWD_PRE,
                          ((pydnn.PYDNN_ACTIVATION_RELU, 0.0, 0.5), (pydnn.PYDNN_ACTIVATION_IDENTITY, 0.0, 0.0),
                           (pydnn.PYDNN_ACTIVATION_CLIPPED_RELU, 1.5, -1.0), (pydnn.PYDNN_ACTIVATION_TANH, 0.0, 1.0)),
                          z_layout, lambda pb: (pydnn.DeviceArray((1,), np.uint8), 0), "fwd_tma bias+act")


def test_tma_off_keeps_wgmma(handle, monkeypatch):
    """FWD_TMA off: the call's plan is fwd_wgmma's (or whatever the model picks), not fwd_tma."""
    monkeypatch.setattr(tuning.conv, "FWD_TMA", False)
    pb = _tc_problem(CASES[3], BF16, XCORR)
    pl = CP.new_plan(handle, CPb.DIR_FWD, FWD_PRE, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
    assert not isinstance(pl, CTMA.TmaPlan)
    assert CT is not None
