"""The Hopper (wgmma) attention forward, ptx/attention_wgmma.cu, forced on explicitly against the float64
reference: bf16 / fp16, head dims 64 / 128, MHA / GQA / MQA, no mask and both causal alignments, BHSD and
BSHD, lengths that are not multiples of the 128-row / 128-key tiles, several key tiles (the pipelined
loop, its buffers and its last P V), more queries than keys (rows that see nothing), variable lengths,
a NULL statsDesc, every instantiated variant; outputs poisoned first and the stride gaps checked
untouched. The mma.sync forward keeps a few cases of its own here (attention_wgmma.ENABLED = False),
since on an sm_90 device the dispatcher otherwise sends every call without dropout to wgmma.
tuning.attention.WS is off here (d 128 would take the warp-specialized forward: test_attention_ws_gpu.py).
Skipped on devices other than sm_90 (the units exist for sm_90a only)."""
import pytest

from pydnn import tuning
from pydnn.ops import attention as A
from pydnn.ops import attention_wgmma as W
from test_attention_gpu import BF16, BR, CASES, F16, NONE, TL, Problem, _check_forward, check_forward_without_stats

pytestmark = pytest.mark.gpu
MASKS = [NONE, TL, BR]
MASK_IDS = ["none", "tl", "br"]


@pytest.fixture
def wgmma(handle, monkeypatch):
    """The wgmma path on, and the mma.sync forward made to fail if the dispatcher falls back to it."""
    if handle.arch != W.ARCH:
        pytest.skip(f"the wgmma forward runs on {W.ARCH} only (device: {handle.arch})")
    monkeypatch.setattr(tuning.attention, "ENABLED", True)
    monkeypatch.setattr(tuning.attention, "WS", False)  # d 128: this kernel, not the warp-specialized one
    real = A._func

    def guard(h, kernel, *args, **kw):
        assert kernel != "fwd", "attention_forward fell back to the mma.sync kernel"
        return real(h, kernel, *args, **kw)

    monkeypatch.setattr(A, "_func", guard)
    return W


MORE = [  # b, hq, hkv, sq, skv, d, layout: several key tiles, odd lengths
    (1, 2, 1, 333, 517, 128, "bshd"),    # GQA, 5 key tiles, ragged both ways
    (2, 3, 3, 300, 700, 64, "bhsd"),     # 6 key tiles at d 64
    (1, 4, 2, 520, 130, 128, "bhsd"),    # more queries than keys: rows that see nothing (bottom-right)
    (1, 2, 2, 1, 1, 64, "bshd"),         # one query, one key
    (1, 2, 1, 77, 1024, 128, "bhsd"),    # 8 whole key tiles
]


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("mask", MASKS, ids=MASK_IDS)
@pytest.mark.parametrize("case", CASES + MORE,
                         ids=[f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}d{c[5]}{c[6]}" for c in CASES + MORE])
def test_forward(handle, rng, wgmma, dtype, mask, case):
    b, hq, hkv, sq, skv, d, layout = case
    _check_forward(handle, Problem(rng, b, hq, hkv, sq, skv, d, dtype, mask, layout))


@pytest.mark.parametrize("mask", MASKS, ids=MASK_IDS)
@pytest.mark.parametrize("d", [64, 128])
def test_variable_lengths(handle, rng, wgmma, mask, d):
    # padded rows in the strides (pad 8 elements) so the gaps are checked untouched too; a batch with no
    # queries, one with 5 keys, lengths crossing the 128 tiles
    pb = Problem(rng, 4, 4, 2, 300, 290, d, BF16, mask, "bshd", lens=([300, 37, 0, 200], [5, 290, 64, 129]), pad=8)
    _check_forward(handle, pb)


def test_forward_without_stats(handle, rng, wgmma):
    check_forward_without_stats(handle, Problem(rng, 1, 2, 2, 200, 200, 128, BF16, TL))


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mask", [NONE, BR], ids=["none", "br"])
def test_every_variant(handle, rng, wgmma, monkeypatch, d, mask):
    """Each instantiated (keys per tile, PIPE) variant (the benchmark times each; TILE picks one)."""
    for tile in W.TILES[d]:
        monkeypatch.setitem(W.TILE, d, tile)
        pb = Problem(rng, 2, 4, 2, 250, 390, d, F16, mask, "bshd", lens=([250, 100], [390, 200]))
        _check_forward(handle, pb)


@pytest.mark.parametrize("mask", MASKS, ids=MASK_IDS)
@pytest.mark.parametrize("case", CASES[:2] + MORE[:1], ids=["mha150", "gqa70x200", "gqa333x517"])
def test_mma_sync_forward_still_checked(handle, rng, monkeypatch, mask, case):
    """ENABLED = False: the mma.sync forward (what every other arch, and dropout, runs)."""
    monkeypatch.setattr(tuning.attention, "ENABLED", False)
    b, hq, hkv, sq, skv, d, layout = case
    _check_forward(handle, Problem(rng, b, hq, hkv, sq, skv, d, BF16, mask, layout))
