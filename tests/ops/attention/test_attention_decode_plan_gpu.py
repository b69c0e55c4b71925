"""The decode forward with the planner's own split counts and the per-handle record of repeated calls, on
the GPU, against the float64 reference with poisoned outputs and workspace (DecodeProblem): the decode
sweep's GQA ratios (32/8, 64/8) and others at batch 1..5 with odd KV lengths (a key, a partial tile, one
past a power of two), many splits (dec_combine's shared lse buffer full, its four-at-a-time loop and its
remainder), every workspace size from the query's down to none, more than 65535 combined rows (the
combine's two-dimensional grid), and repeated calls through the record: new buffers, a re-set descriptor,
another split count."""
import numpy as np
import pytest

import pydnn
from devtensor import DevTensor, assert_close
from pydnn import tuning
from pydnn.ops import attention as A
from test_attention_decode_gpu import DecodeProblem
from test_attention_gpu import BF16, BR, F16, NONE, TL, _check_forward

pytestmark = pytest.mark.gpu

AUTO = [  # b, hq, hkv, sq, skv, d, mask, dtype
    (1, 32, 8, 1, 4097, 128, NONE, BF16),      # the sweep's b1 GQA 4, a key past 4096
    (1, 64, 8, 1, 16385, 128, NONE, BF16),     # GQA 8: ~32 splits of 8 K/V heads
    (4, 32, 8, 1, 8191, 128, NONE, BF16),      # b4: 8 splits (256 CTAs), a partial last tile
    (3, 64, 8, 1, 1, 128, NONE, BF16),         # one key: one split
    (1, 32, 8, 1, 63, 128, NONE, F16),         # less than a tile
    (2, 64, 8, 1, 12345, 64, NONE, BF16),
    (1, 8, 2, 1, 20001, 256, NONE, BF16),       # (D = 256: one CTA an SM)
    (5, 40, 8, 1, 3001, 96, NONE, BF16),       # GQA 5
    (2, 32, 8, 3, 9999, 128, BR, BF16),        # three rows, causal bottom-right: 12 rows a CTA
    (1, 16, 2, 2, 7000, 128, TL, BF16),        # top-left: two keys visible, one split
]


def _id(c):
    return f"b{c[0]}h{c[1]}/{c[2]}s{c[3]}x{c[4]}d{c[5]}m{c[6]}{'f16' if c[7] == F16 else ''}"


@pytest.mark.parametrize("case", AUTO, ids=[_id(c) for c in AUTO])
def test_planned_splits(handle, rng, case):
    b, hq, hkv, sq, skv, d, mask, dt = case
    pb = DecodeProblem(rng, b, hq, hkv, sq, skv, d, dt, mask, "bshd")
    pl = A.decode_plan(handle.sm_count, b, hq, hkv, sq, skv, d, mask)
    _check_forward(handle, pb)
    assert pb.ws_size == pl.ws
    if skv >= 4096 and mask == NONE:
        assert pl.splits > 1  # the planner split it: the combine ran


@pytest.mark.parametrize("splits,skv,d", [(256, 16384, 64), (37, 4731, 128), (17, 1080, 256), (13, 4000, 96)])
def test_many_splits(handle, rng, splits, skv, d):
    pb = DecodeProblem(rng, 1, 8, 2, 1, skv, d, BF16, NONE, "bhsd", splits=splits)
    with tuning.override({"attention.DECODE_SPLITS": splits}):
        assert A.decode_plan(handle.sm_count, 1, 8, 2, 1, skv, d, NONE).splits == splits
    _check_forward(handle, pb)


def _forward_ws(handle, pb, size):
    ws = pydnn.DeviceArray((max(size, 16),), np.uint8)
    ws.fill_bytes(0xFF)
    pb.o.poison()
    pb.lse.poison()
    pydnn.attention_forward(handle, pb.attn, pb.q.desc, pb.q.ptr, pb.k.desc, pb.k.ptr, pb.v.desc, pb.v.ptr,
                            pb.o.desc, pb.o.ptr, pb.lse.desc, pb.lse.ptr, None, None, ws.ptr if size else None, size)
    return ws


def _check_result(pb, what):
    o, lse, so, slse = pb.ref_forward()
    assert_close(pb.o.download(), o, pb.dtype, f"O ({what})", scale=so)
    assert_close(pb.lse.download()[..., 0], lse, pydnn.PYDNN_DATA_FLOAT, f"lse ({what})", scale=slse)
    pb.o.check_untouched()


def test_every_workspace_size(handle, rng):
    """The size query's bytes, one less, a third, what two splits need, one byte less than that, none:
    the plan takes the most splits that fit, and every one is right."""
    b, hq, hkv, skv, d = 2, 32, 8, 10000, 128
    pb = DecodeProblem(rng, b, hq, hkv, 1, skv, d, BF16, NONE, "bshd")
    full = pydnn.get_attention_forward_workspace_size(handle, pb.attn, pb.q.desc, pb.k.desc)
    two = A.decode_ws(b * hq, 2, d)
    seen = set()
    for size in (full, full - 1, full // 3, two, two - 1, 0):
        pl = A.decode_plan(handle.sm_count, b, hq, hkv, 1, skv, d, NONE, size)
        assert pl.ws <= size
        seen.add(pl.splits)
        ws = _forward_ws(handle, pb, size)
        _check_result(pb, f"workspace {size}, {pl.splits} splits")
        del ws
    assert len(seen) >= 4 and 1 in seen


def test_combine_past_65535_rows(handle, rng):
    """b 32 x 128 heads x 16 rows = 65536 rows: dec_combine's grid is (65535, 2)."""
    pb = DecodeProblem(rng, 32, 128, 8, 16, 200, 64, BF16, BR, "bhsd", splits=2)
    assert 32 * 128 * 16 > A.MAX_GRID_YZ
    _check_forward(handle, pb)


def test_repeated_calls_through_the_record(rng):
    """A second call with the same descriptors runs from the handle's record: with other buffers (new
    Q / K / V / O / stats / workspace) it reads and writes those; a re-set descriptor (another scale) and
    another forced split count make new records; all against the reference. (A handle of its own: the
    session's may clear its records when full.)"""
    handle = pydnn.create()
    try:
        _repeated_calls(handle, rng)
    finally:
        pydnn.destroy(handle)


def _repeated_calls(handle, rng):
    pb = DecodeProblem(rng, 1, 64, 8, 1, 9000, 128, BF16, NONE, "bshd")
    _check_forward(handle, pb)
    keys = [k for k in handle.prepared if type(k) is tuple and k and k[0] == "attention.dec" and k[1] is pb.attn]
    assert len(keys) == 1
    rec = handle.prepared[keys[0]]
    for _ in range(2):  # new buffers each time, the same descriptor objects (the record's key)
        old = (pb.q, pb.k, pb.v, pb.o, pb.lse)
        pb.q, pb.k, pb.v, pb.o, pb.lse = (DevTensor(t.dims, t.dtype, t.strides) for t in old)
        for t, o in zip((pb.q, pb.k, pb.v, pb.o, pb.lse), old):
            t.desc = o.desc
        for t in (pb.q, pb.k, pb.v):
            t.random(rng, -2.0, 2.0)
        _check_forward(handle, pb)
        assert handle.prepared[keys[0]] is rec
        assert [k for k in handle.prepared if type(k) is tuple and k and k[0] == "attention.dec"
                and k[1] is pb.attn] == keys  # no new record: the call replayed this one
    pb.scale = 0.05
    pydnn.set_attention_descriptor(pb.attn, 64, 8, 128, pb.scale, NONE, 0.0, 0)
    _check_forward(handle, pb)
    pb.splits = 3
    _check_forward(handle, pb)
    pb.splits = None
    pb.mask = BR
    pydnn.set_attention_descriptor(pb.attn, 64, 8, 128, pb.scale, BR, 0.0, 0)
    _check_forward(handle, pb)
    n = sum(1 for k in handle.prepared if type(k) is tuple and k and k[0] == "attention.dec" and k[1] is pb.attn)
    assert n == 4


def test_record_then_lengths(handle, rng):
    """A recorded call, then the same descriptors with KV lengths (the full path: the record has none),
    then without again."""
    pb = DecodeProblem(rng, 3, 32, 8, 1, 5000, 128, BF16, NONE, "bshd")
    _check_forward(handle, pb)
    lens = ([1, 1, 1], [5000, 17, 0])
    pb.lens = lens
    pb.lens_dev = [None, None]
    for i, arr in enumerate(lens):
        a = pydnn.DeviceArray((3,), np.int32)
        a.copy_from_numpy(np.asarray(arr, np.int32))
        pb.lens_dev[i] = a
    _check_forward(handle, pb)
    pb.lens, pb.lens_dev = None, [None, None]
    _check_forward(handle, pb)
