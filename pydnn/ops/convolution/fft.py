"""Convolution FFT: forward (CUDNN_CONVOLUTION_FWD_ALGO_FFT), backward data
(CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT) and backward filter (CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT), pydnn's
own FFT kernels (ptx/conv_fft.cu; params: ptx/conv_fft_params.h), no cuFFT.

Four launches, the spectra in the workspace (F = Fh x Fw, powers of two, bins = Fh * (Fw / 2 + 1)):
    filter_fft   conj(FFT(f)) per (output channel, input channel), the taps placed at (r - pad) mod F
    input_fft    FFT(in) per (image, channel), the plane zero-extended to F
    product      Y[n][o][b] = sum over i of X[n][i][b] * conj(W)[o][i][b]   (per bin a complex GEMM)
    inverse_fft  y = real(IFFT(Y)) / (Fh Fw) cropped to the output, alpha / beta, fused bias + activation
Real inputs keep only the non-negative w frequencies (Hermitian symmetry): half the workspace and half the
product work. The 2-d transforms are radix-2 in shared memory, one block per transform.

F is the least power of two per dim (at least 2) for which circular correlation equals the linear one on
every output (see fft_size). Backward data is the same forward-form problem on dy: dx = corr(dy, f) with
pad' = filter - 1 - pad, the filter's channel roles swapped and its taps rotated (as cuDNN's backward
data is the transposed convolution). Backward filter correlates x with dy and sums over the images:
dw[k][c] = IFFT(sum over n of X[n][c] conj(DY[n][k])) read at (r - pad) mod F, so the same four kernels
run with dy in the filter's place (its P x Q plane as the taps), the images as the reduction, and the
inverse reading the output at an offset (conv_fft_params.h); F comes from fft_size(H, P, R, pad), the
same wrap conditions with the output plane P in the role of n_out.

Supported: 2 spatial dims, one group, stride 1, dilation 1, padding smaller than the filter in each dim
(cuDNN's FFT has the same limits; with larger padding some outputs sum no product at all), transforms of
at most 8192 points (Fh * Fw <= 8192: 64 x 128, 128 x 64, 64 x 64 ...; the double spectra of one
transform fill 128 KiB of shared memory), every data type, any tensor strides, NCHW / NHWC filters, both
modes.
Precision: the transforms, the products and the epilogue run in double for every data type (data
converted at the two ends). An FFT's rounding error is relative to the whole plane, not to each output's
own terms: in float it exceeded float's per-element tolerance (1.04x, host run of a float version) at
the corners of a fully padded single-channel 13x13 convolution, where an output sums one product. In
double it is far below every dtype's tolerance (tests/test_convolution_fft_cpu.py measures it).
Deterministic (no atomics; each output written once by one thread in a fixed order).
Workspace: 16 * bins * (N * C + K * C + N * K) bytes (three parts, each 256-byte aligned), bins from the
direction's F.
"""
import ctypes

from ... import enums as E
from ..._build.params import FLAG_BETA, FLAG_NAN_PROP, kernel_params
from ..._cuda import driver
from ...status import PydnnError
from ...tensor import DTYPES
from .._elementwise import CTYPE
from ..common import FLOAT_TAGS, cdiv, prod
from .plans import kernel_units as _family_units, IM2COL_GBPS, LAUNCH_MS, StepPlan, add_kernels, register, round_up
from .problem import DIR_BWD_DATA, DIR_BWD_FILTER, DIR_FWD, ConvParams

NS = E.PYDNN_STATUS_NOT_SUPPORTED
FLAG_Z, FLAG_BIAS, FLAG_FLIP, FLAG_BWD, FLAG_FLIP_OUT = 4, 8, 16, 1024, 2048
MAX_POINTS = 8192          # Fh * Fw of the largest transform (PYDNN_FFT_MAX_POINTS)
CPLX = 16                   # bytes of a complex double
THREADS = 256
TN = 4                      # the product kernel's images x output channels per thread (TN x TN)
FFT_TAGS = FLOAT_TAGS
CTYPES = CTYPE
# The Get..._v7 model (fitted on the H200 to the FFT rows of tools/bench_convolution_algos.py,
# forward and backward filter, F 64 x 64 and 32 x 32, and the backward-filter FFT of the fp32 3x3 ResNet
# layers, F 64 x 64 down to 8 x 8; the model within 10% of each of the twelve): double-precision products
# at PRODUCT_TFLOPS over the bins rounded up to whole warps (bins 40 at F 8 x 8 keep 2 of 8 warps busy),
# transforms at FFT_TFLOPS, and BLOCK_US of fixed cost per transform block (twiddles, zero fill, a barrier
# per stage, the load -> FFT -> store chain) per round of the blocks an SM holds at once: at F 8 x 8 the
# 327680 blocks of a 512-channel backward filter cost more than their flops. The first guesses (2 / 1
# TFLOP/s, no block cost) overestimated every large FFT 2.5x and ranked the backward-filter FFT first at
# 512 -> 512 @ 7, where it ran 2.3x slower than ALGO_1.
PRODUCT_TFLOPS = 10.0
FFT_TFLOPS = 3.0
BLOCK_US = 10.0


@kernel_params("conv_fft_params.h", "FftParams")
class FftParams(ctypes.Structure):
    _fields_ = [
        ("in_", ctypes.c_void_p), ("w", ctypes.c_void_p), ("out", ctypes.c_void_p),
        ("xf", ctypes.c_void_p), ("wf", ctypes.c_void_p), ("yf", ctypes.c_void_p),
        ("z", ctypes.c_void_p), ("bias", ctypes.c_void_p),
        ("alpha", ctypes.c_double), ("beta", ctypes.c_double), ("alpha2", ctypes.c_double),
        ("coef", ctypes.c_double),
        ("batch", ctypes.c_int), ("cin", ctypes.c_int), ("cout", ctypes.c_int),
        ("in_h", ctypes.c_int), ("in_w", ctypes.c_int), ("out_h", ctypes.c_int), ("out_w", ctypes.c_int),
        ("pad_h", ctypes.c_int), ("pad_w", ctypes.c_int), ("filt_h", ctypes.c_int), ("filt_w", ctypes.c_int),
        ("log_h", ctypes.c_int), ("log_w", ctypes.c_int), ("bins", ctypes.c_int),
        ("crop_h", ctypes.c_int), ("crop_w", ctypes.c_int),
        ("act", ctypes.c_int), ("flags", ctypes.c_uint),
        ("is_", ctypes.c_longlong * 4), ("os", ctypes.c_longlong * 4), ("zs", ctypes.c_longlong * 4),
        ("ws", ctypes.c_longlong * 4), ("bias_stride", ctypes.c_longlong),
    ]
    C_NAMES = {"in_": "in", "is_": "is"}


KERNELS = ("filter_fft", "input_fft", "inverse_fft")
PRODUCT_EXPR = f"pydnn::conv_fft::product<{TN}>"   # type-independent: in the f32 unit only


def _expr(kernel, tag):
    return f"pydnn::conv_fft::{kernel}<{CTYPES[tag]}>"


for _t in FFT_TAGS:
    add_kernels(f"conv_fft.{_t}", "conv_fft.cu",
                tuple(_expr(k, _t) for k in KERNELS) + ((PRODUCT_EXPR,) if _t == "f32" else ()))


def fft_size(n_in, n_out, filt, pad):
    """The least power of two F >= 2 for which the circular correlation of the F-periodic zero-extended
    input with the filter placed at (r - pad) mod F equals the linear one at outputs 0 .. n_out - 1.
    The input indices read are j = h + r - pad in [lo, hi] = [-pad, n_out + filt - 2 - pad]; j < 0 wraps
    to F + j, which must land in the zeros (F >= n_in - lo); j >= n_in must not wrap (F > hi); outputs
    and taps need distinct slots (F >= n_out, F >= filt)."""
    lo, hi = -pad, n_out + filt - 2 - pad
    need = max(n_in - min(lo, 0), hi + 1, n_out, filt, n_in, 2)
    f = 2
    while f < need:
        f *= 2
    return f


def refusal(pb, fwd, wgrad=False):
    """Why the FFT algorithm cannot serve a problem (None when it can); wgrad: backward filter."""
    name = "backward filter FFT" if wgrad else "FFT" if fwd else "backward data FFT"
    if pb.nspatial != 2:
        return f"{name} serves 2-d convolutions only (this one has {pb.nspatial} spatial dims)"
    if pb.groups != 1:
        return f"{name} serves one group only (got {pb.groups})"
    if tuple(pb.stride3[1:]) != (1, 1):
        return f"{name} needs stride 1 (got {pb.stride3[1]} x {pb.stride3[2]})"
    if tuple(pb.dil3[1:]) != (1, 1):
        return f"{name} needs dilation 1 (got {pb.dil3[1]} x {pb.dil3[2]})"
    for i, d in ((1, "height"), (2, "width")):
        if pb.pad3[i] >= pb.filt3[i]:
            return (f"{name} needs padding smaller than the filter (pad {d} {pb.pad3[i]} >= filter {d} "
                    f"{pb.filt3[i]})")
    fh, fw = _wgrad_sizes(pb) if wgrad else _sizes(pb, fwd)
    if fh * fw > MAX_POINTS:
        src = pb.in3 if fwd or wgrad else pb.out3
        return (f"{name} transforms hold at most {MAX_POINTS} points (64 x 128, 128 x 64, ...: double spectra in "
                f"shared memory); this problem needs {fh} x {fw} (input {src[1]} x {src[2]} plus padding)")
    if pb.n * pb.k > 2**31 - 1 or pb.n * pb.c > 2**31 - 1 or pb.k * pb.c > 2**31 - 1:
        return f"{name}: more than 2^31 - 1 transforms (one block each)"
    return None


def _view(pb, fwd):
    """The forward-form problem: (in strides, in hw, out strides, out hw, cin, cout, pad, flip)."""
    def s4(s):
        return (s[0], s[1], s[3], s[4])
    if fwd:
        return s4(pb.xs), pb.in3[1:], s4(pb.ys), pb.out3[1:], pb.c, pb.k, pb.pad3[1:], pb.flip
    pad = tuple(f - 1 - p for f, p in zip(pb.filt3[1:], pb.pad3[1:]))
    return s4(pb.ys), pb.out3[1:], s4(pb.xs), pb.in3[1:], pb.k, pb.c, pad, not pb.flip


def _sizes(pb, fwd):
    _, in_hw, _, out_hw, _, _, pad, _ = _view(pb, fwd)
    return tuple(fft_size(in_hw[i], out_hw[i], pb.filt3[1 + i], pad[i]) for i in range(2))


def _wgrad_sizes(pb):
    """Backward filter's F per dim: x (H) correlated with dy (P) at lags r - pad, r < R."""
    return tuple(fft_size(pb.in3[1 + i], pb.out3[1 + i], pb.filt3[1 + i], pb.pad3[1 + i]) for i in range(2))


_SMEM_SET = {}   # CUfunction (as int; handles of one context share it) -> the shared memory it was opened to


def _func_key(func):
    try:
        return int(func)      # cuda.bindings handles convert to their address
    except TypeError:
        return id(func)


class FftPlan(StepPlan):
    def run_fft_step(self, handle, i, smem):
        st = self.steps[i]
        if st[6] is None:
            st[6] = handle.function(st[0], st[1])
        if smem > 48 * 1024:  # past 48 KiB it must be asked for; only ever raised (plans share the function)
            key = _func_key(st[6])
            if _SMEM_SET.get(key, 0) < smem:
                driver.function_set_max_dynamic_smem(st[6], smem)
                _SMEM_SET[key] = smem
        driver.launch_args(st[6], st[2], st[3], smem, handle.cu_stream, st[5])

    def launch(self, handle, a_ptr, b_ptr, out_ptr, ws_ptr, alpha, beta, z_ptr=0, bias_ptr=0):
        p, h = self.params, self.gemm  # h: the epilogue fields ConvolutionBiasActivationForward set
        p.in_, p.w, p.out = a_ptr, b_ptr, out_ptr
        if self.wgrad:  # the caller passes (dy, x): x is the transformed "input", dy takes the filter's place
            p.in_, p.w = b_ptr, a_ptr
        p.xf, p.wf, p.yf = ws_ptr + self.offsets[0], ws_ptr + self.offsets[1], ws_ptr + self.offsets[2]
        p.z, p.bias = z_ptr or None, bias_ptr or None
        p.alpha, p.beta = alpha, beta
        p.flags = self.base_flags | (FLAG_BETA if beta != 0 else 0)
        if bias_ptr:
            p.flags |= h.flags & (FLAG_Z | FLAG_BIAS | FLAG_NAN_PROP)
            p.act, p.coef, p.alpha2, p.bias_stride = h.act, h.coef, h.alpha2, h.bias_stride
            for i, j in enumerate((0, 1, 3, 4)):
                p.zs[i] = h.zs[j]
        else:
            p.act = 0
        self.run_fft_step(handle, 0, self.smem_bytes)   # filter spectra
        self.run_fft_step(handle, 1, self.smem_bytes)   # input spectra
        self.run_fft_step(handle, 2, 0)                 # per-bin products
        self.run_fft_step(handle, 3, self.smem_bytes)   # inverse, crop, epilogue

    def estimate_ms(self, handle, base_estimate):
        """model_ms + the transform blocks' fixed cost: rounds of the blocks the SMs hold at once (256
        threads each: at most 8 per SM, fewer where the transform's shared memory limits them)."""
        p = self.params
        blocks = p.batch * p.cin + p.cout * p.cin + p.batch * p.cout
        per_sm = max(1, min(8, (227 * 1024) // self.smem_bytes))
        return self.model_ms + blocks / (max(handle.sm_count, 1) * per_sm) * BLOCK_US * 1e-3 + 3 * LAUNCH_MS


def plan_fft(handle, pb, direction, algo):
    """An FFT plan (forward, backward data or backward filter) or NOT_SUPPORTED with the reason."""
    if direction == DIR_BWD_FILTER:
        return _plan_wgrad(pb, algo)
    fwd = direction == DIR_FWD
    why = refusal(pb, fwd)
    if why:
        raise PydnnError(NS, f"algo: {why}")
    ins, in_hw, outs, out_hw, cin, cout, pad, flip = _view(pb, fwd)
    data = (prod(in_hw) * pb.n * cin + prod(out_hw) * pb.n * cout) * DTYPES[pb.dtype][0]
    pl, p = _fft_plan(pb, direction, algo, _sizes(pb, fwd), (pb.n, cin, cout), data)
    p.in_h, p.in_w, p.out_h, p.out_w = in_hw[0], in_hw[1], out_hw[0], out_hw[1]
    p.pad_h, p.pad_w, p.filt_h, p.filt_w = pad[0], pad[1], pb.filt3[1], pb.filt3[2]
    for i in range(4):
        p.is_[i], p.os[i] = ins[i], outs[i]
    for i, v in enumerate((pb.ws[0], pb.ws[1], pb.ws[3], pb.ws[4])):
        p.ws[i] = v
    pl.base_flags = (FLAG_FLIP if flip else 0) | (0 if fwd else FLAG_BWD)
    return pl


def _plan_wgrad(pb, algo):
    """Backward filter: the forward's kernels with the roles of conv_fft_params.h (batch = C, cin = N,
    cout = K; dy as the filter, x as the input, dw read at (r - pad) mod F). CONVOLUTION mode stores the
    taps rotated (FLIP_OUT)."""
    why = refusal(pb, False, wgrad=True)
    if why:
        raise PydnnError(NS, f"algo: {why}")
    n, c, k = pb.n, pb.c, pb.k
    data = (prod(pb.in3[1:]) * n * c + prod(pb.out3[1:]) * n * k + k * c * prod(pb.filt3[1:])) * DTYPES[pb.dtype][0]
    fh, fw = _wgrad_sizes(pb)
    pl, p = _fft_plan(pb, DIR_BWD_FILTER, algo, (fh, fw), (c, n, k), data)
    pl.wgrad = True
    p.in_h, p.in_w, p.out_h, p.out_w = pb.in3[1], pb.in3[2], pb.filt3[1], pb.filt3[2]
    p.pad_h, p.pad_w, p.filt_h, p.filt_w = 0, 0, pb.out3[1], pb.out3[2]  # dy's plane placed at lag 0
    p.crop_h, p.crop_w = -pb.pad3[1] % fh, -pb.pad3[2] % fw
    xs, ys, ws = pb.xs, pb.ys, pb.ws
    for i, v in enumerate((xs[1], xs[0], xs[3], xs[4])):  # input block (c, n)
        p.is_[i] = v
    for i, v in enumerate((ys[1], ys[0], ys[3], ys[4])):  # "filter" block (k, n): dy[n][k]
        p.ws[i] = v
    for i, v in enumerate((ws[1], ws[0], ws[3], ws[4])):  # output block (c, k): dw[k][c]
        p.os[i] = v
    pl.base_flags = FLAG_FLIP_OUT if pb.flip else 0  # tap (r, s) of the correlation is dw's (R-1-r, S-1-s)
    return pl


def _fft_plan(pb, direction, algo, fft, roles, data_bytes):
    """The plan every direction shares: F = fft (Fh, Fw), the kernels' (batch, cin, cout) = roles, the
    workspace parts, the Get..._v7 model (data_bytes: what the transforms read and write of the caller's tensors)
    and the four launches. The caller fills the sizes, strides, padding and flags of the returned params."""
    fh, fw = fft
    lh, lw = fh.bit_length() - 1, fw.bit_length() - 1
    bins = fh * (fw // 2 + 1)
    batch, cin, cout = roles
    sizes = (CPLX * bins * batch * cin, CPLX * bins * cout * cin, CPLX * bins * batch * cout)
    pl = FftPlan(direction, algo, pb)
    pl.fft, pl.wgrad = (fh, fw), False
    pl.offsets = (0, round_up(sizes[0]), round_up(sizes[0]) + round_up(sizes[1]))
    pl.workspace = pl.offsets[2] + round_up(sizes[2])
    pl.smem_bytes = (fh * fw + fh // 2 + fw // 2) * CPLX
    pl.gemm = ConvParams()          # holds the fused epilogue's settings between the caller and launch
    pl.gemm_expr = "fft"
    transforms = batch * cin + cout * cin + batch * cout
    pl.model_ms = (8 * batch * cout * cin * cdiv(bins, 32) * 32 / (PRODUCT_TFLOPS * 1e9)
                   + transforms * 5 * fh * fw * (lh + lw) / (FFT_TFLOPS * 1e9)
                   + (data_bytes + 2 * sum(sizes)) / (IM2COL_GBPS * 1e6))
    p = FftParams()
    p.batch, p.cin, p.cout = batch, cin, cout
    p.log_h, p.log_w, p.bins = lh, lw, bins
    pl.params = p
    unit = f"conv_fft.{pb.tag}"
    pl.add_step(unit, _expr("filter_fft", pb.tag), (cout * cin, 1, 1), (THREADS, 1, 1), p)
    pl.add_step(unit, _expr("input_fft", pb.tag), (batch * cin, 1, 1), (THREADS, 1, 1), p)
    pl.add_step("conv_fft.f32", PRODUCT_EXPR, (cdiv(bins, THREADS), cdiv(cout, TN), cdiv(batch, TN)), (THREADS, 1, 1),
                p)
    pl.add_step(unit, _expr("inverse_fft", pb.tag), (batch * cout, 1, 1), (THREADS, 1, 1), p)
    return pl, p


@register(DIR_FWD, E.PYDNN_CONVOLUTION_FWD_ALGO_FFT)
@register(DIR_BWD_DATA, E.PYDNN_CONVOLUTION_BWD_DATA_ALGO_FFT)
@register(DIR_BWD_FILTER, E.PYDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT)
def plan_transform(handle, pb, direction, algo):
    return plan_fft(handle, pb, direction, algo)


def kernel_units():
    """This module's kernel units."""
    return _family_units("conv_fft.")
