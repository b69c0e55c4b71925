"""LSTM / GRU / RNN over pydnn's RNN family (RNNForward, RNNBackwardData_v8, RNNBackwardWeights_v8).

The modules subclass PyTorch's (constructor arguments, parameter names, state_dict keys, initialisation,
check_forward_args are PyTorch's). Weights: `flatten_parameters` (which PyTorch's RNNBase calls at
construction and after every `.to()` / `.cuda()` / `.half()`) lays the parameters out in ONE flat tensor in
pydnn's weight-space order and makes each named parameter a view into it, so a call passes that tensor as
the weight space with no copy. The layout (pydnn/ops/rnn/descriptors.py) per pseudo-layer (layer * dirs +
dir): weight_ih (G*H x in), weight_hh (G*H x out), weight_hr (out x H, LSTM with proj_size), bias_ih (G*H),
bias_hh (G*H), unpadded -- PyTorch's tensors exactly, one after the other (checked against
GetRNNWeightParams once per problem on the GPU). When the parameters are no longer views of that buffer (a
parameter replaced by assignment, a deepcopy's new storage), the weight space is concatenated per call (one
copy of the weights; logged once). Under torch.autocast the weight space is cast to the autocast dtype per
call (one cast kernel over the flat buffer; the gradient is cast back in one kernel too).

Backward: RNNBackwardData_v8 (dx, dhx, dcx), then RNNBackwardWeights_v8 adding (WGRAD_MODE_ADD) into a zeroed
flat dweight space, whose views are the parameters' gradients. PackedSequence input maps to the
SEQ_MAJOR_PACKED data layout (seqLengthArray from batch_sizes); batch_first to BATCH_MAJOR_UNPACKED.
Dropout between layers (training) is pydnn's (the dropout descriptor's counter-based masks, not PyTorch's).
"""
import logging

import torch
import torch.nn as nn
from torch.nn.utils.rnn import PackedSequence

import pydnn

from . import _core as C
from ._core import Unsupported, fallback

log = logging.getLogger("pydnn.torch")

_CELLS = {"LSTM": pydnn.PYDNN_LSTM, "GRU": pydnn.PYDNN_GRU, "RNN_TANH": pydnn.PYDNN_RNN_TANH,
          "RNN_RELU": pydnn.PYDNN_RNN_RELU}
_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}
_GPU_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

_rdescs = C.BoundedDict()    # (handle id, settings) -> RNN descriptor (never changed after it is set)
_plans = C.BoundedDict()     # (handle id, settings, data shape) -> _RNNPlan
_checked = set()             # RNN descriptors whose weight-space layout was compared with GetRNNWeightParams


def weight_order(mod):
    """The parameter names of `mod` (an nn.RNNBase) in pydnn's weight-space order."""
    names = []
    sfxs = ("", "_reverse") if mod.bidirectional else ("",)
    for layer in range(mod.num_layers):
        for s in sfxs:
            names += [f"weight_ih_l{layer}{s}", f"weight_hh_l{layer}{s}"]
            if getattr(mod, "proj_size", 0) > 0:
                names.append(f"weight_hr_l{layer}{s}")
            if mod.bias:
                names += [f"bias_ih_l{layer}{s}", f"bias_hh_l{layer}{s}"]
    return names


def layout(mod):
    """[(name, element offset, shape)] of the weight space, in order, and its element count."""
    out, off = [], 0
    for n in weight_order(mod):
        shape = tuple(getattr(mod, n).shape)
        out.append((n, off, shape))
        off += int(torch.Size(shape).numel())
    return out, off


class _RNNPlan:
    __slots__ = ("rd", "xd", "yd", "hd", "cd", "wsize", "ws_train", "rs_train", "ws_inf", "lens", "y_shape",
                 "h_shape", "c_shape", "dtype")


def _rnn_desc(h, s, dd):
    """s: (cell, bias, dirs, dtype, I, H, out, L); dd: the dropout descriptor (None: no dropout)."""
    key = (id(h), s, id(dd) if dd is not None else None)
    r = _rdescs.get(key)
    if r is None:
        cell, bias, dirs, dtype, isz, hid, out, layers = s
        r = pydnn.create_rnn_descriptor()
        pydnn.set_rnn_descriptor_v8(
            r, pydnn.PYDNN_RNN_ALGO_STANDARD, cell, pydnn.PYDNN_RNN_DOUBLE_BIAS if bias else pydnn.PYDNN_RNN_NO_BIAS,
            pydnn.PYDNN_BIDIRECTIONAL if dirs == 2 else pydnn.PYDNN_UNIDIRECTIONAL, pydnn.PYDNN_LINEAR_INPUT,
            C.DTYPES[dtype], pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DEFAULT_MATH, isz, hid, out, layers, dd,
            pydnn.PYDNN_RNN_PADDED_IO_ENABLED)
        _rdescs[key] = (r, dd)  # keeps the dropout descriptor alive with it
        return r
    return r[0]


def _plan(h, s, dd, lay, T, B, lens, device):
    key = (id(h), s, id(dd) if dd is not None else None, lay, T, B, lens)
    pl = _plans.get(key)
    if pl is not None:
        return pl
    cell, bias, dirs, dtype, isz, hid, out, layers = s
    dt = C.DTYPES[dtype]
    pl = _RNNPlan()
    pl.dtype = dtype
    pl.rd = _rnn_desc(h, s, dd)
    pl.wsize = pydnn.get_rnn_weight_space_size(h, pl.rd)
    pl.xd, pl.yd = pydnn.create_rnn_data_descriptor(), pydnn.create_rnn_data_descriptor()
    pydnn.set_rnn_data_descriptor(pl.xd, dt, lay, T, B, isz, list(lens), None)
    pydnn.set_rnn_data_descriptor(pl.yd, dt, lay, T, B, dirs * out,
                                  list(lens), None if lay == pydnn.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED else 0.0)
    pl.h_shape, pl.c_shape = (layers * dirs, B, out), (layers * dirs, B, hid)
    pl.hd = C.tensor_desc(dtype, pl.h_shape, (B * out, out, 1))
    pl.cd = C.tensor_desc(dtype, pl.c_shape, (B * hid, hid, 1))
    pl.ws_train, pl.rs_train = pydnn.get_rnn_temp_space_sizes(h, pl.rd, pydnn.PYDNN_FWD_MODE_TRAINING, pl.xd)
    pl.ws_inf, _ = pydnn.get_rnn_temp_space_sizes(h, pl.rd, pydnn.PYDNN_FWD_MODE_INFERENCE, pl.xd)
    pl.lens = torch.tensor(lens, dtype=torch.int32, device=device)
    if lay == pydnn.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED:
        pl.y_shape = (sum(lens), dirs * out)
    elif lay == pydnn.PYDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED:
        pl.y_shape = (B, T, dirs * out)
    else:
        pl.y_shape = (T, B, dirs * out)
    _plans[key] = pl
    return pl


def _check_layout(h, pl, w, offsets, gates, proj):
    """Once per RNN descriptor: the flat layout this module assumes is GetRNNWeightParams' (a RuntimeError
    otherwise: a bug, never a silent misuse of the weights). offsets: [(pseudo-layer, kind, linLayerID,
    element offset)]."""
    if id(pl.rd) in _checked:
        return
    if w.numel() * w.element_size() != pl.wsize:
        raise RuntimeError(f"pydnn.torch RNN: weight space of {w.numel() * w.element_size()} bytes, pydnn asks "
                           f"{pl.wsize}")
    base, es = w.data_ptr(), w.element_size()
    for p, kind, lin, off in offsets:
        m, b = pydnn.get_rnn_weight_params(h, pl.rd, p, pl.wsize, base, lin, None, None)
        got = m if kind == "m" else b
        if got != base + off * es:
            raise RuntimeError(f"pydnn.torch RNN: pseudo-layer {p} linLayerID {lin} ({kind}) at element "
                               f"{(got - base) // es}, the module's layout puts it at {off}")
    _checked.add(id(pl.rd))


def _aligned(n, dtype, device, zero=False):
    """n elements 256-byte aligned (pydnn's RNN spaces must be; PyTorch's CUDA allocator gives 512-byte
    aligned blocks, so on the GPU this is one allocation with no offset)."""
    es = dtype.itemsize
    pad = 256 // es
    buf = (torch.zeros if zero else torch.empty)(n + pad, dtype=dtype, device=device)
    off = (-buf.data_ptr() % 256) // es
    return buf[off:off + n]


def _space(nbytes, device):
    if not nbytes:
        return None, 0
    t = _aligned(int(nbytes), torch.uint8, device)
    return t, t.data_ptr()


def _run_forward(h, pl, training, x, hx, cx, w, lstm):
    dev = x.device
    y = torch.empty(pl.y_shape, dtype=x.dtype, device=dev)
    hy = torch.empty(pl.h_shape, dtype=x.dtype, device=dev)
    cy = torch.empty(pl.c_shape, dtype=x.dtype, device=dev) if lstm else None
    wss = pl.ws_train if training else pl.ws_inf
    ws, wsp = _space(wss, dev)
    rs = rsp = None
    if training:
        rs, rsp = _space(pl.rs_train, dev)
    pydnn.rnn_forward(h, pl.rd, pydnn.PYDNN_FWD_MODE_TRAINING if training else pydnn.PYDNN_FWD_MODE_INFERENCE,
                      pl.lens.data_ptr(), pl.xd, x.data_ptr(), pl.yd, y.data_ptr(), pl.hd, C.ptr(hx) or 0,
                      hy.data_ptr(), pl.cd if lstm else None, C.ptr(cx) or 0, C.ptr(cy) or 0, pl.wsize,
                      w.data_ptr(), wss, wsp or 0, pl.rs_train if training else 0, rsp or 0)
    return y, hy, cy, rs


class RNNFunction(torch.autograd.Function):
    """(y, hy[, cy]) = RNNForward(TRAINING); backward: RNNBackwardData_v8 then RNNBackwardWeights_v8 (ADD into
    a zeroed dweight space, whose views are the parameters' gradients). Inputs: the plan, whether the cell
    is an LSTM, the weight space w (not differentiated through: the gradients go to `params`, the views
    of it in weight-space order), x, hx, cx, the [(shape, element offset)] of params, *params."""

    @staticmethod
    def forward(ctx, pl, lstm, w, x, hx, cx, views, *params):
        h = C.handle_for(x.device)
        y, hy, cy, rs = _run_forward(h, pl, True, x, hx, cx, w, lstm)
        ctx.save_for_backward(x, hx, cx, rs)
        ctx.pl, ctx.lstm, ctx.w, ctx.views = pl, lstm, w, views
        ctx.pdtype = params[0].dtype if params else w.dtype
        return (y, hy, cy) if lstm else (y, hy)

    @staticmethod
    def backward(ctx, dy, dhy, dcy=None):
        x, hx, cx, rs = ctx.saved_tensors
        pl, lstm, w = ctx.pl, ctx.lstm, ctx.w
        h = C.handle_for(x.device)
        dev = x.device
        dy = torch.zeros(pl.y_shape, dtype=x.dtype, device=dev) if dy is None else dy.contiguous()
        dhy = None if dhy is None else dhy.contiguous()
        dcy = None if dcy is None else dcy.contiguous()
        need = ctx.needs_input_grad
        dx = torch.empty_like(x)
        dhx = torch.empty(pl.h_shape, dtype=x.dtype, device=dev) if hx is not None and need[4] else None
        dcx = torch.empty(pl.c_shape, dtype=x.dtype, device=dev) if lstm and cx is not None and need[5] else None
        ws, wsp = _space(pl.ws_train, dev)
        pydnn.rnn_backward_data_v8(h, pl.rd, pl.lens.data_ptr(), pl.yd, 0, dy.data_ptr(), pl.xd, dx.data_ptr(),
                                   pl.hd, C.ptr(hx) or 0, C.ptr(dhy) or 0, C.ptr(dhx) or 0, pl.cd if lstm else None,
                                   C.ptr(cx) or 0, C.ptr(dcy) or 0, C.ptr(dcx) or 0, pl.wsize, w.data_ptr(),
                                   pl.ws_train, wsp or 0, pl.rs_train, rs.data_ptr())
        grads = [None] * (len(need) - 7)
        if any(need[7:]):
            dw = _aligned(w.numel(), w.dtype, w.device, zero=True)
            pydnn.rnn_backward_weights_v8(h, pl.rd, pydnn.PYDNN_WGRAD_MODE_ADD, pl.lens.data_ptr(), pl.xd,
                                          x.data_ptr(), pl.hd, C.ptr(hx) or 0, pl.yd, 0, pl.wsize, dw.data_ptr(),
                                          pl.ws_train, wsp or 0, pl.rs_train, rs.data_ptr())
            if dw.dtype != ctx.pdtype:  # autocast: the parameters' own dtype, one cast of the whole space
                dw = dw.to(ctx.pdtype)
            grads = [dw[off:off + n].view(shape) if need[7 + i] else None
                     for i, (shape, off, n) in enumerate(ctx.views)]
        return (None, None, None, dx if need[3] else None, dhx, dcx, None, *grads)


class _RNNMixin:
    """forward on pydnn (PyTorch's signature and outputs); PyTorch's own forward where pydnn does not run
    the call (CPU tensors, float64, a dtype mix), the reason in pydnn.torch.fallbacks."""

    # ---------------------------------------------------------------- the flat weight space
    def flatten_parameters(self):
        """Lay the parameters out in one tensor in pydnn's weight-space order, each a view into it (as
        PyTorch's cuDNN flatten_parameters does in cuDNN's order). No-op while the module is half built or
        the parameters differ in dtype / device."""
        d = self.__dict__
        d["_pydnn_flat"] = None
        names = getattr(self, "_flat_weights_names", None)
        if not names or len(getattr(self, "_flat_weights", ())) != len(names):
            return
        ps = [getattr(self, n, None) for n in weight_order(self)]
        if any(not isinstance(p, torch.Tensor) for p in ps):
            return
        if len({(p.dtype, p.device) for p in ps}) != 1 or len({p.data_ptr() for p in ps}) != len(ps):
            return
        lay, total = layout(self)
        flat = _aligned(total, ps[0].dtype, ps[0].device)
        with torch.no_grad():
            for p, (_, off, shape) in zip(ps, lay):
                n = p.numel()
                flat[off:off + n].view(shape).copy_(p)
                p.set_(flat.untyped_storage(), flat.storage_offset() + off, shape, _contig(shape))
        d["_pydnn_flat"] = flat
        d["_pydnn_views"] = tuple((shape, off, int(torch.Size(shape).numel())) for _, off, shape in lay)

    def __setstate__(self, state):
        """Unpickling and deepcopy (whose Parameters are clones, no longer views of one buffer): the
        parameters are laid out in a flat weight space of the copy's own."""
        super().__setstate__(state)
        self.flatten_parameters()

    def _pydnn_params(self):
        return [getattr(self, n) for n in weight_order(self)]

    def _pydnn_weight_space(self, params, dtype):
        """(w, views): the flat weight space in `dtype` and [(shape, offset, numel)] of params in it. No copy
        when the parameters are still views of the flat buffer and dtype is theirs."""
        flat = self.__dict__.get("_pydnn_flat")
        views = self.__dict__.get("_pydnn_views")
        if flat is not None and len(views) == len(params):
            base, es = flat.data_ptr(), flat.element_size()
            if all(p.data_ptr() == base + off * es and p.dtype == flat.dtype and tuple(p.shape) == shape
                   for p, (shape, off, _) in zip(params, views)):
                if flat.dtype == dtype:
                    return flat, views
                w = _aligned(flat.numel(), dtype, flat.device)
                w.copy_(flat)
                return w, views
        if not self.__dict__.get("_pydnn_copy_logged"):
            self.__dict__["_pydnn_copy_logged"] = True
            log.info("pydnn.torch %s: parameters are not views of the flat weight space (replaced or copied); "
                     "the weights are concatenated per call (flatten_parameters() restores the shared buffer)",
                     type(self).__name__)
        n = sum(p.numel() for p in params)
        w = _aligned(n, dtype, params[0].device)
        with torch.no_grad():
            torch.cat([p.reshape(-1).to(dtype) for p in params], out=w)
        views, off = [], 0
        for p in params:
            views.append((tuple(p.shape), off, p.numel()))
            off += p.numel()
        return w, tuple(views)

    # ---------------------------------------------------------------- forward
    def forward(self, input, hx=None):
        what = type(self).__name__
        try:
            return self._pydnn_forward(input, hx)
        except Unsupported as e:
            fallback(f"{what}: {e}")
        except pydnn.PydnnError as e:
            if not C.is_not_supported(e):
                raise
            fallback(f"{what}: pydnn NOT_SUPPORTED: {e}")
        return super().forward(input, hx)

    def _pydnn_forward(self, input, hx):
        lstm = self.mode == "LSTM"
        packed = isinstance(input, PackedSequence)
        sorted_idx = unsorted_idx = None
        if packed:
            x, batch_sizes, sorted_idx, unsorted_idx = input
            bs = batch_sizes.tolist()
            T, B = len(bs), int(bs[0])
            lens = tuple(int(v) for v in (batch_sizes.unsqueeze(1) > torch.arange(B)).sum(0).tolist())
            lay = pydnn.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED
            unbatched = False
        else:
            x, batch_sizes = input, None
            if x.dim() not in (2, 3):
                raise Unsupported(f"input of {x.dim()} dims (PyTorch's error follows)")
            unbatched = x.dim() == 2
            if unbatched:
                x = x.unsqueeze(0 if self.batch_first else 1)
            T, B = (x.shape[1], x.shape[0]) if self.batch_first else (x.shape[0], x.shape[1])
            lens = (int(T),) * int(B)
            lay = (pydnn.PYDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED if self.batch_first
                   else pydnn.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED)
        if not C.on_cuda(x):
            raise Unsupported("tensors not on a CUDA device")
        if T == 0 or B == 0:
            raise Unsupported("empty input")
        h0 = c0 = None
        if hx is not None:
            if lstm:
                if not isinstance(hx, tuple) or len(hx) != 2:
                    raise Unsupported("hx of LSTM must be a tuple (h_0, c_0) (PyTorch's error follows)")
                h0, c0 = hx
            else:
                h0 = hx
            if unbatched:
                if h0.dim() != 2 or (c0 is not None and c0.dim() != 2):
                    raise Unsupported("unbatched input with batched hx (PyTorch's error follows)")
                h0 = h0.unsqueeze(1)
                c0 = c0.unsqueeze(1) if c0 is not None else None
            elif h0.dim() != 3 or (c0 is not None and c0.dim() != 3):
                raise Unsupported("batched input with unbatched hx (PyTorch's error follows)")
            if sorted_idx is not None:
                h0 = h0.index_select(1, sorted_idx)
                c0 = c0.index_select(1, sorted_idx) if c0 is not None else None
        # PyTorch's own argument checks (dtype, sizes, hx shapes): its exceptions, unchanged
        if h0 is None:
            self.check_input(x, batch_sizes)
        else:
            self.check_forward_args(x, (h0, c0) if lstm else h0, batch_sizes)
        params = self._pydnn_params()
        if not C.on_cuda(*params) or any(p.device != x.device for p in params):
            raise Unsupported("parameters not on the input's CUDA device")
        ac = C.autocast_dtype()
        dtype = ac if ac is not None else x.dtype
        if dtype not in _GPU_DTYPES:
            raise Unsupported(f"dtype {dtype} (pydnn's RNN on the GPU: float32, float16, bfloat16)")
        if ac is None and any(p.dtype != dtype for p in params):
            raise Unsupported(f"parameters of dtype {params[0].dtype} with input {dtype}")
        x = C.cast(x, dtype).contiguous()
        h0 = None if h0 is None else C.cast(h0, dtype).contiguous()
        c0 = None if c0 is None else C.cast(c0, dtype).contiguous()
        w, views = self._pydnn_weight_space(params, dtype)
        h = C.handle_for(x.device)
        dirs = 2 if self.bidirectional else 1
        proj = getattr(self, "proj_size", 0)
        out = proj if proj > 0 else self.hidden_size
        s = (_CELLS[self.mode], bool(self.bias), dirs, dtype, self.input_size, self.hidden_size, out, self.num_layers)
        drop = self.training and self.dropout > 0 and self.num_layers > 1
        dd = None
        if drop:
            st = self.__dict__.get("_pydnn_dropout")
            if st is None:
                from .functional import DropoutState
                st = self.__dict__["_pydnn_dropout"] = DropoutState()
            dd = st.get(h, x.device, float(self.dropout))
        pl = _plan(h, s, dd, lay, int(T), int(B), lens, x.device)
        _check_layout(h, pl, w, self._pydnn_offsets(views), _GATES[self.mode], proj > 0)
        grad = torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in params)
                                            or any(t is not None and t.requires_grad for t in (h0, c0)))
        if grad:
            outs = RNNFunction.apply(pl, lstm, w, x, h0, c0, views, *params)
            y, hy = outs[0], outs[1]
            cy = outs[2] if lstm else None
        else:
            y, hy, cy, _ = _run_forward(h, pl, drop, x, h0, c0, w, lstm)
        if packed:
            output = PackedSequence(y, batch_sizes, sorted_idx, unsorted_idx)
            if unsorted_idx is not None:
                hy = hy.index_select(1, unsorted_idx)
                cy = cy.index_select(1, unsorted_idx) if cy is not None else None
        else:
            output = y
            if unbatched:
                output = y.squeeze(0 if self.batch_first else 1)
                hy = hy.squeeze(1)
                cy = cy.squeeze(1) if cy is not None else None
        return (output, (hy, cy)) if lstm else (output, hy)

    def _pydnn_offsets(self, views):
        """[(pseudo-layer, 'm' | 'b', linLayerID, element offset)] of the parameters in weight-space order."""
        g = _GATES[self.mode]
        out, i = [], 0
        proj = getattr(self, "proj_size", 0) > 0
        for pl in range(self.num_layers * (2 if self.bidirectional else 1)):
            kinds = [("m", 0), ("m", g)] + ([("m", 8)] if proj else []) + ([("b", 0), ("b", g)] if self.bias else [])
            for kind, lin in kinds:
                out.append((pl, kind, lin, views[i][1]))
                i += 1
        return out


def _contig(shape):
    st, acc = [], 1
    for n in reversed(shape):
        st.append(acc)
        acc *= n
    return tuple(reversed(st))


class LSTM(_RNNMixin, nn.LSTM):
    """nn.LSTM on pydnn (see pydnn/torch/rnn.py): same arguments (proj_size included), parameters,
    state_dict keys, forward signature and outputs (output, (h_n, c_n))."""


class GRU(_RNNMixin, nn.GRU):
    """nn.GRU on pydnn: same arguments, parameters, state_dict keys, forward and outputs (output, h_n)."""


class RNN(_RNNMixin, nn.RNN):
    """nn.RNN (nonlinearity 'tanh' or 'relu') on pydnn: same arguments, parameters, state_dict keys, forward
    and outputs (output, h_n)."""
