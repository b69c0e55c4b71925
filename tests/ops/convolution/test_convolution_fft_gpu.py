"""The FFT convolution algorithm (forward, backward data, backward filter) on the GPU against the float64 reference:
every dtype, NCHW / NHWC / padded layouts, NCHW and NHWC filters, both modes, odd sizes (H, W not powers of
two, odd C and K, batches not a multiple of the product kernel's 4), transforms from 2 x 32 to the largest
(128 x 64, past 48 KiB of shared memory), alpha / beta, outputs poisoned first and their gaps checked
untouched; the fused bias + activation epilogue; bitwise reproducibility; Find lists it with its exact
workspace."""
import numpy as np
import pytest

import pydnn
from devtensor import DevTensor, assert_close
from pydnn.ops.convolution import fft as Ff
from pydnn.reference import convolution as ref
from test_convolution_gpu import BF16, CONV, F16, F32, F64, NCHW, NHWC, XCORR, Problem, _strides, check_forward

pytestmark = pytest.mark.gpu

FWD_FFT = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_FFT
BWD_FFT = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_FFT
WGRAD_FFT = pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT
DTYPES = [F32, F16, BF16, F64]


def _case(xd, k, filt, pad, layout, wfmt):  # in test_convolution_gpu.py's form: stride 1, dilation 1, one group
    return xd, k, filt, pad, (1, 1), (1, 1), 1, layout, wfmt


CASES = [_case(*c) for c in [  # xdims, k, filt, pad, layout, filter format
    ((2, 3, 13, 11), 5, (9, 9), (4, 4), "nchw", NCHW),       # F 32 x 16
    ((3, 7, 37, 45), 9, (9, 9), (4, 4), "nhwc", NHWC),       # F 64 x 64 (64 KiB of shared memory)
    ((1, 5, 30, 26), 3, (11, 11), (5, 5), "gap", NCHW),      # padded layout, F 64 x 32
    ((2, 3, 20, 17), 7, (13, 13), (6, 6), "nchw", NHWC),     # 13x13, F 32 x 32
    ((1, 2, 100, 33), 3, (13, 7), (12, 3), "nhwc", NCHW),    # the largest transform (128 x 64), full padding in h
    ((2, 1, 19, 23), 1, (5, 3), (0, 2), "nchw", NCHW),       # one channel each way, pad 0
    ((5, 70, 15, 15), 81, (3, 3), (1, 1), "nhwc", NHWC),     # 3x3, long reduction, partial product tiles
    ((2, 4, 1, 21), 6, (1, 5), (0, 2), "nchw", NCHW),        # one row (Fh = 2)
]]


def _ws(handle, pb, direction):
    if direction == "fwd":
        need = pydnn.get_convolution_forward_workspace_size(handle, pb.x.desc, pb.wdesc, pb.conv, pb.y.desc, FWD_FFT)
    elif direction == "wgrad":
        need = pydnn.get_convolution_backward_filter_workspace_size(handle, pb.x.desc, pb.y.desc, pb.conv, pb.wdesc,
                                                                    WGRAD_FFT)
    else:
        need = pydnn.get_convolution_backward_data_workspace_size(handle, pb.wdesc, pb.y.desc, pb.conv, pb.x.desc,
                                                                  BWD_FFT)
    assert need > 0
    return pydnn.DeviceArray((need,), np.uint8), need


def _fwd(handle, pb, ws, n, alpha, beta):
    pydnn.convolution_forward(handle, alpha, pb.x.desc, pb.x.ptr, pb.wdesc, pb.w.ptr, pb.conv, FWD_FFT, ws.ptr, n,
                              beta, pb.y.desc, pb.y.ptr)


def _bwd(handle, pb, ws, n, alpha, beta):
    pydnn.convolution_backward_data(handle, alpha, pb.wdesc, pb.w.ptr, pb.y.desc, pb.y.ptr, pb.conv, BWD_FFT, ws.ptr,
                                    n, beta, pb.x.desc, pb.x.ptr)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fft_forward(handle, rng, case, dtype):
    check_forward(handle, rng, lambda mode: Problem(case, dtype, mode), dtype, FWD_FFT, "forward FFT",
                  workspace=lambda pb: _ws(handle, pb, "fwd"))


def _wgrad(handle, pb, ws, n, alpha, beta):
    pydnn.convolution_backward_filter(handle, alpha, pb.x.desc, pb.x.ptr, pb.y.desc, pb.y.ptr, pb.conv, WGRAD_FFT,
                                      ws.ptr, n, beta, pb.wdesc, pb.w.ptr)


def _check_backward(handle, rng, case, dtype, direction):
    """Backward data (dx from w, dy) or backward filter (dw from x, dy) through FFT, both modes, with and
    without beta, the output poisoned when beta = 0."""
    for mode, alpha, beta in ((XCORR, 1.0, 0.0), (CONV, -1.5, 0.25)):
        pb = Problem(case, dtype, mode)
        if direction == "bwd":
            out, a, run, want_f, raw_f = pb.x, pb.w.random(rng), _bwd, ref.backward_data, ref.backward_data_raw
        else:
            out, a, run, want_f, raw_f = pb.w, pb.x.random(rng), _wgrad, ref.backward_filter, ref.backward_filter_raw
        dy = pb.y.random(rng)
        old = out.random(rng) if beta else np.zeros(out.dims)
        if not beta:
            out.poison()
        ws, n = _ws(handle, pb, direction)
        run(handle, pb, ws, n, alpha, beta)
        want = want_f(alpha, a, dy, beta, old, *pb.args())
        scale = abs(alpha) * raw_f(np.abs(a), np.abs(dy), out.dims[2:], *pb.args()) + abs(beta) * np.abs(old)
        assert_close(out.download(), want, dtype, f"{direction} FFT mode {mode}", scale=scale)
        out.check_untouched()


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fft_backward_data(handle, rng, case, dtype):
    _check_backward(handle, rng, case, dtype, "bwd")


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_fft_backward_filter(handle, rng, case, dtype):
    _check_backward(handle, rng, case, dtype, "wgrad")


@pytest.mark.parametrize("case", [CASES[0], CASES[2]])
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_bias_activation(handle, rng, case, dtype):
    for act_mode, coef, alpha2 in ((pydnn.PYDNN_ACTIVATION_RELU, 0.0, 0.5), (pydnn.PYDNN_ACTIVATION_ELU, 0.7, 0.0)):
        pb = Problem(case, dtype, XCORR)
        x, w = pb.x.random(rng), pb.w.random(rng)
        z = DevTensor(pb.yd, dtype, _strides(pb.yd, "nhwc"))
        zv = z.random(rng)
        bias = DevTensor((1, pb.yd[1], 1, 1), dtype)
        bv = bias.random(rng)
        act = pydnn.create_activation_descriptor()
        pydnn.set_activation_descriptor(act, act_mode, pydnn.PYDNN_NOT_PROPAGATE_NAN, coef)
        pb.y.poison()
        ws, n = _ws(handle, pb, "fwd")
        pydnn.convolution_bias_activation_forward(handle, 0.8, pb.x.desc, pb.x.ptr, pb.wdesc, pb.w.ptr, pb.conv,
                                                  FWD_FFT, ws.ptr, n, alpha2, z.desc, z.ptr, bias.desc, bias.ptr, act,
                                                  pb.y.desc, pb.y.ptr)
        want = ref.bias_activation_forward(0.8, x, w, alpha2, zv, bv, act_mode, coef, *pb.args())
        scale = 0.8 * ref.forward_raw(np.abs(x), np.abs(w), *pb.args()) + alpha2 * np.abs(zv) + np.abs(bv)
        assert_close(pb.y.download(), want, dtype, "bias+act FFT", scale=scale)
        pb.y.check_untouched()
        # the plan is shared with the plain forward: the epilogue settings must not leak into it
        pb.y.poison()
        _fwd(handle, pb, ws, n, 1.0, 0.0)
        assert_close(pb.y.download(), ref.forward(1.0, x, w, 0.0, None, *pb.args()), dtype, "plain after fused",
                     scale=ref.forward_raw(np.abs(x), np.abs(w), *pb.args()))


def test_bitwise_reproducible(handle, rng):
    pb = Problem(CASES[1], F32)
    pb.x.random(rng)
    pb.w.random(rng)
    pb.y.random(rng)
    for direction, out, run in (("fwd", pb.y, _fwd), ("bwd", pb.x, _bwd), ("wgrad", pb.w, _wgrad)):
        ws, n = _ws(handle, pb, direction)
        outs = []
        for _ in range(3):
            out.poison()
            run(handle, pb, ws, n, 1.0, 0.0)
            outs.append(out.buf.to_numpy().copy())
        assert all((o.view(np.uint32) == outs[0].view(np.uint32)).all() for o in outs), direction


def test_find_times_fft(handle, rng, monkeypatch):
    monkeypatch.setenv("PYDNN_CONV_TUNING_CACHE", "0")
    pb = Problem(CASES[1], F32)
    pb.x.random(rng)
    pb.w.random(rng)
    ws = pydnn.DeviceArray((1 << 26,), np.uint8)
    r = pydnn.find_convolution_forward_algorithm_ex(handle, pb.x.desc, pb.x.ptr, pb.wdesc, pb.w.ptr, pb.conv,
                                                    pb.y.desc, pb.y.ptr, 8, ws.ptr, 1 << 26)
    f = next(p for p in r if p.algo == FWD_FFT)
    assert f.status == pydnn.PYDNN_STATUS_SUCCESS and f.time > 0 and f.determinism == pydnn.PYDNN_DETERMINISTIC
    assert f.memory == pydnn.get_convolution_forward_workspace_size(handle, pb.x.desc, pb.wdesc, pb.conv, pb.y.desc,
                                                                    FWD_FFT)
    small = pydnn.find_convolution_forward_algorithm_ex(handle, pb.x.desc, pb.x.ptr, pb.wdesc, pb.w.ptr, pb.conv,
                                                        pb.y.desc, pb.y.ptr, 8, ws.ptr, 1024)
    assert {p.algo: p.status for p in small}[FWD_FFT] == pydnn.PYDNN_STATUS_ALLOC_FAILED
    r = pydnn.find_convolution_backward_data_algorithm_ex(handle, pb.wdesc, pb.w.ptr, pb.y.desc, pb.y.ptr, pb.conv,
                                                          pb.x.desc, pb.x.ptr, 6, ws.ptr, 1 << 26)
    b = next(p for p in r if p.algo == BWD_FFT)
    assert b.status == pydnn.PYDNN_STATUS_SUCCESS and b.time > 0
    r = pydnn.find_convolution_backward_filter_algorithm_ex(handle, pb.x.desc, pb.x.ptr, pb.y.desc, pb.y.ptr, pb.conv,
                                                            pb.wdesc, pb.w.ptr, 7, ws.ptr, 1 << 26)
    f = next(p for p in r if p.algo == WGRAD_FFT)
    assert f.status == pydnn.PYDNN_STATUS_SUCCESS and f.time > 0 and f.determinism == pydnn.PYDNN_DETERMINISTIC


def test_largest_transform_plan():
    """CASES[4] is the 128 x 64 transform (the one past 48 KiB of shared memory before 64 x 64's)."""
    from test_fuzz_cpu import cpu_handle
    from pydnn import tuning
    from pydnn.ops.convolution import implicit as CI, plans as CP, problem as CPb, tensor_core as CT
    pb = Problem(CASES[4], F32)
    pl = CP.new_plan(cpu_handle(), CPb.DIR_FWD, FWD_FFT, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
    assert pl.fft == (128, 64) and pl.smem_bytes > 48 * 1024
    assert Ff.MAX_POINTS == 128 * 64
