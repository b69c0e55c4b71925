"""The GEMM (forward) and WINOGRAD_NONFUSED (forward, backward data) convolution algorithms on the GPU
against the float64 reference: every dtype, NCHW / NHWC / padded layouts, NCHW and NHWC filters, groups,
both modes, odd sizes, alpha / beta, outputs poisoned first and their gaps checked untouched; the fused
bias + activation epilogue through both; bitwise reproducibility; the exact workspace they ask for."""
import numpy as np
import pytest

import pydnn
from pydnn import tuning
from devtensor import DevTensor, assert_close
from pydnn.ops.convolution import winograd as Wg
from pydnn.reference import convolution as ref
from test_convolution_gpu import (BF16, CASES, CONV, F16, F32, F64, NCHW, NHWC, XCORR,  # noqa: F401
                                  Problem, _strides, _workspace, check_backward_data, check_forward)

pytestmark = pytest.mark.gpu

FWD_GEMM = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_GEMM
FWD_WINO = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED
BWD_WINO = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED
DTYPES = [F32, F16, BF16, F64]

WINO_CASES = [  # xdims, k, filt, pad, stride, dil, groups, layout, filter format
    ((2, 6, 13, 11), 10, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),
    ((3, 5, 8, 9), 7, (3, 3), (0, 2), (1, 1), (1, 1), 1, "nchw", NCHW),         # odd pads, odd width
    ((2, 8, 12, 9), 6, (3, 3), (2, 1), (1, 1), (1, 1), 2, "gap", NHWC),        # groups, padded layout
    ((2, 16, 9, 10), 16, (3, 3), (1, 1), (1, 1), (1, 1), 16, "nhwc", NCHW),    # depthwise
    ((4, 70, 15, 15), 80, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),    # several GEMM tiles, long K
    ((1, 33, 3, 2), 40, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nchw", NCHW),      # smaller than one tile
    ((2, 64, 14, 14), 72, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nchw", NCHW),    # a deep reduction (fp32 error)
]
GEMM_CASES = CASES + [((2, 3, 23, 21), 16, (7, 7), (3, 3), (2, 2), (1, 1), 1, "nhwc", NHWC),   # a stem
                      ((2, 16, 9, 9), 24, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC)]    # GEMM on tensor cores


def _ws(handle, pb, direction, algo):
    if direction == "fwd":
        need = pydnn.get_convolution_forward_workspace_size(handle, pb.x.desc, pb.wdesc, pb.conv, pb.y.desc, algo)
    else:
        need = pydnn.get_convolution_backward_data_workspace_size(handle, pb.wdesc, pb.y.desc, pb.conv, pb.x.desc,
                                                                  algo)
    assert need > 0
    return _workspace(need)


def _forward(handle, rng, case, dtype, algo):
    check_forward(handle, rng, lambda mode: Problem(case, dtype, mode), dtype, algo, f"forward algo {algo}",
                  workspace=lambda pb: _ws(handle, pb, "fwd", algo))


@pytest.mark.parametrize("case", GEMM_CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_forward(handle, rng, case, dtype):
    _forward(handle, rng, case, dtype, FWD_GEMM)


@pytest.mark.parametrize("case", WINO_CASES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tile", Wg.TILES)
def test_winograd_forward(handle, rng, case, dtype, tile, monkeypatch):
    monkeypatch.setattr(tuning.conv_winograd, "PREFERRED_TILE", tile)  # F(2x2, 3x3) and F(4x4, 3x3)
    _forward(handle, rng, case, dtype, FWD_WINO)


@pytest.mark.parametrize("case", WINO_CASES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tile", Wg.TILES)
def test_winograd_backward_data(handle, rng, case, dtype, tile, monkeypatch):
    monkeypatch.setattr(tuning.conv_winograd, "PREFERRED_TILE", tile)

    def run(pb, alpha, beta):
        ws, n = _ws(handle, pb, "bwd", BWD_WINO)
        pydnn.convolution_backward_data(handle, alpha, pb.wdesc, pb.w.ptr, pb.y.desc, pb.y.ptr, pb.conv, BWD_WINO,
                                        ws.ptr, n, beta, pb.x.desc, pb.x.ptr)

    check_backward_data(rng, lambda mode: Problem(case, dtype, mode), dtype, run, "backward data winograd")


@pytest.mark.parametrize("algo,case", [(FWD_GEMM, CASES[2]), (FWD_GEMM, GEMM_CASES[-1]), (FWD_WINO, WINO_CASES[0]),
                                       (FWD_WINO, WINO_CASES[2])])
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_bias_activation(handle, rng, algo, case, dtype):
    check_bias_activation(handle, rng, case, dtype, algo, ((pydnn.PYDNN_ACTIVATION_RELU, 0.0, 0.5),
                                                           (pydnn.PYDNN_ACTIVATION_ELU, 0.7, 0.0)),
                          "nchw", lambda pb: _ws(handle, pb, "fwd", algo), f"bias+act algo {algo}")


def check_bias_activation(handle, rng, case, dtype, algo, acts, z_layout, workspace, what):
    """ConvolutionBiasActivationForward with `algo` (alpha1 0.8, z laid out z_layout, a bias) for each
    (activation, coef, alpha2) of acts against the float64 reference, y poisoned first; then a plain forward
    on the same plan: the epilogue settings must not leak into it. workspace(pb) -> (buffer, bytes)."""
    for act_mode, coef, alpha2 in acts:
        pb = Problem(case, dtype, XCORR)
        x, w = pb.x.random(rng), pb.w.random(rng)
        z = DevTensor(pb.yd, dtype, _strides(pb.yd, z_layout))
        zv = z.random(rng)
        bias = DevTensor((1, pb.yd[1]) + (1,) * (len(pb.yd) - 2), dtype)
        bv = bias.random(rng)
        act = pydnn.create_activation_descriptor()
        pydnn.set_activation_descriptor(act, act_mode, pydnn.PYDNN_NOT_PROPAGATE_NAN, coef)
        pb.y.poison()
        ws, n = workspace(pb)
        pydnn.convolution_bias_activation_forward(handle, 0.8, pb.x.desc, pb.x.ptr, pb.wdesc, pb.w.ptr, pb.conv, algo,
                                                  ws.ptr, n, alpha2, z.desc, z.ptr, bias.desc, bias.ptr, act,
                                                  pb.y.desc, pb.y.ptr)
        want = ref.bias_activation_forward(0.8, x, w, alpha2, zv, bv, act_mode, coef, *pb.args())
        scale = 0.8 * ref.forward_raw(np.abs(x), np.abs(w), *pb.args()) + abs(alpha2) * np.abs(zv) + np.abs(bv)
        assert_close(pb.y.download(), want, dtype, f"{what} act {act_mode}", scale=scale)
        pb.y.check_untouched()
        pb.y.poison()
        pydnn.convolution_forward(handle, 1.0, pb.x.desc, pb.x.ptr, pb.wdesc, pb.w.ptr, pb.conv, algo, ws.ptr, n,
                                  0.0, pb.y.desc, pb.y.ptr)
        assert_close(pb.y.download(), ref.forward(1.0, x, w, 0.0, None, *pb.args()), dtype, "plain after fused",
                     scale=ref.forward_raw(np.abs(x), np.abs(w), *pb.args()))


@pytest.mark.parametrize("tile", Wg.TILES)
def test_bitwise_reproducible(handle, rng, tile, monkeypatch):
    monkeypatch.setattr(tuning.conv_winograd, "PREFERRED_TILE", tile)
    pb = Problem(WINO_CASES[4], F32)
    pb.x.random(rng)
    pb.w.random(rng)
    pb.y.random(rng)
    for algo, direction in ((FWD_GEMM, "fwd"), (FWD_WINO, "fwd"), (BWD_WINO, "bwd")):
        ws, n = _ws(handle, pb, direction, algo)
        outs = []
        for _ in range(3):
            out = pb.y if direction == "fwd" else pb.x
            out.poison()
            if direction == "fwd":
                pydnn.convolution_forward(handle, 1.0, pb.x.desc, pb.x.ptr, pb.wdesc, pb.w.ptr, pb.conv, algo, ws.ptr,
                                          n, 0.0, pb.y.desc, pb.y.ptr)
            else:
                pydnn.convolution_backward_data(handle, 1.0, pb.wdesc, pb.w.ptr, pb.y.desc, pb.y.ptr, pb.conv, algo,
                                                ws.ptr, n, 0.0, pb.x.desc, pb.x.ptr)
            outs.append(out.buf.to_numpy().copy())
        assert all((o.view(np.uint32) == outs[0].view(np.uint32)).all() for o in outs), algo


def test_find_times_the_new_algorithms(handle, rng, monkeypatch):
    monkeypatch.setenv("PYDNN_CONV_TUNING_CACHE", "0")
    pb = Problem(WINO_CASES[4], F32)
    pb.x.random(rng)
    pb.w.random(rng)
    ws, n = _workspace(1 << 26)
    r = pydnn.find_convolution_forward_algorithm_ex(handle, pb.x.desc, pb.x.ptr, pb.wdesc, pb.w.ptr, pb.conv,
                                                    pb.y.desc, pb.y.ptr, 8, ws.ptr, n)
    ok = {p.algo: p for p in r if p.status == pydnn.PYDNN_STATUS_SUCCESS}
    assert set(ok) == {pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, FWD_GEMM, FWD_WINO,
                       pydnn.PYDNN_CONVOLUTION_FWD_ALGO_FFT}
    assert all(p.time > 0 and p.determinism == pydnn.PYDNN_DETERMINISTIC for p in ok.values())
    assert ok[FWD_WINO].memory == pydnn.get_convolution_forward_workspace_size(handle, pb.x.desc, pb.wdesc, pb.conv,
                                                                               pb.y.desc, FWD_WINO)
    small = pydnn.find_convolution_forward_algorithm_ex(handle, pb.x.desc, pb.x.ptr, pb.wdesc, pb.w.ptr, pb.conv,
                                                        pb.y.desc, pb.y.ptr, 8, ws.ptr, 1024)
    assert {p.algo: p.status for p in small}[FWD_WINO] == pydnn.PYDNN_STATUS_ALLOC_FAILED
    r = pydnn.find_convolution_backward_data_algorithm_ex(handle, pb.wdesc, pb.w.ptr, pb.y.desc, pb.y.ptr, pb.conv,
                                                          pb.x.desc, pb.x.ptr, 6, ws.ptr, n)
    assert {p.algo: p.status for p in r}[BWD_WINO] == pydnn.PYDNN_STATUS_SUCCESS
