"""Convolution on the GPU against the float64 reference: forward (IMPLICIT_GEMM), backward data (ALGO_0),
backward filter (ALGO_0 and the split-K ALGO_1), backward bias and the fused bias + activation forward,
over 1-d / 2-d / 3-d shapes with stride, padding, dilation, groups (depthwise), both modes, NCHW / NHWC /
padded layouts and NHWC filters, every data type, alpha / beta blending; outputs poisoned first and their
gaps checked untouched. Also: bitwise reproducibility of the deterministic algorithms, Find...Ex."""
import numpy as np
import pytest

import pydnn
from devtensor import DevTensor, assert_close
from pydnn import tuning
from pydnn.ops.convolution import implicit as CI, plans as CP, problem as CPb, tensor_core as CT
from pydnn.reference import convolution as ref
from pydnn.tensor import packed_strides

pytestmark = pytest.mark.gpu

F32, F64, F16, BF16 = (pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_DOUBLE, pydnn.PYDNN_DATA_HALF,
                       pydnn.PYDNN_DATA_BFLOAT16)
NCHW, NHWC = pydnn.PYDNN_TENSOR_NCHW, pydnn.PYDNN_TENSOR_NHWC
CONV, XCORR = pydnn.PYDNN_CONVOLUTION, pydnn.PYDNN_CROSS_CORRELATION
FWD_IG = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM
FWD_PRE = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM
BWD_D0 = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_0
BWD_D1 = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_1
BWD_F0, BWD_F1 = pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_0, pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_1

CASES = [  # xdims, k, filt, pad, stride, dil, groups, layout, filter format
    ((3, 5, 37), 7, (3,), (1,), (2,), (1,), 1, "nchw", NCHW),                        # 1-d
    ((2, 6, 13, 11), 10, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),
    ((2, 8, 12, 9), 6, (3, 2), (2, 0), (2, 3), (2, 1), 2, "nchw", NCHW),             # groups, dilation
    ((2, 16, 9, 10), 16, (3, 3), (1, 1), (2, 1), (1, 1), 16, "nhwc", NCHW),         # depthwise
    ((2, 5, 7, 8), 9, (1, 1), (0, 0), (2, 2), (1, 1), 1, "gap", NHWC),              # padded layout, 1x1
    ((1, 3, 5, 6, 7), 4, (2, 3, 3), (1, 1, 0), (1, 2, 1), (2, 1, 1), 1, "nchw", NCHW),  # 3-d
    ((4, 70, 15, 15), 80, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),         # several tiles, long K
]
DTYPES = [F32, F16, BF16, F64]


def _strides(dims, layout):
    if layout == "nhwc":
        return packed_strides(dims, NHWC)
    if layout == "gap":
        s, acc = [0] * len(dims), 1
        for i in reversed(range(len(dims))):
            s[i] = acc
            acc *= dims[i] + (1 if i > 0 else 0)
        return tuple(s)
    return packed_strides(dims, NCHW)


class Problem:
    def __init__(self, case, dtype, mode=XCORR):
        xd, k, filt, pad, st, dil, g, layout, wfmt = case
        self.pad, self.st, self.dil, self.g, self.cross = pad, st, dil, g, mode == XCORR
        self.conv = pydnn.create_convolution_descriptor()
        ctype = F64 if dtype == F64 else F32
        pydnn.set_convolution_nd_descriptor(self.conv, len(pad), pad, st, dil, mode, ctype)
        pydnn.set_convolution_group_count(self.conv, g)
        self.wd = (k, xd[1] // g) + tuple(filt)
        self.yd = (xd[0], k) + ref.out_dims(xd[2:], filt, pad, st, dil)
        self.x = DevTensor(xd, dtype, _strides(xd, layout))
        self.y = DevTensor(self.yd, dtype, _strides(self.yd, layout))
        self.wdesc = pydnn.create_filter_descriptor()
        pydnn.set_filter_nd_descriptor(self.wdesc, dtype, wfmt, len(self.wd), self.wd)
        self.w = DevTensor(self.wd, dtype, self.wdesc.strides)
        self.dtype = dtype

    def args(self):
        return self.pad, self.st, self.dil, self.g, self.cross


def _workspace(nbytes):
    return pydnn.DeviceArray((max(nbytes, 1),), np.uint8), nbytes


def check_forward(handle, rng, make, dtype, algo, what, workspace=None, before=None):
    """ConvolutionForward with `algo` in both modes against the float64 reference: cross-correlation with
    alpha 1, beta 0 (y poisoned: never read, every element written) and convolution with alpha 0.75,
    beta -0.5 over a random y. make(mode) -> the Problem; workspace(pb) -> (buffer with .ptr, bytes) or
    None for none; before(pb): a check on the problem before the call."""
    for mode, alpha, beta in ((XCORR, 1.0, 0.0), (CONV, 0.75, -0.5)):
        pb = make(mode)
        if before is not None:
            before(pb)
        x, w = pb.x.random(rng), pb.w.random(rng)
        y0 = pb.y.random(rng) if beta else None
        if not beta:
            pb.y.poison()
        ws, n = workspace(pb) if workspace is not None else (None, 0)
        pydnn.convolution_forward(handle, alpha, pb.x.desc, pb.x.ptr, pb.wdesc, pb.w.ptr, pb.conv, algo,
                                  ws.ptr if ws is not None else 0, n, beta, pb.y.desc, pb.y.ptr)
        want = ref.forward(alpha, x, w, beta, y0, *pb.args())
        scale = abs(alpha) * ref.forward_raw(np.abs(x), np.abs(w), *pb.args()) + (abs(beta) * np.abs(y0) if beta else 0)
        assert_close(pb.y.download(), want, dtype, f"{what} mode {mode}", scale=scale)
        pb.y.check_untouched()


BWD_DATA_MODES = ((XCORR, 1.0, 0.0), (CONV, -1.5, 0.25))
BWD_FILTER_MODES = ((XCORR, 1.0, 0.0), (CONV, 0.5, 2.0))


def _same_bits_again(t, rerun):
    """The output t poisoned and computed again by rerun(): the same bits (no atomics, fixed orders)."""
    first = t.buf.to_numpy().copy()
    t.poison()
    rerun()
    assert (t.buf.to_numpy().view(np.uint8) == first.view(np.uint8)).all()


def check_bias_activation(handle, rng, case, dtype, algo, what, before):
    """ConvolutionBiasActivationForward with `algo` on a case's cross-correlation: bias per output channel, z (NHWC),
    ReLU / sigmoid, alpha2 0 and -0.5, against the float64 reference (y poisoned, every element written).
    before(pb) runs first (the plan check)."""
    for mode in (pydnn.PYDNN_ACTIVATION_RELU, pydnn.PYDNN_ACTIVATION_SIGMOID):
        for alpha2 in (0.0, -0.5):
            pb = Problem(case, dtype, XCORR)
            x, w = pb.x.random(rng), pb.w.random(rng)
            z = DevTensor(pb.yd, dtype, _strides(pb.yd, "nhwc"))
            zv = z.random(rng)
            pb.y.poison()
            bias = DevTensor((1, pb.yd[1], 1, 1), dtype)
            bv = bias.random(rng)
            act = pydnn.create_activation_descriptor()
            pydnn.set_activation_descriptor(act, mode, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
            before(pb)
            pydnn.convolution_bias_activation_forward(handle, 1.25, pb.x.desc, pb.x.ptr, pb.wdesc, pb.w.ptr, pb.conv,
                                                      algo, 0, 0, alpha2, z.desc, z.ptr, bias.desc, bias.ptr, act,
                                                      pb.y.desc, pb.y.ptr)
            want = ref.bias_activation_forward(1.25, x, w, alpha2, zv, bv, mode, 0.0, *pb.args())
            scale = 1.25 * ref.forward_raw(np.abs(x), np.abs(w), *pb.args()) + abs(alpha2) * np.abs(zv) + np.abs(bv)
            assert_close(pb.y.download(), want, dtype, f"{what} {mode} alpha2 {alpha2}", scale=scale)
            pb.y.check_untouched()


def check_backward_data(rng, make, dtype, run, what, modes=BWD_DATA_MODES, reproducible=False):
    """ConvolutionBackwardData, enqueued by run(pb, alpha, beta), for each (mode, alpha, beta) of modes
    against the float64 reference: dx poisoned when beta is 0 (never read, every element written), random
    otherwise; nothing written around dx. make(mode) -> the Problem (and any check on its plan).
    reproducible: with beta 0, a second run gives the same bits."""
    for mode, alpha, beta in modes:
        pb = make(mode)
        w, dy = pb.w.random(rng), pb.y.random(rng)
        dx0 = pb.x.random(rng) if beta else np.zeros(pb.x.dims)
        if not beta:
            pb.x.poison()
        run(pb, alpha, beta)
        want = ref.backward_data(alpha, w, dy, beta, dx0, *pb.args())
        scale = abs(alpha) * ref.backward_data_raw(np.abs(w), np.abs(dy), pb.x.dims[2:], *pb.args()) + abs(beta) * np.abs(dx0)
        assert_close(pb.x.download(), want, dtype, f"{what} mode {mode} alpha {alpha} beta {beta}", scale=scale)
        pb.x.check_untouched()
        if reproducible and not beta:
            _same_bits_again(pb.x, lambda: run(pb, alpha, beta))


def check_backward_filter(rng, make, dtype, run, what, modes=BWD_FILTER_MODES, reproducible=False):
    """ConvolutionBackwardFilter as check_backward_data checks backward data (dw poisoned or random)."""
    for mode, alpha, beta in modes:
        pb = make(mode)
        x, dy = pb.x.random(rng), pb.y.random(rng)
        dw0 = pb.w.random(rng) if beta else np.zeros(pb.wd)
        if not beta:
            pb.w.poison()
        run(pb, alpha, beta)
        want = ref.backward_filter(alpha, x, dy, beta, dw0, *pb.args())
        scale = abs(alpha) * ref.backward_filter_raw(np.abs(x), np.abs(dy), pb.wd[2:], *pb.args()) + abs(beta) * np.abs(dw0)
        assert_close(pb.w.download(), want, dtype, f"{what} mode {mode} alpha {alpha} beta {beta}", scale=scale)
        pb.w.check_untouched()
        if reproducible and not beta:
            _same_bits_again(pb.w, lambda: run(pb, alpha, beta))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward(handle, rng, case, dtype):
    check_forward(handle, rng, lambda mode: Problem(case, dtype, mode), dtype, FWD_IG, "forward")


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_data(handle, rng, case, dtype):
    def run(pb, alpha, beta):
        pydnn.convolution_backward_data(handle, alpha, pb.wdesc, pb.w.ptr, pb.y.desc, pb.y.ptr, pb.conv, BWD_D0, 0, 0,
                                        beta, pb.x.desc, pb.x.ptr)

    check_backward_data(rng, lambda mode: Problem(case, dtype, mode), dtype, run, "backward data")


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("algo", [BWD_F0, BWD_F1])
def test_backward_filter(handle, rng, case, dtype, algo):
    def run(pb, alpha, beta):
        need = pydnn.get_convolution_backward_filter_workspace_size(handle, pb.x.desc, pb.y.desc, pb.conv, pb.wdesc,
                                                                    algo)
        ws, n = _workspace(need)
        pydnn.convolution_backward_filter(handle, alpha, pb.x.desc, pb.x.ptr, pb.y.desc, pb.y.ptr, pb.conv, algo, ws.ptr,
                                          n, beta, pb.wdesc, pb.w.ptr)

    check_backward_filter(rng, lambda mode: Problem(case, dtype, mode), dtype, run, f"backward filter algo {algo}")


def test_backward_filter_split_is_used_and_reproducible(handle, rng):
    """ALGO_1 splits this long reduction (workspace > 0) and gives the same bits run after run."""
    pb = Problem(((8, 16, 30, 30), 16, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nchw", NCHW), F32)
    pb.x.random(rng)
    pb.y.random(rng)
    need = pydnn.get_convolution_backward_filter_workspace_size(handle, pb.x.desc, pb.y.desc, pb.conv, pb.wdesc, BWD_F1)
    assert need > 0
    ws, n = _workspace(need)
    outs = []
    for _ in range(3):
        pb.w.poison()
        pydnn.convolution_backward_filter(handle, 1.0, pb.x.desc, pb.x.ptr, pb.y.desc, pb.y.ptr, pb.conv, BWD_F1, ws.ptr,
                                          n, 0.0, pb.wdesc, pb.w.ptr)
        outs.append(pb.w.buf.to_numpy().copy())
    assert all((o.view(np.uint32) == outs[0].view(np.uint32)).all() for o in outs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_backward_bias(handle, rng, dtype, layout):
    for dims in ((3, 7, 5, 6), (2, 300, 4), (2, 5, 3, 4, 5)):
        dy = DevTensor(dims, dtype, _strides(dims, layout))
        v = dy.random(rng)
        bd = (1, dims[1]) + (1,) * (len(dims) - 2)
        db = DevTensor(bd, dtype)
        for alpha, beta in ((1.0, 0.0), (0.5, -1.0)):
            b0 = db.random(rng) if beta else None
            if not beta:
                db.poison()
            pydnn.convolution_backward_bias(handle, alpha, dy.desc, dy.ptr, beta, db.desc, db.ptr)
            want = ref.backward_bias(alpha, v, beta, b0)
            scale = abs(alpha) * ref.backward_bias_raw(np.abs(v)) + (abs(beta) * np.abs(b0) if beta else 0)
            assert_close(db.download(), want, dtype, "backward bias", scale=scale)


ACTS = [(pydnn.PYDNN_ACTIVATION_RELU, 0.0), (pydnn.PYDNN_ACTIVATION_IDENTITY, 0.0),
        (pydnn.PYDNN_ACTIVATION_CLIPPED_RELU, 1.5), (pydnn.PYDNN_ACTIVATION_SIGMOID, 0.0),
        (pydnn.PYDNN_ACTIVATION_TANH, 0.0), (pydnn.PYDNN_ACTIVATION_ELU, 0.7)]


@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[5]])
@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_activation_forward(handle, rng, case, dtype):
    for i, (mode, coef) in enumerate(ACTS):
        pb = Problem(case, dtype, CONV if i % 2 else XCORR)
        x, w = pb.x.random(rng), pb.w.random(rng)
        z = DevTensor(pb.yd, dtype, _strides(pb.yd, "nchw"))
        zv = z.random(rng)
        bias = DevTensor((1, pb.yd[1]) + (1,) * (len(pb.yd) - 2), dtype)
        bv = bias.random(rng)
        act = pydnn.create_activation_descriptor()
        pydnn.set_activation_descriptor(act, mode, pydnn.PYDNN_NOT_PROPAGATE_NAN, coef)
        alpha2 = 0.0 if i == 2 else 0.5
        pb.y.poison()
        pydnn.convolution_bias_activation_forward(handle, 0.8, pb.x.desc, pb.x.ptr, pb.wdesc, pb.w.ptr, pb.conv, FWD_IG,
                                                  0, 0, alpha2, z.desc, z.ptr, bias.desc, bias.ptr, act, pb.y.desc,
                                                  pb.y.ptr)
        want = ref.bias_activation_forward(0.8, x, w, alpha2, zv, bv, mode, coef, *pb.args())
        scale = 0.8 * ref.forward_raw(np.abs(x), np.abs(w), *pb.args()) + alpha2 * np.abs(zv) + np.abs(bv)
        assert_close(pb.y.download(), want, dtype, f"bias+act {mode}", scale=scale)
        pb.y.check_untouched()


def test_bias_activation_in_place_residual(handle, rng):
    """z may be y itself (a residual added in place)."""
    pb = Problem(CASES[1], F32)
    x, w = pb.x.random(rng), pb.w.random(rng)
    yv = pb.y.random(rng)
    bias = DevTensor((1, pb.yd[1], 1, 1), F32)
    bv = bias.random(rng)
    act = pydnn.create_activation_descriptor()
    pydnn.set_activation_descriptor(act, pydnn.PYDNN_ACTIVATION_RELU, pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
    pydnn.convolution_bias_activation_forward(handle, 1.0, pb.x.desc, pb.x.ptr, pb.wdesc, pb.w.ptr, pb.conv, FWD_IG, 0, 0,
                                              1.0, pb.y.desc, pb.y.ptr, bias.desc, bias.ptr, act, pb.y.desc, pb.y.ptr)
    want = ref.bias_activation_forward(1.0, x, w, 1.0, yv, bv, pydnn.PYDNN_ACTIVATION_RELU, 0.0, *pb.args())
    scale = ref.forward_raw(np.abs(x), np.abs(w), *pb.args()) + np.abs(yv) + np.abs(bv)
    assert_close(pb.y.download(), want, F32, "in-place residual", scale=scale)


def test_find_ex(handle, rng, tmp_path, monkeypatch):
    from pydnn.ops.convolution import algorithms as A

    monkeypatch.setattr(A, "tuning_path", lambda: tmp_path / A.TUNING_FILE)
    monkeypatch.delenv("PYDNN_CONV_TUNING_CACHE", raising=False)
    A._tuning["path"] = None
    pb = Problem(CASES[6], F32)
    pb.x.random(rng)
    pb.y.random(rng)
    pb.w.random(rng)
    ws, n = _workspace(1 << 24)
    r = pydnn.find_convolution_forward_algorithm_ex(handle, pb.x.desc, pb.x.ptr, pb.wdesc, pb.w.ptr, pb.conv, pb.y.desc,
                                                    pb.y.ptr, 8, ws.ptr, n)
    # IMPLICIT_GEMM, GEMM, WINOGRAD_NONFUSED and FFT run here (fp32 3x3 stride 1), timed and sorted first
    ran = sorted(p.algo for p in r if p.status == pydnn.PYDNN_STATUS_SUCCESS)
    assert ran == sorted([FWD_IG, pydnn.PYDNN_CONVOLUTION_FWD_ALGO_GEMM, pydnn.PYDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED,
                          pydnn.PYDNN_CONVOLUTION_FWD_ALGO_FFT])
    assert len(r) == 8 and all(p.status == pydnn.PYDNN_STATUS_SUCCESS and p.time > 0 for p in r[:4])
    assert [p.time for p in r[:4]] == sorted(p.time for p in r[:4])
    r = pydnn.find_convolution_backward_filter_algorithm_ex(handle, pb.x.desc, pb.x.ptr, pb.y.desc, pb.y.ptr, pb.conv,
                                                            pb.wdesc, pb.w.ptr, 7, ws.ptr, n)
    ok = [p for p in r if p.status == pydnn.PYDNN_STATUS_SUCCESS]
    # ALGO_0, ALGO_1 and whatever else is implemented for this problem (FFT), timed and sorted
    assert {BWD_F0, BWD_F1} <= {p.algo for p in ok} <= set(CP.implemented()[CPb.DIR_BWD_FILTER])
    assert [p.time for p in ok] == sorted(p.time for p in ok)
    r = pydnn.find_convolution_backward_filter_algorithm_ex(handle, pb.x.desc, pb.x.ptr, pb.y.desc, pb.y.ptr, pb.conv,
                                                            pb.wdesc, pb.w.ptr, 7, ws.ptr, 0)
    f1 = next(p for p in r if p.algo == BWD_F1)
    assert f1.status == pydnn.PYDNN_STATUS_ALLOC_FAILED
    r = pydnn.find_convolution_backward_data_algorithm_ex(handle, pb.wdesc, pb.w.ptr, pb.y.desc, pb.y.ptr, pb.conv,
                                                          pb.x.desc, pb.x.ptr, 6, ws.ptr, n)
    assert r[0].algo in (BWD_D0, pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED,
                         pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_FFT) and r[0].time > 0
    # the tuning cache answers the same question again without timing (the very same times)
    assert (tmp_path / A.TUNING_FILE).exists()
    again = pydnn.find_convolution_backward_data_algorithm_ex(handle, pb.wdesc, pb.w.ptr, pb.y.desc, pb.y.ptr, pb.conv,
                                                              pb.x.desc, pb.x.ptr, 6, ws.ptr, n)
    assert [p.as_tuple() for p in again] == [p.as_tuple() for p in r]


TC_CASES = [  # the tensor-core forward: NHWC x, NHWC filters, C % 8 == 0, one group
    ((2, 8, 13, 11), 10, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),       # K < 32, M, N partial tiles
    ((3, 24, 9, 10), 136, (3, 3), (1, 0), (2, 1), (1, 2), 1, "nhwc", NHWC),      # 2 N tiles, stride, dilation
    ((4, 72, 15, 15), 64, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),      # 1x1, k tail (72 % 32)
    ((2, 16, 6, 7), 16, (3, 2), (2, 1), (1, 1), (1, 1), 1, "pad8", NHWC),        # padded NHWC (strides % 8)
    ((1, 8, 4, 5, 6), 12, (2, 3, 3), (1, 1, 0), (1, 2, 1), (2, 1, 1), 1, "nhwc", NHWC),  # 3-d
    ((2, 64, 20, 20), 64, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),      # the ResNet shape, small N
    ((2, 128, 9, 7), 192, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),      # 2 channel blocks a tap, N tail
    ((1, 40, 33), 24, (5,), (2,), (3,), (1,), 1, "nhwc", NHWC),                  # 1-d
]


def _tc_problem(case, dtype, mode):
    xd, k, filt, pad, st, dil, g, layout, wfmt = case
    if layout == "pad8":  # channels innermost with 8 spare channels after each position
        pb = Problem(case[:7] + ("nhwc", wfmt), dtype, mode)
        s = [0] * len(xd)
        s[1], acc = 1, xd[1] + 8
        for i in reversed(range(2, len(xd))):
            s[i] = acc
            acc *= xd[i]
        s[0] = acc
        pb.x = DevTensor(xd, dtype, tuple(s))
        return pb
    return Problem(case, dtype, mode)


def _force_tiling(monkeypatch, direction, tiling):
    if tiling is not None:
        assert tiling in CT.TC_TILES + CT.TCP_TILES + CT.WGM_TILES + CT.WGM_VARIANTS
        monkeypatch.setitem(tuning.conv.TC_FORCE, direction, tiling)


# the model's tiling, or a forced one: fwd_tc / bwd_data_tc (BM, BN), or the pipelined kernel's
# (BM, BN, WARPS_M, WARPS_N, MINB), which serves every case but backward data with stride > 1 (there the
# model's fwd_tc / bwd_data_tc tile runs)
TC_TILINGS = [None] + list(CT.TC_TILES) + list(CT.TCP_TILES)


# fwd_wgmma's tiles: the model's (WGM_TILES, v12's LEAN copies) and the variants (WGM_VARIANTS: v8's loop)
WGM_TILINGS = list(CT.WGM_TILES) + list(CT.WGM_VARIANTS)


def _need_wgmma(handle):
    if handle.arch != CT.WGM_ARCH:
        pytest.skip(f"fwd_wgmma is built for {CT.WGM_ARCH} only (this device: {handle.arch})")


# fwd_wgmma (Hopper): placed first so that a broken kernel shows on small shapes before the long runs
@pytest.mark.parametrize("case", TC_CASES)
@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("tiling", WGM_TILINGS)
def test_wgmma_forward(handle, rng, monkeypatch, case, dtype, tiling):
    """The wgmma forward on every tensor-core case (partial M / N tiles, channel tails zero-filled,
    stride, dilation, 1-d / 3-d, padded NHWC): plain (register epilogue) and beta != 0 (staged)."""
    _need_wgmma(handle)
    _force_tiling(monkeypatch, CPb.DIR_FWD, tiling)
    monkeypatch.setattr(tuning.conv, "STREAM_1X1", False)   # (the 1x1 cases on fwd_wgmma, not the streaming kernels)

    def planned_on_wgmma(pb):
        pl = CP.new_plan(handle, CPb.DIR_FWD, FWD_PRE, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
        assert "fwd_wgmma<" in pl.gemm_expr and pl.unit.startswith("convolution.wgmma.")

    check_forward(handle, rng, lambda mode: _tc_problem(case, dtype, mode), dtype, FWD_PRE,
                  f"wgmma forward tiling {tiling}", before=planned_on_wgmma)


@pytest.mark.parametrize("dtype", [BF16, F16])
def test_wgmma_model_1x1(handle, rng, monkeypatch, dtype):
    """The model's fwd_wgmma for a 1x1 filter over 256 channels (4 K tiles >= WGM_MIN_KTILES), an M
    tail and a 72-wide N (a partial tile); over 64 channels (1 K tile) the pipelined kernel."""
    _need_wgmma(handle)
    monkeypatch.setattr(tuning.conv, "FWD_TMA", False)   # the model's fwd_wgmma choice itself (not fwd_tma's)
    monkeypatch.setattr(tuning.conv, "STREAM_1X1", False)   # (nor the streaming kernels': 64 channels)
    case = ((2, 256, 9, 11), 72, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC)

    def planned_on_wgmma(pb):
        pl = CP.new_plan(handle, CPb.DIR_FWD, FWD_PRE, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
        assert "fwd_wgmma<" in pl.gemm_expr

    check_forward(handle, rng, lambda mode: _tc_problem(case, dtype, mode), dtype, FWD_PRE, "wgmma model 1x1",
                  before=planned_on_wgmma)
    pb = _tc_problem(((2, 64, 9, 11), 72, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC), dtype, XCORR)
    pl = CP.new_plan(handle, CPb.DIR_FWD, FWD_PRE, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
    assert "implicit_gemm_pipe_tc<" in pl.gemm_expr


@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("case", [0, 6])
@pytest.mark.parametrize("tiling", WGM_TILINGS)
def test_wgmma_bias_activation(handle, rng, monkeypatch, dtype, case, tiling):
    """The fused forward's epilogues on fwd_wgmma (see test_bias_activation_tensor_cores)."""
    _need_wgmma(handle)
    monkeypatch.setitem(tuning.conv.TC_FORCE, CPb.DIR_FWD, tiling)
    pb = _tc_problem(TC_CASES[case], dtype, XCORR)
    pl = CP.new_plan(handle, CPb.DIR_FWD, FWD_PRE, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
    assert "fwd_wgmma<" in pl.gemm_expr
    _bias_activation_cases(handle, rng, monkeypatch, dtype, case, tiling)


@pytest.mark.parametrize("case", TC_CASES)
@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("tiling", TC_TILINGS)
def test_forward_tensor_cores(handle, rng, monkeypatch, case, dtype, tiling):
    _force_tiling(monkeypatch, CPb.DIR_FWD, tiling)
    check_forward(handle, rng, lambda mode: _tc_problem(case, dtype, mode), dtype, FWD_PRE, "tensor-core forward")


TC_BWD_CASES = [c for c in TC_CASES if c[1] % 8 == 0] + [
    ((1, 8, 4, 5, 6), 16, (2, 3, 3), (1, 1, 0), (1, 2, 1), (2, 1, 1), 1, "nhwc", NHWC),  # 3-d, stride 2
    ((3, 136, 11, 9), 8, (3, 3), (1, 1), (2, 2), (1, 1), 1, "nhwc", NHWC),               # 2 N tiles of dx
]


@pytest.mark.parametrize("case", TC_BWD_CASES)
@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("tiling", TC_TILINGS)
def test_backward_data_tensor_cores(handle, rng, monkeypatch, case, dtype, tiling):
    _force_tiling(monkeypatch, CPb.DIR_BWD_DATA, tiling)
    check_backward_data(rng, lambda mode: _tc_problem(case, dtype, mode), dtype,
                        lambda pb, alpha, beta: _backward_data_tc_run(handle, pb, alpha, beta),
                        "tensor-core backward data")


def _backward_data_tc_run(handle, pb, alpha, beta):
    """BWD_DATA_ALGO_1 with the workspace its query reports (on sm_90 fwd_wgmma's swapped filter where
    WGM_BWD_SWAP asks for it, else none)."""
    need = pydnn.get_convolution_backward_data_workspace_size(handle, pb.wdesc, pb.y.desc, pb.conv, pb.x.desc, BWD_D1)
    ws, n = _workspace(need)
    pydnn.convolution_backward_data(handle, alpha, pb.wdesc, pb.w.ptr, pb.y.desc, pb.y.ptr, pb.conv, BWD_D1,
                                    ws.ptr if need else 0, n, beta, pb.x.desc, pb.x.ptr)
    return need


WGM_BWD_CASES = [  # stride 1: odd sizes, padding 0 / 1 / 2 (and past R - 1), dilation, 1-d, 3-d, dx tails
    ((2, 8, 13, 11), 16, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),
    ((3, 24, 9, 7), 136, (3, 3), (0, 2), (1, 1), (1, 2), 1, "nhwc", NHWC),      # K 136: a channel tail, dilation
    ((2, 136, 7, 9), 72, (3, 3), (2, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),      # C 136: 2 N tiles + a tail
    ((2, 64, 11, 11), 64, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),     # the model's own choice
    ((2, 16, 6, 7), 16, (3, 2), (2, 1), (1, 1), (1, 1), 1, "pad8", NHWC),       # padded NHWC dx
    ((1, 8, 4, 5, 6), 16, (2, 3, 3), (1, 1, 0), (1, 1, 1), (2, 1, 1), 1, "nhwc", NHWC),  # 3-d
    ((1, 40, 33), 24, (5,), (5,), (1,), (1,), 1, "nhwc", NHWC),                 # 1-d, pad > R - 1
    ((2, 64, 9, 11), 256, (1, 1), (0, 0), (1, 1), (1, 1), 1, "nhwc", NHWC),     # 1x1, 4 K tiles: the model's (WGM_MIN_KTILES)
    ((3, 128, 7, 9), 64, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),      # 128 -> 64 (dx C 128: 2 slabs of B)
    ((3, 64, 9, 7), 128, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),      # 64 -> 128 (2 K tiles a tap)
    ((1, 192, 5, 7), 128, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),     # C 192: a half-empty 128-wide tile
    ((2, 64, 5, 3), 192, (3, 3), (0, 1), (1, 1), (1, 1), 1, "nhwc", NHWC),      # K 192: 3 K tiles a tap
]


# "swap": WGM_BWD_SWAP, the swap + the 128x128 model tile (else B is read from the filter itself, BKN)
@pytest.mark.parametrize("case", WGM_BWD_CASES)
@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("tiling", [None] + WGM_TILINGS + ["swap"])
def test_wgmma_backward_data(handle, rng, monkeypatch, case, dtype, tiling):
    """Backward data on fwd_wgmma (the forward of dy, its B read from w as [k][c] tiles, or with
    WGM_BWD_SWAP from filter_kc_swap's copy in the workspace): dx poisoned (beta 0) or random (beta != 0),
    both modes, against the float64 reference; bitwise reproducible."""
    _need_wgmma(handle)
    if tiling is None and case[1] % 64:
        pytest.skip("the model takes fwd_wgmma for K % 64 == 0 only (the forced tilings run this case)")
    monkeypatch.setattr(tuning.conv, "DGRAD_TMA", False)   # fwd_wgmma's plans themselves (not fwd_tma's)
    swap = tiling == "swap"
    if swap:
        monkeypatch.setattr(tuning.conv, "WGM_BWD_SWAP", True)
        tiling = CT.WGM_TILES[1]
    _force_tiling(monkeypatch, CPb.DIR_BWD_DATA, tiling)
    planned = {}

    def make(mode):
        pb = _tc_problem(case, dtype, mode)
        pl = CP.new_plan(handle, CPb.DIR_BWD_DATA, BWD_D1, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
        assert "fwd_wgmma<" in pl.gemm_expr and isinstance(pl, CT.BwdWgmmaPlan) == swap
        bkn = pl.gemm_expr.count(",") == 5 and pl.gemm_expr.endswith(", 1>")  # <T, BN, STAGES, MINB, LEAN, BKN = 1>
        assert bkn != swap  # B read as [k][c] from w, or the swap's K-major copy
        assert (pl.workspace > 0) == swap
        planned["workspace"] = pl.workspace
        return pb

    def run(pb, alpha, beta):
        assert _backward_data_tc_run(handle, pb, alpha, beta) == planned["workspace"]

    check_backward_data(rng, make, dtype, run, f"wgmma backward data tiling {tiling}",
                        BWD_DATA_MODES + ((XCORR, 0.5, -1.0),), reproducible=True)


TC_WG_CASES = TC_BWD_CASES + [
    ((2, 16, 9, 9), 136, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NCHW),   # K = 136: an M tail; NCHW dw
    ((2, 8, 5, 6), 8, (3, 3), (0, 2), (1, 2), (2, 1), 1, "nhwc", NHWC),      # tiny: one 32-position tile
]
# the model's choice, or a forced (BM, splits) of wgrad_tc, or (WGP_TILES entry, splits) of wgrad_pipe_tc
WG_TILINGS = [None, (128, 1), (64, 3), (128, 5), (CT.WGP_TILES[0], 1), (CT.WGP_TILES[1], 3),
              (CT.WGP_TILES[0], 5)] + [(cfg, 2) for cfg in CT.WGP_TILES[2:]]


def _wgrad_tc_run(handle, pb, alpha, beta):
    from pydnn import tuning
    from pydnn.ops.convolution import implicit as CI, plans as CP, problem as CPb, tensor_core as CT

    pl = CP.new_plan(handle, CPb.DIR_BWD_FILTER, BWD_F1, pb.conv, pb.x.desc, pb.wdesc, pb.y.desc)
    assert "wgrad_tc" in pl.gemm_expr or "wgrad_pipe_tc" in pl.gemm_expr
    need = pydnn.get_convolution_backward_filter_workspace_size(handle, pb.x.desc, pb.y.desc, pb.conv, pb.wdesc, BWD_F1)
    assert need == pl.workspace and (need > 0) == (pl.splits > 1)
    ws, n = _workspace(need)
    pydnn.convolution_backward_filter(handle, alpha, pb.x.desc, pb.x.ptr, pb.y.desc, pb.y.ptr, pb.conv, BWD_F1, ws.ptr,
                                      n, beta, pb.wdesc, pb.w.ptr)


@pytest.mark.parametrize("case", TC_WG_CASES)
@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("tiling", WG_TILINGS)
def test_backward_filter_tensor_cores(handle, rng, monkeypatch, case, dtype, tiling):
    """BWD_FILTER_ALGO_1 on tensor cores (wgrad_tc, wgrad_pipe_tc): each tiling, one split (dw written
    directly) and several (fp32 partials + the fold), against the reference."""
    from pydnn import tuning
    from pydnn.ops.convolution import implicit as CI, plans as CP, problem as CPb, tensor_core as CT

    if tiling is not None:
        monkeypatch.setitem(tuning.conv.TC_FORCE, CPb.DIR_BWD_FILTER, tiling)
    check_backward_filter(rng, lambda mode: _tc_problem(case, dtype, mode), dtype,
                          lambda pb, alpha, beta: _wgrad_tc_run(handle, pb, alpha, beta),
                          f"tensor-core backward filter tiling {tiling}")


def test_backward_filter_tensor_cores_reproducible(handle, rng):
    """The split tensor-core backward filter (the ResNet 64-channel shape at N = 4) gives the same bits
    run after run, and ranks first in the heuristic, reported deterministic."""
    pb = _tc_problem(((4, 64, 28, 28), 64, (3, 3), (1, 1), (1, 1), (1, 1), 1, "nhwc", NHWC), BF16, XCORR)
    x, dy = pb.x.random(rng), pb.y.random(rng)
    r = pydnn.get_convolution_backward_filter_algorithm_v7(handle, pb.x.desc, pb.y.desc, pb.conv, pb.wdesc, 7)
    assert r[0].algo == BWD_F1 and r[0].determinism == pydnn.PYDNN_DETERMINISTIC and r[0].memory > 0
    outs = []
    for _ in range(3):
        pb.w.poison()
        _wgrad_tc_run(handle, pb, 1.0, 0.0)
        outs.append(pb.w.buf.to_numpy().copy())
    assert all((o.view(np.uint16) == outs[0].view(np.uint16)).all() for o in outs)
    want = ref.backward_filter(1.0, x, dy, 0.0, np.zeros(pb.wd), *pb.args())
    scale = ref.backward_filter_raw(np.abs(x), np.abs(dy), pb.wd[2:], *pb.args())
    assert_close(pb.w.download(), want, BF16, "tensor-core backward filter, ResNet shape", scale=scale)


@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("case", [0, 1, 5, 6])   # K = 10 (scalar tails), 24 channels (fwd_tc), 64 and 128 channels
@pytest.mark.parametrize("tiling", [None] + list(CT.TCP_TILES) + [(64, 64)])
def test_bias_activation_tensor_cores(handle, rng, monkeypatch, dtype, case, tiling):
    """The fused forward's epilogues on each tensor-core kernel, every activation with: no z (bias + a
    clamp-type activation stay in registers), z in NHWC (the staged epilogue's unrolled 16-byte pass for
    clamp types), z in NCHW (its rolled scalar loop), z = y in place."""
    _bias_activation_cases(handle, rng, monkeypatch, dtype, case, tiling)


def _bias_activation_cases(handle, rng, monkeypatch, dtype, case, tiling):
    _force_tiling(monkeypatch, CPb.DIR_FWD, tiling)
    for i, (mode, coef) in enumerate(ACTS):
        for zkind in ("none", "nhwc", "nchw") + (("inplace", "none-propagate-nan") if i == 0 else ()):
            pb = _tc_problem(TC_CASES[case], dtype, XCORR)
            x, w = pb.x.random(rng), pb.w.random(rng)
            z = pb.y if zkind == "inplace" else DevTensor(pb.yd, dtype, _strides(pb.yd, "nchw" if zkind == "nchw"
                                                                                   else "nhwc"))
            zv = z.random(rng)
            if zkind != "inplace":
                pb.y.poison()
            bias = DevTensor((1, pb.yd[1]) + (1,) * (len(pb.yd) - 2), dtype)
            bv = bias.random(rng)
            act = pydnn.create_activation_descriptor()
            pydnn.set_activation_descriptor(act, mode, pydnn.PYDNN_PROPAGATE_NAN if zkind == "none-propagate-nan"
                                            else pydnn.PYDNN_NOT_PROPAGATE_NAN, coef)
            alpha2 = 0.0 if zkind.startswith("none") else -0.5
            pydnn.convolution_bias_activation_forward(handle, 1.25, pb.x.desc, pb.x.ptr, pb.wdesc, pb.w.ptr, pb.conv,
                                                      FWD_PRE, 0, 0, alpha2, z.desc, z.ptr, bias.desc, bias.ptr, act,
                                                      pb.y.desc, pb.y.ptr)
            want = ref.bias_activation_forward(1.25, x, w, alpha2, zv, bv, mode, coef, *pb.args())
            scale = 1.25 * ref.forward_raw(np.abs(x), np.abs(w), *pb.args()) + abs(alpha2) * np.abs(zv) + np.abs(bv)
            assert_close(pb.y.download(), want, dtype, f"tensor-core bias+act {mode} z {zkind} tiling {tiling}",
                         scale=scale)
            if zkind != "inplace":
                pb.y.check_untouched()


@pytest.mark.parametrize("case", [0, 3, 5, 6])
@pytest.mark.parametrize("tiling", [None] + list(CT.TCP_TILES))
def test_forward_tensor_cores_staged_plain(handle, rng, monkeypatch, case, tiling):
    """The plain forward through the staged epilogue (TC_STAGED_PLAIN, the benchmark's switch)."""
    _force_tiling(monkeypatch, CPb.DIR_FWD, tiling)
    monkeypatch.setattr(tuning.conv, "TC_STAGED_PLAIN", True)
    pb = _tc_problem(TC_CASES[case], BF16, XCORR)
    x, w = pb.x.random(rng), pb.w.random(rng)
    pb.y.poison()
    pydnn.convolution_forward(handle, 0.75, pb.x.desc, pb.x.ptr, pb.wdesc, pb.w.ptr, pb.conv, FWD_PRE, 0, 0, 0.0,
                              pb.y.desc, pb.y.ptr)
    want = ref.forward(0.75, x, w, 0.0, None, *pb.args())
    assert_close(pb.y.download(), want, BF16, "staged plain forward",
                 scale=0.75 * ref.forward_raw(np.abs(x), np.abs(w), *pb.args()))
    pb.y.check_untouched()


def test_tensor_core_refusals(handle, rng):
    pb = _tc_problem(TC_CASES[0], BF16, XCORR)
    with pytest.raises(pydnn.PydnnError) as e:  # a pointer off the 16-byte grid (x + 1 element)
        pydnn.convolution_forward(handle, 1.0, pb.x.desc, pb.x.ptr + 2, pb.wdesc, pb.w.ptr, pb.conv, FWD_PRE, 0, 0,
                                  0.0, pb.y.desc, pb.y.ptr)
    assert e.value.status == pydnn.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER
    r = pydnn.get_convolution_forward_algorithm_v7(handle, pb.x.desc, pb.wdesc, pb.conv, pb.y.desc, 8)
    assert r[0].algo == FWD_PRE and FWD_IG in [p.algo for p in r[1:3]]  # GEMM (im2col + tensor cores) may rank 2nd


def test_c_program(tmp_path):
    """The C face: descriptors, shape queries, errors and the numbers of every op (tests/c/convolution_gpu.c)."""
    from cprog import build_and_run

    r = build_and_run("convolution_gpu", tmp_path, extra=["-ldl", "-lm"])
    print(r.stdout, r.stderr)
    assert "FAIL" not in r.stdout and r.returncode == 0, r.stdout + r.stderr
    for what in ("forward numbers", "backward data numbers", "backward filter numbers", "backward bias numbers"):
        assert f"ok {what}" in r.stdout, r.stdout + r.stderr
