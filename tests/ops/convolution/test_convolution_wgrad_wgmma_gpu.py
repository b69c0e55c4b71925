"""The wgmma backward filter (BWD_FILTER_ALGO_1 on sm_90: wgrad_tc_wgmma + conv::fold) against the float64
reference: every tile with one split (dw written by the kernel with alpha / beta) and several (fp32
partials in a poisoned workspace, folded), odd sizes (M / N / position tails, 1-d / 3-d, stride, dilation,
asymmetric padding, padded NHWC x, NCHW dw), both modes; dw poisoned first when beta == 0; bitwise
reproducible run to run; the v7 heuristic ranks it first."""
import numpy as np
import pytest

import pydnn
from devtensor import DevTensor, assert_close
from pydnn import tuning
from pydnn.ops.convolution import implicit as CI, plans as CP, problem as CPb, tensor_core as CT
from pydnn.ops.convolution import wgrad_wgmma as W
from pydnn.reference import convolution as ref
from pydnn.tensor import packed_strides
from test_convolution_gpu import check_backward_filter

pytestmark = pytest.mark.gpu

F16, BF16 = pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_BFLOAT16
NCHW, NHWC = pydnn.PYDNN_TENSOR_NCHW, pydnn.PYDNN_TENSOR_NHWC
CONV, XCORR = pydnn.PYDNN_CONVOLUTION, pydnn.PYDNN_CROSS_CORRELATION
F1 = pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1

CASES = [  # xdims, k, filt, pad, stride, dil, x layout, filter format
    ((2, 64, 9, 10), 64, (3, 3), (1, 1), (1, 1), (1, 1), "nhwc", NHWC),        # 180 positions: a K tail
    ((3, 24, 9, 10), 136, (3, 3), (1, 0), (2, 1), (1, 2), "nhwc", NHWC),       # M tail, N tail, stride, dil
    ((2, 16, 9, 9), 136, (3, 3), (1, 1), (1, 1), (1, 1), "nhwc", NCHW),        # NCHW dw
    ((2, 8, 5, 6), 8, (3, 3), (0, 2), (1, 2), (2, 1), "nhwc", NHWC),           # tiny: one partial tile
    ((2, 16, 6, 7), 16, (3, 2), (2, 1), (1, 1), (1, 1), "pad8", NHWC),         # padded NHWC x
    ((1, 8, 4, 5, 6), 16, (2, 3, 3), (1, 1, 0), (1, 2, 1), (2, 1, 1), "nhwc", NHWC),  # 3-d
    ((1, 40, 33), 24, (5,), (2,), (3,), (1,), "nhwc", NHWC),                   # 1-d
    ((2, 128, 9, 7), 192, (3, 3), (1, 1), (1, 1), (1, 1), "nhwc", NHWC),       # several tiles each way
]
# the model's choice, (a TILES / VARIANTS entry, splits), or a hybrid (cfg, 1, full, tail splits): tiles
# [0, full) unsplit, the rest split (where the case has more than `full` tiles; else one split)
TILINGS = ([None] + [(cfg, s) for cfg in W.TILES for s in (1, 3)] + [(cfg, 2) for cfg in W.VARIANTS]
           + [(W.TILES[0], 1, 3, 3), (W.TILES[2], 1, 3, 2)])


def _skip_unless_sm90(handle):
    if handle.arch != W.ARCH:
        pytest.skip(f"the wgmma backward filter runs on {W.ARCH} only (device {handle.arch})")


class Problem:
    def __init__(self, case, dtype, mode):
        xd, k, filt, pad, st, dil, layout, wfmt = case
        self.pad, self.st, self.dil, self.cross = pad, st, dil, mode == XCORR
        self.conv = pydnn.create_convolution_descriptor()
        pydnn.set_convolution_nd_descriptor(self.conv, len(pad), pad, st, dil, mode, pydnn.PYDNN_DATA_FLOAT)
        self.wd = (k, xd[1]) + tuple(filt)
        self.yd = (xd[0], k) + ref.out_dims(xd[2:], filt, pad, st, dil)
        xs = packed_strides(xd, NHWC)
        if layout == "pad8":  # channels innermost with 8 spare channels after each position
            s, acc = [0] * len(xd), xd[1] + 8
            s[1] = 1
            for i in reversed(range(2, len(xd))):
                s[i] = acc
                acc *= xd[i]
            s[0] = acc
            xs = tuple(s)
        self.x = DevTensor(xd, dtype, xs)
        self.y = DevTensor(self.yd, dtype, packed_strides(self.yd, NHWC))
        self.wdesc = pydnn.create_filter_descriptor()
        pydnn.set_filter_nd_descriptor(self.wdesc, dtype, wfmt, len(self.wd), self.wd)
        self.w = DevTensor(self.wd, dtype, self.wdesc.strides)

    def args(self):
        return self.pad, self.st, self.dil, 1, self.cross

    def plan(self, handle):
        return CP.new_plan(handle, CPb.DIR_BWD_FILTER, F1, self.conv, self.x.desc, self.wdesc, self.y.desc)

    def run(self, handle, alpha, beta):
        """The call with the workspace its query reports, poisoned (every partial must be written)."""
        need = pydnn.get_convolution_backward_filter_workspace_size(handle, self.x.desc, self.y.desc, self.conv,
                                                                    self.wdesc, F1)
        ws = pydnn.DeviceArray((max(need, 1),), np.uint8)
        ws.fill_bytes(0xFF)
        pydnn.convolution_backward_filter(handle, alpha, self.x.desc, self.x.ptr, self.y.desc, self.y.ptr, self.conv,
                                          F1, ws.ptr, need, beta, self.wdesc, self.w.ptr)
        return need


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("tiling", TILINGS)
def test_wgmma_backward_filter(handle, rng, monkeypatch, case, dtype, tiling):
    _skip_unless_sm90(handle)
    if tiling is not None:
        monkeypatch.setattr(tuning.conv_wgrad_wgmma, "FORCE", tiling)
    planned = {}

    def make(mode):
        pb = Problem(case, dtype, mode)
        pl = planned["plan"] = pb.plan(handle)
        assert isinstance(pl, W.WgradWgmmaPlan) and "wgrad_tc_wgmma<" in pl.gemm_expr
        if tiling is not None:
            assert pl.cfg == tiling[0] and pl.splits <= tiling[1]
        assert (pl.workspace > 0) == (pl.fold is not None) == any(st[0] == "fold" for st in pl.steps)
        return pb

    def run(pb, alpha, beta):
        assert pb.run(handle, alpha, beta) == planned["plan"].workspace

    check_backward_filter(rng, make, dtype, run, f"wgmma backward filter tiling {tiling}",
                          ((XCORR, 1.0, 0.0), (CONV, 0.5, -1.5)))


@pytest.mark.parametrize("tiling", [None, (W.TILES[0], 7), (W.TILES[1], 1), (W.TILES[2], 1, 3, 5)])
def test_wgmma_backward_filter_reproducible(handle, rng, monkeypatch, tiling):
    """The ResNet 64-channel shape at N = 4 (49 K tiles): the same bits run after run, the reference's
    values; the v7 heuristic ranks ALGO_1 (this kernel) first, deterministic."""
    _skip_unless_sm90(handle)
    if tiling is not None:
        monkeypatch.setattr(tuning.conv_wgrad_wgmma, "FORCE", tiling)
    pb = Problem(((4, 64, 28, 28), 64, (3, 3), (1, 1), (1, 1), (1, 1), "nhwc", NHWC), BF16, XCORR)
    assert isinstance(pb.plan(handle), W.WgradWgmmaPlan)
    if tiling is None:
        r = pydnn.get_convolution_backward_filter_algorithm_v7(handle, pb.x.desc, pb.y.desc, pb.conv, pb.wdesc, 7)
        assert r[0].algo == F1 and r[0].determinism == pydnn.PYDNN_DETERMINISTIC
    x, dy = pb.x.random(rng), pb.y.random(rng)
    outs = []
    for _ in range(3):
        pb.w.poison()
        pb.run(handle, 1.0, 0.0)
        outs.append(pb.w.buf.to_numpy().copy())
    assert all((o.view(np.uint16) == outs[0].view(np.uint16)).all() for o in outs)
    want = ref.backward_filter(1.0, x, dy, 0.0, np.zeros(pb.wd), *pb.args())
    scale = ref.backward_filter_raw(np.abs(x), np.abs(dy), pb.wd[2:], *pb.args())
    assert_close(pb.w.download(), want, BF16, f"reproducible wgmma backward filter {tiling}", scale=scale)


def test_wgmma_backward_filter_find(handle, rng):
    """FindConvolutionBackwardFilterAlgorithmEx times ALGO_1 (this kernel) among the others and leaves
    the reference's dw."""
    _skip_unless_sm90(handle)
    pb = Problem(((2, 64, 12, 12), 64, (3, 3), (1, 1), (1, 1), (1, 1), "nhwc", NHWC), BF16, XCORR)
    assert isinstance(pb.plan(handle), W.WgradWgmmaPlan)
    x, dy = pb.x.random(rng), pb.y.random(rng)
    ws = pydnn.DeviceArray((1 << 24,), np.uint8)
    res = pydnn.find_convolution_backward_filter_algorithm_ex(handle, pb.x.desc, pb.x.ptr, pb.y.desc, pb.y.ptr,
                                                              pb.conv, pb.wdesc, pb.w.ptr, 7, ws.ptr, 1 << 24)
    ok = [p for p in res if p.status == pydnn.PYDNN_STATUS_SUCCESS]
    assert F1 in [p.algo for p in ok] and all(p.time >= 0 for p in ok)
    pb.run(handle, 1.0, 0.0)
    want = ref.backward_filter(1.0, x, dy, 0.0, np.zeros(pb.wd), *pb.args())
    scale = ref.backward_filter_raw(np.abs(x), np.abs(dy), pb.wd[2:], *pb.args())
    assert_close(pb.w.download(), want, BF16, "wgmma backward filter after Find", scale=scale)
