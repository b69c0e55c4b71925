"""Grouped convolutions on the tensor cores (ops/convolution/grouped.py: filter_group_pack + the *_grouped
kernels, fold_group_diag) on the GPU against the float64 reference: forward (IMPLICIT_PRECOMP_GEMM),
backward data (ALGO_1), backward filter (ALGO_1) for groups 2, 4, 32 with C/g 4..64, odd spatial sizes,
stride 2, dilation, NHWC data with NHWC or NCHW filters, bf16 and fp16, both modes, alpha / beta, outputs
poisoned; the fused bias + activation forward; bitwise reproducibility; the plan taken is the grouped one."""
import numpy as np
import pytest

import pydnn
from devtensor import DevTensor, assert_close
from pydnn.ops.convolution import grouped as CG, plans as CP, problem as CPb
from pydnn.reference import convolution as ref

from test_convolution_gpu import (BF16, F16, FWD_PRE, BWD_D1, BWD_F1, NCHW, NHWC, XCORR, Problem, _same_bits_again,
                                  _strides, _workspace, check_backward_data, check_backward_filter, check_forward)

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _packed_path(monkeypatch):
    """This module covers grouped.py's packed supergroups: the direct kernel (grouped_direct.py, which
    ranks first where C/g == K/g <= 32) is switched off here; test_convolution_grouped_direct_* cover it."""
    from pydnn import tuning
    monkeypatch.setattr(tuning.conv, "GROUPED_DIRECT", False)

CASES = [  # xdims, k, filt, pad, stride, dil, groups, layout, filter format   (C/g, K/g; P packed groups)
    ((2, 128, 13, 11), 128, (3, 3), (1, 1), (1, 1), (1, 1), 32, "nhwc", NHWC),   # 4, 4; P 16 (ResNeXt stage 1)
    ((2, 256, 9, 7), 256, (3, 3), (1, 1), (1, 1), (1, 1), 32, "nhwc", NHWC),     # 8, 8; P 8
    ((3, 512, 7, 9), 512, (3, 3), (1, 1), (2, 2), (1, 1), 32, "nhwc", NHWC),     # 16, 16; P 4, stride 2
    ((2, 1024, 5, 3), 1024, (3, 3), (1, 1), (1, 1), (1, 1), 32, "nhwc", NHWC),   # 32, 32; P 2
    ((2, 64, 11, 13), 64, (3, 3), (1, 1), (1, 1), (1, 1), 2, "nhwc", NCHW),      # 32, 32; NCHW filter
    ((2, 256, 9, 9), 256, (3, 3), (1, 1), (1, 1), (1, 1), 4, "nhwc", NHWC),      # 64, 64; P 1 (4 supergroups)
    ((2, 64, 10, 7), 32, (3, 3), (1, 1), (2, 2), (1, 1), 4, "nhwc", NHWC),       # 16, 8; P 4; K < C, stride 2
    ((2, 64, 7, 7), 128, (1, 1), (0, 0), (1, 1), (1, 1), 2, "nhwc", NHWC),       # 1x1, 32, 64: fwd_tc_grouped
    ((2, 96, 9, 11), 96, (3, 3), (2, 0), (1, 1), (2, 1), 4, "nhwc", NCHW),       # 24, 24; P 2 (48): dilation
    ((1, 32, 6, 5), 64, (3, 3), (1, 1), (2, 1), (1, 1), 4, "nhwc", NHWC),        # 8, 16; P 4
]
IDS = [f"c{c[0][1]}k{c[1]}g{c[6]}" + ("s2" if 2 in c[4] else "") + ("nchwf" if c[8] == NCHW else "")
       + (f"f{c[2][0]}" if c[2][0] != 3 else "") for c in CASES]


def _grouped_plan(handle, pb, direction, algo):
    """The grouped plan; strided backward data runs as the stride's phases (dgrad_phases.py), each phase a
    grouped plan."""
    from pydnn.ops.convolution import dgrad_phases as D

    pl = CP.new_plan(handle, direction, algo, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
    if type(pl) is D.PhasePlan:
        assert direction == CPb.DIR_BWD_DATA and max(pb.conv.stride) > 1, type(pl).__name__
        for sp, _, _, _ in pl.subs:
            assert type(sp) is CG.GroupedPlan, f"{direction} phase: {type(sp).__name__}"
        return pl
    assert type(pl) is CG.GroupedPlan, f"{direction}: {type(pl).__name__}"
    return pl


@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_grouped_forward(handle, rng, case, dtype):
    def before(pb):
        _grouped_plan(handle, pb, CPb.DIR_FWD, FWD_PRE)

    def ws(pb):
        return _workspace(pydnn.get_convolution_forward_workspace_size(handle, pb.x.desc, pb.wdesc, pb.conv,
                                                                       pb.y.desc, FWD_PRE))

    check_forward(handle, rng, lambda mode: Problem(case, dtype, mode), dtype, FWD_PRE, "grouped forward",
                  workspace=ws, before=before)


@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_grouped_backward_data(handle, rng, case, dtype):
    def run(pb, alpha, beta):
        _grouped_plan(handle, pb, CPb.DIR_BWD_DATA, BWD_D1)
        need = pydnn.get_convolution_backward_data_workspace_size(handle, pb.wdesc, pb.y.desc, pb.conv, pb.x.desc,
                                                                  BWD_D1)
        assert need > 0
        ws, n = _workspace(need)
        pydnn.convolution_backward_data(handle, alpha, pb.wdesc, pb.w.ptr, pb.y.desc, pb.y.ptr, pb.conv, BWD_D1,
                                        ws.ptr, n, beta, pb.x.desc, pb.x.ptr)

    check_backward_data(rng, lambda mode: Problem(case, dtype, mode), dtype, run, "grouped backward data",
                        reproducible=True)


@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_grouped_backward_filter(handle, rng, case, dtype):
    def run(pb, alpha, beta):
        pl = _grouped_plan(handle, pb, CPb.DIR_BWD_FILTER, BWD_F1)
        need = pydnn.get_convolution_backward_filter_workspace_size(handle, pb.x.desc, pb.y.desc, pb.conv, pb.wdesc,
                                                                    BWD_F1)
        assert need == pl.workspace > 0
        ws, n = _workspace(need)
        pydnn.convolution_backward_filter(handle, alpha, pb.x.desc, pb.x.ptr, pb.y.desc, pb.y.ptr, pb.conv, BWD_F1,
                                          ws.ptr, n, beta, pb.wdesc, pb.w.ptr)

    check_backward_filter(rng, lambda mode: Problem(case, dtype, mode), dtype, run, "grouped backward filter",
                          reproducible=True)


def test_grouped_backward_filter_split_reproducible(handle, rng):
    """A long reduction split over many slices (ResNeXt's 512 -> 512 at 14 x 14, N 8): the fold adds the
    partials in split order, the same bits run after run; and against the reference."""
    case = ((8, 512, 14, 14), 512, (3, 3), (1, 1), (1, 1), (1, 1), 32, "nhwc", NHWC)
    pb = Problem(case, BF16)
    pl = _grouped_plan(handle, pb, CPb.DIR_BWD_FILTER, BWD_F1)
    assert pl.splits > 1
    x, dy = pb.x.random(rng), pb.y.random(rng)
    ws, n = _workspace(pl.workspace)

    def run():
        pydnn.convolution_backward_filter(handle, 1.0, pb.x.desc, pb.x.ptr, pb.y.desc, pb.y.ptr, pb.conv, BWD_F1,
                                          ws.ptr, n, 0.0, pb.wdesc, pb.w.ptr)

    pb.w.poison()
    run()
    want = ref.backward_filter(1.0, x, dy, 0.0, np.zeros(pb.wd), *pb.args())
    scale = ref.backward_filter_raw(np.abs(x), np.abs(dy), pb.wd[2:], *pb.args())
    assert_close(pb.w.download(), want, BF16, "grouped backward filter, split", scale=scale)
    _same_bits_again(pb.w, run)


@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("case", [0, 2, 7], ids=[IDS[0], IDS[2], IDS[7]])
def test_grouped_bias_activation(handle, rng, dtype, case):
    """The fused forward on a grouped plan: the bias (and z) offset to each supergroup's channels."""
    for mode, coef in ((pydnn.PYDNN_ACTIVATION_RELU, 0.0), (pydnn.PYDNN_ACTIVATION_SIGMOID, 0.0)):
        for zkind in ("none", "nhwc"):
            pb = Problem(CASES[case], dtype, XCORR)
            x, w = pb.x.random(rng), pb.w.random(rng)
            z = DevTensor(pb.yd, dtype, _strides(pb.yd, "nhwc"))
            zv = z.random(rng)
            pb.y.poison()
            bias = DevTensor((1, pb.yd[1]) + (1,) * (len(pb.yd) - 2), dtype)
            bv = bias.random(rng)
            act = pydnn.create_activation_descriptor()
            pydnn.set_activation_descriptor(act, mode, pydnn.PYDNN_NOT_PROPAGATE_NAN, coef)
            alpha2 = 0.0 if zkind == "none" else -0.5
            need = pydnn.get_convolution_forward_workspace_size(handle, pb.x.desc, pb.wdesc, pb.conv, pb.y.desc,
                                                                FWD_PRE)
            ws, n = _workspace(need)
            pydnn.convolution_bias_activation_forward(handle, 1.25, pb.x.desc, pb.x.ptr, pb.wdesc, pb.w.ptr, pb.conv,
                                                      FWD_PRE, ws.ptr, n, alpha2, z.desc, z.ptr, bias.desc,
                                                      bias.ptr, act, pb.y.desc, pb.y.ptr)
            want = ref.bias_activation_forward(1.25, x, w, alpha2, zv, bv, mode, coef, *pb.args())
            scale = 1.25 * ref.forward_raw(np.abs(x), np.abs(w), *pb.args()) + abs(alpha2) * np.abs(zv) + np.abs(bv)
            assert_close(pb.y.download(), want, dtype, f"grouped bias+act {mode} z {zkind}", scale=scale)
            pb.y.check_untouched()


def test_grouped_v7_picks_the_grouped_plans(handle):
    """On the device's own handle, Get..._v7 ranks the grouped tensor-core plans first for a ResNeXt layer
    (N 32; at N 4 the model still prefers the CUDA-core forward, whose 64-wide tile it does not charge for
    K/g = 16)."""
    case = ((32, 512, 14, 14), 512, (3, 3), (1, 1), (1, 1), (1, 1), 32, "nhwc", NHWC)
    pb = Problem(case, BF16)
    r = pydnn.get_convolution_forward_algorithm_v7(handle, pb.x.desc, pb.wdesc, pb.conv, pb.y.desc, 4)
    assert r[0].algo == FWD_PRE
    r = pydnn.get_convolution_backward_data_algorithm_v7(handle, pb.wdesc, pb.y.desc, pb.conv, pb.x.desc, 4)
    assert r[0].algo == BWD_D1
    r = pydnn.get_convolution_backward_filter_algorithm_v7(handle, pb.x.desc, pb.y.desc, pb.conv, pb.wdesc, 4)
    assert r[0].algo == BWD_F1
