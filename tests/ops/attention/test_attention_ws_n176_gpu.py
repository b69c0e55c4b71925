"""The warp-specialized forward with wide K / V tiles, 176 keys at d 128 (FlashAttention-3's non-causal
d 128 tile; ptx/attention_ws.cu BN = 176, units attention.ws.n176.*, tuning.attention.WS_BN176 = True:
every d 128 call) and 192 at d 64 (attention.ws.n192.*, WS_BN192), against the float64 reference: TMA and cp.async producers, no mask and both causal
alignments, GQA / MQA, lengths that are not multiples of 176 or 128, per-batch lengths (the cp.async
producer), a key sequence shorter than one tile; outputs poisoned, gaps untouched. sm_90 only."""
import pytest

from pydnn import tuning
from pydnn.ops import attention_ws as WS
from test_attention_gpu import BF16, BR, F16, NONE, TL, Problem, _check_forward

pytestmark = pytest.mark.gpu


@pytest.fixture
def n176(handle, monkeypatch):
    if handle.arch != WS.ARCH:
        pytest.skip(f"the warp-specialized forward runs on {WS.ARCH} only (device: {handle.arch})")
    monkeypatch.setattr(tuning.attention, "ENABLED", True)
    monkeypatch.setattr(tuning.attention, "WS", True)
    monkeypatch.setattr(tuning.attention, "DECODE", False)
    monkeypatch.setattr(tuning.attention, "WS_BN176", True)
    monkeypatch.setattr(tuning.attention, "WS_BN192", True)
    got = []
    real = WS.bn_of
    monkeypatch.setattr(WS, "bn_of", lambda d, p: got.append(real(d, p)) or got[-1])
    return got


CASES = [  # b, hq, hkv, sq, skv, layout
    (2, 4, 4, 150, 150, "bhsd"),
    (1, 8, 2, 300, 700, "bshd"),     # GQA: 4 key tiles, the last partial
    (2, 4, 1, 200, 97, "bshd"),      # MQA, fewer keys than one tile (bottom-right: empty rows)
    (1, 2, 2, 129, 352, "bhsd"),     # two whole tiles of keys
]


@pytest.mark.parametrize("d,bn", [(128, 176), (64, 192)], ids=["d128", "d64"])
@pytest.mark.parametrize("tma", [True, False], ids=["tma", "cp.async"])
@pytest.mark.parametrize("mask", [NONE, TL, BR], ids=["none", "tl", "br"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}{c[5]}")
def test_forward_wide(handle, rng, n176, tma, mask, case, d, bn):
    b, hq, hkv, sq, skv, layout = case
    with tuning.override({"attention.WS_TMA": tma}):
        WS.LAST_TMA = False
        pb = Problem(rng, b, hq, hkv, sq, skv, d, BF16, mask, layout)
        _check_forward(handle, pb)
        assert WS.LAST_TMA == tma
    assert n176 and set(n176) == {bn}  # (the kernel pick and the launch each ask bn_of)


def test_forward_n176_lengths_f16(handle, rng, n176):
    pb = Problem(rng, 3, 8, 2, 260, 530, 128, F16, BR, "bshd", lens=([260, 100, 1], [530, 177, 176]))
    _check_forward(handle, pb)
    assert n176 == [176]
