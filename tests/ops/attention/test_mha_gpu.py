"""Multi-head attention with projections on the GPU. Each stage the device computes is checked against
float64 math on the exact inputs that stage consumed (read back from the reserve space / workspace, whose
layout pydnn/ops/mha.py documents), with the dtype's tolerance and the magnitude of the summed terms as the
scale: the Q / K / V projections, the attention core (pydnn/reference/attention.py), the output
projection (+ residuals, padding fill); backward: dout @ W_O, the attention gradients, the data
gradients, and every weight / bias gradient (SET, then ADD doubling it). The end-to-end error against the
float64 MHA reference (pydnn/reference/mha.py) is printed for the record. Outputs are poisoned first.
Cases: bf16 / fp16, head dims 64 / 128, ONE_TO_ONE beams and ALL_TO_ONE, three memory orders (one that
needs per-batch launches), no mask / causal top-left / bottom-right, variable lengths, biases on / off,
oProjSize 0 (heads concatenated), residuals, inference at one step and at all steps."""
import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

import pydnn
from devtensor import POISON, DevTensor, assert_close
from pydnn.ops import mha as M
from pydnn.reference import attention as RA
from pydnn.reference import dtypes as rd
from pydnn.reference import mha as R
from pydnn.tensor import DTYPES

pytestmark = pytest.mark.gpu

F16, BF16 = pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_BFLOAT16
T_, B_, M_, V_ = (pydnn.PYDNN_SEQDATA_TIME_DIM, pydnn.PYDNN_SEQDATA_BATCH_DIM, pydnn.PYDNN_SEQDATA_BEAM_DIM,
                  pydnn.PYDNN_SEQDATA_VECT_DIM)
O2O, BIAS = pydnn.PYDNN_ATTN_QUERYMAP_ONE_TO_ONE, pydnn.PYDNN_ATTN_ENABLE_PROJ_BIASES
NONE, TL, BR = (pydnn.PYDNN_ATTN_MASK_NONE, pydnn.PYDNN_ATTN_MASK_CAUSAL_TOP_LEFT,
                pydnn.PYDNN_ATTN_MASK_CAUSAL_BOTTOM_RIGHT)


class Seq:
    """A sequence data tensor: descriptor + DevTensor over its (B, M, T, V) logical view."""

    def __init__(self, rng, t, b, m, v, axes, lens, dtype, fill=None, random=True):
        self.desc = pydnn.create_seq_data_descriptor()
        dims = [0] * 4
        dims[T_], dims[B_], dims[M_], dims[V_] = t, b, m, v
        pydnn.set_seq_data_descriptor(self.desc, dtype, 4, dims, axes, b * m, list(lens), fill)
        st = self.desc.strides
        self.dev = DevTensor((b, m, t, v), dtype, (st[B_], st[M_], st[T_], 1))
        if random:
            self.dev.random(rng, -1.0, 1.0)
        self.rows = np.array([[[(bi * st[B_] + mi * st[M_] + ti * st[T_]) // v for ti in range(t)]
                               for mi in range(m)] for bi in range(b)])  # buffer row of (b, m, t)

    @property
    def ptr(self):
        return self.dev.ptr


class Case:
    def __init__(self, rng, dtype=BF16, heads=2, d=64, sizes=(48, 32, 40), o_proj=56, b=2, m=2, tq=37, tk=45,
                 one_to_one=True, biases=True, axes=(B_, M_, T_, V_), mask=NONE, lens=None, residual=False,
                 fill=None):
        self.dtype, self.h, self.d, self.mask = dtype, heads, d, mask
        mk = m if one_to_one else 1
        lq, lk = lens if lens is not None else ([tq] * (b * m), [tk] * (b * mk))
        self.lq, self.lk = np.array(lq).reshape(b, m), np.array(lk).reshape(b, mk)
        self.sm = 1.0 / np.sqrt(d)
        mode = (O2O if one_to_one else 0) | (BIAS if biases else 0)
        self.a = pydnn.create_attn_descriptor()
        pydnn.set_attn_descriptor(self.a, mode, heads, self.sm, dtype, pydnn.PYDNN_DATA_FLOAT,
                                  pydnn.PYDNN_TENSOR_OP_MATH, None, None, *sizes, d, d, d, o_proj, tq, tk, b, m)
        osize = o_proj or heads * d
        self.q = Seq(rng, tq, b, m, sizes[0], axes, lq, dtype)
        self.k = Seq(rng, tk, b, mk, sizes[1], axes, lk, dtype)
        self.v = Seq(rng, tk, b, mk, sizes[2], axes, lk, dtype)
        self.o = Seq(rng, tq, b, m, osize, axes, lq, dtype, fill=fill, random=False)
        self.do = Seq(rng, tq, b, m, osize, axes, lq, dtype)
        self.dq = Seq(rng, tq, b, m, sizes[0], axes, lq, dtype, random=False)
        self.dk = Seq(rng, tk, b, mk, sizes[1], axes, lk, dtype, random=False)
        self.dv = Seq(rng, tk, b, mk, sizes[2], axes, lk, dtype, random=False)
        self.residual = residual
        self.lens_q, self.lens_k = (pydnn.DeviceArray((len(x),), np.int32) for x in (lq, lk))
        self.lens_q.copy_from_numpy(np.array(lq, np.int32))
        self.lens_k.copy_from_numpy(np.array(lk, np.int32))
        self.handle = None
        self.lo = [0] * tq
        if mask == NONE:
            self.hi = [tk + 5] * tq
        elif mask == TL:
            self.hi = [t + 1 for t in range(tq)]
        else:
            delta = {x - y for x, y in zip(self.kv_of_q(), lq)}
            assert len(delta) == 1
            dl = delta.pop()
            self.hi = [t + 1 + dl for t in range(tq)]

    def kv_of_q(self):
        b, m = self.lq.shape
        mk = self.lk.shape[1]
        return [self.lk[bi, mi if mk > 1 else 0] for bi in range(b) for mi in range(m)]

    def setup(self, handle, rng):
        self.handle = handle
        self.wsize, self.wssize, self.rssize = pydnn.get_multi_head_attn_buffers(handle, self.a)
        item, np_t = DTYPES[self.dtype]
        self.w = pydnn.DeviceArray((self.wsize // item,), np_t)
        self.dw = pydnn.DeviceArray((self.wsize // item,), np_t)
        self.ws = pydnn.DeviceArray((max(self.wssize, 16),), np.uint8)
        self.rs = pydnn.DeviceArray((self.rssize,), np.uint8)
        for x in (self.w, self.dw, self.ws, self.rs):
            x.fill_bytes(POISON)
        host = self.w.to_numpy()
        self.weights, self.views = {}, {}
        for kind in M.KINDS:
            wd = pydnn.create_tensor_descriptor()
            addr = pydnn.get_multi_head_attn_weights(handle, self.a, kind, self.wsize, self.w.ptr, wd)
            if addr == 0:
                continue
            _, _, dims, strides = pydnn.get_tensor_nd_descriptor(wd, 3)
            off = (addr - self.w.ptr) // item
            self.views[kind] = (off, dims, strides)
            fan = dims[2] if kind in (M.QW, M.KW, M.VW) else (dims[0] * dims[2] if kind == M.OW else 4)
            vals = rng.uniform(-1, 1, dims) / np.sqrt(fan)
            stored = rd.to_storage(vals, self.dtype)
            as_strided(host[off:], dims, [s * host.itemsize for s in strides])[...] = stored
            vals = rd.from_storage(stored, self.dtype)
            self.weights[kind] = vals.reshape(vals.shape[:2]) if kind in (M.QB, M.KB, M.VB) else (
                vals.reshape(-1) if kind == M.OB else vals)
        self.w.copy_from_numpy(host)

    def forward(self, training=True, curr=-1):
        rs, rssize = (self.rs.ptr, self.rssize) if training else (None, 0)
        pydnn.multi_head_attn_forward(self.handle, self.a, curr, self.lo, self.hi, self.lens_q.ptr, self.lens_k.ptr,
                                      self.q.desc, self.q.ptr, self.q.ptr if self.residual else None, self.k.desc,
                                      self.k.ptr, self.v.desc, self.v.ptr, self.o.desc, self.o.ptr, self.wsize,
                                      self.w.ptr, self.wssize, self.ws.ptr, rssize, rs)

    def backward_data(self):
        pydnn.multi_head_attn_backward_data(self.handle, self.a, self.lo, self.hi, self.lens_q.ptr, self.lens_k.ptr,
                                            self.do.desc, self.do.ptr, self.dq.desc, self.dq.ptr, self.q.ptr,
                                            self.dk.desc, self.dk.ptr, self.k.ptr, self.dv.desc, self.dv.ptr,
                                            self.v.ptr, self.wsize, self.w.ptr, self.wssize, self.ws.ptr,
                                            self.rssize, self.rs.ptr)

    def backward_weights(self, mode):
        pydnn.multi_head_attn_backward_weights(self.handle, self.a, mode, self.q.desc, self.q.ptr, self.k.desc,
                                               self.k.ptr, self.v.desc, self.v.ptr, self.do.desc, self.do.ptr,
                                               self.wsize, self.w.ptr, self.dw.ptr, self.wssize, self.ws.ptr,
                                               self.rssize, self.rs.ptr)

    # ---- reading the device's intermediates in logical order
    def region(self, buf, off, rows_of, width):
        """(B, M, T, width) from rows laid out like `rows_of` (a Seq) at byte `off` of `buf`."""
        item = DTYPES[self.dtype][0]
        n = rows_of.rows.size * width
        raw = buf.to_numpy()[off:off + n * item].view(DTYPES[self.dtype][1])
        flat = rd.from_storage(raw, self.dtype).reshape(-1, width)
        return flat[rows_of.rows]

    def heads(self, x):
        """(B, M, T, H*D) -> (B*M, H, T, D)."""
        b, m, t, _ = x.shape
        return x.reshape(b * m, t, self.h, -1).transpose(0, 2, 1, 3)

    def unheads(self, x, b, m):
        bm, h, t, d = x.shape
        return x.transpose(0, 2, 1, 3).reshape(b, m, t, h * d)


def _proj_ref(x, w, b):
    """x (B, M, T, size) @ W^T (+ b), and its term magnitude; W (H, P, size) -> (B, M, T, H*P)."""
    wf = w.reshape(-1, w.shape[-1])
    y = x @ wf.T + (0 if b is None else b.reshape(-1))
    mag = np.abs(x) @ np.abs(wf).T + (0 if b is None else np.abs(b.reshape(-1)))
    return y, mag


def _valid_rows(case, x, lens):
    """Zero the rows past each sequence's length (padding) in a (B, M, T, ...) array."""
    x = np.array(x)
    b, m = lens.shape
    for bi in range(b):
        for mi in range(m):
            x[bi, mi, lens[bi, mi]:] = 0
    return x


def _attn_ref_inputs(c, qp, kp, vp):
    lq, lk = np.array(c.lq).reshape(-1), np.array(c.kv_of_q())
    return c.heads(qp), c.heads(kp), c.heads(vp), lq, lk


def _check_forward(c):
    """A training forward, stage by stage (the intermediates read back from the reserve space)."""
    c.o.dev.poison()
    c.forward(True)
    s = M._Sizes(c.a, c.q.dev.dims[0], c.q.dev.dims[1], c.q.dev.dims[2], c.k.dev.dims[2], c.k.dev.dims[1])
    buf, offs = c.rs, s.reserve_off
    hd = c.h * c.d
    w = c.weights
    qp, kp, vp = (c.region(buf, offs[n], seq, hd) for n, seq in (("qp", c.q), ("kp", c.k), ("vp", c.v)))
    for got, seq, wk, bk, name in ((qp, c.q, M.QW, M.QB, "Qp"), (kp, c.k, M.KW, M.KB, "Kp"), (vp, c.v, M.VW, M.VB, "Vp")):
        ref, mag = _proj_ref(seq.dev.values, w[wk], w.get(bk))
        assert_close(got, ref, c.dtype, name, scale=mag)
    q4, k4, v4, lq, lk = _attn_ref_inputs(c, qp, kp, vp)
    o_ref, lse_ref, so, _ = RA.forward(q4, k4, v4, c.sm, c.mask, lq, lk)
    b, m = c.lq.shape
    ao = c.region(buf, offs["ao"], c.q, hd)
    assert_close(c.heads(ao), o_ref, c.dtype, "attention heads", scale=so)
    out = c.o.dev.download()
    if M.OW in w:
        ref, mag = _out_ref(ao, w)
    else:
        ref, mag = c.unheads(o_ref, b, m), c.unheads(so, b, m)
    if c.residual:
        ref, mag = ref + c.q.dev.values, mag + np.abs(c.q.dev.values)
    fill = c.o.desc.fill
    if fill is not None:
        pad = _valid_rows(c, np.ones_like(ref), c.lq) == 0
        ref, mag = np.where(pad, fill, ref), np.where(pad, 0, mag)
        assert_close(out, ref, c.dtype, "out (padding filled)", scale=mag)
    else:
        assert_close(_valid_rows(c, out, c.lq), _valid_rows(c, ref, c.lq), c.dtype, "out", scale=mag)
    c.o.dev.check_untouched()
    # end to end against the float64 MHA reference (rounding the stored intermediates like the device)
    e2e, emag, _ = R.forward(c.q.dev.values, c.k.dev.values, c.v.dev.values, w, c.h, c.sm, c.lo, c.hi, c.lq, c.lk,
                             c.residual, stored=lambda x: rd.round_to(x, c.dtype))
    err = np.abs(_valid_rows(c, out, c.lq) - e2e).max()
    print(f"end-to-end forward: max |out - ref| = {err:.3g}, max |ref| = {np.abs(e2e).max():.3g}")
    return qp, kp, vp, ao, o_ref, so, lse_ref


def _out_ref(ao, w):
    wo = w[M.OW]  # (H, Po, Dv) -> [Po, H*Dv]
    wf = wo.transpose(1, 0, 2).reshape(wo.shape[1], -1)
    b = w.get(M.OB)
    return ao @ wf.T + (0 if b is None else b), np.abs(ao) @ np.abs(wf).T + (0 if b is None else np.abs(b))


def _wo_matrix(w):
    wo = w[M.OW]
    return wo.transpose(1, 0, 2).reshape(wo.shape[1], -1)


def _check_backward(c, fwd):
    qp, kp, vp, ao, _, _, _ = fwd
    for t in (c.dq, c.dk, c.dv):
        t.dev.poison()
    c.backward_data()
    s = M._Sizes(c.a, c.q.dev.dims[0], c.q.dev.dims[1], c.q.dev.dims[2], c.k.dev.dims[2], c.k.dev.dims[1])
    hd, w = c.h * c.d, c.weights
    dout = c.do.dev.values
    if M.OW in w:
        wf = _wo_matrix(w)
        dao = c.region(c.ws, 0, c.q, hd)
        assert_close(dao, dout @ wf, c.dtype, "dout @ W_O", scale=np.abs(dout) @ np.abs(wf))
        ao_in = ao
    else:
        dao, ao_in = dout, c.region(c.rs, s.reserve_off["ao"], c.q, hd)
    q4, k4, v4, lq, lk = _attn_ref_inputs(c, qp, kp, vp)
    dq4, dk4, dv4, (sdq, sdk, sdv) = RA.backward(q4, k4, v4, c.heads(dao), c.sm, c.mask, lq, lk)
    b, m = c.lq.shape
    got = {n: c.region(c.rs, s.reserve_off[n], seq, hd) for n, seq in (("dqp", c.q), ("dkp", c.k), ("dvp", c.v))}
    for n, ref, sc in (("dqp", dq4, sdq), ("dkp", dk4, sdk), ("dvp", dv4, sdv)):
        assert_close(c.heads(got[n]), ref, c.dtype, n, scale=sc)
    for seq, n, wk in ((c.dq, "dqp", M.QW), (c.dk, "dkp", M.KW), (c.dv, "dvp", M.VW)):
        wf = w[wk].reshape(-1, w[wk].shape[-1])
        assert_close(seq.dev.download(), got[n] @ wf, c.dtype, f"{n[:2]} data", scale=np.abs(got[n]) @ np.abs(wf))
        seq.dev.check_untouched()
    # weights: SET, then ADD (doubles)
    for mode, factor in ((pydnn.PYDNN_WGRAD_MODE_SET, 1), (pydnn.PYDNN_WGRAD_MODE_ADD, 2)):
        if mode == pydnn.PYDNN_WGRAD_MODE_SET:
            c.dw.fill_bytes(POISON)
        c.backward_weights(mode)
        host = c.dw.to_numpy()
        for kind, (off, dims, strides) in c.views.items():
            g = rd.from_storage(np.array(as_strided(host[off:], dims, [x * host.itemsize for x in strides])),
                                c.dtype)
            ref, mag = _wgrad_ref(c, kind, got, ao_in, dout)
            assert_close(g.reshape(ref.shape), factor * ref, c.dtype, f"dW kind {kind} x{factor}",
                         scale=factor * mag)


def _flat(seq_vals, lens, c):
    return _valid_rows(c, seq_vals, lens).reshape(-1, seq_vals.shape[-1])


def _wgrad_ref(c, kind, got, ao, dout):
    x = {M.QW: c.q, M.KW: c.k, M.VW: c.v}
    src = {M.QW: "dqp", M.KW: "dkp", M.VW: "dvp", M.QB: "dqp", M.KB: "dkp", M.VB: "dvp"}
    if kind in (M.QW, M.KW, M.VW):
        g = got[src[kind]].reshape(-1, got[src[kind]].shape[-1])
        xv = x[kind].dev.values.reshape(-1, x[kind].dev.values.shape[-1])
        return (g.T @ xv).reshape(c.h, c.d, -1), (np.abs(g).T @ np.abs(xv)).reshape(c.h, c.d, -1)
    if kind in (M.QB, M.KB, M.VB):
        g = got[src[kind]].reshape(-1, got[src[kind]].shape[-1])
        return g.sum(0).reshape(c.h, c.d, 1), np.abs(g).sum(0).reshape(c.h, c.d, 1)
    dflat = _flat(dout, c.lq, c)
    if kind == M.OW:
        a = ao.reshape(-1, ao.shape[-1])
        # dW_O[o, h*D + d] = sum_rows dout[o] ao[h*D + d]; the descriptor's dims (H, Po, D)
        r, mg = dflat.T @ a, np.abs(dflat).T @ np.abs(a)
        po = r.shape[0]
        return (r.reshape(po, c.h, c.d).transpose(1, 0, 2), mg.reshape(po, c.h, c.d).transpose(1, 0, 2))
    return dflat.sum(0).reshape(1, -1, 1), np.abs(dflat).sum(0).reshape(1, -1, 1)


CASES = {
    "bf16-d64-o2o-bmtv-lens-bias": dict(dtype=BF16, lens=([37, 20, 1, 30], [45, 33, 7, 45])),
    "f16-d128-all2one-tbmv-causal-res-fill": dict(dtype=F16, heads=3, d=128, sizes=(48, 32, 40), o_proj=48, m=1,
                                                  one_to_one=False, axes=(T_, B_, M_, V_), mask=TL, biases=False,
                                                  residual=True, fill=-2.5, lens=([37, 25], [45, 40])),
    "bf16-d64-btmv-groups-bottomright-concat": dict(dtype=BF16, o_proj=0, axes=(B_, T_, M_, V_), mask=BR,
                                                    lens=([30, 37, 12, 20], [38, 45, 20, 28])),
}


@pytest.mark.parametrize("name", list(CASES))
def test_forward_and_backward(handle, rng, name):
    c = Case(rng, **CASES[name])
    c.setup(handle, rng)
    fwd = _check_forward(c)
    _check_backward(c, fwd)


def test_inference_matches_training(handle, rng):
    """Inference (all steps) writes the same output as training (same kernels); one step writes only that
    step's rows, within the output projection's rounding of training's: a single query row takes the
    decode attention kernel (split keys, its own order of sums), so its bf16 heads may differ from the
    training kernel's by a rounding, which the projection turns into an error relative to the magnitude of
    its summed terms (scale), as _check_forward measures it."""
    c = Case(rng, **CASES["bf16-d64-o2o-bmtv-lens-bias"])
    c.setup(handle, rng)
    c.forward(training=True)
    train = c.o.dev.download()
    s = M._Sizes(c.a, c.q.dev.dims[0], c.q.dev.dims[1], c.q.dev.dims[2], c.k.dev.dims[2], c.k.dev.dims[1])
    _, mag = _out_ref(c.region(c.rs, s.reserve_off["ao"], c.q, c.h * c.d), c.weights)
    c.o.dev.poison()
    c.forward(training=False)
    assert_close(c.o.dev.download(), train, c.dtype, "inference vs training (same kernels)")
    c.o.dev.poison()
    c.forward(training=False, curr=5)
    got = c.o.dev.download()
    assert np.isnan(np.delete(got, 5, axis=2)).all()  # other steps untouched (still poison)
    valid = c.lq > 5
    assert_close(got[:, :, 5][valid], train[:, :, 5][valid], c.dtype, "step 5 vs training", scale=mag[:, :, 5][valid])


def test_inference_one_step_window(handle, rng):
    """At one step, hiWinIdx[currIdx] limits the keys (any value, not only the causal ones)."""
    c = Case(rng, **CASES["bf16-d64-o2o-bmtv-lens-bias"])
    c.setup(handle, rng)
    c.hi = [17] * len(c.hi)
    c.o.dev.poison()
    c.forward(training=False, curr=3)
    s = M._Sizes(c.a, c.q.dev.dims[0], c.q.dev.dims[1], c.q.dev.dims[2], c.k.dev.dims[2], c.k.dev.dims[1])
    hd = c.h * c.d
    qp, kp, vp = (c.region(c.ws, s.ws_fwd_off[n], seq, hd) for n, seq in (("qp", c.q), ("kp", c.k), ("vp", c.v)))
    ao = c.region(c.ws, s.ws_fwd_off["ao"], c.q, hd)[:, :, 3:4]
    lk = np.minimum(np.array(c.kv_of_q()), 17)
    o_ref, _, so, _ = RA.forward(c.heads(qp[:, :, 3:4]), c.heads(kp[:, :, :17]), c.heads(vp[:, :, :17]), c.sm, NONE,
                                 None, lk)
    assert_close(c.heads(ao), o_ref, c.dtype, "step 3 heads, keys [0, 17)", scale=so)
    ref, mag = _out_ref(ao, c.weights)
    got = c.o.dev.download()
    assert_close(got[:, :, 3:4], ref, c.dtype, "step 3 out", scale=mag)
    e2e, _, _ = R.forward(c.q.dev.values, c.k.dev.values, c.v.dev.values, c.weights, c.h, c.sm, c.lo, c.hi, c.lq,
                          c.lk, stored=lambda x: rd.round_to(x, c.dtype))
    valid = c.lq > 3
    err = np.abs(got[:, :, 3][valid] - e2e[:, :, 3][valid]).max()
    print(f"one step, window [0, 17): end-to-end max |out - ref| = {err:.3g}, max |ref| = {np.abs(e2e).max():.3g}")


def test_c_program_on_gpu(tmp_path):
    from cprog import build_and_run
    r = build_and_run("mha_gpu", tmp_path, extra=["-ldl", "-lm"])
    print(r.stdout, r.stderr)
    assert "FAIL" not in r.stdout and r.returncode == 0, r.stdout + r.stderr
    for what in ("get attention descriptor (NULL dropouts)", "buffer sizes, reserve NULL (inference)",
                 "get sequence data descriptor (paddingFill back in bfloat16)", "forward out numbers",
                 "backward data", "backward weights", "sliding window: NOT_SUPPORTED"):
        assert f"ok {what}" in r.stdout, r.stdout + r.stderr
