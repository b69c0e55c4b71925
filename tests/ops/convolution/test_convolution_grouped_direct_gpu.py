"""The direct grouped tensor-core convolution (ops/convolution/grouped_direct.py: grouped_frag_pack +
grouped_direct_tc, one launch over all groups; grouped_wgrad_tc + grouped_wgrad_fold) on the GPU against
the float64 reference: forward (IMPLICIT_PRECOMP_GEMM), backward filter (ALGO_1: split partials folded in
order, reproducible bits) and backward data (ALGO_1; stride 1 on the forward's view, stride 2 on MODE 1: a warp per
phase) for C/g = K/g = 4, 8, 16, 32, odd spatial sizes (partial 8 x 16 / 8 x 8 tiles),
stride 2, dilation, 1x1 and 5x5, NHWC data with NHWC or NCHW filters, bf16 and fp16, both modes, alpha /
beta, outputs poisoned; the fused bias + activation forward; bitwise reproducibility; the plan taken is
the direct one."""
import numpy as np
import pytest

import pydnn
from devtensor import DevTensor, assert_close
from pydnn.ops.convolution import dgrad_phases as D, grouped_direct as GD, plans as CP, problem as CPb
from pydnn.reference import convolution as ref

from test_convolution_gpu import (BF16, F16, FWD_PRE, BWD_D1, BWD_F1, NCHW, NHWC, XCORR, Problem, _same_bits_again,
                                  _strides, _workspace, check_backward_data, check_backward_filter, check_forward)

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _direct_always(monkeypatch):
    """These tests cover the direct kernels wherever they apply (the model may prefer grouped.py's packed
    plan on some layers: test_model_picks_the_lower_estimate)."""
    from pydnn import tuning
    monkeypatch.setattr(tuning.conv, "GROUPED_DIRECT_ALWAYS", True)

CASES = [  # xdims, k, filt, pad, stride, dil, groups, layout, filter format     (C/g; tile)
    ((2, 128, 13, 11), 128, (3, 3), (1, 1), (1, 1), (1, 1), 32, "nhwc", NHWC),   # 4; 8 x 16 (ResNeXt stage 1)
    ((2, 256, 9, 7), 256, (3, 3), (1, 1), (1, 1), (1, 1), 32, "nhwc", NHWC),     # 8; 8 x 8
    ((3, 512, 7, 9), 512, (3, 3), (1, 1), (2, 2), (1, 1), 32, "nhwc", NHWC),     # 16; stride 2
    ((2, 1024, 5, 3), 1024, (3, 3), (1, 1), (1, 1), (1, 1), 32, "nhwc", NHWC),   # 32 (two k16 parts)
    ((2, 64, 11, 13), 64, (3, 3), (1, 1), (1, 1), (1, 1), 2, "nhwc", NCHW),      # 32; NCHW filter
    ((2, 128, 9, 19), 128, (3, 3), (2, 0), (1, 1), (2, 1), 8, "nhwc", NCHW),     # 16; dilation, 8 x 16 tiles
    ((1, 128, 20, 17), 128, (1, 1), (0, 0), (1, 1), (1, 1), 16, "nhwc", NHWC),   # 8; 1x1
    ((2, 64, 12, 10), 64, (5, 5), (2, 1), (2, 2), (1, 1), 8, "nhwc", NHWC),      # 8; 5x5 stride 2
    ((2, 256, 17, 20), 256, (3, 3), (1, 1), (2, 2), (1, 1), 32, "nhwc", NHWC),   # 8; stride 2, 2 dx tiles a row
    ((1, 64, 13, 14), 64, (3, 3), (1, 1), (3, 3), (1, 1), 4, "nhwc", NHWC),      # 16; stride 3: the phases
    ((3, 512, 11, 9), 512, (3, 3), (1, 1), (2, 2), (1, 1), 64, "nhwc", NHWC),    # 8; groups 64, stride 2, odd N
    ((3, 2048, 5, 7), 2048, (3, 3), (1, 1), (1, 1), (1, 1), 64, "nhwc", NHWC),   # 32; groups 64, odd N
]
IDS = [f"c{c[0][1]}g{c[6]}" + ("s2" if 2 in c[4] else "") + ("d2" if 2 in c[5] else "")
       + ("nchwf" if c[8] == NCHW else "") + (f"f{c[2][0]}" if c[2][0] != 3 else "") for c in CASES]


def _direct_plan(handle, pb, direction, algo):
    pl = CP.new_plan(handle, direction, algo, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
    if type(pl) is D.PhasePlan:
        assert direction == CPb.DIR_BWD_DATA and max(pb.conv.stride) > 1
        for sp, _, _, _ in pl.subs:
            assert type(sp) is GD.GroupedDirectPlan, type(sp).__name__
        return pl
    if direction == CPb.DIR_FWD and max(pb.conv.stride) > 2:   # stride 3: two 24 x 24 halos exceed MAX_SMEM
        from pydnn.ops.convolution import grouped as G
        assert type(pl) is G.GroupedPlan, type(pl).__name__
        return pl
    assert type(pl) is GD.GroupedDirectPlan, f"{direction}: {type(pl).__name__}"
    return pl


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_grouped_direct_forward(handle, rng, case, dtype):
    def before(pb):
        _direct_plan(handle, pb, CPb.DIR_FWD, FWD_PRE)

    def ws(pb):
        return _workspace(pydnn.get_convolution_forward_workspace_size(handle, pb.x.desc, pb.wdesc, pb.conv,
                                                                       pb.y.desc, FWD_PRE))

    check_forward(handle, rng, lambda mode: Problem(case, dtype, mode), dtype, FWD_PRE, "grouped direct forward",
                  workspace=ws, before=before)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_grouped_direct_backward_data(handle, rng, case, dtype):
    def run(pb, alpha, beta):
        _direct_plan(handle, pb, CPb.DIR_BWD_DATA, BWD_D1)
        need = pydnn.get_convolution_backward_data_workspace_size(handle, pb.wdesc, pb.y.desc, pb.conv, pb.x.desc,
                                                                  BWD_D1)
        assert need > 0
        ws, n = _workspace(need)
        pydnn.convolution_backward_data(handle, alpha, pb.wdesc, pb.w.ptr, pb.y.desc, pb.y.ptr, pb.conv, BWD_D1,
                                        ws.ptr, n, beta, pb.x.desc, pb.x.ptr)

    check_backward_data(rng, lambda mode: Problem(case, dtype, mode), dtype, run, "grouped direct backward data",
                        reproducible=True)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", [0, 3], ids=[IDS[0], IDS[3]])
def test_grouped_direct_bias_activation(handle, rng, dtype, case):
    """The fused forward on the direct plan: bias, z and the activation in its epilogue."""
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
            _direct_plan(handle, pb, CPb.DIR_FWD, FWD_PRE)
            need = pydnn.get_convolution_forward_workspace_size(handle, pb.x.desc, pb.wdesc, pb.conv, pb.y.desc,
                                                                FWD_PRE)
            ws, n = _workspace(need)
            pydnn.convolution_bias_activation_forward(handle, 1.25, pb.x.desc, pb.x.ptr, pb.wdesc, pb.w.ptr, pb.conv,
                                                      FWD_PRE, ws.ptr, n, alpha2, z.desc, z.ptr, bias.desc,
                                                      bias.ptr, act, pb.y.desc, pb.y.ptr)
            want = ref.bias_activation_forward(1.25, x, w, alpha2, zv, bv, mode, coef, *pb.args())
            scale = 1.25 * ref.forward_raw(np.abs(x), np.abs(w), *pb.args()) + abs(alpha2) * np.abs(zv) + np.abs(bv)
            assert_close(pb.y.download(), want, dtype, f"grouped direct bias+act {mode} z {zkind}", scale=scale)
            pb.y.check_untouched()


def test_grouped_direct_v7_ranks_it_first(handle):
    """On the device's own handle, Get..._v7 puts the direct plan first for ResNeXt's stage-1 layer at N 8
    (the point that ran the CUDA-core implicit_gemm at 0.017x cuDNN)."""
    case = ((8, 128, 56, 56), 128, (3, 3), (1, 1), (1, 1), (1, 1), 32, "nhwc", NHWC)
    pb = Problem(case, BF16)
    r = pydnn.get_convolution_forward_algorithm_v7(handle, pb.x.desc, pb.wdesc, pb.conv, pb.y.desc, 4)
    assert r[0].algo == FWD_PRE
    assert type(CP.new_plan(handle, CPb.DIR_FWD, FWD_PRE, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)) is \
        GD.GroupedDirectPlan
    r = pydnn.get_convolution_backward_data_algorithm_v7(handle, pb.wdesc, pb.y.desc, pb.conv, pb.x.desc, 4)
    assert r[0].algo == BWD_D1


@pytest.mark.parametrize("n", [8, 32, 128])
@pytest.mark.parametrize("c,hw,stride", [(128, 56, 1), (256, 28, 1), (512, 14, 1), (1024, 7, 1), (256, 56, 2),
                                         (512, 28, 2), (1024, 14, 2)])
def test_grouped_direct_v7_backward_filter_and_strided_forward(handle, monkeypatch, n, c, hw, stride):
    """On the device's own handle, with the planner's default rule (GROUPED_DIRECT_ALWAYS off): Get..._v7
    ranks ALGO_1 first for the backward filter of every ResNeXt-50 grouped layer at N 8 / 32 / 128, on the
    direct kernel for C/g = 4 and C/g = 8 at stride 1, grouped.py's packed plan for the rest (as measured:
    grouped_direct.WGRAD_MEASURED), and the forward on
    IMPLICIT_PRECOMP_GEMM (direct, but the large strided ones packed)."""
    from pydnn import tuning
    monkeypatch.setattr(tuning.conv, "GROUPED_DIRECT_ALWAYS", False)
    pb = Problem(((n, c, hw, hw), c, (3, 3), (1, 1), (stride, stride), (1, 1), 32, "nhwc", NHWC), BF16)
    r = pydnn.get_convolution_backward_filter_algorithm_v7(handle, pb.x.desc, pb.y.desc, pb.conv, pb.wdesc, 4)
    assert r[0].algo == BWD_F1 and r[0].determinism == pydnn.PYDNN_DETERMINISTIC
    from pydnn.ops.convolution import grouped as G
    pl = CP.new_plan(handle, CPb.DIR_BWD_FILTER, BWD_F1, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
    assert type(pl) is (GD.GroupedWgradPlan if c == 128 or (c == 256 and stride == 1) else G.GroupedPlan)
    r = pydnn.get_convolution_forward_algorithm_v7(handle, pb.x.desc, pb.wdesc, pb.conv, pb.y.desc, 4)
    assert r[0].algo == FWD_PRE
    pl = CP.new_plan(handle, CPb.DIR_FWD, FWD_PRE, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
    tiles = n * (-(-(hw // stride) // 8)) ** 2 * (c // 64)
    big = stride == 2 and tiles > 4 * 3 * handle.sm_count
    assert type(pl) is (G.GroupedPlan if big else GD.GroupedDirectPlan)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_grouped_direct_backward_filter(handle, rng, case, dtype):
    """grouped_wgrad_tc (8 warps, compile-time taps NT = 9 / 3 / 0, one or two blocks a SM) over the cases."""
    def run(pb, alpha, beta):
        pl = CP.new_plan(handle, CPb.DIR_BWD_FILTER, BWD_F1, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
        assert type(pl) is GD.GroupedWgradPlan, type(pl).__name__
        need = pydnn.get_convolution_backward_filter_workspace_size(handle, pb.x.desc, pb.y.desc, pb.conv, pb.wdesc,
                                                                    BWD_F1)
        assert need == pl.workspace > 0
        ws, n = _workspace(need)
        pydnn.convolution_backward_filter(handle, alpha, pb.x.desc, pb.x.ptr, pb.y.desc, pb.y.ptr, pb.conv, BWD_F1,
                                          ws.ptr, n, beta, pb.wdesc, pb.w.ptr)

    check_backward_filter(rng, lambda mode: Problem(case, dtype, mode), dtype, run, "grouped direct backward filter",
                          reproducible=True)


def test_grouped_direct_backward_filter_many_splits(handle, rng):
    """ResNeXt's stage-1 layer at N 8 (56 x 56: 196 tiles over the splits): against the reference, and the
    same bits run after run."""
    case = ((8, 128, 56, 56), 128, (3, 3), (1, 1), (1, 1), (1, 1), 32, "nhwc", NHWC)
    pb = Problem(case, BF16)
    pl = CP.new_plan(handle, CPb.DIR_BWD_FILTER, BWD_F1, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
    assert type(pl) is GD.GroupedWgradPlan and pl.splits > 1
    x, dy = pb.x.random(rng), pb.y.random(rng)
    ws, n = _workspace(pl.workspace)

    def run():
        pydnn.convolution_backward_filter(handle, 1.0, pb.x.desc, pb.x.ptr, pb.y.desc, pb.y.ptr, pb.conv, BWD_F1,
                                          ws.ptr, n, 0.0, pb.wdesc, pb.w.ptr)

    pb.w.poison()
    run()
    want = ref.backward_filter(1.0, x, dy, 0.0, np.zeros(pb.wd), *pb.args())
    scale = ref.backward_filter_raw(np.abs(x), np.abs(dy), pb.wd[2:], *pb.args())
    assert_close(pb.w.download(), want, BF16, "grouped direct backward filter, splits", scale=scale)
    _same_bits_again(pb.w, run)


RING_CASES = [  # as CASES (C/g; the tiles one block walks at sm_count 1)
    ((2, 128, 40, 36), 128, (3, 3), (1, 1), (1, 1), (1, 1), 32, "nhwc", NHWC),   # 4; 30 8 x 16 tiles
    ((3, 256, 23, 21), 256, (3, 3), (1, 1), (1, 1), (1, 1), 8, "nhwc", NHWC),    # 32; 18 tiles, odd N
    ((2, 256, 33, 35), 256, (3, 3), (1, 1), (2, 2), (1, 1), 16, "nhwc", NHWC),   # 16; stride 2, 18 8 x 8 tiles
    ((2, 256, 17, 20), 256, (3, 3), (1, 1), (2, 2), (1, 1), 32, "nhwc", NHWC),   # 8; stride 2, 8 tiles
    ((3, 512, 11, 9), 512, (3, 3), (1, 1), (2, 2), (1, 1), 64, "nhwc", NHWC),    # 8; groups 64, stride 2
    ((3, 2048, 5, 7), 2048, (3, 3), (1, 1), (1, 1), (1, 1), 64, "nhwc", NHWC),   # 32; groups 64
    ((2, 64, 12, 10), 64, (5, 5), (2, 1), (2, 2), (1, 1), 8, "nhwc", NHWC),      # 8; 5x5: 5 row blocks
]
RING_IDS = [f"c{c[0][1]}g{c[6]}hw{c[0][2]}" + ("s2" if 2 in c[4] else "") + (f"f{c[2][0]}" if c[2][0] != 3 else "")
            for c in RING_CASES]


@pytest.mark.parametrize("case", RING_CASES, ids=RING_IDS)
def test_grouped_direct_rings_walk_many_tiles(handle, rng, monkeypatch, case):
    """The rings of grouped_direct_tc (the large strided forwards: one block a SM, up to 6 halos in flight)
    and grouped_wgrad_tc (8 warps, up to 6 stages) with each block walking many tiles, the ring wrapping
    around: the plans made as for a 1-SM device (handle.sm_count 1: one persistent block a channel block,
    one split), the strided forward's ring threshold lowered; bf16 against the float64 reference, outputs
    poisoned, alpha / beta as the other tests."""
    monkeypatch.setattr(handle, "sm_count", 1)
    from pydnn import tuning
    monkeypatch.setattr(tuning.conv, "GROUPED_RING_ROUNDS", 0)
    monkeypatch.setattr(tuning.conv, "GROUPED_RING_S2", True)
    c = case

    if max(c[4]) == 2 and c[2][0] == 3:
        def before(pb):
            pl = _direct_plan(handle, pb, CPb.DIR_FWD, FWD_PRE)
            assert pl.stages > 2 and pl.resident == 1 and pl.gemm.gn == pl.stages, (pl.stages, pl.tiles)
            assert pl.grid[0] == 1 < pl.tiles   # one block walks every tile of its channel block

        def ws(pb):
            return _workspace(pydnn.get_convolution_forward_workspace_size(handle, pb.x.desc, pb.wdesc, pb.conv,
                                                                           pb.y.desc, FWD_PRE))

        check_forward(handle, rng, lambda mode: Problem(c, BF16, mode), BF16, FWD_PRE,
                      "grouped direct forward, ring", workspace=ws, before=before)

    def run(pb, alpha, beta):
        pl = CP.new_plan(handle, CPb.DIR_BWD_FILTER, BWD_F1, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
        assert type(pl) is GD.GroupedWgradPlan and pl.gemm.gn == pl.stages and pl.splits == 1
        q = pl.problem
        assert pl.stages == min(GD.MAX_STAGES, pl.tiles + 1, GD.ring_smem(handle.arch) // pl.resident // GD.wgrad_stage(
            pl.tile, pl.rows, q.filt3[1:], q.stride3[1:], q.dil3[1:])), (pl.stages, pl.tiles)
        need = pydnn.get_convolution_backward_filter_workspace_size(handle, pb.x.desc, pb.y.desc, pb.conv, pb.wdesc,
                                                                    BWD_F1)
        ws, n = _workspace(need)
        pydnn.convolution_backward_filter(handle, alpha, pb.x.desc, pb.x.ptr, pb.y.desc, pb.y.ptr, pb.conv, BWD_F1,
                                          ws.ptr, n, beta, pb.wdesc, pb.w.ptr)

    check_backward_filter(rng, lambda mode: Problem(c, BF16, mode), BF16, run,
                          "grouped direct backward filter, ring", reproducible=True)
