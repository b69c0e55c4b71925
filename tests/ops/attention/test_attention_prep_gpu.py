"""The attention backward's memory passes in 16-byte form (ptx/attention_prep.cu: bwd_pre_v, bwd_dq_convert_v;
tuning.attention_bwd.PREP_VEC) against the float64 reference, beside attention.cu's forms (PREP_VEC off): every
head dim (64, 96's 12 live lanes of 16, 128, 256), bf16 / fp16, BHSD and BSHD with padded strides (the gaps
checked untouched), per-batch query lengths (rows past a length: dsum 0, dQ 0), row counts that are not
multiples of a block's rows (the last block's partial zeroing and rows), atomic and deterministic dQ. The
outputs are poisoned first (_check_backward). Every call is checked to have launched the chosen form."""
import pytest

from pydnn import tuning
from pydnn.ops import attention as A
from test_attention_gpu import BF16, F16, NONE, TL, BR, Problem, _check_backward, _check_forward

pytestmark = pytest.mark.gpu


@pytest.fixture
def launches(monkeypatch):
    """The memory passes launched: (kernel, vector form) per call of _launch_prep."""
    seen, real = [], A._launch_prep

    def rec(handle, kernel, pr, rows, p):
        seen.append((kernel, bool(tuning.attention_bwd.PREP_VEC)))
        return real(handle, kernel, pr, rows, p)

    monkeypatch.setattr(A, "_launch_prep", rec)
    return seen


CASES = [  # b, hq, hkv, sq, skv, d, layout, mask, lens
    (2, 4, 4, 150, 150, 64, "bhsd", NONE, None),
    (2, 4, 2, 77, 130, 64, "bshd", TL, ([77, 5], [130, 64])),
    (1, 4, 2, 70, 200, 96, "bshd", BR, None),
    (3, 2, 1, 133, 90, 96, "bhsd", TL, ([133, 0, 40], [90, 31, 90])),
    (1, 2, 2, 256, 256, 128, "bhsd", NONE, None),
    (2, 4, 1, 131, 97, 128, "bshd", BR, ([131, 60], [97, 97])),
    (1, 2, 2, 100, 70, 256, "bshd", TL, None),
    (2, 2, 1, 65, 65, 256, "bhsd", NONE, ([65, 33], [65, 20])),
]
IDS = [f"{c[0]}x{c[1]}/{c[2]}x{c[3]}x{c[4]}d{c[5]}{c[6]}{'-lens' if c[8] else ''}-m{c[7]}" for c in CASES]


@pytest.mark.parametrize("vec", [True, False], ids=["vec", "warp"])
@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_backward_prep(handle, rng, launches, monkeypatch, dtype, case, vec):
    monkeypatch.setattr(tuning.attention_bwd, "PREP_VEC", vec)
    b, hq, hkv, sq, skv, d, layout, mask, lens = case
    pb = Problem(rng, b, hq, hkv, sq, skv, d, dtype, mask, layout, lens=lens, pad=8)
    _check_forward(handle, pb)
    _check_backward(handle, pb, rng, modes=(0, 1))
    # atomic: pre + convert; deterministic (twice): pre only
    want = [("bwd_pre_v", vec), ("bwd_dq_convert_v", vec), ("bwd_pre_v", vec), ("bwd_pre_v", vec)]
    assert launches == want, launches
