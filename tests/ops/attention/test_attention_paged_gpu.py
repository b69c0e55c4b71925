"""The paged-KV forward (pydnn.attention_forward_paged: K / V in page pools read through INT32 page tables,
cuDNN's paged_attention_k_table / _v_table) on the GPU against the float64 reference over the gathered
pages (pydnn/reference/attention.py gather_pages). Pages are scattered in a random order over a pool with
spare pages, K and V through different tables; every pool row that no live key reads (spare pages, the
rows past a sequence's length in its last page) holds NaN, and the table entries past a sequence's last
page hold -1, so a kernel reading either shows. Outputs poisoned. Both kernels: the split-KV decode
kernel (decode shapes, forced split counts, any page size) and the warp-specialized one (prefill on
sm_90: TMA boxes of whole pages or inside a page where the page size divides or is a multiple of its
K / V tile, cp.async through the table otherwise), GQA / MQA, both causal alignments, HND and NHD pages, odd lengths, empty sequences."""
import numpy as np
import pytest

import pydnn
from devtensor import DevTensor, assert_close
from pydnn import tuning
from pydnn.ops import attention as A
from pydnn.ops import attention_ws as WS
from pydnn.reference import attention as R

pytestmark = pytest.mark.gpu

F32, F16, BF16 = pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_BFLOAT16
NONE, TL, BR = (pydnn.PYDNN_ATTN_MASK_NONE, pydnn.PYDNN_ATTN_MASK_CAUSAL_TOP_LEFT,
                pydnn.PYDNN_ATTN_MASK_CAUSAL_BOTTOM_RIGHT)


def _dev_int32(values):
    a = pydnn.DeviceArray((max(1, len(values)),), np.int32)
    a.copy_from_numpy(np.asarray(values, np.int32))
    return a


class PagedProblem:
    """Q (B, Hq, Sq, D) BSHD; K / V pools of `pages` pages (spare ones included) in `layout` ("hnd":
    (pages, H, ps, D) packed; "nhd": a page's rows hold every head, strides (ps H D, D, H D, 1)); tables
    (B, 1, maxPages, 1) with a random page for every live (batch, page) slot, -1 elsewhere."""

    def __init__(self, rng, b, hq, hkv, sq, max_seq, d, ps, dtype, mask, lens_kv, lens_q=None, layout="hnd",
                 spare=3, max_pages=None):
        self.b, self.hq, self.hkv, self.sq, self.seq, self.d, self.ps = b, hq, hkv, sq, max_seq, d, ps
        self.dtype, self.mask, self.scale = dtype, mask, 1.0 / np.sqrt(d)
        self.lens_kv, self.lens_q = list(lens_kv), lens_q
        self.attn = pydnn.create_attention_descriptor()
        pydnn.set_attention_descriptor(self.attn, hq, hkv, d, self.scale, mask, 0.0, 0)
        self.max_pages = max_pages or -(-max_seq // ps)
        live = [-(-min(n, max_seq) // ps) for n in lens_kv]
        self.pages = sum(live) + spare
        qd = (b, hq, sq, d)
        bshd = lambda dims: (dims[2] * dims[1] * dims[3], dims[3], dims[1] * dims[3], 1)  # noqa: E731
        self.q = DevTensor(qd, dtype, bshd(qd))
        self.o = DevTensor(qd, dtype, bshd(qd))
        self.lse = DevTensor((b, hq, sq, 1), F32)
        self.q.random(rng, -2.0, 2.0)
        pd = (self.pages, hkv, ps, d)
        pst = (ps * hkv * d, ps * d, d, 1) if layout == "hnd" else (ps * hkv * d, d, hkv * d, 1)
        self.tables, self.pools = [], []
        for _ in range(2):  # K, then V: each its own scattering of the pages
            perm = rng.permutation(self.pages)
            tab = np.full((b, self.max_pages), -1, np.int64)
            used = np.zeros((self.pages, ps), bool)  # pool rows a live key reads
            n = 0
            for bi in range(b):
                for j in range(live[bi]):
                    tab[bi, j] = perm[n]
                    keys = min(ps, min(lens_kv[bi], max_seq) - j * ps)
                    used[perm[n], :keys] = True
                    n += 1
            vals = rng.uniform(-2.0, 2.0, pd).astype(np.float32).astype(np.float64)
            vals = np.where(used[:, None, :, None], vals, np.nan)
            t = DevTensor(pd, dtype, pst)
            t.upload(vals)
            self.pools.append(t)
            td = DevTensor((b, 1, self.max_pages, 1), pydnn.PYDNN_DATA_INT32)
            td.buf.copy_from_numpy(tab.astype(np.int32).reshape(-1))
            self.tables.append((td, tab))
        self.lkv_dev = _dev_int32(lens_kv)
        self.lq_dev = _dev_int32(lens_q) if lens_q is not None else None

    def workspace_size(self, handle):
        return pydnn.get_attention_forward_paged_workspace_size(handle, self.attn, self.q.desc, self.pools[0].desc,
                                                                self.tables[0][0].desc, self.seq)

    def forward(self, handle, stats=True, max_seq=None):
        n = self.workspace_size(handle)
        self.ws_size = n
        ws = pydnn.DeviceArray((max(n, 16),), np.uint8)
        ws.fill_bytes(0xFF)
        self.o.poison()
        self.lse.poison()
        (tk, _), (tv, _) = self.tables
        k, v = self.pools
        pydnn.attention_forward_paged(handle, self.attn, self.q.desc, self.q.ptr, k.desc, k.ptr, v.desc, v.ptr,
                                      tk.desc, tk.ptr, tv.desc, tv.ptr, self.seq if max_seq is None else max_seq,
                                      self.o.desc, self.o.ptr, self.lse.desc if stats else None,
                                      self.lse.ptr if stats else None, self.lq_dev, self.lkv_dev, ws.ptr, n)
        self._ws = ws

    def ref_forward(self):
        kd = R.gather_pages(self.pools[0].values, self.tables[0][1], self.seq, self.lens_kv)
        vd = R.gather_pages(self.pools[1].values, self.tables[1][1], self.seq, self.lens_kv)
        return R.forward(self.q.values, kd, vd, self.scale, self.mask, self.lens_q, self.lens_kv)


def _check(handle, pb, route=None, **kw):
    pb.forward(handle, **kw)
    if route is not None:
        assert A.LAST_PAGED_ROUTE == route
    o, lse, so, slse = pb.ref_forward()
    assert_close(pb.o.download(), o, pb.dtype, "O", scale=so)
    got = pb.lse.download()[..., 0]
    dead = np.isneginf(lse)
    assert np.isneginf(got[dead]).all(), "lse of rows that see nothing must be -inf"
    assert_close(np.where(dead, 0, got), np.where(dead, 0, lse), F32, "lse", scale=slse)
    pb.o.check_untouched()


# ----------------------------------------------------------------------------- decode (dec)

DEC_CASES = [  # b, hq, hkv, sq, max_seq, d, ps, mask, lens_kv, splits
    (4, 32, 8, 1, 1100, 128, 16, NONE, [1000, 37, 1, 513], None),   # GQA 4, vLLM's 16-key pages
    (2, 16, 1, 1, 2048, 64, 64, NONE, [2048, 1999], 4),              # MQA, forced splits
    (3, 8, 2, 4, 900, 256, 32, BR, [900, 333, 4], 3),                # causal Sq > 1, d 256
    (2, 8, 8, 2, 700, 96, 48, TL, [700, 95], None),                  # a page size that is no power of two
    (3, 8, 2, 1, 600, 128, 128, NONE, [600, 0, 129], 5),             # an empty sequence: O = 0, lse = -inf
]


@pytest.mark.parametrize("case", DEC_CASES, ids=lambda c: f"b{c[0]}h{c[1]}/{c[2]}s{c[3]}x{c[4]}d{c[5]}ps{c[6]}m{c[7]}")
def test_paged_decode(handle, rng, case):
    b, hq, hkv, sq, seq, d, ps, mask, lens, splits = case
    pb = PagedProblem(rng, b, hq, hkv, sq, seq, d, ps, BF16, mask, lens)
    with tuning.override({"attention.DECODE_SPLITS": splits}):
        _check(handle, pb, "dec")
        if splits not in (None, 1):
            assert pb.ws_size > 0  # partials and the combine


@pytest.mark.parametrize("case", DEC_CASES, ids=lambda c: f"b{c[0]}h{c[1]}/{c[2]}s{c[3]}x{c[4]}d{c[5]}ps{c[6]}m{c[7]}")
def test_paged_decode_pipe(handle, rng, case):
    """tuning.attention.PAGED_DEC_PIPE (dec<T, D, true, true>: page ids loaded an iteration ahead)."""
    b, hq, hkv, sq, seq, d, ps, mask, lens, splits = case
    pb = PagedProblem(rng, b, hq, hkv, sq, seq, d, ps, BF16, mask, lens)
    with tuning.override({"attention.DECODE_SPLITS": splits, "attention.PAGED_DEC_PIPE": True}):
        _check(handle, pb, "dec")


def test_paged_prefill_on_the_decode_kernel_pipe(handle, rng):
    """PAGED_DEC_PIPE on a long key range a CTA (one split): many iterations of the page-id pipeline."""
    pb = PagedProblem(rng, 2, 8, 2, 40, 3000, 128, 16, BF16, BR, [3000, 1111])
    with tuning.override({"attention.PAGED_WS": False, "attention.PAGED_DEC_PIPE": True,
                          "attention.DECODE_SPLITS": 1}):
        _check(handle, pb, "dec")


def test_paged_decode_nhd_f16(handle, rng):
    pb = PagedProblem(rng, 2, 8, 2, 1, 1500, 128, 32, F16, NONE, [1500, 777], layout="nhd")
    with tuning.override({"attention.DECODE_SPLITS": 3}):
        _check(handle, pb, "dec")


def test_paged_decode_without_stats_and_wide_table(handle, rng):
    """statsDesc NULL, and a table with more pages than maxSeqLenKV needs (maxPages 50; 700 keys of 16: 44)."""
    pb = PagedProblem(rng, 2, 8, 2, 1, 700, 64, 16, BF16, NONE, [700, 250], max_pages=50)
    pb.forward(handle, stats=False)
    o, _, so, _ = pb.ref_forward()
    assert_close(pb.o.download(), o, BF16, "O", scale=so)
    assert np.isnan(pb.lse.download()).all()


# ----------------------------------------------------------------------------- prefill (fwd_ws paged)

def _sm90(handle):
    if handle.arch != "sm_90":
        pytest.skip("the paged warp-specialized forward is sm_90 only")


WS_CASES = [  # b, hq, hkv, sq, max_seq, d, ps, mask, lens_kv, lens_q, producer
    (3, 8, 2, 200, 768, 128, 128, BR, [700, 129, 300], None, "tma"),    # TMA: one box a page
    (2, 4, 4, 150, 1024, 64, 256, NONE, [1000, 513], [150, 77], "tma"),  # two tiles a page, query lengths
    (2, 8, 2, 130, 520, 256, 64, TL, [520, 100], None, "tma"),           # d 256: 64-key tiles
    (3, 8, 2, 200, 640, 128, 16, BR, [640, 17, 300], None, "tma"),       # 16-key pages: 8 boxes a tile
    (2, 8, 2, 180, 700, 128, 64, NONE, [700, 65], None, "tma"),          # 2 boxes a tile, one past the keys
    (2, 16, 2, 100, 300, 64, 48, NONE, [300, 1], None, "cp.async"),      # 48 does not divide 128: the table
    (2, 4, 1, 64, 1000, 256, 32, BR, [999, 64], None, "tma"),            # MQA, d 256, 2 boxes a tile
]


def run_prefill(handle, rng, case, dtype=BF16, layout="hnd"):
    b, hq, hkv, sq, seq, d, ps, mask, lens, lens_q, _ = case
    pb = PagedProblem(rng, b, hq, hkv, sq, seq, d, ps, dtype, mask, lens, lens_q, layout=layout)
    _check(handle, pb, "ws")
    assert pb.ws_size == 0
    return pb


@pytest.mark.parametrize("case", WS_CASES, ids=lambda c: f"b{c[0]}h{c[1]}/{c[2]}s{c[3]}x{c[4]}d{c[5]}ps{c[6]}m{c[7]}")
def test_paged_prefill(handle, rng, case):
    _sm90(handle)
    run_prefill(handle, rng, case)
    assert WS.LAST_PAGED == case[-1]


def test_paged_prefill_small_pages_cp_async(handle, rng):
    """PAGED_TMA_SMALL off: pages smaller than the tile go through the table by cp.async."""
    _sm90(handle)
    with tuning.override({"attention.PAGED_TMA_SMALL": False}):
        run_prefill(handle, rng, WS_CASES[3])
        assert WS.LAST_PAGED == "cp.async"
        run_prefill(handle, rng, WS_CASES[6])
        assert WS.LAST_PAGED == "cp.async"


def test_paged_prefill_cp_async_switch_nhd_f16(handle, rng):
    """PAGED_TMA off: the cp.async producer for a page size TMA would take; NHD pages, fp16."""
    _sm90(handle)
    pb = PagedProblem(rng, 2, 8, 2, 140, 512, 128, 128, F16, BR, [512, 200], layout="nhd")
    _check(handle, pb, "ws")
    assert WS.LAST_PAGED == "tma"
    with tuning.override({"attention.PAGED_TMA": False}):
        _check(handle, pb, "ws")
    assert WS.LAST_PAGED == "cp.async"


def test_paged_prefill_on_the_decode_kernel(handle, rng):
    """PAGED_WS off: a prefill runs on dec (16 rows a CTA), same answer; d 96 always does."""
    pb = PagedProblem(rng, 2, 8, 2, 100, 600, 128, 64, BF16, TL, [600, 333])
    with tuning.override({"attention.PAGED_WS": False}):
        _check(handle, pb, "dec")
    pb = PagedProblem(rng, 2, 4, 2, 70, 300, 96, 32, BF16, BR, [300, 41])
    _check(handle, pb, "dec")


def test_paged_matches_the_contiguous_forward(handle, rng):
    """The same K / V as contiguous BSHD tensors through attention_forward: the same O (both kernels
    round alike; compared within the tolerance, not bitwise: the paged call may take another producer)."""
    pb = PagedProblem(rng, 2, 8, 2, 1, 1000, 128, 16, BF16, NONE, [1000, 1000])
    pb.forward(handle)
    o_paged = pb.o.download()
    kd = R.gather_pages(pb.pools[0].values, pb.tables[0][1], 1000, pb.lens_kv)
    vd = R.gather_pages(pb.pools[1].values, pb.tables[1][1], 1000, pb.lens_kv)
    k, v = DevTensor(kd.shape, BF16), DevTensor(vd.shape, BF16)
    k.upload(kd)
    v.upload(vd)
    pb.o.poison()
    pydnn.attention_forward(handle, pb.attn, pb.q.desc, pb.q.ptr, k.desc, k.ptr, v.desc, v.ptr, pb.o.desc, pb.o.ptr,
                            None, None, None, None, None, 0)
    _, _, so, _ = pb.ref_forward()
    assert_close(o_paged, pb.o.download(), BF16, "O paged vs contiguous", scale=so)


def test_checked_mode_page_ids(handle, rng, monkeypatch):
    """PYDNN_CHECKED=1: a live key's page id outside [0, pages) is BAD_PARAM naming the table slot; an id
    past the sequence's last page is not looked at."""
    from pydnn import buffers
    pb = PagedProblem(rng, 2, 8, 2, 1, 300, 64, 16, BF16, NONE, [300, 20])
    monkeypatch.setattr(buffers, "CHECKED", True)
    monkeypatch.setattr(A, "CHECKED", True)
    pb.forward(handle)  # -1 past each sequence's pages: fine
    tk, tab = pb.tables[0]
    bad = tab.copy()
    bad[1, 1] = pb.pages  # batch 1's second page (keys 16..19 live)
    tk.buf.copy_from_numpy(bad.astype(np.int32).reshape(-1))
    with pytest.raises(pydnn.PydnnError) as e:
        pb.forward(handle)
    assert e.value.status == pydnn.PYDNN_STATUS_BAD_PARAM and "pageTableK[1][1]" in str(e.value)
