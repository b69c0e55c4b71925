"""Scaled dot-product attention nodes of the graph API on pydnn's fused attention (pydnn/ops/attention.py):
cuDNN 9's OPERATION_SDPA_FWD descriptor (PYDNN_ATTR_OPERATION_SDPA_FWD_QDESC ... _SCALEDESC, values
2800-2805) with pydnn extension attributes for the mask and dropout, the pydnn extension descriptor
OPERATION_SDPA_BWD (cuDNN 9 has none), and the frontend's sdpa / sdpa_backward with cudnn-frontend's
argument names:

    o, stats = g.sdpa(q, k, v, is_inference=False, attn_scale=0.125, use_causal_mask=True)
    dq, dk, dv = g.sdpa_backward(q, k, v, o, dO, stats, attn_scale=0.125, use_causal_mask=True)

q, o, dO, dQ (B, Hq, Sq, D); k, v, dK, dV (B, Hkv, Skv, D), Hq a multiple of Hkv (GQA / MQA); stats
(B, Hq, Sq, 1) FLOAT: the natural-log log-sum-exp of each row (cuDNN's softmax statistics). attn_scale:
a pass-by-value scalar tensor or a number (cudnn-frontend's default: no scaling, 1.0). Masks: none,
causal (top left: key j visible to query i when j <= i) and causal bottom right. dropout: (probability,
seed, offset) with an int seed and offset 0 (pydnn's Philox stream, see pydnn/ops/attention.py).
use_padding_mask with seq_len_q / seq_len_kv ((B, 1, 1, 1) INT32 device tensors): per-batch lengths.
Paged K / V (sdpa only; cudnn-frontend's paged_attention_k_table / _v_table / _max_seq_len_kv, pydnn
extension attributes PAGE_TABLE_KDESC / _VDESC / MAX_SEQ_LEN_KV): k and v are page pools (pages, Hkv,
page size, D), the tables (B, 1, maxPages, 1) INT32 device tensors, seq_len_kv required
(pydnn.attention_forward_paged).
pydnn runs bf16 / fp16 with head dims 64 and 128, the head dim contiguous (NOT_SUPPORTED otherwise).
Each node is one call of the fused attention kernels (forward: one launch; backward: its passes).
"""
import math

from .. import enums as E
from . import backend as B
from . import descriptors as D
from . import engines as EN
from . import frontend as F
from . import plans as PL
from .descriptors import Attr, OpInfo, bad

_BD, _T = "BACKEND_DESCRIPTOR", dict(kinds=("TENSOR",))
FWD, BWD = "OPERATION_SDPA_FWD_", "OPERATION_SDPA_BWD_"
MASKS = (E.PYDNN_ATTN_MASK_NONE, E.PYDNN_ATTN_MASK_CAUSAL_TOP_LEFT, E.PYDNN_ATTN_MASK_CAUSAL_BOTTOM_RIGHT)
HEAD_DIMS = (64, 128)

_EXTRA = lambda pre: {  # noqa: E731
    pre + "SCALEDESC": Attr(_BD, **_T), pre + "MASK_MODE": Attr("INT64"),
    pre + "DROPOUT_PROBABILITY": Attr(("DOUBLE", "FLOAT")), pre + "DROPOUT_SEED": Attr("INT64"),
    pre + "SEQ_LEN_QDESC": Attr(_BD, **_T), pre + "SEQ_LEN_KVDESC": Attr(_BD, **_T),
}
FWD_SCHEMA = {
    **{FWD + n: Attr(_BD, required=True, **_T) for n in ("QDESC", "KDESC", "VDESC", "ODESC")},
    FWD + "STATSDESC": Attr(_BD, **_T), **_EXTRA(FWD),
    FWD + "PAGE_TABLE_KDESC": Attr(_BD, **_T), FWD + "PAGE_TABLE_VDESC": Attr(_BD, **_T),
    FWD + "MAX_SEQ_LEN_KV": Attr("INT64"),
}
BWD_SCHEMA = {
    **{BWD + n: Attr(_BD, required=True, **_T) for n in ("QDESC", "KDESC", "VDESC", "ODESC", "DODESC", "STATSDESC",
                                                        "DQDESC", "DKDESC", "DVDESC")},
    **_EXTRA(BWD), BWD + "DETERMINISTIC": Attr("BOOLEAN"),
}


def _params(d, pre, where):
    mask = d.one(pre + "MASK_MODE", E.PYDNN_ATTN_MASK_NONE)
    if mask not in MASKS:
        raise bad(f"{where}: PYDNN_ATTR_{pre}MASK_MODE = {mask} is not a pydnnAttentionMaskMode_t value")
    p = float(d.one(pre + "DROPOUT_PROBABILITY", 0.0))
    if not 0.0 <= p < 1.0:
        raise bad(f"{where}: PYDNN_ATTR_{pre}DROPOUT_PROBABILITY = {p!r} is outside [0, 1)")
    seed = d.one(pre + "DROPOUT_SEED", 0)
    if not 0 <= seed < 2**63:
        raise bad(f"{where}: PYDNN_ATTR_{pre}DROPOUT_SEED = {seed} is negative")
    return dict(mask=mask, dropout=p, seed=seed)


def _shapes(where, pre, q, k, v, o, stats, extra=(), paged=False):
    for t, n in ((q, "QDESC"), (k, "KDESC"), (v, "VDESC"), (o, "ODESC")):
        if len(t.dims) != 4:
            raise bad(f"{where}: PYDNN_ATTR_{pre}{n} has {len(t.dims)} dims (batch, heads, sequence, head dim)")
    b, hq, sq, d = q.dims
    if (k.dims[0] != b and not paged) or k.dims[3] != d:  # (paged: k is a page pool, dims[0] its pages)
        raise bad(f"{where}: PYDNN_ATTR_{pre}KDESC dims {list(k.dims)} disagree with Q's {list(q.dims)} "
                  f"(batch and head dim)")
    if tuple(v.dims) != tuple(k.dims):
        raise bad(f"{where}: PYDNN_ATTR_{pre}VDESC dims {list(v.dims)} must equal K's {list(k.dims)}")
    if hq % k.dims[1]:
        raise bad(f"{where}: Q's {hq} heads are not a multiple of K's {k.dims[1]} (GQA needs whole groups)")
    if tuple(o.dims) != tuple(q.dims):
        raise bad(f"{where}: PYDNN_ATTR_{pre}ODESC dims {list(o.dims)} must equal Q's {list(q.dims)}")
    if stats is not None and tuple(stats.dims) != (b, hq, sq, 1):
        raise bad(f"{where}: PYDNN_ATTR_{pre}STATSDESC dims {list(stats.dims)} must be {[b, hq, sq, 1]}")
    for t, ref, n in extra:
        if tuple(t.dims) != tuple(ref.dims):
            raise bad(f"{where}: PYDNN_ATTR_{pre}{n} dims {list(t.dims)} must be {list(ref.dims)}")


def _lens(d, pre, where, b):
    """The optional per-batch sequence lengths ((B, 1, 1, 1) INT32 tensors): {role: tensor}."""
    out = {}
    for role, n in (("seq_len_q", "SEQ_LEN_QDESC"), ("seq_len_kv", "SEQ_LEN_KVDESC")):
        t = d.one(pre + n)
        if t is None:
            continue
        t = t.state
        if t.dims[0] != b or any(v != 1 for v in t.dims[1:]):
            raise bad(f"{where}: PYDNN_ATTR_{pre}{n} dims {list(t.dims)} must be [{b}, 1, 1, 1] (one length a batch)")
        if t.dtype != E.PYDNN_DATA_INT32:
            raise bad(f"{where}: PYDNN_ATTR_{pre}{n} data type {t.dtype} must be INT32")
        out[role] = t
    return out


def _scale(d, pre, where):
    s = d.one(pre + "SCALEDESC")
    if s is None:
        return None
    s = s.state
    if any(v != 1 for v in s.dims):
        raise bad(f"{where}: PYDNN_ATTR_{pre}SCALEDESC must be one element (dims {list(s.dims)})")
    return s


def _paged(d, where, q, k, lens):
    """The page tables ({role: tensor}) and maxSeqLenKV of a paged forward, or ({}, 0)."""
    tk, tv = d.one(FWD + "PAGE_TABLE_KDESC"), d.one(FWD + "PAGE_TABLE_VDESC")
    if tk is None and tv is None:
        if d.one(FWD + "MAX_SEQ_LEN_KV") is not None:
            raise bad(f"{where}: PYDNN_ATTR_{FWD}MAX_SEQ_LEN_KV without page tables")
        return {}, 0
    if tk is None or tv is None:
        raise bad(f"{where}: paged K / V need both PYDNN_ATTR_{FWD}PAGE_TABLE_KDESC and _VDESC")
    b, ps = q.dims[0], k.dims[2]
    out = {}
    for role, n, t in (("page_table_k", "PAGE_TABLE_KDESC", tk.state), ("page_table_v", "PAGE_TABLE_VDESC", tv.state)):
        if len(t.dims) != 4 or t.dims[0] != b or t.dims[1] != 1 or t.dims[3] != 1:
            raise bad(f"{where}: PYDNN_ATTR_{FWD}{n} dims {list(t.dims)} must be [{b}, 1, maxPages, 1]")
        if t.dtype != E.PYDNN_DATA_INT32:
            raise bad(f"{where}: PYDNN_ATTR_{FWD}{n} data type {t.dtype} must be INT32")
        out[role] = t
    m = d.one(FWD + "MAX_SEQ_LEN_KV", 0) or tk.state.dims[2] * ps
    for role, t in out.items():
        if not 0 < m <= t.dims[2] * ps:
            raise bad(f"{where}: PYDNN_ATTR_{FWD}MAX_SEQ_LEN_KV = {m}: {role} covers {t.dims[2] * ps} keys "
                      f"({t.dims[2]} pages of {ps})")
    if "seq_len_kv" not in lens:
        raise bad(f"{where}: paged K / V need PYDNN_ATTR_{FWD}SEQ_LEN_KVDESC (the sequences' key lengths)")
    return out, m


def _fin_fwd(d):
    where = "OPERATION_SDPA_FWD"
    q, k, v, o = (d.one(FWD + n).state for n in ("QDESC", "KDESC", "VDESC", "ODESC"))
    st = d.one(FWD + "STATSDESC")
    st = st.state if st is not None else None
    paged = d.one(FWD + "PAGE_TABLE_KDESC") is not None or d.one(FWD + "PAGE_TABLE_VDESC") is not None
    _shapes(where, FWD, q, k, v, o, st, paged=paged)
    scale = _scale(d, FWD, where)
    lens = _lens(d, FWD, where, q.dims[0])
    tables, m = _paged(d, where, q, k, lens)
    ins = dict(q=q, k=k, v=v, **({"attn_scale": scale} if scale is not None else {}), **lens, **tables)
    outs = dict(o=o, **({"stats": st} if st is not None else {}))
    p = _params(d, FWD, where)
    if tables:
        p["max_seq_len_kv"] = m
    return OpInfo("sdpa_fwd", ins, outs, p)


def _fin_bwd(d):
    where = "OPERATION_SDPA_BWD"
    t = {n: d.one(BWD + n).state for n in ("QDESC", "KDESC", "VDESC", "ODESC", "DODESC", "STATSDESC", "DQDESC",
                                          "DKDESC", "DVDESC")}
    _shapes(where, BWD, t["QDESC"], t["KDESC"], t["VDESC"], t["ODESC"], t["STATSDESC"],
            ((t["DODESC"], t["QDESC"], "DODESC"), (t["DQDESC"], t["QDESC"], "DQDESC"),
             (t["DKDESC"], t["KDESC"], "DKDESC"), (t["DVDESC"], t["KDESC"], "DVDESC")))
    scale = _scale(d, BWD, where)
    ins = dict(q=t["QDESC"], k=t["KDESC"], v=t["VDESC"], o=t["ODESC"], do=t["DODESC"], stats=t["STATSDESC"])
    if scale is not None:
        ins["attn_scale"] = scale
    ins.update(_lens(d, BWD, where, t["QDESC"].dims[0]))
    p = _params(d, BWD, where)
    p["deterministic"] = bool(d.one(BWD + "DETERMINISTIC", False))
    return OpInfo("sdpa_bwd", ins, dict(dq=t["DQDESC"], dk=t["DKDESC"], dv=t["DVDESC"]), p)


D.register_operation("OPERATION_SDPA_FWD", FWD_SCHEMA, _fin_fwd)
D.register_operation("OPERATION_SDPA_BWD", BWD_SCHEMA, _fin_bwd)


def _check_json(op):
    p = op.params
    if p.get("mask") not in MASKS or not 0.0 <= float(p.get("dropout", -1)) < 1.0 or type(p.get("seed")) is not int:
        raise ValueError("sdpa parameters")
    need = ({"q", "k", "v"}, {"o"}) if op.kind == "sdpa_fwd" else ({"q", "k", "v", "o", "do", "stats"},
                                                                  {"dq", "dk", "dv"})
    if not need[0] <= set(op.inputs) or not need[1] <= set(op.outputs):
        raise ValueError("sdpa operands")


PL.CHECKS.update(sdpa_fwd=_check_json, sdpa_bwd=_check_json)
EN.BY_VALUE.update(sdpa_fwd={"attn_scale"}, sdpa_bwd={"attn_scale"})
_INT32 = (E.PYDNN_DATA_INT32,)
EN.OTHER_DTYPES.update(sdpa_fwd=dict(seq_len_q=_INT32, seq_len_kv=_INT32, page_table_k=_INT32, page_table_v=_INT32),
                       sdpa_bwd=dict(seq_len_q=_INT32, seq_len_kv=_INT32))


# ----------------------------------------------------------------------------- node engine

DATA = ("q", "k", "v", "o", "do", "dq", "dk", "dv")


class SdpaNode:
    def storage(self, g, op, st):
        dt = st[op.inputs["q"]]
        for r in ("o", "dq", "dk", "dv"):
            u = op.outputs.get(r)
            if u is not None and g.tensors[u].virtual:
                st[u] = dt  # the attention kernels write q's type

    def support(self, g, op, st):
        name = op.kind
        tens = {**{r: g.tensors[u] for r, u in op.inputs.items()}, **{r: g.tensors[u] for r, u in op.outputs.items()}}
        dt = st[tens["q"].uid]
        if dt not in (E.PYDNN_DATA_HALF, E.PYDNN_DATA_BFLOAT16):
            return f"{name}: data type {dt} (pydnn's fused attention runs HALF and BFLOAT16)"
        d = tens["q"].dims[3]
        if d not in HEAD_DIMS:
            return f"{name}: head dim {d} (pydnn's fused attention has {HEAD_DIMS})"
        for r, t in tens.items():
            if r in DATA:
                if st[t.uid] != dt:
                    return f"{name}: {r} (uid {t.uid}) has data type {st[t.uid]}, q has {dt}"
                if t.strides[3] != 1 or any(s % 8 for s in t.strides[:3]):
                    return (f"{name}: {r} (uid {t.uid}) strides {list(t.strides)}: the head dim must be contiguous "
                            f"and the other strides multiples of 8 elements")
            elif r == "stats" and t.dtype != E.PYDNN_DATA_FLOAT:
                return f"{name}: stats (uid {t.uid}) must be FLOAT"
            elif r == "attn_scale" and not t.by_value:
                return f"{name}: attn_scale (uid {t.uid}) must be a pass-by-value scalar"
            elif r in ("seq_len_q", "seq_len_kv", "page_table_k", "page_table_v") and (t.by_value or t.virtual):
                return f"{name}: {r} (uid {t.uid}) must be a graph input in device memory"
        return None

    def step(self, handle, g, op, st, ws_offset):
        return SdpaStep(handle, g, op, st, ws_offset)


class SdpaStep:
    """One pydnn.attention_forward / attention_backward call; the softmax scale comes from the by-value
    attn_scale at execute (the attention descriptor is set again when it changes)."""

    def __init__(self, handle, g, op, st, ws_offset):
        import pydnn

        from .norm_nodes import _tdesc

        self.kind, p = op.kind, op.params
        self.uids = {**op.inputs, **op.outputs}
        tens = {r: g.tensors[u] for r, u in self.uids.items()}
        self.descs = {r: _tdesc(t, st[t.uid]) for r, t in tens.items()
                      if r in DATA or r in ("stats", "page_table_k", "page_table_v")}
        self.max_seq = p.get("max_seq_len_kv", 0)  # paged K / V (attention_forward_paged) when not 0
        q, k = tens["q"], tens["k"]
        self.shape = (q.dims[1], k.dims[1], q.dims[3], p["mask"], p["dropout"], p["seed"])
        self.attn = pydnn.create_attention_descriptor()
        self.scale = None
        self._set_scale(1.0)
        self.det = 1 if p.get("deterministic") else 0
        self.ws_size, self.ws_offset = 0, ws_offset
        if self.kind == "sdpa_bwd":
            self.ws_size = pydnn.get_attention_backward_workspace_size(handle, self.attn, self.descs["q"],
                                                                       self.descs["k"])
        elif self.max_seq:  # the paged decode kernel's partials (split KV), if it takes the call
            self.ws_size = pydnn.get_attention_forward_paged_workspace_size(
                handle, self.attn, self.descs["q"], self.descs["k"], self.descs["page_table_k"], self.max_seq)
        self.launches = 1 if self.kind == "sdpa_fwd" else None

    def _set_scale(self, s):
        import pydnn

        if s != self.scale:
            if not (s > 0 and math.isfinite(s)):
                raise bad(f"{self.kind}: attn_scale {s!r} must be positive and finite")
            hq, hkv, d, mask, drop, seed = self.shape
            pydnn.set_attention_descriptor(self.attn, hq, hkv, d, s, mask, drop, seed)
            self.scale = s

    def run(self, handle, ptr):
        import pydnn

        u, d = self.uids, self.descs
        if "attn_scale" in u:
            self._set_scale(float(ptr[u["attn_scale"]]))
        p = {r: ptr[x] for r, x in u.items() if r != "attn_scale"}
        lq, lkv = p.get("seq_len_q"), p.get("seq_len_kv")
        if self.kind == "sdpa_fwd" and self.max_seq:
            ws = ptr["workspace"] + self.ws_offset if self.ws_size else 0
            pydnn.attention_forward_paged(handle, self.attn, d["q"], p["q"], d["k"], p["k"], d["v"], p["v"],
                                          d["page_table_k"], p["page_table_k"], d["page_table_v"], p["page_table_v"],
                                          self.max_seq, d["o"], p["o"], d.get("stats"), p.get("stats", 0), lq, lkv,
                                          ws, self.ws_size)
        elif self.kind == "sdpa_fwd":
            pydnn.attention_forward(handle, self.attn, d["q"], p["q"], d["k"], p["k"], d["v"], p["v"], d["o"], p["o"],
                                    d.get("stats"), p.get("stats", 0), lq, lkv, None, 0)
        else:
            ws = ptr["workspace"] + self.ws_offset if self.ws_size else 0
            pydnn.attention_backward(handle, self.attn, d["q"], p["q"], d["k"], p["k"], d["v"], p["v"], d["o"], p["o"],
                                     d["do"], p["do"], d["stats"], p["stats"], d["dq"], p["dq"], d["dk"], p["dk"],
                                     d["dv"], p["dv"], lq, lkv, self.det, ws, self.ws_size)


EN.NODE_KINDS.update(sdpa_fwd=SdpaNode(), sdpa_bwd=SdpaNode())


# ----------------------------------------------------------------------------- frontend

_UNSUPPORTED = ("bias", "use_alibi_mask", "sliding_window_length",
                "rng_dump", "paged_attention_k_table", "paged_attention_v_table", "paged_attention_max_seq_len_kv",
                "score_mod", "left_bound", "right_bound", "diagonal_alignment", "diagonal_band_left_bound",
                "diagonal_band_right_bound", "sink_token", "block_mask")


def _options(what, attn_scale, use_causal_mask, use_causal_mask_bottom_right, dropout, kw, g):
    for k, v in kw.items():
        if k not in _UNSUPPORTED:
            raise bad(f"{what}: unknown argument {k!r}")
        if v not in (None, False, 0):
            raise bad(f"{what}: {k} is not supported by pydnn's fused attention", E.PYDNN_STATUS_NOT_SUPPORTED)
    if use_causal_mask and use_causal_mask_bottom_right:
        raise bad(f"{what}: use_causal_mask and use_causal_mask_bottom_right exclude each other")
    mask = (E.PYDNN_ATTN_MASK_CAUSAL_TOP_LEFT if use_causal_mask else
            E.PYDNN_ATTN_MASK_CAUSAL_BOTTOM_RIGHT if use_causal_mask_bottom_right else E.PYDNN_ATTN_MASK_NONE)
    p, seed = 0.0, 0
    if dropout is not None:
        try:
            p, seed, offset = dropout
        except (TypeError, ValueError):
            raise bad(f"{what}: dropout is (probability, seed, offset)") from None
        if isinstance(seed, F.Tensor) or isinstance(offset, F.Tensor):
            raise bad(f"{what}: dropout seed / offset tensors are not supported (pass the seed as an int, offset 0)",
                      E.PYDNN_STATUS_NOT_SUPPORTED)
        if offset != 0:
            raise bad(f"{what}: dropout offset {offset} (pydnn's Philox stream starts at offset 0)",
                      E.PYDNN_STATUS_NOT_SUPPORTED)
        p, seed = float(p), int(seed)
    scale = None
    if attn_scale is not None:
        if isinstance(attn_scale, F.Tensor):
            scale = g._check_in(attn_scale, "attn_scale")
        else:
            if isinstance(attn_scale, bool) or not isinstance(attn_scale, (int, float)):
                raise bad(f"{what}: attn_scale must be a pass-by-value tensor or a number")
            scale = g.tensor(name=f"attn_scale_{len(g.tensors)}", dim=[1, 1, 1, 1], data_type=E.PYDNN_DATA_FLOAT,
                             is_pass_by_value=True)
            F.set_constant(g, scale, float(attn_scale))
    return dict(mask=mask, dropout=p, seed=seed, scale=scale)


def _padding(g, what, use_padding_mask, seq_len_q, seq_len_kv):
    """{role: tensor} of the per-batch sequence lengths (cudnn-frontend: use_padding_mask with seq_len_q /
    seq_len_kv, (B, 1, 1, 1) INT32 tensors)."""
    if not use_padding_mask:
        if seq_len_q is not None or seq_len_kv is not None:
            raise bad(f"{what}: seq_len_q / seq_len_kv need use_padding_mask=True")
        return {}
    if seq_len_q is None and seq_len_kv is None:
        raise bad(f"{what}: use_padding_mask needs seq_len_q and / or seq_len_kv")
    return {r: g._check_in(t, r) for r, t in (("seq_len_q", seq_len_q), ("seq_len_kv", seq_len_kv)) if t is not None}


def sdpa(self, q, k, v, is_inference=False, attn_scale=None, use_causal_mask=False, use_causal_mask_bottom_right=False,
         dropout=None, generate_stats=None, use_padding_mask=False, seq_len_q=None, seq_len_kv=None,
         compute_data_type=None, name=None, paged_attention_k_table=None, paged_attention_v_table=None,
         paged_attention_max_seq_len_kv=None, **kw):
    """cudnn-frontend's sdpa: [O, stats] (stats None when is_inference and not generate_stats). Rows past
    their sequence length: O = 0, stats = -inf (pydnn's fused attention). Paged K / V: k and v the page
    pools (pages, Hkv, page size, D), paged_attention_k_table / _v_table (B, 1, maxPages, 1) INT32 tensors,
    paged_attention_max_seq_len_kv (None: maxPages x page size); needs seq_len_kv."""
    q, k, v = (self._check_in(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    opt = _options("sdpa", attn_scale, use_causal_mask, use_causal_mask_bottom_right, dropout, kw, self)
    lens = _padding(self, "sdpa", use_padding_mask, seq_len_q, seq_len_kv)
    if paged_attention_k_table is not None or paged_attention_v_table is not None:
        if paged_attention_k_table is None or paged_attention_v_table is None:
            raise bad("sdpa: paged attention needs paged_attention_k_table and paged_attention_v_table")
        if "seq_len_kv" not in lens:
            raise bad("sdpa: paged attention needs use_padding_mask=True with seq_len_kv")
        lens["page_table_k"] = self._check_in(paged_attention_k_table, "paged_attention_k_table")
        lens["page_table_v"] = self._check_in(paged_attention_v_table, "paged_attention_v_table")
        m = paged_attention_max_seq_len_kv
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m <= 0):
            raise bad(f"sdpa: paged_attention_max_seq_len_kv {m!r} must be a positive int")
        opt["max_seq_len_kv"] = m or 0
    elif paged_attention_max_seq_len_kv is not None:
        raise bad("sdpa: paged_attention_max_seq_len_kv without page tables")
    if len(q.dim) != 4:
        raise bad(f"sdpa: q dims {q.dim} (batch, heads, sequence, head dim)")
    nm = name or "sdpa"
    o = self._out(f"{nm}::O", list(q.dim))
    stats = None
    if generate_stats or (generate_stats is None and not is_inference):
        stats = self._out(f"{nm}::Stats", list(q.dim[:3]) + [1]).set_data_type(E.PYDNN_DATA_FLOAT)
    ins = dict(q=q, k=k, v=v, attn_scale=opt["scale"], **lens)
    outs = dict(o=o, stats=stats)
    self.nodes.append(("sdpa_fwd", dict(ins=ins, outs_map=outs, out=o, outs=[o, stats], opt=opt)))
    return [o, stats]


def sdpa_backward(self, q, k, v, o, dO, stats, attn_scale=None, use_causal_mask=False,  # noqa: N803
                  use_causal_mask_bottom_right=False, dropout=None, use_deterministic_algorithm=False,
                  use_padding_mask=False, seq_len_q=None, seq_len_kv=None, compute_data_type=None, name=None, **kw):
    """cudnn-frontend's sdpa_backward: [dQ, dK, dV]."""
    ts = [self._check_in(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v"), (o, "o"), (dO, "dO"), (stats, "stats"))]
    opt = _options("sdpa_backward", attn_scale, use_causal_mask, use_causal_mask_bottom_right, dropout, kw, self)
    lens = _padding(self, "sdpa_backward", use_padding_mask, seq_len_q, seq_len_kv)
    opt["deterministic"] = bool(use_deterministic_algorithm)
    nm = name or "sdpa_backward"
    dq, dk, dv = (self._out(f"{nm}::d{n}", list(t.dim)) for n, t in (("Q", ts[0]), ("K", ts[1]), ("V", ts[2])))
    ins = dict(zip(("q", "k", "v", "o", "do", "stats"), ts), attn_scale=opt["scale"], **lens)
    outs = dict(dq=dq, dk=dk, dv=dv)
    self.nodes.append(("sdpa_bwd", dict(ins=ins, outs_map=outs, out=dq, outs=[dq, dk, dv], opt=opt)))
    return [dq, dk, dv]


_ROLE_ATTR = dict(q="QDESC", k="KDESC", v="VDESC", o="ODESC", do="DODESC", stats="STATSDESC", attn_scale="SCALEDESC",
                  dq="DQDESC", dk="DKDESC", dv="DVDESC", seq_len_q="SEQ_LEN_QDESC", seq_len_kv="SEQ_LEN_KVDESC",
                  page_table_k="PAGE_TABLE_KDESC", page_table_v="PAGE_TABLE_VDESC")


def _build(kind):
    def build(g, n, td):
        S, DESC = B.backend_set_attribute, E.PYDNN_TYPE_BACKEND_DESCRIPTOR  # noqa: N806
        fwd = kind == "sdpa_fwd"
        o = B.backend_create_descriptor(E.PYDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR if fwd else
                                        E.PYDNN_BACKEND_OPERATION_SDPA_BWD_DESCRIPTOR)
        pre = "PYDNN_ATTR_OPERATION_SDPA_FWD_" if fwd else "PYDNN_ATTR_OPERATION_SDPA_BWD_"
        for r, t in list(n["ins"].items()) + list(n["outs_map"].items()):
            if t is not None:
                S(o, getattr(E, pre + _ROLE_ATTR[r]), DESC, 1, [td[t.uid]])
        opt = n["opt"]
        S(o, getattr(E, pre + "MASK_MODE"), E.PYDNN_TYPE_INT64, 1, [opt["mask"]])
        if opt["dropout"]:
            S(o, getattr(E, pre + "DROPOUT_PROBABILITY"), E.PYDNN_TYPE_DOUBLE, 1, [opt["dropout"]])
            S(o, getattr(E, pre + "DROPOUT_SEED"), E.PYDNN_TYPE_INT64, 1, [opt["seed"]])
        if fwd and opt.get("max_seq_len_kv"):
            S(o, E.PYDNN_ATTR_OPERATION_SDPA_FWD_MAX_SEQ_LEN_KV, E.PYDNN_TYPE_INT64, 1, [opt["max_seq_len_kv"]])
        if not fwd and opt.get("deterministic"):
            S(o, E.PYDNN_ATTR_OPERATION_SDPA_BWD_DETERMINISTIC, E.PYDNN_TYPE_BOOLEAN, 1, [True])
        B.backend_finalize(o)
        return o
    return build


F.NODE_BUILDERS.update(sdpa_fwd=_build("sdpa_fwd"), sdpa_bwd=_build("sdpa_bwd"))
F.Graph.sdpa = sdpa
F.Graph.sdpa_backward = sdpa_backward
