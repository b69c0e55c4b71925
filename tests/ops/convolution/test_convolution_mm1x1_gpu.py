"""16-bit 1x1 convolutions through pydnn.ops.matmul (issue 18; pydnn/ops/convolution/gemm.py, mm16_ok) on the GPU
against the float64 reference: FWD_ALGO_GEMM as one matmul on x itself (NHWC images as one GEMM of N * P rows,
NCHW per image; strided / padded 1x1's: the gather + the implicit view, as measured faster); BWD_DATA_ALGO_0 as one
matmul into dx (stride 1, unpadded; strided ones keep the CUDA-core gather); odd channel counts (the
unaligned matmul path); both modes, alpha / beta; outputs poisoned first and checked untouched around them;
bitwise reproducibility; the fused bias + activation on the GEMM algorithm's 1x1 plan (the tensor-core
implicit GEMM's epilogue); Find times the new plans."""
import pytest

import pydnn
from pydnn import tuning
from pydnn.ops.convolution import gemm as G, plans as CP, problem as CPb
from test_convolution_algos_gpu import check_bias_activation
from test_convolution_gpu import (BF16, BWD_DATA_MODES, F16, NCHW, NHWC, XCORR, Problem, _workspace,
                                  check_backward_data, check_forward)

pytestmark = pytest.mark.gpu

FWD_GEMM = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_GEMM
BWD_D0 = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_0

CASES = [  # xdims, k, filt, pad, stride, dil, groups, layout, filter format; (kind of plan)
    (((3, 24, 7, 9), 40, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC), "flat"),     # one GEMM of 3 * 63 rows
    (((2, 64, 11, 13), 72, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC), "flat"),   # several tiles
    (((2, 12, 5, 6), 20, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC), "flat"),     # C % 8 != 0: unaligned path
    (((2, 16, 7, 5), 24, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nchw", NCHW), "nchw"),     # per image, filter as A
    (((2, 16, 9, 11), 24, (1, 1), (0, 0), (2, 2), (1, 1), 1, "nhwc", NHWC), "strided"),  # 1x1/2: gather (+ col2im)
    (((3, 8, 8, 7), 16, (1, 1), (0, 0), (3, 2), (1, 1), 1, "nhwc", NHWC), "strided"),   # odd strides
    (((2, 16, 6, 5), 8, (1, 1), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC), "padded"),    # a padded 1x1 (forward only)
    (((2, 16, 3, 4, 5), 8, (1, 1, 1), (0, 0, 0), (1, 1, 1), (1, 1, 1), 1, "nhwc", NHWC), "flat"),   # 3-d
]


def _ws(handle, pb, direction, algo):
    if direction == "fwd":
        need = pydnn.get_convolution_forward_workspace_size(handle, pb.x.desc, pb.wdesc, pb.conv, pb.y.desc, algo)
    else:
        need = pydnn.get_convolution_backward_data_workspace_size(handle, pb.wdesc, pb.y.desc, pb.conv, pb.x.desc,
                                                                  algo)
    return _workspace(need)


def _fwd_plan_is_matmul(handle, pb, kind):
    pl = CP.new_plan(handle, CPb.DIR_FWD, FWD_GEMM, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
    assert isinstance(pl, G.GemmPlan)
    # matmul at stride 1 unpadded; strided / padded: the gather + the implicit 1x1 view (measured faster)
    assert pl.direct == (kind in ("flat", "nchw")) and (pl.mm is not None) == pl.direct
    if kind == "flat":   # the images as one GEMM of N * P rows
        assert pl.mm[0].batch == 1 and pl.mm[0].m == pb.x.dims[0] * pb.y.desc.dims[2] * pb.y.desc.dims[3] * (
            pb.y.desc.dims[4] if len(pb.y.desc.dims) > 4 else 1)


@pytest.mark.parametrize("case,kind", CASES, ids=[f"{k}{i}" for i, (_, k) in enumerate(CASES)])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "half"])
def test_mm1x1_forward(handle, rng, monkeypatch, case, kind, dtype):
    # the GEMM plan itself: tuning.conv.TMA_1X1 moves short-reduction 1x1 plans to fwd_tma (its own GPU tests)
    monkeypatch.setattr(tuning.conv, "TMA_1X1", False)
    check_forward(handle, rng, lambda mode: Problem(case, dtype, mode), dtype, FWD_GEMM, "1x1 forward GEMM (matmul)",
                  workspace=lambda pb: _ws(handle, pb, "fwd", FWD_GEMM),
                  before=lambda pb: _fwd_plan_is_matmul(handle, pb, kind))


def _backward_data(handle, pb, alpha, beta):
    ws, n = _ws(handle, pb, "bwd", BWD_D0)
    pydnn.convolution_backward_data(handle, alpha, pb.wdesc, pb.w.ptr, pb.y.desc, pb.y.ptr, pb.conv, BWD_D0, ws.ptr,
                                    n, beta, pb.x.desc, pb.x.ptr)


@pytest.mark.parametrize("case,kind", [c for c in CASES if c[1] not in ("padded", "strided")],
                         ids=[f"{k}{i}" for i, (_, k) in enumerate(CASES) if k not in ("padded", "strided")])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "half"])
def test_mm1x1_backward_data(handle, rng, monkeypatch, case, kind, dtype):
    # the GEMM plan itself: tuning.conv.TMA_1X1 moves short-reduction 1x1 plans to fwd_tma (its own GPU tests)
    monkeypatch.setattr(tuning.conv, "TMA_1X1", False)
    def make(mode):
        pb = Problem(case, dtype, mode)
        pl = CP.new_plan(handle, CPb.DIR_BWD_DATA, BWD_D0, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
        assert isinstance(pl, G.BwdGemmPlan) and pl.direct, "BWD_DATA_ALGO_0 of a 16-bit 1x1 problem is its GEMM form"
        return pb

    check_backward_data(rng, make, dtype, lambda pb, alpha, beta: _backward_data(handle, pb, alpha, beta),
                        "1x1 backward data ALGO_0 (matmul)", BWD_DATA_MODES + ((XCORR, 0.5, -1.0),),
                        reproducible=True)


def test_mm1x1_off_keeps_the_old_plans(handle, rng, monkeypatch):
    """tuning.conv_gemm.MM_1X1 off: the GEMM algorithm's im2col + implicit 1x1, ALGO_0 the CUDA-core gather;
    both still right."""
    monkeypatch.setattr(tuning.conv_gemm, "MM_1X1", False)
    case = CASES[0][0]
    pb = Problem(case, BF16)
    pl = CP.new_plan(handle, CPb.DIR_FWD, FWD_GEMM, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
    assert pl.mm is None and not pl.direct
    check_forward(handle, rng, lambda mode: Problem(case, BF16, mode), BF16, FWD_GEMM, "1x1 forward GEMM (off)",
                  workspace=lambda pb: _ws(handle, pb, "fwd", FWD_GEMM))
    pl = CP.new_plan(handle, CPb.DIR_BWD_DATA, BWD_D0, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
    assert not isinstance(pl, G.BwdGemmPlan)
    check_backward_data(rng, lambda mode: Problem(case, BF16, mode), BF16,
                        lambda pb, alpha, beta: _backward_data(handle, pb, alpha, beta), "ALGO_0 (off)")


@pytest.mark.parametrize("case", [CASES[0][0], CASES[1][0]], ids=["flat0", "flat1"])
def test_mm1x1_bias_activation(handle, rng, case):
    """ConvolutionBiasActivationForward on the GEMM algorithm's direct 1x1 plan runs the tensor-core implicit
    GEMM's epilogue (matmul has no activation); a plain call on the same plan after it is matmul's again."""
    check_bias_activation(handle, rng, case, BF16, FWD_GEMM,
                          ((pydnn.PYDNN_ACTIVATION_RELU, 0.0, 0.5), (pydnn.PYDNN_ACTIVATION_IDENTITY, 0.0, 0.0),
                           (pydnn.PYDNN_ACTIVATION_CLIPPED_RELU, 1.5, -1.0)),
                          "nhwc", lambda pb: _ws(handle, pb, "fwd", FWD_GEMM), "1x1 GEMM bias+act")


def test_find_times_the_mm1x1_plans(handle, rng, monkeypatch):
    """Find...Ex times FWD_ALGO_GEMM and BWD_DATA_ALGO_0 on a 16-bit 1x1 problem: both succeed, deterministic,
    no workspace (the direct plans), and the output Find leaves is right."""
    monkeypatch.setenv("PYDNN_CONV_TUNING_CACHE", "0")
    pb = Problem(CASES[1][0], BF16)
    pb.x.random(rng)
    pb.w.random(rng)
    pb.y.random(rng)
    ws, n = _workspace(1 << 20)
    r = pydnn.find_convolution_forward_algorithm_ex(handle, pb.x.desc, pb.x.ptr, pb.wdesc, pb.w.ptr, pb.conv,
                                                    pb.y.desc, pb.y.ptr, 8, ws.ptr, n)
    g = next(p for p in r if p.algo == FWD_GEMM)
    assert g.status == pydnn.PYDNN_STATUS_SUCCESS and g.time > 0 and g.memory == 0
    assert g.determinism == pydnn.PYDNN_DETERMINISTIC
    r = pydnn.find_convolution_backward_data_algorithm_ex(handle, pb.wdesc, pb.w.ptr, pb.y.desc, pb.y.ptr, pb.conv,
                                                          pb.x.desc, pb.x.ptr, 6, ws.ptr, n)
    d0 = next(p for p in r if p.algo == BWD_D0)
    assert d0.status == pydnn.PYDNN_STATUS_SUCCESS and d0.time > 0 and d0.memory == 0
    assert d0.determinism == pydnn.PYDNN_DETERMINISTIC
