"""BWD_FILTER_ALGO_WINOGRAD_NONFUSED on the GPU against the float64 reference: every dtype (double through
the implicit-GEMM sub-plan), both tiles, both workspace layouts, forced and modelled splits, N = 1 / 3,
sizes that are not multiples of the tile, pads 0 / 1 / 2, C != K, groups and depthwise, NCHW / NHWC /
padded layouts and filter formats, both modes, alpha / beta (dw poisoned first where beta = 0); bitwise
reproducibility run to run; Find lists it with the workspace the size query reports."""
import numpy as np
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops.convolution import winograd as Wg
from test_fuzz_cpu import _call
from test_convolution_gpu import (BF16, CONV, F16, F32, F64, NCHW, NHWC, XCORR, Problem, _workspace,
                                  check_backward_filter)

pytestmark = pytest.mark.gpu

WINO = pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED
DTYPES = [F32, F16, BF16, F64]

CASES = [  # xdims, k, filt, pad, stride, dil, groups, layout, filter format
    ((3, 6, 13, 11), 10, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),      # N = 3, odd sizes, C != K
    ((1, 5, 8, 9), 7, (3, 3), (0, 2), (1, 1), (1, 1), 1, "nchw", NCHW),         # N = 1, pads 0 / 2
    ((2, 8, 12, 9), 6, (3, 3), (2, 1), (1, 1), (1, 1), 2, "gap", NHWC),        # groups, padded layout
    ((2, 16, 9, 10), 16, (3, 3), (1, 1), (1, 1), (1, 1), 16, "nhwc", NCHW),    # depthwise
    ((4, 70, 15, 15), 80, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nchw", NHWC),    # several GEMM tiles
    ((1, 33, 3, 2), 40, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nchw", NCHW),      # < 1 tile (float: refused)
    ((1, 9, 4, 7), 5, (3, 3), (0, 0), (1, 1), (1, 1), 1, "nhwc", NCHW),        # 2 x 5 outputs, float F(2x2)
    ((8, 64, 28, 28), 64, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nchw", NCHW),    # a long reduction, split
]


def _ws(handle, pb):
    need = pydnn.get_convolution_backward_filter_workspace_size(handle, pb.x.desc, pb.y.desc, pb.conv, pb.wdesc,
                                                                WINO)
    assert need > 0
    return _workspace(need)


def _run(handle, pb, alpha, beta):
    ws, n = _ws(handle, pb)
    pydnn.convolution_backward_filter(handle, alpha, pb.x.desc, pb.x.ptr, pb.y.desc, pb.y.ptr, pb.conv, WINO, ws.ptr,
                                      n, beta, pb.wdesc, pb.w.ptr)


def check_wgrad(handle, rng, case, dtype):
    pb = Problem(case, dtype)
    if dtype == F32 and min(pb.yd[2] - case[3][0], pb.yd[3] - case[3][1]) < Wg.WGRAD_F2_MIN_CLEAR:
        st = _call(pydnn.get_convolution_backward_filter_workspace_size, handle, pb.x.desc, pb.y.desc, pb.conv,
                   pb.wdesc, WINO)
        assert st == pydnn.PYDNN_STATUS_NOT_SUPPORTED and "border taps" in pydnn.get_last_error_string()
        return  # too small for float (convolution_winograd.WGRAD_F2_MIN_CLEAR): refused with the reason
    check_backward_filter(rng, lambda mode: Problem(case, dtype, mode), dtype,
                          lambda pb, alpha, beta: _run(handle, pb, alpha, beta), "backward filter winograd",
                          ((XCORR, 1.0, 0.0), (CONV, 0.5, -2.0)))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tile", Wg.TILES)
def test_winograd_backward_filter(handle, rng, case, dtype, tile, monkeypatch):
    monkeypatch.setattr(tuning.conv_winograd, "PREFERRED_TILE", tile)
    check_wgrad(handle, rng, case, dtype)


@pytest.mark.parametrize("case", [CASES[0], CASES[2], CASES[4], CASES[6]])
@pytest.mark.parametrize("layout,splits", [("tile", 5), ("chan", 3), ("chan", 1)])
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_winograd_backward_filter_layouts_and_splits(handle, rng, case, layout, splits, dtype, monkeypatch):
    """Both workspace layouts ("chan" serves one group; groups fall back to "tile") at forced splits."""
    monkeypatch.setattr(tuning.conv_winograd, "WGRAD_LAYOUT", layout)
    monkeypatch.setattr(tuning.conv_winograd, "WGRAD_FORCE_SPLITS", splits)
    check_wgrad(handle, rng, case, dtype)


def test_winograd_backward_filter_bitwise_reproducible(handle, rng):
    pb = Problem(CASES[6], F32)
    pb.x.random(rng)
    pb.y.random(rng)
    ws, n = _ws(handle, pb)
    outs = []
    for _ in range(2):
        pb.w.poison()
        pydnn.convolution_backward_filter(handle, 1.0, pb.x.desc, pb.x.ptr, pb.y.desc, pb.y.ptr, pb.conv, WINO,
                                          ws.ptr, n, 0.0, pb.wdesc, pb.w.ptr)
        outs.append(pb.w.buf.to_numpy().copy())
    assert (outs[0].view(np.uint32) == outs[1].view(np.uint32)).all()


def test_find_lists_winograd_backward_filter(handle, rng, monkeypatch):
    monkeypatch.setenv("PYDNN_CONV_TUNING_CACHE", "0")
    pb = Problem(CASES[4], F32)
    pb.x.random(rng)
    pb.y.random(rng)
    ws, n = _workspace(1 << 27)
    r = pydnn.find_convolution_backward_filter_algorithm_ex(handle, pb.x.desc, pb.x.ptr, pb.y.desc, pb.y.ptr,
                                                            pb.conv, pb.wdesc, pb.w.ptr, 8, ws.ptr, n)
    ok = {p.algo: p for p in r if p.status == pydnn.PYDNN_STATUS_SUCCESS}
    assert WINO in ok and ok[WINO].time > 0 and ok[WINO].determinism == pydnn.PYDNN_DETERMINISTIC
    assert ok[WINO].memory == _ws(handle, pb)[1]
    small = pydnn.find_convolution_backward_filter_algorithm_ex(handle, pb.x.desc, pb.x.ptr, pb.y.desc, pb.y.ptr,
                                                                pb.conv, pb.wdesc, pb.w.ptr, 8, ws.ptr, 1024)
    assert {p.algo: p.status for p in small}[WINO] == pydnn.PYDNN_STATUS_ALLOC_FAILED
