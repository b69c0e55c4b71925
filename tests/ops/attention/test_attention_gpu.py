"""Fused attention on the GPU against the float64 reference (pydnn/reference/attention.py): forward (O and
lse) and backward (dQ, dK, dV) over bf16 / fp16, head dims 64 / 128, MHA / GQA / MQA, no mask and both
causal alignments, BHSD and BSHD layouts, lengths that are not multiples of the tiles, more queries than
keys (rows that see nothing), variable lengths per batch; outputs poisoned first and gaps checked
untouched; the backward in both dQ modes (deterministic: run twice, must agree bit for bit; atomic),
every forward tile variant, dropout (the Philox mask replayed by the reference), graph capture. Shapes stay small (the reference is O(S^2))."""
import numpy as np
import pytest

import pydnn
from devtensor import DevTensor, assert_close
from pydnn.ops import attention as A

pytestmark = pytest.mark.gpu

F32, F16, BF16 = pydnn.PYDNN_DATA_FLOAT, pydnn.PYDNN_DATA_HALF, pydnn.PYDNN_DATA_BFLOAT16
NONE, TL, BR = (pydnn.PYDNN_ATTN_MASK_NONE, pydnn.PYDNN_ATTN_MASK_CAUSAL_TOP_LEFT,
                pydnn.PYDNN_ATTN_MASK_CAUSAL_BOTTOM_RIGHT)


def _strides(dims, layout, pad=0):
    b, h, s, d = dims
    row = d + pad
    if layout == "bhsd":
        return (h * s * row, s * row, row, 1)
    return (s * h * row, row, h * row, 1)  # bshd


class Problem:
    def __init__(self, rng, b, hq, hkv, sq, skv, d, dtype, mask, layout="bhsd", lens=None, pad=0, dropout=None):
        from pydnn.reference import attention as R  # noqa: F401 - imported by the tests below
        self.b, self.hq, self.hkv, self.sq, self.skv, self.d = b, hq, hkv, sq, skv, d
        self.dtype, self.mask, self.scale = dtype, mask, 1.0 / np.sqrt(d)
        self.attn = pydnn.create_attention_descriptor()
        self.dropout = dropout  # None or (p, seed)
        p, seed = dropout or (0.0, 0)
        pydnn.set_attention_descriptor(self.attn, hq, hkv, d, self.scale, mask, p, seed)
        qd, kd = (b, hq, sq, d), (b, hkv, skv, d)
        self.q = DevTensor(qd, dtype, _strides(qd, layout, pad))
        self.k = DevTensor(kd, dtype, _strides(kd, layout, pad))
        self.v = DevTensor(kd, dtype, _strides(kd, layout, pad))
        self.o = DevTensor(qd, dtype, _strides(qd, layout, pad))
        self.lse = DevTensor((b, hq, sq, 1), F32)
        for t in (self.q, self.k, self.v):
            t.random(rng, -2.0, 2.0)
        self.lens = lens
        self.lens_dev = [None, None]
        if lens is not None:
            for i, arr in enumerate(lens):
                if arr is None:  # (lengths for one side only)
                    continue
                a = pydnn.DeviceArray((b,), np.int32)
                a.copy_from_numpy(np.asarray(arr, np.int32))
                self.lens_dev[i] = a

    def forward(self, handle):
        pydnn.attention_forward(handle, self.attn, self.q.desc, self.q.ptr, self.k.desc, self.k.ptr, self.v.desc,
                                self.v.ptr, self.o.desc, self.o.ptr, self.lse.desc, self.lse.ptr,
                                self.lens_dev[0], self.lens_dev[1], None, 0)

    def ref_forward(self):
        from pydnn.reference import attention as R
        lq, lkv = self.lens if self.lens is not None else (None, None)
        return R.forward(self.q.values, self.k.values, self.v.values, self.scale, self.mask, lq, lkv, self.dropout)

    def backward(self, handle, rng, det=1, poison=True):
        qd, kd = self.q.dims, self.k.dims
        if not hasattr(self, "do"):
            self.do = DevTensor(qd, self.dtype, self.q.strides)
            self.do.random(rng, -2.0, 2.0)
            self.dq = DevTensor(qd, self.dtype, self.q.strides)
            self.dk = DevTensor(kd, self.dtype, self.k.strides)
            self.dv = DevTensor(kd, self.dtype, self.k.strides)
            n = pydnn.get_attention_backward_workspace_size(handle, self.attn, self.q.desc, self.k.desc)
            self.ws = pydnn.DeviceArray((max(n, 16),), np.uint8)
            self.ws.fill_bytes(0xFF)
            self.ws_size = n
        for t in (self.dq, self.dk, self.dv):
            if poison:
                t.poison()
        pydnn.attention_backward(handle, self.attn, self.q.desc, self.q.ptr, self.k.desc, self.k.ptr, self.v.desc,
                                 self.v.ptr, self.o.desc, self.o.ptr, self.do.desc, self.do.ptr, self.lse.desc,
                                 self.lse.ptr, self.dq.desc, self.dq.ptr, self.dk.desc, self.dk.ptr, self.dv.desc,
                                 self.dv.ptr, self.lens_dev[0], self.lens_dev[1], det, self.ws.ptr, self.ws_size)

    def ref_backward(self):
        from pydnn.reference import attention as R
        lq, lkv = self.lens if self.lens is not None else (None, None)
        return R.backward(self.q.values, self.k.values, self.v.values, self.do.values, self.scale, self.mask, lq, lkv,
                          self.dropout)


def _check_forward(handle, pb):
    pb.forward(handle)
    o, lse, so, slse = pb.ref_forward()
    assert_close(pb.o.download(), o, pb.dtype, "O", scale=so)
    got = pb.lse.download()[..., 0]
    dead = np.isneginf(lse)
    assert np.isneginf(got[dead]).all(), "lse of rows that see nothing must be -inf"
    assert_close(np.where(dead, 0, got), np.where(dead, 0, lse), F32, "lse", scale=slse)
    pb.o.check_untouched()


def _check_backward(handle, pb, rng, modes=(1,)):
    """dQ, dK, dV against the reference for each deterministic mode in `modes` (1: the dQ pass, bitwise
    repeatable, checked by a second run; 0: atomic dQ)."""
    ref = None
    for det in modes:
        pb.backward(handle, rng, det)
        if ref is None:  # (the first backward call draws dO)
            ref = pb.ref_backward()
        dq, dk, dv, (sdq, sdk, sdv) = ref
        got = [t.download() for t in (pb.dq, pb.dk, pb.dv)]
        for g, r, s, name in zip(got, (dq, dk, dv), (sdq, sdk, sdv), ("dQ", "dK", "dV")):
            assert_close(g, r, pb.dtype, f"{name} (deterministic={det})", scale=s)
        for t in (pb.dq, pb.dk, pb.dv):
            t.check_untouched()
        if det:
            pb.backward(handle, rng, 1)  # the same bits again
            for g, t, name in zip(got, (pb.dq, pb.dk, pb.dv), ("dQ", "dK", "dV")):
                assert np.array_equal(g, t.download()), f"{name} differs between two deterministic runs"


CASES = [  # b, hq, hkv, sq, skv, d, layout
    (2, 4, 4, 150, 150, 64, "bhsd"),     # MHA, lengths not multiples of the tiles
    (1, 4, 2, 70, 200, 128, "bshd"),     # GQA, more keys than queries
    (2, 4, 1, 200, 97, 64, "bshd"),      # MQA, more queries than keys (bottom-right: empty rows)
    (1, 2, 2, 256, 256, 128, "bhsd"),    # whole tiles
]


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("mask", [NONE, TL, BR], ids=["none", "tl", "br"])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}d{c[5]}{c[6]}" for c in CASES])
def test_forward_backward(handle, rng, dtype, mask, case):
    b, hq, hkv, sq, skv, d, layout = case
    pb = Problem(rng, b, hq, hkv, sq, skv, d, dtype, mask, layout)
    _check_forward(handle, pb)
    _check_backward(handle, pb, rng)


@pytest.mark.parametrize("mask", [NONE, TL, BR], ids=["none", "tl", "br"])
@pytest.mark.parametrize("d", [64, 128])
def test_variable_lengths(handle, rng, mask, d):
    # padded rows in the strides (pad 8 elements) so the gaps are checked untouched too
    pb = Problem(rng, 3, 4, 2, 130, 140, d, BF16, mask, "bshd", lens=([130, 37, 0], [5, 140, 64]), pad=8)
    _check_forward(handle, pb)
    _check_backward(handle, pb, rng)


def check_forward_without_stats(handle, pb):
    """The forward with statsDesc NULL: O checked, the (poisoned) statistics buffer left unwritten."""
    pydnn.attention_forward(handle, pb.attn, pb.q.desc, pb.q.ptr, pb.k.desc, pb.k.ptr, pb.v.desc, pb.v.ptr,
                            pb.o.desc, pb.o.ptr, None, None, None, None, None, 0)
    o, _, so, _ = pb.ref_forward()
    assert_close(pb.o.download(), o, BF16, "O", scale=so)
    assert np.isnan(pb.lse.download()).all()  # every element still poisoned: nothing written


def test_forward_without_stats(handle, rng):
    check_forward_without_stats(handle, Problem(rng, 1, 2, 2, 65, 65, 64, BF16, TL))


def test_c_program_on_gpu(tmp_path):
    from cprog import build_and_run
    r = build_and_run("attention_gpu", tmp_path, extra=["-ldl", "-lm"])
    print(r.stdout, r.stderr)
    assert "FAIL" not in r.stdout and r.returncode == 0, r.stdout + r.stderr
    for what in ("forward O numbers", "forward lse numbers", "backward dQ numbers", "backward dK numbers",
                 "backward dV numbers", "head dim 80: NOT_SUPPORTED"):
        assert f"ok {what}" in r.stdout, r.stdout + r.stderr


# ---- the faster variants (after the validated paths, so that -x reports those first)

@pytest.mark.parametrize("tile", A.FWD_TILES[128], ids=[f"{n}x{nl}" for n, nl in A.FWD_TILES[128]])
@pytest.mark.parametrize("mask", [NONE, BR], ids=["none", "br"])
def test_forward_tiles(handle, rng, monkeypatch, tile, mask):
    """Every forward tile instantiated at D = 128 (the benchmark measures each; one is the default)."""
    monkeypatch.setitem(A.FWD_N, 128, tile)
    pb = Problem(rng, 2, 4, 2, 150, 211, 128, BF16, mask, "bshd", lens=([150, 77], [211, 100]))
    _check_forward(handle, pb)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("mask", [NONE, TL, BR], ids=["none", "tl", "br"])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}d{c[5]}{c[6]}" for c in CASES])
def test_backward_atomic_dq(handle, rng, dtype, mask, case):
    b, hq, hkv, sq, skv, d, layout = case
    pb = Problem(rng, b, hq, hkv, sq, skv, d, dtype, mask, layout)
    pb.forward(handle)
    _check_backward(handle, pb, rng, modes=(0,))


@pytest.mark.parametrize("d", [64, 128])
def test_backward_atomic_dq_variable_lengths(handle, rng, d):
    pb = Problem(rng, 3, 4, 2, 130, 140, d, BF16, BR, "bshd", lens=([130, 37, 0], [5, 140, 64]), pad=8)
    pb.forward(handle)
    _check_backward(handle, pb, rng, modes=(0,))


DROP_CASES = [(2, 4, 2, 150, 97, 64, "bshd"), (1, 2, 2, 70, 130, 128, "bhsd")]


@pytest.mark.parametrize("mask", [NONE, BR], ids=["none", "br"])
@pytest.mark.parametrize("case", DROP_CASES, ids=[f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}d{c[5]}" for c in DROP_CASES])
def test_dropout(handle, rng, mask, case):
    """Dropout on P: the reference replays the Philox mask element by element (forward, both backwards)."""
    b, hq, hkv, sq, skv, d, layout = case
    pb = Problem(rng, b, hq, hkv, sq, skv, d, BF16, mask, layout, lens=([sq, sq // 2][:b], [skv, 40][:b]),
                 dropout=(0.2, 0x123456789ABCDEF))
    _check_forward(handle, pb)
    _check_backward(handle, pb, rng, modes=(1, 0))


def test_capture_and_replay(rng):
    """Forward and backward (both modes) enqueue no synchronization or allocation: they capture into a
    CUDA graph, and replays read the buffers' current contents."""
    from pydnn._cuda import driver
    h = pydnn.create()
    stream = driver.stream_create()
    try:
        pydnn.set_stream(h, stream)
        pb = Problem(rng, 1, 4, 2, 100, 90, 64, BF16, BR)
        pb.forward(h)  # warm-up: loads the modules, sets the shared-memory opt-ins
        pb.backward(h, rng, 0)
        pb.backward(h, rng, 1)
        driver.synchronize()
        g = driver.Graph(stream)
        with g:
            pb.forward(h)
            pb.backward(h, rng, 0, poison=False)  # (poisoning, a memset on the NULL stream, is not capturable)
        for _ in range(2):
            for t in (pb.q, pb.k, pb.v):
                t.random(rng, -2.0, 2.0)
            for t in (pb.o, pb.dq, pb.dk, pb.dv):
                t.poison()
            # the uploads and the poisoning run on the legacy NULL stream, which this non-blocking stream
            # does not wait for, and both may still be in flight on return (a pageable host-to-device copy
            # returns once staged; a memset is asynchronous): finish them before the replay reads the buffers
            driver.synchronize()
            g.launch()
            driver.stream_synchronize(stream)
            o, _, so, _ = pb.ref_forward()
            assert_close(pb.o.download(), o, BF16, "O (graph)", scale=so)
            dq, dk, dv, (sdq, sdk, sdv) = pb.ref_backward()
            for t, r, sc, name in ((pb.dq, dq, sdq, "dQ"), (pb.dk, dk, sdk, "dK"), (pb.dv, dv, sdv, "dV")):
                assert_close(t.download(), r, BF16, f"{name} (graph)", scale=sc)
    finally:
        pydnn.destroy(h)
        driver.stream_destroy(stream)
