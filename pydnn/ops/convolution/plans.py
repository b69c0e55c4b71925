"""Convolution plans: what a planner produces and how a plan is launched, the table of planners, and the
per-handle plan cache.

A Plan is one implicit-GEMM launch (`gemm`, a ConvParams) with an optional split-K `fold`; a StepPlan is
a plan of several launches (GEMM, WINOGRAD_NONFUSED, FFT, the wgmma backward filter) that runs through its
own `launch` and models its own time (`estimate_ms`). Both carry what the family's calls read: workspace,
algo, direction, itemsize, acc_size (the workspace pointer's alignment), deterministic, align, problem.

Planners: each algorithm module registers `{(direction, algo): [candidates]}` here with `register`. A
candidate is a planner function and, optionally, the rule that refuses it (`refusal(pb)`, the reason or
None). plan_for tries a pair's candidates in their `order`: the first whose rule allows it and whose
planner returns a plan wins (a planner may return None to pass, like the wgmma backward filter where
another tiling is forced); when every rule refuses, NOT_SUPPORTED carries all their reasons. So
BWD_DATA_ALGO_1 is the tensor-core implicit GEMM where it applies, else the explicit GEMM + col2im, and
BWD_FILTER_ALGO_1 the wgmma kernel (sm_90), else the mma.sync tensor-core kernels, else the CUDA-core split.
This module imports only problem.py: planners reach each other through the table, never by import.
"""
from ... import enums as E
from ..._build.manifest import KernelUnit
from ..._build.params import FLAG_BETA
from ..._cuda import driver
from ...buffers import device_ptr
from ...status import PydnnError
from ...tensor import DTYPES, _int
from .._elementwise import CTYPE
from ..common import element_aligned, enum_arg, output_tensor
from .problem import (ALGO_TYPES, BAD, DIR_BWD_DATA, DIR_BWD_FILTER, DIR_FWD, FLAG_BIAS, FLAG_FLIP, FLAG_PAIR,
                      FLAG_PARTIAL, FLAG_Z, NS, ConvParams, algo_name, check_conv, operand_names, problem)

WS_ALIGN = 256          # workspace parts start on 256-byte boundaries
# the Get..._v7 heuristic's shared rates (a ranking, not a promise): the im2col / col2im / pack passes (bytes
# moved / time) and the cost of each launch beyond a one-launch plan's
IM2COL_GBPS = 2500.0
LAUNCH_MS = 0.004


def round_up(n, a=WS_ALIGN):
    return -(-n // a) * a


def fold_expr(tag):
    """conv::fold: split-K partials (fp32) added in split order into the output (ptx/convolution.cu)."""
    return f"pydnn::conv::fold<{CTYPE[tag]}>"


# ----------------------------------------------------------------------------- kernel units
# The units of the family, assembled from what each algorithm module adds: ptx/convolution.cu's CUDA-core
# and tensor-core kernels share one unit per data type, so several modules add to it.

_UNITS = {}


def add_kernels(unit, source, exprs, archs=()):
    """Add name expressions to a unit (created on first use; an expression added twice is kept once)."""
    entry = _UNITS.setdefault(unit, (source, [], tuple(archs)))
    if entry[0] != source or entry[2] != tuple(archs):
        raise ValueError(f"kernel unit {unit}: source / archs differ between its contributors")
    entry[1].extend(e for e in exprs if e not in entry[1])


def kernel_units(prefix=""):
    """The family's units (those whose names start with `prefix`)."""
    return [KernelUnit(name, src, tuple(exprs), archs=archs) for name, (src, exprs, archs) in _UNITS.items()
            if name.startswith(prefix)]


# ----------------------------------------------------------------------------- plan types

def digit_step(step, sizes):
    """The reduction's digits (4 sizes, the last fastest) that `step` flattened positions advance by."""
    out = [0] * 4
    for i in range(3, 0, -1):
        out[i] = step % sizes[i]
        step //= sizes[i]
    out[0] = step
    return out


class Plan:
    """The launches of one (direction, algorithm, problem): `gemm` (ConvParams) and an optional `fold`
    (ConvAuxParams) for split-K, with the workspace bytes they need."""

    __slots__ = ("direction", "algo", "unit", "gemm", "gemm_grid", "gemm_argv", "gemm_expr", "gemm_func", "fold",
                 "fold_grid", "fold_argv", "fold_expr", "fold_func", "workspace", "itemsize", "acc_size",
                 "deterministic", "splits", "problem", "align", "smem", "pair_ok", "threads", "cnotes")


def load_function(handle, unit_name, expr_text, smem):
    """The kernel, with its dynamic shared memory allowed past 48 KiB where it needs it and the shared-memory
    carveout preferred at its maximum (a hint: with the driver's default a 41 KiB block could get a carveout
    that holds one block a SM, ~8 us a block wave on the H200). Shared by the StepPlans that launch one kernel of
    their own (grouped_direct, narrow, stream)."""
    func = handle.function(unit_name, expr_text)
    if smem > 48 * 1024:
        driver.function_set_max_dynamic_smem(func, smem)
    try:
        d = driver._driver()
        d.cuFuncSetAttribute(func, d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100)
    except Exception:  # noqa: BLE001 - a hint only
        pass
    return func


def base_params(pb, direction):
    """The ConvParams every implicit-GEMM kernel reads: sizes, padding, strides, dilation, the flip."""
    p = ConvParams()
    p.batch, p.groups, p.cg, p.kg = pb.n, pb.groups, pb.cg, pb.kg
    for i in range(3):
        p.in_size[i], p.out_size[i], p.filt[i] = pb.in3[i], pb.out3[i], pb.filt3[i]
        p.pad[i], p.stride[i], p.dil[i] = pb.pad3[i], pb.stride3[i], pb.dil3[i]
    for i in range(5):  # backward data: xs are dx's strides, ys dy's
        p.ws[i], p.xs[i], p.ys[i] = pb.ws[i], pb.xs[i], pb.ys[i]
    p.flags = FLAG_FLIP if pb.flip else 0
    return p


class StepPlan:
    """A plan of several launches. It carries the attributes the family's code reads from a Plan
    (workspace, algo, direction, itemsize, acc_size (the workspace pointer's alignment), deterministic,
    align, gemm: the ConvParams whose epilogue fields ConvolutionBiasActivationForward sets, problem) and
    runs through `launch` (run_plan's hook) and `estimate_ms` (the Get..._v7 heuristic's hook)."""

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


class SubGemm:
    """A Plan run on a synthetic problem (a StepPlan's GEMM as a 1x1 convolution), with the real
    problem's flops restored for the model."""

    def __init__(self, plan, spb):
        self.plan = plan
        plan.problem = spb

    def run(self, handle, a_ptr, b_ptr, out_ptr, alpha, beta, z_ptr=0, bias_ptr=0):
        run_plan(handle, self.plan, a_ptr, b_ptr, out_ptr, 0, alpha, beta, z_ptr, bias_ptr)


# ----------------------------------------------------------------------------- the table of planners

_PLANNERS = {}   # (direction, algo) -> [(order, refusal or None, planner)], sorted by order


def register(direction, algo, order=0, refusal=None):
    """Decorator: `planner(handle, pb, direction, algo) -> plan or None` serves (direction, algo), tried
    in `order` among the pair's candidates, unless `refusal(pb)` names a reason."""
    def add(planner):
        row = _PLANNERS.setdefault((direction, algo), [])
        row.append((order, refusal, planner))
        row.sort(key=lambda c: c[0])
        return planner
    return add


def plan_for(handle, pb, direction, algo, served_as=None):
    """The plan of the first candidate of (direction, served_as or algo) that serves pb (see the module
    docstring); the plan records `algo`."""
    reasons = []
    for _, refusal, planner in _PLANNERS[(direction, algo if served_as is None else served_as)]:
        why = refusal(pb) if refusal is not None else None
        if why:
            reasons.append(why)
            continue
        pl = planner(handle, pb, direction, algo)
        if pl is not None:
            return pl
    raise PydnnError(NS, "algo: " + "; ".join(reasons))


def planner(direction, algo):
    """The candidates of (direction, algo) as one function (handle, pb, caller's algo): a step of another
    algorithm's plan (the GEMM algorithm's 1x1 convolution, say), recorded under the caller's algo."""
    return lambda handle, pb, caller_algo: plan_for(handle, pb, direction, caller_algo, served_as=algo)


_ESTIMATE = []   # algorithms.py's time model, registered when it loads (the package imports it first)


def register_estimate(fn):
    """algorithms.py hands its model (`fn(handle, plan) -> ms`) down here, so that a planner that weighs two
    routes (the GEMM algorithm: matmul against the implicit 1x1 view) can ask it without importing upward."""
    _ESTIMATE[:] = [fn]


def estimate_ms(handle, pl):
    """The registered model's time for a plan (Get..._v7's ranking model)."""
    return _ESTIMATE[0](handle, pl)


_TOP = []   # hooks fn(handle, plan) -> plan applied to a call's own plan (new_plan), never to a step's


def register_top(fn, scope="all"):
    """A hook for the plan of a call itself (new_plan), not for the plans other plans run as steps
    (planner(): those run without a workspace of their own): tensor_core.py's split-K of fwd_wgmma.
    scope: "all" also for a step plan's sub-plans that apply_top is asked for (dgrad_phases.py's phases),
    "own" a call's own plan only, "sub" those sub-plans only (conv_tma.py's backward data: one switch each)."""
    _TOP.append((fn, scope))


def apply_top(handle, pl, own=False):
    """The register_top hooks on a plan that runs with a workspace of its own: a call's (new_plan: own), or a
    step plan's sub-plan whose workspace the step plan reserves (dgrad_phases.py's phases: the largest)."""
    for fn, scope in _TOP:
        if scope == "all" or (scope == "own") == own:
            pl = fn(handle, pl)
    return pl


_TMA_PLANNER = []   # conv_tma.py's fn(handle, pb, algo, fallback) -> its plan or None (the layers: gemm.py asks here)


def register_tma_planner(fn):
    _TMA_PLANNER[:] = [fn]


def tma_plan(handle, pb, algo, fallback):
    """fwd_tma's plan of a forward problem (fallback: the plan a call it cannot take runs), or None where it
    refuses the problem or is not registered."""
    return _TMA_PLANNER[0](handle, pb, algo, fallback) if _TMA_PLANNER else None


def implemented():
    """{direction: the algorithms with a planner, in enum order}."""
    return {d: tuple(a for a in ALGO_TYPES[d][1] if (d, a) in _PLANNERS) for d in ALGO_TYPES}


def check_algo(direction, algo):
    """BAD_PARAM for a value outside the enum, NOT_SUPPORTED (with the reason) for one pydnn lacks."""
    t, algos = ALGO_TYPES[direction]
    a = enum_arg("algo", algo, algos, t)
    if (direction, a) not in _PLANNERS:
        have = implemented()[direction]
        raise PydnnError(NS, f"algo: {algo_name(direction, a)} is not implemented in pydnn yet (available: "
                             f"{', '.join(algo_name(direction, v) for v in have)})")
    return a


# ----------------------------------------------------------------------------- the plan of a call

def _w_key(w):
    try:
        return (w, w.dtype, w.format, tuple(w.dims), w.alive)
    except AttributeError:
        return None


def _key(direction, algo, conv, descs, w):
    if type(algo) is not int:
        return None
    try:
        return (("convolution", direction, algo, conv, conv.version, _w_key(w))
                + tuple((d, d.version) for d in descs))
    except (AttributeError, TypeError):
        return None


def get_plan(handle, direction, algo, conv, x_desc, w_desc, y_desc, extra=(), extra_key=(), adapt=None):
    """The cached plan of a call, or a new one (validation, kernel lookup). x / w / y in forward terms
    (backward data: dx, w, dy; backward filter: x, dw, dy). `extra`: more descriptors the call depends on
    (keyed with their versions); `extra_key`: plain hashable values it depends on; adapt(plan): applied
    once to a new plan (the call's own variant of it) before it is cached."""
    key = _key(direction, algo, conv, (x_desc, y_desc) + tuple(extra), w_desc)
    if key is not None:
        key += tuple(extra_key)
    pl = handle.prepared.get(key) if key is not None else None
    if pl is None:
        pl = new_plan(handle, direction, algo, conv, x_desc, w_desc, y_desc)
        if adapt is not None:
            adapt(pl)
        if key is not None:
            handle.remember(key, pl)
    return pl


def new_plan(handle, direction, algo, conv, x_desc, w_desc, y_desc):
    """Validate a call's descriptors and algorithm and plan it (uncached)."""
    check_conv(conv)
    pb = problem(conv, x_desc, w_desc, y_desc, operand_names(direction))
    algo = check_algo(direction, algo)
    out = {DIR_FWD: (y_desc, "yDesc"), DIR_BWD_DATA: (x_desc, "dxDesc"), DIR_BWD_FILTER: None}[direction]
    if out is not None:
        output_tensor(*out)
    pl = plan_for(handle, pb, direction, algo)
    pl.problem = pb
    return apply_top(handle, pl, own=True)


# ----------------------------------------------------------------------------- running a plan

def load_kernels(handle, pl):
    if pl.gemm_func is None:
        pl.gemm_func = handle.function(pl.unit, pl.gemm_expr)
        if pl.smem > 48 * 1024:  # dynamic shared memory past 48 KiB must be asked for
            driver.function_set_max_dynamic_smem(pl.gemm_func, pl.smem)
    if pl.fold is not None and pl.fold_func is None:
        pl.fold_func = handle.function(pl.unit, pl.fold_expr)


def check_workspace(pl, work_space, size):
    n = _int("workSpaceSizeInBytes", size)
    if n < 0:
        raise PydnnError(BAD, f"workSpaceSizeInBytes: {n} is negative")
    if n < pl.workspace:
        raise PydnnError(BAD, f"workSpaceSizeInBytes: {n} bytes is less than the {pl.workspace} bytes "
                              f"{algo_name(pl.direction, pl.algo)} needs for this problem")
    if pl.workspace == 0:
        return 0
    ptr = device_ptr(work_space, "workSpace", pl.workspace)
    if ptr == 0:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_NULL_POINTER, "workSpace: NULL with a workspace needed")
    return element_aligned(ptr, "workSpace", pl.acc_size)

def run_plan(handle, pl, a_ptr, b_ptr, out_ptr, ws_ptr, alpha, beta, z_ptr=0, bias_ptr=0):
    """Enqueue a plan's launches with the call's pointers and scalars."""
    if type(pl) is not Plan:  # a multi-launch plan (a StepPlan: its own launches)
        return pl.launch(handle, a_ptr, b_ptr, out_ptr, ws_ptr, alpha, beta, z_ptr, bias_ptr)
    if pl.align and (a_ptr % pl.align or b_ptr % pl.align):
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER,
                         f"{algo_name(pl.direction, pl.algo)} reads its input and w in {pl.align}-byte vectors: both "
                         f"must be {pl.align}-byte aligned (input {a_ptr:#x}, w {b_ptr:#x})")
    load_kernels(handle, pl)
    p = pl.gemm
    p.x, p.w, p.z, p.bias = a_ptr, b_ptr, z_ptr or None, bias_ptr or None
    p.alpha, p.beta = alpha, beta
    p.flags = (p.flags & ~(FLAG_BETA | FLAG_PAIR)) | (FLAG_BETA if beta != 0 else 0)
    if pl.pair_ok and out_ptr % 4 == 0:
        p.flags |= FLAG_PAIR
    if pl.fold is None:
        p.out = out_ptr
        driver.launch_args(pl.gemm_func, pl.gemm_grid, (pl.threads, 1, 1), pl.smem, handle.cu_stream, pl.gemm_argv)
        return
    p.out = ws_ptr
    f = pl.fold
    if type(f) is ConvParams:  # a split fwd_wgmma: fp32 partials, then fwd_split_fold runs the call's epilogue
        f.flags = p.flags & ~FLAG_PARTIAL
        f.act, f.coef, f.alpha2, f.bias_stride = p.act, p.coef, p.alpha2, p.bias_stride
        for i in range(5):
            f.zs[i] = p.zs[i]
        f.z, f.bias, f.alpha, f.beta, f.out, f.w = p.z, p.bias, alpha, beta, out_ptr, ws_ptr
        p.flags = (p.flags & ~(FLAG_BIAS | FLAG_Z | FLAG_BETA)) | FLAG_PARTIAL
        driver.launch_args(pl.gemm_func, pl.gemm_grid, (pl.threads, 1, 1), pl.smem, handle.cu_stream, pl.gemm_argv)
        driver.launch_args(pl.fold_func, pl.fold_grid, (256, 1, 1), 0, handle.cu_stream, pl.fold_argv)
        return
    driver.launch_args(pl.gemm_func, pl.gemm_grid, (pl.threads, 1, 1), pl.smem, handle.cu_stream, pl.gemm_argv)
    f.out, f.in_, f.alpha, f.beta = out_ptr, ws_ptr, alpha, beta
    f.flags = (f.flags & ~FLAG_BETA) | (FLAG_BETA if beta != 0 else 0)
    driver.launch_args(pl.fold_func, pl.fold_grid, (256, 1, 1), 0, handle.cu_stream, pl.fold_argv)
