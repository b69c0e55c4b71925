"""ConvolutionBiasActivationForward on the GEMM algorithm's direct 16-bit 1x1 plan as the graph API's fused
matmul (issue 18; gemm.FusedMM, tuning.conv_gemm.MM_FUSED): bias (+ z added unscaled) (+ ReLU as max(v, 0))
generated into pydnn.ops.matmul's epilogue, NHWC (one GEMM of N * P rows) and NCHW (per image, the filter as
A), against the float64 reference with y poisoned first and checked untouched around it; the calls the
route declines (alpha1 != 1, PROPAGATE_NAN, CLIPPED_RELU, z scaled) still right through the implicit GEMM;
NaN in x gives 0 under ReLU NOT_PROPAGATE_NAN as the convolution epilogue's; a plain call after a fused one
is matmul's plain result again."""
import numpy as np
import pytest

import pydnn
from devtensor import DevTensor, assert_close
from pydnn import tuning
from pydnn.ops.convolution import gemm as G
from pydnn.reference import convolution as ref
from test_convolution_gpu import BF16, F16, NCHW, NHWC, XCORR, Problem, _strides, _workspace

pytestmark = pytest.mark.gpu

FWD_GEMM = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_GEMM
RELU, IDENT, CLIP = pydnn.PYDNN_ACTIVATION_RELU, pydnn.PYDNN_ACTIVATION_IDENTITY, pydnn.PYDNN_ACTIVATION_CLIPPED_RELU

CASES = [  # xdims, k, filt, pad, stride, dil, groups, layout, filter format
    ((3, 24, 7, 9), 40, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),       # one GEMM of 189 rows
    ((2, 64, 11, 13), 136, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),    # several tiles, K tail
    ((4, 128, 7, 7), 256, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),     # the layer, smaller
    ((2, 16, 7, 5), 24, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nchw", NCHW),       # per image, the filter as A
    ((2, 64, 9, 8), 72, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nchw", NCHW),
    ((2, 16, 3, 4, 5), 8, (1, 1, 1), (0, 0, 0), (1, 1, 1), (1, 1, 1), 1, "nhwc", NHWC),   # 3-d
]


class _Count:
    def __init__(self, monkeypatch):
        self.n = 0
        run = G.FusedMM.run

        def counted(fm, *a):
            self.n += 1
            return run(fm, *a)
        monkeypatch.setattr(G.FusedMM, "run", counted)


def _ws(handle, pb):
    return _workspace(pydnn.get_convolution_forward_workspace_size(handle, pb.x.desc, pb.wdesc, pb.conv, pb.y.desc,
                                                                   FWD_GEMM))


def _fused_call(handle, rng, case, dtype, act_mode, coef, alpha1, alpha2, nan_opt=pydnn.PYDNN_NOT_PROPAGATE_NAN,
                z_inplace=False):
    pb = Problem(case, dtype, XCORR)
    x, w = pb.x.random(rng), pb.w.random(rng)
    z = pb.y if z_inplace else DevTensor(pb.yd, dtype, _strides(pb.yd, case[7]))
    zv = z.random(rng)
    bias = DevTensor((1, pb.yd[1]) + (1,) * (len(pb.yd) - 2), dtype)
    bv = bias.random(rng)
    act = pydnn.create_activation_descriptor()
    pydnn.set_activation_descriptor(act, act_mode, nan_opt, coef)
    if not z_inplace:
        pb.y.poison()
    ws, n = _ws(handle, pb)
    pydnn.convolution_bias_activation_forward(handle, alpha1, pb.x.desc, pb.x.ptr, pb.wdesc, pb.w.ptr, pb.conv, FWD_GEMM,
                                              ws.ptr, n, alpha2, z.desc, z.ptr, bias.desc, bias.ptr, act,
                                              pb.y.desc, pb.y.ptr)
    want = ref.bias_activation_forward(alpha1, x, w, alpha2, zv, bv, act_mode, coef, *pb.args(),
                                       propagate_nan=nan_opt == pydnn.PYDNN_PROPAGATE_NAN)
    scale = abs(alpha1) * ref.forward_raw(np.abs(x), np.abs(w), *pb.args()) + \
        abs(alpha2) * np.abs(zv) + np.abs(bv)
    return pb, want, scale, (x, w, ws, n)


@pytest.mark.parametrize("case", CASES, ids=[f"{c[7]}{i}" for i, c in enumerate(CASES)])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "half"])
def test_fused_1x1_on_matmul(handle, rng, monkeypatch, case, dtype):
    # the GEMM plan itself: tuning.conv.TMA_1X1 would move its short-reduction 1x1 plans to fwd_tma (conv_tma.py;
    # tests/ops/convolution/test_convolution_tma_gpu.py covers that route)
    monkeypatch.setattr(tuning.conv, "TMA_1X1", False)
    count = _Count(monkeypatch)
    for act_mode, alpha2 in ((RELU, 0.0), (IDENT, 0.0), (RELU, 1.0), (IDENT, 1.0)):
        before = count.n
        pb, want, scale, (x, w, ws, n) = _fused_call(handle, rng, case, dtype, act_mode, 0.0, 1.0, alpha2)
        assert count.n == before + 1, "the fused call ran the graph API's fused matmul"
        assert_close(pb.y.download(), want, dtype, f"fused 1x1 act {act_mode} alpha2 {alpha2}", scale=scale)
        pb.y.check_untouched()
        pb.y.poison()   # a plain call on the same descriptors: matmul's plain result, no epilogue left over
        pydnn.convolution_forward(handle, 1.0, pb.x.desc, pb.x.ptr, pb.wdesc, pb.w.ptr, pb.conv, FWD_GEMM, ws.ptr, n,
                                  0.0, pb.y.desc, pb.y.ptr)
        assert_close(pb.y.download(), ref.forward(1.0, x, w, 0.0, None, *pb.args()), dtype, "plain after fused",
                     scale=ref.forward_raw(np.abs(x), np.abs(w), *pb.args()))


@pytest.mark.parametrize("case", [CASES[0], CASES[3]], ids=["nhwc", "nchw"])
def test_fused_1x1_in_place_residual(handle, rng, monkeypatch, case):
    """z = y (ResNet's in-place residual): each element read, then written, by the same thread."""
    count = _Count(monkeypatch)
    pb, want, scale, _ = _fused_call(handle, rng, case, BF16, RELU, 0.0, 1.0, 1.0, z_inplace=True)
    assert count.n == 1
    assert_close(pb.y.download(), want, BF16, "fused 1x1 in place", scale=scale)
    pb.y.check_untouched()


@pytest.mark.parametrize("case", [CASES[1], CASES[4]], ids=["nhwc", "nchw"])
def test_fused_1x1_declined_calls_stay_right(handle, rng, monkeypatch, case):
    """What the route does not take runs the implicit GEMM's epilogue, right: alpha1 != 1, ReLU with
    PROPAGATE_NAN, CLIPPED_RELU, a scaled z; and the switch off."""
    count = _Count(monkeypatch)
    for act_mode, coef, alpha1, alpha2, nan_opt in ((RELU, 0.0, 0.8, 0.0, pydnn.PYDNN_NOT_PROPAGATE_NAN),
                                                    (RELU, 0.0, 1.0, 0.0, pydnn.PYDNN_PROPAGATE_NAN),
                                                    (CLIP, 1.5, 1.0, 0.0, pydnn.PYDNN_NOT_PROPAGATE_NAN),
                                                    (IDENT, 0.0, 1.0, -0.5, pydnn.PYDNN_NOT_PROPAGATE_NAN)):
        pb, want, scale, _ = _fused_call(handle, rng, case, BF16, act_mode, coef, alpha1, alpha2, nan_opt)
        assert_close(pb.y.download(), want, BF16, f"declined act {act_mode} alpha1 {alpha1} alpha2 {alpha2}",
                     scale=scale)
        pb.y.check_untouched()
    assert count.n == 0
    monkeypatch.setattr(tuning.conv_gemm, "MM_FUSED", False)
    pb, want, scale, _ = _fused_call(handle, rng, case, BF16, RELU, 0.0, 1.0, 0.0)
    assert count.n == 0
    assert_close(pb.y.download(), want, BF16, "MM_FUSED off", scale=scale)


def test_fused_1x1_relu_nan_gives_zero(handle, rng, monkeypatch):
    """ReLU NOT_PROPAGATE_NAN: a NaN before the activation comes out 0 (max(v, 0)), as the convolution epilogue's."""
    case = CASES[0]
    count = _Count(monkeypatch)
    pb = Problem(case, BF16, XCORR)
    pb.x.random(rng)
    pb.w.random(rng)
    xv = pb.x.download().astype(np.float32)
    xv[0, :, 0, 0] = np.nan   # image 0, pixel (0, 0): all its outputs NaN before the activation
    pb.x.upload(xv)
    bias = DevTensor((1, pb.yd[1], 1, 1), BF16)
    bias.random(rng)
    act = pydnn.create_activation_descriptor()
    pydnn.set_activation_descriptor(act, RELU, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    pb.y.poison()
    ws, n = _ws(handle, pb)
    pydnn.convolution_bias_activation_forward(handle, 1.0, pb.x.desc, pb.x.ptr, pb.wdesc, pb.w.ptr, pb.conv, FWD_GEMM,
                                              ws.ptr, n, 0.0, pb.y.desc, pb.y.ptr, bias.desc, bias.ptr, act,
                                              pb.y.desc, pb.y.ptr)
    assert count.n == 1
    y = pb.y.download()
    assert (y[0, :, 0, 0] == 0).all()
    assert np.isfinite(y).all()


@pytest.mark.parametrize("case", [CASES[2], CASES[1]], ids=["nhwc2", "nhwc1"])
def test_fused_1x1_tma_route(handle, rng, monkeypatch, case):
    """tuning.conv_gemm.MM_FUSED "tma": the fused call on fwd_tma's register epilogue (bias, z, ReLU), right."""
    monkeypatch.setattr(tuning.conv_gemm, "MM_FUSED", "tma")
    count = _Count(monkeypatch)
    for act_mode, alpha2 in ((RELU, 0.0), (RELU, 1.0), (IDENT, 0.0)):
        pb, want, scale, _ = _fused_call(handle, rng, case, BF16, act_mode, 0.0, 1.0, alpha2)
        assert_close(pb.y.download(), want, BF16, f"fused 1x1 on fwd_tma act {act_mode} alpha2 {alpha2}", scale=scale)
        pb.y.check_untouched()
    assert count.n == 0
