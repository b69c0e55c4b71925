"""Activations: cudnnCreate/Set/Get/DestroyActivationDescriptor, ...SwishBeta, cudnnActivationForward,
cudnnActivationBackward. GELU (erf and tanh forms) are pydnn extensions (PYDNN_ACTIVATION_GELU_*).

Forward  y  = alpha * f(x) + beta * y
Backward dx = alpha * f'(x) * dy + beta * dx   (sigmoid and tanh use y; the others use x)
"""
import functools
import sys

from .. import enums as E
from .. import tuning
from .._build.manifest import KernelUnit
from .._build.params import FLAG_NAN_PROP
from .. import buffers as _buffers
from ..handle import Handle, check_handle
from ..status import PydnnError, api
from . import _elementwise as ew
from ..buffers import device_ptr
from .common import FLOAT_TAGS, TAG, enum_arg, float_tensor, output_tensor, same_shape, same_type, scalar

# mode -> (forward functor, backward functor) in ptx/activation.cu
OPS = {
    E.PYDNN_ACTIVATION_SIGMOID: ("pydnn::act::Sigmoid", "pydnn::act::SigmoidBwd"),
    E.PYDNN_ACTIVATION_RELU: ("pydnn::act::Relu", "pydnn::act::ReluBwd"),
    E.PYDNN_ACTIVATION_TANH: ("pydnn::act::Tanh", "pydnn::act::TanhBwd"),
    E.PYDNN_ACTIVATION_CLIPPED_RELU: ("pydnn::act::ClippedRelu", "pydnn::act::ClippedReluBwd"),
    E.PYDNN_ACTIVATION_ELU: ("pydnn::act::Elu", "pydnn::act::EluBwd"),
    E.PYDNN_ACTIVATION_IDENTITY: ("pydnn::act::Identity", "pydnn::act::IdentityBwd"),
    E.PYDNN_ACTIVATION_SWISH: ("pydnn::act::Swish", "pydnn::act::SwishBwd"),
    E.PYDNN_ACTIVATION_GELU_ERF: ("pydnn::act::GeluErf", "pydnn::act::GeluErfBwd"),
    E.PYDNN_ACTIVATION_GELU_TANH: ("pydnn::act::GeluTanh", "pydnn::act::GeluTanhBwd"),
}


# Modes whose kernels keep the plain cache policy (map_contig HINT 0); the others stream (evict-first).
# ReLU and sigmoid (session 32): the memory-bound ones. Measured (mid-session run, H200, tools/bench_memory_points.py,
# eager ms streaming / plain, the plain side in a process of its own, PyTorch in both): ReLU backward fp32 297888 x
# 256 0.2237 / 0.2130 (0.952x -> 0.999x), 14073 x 32768 1.3322 / 1.2668 (0.952x -> 1.002x), ReLU forward fp32 7549 x
# 25760 0.4171 / 0.4120 (0.986x -> 1.000x); tanh bf16 12701 x 65536 0.8545 / 0.8566 (no change: kept streaming).
# Sigmoid: not measured plain; the same loads and stores as ReLU's (its sweep points streaming: 0.97-0.99x).
# Erf-based GELU, at 16 elements per thread (below), measured best streaming (H200; tools/PERF.md, "Element-wise",
# where the plain-policy GELU of earlier versions is recorded); the 256 MiB sweep there had cs +0.3-0.8% on ReLU.
# PLAIN_ACCESS: a switch, pydnn.tuning.activation.PLAIN_ACCESS (default (RELU, SIGMOID))

# Forward modes whose 16-bit kernels take 16 elements (two 16-byte vectors) per thread instead of 8: they are
# compute-heavy, and with one vector per thread a thread has no load in flight while it computes; two
# doubled the bytes in flight at the same 32 registers (bf16 GELU erf 89 -> 97.6% of copy, tanh 92 -> 97.7%
# on the H200). relu and sigmoid measured best at 8.
WIDE_16BIT = (E.PYDNN_ACTIVATION_GELU_ERF, E.PYDNN_ACTIVATION_GELU_TANH, E.PYDNN_ACTIVATION_SWISH)


# The activation ops never read alpha2; 1 lets map_contig take its whole-tile variant compiled for
# alpha == alpha2 == 1 when alpha is 1 (no scaling instructions: 16-bit GELU is compute-bound).
_UNUSED_ALPHA2 = 1.0


def _hint(mode):
    return 0 if mode in tuning.activation.PLAIN_ACCESS else None


# 16-bit TANH forward (session 33): Tanh<true> evaluates tanh_fast (ptx/activation.cu: ex2 / rcp approximations,
# relative error < 1.5e-6) and Tanh<false> tanhf. Why: bf16 tanh 12701 x 65536 ran at 0.896-0.94x PyTorch (94% of
# copy, H200, session 32's sweeps; the plain cache policy did not move it: 0.8545 / 0.8566 ms), where the vector
# kernel issues 19.1 SASS instructions an element (load to store, the folded 16-bit conversions included): 16.0
# with tanh_fast. Predicted at copy speed with those fewer, or with two vectors a thread in flight (TANH_ELEMS 16,
# as GELU's forwards). Measured (mid-session run, H200, tools/bench_memory_points.py, eager ms, PyTorch in the same
# run): bf16 12701 x 65536 tanh_fast 0.8217 (0.985x, 4052 GB/s), tanhf 0.9091 (0.891x), tanh_fast at 16 a thread
# 0.8953, tanhf at 16 0.8876; fp16 3000 x 8192 0.0290 / 0.0296 / 0.0295 (1.015x / 0.997x / 0.912x): tanh_fast at 8
# elements a thread. Both switches' other values compile on first use (pydnn/_build/rare.py).
# TANH_FAST: a switch, pydnn.tuning.activation.TANH_FAST (default True)
# TANH_ELEMS: a switch, pydnn.tuning.activation.TANH_ELEMS (default 8)


def _elems(mode, backward, tag):
    """map_contig's elements per thread (None: the planner's default)."""
    if backward or tag not in ("f16", "bf16"):
        return None
    if mode == E.PYDNN_ACTIVATION_TANH:
        return 16 if tuning.activation.TANH_ELEMS == 16 else None
    return 16 if mode in WIDE_16BIT else None


def _op(mode, backward, tag):
    """The functor for a mode and direction; 16-bit types take the <true> (fast-math) instantiation,
    whose float32 error is far below their own rounding (see ptx/activation.cu); the 16-bit TANH forward
    takes <false> (tanhf) with tuning.activation.TANH_FAST off."""
    fast = tag in ("f16", "bf16") and (backward or mode != E.PYDNN_ACTIVATION_TANH or tuning.activation.TANH_FAST)
    return f"{OPS[mode][backward]}<{'true' if fast else 'false'}>"


def kernel_units():
    """activation.<t> for f32, h16 (half and bfloat16 in one: pydnn::h16_t, the format a launch flag) and f64.
    h16 also holds the 16-bit TANH forward's other forms (TANH_FAST off, TANH_ELEMS 16: first use, rare.py)."""
    units = []
    for t in ew.unit_tags(FLOAT_TAGS):  # (f16's unit, activation.h16, serves bf16 too: _elementwise.ktag)
        exprs = []
        h16 = t in ("f16", "bf16")
        for mode in OPS:
            if h16 and mode == E.PYDNN_ACTIVATION_TANH:  # (every form, in an order the switches do not change)
                exprs += [e for fast in ("true", "false") for el in (None, 16) for e in
                          ew.map_exprs(f"{OPS[mode][0]}<{fast}>", t, hint=_hint(mode), elems=el)]
            else:
                exprs += ew.map_exprs(_op(mode, 0, t), t, hint=_hint(mode), elems=_elems(mode, 0, t))
            exprs += ew.map_exprs(_op(mode, 1, t), t, hint=_hint(mode), elems=_elems(mode, 1, t))
        units.append(KernelUnit(f"activation.{ew.ktag(t)}", "activation.cu", tuple(dict.fromkeys(exprs))))
    return units


class ActivationDescriptor:
    """cudnnActivationDescriptor_t."""

    __slots__ = ("mode", "relu_nan_opt", "coef", "swish_beta", "is_set", "alive", "version")

    def __init__(self):
        self.mode, self.relu_nan_opt, self.coef, self.swish_beta = E.PYDNN_ACTIVATION_RELU, 0, 0.0, 1.0
        self.is_set, self.alive, self.version = False, True, 0


def _live(desc, name="activationDesc"):
    if type(desc) is not ActivationDescriptor or not desc.alive:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, f"{name}: not a live activation descriptor")
    return desc


@api
def create_activation_descriptor():
    """cudnnCreateActivationDescriptor."""
    return ActivationDescriptor()


@api
def set_activation_descriptor(activation_desc, mode, relu_nan_opt, coef):
    """cudnnSetActivationDescriptor: coef is the clipped-ReLU ceiling or the ELU alpha."""
    _live(activation_desc)
    mode = enum_arg("mode", mode, OPS, "pydnnActivationMode_t")
    nan = enum_arg("reluNanOpt", relu_nan_opt, (E.PYDNN_NOT_PROPAGATE_NAN, E.PYDNN_PROPAGATE_NAN),
                   "pydnnNanPropagation_t")
    c = scalar("coef", coef)
    if c != c:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, "coef: NaN")
    activation_desc.mode, activation_desc.relu_nan_opt, activation_desc.coef = mode, nan, c
    activation_desc.is_set = True
    activation_desc.version += 1


@api
def get_activation_descriptor(activation_desc):
    """cudnnGetActivationDescriptor -> (mode, reluNanOpt, coef)."""
    d = _live(activation_desc)
    return d.mode, d.relu_nan_opt, d.coef


@api
def set_activation_descriptor_swish_beta(activation_desc, swish_beta):
    """cudnnSetActivationDescriptorSwishBeta: y = x * sigmoid(swish_beta * x)."""
    _live(activation_desc).swish_beta = scalar("swish_beta", swish_beta)
    activation_desc.version += 1


@api
def get_activation_descriptor_swish_beta(activation_desc):
    """cudnnGetActivationDescriptorSwishBeta."""
    return _live(activation_desc).swish_beta


@api
def destroy_activation_descriptor(activation_desc):
    """cudnnDestroyActivationDescriptor."""
    if activation_desc is None:
        return
    _live(activation_desc).alive = False
    activation_desc.version += 1


def _set(desc):
    _live(desc)
    if not desc.is_set:
        raise PydnnError(E.PYDNN_STATUS_BAD_PARAM, "activationDesc: descriptor was never set")
    return desc


def _flags(desc):
    return FLAG_NAN_PROP if desc.relu_nan_opt == E.PYDNN_PROPAGATE_NAN else 0


def _key(tag, activation_desc, descs):
    """Cache key of a launch record: the descriptors and their versions (None if any is not one)."""
    try:
        if len(descs) == 2:  # the forward's (x, y): spelled out, this runs on every call
            x, y = descs
            return (tag, activation_desc, activation_desc.version, x, x.version, y, y.version)
        if len(descs) == 4:  # the backward's (dx, dy, y, x), flat as activation_backward spells it inline
            dx, dy, y, x = descs
            return (tag, activation_desc, activation_desc.version, dx, dx.version, dy, dy.version, y, y.version, x,
                    x.version)
        return (tag, activation_desc, activation_desc.version) + tuple((d, d.version) for d in descs)
    except (AttributeError, TypeError):
        return None


# activation_forward's cached call in C (pydnn/_build/fastcall.py's act_fwd: the Python function's cached
# path - handle, key, scalars, int pointers or torch tensors, run_map's launch - with no Python frame of its
# own), set up when the first compiled launch record is made (tuning.callpath.C_ENTRY); None before, and
# where there is no compiled launch (no C compiler, a CPU handle's placeholder kernels).
_no_entry = None
_c_entry = _no_entry
_entry_tried = False


def _entry_setup():
    global _c_entry, _entry_tried
    _entry_tried = True
    from .._build import fastcall
    from .._cuda import driver

    e = None
    if tuning.callpath.C_ENTRY:
        try:
            e = fastcall.activation_entry(Handle, driver, ew._LAUNCH_ARGS, _buffers, _UNUSED_ALPHA2)
        except Exception:  # noqa: BLE001 - an optimisation: without it the Python function answers
            e = None
    _c_entry = e if e is not None else _no_entry
    if e is not None:
        _publish_compiled_entry()


def _publish_compiled_entry():
    """pydnn.activation_forward (and this module's name) become the compiled entry object itself
    (fastcall.activation_public: the entry's answer, else the Python function with the same arguments), so a
    call has no Python frame at all (the def below cost 0.28 us a call with torch tensors on the H200 host,
    4.62 against 4.34 us, alternating rounds). Where a name no longer holds the def below (a caller replaced it), it is left alone; a reference
    taken earlier keeps the def, which answers the same."""
    import sys

    from .._build import fastcall

    try:
        pub = fastcall.activation_public(_activation_forward)
    except Exception:  # noqa: BLE001 - an optimisation: the def stays
        pub = None
    if pub is None:
        return
    for mod in (sys.modules[__name__], sys.modules.get("pydnn")):
        if mod is not None and getattr(mod, "activation_forward", None) is _python_entry:
            mod.activation_forward = pub


@api
def activation_forward(handle, activation_desc, alpha, x_desc, x, beta, y_desc, y):
    """cudnnActivationForward: y = alpha * f(x) + beta * y. x and y may be the same buffer."""
    # the hot path spelled out (check_handle, _key, scalar and device_ptr's int case inline): each Python
    # call saved is ~0.1 us of a 1-element call (tools/bench_host_cpu.py)
    if type(handle) is not Handle or not handle.alive:
        check_handle(handle)
    try:
        key = (0, activation_desc, activation_desc.version, x_desc, x_desc.version, y_desc, y_desc.version)
    except AttributeError:
        key = None
    rec = handle.prepared.get(key) if key is not None else None
    if rec is None:
        a = _set(activation_desc)
        float_tensor(x_desc, "xDesc")
        float_tensor(y_desc, "yDesc")
        same_shape(x_desc, "xDesc", y_desc, "yDesc")
        same_type(x_desc, "xDesc", y_desc, "yDesc")
        output_tensor(y_desc, "yDesc")
        device_ptr(x, "x", x_desc.span_bytes())  # pointer errors before any kernel is loaded
        device_ptr(y, "y", y_desc.span_bytes())
        t = TAG[x_desc.dtype]
        rec = ew.prepare_map(handle, f"activation.{ew.ktag(t)}", _op(a.mode, 0, t), t, t, y_desc, (x_desc,),
                             flags=_flags(a), coef=a.coef, coef2=a.swish_beta, hint=_hint(a.mode),
                             elems=_elems(a.mode, 0, t))
        if key is not None:
            handle.remember(key, rec)
    al = alpha if type(alpha) is float else scalar("alpha", alpha)
    be = beta if type(beta) is float else scalar("beta", beta)
    # int pointers and torch tensors (buffers.TORCH_TENSOR: _torch_ptr's checks) inline; anything else, and
    # any tensor that fails a check, through device_ptr (the same errors)
    checked, tt = _buffers.CHECKED, _buffers.TORCH_TENSOR
    if type(x) is int and x > 0 and not checked:
        xp = x
    elif not (type(x) is tt and x.is_cuda and x.nbytes >= rec.need[1] and x.is_contiguous()
              and (xp := x.data_ptr())):
        xp = device_ptr(x, "x", rec.need[1])
    if type(y) is int and y > 0 and not checked:
        yp = y
    elif not (type(y) is tt and y.is_cuda and y.nbytes >= rec.need[0] and y.is_contiguous()
              and (yp := y.data_ptr())):
        yp = device_ptr(y, "y", rec.need[0])
    c = rec.crec  # run_map's compiled branch inline (one Python frame less)
    if c and ew.driver.launch_args is ew._LAUNCH_ARGS and not ew.driver._recorders:
        err = ew._fast_launch(c, handle.stream, yp, xp, 0, 0, al, _UNUSED_ALPHA2, be, 1)
        if err:
            ew.driver.raise_status(err)
    else:
        ew.run_map(handle, rec, yp, (xp,), al, be, _UNUSED_ALPHA2)
        if rec.crec and not _entry_tried:
            _entry_setup()


_activation_forward = activation_forward  # the Python function (api-wrapped): errors are named after it


@functools.wraps(_activation_forward)
def activation_forward(*args, **kwargs):  # noqa: F811 - the public entry in front of it
    # the C entry answers a cached call (None) or declines (False): then the Python function runs, which
    # decides, launches and reports errors as it always did (Python-level misuse included)
    if kwargs or _c_entry is None or _c_entry(*args) is not None:
        return _activation_forward(*args, **kwargs)


_python_entry = activation_forward  # replaced in pydnn's namespace by the compiled entry once there is one


@api
def activation_backward(handle, activation_desc, alpha, y_desc, y, dy_desc, dy, x_desc, x, beta, dx_desc, dx):
    """cudnnActivationBackward: dx = alpha * f'(x) * dy + beta * dx."""
    # the hot path spelled out as activation_forward's (check_handle, _key, scalar, device_ptr's int case and
    # run_map's compiled branch inline): 19 -> 4 Python calls a repeated int-pointer call (the CNN demo's
    # conv + ReLU backward; tests/core/test_call_path_cnn_cpu.py)
    if type(handle) is not Handle or not handle.alive:
        check_handle(handle)
    try:
        key = (1, activation_desc, activation_desc.version, dx_desc, dx_desc.version, dy_desc, dy_desc.version,
               y_desc, y_desc.version, x_desc, x_desc.version)
    except AttributeError:
        key = None
    rec = handle.prepared.get(key) if key is not None else None
    if rec is None:
        a = _set(activation_desc)
        for d, n in ((y_desc, "yDesc"), (dy_desc, "dyDesc"), (x_desc, "xDesc"), (dx_desc, "dxDesc")):
            float_tensor(d, n)
            same_shape(y_desc, "yDesc", d, n)
            same_type(y_desc, "yDesc", d, n)
        output_tensor(dx_desc, "dxDesc")
        for buf, d, n in ((y, y_desc, "y"), (dy, dy_desc, "dy"), (x, x_desc, "x"), (dx, dx_desc, "dx")):
            device_ptr(buf, n, d.span_bytes())
        t = TAG[y_desc.dtype]
        rec = ew.prepare_map(handle, f"activation.{ew.ktag(t)}", _op(a.mode, 1, t), t, t, dx_desc,
                             (dy_desc, y_desc, x_desc), flags=_flags(a), coef=a.coef, coef2=a.swish_beta,
                             hint=_hint(a.mode), elems=_elems(a.mode, 1, t))
        if key is not None:
            handle.remember(key, rec)
    al = alpha if type(alpha) is float else scalar("alpha", alpha)
    be = beta if type(beta) is float else scalar("beta", beta)
    checked = _buffers.CHECKED
    yp = y if type(y) is int and y > 0 and not checked else device_ptr(y, "y", rec.need[2])
    dyp = dy if type(dy) is int and dy > 0 and not checked else device_ptr(dy, "dy", rec.need[1])
    xp = x if type(x) is int and x > 0 and not checked else device_ptr(x, "x", rec.need[3])
    dxp = dx if type(dx) is int and dx > 0 and not checked else device_ptr(dx, "dx", rec.need[0])
    c = rec.crec
    if c and ew.driver.launch_args is ew._LAUNCH_ARGS and not ew.driver._recorders:
        err = ew._fast_launch(c, handle.stream, dxp, dyp, yp, xp, al, _UNUSED_ALPHA2, be, 3)
        if err:
            ew.driver.raise_status(err)
    else:
        ew.run_map(handle, rec, dxp, (dyp, yp, xp), al, be, _UNUSED_ALPHA2)
    if ew.note is not None and key is not None:  # the compiled entry keeps this call site (ew._setup_entries)
        ew.note(ew.K_ACT_BWD, rec, 3, False, False)


_py_activation_backward = activation_backward  # the Python function behind the compiled entry (ew._setup_entries)

# the compiled entries over this module's Python functions (_elementwise._setup_entries)
ew.register_entries(sys.modules[__name__], "activation_forward", "activation_backward")
