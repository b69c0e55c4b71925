"""The warp-specialized Hopper attention forward, ptx/attention_ws.cu (pydnn/ops/attention_ws.py), forced
on against the float64 reference: bf16 / fp16, d 128 (the planner's), d 64 and d 256 (instantiated,
forced here),
MHA / GQA / MQA, no mask and both causal alignments, BHSD and BSHD, lengths that are not multiples of the
128-row / 128-key tiles, more queries than keys (rows and whole 128-row units that see nothing), variable
lengths with padded strides, a NULL statsDesc; the persistent scheduler with more work units than SMs
(several rounds of the snake order, the K / V ring and the Q buffer reused across units) and with small
scheduling sections (sched_heads 1 and 3: a partial last section). Outputs poisoned first and the stride
gaps checked untouched. Every call is checked to have launched this kernel and nothing else.
Skipped on devices other than sm_90."""
import pytest

from pydnn import tuning
from pydnn.ops import attention as A
from pydnn.ops import attention_wgmma as W
from pydnn.ops import attention_ws as WS
from test_attention_gpu import BF16, BR, F16, NONE, TL, Problem, _check_forward, check_forward_without_stats

pytestmark = pytest.mark.gpu
MASKS = [NONE, TL, BR]
MASK_IDS = ["none", "tl", "br"]


@pytest.fixture
def ws(handle, monkeypatch):
    """The warp-specialized path on (d 64 too); the older kernels made to fail if the dispatcher falls
    back to them; a count of this kernel's launches."""
    if handle.arch != WS.ARCH:
        pytest.skip(f"the warp-specialized forward runs on {WS.ARCH} only (device: {handle.arch})")
    monkeypatch.setattr(tuning.attention, "ENABLED", True)
    monkeypatch.setattr(tuning.attention, "WS", True)
    monkeypatch.setattr(tuning.attention, "WS_TMA", False)  # the cp.async producer here; TMA: test_tma below
    monkeypatch.setattr(tuning.attention, "DECODE", False)  # (one query row would take the decode kernels)
    monkeypatch.setattr(WS, "HEAD_DIMS", (64, 128, 256))
    real_f, real_ws = A._func, WS.launch
    launches = []

    def guard(h, kernel, *args, **kw):
        assert kernel != "fwd", "attention_forward fell back to the mma.sync kernel"
        return real_f(h, kernel, *args, **kw)

    def no_old(*args, **kw):
        raise AssertionError("attention_forward fell back to the older wgmma kernel")

    def counted(*args, **kw):
        launches.append(args)
        return real_ws(*args, **kw)

    monkeypatch.setattr(A, "_func", guard)
    monkeypatch.setattr(W, "launch", no_old)
    monkeypatch.setattr(WS, "launch", counted)
    return launches


CASES = [  # b, hq, hkv, sq, skv, d, layout
    (2, 4, 4, 150, 150, 128, "bhsd"),    # MHA, lengths not multiples of the tiles
    (1, 4, 2, 70, 200, 128, "bshd"),     # GQA, more keys than queries
    (2, 4, 1, 200, 97, 128, "bshd"),     # MQA, more queries than keys (bottom-right: empty rows)
    (1, 2, 1, 333, 517, 128, "bshd"),    # GQA, 5 key tiles, ragged both ways
    (1, 4, 2, 520, 130, 128, "bhsd"),    # more queries than keys: whole units that see nothing
    (1, 2, 2, 1, 1, 128, "bshd"),        # one query, one key
    (1, 2, 1, 77, 1024, 128, "bhsd"),    # 8 whole key tiles
    (2, 3, 3, 300, 700, 64, "bhsd"),     # d 64, 6 key tiles
    (1, 4, 2, 200, 333, 256, "bshd"),    # d 256 (64-key tiles), GQA, 6 key tiles, ragged
    (2, 2, 2, 130, 64, 256, "bhsd"),     # d 256, one whole key tile, two row blocks
]
IDS = [f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}d{c[5]}{c[6]}" for c in CASES]


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("mask", MASKS, ids=MASK_IDS)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward(handle, rng, ws, dtype, mask, case):
    b, hq, hkv, sq, skv, d, layout = case
    _check_forward(handle, Problem(rng, b, hq, hkv, sq, skv, d, dtype, mask, layout))
    assert len(ws) == 1


@pytest.mark.parametrize("mask", MASKS, ids=MASK_IDS)
@pytest.mark.parametrize("d", [64, 128])
def test_variable_lengths(handle, rng, ws, mask, d):
    # padded rows in the strides (pad 8 elements) so the gaps are checked untouched too; a batch with no
    # queries, one with 5 keys, lengths crossing the 128 tiles
    pb = Problem(rng, 4, 4, 2, 300, 290, d, BF16, mask, "bshd", lens=([300, 37, 0, 200], [5, 290, 64, 129]), pad=8)
    _check_forward(handle, pb)
    assert len(ws) == 1


def test_forward_without_stats(handle, rng, ws):
    check_forward_without_stats(handle, Problem(rng, 1, 2, 2, 200, 200, 128, BF16, TL))
    assert len(ws) == 1


@pytest.mark.parametrize("share", [None, 1e-9, 3], ids=["default", "hs1", "hs3"])
@pytest.mark.parametrize("mask", [NONE, TL], ids=["none", "tl"])
def test_persistent_schedule(handle, rng, ws, monkeypatch, share, mask):
    """More 128-row units than SMs (b 2 x 20 heads x 5 row blocks = 200 > 132): two snake rounds (one
    partial, reversed), the rings and the Q buffer reused across units; sections of 1 and of 3 (batch,
    head) pairs (20 x 2 = 40 pairs: a last section of 1) besides the default."""
    b, hq, hkv, sq, skv = 2, 20, 4, 520, 300
    if share == 3:  # an L2 share that makes exactly 3 heads a section
        per = 2 * skv * 128 * 2 / (hq // hkv)
        monkeypatch.setattr(WS, "L2_SHARE", 3.5 * per / WS.l2_bytes(handle))
        assert WS.sched_heads(WS.l2_bytes(handle), skv, 128, hq // hkv) == 3
    elif share is not None:
        monkeypatch.setattr(WS, "L2_SHARE", share)
        assert WS.sched_heads(WS.l2_bytes(handle), skv, 128, hq // hkv) == 1
    pb = Problem(rng, b, hq, hkv, sq, skv, 128, BF16, mask, "bshd", lens=([520, 311], [300, 300]))
    _check_forward(handle, pb)
    assert len(ws) == 1 and WS.grid_size(handle, b, hq, sq) == min(handle.sm_count, b * hq * 5)


def test_old_wgmma_kernel_by_switch(handle, rng, monkeypatch):
    """tuning.attention.WS = False: d 128 takes the older wgmma kernel again (the A/B switch)."""
    if handle.arch != WS.ARCH:
        pytest.skip(f"sm_90 only (device: {handle.arch})")
    monkeypatch.setattr(tuning.attention, "WS", False)
    calls = []
    real = W.launch
    monkeypatch.setattr(W, "launch", lambda *a, **k: (calls.append(a), real(*a, **k))[1])
    monkeypatch.setattr(WS, "launch", lambda *a, **k: (_ for _ in ()).throw(AssertionError("WS launched")))
    _check_forward(handle, Problem(rng, 1, 4, 2, 333, 517, 128, BF16, BR, "bshd"))
    assert len(calls) == 1


@pytest.mark.parametrize("mask", [NONE, BR], ids=["none", "br"])
def test_without_pingpong(handle, rng, ws, monkeypatch, mask):
    """The benchmark's variant without the consumers' turns (WS.PINGPONG = False, d 128 bf16)."""
    monkeypatch.setattr(WS, "PINGPONG", False)
    pb = Problem(rng, 2, 4, 2, 250, 390, 128, BF16, mask, "bshd", lens=([250, 100], [390, 200]))
    _check_forward(handle, pb)
    assert len(ws) == 1


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("mask", MASKS, ids=MASK_IDS)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_tma(handle, rng, ws, monkeypatch, dtype, mask, case):
    """WS_TMA (the default): Q / K / V by cp.async.bulk.tensor from per-call tensor maps (BHSD and BSHD
    strides, boxes past the lengths zero filled by the TMA unit; d 64 / 128 / 256), the fwd_ws_tma launch
    checked to have happened."""
    monkeypatch.setattr(tuning.attention, "WS_TMA", True)
    b, hq, hkv, sq, skv, d, layout = case
    pb = Problem(rng, b, hq, hkv, sq, skv, d, dtype, mask, layout)
    monkeypatch.setattr(WS, "LAST_TMA", False)
    _check_forward(handle, pb)
    assert len(ws) == 1 and WS.LAST_TMA, "the tensor maps were refused: the cp.async producer ran"


def test_tma_falls_back_with_key_lengths(handle, rng, ws, monkeypatch):
    """Per-batch key lengths: the cp.async producer even with WS_TMA (rows past len_kv must be zeros)."""
    monkeypatch.setattr(tuning.attention, "WS_TMA", True)
    monkeypatch.setattr(WS, "tma_maps", lambda *a: (_ for _ in ()).throw(AssertionError("TMA with lengths")))
    pb = Problem(rng, 2, 4, 2, 300, 290, 128, BF16, BR, "bshd", lens=([300, 37], [5, 290]), pad=8)
    _check_forward(handle, pb)


@pytest.mark.parametrize("mask", [NONE, TL], ids=["none", "tl"])
def test_persistent_schedule_tma(handle, rng, ws, monkeypatch, mask):
    """test_persistent_schedule's 200 units on 132 CTAs with the TMA producer (no key lengths)."""
    monkeypatch.setattr(tuning.attention, "WS_TMA", True)
    monkeypatch.setattr(WS, "LAST_TMA", False)
    pb = Problem(rng, 2, 20, 4, 520, 300, 128, BF16, mask, "bshd", lens=([520, 311], None))
    _check_forward(handle, pb)
    assert len(ws) == 1 and WS.LAST_TMA

