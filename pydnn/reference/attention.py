"""Float64 references for fused scaled dot-product attention (pydnn/ops/attention.py).

Arrays are (B, H, S, D) in logical order (whatever the device layout). dropout: None or (p, seed): the
probabilities P are multiplied by Z / (1 - p), Z the keep mask of element (b, h, i, j) = number
((b * Hq + h) * Sq + i) * Skv + j of the Philox stream (seed, offset 0) (rdrop.keep_mask); lse is that
of the undropped P. GQA / MQA: query head h uses K/V
head h // (Hq // Hkv). lens_q / lens_kv: per-batch actual lengths or None. mask: a
pydnnAttentionMaskMode_t value. Rows past their length, and rows that see no key: O = 0, lse = -inf,
dQ = 0; keys past their length: dK = dV = 0 (what the kernels write).

Besides the results, forward and backward return, per output element, the magnitude of the terms it
is summed from (sum_j p_ij |v_jd| for O, ...): the scale for the tests' tolerance, since the rounding of
P (and dS) to 16 bits before the tensor-core products errs relative to those terms, not to a result
that may cancel to near zero. For lse the magnitude is max_j |scale s_ij| + log(visible keys).
"""
import numpy as np

from .. import enums as E
from . import dropout as rdrop


def visible(sq, skv, len_q, len_kv, mask):
    """(sq, skv) bool: key j visible to query row i."""
    i = np.arange(sq)[:, None]
    j = np.arange(skv)[None, :]
    vis = (i < len_q) & (j < len_kv)
    if mask == E.PYDNN_ATTN_MASK_CAUSAL_TOP_LEFT:
        vis &= j <= i
    elif mask == E.PYDNN_ATTN_MASK_CAUSAL_BOTTOM_RIGHT:
        vis &= j <= i + (len_kv - len_q)
    return vis


def _lens(lens, b, s):
    return [s] * b if lens is None else [int(min(max(x, 0), s)) for x in lens]


def _probs(q, k, scale, vis):
    """P (sq, skv) and lse (sq,) of one (batch, head); rows with nothing visible: P = 0, lse = -inf."""
    s = scale * (q @ k.T)
    s = np.where(vis, s, -np.inf)
    m = s.max(axis=1, keepdims=True)
    live = np.isfinite(m[:, 0])
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.where(vis, np.exp(s - m), 0.0)
    tot = e.sum(axis=1, keepdims=True)
    p = np.where(live[:, None], e / np.where(tot > 0, tot, 1.0), 0.0)
    lse = np.where(live, m[:, 0] + np.log(np.where(tot[:, 0] > 0, tot[:, 0], 1.0)), -np.inf)
    return p, lse, s


def keep(shape, dropout):
    """(B, Hq, Sq, Skv) float64 Z / (1 - p) (all ones without dropout)."""
    if dropout is None or dropout[0] == 0:
        return np.ones(shape)
    p, seed = dropout
    z = rdrop.keep_mask(seed, 0, int(np.prod(shape)), p).reshape(shape)
    return z / (1.0 - p)


def forward(q, k, v, scale, mask=E.PYDNN_ATTN_MASK_NONE, lens_q=None, lens_kv=None, dropout=None):
    """-> (O (B, Hq, Sq, D), lse (B, Hq, Sq), scale_o: sum_j p_ij |v_jd|, scale_lse)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b, hq, sq, d = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    g = hq // hkv
    lq, lkv = _lens(lens_q, b, sq), _lens(lens_kv, b, skv)
    z = keep((b, hq, sq, skv), dropout)
    o = np.zeros_like(q)
    so = np.zeros_like(q)
    lse = np.full((b, hq, sq), -np.inf)
    slse = np.zeros((b, hq, sq))
    for bi in range(b):
        vis = visible(sq, skv, lq[bi], lkv[bi], mask)
        for h in range(hq):
            p, lse[bi, h], _ = _probs(q[bi, h], k[bi, h // g], scale, vis)
            # rounding in lse scales with the magnitude of the products summed into each score (a score's
            # dot product can cancel to near zero while its terms do not), plus the log of the row sum
            terms = abs(scale) * (np.abs(q[bi, h]) @ np.abs(k[bi, h // g]).T)
            slse[bi, h] = np.where(vis, terms, 0).max(axis=1) + np.log(np.maximum(vis.sum(axis=1), 1))
            p = p * z[bi, h]
            o[bi, h] = p @ v[bi, h // g]
            so[bi, h] = p @ np.abs(v[bi, h // g])
    return o, lse, so, slse


def backward(q, k, v, do, scale, mask=E.PYDNN_ATTN_MASK_NONE, lens_q=None, lens_kv=None, dropout=None):
    """Exact gradients -> (dQ, dK, dV, scales): scales = (sdq, sdk, sdv), the magnitudes of the terms
    summed into each element (|dP| + |dsum| for dP - dsum)."""
    q, k, v, do = (np.asarray(x, np.float64) for x in (q, k, v, do))
    b, hq, sq, d = q.shape
    hkv, skv = k.shape[1], k.shape[2]
    g = hq // hkv
    lq, lkv = _lens(lens_q, b, sq), _lens(lens_kv, b, skv)
    z = keep((b, hq, sq, skv), dropout)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    sdq, sdk, sdv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for bi in range(b):
        vis = visible(sq, skv, lq[bi], lkv[bi], mask)
        for h in range(hq):
            kh, vh = k[bi, h // g], v[bi, h // g]
            p, _, _ = _probs(q[bi, h], kh, scale, vis)
            zh = z[bi, h]
            pd = p * zh  # the dropped-out probabilities O was made of
            o = pd @ vh
            dov = do[bi, h] * (np.arange(sq) < lq[bi])[:, None]
            dp = (dov @ vh.T) * zh
            dsum = (dov * o).sum(axis=1, keepdims=True)
            ds = p * (dp - dsum)
            dv[bi, h // g] += pd.T @ dov
            dq[bi, h] = scale * ds @ kh
            dk[bi, h // g] += scale * ds.T @ q[bi, h]
            # magnitudes: dP from |dO||V|; dsum from |dO| times O's own magnitude (p |V|: the O a kernel
            # reads back carries its rounding relative to that)
            so = pd @ np.abs(vh)
            mag = p * ((np.abs(dov) @ np.abs(vh).T) * zh + (np.abs(dov) * so).sum(axis=1, keepdims=True))
            sdv[bi, h // g] += pd.T @ np.abs(dov)
            sdq[bi, h] = scale * mag @ np.abs(kh)
            sdk[bi, h // g] += scale * mag.T @ np.abs(q[bi, h])
    return dq, dk, dv, (sdq, sdk, sdv)


def gather_pages(pool, table, seq, lens):
    """Paged K or V (pydnn attention_forward_paged) as a dense (B, H, seq, D) array: pool (pages, H,
    page_size, D), table (B, maxPages) page ids, lens the per-batch key lengths; key j < lens[b] of batch
    b is pool[table[b][j // page_size], :, j % page_size], keys past the length are 0 (never read)."""
    pool = np.asarray(pool, np.float64)
    _, h, ps, d = pool.shape
    b = len(lens)
    out = np.zeros((b, h, seq, d))
    for bi in range(b):
        for j in range(min(int(lens[bi]), seq)):
            out[bi, :, j] = pool[int(table[bi][j // ps]), :, j % ps]
    return out
