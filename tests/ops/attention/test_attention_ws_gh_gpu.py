"""The warp-specialized forward with ghost tiles (ptx/attention_ws.cu GH, units attention.ws.gh.*,
tuning.attention.WS_GH: each consumer warpgroup computes only the key tiles its own rows see and walks the
unit's others without issuing) and end-aligned row blocks (AL, WS_AL: d 64 on three consumer warpgroups,
the partial 192-row block first, its rows above row 0 ghosts) against the float64 reference: d 64 (NC = 3)
and d 256 (64-key tiles), no mask and both causal alignments, GQA / MQA, sequences whose 192-row blocks end
64 / 128 rows short (AL shifts of 128 / 64: whole warpgroups above row 0) or not at a 64-row boundary,
fewer keys than queries (bottom-right: rows that see nothing), per-batch query lengths (TMA still takes
them); outputs and lse poisoned (test_attention_gpu's DevTensor), gaps untouched. The grid forced down to
4 CTAs (many units a CTA: the ghosts' releases and turns carry the ring and the turn order across units)
and the planner's. sm_90 only."""
import pytest

from pydnn import tuning
from pydnn.ops import attention_ws as WS
from test_attention_gpu import BF16, BR, F16, NONE, TL, Problem, _check_forward
from test_attention_ws_q2_gpu import grid, q2  # noqa: F401 - fixtures

pytestmark = pytest.mark.gpu

CASES = [  # b, hq, hkv, sq, skv, layout
    (2, 4, 4, 300, 300, "bhsd"),     # 2 blocks of 192 (AL shift 64: 84 rows of the first above 0, one whole WG)
    (1, 8, 2, 390, 700, "bshd"),     # GQA, more keys than queries, the last key tile partial
    (2, 4, 1, 200, 97, "bshd"),      # MQA, fewer keys than one tile (bottom-right: rows that see nothing)
    (1, 2, 2, 1024, 1024, "bhsd"),   # the sweep's s 1024: 6 blocks, AL shift 128 (two warpgroups above 0)
    (2, 2, 1, 512, 512, "bhsd"),     # s 512: 3 blocks, AL shift 64
    (1, 3, 3, 576, 640, "bshd"),     # whole 192-row blocks (no shift)
]


def _run(handle, rng, d, dtype, mask, case, al, lens_q=None):
    b, hq, hkv, sq, skv, layout = case
    got = []
    real = WS.gh_of
    with tuning.override({"attention.WS_TMA": True, "attention.WS_C3": True, "attention.WS_GH": (64, 256),
                          "attention.WS_AL": al}):
        WS.gh_of = lambda *a: got.append(real(*a)) or got[-1]
        try:
            WS.LAST_TMA = False
            pb = Problem(rng, b, hq, hkv, sq, skv, d, dtype, mask, layout,
                         lens=None if lens_q is None else (lens_q, None))
            _check_forward(handle, pb)
            assert WS.LAST_TMA
        finally:
            WS.gh_of = real
    assert got == [(True, al and d == 64)]


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("al", [False, True], ids=["gh", "ghal"])
@pytest.mark.parametrize("mask", [NONE, TL, BR], ids=["none", "tl", "br"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}{c[5]}")
def test_forward_gh_d64(handle, rng, q2, grid, mask, case, al, dtype):
    _run(handle, rng, 64, dtype, mask, case, al)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("mask", [NONE, TL, BR], ids=["none", "tl", "br"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}{c[5]}")
def test_forward_gh_d256(handle, rng, q2, grid, mask, case, dtype):
    """d 256 (64-key tiles, two warpgroups): warpgroup 0's last causal tile a ghost"""
    _run(handle, rng, 256, dtype, mask, case, False)


@pytest.mark.parametrize("d,al", [(64, False), (64, True), (256, False)], ids=["d64gh", "d64ghal", "d256gh"])
@pytest.mark.parametrize("mask", [NONE, TL, BR], ids=["none", "tl", "br"])
def test_forward_gh_lens_q(handle, rng, q2, grid, mask, d, al):
    """per-batch query lengths (TMA takes them): rows past a batch's length zero, whole warpgroups past it
    ghosts"""
    _run(handle, rng, d, BF16, mask, (3, 4, 2, 450, 450, "bshd"), al, lens_q=[450, 130, 1])
