"""The FFT convolution algorithm (forward, backward data, backward filter) on the CPU: which problems it refuses (status +
reason), its FFT sizes (checked against a float64 numpy circular correlation) and workspace sizes, the
BAD_PARAM for a smaller workspace, its rows in the v7 ranking, and the real kernels (ptx/conv_fft.cu
compiled as host C++: tests/c/conv_fft_host.cpp) run from the parameter struct the real API call built,
checked against the float64 reference within float's tolerance: odd sizes, both layouts, NCHW / NHWC
filters, both modes, alpha / beta, the fused bias + activation epilogue."""
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import pydnn
from pydnn.ops.convolution import fft as Ff
from pydnn.reference import convolution as ref
from pydnn.reference.dtypes import TOLERANCE
from test_convolution_cpu import BAD, CONV, F16, F32, F64, NCHW, NHWC, NS, XCORR, _check, _strided, cdesc, fdesc, tdesc
from test_fuzz_cpu import cpu_handle

FWD_FFT = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_FFT
BWD_FFT = pydnn.PYDNN_CONVOLUTION_BWD_DATA_ALGO_FFT
WGRAD_FFT = pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT
FWD_IG = pydnn.PYDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM
BF16 = pydnn.PYDNN_DATA_BFLOAT16


# ----------------------------------------------------------------------------- refusals and sizes

def test_fft_refusals():
    h = cpu_handle()
    ws = pydnn.get_convolution_forward_workspace_size
    bw = pydnn.get_convolution_backward_data_workspace_size
    x, y = tdesc((2, 4, 20, 20)), tdesc((2, 6, 20, 20))
    w9 = fdesc((6, 4, 9, 9))
    ok = cdesc((4, 4), (1, 1), (1, 1))
    assert ws(h, x, w9, ok, y, FWD_FFT) > 0
    _check(ws, (h, x, w9, cdesc((4, 4), (2, 2), (1, 1)), tdesc((2, 6, 10, 10)), FWD_FFT), NS, "FFT needs stride 1")
    _check(ws, (h, x, fdesc((6, 4, 5, 5)), cdesc((4, 4), (1, 1), (2, 2)), y, FWD_FFT), NS, "FFT needs dilation 1")
    _check(ws, (h, x, fdesc((6, 2, 9, 9)), cdesc((4, 4), (1, 1), (1, 1), groups=2), y, FWD_FFT), NS,
           "FFT serves one group only (got 2)")
    _check(ws, (h, tdesc((2, 4, 20)), fdesc((6, 4, 9)), cdesc((4,), (1,), (1,)), tdesc((2, 6, 20)), FWD_FFT), NS,
           "2-d convolutions only")
    _check(ws, (h, tdesc((1, 4, 5, 9, 9)), fdesc((6, 4, 1, 3, 3)), cdesc((0, 1, 1), (1, 1, 1), (1, 1, 1)),
                tdesc((1, 6, 5, 9, 9)), FWD_FFT), NS, "2-d convolutions only")
    assert ws(h, tdesc((2, 4, 20, 20), F64), fdesc((6, 4, 9, 9), F64), cdesc((4, 4), (1, 1), (1, 1), ctype=F64),
              tdesc((2, 6, 20, 20), F64), FWD_FFT) > 0  # double data: the kernels' math is double anyway
    _check(ws, (h, x, fdesc((6, 4, 3, 3)), cdesc((3, 1), (1, 1), (1, 1)), tdesc((2, 6, 24, 20)), FWD_FFT), NS,
           "padding smaller than the filter (pad height 3 >= filter height 3)")
    _check(ws, (h, x, fdesc((6, 4, 3, 3)), cdesc((1, 5), (1, 1), (1, 1)), tdesc((2, 6, 20, 28)), FWD_FFT), NS,
           "pad width 5 >= filter width 3")
    # the largest transform holds 8192 points: 128 x 64 (124 + 4, 60 + 4) fits, 128 x 128 does not
    assert ws(h, tdesc((1, 1, 124, 60)), fdesc((1, 1, 9, 9)), ok, tdesc((1, 1, 124, 60)), FWD_FFT) > 0
    _check(ws, (h, tdesc((1, 1, 124, 61)), fdesc((1, 1, 9, 9)), ok, tdesc((1, 1, 124, 61)), FWD_FFT), NS,
           "FFT transforms hold at most 8192 points (64 x 128, 128 x 64, ...: double spectra in shared memory); "
           "this problem needs 128 x 128 (input 124 x 61 plus padding)")
    _check(bw, (h, fdesc((1, 1, 9, 9)), tdesc((1, 1, 124, 61)), ok, tdesc((1, 1, 124, 61)), BWD_FFT), NS,
           "backward data FFT transforms hold at most 8192 points")
    _check(bw, (h, w9, tdesc((2, 6, 10, 10)), cdesc((4, 4), (2, 2), (1, 1)), x, BWD_FFT), NS,
           "backward data FFT needs stride 1")
    _check(bw, (h, fdesc((6, 4, 3, 3)), tdesc((2, 6, 24, 20)), cdesc((3, 1), (1, 1), (1, 1)), x, BWD_FFT), NS,
           "padding smaller than the filter")
    # backward filter: the same limits, its transforms sized by x and dy
    wf = pydnn.get_convolution_backward_filter_workspace_size
    _check(wf, (h, x, tdesc((2, 6, 10, 10)), cdesc((4, 4), (2, 2), (1, 1)), w9, WGRAD_FFT), NS,
           "backward filter FFT needs stride 1")
    _check(wf, (h, tdesc((1, 1, 124, 61)), tdesc((1, 1, 124, 61)), ok, fdesc((1, 1, 9, 9)), WGRAD_FFT), NS,
           "backward filter FFT transforms hold at most 8192 points")
    _check(wf, (h, tdesc((2, 4, 24, 20)), tdesc((2, 6, 28, 20)), cdesc((3, 1), (1, 1), (1, 1)),
                fdesc((6, 4, 3, 3)), WGRAD_FFT), NS, "padding smaller than the filter")
    _check(wf, (h, x, y, cdesc((4, 4), (1, 1), (1, 1), groups=2), fdesc((6, 2, 9, 9)), WGRAD_FFT), NS,
           "backward filter FFT serves one group only")
    # still not implemented: FFT_TILING
    _check(ws, (h, x, w9, ok, y, pydnn.PYDNN_CONVOLUTION_FWD_ALGO_FFT_TILING), NS, "not implemented")
    _check(wf, (h, x, y, ok, w9, pydnn.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING), NS, "not implemented")


def _circular_matches(n_in, filt, pad, f, rng):
    """numpy float64: the FFT method of conv_fft.cu in 1-d (input at 0 .. n_in - 1, tap r at (r - pad) mod
    f, correlation through the conjugate) against the direct correlation."""
    n_out = n_in + 2 * pad - filt + 1
    x, w = rng.standard_normal(n_in), rng.standard_normal(filt)
    xe, we = np.zeros(f), np.zeros(f)
    xe[:n_in] = x
    for r in range(filt):
        we[(r - pad) % f] += w[r]
    got = np.fft.ifft(np.fft.fft(xe) * np.conj(np.fft.fft(we))).real[:n_out]
    want = [sum(w[r] * x[h + r - pad] for r in range(filt) if 0 <= h + r - pad < n_in) for h in range(n_out)]
    return np.allclose(got, want, rtol=1e-9, atol=1e-9)


def test_fft_size_is_enough_and_tight(rng):
    """fft_size's F makes the circular correlation exact on every output, forward (pad < filt) and in the
    backward-data form (pad' = filt - 1 - pad); and a circular correlation of half that size is wrong
    whenever F / 2 still holds the input and the taps (so F is the least power of two that works)."""
    for n_in in (1, 2, 3, 5, 8, 13, 17, 31, 32, 33, 56, 60):
        for filt in (1, 2, 3, 5, 9, 13):
            for pad in range(filt):
                n_out = n_in + 2 * pad - filt + 1
                if n_out < 1:
                    continue
                for (a, b, p) in ((n_in, n_out, pad), (n_out, n_in, filt - 1 - pad)):  # forward, backward data
                    f = Ff.fft_size(a, b, filt, p)
                    assert f >= 2 and f & (f - 1) == 0
                    assert _circular_matches(a, filt, p, f, rng), (a, filt, p, f)
                    if f // 2 >= max(a, filt, 2, b):
                        assert not _circular_matches(a, filt, p, f // 2, rng), (a, filt, p, f)


def _ru(n, a=256):
    return -(-n // a) * a


@pytest.mark.parametrize("dtype", [F32, F16, BF16, F64])
def test_workspace_sizes_and_small_workspace(dtype):
    h = cpu_handle()
    n, c, k, hh, ww = 3, 5, 7, 21, 13
    cv = cdesc((4, 2), (1, 1), (1, 1), ctype=F64 if dtype == F64 else F32)
    x, w, y = tdesc((n, c, hh, ww), dtype), fdesc((k, c, 9, 5), dtype), tdesc((n, k, hh, ww), dtype)
    fh, fw = 32, 16  # 21 + 4 = 25 -> 32, 13 + 2 = 15 -> 16
    bins = fh * (fw // 2 + 1)
    want = _ru(16 * bins * n * c) + _ru(16 * bins * k * c) + _ru(16 * bins * n * k)  # complex doubles
    assert pydnn.get_convolution_forward_workspace_size(h, x, w, cv, y, FWD_FFT) == want
    # backward data: dy (k channels) is the transformed input, dx (c channels) the output
    want_b = _ru(16 * bins * n * k) + _ru(16 * bins * c * k) + _ru(16 * bins * n * c)
    assert pydnn.get_convolution_backward_data_workspace_size(h, w, y, cv, x, BWD_FFT) == want_b
    _check(pydnn.convolution_forward, (h, 1.0, x, 1 << 40, w, 1 << 41, cv, FWD_FFT, 1 << 43, want - 1, 0.0, y,
                                       1 << 42), BAD, f"less than the {want} bytes PYDNN_CONVOLUTION_FWD_ALGO_FFT")
    _check(pydnn.convolution_backward_data, (h, 1.0, w, 1 << 41, y, 1 << 42, cv, BWD_FFT, 1 << 43, want_b - 1, 0.0,
                                             x, 1 << 40), BAD, "BWD_DATA_ALGO_FFT needs")
    _check(pydnn.convolution_forward, (h, 1.0, x, 1 << 40, w, 1 << 41, cv, FWD_FFT, 0, want, 0.0, y, 1 << 42),
           pydnn.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, "workSpace")
    # backward filter: x (c planes per image), dy (k), dw (k x c); F from x's 21 x 13 with lags -4..4 / -2..2
    want_w = _ru(16 * bins * c * n) + _ru(16 * bins * k * n) + _ru(16 * bins * c * k)
    assert pydnn.get_convolution_backward_filter_workspace_size(h, x, y, cv, w, WGRAD_FFT) == want_w
    _check(pydnn.convolution_backward_filter, (h, 1.0, x, 1 << 40, y, 1 << 42, cv, WGRAD_FFT, 1 << 43, want_w - 1,
                                               0.0, w, 1 << 41), BAD, "BWD_FILTER_ALGO_FFT needs")


def test_v7_lists_fft_truthfully():
    h = cpu_handle()
    c = cdesc((4, 4), (1, 1), (1, 1))
    x, w, y = tdesc((32, 64, 56, 56)), fdesc((64, 64, 9, 9)), tdesc((32, 64, 56, 56))
    r = pydnn.get_convolution_forward_algorithm_v7(h, x, w, c, y, 8)
    by = {p.algo: p for p in r}
    assert by[FWD_FFT].status == pydnn.PYDNN_STATUS_SUCCESS and by[FWD_FFT].determinism == pydnn.PYDNN_DETERMINISTIC
    assert by[FWD_FFT].memory == pydnn.get_convolution_forward_workspace_size(h, x, w, c, y, FWD_FFT)
    assert r[0].algo == FWD_FFT  # 9x9: the model puts the FFT first
    rd = {p.algo: p for p in pydnn.get_convolution_backward_data_algorithm_v7(h, w, y, c, x, 6)}
    assert rd[BWD_FFT].status == pydnn.PYDNN_STATUS_SUCCESS and rd[BWD_FFT].determinism == pydnn.PYDNN_DETERMINISTIC
    rw = {p.algo: p for p in pydnn.get_convolution_backward_filter_algorithm_v7(h, x, y, c, w, 7)}
    assert rw[WGRAD_FFT].status == pydnn.PYDNN_STATUS_SUCCESS
    assert rw[WGRAD_FFT].determinism == pydnn.PYDNN_DETERMINISTIC
    assert rw[WGRAD_FFT].memory == pydnn.get_convolution_backward_filter_workspace_size(h, x, y, c, w, WGRAD_FFT)
    r2 = {p.algo: p for p in pydnn.get_convolution_forward_algorithm_v7(h, x, w, cdesc((4, 4), (2, 2), (1, 1)),
                                                                        tdesc((32, 64, 28, 28)), 8)}
    assert r2[FWD_FFT].status == NS and "stride 1" in r2[FWD_FFT].message
    # 3x3 ResNet layer: Winograd stays the model's first choice
    c3, w3 = cdesc((1, 1), (1, 1), (1, 1)), fdesc((64, 64, 3, 3))
    x3 = tdesc((64, 64, 56, 56))
    assert pydnn.get_convolution_forward_algorithm_v7(h, x3, w3, c3, x3, 1)[0].algo == \
        pydnn.PYDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED


def test_kernels_keep_their_state_in_registers():
    """No stack frame, no spills (ptxas) in any FFT kernel, sm_90."""
    import re
    from pydnn._build import cache
    from pydnn._build.manifest import COMMON_OPTIONS
    from pydnn._cuda import nvrtc
    for unit in Ff.kernel_units():
        text, _ = cache.unit_inputs(unit)
        _, _, log = nvrtc.compile_cubin(text, unit.source, unit.exprs, "sm_90",
                                        COMMON_OPTIONS + ("--ptxas-options=-v",), [str(cache.ptx_dir())])
        frames = re.findall(r"(\d+) bytes stack frame, (\d+) bytes spill stores", log)
        assert len(frames) == len(unit.exprs)
        assert all(int(a) == 0 and int(b) == 0 for a, b in frames), (unit.name, frames)


# ----------------------------------------------------------------------------- the kernels on the host

TYPES_SHIM = """// host shim of what conv_fft.cu uses from common/types.cuh (float / double data, double math)
#include <cmath>
namespace pydnn {
template <class A> inline A load(float v) { return (A)v; }
template <class A> inline A load(double v) { return (A)v; }
template <class T, class A> inline T store(A v) { return (T)v; }
inline double m_expm1(double x) { return expm1(x); }
inline double m_tanh(double x) { return tanh(x); }
template <class A> inline A sigmoid(A x) { return A(1) / (A(1) + std::exp(-x)); }
}
"""


@pytest.fixture(scope="module")
def host_exe(tmp_path_factory):
    from pydnn._build import cache
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    d = tmp_path_factory.mktemp("fft_host")
    ptx = cache.ptx_dir()
    (d / "common").mkdir()
    for name in ("conv_fft.cu", "conv_fft_params.h"):
        shutil.copy(ptx / name, d / name)
    shutil.copy(ptx / "common" / "params.h", d / "common" / "params.h")
    (d / "common" / "types.cuh").write_text(TYPES_SHIM)
    exe = d / "host"
    src = Path(__file__).resolve().parents[2] / "c" / "conv_fft_host.cpp"
    subprocess.run([cxx, "-O2", "-std=c++17", "-I", str(d), str(src), "-o", str(exe)], check=True)
    return exe


class _Captured(Exception):
    pass


def _capture(monkeypatch):
    """Make FftPlan.run_fft_step record (params bytes, grids) at its first launch instead of launching."""
    got = []

    def fake(self, handle, i, smem):
        if i == 0:
            got.append((bytes(self.params), [st[2] for st in self.steps], self.smem_bytes, self.fft))
        assert smem == (0 if i == 2 else self.smem_bytes)
    monkeypatch.setattr(Ff.FftPlan, "run_fft_step", fake)
    return got


def _run_host(exe, tmp, captured, bufs, dtype=F32):
    params, grids, _, _ = captured
    npt = np.float64 if dtype == F64 else np.float32
    for name, arr in bufs.items():
        np.asarray(arr, npt).tofile(tmp / f"{name}.bin")
    (tmp / "params.bin").write_bytes(params)
    args = [str(exe), str(tmp), str(grids[0][0]), str(grids[1][0]), *map(str, grids[2]), str(grids[3][0]),
            "f64" if dtype == F64 else "f32"]
    out = subprocess.run(args, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr
    return np.fromfile(tmp / "out.bin", npt).astype(np.float64)


def _scatter(values, strides, size, fill=np.nan):
    buf = np.full(size, fill)
    idx = sum(np.indices(values.shape)[i] * strides[i] for i in range(values.ndim))
    buf[idx] = values
    return buf


def _gather(buf, dims, strides):
    idx = sum(np.indices(dims)[i] * strides[i] for i in range(len(dims)))
    return buf[idx]


def _ratio(got, want, scale, dtype=F32):
    rtol, atol = TOLERANCE[dtype]
    return float(np.max(np.abs(got - want) / (atol + rtol * np.maximum(np.abs(want), scale))))


HOST_CASES = [  # xdims, k, filt, pad, layout, filter format
    ((2, 3, 13, 11), 5, (9, 9), (4, 4), "nchw", NCHW),       # F 32 x 16
    ((1, 5, 10, 17), 3, (11, 7), (5, 2), "nhwc", NHWC),      # non-square filter, F 32 x 32
    ((3, 2, 9, 6), 7, (5, 3), (0, 2), "gap", NCHW),          # pad 0 in h, padded layout
    ((1, 4, 20, 19), 4, (13, 13), (12, 6), "nchw", NHWC),    # full padding in h (backward data: pad' 0)
    ((2, 1, 1, 12), 2, (1, 5), (0, 4), "nchw", NCHW),        # one row (Fh = 2)
    ((1, 9, 30, 5), 2, (3, 3), (1, 1), "nhwc", NCHW),        # 3x3, deeper reduction, F 32 x 8
    ((1, 1, 20, 20), 1, (13, 13), (12, 12), "nchw", NCHW),   # single channel, full padding: corners sum one
    ((1, 1, 100, 40), 1, (13, 13), (12, 6), "nchw", NCHW),   # product (a float FFT failed here); F 128 x 64
]
WORST = {}


@pytest.mark.parametrize("case", HOST_CASES)
@pytest.mark.parametrize("mode", [XCORR, CONV])
@pytest.mark.parametrize("direction", ["fwd", "bwd", "wgrad"])
@pytest.mark.parametrize("dtype", [F32, F64])
def test_kernels_on_the_host(host_exe, tmp_path, monkeypatch, rng, case, mode, direction, dtype):
    xd, k, filt, pad, layout, wfmt = case
    cross = mode == XCORR
    h = cpu_handle()
    c = cdesc(pad, (1, 1), (1, 1), mode, ctype=dtype)
    wd = (k, xd[1]) + filt
    yd = (xd[0], k) + ref.out_dims(xd[2:], filt, pad, (1, 1), (1, 1))
    xs, xsize = _strided(xd, layout, rng)
    ys, ysize = _strided(yd, layout, rng)
    xdsc, ydsc, wdsc = tdesc(xd, dtype, strides=xs), tdesc(yd, dtype, strides=ys), fdesc(wd, dtype, wfmt)
    x, w, y = rng.uniform(-1, 1, xd), rng.uniform(-1, 1, wd), rng.uniform(-1, 1, yd)
    if dtype == F32:
        x, w, y = (v.astype(np.float32).astype(np.float64) for v in (x, w, y))
    wbuf = _scatter(w, wdsc.strides, int(np.prod(wd)))
    args = (pad, (1, 1), (1, 1), 1, cross)
    got = _capture(monkeypatch)
    for alpha, beta in ((1.0, 0.0), (0.75, -0.5)):
        if direction == "fwd":
            need = pydnn.get_convolution_forward_workspace_size(h, xdsc, wdsc, c, ydsc, FWD_FFT)
            pydnn.convolution_forward(h, alpha, xdsc, 1 << 40, wdsc, 1 << 41, c, FWD_FFT, 1 << 43, need, beta, ydsc,
                                      1 << 42)
            old = _scatter(y, ys, ysize) if beta else np.full(ysize, np.nan)
            buf = _run_host(host_exe, tmp_path, got[-1], {"in": _scatter(x, xs, xsize), "w": wbuf, "out": old}, dtype)
            out = _gather(buf, yd, ys)
            want = ref.forward(alpha, x, w, beta, y if beta else None, *args)
            scale = abs(alpha) * ref.forward_raw(np.abs(x), np.abs(w), *args) + abs(beta) * np.abs(y)
            gap = np.ones(ysize, bool)
            gap[sum(np.indices(yd)[i] * ys[i] for i in range(4))] = False
        elif direction == "wgrad":
            need = pydnn.get_convolution_backward_filter_workspace_size(h, xdsc, ydsc, c, wdsc, WGRAD_FFT)
            pydnn.convolution_backward_filter(h, alpha, xdsc, 1 << 40, ydsc, 1 << 42, c, WGRAD_FFT, 1 << 43, need,
                                              beta, wdsc, 1 << 41)
            wsize = int(np.prod(wd))
            old = wbuf if beta else np.full(wsize, np.nan)
            buf = _run_host(host_exe, tmp_path, got[-1], {"in": _scatter(x, xs, xsize), "w": _scatter(y, ys, ysize),
                                                          "out": old}, dtype)
            out = _gather(buf, wd, wdsc.strides)
            want = ref.backward_filter(alpha, x, y, beta, w if beta else np.zeros(wd), *args)
            scale = (abs(alpha) * ref.backward_filter_raw(np.abs(x), np.abs(y), wd[2:], *args)
                     + abs(beta) * np.abs(w))
            gap = np.zeros(wsize, bool)  # filters are packed: no gaps
        else:
            need = pydnn.get_convolution_backward_data_workspace_size(h, wdsc, ydsc, c, xdsc, BWD_FFT)
            pydnn.convolution_backward_data(h, alpha, wdsc, 1 << 41, ydsc, 1 << 42, c, BWD_FFT, 1 << 43, need, beta,
                                            xdsc, 1 << 40)
            old = _scatter(x, xs, xsize) if beta else np.full(xsize, np.nan)
            buf = _run_host(host_exe, tmp_path, got[-1], {"in": _scatter(y, ys, ysize), "w": wbuf, "out": old}, dtype)
            out = _gather(buf, xd, xs)
            want = ref.backward_data(alpha, w, y, beta, x if beta else np.zeros(xd), *args)
            scale = (abs(alpha) * ref.backward_data_raw(np.abs(w), np.abs(y), xd[2:], *args)
                     + abs(beta) * np.abs(x))
            gap = np.ones(xsize, bool)
            gap[sum(np.indices(xd)[i] * xs[i] for i in range(4))] = False
        r = _ratio(out, want, scale, dtype)
        WORST[(dtype, direction, case[2])] = max(WORST.get((dtype, direction, case[2]), 0), r)
        assert r < 1, (r, got[-1][3])
        assert np.isnan(buf[gap]).all()  # the gaps of a padded layout are never written
    print("err / float tolerance", {k: round(v, 4) for k, v in WORST.items()})


def test_fused_epilogue_on_the_host(host_exe, tmp_path, monkeypatch, rng):
    """ConvolutionBiasActivationForward through FFT: y = act(alpha1 * conv + alpha2 * z + bias), and a
    plain forward after it does not inherit the epilogue (the settings stay with the fused call)."""
    xd, k, filt, pad = (2, 3, 12, 10), 4, (7, 9), (3, 4)
    h = cpu_handle()
    c = cdesc(pad, (1, 1), (1, 1), XCORR)
    wd = (k, xd[1]) + filt
    yd = (xd[0], k) + ref.out_dims(xd[2:], filt, pad, (1, 1), (1, 1))
    xdsc, wdsc, ydsc = tdesc(xd), fdesc(wd), tdesc(yd)
    zdsc, bdsc = tdesc(yd, fmt=NHWC), tdesc((1, k, 1, 1))
    x, w, z, b = (rng.uniform(-1, 1, s).astype(np.float32).astype(np.float64) for s in (xd, wd, yd, (1, k, 1, 1)))
    args = (pad, (1, 1), (1, 1), 1, True)
    got = _capture(monkeypatch)
    need = pydnn.get_convolution_forward_workspace_size(h, xdsc, wdsc, c, ydsc, FWD_FFT)
    for act_mode, coef, alpha2 in ((pydnn.PYDNN_ACTIVATION_RELU, 0.0, 0.5), (pydnn.PYDNN_ACTIVATION_ELU, 0.7, 0.0)):
        act = pydnn.create_activation_descriptor()
        pydnn.set_activation_descriptor(act, act_mode, pydnn.PYDNN_NOT_PROPAGATE_NAN, coef)
        pydnn.convolution_bias_activation_forward(h, 0.8, xdsc, 1 << 40, wdsc, 1 << 41, c, FWD_FFT, 1 << 43, need,
                                                  alpha2, zdsc, 1 << 44, bdsc, 1 << 45, act, ydsc, 1 << 42)
        ysize = int(np.prod(yd))
        buf = _run_host(host_exe, tmp_path, got[-1], {"in": x.ravel(), "w": w.ravel(), "out": np.full(ysize, np.nan),
                                                      "z": _scatter(z, zdsc.strides, ysize), "bias": b.ravel()})
        want = ref.bias_activation_forward(0.8, x, w, alpha2, z, b, act_mode, coef, *args)
        scale = 0.8 * ref.forward_raw(np.abs(x), np.abs(w), *args) + abs(alpha2) * np.abs(z) + np.abs(b)
        assert _ratio(buf.reshape(yd), want, scale) < 1
    pydnn.convolution_forward(h, 1.0, xdsc, 1 << 40, wdsc, 1 << 41, c, FWD_FFT, 1 << 43, need, 0.0, ydsc, 1 << 42)
    buf = _run_host(host_exe, tmp_path, got[-1], {"in": x.ravel(), "w": w.ravel(), "out": np.full(int(np.prod(yd)),
                                                                                                  np.nan)})
    assert _ratio(buf.reshape(yd), ref.forward(1.0, x, w, 0.0, None, *args),
                  ref.forward_raw(np.abs(x), np.abs(w), *args)) < 1
