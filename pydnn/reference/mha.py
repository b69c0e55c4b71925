"""Float64 reference of cuDNN's multi-head attention with projections (pydnn/ops/mha.py).

Arrays are in logical order, whatever the device layout: queries q (B, M, T, qSize), keys k (B, Mk, Tk,
kSize), values v (B, Mk, Tk, vSize), out / dout (B, M, T, oSize); Mk = M for the ONE_TO_ONE query map,
1 for ALL_TO_ONE (every beam of a batch entry attends to the same keys). Weights `w` is a dict keyed by
pydnnMultiHeadAttnWeightKind_t: Q / K / V weights (H, P, size) (head h projects x to W[h] @ x), O weights
(H, oProj, vProj) (out = sum_h W_O[h] @ head_h), biases Q / K / V (H, P), O (oProj,); absent kinds (a
projection size 0, biases disabled) are missing from the dict.

    head_h(t) = sum_j p_tj V_h[j],   p_t = softmax_j(smScaler * Q_h[t] . K_h[j]) over j in [lo[t], hi[t])
                                     and j < the keys' length (rows that see no key: head = 0)
    out(t)    = sum_h W_O[h] head_h(t) + b_O (+ residual q(t))     (oProj = 0: the heads concatenated)

Rows past the queries' length are padding: out = 0 there and their dout is ignored. `stored(x)` is applied
to each intermediate the device keeps in the data type (projected Q, K, V and the heads before the output
projection) so the reference rounds them where the device does. Alongside each result the functions
return the magnitude of the terms it is summed from (the tests' tolerance scale; see
pydnn/reference/attention.py).
"""
import numpy as np

QW, KW, VW, OW, QB, KB, VB, OB = range(8)  # pydnnMultiHeadAttnWeightKind_t (PYDNN_MH_ATTN_*)


def _ident(x):
    return x


def window(t_q, lo, hi, len_kv):
    """(t_q, Tk-bool) key j visible to query t: lo[t] <= j < hi[t] and j < len_kv."""
    j = np.arange(len_kv)[None, :]
    lo = np.asarray(lo)[:t_q, None]
    hi = np.asarray(hi)[:t_q, None]
    return (j >= lo) & (j < hi)


def _proj(x, w, b):
    """Per-head projection of rows x (T, size): (H, T, P); no weights: every head sees x itself."""
    if w is None:
        return x[None]
    y = np.einsum("tk,hpk->htp", x, w)
    return y if b is None else y + b[:, None, :]


def _kv_beam(m, mk):
    return m if mk > 1 else 0


def forward(q, k, v, w, n_heads, sm_scaler, lo, hi, lens_qo, lens_kv, residual=False, stored=_ident):
    """-> (out, mag, cache): out (B, M, T, oSize); cache keeps what backward needs."""
    B, M, T, _ = q.shape
    Mk, Tk = k.shape[1], k.shape[2]
    H = n_heads
    outs, mags, cache = [], [], {}
    for b in range(B):
        ob, mb = [], []
        for m in range(M):
            mk = _kv_beam(m, Mk)
            lq, lk = int(lens_qo[b][m]), int(lens_kv[b][mk])
            qp = stored(_proj(q[b, m], w.get(QW), w.get(QB)))
            kp = stored(_proj(k[b, mk], w.get(KW), w.get(KB)))
            vp = stored(_proj(v[b, mk], w.get(VW), w.get(VB)))
            qp, kp, vp = (np.broadcast_to(x, (H,) + x.shape[1:]) for x in (qp, kp, vp))
            vis = np.zeros((T, Tk), bool)
            vis[:lq, :lk] = window(lq, lo, hi, lk)
            s = sm_scaler * np.einsum("htp,hjp->htj", qp, kp)
            s = np.where(vis[None], s, -np.inf)
            mx = s.max(axis=2, keepdims=True)
            mx = np.where(np.isfinite(mx), mx, 0.0)
            e = np.where(vis[None], np.exp(s - mx), 0.0)
            tot = e.sum(axis=2, keepdims=True)
            p = e / np.where(tot > 0, tot, 1.0)
            a = stored(np.einsum("htj,hjd->htd", p, vp))
            amag = np.einsum("htj,hjd->htd", p, np.abs(vp))
            cache[b, m] = (qp, kp, vp, p, a)
            if OW in w:
                o = np.einsum("htd,hod->to", a, w[OW]) + (w[OB] if OB in w else 0.0)
                mag = np.einsum("htd,hod->to", amag, np.abs(w[OW])) + (np.abs(w[OB]) if OB in w else 0.0)
            else:
                o = a.transpose(1, 0, 2).reshape(T, -1)
                mag = amag.transpose(1, 0, 2).reshape(T, -1)
            if residual:
                o = o + q[b, m]
                mag = mag + np.abs(q[b, m])
            o[lq:] = 0.0
            mag[lq:] = 0.0
            ob.append(o)
            mb.append(mag)
        outs.append(ob)
        mags.append(mb)
    return np.array(outs), np.array(mags), cache


def backward(q, k, v, w, n_heads, sm_scaler, lens_qo, lens_kv, dout, cache):
    """-> (dq, dk, dv, dw): data gradients (the residual's share, dout itself, is not in dq, as cuDNN) and
    the weight gradients as a dict by kind (what one MultiHeadAttnBackwardWeights call with SET writes)."""
    B, M, T, _ = q.shape
    Mk = k.shape[1]
    H = n_heads
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    dw = {kind: np.zeros(x.shape) for kind, x in w.items()}
    for b in range(B):
        for m in range(M):
            mk = _kv_beam(m, Mk)
            lq = int(lens_qo[b][m])
            qp, kp, vp, p, a = cache[b, m]
            g = np.array(dout[b, m], np.float64)
            g[lq:] = 0.0  # padding rows carry no gradient
            if OW in w:
                da = np.einsum("to,hod->htd", g, w[OW])
                dw[OW] += np.einsum("to,htd->hod", g, a)
                if OB in w:
                    dw[OB] += g.sum(axis=0)
            else:
                da = g.reshape(T, H, -1).transpose(1, 0, 2)
            dvp = np.einsum("htj,htd->hjd", p, da)
            dp = np.einsum("htd,hjd->htj", da, vp)
            ds = p * (dp - (dp * p).sum(axis=2, keepdims=True))
            dqp = sm_scaler * np.einsum("htj,hjp->htp", ds, kp)
            dkp = sm_scaler * np.einsum("htj,htp->hjp", ds, qp)
            for x, dxp, wk, bk, dst in ((q[b, m], dqp, QW, QB, dq[b, m]), (k[b, mk], dkp, KW, KB, dk[b, mk]),
                                        (v[b, mk], dvp, VW, VB, dv[b, mk])):
                if wk in w:
                    dst += np.einsum("htp,hpk->tk", dxp, w[wk])
                    dw[wk] += np.einsum("htp,tk->hpk", dxp, x)
                    if bk in w:
                        dw[bk] += dxp.sum(axis=1)
                else:
                    dst += dxp.sum(axis=0)
    return dq, dk, dv, dw


def full_lengths(B, M, T):
    return np.full((B, M), T, np.int64)


__all__ = ["forward", "backward", "window", "full_lengths", "QW", "KW", "VW", "OW", "QB", "KB", "VB", "OB"]
