"""Convolution's public calls (cudnnConvolution*): descriptors, output dims, forward, backward data,
backward filter, backward bias, the fused bias + activation forward, workspace sizes, algorithm queries
and Find; and the C API's declaration of them.

A call validates its arguments, takes its plan from the handle's cache (plans.get_plan: made once per
descriptor set by the planner that plans.plan_for picks) and runs it (plans.run_plan); nothing here
chooses kernels. The algorithms and where they live:

    forward          IMPLICIT_GEMM (implicit.py), IMPLICIT_PRECOMP_GEMM (grouped.py for groups > 1, else
                     tensor_core.py), GEMM (gemm.py), WINOGRAD_NONFUSED (winograd.py), FFT (fft.py)
    backward data    ALGO_0 (implicit.py), ALGO_1 (grouped.py, else tensor_core.py, else gemm.py),
                     WINOGRAD_NONFUSED, FFT
    backward filter  ALGO_0 (implicit.py), ALGO_1 (grouped.py, else wgrad_wgmma.py, else tensor_core.py, else
                     implicit.py), ALGO_3 (gemm.py), WINOGRAD_NONFUSED, FFT
The rest answer NOT_SUPPORTED with the reason.
"""
import ctypes
import functools
import sys

from ... import buffers as _buffers
from ... import enums as E
from ... import tuning
from ..._build.params import FLAG_BETA, FLAG_NAN_PROP
from ..._build import fastcall as _fastcall
from ..._cuda import driver
from ...buffers import device_ptr
from ...handle import Handle, check_handle
from ...status import PydnnError, api
from ...tensor import DTYPES, check_tensor
from .. import _elementwise as _ew
from ..activation import ActivationDescriptor
from ..common import TAG, element_aligned, float_tensor, scalar
from . import algorithms as _algos
from . import find as _find
from . import conv_tma, dgrad_phases, fft, gemm, grouped, grouped_direct, implicit, narrow, stream, tensor_core, wgrad_mm, wgrad_wgmma, winograd  # noqa: F401 - each registers its planners
from .algorithms import *  # noqa: F401,F403 - algorithm queries and Find...Ex
from .find import *  # noqa: F401,F403 - Find without Ex (buffers of its own)
from . import bias as _bias
from .plans import Plan, check_workspace, get_plan, new_plan, run_plan
from .problem import (ACT, BAD, DIR_BWD_DATA, DIR_BWD_FILTER, DIR_FWD, FLAG_BIAS, FLAG_PAIR, FLAG_Z, NS,
                      ConvAuxParams, create_convolution_descriptor, destroy_convolution_descriptor,
                      filter_bytes, get_convolution2d_descriptor, get_convolution2d_forward_output_dim,
                      get_convolution_group_count, get_convolution_math_type, get_convolution_nd_descriptor,
                      get_convolution_nd_forward_output_dim, set_convolution2d_descriptor,
                      set_convolution_group_count, set_convolution_math_type, set_convolution_nd_descriptor,
                      strides5)
from .tensor_core import fused_bias_in_registers
# ----------------------------------------------------------------------------- the cached call
# A call that passed every check leaves a call record in the handle's cache (handle.prepared) under the call's
# descriptors (each with its version: a Set or Destroy makes a new key; the filter, which has no version, by its
# fields) and the algorithm: (plan, itemsize, the operands' spans). A repeated call looks the record up and
# checks only what can change between calls - alpha / beta float, each buffer a positive int or a CUDA torch
# tensor (buffers.TORCH_TENSOR) of at least its span, contiguous, element-aligned, the workspace size and
# pointer - then runs the plan (plans.run_plan, which checks its vector alignment). Anything else, and any
# failure, goes to the full function (the same checks, errors and last-error text as before).
# Python calls of a repeated int-pointer call (tools/bench_host_cnn.py --cpu, tests/core/test_call_path_cnn_cpu.py;
# the entry, run_plan, load_kernels, launch_args for a one-launch plan): convolution_forward / backward data 28 -> 4,
# backward filter 32 -> 5, bias + activation 48 -> 7 (+ its plan's steps), backward bias 20 -> 3. H200 host, the CNN
# demo's layers: forward 13.2-15.1 -> 7.8-9.7 us a call (its launch alone 5.4), backward data 11.9-12.9 -> 8.0-8.5.

_K_FWD, _K_BWD_DATA, _K_BWD_FILTER, _K_CBA = "conv.fwd", "conv.bwd_data", "conv.bwd_filter", "conv.cba"


def _call_key(tag, algo, conv, a, w, b, extra=()):
    """The call record's key (tag, algo, convDesc, x-like, filter, y-like and extra descriptors with their
    versions), or None when an argument is not what a key holds (the full function names it)."""
    try:
        return (tag, algo, conv, conv.version, a, a.version, w, w.dims, w.dtype, w.format, w.alive, b,
                b.version) + extra
    except (AttributeError, TypeError):
        return None


def _tptr(obj, need):
    """A CUDA torch tensor's address when it passes device_ptr's inline checks, else 0 (the full function
    decides: it names the argument)."""
    if type(obj) is _buffers.TORCH_TENSOR and obj.is_cuda and obj.nbytes >= need and obj.is_contiguous():
        return obj.data_ptr()
    return 0


def _ws_fast(pl, work_space, need):
    """check_workspace's answer for a plan that needs a workspace (the size already checked), when it needs
    no error: the workspace pointer, or None (the full function decides)."""
    wsp = work_space if type(work_space) is int else _tptr(work_space, need)
    if wsp > 0 and wsp % pl.acc_size == 0:
        return wsp
    return None


def _remember(handle, key, pl, spans, kind=None):
    """Keep the call record; a convolution's (kind: its compiled entry's) notes a one-launch plan for the entry."""
    if key is not None:
        handle.remember(key, (pl, pl.itemsize) + spans)
        if kind is not None and type(pl) is Plan and (_ew.note is not None or not _ew._entries_tried):
            _note(kind, pl, _need(kind, spans))


# The compiled entries (tuning.callpath.C_ENTRY_MAP; pydnn/_build/fastcall.py's kinds 10-12, cv_core): a call that ran
# a one-launch Plan notes it, and the entry that called it keeps the record in that call site's slot, so the site's
# next call is checked and launched in C (the Python cached path: 7 Python calls, ~2 us on the stand-in host;
# tools/PERF.md).
class _ConvNote:
    """A call record's C twin: crec (the address of crec_obj, fastcall.CvRec), need (the spans in the plan's order:
    its a, b and out)."""
    __slots__ = ("crec", "crec_obj", "need")


def _note(kind, pl, need):
    """Note pl for the compiled entry that called (its call site's slot); a plan without a C record (a split
    fwd_wgmma's fold, a CPU handle's placeholder kernels) is not noted: the Python function keeps answering. Never
    raises (an optimisation: a cached call that failed here would run again in the full function)."""
    try:
        if pl.gemm_func is None:
            return
        if not _ew._entries_tried:  # the compiled entries, where no element-wise record set them up yet
            _ew.plan_entries(pl.gemm_func)
        if _ew.note is None:
            return
        try:
            notes = pl.cnotes
        except AttributeError:
            notes = pl.cnotes = {}
        n = notes.get(need, False)
        if n is False:
            rec = _fastcall.conv_record(pl, ConvAuxParams, FLAG_BETA, FLAG_PAIR)
            n = None
            if rec is not None:
                n = _ConvNote()
                n.crec_obj, n.crec, n.need = rec, ctypes.addressof(rec), need
            notes[need] = n
        if n is not None:
            _ew.note(kind, n, 2, False, False)
    except Exception:  # noqa: BLE001 - nothing noted; the Python function keeps answering this site
        pass


def _need(kind, spans):
    """A call record's spans (the call's buffers in argument order) in its plan's order (a, b, out): forward (x, w, y),
    backward data (dy, w, dx), backward filter (dy, x, dw)."""
    if kind == _ew.K_CONV_FWD:
        return spans
    return spans[1], spans[0], spans[2]


@api
def convolution_forward(handle, alpha, x_desc, x, w_desc, w, conv_desc, algo, work_space, work_space_size_in_bytes,
                         beta, y_desc, y):
    """cudnnConvolutionForward: y = alpha * conv(x, w) + beta * y. Statuses: BAD_PARAM (descriptors that
    do not fit together: dims, channels vs groups, y not the computed output dims, an empty output,
    overlapping y, a workspace smaller than Get...WorkspaceSize), NOT_SUPPORTED (data / compute types,
    an algorithm pydnn lacks), BAD_PARAM_NULL_POINTER, BAD_PARAM_MISALIGNED_POINTER."""
    check_handle(handle)
    pl = get_plan(handle, DIR_FWD, algo, conv_desc, x_desc, w_desc, y_desc)
    ws = check_workspace(pl, work_space, work_space_size_in_bytes)
    al, be = scalar("alpha", alpha), scalar("beta", beta)
    it = pl.itemsize
    spans = (x_desc.span_bytes(), filter_bytes(w_desc), y_desc.span_bytes())
    xp = element_aligned(device_ptr(x, "x", spans[0]), "x", it)
    wp = element_aligned(device_ptr(w, "w", spans[1]), "w", it)
    yp = element_aligned(device_ptr(y, "y", spans[2]), "y", it)
    run_plan(handle, pl, xp, wp, yp, ws, al, be)
    if type(algo) is int and tuning.callpath.CALL_RECORDS:
        _remember(handle, _call_key(_K_FWD, algo, conv_desc, x_desc, w_desc, y_desc), pl, spans, _ew.K_CONV_FWD)


_convolution_forward = convolution_forward  # the full function (api-wrapped: errors are named after it)


@functools.wraps(_convolution_forward)
def convolution_forward(*args, **kwargs):  # noqa: F811 - the public entry in front of it
    if not kwargs and len(args) == 13:  # (misuse: the full function raises Python's error)
        (handle, alpha, x_desc, x, w_desc, w, conv_desc, algo, work_space, work_space_size_in_bytes, beta,
         y_desc, y) = args
        # the cached call (see _call_key); any miss or failure: the full function, which decides and reports
        try:
            if (type(handle) is Handle and handle.alive and type(algo) is int and type(alpha) is float
                    and type(beta) is float and not _buffers.CHECKED):
                rec = handle.prepared.get((_K_FWD, algo, conv_desc, conv_desc.version, x_desc, x_desc.version, w_desc,
                                           w_desc.dims, w_desc.dtype, w_desc.format, w_desc.alive, y_desc,
                                           y_desc.version))
                if rec is not None:
                    tt = _buffers.TORCH_TENSOR
                    pl, it, nx, nw, ny = rec
                    xp = x if type(x) is int else (x.data_ptr() if type(x) is tt and x.is_cuda
                            and x.nbytes >= nx and x.is_contiguous() else 0)
                    wp = w if type(w) is int else (w.data_ptr() if type(w) is tt and w.is_cuda
                            and w.nbytes >= nw and w.is_contiguous() else 0)
                    yp = y if type(y) is int else (y.data_ptr() if type(y) is tt and y.is_cuda
                            and y.nbytes >= ny and y.is_contiguous() else 0)
                    if xp > 0 and wp > 0 and yp > 0 and not (xp % it or wp % it or yp % it):
                        need, n = pl.workspace, work_space_size_in_bytes
                        ws = ((0 if need == 0 else _ws_fast(pl, work_space, need)) if type(n) is int and n >= need
                              else None)
                        if ws is not None:
                            run_plan(handle, pl, xp, wp, yp, ws, alpha, beta)
                            if _ew.note is not None and type(pl) is Plan:  # the compiled entry keeps the site
                                _note(_ew.K_CONV_FWD, pl, _need(_ew.K_CONV_FWD, rec[2:]))
                            return None
        except Exception:  # noqa: BLE001 - the full function below repeats the call and reports any error
            pass
    return _convolution_forward(*args, **kwargs)


@api
def convolution_backward_data(handle, alpha, w_desc, w, dy_desc, dy, conv_desc, algo, work_space,
                               work_space_size_in_bytes, beta, dx_desc, dx):
    """cudnnConvolutionBackwardData: dx = alpha * (gradient of conv with respect to x)(dy, w) + beta * dx.
    Statuses as convolution_forward (dxDesc must be the input whose output dims are dyDesc's)."""
    check_handle(handle)
    pl = get_plan(handle, DIR_BWD_DATA, algo, conv_desc, dx_desc, w_desc, dy_desc)
    ws = check_workspace(pl, work_space, work_space_size_in_bytes)
    al, be = scalar("alpha", alpha), scalar("beta", beta)
    it = pl.itemsize
    spans = (filter_bytes(w_desc), dy_desc.span_bytes(), dx_desc.span_bytes())
    wp = element_aligned(device_ptr(w, "w", spans[0]), "w", it)
    dyp = element_aligned(device_ptr(dy, "dy", spans[1]), "dy", it)
    dxp = element_aligned(device_ptr(dx, "dx", spans[2]), "dx", it)
    run_plan(handle, pl, dyp, wp, dxp, ws, al, be)
    if type(algo) is int and tuning.callpath.CALL_RECORDS:
        _remember(handle, _call_key(_K_BWD_DATA, algo, conv_desc, dx_desc, w_desc, dy_desc), pl, spans,
                  _ew.K_CONV_BWD_DATA)


_convolution_backward_data = convolution_backward_data  # the full function (api-wrapped: errors are named after it)


@functools.wraps(_convolution_backward_data)
def convolution_backward_data(*args, **kwargs):  # noqa: F811 - the public entry in front of it
    if not kwargs and len(args) == 13:  # (misuse: the full function raises Python's error)
        (handle, alpha, w_desc, w, dy_desc, dy, conv_desc, algo, work_space, work_space_size_in_bytes, beta,
         dx_desc, dx) = args
        try:  # the cached call, as convolution_forward's
            if (type(handle) is Handle and handle.alive and type(algo) is int and type(alpha) is float
                    and type(beta) is float and not _buffers.CHECKED):
                rec = handle.prepared.get((_K_BWD_DATA, algo, conv_desc, conv_desc.version, dx_desc, dx_desc.version,
                                           w_desc, w_desc.dims, w_desc.dtype, w_desc.format, w_desc.alive, dy_desc,
                                           dy_desc.version))
                if rec is not None:
                    tt = _buffers.TORCH_TENSOR
                    pl, it, nw, ndy, ndx = rec
                    wp = w if type(w) is int else (w.data_ptr() if type(w) is tt and w.is_cuda
                            and w.nbytes >= nw and w.is_contiguous() else 0)
                    dyp = dy if type(dy) is int else (dy.data_ptr() if type(dy) is tt and dy.is_cuda
                             and dy.nbytes >= ndy and dy.is_contiguous() else 0)
                    dxp = dx if type(dx) is int else (dx.data_ptr() if type(dx) is tt and dx.is_cuda
                             and dx.nbytes >= ndx and dx.is_contiguous() else 0)
                    if wp > 0 and dyp > 0 and dxp > 0 and not (wp % it or dyp % it or dxp % it):
                        need, n = pl.workspace, work_space_size_in_bytes
                        ws = ((0 if need == 0 else _ws_fast(pl, work_space, need)) if type(n) is int and n >= need
                              else None)
                        if ws is not None:
                            run_plan(handle, pl, dyp, wp, dxp, ws, alpha, beta)
                            if _ew.note is not None and type(pl) is Plan:  # the compiled entry keeps the site
                                _note(_ew.K_CONV_BWD_DATA, pl, _need(_ew.K_CONV_BWD_DATA, rec[2:]))
                            return None
        except Exception:  # noqa: BLE001 - the full function below repeats the call and reports any error
            pass
    return _convolution_backward_data(*args, **kwargs)


@api
def convolution_backward_filter(handle, alpha, x_desc, x, dy_desc, dy, conv_desc, algo, work_space,
                                 work_space_size_in_bytes, beta, dw_desc, dw):
    """cudnnConvolutionBackwardFilter: dw = alpha * (gradient of conv with respect to w)(x, dy) + beta * dw.
    Statuses as convolution_forward."""
    check_handle(handle)
    pl = get_plan(handle, DIR_BWD_FILTER, algo, conv_desc, x_desc, dw_desc, dy_desc)
    ws = check_workspace(pl, work_space, work_space_size_in_bytes)
    al, be = scalar("alpha", alpha), scalar("beta", beta)
    it = pl.itemsize
    spans = (x_desc.span_bytes(), dy_desc.span_bytes(), filter_bytes(dw_desc))
    xp = element_aligned(device_ptr(x, "x", spans[0]), "x", it)
    dyp = element_aligned(device_ptr(dy, "dy", spans[1]), "dy", it)
    dwp = element_aligned(device_ptr(dw, "dw", spans[2]), "dw", it)
    run_plan(handle, pl, dyp, xp, dwp, ws, al, be)
    if type(algo) is int and tuning.callpath.CALL_RECORDS:
        _remember(handle, _call_key(_K_BWD_FILTER, algo, conv_desc, x_desc, dw_desc, dy_desc), pl, spans,
                  _ew.K_CONV_BWD_FILTER)


_convolution_backward_filter = convolution_backward_filter  # the full function (api-wrapped: errors are named after it)


@functools.wraps(_convolution_backward_filter)
def convolution_backward_filter(*args, **kwargs):  # noqa: F811 - the public entry in front of it
    if not kwargs and len(args) == 13:  # (misuse: the full function raises Python's error)
        (handle, alpha, x_desc, x, dy_desc, dy, conv_desc, algo, work_space, work_space_size_in_bytes, beta,
         dw_desc, dw) = args
        try:  # the cached call, as convolution_forward's
            if (type(handle) is Handle and handle.alive and type(algo) is int and type(alpha) is float
                    and type(beta) is float and not _buffers.CHECKED):
                rec = handle.prepared.get((_K_BWD_FILTER, algo, conv_desc, conv_desc.version, x_desc, x_desc.version,
                                           dw_desc, dw_desc.dims, dw_desc.dtype, dw_desc.format, dw_desc.alive, dy_desc,
                                           dy_desc.version))
                if rec is not None:
                    tt = _buffers.TORCH_TENSOR
                    pl, it, nx, ndy, ndw = rec
                    xp = x if type(x) is int else (x.data_ptr() if type(x) is tt and x.is_cuda
                            and x.nbytes >= nx and x.is_contiguous() else 0)
                    dyp = dy if type(dy) is int else (dy.data_ptr() if type(dy) is tt and dy.is_cuda
                             and dy.nbytes >= ndy and dy.is_contiguous() else 0)
                    dwp = dw if type(dw) is int else (dw.data_ptr() if type(dw) is tt and dw.is_cuda
                             and dw.nbytes >= ndw and dw.is_contiguous() else 0)
                    if xp > 0 and dyp > 0 and dwp > 0 and not (xp % it or dyp % it or dwp % it):
                        need, n = pl.workspace, work_space_size_in_bytes
                        ws = ((0 if need == 0 else _ws_fast(pl, work_space, need)) if type(n) is int and n >= need
                              else None)
                        if ws is not None:
                            run_plan(handle, pl, dyp, xp, dwp, ws, alpha, beta)
                            if _ew.note is not None and type(pl) is Plan:  # the compiled entry keeps the site
                                _note(_ew.K_CONV_BWD_FILTER, pl, _need(_ew.K_CONV_BWD_FILTER, rec[2:]))
                            return None
        except Exception:  # noqa: BLE001 - the full function below repeats the call and reports any error
            pass
    return _convolution_backward_filter(*args, **kwargs)


_py_convolution_forward = convolution_forward  # the Python functions behind the compiled entries (ew._setup_entries)
_py_convolution_backward_data = convolution_backward_data
_py_convolution_backward_filter = convolution_backward_filter
_ew.register_entries(sys.modules[__name__], "convolution_forward", "convolution_backward_data",
                     "convolution_backward_filter")


def _bias_desc(bias_desc, k, name):
    check_tensor(bias_desc, name)
    dims = tuple(bias_desc.dims)
    want = (1, k) + (1,) * (len(dims) - 2)
    if len(dims) < 2 or dims != want:
        raise PydnnError(BAD, f"{name}: dims {dims} are not (1, {k}, 1, ...) for {k} channels")
    return bias_desc


def _fused_run(handle, pl, activation_desc, z_desc, bias_desc, xp, wp, yp, zp, bp, ws, a1, a2):
    """The fused call's launch: the epilogue's fields set on the plan's ConvParams for this call, run, and
    restored (the plan is shared with convolution_forward's cache only through this call's key)."""
    p = pl.gemm
    saved = p.flags, p.act, p.coef
    p.act, p.coef = ACT[activation_desc.mode], activation_desc.coef
    p.flags |= FLAG_BIAS | (FLAG_Z if a2 != 0 else 0)
    if activation_desc.relu_nan_opt == E.PYDNN_PROPAGATE_NAN:
        p.flags |= FLAG_NAN_PROP
    for i, s in enumerate(strides5(z_desc.strides)):
        p.zs[i] = s
    p.bias_stride = bias_desc.strides[1]
    p.alpha2 = a2
    try:
        run_plan(handle, pl, xp, wp, yp, ws, a1, 0.0, zp, bp)
    finally:
        p.flags, p.act, p.coef = saved


@api
def convolution_bias_activation_forward(handle, alpha1, x_desc, x, w_desc, w, conv_desc, algo, work_space,
                                         work_space_size_in_bytes, alpha2, z_desc, z, bias_desc, bias,
                                         activation_desc, y_desc, y):
    """cudnnConvolutionBiasActivationForward: y = act(alpha1 * conv(x, w) + alpha2 * z + bias), all in the
    convolution kernel's epilogue. z has y's dims (it may be y itself); bias is (1, K, 1, ...). Activations:
    IDENTITY, RELU, CLIPPED_RELU, SIGMOID, TANH, ELU (others NOT_SUPPORTED). Statuses as
    convolution_forward."""
    check_handle(handle)
    if type(activation_desc) is not ActivationDescriptor or not activation_desc.alive:
        raise PydnnError(BAD, "activationDesc: not a live activation descriptor")
    if not activation_desc.is_set:
        raise PydnnError(BAD, "activationDesc: descriptor was never set")
    if activation_desc.mode not in ACT:
        raise PydnnError(NS, f"activationDesc: mode {activation_desc.mode} is not supported in the convolution "
                             f"epilogue (IDENTITY, RELU, CLIPPED_RELU, SIGMOID, TANH, ELU)")
    act_key = ("act", activation_desc, activation_desc.mode, activation_desc.coef, activation_desc.relu_nan_opt)
    pl = get_plan(handle, DIR_FWD, algo, conv_desc, x_desc, w_desc, y_desc, extra=(z_desc, bias_desc),
                  extra_key=act_key, adapt=fused_bias_in_registers)
    check_tensor(z_desc, "zDesc")
    if tuple(z_desc.dims) != tuple(y_desc.dims):
        raise PydnnError(BAD, f"zDesc: dims {tuple(z_desc.dims)} differ from yDesc dims {tuple(y_desc.dims)}")
    if z_desc.dtype != y_desc.dtype:
        raise PydnnError(NS, f"zDesc: data type {z_desc.dtype} differs from yDesc data type {y_desc.dtype}")
    _bias_desc(bias_desc, y_desc.dims[1], "biasDesc")
    if bias_desc.dtype != y_desc.dtype:
        raise PydnnError(NS, f"biasDesc: data type {bias_desc.dtype} differs from yDesc data type {y_desc.dtype}")
    ws = check_workspace(pl, work_space, work_space_size_in_bytes)
    a1, a2 = scalar("alpha1", alpha1), scalar("alpha2", alpha2)
    it = pl.itemsize
    spans = (x_desc.span_bytes(), filter_bytes(w_desc), y_desc.span_bytes(), z_desc.span_bytes(),
             bias_desc.span_bytes())
    xp = element_aligned(device_ptr(x, "x", spans[0]), "x", it)
    wp = element_aligned(device_ptr(w, "w", spans[1]), "w", it)
    yp = element_aligned(device_ptr(y, "y", spans[2]), "y", it)
    zp = element_aligned(device_ptr(z, "z", spans[3]), "z", it) if a2 != 0 else 0
    bp = element_aligned(device_ptr(bias, "bias", spans[4]), "bias", it)
    _fused_run(handle, pl, activation_desc, z_desc, bias_desc, xp, wp, yp, zp, bp, ws, a1, a2)
    if type(algo) is int and tuning.callpath.CALL_RECORDS:
        _remember(handle, _call_key(_K_CBA, algo, conv_desc, x_desc, w_desc, y_desc,
                                    (z_desc, z_desc.version, bias_desc, bias_desc.version, activation_desc,
                                     activation_desc.version)), pl, spans)


# the full function (api-wrapped: errors are named after it)
_convolution_bias_activation_forward = convolution_bias_activation_forward


@functools.wraps(_convolution_bias_activation_forward)
def convolution_bias_activation_forward(*args, **kwargs):  # noqa: F811 - the public entry in front of it
    if not kwargs and len(args) == 18:  # (misuse: the full function raises Python's error)
        (handle, alpha1, x_desc, x, w_desc, w, conv_desc, algo, work_space, work_space_size_in_bytes, alpha2,
         z_desc, z, bias_desc, bias, activation_desc, y_desc, y) = args
        try:  # the cached call, as convolution_forward's (z read only where alpha2 != 0, as the full function)
            if (type(handle) is Handle and handle.alive and type(algo) is int and type(alpha1) is float
                    and type(alpha2) is float and not _buffers.CHECKED):
                rec = handle.prepared.get((_K_CBA, algo, conv_desc, conv_desc.version, x_desc, x_desc.version, w_desc,
                                           w_desc.dims, w_desc.dtype, w_desc.format, w_desc.alive, y_desc,
                                           y_desc.version,
                                           z_desc, z_desc.version, bias_desc, bias_desc.version, activation_desc,
                                           activation_desc.version))
                if rec is not None:
                    tt = _buffers.TORCH_TENSOR
                    pl, it, nx, nw, ny, nz, nb = rec
                    xp = x if type(x) is int else (x.data_ptr() if type(x) is tt and x.is_cuda
                            and x.nbytes >= nx and x.is_contiguous() else 0)
                    wp = w if type(w) is int else (w.data_ptr() if type(w) is tt and w.is_cuda
                            and w.nbytes >= nw and w.is_contiguous() else 0)
                    yp = y if type(y) is int else (y.data_ptr() if type(y) is tt and y.is_cuda
                            and y.nbytes >= ny and y.is_contiguous() else 0)
                    bp = bias if type(bias) is int else (bias.data_ptr() if type(bias) is tt and bias.is_cuda
                            and bias.nbytes >= nb and bias.is_contiguous() else 0)
                    zp = (z if type(z) is int else (z.data_ptr() if type(z) is tt and z.is_cuda
                             and z.nbytes >= nz and z.is_contiguous() else 0)) if alpha2 != 0 else it
                    if (xp > 0 and wp > 0 and yp > 0 and bp > 0 and zp > 0
                            and not (xp % it or wp % it or yp % it or bp % it or zp % it)):
                        need, n = pl.workspace, work_space_size_in_bytes
                        ws = ((0 if need == 0 else _ws_fast(pl, work_space, need)) if type(n) is int and n >= need
                              else None)
                        if ws is not None:
                            _fused_run(handle, pl, activation_desc, z_desc, bias_desc, xp, wp, yp,
                                       zp if alpha2 != 0 else 0, bp, ws, alpha1, alpha2)
                            return None
        except Exception:  # noqa: BLE001 - the full function below repeats the call and reports any error
            pass
    return _convolution_bias_activation_forward(*args, **kwargs)


def _bias_launch(handle, dy_desc, db_desc, it, dyp):
    """(function, ConvAuxParams with the shape filled in, grid) of a backward bias: the reduced dims (n, d, h,
    w) merged where the strides allow (an NCHW dy: rows of D*H*W elements), 16-byte loads where they fit."""
    nd = len(dy_desc.dims)
    tag = TAG[dy_desc.dtype]
    dims5 = (dy_desc.dims[0], dy_desc.dims[1]) + (1,) * (5 - nd) + tuple(dy_desc.dims[2:])
    st5 = strides5(dy_desc.strides)
    sizes, strides = _bias.merge_reduced((dims5[0],) + dims5[2:], (st5[0],) + tuple(st5[2:]))
    v = _bias.vector_width(it, sizes, strides, st5[1], dyp)
    func = handle.function(_bias.UNIT.format(tag), _bias.bias_expr(tag, v))
    p = ConvAuxParams()
    p.channels = dims5[1]
    p.count = dims5[0] * dims5[2] * dims5[3] * dims5[4]
    for i, n in enumerate(sizes):
        p.inner[i] = n
    p.in_stride[0], p.in_stride[1], p.in_stride[2], p.in_stride[3], p.in_stride[4] = (
        strides[0], st5[1], strides[1], strides[2], strides[3])
    p.out_stride[1] = db_desc.strides[1]
    return func, p, (min(dims5[1], 65535 * 4), 1, 1)


@api
def convolution_backward_bias(handle, alpha, dy_desc, dy, beta, db_desc, db):
    """cudnnConvolutionBackwardBias: db = alpha * sum of dy over every dim but C + beta * db; db is
    (1, C, 1, ...). Deterministic (a fixed-order sum per channel: ptx/conv_bias.cu, planned in bias.py)."""
    check_handle(handle)
    float_tensor(dy_desc, "dyDesc")
    nd = len(dy_desc.dims)
    if not 3 <= nd <= 5:
        raise PydnnError(BAD, f"dyDesc: has {nd} dims (3 to 5 expected: N, C, spatial...)")
    _bias_desc(db_desc, dy_desc.dims[1], "dbDesc")
    float_tensor(db_desc, "dbDesc")
    if db_desc.dtype != dy_desc.dtype:
        raise PydnnError(NS, f"dbDesc: data type {db_desc.dtype} differs from dyDesc data type {dy_desc.dtype}")
    al, be = scalar("alpha", alpha), scalar("beta", beta)
    it = DTYPES[dy_desc.dtype][0]
    dyp = element_aligned(device_ptr(dy, "dy", dy_desc.span_bytes()), "dy", it)
    dbp = element_aligned(device_ptr(db, "db", db_desc.span_bytes()), "db", it)
    key = ("conv_bias", dy_desc, dy_desc.version, db_desc, db_desc.version, dyp % 16 == 0)
    rec = handle.prepared.get(key)
    if rec is None:  # the launch's shape-dependent part, once per descriptor pair (and pointer alignment)
        rec = handle.remember(key, _bias_launch(handle, dy_desc, db_desc, it, dyp))
    _bias_go(handle, rec, dyp, dbp, al, be)
    if tuning.callpath.CALL_RECORDS:  # the cached call's record (the entry below)
        handle.remember((_K_BIAS, dy_desc, dy_desc.version, db_desc, db_desc.version),
                        (it, dy_desc.span_bytes(), db_desc.span_bytes()))


def _bias_go(handle, rec, dyp, dbp, al, be):
    func, p, grid = rec
    p.out, p.in_, p.alpha, p.beta = dbp, dyp, al, be
    p.flags = FLAG_BETA if be != 0 else 0
    driver.launch(func, grid, (_bias.THREADS, 1, 1), 0, handle.cu_stream, p)


_convolution_backward_bias = convolution_backward_bias  # the full function (api-wrapped: errors are named after it)
_K_BIAS = "conv.bias"


@functools.wraps(_convolution_backward_bias)
def convolution_backward_bias(*args, **kwargs):  # noqa: F811 - the public entry in front of it
    if not kwargs and len(args) == 7:  # (misuse: the full function raises Python's error)
        handle, alpha, dy_desc, dy, beta, db_desc, db = args
        try:  # the cached call, as convolution_forward's: the record, then the launch record by dy's alignment
            if (type(handle) is Handle and handle.alive and type(alpha) is float and type(beta) is float
                    and not _buffers.CHECKED):
                rec = handle.prepared.get((_K_BIAS, dy_desc, dy_desc.version, db_desc, db_desc.version))
                if rec is not None:
                    tt = _buffers.TORCH_TENSOR
                    it, ndy, ndb = rec
                    dyp = dy if type(dy) is int else (dy.data_ptr() if type(dy) is tt and dy.is_cuda
                                                      and dy.nbytes >= ndy and dy.is_contiguous() else 0)
                    dbp = db if type(db) is int else (db.data_ptr() if type(db) is tt and db.is_cuda
                                                      and db.nbytes >= ndb and db.is_contiguous() else 0)
                    if dyp > 0 and dbp > 0 and not (dyp % it or dbp % it):
                        lrec = handle.prepared.get(("conv_bias", dy_desc, dy_desc.version, db_desc, db_desc.version,
                                                    dyp % 16 == 0))
                        if lrec is not None:
                            _bias_go(handle, lrec, dyp, dbp, alpha, beta)
                            return None
        except Exception:  # noqa: BLE001 - the full function below repeats the call and reports any error
            pass
    return _convolution_backward_bias(*args, **kwargs)


# ----------------------------------------------------------------------------- workspace sizes

def _workspace(handle, direction, algo, conv, x_desc, w_desc, y_desc):
    check_handle(handle)
    return new_plan(handle, direction, algo, conv, x_desc, w_desc, y_desc).workspace


@api
def get_convolution_forward_workspace_size(handle, x_desc, w_desc, conv_desc, y_desc, algo):
    """cudnnGetConvolutionForwardWorkspaceSize (NOT_SUPPORTED for an algorithm pydnn lacks)."""
    return _workspace(handle, DIR_FWD, algo, conv_desc, x_desc, w_desc, y_desc)


@api
def get_convolution_backward_data_workspace_size(handle, w_desc, dy_desc, conv_desc, dx_desc, algo):
    """cudnnGetConvolutionBackwardDataWorkspaceSize."""
    return _workspace(handle, DIR_BWD_DATA, algo, conv_desc, dx_desc, w_desc, dy_desc)


@api
def get_convolution_backward_filter_workspace_size(handle, x_desc, dy_desc, conv_desc, grad_desc, algo):
    """cudnnGetConvolutionBackwardFilterWorkspaceSize."""
    return _workspace(handle, DIR_BWD_FILTER, algo, conv_desc, x_desc, grad_desc, dy_desc)

__all__ = [
    "create_convolution_descriptor", "destroy_convolution_descriptor", "set_convolution2d_descriptor",
    "get_convolution2d_descriptor", "set_convolution_nd_descriptor", "get_convolution_nd_descriptor",
    "set_convolution_group_count", "get_convolution_group_count", "set_convolution_math_type",
    "get_convolution_math_type", "get_convolution2d_forward_output_dim", "get_convolution_nd_forward_output_dim",
    "convolution_forward", "convolution_backward_data", "convolution_backward_filter",
    "convolution_bias_activation_forward", "convolution_backward_bias",
    "get_convolution_forward_workspace_size", "get_convolution_backward_data_workspace_size",
    "get_convolution_backward_filter_workspace_size",
] + list(_algos.__all__) + list(_find.__all__)

_H, _CD, _TD, _FD = "pydnnHandle_t", "pydnnConvolutionDescriptor_t", "pydnnTensorDescriptor_t", "pydnnFilterDescriptor_t"
C_OPAQUE_TYPES = [(_CD, "pydnnConvolutionStruct")]
C_STRUCTS = _algos.C_STRUCTS
C_NULLABLE = {"pydnnConvolutionBiasActivationForward": ()}
C_API = [("Convolution", [
    (f"pydnnStatus_t pydnnCreateConvolutionDescriptor({_CD} *convDesc);", "A new convolution descriptor, unset until a Set call."),
    (f"pydnnStatus_t pydnnSetConvolution2dDescriptor({_CD} convDesc, int pad_h, int pad_w, int u, int v, int dilation_h, int dilation_w, pydnnConvolutionMode_t mode, pydnnDataType_t computeType);", "2 spatial dims: padding, strides (u, v), dilations, mode, compute type."),
    (f"pydnnStatus_t pydnnGetConvolution2dDescriptor(const {_CD} convDesc, int *pad_h, int *pad_w, int *u, int *v, int *dilation_h, int *dilation_w, pydnnConvolutionMode_t *mode, pydnnDataType_t *computeType);", "The settings of a 2-d convolution descriptor."),
    (f"pydnnStatus_t pydnnSetConvolutionNdDescriptor({_CD} convDesc, int arrayLength, const int padA[], const int filterStrideA[], const int dilationA[], pydnnConvolutionMode_t mode, pydnnDataType_t computeType);", "1 to 3 spatial dims (arrayLength)."),
    (f"pydnnStatus_t pydnnGetConvolutionNdDescriptor(const {_CD} convDesc, int arrayLengthRequested, int *arrayLength, int padA[], int strideA[], int dilationA[], pydnnConvolutionMode_t *mode, pydnnDataType_t *computeType);", "Spatial dim count and the first arrayLengthRequested pads, strides, dilations."),
    (f"pydnnStatus_t pydnnSetConvolutionGroupCount({_CD} convDesc, int groupCount);", "Grouped (depthwise) convolution."),
    (f"pydnnStatus_t pydnnGetConvolutionGroupCount({_CD} convDesc, int *groupCount);", "The group count."),
    (f"pydnnStatus_t pydnnSetConvolutionMathType({_CD} convDesc, pydnnMathType_t mathType);", "DEFAULT, TENSOR_OP, TENSOR_OP_ALLOW_CONVERSION or FMA."),
    (f"pydnnStatus_t pydnnGetConvolutionMathType({_CD} convDesc, pydnnMathType_t *mathType);", "The math type."),
    (f"pydnnStatus_t pydnnGetConvolution2dForwardOutputDim(const {_CD} convDesc, const {_TD} inputTensorDesc, const {_FD} filterDesc, int *n, int *c, int *h, int *w);", "Output dims of a 2-d convolution."),
    (f"pydnnStatus_t pydnnGetConvolutionNdForwardOutputDim(const {_CD} convDesc, const {_TD} inputTensorDesc, const {_FD} filterDesc, int nbDims, int tensorOuputDimA[]);", "Output dims (nbDims = the input's dim count)."),
    (f"pydnnStatus_t pydnnDestroyConvolutionDescriptor({_CD} convDesc);", "Release a convolution descriptor (NULL: nothing to do)."),
    (f"pydnnStatus_t pydnnGetConvolutionForwardWorkspaceSize({_H} handle, const {_TD} xDesc, const {_FD} wDesc, const {_CD} convDesc, const {_TD} yDesc, pydnnConvolutionFwdAlgo_t algo, size_t *sizeInBytes);", "Workspace bytes of a forward algorithm."),
    (f"pydnnStatus_t pydnnGetConvolutionBackwardDataWorkspaceSize({_H} handle, const {_FD} wDesc, const {_TD} dyDesc, const {_CD} convDesc, const {_TD} dxDesc, pydnnConvolutionBwdDataAlgo_t algo, size_t *sizeInBytes);", "Workspace bytes of a backward-data algorithm."),
    (f"pydnnStatus_t pydnnGetConvolutionBackwardFilterWorkspaceSize({_H} handle, const {_TD} xDesc, const {_TD} dyDesc, const {_CD} convDesc, const {_FD} gradDesc, pydnnConvolutionBwdFilterAlgo_t algo, size_t *sizeInBytes);", "Workspace bytes of a backward-filter algorithm."),
    (f"pydnnStatus_t pydnnConvolutionForward({_H} handle, const void *alpha, const {_TD} xDesc, const void *x, const {_FD} wDesc, const void *w, const {_CD} convDesc, pydnnConvolutionFwdAlgo_t algo, void *workSpace, size_t workSpaceSizeInBytes, const void *beta, const {_TD} yDesc, void *y);", "y = alpha * conv(x, w) + beta * y."),
    (f"pydnnStatus_t pydnnConvolutionBackwardData({_H} handle, const void *alpha, const {_FD} wDesc, const void *w, const {_TD} dyDesc, const void *dy, const {_CD} convDesc, pydnnConvolutionBwdDataAlgo_t algo, void *workSpace, size_t workSpaceSizeInBytes, const void *beta, const {_TD} dxDesc, void *dx);", "dx = alpha * conv-transpose(dy, w) + beta * dx."),
    (f"pydnnStatus_t pydnnConvolutionBackwardFilter({_H} handle, const void *alpha, const {_TD} xDesc, const void *x, const {_TD} dyDesc, const void *dy, const {_CD} convDesc, pydnnConvolutionBwdFilterAlgo_t algo, void *workSpace, size_t workSpaceSizeInBytes, const void *beta, const {_FD} dwDesc, void *dw);", "dw = alpha * filter gradient(x, dy) + beta * dw."),
    (f"pydnnStatus_t pydnnConvolutionBiasActivationForward({_H} handle, const void *alpha1, const {_TD} xDesc, const void *x, const {_FD} wDesc, const void *w, const {_CD} convDesc, pydnnConvolutionFwdAlgo_t algo, void *workSpace, size_t workSpaceSizeInBytes, const void *alpha2, const {_TD} zDesc, const void *z, const {_TD} biasDesc, const void *bias, const pydnnActivationDescriptor_t activationDesc, const {_TD} yDesc, void *y);", "y = act(alpha1 * conv(x, w) + alpha2 * z + bias), fused in the convolution's epilogue."),
    (f"pydnnStatus_t pydnnConvolutionBackwardBias({_H} handle, const void *alpha, const {_TD} dyDesc, const void *dy, const void *beta, const {_TD} dbDesc, void *db);", "db = alpha * sum of dy over all dims but C + beta * db."),
] + _algos.C_FUNCTIONS + _find.C_FUNCTIONS)]
