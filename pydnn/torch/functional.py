"""Autograd Functions over pydnn's public API, and functional forms that fall back to PyTorch.

Each `pydnn.torch.functional.<op>` (conv, batch_norm, norms, activations, pooling, dropout, softmax,
scaled_dot_product_attention) checks that pydnn runs the configuration (CUDA tensors of one float dtype,
shapes and options pydnn supports) and otherwise calls PyTorch's own op, recording the reason in
`pydnn.torch.fallbacks`. A pydnn NOT_SUPPORTED status raised in a forward also falls back; nothing is ever
approximated.
"""
import math
import sys

import torch
import torch.nn.functional as F

import pydnn
from pydnn import tuning

from . import _core as C
from ._core import Unsupported, dense, fallback, ptr, tdesc

_ACT_MODES = {
    "relu": pydnn.PYDNN_ACTIVATION_RELU, "gelu": pydnn.PYDNN_ACTIVATION_GELU_ERF,
    "gelu_tanh": pydnn.PYDNN_ACTIVATION_GELU_TANH, "silu": pydnn.PYDNN_ACTIVATION_SWISH,
    "sigmoid": pydnn.PYDNN_ACTIVATION_SIGMOID, "tanh": pydnn.PYDNN_ACTIVATION_TANH,
    "identity": pydnn.PYDNN_ACTIVATION_IDENTITY,
}
_TORCH_ACT = {
    "relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu,
    "sigmoid": torch.sigmoid, "tanh": torch.tanh, "identity": lambda x: x,
}
_adescs = {}


def _benchmark():
    return bool(getattr(sys.modules.get("pydnn.torch"), "benchmark", False))


def activation_desc(name):
    d = _adescs.get(name)
    if d is None:
        d = pydnn.create_activation_descriptor()
        pydnn.set_activation_descriptor(d, _ACT_MODES[name], pydnn.PYDNN_NOT_PROPAGATE_NAN, 0.0)
        if name == "silu":
            pydnn.set_activation_descriptor_swish_beta(d, 1.0)
        _adescs[name] = d
    return d


def _run(pydnn_path, torch_path, what):
    """pydnn_path() unless it raises Unsupported or a pydnn NOT_SUPPORTED status: then torch_path()."""
    try:
        return pydnn_path()
    except Unsupported as e:
        fallback(f"{what}: {e}")
    except pydnn.PydnnError as e:
        if not C.is_not_supported(e):
            raise
        fallback(f"{what}: pydnn NOT_SUPPORTED: {e}")
    return torch_path()


def _check_cuda(what, *ts):
    if not C.on_cuda(*ts):
        raise Unsupported("tensors not on a CUDA device")
    if not C.same_float_dtype(*ts):
        raise Unsupported(f"dtypes {sorted({str(t.dtype) for t in ts if t is not None})} (one float dtype needed)")


def _output_like(x, shape):
    """An output of `shape` in x's memory format (channels_last in, channels_last out)."""
    if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last)
    if x.dim() == 5 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last_3d):
        return torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last_3d)
    return torch.empty(shape, dtype=x.dtype, device=x.device)


def _empty_like(x):
    """empty_like keeping x's strides when x is dense (non-overlapping), else contiguous."""
    return torch.empty_like(x)


# ============================================================================================ convolution
_cdescs = {}
_conv_plans = {}
# workspace / reserve sizes per (call, handle, descriptors): descriptors are cached and never changed after
# they are set, so a size asked once holds for every later call on the same ones
_sizes = C.BoundedDict()


class _ConvPlan:
    __slots__ = ("xd", "wd", "cd", "yd", "bd", "y_shape", "fwd", "fwd_ws", "bwd_data", "bwd_data_ws",
                 "bwd_filter", "bwd_filter_ws", "fused_ok", "nhwc", "wtd", "nhwc_ok")


def _conv_desc(spec, dtype):
    stride, padding, dilation, groups = spec
    compute = pydnn.PYDNN_DATA_DOUBLE if dtype == torch.float64 else pydnn.PYDNN_DATA_FLOAT
    key = (spec, compute)
    d = _cdescs.get(key)
    if d is None:
        d = pydnn.create_convolution_descriptor()
        pydnn.set_convolution_nd_descriptor(d, len(stride), list(padding), list(stride), list(dilation),
                                            pydnn.PYDNN_CROSS_CORRELATION, compute)
        pydnn.set_convolution_group_count(d, groups)
        _cdescs[key] = d
    return d


def _pick(perfs, what):
    for p in perfs:
        if p.status == pydnn.PYDNN_STATUS_SUCCESS:
            return p.algo
    raise Unsupported(f"no {what} algorithm supports this problem"
                      + (f" ({perfs[0].message})" if perfs and getattr(perfs[0], "message", "") else ""))


def conv_plan(h, x, w, spec, fmt):
    """The cached plan (descriptors, output dims, forward algorithm) of one convolution problem."""
    key = (id(h), x.dtype, x.shape, x.stride(), w.shape, fmt, spec, _benchmark())  # Size hashes as a tuple
    pl = _conv_plans.get(key)
    if pl is not None:
        return pl
    pl = _ConvPlan()
    pl.xd = tdesc(x)
    pl.wd = C.filter_desc(w.dtype, tuple(w.shape), fmt)
    pl.cd = _conv_desc(spec, x.dtype)
    nsp = x.dim() - 2
    pl.y_shape = tuple(pydnn.get_convolution_nd_forward_output_dim(pl.cd, pl.xd, pl.wd, nsp + 2))
    y = _output_like(x, pl.y_shape)
    pl.yd = tdesc(y)
    k = w.shape[0]
    pl.bd = C.tensor_desc(x.dtype, (1, k) + (1,) * nsp, (k,) + (1,) * (nsp + 1))
    if _benchmark() and not torch.cuda.is_current_stream_capturing():
        perfs = pydnn.find_convolution_forward_algorithm(h, pl.xd, pl.wd, pl.cd, pl.yd, 8)
    else:
        perfs = pydnn.get_convolution_forward_algorithm_v7(h, pl.xd, pl.wd, pl.cd, pl.yd, 8)
    pl.fwd = _pick(perfs, "forward")
    pl.fwd_ws = pydnn.get_convolution_forward_workspace_size(h, pl.xd, pl.wd, pl.cd, pl.yd, pl.fwd)
    pl.bwd_data = pl.bwd_filter = None
    pl.fused_ok = True
    pl.nhwc = None  # the backward's NHWC plan (_nhwc_plan), False where it does not apply
    pl.wtd = None  # the filter seen as a tensor (its layout's strides): the NHWC path's transforms (_nhwc_plan)
    pl.nhwc_ok = None  # _nhwc_applies for this plan's problem (the backward asks it once)
    if len(_conv_plans) >= 4096:
        _conv_plans.clear()
    _conv_plans[key] = pl
    return pl


def _bwd_algos(h, pl, dyd):
    if pl.bwd_data is None:
        bench = _benchmark() and not torch.cuda.is_current_stream_capturing()
        if bench:
            pd = pydnn.find_convolution_backward_data_algorithm(h, pl.wd, dyd, pl.cd, pl.xd, 8)
            pf = pydnn.find_convolution_backward_filter_algorithm(h, pl.xd, dyd, pl.cd, pl.wd, 8)
        else:
            pd = pydnn.get_convolution_backward_data_algorithm_v7(h, pl.wd, dyd, pl.cd, pl.xd, 8)
            pf = pydnn.get_convolution_backward_filter_algorithm_v7(h, pl.xd, dyd, pl.cd, pl.wd, 8)
        a_d, a_f = _pick(pd, "backward data"), _pick(pf, "backward filter")
        pl.bwd_data_ws = pydnn.get_convolution_backward_data_workspace_size(h, pl.wd, dyd, pl.cd, pl.xd, a_d)
        pl.bwd_filter_ws = pydnn.get_convolution_backward_filter_workspace_size(h, pl.xd, dyd, pl.cd, pl.wd, a_f)
        pl.bwd_data, pl.bwd_filter = a_d, a_f
    return pl


_NHWC_DTYPES = (torch.float16, torch.bfloat16)


def _nhwc_applies(x, w, fmt, spec):
    """Whether this NCHW convolution may run on NHWC copies (pydnn.tuning.torch.CONV_NHWC_FWD / _BWD): 2-d,
    groups 1, half / bfloat16, NCHW-packed x and filter, input and output channels multiples of 64 (where the
    NHWC tensor-core kernels serve it directly; NCHW takes an im2col GEMM forward, Winograd backward data and an
    im2col GEMM backward filter)."""
    return (x.dim() == 4 and x.dtype in _NHWC_DTYPES and spec[3] == 1
            and fmt == pydnn.PYDNN_TENSOR_NCHW and x.is_contiguous() and w.is_contiguous()
            and x.shape[1] % 64 == 0 and w.shape[0] % 64 == 0)


def _nhwc_plan(h, pl, x, w, spec):
    """The NHWC twin of an NCHW plan (its descriptors and backward algorithms), made once per plan."""
    if pl.nhwc is None:
        xh = torch.empty_like(x, memory_format=torch.channels_last)
        wh = torch.empty_like(w, memory_format=torch.channels_last)
        try:
            ph = conv_plan(h, xh, wh, spec, pydnn.PYDNN_TENSOR_NHWC)
            _bwd_algos(h, ph, ph.yd)
            # the transforms' descriptors, made once: x, y and the filter as tensors in either layout (the
            # plans' xd / yd are those of x and y; wtd the filter's)
            pl.wtd, ph.wtd = tdesc(w), tdesc(wh)
        except Unsupported:
            ph = False
        pl.nhwc = ph
    return pl.nhwc


def _transform(h, src, dst, sd=None, dd=None):
    """dst = src (same dims, any two layouts) through pydnn.transform_tensor; returns dst. sd / dd: the
    descriptors of src / dst where the caller has them (a plan's), else looked up."""
    pydnn.transform_tensor(h, 1.0, tdesc(src) if sd is None else sd, src.data_ptr(), 0.0,
                           tdesc(dst) if dd is None else dd, dst.data_ptr())
    return dst


def _conv_backward_nhwc(h, pl, x, w, dy, need_x, need_w, copies=False):
    """Backward data and filter of an NCHW convolution (plan pl) run on NHWC copies (ph = pl.nhwc, its
    _nhwc_plan): dy (NCHW packed, pl.yd), x (for the filter gradient) and the filter (for the data gradient)
    transposed to NHWC (x and w already are the forward's NHWC copies when `copies`), the gradients back to
    NCHW. Every transform takes the plans' descriptors (no per-call lookups)."""
    ph = pl.nhwc
    cl = torch.channels_last
    dyh = _transform(h, dy, torch.empty_like(dy, memory_format=cl), pl.yd, ph.yd)
    dx = dw = None
    if need_x:
        wh = w if copies else _transform(h, w, torch.empty_like(w, memory_format=cl), pl.wtd, ph.wtd)
        dxh = torch.empty_like(x, memory_format=cl)
        ws, wsp = C.workspace(ph.bwd_data_ws, x.device)
        pydnn.convolution_backward_data(h, 1.0, ph.wd, wh.data_ptr(), ph.yd, dyh.data_ptr(), ph.cd, ph.bwd_data,
                                        wsp, ph.bwd_data_ws, 0.0, ph.xd, dxh.data_ptr())
        dx = _transform(h, dxh, torch.empty(x.shape, dtype=x.dtype, device=x.device), ph.xd, pl.xd)
    if need_w:
        xh = x if copies else _transform(h, x, torch.empty_like(x, memory_format=cl), pl.xd, ph.xd)
        dwh = torch.empty_like(w, memory_format=cl)
        ws, wsp = C.workspace(ph.bwd_filter_ws, x.device)
        pydnn.convolution_backward_filter(h, 1.0, ph.xd, xh.data_ptr(), ph.yd, dyh.data_ptr(), ph.cd,
                                          ph.bwd_filter, wsp, ph.bwd_filter_ws, 0.0, ph.wd, dwh.data_ptr())
        dw = _transform(h, dwh, torch.empty(w.shape, dtype=w.dtype, device=w.device), ph.wtd, pl.wtd)
    return dx, dw


def _conv_forward(h, pl, x, w, b, act):
    """y = act(conv(x, w) + b) on plan pl: ConvolutionBiasActivationForward when there is a bias or an
    activation (unfused, with PyTorch's bias add and activation, where pydnn refuses the fused epilogue)."""
    y = _output_like(x, pl.y_shape)
    ws, wsp = C.workspace(pl.fwd_ws, x.device)
    epilogue = b is not None or act is not None
    if epilogue and pl.fused_ok:
        bias = b if b is not None else torch.zeros(w.shape[0], dtype=x.dtype, device=x.device)
        try:
            pydnn.convolution_bias_activation_forward(
                h, 1.0, pl.xd, x.data_ptr(), pl.wd, w.data_ptr(), pl.cd, pl.fwd, wsp, pl.fwd_ws, 0.0,
                pl.yd, y.data_ptr(), pl.bd, bias.data_ptr(), activation_desc(act or "identity"), pl.yd,
                y.data_ptr())
            return y
        except pydnn.PydnnError as e:
            if not C.is_not_supported(e):
                raise
            pl.fused_ok = False
            fallback(f"conv: fused bias/activation epilogue: {e} (unfused pydnn convolution, then torch's "
                     "bias add and activation)")
    pydnn.convolution_forward(h, 1.0, pl.xd, x.data_ptr(), pl.wd, w.data_ptr(), pl.cd, pl.fwd, wsp,
                              pl.fwd_ws, 0.0, pl.yd, y.data_ptr())
    if b is not None:
        y.add_(b.view((1, -1) + (1,) * (x.dim() - 2)))
    if act is not None:
        y = _TORCH_ACT[act](y)
    return y


def _conv_fwd(h, x, w, b, rec):
    """The forward of a convolution call on its record: (y, the tensors its backward needs, nhwc). NHWC plans
    (rec.ph) take NHWC copies of x and w (kept for the backward) and bring y back to x's layout."""
    if rec.wcopy:
        w = w.contiguous()
    pl, ph, act = rec.pl, rec.ph, rec.act
    if ph and (ph.fused_ok or (b is None and act is None)):
        # NHWC copies in, the NHWC convolution, the output back to NCHW; the copies serve the backward too
        cl = torch.channels_last
        xh = _transform(h, x, torch.empty_like(x, memory_format=cl), pl.xd, ph.xd)
        wh = _transform(h, w, torch.empty_like(w, memory_format=cl), pl.wtd, ph.wtd)
        y = _transform(h, _conv_forward(h, ph, xh, wh, b, act), _output_like(x, pl.y_shape), ph.yd, pl.yd)
        return y, (xh, wh, y if act is not None else None), True
    y = _conv_forward(h, pl, x, w, b, act)
    return y, (x, w, y if act is not None else None), False


def _conv_bwd(h, rec, nhwc, y_stride, saved, dy, need_x, need_w, need_b, has_bias):
    """(dx, dw, db) of a convolution call from its record, what _conv_fwd saved and dy (any strides)."""
    x, w, y = saved
    pl = rec.pl
    if dy.stride() != y_stride:  # (the same shape: autograd checks it)
        dy = C.to_strides(dy, pl.y_shape, y_stride)
    dyd = pl.yd
    act = rec.act
    if act is not None and act != "identity":
        g = torch.empty_like(dy)
        yd = tdesc(y)
        ad = activation_desc(act)
        # relu'(z) from y (y > 0 iff z > 0); sigmoid' and tanh' read y only: y stands in for x
        pydnn.activation_backward(h, ad, 1.0, yd, y.data_ptr(), dyd, dy.data_ptr(), yd, y.data_ptr(),
                                  0.0, dyd, g.data_ptr())
        dy = g
    dx = dw = db = None
    if nhwc:  # x and w are the forward's NHWC copies; pl.nhwc has the backward algorithms
        dx, dw = _conv_backward_nhwc(h, pl, x, w, dy, need_x, need_w, copies=True)
        need_x = need_w = False
    else:
        try:
            _bwd_algos(h, pl, dyd)
        except Unsupported as e:
            fallback(f"conv backward: {e} (aten.convolution_backward)")
            stride, padding, dilation, groups = rec.spec
            return torch.ops.aten.convolution_backward(
                dy, x, w, [w.shape[0]] if has_bias else None, list(stride), list(padding), list(dilation),
                False, [0] * len(stride), groups, [need_x, need_w, need_b and has_bias])
        if pl.nhwc_ok is None:  # (x, w and the spec are the plan's: the answer holds for every call on it)
            pl.nhwc_ok = _nhwc_applies(x, w, rec.fmt, rec.spec)
        if (need_x or need_w) and tuning.torch.CONV_NHWC_BWD and pl.nhwc_ok:
            ph = _nhwc_plan(h, pl, x, w, rec.spec)
            if ph:
                dx, dw = _conv_backward_nhwc(h, pl, x, w, dy, need_x, need_w)
                need_x = need_w = False
    if need_x:
        dx = _empty_like(x)
        ws, wsp = C.workspace(pl.bwd_data_ws, x.device)
        pydnn.convolution_backward_data(h, 1.0, pl.wd, w.data_ptr(), dyd, dy.data_ptr(), pl.cd, pl.bwd_data,
                                        wsp, pl.bwd_data_ws, 0.0, pl.xd, dx.data_ptr())
    if need_w:
        dw = torch.empty_like(w)
        ws, wsp = C.workspace(pl.bwd_filter_ws, x.device)
        pydnn.convolution_backward_filter(h, 1.0, pl.xd, x.data_ptr(), dyd, dy.data_ptr(), pl.cd,
                                          pl.bwd_filter, wsp, pl.bwd_filter_ws, 0.0, pl.wd, dw.data_ptr())
    if need_b and has_bias:
        db = torch.empty(w.shape[0], dtype=dy.dtype, device=dy.device)
        pydnn.convolution_backward_bias(h, 1.0, dyd, dy.data_ptr(), 0.0, pl.bd, db.data_ptr())
    return dx, dw, db


class ConvFunction(torch.autograd.Function):
    """y = act(conv(x, w) + b): forward through ConvolutionBiasActivationForward when there is a bias or an
    activation (ConvolutionForward otherwise); backward: the activation's derivative from y, then
    ConvolutionBackwardData / Filter / Bias. NCHW 16-bit 2-d convolutions with channel counts that are
    multiples of 64 (_nhwc_applies) run on NHWC copies made with pydnn.transform_tensor (tuning.torch.
    CONV_NHWC_FWD / CONV_NHWC_BWD): the tensor-core kernels read NHWC directly; the output and the gradients
    come back in the caller's NCHW layout."""

    @staticmethod
    def forward(ctx, x, w, b, rec):
        h = C.handle_for(x.device)
        y, saved, ctx.nhwc = _conv_fwd(h, x, w, b, rec)
        ctx.save_for_backward(*saved)
        ctx.rec, ctx.has_bias, ctx.y_stride = rec, b is not None, y.stride()
        return y

    @staticmethod
    def backward(ctx, dy):
        h = C.handle_for(dy.device)
        n = ctx.needs_input_grad
        dx, dw, db = _conv_bwd(h, ctx.rec, ctx.nhwc, ctx.y_stride, ctx.saved_tensors, dy, n[0], n[1], n[2],
                               ctx.has_bias)
        return dx, dw, db, None


_CONV_ACTS = frozenset((None, "relu", "sigmoid", "tanh", "identity"))


def _ntuple(v, n):
    if isinstance(v, int):
        return (v,) * n
    v = tuple(int(i) for i in v)
    return v * n if len(v) == 1 else v


_specs = C.BoundedDict()  # (nsp, stride, padding, dilation, groups, kernel dims for 'same') -> spec


def _conv_spec(nsp, stride, padding, dilation, groups, ks):
    """(stride, padding, dilation, groups) as tuples of nsp ints, cached by the call's own arguments (a
    module passes the same tuples every call): the normalisation runs once per configuration."""
    key = (nsp, stride, padding, dilation, groups, ks if isinstance(padding, str) else None)
    try:
        sp = _specs.get(key)
    except TypeError:  # lists from a functional caller: not cached
        key, sp = None, None
    if sp is not None:
        return sp
    st, dil = _ntuple(stride, nsp), _ntuple(dilation, nsp)
    if isinstance(padding, str):
        if padding == "valid":
            pad = (0,) * nsp
        elif padding == "same":
            tot = [d * (k - 1) for d, k in zip(dil, ks)]
            if any(t % 2 for t in tot) or any(s != 1 for s in st):
                raise Unsupported("padding='same' with asymmetric padding")
            pad = tuple(t // 2 for t in tot)
        else:
            raise Unsupported(f"padding={padding!r}")
    else:
        pad = _ntuple(padding, nsp)
    sp = (st, pad, dil, int(groups))
    if key is not None:
        _specs[key] = sp
    return sp


class _ConvRec:
    """A convolution call's record (FAST_CALLS): its spec, filter format, plan and NHWC twin (False: none)."""
    __slots__ = ("spec", "act", "fmt", "wcopy", "pl", "ph")


def _conv_rec(x, w, spec, act):
    """The record of a convolution call whose checks passed (x dense): plans made on first use."""
    r = _ConvRec()
    h = C.handle_for(x.device)
    fmt, wf = C.filter_format(w)
    r.spec, r.act, r.fmt, r.wcopy = spec, act, fmt, wf is not w
    r.pl = conv_plan(h, x, wf, spec, fmt)
    r.ph = (_nhwc_plan(h, r.pl, x, wf, spec)
            if tuning.torch.CONV_NHWC_FWD and _nhwc_applies(x, wf, fmt, spec) else False)
    return r


_conv_apply = C.applier(ConvFunction)


def conv(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, activation=None):
    """Convolution (1 to 3 spatial dims, cross-correlation as torch's conv{1,2,3}d) with an optional fused
    activation ('relu', 'sigmoid', 'tanh', 'identity'). padding: ints or 'valid' / 'same'."""
    ac = C.autocast_dtype()
    if ac is not None and C.on_cuda(x):  # as torch's autocast: convolutions run in the autocast dtype
        x, weight, bias = C.cast(x, ac), C.cast(weight, ac), C.cast(bias, ac)
    sw = tuning.torch
    fast = sw.FAST_CALLS
    if fast:
        key = ("conv", x.shape, x.stride(), x.dtype, x.device, weight.shape, weight.stride(), weight.dtype,
               weight.device, None if bias is None else (bias.dtype, bias.device), stride, padding, dilation, groups,
               activation, _benchmark(), sw.CONV_NHWC_FWD)
        try:
            rec = _recs.get(key)
        except TypeError:  # list arguments from a functional caller: no record
            rec = fast = None
        if rec is not None:
            try:
                return _conv_apply(x, weight, bias, rec)
            except pydnn.PydnnError as e:
                if not C.is_not_supported(e):
                    raise
                # the full path below runs it again and records the fallback
    nsp = x.dim() - 2

    def torch_path():
        fn = (F.conv1d, F.conv2d, F.conv3d)[nsp - 1] if 1 <= nsp <= 3 else None
        if fn is None:
            raise ValueError(f"conv: input of {x.dim()} dims (3 to 5 expected)")
        y = fn(x, weight, bias, stride, padding, dilation, groups)
        return _TORCH_ACT[activation](y) if activation else y

    def pydnn_path():
        if not 1 <= nsp <= 3:
            raise Unsupported(f"input of {x.dim()} dims")
        dt = x.dtype
        if not (x.is_cuda and weight.is_cuda and weight.dtype is dt and dt in C.DTYPES
                and (bias is None or (bias.is_cuda and bias.dtype is dt))):
            _check_cuda("conv", x, weight, bias)  # the general check (and its reason)
        if activation not in _CONV_ACTS:
            raise Unsupported(f"fused activation {activation!r}")
        spec = _conv_spec(nsp, stride, padding, dilation, groups, weight.shape[2:])
        if x.numel() == 0:
            raise Unsupported("empty input")
        xx = dense(x)
        rec = _conv_rec(xx, weight, spec, activation)
        y = _conv_apply(xx, weight, bias, rec)
        if fast and xx is x:
            _recs[key] = rec
        return y

    return _run(pydnn_path, torch_path, "conv")


# ======================================================================================== batch norm
def _bn_view(x):
    """(dims, strides) of x seen as 4-d (N, C, L, 1) / (N, C, 1, 1) for BatchNorm1d inputs."""
    if x.dim() == 2:
        return (x.shape[0], x.shape[1], 1, 1), (x.stride(0), x.stride(1), 1, 1)
    if x.dim() == 3:
        return tuple(x.shape) + (1,), tuple(x.stride()) + (1,)
    return tuple(x.shape), tuple(x.stride())


def _align(n, a=256):
    return (n + a - 1) // a * a


class _BnRec:
    """A batch-norm call's record (FAST_CALLS): descriptors, the statistics' dtype and channel count, y's
    strides, and the training forms' sizes: one buffer holds the saved mean / inverse std, the Ex forms'
    reserve space and the forward's workspace (offsets into it), so a training forward allocates y and that."""
    __slots__ = ("xd", "yd", "pd", "pdt", "c", "y_stride", "relu", "nws", "nrs", "rs_off", "ws_off", "nbuf",
                 "bwd", "pool", "lean")


def _bn_rec(h, x, training, relu):
    r = _BnRec()
    dims, strides = _bn_view(x)
    r.xd = C.tensor_desc(x.dtype, dims, strides)
    y = _empty_like(x)
    r.y_stride = y.stride()
    r.yd = r.xd if y.stride() == x.stride() else C.tensor_desc(y.dtype, *_bn_view(y))
    r.c = c = x.shape[1]
    r.pdt = torch.float64 if x.dtype == torch.float64 else torch.float32
    r.pd = C.tensor_desc(r.pdt, (1, c) + (1,) * (len(dims) - 2), (c,) + (1,) * (len(dims) - 1))
    r.relu, r.nws, r.nrs, r.bwd, r.pool, r.lean = relu, 0, 0, {}, None, {}
    if training and relu:
        ad, ops = activation_desc("relu"), pydnn.PYDNN_BATCHNORM_OPS_BN_ACTIVATION
        mode = pydnn.PYDNN_BATCHNORM_SPATIAL
        # the size queries plan the call: once per problem, not per step
        r.nws = pydnn.get_batch_normalization_forward_training_ex_workspace_size(h, mode, ops, r.xd, None, r.yd,
                                                                                 r.pd, ad)
        r.nrs = pydnn.get_batch_normalization_training_ex_reserve_space_size(h, mode, ops, ad, r.xd)
    st_bytes = 2 * c * (8 if r.pdt == torch.float64 else 4)
    r.rs_off = _align(st_bytes)
    r.ws_off = r.rs_off + _align(max(r.nrs, 1))
    r.nbuf = r.ws_off + r.nws
    return r


def _bn_fwd_train(h, x, weight, bias, running_mean, running_var, factor, eps, rec):
    """Batch norm in training on its record (fused ReLU and max pool where rec has them): (output, the tensors
    the backward needs: x, w, b, the statistics / reserve buffer [, y, z with the pool])."""
    y = torch.empty_strided(x.shape, rec.y_stride, dtype=x.dtype, device=x.device)
    c, pdt = rec.c, rec.pdt
    w = weight if weight is not None else torch.ones(c, dtype=pdt, device=x.device)
    b = bias if bias is not None else torch.zeros(c, dtype=pdt, device=x.device)
    mode = pydnn.PYDNN_BATCHNORM_SPATIAL
    # saved mean and inverse std, the reserve space and the workspace in one allocation
    buf = torch.empty(rec.nbuf, dtype=torch.uint8, device=x.device)
    smp = buf.data_ptr()
    sip = smp + c * (8 if pdt == torch.float64 else 4)
    if rec.relu:
        nws, nrs = rec.nws, rec.nrs
        pydnn.batch_normalization_forward_training_ex(
            h, mode, pydnn.PYDNN_BATCHNORM_OPS_BN_ACTIVATION, 1.0, 0.0, rec.xd, x.data_ptr(), None, None, rec.yd,
            y.data_ptr(), rec.pd, w.data_ptr(), b.data_ptr(), factor, ptr(running_mean), ptr(running_var), eps,
            smp, sip, activation_desc("relu"), smp + rec.ws_off if nws else None, nws, smp + rec.rs_off, nrs)
    else:
        pydnn.batch_normalization_forward_training(
            h, mode, 1.0, 0.0, rec.xd, x.data_ptr(), rec.yd, y.data_ptr(), rec.pd, w.data_ptr(), b.data_ptr(),
            factor, ptr(running_mean), ptr(running_var), eps, smp, sip)
    pr = rec.pool
    if pr is not None:  # the max pool that followed (convert(fuse=True)): y is its input, z its output
        z = torch.empty_strided(pr.out, pr.y_stride, dtype=x.dtype, device=x.device)
        pydnn.pooling_forward(h, pr.pd, 1.0, pr.xd, y.data_ptr(), 0.0, pr.yd, z.data_ptr())
        return z, (x, w, b, buf, y, z)
    return y, (x, w, b, buf)


def _bn_bwd_train(h, rec, saved, eps, dy):
    """(dx, dw, db) of a training batch norm (and its fused max pool) from what _bn_fwd_train saved."""
    pr = rec.pool
    if pr is None:
        x, w, b, buf = saved
    else:
        x, w, b, buf, y, z = saved
    smp = buf.data_ptr()
    sip = smp + rec.c * (8 if rec.pdt == torch.float64 else 4)
    xs = x.stride()
    if pr is not None:  # the pool's backward first: dy of the batch norm's output from dz
        dz = dy if dy.stride() == pr.y_stride else C.same_layout(dense(dy), z)
        dy = torch.empty_strided(x.shape, rec.y_stride, dtype=x.dtype, device=x.device)
        pydnn.pooling_backward(h, pr.pd, 1.0, pr.yd, z.data_ptr(), pr.yd if dz.stride() == pr.y_stride
                               else tdesc(dz), dz.data_ptr(), pr.xd, y.data_ptr(), 0.0, pr.xd, dy.data_ptr())
    if dy.stride() != xs:
        dy = C.same_layout(dense(dy), x)
    dx = _empty_like(x)
    dw, db = torch.empty((2,) + tuple(w.shape), dtype=w.dtype, device=w.device).unbind(0)  # one allocation
    mode = pydnn.PYDNN_BATCHNORM_SPATIAL
    xd = rec.xd  # x is the forward's: its descriptor is the record's
    dyd = xd if dy.stride() == xs else C.tensor_desc(dy.dtype, *_bn_view(dy))
    dxd = xd if dx.stride() == xs else C.tensor_desc(dx.dtype, *_bn_view(dx))
    if rec.relu:
        ad, ops = activation_desc("relu"), pydnn.PYDNN_BATCHNORM_OPS_BN_ACTIVATION
        key = (h, dyd, dxd)
        nws = rec.bwd.get(key)
        if nws is None:
            nws = rec.bwd[key] = pydnn.get_batch_normalization_backward_ex_workspace_size(
                h, mode, ops, xd, None, dyd, None, dxd, rec.pd, ad)
        ws, wsp = C.workspace(nws, x.device)
        pydnn.batch_normalization_backward_ex(
            h, mode, ops, 1.0, 0.0, 1.0, 0.0, xd, x.data_ptr(), None, None, dyd, dy.data_ptr(), None, None, dxd,
            dx.data_ptr(), rec.pd, w.data_ptr(), b.data_ptr(), dw.data_ptr(), db.data_ptr(), eps,
            smp, sip, ad, wsp, nws, smp + rec.rs_off, rec.nrs)
    else:
        pydnn.batch_normalization_backward(
            h, mode, 1.0, 0.0, 1.0, 0.0, xd, x.data_ptr(), dyd, dy.data_ptr(), dxd, dx.data_ptr(), rec.pd,
            w.data_ptr(), dw.data_ptr(), db.data_ptr(), eps, smp, sip)
    return dx, dw, db


class BatchNormFunction(torch.autograd.Function):
    """Batch norm (SPATIAL) with an optional fused ReLU: training through
    BatchNormalizationForwardTraining(Ex with BN_ACTIVATION) / BatchNormalizationBackward(Ex, the ReLU mask
    from the reserve space); eval through ForwardInference (the ReLU then applied to y) and a PyTorch
    backward (the affine map of eval mode). rec: the call's _BnRec."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, training, factor, eps, rec):
        h = C.handle_for(x.device)
        if training:
            y, saved = _bn_fwd_train(h, x, weight, bias, running_mean, running_var, factor, eps, rec)
            ctx.save_for_backward(*saved)
        else:
            xd, yd, pd = rec.xd, rec.yd, rec.pd
            y = torch.empty_strided(x.shape, rec.y_stride, dtype=x.dtype, device=x.device)
            c, pdt = rec.c, rec.pdt
            w = weight if weight is not None else torch.ones(c, dtype=pdt, device=x.device)
            b = bias if bias is not None else torch.zeros(c, dtype=pdt, device=x.device)
            pydnn.batch_normalization_forward_inference(
                h, pydnn.PYDNN_BATCHNORM_SPATIAL, 1.0, 0.0, xd, x.data_ptr(), yd, y.data_ptr(), pd, w.data_ptr(),
                b.data_ptr(), running_mean.data_ptr(), running_var.data_ptr(), eps)
            if rec.relu:
                y.relu_()
            ctx.save_for_backward(x, w, running_mean, running_var, y if rec.relu else None)
        ctx.training, ctx.eps, ctx.affine, ctx.rec = training, eps, weight is not None, rec
        return y

    @staticmethod
    def backward(ctx, dy):
        if not ctx.training:  # eval mode: y = (x - rm) * w / sqrt(rv + eps) + bias, an affine map of x
            x, w, a, b, y = ctx.saved_tensors
            if y is not None:
                dy = dy * (y > 0)
            inv = torch.rsqrt(b + ctx.eps)
            shape = (1, -1) + (1,) * (x.dim() - 2)
            dx = dy * (w * inv).view(shape).to(dy.dtype)
            axes = [0] + list(range(2, x.dim()))
            xhat = (x.to(w.dtype) - a.view(shape)) * inv.view(shape)
            dw = (dy.to(w.dtype) * xhat).sum(axes) if ctx.affine else None
            db = dy.to(w.dtype).sum(axes) if ctx.affine else None
            return dx, dw, db, None, None, None, None, None, None
        dx, dw, db = _bn_bwd_train(C.handle_for(dy.device), ctx.rec, ctx.saved_tensors, ctx.eps, dy)
        if not ctx.affine:
            dw = db = None
        return dx, dw, db, None, None, None, None, None, None


_bn_apply = C.applier(BatchNormFunction)


def _bn_params_ok(pdt, ts):
    for t in ts:
        if t is not None and (t.dtype != pdt or not t.is_contiguous() or not C.on_cuda(t)):
            return False
    return True


def _bn_pool_rec(x, rec, pool, out_nchw=False):
    """The record of the max pool (kernel_size, stride, padding) run on the batch norm's output (rec's y
    layout), or Unsupported (the checks of max_pool2d's pydnn path). out_nchw: the pool's output packed NCHW
    whatever the layout of its input (tuning.torch.BLOCK_NHWC: an NHWC batch norm inside a block whose caller
    sees NCHW)."""
    if x.dim() != 4:
        raise Unsupported(f"input of {x.dim()} dims (4 needed)")
    k, st, pad = _ntuple(pool[0], 2), _ntuple(pool[1] if pool[1] not in (None, ()) else pool[0], 2), _ntuple(pool[2], 2)
    if any(2 * p > kk for p, kk in zip(pad, k)):
        raise Unsupported("padding larger than half the window (PyTorch raises)")
    out = x.shape[:2] + tuple(_pool_out(n, kk, p, s_) for n, kk, p, s_ in zip(x.shape[2:], k, pad, st))
    if min(out) <= 0:
        raise Unsupported("empty output")
    y = torch.empty_strided(x.shape, rec.y_stride, dtype=x.dtype, device=x.device)
    r = _pool_rec(y, pydnn.PYDNN_POOLING_MAX, _pool_desc(pydnn.PYDNN_POOLING_MAX, k, pad, st), out)
    if out_nchw:
        z = torch.empty(out, dtype=x.dtype, device=x.device)
        r.y_stride, r.yd = z.stride(), tdesc(z)
    return r


def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5,
               activation=None, pool=None):
    """torch.nn.functional.batch_norm's semantics (momentum = cuDNN's exponential average factor);
    activation='relu' fuses a ReLU after it (the Ex form's BN_ACTIVATION in training). pool: (kernel_size,
    stride, padding) of a max pool applied to the result (convert(fuse=True) of BatchNorm2d [+ ReLU] +
    MaxPool2d): in training (tuning.torch.FUSE_POOL) inside the batch norm's autograd Function (one node for
    the three), otherwise max_pool2d after it."""
    if pool is not None and not (training and tuning.torch.FUSE_POOL):
        return max_pool2d(batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps, activation),
                          pool[0], pool[1], pool[2])
    fast = tuning.torch.FAST_CALLS
    if fast:
        key = ("batch_norm", x.shape, x.stride(), x.dtype, x.device, bool(training), activation,
               running_mean is None, running_var is None, pool)
        rec = _recs.get(key)
        if rec is not None and _bn_params_ok(rec.pdt, (running_mean, running_var, weight, bias)):
            try:
                return _bn_apply(x, weight, bias, running_mean, running_var, bool(training), float(momentum),
                                 float(eps), rec)
            except pydnn.PydnnError as e:
                if not C.is_not_supported(e):
                    raise
                # the full path below runs it again and records the fallback
    if activation not in (None, "relu"):
        raise ValueError(f"activation: {activation!r} (batch norm fuses 'relu' only)")
    relu = activation == "relu"

    def torch_path():
        y = F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)
        y = F.relu(y) if relu else y
        return y if pool is None else max_pool2d(y, pool[0], pool[1], pool[2])

    def pydnn_path():
        if not 2 <= x.dim() <= 5:
            raise Unsupported(f"input of {x.dim()} dims")
        _check_cuda("batch_norm", x)
        pdt = torch.float64 if x.dtype == torch.float64 else torch.float32
        for t in (running_mean, running_var, weight, bias):
            if t is not None and (t.dtype != pdt or not t.is_contiguous() or not C.on_cuda(t)):
                raise Unsupported(f"parameter / statistic of dtype {t.dtype} with {x.dtype} input ({pdt} needed)")
        if not training and (running_mean is None or running_var is None):
            raise Unsupported("eval mode without running statistics")
        if training:
            n = x.numel() // x.shape[1]
            if n <= 1:
                raise Unsupported("one value per channel in training (PyTorch raises)")
        if x.numel() == 0:
            raise Unsupported("empty input")
        xx = dense(x)
        rec = _bn_rec(C.handle_for(xx.device), xx, bool(training), relu)
        if pool is not None:
            try:
                rec.pool = _bn_pool_rec(xx, rec, pool)
            except Unsupported as e:  # the batch norm on pydnn, the pool by max_pool2d (its own fallback)
                fallback(f"batch_norm + max_pool2d: {e}")
                y = _bn_apply(xx, weight, bias, running_mean, running_var, bool(training), float(momentum),
                              float(eps), rec)
                return max_pool2d(y, pool[0], pool[1], pool[2])
        y = _bn_apply(xx, weight, bias, running_mean, running_var, bool(training), float(momentum), float(eps), rec)
        if fast and xx is x:
            _recs[key] = rec
        return y

    return _run(pydnn_path, torch_path, "batch_norm")


# ================================================================== convolution + batch norm, one node
class _BlockRec:
    """A conv + batch-norm call's record (tuning.torch.FUSE_BLOCK): the compute dtype (dt: autocast's, the
    parameters cast to it inside the Function), the convolution's record and the batch norm's (with its
    fused ReLU and max pool)."""
    __slots__ = ("dt", "conv", "bn", "nhwc", "w32d", "bn_c", "lean")


def _block_rec(x, weight, bias, spec, bn_params, relu, pool):
    """The record of a conv + batch norm (training) call, or False where the fused path does not apply (the
    caller then runs conv() and batch_norm(), each with its own checks and fallbacks)."""
    dt = x.dtype
    if not (C.on_cuda(x, weight, bias) and dt in C.DTYPES and x.dim() == 4 and x.numel()
            and weight.is_floating_point() and weight.dim() == 4
            and (bias is None or bias.is_floating_point()) and dense(x) is x):
        return False
    if not _bn_params_ok(torch.float64 if dt == torch.float64 else torch.float32, bn_params):
        return False
    if any(t is not None and t.shape != (weight.shape[0],) for t in bn_params):
        return False  # (the calls in sequence raise PyTorch's error)
    try:
        r = _BlockRec()
        r.dt = dt
        wc = torch.empty_like(weight, dtype=dt)  # the layout weight.to(dt) gives (preserve_format)
        r.conv = _conv_rec(x, wc, spec, None)
        ph = r.conv.ph
        # tuning.torch.BLOCK_NHWC: the batch norm and pool on the NHWC convolution's own output (with a pool only:
        # the pool writes the block's output in the layout the caller expects)
        r.nhwc = bool(tuning.torch.BLOCK_NHWC and ph and pool is not None)
        if r.nhwc:
            y = torch.empty(ph.y_shape, dtype=dt, device=x.device, memory_format=torch.channels_last)
        else:
            y = _output_like(x, r.conv.pl.y_shape)
        if y.numel() <= y.shape[1]:
            return False  # one value per channel: batch_norm's own path raises PyTorch's error
        r.bn = _bn_rec(C.handle_for(x.device), y, True, relu)
        if pool is not None:
            r.bn.pool = _bn_pool_rec(y, r.bn, pool, out_nchw=r.nhwc)
        r.bn_c = None
        if r.nhwc:  # the batch norm of the path without BLOCK_NHWC, for CUDA graph capture (see the forward)
            yc = _output_like(x, r.conv.pl.y_shape)
            r.bn_c = _bn_rec(C.handle_for(x.device), yc, True, relu)
            r.bn_c.pool = _bn_pool_rec(yc, r.bn_c, pool)
        # the float32 weight (NCHW-packed) as a tensor: cast in the transform to its NHWC copy (and its gradient
        # back in the one to NCHW)
        r.w32d = (C.tensor_desc(weight.dtype, tuple(weight.shape), weight.stride())
                  if r.nhwc and weight.dtype is not dt and weight.dtype in C.DTYPES and not r.conv.wcopy
                  and weight.is_contiguous() else None)
        r.lean = _lean_fwd_plan(r, x, weight, bias, relu, pool)
    except (Unsupported, pydnn.PydnnError):  # the calls in sequence: their own fallbacks or errors
        return False
    return r


def _block_bwd_nhwc(h, rec, y_stride, xh, wh, dy, need_x, need_w, need_b, w_dt):
    """(dx, dw, db) of a BLOCK_NHWC block's convolution from its NHWC copies xh / wh and dy, the gradient of its
    NHWC output: the NHWC backward data / filter / bias on dy as it is; dx and dw back to NCHW (dw straight to
    w_dt, the parameter's dtype, where rec.w32d has its descriptor)."""
    pl = rec.conv.pl
    ph = pl.nhwc
    if dy.stride() != y_stride:  # (the batch norm's backward writes x's layout: not expected)
        dy = C.to_strides(dy, dy.shape, y_stride)
    dyp = dy.data_ptr()
    dx = dw = db = None
    if need_x:
        dxh = torch.empty_like(xh)
        ws, wsp = C.workspace(ph.bwd_data_ws, xh.device)
        pydnn.convolution_backward_data(h, 1.0, ph.wd, wh.data_ptr(), ph.yd, dyp, ph.cd, ph.bwd_data, wsp,
                                        ph.bwd_data_ws, 0.0, ph.xd, dxh.data_ptr())
        dx = _transform(h, dxh, torch.empty(xh.shape, dtype=xh.dtype, device=xh.device), ph.xd, pl.xd)
    if need_w:
        dwh = torch.empty_like(wh)
        ws, wsp = C.workspace(ph.bwd_filter_ws, xh.device)
        pydnn.convolution_backward_filter(h, 1.0, ph.xd, xh.data_ptr(), ph.yd, dyp, ph.cd, ph.bwd_filter, wsp,
                                          ph.bwd_filter_ws, 0.0, ph.wd, dwh.data_ptr())
        if rec.w32d is not None and w_dt is not None and w_dt is not wh.dtype:
            dw = _transform(h, dwh, torch.empty(wh.shape, dtype=w_dt, device=wh.device), ph.wtd, rec.w32d)
        else:
            dw = _transform(h, dwh, torch.empty(wh.shape, dtype=wh.dtype, device=wh.device), ph.wtd, pl.wtd)
    if need_b:
        db = torch.empty(wh.shape[0], dtype=dy.dtype, device=dy.device)
        pydnn.convolution_backward_bias(h, 1.0, ph.yd, dyp, 0.0, pl.bd, db.data_ptr())
    return dx, dw, db


# ------------------------------------------------------------- the block's lean path (tuning.torch.BLOCK_LEAN)
# Why: the CNN demo's eager step is host-bound (GPU idle ~74% of pydnn's step, H200, session 31) and each torch
# allocation / cast the bridge makes is a dispatcher call, a caching-allocator lookup and (casts) a kernel launch
# of PyTorch's. The block's backward temporaries only live inside its backward, and every pydnn call takes int
# pointers: they are carved from one workspace buffer (C.workspace: the stream's kept buffer eagerly, a fresh one
# under capture), laid out [the calls' largest workspace | temporaries], so no call's workspace overlaps them.
_LEAN_ALIGN = 256


class _LeanFwd:
    """What the block's lean forward needs beyond its record: the float32 <-> compute-dtype descriptors of the
    parameters' casts (None: no cast) and the scratch layout of the forward (the convolution's workspace, then
    the 16-bit bias)."""
    __slots__ = ("b32d", "w32d", "w16d", "b_off", "total", "x_shape", "w_shape", "y_stride", "o_xc", "o_wc",
                 "o_y", "o_yb", "o_buf", "arena")


def _lean_fwd_plan(r, x, weight, bias, relu, pool):
    """The block's _LeanFwd, or None where the lean path does not apply (no ReLU or max pool, a convolution on
    NHWC copies without BLOCK_NHWC, a strided / non-float weight or bias)."""
    conv = r.conv
    if not (relu and pool is not None and (r.nhwc or not conv.ph) and conv.act is None and not conv.wcopy
            and conv.fmt == pydnn.PYDNN_TENSOR_NCHW and weight.is_contiguous()
            and weight.dtype in C.DTYPES and (bias is None or (bias.dtype in C.DTYPES and bias.dim() == 1
                                                               and bias.is_contiguous()))):
        return None
    dt = r.dt
    lf = _LeanFwd()
    pl = conv.pl
    cp = pl.nhwc if r.nhwc else pl
    k = weight.shape[0]
    lf.b32d = (C.tensor_desc(bias.dtype, (1, k, 1, 1), (k, 1, 1, 1))
               if bias is not None and bias.dtype is not dt else None)
    packed = torch.empty(tuple(weight.shape), dtype=dt, device="meta").stride()  # (strides only: no allocation)
    lf.w32d = C.tensor_desc(weight.dtype, tuple(weight.shape), weight.stride()) if weight.dtype is not dt else None
    lf.w16d = C.tensor_desc(dt, tuple(weight.shape), packed)
    lf.b_off = _align(cp.fwd_ws, _LEAN_ALIGN)
    lf.total = lf.b_off + (_align(k * x.element_size(), _LEAN_ALIGN) if lf.b32d is not None else 0)
    # BLOCK_ARENA: the forward's tensors that only the block's backward reads, in one allocation: [the NHWC copy
    # of x (BLOCK_NHWC) | the 16-bit / NHWC filter (where the forward makes one) | the convolution's output | the
    # batch norm's output | its statistics, reserve space and workspace (the batch norm record's buffer)]
    es = torch.empty(0, dtype=dt).element_size()
    yt = (torch.empty(cp.y_shape, dtype=dt, device="meta", memory_format=torch.channels_last) if r.nhwc
          else _output_like(x, pl.y_shape))
    lf.x_shape, lf.w_shape, lf.y_stride = tuple(x.shape), tuple(weight.shape), yt.stride()
    off = 0

    def take(n):
        nonlocal off
        o = off
        off += _align(n, _LEAN_ALIGN)
        return o
    lf.o_xc = take(x.numel() * es) if r.nhwc else -1
    lf.o_wc = take(weight.numel() * es) if (r.nhwc or lf.w32d is not None) else -1
    lf.o_y = take(yt.numel() * es)
    lf.o_yb = take(yt.numel() * es)
    lf.o_buf = take(r.bn.nbuf)
    lf.arena = off
    return lf


def _block_fwd_lean(h, rec, lf, x, w, b):
    """The block's convolution (BLOCK_LEAN): (y, the tensors its backward needs, ctx.nhwc). The bias cast into
    the workspace buffer (after the convolution's own workspace), the weight cast by transform_tensor (into the
    NHWC copy under BLOCK_NHWC, else into a packed 16-bit filter kept for the backward)."""
    conv, dt = rec.conv, rec.dt
    pl = conv.pl
    ws, sp, bp = _lean_bias(h, lf, pl, b, x.device)
    if rec.nhwc:
        cp = pl.nhwc
        cl = torch.channels_last
        xc = _transform(h, x, torch.empty_like(x, memory_format=cl), pl.xd, cp.xd)
        wc = _transform(h, w, torch.empty(w.shape, dtype=dt, device=w.device, memory_format=cl),
                        lf.w32d if lf.w32d is not None else pl.wtd, cp.wtd)
        y = torch.empty(cp.y_shape, dtype=dt, device=x.device, memory_format=cl)
    else:
        cp = pl
        xc = x
        if lf.w32d is None:
            wc = w
        else:
            wc = _transform(h, w, torch.empty(w.shape, dtype=dt, device=w.device), lf.w32d, lf.w16d)
        y = _output_like(x, pl.y_shape)
    _lean_conv(h, cp, xc.data_ptr(), wc.data_ptr(), sp, y.data_ptr(), bp)
    return y, (xc, wc, None), (2 if rec.nhwc else False)


def _lean_bias(h, lf, pl, b, dev):
    """The lean forward's workspace (tensor, pointer) and its bias pointer (the 16-bit cast in the workspace after
    the convolution's own, where the bias is not in the compute dtype; 0: no bias)."""
    ws, sp = C.workspace(lf.total, dev)
    if b is None:
        bp = 0
    elif lf.b32d is not None:
        bp = sp + lf.b_off
        pydnn.transform_tensor(h, 1.0, lf.b32d, b.data_ptr(), 0.0, pl.bd, bp)
    else:
        bp = b.data_ptr()
    return ws, sp, bp


def _lean_conv(h, cp, xcp, wcp, sp, yp, bp):
    """The lean forward's convolution on plan cp (bias bp fused where there is one) into yp."""
    wsp = sp if cp.fwd_ws else None
    if bp:
        try:
            pydnn.convolution_bias_activation_forward(
                h, 1.0, cp.xd, xcp, cp.wd, wcp, cp.cd, cp.fwd, wsp, cp.fwd_ws, 0.0, cp.yd, yp, cp.bd, bp,
                activation_desc("identity"), cp.yd, yp)
        except pydnn.PydnnError as e:
            if C.is_not_supported(e):
                cp.fused_ok = False  # (the general path from now on: its unfused form)
            raise
    else:
        pydnn.convolution_forward(h, 1.0, cp.xd, xcp, cp.wd, wcp, cp.cd, cp.fwd, wsp, cp.fwd_ws, 0.0, cp.yd, yp)


def _block_fwd_arena(h, rec, lf, x, w, b, bn_w, bn_b, running_mean, running_var, factor, eps):
    """The whole block's forward (BLOCK_ARENA; the lean path's convolution, the batch norm with its ReLU, the max
    pool): (z, the tensors saved for the backward: (x or None, w or None, the arena, bn_w, bn_b, z)). x / w are
    saved where the convolution reads them as they are (no copy in the arena). One allocation besides z."""
    conv, dt, bn = rec.conv, rec.dt, rec.bn
    pl = conv.pl
    dev = x.device
    ws, sp, bp = _lean_bias(h, lf, pl, b, dev)
    arena = torch.empty(lf.arena, dtype=torch.uint8, device=dev)
    ap = arena.data_ptr()
    if rec.nhwc:
        cp = pl.nhwc
        xcp, wcp, xt, wt = ap + lf.o_xc, ap + lf.o_wc, None, None
        pydnn.transform_tensor(h, 1.0, pl.xd, x.data_ptr(), 0.0, cp.xd, xcp)
        pydnn.transform_tensor(h, 1.0, lf.w32d if lf.w32d is not None else pl.wtd, w.data_ptr(), 0.0, cp.wtd, wcp)
    else:
        cp = pl
        xcp, xt = x.data_ptr(), x
        if lf.w32d is None:
            wcp, wt = w.data_ptr(), w
        else:
            wcp, wt = ap + lf.o_wc, None
            pydnn.transform_tensor(h, 1.0, lf.w32d, w.data_ptr(), 0.0, lf.w16d, wcp)
    yp = ap + lf.o_y
    _lean_conv(h, cp, xcp, wcp, sp, yp, bp)
    # the batch norm (Ex, ReLU) on the convolution's output, as _bn_fwd_train with its record's buffer layout
    smp, ybp = ap + lf.o_buf, ap + lf.o_yb
    nws = bn.nws
    pydnn.batch_normalization_forward_training_ex(
        h, pydnn.PYDNN_BATCHNORM_SPATIAL, pydnn.PYDNN_BATCHNORM_OPS_BN_ACTIVATION, 1.0, 0.0, bn.xd, yp, None, None,
        bn.yd, ybp, bn.pd, bn_w.data_ptr(), bn_b.data_ptr(), factor, ptr(running_mean), ptr(running_var), eps, smp,
        smp + bn.c * (8 if bn.pdt == torch.float64 else 4), activation_desc("relu"),
        smp + bn.ws_off if nws else None, nws, smp + bn.rs_off, bn.nrs)
    pr = bn.pool
    z = torch.empty_strided(pr.out, pr.y_stride, dtype=dt, device=dev)
    pydnn.pooling_forward(h, pr.pd, 1.0, pr.xd, ybp, 0.0, pr.yd, z.data_ptr())
    return z, (xt, wt, arena, bn_w, bn_b, z)


def _arena_view(arena, off, dt, shape, strides):
    """A tensor of (shape, strides, dt) at byte `off` of the arena (off: a multiple of _LEAN_ALIGN)."""
    t = torch.empty(0, dtype=dt, device=arena.device)
    return t.set_(arena.untyped_storage(), off // t.element_size(), shape, strides)


def _arena_saved(ctx, saved):
    """A BLOCK_ARENA forward's saved tensors in the layout of the block's other paths: (xc, wc, None, x, w, b,
    buf, y, z) (xc / wc: x and the filter as the convolution read them; x: its output; y: the batch norm's)."""
    rec = ctx.rec
    lf, bn, dt = rec.lean, ctx.bn, rec.dt
    xt, wt, arena, bn_w, bn_b, z = saved
    cl = torch.channels_last
    if rec.nhwc:
        ph = rec.conv.pl.nhwc
        xc = _arena_view(arena, lf.o_xc, dt, lf.x_shape, torch.empty(lf.x_shape, dtype=dt, device="meta",
                                                                     memory_format=cl).stride())
        wc = _arena_view(arena, lf.o_wc, dt, lf.w_shape, torch.empty(lf.w_shape, dtype=dt, device="meta",
                                                                     memory_format=cl).stride())
        ys = ph.y_shape
    else:
        xc = xt
        wc = wt if wt is not None else _arena_view(arena, lf.o_wc, dt, lf.w_shape,
                                                   torch.empty(lf.w_shape, device="meta").stride())
        ys = rec.conv.pl.y_shape
    x = _arena_view(arena, lf.o_y, dt, ys, lf.y_stride)
    y = _arena_view(arena, lf.o_yb, dt, ys, bn.y_stride)
    buf = _arena_view(arena, lf.o_buf, torch.uint8, (bn.nbuf,), (1,))
    return xc, wc, None, x, bn_w, bn_b, buf, y, z


class _LeanBwd:
    """The scratch layout of a block's lean backward for one (handle, needs) and its cast descriptors: offsets of
    the pool's gradient (pdy), the batch norm's (bdx), the NHWC input gradient (dxh), the 16-bit weight / bias
    gradients (dw16, db16; -1: not used), after `ws` bytes for the calls' own workspaces."""
    __slots__ = ("nws_bn", "ws", "pdy", "bdx", "dxh", "dw16", "db16", "total", "db32d", "dw_to")


def _lean_bwd_plan(h, rec, bn, x_bn, xc, wc, need, w_dt, b_dt):
    """The block's _LeanBwd for these needs and parameter dtypes (made once), or False where the general path
    takes the backward (a batch-norm output off the convolution output's strides, no ReLU / pool, a plain
    convolution whose backward runs on NHWC copies, CONV_NHWC_BWD)."""
    key = (h, need, w_dt, b_dt)
    lb = bn.lean.get(key)
    if lb is not None:
        return lb
    lb = False
    conv = rec.conv
    pl = conv.pl
    xd = bn.xd
    if rec.nhwc:
        cp = pl.nhwc
    else:
        cp = pl
        _bwd_algos(h, pl, pl.yd)
        if pl.nhwc_ok is None:  # (as _conv_bwd asks it: x and w are the plan's)
            pl.nhwc_ok = _nhwc_applies(xc, wc, conv.fmt, conv.spec)
    ok = bn.y_stride == x_bn.stride() and bn.pool is not None and bn.relu
    if ok and not rec.nhwc and (need[0] or need[1]) and tuning.torch.CONV_NHWC_BWD and pl.nhwc_ok:
        ok = False  # (the general path's NHWC backward for this convolution)
    if ok:
        lb = _LeanBwd()
        ad = activation_desc("relu")
        ops, mode = pydnn.PYDNN_BATCHNORM_OPS_BN_ACTIVATION, pydnn.PYDNN_BATCHNORM_SPATIAL
        nws = bn.bwd.get((h, xd, xd))
        if nws is None:
            nws = bn.bwd[(h, xd, xd)] = pydnn.get_batch_normalization_backward_ex_workspace_size(
                h, mode, ops, xd, None, xd, None, xd, bn.pd, ad)
        lb.nws_bn = nws
        ws = max(nws, cp.bwd_data_ws if need[0] else 0, cp.bwd_filter_ws if need[1] else 0)
        off = lb.ws = _align(ws, _LEAN_ALIGN)
        es = x_bn.element_size()
        ybytes = x_bn.numel() * es

        def take(n):
            nonlocal off
            o = off
            off += _align(n, _LEAN_ALIGN)
            return o
        lb.pdy = take(ybytes)
        lb.bdx = take(ybytes)
        k = cp.y_shape[1]
        lb.dxh = take(xc.numel() * es) if rec.nhwc and need[0] else -1
        # the 16-bit weight gradient: NHWC (its transform to NCHW casts where rec.w32d has the descriptor), or
        # the plain path's before its cast to the parameter's dtype
        lb.dw_to = None
        if need[1] and (rec.nhwc or (w_dt is not None and w_dt is not rec.dt)):
            lb.dw16 = take(wc.numel() * es)
            if not rec.nhwc:
                lb.dw_to = C.tensor_desc(w_dt, tuple(wc.shape), wc.stride())  # (wc: packed NCHW, _lean_fwd_plan)
        else:
            lb.dw16 = -1
        lb.db32d = None
        if need[2] and b_dt is not None and b_dt is not rec.dt:
            lb.db16 = take(k * es)
            lb.db32d = C.tensor_desc(b_dt, (1, k, 1, 1), (k, 1, 1, 1))
        else:
            lb.db16 = -1
        lb.total = off
    bn.lean[key] = lb
    return lb


def _block_bwd_lean(ctx, h, dz, lb, p):
    """The block's backward (BLOCK_LEAN) on plan lb: the pool's backward, the batch norm's (Ex, ReLU mask from
    the reserve space) and the convolution's, every temporary a pointer into one workspace buffer. p: the saved
    tensors' pointers (x and the filter as the convolution read them, its output, the batch norm's buffer, its
    output, the pool's output), the batch norm's weight and bias, and x / the filter where the convolution read
    them as they are (the tensors whose layout dx / dw take), else None."""
    rec, bn = ctx.rec, ctx.bn
    pr = bn.pool
    n = ctx.needs_input_grad
    xcp, wcp, xp, smp, yp, zp, w, b, xc, wc = p
    lf = rec.lean
    ws, sp = C.workspace(lb.total, dz.device)
    pdy, bdx = sp + lb.pdy, sp + lb.bdx
    pydnn.pooling_backward(h, pr.pd, 1.0, pr.yd, zp, pr.yd, dz.data_ptr(), pr.xd, yp, 0.0, pr.xd, pdy)
    # two allocations: one (2, C) tensor unbound into two views took 7.4 us, two torch.empty 3.6 (CPU, C = 64)
    dbn_w = torch.empty(w.shape, dtype=w.dtype, device=w.device)
    dbn_b = torch.empty(w.shape, dtype=w.dtype, device=w.device)
    sip = smp + bn.c * (8 if bn.pdt == torch.float64 else 4)
    xd = bn.xd
    nws = lb.nws_bn
    pydnn.batch_normalization_backward_ex(
        h, pydnn.PYDNN_BATCHNORM_SPATIAL, pydnn.PYDNN_BATCHNORM_OPS_BN_ACTIVATION, 1.0, 0.0, 1.0, 0.0, xd,
        xp, None, None, xd, pdy, None, None, xd, bdx, bn.pd, w.data_ptr(), b.data_ptr(), dbn_w.data_ptr(),
        dbn_b.data_ptr(), ctx.eps, smp, sip, activation_desc("relu"), sp if nws else None, nws, smp + bn.rs_off,
        bn.nrs)
    pl = rec.conv.pl
    dx = dw = db = None
    if rec.nhwc:
        cp = pl.nhwc
        if n[0]:
            dxh = sp + lb.dxh
            pydnn.convolution_backward_data(h, 1.0, cp.wd, wcp, cp.yd, bdx, cp.cd, cp.bwd_data,
                                            sp if cp.bwd_data_ws else None, cp.bwd_data_ws, 0.0, cp.xd, dxh)
            dx = torch.empty(lf.x_shape, dtype=rec.dt, device=dz.device)
            pydnn.transform_tensor(h, 1.0, cp.xd, dxh, 0.0, pl.xd, dx.data_ptr())
        if n[1]:
            dwh = sp + lb.dw16
            pydnn.convolution_backward_filter(h, 1.0, cp.xd, xcp, cp.yd, bdx, cp.cd, cp.bwd_filter,
                                              sp if cp.bwd_filter_ws else None, cp.bwd_filter_ws, 0.0, cp.wd, dwh)
            w_dt = ctx.w_dt
            if rec.w32d is not None and w_dt is not None and w_dt is not rec.dt:
                dw = torch.empty(lf.w_shape, dtype=w_dt, device=dz.device)
                pydnn.transform_tensor(h, 1.0, cp.wtd, dwh, 0.0, rec.w32d, dw.data_ptr())
            else:
                dw = torch.empty(lf.w_shape, dtype=rec.dt, device=dz.device)
                pydnn.transform_tensor(h, 1.0, cp.wtd, dwh, 0.0, pl.wtd, dw.data_ptr())
    else:
        cp = pl
        if n[0]:
            dx = _empty_like(xc)
            pydnn.convolution_backward_data(h, 1.0, cp.wd, wcp, cp.yd, bdx, cp.cd, cp.bwd_data,
                                            sp if cp.bwd_data_ws else None, cp.bwd_data_ws, 0.0, cp.xd, dx.data_ptr())
        if n[1]:
            if lb.dw16 >= 0:
                dwp = sp + lb.dw16
                pydnn.convolution_backward_filter(h, 1.0, cp.xd, xcp, cp.yd, bdx, cp.cd, cp.bwd_filter,
                                                  sp if cp.bwd_filter_ws else None, cp.bwd_filter_ws, 0.0, cp.wd, dwp)
                dw = torch.empty(lf.w_shape, dtype=ctx.w_dt, device=dz.device)
                pydnn.transform_tensor(h, 1.0, rec.lean.w16d, dwp, 0.0, lb.dw_to, dw.data_ptr())
            else:
                dw = torch.empty_like(wc)
                pydnn.convolution_backward_filter(h, 1.0, cp.xd, xcp, cp.yd, bdx, cp.cd, cp.bwd_filter,
                                                  sp if cp.bwd_filter_ws else None, cp.bwd_filter_ws, 0.0, cp.wd,
                                                  dw.data_ptr())
    if n[2] and ctx.b_dt is not None:
        if lb.db16 >= 0:
            dbp = sp + lb.db16
            pydnn.convolution_backward_bias(h, 1.0, cp.yd, bdx, 0.0, pl.bd, dbp)
            db = torch.empty(cp.y_shape[1], dtype=ctx.b_dt, device=dz.device)
            pydnn.transform_tensor(h, 1.0, pl.bd, dbp, 0.0, lb.db32d, db.data_ptr())
        else:
            db = torch.empty(cp.y_shape[1], dtype=rec.dt, device=dz.device)
            pydnn.convolution_backward_bias(h, 1.0, cp.yd, bdx, 0.0, pl.bd, db.data_ptr())
    return dx, dw, db, dbn_w, dbn_b


class ConvBatchNormFunction(torch.autograd.Function):
    """z = [max_pool](batch_norm[+relu](conv(x, w) + b)) in training, one autograd node (tuning.torch.FUSE_BLOCK,
    convert(fuse=True) of an nn.Sequential's Conv2d followed by a BatchNorm2d): the convolution's and the batch
    norm's forwards and backwards are ConvFunction's and BatchNormFunction's (_conv_fwd / _bn_fwd_train and
    _bn_bwd_train / _conv_bwd), without the node, module call and record lookup between them. Under autocast the
    convolution's float32 weight and bias are cast to the compute dtype here (their gradients cast back in the
    backward): the values autocast's casts give, without their two autograd nodes."""

    @staticmethod
    def forward(ctx, x, w, b, bn_w, bn_b, running_mean, running_var, factor, eps, rec):
        h = C.handle_for(x.device)
        dt = rec.dt
        bn = rec.bn
        # BLOCK_NHWC: x and w to NHWC copies (w cast there), the batch norm on the NHWC output. Eager only: its max
        # pool reads NHWC and writes NCHW, and that backward (p2_bwd) took 191 us of GPU time where the NCHW window
        # kernel takes ~20 (H200, the CNN demo's second block): it saves host time, which a captured graph does not
        # spend
        if rec.nhwc and C.capturing():
            bn = rec.bn_c
        lf = rec.lean
        lean = lf is not None and bn is rec.bn and tuning.torch.BLOCK_LEAN and (
            rec.conv.pl.nhwc if rec.nhwc else rec.conv.pl).fused_ok
        ctx.rec, ctx.bn, ctx.eps, ctx.affine = rec, bn, eps, bn_w is not None
        ctx.w_dt, ctx.b_dt = w.dtype, None if b is None else b.dtype
        if lean and tuning.torch.BLOCK_ARENA and bn_w is not None and bn_b is not None:
            z, saved = _block_fwd_arena(h, rec, lf, x, w, b, bn_w, bn_b, running_mean, running_var, factor, eps)
            ctx.save_for_backward(*saved)
            ctx.nhwc, ctx.y_stride, ctx.lean = (2 if rec.nhwc else False), lf.y_stride, 2
            return z
        if lean:
            y, csaved, ctx.nhwc = _block_fwd_lean(h, rec, lf, x, w, b)
        elif bn is rec.bn and rec.nhwc:
            bc = b if (b is None or b.dtype is dt) else b.to(dt)
            pl = rec.conv.pl
            ph = pl.nhwc
            cl = torch.channels_last
            xh = _transform(h, x, torch.empty_like(x, memory_format=cl), pl.xd, ph.xd)
            if rec.w32d is not None and w.dtype is not dt:
                wh = _transform(h, w, torch.empty(w.shape, dtype=dt, device=w.device, memory_format=cl), rec.w32d,
                                ph.wtd)
            else:
                wc = w if w.dtype is dt else w.to(dt)
                if rec.conv.wcopy:
                    wc = wc.contiguous()
                wh = _transform(h, wc, torch.empty_like(wc, memory_format=cl), pl.wtd, ph.wtd)
            y = _conv_forward(h, ph, xh, wh, bc, None)
            csaved, ctx.nhwc = (xh, wh, None), 2
        else:
            bc = b if (b is None or b.dtype is dt) else b.to(dt)
            wc = w if w.dtype is dt else w.to(dt)
            y, csaved, ctx.nhwc = _conv_fwd(h, x, wc, bc, rec.conv)
        ctx.y_stride = y.stride()
        # the lean backward's saved tensors are either forward's: (x or its NHWC copy, the 16-bit filter, None, ...)
        ctx.lean = lf is not None and bn is rec.bn and ctx.nhwc is not True
        z, bsaved = _bn_fwd_train(h, y, bn_w, bn_b, running_mean, running_var, factor, eps, bn)
        ctx.save_for_backward(*csaved, *bsaved)
        return z

    @staticmethod
    def backward(ctx, dz):
        saved = ctx.saved_tensors
        rec = ctx.rec
        h = C.handle_for(dz.device)
        n = ctx.needs_input_grad
        lb = False
        arena = ctx.lean == 2
        if ctx.lean and tuning.torch.BLOCK_LEAN and dz.stride() == ctx.bn.pool.y_stride:
            need = tuple(n[:3])
            lb = ctx.bn.lean.get((h, need, ctx.w_dt, ctx.b_dt))
            if lb is None:  # (made once; a BLOCK_ARENA forward's tensors as views for it)
                full = _arena_saved(ctx, saved) if arena else saved
                lb = _lean_bwd_plan(h, rec, ctx.bn, full[3], full[0], full[1], need, ctx.w_dt, ctx.b_dt)
        if lb and arena:
            xt, wt, a, bw, bb, z = saved
            ap = a.data_ptr()
            lf = rec.lean
            p = (ap + lf.o_xc if xt is None else xt.data_ptr(), ap + lf.o_wc if wt is None else wt.data_ptr(),
                 ap + lf.o_y, ap + lf.o_buf, ap + lf.o_yb, z.data_ptr(), bw, bb, xt, wt)
            dx, dw, db, dbn_w, dbn_b = _block_bwd_lean(ctx, h, dz, lb, p)
        elif lb:
            xc, wc, _, x, bw, bb, buf, y, z = saved
            p = (xc.data_ptr(), wc.data_ptr(), x.data_ptr(), buf.data_ptr(), y.data_ptr(), z.data_ptr(), bw, bb, xc,
                 wc)
            dx, dw, db, dbn_w, dbn_b = _block_bwd_lean(ctx, h, dz, lb, p)
        else:
            if arena:  # (the general path on the arena's tensors as views)
                saved = _arena_saved(ctx, saved)
            dy, dbn_w, dbn_b = _bn_bwd_train(h, ctx.bn, saved[3:], ctx.eps, dz)
            if ctx.nhwc == 2:  # BLOCK_NHWC: dy is the NHWC output's gradient (the batch norm's input layout)
                dx, dw, db = _block_bwd_nhwc(h, rec, ctx.y_stride, saved[0], saved[1], dy, n[0], n[1],
                                             n[2] and ctx.b_dt is not None, ctx.w_dt)
            else:
                dx, dw, db = _conv_bwd(h, rec.conv, ctx.nhwc, ctx.y_stride, saved[:3], dy, n[0], n[1], n[2],
                                       ctx.b_dt is not None)
        if dw is not None and dw.dtype is not ctx.w_dt:
            dw = dw.to(ctx.w_dt)
        if db is not None and db.dtype is not ctx.b_dt:
            db = db.to(ctx.b_dt)
        if not ctx.affine:
            dbn_w = dbn_b = None
        return dx, dw, db, dbn_w, dbn_b, None, None, None, None, None


_block_apply = C.applier(ConvBatchNormFunction)


def _block_key(shape, strides, dtype, device, weight, bias, stride, padding, dilation, groups, activation, pool):
    """The record key of a conv_batch_norm call on an input of (shape, strides, dtype, device)."""
    return ("conv_bn", shape, strides, dtype, device, weight.shape, weight.stride(), weight.dtype,
            None if bias is None else bias.dtype, stride, padding, dilation, groups, activation, pool,
            _benchmark(), tuning.torch.CONV_NHWC_FWD, tuning.torch.FAST_CALLS, tuning.torch.BLOCK_NHWC)


def conv_batch_norm(x, weight, bias, stride, padding, dilation, groups, running_mean, running_var, bn_weight,
                    bn_bias, training, momentum, eps, activation=None, pool=None):
    """batch_norm(conv(x, weight, bias, ...), running_mean, ...) [+ ReLU] [+ max pool (kernel_size, stride,
    padding)]: in training with tuning.torch.FUSE_BLOCK one autograd Function (ConvBatchNormFunction), else
    (eval, the switch off, or a configuration the fused path does not take) conv() then batch_norm(), each with
    its own checks and fallbacks. Semantics of the two calls in sequence (autocast: the convolution in the
    autocast dtype, the batch norm in its input's)."""
    if training and tuning.torch.FUSE_BLOCK and running_mean is not None and running_var is not None:
        ac = C.autocast_dtype()
        if ac is not None and C.on_cuda(x):
            x = C.cast(x, ac)
        key = _block_key(x.shape, x.stride(), x.dtype, x.device, weight, bias, stride, padding, dilation, groups,
                         activation, pool)
        try:
            rec = _recs.get(key)
        except TypeError:  # list arguments: no record
            key = rec = None
        if rec is None and key is not None:
            rec = False
            if 1 <= x.dim() - 2 <= 3:
                try:
                    spec = _conv_spec(x.dim() - 2, stride, padding, dilation, groups, weight.shape[2:])
                    rec = _block_rec(x, weight, bias, spec, (bn_weight, bn_bias, running_mean, running_var),
                                     activation == "relu", pool)
                except Unsupported:
                    rec = False
            if tuning.torch.FAST_CALLS:
                _recs[key] = rec
        if rec and _bn_params_ok(rec.bn.pdt, (bn_weight, bn_bias, running_mean, running_var)):
            try:
                return _block_apply(x, weight, bias, bn_weight, bn_bias, running_mean, running_var,
                                    float(momentum), float(eps), rec)
            except pydnn.PydnnError as e:
                if not C.is_not_supported(e):
                    raise
                # conv() and batch_norm() below run it again, each recording its own fallback
    y = conv(x, weight, bias, stride, padding, dilation, groups)
    return batch_norm(y, running_mean, running_var, bn_weight, bn_bias, training, momentum, eps, activation, pool)


# ============================================================================== layer / group / RMS norm
_ndescs = {}


def _norm_desc(kind, groups, nd, eps):
    key = (kind, groups, nd, eps)
    d = _ndescs.get(key)
    if d is None:
        d = pydnn.create_norm_descriptor()
        pydnn.set_norm_descriptor(d, kind, groups, nd, eps, None)
        _ndescs[key] = d
    return d


_param_descs = {}


def _norm_param_descs(xd, nd):
    key = (xd, nd)
    r = _param_descs.get(key)
    if r is None:
        sb, st = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
        pydnn.derive_norm_param_descriptors(sb, st, xd, nd)
        r = (sb, st)
        if len(_param_descs) >= 4096:
            _param_descs.clear()
        _param_descs[key] = r
    return r


class NormFunction(torch.autograd.Function):
    """pydnn's layer / RMS / group norm (pydnn.norm_forward_training, pydnn.norm_backward). weight and bias:
    float32 tensors packed as the parameter descriptor (torch's weight shapes: normalized_shape or (C,))."""

    @staticmethod
    def forward(ctx, x, weight, bias, kind, groups, ndims, eps):
        h = C.handle_for(x.device)
        xd = tdesc(x)
        nd = _norm_desc(kind, groups, ndims, eps)
        sbd, std = _norm_param_descs(xd, nd)
        # as PyTorch: layer / RMS norm outputs are contiguous, group norm keeps channels_last
        y = _output_like(x, x.shape) if kind == pydnn.PYDNN_NORM_KIND_GROUP else torch.empty(
            x.shape, dtype=x.dtype, device=x.device)
        yd = tdesc(y)
        sdims = _stat_dims(x, kind, groups, ndims)
        mean = None if kind == pydnn.PYDNN_NORM_KIND_RMS else torch.empty(sdims, dtype=torch.float32, device=x.device)
        inv = torch.empty(sdims, dtype=torch.float32, device=x.device)
        w = weight if weight is not None else _ones(x, kind, groups, ndims)
        pydnn.norm_forward_training(h, nd, 1.0, 0.0, xd, x.data_ptr(), yd, y.data_ptr(), sbd, w.data_ptr(),
                                    ptr(bias), std, ptr(mean), inv.data_ptr())
        ctx.save_for_backward(x, w, bias, mean, inv)
        ctx.nd, ctx.sbd, ctx.std, ctx.has_w, ctx.xd = nd, sbd, std, weight is not None, xd
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, bias, mean, inv = ctx.saved_tensors
        h = C.handle_for(x.device)
        dy = C.same_layout(dense(dy), x)
        xd = ctx.xd  # x is the forward's: its descriptor is the forward's
        dyd = xd if dy.stride() == x.stride() else tdesc(dy)
        dx = _empty_like(x)
        dxd = xd if dx.stride() == x.stride() else tdesc(dx)
        dw = torch.empty_like(w)
        db = torch.empty_like(w) if bias is not None else None
        key = ("norm_bwd", h, ctx.nd, xd, dyd, dxd)
        nws = _sizes.get(key)
        if nws is None:
            nws = _sizes[key] = pydnn.get_norm_backward_workspace_size(h, ctx.nd, xd, dyd, dxd, ctx.sbd, ctx.std)
        ws, wsp = C.workspace(nws, x.device)
        pydnn.norm_backward(h, ctx.nd, 1.0, 0.0, 1.0, 0.0, xd, x.data_ptr(), dyd, dy.data_ptr(), dxd, dx.data_ptr(),
                            ctx.sbd, w.data_ptr(), ptr(bias), dw.data_ptr(), ptr(db), ctx.std, ptr(mean),
                            inv.data_ptr(), wsp, nws)
        return dx, (dw if ctx.has_w else None), db, None, None, None, None


def _stat_dims(x, kind, groups, ndims):
    if kind == pydnn.PYDNN_NORM_KIND_GROUP:
        return (x.shape[0], groups) + (1,) * (x.dim() - 2)
    return tuple(x.shape[:x.dim() - ndims]) + (1,) * ndims


def _ones(x, kind, groups, ndims):
    shape = (x.shape[1],) if kind == pydnn.PYDNN_NORM_KIND_GROUP else tuple(x.shape[x.dim() - ndims:])
    return torch.ones(shape, dtype=torch.float32, device=x.device)


def _norm(kind, x, groups, ndims, weight, bias, eps, torch_path, what):
    def pydnn_path():
        _check_cuda(what, x)
        if x.dtype == torch.float64:
            raise Unsupported("float64 (pydnn's norms: float32, float16, bfloat16)")
        if x.numel() == 0:
            raise Unsupported("empty input")
        for t in (weight, bias):
            if not C.on_cuda(t):
                raise Unsupported("parameters not on a CUDA device")
        w = None if weight is None else weight.float().contiguous()
        b = None if bias is None else bias.float().contiguous()
        if b is not None and w is None:
            w = _ones(x, kind, groups, ndims)
        y = NormFunction.apply(dense(x), w, b, kind, int(groups), int(ndims), float(eps))
        return y

    return _run(pydnn_path, torch_path, what)


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    ac = C.autocast_dtype()
    if ac is not None:  # as torch's autocast: layer_norm runs in float32
        x = C.cast(x, torch.float32)

    def torch_path():
        with torch.autocast("cuda", enabled=False):
            return F.layer_norm(x, normalized_shape, C.cast(weight, x.dtype), C.cast(bias, x.dtype), eps)

    if tuple(x.shape[x.dim() - len(normalized_shape):]) != normalized_shape:
        return torch_path()
    return _norm(pydnn.PYDNN_NORM_KIND_LAYER, x, 1, len(normalized_shape), weight, bias, eps, torch_path,
                 "layer_norm")


def rms_norm(x, normalized_shape, weight=None, eps=None):
    normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)

    def torch_path():
        return F.rms_norm(x, normalized_shape, weight, eps)

    if eps is None:
        eps = torch.finfo(x.dtype).eps
    if tuple(x.shape[x.dim() - len(normalized_shape):]) != normalized_shape:
        return torch_path()
    out = _norm(pydnn.PYDNN_NORM_KIND_RMS, x, 1, len(normalized_shape), weight, None, eps, torch_path, "rms_norm")
    if weight is not None and weight.dtype != x.dtype and out.dtype == x.dtype:
        # torch's rms_norm returns the promoted type of x and weight
        out = out.to(torch.promote_types(x.dtype, weight.dtype))
    return out


def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5):
    ac = C.autocast_dtype()
    if ac is not None:  # as torch's autocast: group_norm runs in float32
        x = C.cast(x, torch.float32)

    def torch_path():
        with torch.autocast("cuda", enabled=False):
            return F.group_norm(x, num_groups, C.cast(weight, x.dtype), C.cast(bias, x.dtype), eps)

    if x.dim() < 2 or x.shape[1] % num_groups:
        return torch_path()
    return _norm(pydnn.PYDNN_NORM_KIND_GROUP, x, num_groups, 1, weight, bias, eps, torch_path, "group_norm")


# =========================================================================================== activations
class ActivationFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, name):
        h = C.handle_for(x.device)
        ad = activation_desc(name)
        y = _empty_like(x)
        xd = tdesc(x)
        yd = xd if y.stride() == x.stride() else tdesc(y)
        pydnn.activation_forward(h, ad, 1.0, xd, x.data_ptr(), 0.0, yd, y.data_ptr())
        ctx.save_for_backward(x, y)
        ctx.name, ctx.descs = name, (xd, yd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, y = ctx.saved_tensors
        h = C.handle_for(x.device)
        dy = C.same_layout(dense(dy), y)
        dx = _empty_like(x)
        xd, yd = ctx.descs  # x and y are the forward's tensors: their descriptors are the forward's
        dyd = yd if dy.stride() == y.stride() else tdesc(dy)
        dxd = xd if dx.stride() == x.stride() else tdesc(dx)
        pydnn.activation_backward(h, activation_desc(ctx.name), 1.0, yd, y.data_ptr(), dyd, dy.data_ptr(), xd,
                                  x.data_ptr(), 0.0, dxd, dx.data_ptr())
        return dx, None


def activation(x, name):
    """'relu', 'gelu' (erf), 'gelu_tanh', 'silu', 'sigmoid', 'tanh' through pydnn.activation_forward."""
    def torch_path():
        return _TORCH_ACT[name](x)

    def pydnn_path():
        _check_cuda(name, x)
        if x.numel() == 0:
            raise Unsupported("empty input")
        return ActivationFunction.apply(dense(x), name)

    return _run(pydnn_path, torch_path, name)


def relu(x):
    return activation(x, "relu")


def gelu(x, approximate="none"):
    return activation(x, "gelu_tanh" if approximate == "tanh" else "gelu")


def silu(x):
    return activation(x, "silu")


def sigmoid(x):
    return activation(x, "sigmoid")


def tanh(x):
    return activation(x, "tanh")


# =============================================================================================== pooling
_pdescs = {}


def _pool_desc(mode, k, pad, st):
    key = (mode, k, pad, st)
    d = _pdescs.get(key)
    if d is None:
        d = pydnn.create_pooling_descriptor()
        pydnn.set_pooling_nd_descriptor(d, mode, pydnn.PYDNN_PROPAGATE_NAN, len(k), list(k), list(pad), list(st))
        _pdescs[key] = d
    return d


class _PoolRec:
    """A pooling call's record (tuning.torch.FAST_CALLS): what the checks found for one (x shape, strides,
    dtype, device, options): the descriptors of x and y, y's shape and strides, whether x needs a dense copy."""
    __slots__ = ("mode", "pd", "out", "y_stride", "xd", "yd", "copy")


class PoolFunction(torch.autograd.Function):
    """Window pooling (pooling_forward / pooling_backward) or adaptive average pooling (rec.pd None: the
    adaptive extension); rec: the call's _PoolRec."""

    @staticmethod
    def forward(ctx, x, rec):
        h = C.handle_for(x.device)
        y = torch.empty_strided(rec.out, rec.y_stride, dtype=x.dtype, device=x.device)
        if rec.pd is None:
            pydnn.adaptive_pooling_forward(h, rec.mode, pydnn.PYDNN_PROPAGATE_NAN, 1.0, rec.xd, x.data_ptr(), 0.0,
                                           rec.yd, y.data_ptr())
        else:
            pydnn.pooling_forward(h, rec.pd, 1.0, rec.xd, x.data_ptr(), 0.0, rec.yd, y.data_ptr())
        ctx.save_for_backward(x, y)
        ctx.rec = rec
        return y

    @staticmethod
    def backward(ctx, dy):
        x, y = ctx.saved_tensors
        rec = ctx.rec
        h = C.handle_for(x.device)
        if dy.stride() != rec.y_stride:  # (the same shape: autograd checks it)
            dy = C.same_layout(dense(dy), y)
        dx = _empty_like(x)
        xd, yd = rec.xd, rec.yd  # x and y are the forward's tensors: their descriptors are the record's
        dyd = yd if dy.stride() == rec.y_stride else tdesc(dy)
        dxd = xd if dx.stride() == x.stride() else tdesc(dx)
        if rec.pd is None:
            pydnn.adaptive_pooling_backward(h, rec.mode, pydnn.PYDNN_PROPAGATE_NAN, 1.0, yd, y.data_ptr(), dyd,
                                            dy.data_ptr(), xd, x.data_ptr(), 0.0, dxd, dx.data_ptr())
        else:
            pydnn.pooling_backward(h, rec.pd, 1.0, yd, y.data_ptr(), dyd, dy.data_ptr(), xd, x.data_ptr(), 0.0,
                                   dxd, dx.data_ptr())
        return dx, None


_pool_apply = C.applier(PoolFunction)
# call records: (op, x shape, strides, dtype, device, the call's own option arguments) -> record (FAST_CALLS)
_recs = C.BoundedDict()


def _pool_rec(x, mode, pd, out):
    """The record of a pooling call whose checks passed: y in x's memory format."""
    r = _PoolRec()
    xx = dense(x)
    r.copy = xx is not x
    y = _output_like(xx, out)
    r.mode, r.pd, r.out, r.y_stride = mode, pd, tuple(out), y.stride()
    r.xd, r.yd = tdesc(xx), tdesc(y)
    return r


def _pool_fast(key, x):
    """The output of a pooling call from its record, or None (no record: the full path)."""
    try:
        rec = _recs.get(key)
    except TypeError:  # list arguments: no record
        return None
    if rec is None:
        return None
    try:
        return _pool_apply(x.contiguous() if rec.copy else x, rec)
    except pydnn.PydnnError as e:
        if not C.is_not_supported(e):
            raise
        return None  # the full path runs it again and records the fallback


def _pool_out(n, k, p, s):
    return (n + 2 * p - k) // s + 1


def _window_pool(x, mode, k, pad, st, what, key):
    """The 2-d window pooling both max_pool2d and avg_pool2d run once their own options are accepted; the
    call's record is kept under `key` (FAST_CALLS)."""
    if x.dim() != 4:
        raise Unsupported(f"input of {x.dim()} dims (4 needed)")
    if any(2 * p > kk for p, kk in zip(pad, k)):
        raise Unsupported("padding larger than half the window (PyTorch raises)")
    _check_cuda(what, x)
    out = x.shape[:2] + tuple(_pool_out(n, kk, p, s) for n, kk, p, s in zip(x.shape[2:], k, pad, st))
    if min(out) <= 0 or x.numel() == 0:
        raise Unsupported("empty output")
    rec = _pool_rec(x, mode, _pool_desc(mode, k, pad, st), out)
    y = _pool_apply(x.contiguous() if rec.copy else x, rec)
    if tuning.torch.FAST_CALLS:
        try:
            _recs[key] = rec
        except TypeError:
            pass
    return y


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    key = ("max_pool2d", x.shape, x.stride(), x.dtype, x.device, kernel_size, stride, padding, dilation, ceil_mode,
           return_indices)
    if tuning.torch.FAST_CALLS:
        y = _pool_fast(key, x)
        if y is not None:
            return y
    k = _ntuple(kernel_size, 2)
    st = _ntuple(stride if stride not in (None, ()) else kernel_size, 2)
    pad = _ntuple(padding, 2)

    def torch_path():
        return F.max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode, return_indices)

    def pydnn_path():
        if return_indices:
            raise Unsupported("return_indices=True")
        if ceil_mode:
            raise Unsupported("ceil_mode=True")
        if _ntuple(dilation, 2) != (1, 1):
            raise Unsupported("dilation != 1")
        return _window_pool(x, pydnn.PYDNN_POOLING_MAX, k, pad, st, "max_pool2d", key)

    return _run(pydnn_path, torch_path, "max_pool2d")


def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    key = ("avg_pool2d", x.shape, x.stride(), x.dtype, x.device, kernel_size, stride, padding, ceil_mode,
           count_include_pad, divisor_override)
    if tuning.torch.FAST_CALLS:
        y = _pool_fast(key, x)
        if y is not None:
            return y
    k = _ntuple(kernel_size, 2)
    st = _ntuple(stride if stride not in (None, ()) else kernel_size, 2)
    pad = _ntuple(padding, 2)

    def torch_path():
        return F.avg_pool2d(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)

    def pydnn_path():
        if ceil_mode:
            raise Unsupported("ceil_mode=True")
        if divisor_override is not None:
            raise Unsupported("divisor_override")
        mode = (pydnn.PYDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING if count_include_pad
                else pydnn.PYDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING)
        return _window_pool(x, mode, k, pad, st, "avg_pool2d", key)

    return _run(pydnn_path, torch_path, "avg_pool2d")


def adaptive_avg_pool2d(x, output_size):
    def torch_path():
        return F.adaptive_avg_pool2d(x, output_size)

    def pydnn_path():
        if x.dim() != 4:
            raise Unsupported(f"input of {x.dim()} dims (4 needed)")
        _check_cuda("adaptive_avg_pool2d", x)
        os_ = (output_size, output_size) if isinstance(output_size, int) else tuple(output_size)
        os_ = tuple(x.shape[2 + i] if o is None else int(o) for i, o in enumerate(os_))
        if min(os_) <= 0 or x.numel() == 0:
            raise Unsupported("empty output")
        mode = pydnn.PYDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
        rec = _pool_rec(x, mode, None, tuple(x.shape[:2]) + os_)
        return _pool_apply(x.contiguous() if rec.copy else x, rec)

    return _run(pydnn_path, torch_path, "adaptive_avg_pool2d")


# =============================================================================================== dropout
class DropoutState:
    """One dropout descriptor (and its Philox states buffer) per handle (so per device: one handle each), for
    one module / call site. Keyed by the handle the descriptor was set with, not the device index: a
    descriptor set through one handle is never used with another (a test's stand-in handle, or a handle made
    after it, cannot pick up a descriptor whose states live elsewhere). The seed comes from PyTorch's
    default generator (torch.manual_seed reproduces it); pydnn advances the offset on the device per
    forward, so CUDA graph replays draw fresh masks."""

    def __init__(self):
        self.per_handle = {}

    def get(self, h, device, p):
        e = self.per_handle.get(h)
        if e is None:
            d = pydnn.create_dropout_descriptor()
            n = pydnn.dropout_get_states_size(h)
            states = torch.empty(n, dtype=torch.uint8, device=device)
            seed = int(torch.randint(0, 2 ** 62, (), dtype=torch.int64))
            pydnn.set_dropout_descriptor(d, h, p, states.data_ptr(), n, seed)
            e = [d, states, p]
            self.per_handle[h] = e
        elif e[2] != p:
            pydnn.set_dropout_descriptor(e[0], h, p, None, e[1].numel(), 0)
            e[2] = p
        return e[0]


class DropoutFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, state, p):
        h = C.handle_for(x.device)
        dd = state.get(h, x.device, p)
        y = _empty_like(x)
        xd, yd = tdesc(x), tdesc(y)
        n = _sizes.get(("dropout", xd))
        if n is None:
            n = _sizes[("dropout", xd)] = pydnn.dropout_get_reserve_space_size(xd)
        rs = torch.empty(max(n, 1), dtype=torch.uint8, device=x.device)
        pydnn.dropout_forward(h, dd, xd, x.data_ptr(), yd, y.data_ptr(), rs.data_ptr(), n)
        ctx.save_for_backward(rs)
        ctx.dd, ctx.n, ctx.x_shape = dd, n, y
        return y

    @staticmethod
    def backward(ctx, dy):
        (rs,) = ctx.saved_tensors
        h = C.handle_for(dy.device)
        ref = ctx.x_shape
        dy = C.same_layout(dense(dy), ref)
        dx = _empty_like(dy)
        pydnn.dropout_backward(h, ctx.dd, tdesc(dy), dy.data_ptr(), tdesc(dx), dx.data_ptr(), rs.data_ptr(), ctx.n)
        return dx, None, None


_functional_dropout_state = DropoutState()


def dropout(x, p=0.5, training=True, state=None):
    if not training or p == 0:
        return x

    def torch_path():
        return F.dropout(x, p, training)

    def pydnn_path():
        _check_cuda("dropout", x)
        if not 0 <= p <= 1:
            raise Unsupported(f"p={p}")
        if x.numel() == 0:
            raise Unsupported("empty input")
        return DropoutFunction.apply(dense(x), state or _functional_dropout_state, float(p))

    return _run(pydnn_path, torch_path, "dropout")


# =============================================================================================== softmax
class SoftmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, algo):
        h = C.handle_for(x.device)
        shape = (math.prod(x.shape[:dim]), x.shape[dim], math.prod(x.shape[dim + 1:]), 1)
        y = torch.empty_like(x, memory_format=torch.contiguous_format)
        d = C.tensor_desc(x.dtype, shape, (shape[1] * shape[2], shape[2], 1, 1))
        pydnn.softmax_forward(h, algo, pydnn.PYDNN_SOFTMAX_MODE_CHANNEL, 1.0, d, x.data_ptr(), 0.0, d, y.data_ptr())
        ctx.save_for_backward(y)
        ctx.d, ctx.algo = d, algo
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        h = C.handle_for(y.device)
        dy = dy.contiguous()
        dx = torch.empty_like(y)
        pydnn.softmax_backward(h, ctx.algo, pydnn.PYDNN_SOFTMAX_MODE_CHANNEL, 1.0, ctx.d, y.data_ptr(), ctx.d,
                               dy.data_ptr(), 0.0, ctx.d, dx.data_ptr())
        return dx, None, None


def _softmax(x, dim, dtype, log):
    if dtype is not None:
        x = x.to(dtype)
    elif C.autocast_dtype() is not None:  # as torch's autocast: softmax / log_softmax in float32
        x = C.cast(x, torch.float32)

    def torch_path():
        with torch.autocast("cuda", enabled=False):
            return (F.log_softmax if log else F.softmax)(x, dim)

    def pydnn_path():
        _check_cuda("softmax", x)
        if x.dim() == 0 or x.numel() == 0:
            raise Unsupported("empty or 0-d input")
        d = dim % x.dim()
        algo = pydnn.PYDNN_SOFTMAX_LOG if log else pydnn.PYDNN_SOFTMAX_ACCURATE
        return SoftmaxFunction.apply(x.contiguous(), d, algo)

    return _run(pydnn_path, torch_path, "log_softmax" if log else "softmax")


def softmax(x, dim, dtype=None):
    return _softmax(x, dim, dtype, False)


def log_softmax(x, dim, dtype=None):
    return _softmax(x, dim, dtype, True)


# ============================================================================================= attention
_attn_descs = {}
_attn_plans = C.BoundedDict()  # problem -> (attention descriptor, q k v o lse descriptors, workspace bytes)


def _attn_desc(hq, hkv, d, scale, mask, p, seed):
    key = (hq, hkv, d, scale, mask, p, seed)
    a = _attn_descs.get(key)
    if a is None:
        a = pydnn.create_attention_descriptor()
        pydnn.set_attention_descriptor(a, hq, hkv, d, scale, mask, p, seed)
        if len(_attn_descs) >= 1024:
            _attn_descs.clear()
        _attn_descs[key] = a
    return a


def _attn_ok(t):
    """Head dim contiguous, the other strides multiples of 8 elements, pointer 16-byte aligned."""
    s = t.stride()
    return s[3] == 1 and s[0] % 8 == 0 and s[1] % 8 == 0 and s[2] % 8 == 0 and t.data_ptr() % 16 == 0


def _attn_in(t):
    return t if _attn_ok(t) else t.contiguous()


class AttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, mask, p):
        h = C.handle_for(q.device)
        b, hq, sq, d = q.shape
        # O laid out BSHD in memory: o.transpose(1, 2).reshape(b, sq, hq * d) is then free
        o = torch.empty((b, sq, hq, d), dtype=q.dtype, device=q.device).transpose(1, 2)
        lse = torch.empty((b, hq, sq, 1), dtype=torch.float32, device=q.device)
        # one lookup per call for a problem seen before (without dropout: with it, each call draws a seed)
        pkey = (id(h), q.dtype, q.shape, q.stride(), k.shape, k.stride(), v.stride(), scale, mask) if p == 0 else None
        plan = _attn_plans.get(pkey) if pkey is not None else None
        if plan is None:
            hkv = k.shape[1]
            seed = int(torch.randint(0, 2 ** 62, (), dtype=torch.int64)) if p > 0 else 0
            ad = _attn_desc(hq, hkv, d, scale, mask, p, seed)
            qd, kd, vd, od, sd = tdesc(q), tdesc(k), tdesc(v), tdesc(o), tdesc(lse)
            key = ("attn_fwd", h, ad, qd, kd)
            n = _sizes.get(key)
            if n is None:
                n = _sizes[key] = pydnn.get_attention_forward_workspace_size(h, ad, qd, kd)
            plan = (ad, qd, kd, vd, od, sd, n)
            if pkey is not None:
                _attn_plans[pkey] = plan
        ad, qd, kd, vd, od, sd, n = plan
        ws, wsp = C.workspace(n, q.device)
        pydnn.attention_forward(h, ad, qd, q.data_ptr(), kd, k.data_ptr(), vd, v.data_ptr(), od, o.data_ptr(), sd,
                                lse.data_ptr(), None, None, wsp, n)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.ad, ctx.descs = ad, (qd, kd, vd, od, sd)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        h = C.handle_for(q.device)
        do = do if _attn_ok(do) else C.same_layout(do, o)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        if not (_attn_ok(dq) and _attn_ok(dk) and _attn_ok(dv)):
            dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
        det = 1 if torch.are_deterministic_algorithms_enabled() else 0
        qd, kd, vd, od, sd = ctx.descs  # the saved tensors are the forward's: so are their descriptors
        key = ("attn_bwd", h, ctx.ad, qd, kd)
        n = _sizes.get(key)
        if n is None:
            n = _sizes[key] = pydnn.get_attention_backward_workspace_size(h, ctx.ad, qd, kd)
        ws, wsp = C.workspace(n, q.device)
        dod = od if do.stride() == o.stride() else tdesc(do)
        dqd = qd if dq.stride() == q.stride() else tdesc(dq)
        dkd = kd if dk.stride() == k.stride() else tdesc(dk)
        dvd = vd if dv.stride() == v.stride() else tdesc(dv)
        pydnn.attention_backward(h, ctx.ad, qd, q.data_ptr(), kd, k.data_ptr(), vd, v.data_ptr(), od,
                                 o.data_ptr(), dod, do.data_ptr(), sd, lse.data_ptr(), dqd,
                                 dq.data_ptr(), dkd, dk.data_ptr(), dvd, dv.data_ptr(), None, None, det,
                                 wsp, n)
        return dq, dk, dv, None, None, None


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention on pydnn's fused attention: (B, H, S, D) inputs,
    fp16 / bf16 (autocast casts), head dim 64 or 128, no attn_mask (is_causal: top-left, as PyTorch),
    GQA with enable_gqa. The dropout mask's seed is drawn per call from PyTorch's generator (a captured
    CUDA graph replays the seed it captured)."""
    ac = C.autocast_dtype()
    q, k, v = (C.cast(t, ac) for t in (query, key, value)) if ac is not None else (query, key, value)

    def torch_path():
        kw = {"enable_gqa": enable_gqa} if enable_gqa else {}
        return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, **kw)

    def pydnn_path():
        if attn_mask is not None:
            raise Unsupported("attn_mask (only is_causal masks)")
        if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
            raise Unsupported("inputs that are not (B, H, S, D)")
        _check_cuda("sdpa", q, k, v)
        if q.dtype not in (torch.float16, torch.bfloat16):
            raise Unsupported(f"dtype {q.dtype} (fused attention: float16, bfloat16)")
        b, hq, sq, d = q.shape
        if d not in (64, 128) or k.shape[3] != d or v.shape != k.shape or k.shape[0] != b:
            raise Unsupported(f"head dim {d} / shapes {tuple(q.shape)} {tuple(k.shape)} {tuple(v.shape)} "
                              "(head dims 64, 128; v like k)")
        hkv = k.shape[1]
        if hq != hkv and (not enable_gqa or hq % hkv):
            raise Unsupported("query heads differ from key heads without enable_gqa")
        if min(sq, k.shape[2]) == 0:
            raise Unsupported("empty sequence")
        if not 0 <= dropout_p < 1:
            raise Unsupported(f"dropout_p={dropout_p}")
        sc = float(scale) if scale is not None else 1.0 / math.sqrt(d)
        mask = pydnn.PYDNN_ATTN_MASK_CAUSAL_TOP_LEFT if is_causal else pydnn.PYDNN_ATTN_MASK_NONE
        return AttentionFunction.apply(_attn_in(q), _attn_in(k), _attn_in(v), sc, mask, float(dropout_p))

    return _run(pydnn_path, torch_path, "scaled_dot_product_attention")


_linear_descs = C.BoundedDict()


def _matmul_ws(h, ad, bd, cd):
    key = ("matmul_ex", h, ad, bd, cd)  # cached descriptors: the size asked once holds (as _sizes' others)
    nws = _sizes.get(key)
    if nws is None:
        nws = _sizes[key] = pydnn.get_matmul_ex_workspace_size(h, ad, bd, cd)
    return nws


def _matmul(h, ad, a, bd, b, cd, c, nws=None):
    """c = a @ b on pydnn.matmul with the workspace it asks for (split K: a weight gradient's long K over the
    SMs), taken from PyTorch's caching allocator (capture safe); nws: that size where the caller has it."""
    if nws is None:
        nws = _matmul_ws(h, ad, bd, cd)
    if not nws:
        pydnn.matmul(h, 1.0, ad, a.data_ptr(), bd, b.data_ptr(), 0.0, cd, c.data_ptr())
        return None
    ws, wsp = C.workspace(nws, c.device)
    pydnn.matmul_ex(h, 1.0, ad, a.data_ptr(), bd, b.data_ptr(), 0.0, cd, c.data_ptr(), wsp, nws)
    return ws  # (dtype, x shape / strides, W shape / strides) -> descriptors


_splitk_plans = C.BoundedDict()


def _linear_splitk(h, x2, w):
    """(descriptors, algorithm, workspace bytes) of y = x2 W^T as a 1x1 convolution's backward filter, or None
    where it does not apply (tuning.torch.LINEAR_FWD_SPLITK): dw (M, N, 1, 1) = y, summed over K 'pixels' of
    dy = x2 seen as (1, M, K, 1) (M channels) and x = W seen as (1, N, K, 1) (N channels); both contiguous."""
    m, k = x2.shape
    n = w.shape[0]
    key = (id(h), x2.dtype, m, n, k, x2.stride(), w.stride())
    sk = _splitk_plans.get(key)
    if sk is None:
        sk = False
        if (x2.dtype in _NHWC_DTYPES and x2.is_contiguous() and w.is_contiguous() and max(m, n) <= 512
                and k >= 8 * max(m, n) and n * k < 2 ** 31 and m * k < 2 ** 31):
            dt = x2.dtype
            cx = C.tensor_desc(dt, (1, n, k, 1), (n * k, k, 1, 1))
            cdy = C.tensor_desc(dt, (1, m, k, 1), (m * k, k, 1, 1))
            cw = C.filter_desc(dt, (m, n, 1, 1), pydnn.PYDNN_TENSOR_NCHW)
            cd = _conv_desc(((1, 1), (0, 0), (1, 1), 1), dt)
            try:
                algo = _pick(pydnn.get_convolution_backward_filter_algorithm_v7(h, cx, cdy, cd, cw, 8), "split-K")
                nws = pydnn.get_convolution_backward_filter_workspace_size(h, cx, cdy, cd, cw, algo)
                sk = (cx, cdy, cd, cw, algo, nws)
            except Unsupported:
                sk = False
        _splitk_plans[key] = sk
    return sk


_dw_plans = C.BoundedDict()


def _linear_dw_splitk(h, dy, x2):
    """(descriptors, algorithm, workspace bytes) of dW = dy^T x2 as the backward filter of a 1x1 NHWC
    convolution over m 'pixels' (tuning.torch.LINEAR_DW_SPLITK), or False where it does not apply: x2 (m, k)
    is NHWC (1, m, 1, k) with k channels, dy (m, n) NHWC with n channels, dW (n, k) the KRSC filter (n, 1, 1,
    k). pydnn's wgrad algorithms split the m pixels over blocks (fp32 partials in the workspace, folded in
    order); taken where pydnn.matmul walks m in one block per output tile (matmul_ex asks no workspace: the
    GPT demo's MLP weight gradients, gemm_tc (mma.sync), 72 tiles of 128 x 256 filling 55% of an H200's SMs,
    below the wgmma and split-K thresholds). 16-bit, both contiguous, m >= 8 max(n, k)."""
    m, k = x2.shape
    n = dy.shape[1]
    key = (id(h), x2.dtype, m, n, k)
    sk = _dw_plans.get(key)
    if sk is None:
        sk = False
        if (x2.dtype in _NHWC_DTYPES and m >= 8 * max(n, k) and m * max(n, k) < 2 ** 31):
            dt = x2.dtype
            cx = C.tensor_desc(dt, (1, k, m, 1), (m * k, 1, k, k))
            cdy = C.tensor_desc(dt, (1, n, m, 1), (m * n, 1, n, n))
            cw = C.filter_desc(dt, (n, k, 1, 1), pydnn.PYDNN_TENSOR_NHWC)
            cd = _conv_desc(((1, 1), (0, 0), (1, 1), 1), dt)
            try:
                algo = _pick(pydnn.get_convolution_backward_filter_algorithm_v7(h, cx, cdy, cd, cw, 8), "dW split-K")
                nws = pydnn.get_convolution_backward_filter_workspace_size(h, cx, cdy, cd, cw, algo)
                sk = (cx, cdy, cd, cw, algo, nws)
            except (Unsupported, pydnn.PydnnError):
                sk = False
        _dw_plans[key] = sk
    return sk


_ksplit_descs = C.BoundedDict()


def _dw_ksplit(h, dy, x2, dw, dyt, xd, wdd):
    """dW = dy^T x2 as S = tuning.torch.LINEAR_DW_KSPLIT chunks of the m rows in one batched pydnn.matmul into S
    16-bit partials (S x n x k, PyTorch's allocator), then torch.sum over the chunks (float accumulation) into
    dw. True where it ran; False where it does not apply (off, not 16-bit, m < 8 max(n, k), m not a multiple of
    8 S, rows off 16-byte alignment, dW not contiguous) or where pydnn.matmul splits K itself (it asks a
    workspace for the whole-K problem): the caller's single matmul then."""
    s = tuning.torch.LINEAR_DW_KSPLIT
    if not s or s < 2:
        return False
    m, n = dy.shape
    k = x2.shape[1]
    key = (id(h), dy.dtype, m, n, k, x2.stride(), s)
    d = _ksplit_descs.get(key)
    if d is None:
        d = False
        if (dy.dtype in _NHWC_DTYPES and m >= 8 * max(n, k) and m % (8 * s) == 0 and x2.stride(1) == 1
                and x2.stride(0) % 8 == 0 and n % 8 == 0 and k % 8 == 0 and not _matmul_ws(h, dyt, xd, wdd)):
            mc = m // s
            ld = x2.stride(0)
            d = (C.tensor_desc(dy.dtype, (s, n, mc), (mc * n, 1, n)),         # dy^T chunks (column-major)
                 C.tensor_desc(dy.dtype, (s, mc, k), (mc * ld, ld, 1)),       # x2 chunks
                 C.tensor_desc(dy.dtype, (s, n, k), (n * k, k, 1)))           # the partials
        _ksplit_descs[key] = d
    if not d or not dw.is_contiguous() or (dy.data_ptr() | x2.data_ptr()) % 16:
        return False
    part = torch.empty((s, n, k), dtype=dy.dtype, device=dy.device)
    _matmul(h, d[0], dy, d[1], x2, d[2], part)
    torch.sum(part, 0, out=dw)
    return True


def _weight_grad(h, dy, x2, xd, wd=None):
    """dW (n x k) = dy^T x2 for dy (m x n, contiguous), x2 (m x k, descriptor xd), wd: dW's descriptor (None:
    made here): the 1x1 wgrad convolution (LINEAR_DW_SPLITK), the batched row split (LINEAR_DW_KSPLIT) or one
    pydnn.matmul (which splits K itself where it asks a workspace)."""
    m, n = dy.shape
    k = x2.shape[1]
    dw = torch.empty((n, k), dtype=dy.dtype, device=dy.device)
    dyt = C.tensor_desc(dy.dtype, (n, m), (1, n))
    wdd = wd if wd is not None else tdesc(dw)
    # the convolution where matmul would walk the long K whole (it asks no workspace to split it)
    sk = (_linear_dw_splitk(h, dy, x2) if tuning.torch.LINEAR_DW_SPLITK and x2.is_contiguous()
          and not (x2.data_ptr() | dy.data_ptr()) % 16 and not _matmul_ws(h, dyt, xd, wdd) else None)
    if sk:
        cx, cdy, cd, cw, algo, nws = sk
        ws, wsp = C.workspace(nws, x2.device)
        pydnn.convolution_backward_filter(h, 1.0, cx, x2.data_ptr(), cdy, dy.data_ptr(), cd, algo, wsp, nws,
                                          0.0, cw, dw.data_ptr())
    elif not _dw_ksplit(h, dy, x2, dw, dyt, xd, wdd):
        _matmul(h, dyt, dy, xd, x2, wdd, dw)
    return dw


class _LinearRec:
    """A Linear call's record (FAST_CALLS): x as 2-d (whether it needs a copy), the descriptors, the split-K
    plan (or None) and the forward's matmul workspace size."""
    __slots__ = ("flat", "xcopy", "wcopy", "d", "sk", "nws", "dt", "lean")


class _LinearLean:
    """tuning.torch.LINEAR_LEAN: the descriptors of the folded casts (weight (n, k) and bias (1, n), float32 and the
    compute dtype) and the forward's scratch layout ([the matmul's workspace | the 16-bit bias])."""
    __slots__ = ("w32d", "w16d", "b32d", "b16d", "b_off", "total")


# LINEAR_LEAN takes weights up to this many elements: it saves host time (the CNN demo's classifier, 10 x 8192),
# while transform_tensor's GPU time on large weights against Tensor.to's is not measured (the GPT demo's
# 768 x 3072 projections, a device-bound step, keep Tensor.to)
_LINEAR_LEAN_MAX = 1 << 18


def _linear_lean(w, b, dt, nws):
    if not (w.dim() == 2 and w.numel() <= _LINEAR_LEAN_MAX and w.is_contiguous() and w.dtype in C.DTYPES
            and w.dtype is not dt
            and (b is None or (b.dim() == 1 and b.is_contiguous() and b.dtype in C.DTYPES and b.dtype is not dt))):
        return None
    n, k = w.shape
    ll = _LinearLean()
    ll.w32d, ll.w16d = C.tensor_desc(w.dtype, (n, k), (k, 1)), C.tensor_desc(dt, (n, k), (k, 1))
    ll.b32d = C.tensor_desc(b.dtype, (1, n), (n, 1)) if b is not None else None
    ll.b16d = C.tensor_desc(dt, (1, n), (n, 1))
    ll.b_off = _align(nws, _LEAN_ALIGN)
    ll.total = ll.b_off + _align(n * torch.empty(0, dtype=dt).element_size(), _LEAN_ALIGN)
    return ll


def _linear_rec(h, x2, w):
    r = _LinearRec()
    r.dt = r.lean = None
    m, k = x2.shape
    n = w.shape[0]
    y = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
    key = (x2.dtype, x2.shape, x2.stride(), w.shape, w.stride())
    d = _linear_descs.get(key)
    if d is None:  # x, W^T (a column-major view of W), y (= dy's, contiguous), W (= dW's)
        d = _linear_descs[key] = (tdesc(x2), C.tensor_desc(w.dtype, (k, n), (w.stride(1), w.stride(0))),
                                  tdesc(y), tdesc(w))
    r.d = d
    r.sk = _linear_splitk(h, x2, w) if tuning.torch.LINEAR_FWD_SPLITK else None
    r.nws = _matmul_ws(h, d[0], d[1], d[2])
    return r


class LinearFunction(torch.autograd.Function):
    """y = x W^T (+ b) on pydnn.matmul(handle, alpha, aDesc, A, bDesc, B, beta, cDesc, C) (the graph API's
    public matmul; transposes are strides): forward x (M x K) @ W^T (K x N, column-major view of W);
    backward dx = dy @ W, dW = dy^T @ x (dy^T a column-major view); the bias and its gradient by PyTorch. A
    forward with few output tiles and a long K runs as a 1x1 convolution's backward filter instead
    (_linear_splitk, tuning.torch.LINEAR_FWD_SPLITK): its algorithms split K over blocks (fp32 partials,
    folded in order), where pydnn.matmul walks K with one block per output tile. rec: the call's _LinearRec."""

    @staticmethod
    def forward(ctx, x2, w, b, rec):
        h = C.handle_for(x2.device)
        ctx.w_dt = ctx.b_dt = ctx.lean = None
        has_bias, bp = b is not None, 0
        ll = rec.lean
        if (ll is not None and tuning.torch.LINEAR_LEAN and w.dtype is not rec.dt and w.is_contiguous()
                and (b is None or b.dtype is not rec.dt)):
            # LINEAR_LEAN: the casts by transform_tensor, the 16-bit bias in the workspace buffer after the
            # matmul's own workspace (asked first: _matmul's C.workspace then returns the same buffer), added by
            # pydnn.add_tensor (float math, rounded once: Tensor.add_'s value)
            ws0, sp = C.workspace(ll.total, x2.device)
            ctx.w_dt, ctx.lean = w.dtype, ll
            wl = torch.empty(w.shape, dtype=rec.dt, device=w.device)
            pydnn.transform_tensor(h, 1.0, ll.w32d, w.data_ptr(), 0.0, ll.w16d, wl.data_ptr())
            w = wl
            if b is not None:
                ctx.b_dt, bp = b.dtype, sp + ll.b_off
                pydnn.transform_tensor(h, 1.0, ll.b32d, b.data_ptr(), 0.0, ll.b16d, bp)
                b = None  # (added from bp below)
        elif rec.dt is not None:  # autocast's casts of the float32 parameters, without their autograd nodes
            if w.dtype is not rec.dt:
                ctx.w_dt, w = w.dtype, w.to(rec.dt)
            if b is not None and b.dtype is not rec.dt:
                ctx.b_dt, b = b.dtype, b.to(rec.dt)
        if rec.wcopy:
            w = w.contiguous()
        m = x2.shape[0]
        n = w.shape[0]
        y = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
        d = rec.d
        sk = rec.sk
        if sk and (x2.data_ptr() | w.data_ptr()) % 16:  # a view off 16-byte alignment: matmul's general path
            sk = None
        if sk:
            cx, cdy, cd, cw, algo, nws = sk
            ws, wsp = C.workspace(nws, x2.device)
            pydnn.convolution_backward_filter(h, 1.0, cx, w.data_ptr(), cdy, x2.data_ptr(), cd, algo, wsp, nws, 0.0,
                                              cw, y.data_ptr())
        else:
            _matmul(h, d[0], x2, d[1], w, d[2], y, rec.nws)
        if bp:
            pydnn.add_tensor(h, 1.0, ctx.lean.b16d, bp, 1.0, d[2], y.data_ptr())
        elif b is not None:
            y.add_(b)
        ctx.save_for_backward(x2, w)
        ctx.has_bias, ctx.descs = has_bias, d
        return y

    @staticmethod
    def backward(ctx, dy):
        x2, w = ctx.saved_tensors
        h = C.handle_for(x2.device)
        dy = dy.contiguous()
        m, n = dy.shape
        k = x2.shape[1]
        xd, _, yd, wd = ctx.descs  # dy is contiguous (m, n) as y; x2, w are the forward's tensors
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = torch.empty((m, k), dtype=x2.dtype, device=x2.device)
            _matmul(h, yd, dy, wd, w, xd if x2.is_contiguous() else tdesc(dx), dx)
        if ctx.needs_input_grad[1]:
            dw = _weight_grad(h, dy, x2, xd, wd if w.is_contiguous() else None)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy.sum(0)
        ll = ctx.lean
        if dw is not None and ctx.w_dt is not None:
            if ll is not None and dw.is_contiguous():  # (LINEAR_LEAN: the cast back by transform_tensor)
                d32 = torch.empty(dw.shape, dtype=ctx.w_dt, device=dw.device)
                pydnn.transform_tensor(h, 1.0, ll.w16d, dw.data_ptr(), 0.0, ll.w32d, d32.data_ptr())
                dw = d32
            else:
                dw = dw.to(ctx.w_dt)
        if db is not None and ctx.b_dt is not None:
            if ll is not None and db.is_contiguous():
                d32 = torch.empty(db.shape, dtype=ctx.b_dt, device=db.device)
                pydnn.transform_tensor(h, 1.0, ll.b16d, db.data_ptr(), 0.0, ll.b32d, d32.data_ptr())
                db = d32
            else:
                db = db.to(ctx.b_dt)
        return dx, dw, db, None


_linear_apply = C.applier(LinearFunction)


def _linear_key(shape, strides, dtype, device, weight, bias, fold):
    """The record key of a linear call on an input of (shape, strides, dtype, device) (fold: FOLD_CASTS' dtype)."""
    return ("linear", shape, strides, dtype, device, weight.shape, weight.stride(), weight.dtype, weight.device,
            None if bias is None else (bias.dtype, bias.device), tuning.torch.LINEAR_FWD_SPLITK, fold)


def _linear_fold(x, weight, bias, ac):
    """The dtype LinearFunction casts the parameters to under autocast (tuning.torch.FOLD_CASTS), or None."""
    if (ac is not None and tuning.torch.FOLD_CASTS and weight.dtype in C.DTYPES and weight.dtype is not ac
            and (bias is None or bias.dtype in C.DTYPES) and C.on_cuda(weight, bias)):
        return ac
    return None


def linear(x, weight, bias=None):
    """F.linear on pydnn.matmul when this pydnn has the public matmul (the graph API's; checked with
    hasattr) and pydnn.torch.linear_on_pydnn is true; otherwise PyTorch's F.linear (cuBLAS), which is not
    counted as a fallback. Autocast casts as PyTorch's (linear runs in the autocast dtype)."""
    if not hasattr(pydnn, "matmul") or not getattr(sys.modules.get("pydnn.torch"), "linear_on_pydnn", True):
        return F.linear(x, weight, bias)
    ac = C.autocast_dtype()
    sw = tuning.torch
    fold = None  # the dtype the Function casts the parameters to (tuning.torch.FOLD_CASTS)
    if ac is not None and C.on_cuda(x):
        x = C.cast(x, ac)
        fold = _linear_fold(x, weight, bias, ac)
        if fold is None:
            weight, bias = C.cast(weight, ac), C.cast(bias, ac)
    fast = sw.FAST_CALLS
    if fast:
        key = _linear_key(x.shape, x.stride(), x.dtype, x.device, weight, bias, fold)
        rec = _recs.get(key)
        if rec is not None:
            try:
                x2 = x if not rec.flat else x.reshape(-1, x.shape[-1])
                y = _linear_apply(x2.contiguous() if rec.xcopy else x2, weight, bias, rec)
                return y.view(*x.shape[:-1], weight.shape[0]) if rec.flat else y
            except pydnn.PydnnError as e:
                if not C.is_not_supported(e):
                    raise
                # the full path below runs it again and records the fallback

    def torch_path():
        if fold is not None:
            return F.linear(x, C.cast(weight, fold), C.cast(bias, fold))
        return F.linear(x, weight, bias)

    def pydnn_path():
        # (folded casts: the checks and plans on the parameters as the Function casts them)
        wc = weight if fold is None else torch.empty_like(weight, dtype=fold)
        _check_cuda("linear", x, wc, bias if fold is None or bias is None else bias.to(fold))
        if x.dtype == torch.float64:
            raise Unsupported("float64 (pydnn.matmul: float32, float16, bfloat16)")
        if x.dim() == 0 or x.numel() == 0 or weight.dim() != 2:
            raise Unsupported("empty or 0-d input")
        flat = x.dim() != 2
        x2 = x.reshape(-1, x.shape[-1]) if flat else x
        xcopy = x2.stride(-1) != 1 or (x2.shape[0] > 1 and x2.stride(0) < x2.shape[1])
        if xcopy:
            x2 = x2.contiguous()
        w = wc.contiguous()
        rec = _linear_rec(C.handle_for(x2.device), x2, w)
        rec.flat, rec.xcopy, rec.wcopy, rec.dt = flat, xcopy, w is not wc, fold
        if fold is not None:
            rec.lean = _linear_lean(weight, bias, fold, max(rec.nws, rec.sk[5] if rec.sk else 0))
        y = _linear_apply(x2, weight, bias, rec)
        if fast:
            _recs[key] = rec
        return y.view(*x.shape[:-1], weight.shape[0]) if flat else y

    return _run(pydnn_path, torch_path, "linear")


# ------------------------------------------------------------------ Linear -> GELU -> Linear, fused (FUSE_MLP)
_mlp_graphs = C.BoundedDict()


def _mlp_graph_pair(h, dt, m, k, n, k2, approx):
    """The two graphs of a fused MLP y = act(x W1^T) W2^T (x m x k, W1 n x k, W2 k2 x n; act GELU, erf or
    tanh), built once per handle and shape on the graph API's fusion engine:
      forward:  hpre = x @ W1^T and a = act(hpre), both written by one GEMM launch (the activation in its
                epilogue, from the float accumulator);
      backward: dh = act'(hpre) * (dy @ W2), one GEMM launch (the activation's gradient in the epilogue).
    Returns ((graph, tensors), (graph, tensors)); raises PydnnError / Unsupported where they do not build."""
    key = (id(h), dt, m, k, n, k2, approx)
    got = _mlp_graphs.get(key)
    if got is None:
        _mlp_graphs[key] = False  # a shape whose graphs fail does not try again
        got = _mlp_graphs[key] = _mlp_build(h, dt, m, k, n, k2, approx)
    if got is False:
        raise Unsupported("the fused MLP's graphs do not build for this shape")
    return got


def _mlp_build(h, dt, m, k, n, k2, approx):
    from pydnn.graph.frontend import Graph
    io = _PD_TYPES[dt]
    kw = dict(io_data_type=io, intermediate_data_type=pydnn.PYDNN_DATA_FLOAT,
              compute_data_type=pydnn.PYDNN_DATA_FLOAT, handle=h)
    g = Graph(**kw)
    x = g.tensor(name="x", dim=[1, m, k], stride=[m * k, k, 1])
    w1t = g.tensor(name="w1t", dim=[1, k, n], stride=[k * n, 1, k])     # W1 (n x k, row-major) as k x n
    hpre = g.matmul(x, w1t)
    hpre.set_output(True)
    a = (g.gelu_approx_tanh(hpre) if approx == "tanh" else g.gelu(hpre)).set_output(True)
    _build_fused(g)
    fwd = (g, x, w1t, hpre, a)
    g = Graph(**kw)
    dy = g.tensor(name="dy", dim=[1, m, k2], stride=[m * k2, k2, 1])
    w2 = g.tensor(name="w2", dim=[1, k2, n], stride=[k2 * n, n, 1])       # W2 (k2 x n, row-major)
    hp = g.tensor(name="hpre", dim=[1, m, n], stride=[m * n, n, 1])
    da = g.matmul(dy, w2)
    dh = (g.gelu_approx_tanh_backward(hp, da) if approx == "tanh" else g.gelu_backward(hp, da)).set_output(True)
    _build_fused(g)
    return fwd, (g, dy, w2, hp, dh)


_PD_TYPES = {torch.float16: pydnn.PYDNN_DATA_HALF, torch.bfloat16: pydnn.PYDNN_DATA_BFLOAT16}


def _build_fused(g):
    """Plans on the fusion engine only (one launch): a graph it does not take is NOT_SUPPORTED here, so the
    MLP runs unfused rather than node by node."""
    g.build_operation_graph().create_execution_plans([pydnn.PYDNN_HEUR_MODE_A]).check_support()
    g.build_plans()
    if g.engine_index() != 1 or g.launches() != 1:
        raise Unsupported(f"the graph API planned {g.launches()} launches on engine {g.engine_index()}")


class MlpFunction(torch.autograd.Function):
    """y = act(x2 W1^T) W2^T (no biases; act GELU, approximate 'none' or 'tanh') in three GEMM launches
    forward and four backward instead of three + one activation and four + one: the activation runs in the
    first GEMM's epilogue (which writes both the pre-activation, kept for the backward, and its activation) and
    its gradient in the epilogue of the backward's dy @ W2 (tuning.torch.FUSE_MLP). The second GEMM, dX and
    the weight gradients are the Linear's (pydnn.matmul, _weight_grad)."""

    @staticmethod
    def forward(ctx, x2, w1, w2, approx):
        h = C.handle_for(x2.device)
        m, k = x2.shape
        n, k2 = w1.shape[0], w2.shape[0]
        (g, tx, tw, th, ta), _ = _mlp_graph_pair(h, x2.dtype, m, k, n, k2, approx)
        hpre = torch.empty((m, n), dtype=x2.dtype, device=x2.device)
        a = torch.empty_like(hpre)
        g.execute({tx: x2.data_ptr(), tw: w1.data_ptr(), th: hpre.data_ptr(), ta: a.data_ptr()}, 0, handle=h)
        y = torch.empty((m, k2), dtype=x2.dtype, device=x2.device)
        dt = x2.dtype
        ad = C.tensor_desc(dt, (m, n), (n, 1))
        _matmul(h, ad, a, C.tensor_desc(dt, (n, k2), (1, n)), w2, C.tensor_desc(dt, (m, k2), (k2, 1)), y)
        ctx.save_for_backward(x2, w1, w2, hpre, a)
        ctx.approx = approx
        return y

    @staticmethod
    def backward(ctx, dy):
        x2, w1, w2, hpre, a = ctx.saved_tensors
        h = C.handle_for(x2.device)
        dy = dy.contiguous()
        m, k = x2.shape
        n, k2 = w1.shape[0], w2.shape[0]
        dt = x2.dtype
        _, (g, tdy, tw2, th, tdh) = _mlp_graph_pair(h, dt, m, k, n, k2, ctx.approx)
        dh = torch.empty((m, n), dtype=dt, device=dy.device)
        g.execute({tdy: dy.data_ptr(), tw2: w2.data_ptr(), th: hpre.data_ptr(), tdh: dh.data_ptr()}, 0, handle=h)
        dx = dw1 = dw2 = None
        hd = C.tensor_desc(dt, (m, n), (n, 1))
        xd = C.tensor_desc(dt, (m, k), (k, 1))
        if ctx.needs_input_grad[2]:
            dw2 = _weight_grad(h, dy, a, hd)
        if ctx.needs_input_grad[0]:
            dx = torch.empty((m, k), dtype=dt, device=dy.device)
            _matmul(h, hd, dh, C.tensor_desc(dt, (n, k), (k, 1)), w1, xd, dx)
        if ctx.needs_input_grad[1]:
            dw1 = _weight_grad(h, dh, x2, xd)
        return dx, dw1, dw2, None


_mlp_apply = C.applier(MlpFunction)


def mlp(x, w1, w2, approximate="none"):
    """linear(gelu(linear(x, w1), approximate), w2) without biases, fused where tuning.torch.FUSE_MLP is on and
    the graph API's fusion engine takes both graphs (16-bit, CUDA, contiguous 16-byte aligned rows); otherwise
    the three calls (pydnn.torch's linear and gelu: the same result)."""
    ac = C.autocast_dtype()
    if ac is not None and C.on_cuda(x):
        x, w1, w2 = C.cast(x, ac), C.cast(w1, ac), C.cast(w2, ac)

    def unfused():
        return linear(gelu(linear(x, w1), approximate), w2)

    if not (tuning.torch.FUSE_MLP and hasattr(pydnn, "matmul") and x.dtype in _PD_TYPES and x.dim() >= 2
            and w1.dtype == x.dtype and w2.dtype == x.dtype and w1.dim() == 2 and w2.dim() == 2
            and w1.shape[1] == x.shape[-1] and w2.shape[1] == w1.shape[0] and x.numel()
            and all(v % 8 == 0 for v in (x.shape[-1], w1.shape[0], w2.shape[0])) and C.on_cuda(x, w1, w2)):
        return unfused()
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    w1c, w2c = w1.contiguous(), w2.contiguous()
    if (x2.data_ptr() | w1c.data_ptr() | w2c.data_ptr()) % 16:
        return unfused()
    try:
        y = _mlp_apply(x2, w1c, w2c, "tanh" if approximate == "tanh" else "none")
    except Unsupported:
        return unfused()
    except pydnn.PydnnError as e:
        if not C.is_not_supported(e):
            raise
        return unfused()
    return y.view(*x.shape[:-1], w2.shape[0])


# ============================================================ a Sequential's fused stages, one node (FUSE_CHAIN)
# Why: each autograd Function costs its apply and its backward node (C++ -> Python, the saved tensors' unpack, the
# returned gradients' checks: ~9 + ~25 us a Function on the 2-core dev CPU, measured with trivial bodies), and each
# module call of nn.Sequential ~1.5 us; the CNN demo's step had three Functions and ten module calls.
class _Sub:
    """The ctx a stage's Function body runs with inside ChainFunction: its attributes, its saved tensors and the
    needs_input_grad of its own arguments."""

    def __init__(self, needs):
        self.needs_input_grad, self.saved_tensors = needs, ()

    def save_for_backward(self, *ts):
        self.saved_tensors = ts


_ST_BLOCK, _ST_FLAT, _ST_LINEAR = 0, 1, 2


class ChainFunction(torch.autograd.Function):
    """A Sequential's stages (conv + batch norm blocks, a flatten, a Linear) in one autograd node: each stage's
    forward and backward are ConvBatchNormFunction's / LinearFunction's own bodies run on a _Sub ctx, their saved
    tensors saved together. plan: [(stage kind, record, number of tensor arguments, (factor, eps) or None)]."""

    @staticmethod
    def forward(ctx, plan, x, *ts):
        need = ctx.needs_input_grad
        hneed = need[1]
        subs, saved, counts = [], [], []
        h, i = x, 0
        for kind, rec, n, extra in plan:
            ni = need[2 + i:2 + i + n]
            if kind == _ST_BLOCK:
                s = _Sub((hneed,) + ni + (False, False, False))
                h = ConvBatchNormFunction.forward(s, h, *ts[i:i + n], extra[0], extra[1], rec)
            elif kind == _ST_FLAT:
                s = _Sub(None)
                s.shape = h.shape
                h = h.flatten(1)
            else:
                s = _Sub((hneed,) + ni + (False,))
                x2 = h.contiguous() if rec.xcopy else h
                h = LinearFunction.forward(s, x2, *ts[i:i + n], rec)
            i += n
            hneed = hneed or any(ni)
            subs.append(s)
            saved.extend(s.saved_tensors)
            counts.append(len(s.saved_tensors))
        ctx.save_for_backward(*saved)
        ctx.subs, ctx.counts, ctx.kinds = subs, counts, [p[0] for p in plan]
        return h

    @staticmethod
    def backward(ctx, g):
        saved = ctx.saved_tensors
        j = len(saved)
        grads = []
        for s, n, kind in zip(reversed(ctx.subs), reversed(ctx.counts), reversed(ctx.kinds)):
            s.saved_tensors = saved[j - n:j]
            j -= n
            if kind == _ST_BLOCK:
                r = ConvBatchNormFunction.backward(s, g)
                g = r[0]
                grads.append(r[1:7])
            elif kind == _ST_FLAT:
                g = g.view(s.shape) if g is not None else None
            else:
                r = LinearFunction.backward(s, g)
                g = r[0]
                grads.append(r[1:3])
            s.saved_tensors = ()
        out = [None, g]
        for gs in reversed(grads):
            out.extend(gs)
        return tuple(out)


_chain_apply = C.applier(ChainFunction)


def chain(seq, x, chain_stages):
    """seq's forward in training as one ChainFunction, or None where it does not apply (the caller runs the
    Sequential's own forward); chain_stages: pydnn.torch.modules.chain_stages (passed in: this module does not
    import the modules that import it). Each stage's record must exist (the first call of a shape goes module by
    module and makes them) and take the fused path, no child may have hooks, x must be a dense CUDA tensor. The
    stages' side effects (num_batches_tracked) happen only once the chain is sure to run."""
    mods = tuple(seq._modules.values())
    cached = seq.__dict__.get("_chain")
    if cached is None or len(cached[0]) != len(mods) or any(a is not b for a, b in zip(cached[0], mods)):
        cached = seq.__dict__["_chain"] = (mods, chain_stages(mods))
    stages = cached[1]
    if stages is None or not tuning.torch.FAST_CALLS or not C.on_cuda(x):
        return None
    mn = torch.nn.modules.module
    if (mn._global_forward_hooks or mn._global_forward_pre_hooks or mn._global_backward_hooks
            or mn._global_backward_pre_hooks):
        return None
    for m in mods:  # (a hooked child's hook would not run inside the chain)
        if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks:
            return None
    ac = C.autocast_dtype()
    if ac is not None:
        x = C.cast(x, ac)
    shape, strides, dtype, dev = x.shape, x.stride(), x.dtype, x.device
    plan, ts, bns = [], [], []
    for kind, m, bn in stages:
        if kind == _ST_BLOCK:
            if not (bn.training and tuning.torch.FUSE_BLOCK):
                return None
            p, q, bb = m._parameters, bn._parameters, bn._buffers
            w, b, bw, bb_ = p.get("weight"), p.get("bias"), q.get("weight"), q.get("bias")
            rm, rv = bb.get("running_mean"), bb.get("running_var")
            if w is None or rm is None or rv is None or not bn.track_running_stats:
                return None
            try:
                rec = _recs.get(_block_key(shape, strides, dtype, dev, w, b, m.stride, m.padding, m.dilation,
                                           m.groups, getattr(bn, "activation", None), bn.__dict__.get("pool")))
            except TypeError:
                return None
            if not rec or rec.bn.pool is None:
                return None
            pdt = rec.bn.pdt
            for t in (bw, bb_, rm, rv):  # (_bn_params_ok's checks; on_cuda once for the chain, below)
                if t is not None and (t.dtype != pdt or not t.is_contiguous()):
                    return None
            plan.append([_ST_BLOCK, rec, 6, bn])
            ts += (w, b, bw, bb_, rm, rv)
            pr = rec.bn.pool
            shape, strides, dtype = torch.Size(pr.out), pr.y_stride, rec.dt
        elif kind == _ST_FLAT:
            if len(shape) < 2:
                return None
            plan.append([_ST_FLAT, None, 0, None])
            n = 1
            for d in shape[1:]:
                n *= d
            shape, strides = torch.Size((shape[0], n)), (n, 1)  # (the block's output: packed NCHW, a view)
        else:
            p = m._parameters
            w, b = p.get("weight"), p.get("bias")
            if w is None or len(shape) != 2 or not hasattr(pydnn, "matmul") or not getattr(
                    sys.modules.get("pydnn.torch"), "linear_on_pydnn", True):
                return None
            fold = _linear_fold(None, w, b, ac)
            if ac is not None and fold is None:
                return None  # (the casts before the Function: the module's own path)
            rec = _recs.get(_linear_key(shape, strides, dtype, dev, w, b, fold))
            if not rec or rec.flat:
                return None
            plan.append([_ST_LINEAR, rec, 2, None])
            ts += (w, b)
            shape = torch.Size((shape[0], w.shape[0]))
            strides, dtype = (w.shape[0], 1), rec.dt if rec.dt is not None else dtype
    if not C.on_cuda(*ts):
        return None
    for st in plan:  # sure to run: the batch norms' counters and factors (as _BatchNormMixin._bn_state)
        if st[0] == _ST_BLOCK:
            bn = st[3]
            _, _, _, factor = bn._bn_state()
            st[3] = (float(factor), float(bn.eps))
    try:
        return _chain_apply(plan, x, *ts)
    except pydnn.PydnnError as e:
        if not C.is_not_supported(e):
            raise
        fallback(f"chain: {e} (the Sequential module by module)")
        for kind, m, bn in stages:  # (the module path counts them again)
            nbt = bn._buffers.get("num_batches_tracked") if kind == _ST_BLOCK else None
            if nbt is not None:
                nbt.sub_(1)
        return None
