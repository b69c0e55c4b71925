"""Convolution through explicit GEMMs (ptx/conv_gemm.cu): the forward GEMM algorithm
(CUDNN_CONVOLUTION_FWD_ALGO_GEMM) and the explicit-GEMM form of backward data (BWD_DATA_ALGO_1 where the
tensor-core implicit GEMM refuses, e.g. C % 8 != 0 or float data).

Forward: an im2col of x into the workspace, then a GEMM. The column matrix col[N * OD * OH * OW][ld]
(ld >= groups * C/g * T * R * S: see ptx/conv_gemm_params.h) times the filter viewed as a (K, ld) matrix:
    * half / bfloat16, one group, math type not FMA: ld rounded up to a multiple of 8 (zero columns) and,
      unless the caller's filter already is that matrix (NHWC, packed, C * taps % 8 == 0), the filter
      packed into the workspace too (pack_filter); the GEMM is a 1x1, stride-1 convolution of the column
      matrix on the family's tensor-core kernel (fwd_tc / fwd_wgmma), so y's strides, alpha / beta and
      the fused bias + activation epilogue are that kernel's own. The 7x7 stem (C = 3, 147 columns) gets
      tensor cores this way.
    * float, one group, y with packed spatial dims (NCHW-like or NHWC-like): pydnn.ops.matmul (the
      CUDA-core gemm_simt, 128 x 128 tiles), one GEMM per image (its batch); alpha / beta are the GEMM's.
      A ConvolutionBiasActivationForward call (bias, z, activation) runs the 1x1 convolution instead (the
      CUDA-core implicit GEMM's epilogue), over the same workspace.
    * otherwise (double, groups, FMA math, odd y strides): the 1x1 convolution on the CUDA-core implicit GEMM.
Backward data, BWD_DATA_ALGO_1 where the tensor-core implicit GEMM refuses (convolution.plan_for), for
problems with C < 64 or a stride (where the CUDA-core gather of ALGO_0 wastes most of its 64-wide tile or
its taps), one group, float / half / bfloat16 (16-bit: math type not FMA): col = dy . filter, then
col2im: each dx element sums its own taps in a fixed order (deterministic, no atomics) with alpha / beta.
The GEMM is pydnn.ops.matmul (tensor cores for 16-bit data, gemm_simt for float), one GEMM per image
(dy NCHW-like or NHWC-like with packed spatial dims; the filter packed into the workspace unless it
already is the (K, ld) matrix).

Workspace: the column matrix (N * OD * OH * OW * ld elements; rounded up to 16 bytes, or to 256 when the
packed filter (K * ld elements) follows it); reported exactly by Get...WorkspaceSize. Deterministic
(one writer per element, sums in a fixed order). Not done here: backward filter (dw = dy^T . col, a GEMM
with a reduction of N * P: matmul's 128-wide tiles over K = 64 and 147 columns leave ~70% of each idle,
~2 ms predicted for the fp32 stem against ALGO_1's 3.1; not worth it without a tile that fits).

StepPlan (here) is the shape of a multi-launch plan that convolution.run_plan hands to `.launch`; the
WINOGRAD_NONFUSED and FFT plans (convolution_winograd.py, convolution_fft.py) use it too.

Performance notes (H200; the stem is 7x7/2 3->64 @224, N = 64: 15.1 GFLOP; cuDNN through PyTorch: bf16
fwd 33.6 / bwd data 18.5 / bwd filter 50.1 TFLOP/s, fp32 20.6 / 15.5 / 18.6):
  before (6a9e1df): stem fwd bf16 4.5 TFLOP/s (IMPLICIT_GEMM, CUDA cores: C = 3 refused by the tensor-core
     path), GEMM 3.7 fp32 (the 1x1 view on the CUDA-core implicit GEMM, 64 x 64 tiles); bwd data 0.1 (the
     CUDA-core gather: 3 of a 64-wide tile's columns used, 3/4 of the taps miss the stride).
  v1 Predictions before measuring:
     fwd bf16: im2col writes 802816 x 152 x 2 B = 244 MB and the GEMM reads it back (~0.15 ms at ~3.3
       TB/s) + the tensor-core 1x1 GEMM (15.1 GFLOP, ~0.1 ms) -> ~0.25-0.35 ms, 45-60 TFLOP/s (1.3-1.8x
       cuDNN).
     fwd fp32: im2col 488 MB written + read (~0.3 ms) + gemm_simt with N = 64 (half of each 128-wide tile
       idle: ~12 TFLOP/s) ~1.25 ms -> ~1.5 ms, ~10 TFLOP/s (~0.5x cuDNN; issue 4's 0.8x needs a GEMM
       tile that fits N = 64 or no column round trip).
     bwd data bf16: matmul on tensor cores with k = 64 (memory-bound: dy 103 MB + col 244 MB) + col2im
       (244 MB read) -> ~0.25 ms, ~60 TFLOP/s (~3x cuDNN). fp32: gemm_simt n = 147 (147 of 256 tile
       columns used) ~1.1 ms + col2im ~0.2 ms -> ~11 TFLOP/s (~0.7x cuDNN; 100x ALGO_0).
     Measured (H200, same run as cuDNN): fwd bf16 9.4 TFLOP/s (0.28x), fp32 8.1 (0.39x); bwd data bf16
       14.7 (0.80x), fp32 9.4 (0.60x); v7 vs Find 1.00x on all six (GEMM / ALGO_1 picked and fastest).
       Forward missed: v1's im2col (one block per row, every element decomposed with integer divisions)
       was instruction-bound, ~1.3 ms of the 1.6.
  v2 im2col per block of 32 rows x 512 columns with each column's offsets and each row's base decomposed
     once into shared memory; col2im visiting only the taps that meet an output (first_tap, then steps of
     stride / gcd(stride, dil)) instead of testing all 49 with a division each. Measured per launch
     (H200; bf16 NHWC / fp32 NCHW stem): im2col 0.343 / 0.338 ms, fwd_tc 1x1 over 152 columns 0.227 ms
     (matmul's gemm_tc 128x128 on the same columns 0.296: the 1x1 view stays), gemm_simt 0.489 ms;
     backward data matmul 0.410 (bf16 gemm_tc 128x256, k = 64) / 1.010 (simt), col2im 0.353 / 0.326.
     Whole: fwd bf16 26.9 TFLOP/s (0.80x cuDNN's 33.5), fp32 18.2 (0.88x of 20.6); bwd data bf16 19.7
     (1.05x of 18.8), fp32 11.3 (0.73x of 15.5). The fp32 1x1 layers (the direct GEMM, no im2col):
     256->64 @56 35.4 TFLOP/s (0.94x; IMPLICIT_GEMM had 6.6), 64->256 28.3 (1.04x; 4.2). v7 vs Find
     1.00x on every stem and 1x1 row (3x3 64->64 fp32 too).
  v3 (predictions before measuring) im2col with 4 elements' gathers in flight per thread before their
     stores (v2 one: 122M elements at ~0.7 TB/s of bf16 writes, latency-bound) -> 0.15-0.2 ms; col2im's
     innermost taps as a counted, unrolled run (several loads in flight) -> ~0.2 ms; bf16 backward
     data's GEMM as the tensor-core 1x1 forward of dy with W^T packed (the forward's 1x1 view moved the
     same bytes in 0.227 ms against matmul's 0.410) -> bf16 fwd ~0.4 ms (~38 TFLOP/s, 1.1x), fp32 fwd
     ~0.7 ms (~22, 1.05x), bwd data bf16 ~0.45 ms (~33, 1.8x), fp32 ~1.2 ms (~12.5, 0.8x).
     Measured: none of it paid, all three reverted. Whole plans: fwd bf16 0.584 ms (v2 0.565), fp32
     0.855 (0.834); bwd data fp32 1.472 (1.347: the counted col2im run ~0.12 ms slower than v2's walk),
     bf16 0.993 (0.775). The 1x1 view for bf16 backward data, timed on its own in the next run:
     implicit_gemm_pipe_tc 128x64 0.496 ms against matmul's gemm_tc 128x256 0.410.
  Final (v2 kernels, one run; cuDNN in the same run): stem bf16 fwd 26.9 TFLOP/s (0.80x cuDNN's 33.6),
     bwd data 19.7 (1.06x of 18.5); fp32 fwd 18.2 (0.88x of 20.6), bwd data 11.0 (0.71x of 15.5); fp32
     1x1 forward (direct GEMM) 256->64 @56 35.3 (0.93x), 64->256 28.1 (1.03x). v7's first choice is
     Find's fastest (1.00x) on all of these layers and directions. Still short: fp32 stem backward data
     (0.71x; gemm_simt 1.05 ms with 147 of 256 tile columns used + col2im 0.33), and the backward filter
     (not done here). Where the time goes now: im2col 0.34 ms (bf16 and fp32 alike: latency-bound, not
     bandwidth: 1.4 TB/s at fp32), col2im 0.33-0.35 ms; an implicit GEMM that gathers the 147 columns
     into shared memory (no column round trip) is the next step for the forward.
"""
import ctypes
import math

from .. import enums as E
from .._build.manifest import KernelUnit
from .._build.params import kernel_params
from .._cuda import driver
from ..status import PydnnError
from ..tensor import DTYPES
from ._elementwise import CTYPE
from .common import FLOAT_TAGS, cdiv, prod

NS = E.PYDNN_STATUS_NOT_SUPPORTED
FLAG_FLIP = 16
FLAG_C2I_BETA, FLAG_C2I_CLAST = 1, 2
WS_ALIGN = 256          # workspace parts start on 256-byte boundaries
IM2COL_GBPS = 2500.0    # the heuristic's rate for the im2col / col2im / pack passes (bytes moved / time)
LAUNCH_MS = 0.004       # the heuristic's cost of each launch beyond a one-launch plan's
# The heuristic's rates for pydnn.ops.matmul (a ranking, not a promise): gemm_simt's 128 x 128 float tile
# (25.5 TFLOP/s measured on 4096^3, one block per SM), the tensor-core GEMMs' rate and their memory rate.
SIMT_TILE_TFLOPS = 25.0
MM_TC_TFLOPS = 150.0
MM_GBPS = 2500.0
IM2COL_ROWS, IM2COL_COLS = 32, 512   # im2col's block: rows x columns (ptx/conv_gemm.cu)
MM_TAGS = ("f32", "f16", "bf16")   # the data types pydnn.ops.matmul runs
TC_TAGS = ("f16", "bf16")
SMALL_C = 64   # backward data: the explicit GEMM serves C < SMALL_C (the CUDA-core gather's N tile) or stride > 1


@kernel_params("conv_gemm_params.h", "Im2colParams")
class Im2colParams(ctypes.Structure):
    _fields_ = [
        ("x", ctypes.c_void_p), ("col", ctypes.c_void_p),
        ("batch", ctypes.c_int), ("groups", ctypes.c_int), ("cg", ctypes.c_int), ("taps", ctypes.c_int),
        ("in_size", ctypes.c_int * 3), ("out_size", ctypes.c_int * 3), ("filt", ctypes.c_int * 3),
        ("pad", ctypes.c_int * 3), ("stride", ctypes.c_int * 3), ("dil", ctypes.c_int * 3),
        ("cin_inner", ctypes.c_int), ("flags", ctypes.c_uint),
        ("xs", ctypes.c_longlong * 5), ("cols", ctypes.c_longlong), ("ld", ctypes.c_longlong),
    ]


@kernel_params("conv_gemm_params.h", "PackFilterParams")
class PackFilterParams(ctypes.Structure):
    _fields_ = [
        ("w", ctypes.c_void_p), ("out", ctypes.c_void_p),
        ("k", ctypes.c_int), ("cg", ctypes.c_int), ("taps", ctypes.c_int), ("cin_inner", ctypes.c_int),
        ("filt", ctypes.c_int * 3), ("pad_", ctypes.c_int),
        ("ws", ctypes.c_longlong * 5), ("cols", ctypes.c_longlong), ("ld", ctypes.c_longlong),
    ]


@kernel_params("conv_gemm_params.h", "Col2imParams")
class Col2imParams(ctypes.Structure):
    _fields_ = [
        ("col", ctypes.c_void_p), ("dx", ctypes.c_void_p),
        ("batch", ctypes.c_int), ("c", ctypes.c_int), ("taps", ctypes.c_int), ("cin_inner", ctypes.c_int),
        ("in_size", ctypes.c_int * 3), ("out_size", ctypes.c_int * 3), ("filt", ctypes.c_int * 3),
        ("pad", ctypes.c_int * 3), ("stride", ctypes.c_int * 3), ("dil", ctypes.c_int * 3),
        ("tap_step", ctypes.c_int * 3), ("out_step", ctypes.c_int * 3),
        ("flags", ctypes.c_uint), ("alpha", ctypes.c_float), ("beta", ctypes.c_float), ("pad_", ctypes.c_int),
        ("xs", ctypes.c_longlong * 5), ("ld", ctypes.c_longlong), ("total", ctypes.c_longlong),
    ]


def _expr(kernel, tag):
    return f"pydnn::conv_gemm::{kernel}<{CTYPE[tag]}>"


def kernel_units():
    return [KernelUnit(f"conv_gemm.{t}", "conv_gemm.cu",
                       tuple(_expr(k, t) for k in ("im2col", "pack_filter", "col2im")))
            for t in FLOAT_TAGS]


def round_up(n, a=WS_ALIGN):
    return -(-n // a) * a


class StepPlan:
    """A plan of several launches. It carries the attributes the family's code reads from a Plan
    (workspace, algo, direction, itemsize, acc_size (the workspace pointer's alignment), deterministic,
    align, gemm: the ConvParams whose epilogue fields ConvolutionBiasActivationForward sets, problem) and
    runs through `launch` (convolution.run_plan's hook) and `estimate_ms` (the v7 model's hook)."""

    fold = None
    splits = 1
    smem = 0
    pair_ok = False

    def __init__(self, direction, algo, pb):
        self.direction, self.algo, self.problem = direction, algo, pb
        self.itemsize = DTYPES[pb.dtype][0]
        self.acc_size = 16
        self.deterministic = True
        self.align = 0
        self.workspace = 0
        self.steps = []   # [(unit, expr, grid, block, params, argv, func)] launched before / after the GEMM

    def add_step(self, unit, expr, grid, block, params):
        if max(grid[1], grid[2]) > 65535 or grid[0] > 2**31 - 1 or grid[0] < 1:
            raise PydnnError(NS, f"algo: {grid} blocks exceed the launch grid (problem too large)")
        self.steps.append([unit, expr, grid, block, params, driver.kernel_args(params), None])
        return len(self.steps) - 1

    def run_step(self, handle, i):
        st = self.steps[i]
        if st[6] is None:
            st[6] = handle.function(st[0], st[1])
        driver.launch_args(st[6], st[2], st[3], 0, handle.cu_stream, st[5])


# ----------------------------------------------------------------------------- shared pieces

def _packed_filter(pb):
    """The filter's column order (cin_inner) when it is a packed (K, C/g * taps) matrix, else None."""
    taps = prod(pb.filt3)
    ws = pb.ws
    if pb.w_format == E.PYDNN_TENSOR_NHWC:
        want = (taps * pb.cg, 1, pb.filt3[1] * pb.filt3[2] * pb.cg, pb.filt3[2] * pb.cg, pb.cg)
        inner = 1
    else:
        want = (pb.cg * taps, taps, pb.filt3[1] * pb.filt3[2], pb.filt3[2], 1)
        inner = 0
    # spatial dims of size 1 may carry any stride (they are never stepped)
    ok = all(ws[i] == want[i] or (i >= 2 and pb.filt3[i - 2] == 1) for i in range(5)) and (ws[1] == want[1] or pb.cg == 1)
    return inner if ok else None


def _spatial_unit(strides3, sizes3):
    """The stride of one step of the flattened (d, h, w) position when the spatial dims are packed
    row-major over it (0 when every spatial size is 1: any unit), else None."""
    unit = None
    expect = None
    for s, n in zip(reversed(strides3), reversed(sizes3)):
        if n == 1:
            continue
        if unit is None:
            unit, expect = s, s
        if s != expect:
            return None
        expect = s * n
    return 0 if unit is None else unit


def _add_im2col(pl, pb, inner, cols, ld):
    taps = prod(pb.filt3)
    rows = pb.n * prod(pb.out3)
    p = Im2colParams()
    p.batch, p.groups, p.cg, p.taps, p.cin_inner, p.cols, p.ld = pb.n, pb.groups, pb.cg, taps, inner, cols, ld
    for i in range(3):
        p.in_size[i], p.out_size[i], p.filt[i] = pb.in3[i], pb.out3[i], pb.filt3[i]
        p.pad[i], p.stride[i], p.dil[i] = pb.pad3[i], pb.stride3[i], pb.dil3[i]
    for i in range(5):
        p.xs[i] = pb.xs[i]
    p.flags = FLAG_FLIP if pb.flip else 0
    grid = (cdiv(rows, IM2COL_ROWS), cdiv(ld, IM2COL_COLS), 1)
    return pl.add_step(f"conv_gemm.{pb.tag}", _expr("im2col", pb.tag), grid, (256, 1, 1), p)


def _add_pack(pl, pb, inner, cols, ld):
    p = PackFilterParams()
    p.k, p.cg, p.taps, p.cin_inner, p.cols, p.ld = pb.k, pb.cg, prod(pb.filt3), inner, cols, ld
    for i in range(3):
        p.filt[i] = pb.filt3[i]
    for i in range(5):
        p.ws[i] = pb.ws[i]
    return pl.add_step(f"conv_gemm.{pb.tag}", _expr("pack_filter", pb.tag), (cdiv(pb.k * ld, 256), 1, 1),
                       (256, 1, 1), p)


def _filter_order(pb):
    """(cin_inner, packed?): the caller's filter's own column order when it is packed; else the order
    that follows its format (the pack reads any strides)."""
    inner = _packed_filter(pb)
    if inner is not None:
        return inner, True
    return (1 if pb.w_format == E.PYDNN_TENSOR_NHWC else 0), False


def simt_ms(handle, m, n, k, batch):
    """The model's time of gemm_simt: waves of 128 x 128 tiles, one block per SM."""
    tiles = cdiv(m, 128) * cdiv(n, 128) * batch
    sms = max(handle.sm_count, 1)
    waves = -(-tiles // sms)
    return waves * 2.0 * 128 * 128 * k / (SIMT_TILE_TFLOPS * 1e12 / sms) * 1e3


def mm_ms(handle, mp):
    """The model's time of a pydnn.ops.matmul plan."""
    if mp.esize == 4:
        return simt_ms(handle, mp.m, mp.n, mp.k, mp.batch)
    nbytes = mp.batch * (mp.m * mp.k + mp.k * mp.n + mp.m * mp.n) * mp.esize
    return max(2.0 * mp.batch * mp.m * mp.n * mp.k / (MM_TC_TFLOPS * 1e9), nbytes / (MM_GBPS * 1e6))


# ----------------------------------------------------------------------------- the forward GEMM algorithm

def _col_problem(C, pb, ld, w_rows):
    """The 1x1, stride-1 convolution of the column matrix (ld channels per group) with the filter viewed as
    (K, ld) rows `w_rows` apart."""
    s = C.Problem()
    for a in C.Problem.__slots__:  # everything the real problem has, then the view's own sizes
        if hasattr(pb, a):
            setattr(s, a, getattr(pb, a))
    s.dtype, s.tag, s.n, s.groups, s.k, s.kg = pb.dtype, pb.tag, pb.n, pb.groups, pb.k, pb.kg
    s.cg = ld // pb.groups
    s.c = ld
    s.in3 = s.out3 = tuple(pb.out3)
    s.filt3, s.pad3, s.stride3, s.dil3 = (1, 1, 1), (0, 0, 0), (1, 1, 1), (1, 1, 1)
    o = pb.out3
    s.xs = (prod(o) * ld, 1, o[1] * o[2] * ld, o[2] * ld, ld)
    s.ys = pb.ys
    s.ws = (w_rows, 1, 0, 0, 0)
    s.flip = False
    s.w_format, s.math_type, s.nspatial = E.PYDNN_TENSOR_NHWC, pb.math_type, pb.nspatial
    s.x_desc, s.y_desc, s.w_dims = pb.x_desc, pb.y_desc, (pb.k, s.cg)
    return s


def _fwd_matmul(handle, pb, ld, w_rows):
    """pydnn.ops.matmul's plan of the forward GEMM over the column matrix (one GEMM per image) and
    whether its A operand is the filter, or None when y's layout does not allow one."""
    from . import matmul
    if pb.tag != "f32" or pb.groups != 1:
        return None
    P, K = prod(pb.out3), pb.k
    unit = _spatial_unit(pb.ys[2:], pb.out3)
    try:
        if pb.ys[1] == 1 and unit is not None:     # NHWC-like y: y_n[P x K] = col_n . W^T
            mp = matmul.gemm_plan(handle, pb.dtype, P, K, ld, trans_b=True, lda=ld, ldb=w_rows,
                                  ldc=max(unit, K), batch=pb.n, stride_a=P * ld, stride_c=pb.ys[0])
            return mp, False
        if unit in (0, 1):                          # NCHW-like y: y_n[K x P] = W . col_n^T
            mp = matmul.gemm_plan(handle, pb.dtype, K, P, ld, trans_b=True, lda=w_rows, ldb=ld,
                                  ldc=max(pb.ys[1], P), batch=pb.n, stride_b=P * ld, stride_c=pb.ys[0])
            return mp, True
    except PydnnError:
        return None
    return None


def _direct_matmul(handle, pb):
    """A 1x1, stride-1, unpadded float problem whose x already is the column matrix (NCHW-like x with
    NCHW-like y, or NHWC-like both, spatial dims packed) and whose filter is a packed (K, C) matrix: the
    matmul plan (no im2col, no workspace) and whether A is the filter; else None."""
    from . import matmul
    if (pb.tag != "f32" or pb.groups != 1 or pb.filt3 != (1, 1, 1) or pb.stride3 != (1, 1, 1)
            or pb.pad3 != (0, 0, 0) or _packed_filter(pb) is None):
        return None
    P, K, Cc = prod(pb.out3), pb.k, pb.c
    xu, yu = _spatial_unit(pb.xs[2:], pb.in3), _spatial_unit(pb.ys[2:], pb.out3)
    if xu is None or yu is None:
        return None
    try:
        if pb.ys[1] == 1 and pb.xs[1] == 1:         # y_n[P x K] = x_n[P x C] . W^T
            mp = matmul.gemm_plan(handle, pb.dtype, P, K, Cc, trans_b=True, lda=max(xu, Cc), ldb=pb.ws[0],
                                  ldc=max(yu, K), batch=pb.n, stride_a=pb.xs[0], stride_c=pb.ys[0])
            return mp, False
        if xu in (0, 1) and yu in (0, 1):           # y_n[K x P] = W[K x C] . x_n[C x P]
            mp = matmul.gemm_plan(handle, pb.dtype, K, P, Cc, lda=pb.ws[0], ldb=max(pb.xs[1], P),
                                  ldc=max(pb.ys[1], P), batch=pb.n, stride_b=pb.xs[0], stride_c=pb.ys[0])
            return mp, True
    except PydnnError:
        return None
    return None


class GemmPlan(StepPlan):
    """im2col (+ pack_filter) + the GEMM: matmul (`mm`) or the 1x1 convolution (`sub`). `direct`: a 1x1
    problem whose x is the column matrix: matmul on x itself, no im2col (and `sub` the implicit GEMM of
    the problem itself, for the fused epilogue)."""

    mm = None
    pack = None
    im2col = None
    direct = False
    col_bytes = 0

    def launch(self, handle, a_ptr, b_ptr, out_ptr, ws_ptr, alpha, beta, z_ptr=0, bias_ptr=0):
        fused = bool(z_ptr or bias_ptr)
        if self.direct:
            if fused:
                return self.sub.run(handle, a_ptr, b_ptr, out_ptr, alpha, beta, z_ptr, bias_ptr)
            mp, filter_a = self.mm
            a, b = (b_ptr, a_ptr) if filter_a else (a_ptr, b_ptr)
            return mp.launch(handle, a, b, out_ptr, alpha, beta)
        p = self.steps[self.im2col][4]
        p.x, p.col = a_ptr, ws_ptr
        self.run_step(handle, self.im2col)
        w = b_ptr
        if self.pack is not None:
            q = self.steps[self.pack][4]
            q.w, q.out = b_ptr, ws_ptr + self.filter_off
            self.run_step(handle, self.pack)
            w = ws_ptr + self.filter_off
        if self.mm is not None and not fused:
            mp, filter_a = self.mm
            a, b = (w, ws_ptr) if filter_a else (ws_ptr, w)
            return mp.launch(handle, a, b, out_ptr, alpha, beta)
        self.sub.run(handle, ws_ptr, w, out_ptr, alpha, beta, z_ptr, bias_ptr)

    def estimate_ms(self, handle, base_estimate):
        gemm = mm_ms(handle, self.mm[0]) if self.mm is not None else base_estimate(handle, self.sub.plan)
        return gemm + 2 * self.col_bytes / (IM2COL_GBPS * 1e6) + LAUNCH_MS * len(self.steps)


class SubGemm:
    """A Plan of convolution.py run on a synthetic problem, with the real problem's flops restored for
    the model."""

    def __init__(self, C, plan, spb):
        self.C, self.plan = C, plan
        plan.problem = spb

    def run(self, handle, a_ptr, b_ptr, out_ptr, alpha, beta, z_ptr=0, bias_ptr=0):
        self.C.run_plan(handle, self.plan, a_ptr, b_ptr, out_ptr, 0, alpha, beta, z_ptr, bias_ptr)


def plan_gemm(handle, pb, algo):
    """The GEMM algorithm's plan, or NOT_SUPPORTED with the reason."""
    from . import convolution as C
    direct = _direct_matmul(handle, pb)
    if direct is not None:
        pl = GemmPlan(C.DIR_FWD, algo, pb)
        pl.direct, pl.mm = True, direct
        sub = C.plan(handle, pb, C.DIR_FWD, algo)   # the fused epilogue's path: the problem itself
        pl.sub = SubGemm(C, sub, pb)
        pl.gemm, pl.gemm_expr = sub.gemm, sub.gemm_expr
        return pl
    taps = prod(pb.filt3)
    rows, cols = pb.n * prod(pb.out3), pb.groups * pb.cg * taps
    tc = (pb.tag in TC_TAGS and pb.groups == 1 and pb.math_type != E.PYDNN_FMA_MATH)
    ld = -(-cols // 8) * 8 if tc else cols
    if rows > 2**31 - 1 or ld > 2**31 - 1:
        raise PydnnError(NS, f"algo: GEMM's column matrix ({rows} x {ld}) exceeds 2^31 - 1 rows or columns")
    inner, packed = _filter_order(pb)
    # the caller's filter is the GEMM's B operand as it is when packed in the column order (and, for the
    # tensor cores, NHWC rows of ld elements); else it is packed into the workspace
    own = packed and ld == cols and (not tc or inner == 1)
    pl = GemmPlan(C.DIR_FWD, algo, pb)
    pl.col_bytes = round_up(rows * ld * pl.itemsize)
    pl.filter_off = pl.col_bytes
    w_rows = pb.ws[0] if own else ld
    pl.im2col = _add_im2col(pl, pb, inner, cols, ld)
    if not own:
        pl.pack = _add_pack(pl, pb, inner, cols, ld)
    spb = _col_problem(C, pb, ld, w_rows)
    if C._tc_refusal(spb, C.DIR_FWD) is None:
        sub = C.plan_tc(handle, spb, algo)
    else:
        sub = C.plan(handle, spb, C.DIR_FWD, algo)
    pl.sub = SubGemm(C, sub, spb)
    pl.mm = _fwd_matmul(handle, pb, ld, w_rows)
    pl.gemm = sub.gemm            # the epilogue fields (bias, z, activation) of ConvolutionBiasActivationForward
    pl.gemm_expr = sub.gemm_expr
    # the tensor-core GEMM reads the filter in 16-byte vectors: the caller's, when it is read in place
    pl.align = sub.align if own else 0
    pl.workspace = round_up(rows * ld * pl.itemsize, 16) if own else pl.col_bytes + round_up(pb.k * ld * pl.itemsize, 16)
    return pl


# ----------------------------------------------------------------------------- backward data: GEMM + col2im

class BwdGemmPlan(StepPlan):
    """(pack_filter +) col = dy . W (pydnn.ops.matmul) + col2im."""

    pack = None

    def launch(self, handle, a_ptr, b_ptr, out_ptr, ws_ptr, alpha, beta, z_ptr=0, bias_ptr=0):
        """a = dy, b = w, out = dx."""
        w = b_ptr
        if self.pack is not None:
            q = self.steps[self.pack][4]
            q.w, q.out = b_ptr, ws_ptr + self.filter_off
            self.run_step(handle, self.pack)
            w = ws_ptr + self.filter_off
        self.mm.launch(handle, a_ptr, w, ws_ptr, 1.0, 0.0)
        p = self.steps[self.col2im][4]
        p.col, p.dx, p.alpha, p.beta = ws_ptr, out_ptr, alpha, beta
        p.flags = (p.flags & ~FLAG_C2I_BETA) | (FLAG_C2I_BETA if beta != 0 else 0)
        self.run_step(handle, self.col2im)

    def estimate_ms(self, handle, base_estimate):
        return mm_ms(handle, self.mm) + 2 * self.col_bytes / (IM2COL_GBPS * 1e6) + LAUNCH_MS * len(self.steps)


def bwd_data_gemm_refusal(pb):
    """Why the explicit-GEMM backward data cannot serve a problem (None when it can)."""
    if pb.tag not in MM_TAGS:
        return "its explicit GEMM runs float, half and bfloat16 data"
    if pb.tag in TC_TAGS and pb.math_type == E.PYDNN_FMA_MATH:
        return "its explicit GEMM runs 16-bit data on tensor cores, which the FMA math type forbids"
    if pb.groups != 1:
        return f"its explicit GEMM needs groupCount 1 (got {pb.groups})"
    if pb.c >= SMALL_C and prod(pb.stride3) == 1:
        return (f"its explicit GEMM + col2im serves small-channel (C < {SMALL_C}) or strided problems, where "
                f"the CUDA-core gather wastes most of its tile or taps (C {pb.c}, stride 1)")
    unit = _spatial_unit(pb.ys[2:], pb.out3)
    if unit is None or (pb.ys[1] != 1 and unit not in (0, 1)):
        return (f"its explicit GEMM reads dy as a matrix: NCHW-like or NHWC-like with packed spatial dims "
                f"(strides {tuple(pb.y_desc.strides)})")
    return None


def plan_bwd_data_gemm(handle, pb, algo):
    """Backward data as pack_filter (when needed) + matmul + col2im, or NOT_SUPPORTED with the reason."""
    from . import convolution as C
    from . import matmul
    why = bwd_data_gemm_refusal(pb)
    if why:
        raise PydnnError(NS, f"algo: {C.algo_name(C.DIR_BWD_DATA, algo)}: {why}")
    taps = prod(pb.filt3)
    P, K, rows, cols = prod(pb.out3), pb.k, pb.n * prod(pb.out3), pb.c * taps
    tc = pb.tag in TC_TAGS
    ld = -(-cols // 8) * 8 if tc else cols
    if rows > 2**31 - 1 or ld > 2**31 - 1:
        raise PydnnError(NS, f"algo: the column matrix ({rows} x {ld}) exceeds 2^31 - 1 rows or columns")
    inner, packed = _filter_order(pb)
    pl = BwdGemmPlan(C.DIR_BWD_DATA, algo, pb)
    pl.col_bytes = round_up(rows * ld * pl.itemsize)
    pl.filter_off = pl.col_bytes
    own = packed and ld == cols
    w_rows = pb.ws[0] if own else ld
    if not own:
        pl.pack = _add_pack(pl, pb, inner, cols, ld)
    unit = _spatial_unit(pb.ys[2:], pb.out3)
    if pb.ys[1] == 1:   # NHWC-like dy: col_n[P x ld] = dy_n[P x K] . W
        pl.mm = matmul.gemm_plan(handle, pb.dtype, P, ld, K, lda=max(unit, K), ldb=w_rows, ldc=ld, batch=pb.n,
                                 stride_a=pb.ys[0], stride_c=P * ld)
    else:               # NCHW-like dy: col_n = dy_n^T . W
        pl.mm = matmul.gemm_plan(handle, pb.dtype, P, ld, K, trans_a=True, lda=max(pb.ys[1], P) if K > 1 else P,
                                 ldb=w_rows, ldc=ld, batch=pb.n, stride_a=pb.ys[0], stride_c=P * ld)
    _add_col2im(pl, pb, inner, taps, ld)
    pl.gemm, pl.gemm_expr = None, pl.mm.fast.expr
    pl.align = 0
    pl.workspace = round_up(rows * ld * pl.itemsize, 16) if own else pl.col_bytes + round_up(K * ld * pl.itemsize, 16)
    return pl


def _add_col2im(pl, pb, inner, taps, ld):
    p = Col2imParams()
    p.batch, p.c, p.taps, p.cin_inner, p.ld = pb.n, pb.c, taps, inner, ld
    for i in range(3):
        p.in_size[i], p.out_size[i], p.filt[i] = pb.in3[i], pb.out3[i], pb.filt3[i]
        p.pad[i], p.stride[i], p.dil[i] = pb.pad3[i], pb.stride3[i], pb.dil3[i]
        gcd = math.gcd(pb.stride3[i], pb.dil3[i])
        p.tap_step[i], p.out_step[i] = pb.stride3[i] // gcd, pb.dil3[i] // gcd
    for i in range(5):
        p.xs[i] = pb.xs[i]
    p.total = pb.c * prod(pb.in3)
    if p.total > 2**31 - 1:
        raise PydnnError(NS, f"algo: dx's {p.total} elements per image exceed col2im's 2^31 - 1")
    clast = pb.xs[1] == 1 and pb.c > 1
    p.flags = (FLAG_FLIP if pb.flip else 0) | (FLAG_C2I_CLAST if clast else 0)
    pl.col2im = pl.add_step(f"conv_gemm.{pb.tag}", _expr("col2im", pb.tag), (cdiv(p.total, 256), pb.n, 1),
                            (256, 1, 1), p)
