"""Convolution through explicit GEMMs (pydnn/ops/convolution_gemm.py) on the GPU against the float64
reference: the forward GEMM algorithm's new paths (matmul for float, tensor cores over padded columns with
a packed filter for 16-bit data, the direct 1x1 GEMM), its fused bias + activation, and backward data
ALGO_1 as GEMM + col2im (small C, strides, odd shapes, 1-d / 3-d, NCHW / NHWC dy and dx, both filter
formats, both modes, alpha / beta); outputs poisoned first and their gaps checked untouched; bitwise
reproducibility; the workspace the queries report; Find's record of the new plans."""
import pytest

import pydnn
from devtensor import DevTensor
from pydnn import tuning
from pydnn.ops.convolution import implicit as CI, plans as CP, problem as CPb, tensor_core as CT
from pydnn.ops.convolution import gemm as G
from test_convolution_algos_gpu import check_bias_activation
from test_convolution_gpu import (BF16, BWD_DATA_MODES, F16, F32, F64, NCHW, NHWC, XCORR, Problem, _strides,
                                  _workspace, check_backward_data, check_forward)

pytestmark = pytest.mark.gpu

FWD_GEMM = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_GEMM
BWD_D1 = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1

FWD_CASES = [  # xdims, k, filt, pad, stride, dil, groups, layout, filter format
    ((2, 3, 23, 21), 16, (7, 7), (3, 3), (2, 2), (1, 1), 1, "nchw", NCHW),     # a stem, NCHW (matmul for float)
    ((3, 3, 17, 19), 24, (7, 7), (3, 3), (2, 2), (1, 1), 1, "nhwc", NCHW),     # NHWC x, NCHW filter: packed
    ((2, 5, 9, 8), 7, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),        # 45 columns padded to 48
    ((2, 6, 11), 10, (5,), (2,), (2,), (1,), 1, "nchw", NHWC),                 # 1-d
    ((1, 3, 5, 6, 7), 4, (2, 3, 3), (1, 1, 0), (1, 2, 1), (2, 1, 1), 1, "nhwc", NHWC),   # 3-d
    ((2, 20, 7, 9), 33, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nchw", NCHW),      # 1x1: the direct GEMM (float)
    ((2, 20, 7, 9), 33, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),
    ((2, 5, 7, 8), 9, (3, 3), (1, 1), (1, 1), (1, 1), 1, "gap", NCHW),         # padded layout: the 1x1 view
]
BWD_CASES = [  # dx dims, k, filt, pad, stride, dil, groups, layout, filter format
    ((2, 3, 23, 21), 16, (7, 7), (3, 3), (2, 2), (1, 1), 1, "nchw", NCHW),     # a stem
    ((2, 3, 23, 21), 16, (7, 7), (3, 3), (2, 2), (1, 1), 1, "nhwc", NHWC),
    ((3, 5, 13, 11), 7, (3, 3), (1, 1), (2, 2), (1, 1), 1, "nhwc", NCHW),      # K % 8 != 0, filter packed
    ((2, 6, 12, 9), 10, (3, 2), (2, 0), (2, 3), (2, 1), 1, "nchw", NHWC),      # dilation, odd strides
    ((2, 4, 37), 9, (3,), (1,), (2,), (1,), 1, "nhwc", NHWC),                  # 1-d
    ((1, 3, 5, 6, 7), 4, (2, 3, 3), (1, 1, 0), (1, 2, 1), (2, 1, 1), 1, "nchw", NCHW),   # 3-d
    ((2, 20, 9, 10), 40, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),     # small C (C % 8 != 0), stride 1
    ((2, 4, 6, 5), 3, (3, 3), (2, 2), (3, 3), (1, 1), 1, "gapx", NCHW),        # padded dx; stride > filter - pad
]


def _bwd_problem(case, dtype, mode):
    """Problem, except that layout "gapx" pads dx only (dy packed NCHW: the GEMM reads it as a matrix)."""
    if case[7] != "gapx":
        return Problem(case, dtype, mode)
    pb = Problem(case[:7] + ("nchw",) + case[8:], dtype, mode)
    pb.x = DevTensor(pb.x.dims, dtype, _strides(pb.x.dims, "gap"))
    return pb


def _ws(handle, pb, direction, algo):
    if direction == "fwd":
        need = pydnn.get_convolution_forward_workspace_size(handle, pb.x.desc, pb.wdesc, pb.conv, pb.y.desc, algo)
    else:
        need = pydnn.get_convolution_backward_data_workspace_size(handle, pb.wdesc, pb.y.desc, pb.conv, pb.x.desc,
                                                                  algo)
    return _workspace(need)


@pytest.mark.parametrize("case", FWD_CASES)
@pytest.mark.parametrize("dtype", [F32, F16, BF16, F64])
def test_gemm_forward(handle, rng, case, dtype):
    check_forward(handle, rng, lambda mode: Problem(case, dtype, mode), dtype, FWD_GEMM, "forward GEMM",
                  workspace=lambda pb: _ws(handle, pb, "fwd", FWD_GEMM))


def _backward_data(handle, pb, alpha, beta):
    ws, n = _ws(handle, pb, "bwd", BWD_D1)
    pydnn.convolution_backward_data(handle, alpha, pb.wdesc, pb.w.ptr, pb.y.desc, pb.y.ptr, pb.conv, BWD_D1, ws.ptr,
                                    n, beta, pb.x.desc, pb.x.ptr)


@pytest.mark.parametrize("case", BWD_CASES)
@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_gemm_backward_data(handle, rng, case, dtype):
    def make(mode):
        pb = _bwd_problem(case, dtype, mode)
        pl = CP.new_plan(handle, CPb.DIR_BWD_DATA, BWD_D1, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
        assert isinstance(pl, G.BwdGemmPlan)
        return pb

    check_backward_data(rng, make, dtype, lambda pb, alpha, beta: _backward_data(handle, pb, alpha, beta),
                        "GEMM backward data", BWD_DATA_MODES + ((XCORR, 0.5, -1.0),), reproducible=True)


@pytest.mark.parametrize("case", [FWD_CASES[0], FWD_CASES[1], FWD_CASES[5]])
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_gemm_bias_activation(handle, rng, case, dtype):
    """The fused epilogue through the GEMM algorithm's plans (float: the 1x1 view instead of matmul;
    16-bit: the tensor-core 1x1 view over the padded columns), then a plain call on the same plan."""
    check_bias_activation(handle, rng, case, dtype, FWD_GEMM,
                          ((pydnn.PYDNN_ACTIVATION_RELU, 0.0, 0.5), (pydnn.PYDNN_ACTIVATION_CLIPPED_RELU, 1.5, 0.0),
                           (pydnn.PYDNN_ACTIVATION_TANH, 0.0, -0.5)),
                          "nhwc", lambda pb: _ws(handle, pb, "fwd", FWD_GEMM), "GEMM bias+act")


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_find_records_the_gemm_plans(handle, rng, monkeypatch, dtype):
    """Find times the explicit-GEMM plans with their true workspace and determinism; with too small a
    workspace they are ALLOC_FAILED."""
    monkeypatch.setenv("PYDNN_CONV_TUNING_CACHE", "0")
    pb = Problem(BWD_CASES[1] if dtype == BF16 else BWD_CASES[0], dtype)
    pb.x.random(rng)
    pb.w.random(rng)
    pb.y.random(rng)
    ws, n = _workspace(1 << 24)
    r = pydnn.find_convolution_backward_data_algorithm_ex(handle, pb.wdesc, pb.w.ptr, pb.y.desc, pb.y.ptr, pb.conv,
                                                          pb.x.desc, pb.x.ptr, 6, ws.ptr, n)
    d1 = next(p for p in r if p.algo == BWD_D1)
    need = pydnn.get_convolution_backward_data_workspace_size(handle, pb.wdesc, pb.y.desc, pb.conv, pb.x.desc, BWD_D1)
    assert d1.status == pydnn.PYDNN_STATUS_SUCCESS and d1.time > 0 and d1.memory == need > 0
    assert d1.determinism == pydnn.PYDNN_DETERMINISTIC
    r = pydnn.find_convolution_forward_algorithm_ex(handle, pb.x.desc, pb.x.ptr, pb.wdesc, pb.w.ptr, pb.conv,
                                                    pb.y.desc, pb.y.ptr, 8, ws.ptr, n)
    g = next(p for p in r if p.algo == FWD_GEMM)
    assert g.status == pydnn.PYDNN_STATUS_SUCCESS and g.determinism == pydnn.PYDNN_DETERMINISTIC
    assert g.memory == pydnn.get_convolution_forward_workspace_size(handle, pb.x.desc, pb.wdesc, pb.conv, pb.y.desc,
                                                                    FWD_GEMM)
    r = pydnn.find_convolution_backward_data_algorithm_ex(handle, pb.wdesc, pb.w.ptr, pb.y.desc, pb.y.ptr, pb.conv,
                                                          pb.x.desc, pb.x.ptr, 6, ws.ptr, need - 1)
    assert next(p for p in r if p.algo == BWD_D1).status == pydnn.PYDNN_STATUS_ALLOC_FAILED
