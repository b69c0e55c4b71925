"""Head dims 96 / 256 on the GPU (forward and backward: the mma.sync kernels, and on sm_90 the wgmma
forward: D = 96 as D = 128 with 32 zero columns, D = 256 with 64-key tiles; the D = 96 wgmma backward), against the float64 reference
(pydnn/reference/attention.py) with poisoned outputs and the tolerances of
tests/ops/attention/test_attention_gpu.py: bf16 / fp16, no mask and both causal alignments, MHA / GQA /
MQA, variable lengths, dropout, both dQ modes. (The decode forward: test_attention_decode_gpu.py.)"""
import pytest

from pydnn import tuning
from pydnn.ops import attention_wgmma as W
from test_attention_gpu import BF16, BR, F16, NONE, TL, Problem, _check_backward, _check_forward
from test_attention_wgmma_gpu import wgmma  # noqa: F401 - the fixture (sm_90 only, mma.sync forward guarded)

pytestmark = pytest.mark.gpu

HD_CASES = [  # b, hq, hkv, sq, skv, d, layout
    (2, 4, 4, 150, 150, 96, "bhsd"),     # MHA, lengths not multiples of the tiles
    (1, 4, 2, 70, 200, 256, "bshd"),     # GQA, more keys than queries
    (2, 4, 1, 200, 97, 96, "bshd"),      # MQA, more queries than keys (bottom-right: empty rows)
    (1, 2, 2, 130, 130, 256, "bhsd"),    # a partial last tile of every kernel
]


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("mask", [NONE, TL, BR], ids=["none", "tl", "br"])
@pytest.mark.parametrize("case", HD_CASES, ids=[f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}d{c[5]}{c[6]}" for c in HD_CASES])
def test_hdim_forward_backward(handle, rng, dtype, mask, case):
    b, hq, hkv, sq, skv, d, layout = case
    pb = Problem(rng, b, hq, hkv, sq, skv, d, dtype, mask, layout)
    _check_forward(handle, pb)
    _check_backward(handle, pb, rng, modes=(1, 0))


@pytest.mark.parametrize("mask", [NONE, BR], ids=["none", "br"])
@pytest.mark.parametrize("d", [96, 256])
def test_hdim_variable_lengths(handle, rng, mask, d):
    pb = Problem(rng, 3, 4, 2, 130, 140, d, BF16, mask, "bshd", lens=([130, 37, 0], [5, 140, 64]), pad=8)
    _check_forward(handle, pb)
    _check_backward(handle, pb, rng, modes=(1, 0))


@pytest.mark.parametrize("d", [96, 256])
def test_hdim_dropout(handle, rng, d):
    pb = Problem(rng, 2, 4, 2, 90, 77, d, BF16, BR, "bshd", lens=([90, 45], [77, 40]), dropout=(0.2, 0xABCDEF))
    _check_forward(handle, pb)
    _check_backward(handle, pb, rng, modes=(1, 0))


# ----------------------------------------------------------------------------- D = 96 / 256 on wgmma (sm_90)

WG = [  # b, hq, hkv, sq, skv, layout: several key tiles, ragged lengths, more queries than keys
    (1, 4, 2, 200, 333, "bshd"), (2, 2, 2, 130, 64, "bhsd"), (1, 2, 1, 300, 129, "bhsd")]


@pytest.mark.parametrize("mask", [NONE, TL, BR], ids=["none", "tl", "br"])
@pytest.mark.parametrize("case", WG, ids=[f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}{c[5]}" for c in WG])
@pytest.mark.parametrize("d", [96, 256])
def test_wgmma_new_head_dims_forward(handle, rng, wgmma, monkeypatch, d, mask, case):
    """Every instantiated D = 96 (D = 128's tiles, 32 zero columns) / D = 256 (64-key tiles) wgmma variant,
    pipelined and plain, the dispatcher kept off the mma.sync forward (the wgmma fixture)."""
    b, hq, hkv, sq, skv, layout = case
    for tile in W.TILES[d]:
        monkeypatch.setitem(W.TILE, d, tile)
        _check_forward(handle, Problem(rng, b, hq, hkv, sq, skv, d, BF16, mask, layout))


@pytest.mark.parametrize("d", [96, 256])
def test_wgmma_new_head_dims_variable_lengths(handle, rng, wgmma, d):
    pb = Problem(rng, 3, 4, 2, 150, 190, d, BF16, BR, "bshd", lens=([150, 37, 0], [5, 190, 64]), pad=8)
    _check_forward(handle, pb)


@pytest.mark.parametrize("mask", [NONE, BR], ids=["none", "br"])
@pytest.mark.parametrize("d", [96, 256])
def test_mma_sync_new_head_dims_forward_on_sm90(handle, rng, monkeypatch, d, mask):
    """attention.ENABLED = False: the mma.sync D = 96 / 256 forward, which an sm_90 device otherwise skips."""
    monkeypatch.setattr(tuning.attention, "ENABLED", False)
    _check_forward(handle, Problem(rng, 2, 4, 2, 150, 211, d, BF16, mask, "bshd", lens=([150, 77], [211, 100])))


@pytest.mark.parametrize("mask", [NONE, BR], ids=["none", "br"])
def test_mma_sync_d96_backward_on_sm90(handle, rng, monkeypatch, mask):
    """attention_bwd.ENABLED = False: the mma.sync D = 96 backward, which an sm_90 device otherwise skips
    (there D = 96 runs the wgmma kernels in D = 128's tiles)."""
    monkeypatch.setattr(tuning.attention_bwd, "ENABLED", False)
    pb = Problem(rng, 2, 4, 2, 150, 211, 96, BF16, mask, "bshd", lens=([150, 77], [211, 100]))
    _check_forward(handle, pb)
    _check_backward(handle, pb, rng, modes=(1, 0))
