"""The split-KV decode forward (dec + dec_combine in ptx/attention.cu) on the GPU, against the float64
reference with poisoned outputs (O, lse) and a poisoned workspace from the size query, the tolerances of
tests/ops/attention/test_attention_gpu.py: several split counts (forced and automatic), GQA row grouping
over several row blocks, MQA, causal with Sq > 1 (both alignments), variable lengths (empty splits, empty
rows), head dims 64 / 96 / 128 / 256, no workspace (one split), no statistics, the same results as the
regular forward, the backward fed by the decode forward's lse, and CUDA graph capture."""
import numpy as np
import pytest

import pydnn
from devtensor import assert_close
from pydnn import tuning
from pydnn.ops import attention as A
from test_attention_gpu import BF16, BR, F16, NONE, TL, Problem, _check_backward, _check_forward

pytestmark = pytest.mark.gpu


# ----------------------------------------------------------------------------- decode

class DecodeProblem(Problem):
    """A Problem whose forward passes the workspace the size query reports (poisoned: all-ones bytes,
    NaN as floats) and, with `splits`, forces the split count."""

    def __init__(self, *args, splits=None, **kw):
        super().__init__(*args, **kw)
        self.splits = splits

    def forward(self, handle, use_ws=True):
        with tuning.override({"attention.DECODE_SPLITS": self.splits}):
            n = pydnn.get_attention_forward_workspace_size(handle, self.attn, self.q.desc, self.k.desc)
            self.ws_size = n
            ws = pydnn.DeviceArray((max(n, 16),), np.uint8)
            ws.fill_bytes(0xFF)
            self.o.poison()
            self.lse.poison()
            pydnn.attention_forward(handle, self.attn, self.q.desc, self.q.ptr, self.k.desc, self.k.ptr, self.v.desc,
                                    self.v.ptr, self.o.desc, self.o.ptr, self.lse.desc, self.lse.ptr,
                                    self.lens_dev[0], self.lens_dev[1], ws.ptr if use_ws else None,
                                    n if use_ws else 0)
            self._ws = ws  # (kept alive until the results are read)


DEC_CASES = [  # b, hq, hkv, sq, skv, d, mask, lens (q, kv) or None, splits (None: automatic)
    (1, 8, 2, 1, 4096, 128, NONE, None, None),        # GQA 4 per K/V head, one sequence: automatic splits
    (1, 8, 2, 1, 4096, 128, NONE, None, 1),           # one split: O and lse straight from dec
    (2, 8, 2, 1, 3000, 64, NONE, None, 3),
    (2, 32, 4, 1, 2500, 96, NONE, None, 8),
    (1, 4, 4, 1, 2049, 256, NONE, None, 5),           # MHA, a partial last tile
    (2, 16, 1, 1, 1500, 128, NONE, None, 4),          # MQA: 16 rows, one row block
    (1, 12, 2, 4, 2100, 128, BR, None, 6),            # causal Sq > 1: 6 x 4 = 24 rows, two row blocks
    (2, 8, 8, 3, 1000, 96, TL, None, None),           # top-left: only the first keys are visible
    (3, 8, 2, 2, 1800, 64, BR, ([2, 1, 0], [1800, 700, 33]), 7),  # lengths; some splits empty
    (2, 4, 2, 16, 1024, 256, BR, None, 3),            # the longest decode query (DECODE_MAX_SQ)
    (1, 64, 8, 1, 8192, 128, NONE, None, None),       # a larger automatic case
]


def _dec_id(c):
    return f"b{c[0]}h{c[1]}/{c[2]}s{c[3]}x{c[4]}d{c[5]}m{c[6]}{'L' if c[7] else ''}sp{c[8]}"


@pytest.mark.parametrize("case", DEC_CASES, ids=[_dec_id(c) for c in DEC_CASES])
def test_decode_forward(handle, rng, case):
    b, hq, hkv, sq, skv, d, mask, lens, splits = case
    pb = DecodeProblem(rng, b, hq, hkv, sq, skv, d, BF16, mask, "bshd", lens=lens, splits=splits)
    assert A.takes_decode(pb.attn, sq)
    _check_forward(handle, pb)
    pl = A.decode_plan(handle.sm_count, b, hq, hkv, sq, skv, d, mask)
    if splits is None:
        assert pb.ws_size == pl.ws
    if splits not in (None, 1):
        assert pb.ws_size > 0  # the combine ran


@pytest.mark.parametrize("d", [64, 128])
def test_decode_forward_f16(handle, rng, d):
    pb = DecodeProblem(rng, 2, 8, 2, 2, 2000, d, F16, BR, "bhsd", splits=4)
    _check_forward(handle, pb)


def test_decode_without_workspace(handle, rng):
    """Workspace 0 where the size query asks for more: one split, still the right answer."""
    pb = DecodeProblem(rng, 1, 8, 2, 1, 5000, 128, BF16, NONE, "bshd")
    pb.forward(handle, use_ws=False)
    assert pb.ws_size > 0
    o, lse, so, slse = pb.ref_forward()
    assert_close(pb.o.download(), o, BF16, "O", scale=so)
    got = pb.lse.download()[..., 0]
    assert_close(got, lse, pydnn.PYDNN_DATA_FLOAT, "lse", scale=slse)


@pytest.mark.parametrize("d", [96, 256])
def test_decode_matches_the_regular_forward(handle, rng, d):
    pb = DecodeProblem(rng, 2, 8, 2, 3, 1500, d, BF16, BR, "bshd", splits=5)
    pb.forward(handle)
    o_dec, lse_dec = pb.o.download(), pb.lse.download()
    with tuning.override({"attention.DECODE": False}):
        pb.o.poison()
        Problem.forward(pb, handle)
    o_reg, lse_reg = pb.o.download(), pb.lse.download()
    _, _, so, slse = pb.ref_forward()
    assert_close(o_dec, o_reg, BF16, "O decode vs regular", scale=so)
    assert_close(lse_dec[..., 0], lse_reg[..., 0], pydnn.PYDNN_DATA_FLOAT, "lse decode vs regular", scale=slse)


@pytest.mark.parametrize("d", [96, 256])
def test_backward_after_decode_forward(handle, rng, d):
    """The backward reads the decode forward's O and lse (the combine's log-sum-exp)."""
    pb = DecodeProblem(rng, 1, 6, 2, 4, 700, d, BF16, BR, "bshd", splits=3)
    _check_forward(handle, pb)
    _check_backward(handle, pb, rng, modes=(1, 0))


def test_decode_capture_and_replay(rng):
    """The decode forward (dec + dec_combine, partials in the caller's workspace) neither allocates nor
    synchronizes: it captures into a CUDA graph, and replays read the inputs' current contents."""
    from pydnn._cuda import driver
    h = pydnn.create()
    stream = driver.stream_create()
    try:
        pydnn.set_stream(h, stream)
        pb = DecodeProblem(rng, 2, 8, 2, 2, 3000, 128, BF16, BR, "bshd")
        n = pydnn.get_attention_forward_workspace_size(h, pb.attn, pb.q.desc, pb.k.desc)
        assert n > 0  # more than one split: the combine is captured too
        ws = pydnn.DeviceArray((n,), np.uint8)

        def fwd():
            pydnn.attention_forward(h, pb.attn, pb.q.desc, pb.q.ptr, pb.k.desc, pb.k.ptr, pb.v.desc, pb.v.ptr,
                                    pb.o.desc, pb.o.ptr, pb.lse.desc, pb.lse.ptr, None, None, ws.ptr, n)
        fwd()  # warm-up: loads the modules
        driver.synchronize()
        g = driver.Graph(stream)
        with g:
            fwd()
        for _ in range(2):
            for t in (pb.q, pb.k, pb.v):
                t.random(rng, -2.0, 2.0)
            pb.o.poison()
            pb.lse.poison()
            ws.fill_bytes(0xFF)
            driver.synchronize()
            g.launch()
            driver.stream_synchronize(stream)
            o, lse, so, slse = pb.ref_forward()
            assert_close(pb.o.download(), o, BF16, "O (graph)", scale=so)
            assert_close(pb.lse.download()[..., 0], lse, pydnn.PYDNN_DATA_FLOAT, "lse (graph)", scale=slse)
    finally:
        pydnn.destroy(h)
        driver.stream_destroy(stream)


@pytest.mark.parametrize("splits", [1, 4])
def test_decode_without_stats(handle, rng, splits):
    """statsDesc NULL: O from dec (one split) or dec_combine, the (poisoned) statistics left unwritten."""
    pb = DecodeProblem(rng, 1, 8, 2, 1, 3000, 64, BF16, NONE, "bshd", splits=splits)
    with tuning.override({"attention.DECODE_SPLITS": splits}):
        n = pydnn.get_attention_forward_workspace_size(handle, pb.attn, pb.q.desc, pb.k.desc)
        ws = pydnn.DeviceArray((max(n, 16),), np.uint8)
        pydnn.attention_forward(handle, pb.attn, pb.q.desc, pb.q.ptr, pb.k.desc, pb.k.ptr, pb.v.desc, pb.v.ptr,
                                pb.o.desc, pb.o.ptr, None, None, None, None, ws.ptr, n)
    o, _, so, _ = pb.ref_forward()
    assert_close(pb.o.download(), o, BF16, "O", scale=so)
    assert np.isnan(pb.lse.download()).all()
