"""The warp-specialized forward with two Q buffers (ptx/attention_ws.cu QS = 2, units attention.ws.q2.*,
tuning.attention.WS_Q2), with the key tiles in rotated order (units attention.ws.rot.*, WS_ROT: non-causal
calls), across units (the next unit's S_0 with the last P V: XU, units attention.ws.xu.*, WS_XU), with 2-CTA
clusters sharing K / V (CL, attention.ws.cl.*, WS_CL), with three consumer warpgroups at d 64 (NC = 3,
units attention.ws.c3.*, WS_C3: 192-row units), and with polynomial exponentials on a share of every
unmasked tile (EMU, units attention.ws.emu.*, WS_EMU) against the float64 reference: d 64 / 128, TMA and
cp.async producers, no mask and both causal alignments, GQA / MQA, lengths that are not multiples of the
tiles, per-batch lengths (the cp.async producer); outputs poisoned, gaps untouched. The grid is forced down
to 4 CTAs, so that each runs many work units and both Q buffers turn over several times (the full grid
gives most CTAs one unit). sm_90 only."""
import pytest

from pydnn import tuning
from pydnn.ops import attention_ws as WS
from test_attention_gpu import BF16, BR, F16, NONE, TL, Problem, _check_forward

pytestmark = pytest.mark.gpu


@pytest.fixture
def q2(handle, monkeypatch):
    if handle.arch != WS.ARCH:
        pytest.skip(f"the warp-specialized forward runs on {WS.ARCH} only (device: {handle.arch})")
    monkeypatch.setattr(tuning.attention, "ENABLED", True)
    monkeypatch.setattr(tuning.attention, "WS", True)
    monkeypatch.setattr(tuning.attention, "DECODE", False)
    monkeypatch.setattr(tuning.attention, "WS_Q2", True)
    monkeypatch.setattr(tuning.attention, "WS_C3", False)  # (on by default: the d 64 TMA calls would take it;
    got = []                                                #  test_forward_c3 turns it on)
    real_q, real_e = WS.q2_of, WS.emu_of
    monkeypatch.setattr(WS, "q2_of", lambda d, bn: got.append(("qs", real_q(d, bn))) or got[-1][1])
    monkeypatch.setattr(WS, "emu_of", lambda d, qs: got.append(("emu", real_e(d, qs))) or got[-1][1])
    return got


@pytest.fixture(params=[4, None], ids=["grid4", "grid_full"])
def grid(request, monkeypatch):
    """4 CTAs (2 clusters of 2), or the planner's grid"""
    if request.param:
        real = WS.grid_size
        monkeypatch.setattr(WS, "grid_size", lambda h, b, hq, sq, *a: min(request.param, real(h, b, hq, sq, *a)))
    return request.param


CASES = [  # b, hq, hkv, sq, skv, layout
    (2, 4, 4, 300, 300, "bhsd"),     # 3 row blocks x 8 heads: 24 units
    (1, 8, 2, 390, 700, "bshd"),     # GQA: 6 key tiles, the last partial
    (2, 4, 1, 200, 97, "bshd"),      # MQA, fewer keys than one tile (bottom-right: empty rows)
    (1, 2, 2, 640, 640, "bhsd"),     # whole tiles, 10 units
]


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("tma", [True, False], ids=["tma", "cp.async"])
@pytest.mark.parametrize("mask", [NONE, TL, BR], ids=["none", "tl", "br"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}{c[5]}")
def test_forward_q2(handle, rng, q2, grid, tma, mask, case, d):
    b, hq, hkv, sq, skv, layout = case
    with tuning.override({"attention.WS_TMA": tma}):
        WS.LAST_TMA = False
        pb = Problem(rng, b, hq, hkv, sq, skv, d, BF16, mask, layout)
        _check_forward(handle, pb)
        assert WS.LAST_TMA == tma
    assert ("qs", 2) in q2


@pytest.mark.parametrize("d,emu", [(64, 2), (64, 3), (128, 2)])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("mask", [NONE, TL, BR], ids=["none", "tl", "br"])
@pytest.mark.parametrize("case", CASES[:2] + CASES[3:], ids=lambda c: f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}{c[5]}")
def test_forward_emu(handle, rng, q2, grid, mask, case, d, emu, dtype):
    b, hq, hkv, sq, skv, layout = case
    with tuning.override({"attention.WS_TMA": True, "attention.WS_EMU": {d: emu}}):
        WS.LAST_TMA = False
        pb = Problem(rng, b, hq, hkv, sq, skv, d, dtype, mask, layout)
        _check_forward(handle, pb)
        assert WS.LAST_TMA
    assert ("emu", emu) in q2


def test_forward_q2_lengths_f16(handle, rng, q2, grid):
    """per-batch lengths: the cp.async producer (TMA is not taken), rows past a batch's length zero"""
    pb = Problem(rng, 3, 8, 2, 260, 530, 128, F16, BR, "bshd", lens=([260, 100, 1], [530, 177, 176]))
    _check_forward(handle, pb)
    assert ("qs", 2) in q2


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mask", [NONE, TL], ids=["none", "tl"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}{c[5]}")
def test_forward_rot(handle, rng, q2, grid, mask, case, d, monkeypatch):
    """rotated key order (non-causal calls; a causal call takes the q2 kernel): the partial last key tile
    falls anywhere in a unit's walk"""
    got = []
    real = WS.rot_of
    monkeypatch.setattr(WS, "rot_of", lambda qs, p: got.append(real(qs, p)) or got[-1])
    b, hq, hkv, sq, skv, layout = case
    with tuning.override({"attention.WS_TMA": True, "attention.WS_ROT": True}):
        WS.LAST_TMA = False
        pb = Problem(rng, b, hq, hkv, sq, skv, d, BF16, mask, layout)
        _check_forward(handle, pb)
        assert WS.LAST_TMA
    assert got == [mask == NONE]


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("mask", [NONE, TL, BR], ids=["none", "tl", "br"])
@pytest.mark.parametrize("case", CASES + [(2, 4, 2, 800, 800, "bhsd")],
                         ids=lambda c: f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}{c[5]}")
def test_forward_c3(handle, rng, q2, grid, mask, case, dtype, monkeypatch):
    """three consumer warpgroups at d 64 (TMA): 192-row units (rows past the length in the last one), the
    causal diagonal across the three warpgroups' rows"""
    got = []
    real = WS.c3_of
    monkeypatch.setattr(WS, "c3_of", lambda d, qs: got.append(real(d, qs)) or got[-1])
    b, hq, hkv, sq, skv, layout = case
    with tuning.override({"attention.WS_TMA": True, "attention.WS_C3": True, "attention.WS_GH": {}}):
        WS.LAST_TMA = False
        pb = Problem(rng, b, hq, hkv, sq, skv, 64, dtype, mask, layout)
        _check_forward(handle, pb)
        assert WS.LAST_TMA
    assert got == [3]


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("mask", [NONE, TL], ids=["none", "tl"])
@pytest.mark.parametrize("case", CASES + [(1, 2, 2, 130, 1000, "bhsd"), (3, 2, 1, 384, 257, "bshd")],
                         ids=lambda c: f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}{c[5]}")
def test_forward_cl(handle, rng, q2, grid, mask, case, d, dtype, monkeypatch):
    """2-CTA clusters sharing K / V by multicast (non-causal; a causal call takes the one-CTA kernel): odd
    row-block counts (the pair's second block past the sequence), partial key tiles, GQA / MQA"""
    got = []
    real = WS.cl_of
    monkeypatch.setattr(WS, "cl_of", lambda d_, qs, p: got.append(real(d_, qs, p)) or got[-1])
    b, hq, hkv, sq, skv, layout = case
    with tuning.override({"attention.WS_TMA": True, "attention.WS_CL": True}):
        WS.LAST_TMA = False
        pb = Problem(rng, b, hq, hkv, sq, skv, d, dtype, mask, layout)
        _check_forward(handle, pb)
        assert WS.LAST_TMA
    assert got == [mask == NONE]


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("mask", [NONE, TL, BR], ids=["none", "tl", "br"])
@pytest.mark.parametrize("case", CASES + [(2, 3, 1, 520, 130, "bhsd")],
                         ids=lambda c: f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}{c[5]}")
def test_forward_xu(handle, rng, q2, grid, mask, case, d, dtype, monkeypatch):
    """across units: a CTA's units chained (the 4-CTA grid: many a CTA), causal units of different lengths,
    units that see nothing between (bottom-right, more queries than keys: no chaining into them)"""
    got = []
    real = WS.xu_of
    monkeypatch.setattr(WS, "xu_of", lambda d_, qs: got.append(real(d_, qs)) or got[-1])
    b, hq, hkv, sq, skv, layout = case
    with tuning.override({"attention.WS_TMA": True, "attention.WS_XU": True}):
        WS.LAST_TMA = False
        pb = Problem(rng, b, hq, hkv, sq, skv, d, dtype, mask, layout)
        _check_forward(handle, pb)
        assert WS.LAST_TMA
    assert got == [True]
