"""The 1x1 backward filter as one pydnn.ops.matmul GEMM (tuning.conv.WGRAD_MM; pydnn/ops/convolution/wgrad_mm.py) on
the GPU against the float64 reference: dw poisoned (beta 0) or random (alpha / beta blending), both modes, split
(few pixels, large C and K: matmul's split-K through the call's workspace) and whole-K GEMMs, channel tails,
FP16 and BF16, bitwise reproducible (the split partials summed in a fixed order)."""
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops.convolution import plans as CP, problem as CPb, wgrad_mm as WM
from test_convolution_gpu import BF16, F16, NHWC, _tc_problem, _workspace, check_backward_filter

pytestmark = pytest.mark.gpu

BF1 = pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1

CASES = [  # xdims, k, filt, pad, stride, dil, groups, layout, filter format
    # 1568 pixels, 4 x 4 tiles of 128 x 256 for 132 SMs: matmul splits the reduction (the CPU test's case; the
    # 98-pixel case first written here did not split: session 33's final call)
    ((8, 1024, 14, 14), 512, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),
    ((3, 72, 9, 11), 136, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),      # channel tails
    ((4, 64, 20, 20), 256, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),     # 1600 pixels
    ((1, 24, 5, 6), 40, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),        # small, one tile
]


@pytest.mark.parametrize("case", CASES, ids=["split", "tails", "p1600", "small"])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "half"])
def test_wgrad_mm(handle, rng, monkeypatch, case, dtype):
    if handle.arch != "sm_90":
        pytest.skip("matmul's split-K tile is sm_90's")
    monkeypatch.setattr(tuning.conv, "WGRAD_MM", "always")
    planned = {}

    def make(mode):
        pb = _tc_problem(case, dtype, mode)
        pl = CP.new_plan(handle, CPb.DIR_BWD_FILTER, BF1, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
        assert isinstance(pl, WM.WgradMMPlan), type(pl).__name__
        planned["split"] = pl.mm.split
        return pb

    def run(pb, alpha, beta):
        need = pydnn.get_convolution_backward_filter_workspace_size(handle, pb.x.desc, pb.y.desc, pb.conv, pb.wdesc,
                                                                    BF1)
        ws, n = _workspace(need)
        pydnn.convolution_backward_filter(handle, alpha, pb.x.desc, pb.x.ptr, pb.y.desc, pb.y.ptr, pb.conv, BF1,
                                          ws.ptr if need else 0, n, beta, pb.wdesc, pb.w.ptr)

    check_backward_filter(rng, make, dtype, run, "wgrad on matmul", reproducible=True)
    if case is CASES[0]:
        assert planned["split"] is not None   # the split form ran
