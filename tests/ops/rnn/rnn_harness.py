"""One RNN case end to end (descriptors, weights written through GetRNNWeightParams, RNNForward in
TRAINING and INFERENCE, RNNBackwardData_v8, RNNBackwardWeights_v8 in ADD mode) checked against the
float64 reference (pydnn/reference/rnn.py). Every output is poisoned (NaN bytes) first, the weight space
too (so a part the layout misses shows up as NaN), and x / dy padding positions hold NaN (never read).

The device is an object with alloc(nbytes) -> poisoned address, write(ptr, array), read(ptr, n, dtype),
sync(): tests/ops/rnn/rnn_emulator.py's CPU emulation or GpuDevice below."""
import os
from dataclasses import dataclass, field

import numpy as np

import pydnn
from pydnn import enums as E
from pydnn.reference import dtypes as rd
from pydnn.reference import rnn as R
from pydnn.tensor import DTYPES

POISON = 0xFF
# (rtol, atol relative to the largest reference magnitude) per data type: the recurrence rounds h to the
# data type every step, and the 16-bit GEMMs round their outputs. double: 100x pydnn/reference/dtypes.py's
# (1e-12, 1e-14) for the recurrence (every step's error carried on) and the GEMMs' different summation order
TOL = {E.PYDNN_DATA_FLOAT: (2e-4, 2e-5), E.PYDNN_DATA_HALF: (2e-2, 4e-3), E.PYDNN_DATA_BFLOAT16: (6e-2, 2.5e-2),
       E.PYDNN_DATA_DOUBLE: (1e-10, 1e-12)}


@dataclass
class Case:
    cell: int = E.PYDNN_LSTM
    layers: int = 1
    dirs: int = 1
    hidden: int = 8
    input_size: int = 5
    proj: int = 0            # projSize < hidden (LSTM) or 0: none
    skip: bool = False
    bias_mode: int = E.PYDNN_RNN_DOUBLE_BIAS
    dtype: int = E.PYDNN_DATA_FLOAT
    layout: int = E.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED
    lengths: tuple = (4, 3, 4)
    T: int = 4
    clip: tuple = None
    fill: float = None
    states: bool = True      # hx / cx / dhy / dcy given (else NULL)
    dropout: float = 0.0     # dropout between layers (training)
    extra: dict = field(default_factory=dict)
    algo: int = E.PYDNN_RNN_ALGO_STANDARD
    weights: bool = True     # RNNBackwardWeights_v8 too (False: no matmul GEMM at all with SKIP_INPUT, 1 layer)


class GpuDevice:
    def __init__(self):
        from pydnn._cuda import driver
        self.driver, self.keep = driver, []

    def alloc(self, nbytes):
        a = pydnn.DeviceArray((max(int(nbytes), 1),), np.uint8)
        a.fill_bytes(POISON)
        self.keep.append(a)
        return a.ptr

    def write(self, ptr, arr):
        arr = np.ascontiguousarray(arr)
        if arr.nbytes:
            self.driver.memcpy_htod(ptr, arr.ctypes.data, arr.nbytes)

    def read(self, ptr, n, dt):
        self.driver.synchronize()
        out = np.empty(n, dt)
        if out.nbytes:
            self.driver.memcpy_dtoh(out.ctypes.data, ptr, out.nbytes)
        return out

    def sync(self):
        self.driver.synchronize()

    def dropout_desc(self, handle, p):
        d = pydnn.create_dropout_descriptor()
        size = pydnn.dropout_get_states_size(handle)
        pydnn.set_dropout_descriptor(d, handle, p, self.alloc(size), size, 1234)
        return d


def _store(dev, ptr, values, dtype):
    st = rd.to_storage(np.asarray(values, np.float64), dtype)
    dev.write(ptr, st)
    return rd.from_storage(st, dtype)


def _load(dev, ptr, shape, dtype):
    n = int(np.prod(shape))
    return rd.from_storage(dev.read(ptr, n, DTYPES[dtype][1]), dtype).reshape(shape)


def _close(got, ref, dtype, what):
    rtol, atol = TOL[dtype]
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape, (what, got.shape, ref.shape)
    assert not np.isnan(got).any(), f"{what}: NaN (an element left unwritten or a poisoned input read)"
    scale = max(1.0, float(np.abs(ref).max()) if ref.size else 1.0)
    err = np.abs(got - ref)
    bound = atol * scale + rtol * np.abs(ref)
    bad = err > bound
    if os.environ.get("PYDNN_RNN_TEST_VERBOSE"):
        print(f"{what}: worst err / bound {float((err / bound).max()):.3f}")
    assert not bad.any(), f"{what}: {bad.sum()} of {bad.size} off, max err {err.max():.3g} (scale {scale:.3g})"


def run_case(handle, dev, c, check_backward=True, capture=None):
    """capture: a dict that receives every output as read back (y_<mode>, hy_<mode>, cy_<mode>, dx, dhx, dcx, dw), for
    comparing two runs of one case (the same inputs: a fixed seed)."""
    dt, es = c.dtype, DTYPES[c.dtype][0]
    rng = np.random.default_rng(1234)
    T, B, I, H = c.T, len(c.lengths), c.input_size, c.hidden
    if c.skip:
        I = H
    lens = np.array(c.lengths)
    D, L = c.dirs, c.layers
    out = c.proj or H
    proj_size = c.proj or H
    r = pydnn.create_rnn_descriptor()
    drop = dev.dropout_desc(handle, c.dropout) if c.dropout else None
    pydnn.set_rnn_descriptor_v8(r, c.algo, c.cell, c.bias_mode,
                                E.PYDNN_BIDIRECTIONAL if D == 2 else E.PYDNN_UNIDIRECTIONAL,
                                E.PYDNN_SKIP_INPUT if c.skip else E.PYDNN_LINEAR_INPUT, dt, E.PYDNN_DATA_FLOAT
                                if dt != E.PYDNN_DATA_DOUBLE else dt, E.PYDNN_DEFAULT_MATH, I, H, proj_size, L,
                                drop, E.PYDNN_RNN_PADDED_IO_ENABLED)
    if c.clip:
        pydnn.rnn_set_clip_v9(r, E.PYDNN_RNN_CLIP_MINMAX, E.PYDNN_NOT_PROPAGATE_NAN, c.clip[0], c.clip[1])
    xd, yd = pydnn.create_rnn_data_descriptor(), pydnn.create_rnn_data_descriptor()
    pydnn.set_rnn_data_descriptor(xd, dt, c.layout, T, B, I, list(c.lengths), None)
    pydnn.set_rnn_data_descriptor(yd, dt, c.layout, T, B, D * out, list(c.lengths), c.fill)
    hd, cd = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(hd, dt, 3, [L * D, B, out], [B * out, out, 1])
    pydnn.set_tensor_nd_descriptor(cd, dt, 3, [L * D, B, H], [B * H, H, 1])

    # weights: random, written through GetRNNWeightParams into a poisoned weight space
    wsize = pydnn.get_rnn_weight_space_size(handle, r)
    w = dev.alloc(wsize)
    bw = c.bias_mode in (E.PYDNN_RNN_SINGLE_INP_BIAS, E.PYDNN_RNN_DOUBLE_BIAS)
    br = c.bias_mode in (E.PYDNN_RNN_SINGLE_REC_BIAS, E.PYDNN_RNN_DOUBLE_BIAS)
    ws = R.random_weights(rng, c.cell, I, H, L, D, c.proj, c.skip, bw, br)
    G = R.GATES[c.cell]
    md, bd = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
    parts = []  # (pl, key, gate, address) of every part, for reading gradients back
    for pl in range(L * D):
        for lin in range(9 if c.cell == E.PYDNN_LSTM else 2 * G):
            ma, ba = pydnn.get_rnn_weight_params(handle, r, pl, wsize, w, lin, md, bd)
            if lin == 8:
                key, k = "P", None
            else:
                key, k = ("W", lin) if lin < G else ("R", lin - G)
            arr = ws[pl][key]
            if arr is None:
                assert ma == 0 and pydnn.get_tensor_nd_descriptor(md, 3)[1] == 0
            else:
                mat = arr if k is None else arr[k]
                assert pydnn.get_tensor_nd_descriptor(md, 3)[2] == [1, *mat.shape]
                stored = _store(dev, ma, mat, dt)
                if k is None:
                    ws[pl][key] = stored
                else:
                    ws[pl][key][k] = stored
                parts.append((pl, key, k, ma - w))
            if lin == 8:
                assert ba == 0
                continue
            bkey = "bW" if lin < G else "bR"
            barr = ws[pl][bkey]
            if barr is None:
                assert ba == 0
            else:
                assert pydnn.get_tensor_nd_descriptor(bd, 3)[2] == [1, H, 1]
                barr[k] = _store(dev, ba, barr[k], dt)
                parts.append((pl, bkey, k, ba - w))
    assert sum(a.size for wd in ws for a in wd.values() if a is not None) * es == wsize

    # inputs (padding positions NaN) and outputs (poisoned)
    x_pad = rng.uniform(-1, 1, (T, B, I))
    x_user = R.to_layout(x_pad, lens, c.layout, fill=np.nan)
    xp = dev.alloc(x_user.size * es)
    x_pad = R.from_layout(_store(dev, xp, x_user, dt), lens, c.layout, T, fill=0.0)
    dlens = dev.alloc(4 * B)
    dev.write(dlens, lens.astype(np.int32))
    hbytes, cbytes = L * D * B * out * es, L * D * B * H * es
    hx = cx = None
    hxp = cxp = 0
    if c.states:
        hxp, cxp = dev.alloc(hbytes), dev.alloc(cbytes)
        hx = _store(dev, hxp, rng.uniform(-1, 1, (L * D, B, out)), dt)
        if c.cell == E.PYDNN_LSTM:
            cx = _store(dev, cxp, rng.uniform(-1, 1, (L * D, B, H)), dt)
    lstm = c.cell == E.PYDNN_LSTM
    ref_y, ref_hy, ref_cy = R.rnn_forward(c.cell, x_pad, lens, ws, L, D, H, c.proj, hx, cx, c.clip)
    valid = (np.arange(T)[:, None] < lens[None, :])[:, :, None]
    ysz = (int(lens.sum()) if c.layout == E.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED else T * B) * D * out

    results = {}
    for mode in (E.PYDNN_FWD_MODE_INFERENCE, E.PYDNN_FWD_MODE_TRAINING):
        wss, rss = pydnn.get_rnn_temp_space_sizes(handle, r, mode, xd)
        wsp, rsp = dev.alloc(wss), (dev.alloc(rss) if rss else 0)
        yp, hyp, cyp = dev.alloc(ysz * es), dev.alloc(hbytes), dev.alloc(cbytes)
        for rep in range(2 if mode == E.PYDNN_FWD_MODE_TRAINING else 1):
            if rep:  # the same call again replays its recorded launches: poison the outputs in between
                for ptr, n in ((yp, ysz * es), (hyp, hbytes), (cyp, cbytes)):
                    dev.write(ptr, np.full(n, POISON, np.uint8))
            pydnn.rnn_forward(handle, r, mode, dlens, xd, xp, yd, yp, hd, hxp, hyp, cd, cxp, cyp if lstm else 0,
                              wsize, w, wss, wsp, rss, rsp)
        dev.sync()
        y_user = _load(dev, yp, (ysz // (D * out), D * out), dt)
        y = R.from_layout(y_user.reshape(R.to_layout(np.zeros((T, B, D * out)), lens, c.layout).shape), lens,
                          c.layout, T, fill=np.nan)
        masks = None
        if c.dropout and mode == E.PYDNN_FWD_MODE_TRAINING:  # the masks this forward drew, from the reserve
            masks = _masks(dev, r, xd, rsp, c.dropout, T, B, D * out)
            ref_y, ref_hy, ref_cy = R.rnn_forward(c.cell, x_pad, lens, ws, L, D, H, c.proj, hx, cx, c.clip,
                                                  masks=masks)
        if capture is not None:
            capture[f"y_{mode}"], capture[f"hy_{mode}"] = y_user, _load(dev, hyp, (L * D, B, out), dt)
            if lstm:
                capture[f"cy_{mode}"] = _load(dev, cyp, (L * D, B, H), dt)
        _close(np.where(valid, y, 0), np.where(valid, ref_y, 0), dt, f"y (mode {mode})")
        if c.layout != E.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED:
            pad = _padding_values(y_user, lens, c.layout, T, D * out)
            if c.fill is None:
                assert np.isnan(pad).all(), "y: padding positions written without a fill"
            else:
                assert (pad == rd.from_storage(rd.to_storage(np.array(c.fill), dt), dt)).all(), "y: padding fill"
        _close(_load(dev, hyp, (L * D, B, out), dt), ref_hy, dt, f"hy (mode {mode})")
        if lstm:
            _close(_load(dev, cyp, (L * D, B, H), dt), ref_cy, dt, f"cy (mode {mode})")
        results[mode] = (wss, wsp, rss, rsp, yp)
    if not check_backward:
        return
    wss, wsp, rss, rsp, yp = results[E.PYDNN_FWD_MODE_TRAINING]
    dy_pad = rng.uniform(-1, 1, (T, B, D * out))
    dy_user = R.to_layout(dy_pad, lens, c.layout, fill=np.nan)
    dyp = dev.alloc(dy_user.size * es)
    dy_pad = R.from_layout(_store(dev, dyp, dy_user, dt), lens, c.layout, T, fill=0.0)
    dhy = dcy = None
    dhyp = dcyp = 0
    if c.states:
        dhyp, dcyp = dev.alloc(hbytes), dev.alloc(cbytes)
        dhy = _store(dev, dhyp, rng.uniform(-1, 1, (L * D, B, out)), dt)
        if lstm:
            dcy = _store(dev, dcyp, rng.uniform(-1, 1, (L * D, B, H)), dt)
    dxp, dhxp, dcxp = dev.alloc(x_user.size * es), dev.alloc(hbytes), dev.alloc(cbytes)
    pydnn.rnn_backward_data_v8(handle, r, dlens, yd, yp, dyp, xd, dxp, hd, hxp, dhyp, dhxp, cd, cxp, dcyp,
                               dcxp if lstm else 0, wsize, w, wss, wsp, rss, rsp)
    rdx, rdhx, rdcx, rdw = R.rnn_backward(c.cell, x_pad, lens, ws, L, D, H, dy_pad, dhy, dcy, c.proj, hx, cx, c.clip,
                                          masks)
    dx_user = _load(dev, dxp, x_user.shape, dt)
    dx = R.from_layout(dx_user, lens, c.layout, T, fill=0.0)
    if capture is not None:
        capture["dx"], capture["dhx"] = dx_user, _load(dev, dhxp, (L * D, B, out), dt)
        if lstm:
            capture["dcx"] = _load(dev, dcxp, (L * D, B, H), dt)
    _close(np.where(valid, dx, 0), np.where(valid, rdx, 0), dt, "dx")
    if c.layout != E.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED:
        assert (_padding_values(dx_user, lens, c.layout, T, I) == 0).all(), "dx: padding positions not 0"
    _close(_load(dev, dhxp, (L * D, B, out), dt), rdhx, dt, "dhx")
    if lstm:
        _close(_load(dev, dcxp, (L * D, B, H), dt), rdcx, dt, "dcx")
    if not c.weights:
        return
    # weights: ADD onto known values
    dw = dev.alloc(wsize)
    init = _store(dev, dw, rng.uniform(-1, 1, wsize // es), dt)
    pydnn.rnn_backward_weights_v8(handle, r, E.PYDNN_WGRAD_MODE_ADD, dlens, xd, xp, hd, hxp, yd, yp, wsize, dw, wss,
                                  wsp, rss, rsp)
    got = _load(dev, dw, (wsize // es,), dt)
    if capture is not None:
        capture["dw"] = got
    for pl, key, k, off in parts:
        ref = rdw[pl][key] if k is None else rdw[pl][key][k]
        n = ref.size
        o = off // es
        _close(got[o:o + n].reshape(ref.shape) - init[o:o + n].reshape(ref.shape), ref, dt,
               f"dweights pseudo-layer {pl} {key}[{k}]")
    if hasattr(dev, "guards_intact"):
        assert dev.guards_intact(), "a kernel wrote past a buffer"


def _masks(dev, r, xd, rsp, p, T, B, W):
    """Each layer boundary's dropout multipliers [T, B, W] (0 or 1 / (1 - p)), decoded from the mask bits
    in the reserve space (bit i & 7 of byte i >> 3 for element i of the [T * B, W] layer output)."""
    from pydnn.ops.rnn import engine
    g = engine.Geometry(r, xd)
    n = T * B * W
    out = []
    for layer in range(r.layers - 1):
        bits = dev.read(rsp + g.rs[("mask", layer)], (n + 7) // 8, np.uint8)
        keep = np.unpackbits(bits.reshape(-1, 1), axis=1)[:, ::-1].ravel()[:n].astype(bool)
        assert 0 < keep.mean() < 1 or n < 16
        out.append(np.where(keep, 1.0 / (1.0 - p), 0.0).reshape(T, B, W))
    return out


def _padding_values(user, lens, layout, T, V):
    """The values at padding positions of an unpacked user-layout array."""
    B = len(lens)
    a = user.reshape((T, B, V) if layout == E.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED else (B, T, V))
    if layout != E.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED:
        a = a.transpose(1, 0, 2)
    pad = ~(np.arange(T)[:, None] < np.asarray(lens)[None, :])
    return a[pad]



def torch_parts(mod, cell, L, dirs):
    """{(pseudo-layer, linLayerID, 'm' | 'b'): torch tensor (a view of the module's parameter)}."""
    G = {E.PYDNN_LSTM: 4, E.PYDNN_GRU: 3}.get(cell, 1)
    parts = {}
    for layer in range(L):
        for d in range(dirs):
            sfx = f"l{layer}" + ("_reverse" if d else "")
            pl = layer * dirs + d
            w_ih, w_hh = getattr(mod, f"weight_ih_{sfx}"), getattr(mod, f"weight_hh_{sfx}")
            b_ih, b_hh = getattr(mod, f"bias_ih_{sfx}"), getattr(mod, f"bias_hh_{sfx}")
            H = w_ih.shape[0] // G
            for k in range(G):
                parts[(pl, k, "m")] = w_ih[k * H:(k + 1) * H]
                parts[(pl, G + k, "m")] = w_hh[k * H:(k + 1) * H]
                parts[(pl, k, "b")] = b_ih[k * H:(k + 1) * H]
                parts[(pl, G + k, "b")] = b_hh[k * H:(k + 1) * H]
            if hasattr(mod, f"weight_hr_{sfx}"):
                parts[(pl, 8, "m")] = getattr(mod, f"weight_hr_{sfx}")
    return parts


def pytorch_double_case(torch, case, handle, dev):
    """A float64 PyTorch module on the CPU copied in through GetRNNWeightParams (into a poisoned weight space):
    pydnn's double path gives its y, hy, cy (training forward) and dx, dhx, dcx, every weight gradient (ADD onto
    zeros) within (1e-10, 1e-12) / (1e-9, 1e-11). case: (cell, I, H, layers, bidirectional, proj, lengths)."""
    F64 = E.PYDNN_DATA_DOUBLE  # noqa: N806
    cell, I, H, L, bi, proj, lengths = case
    dirs, out = (2 if bi else 1), proj or H
    torch.manual_seed(0)
    kw = dict(num_layers=L, bidirectional=bi, bias=True, dtype=torch.float64)
    if cell == E.PYDNN_LSTM:
        mod = torch.nn.LSTM(I, H, proj_size=proj, **kw)
    elif cell == E.PYDNN_GRU:
        mod = torch.nn.GRU(I, H, **kw)
    else:
        mod = torch.nn.RNN(I, H, nonlinearity="tanh", **kw)
    T, B = max(lengths), len(lengths)
    lens = torch.tensor(lengths, dtype=torch.int64)
    r = pydnn.create_rnn_descriptor()
    pydnn.set_rnn_descriptor_v8(r, E.PYDNN_RNN_ALGO_STANDARD, cell, E.PYDNN_RNN_DOUBLE_BIAS,
                                E.PYDNN_BIDIRECTIONAL if bi else E.PYDNN_UNIDIRECTIONAL, E.PYDNN_LINEAR_INPUT, F64, F64,
                                E.PYDNN_DEFAULT_MATH, I, H, out, L, None, E.PYDNN_RNN_PADDED_IO_ENABLED)
    wsize = pydnn.get_rnn_weight_space_size(handle, r)
    w = dev.alloc(wsize)  # poisoned: a part the copy misses reads NaN
    parts = torch_parts(mod, cell, L, dirs)
    md, bd = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
    offs = {}
    for (pl, lin, kind), tensor in parts.items():
        ma, ba = pydnn.get_rnn_weight_params(handle, r, pl, wsize, w, lin, md, bd)
        addr = ma if kind == "m" else ba
        assert addr, (pl, lin, kind)
        dev.write(addr, tensor.detach().numpy())
        offs[(pl, lin, kind)] = (addr - w) // 8
    x = torch.randn(T, B, I, dtype=torch.float64)
    hx = torch.randn(L * dirs, B, out, dtype=torch.float64) * 0.5
    cx = torch.randn(L * dirs, B, H, dtype=torch.float64) * 0.5
    xr, hr, cr = (t.clone().requires_grad_(True) for t in (x, hx, cx))
    lstm = cell == E.PYDNN_LSTM
    ty, th = mod(torch.nn.utils.rnn.pack_padded_sequence(xr, lens), (hr, cr) if lstm else hr)
    ty, _ = torch.nn.utils.rnn.pad_packed_sequence(ty, total_length=T)
    th_h = th[0] if lstm else th
    xd, yd = pydnn.create_rnn_data_descriptor(), pydnn.create_rnn_data_descriptor()
    pydnn.set_rnn_data_descriptor(xd, F64, E.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, T, B, I, list(lengths), None)
    pydnn.set_rnn_data_descriptor(yd, F64, E.PYDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, T, B, dirs * out,
                                  list(lengths), 0.0)
    hd, cd = pydnn.create_tensor_descriptor(), pydnn.create_tensor_descriptor()
    pydnn.set_tensor_nd_descriptor(hd, F64, 3, [L * dirs, B, out], [B * out, out, 1])
    pydnn.set_tensor_nd_descriptor(cd, F64, 3, [L * dirs, B, H], [B * H, H, 1])
    wss, rss = pydnn.get_rnn_temp_space_sizes(handle, r, E.PYDNN_FWD_MODE_TRAINING, xd)
    ws, rs = dev.alloc(wss), dev.alloc(rss)

    def put(t):
        p = dev.alloc(t.numel() * 8)
        dev.write(p, t.detach().numpy())
        return p

    def get(p, shape):
        return torch.from_numpy(dev.read(p, int(np.prod(shape)), np.float64).reshape(shape))

    dl = dev.alloc(4 * B)
    dev.write(dl, np.array(lengths, np.int32))
    xp, hxp, cxp = put(x), put(hx), put(cx)
    yp, hyp, cyp = dev.alloc(T * B * dirs * out * 8), dev.alloc(hx.numel() * 8), dev.alloc(cx.numel() * 8)
    pydnn.rnn_forward(handle, r, E.PYDNN_FWD_MODE_TRAINING, dl, xd, xp, yd, yp, hd, hxp, hyp, cd,
                      cxp if lstm else 0, cyp if lstm else 0, wsize, w, wss, ws, rss, rs)
    tol = dict(rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(get(yp, ty.shape), ty.detach(), **tol)
    torch.testing.assert_close(get(hyp, hx.shape), th_h.detach(), **tol)
    if lstm:
        torch.testing.assert_close(get(cyp, cx.shape), th[1].detach(), **tol)
    valid = (torch.arange(T)[:, None] < lens[None, :])[:, :, None]
    dy = torch.where(valid, torch.randn_like(ty), torch.zeros_like(ty))
    dhy, dcy = torch.randn_like(hx), torch.randn_like(cx)
    ((ty * dy).sum() + (th_h * dhy).sum() + ((th[1] * dcy).sum() if lstm else 0)).backward()
    dyp, dhyp, dcyp = put(dy), put(dhy), put(dcy)
    dxp, dhxp, dcxp = dev.alloc(x.numel() * 8), dev.alloc(hx.numel() * 8), dev.alloc(cx.numel() * 8)
    pydnn.rnn_backward_data_v8(handle, r, dl, yd, yp, dyp, xd, dxp, hd, hxp, dhyp, dhxp, cd, cxp if lstm else 0,
                               dcyp if lstm else 0, dcxp if lstm else 0, wsize, w, wss, ws, rss, rs)
    dw = dev.alloc(wsize)
    dev.write(dw, np.zeros(wsize // 8))
    pydnn.rnn_backward_weights_v8(handle, r, E.PYDNN_WGRAD_MODE_ADD, dl, xd, xp, hd, hxp, yd, yp, wsize, dw, wss, ws,
                                  rss, rs)
    g = dict(rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(torch.where(valid, get(dxp, x.shape), 0), torch.where(valid, xr.grad, 0), **g)
    torch.testing.assert_close(get(dhxp, hx.shape), hr.grad, **g)
    if lstm:
        torch.testing.assert_close(get(dcxp, cx.shape), cr.grad, **g)
    got = get(dw, (wsize // 8,))
    G = {E.PYDNN_LSTM: 4, E.PYDNN_GRU: 3}.get(cell, 1)
    for (pl, lin, kind), tensor in parts.items():
        base = tensor._base if tensor._base is not None else tensor
        tg = base.grad if lin == 8 else base.grad[(lin % G) * H:(lin % G + 1) * H]
        o = offs[(pl, lin, kind)]
        torch.testing.assert_close(got[o:o + tensor.numel()].view(tensor.shape), tg, **g,
                                   msg=lambda m: f"pseudo-layer {pl} linLayerID {lin} {kind}: {m}")
