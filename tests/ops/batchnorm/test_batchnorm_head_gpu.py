"""Batch norm's non-Ex heads ({fwd,bwd}_head_batched<T, HEAD_U>: one block of HEAD_THREADS, HEAD_U elements per
thread with their loads issued together) on the GPU against the float64 reference, outputs poisoned: wide
channel counts whose constants fill several rows of y / dx (a head of more than one batch of HEAD_THREADS x
HEAD_U elements, exactly one, and less), on the vector rows, the 1-element rows, the super-rows (one and several
position tiles) and srh (the 1-element rows' statistics, the super-rows' apply); the training forward without
the saved-statistics apply (APPLY_SAVED off: the head path), the backward with saved statistics and dscale /
dbias blending (the sums with the head) and recomputed ones; that each call launched the head over the rows the
constants took."""
import pytest

from pydnn import tuning
from pydnn.ops import batchnorm as B
from test_batchnorm_gpu import BF16, F16, F32, F64, SPATIAL, _backward, _forget_bn_plans, _train

pytestmark = pytest.mark.gpu

CASES = [  # dims (NHWC), dtype, sequence (tools: the plan's pick for 16-byte aligned pointers), what the head covers
    ((2, 1305, 9, 9), BF16, "srh"),    # C odd > 256, under SR_TILED_BYTES (rows1 stats, super-row apply): 8 rows
    ((3, 2048, 4, 4), F32, "rows4"),   # 4 rows x 2048 = 8192, exactly one batch
    ((2, 1000, 5, 5), F16, "rows8"),   # 8 rows x 1000 (the forward: rows8p, fwd_apply_plain)
    ((2, 1024, 3, 5), F64, "rows2"),   # 32-byte constants: 4 rows x 1024
    ((4, 1315, 3, 3), F32, "sr"),      # super-rows, position tiles (SR_TILED_BYTES 0): 1 super-row of 4 rows
    ((3, 93, 7, 9), BF16, "sr"),       # super-rows, one tile: 8 rows x 93 (less than a batch)
    ((3, 37, 5, 7), F64, "rows1"),     # 1-element rows (double: no super-rows)
]
NAMES = {F32: "f32", F16: "f16", BF16: "bf16", F64: "f64"}


@pytest.fixture(autouse=True)
def _setup(monkeypatch, handle):
    monkeypatch.setattr(tuning.batchnorm, "GEN_TINY", 0)       # (small shapes: the rows path, not gen)
    monkeypatch.setattr(tuning.batchnorm, "APPLY_SAVED", False)  # (the forward's head path)
    _forget_bn_plans(handle)
    yield
    _forget_bn_plans(handle)


@pytest.fixture
def launched(monkeypatch):
    seqs = []
    run = B._run

    def rec(handle, pl, seq):
        seqs.append([(lc.kernel, dict(lc.fields), lc.block, lc.vec, lc.u) for lc in seq])
        return run(handle, pl, seq)

    monkeypatch.setattr(B, "_run", rec)
    return seqs


def _check_kind(launches, seq):
    """The stats launch is the expected sequence's: super-rows (u SR_U) or rows at the named vector width."""
    kernel, _, _, vec, u = launches[0]
    assert kernel.endswith("_stats") or kernel == "bwd_sums", launches
    if seq == "sr":
        assert u == B.SR_U, launches
    elif seq == "srh":  # (rows1's stats, the super-rows' apply)
        assert vec == 1 and u != B.SR_U and launches[2][4] == B.SR_U, launches
    else:
        assert vec == int(seq[4:]) and u != B.SR_U, launches


def _head_rows(dims, dtype, direction):
    c = dims[1]
    isz = {F32: 4, F16: 2, BF16: 2, F64: 8}[dtype]
    cslot = 4 * (8 if dtype == F64 else 4)
    return -(-(c * cslot) // (c * isz))


@pytest.mark.parametrize("dims,dtype,seq", CASES, ids=[f"{'x'.join(map(str, d))}-{NAMES[t]}" for d, t, _ in CASES])
def test_head_forward_backward(handle, rng, dims, dtype, seq, launched, monkeypatch):
    if dims[1] == 1315:
        monkeypatch.setattr(tuning.batchnorm, "SR_TILED_BYTES", 0)
    t = _train(handle, SPATIAL, dims, "nhwc", dtype, rng)
    assert len(launched) == 1 and launched[0][-1][0] == "fwd_head_batched", launched
    _check_kind(launched[0], seq)
    head = launched[0][-1]
    assert head[2] == (B.HEAD_THREADS, 1, 1) and head[1]["row_begin"] == 0
    assert head[1]["row_end"] >= _head_rows(dims, dtype, "fwd")
    del launched[:]
    _backward(handle, t, dtype, SPATIAL, rng, saved=True, ap=0.5, bp=0.5)  # (the sums; blending keeps the head)
    _backward(handle, t, dtype, SPATIAL, rng, saved=False)
    assert len(launched) == 2, launched
    for s in launched:
        _check_kind(s, seq)
        assert s[-1][0] == "bwd_head_batched" and s[-1][2] == (B.HEAD_THREADS, 1, 1), s
        assert s[-1][1]["row_end"] >= _head_rows(dims, dtype, "bwd")
