"""The narrow 1x1 convolutions (ops/convolution/narrow.py: K < 8 output channels, packed NHWC, 16-bit)
on the GPU against the float64 reference: forward (IMPLICIT_GEMM; the fused bias + activation too),
backward data (ALGO_0), backward filter (ALGO_0: per-block partials + the fold, reproducible bits), for
C = 8 .. 256 (one to 32 lanes a pixel, C / 8 not a power of two), K = 1 .. 7, 2-d and 3-d, pixel counts
that leave partial rounds; bf16 and fp16, alpha / beta, outputs poisoned; the plan taken is the narrow one."""
import numpy as np
import pytest

import pydnn
from devtensor import assert_close
from pydnn.ops.convolution import narrow as NW, plans as CP, problem as CPb
from pydnn.reference import convolution as ref

from test_convolution_gpu import (BF16, F16, NHWC, Problem, _same_bits_again, _workspace, check_backward_data,
                                  check_backward_filter, check_bias_activation, check_forward)

pytestmark = pytest.mark.gpu

FWD0 = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM
BWD_D0, BWD_F0 = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_0, pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_0

CASES = [  # xdims, k, filt, pad, stride, dil, groups, layout, filter format
    ((2, 64, 37, 19), 2, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),      # the UNet head's shape, smaller
    ((1, 24, 9, 7), 3, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),        # C / 8 = 3: 4 lanes, 1 idle
    ((3, 256, 5, 11), 7, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),      # 32 lanes a pixel, K 7 (KT 8)
    ((1, 8, 40, 40), 1, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),       # one lane a pixel, K 1
    ((2, 96, 6, 6, 5), 5, (1, 1, 1), (0, 0, 0), (1, 1, 1), (1, 1, 1), 1, "nhwc", NHWC),   # 3-d
]
IDS = [f"c{c[0][1]}k{c[1]}" + ("3d" if len(c[0]) == 5 else "") for c in CASES]


def _narrow(handle, pb, direction, algo):
    pl = CP.new_plan(handle, direction, algo, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
    assert type(pl) is NW.NarrowPlan, type(pl).__name__
    return pl


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_narrow_forward(handle, rng, case, dtype):
    check_forward(handle, rng, lambda mode: Problem(case, dtype, mode), dtype, FWD0, "narrow forward",
                  before=lambda pb: _narrow(handle, pb, CPb.DIR_FWD, FWD0))


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_narrow_backward_data(handle, rng, case, dtype):
    def run(pb, alpha, beta):
        _narrow(handle, pb, CPb.DIR_BWD_DATA, BWD_D0)
        pydnn.convolution_backward_data(handle, alpha, pb.wdesc, pb.w.ptr, pb.y.desc, pb.y.ptr, pb.conv, BWD_D0, 0, 0,
                                        beta, pb.x.desc, pb.x.ptr)

    check_backward_data(rng, lambda mode: Problem(case, dtype, mode), dtype, run, "narrow backward data",
                        reproducible=True)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_narrow_backward_filter(handle, rng, case, dtype):
    def run(pb, alpha, beta):
        pl = _narrow(handle, pb, CPb.DIR_BWD_FILTER, BWD_F0)
        need = pydnn.get_convolution_backward_filter_workspace_size(handle, pb.x.desc, pb.y.desc, pb.conv, pb.wdesc,
                                                                    BWD_F0)
        assert need == pl.workspace > 0
        ws, n = _workspace(need)
        pydnn.convolution_backward_filter(handle, alpha, pb.x.desc, pb.x.ptr, pb.y.desc, pb.y.ptr, pb.conv, BWD_F0,
                                          ws.ptr, n, beta, pb.wdesc, pb.w.ptr)

    check_backward_filter(rng, lambda mode: Problem(case, dtype, mode), dtype, run, "narrow backward filter",
                          reproducible=True)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
def test_narrow_bias_activation(handle, rng, dtype):
    """The fused forward on the narrow plan: bias per output channel, z (NHWC), ReLU / sigmoid."""
    case = CASES[0]
    check_bias_activation(handle, rng, case, dtype, FWD0, "narrow bias+act",
                          lambda pb: _narrow(handle, pb, CPb.DIR_FWD, FWD0))


def test_narrow_unet_head_backward_filter_reproducible(handle, rng):
    """The UNet head at N 2 (32768 pixels over 264 blocks' partials): the reference and the same bits again."""
    case = ((2, 64, 128, 128), 2, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC)
    pb = Problem(case, BF16)
    pl = _narrow(handle, pb, CPb.DIR_BWD_FILTER, BWD_F0)
    x, dy = pb.x.random(rng), pb.y.random(rng)
    ws, n = _workspace(pl.workspace)

    def run():
        pydnn.convolution_backward_filter(handle, 1.0, pb.x.desc, pb.x.ptr, pb.y.desc, pb.y.ptr, pb.conv, BWD_F0,
                                          ws.ptr, n, 0.0, pb.wdesc, pb.w.ptr)

    pb.w.poison()
    run()
    want = ref.backward_filter(1.0, x, dy, 0.0, np.zeros(pb.wd), *pb.args())
    scale = ref.backward_filter_raw(np.abs(x), np.abs(dy), pb.wd[2:], *pb.args())
    assert_close(pb.w.download(), want, BF16, "narrow backward filter, UNet head", scale=scale)
    _same_bits_again(pb.w, run)
