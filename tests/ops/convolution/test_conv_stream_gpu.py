"""The streaming 1x1 convolutions (ops/convolution/stream.py, tuning.conv.STREAM_1X1) on the GPU against the float64
reference: forward (IMPLICIT_PRECOMP_GEMM; the fused bias + z + activation too) and backward data (ALGO_1), for
reductions of 8 .. 128 (two to eight k16 steps, tails zero-filled), output sides of 8 .. 400 (each NT tile, tails
masked; column chunks past 256), pixel counts that leave a partial 64-row tile, grids of fewer blocks than tiles (the
ring walking several) and the issue's worst layer (N32 64 -> 64 @56); bf16 and fp16, alpha / beta, outputs poisoned;
the plan taken is the streaming one."""
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops.convolution import plans as CP, problem as CPb, stream as ST

from test_convolution_gpu import BF16, F16, NHWC, Problem, check_backward_data, check_bias_activation, check_forward

pytestmark = pytest.mark.gpu

FWD1, BWD_D1 = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1

CASES = [  # xdims, k, filt, pad, stride, dil, groups, layout, filter format (both directions serve every one)
    ((2, 64, 37, 19), 64, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),      # KP 64, NT 64, a partial tile
    ((1, 40, 13, 7), 24, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),       # reductions 40 / 24: k tails
    ((3, 16, 9, 11), 56, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),       # backward data's NT 64 over 16
    ((1, 8, 40, 40), 8, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),        # one k16 step, 8 columns of 64
    ((2, 32, 30, 30), 64, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),
    ((32, 64, 56, 56), 64, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),     # issue 18's worst layer
    ((2, 128, 19, 23), 64, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),     # reductions 128 / 64
    ((2, 64, 21, 20), 128, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),     # ResNeXt's 64 -> 128 (dgrad 0.285x)
]
FWD_ONLY = [  # forward only (backward data's reduction past 64): output sides 136 .. 400 (past 256: two chunks)
    ((2, 56, 8, 9), 136, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),
    ((1, 32, 17, 17), 248, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),
    ((2, 32, 13, 11), 400, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),
    ((1, 40, 20, 21), 280, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),
    ((1, 96, 15, 17), 256, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),     # KP 128 x NT 256: 1 block a SM
]
IDS = [f"n{c[0][0]}c{c[0][1]}k{c[1]}" for c in CASES]


@pytest.fixture(autouse=True)
def on():
    # (the kernels themselves: sm_90 sends a wide output with a reduction >= matmul.WG_PERSIST_MIN_K, c96k256 here, to
    # the wgmma GEMM, stream.wgmma_takes; the limit raised keeps every case on the streaming kernels)
    with tuning.override({"conv.STREAM_1X1": True, "matmul.WG_PERSIST_MIN_K": 1 << 20}):
        yield


def _stream(handle, pb, direction, algo, blocks=None):
    """The handle's cached plan of the call (the one the call runs): a streaming one; `blocks` its grid."""
    pl = CP.get_plan(handle, direction, algo, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
    assert type(pl) is ST.StreamPlan, type(pl).__name__
    if blocks is not None:   # (the cached plan: the calls below run it with this grid)
        pl.blocks = blocks
    return pl


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CASES + FWD_ONLY, ids=IDS + ["c56k136", "c32k248", "c32k400", "c40k280", "c96k256"])
def test_stream_forward(handle, rng, case, dtype):
    check_forward(handle, rng, lambda mode: Problem(case, dtype, mode), dtype, FWD1, "stream forward",
                  before=lambda pb: _stream(handle, pb, CPb.DIR_FWD, FWD1))


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_stream_backward_data(handle, rng, case, dtype):
    def run(pb, alpha, beta):
        _stream(handle, pb, CPb.DIR_BWD_DATA, BWD_D1)
        pydnn.convolution_backward_data(handle, alpha, pb.wdesc, pb.w.ptr, pb.y.desc, pb.y.ptr, pb.conv, BWD_D1, 0, 0,
                                        beta, pb.x.desc, pb.x.ptr)

    check_backward_data(rng, lambda mode: Problem(case, dtype, mode), dtype, run, "stream backward data",
                        reproducible=True)


@pytest.mark.parametrize("blocks", [1, 3])
def test_stream_few_blocks_walk_the_ring(handle, rng, blocks):
    """A grid of 1 or 3 blocks over 141 tiles: each block's ring turns over tens of times."""
    case = ((2, 64, 75, 60), 64, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC)
    check_forward(handle, rng, lambda mode: Problem(case, BF16, mode), BF16, FWD1, "stream forward, few blocks",
                  before=lambda pb: _stream(handle, pb, CPb.DIR_FWD, FWD1, blocks))


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
def test_stream_bias_activation(handle, rng, dtype):
    """The fused forward on the streaming plan: bias per output channel, z (NHWC), ReLU / sigmoid."""
    case = CASES[0]
    check_bias_activation(handle, rng, case, dtype, FWD1, "stream bias+act",
                          lambda pb: _stream(handle, pb, CPb.DIR_FWD, FWD1))
