"""The warp-specialized Hopper attention backward, ptx/attention_ws_bwd.cu (pydnn/ops/attention_ws_bwd.py),
forced on (tuning.attention_bwd.WS, HEAD_DIMS 64 and 128) against the float64 reference: bf16 / fp16, d 64
and d 128, MHA / GQA / MQA, no mask and both causal alignments, BHSD and BSHD, lengths that are not
multiples of the 128-key blocks or the query tiles (TMA's zero fill past the tensor), more keys than
queries and more queries than keys (key blocks that see no query: dK = dV = 0 written, no load issued),
several query tiles and group heads per CTA (the stage ring wrapping many times), the dQ modes (atomic,
by red.global.add or by bulk tensor reductions of a shared fp32 tile (TMA skipping the tile's rows past
seq_q); deterministic: bwd_ws without atomics +
the older dQ pass, bit-identical reruns and the older kernel's bits), the kernel's own CTA order (WS_ORDER)
and the 3-stage ring (WS_STAGES). Outputs poisoned first
and stride gaps checked untouched (test_attention_gpu.py's _check_backward). Every backward call is
checked to have launched bwd_ws (a silent fallback fails); per-batch lengths are checked to go to the
older kernel. The forward producing O and lse is the default one. Skipped on devices other than sm_90."""
import pytest

from pydnn import tuning
from pydnn.ops import attention_wgmma_bwd as W
from pydnn.ops import attention_ws_bwd as WSB
from test_attention_gpu import BF16, BR, F16, NONE, TL, Problem, _check_backward, _check_forward

pytestmark = pytest.mark.gpu
MASKS = [NONE, TL, BR]
MASK_IDS = ["none", "tl", "br"]


@pytest.fixture
def wsb(handle, monkeypatch):
    """bwd_ws forced on for d 64 / 128; returns the list of launches: "ws" / "ws atomic" for bwd_ws (that
    launched), "old" / "old atomic" for bwd_dkdv_wg."""
    if handle.arch != WSB.ARCH:
        pytest.skip(f"the warp-specialized backward runs on {WSB.ARCH} only (device: {handle.arch})")
    monkeypatch.setattr(tuning.attention_bwd, "ENABLED", True)
    monkeypatch.setattr(tuning.attention_bwd, "WS", True)
    monkeypatch.setattr(tuning.attention_bwd, "WS_DQ_CAUSAL", None)  # (WS_DQ as each test sets it)
    monkeypatch.setattr(WSB, "HEAD_DIMS", (64, 128, 256))
    monkeypatch.setattr(WSB, "HEAD_DIMS_DET", (64, 128, 256))
    calls = []
    real_ws, real_old = WSB.launch_dkdv, W.launch_dkdv

    def ws(handle, tag, d, atomic, *args):
        ok = real_ws(handle, tag, d, atomic, *args)
        calls.append(("ws atomic" if atomic else "ws") if ok else "ws refused")
        return ok

    def old(handle, tag, d, atomic, *args):
        calls.append("old atomic" if atomic else "old")
        return real_old(handle, tag, d, atomic, *args)

    monkeypatch.setattr(WSB, "launch_dkdv", ws)
    monkeypatch.setattr(W, "launch_dkdv", old)
    return calls


_LAUNCHES = {0: ["ws atomic"], 1: ["ws", "ws"]}  # deterministic = 1 runs twice (same bits)


def _run(handle, rng, pb, calls, modes=(0, 1)):
    _check_forward(handle, pb)
    _check_backward(handle, pb, rng, modes=modes)
    want = [c for m in modes for c in _LAUNCHES[m]]
    assert calls == want, f"backward dK / dV launches {calls}, expected {want}"


CASES = [  # b, hq, hkv, sq, skv, d, layout
    (2, 4, 4, 150, 150, 64, "bhsd"),     # MHA, lengths not multiples of the tiles
    (1, 4, 2, 70, 200, 128, "bshd"),     # GQA, more keys than queries (top-left: key blocks seeing nothing)
    (2, 4, 1, 200, 97, 64, "bshd"),      # MQA, more queries than keys (bottom-right: empty rows)
    (1, 2, 2, 256, 256, 128, "bhsd"),    # whole tiles
]
IDS = [f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}d{c[5]}{c[6]}" for c in CASES]


@pytest.mark.parametrize("dq", ["bulk", "red", "redpp", "bulkw", "bulkwpp", "bulkwpp1"])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("mask", MASKS, ids=MASK_IDS)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_backward_ws(handle, rng, wsb, monkeypatch, dtype, mask, case, dq):
    """The atomic dQ modes (tuning.attention_bwd.WS_DQ): the bulk reduction of a shared tile (by a consumer
    thread, or by the dedicated writer warp: bulkw, bulkwpp with the ping-pong), red.global.add (redpp:
    ping-pong, the previous tile's); WS_ORDER's default order."""
    monkeypatch.setattr(tuning.attention_bwd, "WS_DQ", dq)
    b, hq, hkv, sq, skv, d, layout = case
    _run(handle, rng, Problem(rng, b, hq, hkv, sq, skv, d, dtype, mask, layout), wsb)


LONG_CASES = [  # several 128-key blocks and query tiles per CTA, partial last ones
    (1, 8, 2, 300, 333, 128, "bshd"),   # GQA 4: 4 heads x 5 tiles a CTA
    (2, 4, 1, 333, 300, 64, "bhsd"),    # MQA
    (1, 2, 2, 512, 512, 128, "bhsd"),   # whole tiles
    (1, 2, 2, 385, 129, 64, "bshd"),    # more queries than keys: one key past a block boundary
    (1, 4, 4, 1000, 1000, 128, "bhsd"), # 16 query tiles a CTA: the ring wraps 8 times
]
LONG_IDS = [f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}d{c[5]}{c[6]}" for c in LONG_CASES]


@pytest.mark.parametrize("dq", ["red", "bulk", "redpp", "bulkw", "bulkwpp", "bulkwpp1"])
@pytest.mark.parametrize("mask", MASKS, ids=MASK_IDS)
@pytest.mark.parametrize("case", LONG_CASES, ids=LONG_IDS)
def test_backward_ws_long(handle, rng, wsb, monkeypatch, mask, case, dq):
    monkeypatch.setattr(tuning.attention_bwd, "WS_DQ", dq)
    b, hq, hkv, sq, skv, d, layout = case
    _run(handle, rng, Problem(rng, b, hq, hkv, sq, skv, d, BF16, mask, layout), wsb)


@pytest.mark.parametrize("mask", MASKS, ids=MASK_IDS)
@pytest.mark.parametrize("case", [(4, 24, 24, 260, 260, 64, "bhsd"), (4, 16, 16, 300, 300, 128, "bshd")],
                         ids=["4x24x260d64", "4x16x300d128"])
def test_backward_ws_l2pf(handle, rng, wsb, monkeypatch, mask, case):
    """tuning.attention_bwd.WS_VAR "l2pf" (the next wave's K / V prefetched into L2): the same results, on grids of
    more CTAs than SMs (288 / 192: the prefetch is issued), the 1-d grid (WS_ORDER), the default dQ modes."""
    monkeypatch.setattr(tuning.attention_bwd, "WS_DQ", "bulkwpp1")
    monkeypatch.setattr(tuning.attention_bwd, "WS_DQ_CAUSAL", "bulkwpp")
    monkeypatch.setattr(tuning.attention_bwd, "WS_ORDER", True)
    monkeypatch.setattr(tuning.attention_bwd, "WS_VAR", "l2pf")
    b, hq, hkv, sq, skv, d, layout = case
    _run(handle, rng, Problem(rng, b, hq, hkv, sq, skv, d, BF16, mask, layout), wsb, modes=(0,))


ORDER_CASES = [  # 1-d grid chunks of 4 (K/V head, batch) pairs: 6 pairs (4 + a partial 2), 3 pairs, 16
    (2, 6, 3, 300, 333, 128, "bshd"),   # GQA 2, 3 key blocks
    (3, 2, 1, 200, 400, 64, "bhsd"),    # MQA, more keys than queries
    (4, 4, 4, 260, 250, 128, "bhsd"),
]
ORDER_IDS = [f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}d{c[5]}{c[6]}" for c in ORDER_CASES]


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("dq", ["bulk", "bulkw", "bulkwpp", "bulkwpp1"])
@pytest.mark.parametrize("mask", MASKS, ids=MASK_IDS)
@pytest.mark.parametrize("case", ORDER_CASES, ids=ORDER_IDS)
def test_backward_ws_order_stages(handle, rng, wsb, monkeypatch, mask, case, dq, stages):
    """tuning.attention_bwd.WS_ORDER (the kernel's own CTA order over a 1-d grid, partial chunks) with
    WS_STAGES 2 / 3 (3: the d 128 bulk / bulkw / bulkwpp1 instantiations; d 64 keeps 2), both modes."""
    monkeypatch.setattr(tuning.attention_bwd, "WS_DQ", dq)
    monkeypatch.setattr(tuning.attention_bwd, "WS_ORDER", True)
    monkeypatch.setattr(tuning.attention_bwd, "WS_STAGES", stages)
    b, hq, hkv, sq, skv, d, layout = case
    _run(handle, rng, Problem(rng, b, hq, hkv, sq, skv, d, BF16, mask, layout), wsb)


@pytest.mark.parametrize("mask", MASKS, ids=MASK_IDS)
@pytest.mark.parametrize("case", ORDER_CASES[:2], ids=ORDER_IDS[:2])
def test_deterministic_bits_equal_the_older_kernel(handle, rng, wsb, monkeypatch, mask, case):
    """deterministic = 1: bwd_ws (3-d grid and WS_ORDER's 1-d grid) gives the older kernel's bits."""
    b, hq, hkv, sq, skv, d, layout = case
    pb = Problem(rng, b, hq, hkv, sq, skv, d, BF16, mask, layout)
    _check_forward(handle, pb)
    got = {}
    for name, ws, order in (("old", False, False), ("ws", True, False), ("ws ordered", True, True)):
        monkeypatch.setattr(tuning.attention_bwd, "WS", ws)
        monkeypatch.setattr(tuning.attention_bwd, "WS_ORDER", order)
        pb.backward(handle, rng, 1)
        got[name] = [t.download() for t in (pb.dq, pb.dk, pb.dv)]
    assert wsb == ["old", "ws", "ws"]
    for name in ("ws", "ws ordered"):
        for x, y, t in zip(got[name], got["old"], ("dQ", "dK", "dV")):
            assert x.tobytes() == y.tobytes(), f"{name}: {t} differs from the older kernel"


D256_CASES = [  # bwd_ws256: 64-key CTAs, 64-row query tiles split in halves of 32 over the warpgroups
    (2, 4, 4, 150, 150, 256, "bhsd"),   # MHA, lengths not multiples of the tiles
    (1, 4, 2, 70, 200, 256, "bshd"),    # GQA, more keys than queries (top-left: key blocks seeing nothing)
    (2, 4, 1, 200, 97, 256, "bshd"),    # MQA, more queries than keys (bottom-right: empty rows)
    (1, 2, 2, 256, 256, 256, "bhsd"),   # whole tiles
    (1, 8, 2, 333, 300, 256, "bshd"),   # GQA 4: 4 heads x 6 tiles a CTA, the ring wrapping
    (1, 2, 2, 33, 31, 256, "bhsd"),     # one partial tile: half of the query split empty
]
D256_IDS = [f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}d{c[5]}{c[6]}" for c in D256_CASES]


@pytest.mark.parametrize("dq", WSB.D256_MODES[1:])
@pytest.mark.parametrize("order", [True, False], ids=["ord", "3d"])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("mask", MASKS, ids=MASK_IDS)
@pytest.mark.parametrize("case", D256_CASES, ids=D256_IDS)
def test_backward_ws256(handle, rng, wsb, monkeypatch, dtype, mask, case, order, dq):
    """d 256 (bwd_ws256): atomic dQ (tuning.attention_bwd.WS_DQ_D256: red.global.add, or the writer's bulk
    reductions of the tile staged in the stage's Q / dO buffers) and deterministic (the mma.sync dQ pass after
    it; bit-identical reruns), both CTA orders."""
    monkeypatch.setattr(tuning.attention_bwd, "WS_DQ", "bulkwpp")  # (bwd_ws's modes: not read at d 256)
    monkeypatch.setattr(tuning.attention_bwd, "WS_DQ_D256", dq)
    monkeypatch.setattr(tuning.attention_bwd, "WS_ORDER", order)
    b, hq, hkv, sq, skv, d, layout = case
    _run(handle, rng, Problem(rng, b, hq, hkv, sq, skv, d, dtype, mask, layout), wsb)


def test_backward_ws256_switch_off_and_lengths_take_mma_sync(handle, rng, wsb, monkeypatch):
    """d 256 with per-batch lengths, or WS off: the mma.sync dK / dV kernel (no bwd_ws256 launch)."""
    pb = Problem(rng, 3, 4, 2, 130, 140, 256, BF16, TL, "bshd", lens=([130, 37, 0], [5, 140, 129]), pad=8)
    _check_forward(handle, pb)
    _check_backward(handle, pb, rng, modes=(0, 1))
    monkeypatch.setattr(tuning.attention_bwd, "WS", False)
    pb = Problem(rng, 1, 4, 2, 150, 211, 256, BF16, BR, "bshd")
    _check_forward(handle, pb)
    _check_backward(handle, pb, rng, modes=(0,))
    assert wsb == []


@pytest.mark.parametrize("d", [64, 128])
def test_variable_lengths_take_the_older_kernel(handle, rng, wsb, d):
    """Per-batch lengths: bwd_dkdv_wg (TMA would bring rows past a length as they are)."""
    pb = Problem(rng, 3, 4, 2, 230, 260, d, BF16, TL, "bshd", lens=([230, 37, 0], [5, 260, 129]), pad=8)
    _check_forward(handle, pb)
    _check_backward(handle, pb, rng, modes=(0, 1))
    assert wsb == ["old atomic", "old", "old"]


def test_switch_off_takes_the_older_kernel(handle, rng, wsb, monkeypatch):
    monkeypatch.setattr(tuning.attention_bwd, "WS", False)
    pb = Problem(rng, 1, 4, 2, 150, 211, 128, BF16, BR, "bshd")
    _check_forward(handle, pb)
    _check_backward(handle, pb, rng, modes=(0,))
    assert wsb == ["old atomic"]
