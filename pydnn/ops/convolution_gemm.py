"""Convolution forward, GEMM algorithm (CUDNN_CONVOLUTION_FWD_ALGO_GEMM): an explicit im2col of x into
the workspace (ptx/conv_gemm.cu), then a GEMM. The GEMM is not a second kernel: the column matrix
col[N * OD * OH * OW][groups * C/g * T * R * S] is exactly an NHWC input of a 1x1, stride-1 convolution
with C/g * T * R * S channels per group, whose filter is the caller's filter viewed as (K, C/g * T*R*S)
(the column order inside a group follows the filter's memory order, so no filter copy). That convolution
runs on the family's existing plans: the tensor-core IMPLICIT_PRECOMP_GEMM kernel when it accepts the
view (half / bfloat16, math type not FMA, one group, NHWC filter, C/g * T*R*S a multiple of 8), the
CUDA-core implicit GEMM otherwise (every dtype, groups, layouts). y's strides, alpha / beta and the fused
bias + activation epilogue are the GEMM kernel's own.

Workspace: N * OD * OH * OW * C * T * R * S elements of the data type (16-byte aligned).
Deterministic (no atomics, one writer per element). Every shape the implicit GEMM serves, as long as the
column matrix's sizes fit 32-bit GEMM indices.

StepPlan (here) is the shape of a multi-launch plan that convolution.run_plan hands to `.launch`; the
WINOGRAD_NONFUSED plans (convolution_winograd.py) use it too.
"""
import ctypes

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
WS_ALIGN = 256          # workspace parts start on 256-byte boundaries
IM2COL_GBPS = 2500.0    # the heuristic's rate for the im2col pass (bytes moved / time)
LAUNCH_MS = 0.004       # the heuristic's cost of each launch beyond a one-launch plan's


@kernel_params("conv_gemm_params.h", "Im2colParams")
class Im2colParams(ctypes.Structure):
    _fields_ = [
        ("x", ctypes.c_void_p), ("col", ctypes.c_void_p),
        ("batch", ctypes.c_int), ("groups", ctypes.c_int), ("cg", ctypes.c_int), ("taps", ctypes.c_int),
        ("in_size", ctypes.c_int * 3), ("out_size", ctypes.c_int * 3), ("filt", ctypes.c_int * 3),
        ("pad", ctypes.c_int * 3), ("stride", ctypes.c_int * 3), ("dil", ctypes.c_int * 3),
        ("cin_inner", ctypes.c_int), ("flags", ctypes.c_uint),
        ("xs", ctypes.c_longlong * 5), ("cols", ctypes.c_longlong),
    ]


def kernel_units():
    return [KernelUnit(f"conv_gemm.{t}", "conv_gemm.cu", (f"pydnn::conv_gemm::im2col<{CTYPE[t]}>",))
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

    def run_step(self, handle, i):
        st = self.steps[i]
        if st[6] is None:
            st[6] = handle.function(st[0], st[1])
        driver.launch_args(st[6], st[2], st[3], 0, handle.cu_stream, st[5])


# ----------------------------------------------------------------------------- the GEMM algorithm

def _packed_filter(pb):
    """The filter's (channel stride within a group's row, cin_inner) for a packed filter, else None."""
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


def _col_problem(C, pb):
    """The 1x1, stride-1 convolution of the column matrix with the filter viewed as (K, C/g * taps)."""
    taps = prod(pb.filt3)
    s = C.Problem()
    for a in C.Problem.__slots__:  # everything the real problem has, then the view's own sizes
        if hasattr(pb, a):
            setattr(s, a, getattr(pb, a))
    s.dtype, s.tag, s.n, s.groups, s.k, s.kg = pb.dtype, pb.tag, pb.n, pb.groups, pb.k, pb.kg
    s.cg = pb.cg * taps
    s.c = pb.groups * s.cg
    s.in3 = s.out3 = tuple(pb.out3)
    s.filt3, s.pad3, s.stride3, s.dil3 = (1, 1, 1), (0, 0, 0), (1, 1, 1), (1, 1, 1)
    cols, o = s.c, pb.out3
    s.xs = (prod(o) * cols, 1, o[1] * o[2] * cols, o[2] * cols, cols)
    s.ys = pb.ys
    s.ws = (pb.ws[0], 1, 0, 0, 0)
    s.flip = False
    s.w_format, s.math_type, s.nspatial = pb.w_format, pb.math_type, pb.nspatial
    s.x_desc, s.y_desc, s.w_dims = pb.x_desc, pb.y_desc, (pb.k, s.cg)
    return s


class GemmPlan(StepPlan):
    def launch(self, handle, a_ptr, b_ptr, out_ptr, ws_ptr, alpha, beta, z_ptr=0, bias_ptr=0):
        p = self.steps[0][4]
        p.x, p.col = a_ptr, ws_ptr
        self.run_step(handle, 0)
        self.sub.run(handle, ws_ptr, b_ptr, out_ptr, alpha, beta, z_ptr, bias_ptr)

    def estimate_ms(self, handle, base_estimate):
        return base_estimate(handle, self.sub.plan) + 2 * self.workspace / (IM2COL_GBPS * 1e6) + LAUNCH_MS


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
    inner = _packed_filter(pb)
    if inner is None:
        raise PydnnError(NS, "algo: GEMM reads the filter as a packed (K, C/g * T*R*S) matrix; this filter's "
                             f"strides {tuple(pb.ws)} are not packed")
    taps = prod(pb.filt3)
    rows, cols = pb.n * prod(pb.out3), pb.groups * pb.cg * taps
    if rows > 2**31 - 1 or cols > 2**31 - 1:
        raise PydnnError(NS, f"algo: GEMM's column matrix ({rows} x {cols}) exceeds 2^31 - 1 rows or columns")
    spb = _col_problem(C, pb)
    if C._tc_refusal(spb, C.DIR_FWD) is None:
        sub = C.plan_tc(handle, spb, algo)
    else:
        sub = C.plan(handle, spb, C.DIR_FWD, algo)
    pl = GemmPlan(C.DIR_FWD, algo, pb)
    pl.sub = SubGemm(C, sub, spb)
    pl.gemm = sub.gemm            # the epilogue fields (bias, z, activation) of ConvolutionBiasActivationForward
    pl.gemm_expr = sub.gemm_expr
    pl.align = sub.align          # the tensor-core GEMM reads the filter in 16-byte vectors
    pl.workspace = round_up(rows * cols * pl.itemsize, 16)
    p = Im2colParams()
    p.batch, p.groups, p.cg, p.taps, p.cin_inner, p.cols = pb.n, pb.groups, pb.cg, taps, inner, cols
    for i in range(3):
        p.in_size[i], p.out_size[i], p.filt[i] = pb.in3[i], pb.out3[i], pb.filt3[i]
        p.pad[i], p.stride[i], p.dil[i] = pb.pad3[i], pb.stride3[i], pb.dil3[i]
    for i in range(5):
        p.xs[i] = pb.xs[i]
    p.flags = FLAG_FLIP if pb.flip else 0
    block = min(256, cdiv(cols, 32) * 32)
    pl.add_step(f"conv_gemm.{pb.tag}", kernel_units_expr(pb.tag), (rows, 1, 1), (block, 1, 1), p)
    return pl


def kernel_units_expr(tag):
    return f"pydnn::conv_gemm::im2col<{CTYPE[tag]}>"
